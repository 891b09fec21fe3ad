// Continuous batching over Engine::step (iteration-level scheduling, as vLLM and llama-server do
// it): requests join at the next step, prompts are prefilled in chunks within a token budget per
// step, running sequences decode in every step (never starved by prefill), admission is by free KV
// blocks, and when the cache runs out the most recently admitted running request is preempted and
// later recomputed from its prompt and the tokens it had generated (never dropped). With a model
// whose every layer slides (Engine::window_freeing), a sequence holds at most its window's blocks
// and a step's, and admission, prefill chunks and submit()'s size check count that instead.
//
// The server, the Python package and `fdpp generate --file` all drive this class. submit(),
// cancel() and stats() are thread-safe; step() / run() run on one engine thread, and every
// callback is called on that thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/engine.h"
#include "fdpp/error.h"
#include "fdpp/sampling.h"
#include "grammar/grammar.h"
#include "tokenizer/tokenizer.h"

namespace fdpp {

// submit() when the waiting queue is full (the server answers 503 with Retry-After).
class QueueFullError : public Error {
 public:
  using Error::Error;
};

// Stop strings a request may carry, and their length: bounded so that the hold-back buffer and the
// per-token search stay small (OpenAI allows 4; llama-server does not bound them). Stop token ids:
// each is compared with every generated token. The front ends check these first, naming the field.
inline constexpr size_t kMaxStopStrings = 16;
inline constexpr size_t kMaxStopBytes = 256;
inline constexpr size_t kMaxStopTokenIds = 64;

struct GenerationRequest {
  std::vector<int32_t> prompt;      // token ids (not empty)
  SamplingParams sampling;          // seed: the request's random stream (see StepRow)
  int max_tokens = 128;             // >= 1
  bool ignore_eos = false;
  std::vector<std::string> stop;    // stop strings: the text ends before the first one found
  // Ids that end the generation like an end-of-generation token (vLLM's stop_token_ids): kept in
  // token_ids, left out of the text, finish_reason "stop"; ignore_eos does not turn them off.
  std::vector<int32_t> stop_token_ids;
  // false: special tokens met in the output (after an ignored EOS, say) are written into the text,
  // as vLLM's skip_special_tokens=false does; the end-of-generation token that ends it never is.
  bool skip_special_tokens = true;
  // Structured output (src/grammar): every token is drawn from those the grammar allows, the end
  // token only where it may end, and the request finishes with "stop" where nothing may follow.
  // Null: unconstrained.
  std::shared_ptr<const grammar::Grammar> grammar;
  // >= 0: the log probability of every prompt token after the first, with this many most likely
  // alternatives (vLLM's prompt_logprobs; the server's echo with logprobs). The prompt is then
  // prefilled with the logits of every position and not taken from the prefix cache.
  int prompt_logprobs = -1;
};

struct GenerationResult {
  uint64_t id = 0;
  std::vector<int32_t> prompt;
  std::vector<int32_t> token_ids;   // generated (an end-of-generation token included when hit)
  std::string text;                 // their text, special tokens skipped, cut before a stop string
  std::string finish_reason;        // "stop" (end token or stop string), "length", "cancelled", "error"
  std::string error;                // the message when finish_reason == "error"
  // What ended a "stop" (vLLM's stop_reason): one of the request's stop_token_ids, or the stop
  // string found; neither for an end-of-generation token.
  std::optional<int32_t> stop_token_id;
  std::optional<std::string> stop_string;
  // sampling.logprobs >= 0: one entry per token of token_ids, and the sum of their logprob (vLLM's
  // cumulative_logprob; 0 otherwise).
  std::vector<TokenLogprobs> logprobs;
  double cumulative_logprob = 0;
  // prompt_logprobs >= 0: one entry per prompt token from the second on (the first has no context).
  std::vector<TokenLogprobs> prompt_logprobs;
  int preemptions = 0;
  // Prompt tokens whose keys and values came from the prefix cache when the request was first
  // admitted (OpenAI's usage.prompt_tokens_details.cached_tokens, vLLM's num_cached_tokens).
  int cached_tokens = 0;
  // Seconds since submit(): the first generated token, and the end.
  double time_to_first_token = 0;
  double total_time = 0;
  // Decode time per generated token after the first (0 with fewer than two tokens).
  double time_per_output_token() const;
};

struct GenerationCallbacks {
  // New text (complete UTF-8, never part of a stop string) and the token ids it came from, with
  // their log probabilities when the request asked for them (else an empty span).
  std::function<void(uint64_t id, std::string_view text, std::span<const int32_t> tokens,
                     std::span<const TokenLogprobs> logprobs)>
      on_delta;
  // Called once per request, last.
  std::function<void(const GenerationResult&)> on_finish;
};

struct SchedulerOptions {
  int max_num_seqs = 64;         // running sequences (rows of a decode step)
  int max_batched_tokens = 2048; // tokens of one step, decode rows and prefill chunks together
  int max_waiting = 1024;        // queued requests; submit() beyond throws QueueFullError
  // "": none. Else a file that gets one JSON line per step (the per-step timeline that throughput
  // work starts from): when it began, the host's scheduling, the engine's step (with the previous
  // step's text rendered while it computes, also given alone) and the token handling after it, in
  // ms, and the step's rows and tokens. bench/step_timeline.py reads it.
  std::string step_log;
  // Automatic prefix caching (kv_blocks.h): an admitted request maps the cached blocks of its
  // beginning and prefills only the rest; its own full blocks stay cached after it for later ones.
  bool prefix_caching = true;
  // Admission also keeps room for what the running requests and the new one will still generate:
  // growth_ratio of each one's remaining max_tokens (at most kGrowthClip tokens). The ratio starts
  // at 1 (a batch whose outputs reach max_tokens never preempts), falls by growth_ratio_decay a
  // step to growth_ratio_floor as requests finish early, and goes back to 1 at a preemption. This
  // is SGLang's new-token ratio; it lets max_num_seqs be the engine's rows and the KV cache decide.
  // Off (false): a request enters when its tokens so far fit (vLLM's rule).
  bool reserve_growth = false;
  // Where the engine overlaps steps (Engine::overlaps_steps: the CUDA engine), the next step is
  // scheduled and launched while the device computes the current one, its decode rows continuing
  // with the tokens still being drawn; the finished requests' rows of it are dropped. Steps with a
  // structured-output request, a repetition, presence or frequency penalty, or prompt scoring wait
  // for the tokens first (their inputs need them). The tokens are the same either way.
  bool overlap_steps = true;
  double growth_ratio_floor = 0.3;
  double growth_ratio_decay = 0.002;
  static constexpr int64_t kGrowthClip = 4096;
};

// Why a step of max_batched_tokens cannot serve max_num_seqs running sequences ("" when it can):
// every running sequence decodes in every step, and a prefill needs at least one more token.
std::string step_size_problem(int max_num_seqs, int max_batched_tokens);

struct SchedulerStats {
  int running = 0;
  int waiting = 0;
  int64_t kv_blocks_used = 0;
  int64_t kv_blocks_free = 0;
  int64_t kv_blocks_peak = 0;     // the most kv_blocks_used seen between steps
  uint64_t prompt_tokens = 0;     // prefilled (recomputation after preemption included)
  uint64_t generated_tokens = 0;
  uint64_t preemptions = 0;
  uint64_t requests_finished = 0;
  uint64_t steps = 0;
  // Prefix caching: prompt tokens looked up at admission (recomputation after preemption included),
  // those found in the cache, cached blocks evicted to make room, and blocks cached now.
  uint64_t prefix_cache_queries = 0;
  uint64_t prefix_cache_hits = 0;
  uint64_t prefix_cache_evictions = 0;
  int64_t kv_blocks_cached = 0;
};

class Scheduler {
 public:
  Scheduler(Engine& engine, const Tokenizer& tokenizer, const SchedulerOptions& options);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a request and returns its id. Throws fdpp::Error for a request that can never run (empty
  // prompt, ids outside the vocabulary, prompt + max_tokens beyond the context, parameters out of
  // range, min_tokens above max_tokens, logit_bias ids outside the vocabulary) and QueueFullError
  // when max_waiting requests already wait. Fills sampling.min_tokens_ids (the end-of-generation
  // ids unless ignore_eos, and stop_token_ids) for a request with min_tokens.
  uint64_t submit(GenerationRequest request, GenerationCallbacks callbacks);
  // The request finishes with "cancelled" at the next step; its KV blocks are free after it.
  void cancel(uint64_t id);

  // One engine step over the running requests and whatever the budget admits. Returns false when
  // there was nothing to run.
  bool step();
  // Steps until every submitted request has finished.
  void run_until_idle();
  // Ends the steps still in flight (overlap_steps leaves the last one begun, with the rows of
  // requests that had already finished), so that the engine is free for direct use.
  void settle();
  // The engine thread's loop: steps while there is work, sleeps until submit() otherwise, returns
  // after stop(). With drain, requests already submitted finish first; submit() is refused after
  // stop().
  void run();
  void stop(bool drain);

  bool idle() const;  // nothing waits, runs or is in flight (the last: engine thread only)
  SchedulerStats stats() const;
  const SchedulerOptions& options() const { return options_; }
  Engine& engine() { return engine_; }
  const Tokenizer& tokenizer() const { return tokenizer_; }

 private:
  struct Active;
  // A step begun and not yet ended: its rows' owners and what the token handling needs of them.
  struct StepInFlight {
    struct Row {
      Active* owner;
      int n;
      bool sample, all_logits, logprobs;
    };
    std::vector<Row> rows;
    bool overlapped = false;  // built while the previous step computed
    std::chrono::steady_clock::time_point began, engine_began, launched;
    int decode_rows = 0, prefill_rows = 0;
    int64_t prefill_tokens = 0;
  };
  void admit_locked();
  // The next step's rows: decode rows first, then prefill chunks in the budget. With `overlap` a
  // step is in flight and the rows continue from it (its tokens still pending); returns false,
  // with the batch to be discarded, where that would need a preemption (the caller ends the step
  // in flight and builds again without overlap).
  bool build_batch(Batch& batch, std::vector<Active*>& owners, bool overlap);
  // Whether the next step may be built while the one in flight computes (SchedulerOptions::overlap_steps).
  bool can_overlap() const;
  // Ends the oldest step in flight and takes its tokens in (accept_token, grammar, prompt scores).
  void complete_step();
  // Drops finished requests from running_; those with rows still in flight wait in retired_.
  void retire_done();
  // Whether a running request is still computing more whole blocks of a's beginning than the
  // prefix cache holds (`cached_blocks`).
  bool computing_prefix(const Active& a, int64_t cached_blocks) const;
  // Whether a's next prefill chunk returns the logits of every position (prompt_logprobs), and
  // the log probabilities of its prompt tokens from a step's logits rows.
  bool scores_prompt(const Active& a) const;
  void score_prompt(Active& a, const StepOutput& out, int64_t first_logit_row, int n);
  void finish(Active& a, const std::string& reason);
  void preempt(Active& a);
  // The KV blocks `a` will still take if it generates growth_ratio_ of its remaining max_tokens.
  int64_t growth_blocks(const Active& a) const;
  int64_t expected_new_tokens(const Active& a) const;  // growth_ratio_ of its remaining max_tokens
  // The engine's token for a: its bookkeeping and the checks that need no text (end of generation,
  // stop ids, the length limit). Its text waits for render_text, which runs while the next step
  // computes where the engine queues steps (at the end of this step otherwise), except for a
  // request that ends here or follows a grammar. True when it finished.
  bool accept_token(Active& a, int32_t token, const TokenLogprobs* logprobs);
  // The accepted token's text: detokenized, searched for stop strings (one ends the request) and
  // delivered except what a stop string may still claim (last: finish() delivers the rest).
  void render_text(Active& a, bool last);
  void render_due_text();  // render_text for every running request with a token's text due
  void timed_render();     // render_due_text, its time counted for the step log (rendered_)
  void deliver(Active& a, std::string_view text);  // on_delta with the undelivered tokens
  void advance_grammar(Active& a, int32_t token);  // after accept_token: may finish the request
  // The automata of structured output's grammars over this model's vocabulary (built at first use):
  // requests of one schema share one, so a state's mask is computed once for all of them.
  grammar::GrammarAutomata& grammar_automata();
  void publish_stats();
  void log_step(const StepInFlight& step, std::chrono::steady_clock::duration wait,
                std::chrono::steady_clock::time_point ended, std::chrono::steady_clock::duration render);

  Engine& engine_;
  const Tokenizer& tokenizer_;
  SchedulerOptions options_;
  double growth_ratio_ = 1.0;  // reserve_growth: the share of remaining max_tokens reserved
  std::vector<int32_t> end_of_generation_ids_;  // what min_tokens holds back

  mutable std::mutex mutex_;        // guards waiting_, cancelled_, stopping_, next_id_, stats_
  std::condition_variable wake_;
  std::deque<std::unique_ptr<Active>> waiting_;
  std::vector<uint64_t> cancelled_;
  bool stopping_ = false;
  bool draining_ = false;
  uint64_t next_id_ = 1;
  SchedulerStats stats_;

  std::vector<std::unique_ptr<Active>> running_;  // engine thread only
  std::vector<std::unique_ptr<Active>> retired_;  // finished, with rows in a step in flight
  std::deque<StepInFlight> in_flight_;            // engine thread only, oldest first
  std::string current_error_;                      // the failed step's message (engine thread)
  std::mutex vocab_mutex_;  // builds grammar_automata_ once
  std::unique_ptr<grammar::GrammarAutomata> grammar_automata_;
  std::unique_ptr<std::ofstream> step_log_;        // engine thread only
  std::chrono::steady_clock::duration rendered_{};  // text rendered since the last step logged
  std::chrono::steady_clock::time_point created_ = std::chrono::steady_clock::now();
};

}  // namespace fdpp
