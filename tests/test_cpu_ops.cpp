// CPU reference ops against straightforward fp64 implementations written here (NMSE <= 1e-8),
// over odd sizes, GQA ratios 1..16, and length-1 cases.
#include <cmath>
#include <numbers>

#include "backend/cpu/ops.h"
#include "core/half.h"
#include "test_util.h"

namespace fdpp {
namespace {

using test::nmse;
using test::random_vector;

// Softmax over the experts, the best n_used, ties to the lower index, renormalized or not.
TEST(CpuOps, RouteExpertsTakesTheTopProbabilitiesWithTiesToTheLowerIndex) {
  // Token 0: experts 2 and 3 tie for best; token 1: all equal; token 2: one clear best.
  const std::vector<float> logits{0.f, 0.f, 1.f, 1.f, 0.5f, 0.5f, 0.5f, 0.5f, -1.f, 3.f, 0.f, 2.f};
  std::vector<int32_t> experts(6);
  std::vector<float> weights(6);
  cpu::route_experts(logits.data(), 3, 4, 2, /*normalize=*/false, experts.data(), weights.data());
  EXPECT_EQ(experts, (std::vector<int32_t>{2, 3, 0, 1, 1, 3}));
  const double e = std::exp(1.0);
  EXPECT_NEAR(weights[0], e / (2 + 2 * e), 1e-7);
  EXPECT_NEAR(weights[1], e / (2 + 2 * e), 1e-7);
  EXPECT_NEAR(weights[2], 0.25, 1e-7);
  const double z = std::exp(-1.0) + std::exp(3.0) + 1.0 + std::exp(2.0);
  EXPECT_NEAR(weights[4], std::exp(3.0) / z, 1e-6);
  EXPECT_NEAR(weights[5], std::exp(2.0) / z, 1e-6);

  cpu::route_experts(logits.data(), 3, 4, 2, /*normalize=*/true, experts.data(), weights.data());
  EXPECT_NEAR(weights[0], 0.5, 1e-7);
  EXPECT_NEAR(weights[3], 0.5, 1e-7);
  EXPECT_NEAR(weights[4], std::exp(3.0) / (std::exp(3.0) + std::exp(2.0)), 1e-6);
  EXPECT_NEAR(weights[4] + weights[5], 1.0, 1e-6);

  // Every expert used: all of them, best first, normalized to the full softmax.
  std::vector<int32_t> all(4);
  std::vector<float> all_w(4);
  cpu::route_experts(logits.data() + 8, 1, 4, 4, true, all.data(), all_w.data());
  EXPECT_EQ(all, (std::vector<int32_t>{1, 3, 2, 0}));
  EXPECT_NEAR(all_w[3], std::exp(-1.0) / z, 1e-6);
}

TEST(CpuOps, LinearMatchesFp64AcrossOddShapes) {
  for (auto [M, K, N] : {std::tuple{1, 1, 1}, {1, 577, 193}, {3, 64, 17}, {7, 1000, 33}, {16, 4096, 5}}) {
    const auto x = random_vector(size_t(M) * K), w = random_vector(size_t(N) * K), b = random_vector(N);
    for (bool with_bias : {false, true}) {
      std::vector<float> y(size_t(M) * N, NAN);  // poisoned: every element must be written
      cpu::linear(x.data(), M, K, w.data(), N, with_bias ? b.data() : nullptr, y.data());
      std::vector<double> ref(size_t(M) * N);
      for (int m = 0; m < M; ++m)
        for (int n = 0; n < N; ++n) {
          double acc = with_bias ? b[n] : 0.0;
          for (int k = 0; k < K; ++k) acc += double(x[m * K + k]) * w[n * K + k];
          ref[m * N + n] = acc;
        }
      EXPECT_LE(nmse(y, ref), 1e-8) << M << "x" << K << "x" << N;
    }
  }
}

TEST(CpuOps, RmsNormMatchesFp64) {
  for (int dim : {1, 7, 576, 4099}) {
    const int rows = 3;
    const auto x = random_vector(size_t(rows) * dim, 3.f), w = random_vector(dim);
    std::vector<float> out(x.size(), NAN);
    cpu::rms_norm(x.data(), w.data(), rows, dim, 1e-5, out.data());
    std::vector<double> ref(x.size());
    for (int r = 0; r < rows; ++r) {
      double ss = 0;
      for (int i = 0; i < dim; ++i) ss += double(x[r * dim + i]) * x[r * dim + i];
      const double inv = 1.0 / std::sqrt(ss / dim + 1e-5);
      for (int i = 0; i < dim; ++i) ref[r * dim + i] = x[r * dim + i] * inv * w[i];
    }
    EXPECT_LE(nmse(out, ref), 1e-8) << dim;
  }
}

TEST(CpuOps, LayerNormMatchesFp64) {
  const int rows = 4, dim = 301;
  const auto x = random_vector(size_t(rows) * dim, 2.f), w = random_vector(dim), b = random_vector(dim);
  std::vector<float> out(x.size(), NAN);
  cpu::layer_norm(x.data(), w.data(), b.data(), rows, dim, 1e-5, out.data());
  std::vector<double> ref(x.size());
  for (int r = 0; r < rows; ++r) {
    double mean = 0, var = 0;
    for (int i = 0; i < dim; ++i) mean += x[r * dim + i];
    mean /= dim;
    for (int i = 0; i < dim; ++i) var += (x[r * dim + i] - mean) * (x[r * dim + i] - mean);
    var /= dim;
    for (int i = 0; i < dim; ++i) ref[r * dim + i] = (x[r * dim + i] - mean) / std::sqrt(var + 1e-5) * w[i] + b[i];
  }
  EXPECT_LE(nmse(out, ref), 1e-8);
}

TEST(CpuOps, SiluMulMatchesFp64) {
  const auto g = random_vector(1001, 4.f), u = random_vector(1001);
  std::vector<float> out(g.size(), NAN);
  cpu::silu_mul(g.data(), u.data(), 1001, out.data());
  std::vector<double> ref(g.size());
  for (size_t i = 0; i < g.size(); ++i) ref[i] = g[i] / (1.0 + std::exp(-double(g[i]))) * u[i];
  EXPECT_LE(nmse(out, ref), 1e-8);
}

TEST(CpuOps, RopeRotateHalfMatchesFp64) {
  const int tokens = 5, heads = 3, head_dim = 64;
  RopeConfig rope;
  rope.theta = 10000;
  rope.rotary_dim = head_dim;
  const auto inv = cpu::rope_inv_freq(rope);
  auto x = random_vector(size_t(tokens) * heads * head_dim);
  const auto x0 = x;
  const std::vector<int32_t> pos{0, 1, 7, 30, 63};
  cpu::rope(x.data(), tokens, heads, head_dim, RopeStyle::RotateHalf, inv, pos);
  std::vector<double> ref(x.size());
  for (int t = 0; t < tokens; ++t)
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < head_dim / 2; ++i) {
        const double f = 1.0 / std::pow(10000.0, 2.0 * i / head_dim), a = pos[t] * f;
        const size_t base = (size_t(t) * heads + h) * head_dim;
        const double x1 = x0[base + i], x2 = x0[base + i + head_dim / 2];
        ref[base + i] = x1 * std::cos(a) - x2 * std::sin(a);
        ref[base + i + head_dim / 2] = x2 * std::cos(a) + x1 * std::sin(a);
      }
  EXPECT_LE(nmse(x, ref), 1e-8);
  // Position 0 is the identity.
  for (int i = 0; i < heads * head_dim; ++i) EXPECT_EQ(x[i], x0[i]);
}

TEST(CpuOps, RopeInterleavedPartialMatchesFp64) {
  // ChatGLM2 style: only the first half of each head rotates, in adjacent pairs (2i, 2i + 1).
  const int tokens = 3, heads = 2, head_dim = 32, rotary = 16;
  RopeConfig rope;
  rope.theta = 10000;
  rope.rotary_dim = rotary;
  const auto inv = cpu::rope_inv_freq(rope);
  auto x = random_vector(size_t(tokens) * heads * head_dim);
  const auto x0 = x;
  const std::vector<int32_t> pos{2, 5, 40};
  cpu::rope(x.data(), tokens, heads, head_dim, RopeStyle::Interleaved, inv, pos);
  std::vector<double> ref(x0.begin(), x0.end());
  for (int t = 0; t < tokens; ++t)
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < rotary / 2; ++i) {
        const double a = pos[t] / std::pow(10000.0, 2.0 * i / rotary);
        const size_t base = (size_t(t) * heads + h) * head_dim;
        const double x1 = x0[base + 2 * i], x2 = x0[base + 2 * i + 1];
        ref[base + 2 * i] = x1 * std::cos(a) - x2 * std::sin(a);
        ref[base + 2 * i + 1] = x2 * std::cos(a) + x1 * std::sin(a);
      }
  EXPECT_LE(nmse(x, ref), 1e-8);
  for (int t = 0; t < tokens; ++t)  // the second half of each head passes through untouched
    for (int h = 0; h < heads; ++h)
      for (int d = rotary; d < head_dim; ++d) {
        const size_t i = (size_t(t) * heads + h) * head_dim + d;
        EXPECT_EQ(x[i], x0[i]);
      }
}

