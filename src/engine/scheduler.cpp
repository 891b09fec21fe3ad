#include "engine/scheduler.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "engine/sampler.h"

namespace fdpp {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Length of the longest suffix of `text` that is a proper prefix of some stop string: those bytes
// may still become a stop string and are held back.
size_t held_back(std::string_view text, const std::vector<std::string>& stops) {
  size_t hold = 0;
  for (const std::string& s : stops)
    for (size_t k = std::min(text.size(), s.size() - 1); k > hold; --k)
      if (text.substr(text.size() - k) == std::string_view(s).substr(0, k)) {
        hold = k;
        break;
      }
  return hold;
}
}  // namespace

std::string step_size_problem(int max_num_seqs, int max_batched_tokens) {
  if (max_batched_tokens > max_num_seqs || max_num_seqs == 1) return "";
  return fmt::format("max-batched-tokens ({}) must exceed max-num-seqs ({}) so that prompts progress while others decode",
                     max_batched_tokens, max_num_seqs);
}

double GenerationResult::time_per_output_token() const {
  return token_ids.size() > 1 ? (total_time - time_to_first_token) / static_cast<double>(token_ids.size() - 1) : 0.0;
}

struct Scheduler::Active {
  Active(uint64_t id_, GenerationRequest r, GenerationCallbacks c, const Tokenizer& t)
      : id(id_), request(std::move(r)), callbacks(std::move(c)), detok(t, request.skip_special_tokens) {
    tokens = request.prompt;
  }
  uint64_t id;
  GenerationRequest request;
  GenerationCallbacks callbacks;
  StreamingDetokenizer detok;
  Clock::time_point submitted = Clock::now();
  std::vector<int32_t> tokens;    // prompt + generated: the history, and what the cache must hold
  std::vector<int32_t> generated;
  std::vector<TokenLogprobs> logprobs;  // per generated token, when asked
  double cumulative_logprob = 0;
  std::vector<TokenLogprobs> prompt_logprobs;  // prompt tokens 1.. so far (request.prompt_logprobs)
  int seq = -1;                   // the engine's sequence while admitted
  int computed = 0;               // tokens of `tokens` whose keys and values are in the cache
  std::string text;               // emitted so far
  std::string pending;            // decoded but held back (may start a stop string)
  size_t undelivered = 0;         // generated tokens not yet reported with a delta
  double first_token_time = -1;
  int preemptions = 0;
  int cached_tokens = -1;         // from the prefix cache at the first admission (-1: not admitted yet)
  bool done = false;
  bool discard_rest = false;      // a stop string ended the text
  std::optional<int32_t> stop_token_id;  // what ended a "stop" (GenerationResult)
  std::optional<std::string> stop_string;
  bool in_batch = false;          // has a row in the step being built
  // Tokens of its rows in steps begun and not yet ended (added to `computed` as each ends), and
  // its sampling rows among them (their tokens are not in `tokens` yet).
  int tokens_in_flight = 0;
  int draws_in_flight = 0;
  // Its newest token is accepted but its text not yet rendered (render_text, while the next step
  // computes).
  bool text_due = false;
  std::unique_ptr<grammar::GrammarMatcher> matcher;  // structured output, or null
};

Scheduler::Scheduler(Engine& engine, const Tokenizer& tokenizer, const SchedulerOptions& options)
    : engine_(engine), tokenizer_(tokenizer), options_(options) {
  const EngineLimits& l = engine.limits();
  check(options.max_num_seqs >= 1, "max-num-seqs = {} must be positive", options.max_num_seqs);
  check(options.max_batched_tokens >= 1, "max-batched-tokens = {} must be positive", options.max_batched_tokens);
  check(options.max_waiting >= 0, "max waiting requests = {} must be >= 0", options.max_waiting);
  options_.max_num_seqs = std::min(options.max_num_seqs, l.max_step_rows);
  options_.max_batched_tokens = std::min(options.max_batched_tokens, l.max_step_tokens);
  if (const std::string p = step_size_problem(options_.max_num_seqs, options_.max_batched_tokens); !p.empty())
    fail("{}", p);
  for (int32_t id = 0; id < std::min(tokenizer.vocab_size(), engine.config().vocab_size); ++id)
    if (tokenizer.is_end_of_generation(id)) end_of_generation_ids_.push_back(id);
  if (!options_.step_log.empty()) {
    step_log_ = std::make_unique<std::ofstream>(options_.step_log, std::ios::out | std::ios::trunc);
    check(step_log_->good(), "step log {}: cannot open it for writing", options_.step_log);
  }
}

