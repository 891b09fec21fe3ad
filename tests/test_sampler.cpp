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