TEST(CpuOps, Llama3FrequencyScalingMatchesTransformers) {
  // Values of transformers' _compute_llama3_parameters for Llama 3.1 (theta 5e5, factor 8,
  // low 1, high 4, original 8192, head dim 128), evaluated in fp64.
  RopeConfig rope;
  rope.theta = 500000;
  rope.rotary_dim = 128;
  rope.scaling = RopeScaling::Llama3;
  rope.factor = 8;
  rope.low_freq_factor = 1;
  rope.high_freq_factor = 4;
  rope.original_max_positions = 8192;
  const auto inv = cpu::rope_inv_freq(rope);
  ASSERT_EQ(inv.size(), 64u);
  const std::pair<int, double> expected[] = {{0, 1.0},
                                             {20, 0.016560440080994446},
                                             {40, 3.428102195952591e-05},
                                             {45, 1.2297638677963614e-05},  // the smoothed band
                                             {50, 4.411534674558404e-06},
                                             {63, 3.068925988914511e-07}};
  for (auto [i, v] : expected) EXPECT_NEAR(inv[i] / v, 1.0, 1e-12) << i;
}

// fp64 causal attention reference; window > 0: keys pos - window + 1 .. pos only.
std::vector<double> attention_ref(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                                  int n_q, int start, int H, int KVH, int D, int window = 0) {
  std::vector<double> out(size_t(n_q) * H * D);
  const int group = H / KVH;
  for (int t = 0; t < n_q; ++t)
    for (int h = 0; h < H; ++h) {
      const int len = start + t + 1, kvh = h / group;
      const int first = window > 0 ? std::max(0, len - window) : 0;
      std::vector<double> s(len, -INFINITY);
      double mx = -INFINITY;
      for (int j = first; j < len; ++j) {
        double acc = 0;
        for (int d = 0; d < D; ++d) acc += double(q[(size_t(t) * H + h) * D + d]) * k[(size_t(j) * KVH + kvh) * D + d];
        s[j] = acc / std::sqrt(double(D));
        mx = std::max(mx, s[j]);
      }
      double den = 0;
      for (double& x : s) den += (x = std::exp(x - mx));  // exp(-inf) = 0 outside the window
      for (int d = 0; d < D; ++d) {
        double acc = 0;
        for (int j = 0; j < len; ++j) acc += s[j] * v[(size_t(j) * KVH + kvh) * D + d];
        out[(size_t(t) * H + h) * D + d] = acc / den;
      }
    }
  return out;
}

