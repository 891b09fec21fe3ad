// Sliding-window block freeing (Engine::window_freeing, KvBlockAllocator::release_leading): when
// every layer slides, a sequence gives back the blocks wholly before its window. The logits stay
// bit-identical to an engine that keeps every position, through chunked prefill, batching, a
// prefix-cache hit, eviction of the freed blocks and the scheduler's preemption; a sequence never
// holds more than its window's blocks; a model with a full-attention layer frees nothing; the
// allocator's invariants hold when a cached chain's beginning is let go while its end is held.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include "backend/cpu/cpu_engine.h"
#include "backend/cpu/cpu_runner.h"
#include "engine/kv_blocks.h"
#include "engine/scheduler.h"
#include "model/model_loader.h"
#include "test_util.h"
#include "tiny_model.h"

namespace fdpp {
namespace {

std::vector<int32_t> holders_of(const KvBlockAllocator& kv, const std::vector<std::vector<int32_t>*>& lists) {
  std::vector<int32_t> h(static_cast<size_t>(kv.num_blocks()), 0);
  for (const auto* l : lists)
    for (int32_t b : *l)
      if (b != KvBlockAllocator::kFreed) ++h[static_cast<size_t>(b)];
  return h;
}

TEST(WindowBlocksAllocator, LettingGoOfACachedChainsBeginningDropsReferencesAndCutsOnlyUnderPressure) {
  KvBlockAllocator kv(6, 2);
  const int32_t t[] = {1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<int32_t> a, b;
  ASSERT_TRUE(kv.grow(a, 8));  // blocks 0..3, a cached chain
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(kv.register_block(a[i], 100 + i, i == 0 ? -1 : a[i - 1], std::span(t + 2 * i, 2)));
  kv.acquire(a[0], b);  // b shares the first two blocks
  kv.acquire(a[1], b);
  const int64_t free_before = kv.free_blocks();
  EXPECT_EQ(kv.release_leading(a, 3), 3);
  EXPECT_EQ(a.size(), 4u) << "the list keeps its length: entry p / block_size still maps position p";
  EXPECT_EQ(a[0], KvBlockAllocator::kFreed);
  EXPECT_EQ(a[2], KvBlockAllocator::kFreed);
  EXPECT_EQ(kv.release_leading(a, 3), 0) << "already given back";
  EXPECT_EQ(kv.ref_count(0), 1) << "shared: only a's reference went";
  EXPECT_EQ(kv.ref_count(2), 0);
  EXPECT_EQ(kv.free_blocks(), free_before + 1) << "block 2, idle but cached, counts as free";
  EXPECT_TRUE(kv.is_registered(2));
  EXPECT_NO_THROW(kv.check_invariants(holders_of(kv, {&a, &b})));
  kv.shrink(b, 0);  // blocks 0, 1, 2 idle while 3 (their descendant) is held by a
  EXPECT_EQ(KvBlockAllocator::held(a), 1);
  EXPECT_NO_THROW(kv.check_invariants(holders_of(kv, {&a})));
  EXPECT_EQ(kv.lookup(100, -1, std::span(t, 2)), 0) << "still cached: a later prompt can map them";
  // A sequence taking every free block: 4 and 5 never used, then the idle interior blocks, the
  // chain cut below the first one taken; a's block 3 stays a's, uncached.
  std::vector<int32_t> c;
  ASSERT_EQ(kv.free_blocks(), 5);
  ASSERT_TRUE(kv.grow(c, 10));
  EXPECT_EQ(kv.free_blocks(), 0);
  EXPECT_EQ(kv.ref_count(3), 1);
  EXPECT_FALSE(kv.is_registered(3));
  EXPECT_EQ(kv.cached_blocks(), 0);
  EXPECT_EQ(kv.evictions(), 3u);
  EXPECT_NO_THROW(kv.check_invariants(holders_of(kv, {&a, &c})));
  kv.shrink(a, 0);
  kv.shrink(c, 0);
  EXPECT_EQ(kv.free_blocks(), 6);
  EXPECT_NO_THROW(kv.check_invariants());
}

// A tiny Llama whose every layer slides over `window` positions (Mistral's layout), or with some
// full-attention layers (Gemma's).
class WindowBlocks : public ::testing::Test {
 protected:
  static constexpr int kWindow = 11;  // not a multiple of the block size
  static constexpr int kBlock = 4;
  void SetUp() override {
    config_ = test::tiny("llama", 16);
    config_.layer_windows.assign(static_cast<size_t>(config_.n_layers), kWindow);
    weights_ = test::random_weights(config_);
  }
  std::unique_ptr<CpuEngine> engine(bool free_blocks, int64_t kv_tokens = 4096, const ModelConfig* c = nullptr) {
    EngineLimits l;
    l.max_context = config_.max_context;
    l.max_step_rows = 8;
    l.max_step_tokens = 256;
    l.kv_cache_tokens = kv_tokens;
    l.block_size = kBlock;
    l.free_window_blocks = free_blocks;
    return std::make_unique<CpuEngine>(c ? *c : config_, weights_, l);
  }
  // The most blocks a sequence may hold between steps: the W - 1 positions before its next token.
  int64_t held_bound() const { return (kWindow - 1 + kBlock - 1) / kBlock + 1; }
  ModelConfig config_;
  DecoderWeights weights_;
};

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
}

TEST_F(WindowBlocks, LogitsAreBitIdenticalWithAndWithoutFreeingOverManyWindows) {
  auto freeing = engine(true);
  auto keeping = engine(false);
  ASSERT_EQ(freeing->window_freeing(), kWindow);
  ASSERT_EQ(keeping->window_freeing(), 0);
  // Three sequences, prefilled in uneven chunks, then decoding random tokens together far past the
  // window.
  const std::vector<std::vector<std::pair<int, int>>> prefill = {{{0, 7}, {7, 30}}, {{0, 1}, {1, 3}}, {{0, 40}}};
  std::vector<std::vector<int32_t>> tokens;
  for (const auto& p : prefill) tokens.push_back(test::random_ids(p.back().first + p.back().second, config_.vocab_size));
  std::vector<int> sf, sk;
  for (size_t i = 0; i < tokens.size(); ++i) {
    sf.push_back(freeing->create_sequence());
    sk.push_back(keeping->create_sequence());
  }
  auto run_both = [&](const Batch& bf, const Batch& bk) {
    const StepOutput of = freeing->step(bf), ok = keeping->step(bk);
    ASSERT_TRUE(same_bits(of.logits, ok.logits)) << "the freeing engine's logits differ";
    for (size_t i = 0; i < tokens.size(); ++i) {
      const int len = freeing->sequence_length(sf[i]);
      EXPECT_LE(freeing->held_blocks(sf[i]), held_bound()) << "sequence " << i << " at length " << len;
      // Exactly the blocks from the one holding position len - W + 1 on.
      EXPECT_EQ(freeing->held_blocks(sf[i]), freeing->kv().blocks_for(len) - std::max(0, len - kWindow + 1) / kBlock);
      EXPECT_EQ(keeping->held_blocks(sk[i]), freeing->kv().blocks_for(len)) << "the keeping engine frees nothing";
    }
  };
  // The same row for sequence i in both engines' batches.
  auto add_row = [&](Batch& bf, Batch& bk, size_t i, std::span<const int32_t> row_tokens) {
    StepRow r;
    r.tokens = row_tokens;
    r.logits = true;
    r.seq = sf[i];
    bf.rows.push_back(r);
    r.seq = sk[i];
    bk.rows.push_back(r);
  };
  for (size_t piece = 0; piece < 2; ++piece) {
    Batch bf, bk;
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (piece >= prefill[i].size()) continue;
      const auto [start, n] = prefill[i][piece];
      add_row(bf, bk, i, std::span<const int32_t>(tokens[i].data() + start, n));
    }
    run_both(bf, bk);
  }
  const int decode_steps = 6 * kWindow;
  for (int step = 0; step < decode_steps; ++step) {
    Batch bf, bk;
    std::vector<int32_t> next(tokens.size());
    for (size_t i = 0; i < tokens.size(); ++i) next[i] = test::random_ids(1, config_.vocab_size)[0];
    for (size_t i = 0; i < tokens.size(); ++i) add_row(bf, bk, i, std::span<const int32_t>(&next[i], 1));
    run_both(bf, bk);
    if (HasFatalFailure()) return;
  }
  const int64_t len0 = freeing->sequence_length(sf[0]);
  EXPECT_GT(freeing->kv().blocks_for(len0), 4 * held_bound()) << "the run must be several windows long";
  EXPECT_LE(freeing->kv().used_blocks(), static_cast<int64_t>(tokens.size()) * held_bound());
  // Truncating into the freed positions is refused; to 0 (a fresh start) it is not.
  EXPECT_THROW(freeing->truncate_sequence(sf[0], static_cast<int>(len0) - 2 * kWindow), Error);
  EXPECT_NO_THROW(freeing->truncate_sequence(sf[0], static_cast<int>(len0) - 1));
  EXPECT_NO_THROW(freeing->truncate_sequence(sf[0], 0));
  for (int s : sf) freeing->release_sequence(s);
  EXPECT_EQ(freeing->kv().used_blocks(), 0);
  EXPECT_NO_THROW(freeing->kv().check_invariants());
}

TEST_F(WindowBlocks, AModelWithAFullAttentionLayerFreesNothing) {
  ModelConfig mixed = config_;
  mixed.layer_windows[1] = 0;  // Gemma's local and global layers
  auto e = engine(true, 4096, &mixed);
  EXPECT_EQ(e->window_freeing(), 0);
  const int seq = e->create_sequence();
  const auto ids = test::random_ids(8 * kWindow, mixed.vocab_size);
  Batch b;
  StepRow r;
  r.seq = seq;
  r.tokens = ids;
  b.rows.push_back(r);
  e->step(b);
  EXPECT_EQ(e->held_blocks(seq), e->kv().blocks_for(8 * kWindow));
  EXPECT_EQ(e->kv().used_blocks(), e->kv().blocks_for(8 * kWindow));
}

TEST_F(WindowBlocks, APrefixCacheHitOnAFreedChainGivesTheSameLogits) {
  // A caching sequence computes a prompt several windows long and lets go of its beginning as it
  // goes; after it ends, a second one with the same beginning maps the chain (or what eviction left
  // of it) and must continue exactly as an engine that recomputes everything.
  for (const int64_t pool : {int64_t{4096}, int64_t{12 * kBlock}}) {
    SCOPED_TRACE(testing::Message() << "pool of " << pool << " tokens");
    auto e = engine(true, pool);
    auto ref = engine(false);
    const auto prompt = test::random_ids(9 * kWindow, config_.vocab_size);
    const int a = e->create_sequence();
    ASSERT_EQ(e->map_cached_prefix(a, prompt), 0);
    for (size_t done = 0; done < prompt.size();) {
      const size_t n = std::min<size_t>(13, prompt.size() - done);
      Batch b;
      StepRow r;
      r.seq = a;
      r.tokens = std::span<const int32_t>(prompt.data() + done, n);
      b.rows.push_back(r);
      ASSERT_TRUE(e->reserve(a, static_cast<int>(done + n)));
      e->step(b);
      done += n;
      EXPECT_LE(e->held_blocks(a), held_bound());
    }
    EXPECT_NO_THROW(e->kv().check_invariants());
    e->release_sequence(a);
    EXPECT_NO_THROW(e->kv().check_invariants());
    // The same prompt plus a different tail.
    std::vector<int32_t> second = prompt;
    for (int32_t t : test::random_ids(2 * kWindow, config_.vocab_size)) second.push_back(t);
    const int b = e->create_sequence();
    const int cached = e->map_cached_prefix(b, second);
    if (pool == 4096) EXPECT_EQ(cached, static_cast<int>(prompt.size()) / kBlock * kBlock) << "nothing was evicted";
    EXPECT_LE(e->held_blocks(b), held_bound()) << "mapping lets go of the blocks before the window at once";
    EXPECT_NO_THROW(e->kv().check_invariants());
    const int rb = ref->create_sequence();
    Batch head;
    StepRow r0;
    r0.seq = rb;
    r0.tokens = std::span<const int32_t>(second.data(), static_cast<size_t>(cached));
    head.rows.push_back(r0);
    if (cached > 0) ref->step(head);
    for (size_t pos = static_cast<size_t>(cached); pos < second.size(); ++pos) {
      StepRow r;
      r.tokens = std::span<const int32_t>(&second[pos], 1);
      r.logits = true;
      Batch bf, bk;
      r.seq = b;
      bf.rows.push_back(r);
      r.seq = rb;
      bk.rows.push_back(r);
      ASSERT_TRUE(same_bits(e->step(bf).logits, ref->step(bk).logits)) << "position " << pos;
      EXPECT_LE(e->held_blocks(b), held_bound());
    }
    e->release_sequence(b);
    EXPECT_NO_THROW(e->kv().check_invariants());
    EXPECT_EQ(e->kv().used_blocks(), 0);
  }
}

// The scheduler with a windowed model: the default model's tokenizer, a tiny random windowed model
// of its vocabulary.
class WindowScheduler : public WindowBlocks {
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
    config_ = test::tiny("llama", 16);
    config_.vocab_size = model_->config().vocab_size;
    config_.layer_windows.assign(static_cast<size_t>(config_.n_layers), kWindow);
    weights_ = test::random_weights(config_);
  }
  std::vector<GenerationResult> run(Engine& e, const std::vector<GenerationRequest>& reqs, SchedulerStats* st,
                                    int64_t* peak_used) {
    SchedulerOptions o;
    o.max_num_seqs = 6;
    o.max_batched_tokens = 48;
    Scheduler s(e, *model_->tokenizer, o);
    std::map<uint64_t, GenerationResult> done;
    std::vector<uint64_t> ids;
    for (const auto& r : reqs) {
      GenerationCallbacks cb;
      cb.on_finish = [&](const GenerationResult& g) { done[g.id] = g; };
      ids.push_back(s.submit(r, cb));
    }
    *peak_used = 0;
    while (!s.idle()) {
      s.step();
      *peak_used = std::max(*peak_used, e.kv().used_blocks());
      EXPECT_NO_THROW(e.kv().check_invariants());
    }
    *st = s.stats();
    std::vector<GenerationResult> out;
    for (uint64_t id : ids) out.push_back(done[id]);
    EXPECT_EQ(e.kv().used_blocks(), 0);
    return out;
  }
  static LoadedModel* model_;
};
LoadedModel* WindowScheduler::model_ = nullptr;

