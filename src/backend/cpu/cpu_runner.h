// The Runner interface (one sequence, as `fdpp logits`, calibration and the tests use it) over a
// CpuEngine.
#pragma once

#include "backend/cpu/cpu_engine.h"
#include "engine/runner.h"

namespace fdpp {

class CpuRunner final : public Runner {
 public:
  // The weights must outlive the runner. max_context bounds the KV cache.
  CpuRunner(const ModelConfig& config, const DecoderWeights& weights, int max_context);

  void forward(std::span<const int32_t> tokens, int start_pos, bool all_positions, std::span<float> logits) override;
  int32_t forward_sample(std::span<const int32_t> tokens, int start_pos, Sampler& sampler,
                         std::span<const int32_t> history, uint64_t step) override;
  int max_context() const override { return engine_.max_context(); }
  const ModelConfig& config() const override { return engine_.config(); }

  void set_attention_observer(AttentionObserver observer) { engine_.set_attention_observer(std::move(observer)); }
  CpuEngine& engine() { return engine_; }

 private:
  StepOutput run(std::span<const int32_t> tokens, int start_pos, bool all_positions, bool want_logits,
                 const StepRow* sampling);
  CpuEngine engine_;
  int seq_;
};

}  // namespace fdpp