TEST(CpuOps, AttentionMatchesFp64ForEveryGroupSize) {
  for (int group : {1, 2, 3, 4, 8, 16}) {
    for (auto [n_q, start, D] : {std::tuple{1, 0, 64}, {1, 37, 128}, {5, 0, 64}, {4, 11, 32}}) {
      const int KVH = 2, H = KVH * group, L = start + n_q;
      const auto q = random_vector(size_t(n_q) * H * D), k = random_vector(size_t(L) * KVH * D),
                 v = random_vector(size_t(L) * KVH * D);
      std::vector<float> out(q.size(), NAN);
      cpu::attention(q.data(), k.data(), v.data(), n_q, start, H, KVH, D, 1.0f / std::sqrt(float(D)), out.data());
      EXPECT_LE(nmse(out, attention_ref(q, k, v, n_q, start, H, KVH, D)), 1e-8)
          << "group " << group << " n_q " << n_q << " start " << start << " D " << D;
    }
  }
}

// Sliding-window attention: prefill chunks and decode rows whose window starts inside the cache,
// at the cache's start, and a window longer than every row (then it equals full attention).
TEST(CpuOps, SlidingWindowAttentionMatchesFp64) {
  for (int window : {1, 3, 7, 64}) {
    for (auto [n_q, start] : {std::pair{1, 0}, {1, 20}, {9, 0}, {6, 13}}) {
      const int KVH = 2, H = 6, D = 32, L = start + n_q;
      const auto q = random_vector(size_t(n_q) * H * D), k = random_vector(size_t(L) * KVH * D),
                 v = random_vector(size_t(L) * KVH * D);
      std::vector<float> out(q.size(), NAN);
      cpu::attention(q.data(), k.data(), v.data(), n_q, start, H, KVH, D, 1.0f / std::sqrt(float(D)), out.data(),
                     window);
      EXPECT_LE(nmse(out, attention_ref(q, k, v, n_q, start, H, KVH, D, window)), 1e-8)
          << "window " << window << " n_q " << n_q << " start " << start;
      // The window matters wherever a row has more keys than it.
      if (L > window) EXPECT_GT(nmse(out, attention_ref(q, k, v, n_q, start, H, KVH, D)), 1e-4) << window;
    }
  }
}