Scheduler::~Scheduler() {
  try {
    while (engine_.step_in_flight()) engine_.end_step();
  } catch (const std::exception&) {
    // The engine's error is the step's; the sequences are released below all the same.
  }
  for (auto& a : running_)
    if (a->seq >= 0) engine_.release_sequence(a->seq);
}

uint64_t Scheduler::submit(GenerationRequest request, GenerationCallbacks callbacks) {
  const ModelConfig& c = engine_.config();
  check(!request.prompt.empty(), "the prompt is empty (no tokens to start from)");
  for (int32_t id : request.prompt)
    check(id >= 0 && id < c.vocab_size, "prompt token id {} is out of range [0, {})", id, c.vocab_size);
  check(request.max_tokens >= 1, "max_tokens = {} must be at least 1", request.max_tokens);
  const int64_t need = static_cast<int64_t>(request.prompt.size()) + request.max_tokens;
  check(need <= engine_.max_context(),
        "the prompt ({} tokens) + max_tokens ({}) exceed the context size {}", request.prompt.size(),
        request.max_tokens, engine_.max_context());
  // A sequence that gives back the blocks behind its window runs alone in a pool of its window.
  const int64_t blocks = engine_.window_freeing() > 0
                             ? std::min(engine_.kv().blocks_for(need), engine_.window_blocks_bound(1))
                             : engine_.kv().blocks_for(need);
  check(blocks <= engine_.kv().num_blocks(),
        "the prompt ({} tokens) + max_tokens ({}) exceed the whole KV cache ({} tokens)", request.prompt.size(),
        request.max_tokens, engine_.kv().capacity_tokens());
  check_sampling_params(request.sampling);
  check(request.stop.size() <= kMaxStopStrings, "{} stop strings: at most {} are supported", request.stop.size(),
        kMaxStopStrings);
  for (const std::string& s : request.stop)
    check(!s.empty() && s.size() <= kMaxStopBytes, "a stop string must have 1 to {} bytes, not {}", kMaxStopBytes,
          s.size());
  check(request.stop_token_ids.size() <= kMaxStopTokenIds, "{} stop token ids: at most {} are supported",
        request.stop_token_ids.size(), kMaxStopTokenIds);
  for (const int32_t id : request.stop_token_ids)
    check(id >= 0 && id < c.vocab_size, "stop token id {} is out of range [0, {})", id, c.vocab_size);
  for (const LogitBias& b : request.sampling.logit_bias)
    check(b.id >= 0 && b.id < c.vocab_size, "logit_bias token id {} is out of range [0, {})", b.id, c.vocab_size);
  check(request.sampling.min_tokens <= request.max_tokens, "min_tokens = {} exceeds max_tokens = {}",
        request.sampling.min_tokens, request.max_tokens);
  // The format decides where the output may end: holding its end back could leave no token allowed.
  check(!request.grammar || request.sampling.min_tokens == 0,
        "min_tokens = {} cannot be combined with structured output (the format decides where the output ends)",
        request.sampling.min_tokens);
  request.sampling.min_tokens_ids.clear();
  if (request.sampling.min_tokens > 0) {
    if (!request.ignore_eos) request.sampling.min_tokens_ids = end_of_generation_ids_;
    request.sampling.min_tokens_ids.insert(request.sampling.min_tokens_ids.end(), request.stop_token_ids.begin(),
                                           request.stop_token_ids.end());
  }
  std::unique_ptr<grammar::GrammarMatcher> matcher;
  if (request.grammar) {
    // The first mask is computed here, on the caller's thread: a grammar that the vocabulary cannot
    // even start is refused now rather than failing in a step.
    matcher = std::make_unique<grammar::GrammarMatcher>(grammar_automata().get(request.grammar));
    check(!matcher->dead_end(), "structured output: no token of the vocabulary can start the required format");
  }
  std::lock_guard<std::mutex> lock(mutex_);
  check(!stopping_, "the engine is shutting down: no new requests");
  if (static_cast<int>(waiting_.size()) >= options_.max_waiting)
    throw QueueFullError(fmt::format("the queue is full ({} requests waiting)", waiting_.size()));
  const uint64_t id = next_id_++;
  waiting_.push_back(std::make_unique<Active>(id, std::move(request), std::move(callbacks), tokenizer_));
  waiting_.back()->matcher = std::move(matcher);
  wake_.notify_all();
  return id;
}

void Scheduler::cancel(uint64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  cancelled_.push_back(id);
  wake_.notify_all();
}

bool Scheduler::idle() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return waiting_.empty() && running_.empty() && in_flight_.empty();
}

