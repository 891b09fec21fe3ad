// The decoder on the GPU: the batched step of engine/engine.h (any mix of prefill chunks and decode
// rows in one forward pass) over a paged KV cache, device-side sampling with per-row parameters,
// and CUDA-graph replay of decode-only steps. One engine owns a DeviceModel, the KV cache and every
// activation buffer; sequences are handles into it (the block accounting is Engine's).
//
// The forward pass is the shared skeleton (model/forward.h) over this engine's ops; per layer of a
// pre-norm model that is:
//   residual_norm (adds the previous MLP output into the fp32 stream) -> QKV GEMM (+bias)
//   -> rope_qk_cache (or kv_cache_write) -> attention -> O GEMM -> residual_norm -> gate/up GEMM
//   (SwiGLU in its epilogue, or silu_mul / relu after it) -> down GEMM
// and only token ids (and, when asked, logits) cross to the host.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/cuda/check.h"
#include "backend/cuda/device_model.h"
#include "backend/cuda/kernel_options.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/linear.h"
#include "backend/cuda/linear_dispatch.h"
#include "engine/engine.h"
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
  // Prefill attention's tile configuration (kernels.h: prefill_attention_configs()); -1: chosen
  // the wgmma kernel where it runs, else per step by the longest chunk (cuda_engine.cpp:
  // fixed_prefill_config).
  int prefill_attention_config = -1;
  // The KV cache's element type (kernels.h: KvQuant): the model's 16-bit dtype, or e4m3 bytes
  // (--kv-cache-dtype fp8: half the bytes per token; head dims 64, 128, 256). An e4m3 cache takes
  // each layer's scales from the model (ModelConfig::kv_cache_scales, the checkpoint's k_scale /
  // v_scale); a model without them takes this k_scale and v_scale for every layer (1: vLLM's fp8
  // without calibration). A 16-bit cache has no scales.
  KvQuant kv_quant;
  // The unified max phi per layer (natural-log units of q.k / sqrt(d)), from the model's
  // calibration file; empty: the conservative default phi = 0 for every layer. Either way rows
  // outside the safe range are recomputed, so results do not depend on phi, only speed does.
  std::vector<float> unified_max_phi;
  // Linear layers: "" or auto, gemv, flat or cublas; the dispatch table file ("": beside
  // model_path, the cache, configs/dispatch/); GEMV for exactly M <= gemv_max_m (-1: the table).
  std::string linear_mode;
  std::string dispatch_table;
  std::string model_path;
  int gemv_max_m = -1;
  // Launch switches of the kernels (PDL, cuBLASLt tuning, the decode-attention loop), in force
  // during this engine's calls on the calling thread (kernel_options.h).
  KernelOptions kernels;
  // Tensor parallelism (tensor_parallel_engine.h): this engine is rank `rank` of `ranks`, its model
  // the rank's shard (model/tensor_parallel.h: heads, KV heads and FFN divided, lm head rows
  // [rank * vocab_stride, ...)). After the o and down projections it sums the ranks' partial outputs
  // (all-reduce), and it gathers the logits; only rank 0 returns logits and samples. No comm: the
  // whole model, no collectives (a group of one runs them, as identities).
  struct Shard {
    int rank = 0, ranks = 1;
    void* comm = nullptr;      // this rank's ncclComm_t (collectives.h)
    int64_t vocab_stride = 0;  // lm head rows per rank (TensorParallelLayout::vocab_per_rank)
    // Every rank must hold the same KV blocks (the block tables are the same): called with this
    // rank's count when the cache is sized from free memory, returns the one all ranks use.
    std::function<int64_t(int64_t)> agree_kv_blocks;
  } shard;
};

struct MemoryReport {
  uint64_t weights = 0, kv_cache = 0, activations = 0, workspace = 0;
  uint64_t device_used = 0;  // cudaMemGetInfo's total - free, for comparison
  int64_t kv_tokens = 0;
};

// Why the CUDA engine cannot run a model of this config (its head size, embedding projection, or
// LongRoPE's features it lacks so far), in the words the engine refuses it with; "" when it can.
std::string cuda_model_problem(const ModelConfig& c);
// What tensor parallelism refuses beyond that (Gemma's features; sliding windows shorter than the
// context, which the runtime removes by capping the context at the shortest window); "" if none.
std::string tensor_parallel_model_problem(const ModelConfig& c);

