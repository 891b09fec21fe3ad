// What both decode-attention loops share: the kernel's arguments (DecodeArgs), the CTA's row slice,
// the staged-row layout and the K/V copies. The decode_attention_*.cuh headers are the parts of one
// translation unit, decode_attention.cu, and include nothing else of it: their definitions sit in
// an unnamed namespace, as they did in the .cu, so the kernels keep their internal linkage and names.
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/decode_plan.h"
#include "backend/cuda/kv_cache_layout.h"

namespace fdpp::cuda {
namespace {

using decode::CoreShape;
using decode::default_warps;
using decode::kDefaultWarps;
using decode::kFlagBytes;
using decode::kStagedRow;
using decode::kSwizzledRows;
using decode::MmaShape;
using decode::resident_ctas;
using detail::aligned16;
using detail::check_launch;
using detail::cuda_check;
using detail::from_float;
using detail::to_float;
using detail::warp_max;
using detail::warp_sum;

struct DecodeArgs {
  const void* qkv;
  const void* k_cache;
  const void* v_cache;
  const int32_t* block_tables;
  int max_blocks_per_seq;
  const int32_t* context_lens;
  int batch, n_heads, n_kv_heads, group, n_sub;
  int gmax;  // query heads per CTA (sub-group size; the last sub-group may have fewer)
  int n_groups;  // CTA groups: batch x n_kv_heads x n_sub (plan_groups, once per call)
  KvCacheLayout kv;  // where a key's row of a kv head sits in the paged cache (kv_cache_layout.h)
  float scale_log2;  // scale * log2(e)
  void* out;
  // Split-KV (splits > 1): CTA (.., split) takes the split-th slice of the key tiles and writes
  // its partial to `partials` [batch][H][splits][D + 2] = (m, d, o[D]). Sync mode: m is the
  // slice's running max, d and o are relative to it, and decode_combine_kernel merges the slices.
  // Async mode: m is the slice's max logit (for the guard only), d and o are relative to the
  // unified max phi, and decode_async_combine_kernel adds them up (no rescaling).
  int splits;
  float* partials;
  // Async (unified max) mode, all in log2 units (x * log2 e): phi and the safe range [lo, hi] of
  // (row max - phi). Rows outside it are recomputed by the CTA that finds them.
  float phi2, lo2, hi2;
  // Per-group semaphores of the in-kernel reduction (kKernelCombine): counters[2 + group], zero
  // before the launch and left zero by the group's last CTA. (Ints 0 and 1 are unused: the former
  // fallback list's count; the interface's sizing keeps them.)
  int* counters;
  unsigned long long* fallback_rows;  // cumulative count of rows recomputed (nullable)
  // Masked calls (the kMasked kernels; the combine's recomputation reads them at run time): a row
  // of L keys attends to keys [L - window, L) when window > 0 (RowSlice::lo); softcap > 0 caps
  // every logit x = scale q.k to softcap * tanh(x / softcap) before the softmax. 0: off.
  int window;
  float softcap;
  float scale;  // (the raw logits' multiplier, for the cap of raw q.k)
  // An e4m3 cache (the kFp8 kernels): `kv` counts 16-bit units (a row of D bytes is D / 2 of them),
  // K's scale is folded into scale and scale_log2, and V's multiplies the loop's sums.
  float v_scale;
};

// The first key a row of L keys attends to (0 without a window).
__device__ __forceinline__ int window_begin(int L, int window) { return window > 0 && L > window ? L - window : 0; }

// A raw logit q.k capped as its scaled value scale q.k would be: cap / scale * tanh(q.k scale / cap),
// so that the loops' later multiplication by scale log2(e) gives cap tanh(x / cap) in log2 units.
// (tanhf, not the approximate instruction: the result must match the reference to rounding.)
__device__ __forceinline__ float cap_raw_logit(float s, float scale, float cap) {
  return cap / scale * tanhf(s * scale / cap);
}

// ---- shared memory layouts ---------------------------------------------------------------------
// Both loops start with the per-warp merge inputs m [W][GMAX], d [W][GMAX] (fp32); the loop's own
// buffers follow, and after the loop o [W][GMAX][D] (fp32) overlays the loop's K/V stages
// (decode_plan.h: CoreShape, MmaShape).

// Element offset of chunk c of staged row r. Reads take one 16-byte chunk from each of 8
// consecutive rows (ldmatrix; the CUDA-core loop's quarter-warp of keys), which with rows a multiple
// of 128 bytes apart would all fall on the same 4 banks: chunk c of row r is stored at c ^ (r & 7)
// where rows have a multiple of 8 chunks, and rows are padded by 16 bytes otherwise (kStagedRow).
template <int D>
__device__ __forceinline__ int staged(int r, int c) {
  return r * kStagedRow<D> + (kSwizzledRows<D> ? c ^ (r & 7) : c) * 8;
}

template <int D, int GMAX, bool kMma, int W, bool kFp8 = false>
struct ShapeOf {
  static_assert(!kFp8, "an e4m3 cache runs the tensor-core loop");
  using type = CoreShape<D, GMAX, W>;
};
template <int D, int GMAX, int W, bool kFp8>
struct ShapeOf<D, GMAX, true, W, kFp8> {
  using type = MmaShape<D, W, kFp8>;
};

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

// What both loops need to know about the CTA's row.
struct RowSlice {
  int b, kvh, head0, gc;  // sequence, kv head, first query head, query heads of this CTA
  int L;                  // keys of the row
  int lo;                 // its first key (window_begin; 0 in unmasked kernels)
  int tile_begin, tile_end;  // this CTA's key tiles (of the loop's tile size)
};

// K/V copies global -> shared (bypassing L1) with an L2 prefetch size of 128 bytes (the qualifier
// CUTLASS's cp.async uses; faster than none and than 256 bytes: docs/kernels/decode_attention.md,
// L2 prefetch).
__device__ __forceinline__ void kv_copy16(void* smem_dst, const void* gmem_src) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16;\n" ::"r"(dst), "l"(gmem_src) : "memory");
}
// The same, writing 16 zero bytes instead when !valid (src-size 0: nothing is read).
__device__ __forceinline__ void kv_copy16_zfill(void* smem_dst, const void* gmem_src, bool valid) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem_src), "r"(src_bytes)
               : "memory");
}

// Element offset of key j's row of kv head kvh (btab: the sequence's block table).
__device__ __forceinline__ int64_t cache_row(const DecodeArgs& a, const int32_t* btab, int j, int kvh) {
  return a.kv.row(btab[j >> a.kv.block_shift], j & ((1 << a.kv.block_shift) - 1), kvh);
}

}  // namespace
}  // namespace fdpp::cuda