SchedulerStats Scheduler::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  SchedulerStats s = stats_;
  s.waiting = static_cast<int>(waiting_.size());
  return s;
}

bool Scheduler::scores_prompt(const Active& a) const {
  // Positions before the last prompt token whose successor has no log probability yet (a preempted
  // request recomputes its prompt without scoring it twice).
  return a.request.prompt_logprobs >= 0 &&
         a.prompt_logprobs.size() + 1 < a.request.prompt.size() &&
         static_cast<size_t>(a.computed) <= a.prompt_logprobs.size();
}

void Scheduler::score_prompt(Active& a, const StepOutput& out, int64_t first_logit_row, int n) {
  const int vocab = engine_.config().vocab_size;
  const std::vector<int32_t>& prompt = a.request.prompt;
  for (int j = 0; j < n; ++j) {
    // The logits at position t predict token t + 1.
    const size_t t = static_cast<size_t>(a.computed + j);
    if (t + 1 >= prompt.size() || t != a.prompt_logprobs.size()) continue;
    const std::span<const float> row(out.logits.data() + (first_logit_row + j) * vocab, static_cast<size_t>(vocab));
    a.prompt_logprobs.push_back(Sampler::logprobs(row, prompt[t + 1], a.request.prompt_logprobs));
  }
}

void Scheduler::finish(Active& a, const std::string& reason) {
  if (a.done) return;
  a.done = true;
  if (a.text_due) {
    a.text_due = false;
    if (reason != "cancelled" && a.generated.back() < tokenizer_.vocab_size()) a.pending += a.detok.push(a.generated.back());
  }
  if (reason != "cancelled" && !a.discard_rest) {
    // What was held back for a possible stop string, and the detokenizer's incomplete bytes.
    a.pending += a.detok.flush();
  }
  if (!a.pending.empty() || a.undelivered > 0) {
    if (reason != "cancelled") {
      a.text += a.pending;
      deliver(a, a.pending);
    }
    a.pending.clear();
    a.undelivered = 0;
  }
  if (a.seq >= 0) {
    engine_.release_sequence(a.seq);
    a.seq = -1;
  }
  GenerationResult r;
  r.id = a.id;
  r.prompt = a.request.prompt;
  r.token_ids = a.generated;
  r.text = a.text;
  r.finish_reason = reason;
  if (reason == "error") r.error = current_error_;
  if (reason == "stop") {
    r.stop_token_id = a.stop_token_id;
    r.stop_string = a.stop_string;
  }
  r.logprobs = a.logprobs;
  r.cumulative_logprob = a.cumulative_logprob;
  r.prompt_logprobs = a.prompt_logprobs;
  r.preemptions = a.preemptions;
  r.cached_tokens = std::max(0, a.cached_tokens);
  r.time_to_first_token = a.first_token_time < 0 ? 0 : a.first_token_time;
  r.total_time = seconds_since(a.submitted);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.requests_finished++;
  }
  if (a.callbacks.on_finish) a.callbacks.on_finish(r);
}

void Scheduler::deliver(Active& a, std::string_view text) {
  if (a.callbacks.on_delta) {
    const size_t from = a.generated.size() - a.undelivered;
    std::span<const TokenLogprobs> lp;
    if (a.logprobs.size() == a.generated.size()) lp = std::span<const TokenLogprobs>(a.logprobs).subspan(from);
    a.callbacks.on_delta(a.id, text, std::span<const int32_t>(a.generated).subspan(from), lp);
  }
  a.undelivered = 0;
}

bool Scheduler::accept_token(Active& a, int32_t token, const TokenLogprobs* logprobs) {
  if (logprobs != nullptr) {
    a.logprobs.push_back(*logprobs);
    a.cumulative_logprob += logprobs->logprob;
  }
  a.generated.push_back(token);
  a.tokens.push_back(token);
  a.undelivered++;
  if (a.first_token_time < 0) a.first_token_time = seconds_since(a.submitted);
  const std::vector<int32_t>& stop_ids = a.request.stop_token_ids;
  // vLLM's min_tokens: nothing stops the request before it (the sampler holds the ids back too).
  const bool may_stop = static_cast<int>(a.generated.size()) >= a.request.sampling.min_tokens;
  if (may_stop && !a.request.ignore_eos && tokenizer_.is_end_of_generation(token)) {
    finish(a, "stop");
    return true;
  }
  if (may_stop && std::find(stop_ids.begin(), stop_ids.end(), token) != stop_ids.end()) {
    a.stop_token_id = token;
    finish(a, "stop");
    return true;
  }
  const bool at_limit = static_cast<int>(a.generated.size()) >= a.request.max_tokens ||
                        static_cast<int>(a.tokens.size()) >= engine_.max_context();
  a.text_due = true;
  // The last token's text now (a stop string in it makes the finish "stop"); a grammar's request
  // too, since its matcher may end it next.
  if (at_limit || a.matcher) render_text(a, at_limit);
  if (at_limit && !a.done) finish(a, "length");
  return a.done;
}

