// The streaming loader's conversion kernels (weight_convert.cu), declared for C++17 (.cu) callers,
// which cannot include model/ or io/ headers (C++20): ggml type numbers instead of io/gguf.h's
// GgmlType. weight_streamer.h has the typed wrappers.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>

#include "backend/cuda/kernels.h"

namespace fdpp::cuda {

// Options and results of stream_weights (weight_streamer.h), here so that C++17 code can name them.
struct StreamProgress {
  int tensors_done = 0, tensors_total = 0;
  uint64_t bytes_done = 0, bytes_total = 0;  // as stored in the files
  double seconds = 0;
};
using StreamProgressFn = std::function<void(const StreamProgress&)>;

struct StreamOptions {
  size_t staging_bytes = size_t{64} << 20;  // per buffer
  int staging_buffers = 3;
  int read_threads = 8;  // pread threads per chunk (0: copy from the mapping, one thread)
  StreamProgressFn progress;
};

struct StreamStats {
  int tensors = 0;
  uint64_t bytes = 0;  // read from the files
  double seconds = 0;
};


bool gpu_converts_type(uint32_t ggml_type);
void convert_stored_type(uint32_t ggml_type, const void* src, int64_t n, int64_t cols, int64_t permute_head_dim,
                         void* dst, DType dtype, cudaStream_t stream);
// dst = `rows` stored rows of row_bytes (whole heads of head_dim rows), each head's rows in the order
// planned_source_row gives (GGUF q/k kept in their blocks).
void permute_stored_rows(const void* src, int64_t rows, uint64_t row_bytes, int64_t head_dim, void* dst,
                         cudaStream_t stream);

}  // namespace fdpp::cuda
