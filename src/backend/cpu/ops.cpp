#include "backend/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <numbers>
#include <vector>

#include "backend/cpu/thread_pool.h"
#include "core/half.h"
#include "fdpp/error.h"

namespace fdpp::cpu {

namespace {

inline float dot(const float* a, const float* b, int64_t n) {
  float acc = 0.f;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

}  // namespace

void linear(const float* x, int64_t M, int64_t K, const float* w, int64_t N, const float* bias, float* y) {
  // One pass over the weights: each weight row is read once and applied to all M input rows while
  // it is in L1. Rows are blocked so that each thread streams a contiguous slice of w.
  // On the pool of thread_pool.h rather than OpenMP (whose spinning barriers collapse when another
  // process holds a core: tests and calibration ran 10-40x slower on the shared dev machine); each
  // output is the same dot() either way, so results do not depend on the thread count.
  constexpr int64_t kRowsPerTask = 16;
  const int64_t tasks = (N + kRowsPerTask - 1) / kRowsPerTask;
  parallel_for(tasks, [&](int64_t t) {
    const int64_t n_end = std::min(N, (t + 1) * kRowsPerTask);
    for (int64_t n = t * kRowsPerTask; n < n_end; ++n) {
      const float* wr = w + n * K;
      const float b = bias != nullptr ? bias[n] : 0.f;
      for (int64_t m = 0; m < M; ++m) y[m * N + n] = dot(x + m * K, wr, K) + b;
    }
  });
}

void rms_norm(const float* x, const float* weight, int64_t rows, int64_t dim, double eps, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* o = out + r * dim;
    double ss = 0.0;
    for (int64_t i = 0; i < dim; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(dim) + eps));
    for (int64_t i = 0; i < dim; ++i) o[i] = xr[i] * inv * weight[i];
  }
}

void layer_norm(const float* x, const float* weight, const float* bias, int64_t rows, int64_t dim, double eps,
                float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* o = out + r * dim;
    double mean = 0.0;
    for (int64_t i = 0; i < dim; ++i) mean += xr[i];
    mean /= static_cast<double>(dim);
    double var = 0.0;
    for (int64_t i = 0; i < dim; ++i) var += (xr[i] - mean) * (xr[i] - mean);
    var /= static_cast<double>(dim);
    const double inv = 1.0 / std::sqrt(var + eps);
    for (int64_t i = 0; i < dim; ++i) {
      const float normed = static_cast<float>((xr[i] - mean) * inv);
      o[i] = normed * weight[i] + (bias != nullptr ? bias[i] : 0.f);
    }
  }
}

void add_inplace(float* x, const float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

void silu_mul(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.f + std::exp(-g)) * up[i];
  }
}

void route_experts(const float* logits, int64_t tokens, int n_experts, int n_used, bool normalize, int32_t* experts,
                   float* weights) {
  std::vector<float> p(static_cast<size_t>(n_experts));
  std::vector<int32_t> order(static_cast<size_t>(n_experts));
  for (int64_t t = 0; t < tokens; ++t) {
    const float* l = logits + t * n_experts;
    const float mx = *std::max_element(l, l + n_experts);
    float sum = 0.f;
    for (int e = 0; e < n_experts; ++e) sum += p[e] = std::exp(l[e] - mx);
    for (float& v : p) v /= sum;
    std::iota(order.begin(), order.end(), 0);
    // Stable: equal probabilities keep index order, so a tie goes to the lower expert.
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return p[a] > p[b]; });
    float chosen = 0.f;
    for (int k = 0; k < n_used; ++k) chosen += p[order[k]];
    for (int k = 0; k < n_used; ++k) {
      experts[t * n_used + k] = order[k];
      weights[t * n_used + k] = normalize ? p[order[k]] / chosen : p[order[k]];
    }
  }
}

std::vector<double> rope_inv_freq(const RopeConfig& rope) {
  const int half = rope.rotary_dim / 2;
  std::vector<double> inv(half);
  for (int i = 0; i < half; ++i) inv[i] = 1.0 / std::pow(rope.theta, (2.0 * i) / rope.rotary_dim);
  if (rope.scaling == RopeScaling::Linear) {
    for (double& f : inv) f /= rope.factor;
  } else if (rope.scaling == RopeScaling::Llama3) {
    // transformers' _compute_llama3_parameters: long wavelengths are divided by factor, short ones
    // kept, and the band between is interpolated smoothly.
    const double low_freq_wavelen = rope.original_max_positions / rope.low_freq_factor;
    const double high_freq_wavelen = rope.original_max_positions / rope.high_freq_factor;
    for (double& f : inv) {
      const double wavelen = 2.0 * std::numbers::pi / f;
      if (wavelen > low_freq_wavelen) {
        f = f / rope.factor;
      } else if (wavelen >= high_freq_wavelen) {
        const double smooth = (rope.original_max_positions / wavelen - rope.low_freq_factor) /
                              (rope.high_freq_factor - rope.low_freq_factor);
        f = (1.0 - smooth) * f / rope.factor + smooth * f;
      }
    }
  }
  if (!rope.freq_factors.empty()) {
    for (int i = 0; i < half; ++i) inv[i] /= rope.freq_factors[i];
  }
  return inv;
}