class CudaEngine final : public Engine {
 public:
  CudaEngine(std::shared_ptr<const DeviceModel> model, const EngineOptions& options);
  ~CudaEngine() override;
  CudaEngine(const CudaEngine&) = delete;
  CudaEngine& operator=(const CudaEngine&) = delete;

  const ModelConfig& config() const override { return model_->config(); }
  const EngineOptions& options() const { return options_; }
  MemoryReport memory() const;
  cudaStream_t stream() const { return stream_; }

  // Sequences: Engine's create_sequence / release_sequence / sequence_length / reserve; step() runs
  // a batch of any mix of prefill chunks and decode rows: the only way to compute.

  const LinearDispatcher& linear_dispatcher() const { return *linear_; }

  // Decode attention rows (sequence x query head x layer) computed so far, and how many of them the
  // asynchronized softmax recomputed because their max logit left [phi + a, phi + b] (synchronizes).
  uint64_t attention_rows() const { return attention_rows_; }
  uint64_t graph_captures() const override { return graphs_captured_; }
  // run_step returns once the step is queued (finish_step waits), except on tensor-parallel ranks,
  // whose engine steps them together.
  bool queues_steps() const override { return options_.shard.comm == nullptr; }
  // A step may be queued behind the one in flight, its pending tokens read on the device from where
  // the previous step's sampling left them (not on tensor-parallel ranks).
  bool overlaps_steps() const override { return queues_steps(); }
  uint64_t attention_fallback_rows() const;
  // Of the decode attention rows, those the unified-max kernels ran (async mode, several splits on
  // tensor cores; the others ran the synchronized kernels: DecodeAttentionLaunch::unified).
  uint64_t attention_unified_rows() const { return attention_unified_rows_; }
  // The same for prefill attention (query rows of prefill chunks x query head x layer), whose
  // tensor-core kernel falls back per 64-row tile (kernels.h, prefill_attention_varlen).
  uint64_t prefill_attention_rows() const { return prefill_attention_rows_; }
  uint64_t prefill_attention_fallback_rows() const;
  // The unified max and safe range used for a layer.
  const UnifiedMaxRange& unified_max(int layer) const { return unified_max_.at(layer); }

  // Benchmarks: gives the sequence `length` positions of (unwritten) cache without computing them.
  void reserve_for_benchmark(int seq, int length);
  // Fills the whole KV cache with small random values (so that benchmark reads see real data; an
  // fp8 cache gets their e4m3 bytes, never NaN).
  void randomize_kv_cache(uint64_t seed);
  // Engine::warm_up: every linear layer's call once per cuBLASLt row bucket up to the step's tokens
  // (linear_tuning.h), so that cuBLASLt times its candidates before the first request, not in it.
  void warm_up() override;

 private:
  void ensure_capacity(int seq, int new_length);
  // Queues the step (launches, sampling, the copies of its tokens into pinned memory) and returns;
  // finish_step waits for it and writes out.tokens and out.logprobs.
  void run_step(std::span<const RowPlan> rows, int64_t total_tokens, StepOutput& out) override;
  void finish_step(StepOutput& out) override;
  // run_step's work: queues the step, its outputs' copies into step_out_host_[slot], pending_[slot].
  void queue_step(std::span<const RowPlan> rows, int64_t total_tokens, StepOutput& out, int slot);
  void ensure_step_out_host(int slot, size_t bytes);
  // Uploads a decode step's inputs (rows' sequences already hold room for position length) and
  // runs it: replays the captured graph for (batch, attention launch) or captures one. Lengths
  // unchanged. Tokens below -1 are drawn ones (encode_drawn_token), resolved on the device first.
  void launch_decode(std::span<const int> seqs, std::span<const int32_t> tokens, bool drawn);
  // How decode attention runs for decode_rows rows of at most max_len keys (the split plan, then
  // what the kernels launch with it), planned once per step.
  DecodeAttentionLaunch plan_decode_attention(int decode_rows, int max_len) const;
  // Whether every layer's attention runs the masked kernels (a window shorter than the context, or
  // soft-capped logits): then the plan above is theirs. A model that mixes masked and plain layers
  // (Gemma 3's global layers) is planned as plain; its masked layers' launches follow from the same
  // rows, lengths and splits, so the graph key still tells its steps apart where their plans differ.
  bool masked_attention() const;
  // Adds a step's decode rows to attention_rows_ (and attention_unified_rows_ where they unify).
  void count_attention_rows(int decode_rows, const DecodeAttentionLaunch& attention);
  // Samples head rows [first, first + count) of the last step's logits with one parameter set;
  // seeds_ and offsets_ rows [first, first + count) are already uploaded.
  // Sets the logits outside each sampled row's allowed_tokens to -inf (structured output).
  template <class HeadOf>
  void apply_token_masks(std::span<const RowPlan> rows, const std::vector<int>& sampled, const HeadOf& head_of);
  void sample_rows(int first, int count, const SamplingParams& params,
                   std::span<const std::span<const int32_t>> history, const LogitAdjust* adjust);

