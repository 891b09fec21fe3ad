// The collectives tensor parallelism needs, over NCCL: one communicator per GPU of this process,
// an all-reduce (sum) of 16-bit activations and an all-gather of fp32 logits, enqueued on a stream
// (and so capturable in CUDA graphs). NCCL is loaded with dlopen when a group is first made, so the
// fdpp binary runs on machines without NCCL; only --tensor-parallel N > 1 needs libnccl.so.2.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>
#include <vector>

#include "backend/cuda/kernels.h"

namespace fdpp::cuda {

// Communicators for devices[0..n) of this process (rank i drives devices[i]), made together with
// ncclCommInitAll. Throws with one line when NCCL cannot be loaded or initialized.
class CommGroup {
 public:
  explicit CommGroup(const std::vector<int>& devices);
  ~CommGroup();
  CommGroup(const CommGroup&) = delete;
  CommGroup& operator=(const CommGroup&) = delete;

  int size() const { return static_cast<int>(comms_.size()); }
  void* comm(int rank) const { return comms_.at(static_cast<size_t>(rank)); }
  int device(int rank) const { return devices_.at(static_cast<size_t>(rank)); }
  static std::string nccl_version();  // "2.28.9", or why NCCL is unavailable

 private:
  std::vector<void*> comms_;  // ncclComm_t
  std::vector<int> devices_;
};

// In place: buf[0..count) = the sum over ranks of every rank's buf (16-bit elements of dtype).
void all_reduce_sum(void* buf, size_t count, DType dtype, void* comm, cudaStream_t stream);
// out[r * count .. (r + 1) * count) = rank r's in[0..count) (fp32).
void all_gather_f32(const float* in, float* out, size_t count, void* comm, cudaStream_t stream);

// The logits gathered from the ranks' lm head slices, into [rows, vocab]: rank r computed
// vocab rows [r * stride, r * stride + n_r) of the vocabulary (n_r = min(stride, vocab - r * stride))
// as a [rows, n_r] matrix at gathered + r * rows * stride.
void assemble_vocab_shards(const float* gathered, int rows, int ranks, int64_t stride, int vocab, float* logits,
                           cudaStream_t stream);

}  // namespace fdpp::cuda
