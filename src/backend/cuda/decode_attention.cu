// Decode attention over the paged KV cache: one query token per sequence.
//
// Design of the one-pass kernel (the synchronized FlashDecoding-style softmax); the split-KV kernels
// below (sync, and the asynchronized FlashDecoding++ one with the unified max) reuse its tiling:
//   * One CTA per (sequence, kv head [, sub-group of 16 query heads when the group is larger]). It
//     handles every query head of the GQA group, so each K/V vector is read from memory once for the
//     whole group.
//   * The CTA's 8 warps take 32-key tiles round-robin (tile t -> warp t % 8). A warp copies its
//     tile's 32 K rows and 32 V rows into its own shared-memory stage with cp.async, coalesced (a
//     row's 16-byte chunks on consecutive lanes, the rows' offsets broadcast from the lanes that
//     looked them up in the block table): K and V of the tile are in flight together, one memory
//     round trip per tile. (First version, measured on the H200, B 1, 32/8 heads, D 128, L 4K:
//     lane-per-key K loads from global and V read row by row in the P.V loop: 132 us; V staged
//     with lane-per-key cp.async: 98 us, and batched cases got slower from the uncoalesced
//     pattern.)
//   * Within a tile each lane owns one key: it reads its K row from the stage (rows padded by 16
//     bytes: conflict-free) and computes its dot product with all the group's query heads (q is in
//     shared memory as fp32, pre-multiplied by scale * log2(e), read as warp-wide broadcasts). No
//     shuffles per key.
//   * Per warp and head an online softmax: running max m, per-lane partial sums d, accumulator o
//     (lane owns D/32 output dims). Per tile: warp max of the 32 logits (5 shuffles), rescale by
//     exp2(m_old - m_new), probabilities to a per-warp shared array, then P.V where each lane reads
//     its D/32 dims of each key's V row from shared memory.
//   * At the end the 8 warps' (m, d, o) are merged in shared memory: o = sum_w 2^(m_w-M) o_w /
//     sum_w 2^(m_w-M) d_w, M = max_w m_w. Warps that saw no key hold m = -inf and contribute 0.
// Stability: every exponent is (logit - running max) <= 0; masked lanes use -inf, exp2(-inf) = 0;
// a tile is only processed when it holds at least one valid key, so the running max is finite
// after the first tile and no inf - inf arises (logits of +-1e4 are fine in fp32).
// Head counts: the group (H / KVH) is padded up to GMAX in {1, 2, 4, 8, 16} (the padded heads get
// q = 0 and are never written); groups above 16 are split over several CTAs of 16 heads.
// A context length <= 0 writes zeros (padding rows of a fixed-size batch); lengths beyond the
// block table's capacity (max_blocks_per_seq * block_size) are clamped to it.
#include <algorithm>
#include <cmath>

#include "backend/cuda/per_device.h"
#include "backend/cuda/cuda_common.cuh"

