// Sampling: each filter keeps exactly the right set; seeded runs repeat; draws follow the
// distribution.
#include "engine/sampler.h"
#include "fdpp/error.h"
#include "test_util.h"

namespace fdpp {
namespace {

std::vector<Candidate> sorted_candidates(const std::vector<float>& logits) {
  std::vector<Candidate> c;
  for (size_t i = 0; i < logits.size(); ++i) c.push_back({int32_t(i), logits[i], 0});
  Sampler::softmax(c);
  return c;
}

std::vector<int32_t> ids_of(const std::vector<Candidate>& c) {
  std::vector<int32_t> ids;
  for (const auto& x : c) ids.push_back(x.id);
  return ids;
}

TEST(Sampler, SoftmaxSortsAndNormalizes) {
  auto c = sorted_candidates({0.f, 2.f, 1.f});
  EXPECT_EQ(ids_of(c), (std::vector<int32_t>{1, 2, 0}));
  const double e2 = std::exp(2.0), e1 = std::exp(1.0), sum = e2 + e1 + 1;
  EXPECT_NEAR(c[0].prob, e2 / sum, 1e-6);
  EXPECT_NEAR(c[2].prob, 1 / sum, 1e-6);
}

TEST(Sampler, TopKKeepsExactlyTheKLargest) {
  auto c = sorted_candidates({0.1f, 5.f, 3.f, 4.f, -1.f});
  Sampler::top_k(c, 3);
  EXPECT_EQ(ids_of(c), (std::vector<int32_t>{1, 3, 2}));
  double s = 0;
  for (auto& x : c) s += x.prob;
  EXPECT_NEAR(s, 1.0, 1e-6);
}

TEST(Sampler, TopPKeepsTheSmallestPrefixReachingP) {
  // probs 0.5, 0.25, 0.125, 0.125 (logits are log-probs)
  auto c = sorted_candidates({std::log(0.5f), std::log(0.25f), std::log(0.125f), std::log(0.125f)});
  auto a = c;
  Sampler::top_p(a, 0.75f);  // 0.5 + 0.25 reaches 0.75 exactly
  EXPECT_EQ(ids_of(a), (std::vector<int32_t>{0, 1}));
  auto b = c;
  Sampler::top_p(b, 0.76f);  // needs the third
  EXPECT_EQ(b.size(), 3u);
  auto d = c;
  Sampler::top_p(d, 0.1f);  // always at least one
  EXPECT_EQ(ids_of(d), (std::vector<int32_t>{0}));
}

TEST(Sampler, MinPKeepsTokensAboveTheScaledMax) {
  auto c = sorted_candidates({std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)});
  Sampler::min_p(c, 0.25f);  // threshold 0.125: keeps 0.5, 0.3, 0.15
  EXPECT_EQ(ids_of(c), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_NEAR(c[0].prob, 0.5 / 0.95, 1e-5);
}

TEST(Sampler, RepetitionPenaltyDividesPositiveAndMultipliesNegative) {
  std::vector<float> logits{2.f, -2.f, 1.f, 3.f};
  const std::vector<int32_t> history{0, 1, 1, 7 /* out of range: ignored */};
  Sampler::apply_repetition_penalty(logits, history, 2.f, -1);
  EXPECT_EQ(logits, (std::vector<float>{1.f, -4.f, 1.f, 3.f}));
  std::vector<float> l2{2.f, 2.f};
  Sampler::apply_repetition_penalty(l2, std::vector<int32_t>{0, 1}, 2.f, 1);  // only the last token
  EXPECT_EQ(l2, (std::vector<float>{2.f, 1.f}));
}

TEST(Sampler, GreedyIsArgmaxEvenWithFilters) {
  SamplingParams p;
  p.temperature = 0;
  Sampler s(p);
  const auto logits = test::random_vector(1000);
  EXPECT_EQ(s.sample(logits, {}), argmax(logits));
}

TEST(Sampler, SameSeedSameTokensDifferentSeedDifferentTokens) {
  const auto logits = test::random_vector(500, 0.5f);
  auto run = [&](uint64_t seed) {
    SamplingParams p;
    p.temperature = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0;
    p.seed = seed;
    Sampler s(p);
    std::vector<int32_t> out;
    for (int i = 0; i < 64; ++i) out.push_back(s.sample(logits, {}));
    return out;
  };
  EXPECT_EQ(run(42), run(42));
  EXPECT_NE(run(42), run(43));
}

TEST(Sampler, DrawsFollowTheFilteredDistribution) {
  // logits -> probs 0.5, 0.3, 0.2 (plus a token removed by top-k); 20000 draws.
  std::vector<float> logits{std::log(0.5f), std::log(0.3f), std::log(0.2f), std::log(0.001f)};
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 3;
  p.top_p = 1.0f;
  p.min_p = 0;
  p.seed = 7;
  Sampler s(p);
  std::vector<int> counts(4);
  const int n = 20000;
  for (int i = 0; i < n; ++i) counts[s.sample(logits, {})]++;
  EXPECT_EQ(counts[3], 0);
  const double expect[] = {0.5 / 1.0, 0.3, 0.2};
  // 5 standard deviations of a binomial at n = 20000 is under 0.018.
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(counts[i] / double(n), expect[i], 0.018) << i;
}

TEST(Sampler, RejectsImpossibleParameters) {
  SamplingParams p;
  p.top_p = 0;
  EXPECT_THROW(Sampler{p}, Error);
  p = {};
  p.repeat_penalty = 0;
  EXPECT_THROW(Sampler{p}, Error);
  p = {};
  p.min_p = 1.5f;
  EXPECT_THROW(Sampler{p}, Error);
}

}  // namespace
}  // namespace fdpp

