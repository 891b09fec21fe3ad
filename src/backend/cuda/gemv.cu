// GEMV on CUDA cores for decode's smallest batches (FlashDecoding++'s ImplA, FastGEMV style):
// y[M, N] = x[M, K] . W[N, K]^T (+ bias), M = 1..8, 16-bit inputs, fp32 accumulation, with the
// epilogues of flat_gemm.h (gemv_ex) or a plain 16-bit / fp32 store (gemv, kernels.h).
//
// Decode at batch 1 is a pure stream of the weights, so the kernel is built around bytes in flight:
// one warp owns R weight rows (R = 2 at M <= 2, 4 above: the x chunk a lane loads is applied to all
// R rows, so x costs 1/R of the W traffic in L1) and lane l takes the rows' 16-byte chunks l, l + 32,
// ... Each pass issues R x U independent 16-byte loads per lane before the first use (U = 8 at
// M <= 2: 16 loads = 256 bytes per lane, a whole 8 KB row pair of K = 4096 in two passes; U = 4 at
// M > 2), with the streaming hint (__ldcs, evict-first: the weights are read once per step; x
// stays cached). Each chunk's 8 products go to their own fp32 chain before joining the row's sum,
// so a row is not one long dependent FMA chain (U x R x M independent chains per lane). A
// warp-shuffle butterfly ends each row; lane i stores value i. 8 warps per CTA. SwiGLU: the warp's
// rows are R / 2 gate rows and the matching up rows.
//
// Measured on the H200 (fdpp_flat_gemm_bench, fp16, graph of 20 calls over weights rotated past L2;
// bench/kernels/NOTES.md), M = 1: 88-94% of 4.46 TB/s on the large gate+up shapes (Llama-2-7B
// [22016, 4096] 45.9 us, 88%; Llama-2-13B [27648, 5120] 93.5%), but 53-67% on the small ones
// ([4096, 4096] 11.3-12.4 us, ChatGLM2 QKV [4608, 4096] 53%): the fixed cost of a launch (first
// bytes, tail) is ~4 us there. From M = 4 on it loses to the flat GEMM (x loads and FMAs per W chunk).
//
// The old one-row-per-warp kernel (4 loads in flight per lane) stays for K not a multiple of 8 or
// unaligned pointers (gemv only; gemv_ex rejects them).
// (cuBLAS at M = 1, measured on the H200 through torch, reaches 54% of read bandwidth on Llama-2-7B's
// O projection [4096, 4096] and 70-86% on the others; see docs/performance-log.md.)
#include <cuda_fp8.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/flat_gemm.h"
#include "backend/cuda/fp8.h"
#include "backend/cuda/gemv_rows.cuh"

namespace fdpp::cuda {

namespace {

using detail::aligned16;
using detail::check_launch;
using detail::from_float;
using detail::to_float;
using detail::unpack8;
using detail::warp_sum;

constexpr int kWarpsPerCta = 8;

// acc[m] += W chunk (8 elements at chunk index c) . x[m] chunk c
template <class T, int M>
__device__ __forceinline__ void fma_chunk(const uint4& wv, const T* __restrict__ x, int K, int c, float (&acc)[M]) {
  float wf[8];
  unpack8<T>(wv, wf);
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const uint4 xv = __ldg(reinterpret_cast<const uint4*>(x + int64_t(m) * K) + c);
    float xf[8];
    unpack8<T>(xv, xf);
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[m] = fmaf(wf[i], xf[i], acc[m]);
  }
}

template <class OutT>
__device__ __forceinline__ void store_out(OutT* p, float v) {
  if constexpr (std::is_same_v<OutT, float>) *p = v;
  else *p = from_float<OutT>(v);
}

template <class T, int M, bool kVec, class OutT>
__global__ void __launch_bounds__(kWarpsPerCta * 32) gemv_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                                                  const T* __restrict__ bias, OutT* __restrict__ y,
                                                                  int N, int K) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int n = blockIdx.x * kWarpsPerCta + warp;
  if (n >= N) return;  // whole warps: no shuffle below runs with missing lanes
  const T* wr = w + int64_t(n) * K;
  float acc[M];
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = 0.f;
  if constexpr (kVec) {
    const int chunks = K / 8;
    const uint4* w4 = reinterpret_cast<const uint4*>(wr);
    int c = lane;
    for (; c + 96 < chunks; c += 128) {  // four independent 16-byte loads in flight per lane
      uint4 wv[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) wv[u] = __ldcs(w4 + c + 32 * u);
#pragma unroll
      for (int u = 0; u < 4; ++u) fma_chunk<T, M>(wv[u], x, K, c + 32 * u, acc);
    }
    for (; c < chunks; c += 32) fma_chunk<T, M>(__ldcs(w4 + c), x, K, c, acc);
  } else {
    for (int k = lane; k < K; k += 32) {
      const float wf = to_float(wr[k]);
#pragma unroll
      for (int m = 0; m < M; ++m) acc[m] = fmaf(wf, to_float(x[int64_t(m) * K + k]), acc[m]);
    }
  }
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = warp_sum(acc[m]);
  if (lane == 0) {
    const float b = bias != nullptr ? to_float(bias[n]) : 0.f;
#pragma unroll
    for (int m = 0; m < M; ++m) store_out(y + int64_t(m) * N + n, acc[m] + b);
  }
}

