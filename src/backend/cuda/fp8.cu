// FP8 weights: the per-row quantizer and the CUDA-core GEMV (fp8.h). The GEMV follows gemv_ex's
// plan (gemv.cu): R weight rows per warp, each lane issuing R x U independent 16-byte streaming
// loads before their first use; a 16-byte chunk holds 16 e4m3 weights here (8 16-bit ones there),
// so U is half of gemv_ex's for the same bytes in flight. The chunk is converted to fp32 once
// (cvt e4m3x2 -> f16x2, one instruction per pair on sm_89+) and applied to every row of x; the row
// scale multiplies the finished dot product.
#include <cuda_fp8.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/fp8.h"

namespace fdpp::cuda {

namespace {

using detail::check_launch;
using detail::from_float;
using detail::to_float;
using detail::warp_max;
using detail::warp_sum;

constexpr int kThreads = 256;

// 8 16-bit values into out[0..7] (out points into a register array; the loops are unrolled).
template <class T>
__device__ __forceinline__ void unpack8(const uint4& u, float* out) {
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

template <int M>
struct Fp8Shape {
  static constexpr int R = M <= 2 ? 2 : 4;  // weight rows per warp (even: SwiGLU pairs)
  static constexpr int U = M <= 2 ? 4 : 2;  // 16-byte chunks per row per lane per pass
};
constexpr int kWarpsPerCta = 8;

__device__ __forceinline__ float silu(float g) { return g / (1.f + __expf(-g)); }

template <class T, int M>
__global__ void __launch_bounds__(kWarpsPerCta * 32)
    fp8_gemv_kernel(const T* __restrict__ x, const uint8_t* __restrict__ w, const float* __restrict__ w_scale,
                    const T* __restrict__ bias, void* __restrict__ y, int N, int K, Epilogue epilogue) {
  constexpr int R = Fp8Shape<M>::R, U = Fp8Shape<M>::U, P = R / 2;
  detail::pdl_trigger();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int unit = blockIdx.x * kWarpsPerCta + warp;
  const bool swiglu = epilogue == Epilogue::SwiGLU;
  const int F = N / 2;
  int rows[R];
  bool valid[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    if (swiglu) {
      const int f = unit * P + (r % P);
      valid[r] = f < F;
      rows[r] = (r < P ? 0 : F) + min(f, F - 1);
    } else {
      const int n = unit * R + r;
      valid[r] = n < N;
      rows[r] = min(n, N - 1);
    }
  }
  if (!valid[0]) {  // whole warps: no shuffle below runs with missing lanes
    detail::pdl_wait();
    return;
  }
  const int chunks = K / 16;     // 16 weights per 16-byte chunk
  const int x_chunks = K / 8;    // 8 16-bit x values per 16 bytes
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
      float wf[R][16];
#pragma unroll
      for (int r = 0; r < R; ++r) fp8x16_to_float(wv[r][u], wf[r]);
#pragma unroll
      for (int m = 0; m < M; ++m) {
        float xf[16];
        unpack8<T>(__ldg(x4 + int64_t(m) * x_chunks + 2 * c), xf);
        unpack8<T>(__ldg(x4 + int64_t(m) * x_chunks + 2 * c + 1), xf + 8);
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
    }
  }
  if (!waited) detail::pdl_wait();  // lanes past the last chunk ran no pass but may store below
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) acc[r][m] = warp_sum(acc[r][m]);

