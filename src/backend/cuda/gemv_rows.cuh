// The CUDA-core GEMVs' shared frame (gemv.cu's gemv_ex, gguf_blocks.cu's block GEMV): which weight
// rows a warp owns, and the epilogue that stores its finished dot products.
#pragma once

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/flat_gemm.h"

namespace fdpp::cuda::detail {

// Warp `unit`'s R rows of W [N, K] (R even): rows unit * R .. unit * R + R - 1, or for SwiGLU
// ([gate; up], N = 2F) the P = R / 2 gate rows unit * P .. and their up rows F + f. Rows past the
// end are clamped into W for loading and marked invalid (their results are not stored).
template <int R>
struct WarpRows {
  int row[R];
  bool valid[R];

  __device__ __forceinline__ WarpRows(int unit, int N, bool swiglu) {
    constexpr int P = R / 2;
    const int F = N / 2;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (swiglu) {
        const int f = unit * P + (r % P);
        valid[r] = f < F;
        row[r] = (r < P ? 0 : F) + min(f, F - 1);
      } else {
        const int n = unit * R + r;
        valid[r] = n < N;
        row[r] = min(n, N - 1);
      }
    }
  }
};

__device__ __forceinline__ float silu(float g) { return g / (1.f + __expf(-g)); }

// Stores acc[r][m] (already summed over the warp; lane (r M + m) % 32 stores it): times row_scale
// (null: 1), plus bias, through the epilogue: y [M, ldy] at column col0 + row (Store, StoreF32,
// AddF32), or for SwiGLU y [M, N / 2] = silu(gate) * up.
template <class T, int R, int M>
__device__ __forceinline__ void store_rows(const float (&acc)[R][M], const WarpRows<R>& w, int N, int lane,
                                           const float* __restrict__ row_scale, const T* __restrict__ bias, void* y,
                                           int ldy, int col0, Epilogue epilogue) {
  constexpr int P = R / 2;
  if (epilogue == Epilogue::SwiGLU) {
    const int F = N / 2;
#pragma unroll
    for (int p = 0; p < P; ++p)
#pragma unroll
      for (int m = 0; m < M; ++m) {
        if (lane != (p * M + m) % 32 || !w.valid[p]) continue;
        const int f = w.row[p];
        float g = acc[p][m], u = acc[P + p][m];
        if (row_scale != nullptr) {
          g *= row_scale[f];
          u *= row_scale[F + f];
        }
        if (bias != nullptr) {
          g += to_float(bias[f]);
          u += to_float(bias[F + f]);
        }
        static_cast<T*>(y)[int64_t(m) * F + f] = from_float<T>(silu(g) * u);
      }
    return;
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) {
      if (lane != (r * M + m) % 32 || !w.valid[r]) continue;
      const int n = w.row[r];
      float v = acc[r][m];
      if (row_scale != nullptr) v *= row_scale[n];
      if (bias != nullptr) v += to_float(bias[n]);
      const int64_t o = int64_t(m) * ldy + col0 + n;
      switch (epilogue) {
        case Epilogue::Store: static_cast<T*>(y)[o] = from_float<T>(v); break;
        case Epilogue::StoreF32: static_cast<float*>(y)[o] = v; break;
        default: static_cast<float*>(y)[o] += v; break;  // AddF32
      }
    }
}

}  // namespace fdpp::cuda::detail
