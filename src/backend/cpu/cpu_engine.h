// The CPU reference backend: the ops of the shared decoder skeleton (model/forward.h) in fp32, for
// every variant ModelConfig describes. One step runs the linear layers over all the step's tokens
// at once (one M, so each weight is read once per step) and attention row by row, each sequence
// over its own cache.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "attention/attention_observer.h"
#include "engine/engine.h"
#include "model/decoder.h"

namespace fdpp {

class CpuEngine final : public Engine {
 public:
  // The weights must outlive the engine. limits.kv_cache_tokens 0: max_step_rows sequences of
  // max_context tokens, capped at 4 GiB of cache. f16_cache: the KV cache holds IEEE fp16 instead of
  // fp32 (half the memory, as llama.cpp's default; attention converts each row back, so the
  // results are no longer the fp32 reference's bit for bit).
  CpuEngine(const ModelConfig& config, const DecoderWeights& weights, EngineLimits limits, bool f16_cache = false);
  bool f16_cache() const { return f16_cache_; }

  const ModelConfig& config() const override { return config_; }

  // Called once per layer per row of a step, before the row's attention (calibration records the
  // attention logits with it). An empty observer (the default) costs one branch per layer.
  void set_attention_observer(AttentionObserver observer) { observer_ = std::move(observer); }

 private:
  struct Forward;  // one step's buffers and the skeleton's ops over them (cpu_engine.cpp)
  void run_step(std::span<const RowPlan> rows, int64_t total_tokens, StepOutput& out) override;
  // Layer `layer`'s K (or V) pool: [num_blocks * block_size, kv_dim], row = the token's slot; in
  // pool_ (fp32) or pool16_ (fp16, f16_cache).
  float* k_pool(int layer) { return pool_.get() + static_cast<size_t>(2 * layer) * pool_layer_floats_; }
  float* v_pool(int layer) { return k_pool(layer) + pool_layer_floats_; }
  uint16_t* k_pool16(int layer) { return pool16_.get() + static_cast<size_t>(2 * layer) * pool_layer_floats_; }
  uint16_t* v_pool16(int layer) { return k_pool16(layer) + pool_layer_floats_; }
  void norm(const float* x, const Tensor& weight, const Tensor& bias, int64_t rows, float* out) const;

  const ModelConfig& config_;
  const DecoderWeights& weights_;
  std::vector<double> inv_freq_;
  // The KV cache, indexed by Engine's block ids (so that sequences share prefix blocks): per layer a
  // K and a V pool. Allocated uninitialized, so the system commits only the pages blocks touch.
  std::unique_ptr<float[]> pool_;
  std::unique_ptr<uint16_t[]> pool16_;
  size_t pool_layer_floats_ = 0;  // elements of one layer's K (or V) pool
  bool f16_cache_ = false;
  std::vector<double> local_inv_freq_;  // ModelConfig::local_rope's, when has_local_rope
  AttentionObserver observer_;
};

}  // namespace fdpp