void Scheduler::render_text(Active& a, bool last) {
  if (!a.text_due) return;
  a.text_due = false;
  const int32_t token = a.generated.back();
  // A model may pad its vocabulary past the tokenizer's (OPT's 50272 rows for 50265 tokens): such
  // an id has no text.
  if (token < tokenizer_.vocab_size()) a.pending += a.detok.push(token);
  const bool may_stop = static_cast<int>(a.generated.size()) >= a.request.sampling.min_tokens;
  const std::vector<std::string>& stops = a.request.stop;
  size_t cut = std::string::npos;
  const std::string* found = nullptr;
  for (const std::string& s : stops) {
    const size_t at = may_stop ? a.pending.find(s) : std::string::npos;
    if (at < cut) {
      cut = at;
      found = &s;
    }
  }
  if (cut != std::string::npos) {
    a.stop_string = *found;
    a.pending.resize(cut);
    a.discard_rest = true;  // the text after the stop string is dropped
    a.text += a.pending;
    deliver(a, a.pending);
    a.pending.clear();
    finish(a, "stop");
    return;
  }
  if (last) return;  // finish() delivers the rest in one piece
  const size_t hold = stops.empty() ? 0 : held_back(a.pending, stops);
  if (a.pending.size() > hold || (a.pending.empty() && a.undelivered > 0 && hold == 0)) {
    std::string out = a.pending.substr(0, a.pending.size() - hold);
    a.pending.erase(0, a.pending.size() - hold);
    a.text += out;
    deliver(a, out);
  }
}

void Scheduler::render_due_text() {
  for (auto& a : running_)
    if (a->text_due && !a->done) render_text(*a, false);
}

grammar::GrammarAutomata& Scheduler::grammar_automata() {
  std::lock_guard<std::mutex> lock(vocab_mutex_);
  if (!grammar_automata_)
    grammar_automata_ = std::make_unique<grammar::GrammarAutomata>(
        std::make_shared<grammar::TokenVocabulary>(tokenizer_, engine_.config().vocab_size));
  return *grammar_automata_;
}

void Scheduler::advance_grammar(Active& a, int32_t token) {
  grammar::GrammarMatcher& m = *a.matcher;
  if (!m.accept_token(token)) {
    // The mask made this impossible; a sampler that drew outside it is a bug, reported as one.
    current_error_ = fmt::format("structured output: the sampler drew token {} outside the grammar's mask", token);
    finish(a, "error");
    return;
  }
  // The grammar is complete and nothing may follow (or an ignored end token was accepted): done.
  if (m.finished() || (m.accepting() && !m.can_continue())) {
    finish(a, "stop");
    return;
  }
  // The next mask, computed now: empty means the grammar needs bytes no token spells.
  if (m.dead_end()) {
    current_error_ = "structured output: no token of the vocabulary can continue the required format";
    finish(a, "error");
  }
}

void Scheduler::preempt(Active& a) {
  // Recompute later from prompt + generated tokens (vLLM's preemption by recomputation): the cache
  // is given back now; the request keeps its place at the head of the queue.
  engine_.release_sequence(a.seq);
  a.seq = -1;
  a.computed = 0;
  a.preemptions++;
  growth_ratio_ = 1.0;  // the estimate was too low: admit by whole remaining outputs again
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.preemptions++;
}

int64_t Scheduler::expected_new_tokens(const Active& a) const {
  const int64_t remaining = std::max<int64_t>(0, a.request.max_tokens - static_cast<int64_t>(a.generated.size()));
  return static_cast<int64_t>(std::ceil(static_cast<double>(std::min(remaining, SchedulerOptions::kGrowthClip)) *
                                        growth_ratio_));
}

int64_t Scheduler::growth_blocks(const Active& a) const {
  const int64_t final_blocks = engine_.kv().blocks_for(static_cast<int64_t>(a.tokens.size()) + expected_new_tokens(a));
  return std::max<int64_t>(0, final_blocks - engine_.held_blocks(a.seq));
}