  if (swiglu) {
#pragma unroll
    for (int p = 0; p < P; ++p) {
#pragma unroll
      for (int m = 0; m < M; ++m) {
        if (lane != (p * M + m) % 32 || !valid[p]) continue;
        const int f = rows[p];
        float g = acc[p][m] * w_scale[f], u = acc[P + p][m] * w_scale[F + f];
        if (bias != nullptr) {
          g += to_float(bias[f]);
          u += to_float(bias[F + f]);
        }
        static_cast<T*>(y)[int64_t(m) * F + f] = from_float<T>(silu(g) * u);
      }
    }
    return;
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int m = 0; m < M; ++m) {
      if (lane != (r * M + m) % 32 || !valid[r]) continue;
      const int n = rows[r];
      float v = acc[r][m] * w_scale[n];
      if (bias != nullptr) v += to_float(bias[n]);
      const int64_t o = int64_t(m) * N + n;
      switch (epilogue) {
        case Epilogue::Store: static_cast<T*>(y)[o] = from_float<T>(v); break;
        case Epilogue::StoreF32: static_cast<float*>(y)[o] = v; break;
        default: static_cast<float*>(y)[o] += v; break;  // AddF32
      }
    }
  }
}

template <class T, int M>
void launch_m(const void* x, const uint8_t* w, const float* s, const void* bias, void* y, int N, int K, Epilogue ep,
              cudaStream_t stream) {
  constexpr int R = Fp8Shape<M>::R;
  const int units = ep == Epilogue::SwiGLU ? (N / 2 + R / 2 - 1) / (R / 2) : (N + R - 1) / R;
  const detail::LaunchConfig config(dim3(static_cast<unsigned>((units + kWarpsPerCta - 1) / kWarpsPerCta)),
                                    dim3(kWarpsPerCta * 32), 0, stream, linear_programmatic_launch_enabled());
  detail::cuda_check(cudaLaunchKernelEx(config.get(), fp8_gemv_kernel<T, M>, static_cast<const T*>(x), w, s,
                                        static_cast<const T*>(bias), y, N, K, ep),
                     "cudaLaunchKernelEx(fp8_gemv)");
}

template <class T>
void launch(int M, const void* x, const uint8_t* w, const float* s, const void* bias, void* y, int N, int K,
            Epilogue ep, cudaStream_t stream) {
  switch (M) {
    case 1: return launch_m<T, 1>(x, w, s, bias, y, N, K, ep, stream);
    case 2: return launch_m<T, 2>(x, w, s, bias, y, N, K, ep, stream);
    case 3: return launch_m<T, 3>(x, w, s, bias, y, N, K, ep, stream);
    case 4: return launch_m<T, 4>(x, w, s, bias, y, N, K, ep, stream);
    case 5: return launch_m<T, 5>(x, w, s, bias, y, N, K, ep, stream);
    case 6: return launch_m<T, 6>(x, w, s, bias, y, N, K, ep, stream);
    case 7: return launch_m<T, 7>(x, w, s, bias, y, N, K, ep, stream);
    default: return launch_m<T, 8>(x, w, s, bias, y, N, K, ep, stream);
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

void fp8_gemv(const void* x, const uint8_t* w8, const float* w_scale, const void* bias, void* y, int M, int N, int K,
              DType dtype, Epilogue epilogue, cudaStream_t stream) {
  check(x != nullptr && w8 != nullptr && w_scale != nullptr && y != nullptr, "fp8_gemv: null pointer");
  check(M >= 1 && M <= kFp8GemvMaxM, "fp8_gemv: M = {} out of range [1, {}]", M, kFp8GemvMaxM);
  check(N > 0 && K > 0 && K % 16 == 0, "fp8_gemv: N = {}, K = {} (K must be a positive multiple of 16)", N, K);
  check(detail::aligned16(x) && detail::aligned16(w8), "fp8_gemv: x and w8 must be 16-byte aligned");
  check(epilogue != Epilogue::SwiGLU || N % 2 == 0, "fp8_gemv: SwiGLU needs an even N ([gate; up]), got N = {}", N);
  detail::dispatch_dtype(dtype, [&](auto tag) { launch<decltype(tag)>(M, x, w8, w_scale, bias, y, N, K, epilogue, stream); });
  check_launch("fp8_gemv");
}

uint8_t fp8_e4m3_from_float(float v) { return __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3); }

float fp8_e4m3_to_float(uint8_t bits) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(bits, __NV_E4M3);
  return __half2float(__half(h));
}

}  // namespace fdpp::cuda
