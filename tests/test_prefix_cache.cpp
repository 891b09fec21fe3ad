// Prefix caching (engine/kv_blocks.h, Engine::map_cached_prefix, the scheduler's admission): a
// cached prefix gives the same logits as a recompute, bit for bit on the CPU, wherever the prefix
// ends, when sequences share it in one step, after it was evicted, and when its first owner is
// cancelled while another still maps it. The block table itself is fuzzed: random admissions,
// shares, steps, cancellations and evictions, with the allocator's invariants and the content of
// every mapped block checked after each operation, with and without a sliding window that gives the
// blocks behind it back.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>

#include "backend/cpu/cpu_engine.h"
#include "engine/kv_blocks.h"
#include "engine/scheduler.h"
#include "model/model_loader.h"
#include "test_util.h"

namespace fdpp {
namespace {

// ---------------------------------------------------------------------------------------------
// The block table under random operations.

// An engine that computes nothing but records, per KV slot, which prefix it holds (a chained hash
// of every token up to that position): a mapped block whose slots do not hold the sequence's own
// prefix, or a shared block overwritten, shows at once.
class RecordingEngine final : public Engine {
 public:
  // window > 0: one sliding layer of that window (>= 2: a step reads the position before it), so
  // that the engine gives back the blocks behind it.
  RecordingEngine(int64_t kv_tokens, int block_size, int window = 0) {
    config_.n_layers = 1;
    config_.hidden = 8;
    config_.n_heads = 1;
    config_.n_kv_heads = 1;
    config_.head_dim = 8;
    config_.vocab_size = 50;
    config_.max_context = 4096;
    if (window > 0) config_.layer_windows = {window};
    EngineLimits l;
    l.max_context = 4096;
    l.max_step_tokens = 4096;
    l.max_step_rows = 64;
    l.kv_cache_tokens = kv_tokens;
    l.block_size = block_size;
    init_engine(l);
    slots_.assign(static_cast<size_t>(kv().num_blocks() * block_size), 0);
  }
  const ModelConfig& config() const override { return config_; }
  const std::vector<int32_t>& blocks_of(int seq) const { return sequence(seq).blocks; }
  static uint64_t chain(uint64_t h, int32_t token) { return (h ^ static_cast<uint64_t>(token + 1)) * 0x100000001b3ull + 7; }
  // The prefix hash each position of `tokens` must hold.
  static std::vector<uint64_t> expected(std::span<const int32_t> tokens) {
    std::vector<uint64_t> e(tokens.size());
    uint64_t h = 0;
    for (size_t i = 0; i < tokens.size(); ++i) e[i] = h = chain(h, tokens[i]);
    return e;
  }
  uint64_t slot(int seq, int pos) const {
    const Sequence& s = sequence(seq);
    const int bs = kv().block_size();
    return slots_[static_cast<size_t>(s.blocks[pos / bs]) * bs + pos % bs];
  }