bool Scheduler::computing_prefix(const Active& a, int64_t cached_blocks) const {
  // A request whose beginning a running request is computing right now waits for it (the n
  // requests of one prompt, a burst behind one system prompt): admitted a step or a few later, it
  // maps those blocks instead of computing them a second time beside it. Only running requests
  // are waited for, and they progress without the waiting ones, so the wait ends.
  const int64_t bs = engine_.kv().block_size();
  for (const auto& r : running_) {
    // Decoding requests have computed all but their newest token: only prefills are compared, so
    // the cost stays a few prompts per admission however many requests run.
    if (static_cast<int64_t>(r->tokens.size()) - r->computed <= 1) continue;
    const size_t n = std::min(a.tokens.size() - 1, r->tokens.size());
    const auto diverge = std::mismatch(a.tokens.begin(), a.tokens.begin() + static_cast<std::ptrdiff_t>(n), r->tokens.begin());
    const int64_t blocks = static_cast<int64_t>(diverge.first - a.tokens.begin()) / bs;
    if (blocks > cached_blocks && r->computed < blocks * bs) return true;
  }
  return false;
}

void Scheduler::admit_locked() {
  // Admission by free KV blocks: a request enters when its tokens so far (and the next one) fit,
  // keeping a small reserve so that running sequences can still grow a block.
  // Nothing to admit (most steps at saturation): no pass over the running requests.
  if (waiting_.empty() || static_cast<int>(running_.size()) >= options_.max_num_seqs) return;
  const int64_t reserve_blocks = std::max<int64_t>(1, engine_.kv().num_blocks() / 100);
  int64_t free_blocks = engine_.kv().free_blocks();
  if (engine_.window_freeing() > 0)
    // A running windowed sequence grows until it holds its window: that room is spoken for.
    for (const auto& r : running_)
      free_blocks -= std::max<int64_t>(0, engine_.window_blocks_bound(1) - engine_.held_blocks(r->seq));
  const bool growth = options_.reserve_growth && engine_.window_freeing() == 0;
  if (growth)
    for (const auto& r : running_) free_blocks -= growth_blocks(*r);
  while (!waiting_.empty() && static_cast<int>(running_.size()) < options_.max_num_seqs) {
    Active& a = *waiting_.front();
    // Cached blocks cost nothing, except those no one holds: mapping takes them off the free count.
    Engine::PrefixMatch cached;
    // A request that scores its prompt computes every position's logits: nothing from the cache.
    const bool use_cache = options_.prefix_caching && a.request.prompt_logprobs < 0;
    if (use_cache) {
      cached = engine_.match_prefix(a.tokens);
      if (computing_prefix(a, cached.blocks)) break;  // admitted when those blocks are cached
    }
    int64_t need =
        engine_.kv().blocks_for(static_cast<int64_t>(a.tokens.size()) + 1) - cached.blocks + cached.idle_blocks;
    const bool alone = running_.empty();  // a lone request may take the reserve too
    if (growth) {
      const int64_t now = engine_.kv().blocks_for(static_cast<int64_t>(a.tokens.size()) + 1);
      need += std::max<int64_t>(0, engine_.kv().blocks_for(static_cast<int64_t>(a.tokens.size()) +
                                                            expected_new_tokens(a)) - now);
    }
    if (engine_.window_freeing() > 0) {
      // It never holds more than its window and a step's tokens (prefill chunks are cut to fit);
      // alone, it progresses a token at a time in the least that submit() checked.
      const int64_t chunk = std::min<int64_t>(static_cast<int64_t>(a.tokens.size()) - cached.tokens + 1,
                                              options_.max_batched_tokens);
      need = std::min(need, engine_.window_blocks_bound(alone ? 1 : chunk));
    }
    if (need > free_blocks - (alone ? 0 : reserve_blocks)) break;
    free_blocks -= need;
    a.seq = engine_.create_sequence();
    if (use_cache) {
      a.computed = engine_.map_cached_prefix(a.seq, a.tokens);
      if (a.cached_tokens < 0) a.cached_tokens = a.computed;
      stats_.prefix_cache_queries += a.tokens.size();
      stats_.prefix_cache_hits += static_cast<uint64_t>(a.computed);
    }
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
}

void Scheduler::retire_done() {
  for (auto& a : running_)
    if (a->done && a->tokens_in_flight > 0) retired_.push_back(std::move(a));
  std::erase_if(running_, [](const auto& a) { return !a || a->done; });
  std::erase_if(retired_, [](const auto& a) { return a->tokens_in_flight == 0; });
}

bool Scheduler::can_overlap() const {
  if (!options_.overlap_steps || !engine_.overlaps_steps() || in_flight_.size() != 1) return false;
  // A row whose inputs need the pending token on the host: a grammar's mask, a penalty's history,
  // or a prompt scored position by position.
  for (const auto& a : running_) {
    if (a->done || a->tokens_in_flight == 0) continue;
    const SamplingParams& p = a->request.sampling;
    if (a->matcher || p.repeat_penalty != 1.0f || p.presence_penalty != 0.f || p.frequency_penalty != 0.f ||
        a->request.prompt_logprobs >= 0)
      return false;
  }
  return true;
}

bool Scheduler::build_batch(Batch& batch, std::vector<Active*>& owners, bool overlap) {
  static constexpr int32_t kPending[1] = {kPendingToken};
  int budget = options_.max_batched_tokens;
  auto preempt_last = [&]() {
    std::unique_ptr<Active> victim = std::move(running_.back());
    running_.pop_back();
    preempt(*victim);
    std::lock_guard<std::mutex> lock(mutex_);
    waiting_.push_front(std::move(victim));
  };
  auto abandon = [&]() {
    for (Active* a : owners) a->in_batch = false;
    return false;
  };
  // Decode rows first (never starved), each needing one more slot of cache; when the cache is
  // full the most recently admitted request is preempted until the rest fit. A request whose
  // token is still being drawn in the step in flight continues with it (kPendingToken), unless
  // that token is its last (max_tokens or the context reached).
  for (size_t i = 0; i < running_.size(); ++i) {
    Active& a = *running_[i];
    if (a.done) continue;
    const int known = static_cast<int>(a.tokens.size()) + a.draws_in_flight;
    const int computed = a.computed + a.tokens_in_flight;
    if (known - computed != 1) continue;
    const bool pending = a.draws_in_flight > 0;
    const int generated = static_cast<int>(a.generated.size()) + a.draws_in_flight;
    if (pending && (generated >= a.request.max_tokens || known >= engine_.max_context())) continue;
    while (!engine_.reserve(a.seq, computed + 1)) {
      if (overlap) return abandon();  // preemption only between steps
      const bool self = running_.back().get() == &a;
      preempt_last();
      if (self) break;
    }
    if (a.seq < 0) break;  // it was the victim (the last one): no later rows remain
    StepRow r;
    r.seq = a.seq;
    r.tokens = pending ? std::span<const int32_t>(kPending) : std::span<const int32_t>(a.tokens.data() + computed, 1);
    r.sample = true;
    r.sampling = a.request.sampling;
    r.sample_index = static_cast<uint64_t>(generated);
    r.history = a.tokens;
    if (a.matcher) r.allowed_tokens = a.matcher->allowed_tokens();
    batch.rows.push_back(r);
    owners.push_back(&a);
    a.in_batch = true;
    --budget;
  }
  // Prefill chunks with the rest of the budget, in admission order.
  const int logit_rows_cap = engine_.limits().max_logit_rows;  // 0: no limit
  // Logits rows of the step so far, counted as the engine that counts most does: one per row (the
  // CUDA engine's head rows include every sampling row) and every position of a scored chunk.
  int logit_rows = static_cast<int>(batch.rows.size());
  for (auto& owner : running_) {
    Active& a = *owner;
    if (a.done || a.in_batch || a.draws_in_flight > 0) continue;
    const int computed = a.computed + a.tokens_in_flight;
    const int remaining = static_cast<int>(a.tokens.size()) - computed;
    if (remaining <= 1 && !(remaining == 1 && computed == 0)) continue;
    if (budget <= 0 || static_cast<int>(batch.rows.size()) >= options_.max_num_seqs) break;
    int n = std::min(remaining, budget);
    if (engine_.window_freeing() > 0) {
      // Its blocks behind the window are given back as it goes: a chunk that fits the free blocks
      // progresses (a sequence longer than the pool included) where a whole one would wait.
      const KvBlockAllocator& kv = engine_.kv();
      const int64_t fit = (kv.blocks_for(computed) + kv.free_blocks()) * kv.block_size() - computed;
      n = static_cast<int>(std::min<int64_t>(n, std::max<int64_t>(1, fit)));
    }
    // Scoring the prompt: every position's logits, within what one step returns.
    const bool score = scores_prompt(a);
    if (score && logit_rows_cap > 0) {
      if (logit_rows >= logit_rows_cap) continue;  // the next step, with fewer rows
      n = std::min(n, logit_rows_cap - logit_rows);
    }
    if (!engine_.reserve(a.seq, computed + n)) break;  // the next step, after decodes free or preempt
    StepRow r;
    r.seq = a.seq;
    r.tokens = std::span<const int32_t>(a.tokens.data() + computed, n);
    r.all_logits = score;
    logit_rows += score ? n : 1;
    r.sample = n == remaining;  // the last chunk draws the next token
    r.sampling = a.request.sampling;
    r.sample_index = a.generated.size();
    r.history = a.tokens;
    if (a.matcher && r.sample) r.allowed_tokens = a.matcher->allowed_tokens();
    batch.rows.push_back(r);
    owners.push_back(&a);
    a.in_batch = true;
    budget -= n;
  }
  for (Active* a : owners) a->in_batch = false;
  return true;
}

bool Scheduler::step() {
  const Clock::time_point began = Clock::now();
  // Cancellations first, so their blocks are free for this step's admissions. A cancelled
  // request's rows in a step in flight are dropped when it ends.
  std::vector<uint64_t> cancelled;
  std::vector<std::unique_ptr<Active>> cancelled_waiting;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    cancelled.swap(cancelled_);
    for (uint64_t id : cancelled) {
      auto it = std::find_if(waiting_.begin(), waiting_.end(), [&](const auto& a) { return a->id == id; });
      if (it != waiting_.end()) {
        cancelled_waiting.push_back(std::move(*it));
        waiting_.erase(it);
      }
    }
  }
  for (auto& a : cancelled_waiting) finish(*a, "cancelled");
  for (uint64_t id : cancelled)
    for (auto& a : running_)
      if (a->id == id) finish(*a, "cancelled");
  retire_done();

  {
    std::lock_guard<std::mutex> lock(mutex_);
    admit_locked();
  }
  publish_stats();
  if (running_.empty()) {
    if (in_flight_.empty()) return !cancelled.empty();
    complete_step();  // the last step's rows, all of finished requests by now or soon
    retire_done();
    publish_stats();
    return true;
  }

  // Overlap: build the next step while the one in flight computes; else take its tokens first.
  bool overlap = can_overlap();
  if (!in_flight_.empty() && !overlap) {
    complete_step();
    retire_done();
  }
  Batch batch;
  std::vector<Active*> row_owner;
  if (!build_batch(batch, row_owner, overlap)) {
    // The cache is full: preemption waits until the step in flight has ended.
    complete_step();
    retire_done();
    overlap = false;
    batch.rows.clear();
    row_owner.clear();
    build_batch(batch, row_owner, false);
  }
  if (batch.rows.empty()) {
    if (!in_flight_.empty()) {
      complete_step();  // every request with a row in it ends there
      retire_done();
    }
    // Windowed sequences are admitted by their window's bound, not their length, so prefills alone
    // can leave each other no block: the last admitted gives way, as a decode row would make it.
    else if (engine_.window_freeing() > 0 && running_.size() > 1) {
      std::unique_ptr<Active> victim = std::move(running_.back());
      running_.pop_back();
      preempt(*victim);
      std::lock_guard<std::mutex> lock(mutex_);
      waiting_.push_front(std::move(victim));
    }
    publish_stats();
    return true;  // only preemptions or endings happened; the next step admits again
  }

  StepInFlight st;
  st.began = began;
  st.overlapped = overlap;
  st.engine_began = Clock::now();
  try {
    engine_.begin_step(batch);
  } catch (const Error& e) {
    // The step checks everything before it computes, so the engine is as it was: the requests in
    // this batch end with the error and the others go on.
    current_error_ = e.what();
    for (Active* a : row_owner) {
      a->pending.clear();
      finish(*a, "error");
    }
    while (!in_flight_.empty()) complete_step();
    retire_done();
    publish_stats();
    return true;
  }
  st.launched = Clock::now();
  for (size_t i = 0; i < batch.rows.size(); ++i) {
    const StepRow& r = batch.rows[i];
    Active& a = *row_owner[i];
    const int n = static_cast<int>(r.tokens.size());
    st.rows.push_back({&a, n, r.sample, r.all_logits, r.sample && r.sampling.logprobs >= 0});
    a.tokens_in_flight += n;
    if (r.sample) a.draws_in_flight++;
    if (n == 1 && r.sample) {
      ++st.decode_rows;
    } else {
      ++st.prefill_rows;
      st.prefill_tokens += n;
    }
  }
  in_flight_.push_back(std::move(st));
  if (options_.overlap_steps && engine_.overlaps_steps()) {
    // The new step stays in flight: while it computes, the previous one (if any) ends here, and
    // the text of the tokens taken in renders (detokenizing, stop strings, deliveries).
    if (in_flight_.size() > 1) complete_step();
    timed_render();
  } else {
    // While the device computes (an engine that queues steps): the previous step's text. A stop
    // string found here ends its request, whose row in this step is then ignored.
    timed_render();
    complete_step();
    // An engine that computed the step in begin_step leaves nothing to overlap: the text now, so
    // that it reaches the client without waiting for the next step.
    if (!engine_.queues_steps()) render_due_text();
  }
  retire_done();
  publish_stats();
  return true;
}

