#include <cuda_runtime.h>

#include <string>

#include "backend/cuda/device_query.h"

namespace fdpp::cuda {

std::vector<GpuInfo> list_gpus(std::string* why) {
  std::vector<GpuInfo> gpus;
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    if (why != nullptr) {
      // The runtime's own words for the usual cases ("CUDA driver version is insufficient for CUDA
      // runtime version" when no driver is installed at all) mislead users; say what it means.
      int driver = 0, runtime = 0;
      if (err == cudaErrorInsufficientDriver) {
        cudaDriverGetVersion(&driver);  // 0 when no driver is installed
        cudaRuntimeGetVersion(&runtime);
        *why = driver == 0 ? std::string("no CUDA driver found")
                           : "the CUDA driver (" + std::to_string(driver / 1000) + "." +
                                 std::to_string(driver % 1000 / 10) + ") is older than this build's runtime (" +
                                 std::to_string(runtime / 1000) + "." + std::to_string(runtime % 1000 / 10) + ")";
      } else if (err == cudaErrorNoDevice) {
        *why = "no CUDA device";
      } else {
        *why = cudaGetErrorString(err);
      }
    }
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
