// The conversion kernels of the streaming loader, declared for C++17 (.cu) callers: ggml type
// numbers instead of io/gguf.h's GgmlType. weight_streamer.h has the typed wrappers.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/kernels.h"

namespace fdpp::cuda {

bool gpu_converts_type(uint32_t ggml_type);
void convert_stored_type(uint32_t ggml_type, const void* src, int64_t n, int64_t cols, int64_t permute_head_dim,
                         void* dst, DType dtype, cudaStream_t stream);

}  // namespace fdpp::cuda
