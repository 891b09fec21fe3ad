// Rotary position embedding on the fused q/k/v projection output, and the paged KV-cache write.
//
// rope_qk: one thread per (token, q-or-k head, frequency pair). The angle is float(position) *
// inv_freq[i] in fp32 and cos/sin come from sincosf with full range reduction (not __sinf/__cosf,
// whose error grows with the argument: positions reach 128K, angles 1e5 rad), exactly how HF and
// the CPU reference compute them. V heads are not touched.
//
// kv_cache_write: one thread per (token, kv head, 8-element chunk): two 16-byte copies (k and v),
// or with an fp8 cache two 8-byte stores of e4m3(x / scale). Tokens whose slot is negative are
// skipped (padding rows of a fixed-size batch). Both writers place rows where kv_cache_layout.h says
// (the calling thread's KernelOptions::kv_head_major).
#include <cuda_fp8.h>

#include <cmath>
#include <type_traits>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kv_cache_layout.h"

namespace fdpp::cuda {

namespace {

using detail::aligned16;
using detail::check_launch;
using detail::from_float;
using detail::grid_for;
using detail::to_float;

constexpr int kThreads = 256;

// One rotated pair (a0, b0) by the angle whose cosine and sine are c and s, times `scale`
// (LongRoPE's attention factor; x 1 is exact). Explicit roundings, so that both rope kernels give
// the same bits whatever the compiler would contract into FMAs in each.
__device__ __forceinline__ void rotate_pair(float a0, float b0, float c, float s, float scale, float& a, float& b) {
  a = __fmul_rn(__fmaf_rn(a0, c, -__fmul_rn(b0, s)), scale);
  b = __fmul_rn(__fmaf_rn(b0, c, __fmul_rn(a0, s)), scale);
}

// Pair p of a head: rotated pairs are (p, p + n_freq) or (2p, 2p + 1); the dims after 2 * n_freq
// pass through as (2p, 2p + 1) in both styles.
template <bool kInterleaved>
__device__ __forceinline__ void pair_dims(int p, int n_freq, int& ia, int& ib) {
  ia = p < n_freq && !kInterleaved ? p : 2 * p;
  ib = p < n_freq && !kInterleaved ? p + n_freq : 2 * p + 1;
}

// (a, b) rotated by position * inv_freq and rounded to T, as both cache-writing kernels do.
template <class T>
__device__ __forceinline__ void rotate_rounded(T& a, T& b, int32_t position, float inv_freq, float rotary_scale) {
  float sn, cs;
  sincosf(static_cast<float>(position) * inv_freq, &sn, &cs);
  float ra, rb;
  rotate_pair(to_float(a), to_float(b), cs, sn, rotary_scale, ra, rb);
  a = from_float<T>(ra);
  b = from_float<T>(rb);
}

template <class T, bool kInterleaved>
__global__ void rope_qk_kernel(T* __restrict__ qkv, const int32_t* __restrict__ positions,
                               const float* __restrict__ inv_freq, int n_freq, int n_tokens, int n_rot_heads,
                               int head_dim, int64_t row_stride, float rotary_scale) {
  const int64_t total = int64_t(n_tokens) * n_rot_heads * n_freq;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int i = static_cast<int>(idx % n_freq);
    const int64_t rest = idx / n_freq;
    const int h = static_cast<int>(rest % n_rot_heads);  // q heads, then k heads: contiguous
    const int64_t t = rest / n_rot_heads;
    const float angle = static_cast<float>(positions[t]) * inv_freq[i];
    float s, c;
    sincosf(angle, &s, &c);
    T* head = qkv + t * row_stride + int64_t(h) * head_dim;
    const int ia = kInterleaved ? 2 * i : i;
    const int ib = kInterleaved ? 2 * i + 1 : i + n_freq;
    float a, b;
    rotate_pair(to_float(head[ia]), to_float(head[ib]), c, s, rotary_scale, a, b);
    head[ia] = from_float<T>(a);
    head[ib] = from_float<T>(b);
  }
}

// e4m3 bits of x / scale, saturating at +-448 (NaN stays NaN). The division is IEEE (not x * 1/scale)
// so that host references (core/fp8_e4m3.h) reproduce every byte.
__device__ __forceinline__ uint8_t to_fp8(float x, float scale) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(__fdiv_rn(x, scale), __NV_SATFINITE, __NV_E4M3));
}
__device__ __forceinline__ uint32_t to_fp8x2(float a, float b, float scale) {
  return __nv_cvt_float2_to_fp8x2(make_float2(__fdiv_rn(a, scale), __fdiv_rn(b, scale)), __NV_SATFINITE,
                                  __NV_E4M3);
}
// Eight T (a uint4) -> eight e4m3 bytes (a uint2) in the same order.
template <class T>
__device__ __forceinline__ uint2 to_fp8x8(const uint4& src, float scale) {
  float f[8];
  detail::load8(reinterpret_cast<const T*>(&src), f);
  return make_uint2(to_fp8x2(f[0], f[1], scale) | (to_fp8x2(f[2], f[3], scale) << 16),
                    to_fp8x2(f[4], f[5], scale) | (to_fp8x2(f[6], f[7], scale) << 16));
}