 private:
  void run_step(std::span<const RowPlan> rows, int64_t, StepOutput&) override {
    const int bs = kv().block_size();
    for (const RowPlan& r : rows) {
      uint64_t h = r.start == 0 ? 0 : slots_[static_cast<size_t>(r.sequence->blocks[(r.start - 1) / bs]) * bs + (r.start - 1) % bs];
      for (size_t t = 0; t < r.row->tokens.size(); ++t) {
        const int pos = r.start + static_cast<int>(t);
        h = chain(h, r.row->tokens[t]);
        slots_[static_cast<size_t>(r.sequence->blocks[pos / bs]) * bs + pos % bs] = h;
      }
    }
  }
  ModelConfig config_;
  std::vector<uint64_t> slots_;
};

TEST(PrefixCacheFuzz, RandomAdmitShareStepCancelEvictKeepsTheTableConsistent) {
  const uint32_t seed = static_cast<uint32_t>(std::random_device{}());
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  uint64_t hits = 0, evictions = 0;
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int round = 0; round < 20; ++round) {
    const int bs = 1 << pick(0, 3);  // 1, 2, 4, 8 tokens per block
    const int64_t pool_blocks = pick(6, 40);
    const int window = round % 2 ? pick(2, 3 * bs + 1) : 0;
    RecordingEngine e(pool_blocks * bs, bs, window);
    ASSERT_EQ(e.window_freeing(), window);
    // Few "documents" with a shared start, so that prompts share prefixes often.
    std::vector<std::vector<int32_t>> docs;
    for (int d = 0; d < 4; ++d) {
      std::vector<int32_t> doc(static_cast<size_t>(pick(1, 12) * bs / 2 + 3));
      for (auto& t : doc) t = pick(0, 3);  // a tiny vocabulary: equal blocks at different places
      if (d > 0 && pick(0, 1)) std::copy_n(docs[0].begin(), std::min(docs[0].size(), doc.size()) / 2, doc.begin());
      docs.push_back(doc);
    }
    struct Live {
      int seq;
      std::vector<int32_t> tokens;  // everything it will hold
      int cached = 0;
    };
    std::vector<Live> live;
    auto check_all = [&](const char* after) {
      std::vector<int32_t> holders(static_cast<size_t>(e.kv().num_blocks()), 0);
      for (const Live& l : live)
        for (int32_t b : e.blocks_of(l.seq))
          if (b != KvBlockAllocator::kFreed) ++holders[b];
      ASSERT_NO_THROW(e.kv().check_invariants(holders)) << "after " << after;
      // Every position of every live sequence that its window still reads holds its own prefix;
      // the blocks wholly before it are given back.
      for (const Live& l : live) {
        const auto want = RecordingEngine::expected(l.tokens);
        const int len = e.sequence_length(l.seq);
        const int first = window > 0 ? std::max(0, len - window + 1) : 0;
        for (int p = first; p < len; ++p)
          ASSERT_EQ(e.slot(l.seq, p), want[p]) << "after " << after << ": sequence " << l.seq << " position " << p;
        for (int i = 0; i < first / bs; ++i)
          ASSERT_EQ(e.blocks_of(l.seq)[i], KvBlockAllocator::kFreed) << "after " << after << ": block " << i;
        if (window > 0) ASSERT_LE(e.held_blocks(l.seq), e.window_blocks_bound(0)) << "after " << after;
      }
    };
    for (int op = 0; op < 1000; ++op) {
      const int what = pick(0, 9);
      if (what <= 2 && live.size() < 12) {
        // Admit: a document, maybe cut, maybe with a private tail; map its cached prefix.
        Live l;
        const auto& doc = docs[pick(0, static_cast<int>(docs.size()) - 1)];
        l.tokens.assign(doc.begin(), doc.begin() + pick(1, static_cast<int>(doc.size())));
        for (int k = pick(0, 2 * bs); k > 0; --k) l.tokens.push_back(pick(0, 49));
        const Engine::PrefixMatch m = e.match_prefix(l.tokens);
        if (m.idle_blocks > e.kv().free_blocks()) continue;
        const int64_t free_before = e.kv().free_blocks();
        l.seq = e.create_sequence();
        l.cached = e.map_cached_prefix(l.seq, l.tokens);
        ASSERT_EQ(l.cached, m.tokens);
        ASSERT_EQ(l.cached % bs, 0);
        ASSERT_LT(l.cached, static_cast<int>(l.tokens.size())) << "the last token is always computed";
        // With a window, the mapped blocks behind it go back at once.
        if (window == 0) ASSERT_EQ(e.kv().free_blocks(), free_before - m.idle_blocks);
        else ASSERT_GE(e.kv().free_blocks(), free_before - m.idle_blocks);
        hits += static_cast<uint64_t>(l.cached);
        live.push_back(l);
        check_all("admit");
      } else if (what <= 6 && !live.empty()) {
        // A step: some live sequences advance by a chunk (as far as the cache lets them).
        Batch b;
        for (Live& l : live) {
          const int len = e.sequence_length(l.seq);
          if (len >= static_cast<int>(l.tokens.size()) || pick(0, 2) == 0) continue;
          const int n = pick(1, std::min(3 * bs, static_cast<int>(l.tokens.size()) - len));
          if (!e.reserve(l.seq, len + n)) continue;  // evicts idle cached blocks when it must
          StepRow r;
          r.seq = l.seq;
          r.tokens = std::span<const int32_t>(l.tokens.data() + len, n);
          b.rows.push_back(r);
        }
        if (!b.rows.empty()) ASSERT_NO_THROW(e.step(b));
        check_all("step");
      } else if (!live.empty()) {
        // Cancel or finish: the sequence lets go of its blocks; the full ones stay cached.
        const size_t i = static_cast<size_t>(pick(0, static_cast<int>(live.size()) - 1));
        e.release_sequence(live[i].seq);
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
        check_all("release");
      }
    }
    evictions += e.kv().evictions();
    for (const Live& l : live) e.release_sequence(l.seq);
    live.clear();
    check_all("the end");
    EXPECT_EQ(e.kv().free_blocks(), e.kv().num_blocks()) << "every block free or idle-cached: nothing leaked";
  }
  EXPECT_GT(hits, 0u) << "the documents share prefixes: some admissions must have mapped cached blocks";
  EXPECT_GT(evictions, 0u) << "the pools are small: some steps must have evicted cached blocks";
}

TEST(PrefixCacheBlocks, EvictsLeastRecentlyReleasedLeavesFirstAndNeverAHeldBlock) {
  KvBlockAllocator kv(4, 2);
  const int32_t t[] = {1, 2, 3, 4, 5, 6};
  std::vector<int32_t> a;
  ASSERT_TRUE(kv.grow(a, 6));  // blocks 0, 1, 2
  kv.register_block(a[0], 10, -1, std::span(t, 2));
  kv.register_block(a[1], 11, a[0], std::span(t + 2, 2));
  kv.register_block(a[2], 12, a[1], std::span(t + 4, 2));
  EXPECT_EQ(kv.lookup(11, a[0], std::span(t + 2, 2)), a[1]);
  EXPECT_EQ(kv.lookup(11, a[0], std::span(t, 2)), -1) << "other tokens under the same hash: a miss";
  EXPECT_EQ(kv.lookup(11, -1, std::span(t + 2, 2)), -1) << "another parent: a miss";
  kv.shrink(a, 0);
  EXPECT_EQ(kv.free_blocks(), 4);
  EXPECT_EQ(kv.cached_blocks(), 3);
  // b holds the first cached block; the fresh blocks come from the never-used one, then the chain's
  // leaves (2, then 1), never block 0.
  std::vector<int32_t> b;
  kv.acquire(kv.lookup(10, -1, std::span(t, 2)), b);
  ASSERT_TRUE(kv.grow(b, 4));
  EXPECT_EQ(b[1], 3);
  EXPECT_EQ(kv.evictions(), 0u);
  ASSERT_TRUE(kv.grow(b, 6));
  EXPECT_EQ(b[2], 2) << "the leaf goes first";
  ASSERT_TRUE(kv.grow(b, 8));
  EXPECT_EQ(b[3], 1);
  EXPECT_EQ(kv.evictions(), 2u);
  EXPECT_FALSE(kv.grow(b, 10)) << "block 0 is held: never evicted";
  EXPECT_EQ(kv.ref_count(0), 1);
  EXPECT_TRUE(kv.is_registered(0));
  kv.check_invariants();
  kv.shrink(b, 0);
  kv.check_invariants();
}

// ---------------------------------------------------------------------------------------------
// Exactness on the default model (skips when it is not fetched).

class PrefixCacheExact : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string path = test::default_model_or_empty();
    if (!path.empty()) model_ = new LoadedModel(load_model(path));
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }
  void SetUp() override {
    if (model_ == nullptr) GTEST_SKIP() << "default model not fetched (scripts/fetch-default-model.sh)";
  }
  static const ModelConfig& config() { return model_->config(); }
  static std::unique_ptr<CpuEngine> engine(int64_t kv_tokens = 1024) {
    EngineLimits l;
    l.max_context = 512;
    l.max_step_rows = 8;
    l.max_step_tokens = 512;
    l.kv_cache_tokens = kv_tokens;
    l.block_size = 16;
    return std::make_unique<CpuEngine>(model_->config(), model_->weights, l);
  }
  static std::vector<int32_t> ids(int n, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<int32_t> v(static_cast<size_t>(n));
    for (auto& t : v) t = static_cast<int32_t>(rng() % 20000);
    return v;
  }
  // Logits of every position of `tokens` on a fresh engine without the cache, in one step.
  static std::vector<float> uncached(const std::vector<int32_t>& tokens) {
    auto e = engine();
    const int s = e->create_sequence();
    StepRow r;
    r.seq = s;
    r.tokens = tokens;
    r.all_logits = true;
    return e->step(Batch{{r}}).logits;
  }
  // The rows [from, end) of an all-positions logits array.
  static std::vector<float> rows_from(const std::vector<float>& all, int from) {
    return std::vector<float>(all.begin() + static_cast<std::ptrdiff_t>(from) * config().vocab_size, all.end());
  }
  // Maps the cached prefix of `tokens` into a new sequence and computes the rest in one step (or
  // returns the row to put into a shared step).
  static StepRow rest_row(Engine& e, const std::vector<int32_t>& tokens, int* cached) {
    const int s = e.create_sequence();
    *cached = e.map_cached_prefix(s, tokens);
    StepRow r;
    r.seq = s;
    r.tokens = std::span<const int32_t>(tokens).subspan(static_cast<size_t>(*cached));
    r.all_logits = true;
    return r;
  }
  static std::vector<float> cached_run(Engine& e, const std::vector<int32_t>& tokens, int* cached, int* seq = nullptr) {
    StepRow r = rest_row(e, tokens, cached);
    if (seq) *seq = r.seq;
    return e.step(Batch{{r}}).logits;
  }
  static bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  }
  static LoadedModel* model_;
};
LoadedModel* PrefixCacheExact::model_ = nullptr;

