#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <unordered_set>

#include "engine/request_limits.h"
#include "fdpp/error.h"

namespace fdpp {

namespace {

void renormalize(std::vector<Candidate>& c) {
  double sum = 0.0;
  for (const auto& x : c) sum += x.prob;
  for (auto& x : c) x.prob = static_cast<float>(x.prob / sum);
}

}  // namespace

void check_sampling_params(const SamplingParams& params) {
  // The table every entrance checks (engine/request_limits.h); the fields print as floats, so a value
  // that an entrance refused is named the same way here. seed: any 64-bit value is a key.
  auto real = [](std::string_view name, float v) {
    const std::string problem = param_problem(request_param(name), static_cast<double>(v));
    if (!problem.empty()) fail("{}", param_message(name, show_value(v), problem));
  };
  auto integer = [](std::string_view name, int v) {
    if (std::string m = check_request_param(name, int64_t{v}); !m.empty()) fail("{}", m);
  };
  real("temperature", params.temperature);
  integer("top_k", params.top_k);
  real("top_p", params.top_p);
  real("min_p", params.min_p);
  real("repeat_penalty", params.repeat_penalty);
  integer("repeat_last_n", params.repeat_last_n);
}

Sampler::Sampler(const SamplingParams& params) : params_(params) { check_sampling_params(params); }

double keyed_uniform(uint64_t seed, uint64_t index) {
  uint32_t c[4] = {static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32), 0u, 0u};
  uint32_t k[2] = {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      k[0] += 0x9E3779B9u;
      k[1] += 0xBB67AE85u;
    }
    const uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * c[0];
    const uint64_t p1 = static_cast<uint64_t>(0xCD9E8D57u) * c[2];
    const uint32_t lo0 = static_cast<uint32_t>(p0), hi0 = static_cast<uint32_t>(p0 >> 32);
    const uint32_t lo1 = static_cast<uint32_t>(p1), hi1 = static_cast<uint32_t>(p1 >> 32);
    const uint32_t n0 = hi1 ^ c[1] ^ k[0], n2 = hi0 ^ c[3] ^ k[1];
    c[0] = n0;
    c[1] = lo1;
    c[2] = n2;
    c[3] = lo0;
  }
  const uint64_t bits = (static_cast<uint64_t>(c[0] >> 5) << 26) | (c[1] >> 6);  // 27 + 26 = 53 bits
  return static_cast<double>(bits) * 0x1.0p-53;
}

int32_t argmax(std::span<const float> logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

void Sampler::apply_token_mask(std::vector<float>& logits, std::span<const uint32_t> allowed) {
  if (allowed.empty()) return;
  check(allowed.size() * 32 >= logits.size(), "sample: a token mask of {} words for {} logits", allowed.size(),
        logits.size());
  bool any = false;
  for (size_t i = 0; i < logits.size(); ++i) {
    if ((allowed[i >> 5] >> (i & 31)) & 1u) any = true;
    else logits[i] = -INFINITY;
  }
  check(any, "sample: the token mask allows no token");
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

int32_t Sampler::sample(std::span<const float> logits_in, std::span<const int32_t> history, uint64_t index,
                        std::span<const uint32_t> allowed) {
  check(!logits_in.empty(), "sample: empty logits");
  std::vector<float> logits(logits_in.begin(), logits_in.end());
  apply_token_mask(logits, allowed);
  apply_repetition_penalty(logits, history, params_.repeat_penalty, params_.repeat_last_n);
  if (params_.temperature <= 0.0f) return argmax(logits);

  std::vector<Candidate> c;
  c.reserve(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) {
    if (std::isnan(logits[i])) fail("sample: logit {} is NaN", i);
    if (!allowed.empty() && !((allowed[i >> 5] >> (i & 31)) & 1u)) continue;  // masked out: never drawn
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

  const double r = keyed_uniform(params_.seed, index);
  double cum = 0.0;
  for (const auto& x : c) {
    cum += x.prob;
    if (r < cum) return x.id;
  }
  return c.back().id;
}

}  // namespace fdpp