// One thread per (token, kv head, 8-element chunk, or element where rows are not 16-byte aligned).
// Src = Dst = uint16_t: the 16-bit cache, where the element type only matters for its size (the
// copy moves bits). Src = T, Dst = uint8_t: an e4m3 cache, each T value quantized.
template <class Src, class Dst, bool kVec>
__global__ void kv_cache_write_kernel(const Src* __restrict__ qkv, const int32_t* __restrict__ slots, int n_tokens,
                                      int n_heads, int n_kv_heads, int head_dim, KvCacheLayout layout,
                                      Dst* __restrict__ k_cache, Dst* __restrict__ v_cache, float k_scale,
                                      float v_scale) {
  constexpr bool kFp8 = sizeof(Dst) == 1;
  const int chunks = kVec ? head_dim / 8 : head_dim;  // per head
  const int64_t row_stride = int64_t(n_heads + 2 * n_kv_heads) * head_dim;
  const int64_t total = int64_t(n_tokens) * n_kv_heads * chunks;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int c = static_cast<int>(idx % chunks);
    const int64_t rest = idx / chunks;
    const int kvh = static_cast<int>(rest % n_kv_heads);
    const int64_t t = rest / n_kv_heads;
    const int32_t slot = slots[t];
    if (slot < 0) continue;
    const int64_t elem = kVec ? int64_t(c) * 8 : c;
    const Src* src_k = qkv + t * row_stride + int64_t(n_heads + kvh) * head_dim + elem;
    const Src* src_v = src_k + int64_t(n_kv_heads) * head_dim;
    const int64_t dst = layout.slot_row(slot, kvh) + elem;  // (e4m3: elements = bytes)
    if constexpr (kFp8 && kVec) {
      // elem is a multiple of 8 and rows are too: the 8-byte stores are aligned.
      *reinterpret_cast<uint2*>(k_cache + dst) = to_fp8x8<Src>(*reinterpret_cast<const uint4*>(src_k), k_scale);
      *reinterpret_cast<uint2*>(v_cache + dst) = to_fp8x8<Src>(*reinterpret_cast<const uint4*>(src_v), v_scale);
    } else if constexpr (kFp8) {
      k_cache[dst] = to_fp8(to_float(*src_k), k_scale);
      v_cache[dst] = to_fp8(to_float(*src_v), v_scale);
    } else if constexpr (kVec) {
      *reinterpret_cast<uint4*>(k_cache + dst) = *reinterpret_cast<const uint4*>(src_k);
      *reinterpret_cast<uint4*>(v_cache + dst) = *reinterpret_cast<const uint4*>(src_v);
    } else {
      k_cache[dst] = *src_k;
      v_cache[dst] = *src_v;
    }
  }
}

// The cache's element as a kernel template argument: T itself, or an e4m3 byte.
struct Fp8Cache {};

