#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>

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
  real("presence_penalty", params.presence_penalty);
  real("frequency_penalty", params.frequency_penalty);
  integer("min_tokens", params.min_tokens);
  if (params.logprobs != -1) integer("logprobs", params.logprobs);
  if (std::string m = list_count_message("logit_bias", params.logit_bias.size()); !m.empty()) fail("{}", m);
  for (const LogitBias& b : params.logit_bias) {
    check(b.id >= 0, "\"logit_bias\": token id {} is negative", b.id);
    const std::string problem = param_problem(request_param("logit_bias_value"), static_cast<double>(b.bias));
    if (!problem.empty()) fail("{}", param_message(fmt::format("logit_bias[{}]", b.id), show_value(b.bias), problem));
  }
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

uint64_t derived_seed(uint64_t seed, uint64_t choice) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ULL * (choice + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
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

void Sampler::apply_logit_bias(std::vector<float>& logits, const SamplingParams& params, uint64_t index) {
  const int64_t vocab = static_cast<int64_t>(logits.size());
  auto add = [&](int32_t id, float bias) {
    if (id < 0 || id >= vocab) return;
    logits[id] = bias == -INFINITY ? -INFINITY : logits[id] + bias;
  };
  for (const LogitBias& b : params.logit_bias) add(b.id, b.bias);
  if (index < static_cast<uint64_t>(std::max(params.min_tokens, 0)))
    for (int32_t id : params.min_tokens_ids) add(id, -INFINITY);
}

void Sampler::apply_presence_frequency(std::vector<float>& logits, std::span<const int32_t> generated, float presence,
                                       float frequency) {
  if ((presence == 0.0f && frequency == 0.0f) || generated.empty()) return;
  std::unordered_map<int32_t, int> counts;
  for (int32_t id : generated)
    if (id >= 0 && static_cast<size_t>(id) < logits.size()) ++counts[id];
  // An explicit fused multiply-add, as the CUDA kernel computes it: one rounding on both, whatever
  // the compiler would contract.
  for (const auto& [id, n] : counts) logits[id] = logits[id] - std::fma(static_cast<float>(n), frequency, presence);
}

TokenLogprobs Sampler::logprobs(std::span<const float> raw, int32_t token, int k) {
  check(!raw.empty() && token >= 0 && static_cast<size_t>(token) < raw.size(), "logprobs: token {} of {} logits",
        token, raw.size());
  auto valid = [](float l) { return std::isnan(l) ? -INFINITY : l; };  // NaN counts as -inf, as on the GPU
  float max_logit = -INFINITY;
  for (float l : raw) max_logit = std::max(max_logit, valid(l));
  double sum = 0.0;
  for (float l : raw) {
    const float v = valid(l);
    sum += v == max_logit ? 1.0 : std::exp(static_cast<double>(v) - max_logit);
  }
  const double lse = static_cast<double>(max_logit) + std::log(sum);
  auto logprob = [&](float l) { return static_cast<float>(static_cast<double>(valid(l)) - lse); };
  TokenLogprobs out;
  out.logprob = logprob(raw[token]);
  const float t = valid(raw[token]);
  int32_t greater = 0;
  for (float l : raw) greater += valid(l) > t;
  out.rank = greater + 1;
  const size_t n = std::min(static_cast<size_t>(std::max(k, 0)), raw.size());
  std::vector<int32_t> ids(raw.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
  std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(n), ids.end(), [&](int32_t a, int32_t b) {
    const float va = valid(raw[a]), vb = valid(raw[b]);
    return va > vb || (va == vb && a < b);
  });
  for (size_t i = 0; i < n; ++i) out.top.push_back({ids[i], logprob(raw[ids[i]])});
  return out;
}

int32_t Sampler::sample(std::span<const float> logits_in, std::span<const int32_t> history, uint64_t index,
                        TokenLogprobs* logprobs_out, std::span<const uint32_t> allowed) {
  check(!logits_in.empty(), "sample: empty logits");
  const int32_t token = sample_adjusted(logits_in, history, index, allowed);
  if (logprobs_out != nullptr && params_.logprobs >= 0) *logprobs_out = logprobs(logits_in, token, params_.logprobs);
  return token;
}

int32_t Sampler::sample_adjusted(std::span<const float> logits_in, std::span<const int32_t> history, uint64_t index,
                                 std::span<const uint32_t> allowed) {
  std::vector<float> logits(logits_in.begin(), logits_in.end());
  apply_logit_bias(logits, params_, index);
  apply_token_mask(logits, allowed);
  apply_repetition_penalty(logits, history, params_.repeat_penalty, params_.repeat_last_n);
  const size_t generated = std::min(history.size(), static_cast<size_t>(index));
  apply_presence_frequency(logits, history.subspan(history.size() - generated), params_.presence_penalty,
                           params_.frequency_penalty);
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
