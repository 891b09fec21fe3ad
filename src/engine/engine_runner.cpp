#include "engine/engine_runner.h"

#include <algorithm>
#include <cstring>

#include "fdpp/error.h"

namespace fdpp {

EngineRunner::EngineRunner(std::unique_ptr<Engine> engine, int max_context)
    : engine_(std::move(engine)), max_context_(max_context) {
  check(max_context > 0 && max_context <= engine_->max_context(), "context size {} out of range [1, {}]", max_context,
        engine_->max_context());
  seq_ = engine_->create_sequence();
}

EngineRunner::~EngineRunner() = default;

void EngineRunner::forward(std::span<const int32_t> tokens, int start_pos, bool all_positions, std::span<float> logits) {
  const size_t V = static_cast<size_t>(config().vocab_size);
  const size_t rows = all_positions ? tokens.size() : 1;
  check(!tokens.empty(), "forward: no tokens");
  check(logits.size() == rows * V, "forward: logits buffer has {} floats, need {}", logits.size(), rows * V);
  const int length = engine_->sequence_length(seq_);
  check(start_pos <= length, "runner: tokens must continue the sequence (start {} but the cache holds {})", start_pos,
        length);
  check(start_pos + static_cast<int64_t>(tokens.size()) <= max_context_,
        "context overflow: {} + {} tokens exceed the context size {}", start_pos, tokens.size(), max_context_);
  if (start_pos < length) engine_->truncate_sequence(seq_, start_pos);
  // Steps of at most max_step_tokens; rows of every position at most 256 per step (what a GPU
  // engine's logits buffer holds for a prefill chunk).
  const size_t chunk = static_cast<size_t>(
      all_positions ? std::min(engine_->limits().max_step_tokens, 256) : engine_->limits().max_step_tokens);
  size_t done = 0;
  while (done < tokens.size()) {
    const size_t n = std::min(chunk, tokens.size() - done);
    const bool last = done + n == tokens.size();
    Batch batch;
    StepRow row;
    row.seq = seq_;
    row.tokens = tokens.subspan(done, n);
    row.all_logits = all_positions;
    row.logits = !all_positions && last;
    batch.rows.push_back(row);
    const StepOutput out = engine_->step(batch);
    if (all_positions) std::memcpy(logits.data() + done * V, out.logits.data(), n * V * sizeof(float));
    else if (last) std::memcpy(logits.data(), out.logits.data(), V * sizeof(float));
    done += n;
  }
}

}  // namespace fdpp