TEST_F(PrefixCacheExact, PrefixEndingInsideABlockOrAtABoundaryGivesTheSameLogits) {
  auto e = engine();
  const std::vector<int32_t> base = ids(45, 1);
  int cached = -1;
  const std::vector<float> first = cached_run(*e, base, &cached);
  EXPECT_EQ(cached, 0) << "an empty cache";
  EXPECT_TRUE(same_bits(first, uncached(base)));
  EXPECT_EQ(e->kv().cached_blocks(), 2) << "45 tokens: two full blocks registered";
  // (shared tokens with base, total length, tokens expected from the cache)
  struct Case {
    int shared, length, cached;
  };
  for (const Case c : {Case{32, 50, 32},   // diverges at a block boundary
                       Case{37, 50, 32},   // diverges inside the third block: it is recomputed
                       Case{20, 40, 16},   // inside the second block
                       Case{45, 45, 32},   // the same prompt: its last partial block recomputed
                       Case{32, 32, 16}}) {  // the prompt is two whole cached blocks: the last
                                             // token is computed again, so the second block is too
    std::vector<int32_t> p(base.begin(), base.begin() + c.shared);
    const std::vector<int32_t> tail = ids(c.length - c.shared, 100 + c.shared);
    p.insert(p.end(), tail.begin(), tail.end());
    const std::vector<float> got = cached_run(*e, p, &cached);
    EXPECT_EQ(cached, c.cached) << "shared " << c.shared;
    EXPECT_TRUE(same_bits(got, rows_from(uncached(p), cached))) << "shared " << c.shared << " length " << c.length;
  }
}

