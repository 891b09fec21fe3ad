// fdpp logits: the logits of every position of a prompt as a float32 .npy [T, vocab].
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "subcommands.h"
#include "core/npy.h"
#include "engine/generate.h"
#include "engine/prompt_file.h"
#include "engine_flags.h"
#include "tokenizer/tokenizer.h"

namespace fdpp::cli {

namespace {

int run_logits(const std::string& token_ids, const std::string& prompt, const std::string& out, const EngineArgs& e,
               bool quiet) {
  std::vector<int32_t> ids;
  if (!token_ids.empty()) ids = parse_token_ids(token_ids);
  LoadReport report("loading " + (e.model.empty() ? default_model_path() : e.model), quiet);
  OpenedModel m = open_model_with_progress(e, quiet);
  const std::string& path = m.path;
  const ModelConfig& c = m.config();
  if (!prompt.empty()) {
    check(m.tokenizer != nullptr, "{}: no tokenizer; use --token-ids", path);
    // As generate encodes a plain prompt: BOS when the model wants one, special tokens parsed.
    ids = encode_prompt(*m.tokenizer, prompt, {}, false, "");
    check(!ids.empty(), "--prompt: the prompt encodes to no tokens");
  }
  for (int32_t id : ids) check(id < c.vocab_size, "--token-ids: id {} is out of range [0, {})", id, c.vocab_size);
  check(static_cast<int64_t>(ids.size()) <= c.max_context, "{} tokens exceed the model's context length {}",
        ids.size(), c.max_context);
  auto runner = m.make_runner(e, static_cast<int>(ids.size()), report.progress());
  const nlohmann::json load = report.stats(m);
  std::vector<float> logits(ids.size() * static_cast<size_t>(c.vocab_size));
  runner->forward(ids, 0, /*all_positions=*/true, logits);
  write_npy_f32(out, {static_cast<int64_t>(ids.size()), c.vocab_size}, logits);
  fmt::print(stderr, "wrote {} [{} x {}] float32\n", out, ids.size(), c.vocab_size);
  // After success only: an error stays the one line on stderr.
  if (!quiet) fmt::print(stderr, "{}\n", load_line(load));
  return 0;
}

}  // namespace

Subcommand register_logits(CLI::App& app) {
  static EngineArgs engine;
  static std::string l_ids, l_prompt, l_out;
  static bool quiet = false;
  auto* logits = app.add_subcommand("logits", "write the logits of every position as float32 .npy [T, vocab]");
  auto* l_ids_opt = logits->add_option("--token-ids", l_ids, "token ids, e.g. 1,2,3");
  auto* l_prompt_opt = logits->add_option("-p,--prompt", l_prompt, "text, encoded as generate does; - reads stdin");
  l_ids_opt->excludes(l_prompt_opt);
  logits->add_option("-o,--out", l_out, "output .npy file")->required();
  add_engine_flags(logits, engine, kLogits);
  logits->add_flag("--quiet", quiet, "no load progress bar or load line on stderr");
  return {logits, [l_ids_opt, l_prompt_opt]() -> int {
            check_engine_flags(engine);
            if (l_ids_opt->count() == 0 && l_prompt_opt->count() == 0)
              throw UsageError("logits needs --token-ids 1,2,3 or --prompt TEXT");
            if (l_prompt_opt->count() > 0) l_prompt = prompt_text("--prompt", l_prompt);
            if (l_ids_opt->count() > 0) parse_token_ids(l_ids);  // usage errors before the model loads
            say_gpu_layers(engine);
            return run_logits(l_ids, l_prompt, l_out, engine, quiet);
          }};
}

}  // namespace fdpp::cli