// An fp16 paged cache gives exactly what the fp32 paged cache of the same (converted) values gives:
// decode rows (converted as read) and prefill chunks (each kv head's rows converted once), with
// scattered blocks, GQA, windows and soft-capping.
TEST(CpuOps, F16PagedAttentionEqualsFp32OfTheSameValues) {
  const int KVH = 2, H = 6, D = 32, block_size = 4;
  for (auto [n_q, start] : {std::pair{1, 0}, {1, 13}, {7, 0}, {9, 10}})
    for (int window : {0, 5})
      for (float softcap : {0.f, 2.f}) {
        const int L = start + n_q, n_blocks = (L + block_size - 1) / block_size + 2;
        std::vector<int32_t> blocks(n_blocks);
        for (int i = 0; i < n_blocks; ++i) blocks[i] = (5 * i + 3) % n_blocks;  // scattered, all distinct
        const auto q = random_vector(size_t(n_q) * H * D);
        const auto kf = random_vector(size_t(n_blocks) * block_size * KVH * D),
                   vf = random_vector(size_t(n_blocks) * block_size * KVH * D);
        std::vector<uint16_t> k16(kf.size()), v16(vf.size());
        std::vector<float> k32(kf.size()), v32(vf.size());
        for (size_t i = 0; i < kf.size(); ++i) {
          k16[i] = f32_to_fp16(kf[i]);
          v16[i] = f32_to_fp16(vf[i]);
          k32[i] = fp16_to_f32(k16[i]);
          v32[i] = fp16_to_f32(v16[i]);
        }
        std::vector<float> got(q.size(), NAN), want(q.size(), NAN);
        const float scale = 1.0f / std::sqrt(float(D));
        cpu::attention_paged(q.data(), k16.data(), v16.data(), blocks, block_size, n_q, start, H, KVH, D, scale,
                             got.data(), window, softcap);
        cpu::attention_paged(q.data(), k32.data(), v32.data(), blocks, block_size, n_q, start, H, KVH, D, scale,
                             want.data(), window, softcap);
        EXPECT_EQ(got, want) << "n_q " << n_q << " start " << start << " window " << window << " softcap " << softcap;
      }
}

TEST(CpuOps, AttentionIsStableForHugeLogits) {
  // Logits around 1e4: a softmax without the max subtraction would overflow to inf/NaN.
  const int H = 2, KVH = 1, D = 16, L = 9;
  auto q = random_vector(size_t(H) * D, 100.f);
  const auto k = random_vector(size_t(L) * KVH * D, 100.f), v = random_vector(size_t(L) * KVH * D);
  std::vector<float> out(q.size(), NAN);
  cpu::attention(q.data(), k.data(), v.data(), 1, L - 1, H, KVH, D, 1.0f / 4, out.data());
  EXPECT_LE(nmse(out, attention_ref(q, k, v, 1, L - 1, H, KVH, D)), 1e-8);
}

}  // namespace
}  // namespace fdpp