  struct StepInputs {  // device arrays a forward pass reads
    const int32_t *ids, *positions, *slots;
    const int32_t *block_tables, *context_lens;  // decode rows: [decode_rows][max_blocks_per_seq], [decode_rows]
    const int32_t* chunk_tables;                 // prefill chunks: [chunks][max_blocks_per_seq]
    const int32_t *chunk_q_begin, *chunk_starts; // [chunks + 1] token offsets, [chunks] first positions
    const int32_t* head_index;                   // rows whose logits are computed (null: the last logit_rows)
  };
  struct Chunk {  // a prefill chunk of a step: tokens [q_offset, q_offset + n) at positions start..
    int q_offset, n, start, table_row;
  };
  // Runs the layers over n tokens whose ids/positions/slots are already in the device buffers: the
  // first decode_rows tokens are decode rows (decode attention), then the chunks (prefill
  // attention). Logits for logit_rows rows: in.head_index's tokens, or the last logit_rows.
  // Decode attention runs attention_splits splits, planned for rows of up to attention_max_len keys.
  struct Forward;  // one forward pass's inputs and the skeleton's ops over the buffers (cuda_engine.cpp)
  void forward(const StepInputs& in, int n_tokens, int decode_rows, std::span<const Chunk> chunks, int logit_rows,
               int attention_splits = 1, int attention_max_len = 0);
  // A linear layer through the dispatcher (GEMV / flat GEMM / cuBLASLt by the tuned table).
  void linear(const void* x, const void* w, const void* bias, void* y, int M, int N, int K, bool fp32_out);
  // A layer's matrix in its form (16-bit, fp8 with row scales, 4-bit groups or GGUF blocks:
  // DeviceLayer).
  void layer_linear(const void* x, const LayerMatrix& w, const DeviceBuffer& bias, void* y, int M, int N, int K,
                    Epilogue epilogue);
  // Tensor parallelism: sums the ranks' partial outputs of a row-parallel layer (o, down) in place.
  void reduce_partial(void* y, int64_t elements);
  // logits_[0..rows) = the lm head over x [rows, H] (the ranks' vocabulary slices gathered).
  void lm_head(const void* x, int rows);
  void* layer_k(int layer) const;
  void* layer_v(int layer) const;
  // What a layer's cache writes and attention calls quantize with (its scales on an e4m3 cache).
  const KvQuant& layer_kv_quant(int layer) const { return layer_kv_quant_[static_cast<size_t>(layer)]; }

  std::shared_ptr<const DeviceModel> model_;
  EngineOptions options_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<LinearDispatcher> linear_;
  int max_tokens_ = 0;  // per forward
  int max_blocks_per_seq_ = 0;
  int64_t num_blocks_ = 0;
  size_t kv_elem_bytes_ = 2;  // bytes of one cached K or V element (kv_element_bytes)
  std::vector<KvQuant> layer_kv_quant_;  // per layer: options_.kv_quant with the layer's scales
  int prefill_config_ = -1;  // prefill attention's configuration; -1: by each step's longest chunk
  size_t block_bytes_ = 0;     // one layer's k (or v) block
  DeviceBuffer kv_;         // [layers][2][num_blocks][block_size][kv_dim]
  int logit_capacity_ = 0;  // rows of logits_

