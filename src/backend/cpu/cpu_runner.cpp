#include "backend/cpu/cpu_runner.h"

#include <memory>

namespace fdpp {

namespace {
EngineLimits one_sequence(int max_context) {
  EngineLimits l;
  l.max_context = max_context;
  l.max_step_rows = 1;
  l.max_step_tokens = max_context;
  l.kv_cache_tokens = max_context;
  return l;
}
}  // namespace

CpuRunner::CpuRunner(const ModelConfig& config, const DecoderWeights& weights, int max_context, bool f16_cache)
    : EngineRunner(std::make_unique<CpuEngine>(config, weights, one_sequence(max_context), f16_cache), max_context) {}

}  // namespace fdpp
