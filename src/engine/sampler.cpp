#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <unordered_set>

#include "fdpp/error.h"

namespace fdpp {

namespace {

uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

void renormalize(std::vector<Candidate>& c) {
  double sum = 0.0;
  for (const auto& x : c) sum += x.prob;
  for (auto& x : c) x.prob = static_cast<float>(x.prob / sum);
}

}  // namespace

Sampler::Sampler(const SamplingParams& params) : params_(params) {
  check(std::isfinite(params.temperature), "temperature must be a finite number");
  check(params.top_p > 0 && params.top_p <= 1.0f, "top-p = {} must be in (0, 1]", params.top_p);
  check(params.min_p >= 0 && params.min_p <= 1.0f, "min-p = {} must be in [0, 1]", params.min_p);
  check(params.repeat_penalty > 0 && std::isfinite(params.repeat_penalty), "repeat penalty = {} must be positive",
        params.repeat_penalty);
  // xoshiro256** seeded through splitmix64: fully specified, so a seed gives the same stream on
  // every platform and compiler (std::uniform_real_distribution does not promise that).
  uint64_t s = params.seed;
  for (auto& word : state_) word = splitmix64(s);
}

double Sampler::uniform() {
  const uint64_t result = rotl(state_[1] * 5, 7) * 9;
  const uint64_t t = state_[1] << 17;
  state_[2] ^= state_[0];
  state_[3] ^= state_[1];
  state_[1] ^= state_[2];
  state_[0] ^= state_[3];
  state_[2] ^= t;
  state_[3] = rotl(state_[3], 45);
  return static_cast<double>(result >> 11) * 0x1.0p-53;
}

int32_t argmax(std::span<const float> logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

void Sampler::apply_repetition_penalty(std::vector<float>& logits, std::span<const int32_t> history, float penalty,
                                       int last_n) {
  if (penalty == 1.0f || history.empty()) return;
  size_t n = history.size();
  if (last_n >= 0) n = std::min(n, static_cast<size_t>(last_n));
  std::unordered_set<int32_t> seen(history.end() - static_cast<std::ptrdiff_t>(n), history.end());
  // HF's RepetitionPenaltyLogitsProcessor: positive logits are divided, negative multiplied.
  for (int32_t id : seen) {
    if (id < 0 || static_cast<size_t>(id) >= logits.size()) continue;
    float& l = logits[id];
    l = l > 0 ? l / penalty : l * penalty;
  }
}

void Sampler::softmax(std::vector<Candidate>& c) {
  std::sort(c.begin(), c.end(), [](const Candidate& a, const Candidate& b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
  });
  const float max_logit = c.front().logit;
  double sum = 0.0;
  for (auto& x : c) {
    x.prob = std::exp(x.logit - max_logit);
    sum += x.prob;
  }
  for (auto& x : c) x.prob = static_cast<float>(x.prob / sum);
}

void Sampler::top_k(std::vector<Candidate>& c, int k) {
  if (k <= 0 || static_cast<size_t>(k) >= c.size()) return;
  c.resize(k);
  renormalize(c);
}

void Sampler::top_p(std::vector<Candidate>& c, float p) {
  if (p >= 1.0f) return;
  double cum = 0.0;
  size_t keep = c.size();
  for (size_t i = 0; i < c.size(); ++i) {
    cum += c[i].prob;
    if (cum >= p) {
      keep = i + 1;
      break;
    }
  }
  c.resize(keep);
  renormalize(c);
}

void Sampler::min_p(std::vector<Candidate>& c, float p) {
  if (p <= 0.0f) return;
  const float threshold = p * c.front().prob;
  size_t keep = 1;
  while (keep < c.size() && c[keep].prob >= threshold) ++keep;
  c.resize(keep);
  renormalize(c);
}

int32_t Sampler::sample(std::span<const float> logits_in, std::span<const int32_t> history) {
  check(!logits_in.empty(), "sample: empty logits");
  std::vector<float> logits(logits_in.begin(), logits_in.end());
  apply_repetition_penalty(logits, history, params_.repeat_penalty, params_.repeat_last_n);
  if (params_.temperature <= 0.0f) return argmax(logits);

  std::vector<Candidate> c;
  c.reserve(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) {
    if (std::isnan(logits[i])) fail("sample: logit {} is NaN", i);
    c.push_back({static_cast<int32_t>(i), logits[i] / params_.temperature, 0.f});
  }
  // top-k first on the raw order, so that the sort below runs over k entries, not the vocabulary.
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < c.size()) {
    std::nth_element(c.begin(), c.begin() + params_.top_k, c.end(), [](const Candidate& a, const Candidate& b) {
      return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
    });
    c.resize(params_.top_k);
  }
  softmax(c);
  top_p(c, params_.top_p);
  min_p(c, params_.min_p);

  const double r = uniform();
  double cum = 0.0;
  for (const auto& x : c) {
    cum += x.prob;
    if (r < cum) return x.id;
  }
  return c.back().id;
}

}  // namespace fdpp
