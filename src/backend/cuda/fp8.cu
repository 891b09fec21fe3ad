// FP8 weights: the per-row quantizer (fp8.h). The GEMV over FP8
// weights is gemv_ex's kernel (gemv.cu), the flat GEMM's is flat_gemm.cu's.
#include <cuda_fp8.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/fp8.h"

namespace fdpp::cuda {

namespace {

using detail::check_launch;
using detail::warp_max;

constexpr int kThreads = 256;

// One CTA per row: the row's max magnitude, then the row scaled into e4m3 (8 elements per thread
// step: 16 bytes in, 8 out).
template <class T>
__global__ void __launch_bounds__(kThreads) quantize_rows_kernel(const T* __restrict__ x, int64_t K,
                                                                 uint8_t* __restrict__ q, float* __restrict__ scale) {
  const int64_t row = blockIdx.x;
  const uint4* xr = reinterpret_cast<const uint4*>(x + row * K);
  const int64_t chunks = K / 8;
  float m = 0.f;
  for (int64_t c = threadIdx.x; c < chunks; c += kThreads) {
    float f[8];
    detail::load8(reinterpret_cast<const T*>(xr + c), f);
#pragma unroll
    for (int i = 0; i < 8; ++i) m = fmaxf(m, fabsf(f[i]));
  }
  __shared__ float warp_maxes[kThreads / 32];
  m = warp_max(m);
  if ((threadIdx.x & 31) == 0) warp_maxes[threadIdx.x >> 5] = m;
  __syncthreads();
  m = 0.f;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) m = fmaxf(m, warp_maxes[w]);
  // Round-to-nearest division on purpose (the host reference computes the same).
  const float inv = m > 0.f ? __fdiv_rn(kFp8E4M3Max, m) : 1.f;
  if (threadIdx.x == 0) scale[row] = m > 0.f ? __fdiv_rn(m, kFp8E4M3Max) : 1.f;
  uint2* qr = reinterpret_cast<uint2*>(q + row * K);
  for (int64_t c = threadIdx.x; c < chunks; c += kThreads) {
    float f[8];
    detail::load8(reinterpret_cast<const T*>(xr + c), f);
    uint32_t p[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
      p[i] = __nv_cvt_float2_to_fp8x2(make_float2(__fmul_rn(f[2 * i], inv), __fmul_rn(f[2 * i + 1], inv)),
                                      __NV_SATFINITE, __NV_E4M3);
    qr[c] = make_uint2(p[0] | (p[1] << 16), p[2] | (p[3] << 16));
  }
}

}  // namespace

void quantize_rows_fp8(const void* x, DType dtype, int64_t rows, int64_t K, uint8_t* q, float* scale,
                       cudaStream_t stream) {
  check(x != nullptr && q != nullptr && scale != nullptr, "quantize_rows_fp8: null pointer");
  check(rows >= 0 && rows < (int64_t{1} << 31), "quantize_rows_fp8: {} rows", rows);
  check(K > 0 && K % 8 == 0, "quantize_rows_fp8: K = {} is not a positive multiple of 8", K);
  check(detail::aligned16(x) && (reinterpret_cast<uintptr_t>(q) & 7u) == 0,
        "quantize_rows_fp8: x must be 16-byte and q 8-byte aligned");
  if (rows == 0) return;
  detail::dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    quantize_rows_kernel<T><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(static_cast<const T*>(x), K, q,
                                                                                  scale);
  });
  check_launch("quantize_rows_fp8");
}

}  // namespace fdpp::cuda