void relu(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = x[i] > 0.f ? x[i] : 0.f;
}

void gelu_tanh_mul(const float* gate, const float* up, int64_t n, float* out) {
  const float k = std::sqrt(2.f / std::numbers::pi_v<float>);
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = 0.5f * g * (1.f + std::tanh(k * (g + 0.044715f * g * g * g))) * up[i];
  }
}

void soft_cap(float* x, int64_t n, float cap) {
  for (int64_t i = 0; i < n; ++i) x[i] = cap * std::tanh(x[i] / cap);
}

void rope(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_dim, RopeStyle style,
          std::span<const double> inv_freq, std::span<const int32_t> positions) {
  const int64_t half = static_cast<int64_t>(inv_freq.size());
  for (int64_t t = 0; t < n_tokens; ++t) {
    // HF computes cos/sin in fp32 from an fp32 product position * inv_freq; do the same so that
    // long positions round the same way.
    std::vector<float> cos_v(half), sin_v(half);
    for (int64_t i = 0; i < half; ++i) {
      const float angle = static_cast<float>(positions[t]) * static_cast<float>(inv_freq[i]);
      cos_v[i] = std::cos(angle);
      sin_v[i] = std::sin(angle);
    }
    for (int64_t h = 0; h < n_heads; ++h) {
      float* xh = x + (t * n_heads + h) * head_dim;
      // (first, second) index of pair i in this style
      const int64_t stride = style == RopeStyle::RotateHalf ? 1 : 2;
      const int64_t offset = style == RopeStyle::RotateHalf ? half : 1;
      for (int64_t i = 0; i < half; ++i) {
        float& a = xh[i * stride];
        float& b = xh[i * stride + offset];
        const float a0 = a, b0 = b;
        a = a0 * cos_v[i] - b0 * sin_v[i];
        b = b0 * cos_v[i] + a0 * sin_v[i];
      }
    }
  }
}

namespace {
// row(j): the cache row of position j (j itself for a contiguous cache). window > 0: each query
// sees only the last `window` positions up to its own; softcap > 0: scores become
// softcap * tanh(score / softcap) (Gemma 2).
// A cached K or V row as fp32: the row itself for an fp32 cache, else converted into `scratch`.
inline const float* kv_row(const float* base, int64_t offset, int64_t, float*) { return base + offset; }
inline const float* kv_row(const uint16_t* base, int64_t offset, int64_t n, float* scratch) {
  fp16_to_f32_row(base + offset, scratch, n);
  return scratch;
}

// q_stride / kv_stride: elements between consecutive tokens of q and out / of the cache (0: the
// packed n_heads * head_dim / n_kv_heads * head_dim), so that one kv head's query heads can run alone.
template <typename Row, typename KV>
void attention_rows(const float* q, const KV* k, const KV* v, Row row, int64_t n_q, int64_t start_pos,
                    int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, float scale, float* out, int64_t window,
                    float softcap, int64_t q_stride = 0, int64_t kv_stride = 0) {
  const int64_t group = n_heads / n_kv_heads;
  if (q_stride == 0) q_stride = n_heads * head_dim;
  if (kv_stride == 0) kv_stride = n_kv_heads * head_dim;
  // One task per (query token, head) on the fast path's pool (thread_pool.h), not OpenMP: a decode
  // step runs this once per layer, and OpenMP's waits collapse when another process holds a core.
  parallel_for(n_q * n_heads, [&](int64_t task) {
    thread_local std::vector<float> scores, acc, row_scratch;
    const int64_t t = task / n_heads, h = task % n_heads;
    const int64_t end = start_pos + t + 1;  // causal: keys first .. own position
    const int64_t first = window > 0 ? std::max<int64_t>(0, end - window) : 0;
    const int64_t len = end - first;
    if (static_cast<int64_t>(scores.size()) < len) scores.resize(static_cast<size_t>(len));
    acc.assign(static_cast<size_t>(head_dim), 0.f);
    if (static_cast<int64_t>(row_scratch.size()) < head_dim) row_scratch.resize(static_cast<size_t>(head_dim));
    float* scratch = row_scratch.data();
    const float* qh = q + t * q_stride + h * head_dim;
    const int64_t kvh = h / group;
    float max_score = -INFINITY;
    for (int64_t j = 0; j < len; ++j) {
      scores[j] = dot(qh, kv_row(k, row(first + j) * kv_stride + kvh * head_dim, head_dim, scratch), head_dim) * scale;
      if (softcap > 0.f) scores[j] = softcap * std::tanh(scores[j] / softcap);
      max_score = std::max(max_score, scores[j]);
    }
    double denom = 0.0;
    for (int64_t j = 0; j < len; ++j) {
      scores[j] = std::exp(scores[j] - max_score);
      denom += scores[j];
    }
    float* a = acc.data();
    for (int64_t j = 0; j < len; ++j) {
      const float p = scores[j];
      const float* vj = kv_row(v, row(first + j) * kv_stride + kvh * head_dim, head_dim, scratch);
#pragma omp simd
      for (int64_t d = 0; d < head_dim; ++d) a[d] += p * vj[d];
    }
    float* o = out + t * q_stride + h * head_dim;
    const float inv = static_cast<float>(1.0 / denom);
    for (int64_t d = 0; d < head_dim; ++d) o[d] = a[d] * inv;
  });
}

// attention_rows over a paged cache: position j's row is blocks[j / block_size] * block_size + j % block_size.
template <typename KV>
void paged_rows(const float* q, const KV* k, const KV* v, std::span<const int32_t> blocks, int64_t block_size,
                int64_t n_q, int64_t start_pos, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, float scale,
                float* out, int64_t window, float softcap) {
  check(static_cast<int64_t>(blocks.size()) * block_size >= start_pos + n_q,
        "attention: {} blocks of {} tokens hold fewer than {} positions", blocks.size(), block_size, start_pos + n_q);
  const auto row = [&](int64_t j) { return static_cast<int64_t>(blocks[j / block_size]) * block_size + j % block_size; };
  attention_rows(q, k, v, row, n_q, start_pos, n_heads, n_kv_heads, head_dim, scale, out, window, softcap);
}

}  // namespace

