#include <cuda_runtime.h>

#include "backend/cuda/device_query.h"

namespace fdpp::cuda {

std::vector<GpuInfo> list_gpus(std::string* why) {
  std::vector<GpuInfo> gpus;
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    if (why != nullptr) *why = cudaGetErrorString(err);
    cudaGetLastError();  // clear the sticky error so later calls start clean
    return gpus;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    gpus.push_back({i, p.name, p.major, p.minor, p.multiProcessorCount, static_cast<uint64_t>(p.totalGlobalMem),
                    static_cast<uint64_t>(p.l2CacheSize)});
  }
  if (gpus.empty() && why != nullptr) *why = "no CUDA device";
  return gpus;
}

}  // namespace fdpp::cuda
