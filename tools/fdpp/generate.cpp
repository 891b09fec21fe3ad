// fdpp generate: text from a model, streamed to stdout; with --file, a prompts file run as one
// continuously batched job (generate_file.cpp).
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <functional>

#include "chat.h"
#include "cli_common.h"
#include "core/read_file.h"
#include "engine/generate.h"
#include "engine/prompt_file.h"
#include "engine/request_limits.h"
#include "engine/scheduler.h"
#include "engine_flags.h"
#include "generate_file.h"
#include "subcommands.h"
#include "tokenizer/tokenizer.h"
#ifdef FDPP_HAVE_CUDA
#include "backend/cuda/cuda_engine.h"
#endif

namespace fdpp::cli {

namespace {

int run_generate(GenerateArgs a, const EngineArgs& e, bool quiet) {
  LoadReport report("loading " + model_label(e), quiet || a.json);
  OpenedModel m = open_model_with_progress(e, quiet || a.json);
  const std::string& path = m.path;
  // A bare HF checkpoint (no tokenizer files) runs by token ids: the ids are the output, the text
  // stays empty.
  const bool has_tokenizer = m.tokenizer != nullptr;
  if (!has_tokenizer) {
    check(!a.token_ids.empty(),
          "{}: no tokenizer (tokenizer.json, tokenizer.model or vocab.json + merges.txt); give --token-ids instead of "
          "--prompt",
          path);
    m.tokenizer = Tokenizer::ids_only(m.config().vocab_size, m.description.eos_token_ids, m.description.bos_token_id);
  }
  std::vector<int32_t> prompt;
  if (!a.token_ids.empty()) {
    prompt = parse_token_ids(a.token_ids);
  } else {
    prompt = encode_prompt(*m.tokenizer, a.prompt, {}, a.chat, a.system, a.chat_options);
  }
  check(!prompt.empty(), "the prompt encodes to no tokens; give --prompt TEXT or --token-ids");
  const ModelConfig& c = m.config();
  const int ctx = e.max_model_len > 0 ? e.max_model_len : c.max_context;
  check(ctx <= c.max_context, "--ctx-size {} exceeds the model's context length {}", ctx, c.max_context);
  // -n -1 (llama.cpp's "until the context is full").
  if (a.max_tokens < 0)
    a.max_tokens = static_cast<int>(std::max<int64_t>(0, ctx - static_cast<int64_t>(prompt.size())));
  const int64_t needed = static_cast<int64_t>(prompt.size()) + a.max_tokens;
  check(needed <= ctx, "prompt ({} tokens) + --max-tokens ({}) exceed the context size {}", prompt.size(),
        a.max_tokens, ctx);

  // One sequence on the batched engine, through the same scheduler the server uses; the whole
  // prompt in one step up to 8192 tokens (longer prompts are prefilled in chunks of that size).
  EngineLimits limits;
  limits.max_context = static_cast<int>(needed);
  limits.max_step_rows = 1;
  limits.max_step_tokens = static_cast<int>(std::min<int64_t>(needed, 8192));
  limits.kv_cache_tokens = needed;
  for (int32_t id : prompt) check(id < c.vocab_size, "--token-ids: id {} is out of range [0, {})", id, c.vocab_size);
  auto engine = m.make_engine(e, limits, report.progress());
  const nlohmann::json load = report.stats(m);
  GenerateOptions opt{a.max_tokens, a.ignore_eos, a.sampling, a.stop};
  std::function<void(std::string_view)> stream;
  bool ends_with_newline = true;  // nothing written yet
  if (!a.json) stream = [&](std::string_view piece) {
      write_stdout(piece);
      ends_with_newline = piece.ends_with('\n');
    };
  GenerateResult r = generate(*engine, *m.tokenizer, prompt, opt, stream);
  if (a.json) {
    nlohmann::json j;
    j["model"] = path;
    j["seed"] = a.sampling.seed;
    j["prompt_token_ids"] = prompt;
    j["token_ids"] = r.tokens;
    j["text"] = r.text;
    if (!has_tokenizer) j["note"] = "no tokenizer files: text is empty, token_ids are the output";
    j["finish_reason"] = r.finish_reason;
    j["load"] = load;
    j["timings"] = {{"prompt_tokens", r.prompt_tokens},
                    {"generated_tokens", r.tokens.size()},
                    {"prefill_seconds", r.prefill_seconds},
                    {"decode_seconds", r.decode_seconds},
                    {"prefill_tokens_per_second", r.prefill_tokens_per_second()},
                    {"decode_tokens_per_second", r.decode_tokens_per_second()}};
#ifdef FDPP_HAVE_CUDA
    // The asynchronized softmax's guard: decode attention rows recomputed (issue 5's fallback rate).
    if (auto* gpu = dynamic_cast<cuda::CudaEngine*>(engine.get())) {
      j["attention"] = {{"mode", e.attention},
                        {"decode_rows", gpu->attention_rows()},
                        {"unified_rows", gpu->attention_unified_rows()},
                        {"fallback_rows", gpu->attention_fallback_rows()},
                        {"prefill_rows", gpu->prefill_attention_rows()},
                        {"prefill_fallback_rows", gpu->prefill_attention_fallback_rows()}};
    }
#endif
    // Invalid UTF-8 (a model can emit it) is replaced rather than aborting the dump.
    write_stdout(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
  } else {
    // The stats go to stderr on a line of their own: stdout ends with a newline (flushed) first, so
    // the two never run together when they share a terminal or a pipe.
    if (!ends_with_newline || r.text.empty()) write_stdout("\n");
    if (!has_tokenizer) {  // no text to stream: the ids are the output
      std::string ids;
      for (int32_t t : r.tokens) ids += fmt::format("{}{}", ids.empty() ? "" : ",", t);
      write_stdout(ids + "\n");
    }
    if (!quiet) fmt::print(stderr, "{}\n", load_line(load));
    fmt::print(stderr, "prefill: {} tokens, {:.1f} tokens/s | decode: {} tokens, {:.1f} tokens/s | seed {}\n",
               r.prompt_tokens, r.prefill_tokens_per_second(), r.tokens.size(), r.decode_tokens_per_second(),
               a.sampling.seed);
  }
  return 0;
}

}  // namespace

Subcommand register_generate(CLI::App& app) {
  static GenerateArgs a;
  static EngineArgs engine;
  static bool quiet = false;
  static int64_t seed = -1;
  static bool escape = true;
  static bool conversation = false;
  static std::string system_file;
  auto* gen = app.add_subcommand("generate",
                                 "generate text (streams to stdout), chat (-cnv, -i), or run a prompts "
                                 "file (--file)");
  const std::string kPrompt = "Prompt", kChat = "Chat (-cnv, -i)", kSampling = "Sampling", kOutput = "Output";
  auto* prompt_opt = gen->add_option("-p,--prompt", a.prompt,
                                     "prompt text; - reads it from stdin; with -cnv the "
                                     "first message")
                         ->group(kPrompt);
  auto* ids_opt = gen->add_option("--token-ids", a.token_ids, "prompt as token ids, e.g. 1,2,3")
                      ->group(kPrompt)
                      ->check(CLI::Validator(
                          [](std::string& s) -> std::string {
                            try {
                              parse_token_ids(s);
                              return "";
                            } catch (const UsageError& e) {
                              return std::string(e.what()).substr(std::string("--token-ids: ").size());
                            }
                          },
                          ""));
  auto* file_opt = gen->add_option("-f,--file", a.file,
                                   "prompts file run as one batch: .jsonl (\"prompt\" or \"messages\", optional "
                                   "sampling fields per line) or text (one prompt per line; - reads stdin); "
                                   "writes JSON Lines")
                       ->group(kPrompt);
  prompt_opt->excludes(ids_opt);
  file_opt->excludes(prompt_opt)->excludes(ids_opt);
  auto* system_opt =
      gen->add_option("--system,--system-prompt", a.system, "system message (implies --chat; -sys)")->group(kPrompt);
  auto* system_file_opt =
      gen->add_option("--system-prompt-file", system_file, "the system message from a file (-sysf)")->group(kPrompt);
  system_file_opt->excludes(system_opt);
  auto* chat_opt = gen->add_flag("--chat", a.chat, "wrap the prompt in the model's chat template")->group(kPrompt);
  gen->add_flag("-e,--escape,!--no-escape", escape,
                "process \\n \\r \\t \\' \\\" \\\\ \\xNN in --prompt (default: on, as llama.cpp)")
      ->group(kPrompt);

  auto* interactive_opt =
      gen->add_flag("-i,--interactive,--conversation", conversation,
                    "chat: read messages at a > prompt, keep the history, render it with the chat template each "
                    "turn, stream each reply (-cnv)")
          ->group(kChat);
  static bool no_conversation = false;  // the default: taken for llama.cpp's -no-cnv
  gen->add_flag("--no-conversation", no_conversation, "no chat (-no-cnv; the default of fdpp generate)")->group(kChat);
  gen->add_flag("--single-turn", a.single_turn, "chat: one reply, then exit (-st)")->group(kChat);
  gen->add_flag("--multiline-input", a.multiline,
                "chat: a message ends with a line ending in / (-mli); without it a line ending in \\ continues")
      ->group(kChat);
  gen->add_option("--color", a.color, "chat: color the user's input: on, off or auto (a terminal) (-co)")
      ->expected(0, 1)
      ->default_str("auto")
      ->check(CLI::IsMember({"", "on", "off", "auto"}))
      ->group(kChat);
  gen->add_flag("--verbose-prompt", a.verbose_prompt, "print the rendered prompt on stderr before each reply")
      ->group(kChat);

  auto* n_opt = gen->add_option("-n,--max-tokens,--n-predict", a.max_tokens,
                                "tokens to generate (-1: until the context is full, the chat's default)")
                    ->capture_default_str()
                    ->group(kSampling)
                    ->check(CLI::Validator(
                        [](std::string& s) -> std::string {
                          if (s == "-1") return "";
                          const std::string p = int_check(max_tokens_problem)(s);
                          return p.empty() || !s.starts_with('-') ? p : p + ", or -1 (until the context is full)";
                        },
                        ""));
  gen->add_option("--temperature,--temp", a.sampling.temperature, "0 = greedy")
      ->capture_default_str()
      ->group(kSampling)
      ->check(real_check(temperature_problem));
  gen->add_option("--top-k", a.sampling.top_k, "keep the k most likely tokens (0 = off)")
      ->capture_default_str()
      ->group(kSampling)
      ->check(int_check(top_k_problem));
  gen->add_option("--top-p", a.sampling.top_p, "nucleus sampling mass in (0, 1] (1 = off)")
      ->capture_default_str()
      ->group(kSampling)
      ->check(real_check(top_p_problem));
  gen->add_option("--min-p", a.sampling.min_p, "drop tokens below min-p x the top probability (0 = off)")
      ->capture_default_str()
      ->group(kSampling)
      ->check(real_check(min_p_problem));
  gen->add_option("--repeat-penalty", a.sampling.repeat_penalty, "penalty for repeated tokens (1 = off)")
      ->capture_default_str()
      ->group(kSampling)
      ->check(real_check(repeat_penalty_problem));
  gen->add_option("--repeat-last-n", a.sampling.repeat_last_n, "tokens the penalty looks back over (-1 = all)")
      ->capture_default_str()
      ->group(kSampling)
      ->check(int_check(repeat_last_n_problem));
  // llama.cpp's flags for OpenAI's penalties (over the generated tokens; the table's range).
  gen->add_option("--presence-penalty", a.sampling.presence_penalty, "subtracted once from generated tokens (0 = off)")
      ->capture_default_str()
      ->group(kSampling)
      ->check(real_check([](double v) { return param_problem(request_param("presence_penalty"), v); }));
  gen->add_option("--frequency-penalty", a.sampling.frequency_penalty,
                  "subtracted per occurrence from generated tokens (0 = off)")
      ->capture_default_str()
      ->group(kSampling)
      ->check(real_check([](double v) { return param_problem(request_param("frequency_penalty"), v); }));
  gen->add_option("-s,--seed", seed, "random seed; -1 (default): a random one, printed with the stats / in --json")
      ->capture_default_str()
      ->group(kSampling)
      ->check(int_range(-1, INT64_MAX, "[-1, 2^63)"));
  gen->add_option("--stop,-r,--reverse-prompt", a.stop, "stop string: the text ends before it (repeatable)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->group(kSampling)
      ->check(CLI::Validator(
          [](std::string& s) -> std::string {
            const std::string p = stop_problem(s);
            return p.empty() ? "" : fmt::format("'{}' {}", s, p);
          },
          ""));
  gen->add_flag("--ignore-eos", a.ignore_eos, "keep generating past end-of-generation tokens")->group(kSampling);
  gen->add_flag("--json", a.json, "print one JSON object (token_ids, text, seed, timings) instead of streaming")
      ->group(kOutput);
  gen->add_flag("--unordered", a.unordered, "with --file: write each result as it finishes (with its index)")
      ->group(kOutput);
  gen->add_flag("--quiet", quiet, "no load progress bar or load line on stderr")->group(kOutput);
  static std::string chat_kwargs;
  auto* kwargs_opt = gen->add_option("--chat-template-kwargs", chat_kwargs,
                                     "chat template variables as JSON, e.g. '{\"enable_thinking\": false}' (Qwen3)")
                         ->group(kPrompt);
  ids_opt->excludes(system_opt)->excludes(chat_opt)->excludes(interactive_opt)->excludes(kwargs_opt);
  file_opt->excludes(interactive_opt);
  add_engine_flags(gen, engine, kGenerate);
  auto run = [prompt_opt, n_opt]() -> int {
    check_engine_flags(engine);
    // A random seed unless one is given (llama.cpp's rule); it is printed, so a run can be repeated.
    a.sampling.seed = seed >= 0 ? static_cast<uint64_t>(seed) : random_seed();
    a.interactive = conversation;
    if (prompt_opt->count() > 0) {
      if (escape && a.prompt != "-") a.prompt = process_escapes(a.prompt);
      a.prompt = prompt_text("--prompt", a.prompt);
    }
    if (escape)  // llama.cpp processes its reverse prompts (-r) too
      for (std::string& s : a.stop) s = process_escapes(s);
    if (!system_file.empty()) {
      a.system = read_file(system_file, size_t{16} << 20, "--system-prompt-file");
      while (a.system.ends_with('\n')) a.system.pop_back();
      if (a.system.empty()) throw UsageError(fmt::format("--system-prompt-file {}: the file is empty", system_file));
    }
    if (!a.system.empty()) {
      if (std::string p = utf8_problem(a.system); !p.empty()) throw UsageError("--system: " + p);
    }
    if (a.stop.size() > kMaxStopStrings)
      throw UsageError(fmt::format("--stop: given {} times; at most {} stop strings are supported", a.stop.size(),
                                   kMaxStopStrings));
    if (a.unordered && a.file.empty()) throw UsageError("--unordered: only with --file");
    if (!chat_kwargs.empty()) {
      try {
        a.chat_options = parse_chat_template_kwargs(chat_kwargs);
      } catch (const Error& e) {
        throw UsageError(std::string("--chat-template-kwargs: ") + e.what());
      }
    }
    if (!a.file.empty() && a.max_tokens <= 0)
      throw UsageError(
          fmt::format("--max-tokens {}: each request of a prompts file generates at least 1 token", a.max_tokens));
    if (a.color.empty()) a.color = "on";  // -co alone
    if (a.interactive) {
      if (a.json) throw UsageError("--json: not with the chat (-cnv, -i)");
      if (n_opt->count() == 0) a.max_tokens = -1;  // a reply runs to its end, as in llama-cli
      if (a.max_tokens == 0) throw UsageError("--max-tokens 0: a chat reply needs at least 1 token");
      say_gpu_layers(engine);
      return run_chat(a, engine, quiet);
    }
    if (a.single_turn || a.multiline || a.verbose_prompt)
      throw UsageError(fmt::format("{}: only with the chat (-cnv, -i)", a.single_turn ? "--single-turn"
                                                                        : a.multiline ? "--multiline-input"
                                                                                      : "--verbose-prompt"));
    if (a.file.empty() && prompt_opt->count() == 0 && a.token_ids.empty())
      throw UsageError("generate needs --prompt TEXT, --token-ids 1,2,3, --file FILE, or -cnv for a chat");
    say_gpu_layers(engine);
    return a.file.empty() ? run_generate(a, engine, quiet) : run_generate_file(a, engine, quiet);
  };
  return {gen, run};
}

}  // namespace fdpp::cli
