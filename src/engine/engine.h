// The batched step every front end stands on (CLI, server, Python): one forward pass over any mix
// of prefill chunks and decode rows of many sequences, as llama.cpp's llama_batch and vLLM's
// scheduler output describe a step. The linear layers see all the step's tokens as one M; the
// backend runs decode attention over the one-token rows and prefill attention over the chunks.
//
// Engine holds what is backend-neutral: the sequence table and the KV block accounting, so that a
// caller learns before a step whether a sequence fits (reserve), never in the middle of one. The
// CPU engine (src/backend/cpu/cpu_engine.h) and the CUDA engine implement run_step().
#pragma once

#include <cstdint>
#include <deque>
#include <span>
#include <vector>

#include "engine/kv_blocks.h"
#include "fdpp/model_config.h"
#include "fdpp/sampling.h"

namespace fdpp {

// A decode row's token that the step in flight is still drawing (Engine::overlaps_steps): the
// row continues its sequence with the token that sequence's sampling row of that step draws, which
// the backend takes from where the device left it.
inline constexpr int32_t kPendingToken = -1;

// One row of a step: `tokens` are appended to sequence `seq` at positions
// [sequence_length(seq), sequence_length(seq) + tokens.size()) and attend to the sequence's cache
// up to their own position. A prefill chunk has many tokens, a decode row one (or kPendingToken).
struct StepRow {
  int seq = -1;
  std::span<const int32_t> tokens;
  bool logits = false;      // return the logits of the row's last token (StepOutput::logits)
  bool all_logits = false;  // return the logits of every token of the row instead (scoring)
  bool sample = false;  // draw a token from them (StepOutput::tokens)
  // Sampling of this row alone: its parameters, and the key of its random stream. The draw depends
  // on (sampling.seed, sample_index) and the logits only, never on the batch slot or on the other
  // rows of the step; sample_index is the request's generated-token index.
  SamplingParams sampling;
  uint64_t sample_index = 0;
  std::span<const int32_t> history;  // the tokens the repetition penalty sees (prompt + generated)
  // Structured output: the tokens the draw may choose (bit id % 32 of word id / 32, at least
  // (vocab + 31) / 32 words); empty: every token.
  std::span<const uint32_t> allowed_tokens;
};

// The rows of logits a step row has computed: every token's with all_logits, else one when it
// returns or samples from them (the engines' head rows; EngineLimits::max_logit_rows bounds their sum).
inline int head_rows(const StepRow& r) {
  return r.all_logits ? static_cast<int>(r.tokens.size()) : (r.logits || r.sample) ? 1 : 0;
}

struct Batch {
  std::vector<StepRow> rows;
  int64_t total_tokens() const;
};

struct StepOutput {
  std::vector<int32_t> tokens;  // per row: the sampled token, or -1 where the row did not sample
  std::vector<float> logits;    // [logit rows, vocab]: one per `logits` row, n per `all_logits` row, in row order
  // Per row: the sampled token's log probabilities where the row sampled with sampling.logprobs >= 0
  // (Sampler::logprobs: of the raw logits); empty when no row of the step asked.
  std::vector<TokenLogprobs> logprobs;
};

struct EngineLimits {
  int max_context = 0;         // tokens per sequence
  int max_step_tokens = 2048;  // tokens in one step (all rows)
  int max_step_rows = 64;      // rows (sequences) in one step
  int64_t kv_cache_tokens = 0; // the KV pool, in tokens
  int block_size = 16;         // tokens per KV block
  // Rows of logits one step computes (0: as many as it has tokens), counted by head_rows: a
  // sampling row takes one even when its logits are not returned.
  int max_logit_rows = 0;
  // When every layer of the model slides (Engine::window_freeing), give each sequence's blocks back
  // as they fall wholly before its window. False keeps every position (for comparison).
  bool free_window_blocks = true;
};

class Engine {
 public:
  virtual ~Engine() = default;

  virtual const ModelConfig& config() const = 0;
  const EngineLimits& limits() const { return limits_; }
  int max_context() const { return limits_.max_context; }

