#include "engine/engine.h"

#include <algorithm>
#include <cmath>

#include "fdpp/error.h"

namespace fdpp {

int64_t Batch::total_tokens() const {
  int64_t n = 0;
  for (const StepRow& r : rows) n += static_cast<int64_t>(r.tokens.size());
  return n;
}

void Engine::init_engine(const EngineLimits& limits) {
  check(limits.max_context >= 1, "context size {} must be positive", limits.max_context);
  check(limits.max_step_tokens >= 1, "max tokens per step {} must be positive", limits.max_step_tokens);
  check(limits.max_step_rows >= 1 && limits.max_step_rows <= limits.max_step_tokens,
        "max rows per step {} out of range [1, {}]", limits.max_step_rows, limits.max_step_tokens);
  check(limits.kv_cache_tokens >= 1, "KV cache of {} tokens", limits.kv_cache_tokens);
  limits_ = limits;
  kv_ = KvBlockAllocator((limits.kv_cache_tokens + limits.block_size - 1) / limits.block_size, limits.block_size);
  // One engine's cache only ever holds one model's keys and values; the salt keeps the hashes apart
  // should caches ever be shared (another model, another dtype, adapters).
  const ModelConfig& c = config();
  const int32_t shape[] = {c.n_layers, c.hidden, c.n_heads, c.n_kv_heads, c.head_dim, c.vocab_size, c.max_context};
  salt_ = prefix_block_hash(0, 0, std::span<const int32_t>(shape));
  // One full-attention layer reads every position, so only a model whose every layer slides frees.
  window_ = 0;
  if (limits.free_window_blocks && static_cast<int>(c.layer_windows.size()) == c.n_layers && c.n_layers > 0) {
    window_ = *std::max_element(c.layer_windows.begin(), c.layer_windows.end());
    if (*std::min_element(c.layer_windows.begin(), c.layer_windows.end()) <= 0) window_ = 0;
  }
}

void Engine::free_out_of_window(Sequence& s) {
  if (window_ <= 0) return;
  // The next token, at position length, attends to (length - W, length]; later ones further on.
  const int64_t first_read = std::max<int64_t>(0, static_cast<int64_t>(s.length) - window_ + 1);
  kv_.release_leading(s.blocks, first_read / kv_.block_size());
}

const Engine::Sequence& Engine::sequence(int seq) const {
  check(seq >= 0 && seq < static_cast<int>(sequences_.size()) && sequences_[seq].live, "no sequence {}", seq);
  return sequences_[seq];
}

bool Engine::is_live(int seq) const {
  return seq >= 0 && seq < static_cast<int>(sequences_.size()) && sequences_[seq].live;
}

int Engine::create_sequence() {
  for (size_t i = 0; i < sequences_.size(); ++i)
    if (!sequences_[i].live) {
      sequences_[i] = Sequence{true, 0, {}};
      return static_cast<int>(i);
    }
  sequences_.push_back(Sequence{true, 0, {}});
  return static_cast<int>(sequences_.size() - 1);
}

void Engine::release_sequence(int seq) {
  sequence(seq);  // checks
  Sequence& s = sequences_[seq];
  kv_.shrink(s.blocks, 0);
  s = Sequence{};
  on_sequence_resized(seq, 0);
}

int Engine::sequence_length(int seq) const { return sequence(seq).length; }

void Engine::truncate_sequence(int seq, int length) {
  sequence(seq);
  Sequence& s = sequences_[seq];
  check(length >= 0 && length <= s.length, "truncate: length {} out of range [0, {}]", length, s.length);
  // A registered block may be shared: rewriting part of it would change other sequences' cache.
  check(!s.caching || length >= static_cast<int64_t>(s.hashes.size()) * kv_.block_size(),
        "truncate: sequence {} would rewrite its cached blocks (length {} < {})", seq, length,
        static_cast<int64_t>(s.hashes.size()) * kv_.block_size());
  // The window at the new length must still be held (0 needs nothing).
  if (length > 0 && window_ > 0) {
    const int64_t first_read = std::max<int64_t>(0, static_cast<int64_t>(length) - window_ + 1);
    for (int64_t i = first_read / kv_.block_size(); i < kv_.blocks_for(length); ++i)
      check(s.blocks[static_cast<size_t>(i)] != KvBlockAllocator::kFreed,
            "truncate: sequence {} gave back the blocks its window needs at length {} (sliding-window freeing)",
            seq, length);
  }
  if (s.caching) s.tokens.resize(static_cast<size_t>(length));
  s.length = length;
  kv_.shrink(s.blocks, length);
  on_sequence_resized(seq, length);
}

void Engine::advance_sequence(int seq, int n) {
  sequence(seq);
  Sequence& s = sequences_[seq];
  check(n >= 0 && static_cast<int64_t>(s.length) + n <= static_cast<int64_t>(s.blocks.size()) * kv_.block_size(),
        "internal: sequence {} advanced by {} past its {} reserved blocks", seq, n, s.blocks.size());
  s.length += n;
  free_out_of_window(s);
}

int Engine::live_sequences() const {
  return static_cast<int>(std::count_if(sequences_.begin(), sequences_.end(), [](const Sequence& s) { return s.live; }));
}

bool Engine::can_reserve(int seq, int length) const {
  if (length > limits_.max_context) return false;
  return kv_.can_grow(sequence(seq).blocks, length);
}

bool Engine::reserve(int seq, int length) {
  if (length > limits_.max_context) return false;
  sequence(seq);
  return kv_.grow(sequences_[seq].blocks, length);
}

StepOutput Engine::step(const Batch& batch) {
  check(in_flight_.empty(), "step: the previous step has not ended (end_step)");
  begin_step(batch);
  return end_step();
}

StepOutput Engine::end_step() {
  check(!in_flight_.empty(), "end_step: no step was begun");
  InFlight done = std::move(in_flight_.front());
  in_flight_.pop_front();
  finish_step(done.out);
  // The tokens this step drew, into the token lists of caching sequences whose next step already
  // took them as kPendingToken: their blocks can now be hashed and registered.
  for (const InFlight::Draw& d : done.draws) {
    if (!is_live(d.seq)) continue;
    Sequence& s = sequences_[static_cast<size_t>(d.seq)];
    if (s.pending_at != d.position) continue;
    s.tokens[static_cast<size_t>(d.position)] = done.out.tokens[static_cast<size_t>(d.row)];
    s.pending_at = -1;
    register_full_blocks(s);
  }
  return std::move(done.out);
}

void Engine::begin_step(const Batch& batch) {
  check(in_flight_.empty() || (overlaps_steps() && in_flight_.size() == 1),
        "begin_step: the previous step has not ended (end_step)");
  const ModelConfig& c = config();
  const int rows = static_cast<int>(batch.rows.size());
  check(rows >= 1, "step: the batch is empty");
  check(rows <= limits_.max_step_rows, "step: {} rows exceed the engine's {} rows per step", rows,
        limits_.max_step_rows);
  const int64_t total = batch.total_tokens();
  check(total <= limits_.max_step_tokens, "step: {} tokens exceed the engine's {} tokens per step", total,
        limits_.max_step_tokens);

  // Every check before anything changes, so a bad batch leaves the engine as it was.
  std::vector<RowPlan> plan(rows);
  int64_t extra_blocks = 0;
  int logits_rows = 0;    // returned (StepOutput::logits)
  int computed_rows = 0;  // head_rows: returned or sampled from
  int64_t offset = 0;
  bool want_logprobs = false;
  std::vector<char> in_batch(sequences_.size(), 0);  // not a pairwise check: a step may hold 1,024 rows
  for (int i = 0; i < rows; ++i) {
    const StepRow& r = batch.rows[i];
    const Sequence& s = sequence(r.seq);
    check(!in_batch[static_cast<size_t>(r.seq)], "step: sequence {} appears twice", r.seq);
    in_batch[static_cast<size_t>(r.seq)] = 1;
    check(!r.tokens.empty(), "step: row {} (sequence {}) has no tokens", i, r.seq);
    if (r.tokens.size() == 1 && r.tokens[0] == kPendingToken) {
      // The token the step in flight draws for this sequence: that step must have a sampling row of it.
      check(!in_flight_.empty() && s.sampled_in_step == in_flight_.back().serial,
            "step: row {} (sequence {}) continues with a token no step in flight draws for it", i, r.seq);
    } else {
      for (int32_t id : r.tokens)
        check(id >= 0 && id < c.vocab_size, "token id {} is out of range [0, {})", id, c.vocab_size);
    }
    const int64_t end = s.length + static_cast<int64_t>(r.tokens.size());
    check(end <= limits_.max_context, "sequence {}: {} + {} tokens exceed the context size {}", r.seq, s.length,
          r.tokens.size(), limits_.max_context);
    if (r.sample) {
      const SamplingParams& p = r.sampling;
      check(std::isfinite(p.temperature), "temperature must be a finite number");
      check(p.top_p > 0 && p.top_p <= 1.0f, "top-p = {} must be in (0, 1]", p.top_p);
      check(p.min_p >= 0 && p.min_p <= 1.0f, "min-p = {} must be in [0, 1]", p.min_p);
      check(p.repeat_penalty > 0 && std::isfinite(p.repeat_penalty), "repeat penalty = {} must be positive",
            p.repeat_penalty);
      check(p.logprobs >= -1 && p.logprobs <= kMaxLogprobs, "logprobs = {} must be in [-1, {}]", p.logprobs,
            kMaxLogprobs);
      check(std::isfinite(p.presence_penalty) && std::isfinite(p.frequency_penalty),
            "presence and frequency penalties must be finite");
      want_logprobs |= p.logprobs >= 0;
      check(r.allowed_tokens.empty() || r.allowed_tokens.size() * 32 >= static_cast<size_t>(c.vocab_size),
            "step: row {}'s token mask has {} words for a vocabulary of {}", i, r.allowed_tokens.size(), c.vocab_size);
    }
    extra_blocks += std::max<int64_t>(0, kv_.blocks_for(end) - static_cast<int64_t>(s.blocks.size()));
    int logits_index = -1;
    if (r.logits || r.all_logits) {
      logits_index = logits_rows;
      logits_rows += r.all_logits ? static_cast<int>(r.tokens.size()) : 1;
    }
    computed_rows += head_rows(r);
    plan[i] = RowPlan{&r, s.length, &s, offset, logits_index};
    offset += static_cast<int64_t>(r.tokens.size());
  }
  check(limits_.max_logit_rows == 0 || computed_rows <= limits_.max_logit_rows,
        "step: {} rows of logits (returned or sampled from), the engine computes at most {} per step", computed_rows,
        limits_.max_logit_rows);
  if (extra_blocks > kv_.free_blocks())
    fail("KV cache full: the step needs {} more blocks of {} tokens, {} of {} are free (the cache holds {} tokens): "
         "admit fewer sequences or raise --kv-cache-tokens",
         extra_blocks, kv_.block_size(), kv_.free_blocks(), kv_.num_blocks(), kv_.capacity_tokens());
  for (const StepRow& r : batch.rows) {
    const bool ok = kv_.grow(sequences_[r.seq].blocks, sequences_[r.seq].length + static_cast<int64_t>(r.tokens.size()));
    check(ok, "internal: KV reservation failed after the check");
  }

  InFlight step;
  step.serial = ++steps_begun_;
  StepOutput& out = step.out;
  out.tokens.assign(rows, -1);
  out.logits.assign(static_cast<size_t>(logits_rows) * c.vocab_size, 0.f);
  if (want_logprobs) out.logprobs.resize(rows);
  run_step(plan, total, out);
  for (int i = 0; i < rows; ++i) {
    const StepRow& r = batch.rows[static_cast<size_t>(i)];
    Sequence& s = sequences_[r.seq];
    if (s.caching) {
      // A pending token stays a placeholder (and its block unregistered) until end_step of the
      // step that draws it.
      if (r.tokens[0] == kPendingToken && r.tokens.size() == 1) s.pending_at = s.length;
      s.tokens.insert(s.tokens.end(), r.tokens.begin(), r.tokens.end());
      register_full_blocks(s);
    }
    s.length += static_cast<int>(r.tokens.size());
    if (r.sample) {
      s.sampled_in_step = step.serial;
      if (s.caching) step.draws.push_back({i, r.seq, s.length});
    }
    // After registering: a completed block is cached before it may be given back.
    free_out_of_window(s);
  }
  in_flight_.push_back(std::move(step));
}

Engine::PrefixMatch Engine::match_prefix(std::span<const int32_t> tokens) const {
  PrefixMatch m;
  const int64_t bs = kv_.block_size();
  const int64_t whole = tokens.empty() ? 0 : (static_cast<int64_t>(tokens.size()) - 1) / bs;
  uint64_t hash = 0;
  int32_t parent = -1;
  for (int64_t i = 0; i < whole; ++i) {
    const std::span<const int32_t> block = tokens.subspan(static_cast<size_t>(i * bs), static_cast<size_t>(bs));
    hash = prefix_block_hash(hash, salt_, block);
    const int32_t b = kv_.lookup(hash, parent, block);
    if (b < 0) break;
    ++m.blocks;
    if (kv_.unreferenced(b)) ++m.idle_blocks;
    parent = b;
  }
  m.tokens = static_cast<int>(m.blocks * bs);
  return m;
}

int Engine::map_cached_prefix(int seq, std::span<const int32_t> tokens) {
  sequence(seq);
  Sequence& s = sequences_[seq];
  check(s.length == 0 && s.blocks.empty(), "map_cached_prefix: sequence {} is not empty ({} tokens)", seq, s.length);
  check(static_cast<int64_t>(tokens.size()) <= limits_.max_context, "map_cached_prefix: {} tokens exceed the context size {}",
        tokens.size(), limits_.max_context);
  const int64_t bs = kv_.block_size();
  const PrefixMatch m = match_prefix(tokens);
  s.caching = true;
  uint64_t hash = 0;
  int32_t parent = -1;
  for (int64_t i = 0; i < m.blocks; ++i) {
    const std::span<const int32_t> block = tokens.subspan(static_cast<size_t>(i * bs), static_cast<size_t>(bs));
    hash = prefix_block_hash(hash, salt_, block);
    parent = kv_.lookup(hash, parent, block);
    check(parent >= 0, "internal: cached block {} vanished between match and map", i);
    kv_.acquire(parent, s.blocks);
    s.hashes.push_back(hash);
  }
  s.tokens.assign(tokens.begin(), tokens.begin() + m.tokens);
  s.length = m.tokens;
  on_prefix_mapped(seq, tokens, m.tokens);
  free_out_of_window(s);
  return m.tokens;
}

void Engine::register_full_blocks(Sequence& s) {
  const int64_t bs = kv_.block_size();
  const int64_t known = static_cast<int64_t>(s.tokens.size());  // called before or after length grows
  while (static_cast<int64_t>(s.hashes.size() + 1) * bs <= known) {
    // A block holding a token not drawn yet waits for end_step.
    if (s.pending_at >= 0 && s.pending_at < static_cast<int64_t>(s.hashes.size() + 1) * bs) break;
    const size_t i = s.hashes.size();
    const std::span<const int32_t> block(s.tokens.data() + i * bs, static_cast<size_t>(bs));
    const uint64_t hash = prefix_block_hash(i == 0 ? 0 : s.hashes.back(), salt_, block);
    s.hashes.push_back(hash);
    // Registered only under a registered parent of this same sequence (kv_blocks.h): a block whose
    // parent duplicated one computed by another sequence at the same time stays private.
    const int32_t parent = i == 0 ? -1 : s.blocks[i - 1];
    // A parent already given back (a window shorter than a block) may be gone: the chain ends here.
    if (i > 0 && parent == KvBlockAllocator::kFreed) continue;
    if (parent >= 0 && (!kv_.is_registered(parent) || kv_.registered(s.hashes[i - 1]) != parent)) continue;
    kv_.register_block(s.blocks[i], hash, parent, block);
  }
}

}  // namespace fdpp
