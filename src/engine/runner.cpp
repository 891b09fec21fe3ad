#include "engine/runner.h"

#include <vector>

#include "engine/sampler.h"

namespace fdpp {

int32_t Runner::forward_sample(std::span<const int32_t> tokens, int start_pos, Sampler& sampler,
                               std::span<const int32_t> history, uint64_t /*step*/) {
  std::vector<float> logits(config().vocab_size);
  forward(tokens, start_pos, /*all_positions=*/false, logits);
  return sampler.sample(logits, history);
}

}  // namespace fdpp
