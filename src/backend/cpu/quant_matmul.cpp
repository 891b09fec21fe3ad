#include "backend/cpu/quant_matmul.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "backend/cpu/ops.h"
#include "backend/cpu/quant_kernels.h"
#include "backend/cpu/quant_repack.h"
#include "backend/cpu/thread_pool.h"
#include "core/half.h"
#include "fdpp/error.h"

namespace fdpp::cpu {

using gguf::GgmlType;

namespace qk {
namespace {

// ---- the scalar kernels: the portable fallback and the reference of the vector ones ----

inline float h2f(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return fp16_to_f32(h);
}

// amax of a block, NaN when the block holds a NaN or an infinity (so that it reaches the output
// instead of being rounded into a finite byte).
float amax_or_nan(const float* x, int n) {
  float amax = 0.f, bad = 0.f;
  for (int j = 0; j < n; ++j) {
    const float a = std::fabs(x[j]);
    amax = a > amax ? a : amax;
    bad += x[j] * 0.f;
  }
  return bad == 0.f ? amax : NAN;
}

// q = round-to-nearest-even(x / d) with d = amax / 127, as the vector code computes it.
void quantize_block(const float* x, int n, float d, int8_t* q) {
  const float id = d != 0.f ? 1.f / d : 0.f;
  for (int j = 0; j < n; ++j) q[j] = std::isfinite(d) ? static_cast<int8_t>(std::nearbyint(x[j] * id)) : 0;
}

void quant_q8(const float* x, int64_t k, uint8_t* out) {
  BlockQ8* y = reinterpret_cast<BlockQ8*>(out);
  for (int64_t b = 0; b < k / kQK; ++b, x += kQK) {
    const float d = amax_or_nan(x, kQK) / 127.f;
    quantize_block(x, kQK, d, y[b].qs);
    int s = 0;
    for (int j = 0; j < kQK; ++j) s += y[b].qs[j];
    y[b].d = d;
    y[b].s = d * static_cast<float>(s);
  }
}

void quant_q8k(const float* x, int64_t k, uint8_t* out) {
  BlockQ8K* y = reinterpret_cast<BlockQ8K*>(out);
  for (int64_t b = 0; b < k / kQKK; ++b, x += kQKK) {
    const float d = amax_or_nan(x, kQKK) / 127.f;
    quantize_block(x, kQKK, d, y[b].qs);
    for (int g = 0; g < kQKK / 16; ++g) {
      int s = 0;
      for (int l = 0; l < 16; ++l) s += y[b].qs[16 * g + l];
      y[b].bsums[g] = static_cast<int16_t>(s);
    }
    y[b].d = d;
  }
}

template <int T>  // 0: f32, 1: f16, 2: bf16
float weight_at(const uint8_t* w, int64_t i) {
  if constexpr (T == 0) {
    float f;
    std::memcpy(&f, w + 4 * i, 4);
    return f;
  } else if constexpr (T == 1) {
    return h2f(w + 2 * i);
  } else {
    uint16_t b;
    std::memcpy(&b, w + 2 * i, 2);
    return bf16_to_f32(b);
  }
}

template <int T>
void float_rows(const uint8_t* w, const uint8_t* act, uint64_t stride, int m, int64_t k, float* out) {
  for (int i = 0; i < m; ++i) {
    const float* x = reinterpret_cast<const float*>(act + i * stride);
    float s = 0.f;
    for (int64_t j = 0; j < k; ++j) s += weight_at<T>(w, j) * x[j];
    out[i] = s;
  }
}

template <int Kind>  // 0: Q4_0, 1: Q4_1, 2: Q8_0
void legacy_rows(const uint8_t* w, const uint8_t* act, uint64_t stride, int m, int64_t k, float* out) {
  constexpr int B = Kind == 0 ? 18 : Kind == 1 ? 20 : 34;
  for (int i = 0; i < m; ++i) {
    const BlockQ8* a = reinterpret_cast<const BlockQ8*>(act + i * stride);
    float acc = 0.f;
    for (int64_t b = 0; b < k / kQK; ++b) {
      const uint8_t* wb = w + b * B;
      const float d = h2f(wb);
      int sumi = 0;
      if constexpr (Kind == 2) {
        const int8_t* q = reinterpret_cast<const int8_t*>(wb + 2);
        for (int j = 0; j < kQK; ++j) sumi += q[j] * a[b].qs[j];
        acc += d * a[b].d * static_cast<float>(sumi);
      } else {
        const uint8_t* qs = wb + (Kind == 1 ? 4 : 2);
        for (int j = 0; j < kQK / 2; ++j) sumi += (qs[j] & 0x0F) * a[b].qs[j] + (qs[j] >> 4) * a[b].qs[j + kQK / 2];
        const float mn = Kind == 1 ? h2f(wb + 2) : -8.f * d;
        acc += d * a[b].d * static_cast<float>(sumi) + mn * a[b].s;
      }
    }
    out[i] = acc;
  }
}

// Q5_K: Q4_K's block with a fifth bit per element (qh, bit j for group j) before the nibbles.
template <bool Q5>
void qk_rows(const uint8_t* w, const uint8_t* act, uint64_t stride, int m, int64_t k, float* out) {
  for (int i = 0; i < m; ++i) {
    const BlockQ8K* a = reinterpret_cast<const BlockQ8K*>(act + i * stride);
    float acc = 0.f;
    for (int64_t b = 0; b < k / kQKK; ++b) {
      const uint8_t* wb = w + b * (Q5 ? 176 : 144);
      const float d = h2f(wb), dmin = h2f(wb + 2);
      const uint8_t* s = wb + 4;
      const uint8_t* qh = wb + 16;
      const uint8_t* q = wb + (Q5 ? 48 : 16);
      int sumi = 0, summ = 0;
      for (int j = 0; j < 8; ++j) {  // group j of 32: scale and min per ggml's get_scale_min_k4
        const int sc = j < 4 ? (s[j] & 63) : ((s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4));
        const int mn = j < 4 ? (s[j + 4] & 63) : ((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
        const uint8_t* qj = q + 32 * (j / 2);
        const int shift = 4 * (j % 2);
        int g = 0;
        for (int l = 0; l < 32; ++l)
          g += (((qj[l] >> shift) & 0x0F) | (Q5 ? ((qh[l] >> j) & 1) << 4 : 0)) * a[b].qs[32 * j + l];
        sumi += sc * g;
        summ += mn * (a[b].bsums[2 * j] + a[b].bsums[2 * j + 1]);
      }
      acc += d * a[b].d * static_cast<float>(sumi) - dmin * a[b].d * static_cast<float>(summ);
    }
    out[i] = acc;
  }
}

void q6k_rows(const uint8_t* w, const uint8_t* act, uint64_t stride, int m, int64_t k, float* out) {
  for (int i = 0; i < m; ++i) {
    const BlockQ8K* a = reinterpret_cast<const BlockQ8K*>(act + i * stride);
    float acc = 0.f;
    for (int64_t b = 0; b < k / kQKK; ++b) {
      const uint8_t* wb = w + b * 210;
      const int8_t* sc = reinterpret_cast<const int8_t*>(wb + 192);
      const float d = h2f(wb + 208);
      int sumi = 0;
      for (int h = 0; h < 2; ++h) {
        const uint8_t* ql = wb + 64 * h;
        const uint8_t* qh = wb + 128 + 32 * h;
        for (int kk = 0; kk < 4; ++kk) {  // elements 128 h + 32 kk + l, as deq_q6_k lays them out
          for (int l = 0; l < 32; ++l) {
            const uint8_t qlb = ql[l + 32 * (kk % 2)];
            const int low = kk < 2 ? (qlb & 0x0F) : (qlb >> 4);
            const int q = (low | (((qh[l] >> (2 * kk)) & 3) << 4)) - 32;
            sumi += sc[8 * h + 2 * kk + l / 16] * q * a[b].qs[128 * h + 32 * kk + l];
          }
        }
      }
      acc += d * a[b].d * static_cast<float>(sumi);
    }
    out[i] = acc;
  }
}

const Kernels kScalarTable = {float_rows<0>, float_rows<1>, float_rows<2>, legacy_rows<0>, legacy_rows<1>,
                              legacy_rows<2>, qk_rows<false>, qk_rows<true>, q6k_rows, quant_q8, quant_q8k,
                              0, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr};

}  // namespace

const Kernels& scalar_kernels() { return kScalarTable; }

}  // namespace qk

namespace {

// What a stored type needs: its kernel, its activation format, its block.
struct Plan {
  qk::RowDot dot = nullptr;
  qk::QuantRow quant = nullptr;  // null: fp32 activations used in place
  int64_t block = 1;             // elements per weight block (the row length must be a multiple)
  uint64_t act_block_bytes = 0;  // bytes per activation block (quantized formats)
};

bool plan_for(const qk::Kernels& k, GgmlType type, Plan* p) {
  switch (type) {
    case GgmlType::F32: *p = {k.f32, nullptr, 1, 0}; return true;
    case GgmlType::F16: *p = {k.f16, nullptr, 1, 0}; return true;
    case GgmlType::BF16: *p = {k.bf16, nullptr, 1, 0}; return true;
    case GgmlType::Q4_0: *p = {k.q4_0, k.quant_q8, qk::kQK, sizeof(qk::BlockQ8)}; return true;
    case GgmlType::Q4_1: *p = {k.q4_1, k.quant_q8, qk::kQK, sizeof(qk::BlockQ8)}; return true;
    case GgmlType::Q8_0: *p = {k.q8_0, k.quant_q8, qk::kQK, sizeof(qk::BlockQ8)}; return true;
    case GgmlType::Q4_K: *p = {k.q4_k, k.quant_q8k, qk::kQKK, sizeof(qk::BlockQ8K)}; return true;
    case GgmlType::Q5_K: *p = {k.q5_k, k.quant_q8k, qk::kQKK, sizeof(qk::BlockQ8K)}; return true;
    case GgmlType::Q6_K: *p = {k.q6_k, k.quant_q8k, qk::kQKK, sizeof(qk::BlockQ8K)}; return true;
    default: return false;
  }
}

Isa detect_isa() {
  // FDPP_CPU_ISA=scalar|avx2|avx512 forces a slower one for comparisons (never a faster one the
  // CPU lacks).
  Isa best = Isa::Scalar;
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (qk::avx2_kernels() != nullptr && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    best = Isa::Avx2;
  if (best == Isa::Avx2 && qk::avx512_kernels() != nullptr && __builtin_cpu_supports("avx512f") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512vnni"))
    best = Isa::Avx512;
#endif
  if (const char* env = std::getenv("FDPP_CPU_ISA"); env != nullptr) {
    const std::string_view v(env);
    if (v == "scalar") best = Isa::Scalar;
    else if (v == "avx2" && best == Isa::Avx512) best = Isa::Avx2;
  }
  return best;
}

const qk::Kernels& kernels(Isa isa) {
  if (isa == Isa::Auto) isa = best_isa();
  check(isa_available(isa), "CPU kernels {} are not available on this CPU", isa_name(isa));
  if (isa == Isa::Avx512) return *qk::avx512_kernels();
  if (isa == Isa::Avx2) return *qk::avx2_kernels();
  return qk::scalar_kernels();
}

// A task should be worth a few microseconds (a dispatch through the pool costs ~0.1-1 us when the
// workers are polling): about 16K multiply-adds, i.e. 28 rows of K = 576 at M = 1.
constexpr int64_t kMinMacsPerTask = 16384;
// Output rows per inner tile: the tile's weight rows (16 x ~1 KB for K = 1536 at 4.5 bits) stay in
// L1 while groups of 4 activation rows stream past them (prefill).
constexpr int64_t kTileRows = 16;

}  // namespace

bool stored_supported(GgmlType type) {
  Plan p;
  return plan_for(qk::scalar_kernels(), type, &p);
}

LoadOptions stored_load_options() {
  LoadOptions o;
  o.weights = WeightForm::Stored;
  o.stored_types = stored_supported;
  o.prepare_stored = repack_weights;
  return o;
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Auto: return "auto";
    case Isa::Scalar: return "scalar";
    case Isa::Avx2: return "avx2";
    case Isa::Avx512: return "avx512";
  }
  return "?";
}

int pack_rows(Isa isa) { return kernels(isa).pack_rows; }

Isa best_isa() {
  static const Isa isa = detect_isa();
  return isa;
}

bool isa_available(Isa isa) {
  if (isa == Isa::Auto || isa == Isa::Scalar) return true;
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (isa == Isa::Avx2)
    return qk::avx2_kernels() != nullptr && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return qk::avx512_kernels() != nullptr && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
#else
  return false;
#endif
}

namespace {

qk::GroupDot group_dot(const qk::Kernels& k, GgmlType type) {
  switch (type) {
    case GgmlType::Q4_0: return k.g_q4_0;
    case GgmlType::Q4_1: return k.g_q4_1;
    case GgmlType::Q8_0: return k.g_q8_0;
    case GgmlType::Q4_K: return k.g_q4_k;
    case GgmlType::Q5_K: return k.g_q5_k;
    case GgmlType::Q6_K: return k.g_q6_k;
    default: return nullptr;
  }
}

}  // namespace

void stored_linear(const float* x, int64_t M, const StoredMatrix& w, const float* bias, float* y, Isa isa) {
  if (M <= 0 || w.rows <= 0) return;
  const qk::Kernels& kern = kernels(isa);
  Plan plan;
  check(plan_for(kern, w.type, &plan), "the CPU fast path has no kernel for {} weights",
        gguf::type_name(w.type));
  const int64_t N = w.rows, K = w.cols;
  check(K % plan.block == 0, "{} weights need rows of whole {}-element blocks, got {} columns",
        gguf::type_name(w.type), plan.block, K);

  // Activations: quantized once per call (each row by one task), or used in place.
  const uint8_t* act = reinterpret_cast<const uint8_t*>(x);
  uint64_t stride = static_cast<uint64_t>(K) * sizeof(float);
  thread_local std::vector<uint8_t> act_buf;
  if (plan.quant != nullptr) {
    stride = static_cast<uint64_t>(K / plan.block) * plan.act_block_bytes;
    if (act_buf.size() < stride * static_cast<uint64_t>(M)) act_buf.resize(stride * static_cast<uint64_t>(M));
    uint8_t* buf = act_buf.data();
    const qk::QuantRow quant = plan.quant;
    if (M * K >= 65536) {
      parallel_for(M, [&](int64_t m) { quant(x + m * K, K, buf + static_cast<uint64_t>(m) * stride); });
    } else {
      for (int64_t m = 0; m < M; ++m) quant(x + m * K, K, buf + static_cast<uint64_t>(m) * stride);
    }
    act = buf;
  }

  const qk::GroupDot gdot = group_dot(kern, w.type);
  if (w.packed_rows > 0 && w.packed_rows == kern.pack_rows && gdot != nullptr) {
    // Interleaved groups of R rows, then the N % R leftover rows in file order. A task owns whole
    // groups. One activation row (decode) goes through the task's groups in one call, which reads
    // several groups side by side; more rows meet each group 4 at a time while its bytes (R rows
    // of K: 36 KiB for Q4_K at K = 4096, R = 16) stay in L1/L2.
    const int R = w.packed_rows;
    const int64_t groups = N / R, tail = N % R;
    const uint64_t group_bytes = w.row_bytes * static_cast<uint64_t>(R);
    const uint8_t* tail_rows = w.data + static_cast<uint64_t>(groups) * group_bytes;
    const int64_t min_groups =
        std::max<int64_t>(1, kMinMacsPerTask / std::max<int64_t>(1, K * R * std::min<int64_t>(M, 4)));
    const int64_t gtasks = task_count(groups + (tail > 0 ? 1 : 0), min_groups);
    const int64_t per = (groups + (tail > 0 ? 1 : 0) + gtasks - 1) / gtasks;
    const qk::RowDot dot = plan.dot;
    parallel_for(gtasks, [&](int64_t t) {
      const int64_t g_begin = t * per, g_end = std::min(groups + (tail > 0 ? 1 : 0), g_begin + per);
      const int64_t whole_end = std::min(g_end, groups);
      if (M == 1 && whole_end > g_begin) {
        gdot(w.data + static_cast<uint64_t>(g_begin) * group_bytes, static_cast<int>(whole_end - g_begin), act,
             stride, 1, K, y + g_begin * R, N);
      } else {
        for (int64_t g = g_begin; g < whole_end; ++g)
          for (int64_t m0 = 0; m0 < M; m0 += 4)
            gdot(w.data + static_cast<uint64_t>(g) * group_bytes, 1, act + static_cast<uint64_t>(m0) * stride,
                 stride, static_cast<int>(std::min<int64_t>(4, M - m0)), K, y + m0 * N + g * R, N);
      }
      if (bias != nullptr)
        for (int64_t m = 0; m < M; ++m)
          for (int64_t n = g_begin * R; n < whole_end * R; ++n) y[m * N + n] += bias[n];
      if (g_end > groups) {
        for (int64_t m0 = 0; m0 < M; m0 += 4) {
          const int mm = static_cast<int>(std::min<int64_t>(4, M - m0));
          float o[4];
          for (int64_t r = 0; r < tail; ++r) {
            dot(tail_rows + static_cast<uint64_t>(r) * w.row_bytes, act + static_cast<uint64_t>(m0) * stride, stride,
                mm, K, o);
            const int64_t n = groups * R + r;
            for (int i = 0; i < mm; ++i) y[(m0 + i) * N + n] = o[i] + (bias != nullptr ? bias[n] : 0.f);
          }
        }
      }
    });
    return;
  }
  // A packed matrix met by kernels of another ISA (tests, a forced ISA): its rows unpacked to file
  // order on the way, slowly.
  const auto row_of = [&](int64_t n, uint8_t* buf) -> const uint8_t* {
    if (w.packed_rows == 0) return w.row(n);
    stored_row_bytes(w, n, buf);
    return buf;
  };

  const int64_t min_rows = std::max<int64_t>(1, kMinMacsPerTask / std::max<int64_t>(1, K * std::min<int64_t>(M, 4)));
  const int64_t tasks = task_count(N, min_rows);
  const int64_t per_task = (N + tasks - 1) / tasks;
  const qk::RowDot dot = plan.dot;
  parallel_for(tasks, [&](int64_t t) {
    const int64_t n_begin = t * per_task, n_end = std::min(N, n_begin + per_task);
    float out[4];
    std::vector<uint8_t> buf(w.packed_rows > 0 ? w.row_bytes : 0);
    for (int64_t n0 = n_begin; n0 < n_end; n0 += kTileRows) {
      const int64_t n1 = std::min(n_end, n0 + kTileRows);
      for (int64_t m0 = 0; m0 < M; m0 += 4) {
        const int mm = static_cast<int>(std::min<int64_t>(4, M - m0));
        const uint8_t* a = act + static_cast<uint64_t>(m0) * stride;
        for (int64_t n = n0; n < n1; ++n) {
          dot(row_of(n, buf.data()), a, stride, mm, K, out);
          const float b = bias != nullptr ? bias[n] : 0.f;
          for (int i = 0; i < mm; ++i) y[(m0 + i) * N + n] = out[i] + b;
        }
      }
    }
  });
}

void linear(const float* x, int64_t M, const Weight& w, const float* bias, float* y) {
  if (!w.stored.empty()) {
    stored_linear(x, M, w.stored, bias, y);
    return;
  }
  check(!w.empty() && w.shape.size() == 2, "linear: weight matrix is missing");
  cpu::linear(x, M, w.shape[1], w.ptr(), w.shape[0], bias, y);
}

void expert_linear(const float* x, int64_t M, const Weight& stack, int expert, float* y) {
  if (!stack.stored.empty()) {
    const StoredMatrix& s = stack.stored;
    check(expert >= 0 && expert < s.matrices && s.row_order == nullptr, "expert {} of a stack of {}", expert,
          s.matrices);
    StoredMatrix one = s;
    one.rows = s.rows / s.matrices;
    one.matrices = 1;
    // Whole groups when packed (repack_weights packs a stack only so), file rows otherwise.
    one.data = s.data + static_cast<uint64_t>(expert) * static_cast<uint64_t>(one.rows) * s.row_bytes;
    stored_linear(x, M, one, nullptr, y);
    return;
  }
  check(stack.shape.size() == 3 && expert >= 0 && expert < stack.shape[0], "expert {} of a stack of shape {}",
        expert, shape_string(stack.shape));
  const int64_t N = stack.shape[1], K = stack.shape[2];
  cpu::linear(x, M, K, stack.ptr() + expert * N * K, N, nullptr, y);
}

void embedding_row(const Weight& w, int64_t row, float* out) {
  if (!w.stored.empty()) {
    check(row >= 0 && row < w.stored.rows, "embedding row {} is out of range [0, {})", row, w.stored.rows);
    if (w.stored.packed_rows > 0) {
      thread_local std::vector<uint8_t> buf;
      buf.resize(w.stored.row_bytes);
      stored_row_bytes(w.stored, row, buf.data());
      gguf::dequantize(w.stored.type, buf.data(), out, static_cast<uint64_t>(w.stored.cols));
      return;
    }
    gguf::dequantize(w.stored.type, w.stored.row(row), out, static_cast<uint64_t>(w.stored.cols));
    return;
  }
  check(!w.empty() && w.shape.size() == 2 && row >= 0 && row < w.shape[0], "embedding row {} is out of range", row);
  std::memcpy(out, w.ptr() + row * w.shape[1], static_cast<size_t>(w.shape[1]) * sizeof(float));
}

}  // namespace fdpp::cpu