// One pair (a at ia, b at ib) of a k or v row into the cache at row offset `row`: T as it is, or
// e4m3 bytes of a / scale (KV = Fp8Cache).
template <class T, class KV>
__device__ __forceinline__ void write_cache_pair(void* cache, int64_t row, int ia, int ib, T a, T b, float scale) {
  if constexpr (std::is_same_v<KV, Fp8Cache>) {
    uint8_t* dst = static_cast<uint8_t*>(cache) + row;
    dst[ia] = to_fp8(to_float(a), scale);
    dst[ib] = to_fp8(to_float(b), scale);
  } else {
    T* dst = static_cast<T*>(cache) + row;
    dst[ia] = a;
    dst[ib] = b;
  }
}

// rope_qk + kv_cache_write in one launch (one per layer instead of two): one thread per (token,
// head of q, k or v, pair of dims). Pairs below n_freq rotate (q and k heads); the others pass
// through. Rotated k and v go to the cache at the token's slot (skipped when the slot is
// negative); q is rotated in place for the attention kernels, k stays unrotated in qkv (nothing
// reads it there). The cache receives the values of rope_qk followed by kv_cache_write, bit for
// bit (same math, same rounding; an fp8 cache quantizes the T-rounded values, as kv_cache_write).
// KV: T, or Fp8Cache for e4m3 bytes.
template <class T, class KV, bool kInterleaved>
__global__ void rope_qk_cache_kernel(T* __restrict__ qkv, const int32_t* __restrict__ positions,
                                     const float* __restrict__ inv_freq, int n_freq, const int32_t* __restrict__ slots,
                                     int n_tokens, int n_heads, int n_kv_heads, int head_dim, KvCacheLayout layout,
                                     void* __restrict__ k_cache, void* __restrict__ v_cache, float k_scale,
                                     float v_scale, float rotary_scale) {
  detail::pdl_trigger();
  detail::pdl_wait();  // qkv is the previous kernel's (programmatic launch: see kernels.h)
  const int pairs = head_dim / 2;
  const int heads = n_heads + 2 * n_kv_heads;
  const int64_t row_stride = int64_t(heads) * head_dim;
  const int64_t total = int64_t(n_tokens) * heads * pairs;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int p = static_cast<int>(idx % pairs);
    const int64_t rest = idx / pairs;
    const int h = static_cast<int>(rest % heads);
    const int64_t t = rest / heads;
    const bool is_q = h < n_heads, is_k = !is_q && h < n_heads + n_kv_heads;
    T* head = qkv + t * row_stride + int64_t(h) * head_dim;
    int ia, ib;
    pair_dims<kInterleaved>(p, n_freq, ia, ib);
    T a = head[ia], b = head[ib];
    if ((is_q || is_k) && p < n_freq) {
      rotate_rounded(a, b, positions[t], inv_freq[p], rotary_scale);
      if (is_q) {
        head[ia] = a;
        head[ib] = b;
      }
    }
    if (is_q) continue;
    const int32_t slot = slots[t];
    if (slot < 0) continue;
    const int kvh = is_k ? h - n_heads : h - n_heads - n_kv_heads;
    write_cache_pair<T, KV>(is_k ? k_cache : v_cache, layout.slot_row(slot, kvh), ia, ib, a, b,
                            is_k ? k_scale : v_scale);
  }
}