// ---- gemv_ex: R rows per warp, R x U loads in flight per lane --------------------------------------

// W8: FP8 weights (fp8.h, fp8_gemv): a 16-byte chunk holds 16 e4m3 weights instead of 8 16-bit
// ones, so U halves for the same bytes in flight; the chunk is converted to fp32 once (cvt e4m3x2
// -> f16x2, one instruction per pair on sm_89+) and applied to every row of x, and the row scale
// multiplies the finished dot product.
template <int M, bool W8 = false>
struct ExShape {
  static constexpr int R = M <= 2 ? 2 : 4;                     // weight rows per warp (even: SwiGLU pairs)
  static constexpr int U = (M <= 2 ? 8 : 4) / (W8 ? 2 : 1);  // chunks per row per lane per pass
};

// 8 16-bit values into out[0..7] (out points into a register array; the loops are unrolled).
template <class T>
__device__ __forceinline__ void unpack8_at(const uint4& u, float* out) {
  const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
  for (int i = 0; i < 8; ++i) out[i] = to_float(e[i]);
}

__device__ __forceinline__ void fp8x16_to_float(const uint4& v, float (&f)[16]) {
  const __nv_fp8x2_storage_t* pairs = reinterpret_cast<const __nv_fp8x2_storage_t*>(&v);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(pairs[i], __NV_E4M3);
    const float2 p = __half22float2(*reinterpret_cast<const __half2*>(&h));
    f[2 * i] = p.x;
    f[2 * i + 1] = p.y;
  }
}

// Programmatic dependent launch (cuda_common.cuh; kernel_options.h): the first pass's weight loads
// are issued before waiting for the previous kernel (which may write x or y). No-ops otherwise.

template <class T, int M, bool W8>
__global__ void __launch_bounds__(kWarpsPerCta * 32)
    gemv_ex_kernel(const T* __restrict__ x, const void* __restrict__ w, const float* __restrict__ w_scale,
                   const T* __restrict__ bias, void* __restrict__ y, int N, int K, Epilogue epilogue) {
  constexpr int R = ExShape<M, W8>::R, U = ExShape<M, W8>::U;
  detail::pdl_trigger();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int unit = blockIdx.x * kWarpsPerCta + warp;
  // Rows of this warp (clamped into W for loading; results of rows past the end are not stored).
  const detail::WarpRows<R> wr(unit, N, epilogue == Epilogue::SwiGLU);
  const int(&rows)[R] = wr.row;
  const bool(&valid)[R] = wr.valid;
  if (!valid[0]) {  // whole warps: no shuffle below runs with missing lanes
    detail::pdl_wait();
    return;
  }
  const int chunks = K / (W8 ? 16 : 8);  // 16-byte chunks of a weight row
  const int x_chunks = K / 8;            // 16-byte chunks of a row of x
  bool waited = false;
  const uint4* __restrict__ w4 = reinterpret_cast<const uint4*>(w);
  const uint4* __restrict__ x4 = reinterpret_cast<const uint4*>(x);
  float acc[R][M];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) acc[r][m] = 0.f;

  for (int base = lane; base < chunks; base += 32 * U) {
    uint4 wv[R][U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = base + 32 * u;
#pragma unroll
      for (int r = 0; r < R; ++r)
        wv[r][u] = c < chunks ? __ldcs(w4 + int64_t(rows[r]) * chunks + c) : make_uint4(0, 0, 0, 0);
    }
    if (!waited) {  // x and y may be the previous kernel's: wait for it after the first weights
      detail::pdl_wait();
      waited = true;
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = base + 32 * u;
      if (c >= chunks) break;
      if constexpr (W8) {
        float wf[R][16];
#pragma unroll
        for (int r = 0; r < R; ++r) fp8x16_to_float(wv[r][u], wf[r]);
#pragma unroll
        for (int m = 0; m < M; ++m) {
          float xf[16];
          unpack8_at<T>(__ldg(x4 + int64_t(m) * x_chunks + 2 * c), xf);
          unpack8_at<T>(__ldg(x4 + int64_t(m) * x_chunks + 2 * c + 1), xf + 8);
#pragma unroll
          for (int r = 0; r < R; ++r) {
            float d0 = wf[r][0] * xf[0], d1 = wf[r][1] * xf[1];
#pragma unroll
            for (int i = 2; i < 16; i += 2) {
              d0 = fmaf(wf[r][i], xf[i], d0);
              d1 = fmaf(wf[r][i + 1], xf[i + 1], d1);
            }
            acc[r][m] += d0 + d1;
          }
        }
      } else {
#pragma unroll
        for (int m = 0; m < M; ++m) {
          float xf[8];
          unpack8<T>(__ldg(x4 + int64_t(m) * chunks + c), xf);
#pragma unroll
          for (int r = 0; r < R; ++r) {
            float wf[8];
            unpack8<T>(wv[r][u], wf);
            float d = wf[0] * xf[0];
#pragma unroll
            for (int i = 1; i < 8; ++i) d = fmaf(wf[i], xf[i], d);
            acc[r][m] += d;
          }
        }
      }
    }
  }
  if (!waited) detail::pdl_wait();  // lanes past the last chunk (K < 256) ran no pass but may store below
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) acc[r][m] = warp_sum(acc[r][m]);

  detail::store_rows<T, R, M>(acc, wr, N, lane, W8 ? w_scale : nullptr, bias, y, N, 0, epilogue);
}

