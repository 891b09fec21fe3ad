// Turns logits into the next token. The filters run in the order vLLM applies them: logit bias and
// the min_tokens mask, repetition penalty, presence and frequency penalties, temperature, top-k,
// top-p, min-p, then one draw from the renormalized distribution. The draw's random number is keyed by (seed, index): Philox4x32-10 with the seed as
// key and the index as counter, the same function the CUDA sampler uses, so a request's tokens
// depend on its seed, its token index and the logits only (not on its batch slot or on the other
// requests sharing the step).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "fdpp/sampling.h"

namespace fdpp {

struct Candidate {
  int32_t id;
  float logit;
  float prob;  // filled by softmax()
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);

  // history: the tokens the repetition penalty looks at (prompt and generated so far); index: the
  // key of the draw's random number (the request's generated-token index).
  // The last `index` tokens of history are the generated ones (the presence and frequency
  // penalties' tokens). logprobs: filled when params().logprobs >= 0 (else untouched).
  // allowed: structured output's token mask (bit id % 32 of word id / 32; empty: every token).
  int32_t sample(std::span<const float> logits, std::span<const int32_t> history, uint64_t index,
                 TokenLogprobs* logprobs = nullptr, std::span<const uint32_t> allowed = {});
  // The same with index = the number of earlier calls of this overload.
  int32_t sample(std::span<const float> logits, std::span<const int32_t> history) {
    return sample(logits, history, next_index_++);
  }

  const SamplingParams& params() const { return params_; }

  // The steps, public so tests can check exactly which tokens each one keeps.
  // Structured output's hook, before every other filter: tokens outside the mask get -inf and are
  // never drawn (a mask that allows nothing is an error).
  static void apply_token_mask(std::vector<float>& logits, std::span<const uint32_t> allowed);
  static void apply_repetition_penalty(std::vector<float>& logits, std::span<const int32_t> history, float penalty,
                                       int last_n);
  // logit_bias added (a -inf entry sets -inf), and min_tokens_ids set to -inf while index < min_tokens.
  static void apply_logit_bias(std::vector<float>& logits, const SamplingParams& params, uint64_t index);
  // OpenAI's: logit[t] -= count(t) * frequency + (count(t) > 0) * presence, over `generated`.
  static void apply_presence_frequency(std::vector<float>& logits, std::span<const int32_t> generated, float presence,
                                       float frequency);
  // The log-softmax of raw (in double): `token`'s log probability and rank, and the k largest.
  static TokenLogprobs logprobs(std::span<const float> raw, int32_t token, int k);
  // Sorts candidates by logit (descending) and fills prob with the softmax over them.
  static void softmax(std::vector<Candidate>& candidates);
  // Each keeps a prefix of the sorted candidates (always at least one) and renormalizes.
  static void top_k(std::vector<Candidate>& sorted, int k);
  static void top_p(std::vector<Candidate>& sorted, float p);   // smallest prefix with mass >= p
  static void min_p(std::vector<Candidate>& sorted, float p);   // prob >= p * max prob

 private:
  int32_t sample_adjusted(std::span<const float> logits, std::span<const int32_t> history, uint64_t index,
                          std::span<const uint32_t> allowed);
  SamplingParams params_;
  uint64_t next_index_ = 0;
};

// [0, 1) with 53 random bits: Philox4x32-10 (Salmon et al., SC'11) keyed by seed at counter
// (index, 0); bit for bit the CUDA sampler's uniform01.
double keyed_uniform(uint64_t seed, uint64_t index);

// Validates sampling parameters against the table of request limits (engine/request_limits.h); throws
// fdpp::Error with the table's message naming the bad one ("\"top_p\" 0 must be in (0, 1] (1 = off)").
void check_sampling_params(const SamplingParams& params);

int32_t argmax(std::span<const float> logits);

// The seed of choice `choice` > 0 of a request seeded `seed` when a request asks for n choices (the
// server's n, Python's SamplingParams.n): splitmix64 of the pair, so the choices are unrelated
// streams and a seeded request with n choices is reproducible.
uint64_t derived_seed(uint64_t seed, uint64_t choice);

}  // namespace fdpp