  // Sequences. A new sequence holds no tokens and no blocks; release frees its blocks at once.
  int create_sequence();
  void release_sequence(int seq);
  int sequence_length(int seq) const;
  // Forgets the tokens at positions >= length (the next row continues from there).
  void truncate_sequence(int seq, int length);
  int live_sequences() const;

  // Admission: makes room in the KV cache for the sequence to reach `length` tokens. Returns false,
  // with nothing changed, when too few blocks are free. step() reserves what its rows need itself
  // (all or nothing, before any work), so calling this first is only needed to plan.
  bool reserve(int seq, int length);
  bool can_reserve(int seq, int length) const;
  const KvBlockAllocator& kv() const { return kv_; }

  // Sliding windows. When every layer slides and limits().free_window_blocks, a sequence of length
  // L never reads positions before L - W + 1 again (W: the longest layer window), so after every
  // step (and after mapping a cached prefix) the blocks wholly before that go back to the pool: a
  // shared one only drops a reference, a cached one stays cached (kv_blocks.h). Returns W, or 0
  // when nothing is freed (a full-attention layer reads every position; the CUDA backend has no
  // windows).
  int window_freeing() const { return window_; }
  // Blocks a sequence holds (those given back not counted).
  int64_t held_blocks(int seq) const { return KvBlockAllocator::held(sequence(seq).blocks); }
  // The most blocks a sequence holds while a step appends n tokens to it, whatever its length: its
  // window's W - 1 earlier positions and the n new ones, misaligned by at most one block. Only
  // meaningful when window_freeing() > 0.
  int64_t window_blocks_bound(int64_t n) const { return kv_.blocks_for(window_ - 1 + n) + 1; }

  // Prefix caching (kv_blocks.h). match_prefix: how much of `tokens` the cache holds as whole
  // blocks, at most tokens.size() - 1 tokens (the last token is always computed, so that there are
  // logits to sample from), and how many of those blocks no sequence holds (mapping them takes
  // that many from kv().free_blocks()). map_cached_prefix: maps them into a new, empty sequence,
  // which then starts at the returned length, and makes the sequence a caching one: its full blocks
  // are registered as step() computes them, for later sequences to map. A sequence never mapped
  // this way neither maps nor registers (the single-sequence runners, the benchmarks).
  struct PrefixMatch {
    int tokens = 0;
    int64_t blocks = 0;
    int64_t idle_blocks = 0;
  };
  PrefixMatch match_prefix(std::span<const int32_t> tokens) const;
  int map_cached_prefix(int seq, std::span<const int32_t> tokens);

  // Runs one step. Checks every row first (live distinct sequences, non-empty tokens, ids in the
  // vocabulary, lengths within max_context, the step within max_step_tokens / max_step_rows, room
  // in the KV cache) and throws fdpp::Error naming the problem before anything is computed or
  // reserved; then computes and advances each row's sequence.
  StepOutput step(const Batch& batch);
  // step() in two halves, for a caller with host work to do while the device computes (the
  // scheduler renders the previous step's text meanwhile): begin_step checks, reserves, launches
  // and advances the sequences; end_step waits for the oldest step begun and returns its output.
  // The batch's token spans need not outlive begin_step. Sequences may be released in between
  // (their blocks are reused only by a later step). Engines without a device queue (queues_steps()
  // false) compute the whole step in begin_step. One step at a time, except where overlaps_steps():
  // then a second step may begin while one is in flight, its decode rows continuing sequences
  // with the tokens the first draws (kPendingToken), so that the host schedules and launches step
  // N + 1 while the device computes step N (SGLang's overlap scheduler, vLLM's async scheduling).
  void begin_step(const Batch& batch);
  StepOutput end_step();
  bool step_in_flight() const { return !in_flight_.empty(); }
  int steps_in_flight() const { return static_cast<int>(in_flight_.size()); }
  // Whether begin_step returns while the device still computes (so that host work between
  // begin_step and end_step overlaps it). False: the whole step runs in begin_step.
  virtual bool queues_steps() const { return false; }
  // Whether begin_step takes a second step while one is in flight, with kPendingToken rows.
  virtual bool overlaps_steps() const { return false; }

