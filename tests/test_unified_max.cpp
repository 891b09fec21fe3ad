// The CPU reference of asynchronized softmax with unified max (attention/unified_max.h) against
// cpu::attention, adversarial rows, the bounds derivation, and calibration files
// (attention/calibration.h).
#include <cfloat>
#include <cmath>

#include "attention/unified_max.h"
#include "backend/cpu/ops.h"
#include "test_util.h"

namespace fdpp {
namespace {

using test::nmse;
using test::random_vector;
using test::rng;

// The stable reference for one row: cpu::attention with one query at position len - 1, one head.
std::vector<float> stable_reference(const std::vector<float>& q, const std::vector<float>& k,
                                    const std::vector<float>& v, int len, int head_dim, float scale) {
  std::vector<float> out(head_dim);
  cpu::attention(q.data(), k.data(), v.data(), 1, len - 1, 1, 1, head_dim, scale, out.data());
  return out;
}

float row_max_logit(const std::vector<float>& q, const std::vector<float>& k, int len, int head_dim, float scale) {
  float m = -INFINITY;
  for (int j = 0; j < len; ++j) {
    float s = 0.f;
    for (int d = 0; d < head_dim; ++d) s += q[d] * k[static_cast<size_t>(j) * head_dim + d];
    m = std::max(m, s * scale);
  }
  return m;
}

bool all_finite(const std::vector<float>& x) {
  for (float f : x)
    if (!std::isfinite(f)) return false;
  return true;
}

TEST(UnifiedMax, BoundsDerivation) {
  for (int64_t n : {int64_t{1}, int64_t{2048}, int64_t{8192}, int64_t{32768}, int64_t{131072}, int64_t{1} << 20}) {
    const UnifiedMaxBounds b = derive_unified_max_bounds(0.f, n);
    const double ln_n = std::log(static_cast<double>(n));
    EXPECT_LT(b.b + ln_n, std::log(FLT_MAX)) << n;
    // With the value headroom: N e^b 2^16 stays finite.
    EXPECT_TRUE(std::isfinite(static_cast<float>(n) * std::exp(b.b) * 65536.f)) << n;
    // e^a is a normal float, and so is every term within 24 ln 2 + ln N of it.
    EXPECT_TRUE(std::isnormal(std::exp(b.a))) << n;
    EXPECT_GE(std::exp(static_cast<double>(b.a)) * std::pow(2.0, -24) / static_cast<double>(n), FLT_MIN) << n;
    EXPECT_LT(b.a, 0.f);
    EXPECT_GT(b.b, 0.f);
  }
  const UnifiedMaxBounds b17 = derive_unified_max_bounds(1.5f, 131072);
  EXPECT_EQ(b17.phi, 1.5f);
  EXPECT_NEAR(b17.a, -57.917, 1e-3);
  EXPECT_NEAR(b17.b, 64.849, 1e-3);
  EXPECT_GE(b17.a, -60.f);
  EXPECT_TRUE(b17.contains(1.5f + 64.8f));
  EXPECT_FALSE(b17.contains(1.5f + 64.9f));
  EXPECT_TRUE(b17.contains(1.5f - 57.9f));
  EXPECT_FALSE(b17.contains(1.5f - 58.0f));
  const UnifiedMaxBounds d = default_unified_max_bounds(8192);
  EXPECT_EQ(d.phi, 0.f);
  test::error_of([] { derive_unified_max_bounds(0.f, 0); });
  test::error_of([] { derive_unified_max_bounds(NAN, 8192); });
}

// Rows inside the bounds: equal to the stable softmax to fp32 rounding, for every tile size.
TEST(UnifiedMax, MatchesStableInsideBounds) {
  const int head_dim = 64;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  const UnifiedMaxBounds base = derive_unified_max_bounds(0.f, 131072);
  std::uniform_int_distribution<int> tile_dist(1, 64);
  std::uniform_real_distribution<float> offset_dist(base.a + 0.5f, base.b - 0.5f);
  std::uniform_real_distribution<float> qscale_dist(0.1f, 3.0f);
  for (int len : {1, 2, 3, 7, 64, 65, 127, 500, 1024, 2049, 4096}) {
    for (int rep = 0; rep < 4; ++rep) {
      const std::vector<float> q = random_vector(head_dim, qscale_dist(rng()));
      const std::vector<float> k = random_vector(static_cast<size_t>(len) * head_dim);
      const std::vector<float> v = random_vector(static_cast<size_t>(len) * head_dim);
      const std::vector<float> ref = stable_reference(q, k, v, len, head_dim, scale);
      // phi placed so that the row's max - phi is anywhere inside [a, b], ends included (almost).
      UnifiedMaxBounds bounds = base;
      const float m = row_max_logit(q, k, len, head_dim, scale);
      bounds.phi = m - offset_dist(rng());
      ASSERT_TRUE(bounds.contains(m));
      for (int tile : {1, 2, 16, 64, tile_dist(rng())}) {
        std::vector<float> out(head_dim);
        const bool fell_back = unified_max_attention_row(q.data(), k.data(), v.data(), len, head_dim, head_dim, scale,
                                                         bounds, tile, out.data());
        EXPECT_FALSE(fell_back) << "len " << len << " tile " << tile;
        EXPECT_LE(nmse(out, ref), 1e-10) << "len " << len << " tile " << tile << " max - phi " << m - bounds.phi;
      }
    }
  }
}

// GQA-style strides: k/v rows kv_stride floats apart, the row reading one head of several.
TEST(UnifiedMax, KvStride) {
  const int head_dim = 32, n_kv = 3, len = 300;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  const std::vector<float> q = random_vector(head_dim);
  const std::vector<float> k = random_vector(static_cast<size_t>(len) * n_kv * head_dim);
  const std::vector<float> v = random_vector(static_cast<size_t>(len) * n_kv * head_dim);
  for (int h = 0; h < n_kv; ++h) {
    // cpu::attention with n_heads = n_kv_heads = 3, one query: head h's output.
    std::vector<float> q3(static_cast<size_t>(n_kv) * head_dim, 0.f), ref3(q3.size());
    std::copy(q.begin(), q.end(), q3.begin() + h * head_dim);
    cpu::attention(q3.data(), k.data(), v.data(), 1, len - 1, n_kv, n_kv, head_dim, scale, ref3.data());
    const std::vector<float> ref(ref3.begin() + h * head_dim, ref3.begin() + (h + 1) * head_dim);
    std::vector<float> out(head_dim);
    const bool fb = unified_max_attention_row(q.data(), k.data() + h * head_dim, v.data() + h * head_dim, len,
                                              head_dim, n_kv * head_dim, scale, default_unified_max_bounds(4096), 37,
                                              out.data());
    EXPECT_FALSE(fb);
    EXPECT_LE(nmse(out, ref), 1e-10) << "head " << h;
  }
}

// Adversarial rows: the stable result, no inf/NaN, and a fallback exactly when max - phi is
// outside [a, b].
TEST(UnifiedMax, AdversarialRows) {
  const int head_dim = 64;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  const UnifiedMaxBounds bounds = derive_unified_max_bounds(0.f, 131072);
  int expected_fallbacks = 0, fallbacks = 0, rows = 0;
  auto check_row = [&](const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v, int len,
                       const std::string& what) {
    const std::vector<float> ref = stable_reference(q, k, v, len, head_dim, scale);
    ASSERT_TRUE(all_finite(ref)) << what;
    const float m = row_max_logit(q, k, len, head_dim, scale);
    const bool expect_fb = !bounds.contains(m);
    for (int tile : {1, 5, 64, 4096}) {
      std::vector<float> out(head_dim);
      const bool fb = unified_max_attention_row(q.data(), k.data(), v.data(), len, head_dim, head_dim, scale, bounds,
                                                tile, out.data());
      ++rows;
      expected_fallbacks += expect_fb;
      fallbacks += fb;
      EXPECT_EQ(fb, expect_fb) << what << " tile " << tile << " max - phi " << m - bounds.phi;
      EXPECT_TRUE(all_finite(out)) << what << " tile " << tile;
      EXPECT_LE(nmse(out, ref), 1e-10) << what << " tile " << tile << " max - phi " << m - bounds.phi;
    }
  };
  std::uniform_int_distribution<int> len_dist(1, 3000);
  for (int rep = 0; rep < 3; ++rep) {
    const int len = len_dist(rng());
    std::uniform_int_distribution<int> pos_dist(0, len - 1);
    const std::vector<float> k = random_vector(static_cast<size_t>(len) * head_dim);
    const std::vector<float> v = random_vector(static_cast<size_t>(len) * head_dim);
    const std::vector<float> q0 = random_vector(head_dim);
    // q scaled so that the logits reach about +-1e4 (both signs of the scale).
    for (float target : {1e4f, -1e4f, 100.f, 60.f}) {
      const float m = std::abs(row_max_logit(q0, k, len, head_dim, scale));
      std::vector<float> q = q0;
      for (float& x : q) x *= target / std::max(m, 1e-3f);
      check_row(q, k, v, len, fmt::format("q scaled to {} (len {})", target, len));
    }
    // A single huge logit: key j aligned with q, far beyond the others.
    {
      std::vector<float> kk = k;
      const int j = pos_dist(rng());
      for (int d = 0; d < head_dim; ++d) kk[static_cast<size_t>(j) * head_dim + d] = q0[d] * 200.f;
      check_row(q0, kk, v, len, fmt::format("single huge logit at {} (len {})", j, len));
    }
    // All logits equal (q = 0: every logit is 0, max - phi = 0 inside; and with all keys equal at
    // a logit far below phi + a, outside).
    {
      std::vector<float> q(head_dim, 0.f);
      check_row(q, k, v, len, fmt::format("all logits zero (len {})", len));
      std::vector<float> kk(static_cast<size_t>(len) * head_dim);
      for (int j = 0; j < len; ++j)
        for (int d = 0; d < head_dim; ++d) kk[static_cast<size_t>(j) * head_dim + d] = -q0[d];
      // logit = -c |q0|^2 scale = -100 with c = 100 / (|q0|^2 scale).
      float qq0 = 0.f;
      for (float x : q0) qq0 += x * x;
      std::vector<float> qq = q0;
      for (float& x : qq) x *= 100.f / (std::max(qq0, 1e-6f) * scale);
      check_row(qq, kk, v, len, fmt::format("all logits equal and very negative (len {})", len));
    }
    // Mixing both: a row of moderate logits with one far above and one far below.
    {
      std::vector<float> kk = k;
      const int hi = pos_dist(rng()), lo = pos_dist(rng());
      for (int d = 0; d < head_dim; ++d) {
        kk[static_cast<size_t>(lo) * head_dim + d] = -q0[d] * 500.f;
        kk[static_cast<size_t>(hi) * head_dim + d] = q0[d] * 500.f;
      }
      check_row(q0, kk, v, len, fmt::format("huge and tiny logits mixed (len {})", len));
    }
  }
  EXPECT_EQ(fallbacks, expected_fallbacks);
  EXPECT_GT(expected_fallbacks, 0);
  EXPECT_LT(expected_fallbacks, rows);
}

TEST(UnifiedMax, RejectsBadArguments) {
  std::vector<float> q(4, 0.f), k(4, 0.f), v(4, 0.f), out(4);
  const UnifiedMaxBounds b = default_unified_max_bounds(16);
  test::error_of([&] { unified_max_attention_row(q.data(), k.data(), v.data(), 0, 4, 4, 1.f, b, 1, out.data()); });
  test::error_of([&] { unified_max_attention_row(q.data(), k.data(), v.data(), 1, 4, 4, 1.f, b, 0, out.data()); });
}

}  // namespace
}  // namespace fdpp