TEST_F(WindowScheduler, OutputsEqualAKeepingEngineInAPoolSmallerThanOneRequest) {
  // Short prompts sharing a block (prefix cache hits) admitted by their window's bound while they
  // hold little, so that growing past the window they run the small pool out and preempt; they run
  // far past the window, each longer than the whole pool. The roomy engine that keeps every
  // position gives the same tokens.
  const auto shared = test::random_ids(kBlock, config_.vocab_size);
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 8; ++i) {
    GenerationRequest r;
    r.prompt = shared;
    for (int32_t t : test::random_ids(1 + i % 5, config_.vocab_size)) r.prompt.push_back(t);
    r.max_tokens = 6 * kWindow + 3 * i;
    r.sampling.temperature = i % 2 ? 0.8f : 0.f;
    r.sampling.seed = 100 + i;
    r.ignore_eos = true;
    reqs.push_back(r);
  }
  const int64_t small_pool = 3 * held_bound() * kBlock;  // three windowed sequences at once
  ASSERT_LT(small_pool, static_cast<int64_t>(reqs[0].prompt.size()) + reqs[0].max_tokens)
      << "each request alone is longer than the whole small pool";
  auto small = engine(true, small_pool);
  auto roomy = engine(false, 8192);
  SchedulerStats st_small, st_roomy;
  int64_t peak_small = 0, peak_roomy = 0;
  const auto a = run(*small, reqs, &st_small, &peak_small);
  const auto b = run(*roomy, reqs, &st_roomy, &peak_roomy);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(a[i].finish_reason, "length") << a[i].error;
    EXPECT_EQ(a[i].token_ids, b[i].token_ids) << "request " << i;
  }
  EXPECT_GT(st_small.preemptions, 0u) << "the small pool must have preempted (recompute path tested)";
  EXPECT_GT(st_small.prefix_cache_hits, 0u);
  EXPECT_LE(peak_small, small->kv().num_blocks());
  EXPECT_GT(peak_roomy, small->kv().num_blocks()) << "without freeing the same requests need more than the small pool";
}

}  // namespace
}  // namespace fdpp

