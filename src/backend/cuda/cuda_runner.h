// The Runner interface (one sequence, as the CLI and tests use it) over a CudaEngine. Sampling
// happens on the device: only token ids come back, unless logits are asked for.
#pragma once

#include <memory>

#include "backend/cuda/cuda_engine.h"
#include "engine/runner.h"

namespace fdpp::cuda {

class CudaRunner final : public Runner {
 public:
  CudaRunner(std::shared_ptr<const DeviceModel> model, int max_context, const EngineOptions& options);

  void forward(std::span<const int32_t> tokens, int start_pos, bool all_positions, std::span<float> logits) override;
  int32_t forward_sample(std::span<const int32_t> tokens, int start_pos, Sampler& sampler,
                         std::span<const int32_t> history, uint64_t step) override;
  int max_context() const override { return max_context_; }
  const ModelConfig& config() const override { return engine_.config(); }

  CudaEngine& engine() { return engine_; }

 private:
  void run(std::span<const int32_t> tokens, int start_pos, bool all_positions, float* host_logits);
  CudaEngine engine_;
  int seq_;
  int max_context_;
};

}  // namespace fdpp::cuda