TEST_F(PrefixCacheExact, TwoSequencesSharingAPrefixInOneStep) {
  auto e = engine();
  const std::vector<int32_t> system = ids(48, 2);
  int cached = -1, warm = -1;
  cached_run(*e, system, &cached, &warm);  // warms the cache: 3 blocks
  e->release_sequence(warm);
  std::vector<int32_t> a = system, b = system;
  const auto ta = ids(21, 3), tb = ids(9, 4);
  a.insert(a.end(), ta.begin(), ta.end());
  b.insert(b.end(), tb.begin(), tb.end());
  int ca = -1, cb = -1;
  Batch batch{{rest_row(*e, a, &ca), rest_row(*e, b, &cb)}};
  EXPECT_EQ(ca, 48);
  EXPECT_EQ(cb, 48);
  for (int32_t block = 0; block < 3; ++block) EXPECT_EQ(e->kv().ref_count(block), 2) << "both map block " << block;
  const StepOutput out = e->step(batch);
  const size_t split = static_cast<size_t>(a.size() - 48) * config().vocab_size;
  const std::vector<float> got_a(out.logits.begin(), out.logits.begin() + static_cast<std::ptrdiff_t>(split));
  const std::vector<float> got_b(out.logits.begin() + static_cast<std::ptrdiff_t>(split), out.logits.end());
  EXPECT_TRUE(same_bits(got_a, rows_from(uncached(a), 48)));
  EXPECT_TRUE(same_bits(got_b, rows_from(uncached(b), 48)));
}