  // Activations and step inputs (fixed addresses, so graphs can replay them).
  DeviceBuffer x_, normed_, qkv_, attn_, o_, ffn_in_, ffn_act_, logits_;
  // Expert layers (moe.h): router logits [T, E] fp32, the routing, and the sorted rows' SwiGLU
  // activations [rows, FE] and down products [rows, H]; empty for a dense model. moe_arrivals_:
  // moe_route_one's CTA counter (one unsigned, zero between launches).
  DeviceBuffer moe_logits_, moe_pick_expert_, moe_pick_weight_, moe_pick_row_, moe_row_token_, moe_tile_expert_,
      moe_block_tile_, moe_arrivals_;
  DeviceBuffer moe_act_, moe_down_;
  DeviceBuffer shard_logits_, gathered_logits_;  // tensor parallelism: this rank's slice, every rank's
  int64_t vocab_rows_ = 0;                       // lm head rows this engine computes
  DeviceBuffer ids_, positions_, slots_, block_tables_;  // prefill and mixed-step inputs
  DeviceBuffer row_index_;                                // 0, 1, 2, ... (models with project_in)
  DeviceBuffer context_lens_, head_index_;                // mixed steps: decode rows' lengths, logit rows
  DeviceBuffer chunk_meta_;                               // prefill chunks: q_begin [max_batch + 1], starts
  DeviceBuffer sample_ws_, sample_ids_, history_, history_lens_, offsets_, seeds_;
  DeviceBuffer token_masks_;  // structured output (apply_token_masks)
  int history_stride_ = 0;
  // Sampling rows' logit_bias / min_tokens lists and generated tokens (cuda::LogitAdjust), grown on
  // demand; raw logits kept for log probabilities when the adjustments edit logits_ in place; the
  // logprob rows and their 2 + 2k floats each.
  DeviceBuffer adjust_i32_, adjust_f32_, raw_logits_, logprob_rows_, logprob_out_;
  // Decode-step inputs travel in one copy from pinned memory: ids, positions, slots, context
  // lengths ([max_batch] each), then block tables [max_batch][max_blocks_per_seq].
  DeviceBuffer decode_in_;
  int32_t* decode_in_host_ = nullptr;  // cudaMallocHost
  cudaEvent_t inputs_copied_ = nullptr;  // the last copy out of decode_in_host_ is done
  // A mixed step's inputs staged in pinned memory, one buffer per output slot (the slot's last step
  // has ended before a step takes it, so its copies are done).
  int32_t* mixed_in_host_[2] = {nullptr, nullptr};
  size_t mixed_in_ints_ = 0;
  // A queued step's sampled ids, then its logprob rows' floats (cudaMallocHost), and what
  // finish_step reads out of them; two of each, for a step queued behind the one in flight
  // (slots taken in turn by run_step and by finish_step, each step's done event beside them).
  void* step_out_host_[2] = {nullptr, nullptr};
  size_t step_out_host_bytes_[2] = {0, 0};
  cudaEvent_t step_done_[2] = {nullptr, nullptr};
  int run_slot_ = 0, finish_slot_ = 0;
  // Per sequence, the head row of its sampling row in the last step run: where a pending token of
  // the next step is read from (sample_ids_).
  std::vector<int32_t> draw_head_;
  struct PendingRow {
    int row, head, top_k;  // the batch row, its head row, the top log probabilities it asked for
  };
  struct PendingOutput {
    std::vector<PendingRow> rows;
    std::vector<int32_t> lp_heads;  // head rows whose logprobs came back, in order
    int lp_stride = 0;
    size_t lp_offset = 0;  // ints before the logprob floats
  } pending_[2];
  std::vector<int> lp_slot_of_head_;  // finish_step's scratch: head row -> logprob row, or -1
  DeviceBuffer attn_ws_;  // split-KV partials (sync), or partials, semaphores and fallback list (async)
  DeviceBuffer attn_counters_;  // async: semaphores and the fallback list's length
  int attn_counter_ints_ = 0;
  DeviceBuffer fallback_rows_;  // two device counters (unsigned long long): decode, prefill
  std::vector<UnifiedMaxRange> unified_max_;  // per layer
  uint64_t attention_rows_ = 0, attention_unified_rows_ = 0;
  uint64_t prefill_attention_rows_ = 0;
  int multiprocessors_ = 0;
  // (batch, how decode attention launches) -> captured step
  std::map<std::pair<int, DecodeAttentionLaunch>, cudaGraphExec_t> graphs_;
  uint64_t graphs_captured_ = 0;
};

}  // namespace fdpp::cuda