template <class T, int M, bool W8>
void launch_ex_m(const void* x, const void* w, const float* w_scale, const void* bias, void* y, int N, int K,
                 Epilogue ep, cudaStream_t stream) {
  constexpr int R = ExShape<M, W8>::R;
  const int units = ep == Epilogue::SwiGLU ? (N / 2 + R / 2 - 1) / (R / 2) : (N + R - 1) / R;
  const detail::LaunchConfig config(dim3(static_cast<unsigned>((units + kWarpsPerCta - 1) / kWarpsPerCta)),
                                    dim3(kWarpsPerCta * 32), 0, stream, linear_programmatic_launch_enabled());
  detail::cuda_check(cudaLaunchKernelEx(config.get(), gemv_ex_kernel<T, M, W8>, static_cast<const T*>(x), w, w_scale,
                                        static_cast<const T*>(bias), y, N, K, ep),
                     "cudaLaunchKernelEx(gemv_ex)");
}

template <class T, bool W8 = false>
void launch_ex(int M, const void* x, const void* w, const void* bias, void* y, int N, int K, Epilogue ep,
               cudaStream_t stream, const float* w_scale = nullptr) {
  switch (M) {
    case 1: return launch_ex_m<T, 1, W8>(x, w, w_scale, bias, y, N, K, ep, stream);
    case 2: return launch_ex_m<T, 2, W8>(x, w, w_scale, bias, y, N, K, ep, stream);
    case 3: return launch_ex_m<T, 3, W8>(x, w, w_scale, bias, y, N, K, ep, stream);
    case 4: return launch_ex_m<T, 4, W8>(x, w, w_scale, bias, y, N, K, ep, stream);
    case 5: return launch_ex_m<T, 5, W8>(x, w, w_scale, bias, y, N, K, ep, stream);
    case 6: return launch_ex_m<T, 6, W8>(x, w, w_scale, bias, y, N, K, ep, stream);
    case 7: return launch_ex_m<T, 7, W8>(x, w, w_scale, bias, y, N, K, ep, stream);
    default: return launch_ex_m<T, 8, W8>(x, w, w_scale, bias, y, N, K, ep, stream);
  }
}

// ---- the one-row-per-warp kernel: any K, any alignment (gemv only) -------------------------------

template <class T, int M, class OutT>
void launch_m(const void* x, const void* w, const void* bias, void* y, int N, int K, bool vec, cudaStream_t stream) {
  const unsigned grid = static_cast<unsigned>((N + kWarpsPerCta - 1) / kWarpsPerCta);
  auto* kernel = vec ? gemv_kernel<T, M, true, OutT> : gemv_kernel<T, M, false, OutT>;
  kernel<<<grid, kWarpsPerCta * 32, 0, stream>>>(static_cast<const T*>(x), static_cast<const T*>(w),
                                                  static_cast<const T*>(bias), static_cast<OutT*>(y), N, K);
}