TEST_F(PrefixCacheExact, AnEvictedPrefixIsRecomputedExactly) {
  auto e = engine(8 * 16);  // 8 blocks
  const std::vector<int32_t> p = ids(70, 5);
  int cached = -1, s = -1;
  const std::vector<float> first = cached_run(*e, p, &cached, &s);
  e->release_sequence(s);
  EXPECT_EQ(e->kv().cached_blocks(), 4);
  // A sequence of 8 blocks needs every block: all four cached ones are evicted.
  const std::vector<int32_t> other = ids(120, 6);
  cached_run(*e, other, &cached, &s);
  EXPECT_EQ(e->kv().evictions(), 4u);
  e->release_sequence(s);
  EXPECT_EQ(e->match_prefix(p).tokens, 0) << "the prefix is gone";
  const std::vector<float> again = cached_run(*e, p, &cached);
  EXPECT_EQ(cached, 0);
  EXPECT_TRUE(same_bits(again, first));
  EXPECT_TRUE(same_bits(again, uncached(p)));
}

TEST_F(PrefixCacheExact, ASequenceCancelledWhileAnotherMapsItsBlocks) {
  auto e = engine(10 * 16);
  const std::vector<int32_t> p = ids(64, 7);
  int cached = -1, owner = -1;
  cached_run(*e, p, &cached, &owner);  // 4 blocks, 4 registered... the 4th only once full (64)
  std::vector<int32_t> q = p;
  const auto tail = ids(30, 8);
  q.insert(q.end(), tail.begin(), tail.end());
  // q maps the owner's blocks, then the owner is cancelled; q goes on in chunks while another
  // sequence takes every block it can (only idle cached blocks may be evicted, none of q's).
  const int s = e->create_sequence();
  EXPECT_EQ(e->map_cached_prefix(s, q), 64);
  e->release_sequence(owner);
  for (int32_t b = 0; b < 4; ++b) EXPECT_EQ(e->kv().ref_count(b), 1) << "q still holds block " << b;
  const int hog = e->create_sequence();
  EXPECT_TRUE(e->reserve(hog, 4 * 16));  // 2 blocks left: what q still needs
  EXPECT_FALSE(e->reserve(hog, 7 * 16)) << "q's blocks are not free";
  std::vector<float> got;
  for (int at = 64; at < static_cast<int>(q.size()); at += 10) {
    StepRow r;
    r.seq = s;
    r.tokens = std::span<const int32_t>(q).subspan(static_cast<size_t>(at), std::min<size_t>(10, q.size() - at));
    r.all_logits = true;
    const StepOutput out = e->step(Batch{{r}});
    got.insert(got.end(), out.logits.begin(), out.logits.end());
  }
  EXPECT_TRUE(same_bits(got, rows_from(uncached(q), 64)));
}

