// A Runner (one sequence, forward passes) over any Engine: what the single-prompt front ends
// (`fdpp logits`, the Python logits call) use where the backend is only an engine, as with tensor
// parallelism. Each forward() is one or more steps of a single row.
#pragma once

#include <memory>

#include "engine/engine.h"
#include "engine/runner.h"

namespace fdpp {

class EngineRunner final : public Runner {
 public:
  EngineRunner(std::unique_ptr<Engine> engine, int max_context);
  ~EngineRunner() override;
  void forward(std::span<const int32_t> tokens, int start_pos, bool all_positions, std::span<float> logits) override;
  int max_context() const override { return max_context_; }
  const ModelConfig& config() const override { return engine_->config(); }

 private:
  std::unique_ptr<Engine> engine_;
  int seq_ = -1;
  int max_context_ = 0;
};

}  // namespace fdpp