namespace fdpp::cuda {

namespace {

using detail::aligned16;
using detail::check_launch;
using detail::cuda_check;
using detail::from_float;
using detail::to_float;
using detail::warp_max;
using detail::warp_sum;

// 8 warps, one CTA per SM at head_dim 128 (135 KB of shared memory). Measured on the H200 against
// 4 warps (three CTAs per SM): no better anywhere, 10-50% slower at batch 1 (docs/performance-log.md).
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;

struct DecodeArgs {
  const void* qkv;
  const void* k_cache;
  const void* v_cache;
  const int32_t* block_tables;
  int max_blocks_per_seq;
  const int32_t* context_lens;
  int n_heads, n_kv_heads, group, n_sub;
  int block_shift;
  float scale_log2;  // scale * log2(e)
  void* out;
  // Split-KV (splits > 1): CTA (.., split) takes the split-th slice of the key tiles and writes
  // its partial to `partials` [batch][H][splits][D + 2] = (m, d, o[D]). Sync mode: m is the
  // slice's running max, d and o are relative to it, and decode_combine_kernel merges the slices.
  // Async mode: m is the slice's max logit (for the guard only), d and o are relative to the
  // unified max phi, and the last CTA of the group to finish adds them up (no rescaling).
  int splits;
  float* partials;
  // Async (unified max) mode, all in log2 units (x * log2 e): phi and the safe range [lo, hi] of
  // (row max - phi). Rows outside it are left unwritten and listed for the fallback launch.
  float phi2, lo2, hi2;
  int* counters;                        // [0] listed groups, [1] fallback CTAs done, [2 + g] arrivals of
                                        // group g's splits; all left at 0 by the kernels
  int* fallback_entries;                // (group, head mask) pairs, [0 .. counters[0])
  unsigned long long* fallback_rows;    // cumulative count of rows recomputed (nullable)
  // Fallback launch (sync mode): CTA i recomputes the i-th listed group, only its masked heads.
  bool from_list;
};

// K tile row stride in elements: 16 bytes of padding make the row-per-lane reads conflict-free.
template <int D>
constexpr int kKStride = D + 8;

// K and V tile staging (16-bit, per warp [32][D + 8] then [32][D]) during the loop; o per warp
// ([kWarps][GMAX][D] fp32) for the final merge, in the same bytes.
template <int D, int GMAX>
constexpr size_t decode_stage_bytes() {
  constexpr size_t kv = sizeof(uint16_t) * kWarps * 32 * (kKStride<D> + D), o = sizeof(float) * kWarps * GMAX * D;
  return kv > o ? kv : o;
}

template <int D, int GMAX>
constexpr size_t decode_smem_bytes() {
  return sizeof(float) * GMAX * D               // q (scaled)
         + sizeof(float) * kWarps * GMAX * 32   // probabilities of the tile, per warp
         + sizeof(float) * 2 * kWarps * GMAX    // m, d per warp (merge)
         + decode_stage_bytes<D, GMAX>();       // V tiles / o per warp
}

// 4 or 2 consecutive 16-bit values -> floats (8- or 4-byte load).
template <class T, int N>
__device__ __forceinline__ void load_small(const T* p, float (&f)[N]) {
  static_assert(N == 2 || N == 4, "N");
  if constexpr (N == 4) {
    const uint2 u = *reinterpret_cast<const uint2*>(p);
    const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
    for (int i = 0; i < 4; ++i) f[i] = to_float(e[i]);
  } else {
    const uint32_t u = *reinterpret_cast<const uint32_t*>(p);
    const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
    for (int i = 0; i < 2; ++i) f[i] = to_float(e[i]);
  }
}

// One element of a split's partial result [m, d, o[D]]: o[dim], and m and d with dim 0.
__device__ __forceinline__ void write_partial(float* p, int dim, float m, float d, float o) {
  p[2 + dim] = o;
  if (dim == 0) {
    p[0] = m;
    p[1] = d;
  }
}

// Waits until at most one cp.async group of this thread is still in flight.
__device__ __forceinline__ void cp_async_wait_one() { asm volatile("cp.async.wait_group 1;\n" ::: "memory"); }


// One CTA's work: the group `group_index` ((b * KVH + kvh) * n_sub + sub), key slice `split`,
// writing only the heads in head_mask (sync mode without splits).
template <class T, int D, int GMAX, bool kAsync>
__device__ __forceinline__ void attend_group(const DecodeArgs& a, int group_index, unsigned head_mask, int split,
                                             unsigned char* smem_raw, int& mask_s, int& last_s) {
  static_assert(D == 64 || D == 128, "head_dim");
  constexpr int VPL = D / 32;  // output dims per lane
  constexpr int CH = D / 8;    // 16-byte chunks per K row
  constexpr int KS = kKStride<D>;
  constexpr int RPS = 32 / CH;  // rows copied per warp-wide step (one chunk per lane)

  float* q_s = reinterpret_cast<float*>(smem_raw);             // [GMAX][D]
  float* p_s = q_s + GMAX * D;                                 // [kWarps][GMAX][32]
  float* m_s = p_s + kWarps * GMAX * 32;                       // [kWarps][GMAX]
  float* d_s = m_s + kWarps * GMAX;                            // [kWarps][GMAX]
  float* o_s = d_s + kWarps * GMAX;                            // [kWarps][GMAX][D] (after the loop)
  T* stage = reinterpret_cast<T*>(o_s);                        // per warp K [32][KS], V [32][D] (loop)

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int sub = group_index % a.n_sub;
  const int bk = group_index / a.n_sub;
  const int kvh = bk % a.n_kv_heads;
  const int b = bk / a.n_kv_heads;
  const int g0 = sub * GMAX;
  const int gc = min(GMAX, a.group - g0);  // query heads of this CTA
  const int head0 = kvh * a.group + g0;
  const int H = a.n_heads, KVH = a.n_kv_heads;

  T* out = static_cast<T*>(a.out) + (int64_t(b) * H + head0) * D;
  int L = a.context_lens[b];
  const int64_t capacity = int64_t(a.max_blocks_per_seq) << a.block_shift;
  if (L > capacity) L = static_cast<int>(capacity);
  // This CTA's slice of the key tiles (all of them when there is one split).
  const int n_tiles = L > 0 ? (L + 31) >> 5 : 0;
  const int tiles_per_split = (n_tiles + a.splits - 1) / a.splits;
  const int tile_begin = split * tiles_per_split;
  const int tile_end = min(n_tiles, tile_begin + tiles_per_split);
  float* partial = a.splits > 1 ? a.partials + ((int64_t(b) * H + head0) * a.splits + split) * (D + 2) : nullptr;
  if (n_tiles == 0) {  // a padding row (length <= 0): zeros, written by every split alike
    for (int i = tid; i < gc * D; i += kThreads) out[i] = from_float<T>(0.f);
    return;
  }
  if (!kAsync && tile_begin >= tile_end) {  // sync: no keys in this slice, an empty partial
    for (int i = tid; i < gc * D; i += kThreads) {
      write_partial(partial + int64_t(i / D) * a.splits * (D + 2), i % D, -INFINITY, 0.f, 0.f);
    }
    return;
  }
  // (Async: an empty slice still arrives at the semaphore below, with zero sums.)


  const T* k_cache = static_cast<const T*>(a.k_cache);
  const T* v_cache = static_cast<const T*>(a.v_cache);
  const int32_t* btab = a.block_tables + int64_t(b) * a.max_blocks_per_seq;
  const int shift = a.block_shift;
  const int in_block_mask = (1 << shift) - 1;

  // Sync: m is the running max, d and o are relative to it. Async: m is this lane's max logit
  // (the guard's input only), d and o are relative to phi and never rescaled.
  float m[GMAX], dl[GMAX], o[GMAX][VPL];
#pragma unroll
  for (int g = 0; g < GMAX; ++g) {
    m[g] = -INFINITY;
    dl[g] = 0.f;
#pragma unroll
    for (int v = 0; v < VPL; ++v) o[g][v] = 0.f;
  }

  float* p_w = p_s + warp * GMAX * 32;
  T* k_w = stage + warp * 32 * (KS + D);
  T* v_w = k_w + 32 * KS;
  const int copy_row = lane / CH, copy_chunk = lane % CH;
  // Element offset of this lane's key row (head kvh) in a tile; 0 for keys past the end.
  auto key_row = [&](int tile) -> int64_t {
    const int j = (tile << 5) + lane;
    if (j >= L) return 0;
    const int64_t blk = btab[j >> shift];
    return ((blk << shift) + (j & in_block_mask)) * KVH * D + int64_t(kvh) * D;
  };
  // Stage a tile's K (or V) rows with cp.async, coalesced: the lanes copy consecutive 16-byte
  // chunks of RPS rows per step, the rows' offsets broadcast from the lanes that looked them up.
  auto stage_rows = [&](int tile, int64_t row, const T* src_cache, T* dst, int stride) {
    const int n_valid = min(32, L - (tile << 5));
#pragma unroll
    for (int step = 0; step < 32 / RPS; ++step) {
      const int jj = step * RPS + copy_row;
      const int64_t src = __shfl_sync(0xffffffffu, row, jj);
      if (jj < n_valid) detail::cp_async16(dst + jj * stride + copy_chunk * 8, src_cache + src + copy_chunk * 8);
    }
  };
  // Software pipeline per warp (two cp.async groups in flight): while the logits of tile t are
  // computed, V(t) is loading; while P.V(t) runs, K(t + 8) is loading; V(t + 8) is issued right
  // after P.V(t). Without it (load, wait, compute) the loads and the math of a warp never overlap
  // and the kernel reached 61% of read bandwidth at GQA 32/8, B 1, L 64K (docs/performance-log.md).
  int tile = tile_begin + warp;
  int64_t row = tile < tile_end ? key_row(tile) : 0;
  if (tile < tile_end) stage_rows(tile, row, k_cache, k_w, KS);
  detail::cp_async_commit();
  if (tile < tile_end) stage_rows(tile, row, v_cache, v_w, D);
  detail::cp_async_commit();
  // q after the first tiles' loads are in flight (its latency overlaps theirs).
  const T* q = static_cast<const T*>(a.qkv) + int64_t(b) * (H + 2 * KVH) * D + int64_t(head0) * D;
  for (int i = tid; i < GMAX * D; i += kThreads) q_s[i] = i < gc * D ? to_float(q[i]) * a.scale_log2 : 0.f;
  __syncthreads();
  for (; tile < tile_end; tile += kWarps) {
    const bool valid = (tile << 5) + lane < L;
    const int n_valid = min(32, L - (tile << 5));
    cp_async_wait_one();  // K(tile) has landed (V(tile) may still be in flight)
    __syncwarp();         // every lane's copies visible to the whole warp

    // Logits of this lane's key for every head of the group (log2 domain).
    float s[GMAX];
#pragma unroll
    for (int g = 0; g < GMAX; ++g) s[g] = 0.f;
    if (valid) {
      const T* kp = k_w + lane * KS;
#pragma unroll
      for (int c = 0; c < CH; ++c) {
        const uint4 raw = *reinterpret_cast<const uint4*>(kp + c * 8);
        const T* e = reinterpret_cast<const T*>(&raw);
        float kf[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) kf[i] = to_float(e[i]);
#pragma unroll
        for (int g = 0; g < GMAX; ++g) {
          const float4* qp = reinterpret_cast<const float4*>(q_s + g * D + c * 8);
          const float4 qa = qp[0], qb = qp[1];
          s[g] += qa.x * kf[0] + qa.y * kf[1] + qa.z * kf[2] + qa.w * kf[3] + qb.x * kf[4] + qb.y * kf[5] +
                  qb.z * kf[6] + qb.w * kf[7];
        }
      }
    }

    if constexpr (kAsync) {
      // Unified max: p = 2^(s - phi), no max, no rescale, no shuffle. Each lane keeps the max of
      // its own logits for the guard (reduced once, after the loop).
#pragma unroll
      for (int g = 0; g < GMAX; ++g) {
        const float p = valid ? exp2f(s[g] - a.phi2) : 0.f;
        if (valid) m[g] = fmaxf(m[g], s[g]);
        dl[g] += p;
        p_w[g * 32 + lane] = p;
      }
    } else {
      // Online softmax update (the tile has at least one valid key, so m_new is finite).
#pragma unroll
      for (int g = 0; g < GMAX; ++g) {
        const float sg = valid ? s[g] : -INFINITY;
        const float m_new = fmaxf(m[g], warp_max(sg));
        const float alpha = exp2f(m[g] - m_new);  // m = -inf on the first tile: 0
        const float p = exp2f(sg - m_new);        // masked: exp2(-inf) = 0
        dl[g] = dl[g] * alpha + p;
#pragma unroll
        for (int v = 0; v < VPL; ++v) o[g][v] *= alpha;
        m[g] = m_new;
        p_w[g * 32 + lane] = p;
      }
    }
    __syncwarp();  // p_w visible to the whole warp; every lane is done with the K stage
    const int next = tile + kWarps;
    const int64_t next_row = next < tile_end ? key_row(next) : 0;
    if (next < tile_end) stage_rows(next, next_row, k_cache, k_w, KS);
    detail::cp_async_commit();
    cp_async_wait_one();  // V(tile) has landed (K(next) may still be in flight)
    __syncwarp();

    // o += P . V over the tile's valid keys.
#pragma unroll 4
    for (int jj = 0; jj < n_valid; ++jj) {
      float vf[VPL];
      load_small<T, VPL>(v_w + jj * D + lane * VPL, vf);
#pragma unroll
      for (int g = 0; g < GMAX; ++g) {
        const float p = p_w[g * 32 + jj];
#pragma unroll
        for (int v = 0; v < VPL; ++v) o[g][v] += p * vf[v];
      }
    }
    __syncwarp();  // p_w and the V stage are rewritten by the next tile
    if (next < tile_end) stage_rows(next, next_row, v_cache, v_w, D);
    detail::cp_async_commit();
  }
  detail::cp_async_wait_all();  // (only empty groups remain; the stage is about to be reused)

  // Cross-warp merge. o_s overlays the other warps' V tiles: wait until every warp is done.
  __syncthreads();
#pragma unroll
  for (int g = 0; g < GMAX; ++g) {
    const float d_total = warp_sum(dl[g]);
    const float m_total = kAsync ? warp_max(m[g]) : m[g];
    if (lane == 0) {
      m_s[warp * GMAX + g] = m_total;
      d_s[warp * GMAX + g] = d_total;
    }
#pragma unroll
    for (int v = 0; v < VPL; ++v) o_s[(warp * GMAX + g) * D + lane * VPL + v] = o[g][v];
  }
  if (kAsync && tid == 0) mask_s = 0;
  __syncthreads();

  if constexpr (kAsync) {
    // Add the warps' sums (all relative to phi: no rescale) and take the CTA's max logit.
    for (int i = tid; i < gc * D; i += kThreads) {
      const int g = i / D, d = i - g * D;
      float M = -INFINITY, num = 0.f, den = 0.f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        M = fmaxf(M, m_s[w * GMAX + g]);
        num += o_s[(w * GMAX + g) * D + d];
        den += d_s[w * GMAX + g];
      }
      if (partial == nullptr) {
        // One split: this CTA holds the whole row. Guard: a <= max - phi <= b (NaN fails).
        const float rel = M - a.phi2;
        if (rel >= a.lo2 && rel <= a.hi2) out[i] = from_float<T>(num / den);
        else if (d == 0) atomicOr(&mask_s, 1 << g);
      } else {
        write_partial(partial + int64_t(g) * a.splits * (D + 2), d, M, den, num);
      }
    }
    if (partial != nullptr) {
      // Last-block reduction: the CTA that arrives last for this group adds the splits' partials
      // (fp32 addition in split order, so the result does not depend on arrival order).
      __threadfence();
      __syncthreads();
      if (tid == 0) {
        const int arrived = atomicAdd(a.counters + 2 + group_index, 1);
        last_s = arrived == a.splits - 1;
        if (last_s) a.counters[2 + group_index] = 0;  // ready for the next launch
      }
      __syncthreads();
      if (!last_s) return;
      __threadfence();
      // (Staging the partials in shared memory with one coalesced load per chunk measured slower
      // on the H200: +0.8 us at batch 1, 4 to 16 splits.)
      for (int i = tid; i < gc * D; i += kThreads) {
        const int g = i / D, d = i - g * D;
        const float* pg = a.partials + ((int64_t(b) * H + head0 + g) * a.splits) * (D + 2);
        float M = -INFINITY, num = 0.f, den = 0.f;
        for (int sp = 0; sp < a.splits; ++sp) {  // in split order: the sum does not depend on timing
          const float* ps = pg + sp * (D + 2);
          M = fmaxf(M, __ldcg(ps));
          den += __ldcg(ps + 1);
          num += __ldcg(ps + 2 + d);
        }
        const float rel = M - a.phi2;
        if (rel >= a.lo2 && rel <= a.hi2) out[i] = from_float<T>(num / den);
        else if (d == 0) atomicOr(&mask_s, 1 << g);
      }
    }
    __syncthreads();
    if (tid == 0 && mask_s != 0) {
      // Rows out of range: list the group (with its heads) for the synchronized recomputation.
      const int slot = atomicAdd(a.counters, 1);
      a.fallback_entries[2 * slot] = group_index;
      a.fallback_entries[2 * slot + 1] = mask_s;
      if (a.fallback_rows != nullptr) atomicAdd(a.fallback_rows, static_cast<unsigned long long>(__popc(mask_s)));
    }
    return;
  } else {
    for (int i = tid; i < gc * D; i += kThreads) {
      const int g = i / D, d = i - g * D;
      float M = -INFINITY;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) M = fmaxf(M, m_s[w * GMAX + g]);
      float num = 0.f, den = 0.f;
      if (M != -INFINITY) {
#pragma unroll
        for (int w = 0; w < kWarps; ++w) {
          const float f = exp2f(m_s[w * GMAX + g] - M);
          num += f * o_s[(w * GMAX + g) * D + d];
          den += f * d_s[w * GMAX + g];
        }
      }
      if (partial == nullptr) {
        if ((head_mask >> g) & 1u) out[i] = from_float<T>(den > 0.f ? num / den : 0.f);
      } else {
        write_partial(partial + int64_t(g) * a.splits * (D + 2), d, M, den, num);
      }
    }
  }
}

