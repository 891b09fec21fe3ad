#include "engine/generate.h"

#include <chrono>

#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "fdpp/error.h"

namespace fdpp {

double GenerateResult::prefill_tokens_per_second() const {
  return prefill_seconds > 0 ? prompt_tokens / prefill_seconds : 0.0;
}

double GenerateResult::decode_tokens_per_second() const {
  const size_t decoded = tokens.size() > 1 ? tokens.size() - 1 : 0;
  return decode_seconds > 0 ? static_cast<double>(decoded) / decode_seconds : 0.0;
}

GenerateResult generate(Runner& runner, const Tokenizer& tokenizer, std::span<const int32_t> prompt,
                        const GenerateOptions& options, const std::function<void(std::string_view)>& on_text) {
  using Clock = std::chrono::steady_clock;
  check(!prompt.empty(), "the prompt is empty (no tokens to start from)");
  check(options.max_tokens >= 0, "max tokens = {} must be >= 0", options.max_tokens);
  // Stop strings live in the Scheduler (one implementation); refused here rather than ignored.
  check(options.stop.empty(), "stop strings need the engine path, generate(Engine&)");
  const int vocab = runner.config().vocab_size;
  for (int32_t id : prompt) check(id >= 0 && id < vocab, "prompt token id {} is out of range [0, {})", id, vocab);
  check(static_cast<int64_t>(prompt.size()) + options.max_tokens <= runner.max_context(),
        "prompt ({} tokens) + max tokens ({}) exceed the context size {}", prompt.size(), options.max_tokens,
        runner.max_context());

  GenerateResult r;
  r.prompt_tokens = static_cast<int>(prompt.size());
  r.finish_reason = "length";
  if (options.max_tokens == 0) return r;

  Sampler sampler(options.sampling);
  StreamingDetokenizer detok(tokenizer, /*skip_special=*/true);
  std::vector<int32_t> history(prompt.begin(), prompt.end());

  auto t0 = Clock::now();
  int32_t next = runner.forward_sample(prompt, 0, sampler, history, 0);
  r.prefill_seconds = std::chrono::duration<double>(Clock::now() - t0).count();

  auto decode_start = Clock::now();
  for (int step = 0;; ++step) {
    r.tokens.push_back(next);
    history.push_back(next);
    if (!options.ignore_eos && tokenizer.is_end_of_generation(next)) {
      r.finish_reason = "stop";
      break;
    }
    std::string piece = detok.push(next);
    r.text += piece;
    if (on_text && !piece.empty()) on_text(piece);
    if (step + 1 >= options.max_tokens) break;
    next = runner.forward_sample(std::span<const int32_t>(&history.back(), 1), static_cast<int>(history.size()) - 1,
                                 sampler, history, static_cast<uint64_t>(step + 1));
  }
  std::string rest = detok.flush();
  r.text += rest;
  if (on_text && !rest.empty()) on_text(rest);
  r.decode_seconds = std::chrono::duration<double>(Clock::now() - decode_start).count();
  return r;
}

}  // namespace fdpp

namespace fdpp {

GenerateResult generate(Engine& engine, const Tokenizer& tokenizer, std::span<const int32_t> prompt,
                        const GenerateOptions& options, const std::function<void(std::string_view)>& on_text) {
  check(!prompt.empty(), "the prompt is empty (no tokens to start from)");
  check(options.max_tokens >= 0, "max tokens = {} must be >= 0", options.max_tokens);
  GenerateResult r;
  r.prompt_tokens = static_cast<int>(prompt.size());
  r.finish_reason = "length";
  if (options.max_tokens == 0) return r;
  SchedulerOptions so;
  so.max_num_seqs = 1;
  so.max_batched_tokens = engine.limits().max_step_tokens;
  Scheduler scheduler(engine, tokenizer, so);
  GenerationRequest request;
  request.prompt.assign(prompt.begin(), prompt.end());
  request.sampling = options.sampling;
  request.max_tokens = options.max_tokens;
  request.ignore_eos = options.ignore_eos;
  request.stop = options.stop;
  GenerationCallbacks callbacks;
  if (on_text)
    callbacks.on_delta = [&](uint64_t, std::string_view text, std::span<const int32_t>, std::span<const TokenLogprobs>) {
      if (!text.empty()) on_text(text);
    };
  GenerationResult result;
  callbacks.on_finish = [&](const GenerationResult& g) { result = g; };
  scheduler.submit(std::move(request), std::move(callbacks));
  scheduler.run_until_idle();
  check(result.finish_reason != "error", "{}", result.error);
  r.tokens = result.token_ids;
  r.text = result.text;
  r.finish_reason = result.finish_reason;
  r.prefill_seconds = result.time_to_first_token;
  r.decode_seconds = result.total_time - result.time_to_first_token;
  return r;
}

}  // namespace fdpp
