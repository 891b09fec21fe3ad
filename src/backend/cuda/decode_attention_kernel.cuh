// One decode-attention CTA's work (attend_group: the prologue, one of the two loops, the merge of
// the warps, the split's partial or the output, and the async in-kernel reduction with its
// synchronized recomputation of rows out of range) and the kernel around it. Part of
// decode_attention.cu's translation unit (decode_attention_common.cuh).
//
// Async reduction and fallback. One split: there is nothing to unify, and the async mode runs the
// synchronized kernel (exact for any logits; see decode_attention_async); the same where a launch
// would run the CUDA-core loop. Several splits on tensor cores: each CTA writes its partial (sums
// relative to phi, and its max logit); a second, wide launch (decode_async_combine_kernel, one CTA
// per row) adds them in a fixed order, checks the guard and recomputes rows out of range exactly;
// or, with few splits (decode_plan.h: combine_in_kernel), the group's last CTA to arrive at its
// semaphore does the same in the kernel, without the launch, and recomputes rows out of range itself
// with the synchronized loop.
// A context length <= 0 writes zeros (padding rows of a fixed-size batch); lengths beyond the
// block table's capacity (max_blocks_per_seq * block_size) are clamped to it.
#pragma once

#include <cmath>

#include "backend/cuda/decode_attention_common.cuh"
#include "backend/cuda/decode_attention_core.cuh"
#include "backend/cuda/decode_attention_mma.cuh"
#include "backend/cuda/softmax_state.cuh"

