// The decoder on the GPU: batched decode over a paged KV cache, chunked prefill, device-side
// sampling, and CUDA-graph replay of the decode step. One engine owns a DeviceModel, the KV cache
// and every activation buffer; sequences are handles into it.
//
// Per layer (pre-norm models) the step is:
//   residual_norm (adds the previous MLP output into the fp32 stream) -> QKV GEMM (+bias)
//   -> rope_qk -> kv_cache_write -> attention -> O GEMM -> residual_norm -> gate/up GEMM
//   -> silu_mul (or relu) -> down GEMM
// and only token ids (and, when asked, logits) cross to the host.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/cuda/check.h"
#include "backend/cuda/device_model.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/linear.h"
#include "backend/cuda/linear_dispatch.h"
#include "fdpp/sampling.h"

namespace fdpp::cuda {

enum class AttentionMode { Sync, Async };

struct EngineOptions {
  int max_batch = 64;              // sequences in one decode step
  int max_prefill_tokens = 2048;   // prefill runs in chunks of at most this many tokens
  int block_size = 16;             // tokens per KV-cache block
  int64_t kv_cache_tokens = 0;     // 0: size the cache from free memory
  double memory_fraction = 0.90;   // of the free memory after weights, for the KV cache
  bool cuda_graphs = true;
  // Decode attention: the asynchronized softmax with a unified max (FlashDecoding++, the default)
  // or the synchronized split-KV kernel (FlashDecoding), for comparison.
  AttentionMode attention = AttentionMode::Async;
  // The unified max phi per layer (natural-log units of q.k / sqrt(d)), from the model's
  // calibration file; empty: the conservative default phi = 0 for every layer. Either way rows
  // outside the safe range are recomputed, so results do not depend on phi, only speed does.
  std::vector<float> unified_max_phi;
  // Linear layers: "" (FDPP_LINEAR, else auto), auto, gemv, flat or cublas; the dispatch table
  // file ("" : FDPP_DISPATCH_TABLE, else beside model_path, the cache, configs/dispatch/).
  std::string linear_mode;
  std::string dispatch_table;
  std::string model_path;
};

struct MemoryReport {
  uint64_t weights = 0, kv_cache = 0, activations = 0, workspace = 0;
  uint64_t device_used = 0;  // cudaMemGetInfo's total - free, for comparison
  int64_t kv_tokens = 0;
};

class CudaEngine {
 public:
  CudaEngine(std::shared_ptr<const DeviceModel> model, const EngineOptions& options);
  ~CudaEngine();
  CudaEngine(const CudaEngine&) = delete;
  CudaEngine& operator=(const CudaEngine&) = delete;

  const ModelConfig& config() const { return model_->config(); }
  const EngineOptions& options() const { return options_; }
  MemoryReport memory() const;
  cudaStream_t stream() const { return stream_; }

  // Sequences. A new sequence holds no tokens; release returns its KV blocks.
  int create_sequence();
  void release_sequence(int seq);
  int sequence_length(int seq) const;

  // Appends tokens to a sequence and computes their logits (fp32, device), in chunks. When
  // host_logits is given it receives [n, vocab] (all_positions) or [1, vocab].
  void prefill(int seq, std::span<const int32_t> tokens, bool all_positions, float* host_logits);
  // One decode step: appends tokens[i] to seqs[i] (all distinct) and computes one logits row each.
  // Returns with the step still running unless host_logits is given; sample() (or any later
  // synchronizing call) waits for it.
  void decode(std::span<const int> seqs, std::span<const int32_t> tokens, float* host_logits);
  // Samples one token per row of the last prefill (its last row) / decode logits, on the device.
  // history: the tokens the repetition penalty sees, per row (only read when it is on).
  std::vector<int32_t> sample(int rows, const SamplingParams& params, std::span<const std::span<const int32_t>> history,
                              uint64_t step);

  const LinearDispatcher& linear_dispatcher() const { return *linear_; }

  // Decode attention rows (sequence x query head x layer) computed so far, and how many of them the
  // asynchronized softmax recomputed because their max logit left [phi + a, phi + b] (synchronizes).
  uint64_t attention_rows() const { return attention_rows_; }
  uint64_t attention_fallback_rows() const;
  // The unified max and safe range used for a layer.
  const UnifiedMaxRange& unified_max(int layer) const { return unified_max_.at(layer); }

  // Benchmarks: gives the sequence `length` positions of (unwritten) cache without computing them.
  void reserve_for_benchmark(int seq, int length);
  // Fills the whole KV cache with small random values (so that benchmark reads see real data).
  void randomize_kv_cache(uint64_t seed);

 private:
  struct Sequence {
    int length = 0;
    std::vector<int32_t> blocks;
    bool live = false;
  };
  void ensure_capacity(Sequence& s, int new_length);
  // Runs the layers over n tokens whose ids/positions/slots are already in the device buffers.
  // decode_batch > 0: decode attention over decode_batch sequences; else prefill of one sequence
  // (block table in row 0) whose new tokens start at prefill_start.
  struct StepInputs {  // device arrays a forward pass reads
    const int32_t *ids, *positions, *slots, *block_tables, *context_lens;
  };
  void forward(const StepInputs& in, int n_tokens, int decode_batch, int prefill_start, int logit_rows,
               int attention_splits = 1);
  // A linear layer through the dispatcher (GEMV / flat GEMM / cuBLASLt by the tuned table).
  void linear(const void* x, const void* w, const void* bias, void* y, int M, int N, int K, bool fp32_out);
  void* layer_k(int layer) const;
  void* layer_v(int layer) const;

  std::shared_ptr<const DeviceModel> model_;
  EngineOptions options_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<LinearDispatcher> linear_;
  int max_tokens_ = 0;  // per forward
  int max_blocks_per_seq_ = 0;
  int64_t num_blocks_ = 0;
  size_t block_bytes_ = 0;  // one layer's k (or v) block
  DeviceBuffer kv_;         // [layers][2][num_blocks][block_size][kv_dim]
  std::vector<int32_t> free_blocks_;
  std::vector<Sequence> sequences_;

  // Activations and step inputs (fixed addresses, so graphs can replay them).
  DeviceBuffer x_, normed_, qkv_, attn_, o_, ffn_in_, ffn_act_, logits_;
  DeviceBuffer ids_, positions_, slots_, block_tables_;  // prefill inputs
  DeviceBuffer sample_ws_, sample_ids_, history_, history_lens_, offsets_;
  int history_stride_ = 0;
  int last_logit_rows_ = 0;
  // Decode-step inputs travel in one copy from pinned memory: ids, positions, slots, context
  // lengths ([max_batch] each), then block tables [max_batch][max_blocks_per_seq].
  DeviceBuffer decode_in_;
  int32_t* decode_in_host_ = nullptr;  // cudaMallocHost
  cudaEvent_t inputs_copied_ = nullptr;  // the last copy out of decode_in_host_ is done
  DeviceBuffer attn_ws_;  // split-KV partials (sync), or partials, semaphores and fallback list (async)
  DeviceBuffer attn_counters_;  // async: semaphores and the fallback list's length
  int attn_counter_ints_ = 0;
  DeviceBuffer fallback_rows_;  // one device counter (unsigned long long)
  std::vector<UnifiedMaxRange> unified_max_;  // per layer
  uint64_t attention_rows_ = 0;
  int multiprocessors_ = 0;
  std::map<std::pair<int, int>, cudaGraphExec_t> graphs_;  // (batch, attention splits) -> captured step
};

}  // namespace fdpp::cuda
