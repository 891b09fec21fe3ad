#include "backend/cuda/collectives.h"

#include "backend/cuda/check.h"
#include "backend/cuda/cuda_common.cuh"

namespace fdpp::cuda {

namespace {
__global__ void assemble_vocab_shards_kernel(const float* __restrict__ gathered, int rows, int64_t stride, int vocab,
                                             float* __restrict__ logits) {
  const int row = blockIdx.y;
  for (int64_t v = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; v < vocab; v += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = v / stride, c = v - r * stride;
    const int64_t n_r = min(stride, int64_t(vocab) - r * stride);
    logits[int64_t(row) * vocab + v] = gathered[r * rows * stride + row * n_r + c];
  }
}
}  // namespace

void assemble_vocab_shards(const float* gathered, int rows, int ranks, int64_t stride, int vocab, float* logits,
                           cudaStream_t stream) {
  (void)ranks;
  if (rows <= 0) return;
  const int threads = 256;
  const int blocks = static_cast<int>(std::min<int64_t>((vocab + threads - 1) / threads, 128));
  assemble_vocab_shards_kernel<<<dim3(blocks, rows), threads, 0, stream>>>(gathered, rows, stride, vocab, logits);
  FDPP_CUDA_CHECK(cudaGetLastError());
}

}  // namespace fdpp::cuda