// The scheduler: a multi-turn conversation (each turn resends the last prompt and answer) and
// parallel requests sharing a system prompt, with the cache and without: the same tokens; the
// later turns report cached tokens. A cancelled request leaves the others' output unchanged.
TEST_F(PrefixCacheExact, SchedulerOutputsEqualWithAndWithoutTheCache) {
  const std::vector<int32_t> system = ids(40, 9);
  auto run = [&](bool caching, std::vector<GenerationResult>& results, SchedulerStats& stats, bool cancel_one) {
    auto e = engine(2048);
    SchedulerOptions o;
    o.max_num_seqs = 4;
    o.max_batched_tokens = 64;
    o.prefix_caching = caching;
    Scheduler s(*e, *model_->tokenizer, o);
    std::vector<int32_t> convo = system;
    for (int turn = 0; turn < 3; ++turn) {
      const auto q = ids(11 + turn, 20 + turn);
      convo.insert(convo.end(), q.begin(), q.end());
      // This turn's request plus two sharing the system prompt, one of which may be cancelled.
      std::vector<GenerationRequest> reqs(3);
      reqs[0].prompt = convo;
      for (int k = 1; k < 3; ++k) {
        reqs[k].prompt = system;
        const auto own = ids(5 + k, 40 + 3 * turn + k);
        reqs[k].prompt.insert(reqs[k].prompt.end(), own.begin(), own.end());
      }
      std::vector<uint64_t> id;
      std::map<uint64_t, GenerationResult> done;
      for (auto& r : reqs) {
        r.max_tokens = 8;
        r.ignore_eos = true;
        GenerationCallbacks cb;
        cb.on_finish = [&](const GenerationResult& g) { done[g.id] = g; };
        id.push_back(s.submit(r, cb));
      }
      if (cancel_one) {
        s.step();
        s.step();
        s.cancel(id[2]);
      }
      s.run_until_idle();
      for (int k = 0; k < 2; ++k) results.push_back(done[id[k]]);
      convo.insert(convo.end(), done[id[0]].token_ids.begin(), done[id[0]].token_ids.end());
    }
    stats = s.stats();
    EXPECT_EQ(e->kv().used_blocks(), 0) << "idle: no block held";
  };
  for (const bool cancel_one : {false, true}) {
    std::vector<GenerationResult> on, off;
    SchedulerStats st_on, st_off;
    run(true, on, st_on, cancel_one);
    run(false, off, st_off, cancel_one);
    ASSERT_EQ(on.size(), off.size());
    for (size_t i = 0; i < on.size(); ++i) {
      EXPECT_EQ(on[i].token_ids, off[i].token_ids) << "request " << i << (cancel_one ? " (with a cancel)" : "");
      EXPECT_EQ(off[i].cached_tokens, 0);
    }
    // Turns 2 and 3 find the conversation so far; the system prompt's two blocks are shared.
    EXPECT_GE(on[2].cached_tokens, 48);
    EXPECT_GE(on[4].cached_tokens, on[2].cached_tokens + 16);
    EXPECT_EQ(on[3].cached_tokens, 32);
    EXPECT_GT(st_on.prefix_cache_hits, 0u);
    EXPECT_LT(st_on.prompt_tokens, st_off.prompt_tokens) << "fewer tokens prefilled";
    EXPECT_EQ(st_off.prefix_cache_queries, 0u);
  }
}

// The n requests of one prompt (how n > 1 runs) arrive together: one computes the prompt, the
// others wait for its blocks and map them, and every request draws what it draws without the cache.
TEST_F(PrefixCacheExact, RequestsOfOnePromptArrivingTogetherComputeItOnce) {
  const std::vector<int32_t> prompt = ids(70, 11);
  auto run = [&](bool caching, SchedulerStats& stats) {
    auto e = engine(2048);
    SchedulerOptions o;
    o.max_num_seqs = 4;
    o.max_batched_tokens = 48;  // the prompt takes two steps: the others wait through both
    o.prefix_caching = caching;
    Scheduler s(*e, *model_->tokenizer, o);
    std::map<uint64_t, GenerationResult> done;
    std::vector<uint64_t> id;
    for (int k = 0; k < 4; ++k) {
      GenerationRequest r;
      r.prompt = prompt;
      r.max_tokens = 5;
      r.ignore_eos = true;
      r.sampling.temperature = k == 0 ? 0.f : 0.8f;
      r.sampling.seed = 500 + k;
      GenerationCallbacks cb;
      cb.on_finish = [&](const GenerationResult& g) { done[g.id] = g; };
      id.push_back(s.submit(r, cb));
    }
    s.run_until_idle();
    stats = s.stats();
    std::vector<GenerationResult> out;
    for (uint64_t i : id) out.push_back(done[i]);
    return out;
  };
  SchedulerStats on_stats, off_stats;
  const auto on = run(true, on_stats), off = run(false, off_stats);
  for (size_t k = 0; k < on.size(); ++k) {
    EXPECT_EQ(on[k].token_ids, off[k].token_ids) << "request " << k;
    EXPECT_EQ(on[k].cached_tokens, k == 0 ? 0 : 64) << "request " << k;
  }
  EXPECT_EQ(off_stats.prompt_tokens, 4u * 70u);
  EXPECT_EQ(on_stats.prompt_tokens, 70u + 3u * 6u) << "the prompt computed once, then each one's last block";
}

}  // namespace
}  // namespace fdpp
