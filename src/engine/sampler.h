// Turns logits into the next token. The filters run in the order HF transformers and vLLM apply
// them: repetition penalty, temperature, top-k, top-p, min-p, then one draw from the renormalized
// distribution. Same seed, same logits -> same tokens.
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

  // history: the tokens the repetition penalty looks at (prompt and generated so far).
  int32_t sample(std::span<const float> logits, std::span<const int32_t> history);

  const SamplingParams& params() const { return params_; }

  // The steps, public so tests can check exactly which tokens each one keeps.
  static void apply_repetition_penalty(std::vector<float>& logits, std::span<const int32_t> history, float penalty,
                                       int last_n);
  // Sorts candidates by logit (descending) and fills prob with the softmax over them.
  static void softmax(std::vector<Candidate>& candidates);
  // Each keeps a prefix of the sorted candidates (always at least one) and renormalizes.
  static void top_k(std::vector<Candidate>& sorted, int k);
  static void top_p(std::vector<Candidate>& sorted, float p);   // smallest prefix with mass >= p
  static void min_p(std::vector<Candidate>& sorted, float p);   // prob >= p * max prob

 private:
  double uniform();  // [0, 1), 53 random bits from a standard-defined engine

  SamplingParams params_;
  uint64_t state_[4];
};

int32_t argmax(std::span<const float> logits);

}  // namespace fdpp
