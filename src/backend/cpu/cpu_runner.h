// The Runner interface (one sequence) over a CpuEngine of its own, with the engine's attention
// observer reachable (calibration).
#pragma once

#include "backend/cpu/cpu_engine.h"
#include "engine/engine_runner.h"

namespace fdpp {

class CpuRunner final : public EngineRunner {
 public:
  // The weights must outlive the runner. max_context bounds the KV cache; one step takes the whole
  // context, so a forward pass is one step whatever its length.
  CpuRunner(const ModelConfig& config, const DecoderWeights& weights, int max_context, bool f16_cache = false);

  void set_attention_observer(AttentionObserver observer) { cpu_engine().set_attention_observer(std::move(observer)); }
  CpuEngine& cpu_engine() { return static_cast<CpuEngine&>(engine()); }
};

}  // namespace fdpp