void Scheduler::complete_step() {
  StepInFlight st = std::move(in_flight_.front());
  in_flight_.pop_front();
  const Clock::time_point wait_began = Clock::now();
  const StepOutput out = engine_.end_step();
  const Clock::time_point ended = Clock::now();
  uint64_t prefilled = 0, generated = 0;
  int64_t logit_row = 0;  // the first logits row of batch row i (StepOutput::logits' order)
  for (size_t i = 0; i < st.rows.size(); ++i) {
    const StepInFlight::Row& row = st.rows[i];
    Active& a = *row.owner;
    a.tokens_in_flight -= row.n;
    if (row.sample) a.draws_in_flight--;
    const int64_t first_logit_row = logit_row;
    if (row.all_logits) logit_row += row.n;
    if (a.done) continue;
    if (row.all_logits) score_prompt(a, out, first_logit_row, row.n);
    a.computed += row.n;
    if (row.n > 1 || a.generated.empty()) prefilled += static_cast<uint64_t>(row.n);
    if (!row.sample) continue;
    ++generated;
    if (!accept_token(a, out.tokens[i], out.logprobs.empty() || !row.logprobs ? nullptr : &out.logprobs[i]) &&
        a.matcher)
      advance_grammar(a, out.tokens[i]);
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.prompt_tokens += prefilled;
    stats_.generated_tokens += generated;
    stats_.steps++;
  }
  growth_ratio_ = std::max(options_.growth_ratio_floor, growth_ratio_ - options_.growth_ratio_decay);
  if (step_log_) {
    log_step(st, ended - wait_began, ended, rendered_);
    rendered_ = Clock::duration::zero();
  }
}

