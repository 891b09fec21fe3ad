// The Runner interface (one sequence, forward passes) over any Engine: what the single-prompt
// callers use (`fdpp logits`, Python's logits(), calibration, tests). Each forward() is one or more
// steps of a single row through Engine::step, the only execution API.
#pragma once

#include <memory>

#include "engine/engine.h"
#include "engine/runner.h"

namespace fdpp {

class EngineRunner : public Runner {
 public:
  // Owns the engine.
  EngineRunner(std::unique_ptr<Engine> engine, int max_context);
  // Borrows an engine that others use too (a scheduler's, between its steps): the runner's
  // sequence is released when the runner goes, and the engine must outlive it.
  EngineRunner(Engine& engine, int max_context);
  ~EngineRunner() override;
  EngineRunner(const EngineRunner&) = delete;
  EngineRunner& operator=(const EngineRunner&) = delete;

  void forward(std::span<const int32_t> tokens, int start_pos, bool all_positions, std::span<float> logits) override;
  // Samples with the engine's own sampler (on the device for the GPU): the logits stay where they are.
  int32_t forward_sample(std::span<const int32_t> tokens, int start_pos, Sampler& sampler,
                         std::span<const int32_t> history, uint64_t step) override;
  int max_context() const override { return max_context_; }
  const ModelConfig& config() const override { return engine_->config(); }
  Engine& engine() { return *engine_; }

 private:
  // Positions the sequence at start_pos (rewriting the cache from there) after checking the range.
  void seek(int start_pos, size_t n_tokens);
  std::unique_ptr<Engine> owned_;
  Engine* engine_ = nullptr;
  int seq_ = -1;
  int max_context_ = 0;
};

}  // namespace fdpp