template <class T, int D, int GMAX, bool kAsync>
__global__ void __launch_bounds__(kThreads, 1) decode_attention_kernel(DecodeArgs a) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __shared__ int mask_s, last_s, count_s;
  // The next launch (the fallback launch after the async one; the O projection after that) may be
  // scheduled now: its CTAs take SMs as this grid's retire, so a second launch with nothing to do
  // costs almost nothing. Then wait for the previous kernel (rope: qkv and the cache; the async
  // launch: the fallback list). See kernels.h, programmatic launch.
  detail::pdl_trigger();
  detail::pdl_wait();
  if (!kAsync && a.from_list) {
    // The fallback launch: a fixed grid (graph-friendly, at most one wave) whose CTAs take the
    // listed groups round-robin; with an empty list every CTA exits at once.
    if (threadIdx.x == 0) {
      count_s = atomicAdd(a.counters, 0);
      // Every CTA has read the count: the last one resets it for the next step.
      __threadfence();
      if (atomicAdd(a.counters + 1, 1) == int(gridDim.x) - 1) {
        a.counters[0] = 0;
        a.counters[1] = 0;
      }
    }
    __syncthreads();
    for (int e = blockIdx.x; e < count_s; e += gridDim.x) {
      attend_group<T, D, GMAX, false>(a, a.fallback_entries[2 * e], static_cast<unsigned>(a.fallback_entries[2 * e + 1]),
                                      0, smem_raw, mask_s, last_s);
      __syncthreads();
    }
    return;
  }
  attend_group<T, D, GMAX, kAsync>(a, blockIdx.x, 0xffffffffu, blockIdx.y, smem_raw, mask_s, last_s);
}