void Scheduler::timed_render() {
  const Clock::time_point t0 = Clock::now();
  render_due_text();
  rendered_ += Clock::now() - t0;
}

void Scheduler::log_step(const StepInFlight& step, Clock::duration wait, Clock::time_point ended,
                         Clock::duration render) {
  auto ms = [](Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
  auto dur = [](Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); };
  const SchedulerStats st = stats();
  *step_log_ << fmt::format(
      "{{\"step\":{},\"start_ms\":{:.3f},\"schedule_ms\":{:.3f},\"engine_ms\":{:.3f},\"emit_ms\":{:.3f},"
      "\"decode_rows\":{},\"prefill_rows\":{},\"prefill_tokens\":{},\"running\":{},\"waiting\":{},"
      "\"graph_captures\":{},\"render_ms\":{:.3f},\"launch_ms\":{:.3f},\"wait_ms\":{:.3f},\"overlapped\":{}}}\n",
      st.steps, ms(created_, step.began), ms(step.began, step.engine_began),
      ms(step.engine_began, step.launched) + dur(wait), ms(ended, Clock::now()), step.decode_rows, step.prefill_rows,
      step.prefill_tokens, st.running, st.waiting, engine_.graph_captures(), dur(render), ms(step.engine_began, step.launched),
      dur(wait), step.overlapped);
}

