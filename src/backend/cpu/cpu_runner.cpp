#include "backend/cpu/cpu_runner.h"

#include "engine/sampler.h"
#include "fdpp/error.h"

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

CpuRunner::CpuRunner(const ModelConfig& config, const DecoderWeights& weights, int max_context)
    : engine_(config, weights, one_sequence(max_context)), seq_(engine_.create_sequence()) {}

StepOutput CpuRunner::run(std::span<const int32_t> tokens, int start_pos, bool all_positions, bool want_logits,
                          const StepRow* sampling) {
  check(!tokens.empty(), "forward: no tokens");
  check(start_pos >= 0 && start_pos + static_cast<int64_t>(tokens.size()) <= max_context(),
        "context overflow: {} + {} tokens exceed the context size {}", start_pos, tokens.size(), max_context());
  check(start_pos <= engine_.sequence_length(seq_), "forward: start position {} is past the {} cached tokens",
        start_pos, engine_.sequence_length(seq_));
  // A start before the end rewrites the cache from there (as the single-sequence runner always did).
  if (start_pos < engine_.sequence_length(seq_)) engine_.truncate_sequence(seq_, start_pos);
  Batch batch;
  StepRow row = sampling != nullptr ? *sampling : StepRow{};
  row.seq = seq_;
  row.tokens = tokens;
  row.logits = want_logits && !all_positions;
  row.all_logits = want_logits && all_positions;
  batch.rows.push_back(row);
  return engine_.step(batch);
}

void CpuRunner::forward(std::span<const int32_t> tokens, int start_pos, bool all_positions, std::span<float> logits) {
  const size_t rows = all_positions ? tokens.size() : 1;
  check(logits.size() == rows * static_cast<size_t>(config().vocab_size), "forward: logits buffer has {} floats, need {}",
        logits.size(), rows * config().vocab_size);
  StepOutput out = run(tokens, start_pos, all_positions, true, nullptr);
  std::copy(out.logits.begin(), out.logits.end(), logits.begin());
}

int32_t CpuRunner::forward_sample(std::span<const int32_t> tokens, int start_pos, Sampler& sampler,
                                  std::span<const int32_t> history, uint64_t step) {
  StepRow row;
  row.sample = true;
  row.sampling = sampler.params();
  row.sample_index = step;
  row.history = history;
  return run(tokens, start_pos, false, false, &row).tokens[0];
}

}  // namespace fdpp