// Merges the splits' partials of one (sequence, query head): out = sum_s 2^(m_s - M) o_s /
// sum_s 2^(m_s - M) d_s with M = max_s m_s (the synchronized FlashDecoding reduction).
template <class T, int D>
__global__ void decode_combine_kernel(const float* __restrict__ partials, int splits, T* __restrict__ out) {
  detail::pdl_trigger();
  detail::pdl_wait();
  const int bh = blockIdx.x;  // b * H + h
  const float* p = partials + int64_t(bh) * splits * (D + 2);
  float M = -INFINITY;
  for (int s = 0; s < splits; ++s) M = fmaxf(M, p[s * (D + 2)]);
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float num = 0.f, den = 0.f;
    if (M != -INFINITY) {
      for (int s = 0; s < splits; ++s) {
        const float* ps = p + s * (D + 2);
        const float f = exp2f(ps[0] - M);
        num += f * ps[2 + d];
        den += f * ps[1];
      }
    }
    out[int64_t(bh) * D + d] = from_float<T>(den > 0.f ? num / den : 0.f);
  }
}

template <class T, int D, int GMAX, bool kAsync>
void launch_decode(const DecodeArgs& a, int n_ctas, bool dependent, cudaStream_t stream) {
  constexpr size_t smem = decode_smem_bytes<D, GMAX>();
  auto* kernel = decode_attention_kernel<T, D, GMAX, kAsync>;
  // Once per instantiation and device (not inside graph capture each time; per_device.h).
  once_per_device(reinterpret_cast<const void*>(kernel), [&] {
    if (smem > 48 * 1024)
      cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
                 "cudaFuncSetAttribute(decode_attention_kernel, max dynamic shared memory)");
  });
  // The fallback launch (dependent) follows the async launch programmatically: its CTAs are
  // scheduled while the async grid drains and wait for it in griddepcontrol.wait.
  const detail::LaunchConfig config(dim3(n_ctas, a.splits), dim3(kThreads), smem, stream, dependent);
  cuda_check(cudaLaunchKernelEx(config.get(), kernel, a), "cudaLaunchKernelEx(decode_attention_kernel)");
}

