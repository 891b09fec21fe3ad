#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

// Only C++17 headers here (nvcc compiles CUDA sources as C++17; the model headers are C++20).
#include "backend/cuda/check.h"
#include "backend/cuda/kernels.h"

namespace fdpp::cuda {

namespace {

// Counter-based hash -> uniform [-1, 1): reproducible for a seed, independent of launch shape.
__device__ inline float hash_uniform(uint64_t seed, uint64_t i) {
  uint64_t z = seed + 0x9e3779b97f4a7c15ULL * (i + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

template <class T>
__global__ void fill_random_kernel(T* out, int64_t n, float scale, float offset, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = offset + scale * hash_uniform(seed, i);
    if constexpr (std::is_same_v<T, __half>) out[i] = __float2half(v);
    else out[i] = __float2bfloat16(v);
  }
}

}  // namespace

void fill_random(void* dst, int64_t n, DType dtype, float scale, float offset, uint64_t seed, cudaStream_t stream) {
  if (n == 0) return;
  if (dtype == DType::F16) fill_random_kernel<<<1024, 256, 0, stream>>>(static_cast<__half*>(dst), n, scale, offset, seed);
  else fill_random_kernel<<<1024, 256, 0, stream>>>(static_cast<__nv_bfloat16*>(dst), n, scale, offset, seed);
  FDPP_CUDA_CHECK(cudaGetLastError());
}

}  // namespace fdpp::cuda
