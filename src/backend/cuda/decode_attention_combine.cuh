// Decode attention's split combines: the launches after the main kernel that merge a row's split
// partials, synchronized (decode_combine_kernel: each split relative to its own max) and unified max
// (decode_async_combine_kernel: every split relative to phi; rows out of the guard's range are
// recomputed exactly). Both are deterministic: a row's splits are added in a fixed order. Part of
// decode_attention.cu's translation unit (decode_attention_common.cuh).
#pragma once

#include <cmath>

#include "backend/cuda/decode_attention_common.cuh"
#include "backend/cuda/mma_fragments.cuh"
#include "backend/cuda/softmax_state.cuh"

namespace fdpp::cuda {
namespace {

// The combine launches: one CTA per (sequence, query head) row, in one of three shapes (threads,
// splits per batch, and the registers that leave room for the CTAs an SM should hold at once):
//   rows <= SMs (batch 1-4 at 32 heads; many splits): 256 threads, 8 splits per batch;
//   rows <= 4 x SMs: 128 threads, 8 per batch (64 registers: 8 CTAs per SM);
//   more rows (few splits): 128 threads, 4 per batch (48 registers: 10 per SM).
// Under programmatic launch a combine's CTAs become resident while the main kernel still runs, and
// the next kernel launches only once every combine CTA has started, so the shapes bound their
// registers to fit many CTAs per SM (docs/kernels/decode_attention.md, combine shapes; the row
// thresholds are decode_plan.h's kCombineFewRowsPerSm and kCombineSomeRowsPerSm).
template <int NT, int B>
struct CombineShape {
  static constexpr int kThreads = NT, kBatch = B;
  static constexpr int kMaxRegisters = B >= 8 ? 64 : 48;
  static constexpr int kMinCtasPerSm = 65536 / (NT * kMaxRegisters);
};
using CombineFewRows = CombineShape<256, 8>;
using CombineSomeRows = CombineShape<128, 8>;
using CombineManyRows = CombineShape<128, 4>;

// How a combine's threads share a row: the D dims as D / 2 lanes of two (float2 loads: a split's
// partial is D + 2 floats, so 8-byte aligned), the splits dealt round-robin to the kGroups groups of
// lanes that fit the CTA (D 128: 2 groups of 64 lanes in 128 threads, 4 in 256; D 256: 1 group in
// 128 threads), each group taking up to kBatch of its splits' loads in flight at once; the groups'
// results meet in shared memory, added in group order. Every load of a row goes out before any
// value is used: one L2 round trip up to kGroups x kBatch splits (the former loops took several
// dependent round trips; docs/kernels/decode_attention.md, combine shapes).
template <int D, class Shape>
struct CombineLayout {
  static constexpr int kLanes = D / 2;
  static constexpr int kGroups = Shape::kThreads / kLanes >= 1 ? Shape::kThreads / kLanes : 1;
  static constexpr int kBatch = Shape::kBatch;
  static_assert(D % 2 == 0 && kLanes <= Shape::kThreads, "combine layout");
};

// Thread `lane` of group `group`: the row's splits group, group + kGroups, ... in batches of up to
// kBatch, each batch's loads in flight together, as use(md, o, n): md[k] = (m, d) and o[k] = the
// lane's two dims of the batch's k-th split, for k < n. p: the row's partials, splits x (D + 2)
// floats [m, d, o[D]] (other SMs wrote them in the previous kernel: L2 reads).
template <int D, class Shape, class Use>
__device__ __forceinline__ void for_lane_split_batches(const float* __restrict__ p, int splits, int group, int lane,
                                                       Use use) {
  using Layout = CombineLayout<D, Shape>;
  constexpr int G = Layout::kGroups, B = Layout::kBatch;
  for (int s0 = group; s0 < splits; s0 += G * B) {
    float2 md[B], o[B];
#pragma unroll
    for (int k = 0; k < B; ++k) {
      const int s = s0 + k * G;
      if (s < splits) {
        const float* ps = p + int64_t(s) * (D + 2);
        md[k] = __ldcg(reinterpret_cast<const float2*>(ps));
        o[k] = __ldcg(reinterpret_cast<const float2*>(ps + 2 + 2 * lane));
      }
    }
    use(md, o, min(B, (splits - s0 + G - 1) / G));
  }
}

// The groups' (m, d, o) of a combine in shared memory, for the merge after the barrier.
template <int D, class Shape>
struct CombineGroups {
  using Layout = CombineLayout<D, Shape>;
  float m[Layout::kGroups], d[Layout::kGroups];
  float2 o[Layout::kGroups][Layout::kLanes];
  __device__ __forceinline__ void put(int group, int lane, float group_m, float group_d, float2 group_o) {
    if (lane == 0) m[group] = group_m, d[group] = group_d;
    o[group][lane] = group_o;
  }
  __device__ __forceinline__ float max_m() const {
    float M = m[0];
#pragma unroll
    for (int g = 1; g < Layout::kGroups; ++g) M = fmaxf(M, m[g]);
    return M;
  }
  // The lane's two dims and the denominator summed over the groups in group order, each group
  // weighted by 2^(m_g - M) (kRescale: the synchronized combine, whose groups keep their own
  // maxima) or not (the async combine: every split is relative to the same phi).
  template <bool kRescale>
  __device__ __forceinline__ float2 sum(int lane, float M, float& den) const {
    float2 num = make_float2(0.f, 0.f);
    den = 0.f;
    SoftmaxState<float2> st{M, num, den};
#pragma unroll
    for (int g = 0; g < Layout::kGroups; ++g) {
      st.add_weighted(kRescale ? combine_weight(m[g], M) : 1.f, o[g][lane], d[g]);
    }
    return num;
  }
};

// A combine's output: the lane's two dims of the row, o / d (0 where every split was empty).
template <class T>
__device__ __forceinline__ void store_lane_dims(T* row, int lane, const SoftmaxState<float2>& st) {
  row[2 * lane] = from_float<T>(st.normalized(0));
  row[2 * lane + 1] = from_float<T>(st.normalized(1));
}

// Merges the splits' partials of one (sequence, query head): out = sum_s 2^(m_s - M) o_s /
// sum_s 2^(m_s - M) d_s with M = max_s m_s (the synchronized FlashDecoding reduction). Each group
// of lanes keeps its own running max over its splits (its sums rescaled once per batch, where the
// max grows); the merge weighs the groups by 2^(m_g - M).
template <class T, int D, class Shape>
__global__ void __launch_bounds__(Shape::kThreads, Shape::kMinCtasPerSm)
    decode_combine_kernel(const float* __restrict__ partials, int splits, T* __restrict__ out) {
  detail::pdl_trigger();
  detail::pdl_wait();
  using Layout = CombineLayout<D, Shape>;
  constexpr int G = Layout::kGroups, NL = Layout::kLanes;
  __shared__ CombineGroups<D, Shape> groups_s;
  const int tid = threadIdx.x, group = tid / NL, lane = tid - group * NL;
  const int64_t bh = blockIdx.x;  // b * H + h
  const float* p = partials + bh * splits * (D + 2);
  T* o_row = out + bh * D;
  if (group < G) {
    float m = -INFINITY, den = 0.f;
    float2 num = make_float2(0.f, 0.f);
    SoftmaxState<float2> st{m, num, den};
    for_lane_split_batches<D, Shape>(p, splits, group, lane, [&](const float2(&md)[Layout::kBatch],
                                                                 const float2(&os)[Layout::kBatch], int n) {
      float m_new = m;  // the batch's weights are independent of one another: one rescale per batch
#pragma unroll
      for (int k = 0; k < Layout::kBatch; ++k)
        if (k < n) m_new = fmaxf(m_new, md[k].x);
      if (m_new == -INFINITY) return;  // every split so far empty
      st.rescale_to(m_new);
#pragma unroll
      for (int k = 0; k < Layout::kBatch; ++k) {
        if (k < n) st.add_weighted(combine_weight(md[k].x, m_new), os[k], md[k].y);
      }
    });
    if (G == 1) return store_lane_dims(o_row, lane, st);
    groups_s.put(group, lane, m, den, num);
  }
  if constexpr (G > 1) {
    __syncthreads();
    if (group != 0) return;
    float M = groups_s.max_m(), den;
    float2 num = groups_s.template sum<true>(lane, M, den);
    store_lane_dims(o_row, lane, SoftmaxState<float2>{M, num, den});
  }
}

// A block-wide max or sum of NT values, the same on every thread and in the same order on every run
// (deterministic). red_s: NT / 32 floats.
template <int NT>
__device__ __forceinline__ float combine_block_reduce(float v, bool is_max, float* red_s) {
  constexpr int NW = NT / 32;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = is_max ? warp_max(v) : warp_sum(v);
  if (lane == 0) red_s[warp] = v;
  __syncthreads();
  float r = red_s[0];
#pragma unroll
  for (int w = 1; w < NW; ++w) r = is_max ? fmaxf(r, red_s[w]) : r + red_s[w];
  __syncthreads();
  return r;
}

// Async (unified max) reduction of the splits, one CTA per (sequence, query head), launched after
// the main kernel like the synchronized combine. The partials are relative to the same phi, so they
// simply add: out = sum_s o_s / sum_s d_s (each group of lanes in its split order, then the groups
// in order: deterministic, no atomics). A row whose max logit (the max of the splits' maxima)
// leaves [phi + a, phi + b], or is NaN, is recomputed here exactly (fp32 synchronized softmax over
// all its keys) and counted in fallback_rows.
// Why a launch and not only the last CTA of each group inside the main kernel: that CTA sums
// splits x heads x (D + 2) floats alone on one SM after every other CTA has retired, slow with many
// splits (docs/kernels/decode_attention.md, async combine). Spreading it with red.global.add.f32
// would make outputs change in the last bits from run to run; this launch costs what sync's
// combine costs and stays bitwise reproducible.
// kFp8: the cache holds e4m3 bytes (DecodeArgs: kv in 16-bit units, K's scale in scale_log2, V's v_scale).
template <class T, int D, class Shape, bool kFp8 = false>
__global__ void __launch_bounds__(Shape::kThreads, Shape::kMinCtasPerSm) decode_async_combine_kernel(DecodeArgs a) {
  detail::pdl_trigger();
  using Layout = CombineLayout<D, Shape>;
  constexpr int NT = Shape::kThreads, NW = NT / 32, VPT = (D + NT - 1) / NT, G = Layout::kGroups,
                NL = Layout::kLanes;
  __shared__ float red_s[NW];
  __shared__ float q_s[D];
  __shared__ float p_s[NT];
  __shared__ int64_t row_s[NT];
  __shared__ CombineGroups<D, Shape> groups_s;
  const int tid = threadIdx.x, group = tid / NL, lane = tid - group * NL;
  const int bh = blockIdx.x, H = a.n_heads, b = bh / H, h = bh - b * H;
  T* out = static_cast<T*>(a.out) + int64_t(bh) * D;
  const int splits = a.splits;
  const float* p = a.partials + int64_t(bh) * splits * (D + 2);
  // The row's length, into shared memory before the wait for the main kernel (the lengths are
  // written before the step's first kernel; the main kernel reads them before its wait too). Read
  // after the wait into a register, it held the partials' loads for a round trip: the register
  // spilled, and the spill's store waited for the load (SASS).
  __shared__ int len_s;
  if (tid == 0) len_s = a.context_lens[b];
  detail::pdl_wait();
  if (group < G) {
    float m = -INFINITY, den = 0.f;
    float2 num = make_float2(0.f, 0.f);
    // (The state is captured as its parts, in the order the adds use them: the kernel's code stays
    // as it was built before SoftmaxState.)
    for_lane_split_batches<D, Shape>(
        p, splits, group, lane,
        [&m, &den, &num](const float2(&md)[Layout::kBatch], const float2(&os)[Layout::kBatch], int n) {
          SoftmaxState<float2> st{m, num, den};
#pragma unroll
          for (int k = 0; k < Layout::kBatch; ++k) {
            if (k < n) st.add_unified(md[k].x, md[k].y, os[k]);
          }
        });
    groups_s.put(group, lane, m, den, num);
  }
  __syncthreads();  // (also publishes len_s)
  float M = groups_s.max_m();
  int L = len_s;
  const int64_t capacity = int64_t(a.max_blocks_per_seq) << a.kv.block_shift;
  if (L > capacity) L = static_cast<int>(capacity);
  if (L <= 0) {  // (the main kernel wrote the zeros already; written again, alike)
    for (int d = tid; d < D; d += NT) out[d] = from_float<T>(0.f);
    return;
  }
  auto block_reduce = [&](float v, bool is_max) { return combine_block_reduce<NT>(v, is_max, red_s); };
  const float rel = M - a.phi2;
  if (rel >= a.lo2 && rel <= a.hi2) {  // (NaN fails)
    if (group == 0) {
      float den;
      float2 num = groups_s.template sum<false>(lane, M, den);
      store_lane_dims(out, lane, SoftmaxState<float2>{M, num, den});
    }
    return;
  }
  // Out of range: the exact recomputation, NT keys per step (logit of key j0 + tid on thread tid,
  // then P V with thread tid owning dims tid, tid + NT, ..).
  if (tid == 0 && a.fallback_rows != nullptr) atomicAdd(a.fallback_rows, 1ull);
  const int KVH = a.n_kv_heads, kvh = h / a.group;
  const T* q = static_cast<const T*>(a.qkv) + int64_t(b) * (H + 2 * KVH) * D + int64_t(h) * D;
  for (int d = tid; d < D; d += NT) q_s[d] = to_float(q[d]) * a.scale_log2;
  const T* k_cache = static_cast<const T*>(a.k_cache);
  const T* v_cache = static_cast<const T*>(a.v_cache);
  const int32_t* btab = a.block_tables + int64_t(b) * a.max_blocks_per_seq;
  // A window: keys from its first (those before may have been given back); a soft-cap: on the
  // logits in log2 units (q_s holds q scale log2 e), cap log2 e tanh(s / (cap log2 e)).
  const int lo = window_begin(L, a.window);
  const float cap2 = a.softcap * detail::kLog2e;
  __syncthreads();
  float m = -INFINITY, den = 0.f, o[VPT];
#pragma unroll
  for (int v = 0; v < VPT; ++v) o[v] = 0.f;
  for (int j0 = lo; j0 < L; j0 += NT) {
    const int j = j0 + tid;
    float s = -INFINITY;
    if (j < L) {
      const int64_t row = cache_row(a, btab, j, kvh);
      row_s[tid] = row;
      const T* kr = k_cache + row;  // (kFp8: D bytes at the same 16-bit offset)
      float dot = 0.f;
      if constexpr (kFp8) {
#pragma unroll
        for (int c = 0; c < D / 8; ++c) {
          const uint4 e = detail::fp8x8_to<__half>(*reinterpret_cast<const uint2*>(reinterpret_cast<const uint8_t*>(kr) + c * 8));
          const __half* h = reinterpret_cast<const __half*>(&e);
#pragma unroll
          for (int i = 0; i < 8; ++i) dot += q_s[c * 8 + i] * __half2float(h[i]);
        }
      } else {
#pragma unroll
        for (int c = 0; c < D / 8; ++c) {
          const uint4 raw = *reinterpret_cast<const uint4*>(kr + c * 8);
          const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
          for (int i = 0; i < 8; ++i) dot += q_s[c * 8 + i] * to_float(e[i]);
        }
      }
      s = cap2 > 0.f ? cap2 * tanhf(dot / cap2) : dot;
    }
    const float m_new = fmaxf(m, block_reduce(s, true));  // finite: the step has a valid key
    const float alpha = exp2f(m - m_new);                  // m = -inf on the first step: 0
    const float pj = exp2f(s - m_new);                     // masked: exp2(-inf) = 0
    p_s[tid] = pj;
    den = den * alpha + block_reduce(pj, false);  // (its barriers publish p_s and row_s)
    const int n = min(NT, L - j0);
#pragma unroll
    for (int v = 0; v < VPT; ++v) {
      const int d = tid + v * NT;
      if (d < D) {
        float acc = 0.f;
        if constexpr (kFp8) {
          const uint8_t* vb = reinterpret_cast<const uint8_t*>(v_cache);
          for (int jj = 0; jj < n; ++jj) acc += p_s[jj] * detail::fp8_to_float(vb[2 * row_s[jj] + d]);
        } else {
          for (int jj = 0; jj < n; ++jj) acc += p_s[jj] * to_float(v_cache[row_s[jj] + d]);
        }
        o[v] = o[v] * alpha + acc;
      }
    }
    m = m_new;
    __syncthreads();  // p_s and row_s are rewritten by the next step
  }
#pragma unroll
  for (int v = 0; v < VPT; ++v) {
    const int d = tid + v * NT;
    if (d < D) out[d] = from_float<T>((kFp8 ? a.v_scale : 1.f) * (o[v] / den));
  }
}

}  // namespace
}  // namespace fdpp::cuda
