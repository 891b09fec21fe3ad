#include <algorithm>
#include <vector>

#include "backend/cuda/bandwidth.h"
#include "backend/cuda/check.h"
#include "backend/cuda/per_device.h"

namespace fdpp::cuda {

namespace {

// Each thread folds many 16-byte loads into a register; one word per block is written so that the
// loads cannot be optimized away. Four loads in flight per iteration hide latency.
__global__ void read_stream_kernel(const int4* __restrict__ data, size_t n, int* sink) {
  int acc = 0;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    const int4 a = __ldcs(data + i), b = __ldcs(data + i + stride), c = __ldcs(data + i + 2 * stride),
               d = __ldcs(data + i + 3 * stride);
    acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
  }
  for (; i < n; i += stride) {
    const int4 a = __ldcs(data + i);
    acc ^= a.x ^ a.y ^ a.z ^ a.w;
  }
  if (acc == 0x7fffffff) sink[blockIdx.x] = acc;  // practically never true; keeps the loads live
}

}  // namespace

double measure_read_bandwidth(size_t bytes, int repetitions) {
  const size_t n = bytes / sizeof(int4);
  DeviceBuffer buf(n * sizeof(int4)), sink(sizeof(int) * 4096);
  FDPP_CUDA_CHECK(cudaMemset(buf.get(), 1, buf.bytes()));
  int sms = 0;
  sms = multiprocessors_of_current_device();
  const int blocks = std::min(4096, sms * 8);
  cudaEvent_t start, stop;
  FDPP_CUDA_CHECK(cudaEventCreate(&start));
  FDPP_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<float> ms;
  for (int r = -1; r < repetitions; ++r) {
    FDPP_CUDA_CHECK(cudaEventRecord(start));
    read_stream_kernel<<<blocks, 256>>>(buf.as<int4>(), n, sink.as<int>());
    FDPP_CUDA_CHECK(cudaEventRecord(stop));
    FDPP_CUDA_CHECK(cudaEventSynchronize(stop));
    float t = 0;
    FDPP_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
    if (r >= 0) ms.push_back(t);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
  return static_cast<double>(n * sizeof(int4)) / (ms[ms.size() / 2] * 1e-3);
}

}  // namespace fdpp::cuda