namespace fdpp::cuda {
namespace {

// ---- one CTA's work --------------------------------------------------------------------------------
// The group `group_index` ((b * KVH + kvh) * n_sub + sub), key slice `split`, writing only the heads
// in head_mask (sync mode without splits: the recomputation of rows the guard rejected).
// kKernelCombine (async only): the group's last CTA adds the splits' partials (DecodeAttentionLaunch::
// combine_in_kernel); without it the CTA ends after its partial and the kernel holds no reduction and
// no synchronized recomputation (half the code).
// kMasked: a window and/or soft-capped logits (DecodeArgs::window, softcap): the tiles start at the
// window's first key and the loop masks and caps (tensor-core loop only).
// kFp8: an e4m3 cache (tensor-core loop only; DecodeArgs::v_scale).
template <class T, int D, int GMAX, bool kAsync, bool kMma, int kW, bool kKernelCombine = false, bool kMasked = false,
          bool kFp8 = false>
__device__ void attend_group(const DecodeArgs& a, int group_index, unsigned head_mask, int split,
                             unsigned char* smem_raw, int& mask_s) {
  using Shape = typename ShapeOf<D, GMAX, kMma, kW, kFp8>::type;
  constexpr int W = Shape::kWarps, NTH = W * 32, KT = Shape::kKeys;
  float* m_s = reinterpret_cast<float*>(smem_raw);  // [W][GMAX]
  float* d_s = m_s + W * GMAX;                      // [W][GMAX]
  unsigned char* body = reinterpret_cast<unsigned char*>(d_s + W * GMAX);  // (16-byte aligned: W * GMAX >= 8)

  const int tid = threadIdx.x;
  RowSlice r;
  const int sub = group_index % a.n_sub;
  const int bk = group_index / a.n_sub;
  r.kvh = bk % a.n_kv_heads;
  r.b = bk / a.n_kv_heads;
  const int g0 = sub * a.gmax;
  r.gc = min(a.gmax, a.group - g0);  // query heads of this CTA (<= GMAX)
  r.head0 = r.kvh * a.group + g0;
  const int H = a.n_heads;

  T* out = static_cast<T*>(a.out) + (int64_t(r.b) * H + r.head0) * D;
  int L = a.context_lens[r.b];
  const int64_t capacity = int64_t(a.max_blocks_per_seq) << a.kv.block_shift;
  if (L > capacity) L = static_cast<int>(capacity);
  r.L = L;
  r.lo = kMasked ? window_begin(L, a.window) : 0;
  // This CTA's slice of the key tiles (all of them when there is one split); with a window, of the
  // tiles from the one holding its first key: every tile walked holds a key of the window.
  const int n_tiles = L > 0 ? (L + KT - 1) / KT : 0;
  const int first_tile = kMasked ? r.lo / KT : 0;
  const int tiles_per_split = (n_tiles - first_tile + a.splits - 1) / a.splits;
  r.tile_begin = first_tile + split * tiles_per_split;
  r.tile_end = min(n_tiles, r.tile_begin + tiles_per_split);
  float* partial = a.splits > 1 ? a.partials + ((int64_t(r.b) * H + r.head0) * a.splits + split) * (D + 2) : nullptr;
  // Everything below reads q or writes global memory after the previous kernel (pdl_wait), except
  // the loops' first copies (each loop waits itself).
  if (n_tiles == 0 || r.tile_begin >= r.tile_end) detail::pdl_wait();
  if (n_tiles == 0) {  // a padding row (length <= 0): zeros, written by every split alike
    for (int i = tid; i < r.gc * D; i += NTH) out[i] = from_float<T>(0.f);
    return;
  }
  if (!kAsync && r.tile_begin >= r.tile_end) {  // sync: no keys in this slice, an empty partial
    for (int i = tid; i < r.gc * D; i += NTH) {
      write_partial(partial + int64_t(i / D) * a.splits * (D + 2), i % D, -INFINITY, 0.f, 0.f);
    }
    return;
  }
  // (Async: an empty slice still arrives at the semaphore below, with zero sums.)

  float* o_s;
  if constexpr (kMma) {
    o_s = mma_loop<T, D, kAsync, kW, kMasked, kFp8>(a, r, body, m_s, d_s);
  } else {
    static_assert(!kAsync, "the async mode runs the synchronized kernels on the CUDA-core loop");
    static_assert(!kMasked, "masked calls run the tensor-core loop");
    o_s = core_loop<T, D, GMAX, kW>(a, r, body, m_s, d_s);
  }

  // The merges of the warps: VW consecutive dims per thread, 4 (float4 reads of o, a row's max and
  // weights once per 4 outputs) where that still gives every thread work (the tensor-core CTAs'
  // 16 rows), else 1 (one query head per CTA on CUDA cores, where 4 measured slower:
  // docs/kernels/decode_attention.md, end of the CTA).
  const int gc = r.gc;
  constexpr int OS = Shape::kOStride, VW = GMAX * D >= 4 * NTH ? 4 : 1, NQ = D / VW;
  static_assert(D % 4 == 0 && OS % 4 == 0, "float4 rows");
  auto o_load = [&](int w, int g, int d, float(&v)[VW]) {
    const float* p = o_s + (w * GMAX + g) * OS + d;
    if constexpr (VW == 4) {
      const float4 q = *reinterpret_cast<const float4*>(p);
      v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
    } else {
      v[0] = *p;
    }
  };
  if constexpr (kAsync) {
    // Add the warps' sums (all relative to phi: no rescale) and take the CTA's max logit: SoftmaxState's
    // add_unified, written out here and in the in-kernel reduction below because their loads and adds
    // come in another order (through the state the compiler numbers and schedules them differently).
    for (int i = tid; i < gc * NQ; i += NTH) {
      const int g = i / NQ, d = (i - g * NQ) * VW;
      float M = -INFINITY, den = 0.f, num[VW] = {};
#pragma unroll
      for (int w = 0; w < W; ++w) {
        M = fmaxf(M, m_s[w * GMAX + g]);
        float o[VW];
        o_load(w, g, d, o);
#pragma unroll
        for (int k = 0; k < VW; ++k) num[k] += o[k];
        den += d_s[w * GMAX + g];
      }
      float* pg = partial + int64_t(g) * a.splits * (D + 2);
#pragma unroll
      for (int k = 0; k < VW; ++k) write_partial(pg, d + k, M, den, num[k]);
    }
    // The partial is written (this kernel always runs several splits: decode_attention_async sends a
    // single split to the synchronized kernel). Without kKernelCombine the CTA is done: the launch
    // after it, decode_async_combine_kernel (one CTA per row), adds the splits' sums, checks the
    // guard and recomputes rows out of range.
    if constexpr (kKernelCombine) {
      // In-kernel reduction (few splits): every thread's partial stores are made visible device-wide
      // before the CTA arrives at its group's semaphore; the CTA that arrives last (the counter
      // reaches splits - 1 before its add) resets the semaphore for the next launch and adds every
      // split's partial in split order (bitwise the same output whichever CTA is last).
      __threadfence();
      __syncthreads();
      if (tid == 0) {
        int* sem = a.counters + 2 + group_index;
        const bool last = atomicAdd(sem, 1) == a.splits - 1;
        if (last) atomicExch(sem, 0);  // every split has arrived: nobody else touches it this launch
        mask_s = last ? 0 : -1;
      }
      __syncthreads();
      if (mask_s != 0) return;  // (read by every thread before any atomicOr below can change it)
      __threadfence();  // the other CTAs' partials, published before their arrival, are read below
      __syncthreads();
      const float* p0 = a.partials + (int64_t(r.b) * H + r.head0) * a.splits * (D + 2);
      // VW dims per thread as in the merge above; the splits' loads in flight together (4 splits
      // unrolled; auto takes this path with at most kAsyncKernelCombineMaxSplits), each element's
      // sum still in split order.
      for (int i = tid; i < gc * NQ; i += NTH) {
        const int g = i / NQ, d = (i - g * NQ) * VW;
        const float* pg = p0 + int64_t(g) * a.splits * (D + 2);
        float M = -INFINITY, den = 0.f, num[VW] = {};  // (add_unified, written out: above)
#pragma unroll 4
        for (int s = 0; s < a.splits; ++s) {  // in split order; L2 reads (other SMs wrote them)
          const float* ps = pg + int64_t(s) * (D + 2);
          M = fmaxf(M, __ldcg(ps));
          den += __ldcg(ps + 1);
#pragma unroll
          for (int k = 0; k < VW; ++k) num[k] += __ldcg(ps + 2 + d + k);
        }
        const float rel = M - a.phi2;
        if (rel >= a.lo2 && rel <= a.hi2) {  // (NaN fails)
#pragma unroll
          for (int k = 0; k < VW; ++k) out[g * D + d + k] = from_float<T>(num[k] / den);
        } else if (d == 0) {
          atomicOr(&mask_s, 1 << g);
        }
      }
      __syncthreads();
      const unsigned mask = static_cast<unsigned>(mask_s);
      if (mask == 0) return;
      // Rows out of range: this CTA recomputes them with the synchronized softmax over all the row's
      // keys (one split, only the masked heads written). The barrier above ended every read of the
      // shared buffers the recomputation reuses.
      if (tid == 0 && a.fallback_rows != nullptr)
        atomicAdd(a.fallback_rows, static_cast<unsigned long long>(__popc(mask)));
      DecodeArgs f = a;
      f.splits = 1;
      f.partials = nullptr;
      attend_group<T, D, GMAX, false, kMma, kW, false, kMasked, kFp8>(f, group_index, mask, 0, smem_raw, mask_s);
    }
  } else {
    for (int i = tid; i < gc * NQ; i += NTH) {
      const int g = i / NQ, d = (i - g * NQ) * VW;
      // The warps' states rescaled to the CTA's max M (a warp that saw no key has m = -inf: weight 0).
      float M = -INFINITY;
#pragma unroll
      for (int w = 0; w < W; ++w) M = fmaxf(M, m_s[w * GMAX + g]);
      float num[VW] = {}, den = 0.f;
      SoftmaxState<float[VW]> st{M, num, den};
      if (M != -INFINITY) {
#pragma unroll
        for (int w = 0; w < W; ++w) {
          const float f = exp2f(m_s[w * GMAX + g] - M);
          float o[VW];
          o_load(w, g, d, o);
          st.add_weighted(f, o, d_s[w * GMAX + g]);
        }
      }
      if (partial == nullptr) {
        if ((head_mask >> g) & 1u) {
#pragma unroll
          for (int k = 0; k < VW; ++k) out[g * D + d + k] = from_float<T>(st.normalized(k));
        }
      } else {
        float* pg = partial + int64_t(g) * a.splits * (D + 2);
#pragma unroll
        for (int k = 0; k < VW; ++k) write_partial(pg, d + k, M, den, num[k]);
      }
    }
  }
}

// The resident CTAs per SM an instantiation is built for: 1 at the default 8 warps (the bound of the
// measured kernels, unchanged), else as many as shared memory and threads allow, at most 3 (4 warps
// at head_dim 128: 3 on CUDA cores for groups up to 8, 2 at 16 and on tensor cores). It also caps
// registers at 64K / (threads x CTAs): 168 per thread at 3 x 128 threads (uncapped, the CUDA-core
// loop spilled at head_dim 64: docs/kernels/decode_attention.md, loop and warps).
constexpr int kMaxMinCtasPerSm = 3;
template <int D, int GMAX, bool kMma, int W, bool kFp8 = false>
constexpr int min_ctas_per_sm() {
  using Shape = typename ShapeOf<D, GMAX, kMma, W, kFp8>::type;
  const int n = resident_ctas(W * 32, Shape::kSmem + kFlagBytes);
  return W == kDefaultWarps ? 1 : n < kMaxMinCtasPerSm ? n : kMaxMinCtasPerSm;
}

template <class T, int D, int GMAX, bool kAsync, bool kMma, int W, bool kKernelCombine, bool kMasked, bool kFp8>
__global__ void __launch_bounds__(W * 32, (min_ctas_per_sm<D, GMAX, kMma, W, kFp8>()))
    decode_attention_kernel(DecodeArgs a) {
  // No static __shared__ here: it would come first and move the dynamic buffer's start off a 128-byte
  // line, and with it every staged K/V row (each warp's copies would then straddle one more line per
  // 512 bytes, as padded rows did). The in-kernel reduction's flag (the one such variable; unused
  // elsewhere) lives after the dynamic layout instead (kFlagBytes; a static flag made the kernel
  // that holds the reduction twice as slow: docs/kernels/decode_attention.md, staged rows).
  extern __shared__ __align__(128) unsigned char smem_raw[];
  using Shape = typename ShapeOf<D, GMAX, kMma, W, kFp8>::type;
  int& mask_s = *reinterpret_cast<int*>(smem_raw + Shape::kSmem);
  // The next launch (the O projection) may be scheduled now: its CTAs take SMs as this grid's
  // retire. attend_group waits for the previous kernel (rope: qkv and the cache's last key) once it
  // has issued the copies of older keys. See kernels.h, programmatic launch.
  detail::pdl_trigger();
  attend_group<T, D, GMAX, kAsync, kMma, W, kKernelCombine, kMasked, kFp8>(a, blockIdx.x, 0xffffffffu, blockIdx.y,
                                                                           smem_raw, mask_s);
}

}  // namespace
}  // namespace fdpp::cuda
