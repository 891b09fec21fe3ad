// The one kernel of the linear-layer dispatcher: y += d in fp32, the AddF32 epilogue (the residual
// stream) after a cuBLAS GEMM into scratch, since cuBLASLt here writes and does not accumulate.
// Memory bound: float4 units when both pointers are 16-byte aligned, single floats otherwise.
// (Declared in linear_dispatch.h, which this file does not include: that header is C++20 and CUDA
// sources are compiled as C++17.)
#include "backend/cuda/cuda_common.cuh"

namespace fdpp::cuda {

namespace {

constexpr int kThreads = 256;

__global__ void add_f32_vec_kernel(float4* __restrict__ y, const float4* __restrict__ d, int64_t n4) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n4; i += int64_t(gridDim.x) * blockDim.x) {
    float4 a = y[i];
    const float4 b = d[i];
    a.x += b.x;
    a.y += b.y;
    a.z += b.z;
    a.w += b.w;
    y[i] = a;
  }
}

__global__ void add_f32_kernel(float* __restrict__ y, const float* __restrict__ d, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] += d[i];
}

}  // namespace

void add_f32(float* y, const float* d, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  if (n % 4 == 0 && detail::aligned16(y) && detail::aligned16(d)) {
    const int64_t n4 = n / 4;
    add_f32_vec_kernel<<<detail::grid_for(n4, kThreads), kThreads, 0, stream>>>(
        reinterpret_cast<float4*>(y), reinterpret_cast<const float4*>(d), n4);
  } else {
    add_f32_kernel<<<detail::grid_for(n, kThreads), kThreads, 0, stream>>>(y, d, n);
  }
  detail::check_launch("add_f32");
}

}  // namespace fdpp::cuda
