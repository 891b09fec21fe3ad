// GEMV on CUDA cores for decode's smallest batches (FlashDecoding++'s ImplA, FastGEMV style):
// y[M, N] = x[M, K] . W[N, K]^T (+ bias), M = 1..8, 16-bit inputs, fp32 accumulation.
//
// Decode at batch 1 is a pure stream of the weights: each output row n is one warp reading W's
// row n once with 16-byte loads (lane l takes 16-byte chunks l, l + 32, ...: a warp reads 512
// contiguous bytes per step), four loads in flight per lane, loaded with the streaming hint
// (__ldcs: the weights are read once per step, x is what should stay cached). Every x row is
// applied to the same loaded W chunk, so W is read once for all M rows. A warp-shuffle sum ends
// each row; lane 0 adds the bias and stores. Eight warps per 256-thread CTA, one row each.
// K not a multiple of 8 (or unaligned pointers) take a scalar path.
// (cuBLAS at M = 1, measured on the H200 through torch, reaches 54% of read bandwidth on Llama-2-7B's
// O projection [4096, 4096] and 70-86% on the others; see docs/PERFORMANCE.md.)
#include "backend/cuda/cuda_common.cuh"

namespace fdpp::cuda {

namespace {

using detail::aligned16;
using detail::check_launch;
using detail::from_float;
using detail::to_float;
using detail::warp_sum;

constexpr int kWarpsPerCta = 8;

template <class T>
__device__ __forceinline__ void unpack8(const uint4& u, float (&f)[8]) {
  const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
  for (int i = 0; i < 8; ++i) f[i] = to_float(e[i]);
}

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
    if (fp32_out) launch<T, float>(M, x, w, bias, y, N, K, vec, stream);
    else launch<T, T>(M, x, w, bias, y, N, K, vec, stream);
  });
  check_launch("gemv");
}

}  // namespace fdpp::cuda