void Scheduler::publish_stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.running = static_cast<int>(running_.size());
  stats_.kv_blocks_used = engine_.kv().used_blocks();
  stats_.kv_blocks_peak = std::max(stats_.kv_blocks_peak, stats_.kv_blocks_used);
  stats_.kv_blocks_free = engine_.kv().free_blocks();
  stats_.kv_blocks_cached = engine_.kv().cached_blocks();
  stats_.prefix_cache_evictions = engine_.kv().evictions();
}

void Scheduler::run_until_idle() {
  while (!idle()) step();
}

void Scheduler::settle() {
  while (!in_flight_.empty()) complete_step();
  retire_done();
  publish_stats();
}

void Scheduler::run() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] {
        return stopping_ || !waiting_.empty() || !running_.empty() || !cancelled_.empty() || !in_flight_.empty();
      });
      if (stopping_ && !draining_) {
        for (auto& a : waiting_) cancelled_.push_back(a->id);
        for (auto& a : running_) cancelled_.push_back(a->id);
      }
      if (stopping_ && waiting_.empty() && running_.empty() && cancelled_.empty() && in_flight_.empty()) return;
    }
    step();
  }
}

void Scheduler::stop(bool drain) {
  std::lock_guard<std::mutex> lock(mutex_);
  stopping_ = true;
  draining_ = drain;
  wake_.notify_all();
}

}  // namespace fdpp
