// Streams a WeightPlan from the checkpoint files to the GPU without materializing the model in host
// memory: each tensor is read in its stored type (pread from the file by several threads, or copied
// from the mapping for in-memory images) into a small ring of pinned staging buffers, copied to the
// device with cudaMemcpyAsync while the next chunk is read, and converted there to the engine's
// 16-bit type by convert_stored (F32/F16/BF16 and the GGUF blocks Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K on
// the GPU; other GGUF types are dequantized on the CPU chunk by chunk into the staging buffer).
// Host memory: staging_buffers x staging_bytes pinned, whatever the model's size.
//
// Conversions are bit-identical to the host path (gguf::dequantize to fp32, then half.h's
// round-to-nearest-even): the kernels repeat its fp32 operations in the same order, uncontracted.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "backend/cuda/kernels.h"
#include "backend/cuda/weight_convert.h"
#include "model/weight_plan.h"

namespace fdpp::cuda {

// One planned tensor and where its numel() 16-bit elements go on the device (for an FP8 tensor,
// PlannedTensor::fp8(), its numel() e4m3 bytes, copied as stored; with `blocks`, its GGUF blocks as
// stored, rows permuted where the plan says: gguf_blocks.h).
struct StreamJob {
  const PlannedTensor* tensor;
  void* dst;
  bool blocks = false;
};

// Runs every job on `stream` and waits for the last. Throws fdpp::Error naming the file and tensor
// when a read fails.
StreamStats stream_weights(const std::vector<StreamJob>& jobs, DType dtype, const StreamOptions& options,
                           cudaStream_t stream = nullptr);

// Whether convert_stored handles a stored type on the GPU (the others come as fp32 from the CPU).
inline bool gpu_converts(gguf::GgmlType type) { return gpu_converts_type(static_cast<uint32_t>(type)); }

// dst[0..n) = the n elements of a stored chunk at src (device memory, whole blocks), converted to
// dtype. permute_head_dim > 0: the chunk is whole heads of head_dim rows of `cols` elements and
// dst row r takes stored row planned_source_row(r) (GGUF q/k). Launches on stream.
inline void convert_stored(gguf::GgmlType type, const void* src, int64_t n, int64_t cols, int64_t permute_head_dim,
                           void* dst, DType dtype, cudaStream_t stream) {
  convert_stored_type(static_cast<uint32_t>(type), src, n, cols, permute_head_dim, dst, dtype, stream);
}

}  // namespace fdpp::cuda