template <class T, int D, bool kAsync>
void launch_decode_g(int gmax, const DecodeArgs& a, int n_ctas, bool dependent, cudaStream_t stream) {
  switch (gmax) {
    case 1: return launch_decode<T, D, 1, kAsync>(a, n_ctas, dependent, stream);
    case 2: return launch_decode<T, D, 2, kAsync>(a, n_ctas, dependent, stream);
    case 4: return launch_decode<T, D, 4, kAsync>(a, n_ctas, dependent, stream);
    case 8: return launch_decode<T, D, 8, kAsync>(a, n_ctas, dependent, stream);
    default: return launch_decode<T, D, 16, kAsync>(a, n_ctas, dependent, stream);
  }
}

int multiprocessor_count() { return multiprocessors_of_current_device(); }

// CTA groups of a launch: one per (sequence, kv head, sub-group of at most gmax query heads).
// A CTA normally takes the whole GQA group (up to 16 heads), so each K/V tile is read once for
// all of them. When even with `splits` that leaves most SMs idle (short contexts at small batch:
// ChatGLM2-6B, 32 query heads on 2 kv heads, batch 1, context 1024 ran 8 CTAs of 16 heads each,
// 56% of the roofline end to end), the group is split over more CTAs, halving gmax while fewer
// than half the SMs would be busy: the extra K/V reads of the sub-groups hit L2 (the cache of
// such a short context is a few MB). Long contexts split the keys instead and keep whole groups.
struct GroupPlan {
  int group, gmax, n_sub;
  int64_t n_groups;
};
GroupPlan plan_groups(int batch, int n_heads, int n_kv_heads, int splits) {
  GroupPlan g{};
  g.group = n_heads / n_kv_heads;
  g.gmax = g.group <= 1 ? 1 : g.group <= 2 ? 2 : g.group <= 4 ? 4 : g.group <= 8 ? 8 : 16;
  auto n_sub = [&](int gmax) { return (g.group + gmax - 1) / gmax; };
  const int64_t half_sms = multiprocessor_count() / 2;
  while (g.gmax > 1 && int64_t(batch) * n_kv_heads * n_sub(g.gmax) * splits < half_sms) g.gmax /= 2;
  g.n_sub = n_sub(g.gmax);
  g.n_groups = int64_t(batch) * n_kv_heads * g.n_sub;
  return g;
}
// The most groups any plan can have (one query head per CTA): bounds the counters and the list.
int64_t max_groups(int batch, int n_heads) { return int64_t(batch) * n_heads; }

