#include "backend/cuda/cuda_runner.h"

#include "engine/sampler.h"

namespace fdpp::cuda {

namespace {
EngineOptions single_sequence(EngineOptions o, int max_context) {
  o.max_batch = 1;
  if (o.kv_cache_tokens == 0) o.kv_cache_tokens = max_context;  // one sequence needs no more
  return o;
}
}  // namespace

CudaRunner::CudaRunner(std::shared_ptr<const DeviceModel> model, int max_context, const EngineOptions& options)
    : engine_(std::move(model), single_sequence(options, max_context)), seq_(engine_.create_sequence()),
      max_context_(max_context) {
  check(max_context > 0 && max_context <= engine_.config().max_context,
        "context size {} out of range [1, {}]", max_context, engine_.config().max_context);
}

void CudaRunner::run(std::span<const int32_t> tokens, int start_pos, bool all_positions, float* host_logits) {
  check(start_pos == engine_.sequence_length(seq_),
        "CUDA runner: tokens must continue the sequence (start {} but the cache holds {})", start_pos,
        engine_.sequence_length(seq_));
  check(start_pos + static_cast<int64_t>(tokens.size()) <= max_context_,
        "context overflow: {} + {} tokens exceed the context size {}", start_pos, tokens.size(), max_context_);
  if (tokens.size() == 1 && start_pos > 0 && !all_positions) {
    const int seq = seq_;
    engine_.decode(std::span<const int>(&seq, 1), tokens, host_logits);
  } else {
    engine_.prefill(seq_, tokens, all_positions, host_logits);
  }
}

void CudaRunner::forward(std::span<const int32_t> tokens, int start_pos, bool all_positions, std::span<float> logits) {
  const size_t rows = all_positions ? tokens.size() : 1;
  check(logits.size() == rows * static_cast<size_t>(config().vocab_size), "forward: logits buffer has {} floats, need {}",
        logits.size(), rows * config().vocab_size);
  run(tokens, start_pos, all_positions, logits.data());
}

int32_t CudaRunner::forward_sample(std::span<const int32_t> tokens, int start_pos, Sampler& sampler,
                                   std::span<const int32_t> history, uint64_t step) {
  run(tokens, start_pos, false, nullptr);
  return engine_.sample(1, sampler.params(), std::span<const std::span<const int32_t>>(&history, 1), step)[0];
}

}  // namespace fdpp::cuda
