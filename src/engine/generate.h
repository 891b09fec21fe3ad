// The generation loop: prefill the prompt, then decode one token at a time, sampling each and
// streaming the text as it becomes complete UTF-8.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "fdpp/sampling.h"
#include "engine/engine.h"
#include "engine/runner.h"
#include "tokenizer/tokenizer.h"

namespace fdpp {

struct GenerateOptions {
  int max_tokens = 128;
  bool ignore_eos = false;
  SamplingParams sampling;
  std::vector<std::string> stop;  // stop strings: the text ends before the first one (engine path only)
};

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated ids (the end-of-generation token included when hit)
  std::string text;             // their text, special tokens skipped
  int prompt_tokens = 0;
  double prefill_seconds = 0;   // prompt forward pass, up to the first token's logits
  double decode_seconds = 0;    // every later forward pass
  std::string finish_reason;    // "stop" (end-of-generation token or stop string) or "length"
  double prefill_tokens_per_second() const;
  double decode_tokens_per_second() const;  // tokens after the first, over decode time
};

// runner must be fresh (empty cache) and hold prompt + max_tokens positions.
GenerateResult generate(Runner& runner, const Tokenizer& tokenizer, std::span<const int32_t> prompt,
                        const GenerateOptions& options, const std::function<void(std::string_view)>& on_text = {});

// The same on the batched engine: one request through the continuous-batching Scheduler (the path
// the server and `generate --file` take, so a prompt gives the same tokens alone or in a batch).
// Its token draws are keyed like the runner's (seed, token index), so both give the same output.
GenerateResult generate(Engine& engine, const Tokenizer& tokenizer, std::span<const int32_t> prompt,
                        const GenerateOptions& options, const std::function<void(std::string_view)>& on_text = {});

}  // namespace fdpp