// The async workspace: partials (splits > 1), then the fallback list's entries.
struct AsyncWorkspace {
  size_t partial_bytes, entries_offset, total;
};
AsyncWorkspace async_workspace_layout(int batch, int n_heads, int /*n_kv_heads*/, int head_dim, int splits) {
  AsyncWorkspace w{};
  w.partial_bytes = decode_attention_workspace_bytes(batch, n_heads, head_dim, splits);
  w.entries_offset = (w.partial_bytes + 15) & ~size_t(15);
  w.total = w.entries_offset + sizeof(int) * 2 * size_t(max_groups(batch, n_heads));
  return w;
}

}  // namespace

size_t decode_attention_workspace_bytes(int batch, int n_heads, int head_dim, int splits) {
  return splits <= 1 ? 0 : sizeof(float) * size_t(batch) * n_heads * splits * (head_dim + 2);
}

size_t decode_attention_async_workspace_bytes(int batch, int n_heads, int n_kv_heads, int head_dim, int splits) {
  check(batch > 0 && n_heads > 0 && n_kv_heads > 0 && n_heads % n_kv_heads == 0 && splits >= 1,
        "decode_attention_async_workspace_bytes: batch {}, heads {}/{}, splits {}", batch, n_heads, n_kv_heads, splits);
  return async_workspace_layout(batch, n_heads, n_kv_heads, head_dim, splits).total;
}

int decode_attention_async_counters(int batch, int n_heads, int n_kv_heads) {
  check(batch > 0 && n_heads > 0 && n_kv_heads > 0 && n_heads % n_kv_heads == 0,
        "decode_attention_async_counters: batch {}, heads {}/{}", batch, n_heads, n_kv_heads);
  const int64_t n = 2 + max_groups(batch, n_heads);
  check(n <= 0x7fffffff, "decode_attention_async_counters: {} groups", n);
  return static_cast<int>(n);
}

