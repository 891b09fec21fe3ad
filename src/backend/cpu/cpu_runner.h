// The decoder recipe on the CPU reference backend: every variant ModelConfig describes (RMSNorm or
// LayerNorm, pre- or post-norm, RoPE in either layout or learned positions, SwiGLU or ReLU MLP,
// biases, embedding projections), in fp32 with its own KV cache.
#pragma once

#include <functional>
#include <vector>

#include "engine/runner.h"
#include "model/decoder.h"

namespace fdpp {

// What an attention observer sees of one layer's attention in a forward pass: the n_q new queries
// (after RoPE) and the layer's K and V caches, laid out as cpu::attention takes them.
struct AttentionObservation {
  int layer = 0;
  const float* q = nullptr;  // [n_q, n_heads * head_dim]
  const float* k = nullptr;  // [start_pos + n_q, n_kv_heads * head_dim]
  const float* v = nullptr;
  int64_t n_q = 0;
  int64_t start_pos = 0;
  int n_heads = 0, n_kv_heads = 0, head_dim = 0;
  float scale = 1.f;
};
using AttentionObserver = std::function<void(const AttentionObservation&)>;

class CpuRunner final : public Runner {
 public:
  // The weights must outlive the runner. max_context bounds the KV cache.
  CpuRunner(const ModelConfig& config, const DecoderWeights& weights, int max_context);

  void forward(std::span<const int32_t> tokens, int start_pos, bool all_positions, std::span<float> logits) override;
  int max_context() const override { return max_context_; }
  const ModelConfig& config() const override { return config_; }

  // Called once per layer per forward pass, before the layer's attention (calibration records the
  // attention logits with it). An empty observer (the default) costs one branch per layer.
  void set_attention_observer(AttentionObserver observer) { observer_ = std::move(observer); }

 private:
  void norm(const float* x, const Tensor& weight, const Tensor& bias, int64_t rows, float* out) const;

  const ModelConfig& config_;
  const DecoderWeights& weights_;
  int max_context_;
  std::vector<double> inv_freq_;
  std::vector<Tensor> k_cache_, v_cache_;  // per layer [max_context, kv_dim]
  AttentionObserver observer_;
};

}  // namespace fdpp