void attention(const float* q, const float* k, const float* v, int64_t n_q, int64_t start_pos, int64_t n_heads,
               int64_t n_kv_heads, int64_t head_dim, float scale, float* out, int64_t window, float softcap) {
  attention_rows(q, k, v, [](int64_t j) { return j; }, n_q, start_pos, n_heads, n_kv_heads, head_dim, scale, out,
                 window, softcap);
}

void attention_paged(const float* q, const float* k, const float* v, std::span<const int32_t> blocks,
                     int64_t block_size, int64_t n_q, int64_t start_pos, int64_t n_heads, int64_t n_kv_heads,
                     int64_t head_dim, float scale, float* out, int64_t window, float softcap) {
  paged_rows(q, k, v, blocks, block_size, n_q, start_pos, n_heads, n_kv_heads, head_dim, scale, out, window, softcap);
}

void attention_paged(const float* q, const uint16_t* k, const uint16_t* v, std::span<const int32_t> blocks,
                     int64_t block_size, int64_t n_q, int64_t start_pos, int64_t n_heads, int64_t n_kv_heads,
                     int64_t head_dim, float scale, float* out, int64_t window, float softcap) {
  if (n_q == 1) {  // decode: each row is read once per query head, converted as it is read
    paged_rows(q, k, v, blocks, block_size, n_q, start_pos, n_heads, n_kv_heads, head_dim, scale, out, window,
               softcap);
    return;
  }
  // Prefill: every query token of the chunk and every head of a group reads the same rows, so each
  // kv head's visible rows are converted once into fp32 and its query heads run over them (the same
  // arithmetic on the same values: equal to the decode path's results).
  check(static_cast<int64_t>(blocks.size()) * block_size >= start_pos + n_q,
        "attention: {} blocks of {} tokens hold fewer than {} positions", blocks.size(), block_size, start_pos + n_q);
  const int64_t end = start_pos + n_q;
  const int64_t first = window > 0 ? std::max<int64_t>(0, start_pos + 1 - window) : 0;
  const int64_t group = n_heads / n_kv_heads, kv_stride = n_kv_heads * head_dim;
  // Kept between calls (each layer of each prefill step needs them): grown, never shrunk.
  thread_local std::vector<float> k32, v32;
  const auto rows = static_cast<size_t>((end - first) * head_dim);
  if (k32.size() < rows) {
    k32.resize(rows);
    v32.resize(rows);
  }
  // (Pointers, not the names: inside the tasks a thread_local name would be the worker's own.)
  float* const k_rows = k32.data();
  float* const v_rows = v32.data();
  const int64_t n_rows = end - first, n_tasks = task_count(n_rows, 64);
  for (int64_t kvh = 0; kvh < n_kv_heads; ++kvh) {
    // Converted on the pool (rows split among its threads), then read by every task below.
    parallel_for(n_tasks, [&](int64_t task) {
      for (int64_t i = n_rows * task / n_tasks; i < n_rows * (task + 1) / n_tasks; ++i) {
        const int64_t j = first + i;
        const int64_t at =
            (static_cast<int64_t>(blocks[j / block_size]) * block_size + j % block_size) * kv_stride + kvh * head_dim;
        fp16_to_f32_row(k + at, k_rows + i * head_dim, head_dim);
        fp16_to_f32_row(v + at, v_rows + i * head_dim, head_dim);
      }
    });
    attention_rows(q + kvh * group * head_dim, k_rows, v_rows, [first](int64_t j) { return j - first; }, n_q,
                   start_pos, group, 1, head_dim, scale, out + kvh * group * head_dim, window, softcap,
                   n_heads * head_dim, head_dim);
  }
}

float attention_dot(const float* a, const float* b, int64_t n) { return dot(a, b, n); }

}  // namespace fdpp::cpu
