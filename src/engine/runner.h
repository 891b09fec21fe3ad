// A model instance that can run forward passes over one sequence with its own KV cache: the
// single-sequence view of an Engine (EngineRunner in engine_runner.h, which every backend's runner
// is, so that one execution path, Engine::step, serves both). The generation loop and the CLI only
// see this interface.
#pragma once

#include <cstdint>
#include <span>

#include "fdpp/model_config.h"

namespace fdpp {
class Sampler;
}

namespace fdpp {

class Runner {
 public:
  virtual ~Runner() = default;

  // Appends tokens at positions start_pos .. start_pos + n - 1 (the cache must already hold
  // 0 .. start_pos - 1) and writes logits: [n, vocab] when all_positions, else [1, vocab] for the
  // last token.
  virtual void forward(std::span<const int32_t> tokens, int start_pos, bool all_positions, std::span<float> logits) = 0;

  // Runs tokens like forward() and returns the next token drawn from the last row's logits.
  // history: the tokens the repetition penalty sees; step: the generation step (device samplers
  // key their random numbers by (seed, step)). The default samples on the host with `sampler`;
  // backends that sample on the device override it so that logits never leave the device.
  virtual int32_t forward_sample(std::span<const int32_t> tokens, int start_pos, Sampler& sampler,
                                 std::span<const int32_t> history, uint64_t step);

  virtual int max_context() const = 0;
  virtual const ModelConfig& config() const = 0;
};

}  // namespace fdpp