namespace fdpp {
namespace {

// The tiny recipes the GPU suite compares with the CPU engine (tests/gpu/test_cuda_engine.cpp,
// CudaRecipes): Gemma 2 and 3 and a model whose every layer slides are valid and run on the CPU.
TEST(TinyRecipes, GemmaAndSlidingWindowRecipesRunOnTheCpu) {
  for (const char* recipe : {"gemma2", "gemma3", "mistral-window"})
    for (int head_dim : {64, 256}) {
      const ModelConfig c = test::tiny(recipe, head_dim);
      EXPECT_TRUE(c.has_sliding_window()) << recipe;
      const DecoderWeights w = test::random_weights(c);
      const auto ids = test::random_ids(20, c.vocab_size);
      CpuRunner r(c, w, static_cast<int>(ids.size()));
      std::vector<float> logits(ids.size() * c.vocab_size, NAN);
      r.forward(ids, 0, true, logits);
      EXPECT_TRUE(std::all_of(logits.begin(), logits.end(), [](float x) { return std::isfinite(x); })) << recipe;
      if (c.final_softcap > 0)
        EXPECT_TRUE(std::all_of(logits.begin(), logits.end(), [&](float x) { return std::fabs(x) <= c.final_softcap; }))
            << recipe;
    }
}

}  // namespace
}  // namespace fdpp