// The q/k norms (Qwen3, Gemma 3), the rotary embedding and the cache write in one launch: a warp per (token, head
// of q, k or v). A q or k head is first scaled by its RMSNorm (the sum of squares taken in
// head_rms_norm's order, lane-strided then a warp sum, and the normed values rounded to T as it
// stores them), then rotated and written as rope_qk_cache_kernel does: the bits of head_rms_norm
// followed by rope_qk_cache. q gets every normed dim (rotated or not); k and v go to the cache.
template <class T, class KV, bool kInterleaved>
__global__ void norm_rope_qk_cache_kernel(T* __restrict__ qkv, const int32_t* __restrict__ positions,
                                          const float* __restrict__ inv_freq, int n_freq,
                                          const int32_t* __restrict__ slots, int n_tokens, int n_heads,
                                          int n_kv_heads, int head_dim, KvCacheLayout layout,
                                          void* __restrict__ k_cache, void* __restrict__ v_cache, float k_scale,
                                          float v_scale, float rotary_scale, const T* __restrict__ q_weight,
                                          const T* __restrict__ k_weight, float eps) {
  detail::pdl_trigger();
  detail::pdl_wait();  // qkv is the previous kernel's
  const int heads = n_heads + 2 * n_kv_heads;
  const int64_t r = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (r >= int64_t(n_tokens) * heads) return;  // whole warps leave together
  const int64_t t = r / heads;
  const int h = static_cast<int>(r - t * heads);
  const bool is_q = h < n_heads, is_k = !is_q && h < n_heads + n_kv_heads;
  const int32_t slot = is_q ? 0 : slots[t];
  if (slot < 0) return;  // warp-uniform: a padding row's k and v are not written
  T* head = qkv + t * int64_t(heads) * head_dim + int64_t(h) * head_dim;
  const T* w = is_q ? q_weight : is_k ? k_weight : nullptr;
  float inv = 1.f;
  if (w != nullptr) {
    float ss = 0.f;
    for (int i = lane; i < head_dim; i += 32) {
      const float v = to_float(head[i]);
      ss += v * v;
    }
    ss = detail::warp_sum(ss);
    inv = static_cast<float>(1.0 / sqrt(static_cast<double>(ss) / head_dim + eps));
  }
  const int32_t position = positions[t];
  const int kvh = is_k ? h - n_heads : h - n_heads - n_kv_heads;
  for (int p = lane; p < head_dim / 2; p += 32) {
    int ia, ib;
    pair_dims<kInterleaved>(p, n_freq, ia, ib);
    T a = head[ia], b = head[ib];
    if (w != nullptr) {
      a = from_float<T>(to_float(a) * inv * to_float(w[ia]));
      b = from_float<T>(to_float(b) * inv * to_float(w[ib]));
    }
    if ((is_q || is_k) && p < n_freq) rotate_rounded(a, b, position, inv_freq[p], rotary_scale);
    if (is_q) {
      head[ia] = a;
      head[ib] = b;
      continue;
    }
    write_cache_pair<T, KV>(is_k ? k_cache : v_cache, layout.slot_row(slot, kvh), ia, ib, a, b,
                            is_k ? k_scale : v_scale);
  }
}

}  // namespace

void check_kv_quant(const KvQuant& q, int head_dim, const char* what) {
  if (q.dtype == KvDType::Model) return;
  check(q.dtype == KvDType::Fp8E4M3, "{}: unknown KV cache dtype {}", what, static_cast<int>(q.dtype));
  check(head_dim == 64 || head_dim == 128 || head_dim == 256,
        "{}: an fp8 KV cache supports head_dim 64, 128 or 256, not {}", what, head_dim);
  check(std::isfinite(q.k_scale) && q.k_scale > 0.f && std::isfinite(q.v_scale) && q.v_scale > 0.f,
        "{}: fp8 KV cache scales must be positive and finite (k_scale {}, v_scale {})", what, q.k_scale, q.v_scale);
}


