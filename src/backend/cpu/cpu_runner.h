// The decoder recipe on the CPU reference backend: every variant ModelConfig describes (RMSNorm or
// LayerNorm, pre- or post-norm, RoPE in either layout or learned positions, SwiGLU or ReLU MLP,
// biases, embedding projections), in fp32 with its own KV cache.
#pragma once

#include <vector>

#include "engine/runner.h"
#include "model/decoder.h"

namespace fdpp {

class CpuRunner final : public Runner {
 public:
  // The weights must outlive the runner. max_context bounds the KV cache.
  CpuRunner(const ModelConfig& config, const DecoderWeights& weights, int max_context);

  void forward(std::span<const int32_t> tokens, int start_pos, bool all_positions, std::span<float> logits) override;
  int max_context() const override { return max_context_; }
  const ModelConfig& config() const override { return config_; }

 private:
  void norm(const float* x, const Tensor& weight, const Tensor& bias, int64_t rows, float* out) const;

  const ModelConfig& config_;
  const DecoderWeights& weights_;
  int max_context_;
  std::vector<double> inv_freq_;
  std::vector<Tensor> k_cache_, v_cache_;  // per layer [max_context, kv_dim]
};

}  // namespace fdpp
