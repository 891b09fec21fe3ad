#include "engine/engine_runner.h"

#include <algorithm>
#include <cstring>

#include "engine/sampler.h"
#include "fdpp/error.h"

namespace fdpp {

EngineRunner::EngineRunner(std::unique_ptr<Engine> engine, int max_context) : EngineRunner(*engine, max_context) {
  owned_ = std::move(engine);
}

EngineRunner::EngineRunner(Engine& engine, int max_context) : engine_(&engine), max_context_(max_context) {
  check(max_context > 0 && max_context <= engine_->max_context(), "context size {} out of range [1, {}]", max_context,
        engine_->max_context());
  seq_ = engine_->create_sequence();
}

EngineRunner::~EngineRunner() {
  if (!owned_ && seq_ >= 0) engine_->release_sequence(seq_);
}

void EngineRunner::seek(int start_pos, size_t n_tokens) {
  check(n_tokens > 0, "forward: no tokens");
  const int length = engine_->sequence_length(seq_);
  check(start_pos >= 0 && start_pos <= length,
        "runner: tokens must continue the sequence (start {} but the cache holds {})", start_pos, length);
  check(start_pos + static_cast<int64_t>(n_tokens) <= max_context_,
        "context overflow: {} + {} tokens exceed the context size {}", start_pos, n_tokens, max_context_);
  // A start before the end rewrites the cache from there.
  if (start_pos < length) engine_->truncate_sequence(seq_, start_pos);
}

void EngineRunner::forward(std::span<const int32_t> tokens, int start_pos, bool all_positions, std::span<float> logits) {
  const size_t V = static_cast<size_t>(config().vocab_size);
  const size_t rows = all_positions ? tokens.size() : 1;
  seek(start_pos, tokens.size());
  check(logits.size() == rows * V, "forward: logits buffer has {} floats, need {}", logits.size(), rows * V);
  // Steps of at most max_step_tokens; an all-positions row at most the logits rows a step returns.
  const EngineLimits& lim = engine_->limits();
  size_t chunk = static_cast<size_t>(lim.max_step_tokens);
  if (all_positions && lim.max_logit_rows > 0) chunk = std::min(chunk, static_cast<size_t>(lim.max_logit_rows));
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

int32_t EngineRunner::forward_sample(std::span<const int32_t> tokens, int start_pos, Sampler& sampler,
                                     std::span<const int32_t> history, uint64_t step) {
  seek(start_pos, tokens.size());
  const size_t chunk = static_cast<size_t>(engine_->limits().max_step_tokens);
  int32_t token = -1;
  for (size_t done = 0; done < tokens.size();) {
    const size_t n = std::min(chunk, tokens.size() - done);
    Batch batch;
    StepRow row;
    row.seq = seq_;
    row.tokens = tokens.subspan(done, n);
    done += n;
    if (done == tokens.size()) {  // the last chunk draws the token
      row.sample = true;
      row.sampling = sampler.params();
      row.sample_index = step;
      row.history = history;
    }
    batch.rows.push_back(row);
    token = engine_->step(batch).tokens[0];
  }
  return token;
}

}  // namespace fdpp