void rope_qk_cache(void* qkv, const int32_t* positions, const float* inv_freq, int n_freq, const int32_t* slots,
                   int n_tokens, int n_heads, int n_kv_heads, int head_dim, int block_size, RopeStyle style,
                   void* k_cache, void* v_cache, DType dtype, cudaStream_t stream, const KvQuant& kv_quant,
                   float rotary_scale, const HeadNorm& head_norm) {
  check(qkv != nullptr && positions != nullptr && inv_freq != nullptr && slots != nullptr && k_cache != nullptr &&
            v_cache != nullptr,
        "rope_qk_cache: null pointer (qkv {}, positions {}, inv_freq {}, slots {}, k_cache {}, v_cache {})", qkv,
        static_cast<const void*>(positions), static_cast<const void*>(inv_freq), static_cast<const void*>(slots),
        k_cache, v_cache);
  check(n_tokens > 0 && n_heads > 0 && n_kv_heads > 0 && head_dim > 0 && head_dim % 2 == 0,
        "rope_qk_cache: n_tokens = {}, n_heads = {}, n_kv_heads = {} must be positive, head_dim = {} even", n_tokens,
        n_heads, n_kv_heads, head_dim);
  check(n_freq > 0 && 2 * n_freq <= head_dim, "rope_qk_cache: n_freq = {} must be in [1, head_dim / 2 = {}]", n_freq,
        head_dim / 2);
  check(style == RopeStyle::RotateHalf || style == RopeStyle::Interleaved, "rope_qk_cache: unknown rope style {}",
        static_cast<int>(style));
  check_kv_quant(kv_quant, head_dim, "rope_qk_cache");
  check(std::isfinite(rotary_scale) && rotary_scale > 0.f, "rope_qk_cache: rotary_scale = {} must be positive",
        rotary_scale);
  const bool normed = head_norm.q_weight != nullptr;
  check(normed == (head_norm.k_weight != nullptr), "rope_qk_cache: the head norm needs both q and k weights");
  check(!normed || (std::isfinite(head_norm.eps) && head_norm.eps >= 0.f),
        "rope_qk_cache: head norm eps = {} must be finite and non-negative", head_norm.eps);
  const KvCacheLayout layout = kv_cache_layout(block_size, n_kv_heads, head_dim, "rope_qk_cache");
  const int64_t total = int64_t(n_tokens) * (n_heads + 2 * n_kv_heads) * (head_dim / 2);
  const bool fp8 = kv_quant.dtype == KvDType::Fp8E4M3;
  detail::dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    const bool interleaved = style == RopeStyle::Interleaved;
    if (normed) {
      auto* kernel = fp8 ? (interleaved ? norm_rope_qk_cache_kernel<T, Fp8Cache, true>
                                        : norm_rope_qk_cache_kernel<T, Fp8Cache, false>)
                         : (interleaved ? norm_rope_qk_cache_kernel<T, T, true> : norm_rope_qk_cache_kernel<T, T, false>);
      const int64_t warps = int64_t(n_tokens) * (n_heads + 2 * n_kv_heads);
      const detail::LaunchConfig config(dim3(static_cast<unsigned>((warps * 32 + kThreads - 1) / kThreads)),
                                        dim3(kThreads), 0, stream, programmatic_launch_enabled());
      detail::cuda_check(cudaLaunchKernelEx(config.get(), kernel, static_cast<T*>(qkv), positions, inv_freq, n_freq,
                                            slots, n_tokens, n_heads, n_kv_heads, head_dim, layout, k_cache, v_cache,
                                            kv_quant.k_scale, kv_quant.v_scale, rotary_scale,
                                            static_cast<const T*>(head_norm.q_weight),
                                            static_cast<const T*>(head_norm.k_weight), head_norm.eps),
                         "cudaLaunchKernelEx(rope_qk_cache, with the head norm)");
      return;
    }
    auto* kernel = fp8 ? (interleaved ? rope_qk_cache_kernel<T, Fp8Cache, true> : rope_qk_cache_kernel<T, Fp8Cache, false>)
                       : (interleaved ? rope_qk_cache_kernel<T, T, true> : rope_qk_cache_kernel<T, T, false>);
    const detail::LaunchConfig config(dim3(grid_for(total, kThreads)), dim3(kThreads), 0, stream,
                                      programmatic_launch_enabled());
    detail::cuda_check(cudaLaunchKernelEx(config.get(), kernel, static_cast<T*>(qkv), positions, inv_freq, n_freq,
                                          slots, n_tokens, n_heads, n_kv_heads, head_dim, layout, k_cache, v_cache,
                                          kv_quant.k_scale, kv_quant.v_scale, rotary_scale),
                       "cudaLaunchKernelEx(rope_qk_cache)");
  });
  check_launch("rope_qk_cache");
}

