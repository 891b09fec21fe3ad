// Sampling parameters, with llama.cpp's defaults. temperature <= 0 means greedy (argmax).
#pragma once

#include <cstdint>
#include <vector>

namespace fdpp {

// One entry of OpenAI's logit_bias: `bias` is added to the token's logit before anything else. The
// scheduler also uses -inf entries to hold tokens back (min_tokens): -inf sets the logit to -inf.
struct LogitBias {
  int32_t id = 0;
  float bias = 0.0f;
};

struct SamplingParams {
  float temperature = 0.8f;
  int top_k = 40;           // <= 0: off
  float top_p = 0.95f;      // >= 1: off
  float min_p = 0.05f;      // <= 0: off
  float repeat_penalty = 1.0f;  // 1: off
  int repeat_last_n = 64;   // how many recent tokens the penalty looks at; -1: all
  uint64_t seed = 0xf0d0ULL;
  // OpenAI's penalties over the tokens generated so far (not the prompt): a token's logit loses
  // presence_penalty once if it occurred and frequency_penalty per occurrence. 0: off.
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  std::vector<LogitBias> logit_bias;  // added to the logits, in [-100, 100] (OpenAI's range)
  // Until min_tokens tokens are generated, the ids of min_tokens_ids get the logit -inf (the
  // scheduler fills them: the end-of-generation ids and the request's stop ids).
  int min_tokens = 0;
  std::vector<int32_t> min_tokens_ids;
  // -1: none. k >= 0: the sampled token's log probability and the k most likely tokens', of the
  // model's own distribution (log-softmax of the raw logits, before the bias, the penalties and the
  // temperature: vLLM's default), at most kMaxLogprobs.
  int logprobs = -1;
};

inline constexpr int kMaxLogprobs = 20;  // OpenAI's top_logprobs bound (vLLM's max_logprobs default)

struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0.0f;
};

// What a sampled token gets when SamplingParams::logprobs >= 0.
struct TokenLogprobs {
  float logprob = 0.0f;           // the sampled token's
  int32_t rank = 0;               // 1 + how many tokens have a larger raw logit
  std::vector<TokenLogprob> top;  // the k largest, descending (ties: the lower id first)
};

}  // namespace fdpp