  // Does now what the first steps of a long run would otherwise do on the way (the CUDA engine
  // times its linear layers' algorithms for every row count a step can reach). For engines that
  // serve many requests (serve, Python, generate --file); nothing on the CPU.
  virtual void warm_up() {}
  // Step graphs captured so far (CUDA graphs of new decode batch shapes; the step log's
  // "graph_captures"): a step that captures pays for it on the host.
  virtual uint64_t graph_captures() const { return 0; }

 protected:
  struct Sequence {
    bool live = false;
    int length = 0;
    std::vector<int32_t> blocks;
    // Prefix caching (map_cached_prefix): the tokens computed so far and the chained hash of each
    // full block among them.
    bool caching = false;
    std::vector<int32_t> tokens;
    std::vector<uint64_t> hashes;
    // The newest step begun whose row of this sequence draws a token (kPendingToken rows continue
    // from it), and where a caching sequence's tokens hold kPendingToken until that token is known.
    uint64_t sampled_in_step = 0;
    int pending_at = -1;
  };
  // A row as the backend sees it: its sequence's cache state before the step.
  struct RowPlan {
    const StepRow* row = nullptr;
    int start = 0;           // the sequence's length before the step (the first new position)
    const Sequence* sequence = nullptr;
    int64_t token_offset = 0;  // where the row's tokens start in the step's token list
    int logits_index = -1;     // its first row in StepOutput::logits, or -1
  };
  void init_engine(const EngineLimits& limits);
  // Computes the step: writes out.tokens for sampling rows and out.logits (already sized) for
  // rows with logits_index >= 0. The sequences' blocks already hold start + n tokens. An engine
  // with a device queue may return once the step is queued, leaving out.tokens and out.logprobs to
  // finish_step (out.logits are written by run_step). The rows do not outlive run_step. Where
  // overlaps_steps(), a row's token may be kPendingToken: the token its sequence's sampling row of
  // the previous step draws (finish_step is called in the order the steps were run).
  virtual void run_step(std::span<const RowPlan> rows, int64_t total_tokens, StepOutput& out) = 0;
  // Waits for the step run_step queued and completes its output; nothing to do for an engine
  // that computed it in run_step.
  virtual void finish_step(StepOutput& /*out*/) {}
  // Called when a sequence is released or truncated (the backend may drop storage). A sequence's
  // block list may begin with KvBlockAllocator::kFreed entries (window_freeing): positions there are
  // never read again.
  virtual void on_sequence_resized(int /*seq*/, int /*length*/) {}
  // Called after map_cached_prefix mapped `cached` tokens of `tokens` into `seq` (the
  // tensor-parallel engine maps the same prefix on every rank).
  virtual void on_prefix_mapped(int /*seq*/, std::span<const int32_t> /*tokens*/, int /*cached*/) {}
  const Sequence& sequence(int seq) const;
  bool is_live(int seq) const;  // false for a released (or never created) sequence
  // For backends' own single-sequence paths (the CUDA engine's prefill/decode): the tokens at
  // [length, length + n) were computed into blocks that reserve() had already made room for.
  void advance_sequence(int seq, int n);

 private:
  // Hashes and registers the full blocks of a caching sequence that its last step completed.
  void register_full_blocks(Sequence& s);
  // Gives back the blocks of s that lie wholly before its window (window_freeing).
  void free_out_of_window(Sequence& s);

  EngineLimits limits_;
  KvBlockAllocator kv_;
  std::vector<Sequence> sequences_;
  uint64_t salt_ = 0;  // prefix_block_hash's salt: the model's shapes
  int window_ = 0;     // window_freeing()
  // Steps begun and not yet ended, oldest first (at most two, and two only where overlaps_steps()):
  // each one's output, and where its sampling rows' tokens go in caching sequences' token lists.
  struct InFlight {
    StepOutput out;
    uint64_t serial = 0;
    struct Draw {
      int row, seq, position;
    };
    std::vector<Draw> draws;
  };
  std::deque<InFlight> in_flight_;
  uint64_t steps_begun_ = 0;
};

}  // namespace fdpp