void rope_qk(void* qkv, const int32_t* positions, const float* inv_freq, int n_freq, int n_tokens, int n_heads,
             int n_kv_heads, int head_dim, RopeStyle style, DType dtype, cudaStream_t stream, float rotary_scale) {
  check(qkv != nullptr && positions != nullptr && inv_freq != nullptr,
        "rope_qk: null pointer (qkv {}, positions {}, inv_freq {})", qkv, static_cast<const void*>(positions),
        static_cast<const void*>(inv_freq));
  check(n_tokens > 0 && n_heads > 0 && n_kv_heads > 0 && head_dim > 0,
        "rope_qk: n_tokens = {}, n_heads = {}, n_kv_heads = {}, head_dim = {} must be positive", n_tokens, n_heads,
        n_kv_heads, head_dim);
  check(n_freq > 0 && 2 * n_freq <= head_dim, "rope_qk: n_freq = {} must be in [1, head_dim / 2 = {}]", n_freq,
        head_dim / 2);
  check(style == RopeStyle::RotateHalf || style == RopeStyle::Interleaved, "rope_qk: unknown rope style {}",
        static_cast<int>(style));
  check(std::isfinite(rotary_scale) && rotary_scale > 0.f, "rope_qk: rotary_scale = {} must be positive",
        rotary_scale);
  const int64_t row_stride = int64_t(n_heads + 2 * n_kv_heads) * head_dim;
  const int n_rot_heads = n_heads + n_kv_heads;
  const int64_t total = int64_t(n_tokens) * n_rot_heads * n_freq;
  detail::dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    auto* kernel = style == RopeStyle::Interleaved ? rope_qk_kernel<T, true> : rope_qk_kernel<T, false>;
    kernel<<<grid_for(total, kThreads), kThreads, 0, stream>>>(static_cast<T*>(qkv), positions, inv_freq, n_freq,
                                                               n_tokens, n_rot_heads, head_dim, row_stride,
                                                               rotary_scale);
  });
  check_launch("rope_qk");
}

void kv_cache_write(const void* qkv, const int32_t* slots, int n_tokens, int n_heads, int n_kv_heads, int head_dim,
                    int block_size, void* k_cache, void* v_cache, DType dtype, cudaStream_t stream,
                    const KvQuant& kv_quant) {
  check(qkv != nullptr && slots != nullptr && k_cache != nullptr && v_cache != nullptr,
        "kv_cache_write: null pointer (qkv {}, slots {}, k_cache {}, v_cache {})", qkv,
        static_cast<const void*>(slots), k_cache, v_cache);
  check(n_tokens > 0 && n_heads > 0 && n_kv_heads > 0 && head_dim > 0,
        "kv_cache_write: n_tokens = {}, n_heads = {}, n_kv_heads = {}, head_dim = {} must be positive", n_tokens,
        n_heads, n_kv_heads, head_dim);
  check(dtype == DType::F16 || dtype == DType::BF16, "kv_cache_write: unknown dtype {}", static_cast<int>(dtype));
  check_kv_quant(kv_quant, head_dim, "kv_cache_write");
  const KvCacheLayout layout = kv_cache_layout(block_size, n_kv_heads, head_dim, "kv_cache_write");
  const bool vec = head_dim % 8 == 0 && aligned16(qkv) && aligned16(k_cache) && aligned16(v_cache);
  const int64_t total = int64_t(n_tokens) * n_kv_heads * (vec ? head_dim / 8 : head_dim);
  auto launch = [&](auto* kernel, const auto* src, auto* k, auto* v) {
    kernel<<<grid_for(total, kThreads), kThreads, 0, stream>>>(src, slots, n_tokens, n_heads, n_kv_heads, head_dim,
                                                               layout, k, v, kv_quant.k_scale, kv_quant.v_scale);
  };
  if (kv_quant.dtype == KvDType::Fp8E4M3) {
    detail::dispatch_dtype(dtype, [&](auto tag) {
      using T = decltype(tag);
      launch(vec ? kv_cache_write_kernel<T, uint8_t, true> : kv_cache_write_kernel<T, uint8_t, false>,
             static_cast<const T*>(qkv), static_cast<uint8_t*>(k_cache), static_cast<uint8_t*>(v_cache));
    });
  } else {
    launch(vec ? kv_cache_write_kernel<uint16_t, uint16_t, true> : kv_cache_write_kernel<uint16_t, uint16_t, false>,
           static_cast<const uint16_t*>(qkv), static_cast<uint16_t*>(k_cache), static_cast<uint16_t*>(v_cache));
  }
  check_launch("kv_cache_write");
}

}  // namespace fdpp::cuda