template <class T, class OutT>
void launch(int M, const void* x, const void* w, const void* bias, void* y, int N, int K, bool vec,
            cudaStream_t stream) {
  switch (M) {
    case 1: return launch_m<T, 1, OutT>(x, w, bias, y, N, K, vec, stream);
    case 2: return launch_m<T, 2, OutT>(x, w, bias, y, N, K, vec, stream);
    case 3: return launch_m<T, 3, OutT>(x, w, bias, y, N, K, vec, stream);
    case 4: return launch_m<T, 4, OutT>(x, w, bias, y, N, K, vec, stream);
    case 5: return launch_m<T, 5, OutT>(x, w, bias, y, N, K, vec, stream);
    case 6: return launch_m<T, 6, OutT>(x, w, bias, y, N, K, vec, stream);
    case 7: return launch_m<T, 7, OutT>(x, w, bias, y, N, K, vec, stream);
    default: return launch_m<T, 8, OutT>(x, w, bias, y, N, K, vec, stream);
  }
}

}  // namespace

void gemv(const void* x, const void* w, const void* bias, void* y, int M, int N, int K, DType dtype, bool fp32_out,
          cudaStream_t stream) {
  check(x != nullptr && w != nullptr && y != nullptr, "gemv: null pointer (x {}, w {}, y {})", x, w, y);
  check(M >= 1 && M <= kGemvMaxM, "gemv: M = {} out of range [1, {}]", M, kGemvMaxM);
  check(N > 0 && K > 0, "gemv: N = {}, K = {} must be positive", N, K);
  check(dtype == DType::F16 || dtype == DType::BF16, "gemv: unknown dtype {}", static_cast<int>(dtype));
  const bool vec = K % 8 == 0 && aligned16(x) && aligned16(w);
  detail::dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    if (vec) launch_ex<T>(M, x, w, bias, y, N, K, fp32_out ? Epilogue::StoreF32 : Epilogue::Store, stream);
    else if (fp32_out) launch<T, float>(M, x, w, bias, y, N, K, false, stream);
    else launch<T, T>(M, x, w, bias, y, N, K, false, stream);
  });
  check_launch("gemv");
}

void gemv_ex(const void* x, const void* w, const void* bias, void* y, int M, int N, int K, DType dtype,
             Epilogue epilogue, cudaStream_t stream) {
  check(x != nullptr && w != nullptr && y != nullptr, "gemv_ex: null pointer (x {}, w {}, y {})", x, w, y);
  check(M >= 1 && M <= kGemvMaxM, "gemv_ex: M = {} out of range [1, {}]", M, kGemvMaxM);
  check(N > 0 && K > 0, "gemv_ex: N = {}, K = {} must be positive", N, K);
  check(K % 8 == 0, "gemv_ex: K = {} is not a multiple of 8 (rows are streamed in 16-byte chunks)", K);
  check(aligned16(x) && aligned16(w), "gemv_ex: x ({}) and w ({}) must be 16-byte aligned", x, w);
  check(epilogue != Epilogue::SwiGLU || N % 2 == 0, "gemv_ex: SwiGLU needs an even N ([gate; up]), got N = {}", N);
  check(dtype == DType::F16 || dtype == DType::BF16, "gemv_ex: unknown dtype {}", static_cast<int>(dtype));
  detail::dispatch_dtype(dtype, [&](auto tag) { launch_ex<decltype(tag)>(M, x, w, bias, y, N, K, epilogue, stream); });
  check_launch("gemv_ex");
}

void fp8_gemv(const void* x, const uint8_t* w8, const float* w_scale, const void* bias, void* y, int M, int N, int K,
              DType dtype, Epilogue epilogue, cudaStream_t stream) {
  check(x != nullptr && w8 != nullptr && w_scale != nullptr && y != nullptr, "fp8_gemv: null pointer");
  check(M >= 1 && M <= kFp8GemvMaxM, "fp8_gemv: M = {} out of range [1, {}]", M, kFp8GemvMaxM);
  check(N > 0 && K > 0 && K % 16 == 0, "fp8_gemv: N = {}, K = {} (K must be a positive multiple of 16)", N, K);
  check(detail::aligned16(x) && detail::aligned16(w8), "fp8_gemv: x and w8 must be 16-byte aligned");
  check(epilogue != Epilogue::SwiGLU || N % 2 == 0, "fp8_gemv: SwiGLU needs an even N ([gate; up]), got N = {}", N);
  detail::dispatch_dtype(dtype, [&](auto tag) {
    launch_ex<decltype(tag), true>(M, x, w8, bias, y, N, K, epilogue, stream, w_scale);
  });
  check_launch("fp8_gemv");
}

}  // namespace fdpp::cuda