int plan_decode_splits(int batch, int n_heads, int n_kv_heads, int max_context_len, int multiprocessors) {
  // A launch has one CTA per (sequence, kv head [, 16-head sub-group]) and split, and the kernel
  // runs one CTA per SM (135 KB of shared memory at head_dim 128). A grid of C CTAs therefore takes
  // ceil(C / SMs) waves, and the last wave idles SMs: wave efficiency = C / (ceil(C / SMs) SMs).
  // Splitting a row's keys multiplies C; we take the smallest split count whose efficiency is
  // within 85% of the best achievable one (FlashAttention's rule), keeping at least 8 tiles of 32
  // keys per split (one per warp) so that a split's fixed cost (loading q, the merge, writing the
  // partial) stays small next to its key traffic.
  // Worked numbers on the H200 (132 SMs), 32 heads (MHA):
  //   batch 1, context 1024: C = 32, 32 tiles -> at most 4 splits; efficiency 0.24, 0.48, 0.73,
  //   0.97 for 1..4 splits -> 4 splits, 128 CTAs in one wave (measured without splits: 17 us,
  //   32 of 132 SMs busy; see docs/performance-log.md).
  //   batch 1, context 64K: the best efficiency is 1.0 (33 splits, 1056 CTAs = 8 full waves);
  //   4 splits already give 0.97 -> 4 splits (fewer partials to write and add).
  //   batch 5, context 4K: C = 160: 1 split 0.61, 2 -> 0.81, 3 -> 0.91 -> 3 splits.
  //   batch 8: C = 256, 0.97 without splitting -> 1 split.
  const int group = n_heads / n_kv_heads;
  const int n_sub = (group + 15) / 16;
  const int64_t ctas = int64_t(batch) * n_kv_heads * n_sub;
  if (max_context_len <= 0 || multiprocessors <= 0) return 1;
  const int n_tiles = (max_context_len + 31) / 32;
  const int max_splits = std::max(1, std::min(n_tiles / kWarps, 64));
  // CTAs resident per SM (shared memory bound; head_dim 128, groups up to 4 heads).
  constexpr int kSmemPerSm = 227 * 1024;
  constexpr int kPerSm = std::max<int>(1, std::min<int>(2048 / kThreads, kSmemPerSm / decode_smem_bytes<128, 4>()));
  const int64_t slots = int64_t(multiprocessors) * kPerSm;
  auto efficiency = [&](int splits) {
    const int64_t c = ctas * splits;
    const int64_t waves = (c + slots - 1) / slots;
    return double(c) / double(waves * slots);
  };
  double best = 0.0;
  for (int s = 1; s <= max_splits; ++s) best = std::max(best, efficiency(s));
  for (int s = 1; s <= max_splits; ++s)
    if (efficiency(s) >= 0.85 * best) return s;
  return 1;
}

void decode_attention(const void* qkv, const void* k_cache, const void* v_cache, const int32_t* block_tables,
                      int max_blocks_per_seq, const int32_t* context_lens, int batch, int n_heads, int n_kv_heads,
                      int head_dim, int block_size, float scale, void* out, DType dtype, cudaStream_t stream) {
  decode_attention_split(qkv, k_cache, v_cache, block_tables, max_blocks_per_seq, context_lens, batch, n_heads,
                         n_kv_heads, head_dim, block_size, scale, out, dtype, 1, nullptr, 0, stream);
}

namespace {

// Checks the arguments shared by both modes and fills the kernel's arguments.
DecodeArgs make_args(const void* qkv, const void* k_cache, const void* v_cache, const int32_t* block_tables,
                     int max_blocks_per_seq, const int32_t* context_lens, int batch, int n_heads, int n_kv_heads,
                     int head_dim, int block_size, float scale, void* out, DType dtype, int splits) {
  check(splits >= 1 && splits <= 1024, "decode_attention: splits = {} out of range [1, 1024]", splits);
  check(qkv != nullptr && k_cache != nullptr && v_cache != nullptr && block_tables != nullptr &&
            context_lens != nullptr && out != nullptr,
        "decode_attention: null pointer (qkv {}, k_cache {}, v_cache {}, block_tables {}, context_lens {}, out {})",
        qkv, k_cache, v_cache, static_cast<const void*>(block_tables), static_cast<const void*>(context_lens), out);
  check(batch > 0 && n_heads > 0 && n_kv_heads > 0 && max_blocks_per_seq > 0,
        "decode_attention: batch = {}, n_heads = {}, n_kv_heads = {}, max_blocks_per_seq = {} must be positive",
        batch, n_heads, n_kv_heads, max_blocks_per_seq);
  check(n_heads % n_kv_heads == 0, "decode_attention: n_heads = {} is not a multiple of n_kv_heads = {}", n_heads,
        n_kv_heads);
  check(head_dim == 64 || head_dim == 128, "decode_attention: head_dim = {} is not supported (64, 128)", head_dim);
  check(block_size > 0 && (block_size & (block_size - 1)) == 0 && block_size <= (1 << 20),
        "decode_attention: block_size = {} must be a power of two", block_size);
  check(std::isfinite(scale), "decode_attention: scale = {} is not finite", scale);
  check(aligned16(k_cache) && aligned16(v_cache), "decode_attention: k/v cache pointers must be 16-byte aligned");
  check(dtype == DType::F16 || dtype == DType::BF16, "decode_attention: unknown dtype {}", static_cast<int>(dtype));
  const GroupPlan g = plan_groups(batch, n_heads, n_kv_heads, splits);
  check(g.n_groups <= 0x7fffffff, "decode_attention: {} CTAs exceed the grid limit", g.n_groups);
  int shift = 0;
  while ((1 << shift) < block_size) ++shift;
  DecodeArgs a{};
  a.qkv = qkv;
  a.k_cache = k_cache;
  a.v_cache = v_cache;
  a.block_tables = block_tables;
  a.max_blocks_per_seq = max_blocks_per_seq;
  a.context_lens = context_lens;
  a.n_heads = n_heads;
  a.n_kv_heads = n_kv_heads;
  a.group = g.group;
  a.n_sub = g.n_sub;
  a.block_shift = shift;
  a.scale_log2 = scale * detail::kLog2e;
  a.out = out;
  a.splits = splits;
  return a;
}

}  // namespace