namespace fdpp {
namespace {

// OpenAI's penalties, by hand: logits {1, 2, 3, 4}; the prompt holds token 3, the generated tokens
// are 0, 0, 2 (index 3: the last three of the history). presence 0.5, frequency 0.25:
// token 0 (twice): 1 - (2 * 0.25 + 0.5) = 0; token 2 (once): 3 - 0.75 = 2.25; tokens 1 and 3 (only
// in the prompt) keep theirs.
TEST(SamplerPenalties, PresenceAndFrequencyOverTheGeneratedTokens) {
  std::vector<float> l = {1.f, 2.f, 3.f, 4.f};
  const std::vector<int32_t> history = {3, 0, 0, 2};
  Sampler::apply_presence_frequency(l, std::span<const int32_t>(history).subspan(1), 0.5f, 0.25f);
  EXPECT_EQ(l, (std::vector<float>{0.f, 2.f, 2.25f, 4.f}));
  // Negative values encourage repetition.
  std::vector<float> m = {1.f, 2.f, 3.f, 4.f};
  Sampler::apply_presence_frequency(m, std::span<const int32_t>(history).subspan(1), -1.f, -2.f);
  EXPECT_EQ(m, (std::vector<float>{6.f, 2.f, 6.f, 4.f}));
}

TEST(SamplerPenalties, SampleAppliesThemToTheGeneratedPartOnly) {
  SamplingParams p;
  p.temperature = 0;
  p.presence_penalty = 2.f;
  Sampler s(p);
  // Token 3 leads by 1; generated once, it loses 2 and token 2 wins. In the prompt it would not.
  const std::vector<float> logits = {0.f, 1.f, 3.f, 4.f};
  const std::vector<int32_t> history = {1, 3};
  EXPECT_EQ(s.sample(logits, history, /*index=*/1), 2);
  EXPECT_EQ(s.sample(logits, history, /*index=*/0), 3);  // 3 is a prompt token here
}

TEST(SamplerPenalties, LogitBiasAddsAndMinTokensMasks) {
  SamplingParams p;
  p.temperature = 0;
  p.logit_bias = {{1, 2.5f}, {3, -100.f}};
  std::vector<float> l = {0.f, 1.f, 3.f, 4.f};
  Sampler::apply_logit_bias(l, p, 0);
  EXPECT_EQ(l, (std::vector<float>{0.f, 3.5f, 3.f, -96.f}));
  EXPECT_EQ(Sampler(p).sample(std::vector<float>{0.f, 1.f, 3.f, 4.f}, {}, 0), 1);
  // min_tokens: the ids are -inf while index < min_tokens, untouched from then on.
  SamplingParams q;
  q.min_tokens = 2;
  q.min_tokens_ids = {3};
  std::vector<float> a = {0.f, 1.f, 3.f, 4.f}, b = a;
  Sampler::apply_logit_bias(a, q, 1);
  Sampler::apply_logit_bias(b, q, 2);
  EXPECT_EQ(a[3], -INFINITY);
  EXPECT_EQ(b[3], 4.f);
  q.temperature = 0;
  EXPECT_EQ(Sampler(q).sample(std::vector<float>{0.f, 1.f, 3.f, 4.f}, {}, 1), 2);
  EXPECT_EQ(Sampler(q).sample(std::vector<float>{0.f, 1.f, 3.f, 4.f}, {}, 2), 3);
  // With temperature a masked token is never drawn.
  q.temperature = 1.f;
  q.top_k = 0;
  q.top_p = 1.f;
  q.min_p = 0.f;
  Sampler r(q);
  for (uint64_t i = 0; i < 200; ++i) EXPECT_NE(r.sample(std::vector<float>{0.f, 1.f, 3.f, 9.f}, {}, 0), 3);
}

// vLLM's order: the bias before the repetition penalty (2 + 1 = 3, / 2 = 1.5), the presence
// penalty after it (1.5 - 1 = 0.5).
TEST(SamplerPenalties, OrderIsBiasRepetitionThenPresence) {
  SamplingParams p;
  p.temperature = 0;
  p.logit_bias = {{0, 1.f}};
  p.repeat_penalty = 2.f;
  p.repeat_last_n = -1;
  p.presence_penalty = 1.f;
  // Token 0's adjusted logit is 0.5 and token 1's is 0.6: 1 wins. In any other order token 0
  // would have 2 / 2 + 1 - 1 = 1 or (2 - 1 + 1) / 2 = 1, above 0.6.
  EXPECT_EQ(Sampler(p).sample(std::vector<float>{2.f, 0.6f}, std::vector<int32_t>{0}, 1), 1);
}

TEST(SamplerLogprobs, LogSoftmaxRankAndTopK) {
  // log-softmax of {ln 1, ln 2, ln 2, ln 5} = ln(p) with p = {0.1, 0.2, 0.2, 0.5}.
  const std::vector<float> raw = {0.f, std::log(2.f), std::log(2.f), std::log(5.f)};
  const TokenLogprobs t = Sampler::logprobs(raw, 2, 3);
  EXPECT_NEAR(t.logprob, std::log(0.2), 1e-6);
  EXPECT_EQ(t.rank, 2);  // only token 3 is larger; the tie with token 1 does not count
  ASSERT_EQ(t.top.size(), 3u);
  EXPECT_EQ(t.top[0].id, 3);
  EXPECT_EQ(t.top[1].id, 1);  // tie: the lower id first
  EXPECT_EQ(t.top[2].id, 2);
  EXPECT_NEAR(t.top[0].logprob, std::log(0.5), 1e-6);
  EXPECT_NEAR(t.top[2].logprob, std::log(0.2), 1e-6);
  EXPECT_TRUE(Sampler::logprobs(raw, 0, 0).top.empty());
  EXPECT_EQ(Sampler::logprobs(raw, 0, 9).top.size(), 4u);  // k beyond the vocabulary: all of it
}

TEST(SamplerLogprobs, AreOfTheRawLogitsAndTopIsGreedy) {
  SamplingParams p;
  p.temperature = 0;
  p.logprobs = 2;
  p.logit_bias = {{0, 10.f}};
  const std::vector<float> raw = {1.f, 3.f, 2.f};
  TokenLogprobs t;
  EXPECT_EQ(Sampler(p).sample(raw, {}, 0, &t), 0);  // the bias decides the draw...
  EXPECT_EQ(t.top[0].id, 1);                         // ...not the log probabilities
  EXPECT_EQ(t.rank, 3);
  EXPECT_NEAR(t.logprob, Sampler::logprobs(raw, 0, 0).logprob, 0);
  p.logit_bias.clear();
  const int32_t token = Sampler(p).sample(raw, {}, 0, &t);
  EXPECT_EQ(token, t.top[0].id);  // greedy = the top logprob
  SamplingParams none;
  TokenLogprobs untouched;
  untouched.rank = -7;
  Sampler(none).sample(raw, {}, 0, &untouched);
  EXPECT_EQ(untouched.rank, -7);  // logprobs -1: not filled
}

TEST(SamplerChecks, NewFieldsAreRangeChecked) {
  auto refused = [](auto edit) {
    SamplingParams p;
    edit(p);
    try {
      Sampler s(p);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(refused([](SamplingParams& p) { p.presence_penalty = 2.5f; }).find("\"presence_penalty\" 2.5 must be in [-2, 2]"),
            std::string::npos);
  EXPECT_NE(refused([](SamplingParams& p) { p.frequency_penalty = -3.f; }).find("frequency_penalty"), std::string::npos);
  EXPECT_NE(refused([](SamplingParams& p) { p.logprobs = 21; }).find("\"logprobs\" 21"), std::string::npos);
  EXPECT_NE(refused([](SamplingParams& p) { p.logit_bias = {{5, 101.f}}; }).find("\"logit_bias[5]\" 101"),
            std::string::npos);
  EXPECT_NE(refused([](SamplingParams& p) { p.min_tokens = -1; }).find("min_tokens"), std::string::npos);
  EXPECT_EQ(refused([](SamplingParams& p) {
              p.presence_penalty = -2.f;
              p.frequency_penalty = 2.f;
              p.logprobs = 20;
              p.logit_bias = {{1, -100.f}, {2, 100.f}};
            }),
            "");
}

TEST(SamplerSeeds, DerivedSeedsDifferAndRepeat) {
  EXPECT_EQ(derived_seed(42, 1), derived_seed(42, 1));
  EXPECT_NE(derived_seed(42, 1), derived_seed(42, 2));
  EXPECT_NE(derived_seed(42, 1), derived_seed(43, 1));
  EXPECT_NE(derived_seed(42, 1), 42u);
}

}  // namespace
}  // namespace fdpp
