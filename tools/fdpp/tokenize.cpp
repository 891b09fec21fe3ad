// fdpp tokenize: text to token ids (as generate encodes a prompt), or ids back to text. Reads only
// the tokenizer.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "subcommands.h"
#include "engine/generate.h"
#include "engine/prompt_file.h"
#include "model/model_loader.h"
#include "tokenizer/tokenizer.h"

namespace fdpp::cli {

namespace {

struct TokenizeArgs {
  std::string model, prompt, ids, system, chat_kwargs;
  bool chat = false, no_bos = false, json = false;
};

// Text to ids (one comma-separated line, ready for --token-ids) or, with --ids, ids to text (special
// tokens written out, so that what a prompt really holds is visible). Reads only the tokenizer.
int run_tokenize(const TokenizeArgs& a) {
  std::vector<int32_t> ids;
  if (!a.ids.empty()) ids = parse_token_ids(a.ids);
  const std::string path = resolve_model_path(a.model);
  const std::unique_ptr<Tokenizer> tok = load_tokenizer(path);
  if (!a.ids.empty()) {
    for (int32_t id : ids)
      check(id < tok->vocab_size(), "--ids: id {} is out of range [0, {})", id, tok->vocab_size());
    const std::string text = tok->decode(ids, /*skip_special=*/false);
    if (a.json) {
      write_stdout(nlohmann::json{{"token_ids", ids}, {"text", text}}.dump(-1, ' ', false,
                                                                            nlohmann::json::error_handler_t::replace) +
                   "\n");
    } else {
      write_stdout(text + "\n");
    }
    return 0;
  }
  // encode_prompt decides BOS as generate does; --no-bos drops a leading BOS whichever way it came.
  ChatOptions chat_options;
  if (!a.chat_kwargs.empty()) {
    try {
      chat_options = parse_chat_template_kwargs(a.chat_kwargs);
    } catch (const Error& e) {
      throw UsageError(std::string("--chat-template-kwargs: ") + e.what());
    }
  }
  ids = encode_prompt(*tok, a.prompt, {}, a.chat, a.system, chat_options);
  if (a.no_bos && !ids.empty() && ids.front() == tok->bos_id()) ids.erase(ids.begin());
  if (a.json) {
    std::vector<std::string> pieces;
    for (int32_t id : ids) pieces.push_back(tok->token_bytes(id));
    write_stdout(nlohmann::json{{"token_ids", ids}, {"pieces", pieces}, {"count", ids.size()}}.dump(
                     -1, ' ', false, nlohmann::json::error_handler_t::replace) +
                 "\n");
  } else {
    std::string line;
    for (size_t i = 0; i < ids.size(); ++i) line += (i ? "," : "") + std::to_string(ids[i]);
    write_stdout(line + "\n");
  }
  return 0;
}

}  // namespace

Subcommand register_tokenize(CLI::App& app) {
  static TokenizeArgs t;
  auto* tokenize = app.add_subcommand("tokenize", "text to token ids (comma-separated), or --ids back to text");
  tokenize->add_option("-m,--model", t.model, "GGUF file or HF model directory (default: the default model)");
  auto* t_prompt_opt = tokenize->add_option("-p,--prompt", t.prompt, "text to encode; - reads stdin");
  auto* t_ids_opt = tokenize->add_option("--ids", t.ids, "token ids to decode, e.g. 1,2,3");
  t_prompt_opt->excludes(t_ids_opt);
  tokenize->add_flag("--chat", t.chat, "wrap the text in the model's chat template first");
  tokenize->add_option("--system", t.system, "system message (implies --chat)");
  tokenize->add_option("--chat-template-kwargs", t.chat_kwargs,
                       "chat template variables as JSON, e.g. '{\"enable_thinking\": false}' (Qwen3)");
  tokenize->add_flag("--no-bos", t.no_bos, "drop the BOS token the model would add");
  tokenize->add_flag("--json", t.json, "print JSON (token_ids and pieces, or token_ids and text)");
  return {tokenize, [t_prompt_opt, t_ids_opt]() -> int {
            if (t_prompt_opt->count() == 0 && t_ids_opt->count() == 0)
              throw UsageError("tokenize needs --prompt TEXT or --ids 1,2,3");
            if (t_prompt_opt->count() > 0) t.prompt = prompt_text("--prompt", t.prompt);
            if (std::string p = utf8_problem(t.system); !p.empty()) throw UsageError("--system: " + p);
            if (t_ids_opt->count() > 0) {
              try {
                parse_token_ids(t.ids);
              } catch (const UsageError& e) {
                throw UsageError("--ids" + std::string(e.what()).substr(std::string("--token-ids").size()));
              }
            }
            return run_tokenize(t);
          }};
}

}  // namespace fdpp::cli