void decode_attention_split(const void* qkv, const void* k_cache, const void* v_cache, const int32_t* block_tables,
                            int max_blocks_per_seq, const int32_t* context_lens, int batch, int n_heads,
                            int n_kv_heads, int head_dim, int block_size, float scale, void* out, DType dtype,
                            int splits, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  DecodeArgs a = make_args(qkv, k_cache, v_cache, block_tables, max_blocks_per_seq, context_lens, batch, n_heads,
                           n_kv_heads, head_dim, block_size, scale, out, dtype, splits);
  check(splits == 1 || (workspace != nullptr &&
                        workspace_bytes >= decode_attention_workspace_bytes(batch, n_heads, head_dim, splits)),
        "decode_attention: {} splits need {} bytes of workspace, got {}", splits,
        decode_attention_workspace_bytes(batch, n_heads, head_dim, splits), workspace_bytes);
  a.partials = static_cast<float*>(workspace);
  const GroupPlan g = plan_groups(batch, n_heads, n_kv_heads, splits);
  detail::dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    const bool pdl = programmatic_launch_enabled();
    auto combine = [&](auto* kernel, int threads) {
      const detail::LaunchConfig config(dim3(batch * n_heads), dim3(threads), 0, stream, pdl);
      cuda_check(cudaLaunchKernelEx(config.get(), kernel, static_cast<const float*>(a.partials), splits,
                                    static_cast<T*>(out)),
                 "cudaLaunchKernelEx(decode_combine_kernel)");
    };
    if (head_dim == 64) {
      launch_decode_g<T, 64, false>(g.gmax, a, static_cast<int>(g.n_groups), pdl, stream);
      if (splits > 1) combine(decode_combine_kernel<T, 64>, 64);
    } else {
      launch_decode_g<T, 128, false>(g.gmax, a, static_cast<int>(g.n_groups), pdl, stream);
      if (splits > 1) combine(decode_combine_kernel<T, 128>, 128);
    }
  });
  check_launch("decode_attention");
}

void decode_attention_async(const void* qkv, const void* k_cache, const void* v_cache, const int32_t* block_tables,
                            int max_blocks_per_seq, const int32_t* context_lens, int batch, int n_heads,
                            int n_kv_heads, int head_dim, int block_size, float scale, const UnifiedMaxRange& range,
                            void* out, DType dtype, int splits, void* workspace, size_t workspace_bytes,
                            int* counters, int counter_ints, unsigned long long* fallback_rows, cudaStream_t stream) {
  DecodeArgs a = make_args(qkv, k_cache, v_cache, block_tables, max_blocks_per_seq, context_lens, batch, n_heads,
                           n_kv_heads, head_dim, block_size, scale, out, dtype, splits);
  check(std::isfinite(range.phi) && std::isfinite(range.a) && std::isfinite(range.b) && range.a < range.b,
        "decode_attention_async: unified max phi = {}, range [{}, {}] is not a finite, non-empty interval", range.phi,
        range.a, range.b);
  const AsyncWorkspace w = async_workspace_layout(batch, n_heads, n_kv_heads, head_dim, splits);
  check(workspace != nullptr && workspace_bytes >= w.total && aligned16(workspace),
        "decode_attention_async: needs {} bytes of 16-byte aligned workspace, got {} at {}", w.total, workspace_bytes,
        workspace);
  const int need_counters = decode_attention_async_counters(batch, n_heads, n_kv_heads);
  check(counters != nullptr && counter_ints >= need_counters,
        "decode_attention_async: needs {} zeroed counters, got {} at {}", need_counters, counter_ints,
        static_cast<const void*>(counters));
  unsigned char* base = static_cast<unsigned char*>(workspace);
  a.partials = splits > 1 ? reinterpret_cast<float*>(base) : nullptr;
  a.fallback_entries = reinterpret_cast<int*>(base + w.entries_offset);
  a.counters = counters;
  a.fallback_rows = fallback_rows;
  // The kernel works in log2 units: 2^(x log2 e - phi log2 e) = e^(x - phi).
  a.phi2 = range.phi * detail::kLog2e;
  a.lo2 = range.a * detail::kLog2e;
  a.hi2 = range.b * detail::kLog2e;
  // The fallback launch: the synchronized kernel over the listed groups only, one CTA each.
  DecodeArgs f = a;
  f.splits = 1;
  f.partials = nullptr;
  f.from_list = true;
  const GroupPlan g = plan_groups(batch, n_heads, n_kv_heads, splits);
  const int n = static_cast<int>(g.n_groups);
  // The fallback grid: at most one wave. (A CTA per group measured +17 us at batch 64 with no row
  // to recompute: 2048 CTAs of 135 KB shared memory take 16 waves just to exit.)
  const int n_fallback = std::max(1, std::min(n, multiprocessor_count()));
  detail::dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    if (head_dim == 64) {
      launch_decode_g<T, 64, true>(g.gmax, a, n, programmatic_launch_enabled(), stream);
      launch_decode_g<T, 64, false>(g.gmax, f, n_fallback, true, stream);
    } else {
      launch_decode_g<T, 128, true>(g.gmax, a, n, programmatic_launch_enabled(), stream);
      launch_decode_g<T, 128, false>(g.gmax, f, n_fallback, true, stream);
    }
  });
  check_launch("decode_attention_async");
}

}  // namespace fdpp::cuda
