// The batched step and the scheduler on the CPU engine: a step mixing prefill chunks and decode rows
// gives each sequence exactly what it gets alone; sampling depends on (seed, token index) only;
// the KV allocator admits or refuses before a step; the scheduler's continuous batching (chunked
// prefill, preemption by recompute, cancellation, stop strings, a full queue) changes no output.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <regex>

#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_engine.h"
#include "backend/cpu/cpu_runner.h"
#include "backend/cpu/ops.h"
#include "core/half.h"
#include "engine/generate.h"
#include "engine/kv_blocks.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "model/model_loader.h"
#include "runtime/backend_select.h"
#include "test_util.h"
#include "tiny_model.h"

namespace fdpp {
namespace {

TEST(KvBlockAllocator, GrowsShrinksAndRefusesWithoutTakingAnything) {
  KvBlockAllocator kv(5, 16);
  std::vector<int32_t> a, b;
  EXPECT_TRUE(kv.grow(a, 33));  // 3 blocks
  EXPECT_EQ(a.size(), 3u);
  EXPECT_EQ(kv.free_blocks(), 2);
  EXPECT_FALSE(kv.can_grow(b, 48));
  EXPECT_FALSE(kv.grow(b, 48));  // needs 3, 2 free
  EXPECT_TRUE(b.empty());
  EXPECT_EQ(kv.free_blocks(), 2);
  EXPECT_TRUE(kv.grow(b, 32));
  EXPECT_EQ(kv.free_blocks(), 0);
  kv.shrink(a, 16);  // keeps one block
  EXPECT_EQ(a.size(), 1u);
  EXPECT_EQ(kv.free_blocks(), 2);
  kv.shrink(a, 0);
  kv.shrink(b, 0);
  EXPECT_EQ(kv.free_blocks(), 5);
  std::vector<int32_t> all;
  EXPECT_TRUE(kv.grow(all, 80));
  std::sort(all.begin(), all.end());
  EXPECT_EQ(all, (std::vector<int32_t>{0, 1, 2, 3, 4}));  // every block handed out once
  EXPECT_THROW(KvBlockAllocator(4, 12), Error);           // not a power of two
}

TEST(Sampler, KeyedDrawsDependOnSeedAndIndexOnly) {
  // Philox known-answer: Random123's test vector for philox4x32-10 with counter 0 and key 0 is
  // {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}: bits (x >> 5) << 26 | (y >> 6).
  const uint64_t bits = (static_cast<uint64_t>(0x6627e8d5u >> 5) << 26) | (0xe169c58du >> 6);
  EXPECT_EQ(keyed_uniform(0, 0), static_cast<double>(bits) * 0x1.0p-53);
  EXPECT_EQ(keyed_uniform(7, 3), keyed_uniform(7, 3));
  EXPECT_NE(keyed_uniform(7, 3), keyed_uniform(7, 4));
  EXPECT_NE(keyed_uniform(7, 3), keyed_uniform(8, 3));
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0;
  p.seed = 11;
  const auto logits = test::random_vector(300, 0.5f);
  Sampler s1(p), s2(p);
  for (uint64_t i = 0; i < 32; ++i) EXPECT_EQ(s1.sample(logits, {}, i), s2.sample(logits, {}, i));
}

class EngineStep : public ::testing::Test {
 protected:
  void SetUp() override {
    config_ = test::tiny("llama", 16);
    weights_ = test::random_weights(config_);
  }
  std::unique_ptr<CpuEngine> engine(int rows = 8, int64_t kv_tokens = 0, int max_context = 256, bool f16_cache = false) {
    EngineLimits l;
    l.max_context = max_context;
    l.max_step_rows = rows;
    l.max_step_tokens = 512;
    l.kv_cache_tokens = kv_tokens;
    return std::make_unique<CpuEngine>(config_, weights_, l, f16_cache);
  }
  // Logits of every position of `ids`, computed in one pass by a fresh runner.
  std::vector<float> reference(const std::vector<int32_t>& ids) {
    CpuRunner r(config_, weights_, static_cast<int>(ids.size()));
    std::vector<float> out(ids.size() * config_.vocab_size);
    r.forward(ids, 0, true, out);
    return out;
  }
  std::span<const float> row(const std::vector<float>& all, size_t t) const {
    return std::span<const float>(all.data() + t * config_.vocab_size, config_.vocab_size);
  }
  ModelConfig config_;
  DecoderWeights weights_;
};

// The f16 KV cache (--kv-cache-dtype f16): rows convert to fp16 and back exactly as the scalar
// conversions do (round to nearest even, subnormals, infinities), and a prefill chunk plus decode
// rows give logits close to the fp32 cache's: only K and V are rounded.
TEST_F(EngineStep, F16CacheStaysCloseToTheFp32Cache) {
  std::vector<float> x = test::random_vector(1000, 3.0f);
  x[3] = 1e-6f;  // a subnormal half
  x[5] = 7e4f;   // beyond fp16: infinity
  x[7] = -0.f;
  std::vector<uint16_t> h(x.size());
  f32_to_fp16_row(x.data(), h.data(), static_cast<int64_t>(x.size()));
  std::vector<float> back(x.size());
  fp16_to_f32_row(h.data(), back.data(), static_cast<int64_t>(h.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(h[i], f32_to_fp16(x[i])) << i;
    ASSERT_EQ(back[i], fp16_to_f32(h[i])) << i;
  }
  const auto a = test::random_ids(40, config_.vocab_size);
  auto run = [&](bool f16) {
    auto e = engine(4, 0, 256, f16);
    EXPECT_EQ(e->f16_cache(), f16);
    const int s = e->create_sequence();
    StepRow r;
    r.seq = s;
    r.tokens = a;
    r.logits = true;
    std::vector<float> logits = e->step(Batch{{r}}).logits;
    for (int t = 0; t < 6; ++t) {
      const int32_t next[] = {static_cast<int32_t>(7 + 11 * t)};
      r.tokens = next;
      const std::vector<float> l = e->step(Batch{{r}}).logits;
      logits.insert(logits.end(), l.begin(), l.end());
    }
    return logits;
  };
  const auto f32 = run(false), f16 = run(true);
  EXPECT_NE(f32, f16) << "the f16 cache rounds K and V";
  EXPECT_LE(test::nmse(f16, f32), 1e-5);
}

// --kv-cache-dtype fp8 is the CUDA backend's e4m3 cache: the CPU backend refuses it naming the
// option (reached with --device auto on a machine without a GPU; --device cpu fails earlier, in
// EngineArgs::check), for the engine and the one-sequence runner alike.
TEST_F(EngineStep, Fp8CacheIsRefusedByTheCpuBackendNamingTheOption) {
  RunnerOptions o;
  o.device = Device::Cpu;
  o.kv_cache_dtype = "fp8";
  EngineLimits l;
  l.max_context = 128;
  l.max_step_rows = 2;
  l.max_step_tokens = 64;
  for (const std::string& e : {test::error_of([&] { make_engine(config_, weights_, o, l); }),
                               test::error_of([&] { make_runner(config_, weights_, 128, o); })}) {
    EXPECT_NE(e.find("--kv-cache-dtype fp8"), std::string::npos) << e;
    EXPECT_NE(e.find("CPU backend"), std::string::npos) << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  }
  o.kv_cache_dtype = "f16";  // the CPU's own half-size cache still runs
  EXPECT_NO_THROW(make_engine(config_, weights_, o, l));
}

TEST_F(EngineStep, MixedChunksAndDecodeRowsEqualEachSequenceAlone) {
  auto e = engine();
  std::vector<std::vector<int32_t>> text;
  for (int n : {37, 9, 64, 1}) text.push_back(test::random_ids(n + 6, config_.vocab_size));
  std::vector<int> seq;
  for (size_t i = 0; i < text.size(); ++i) seq.push_back(e->create_sequence());
  // Step plan per sequence: (start, n) pieces. Chunk boundaries fall anywhere; decode rows mix in.
  std::vector<std::vector<std::pair<int, int>>> pieces = {
      {{0, 5}, {5, 32}, {37, 1}, {38, 1}, {39, 3}, {42, 1}},
      {{0, 9}, {9, 1}, {10, 1}, {11, 1}, {12, 1}, {13, 2}},
      {{0, 1}, {1, 63}, {64, 1}, {65, 5}, {70, 0}, {70, 0}},
      {{0, 1}, {1, 1}, {2, 1}, {3, 1}, {4, 3}, {7, 0}}};
  std::vector<std::vector<float>> ref;
  for (auto& t : text) ref.push_back(reference(t));
  for (int step = 0; step < 6; ++step) {
    Batch b;
    std::vector<int> who;
    for (size_t i = 0; i < text.size(); ++i) {
      auto [start, n] = pieces[i][step];
      if (n == 0) continue;
      ASSERT_EQ(e->sequence_length(seq[i]), start);
      StepRow r;
      r.seq = seq[i];
      r.tokens = std::span<const int32_t>(text[i].data() + start, n);
      r.logits = true;
      b.rows.push_back(r);
      who.push_back(static_cast<int>(i));
    }
    // Rows in a different order each step: the batch slot must not matter.
    if (step % 2) {
      std::reverse(b.rows.begin(), b.rows.end());
      std::reverse(who.begin(), who.end());
    }
    StepOutput out = e->step(b);
    ASSERT_EQ(out.logits.size(), b.rows.size() * config_.vocab_size);
    for (size_t k = 0; k < who.size(); ++k) {
      const int i = who[k];
      const size_t last = pieces[i][step].first + pieces[i][step].second - 1;
      std::span<const float> got(out.logits.data() + k * config_.vocab_size, config_.vocab_size);
      EXPECT_LE(test::nmse(got, row(ref[i], last)), 1e-10) << "sequence " << i << " step " << step;
    }
  }
}

// step() in halves (what the scheduler does to render text while the device computes): one step
// at a time, the sequences advanced at begin_step, a sequence released in between gives its blocks
// back at once, and the other row's output is that of step().
TEST_F(EngineStep, BeginAndEndStepAroundAReleasedSequence) {
  auto e = engine();
  const auto a = test::random_ids(20, config_.vocab_size), b = test::random_ids(12, config_.vocab_size);
  const int sa = e->create_sequence(), sb = e->create_sequence();
  StepRow ra, rb;
  ra.seq = sa;
  ra.tokens = a;
  ra.logits = true;
  rb.seq = sb;
  rb.tokens = b;
  rb.sample = true;
  EXPECT_NE(test::error_of([&] { e->end_step(); }).find("no step was begun"), std::string::npos);
  const int64_t free0 = e->kv().free_blocks();
  e->begin_step(Batch{{ra, rb}});
  EXPECT_TRUE(e->step_in_flight());
  EXPECT_EQ(e->sequence_length(sa), 20);
  EXPECT_NE(test::error_of([&] { e->step(Batch{{ra}}); }).find("has not ended"), std::string::npos);
  e->release_sequence(sb);
  EXPECT_EQ(e->kv().free_blocks(), free0 - e->kv().blocks_for(20));
  const StepOutput out = e->end_step();
  EXPECT_FALSE(e->step_in_flight());
  ASSERT_EQ(out.tokens.size(), 2u);
  EXPECT_GE(out.tokens[1], 0);
  EXPECT_LE(test::nmse(out.logits, row(reference(a), 19)), 1e-10);
}

TEST_F(EngineStep, AllLogitsRowsAndSamplingRowsMix) {
  auto e = engine();
  const auto a = test::random_ids(20, config_.vocab_size), b = test::random_ids(7, config_.vocab_size);
  const auto ref_a = reference(a);
  Batch batch;
  StepRow ra;
  ra.seq = e->create_sequence();
  ra.tokens = a;
  ra.all_logits = true;
  StepRow rb;
  rb.seq = e->create_sequence();
  rb.tokens = b;
  rb.sample = true;
  rb.sampling.temperature = 0;
  batch.rows = {rb, ra};
  StepOutput out = e->step(batch);
  ASSERT_EQ(out.logits.size(), a.size() * config_.vocab_size);
  EXPECT_LE(test::nmse(out.logits, ref_a), 1e-10);
  const auto ref_b = reference(b);
  EXPECT_EQ(out.tokens[0], argmax(row(ref_b, b.size() - 1)));
  EXPECT_EQ(out.tokens[1], -1);
}

TEST_F(EngineStep, BadBatchesThrowBeforeAnythingChanges) {
  auto e = engine(4, /*kv_tokens=*/64, /*max_context=*/64);
  const int s = e->create_sequence();
  const auto ids = test::random_ids(40, config_.vocab_size);
  auto expect_unchanged = [&](Batch b, const std::string& what) {
    const int64_t free0 = e->kv().free_blocks();
    const int len0 = e->sequence_length(s);
    const std::string msg = test::error_of([&] { e->step(b); });
    EXPECT_NE(msg.find(what), std::string::npos) << msg;
    EXPECT_EQ(e->kv().free_blocks(), free0);
    EXPECT_EQ(e->sequence_length(s), len0);
  };
  StepRow r;
  r.seq = s;
  r.tokens = ids;
  expect_unchanged(Batch{{r, r}}, "appears twice");
  StepRow empty = r;
  empty.tokens = {};
  expect_unchanged(Batch{{empty}}, "no tokens");
  std::vector<int32_t> bad{1, config_.vocab_size};
  StepRow oov = r;
  oov.tokens = bad;
  expect_unchanged(Batch{{oov}}, "out of range");
  StepRow ghost = r;
  ghost.seq = 99;
  expect_unchanged(Batch{{ghost}}, "no sequence");
  ASSERT_NO_THROW(e->step(Batch{{r}}));  // 40 tokens: 3 of 4 blocks
  StepRow more = r;
  more.tokens = std::span<const int32_t>(ids.data(), 30);
  expect_unchanged(Batch{{more}}, "context size");  // 70 > 64
  const int s2 = e->create_sequence();
  StepRow other = r;
  other.seq = s2;
  other.tokens = std::span<const int32_t>(ids.data(), 20);  // 2 blocks, 1 free
  const int64_t free0 = e->kv().free_blocks();
  EXPECT_FALSE(e->can_reserve(s2, 20));
  EXPECT_FALSE(e->reserve(s2, 20));
  EXPECT_EQ(e->kv().free_blocks(), free0);
  EXPECT_NE(test::error_of([&] { e->step(Batch{{other}}); }).find("KV cache full"), std::string::npos);
  e->release_sequence(s);
  EXPECT_TRUE(e->reserve(s2, 20));
  EXPECT_NO_THROW(e->step(Batch{{other}}));
}

// max_logit_rows bounds the rows of logits a step computes, head_rows's count: a sampling row takes
// one though its logits are not returned, as on the GPU, whose head buffers it sizes.
TEST_F(EngineStep, LogitRowsCountSamplingRows) {
  EngineLimits l;
  l.max_context = 256;
  l.max_step_rows = 8;
  l.max_step_tokens = 512;
  l.max_logit_rows = 4;
  CpuEngine e(config_, weights_, l);
  const auto ids = test::random_ids(3, config_.vocab_size);
  std::vector<StepRow> rows(3);
  for (StepRow& r : rows) {
    r.seq = e.create_sequence();
    r.tokens = ids;
    r.sample = true;
    r.sampling.temperature = 0;
  }
  rows[2].sample = false;
  rows[2].all_logits = true;  // 3 rows of logits, and 2 sampled: 5 > 4
  const std::string msg = test::error_of([&] { e.step(Batch{rows}); });
  EXPECT_NE(msg.find("5 rows of logits"), std::string::npos) << msg;
  EXPECT_EQ(head_rows(rows[0]), 1);
  EXPECT_EQ(head_rows(rows[2]), 3);
  rows[2].all_logits = false;
  rows[2].logits = true;  // 1 + 2 = 3
  StepOutput out;
  ASSERT_NO_THROW(out = e.step(Batch{rows}));
  EXPECT_EQ(out.logits.size(), static_cast<size_t>(config_.vocab_size));
  StepRow idle = rows[0];
  idle.sample = false;
  EXPECT_EQ(head_rows(idle), 0);
}

// The scheduler needs a tokenizer: the default model's, with a tiny random model of its vocabulary.
class SchedulerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string path = test::default_model_or_empty();
    if (path.empty()) return;
    model_ = new LoadedModel(load_model(path));
    config_ = new ModelConfig(test::tiny("llama", 16));
    config_->vocab_size = model_->config().vocab_size;
    config_->max_context = 512;
    weights_ = new DecoderWeights(test::random_weights(*config_));
  }
  static void TearDownTestSuite() {
    delete weights_;
    delete config_;
    delete model_;
  }
  void SetUp() override {
    if (model_ == nullptr) GTEST_SKIP() << "default model not fetched (scripts/fetch-default-model.sh)";
  }
  static std::unique_ptr<CpuEngine> engine(int rows, int64_t kv_tokens, int step_tokens = 64) {
    EngineLimits l;
    l.max_context = config_->max_context;
    l.max_step_rows = rows;
    l.max_step_tokens = step_tokens;
    l.kv_cache_tokens = kv_tokens;
    return std::make_unique<CpuEngine>(*config_, *weights_, l);
  }
  static GenerationRequest request(int prompt_len, int max_tokens, float temperature, uint64_t seed) {
    GenerationRequest r;
    r.prompt = test::random_ids(prompt_len, config_->vocab_size);
    r.max_tokens = max_tokens;
    r.sampling.temperature = temperature;
    r.sampling.seed = seed;
    r.sampling.repeat_penalty = 1.1f;
    r.ignore_eos = true;
    return r;
  }
  // Runs requests through a scheduler; returns the results by submission order.
  static std::vector<GenerationResult> run(Engine& e, const std::vector<GenerationRequest>& reqs,
                                           const SchedulerOptions& o, SchedulerStats* stats = nullptr) {
    Scheduler s(e, *model_->tokenizer, o);
    std::map<uint64_t, GenerationResult> done;
    std::map<uint64_t, std::string> streamed;
    std::vector<uint64_t> ids;
    for (const auto& r : reqs) {
      GenerationCallbacks cb;
      cb.on_delta = [&](uint64_t id, std::string_view t, std::span<const int32_t>, std::span<const TokenLogprobs>) { streamed[id] += t; };
      cb.on_finish = [&](const GenerationResult& g) { done[g.id] = g; };
      ids.push_back(s.submit(r, cb));
    }
    s.run_until_idle();
    if (stats) *stats = s.stats();
    std::vector<GenerationResult> out;
    for (uint64_t id : ids) {
      EXPECT_EQ(streamed[id], done[id].text) << "the deltas join to the text";
      out.push_back(done[id]);
    }
    EXPECT_EQ(e.kv().used_blocks(), 0) << "every block is free when the scheduler is idle";
    return out;
  }
  // Expects every run's text, tokens, finish reasons and stop strings to be the reference's;
  // returns how many of the reference's requests ended with "stop".
  static int expect_same_results(const std::vector<GenerationResult>& reference,
                                 std::initializer_list<const std::vector<GenerationResult>*> runs) {
    int stopped = 0;
    for (size_t i = 0; i < reference.size(); ++i) {
      stopped += reference[i].finish_reason == "stop";
      for (const auto* run : runs) {
        const GenerationResult& r = (*run)[i];
        EXPECT_EQ(r.text, reference[i].text) << "request " << i;
        EXPECT_EQ(r.token_ids, reference[i].token_ids) << "request " << i;
        EXPECT_EQ(r.finish_reason, reference[i].finish_reason) << "request " << i;
        EXPECT_EQ(r.stop_string, reference[i].stop_string) << "request " << i;
      }
    }
    return stopped;
  }
  // The requests twice, 6 rows and 64 tokens a step: on a cache of kv_tokens that must preempt
  // (asserted), and on a roomy one. Returns {squeezed, roomy} outputs.
  static std::pair<std::vector<GenerationResult>, std::vector<GenerationResult>> squeezed_and_roomy(
      const std::vector<GenerationRequest>& reqs, int64_t kv_tokens) {
    SchedulerOptions o;
    o.max_num_seqs = 6;
    o.max_batched_tokens = 64;
    auto small = engine(6, kv_tokens);
    SchedulerStats st;
    auto squeezed = run(*small, reqs, o, &st);
    EXPECT_GT(st.preemptions, 0u);
    auto roomy = engine(6, 4096);
    return {std::move(squeezed), run(*roomy, reqs, o)};
  }
  static LoadedModel* model_;
  static ModelConfig* config_;
  static DecoderWeights* weights_;
};
LoadedModel* SchedulerTest::model_ = nullptr;
ModelConfig* SchedulerTest::config_ = nullptr;
DecoderWeights* SchedulerTest::weights_ = nullptr;

// An engine without a model, for the scheduler's own logic: a sampling row's token is a hash of its
// last token and position (so a request recomputed after preemption draws the same tokens), the
// first its mask allows from there on. It reports its steps as computed at once, queued (text
// rendered while the next step computes) or overlapped (the next step begun while one is in
// flight, continuing with the tokens it draws, as the CUDA engine does on the device).
enum class StepMode { AtOnce, Queued, Overlapped };
class ScriptedEngine final : public Engine {
 public:
  ScriptedEngine(const ModelConfig& c, int rows, int64_t kv_tokens, StepMode mode) : config_(c), mode_(mode) {
    EngineLimits l;
    l.max_context = c.max_context;
    l.max_step_rows = rows;
    l.max_step_tokens = 64;
    l.kv_cache_tokens = kv_tokens;
    init_engine(l);
  }
  ScriptedEngine(const ModelConfig& c, int rows, int64_t kv_tokens, bool queued)
      : ScriptedEngine(c, rows, kv_tokens, queued ? StepMode::Queued : StepMode::AtOnce) {}
  const ModelConfig& config() const override { return config_; }
  bool queues_steps() const override { return mode_ != StepMode::AtOnce; }
  bool overlaps_steps() const override { return mode_ == StepMode::Overlapped; }
  int pending_rows = 0;  // rows that continued with a token still being drawn

 private:
  void run_step(std::span<const RowPlan> rows, int64_t, StepOutput& out) override {
    std::vector<std::pair<int, int32_t>> drawn;
    for (size_t i = 0; i < rows.size(); ++i) {
      const StepRow& r = *rows[i].row;
      int32_t last = r.tokens.back();
      if (last == kPendingToken) {
        last = last_drawn_.at(static_cast<size_t>(r.seq));
        ++pending_rows;
      }
      if (!r.sample) continue;
      const uint64_t h = (static_cast<uint64_t>(last) + 1) * 0x9E3779B97F4A7C15ull ^
                         static_cast<uint64_t>(rows[i].start + static_cast<int>(r.tokens.size()));
      int32_t t = static_cast<int32_t>((h >> 17) % static_cast<uint64_t>(config_.vocab_size));
      if (!r.allowed_tokens.empty())
        for (int k = 0; k < config_.vocab_size; ++k) {
          const int32_t id = (t + k) % config_.vocab_size;
          if (r.allowed_tokens[static_cast<size_t>(id) / 32] >> (id % 32) & 1u) {
            t = id;
            break;
          }
        }
      out.tokens[i] = t;
      drawn.emplace_back(r.seq, t);
    }
    // Read by the next step's pending rows only after this step's own rows have read theirs.
    for (const auto& [seq, t] : drawn) {
      if (static_cast<size_t>(seq) >= last_drawn_.size()) last_drawn_.resize(static_cast<size_t>(seq) + 1, -1);
      last_drawn_[static_cast<size_t>(seq)] = t;
    }
  }
  ModelConfig config_;
  StepMode mode_;
  std::vector<int32_t> last_drawn_;
};

// Text rendered while a queued step computes (the GPU's way) equals text rendered at the end of
// each step: the same text, tokens and finish reasons, stop strings found a step later included
// (their request's row in that step is dropped), with and without preemption.
TEST_F(SchedulerTest, TextRenderedWhileTheNextStepComputesIsTheSame) {
  SchedulerOptions o;
  o.max_num_seqs = 6;
  o.max_batched_tokens = 64;
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 10; ++i) reqs.push_back(request(20 + 3 * i, 30 + 2 * i, 0.f, static_cast<uint64_t>(i)));
  ScriptedEngine first_engine(*config_, 6, 4096, false);
  const auto first = run(first_engine, reqs, o);
  for (size_t i = 0; i < reqs.size(); i += 2)
    if (first[i].text.size() > 8) reqs[i].stop = {first[i].text.substr(first[i].text.size() / 2, 2)};
  ScriptedEngine at_once(*config_, 6, 4096, false), queued(*config_, 6, 4096, true), squeezed(*config_, 6, 16 * 8, true);
  const auto a = run(at_once, reqs, o), b = run(queued, reqs, o);
  SchedulerStats st;
  const auto c = run(squeezed, reqs, o, &st);
  EXPECT_GT(st.preemptions, 0u);
  const int stopped = expect_same_results(a, {&b, &c});
  EXPECT_GT(stopped, 0) << "no stop string was met: the test checks less than it should";
}

// Steps overlapped (the next one scheduled and begun while one is in flight, its decode rows
// continuing with tokens still being drawn) give what steps one at a time give: the same tokens,
// text, finish reasons and stop strings, with stop strings and end tokens found a step late (the
// row of the step already begun is dropped), prefixes shared through the cache, requests that
// must wait for their tokens on the host (a grammar, a penalty) beside them, and preemption (which
// waits for the step in flight).
TEST_F(SchedulerTest, OverlappedStepsGiveWhatStepsOneAtATimeGive) {
  SchedulerOptions o;
  o.max_num_seqs = 6;
  o.max_batched_tokens = 64;
  std::vector<GenerationRequest> reqs;
  const std::vector<int32_t> shared = test::random_ids(40, config_->vocab_size);
  for (int i = 0; i < 12; ++i) {
    GenerationRequest r = request(20 + 3 * i, 30 + 2 * i, 0.f, static_cast<uint64_t>(i));
    r.sampling.repeat_penalty = 1.0f;
    if (i % 4 == 1) r.prompt.insert(r.prompt.begin(), shared.begin(), shared.end());  // a shared beginning
    if (i % 4 == 3) r.ignore_eos = false;
    reqs.push_back(std::move(r));
  }
  reqs[5].sampling.repeat_penalty = 1.1f;  // its rows wait for their tokens on the host
  reqs[6].grammar = grammar::compile_regex("[0-9]{2}-[a-z]{2,3}");
  reqs[6].ignore_eos = false;
  ScriptedEngine first_engine(*config_, 6, 4096, StepMode::AtOnce);
  const auto first = run(first_engine, reqs, o);
  for (size_t i = 0; i < reqs.size(); i += 2)
    if (i != 6 && first[i].text.size() > 8) reqs[i].stop = {first[i].text.substr(first[i].text.size() / 2, 2)};
  ScriptedEngine at_once(*config_, 6, 4096, StepMode::AtOnce), overlapped(*config_, 6, 4096, StepMode::Overlapped),
      squeezed(*config_, 6, 16 * 12, StepMode::Overlapped);
  const auto a = run(at_once, reqs, o);
  SchedulerStats roomy_stats, squeezed_stats;
  const auto b = run(overlapped, reqs, o, &roomy_stats);
  const auto c = run(squeezed, reqs, o, &squeezed_stats);
  EXPECT_GT(overlapped.pending_rows, 40) << "the steps did not overlap: the test checks less than it should";
  EXPECT_GT(squeezed.pending_rows, 0);
  EXPECT_GT(squeezed_stats.preemptions, 0u);
  EXPECT_GT(roomy_stats.prefix_cache_hits, 0u) << "no prefix was shared: the test checks less than it should";
  const int stopped = expect_same_results(a, {&b, &c});
  EXPECT_GT(stopped, 1) << "too few stop strings were met: the test checks less than it should";
  EXPECT_TRUE(std::regex_match(a[6].text, std::regex("[0-9]{2}-[a-z]{2,3}"))) << a[6].text;
}

// A request cancelled while its rows are in flight ends "cancelled", its blocks come back, and the
// others run on unchanged.
TEST_F(SchedulerTest, CancelWhileAStepIsInFlight) {
  SchedulerOptions o;
  o.max_num_seqs = 4;
  o.max_batched_tokens = 64;
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 4; ++i) {
    reqs.push_back(request(10 + i, 40, 0.f, static_cast<uint64_t>(i)));
    reqs.back().sampling.repeat_penalty = 1.0f;
  }
  ScriptedEngine alone(*config_, 4, 4096, StepMode::AtOnce);
  const auto expected = run(alone, reqs, o);
  ScriptedEngine e(*config_, 4, 4096, StepMode::Overlapped);
  Scheduler s(e, *model_->tokenizer, o);
  std::map<uint64_t, GenerationResult> done;
  std::vector<uint64_t> ids;
  for (const auto& r : reqs) {
    GenerationCallbacks cb;
    cb.on_finish = [&](const GenerationResult& g) { done[g.id] = g; };
    ids.push_back(s.submit(r, cb));
  }
  for (int i = 0; i < 8; ++i) s.step();
  EXPECT_TRUE(e.step_in_flight());
  s.cancel(ids[1]);
  s.run_until_idle();
  EXPECT_FALSE(e.step_in_flight());
  EXPECT_EQ(done[ids[1]].finish_reason, "cancelled");
  EXPECT_LT(done[ids[1]].token_ids.size(), 40u);
  for (size_t i : {0u, 2u, 3u}) EXPECT_EQ(done[ids[i]].token_ids, expected[i].token_ids) << i;
  EXPECT_EQ(e.kv().used_blocks(), 0);
  EXPECT_GT(e.pending_rows, 0);
}

// The engine's side of overlapped steps: a second step only where the engine overlaps them, a
// pending token only for a sequence the step in flight draws for, and a caching sequence's block
// registered in the prefix cache once its drawn token is known.
TEST_F(SchedulerTest, EngineOverlapChecksAndDeferredPrefixBlocks) {
  static constexpr int32_t kPending[1] = {kPendingToken};
  ScriptedEngine queued(*config_, 4, 4096, StepMode::Queued);
  const int q = queued.create_sequence();
  const std::vector<int32_t> prompt = test::random_ids(20, config_->vocab_size);
  Batch first;
  first.rows.push_back(StepRow{q, prompt, false, false, true});
  queued.begin_step(first);
  Batch next;
  next.rows.push_back(StepRow{q, kPending, false, false, true});
  EXPECT_THROW(queued.begin_step(next), Error) << "a queued engine that does not overlap takes one step at a time";
  queued.end_step();
  EXPECT_THROW(queued.step(next), Error) << "no step in flight draws the pending token";

  ScriptedEngine e(*config_, 4, 4096, StepMode::Overlapped);
  const int bs = e.kv().block_size();
  // 2 blocks less one token: the drawn token completes the second block.
  std::vector<int32_t> tokens = test::random_ids(2 * bs - 1, config_->vocab_size);
  const int a = e.create_sequence(), other = e.create_sequence();
  e.map_cached_prefix(a, tokens);
  Batch b1;
  b1.rows.push_back(StepRow{a, tokens, false, false, true});
  b1.rows.push_back(StepRow{other, std::span<const int32_t>(tokens).first(3), false, false, false});
  e.begin_step(b1);
  Batch b2;
  b2.rows.push_back(StepRow{other, kPending, false, false, true});
  EXPECT_THROW(e.begin_step(b2), Error) << "the step in flight draws nothing for `other`";
  b2.rows[0].seq = a;
  e.begin_step(b2);
  EXPECT_EQ(e.steps_in_flight(), 2);
  EXPECT_THROW(e.step(b2), Error);
  EXPECT_EQ(e.kv().cached_blocks(), 1) << "the block with the pending token is not cached yet";
  const StepOutput o1 = e.end_step();
  EXPECT_EQ(e.kv().cached_blocks(), 2) << "cached once its token is drawn";
  std::vector<int32_t> known = tokens;
  known.push_back(o1.tokens[0]);
  known.push_back(0);  // match_prefix leaves the last token to compute
  EXPECT_EQ(e.match_prefix(known).blocks, 2) << "under the hash of the drawn token";
  e.end_step();
  EXPECT_FALSE(e.step_in_flight());
}

// Admission with room kept for the outputs (reserve_growth, the automatic batch): with the ratio
// held at 1, requests whose outputs run to max_tokens never preempt on a cache that makes the plain
// rule preempt, and give the same tokens; with the ratio falling (the default) a preemption puts it
// back, and the tokens are still the same.
TEST_F(SchedulerTest, AdmissionThatKeepsRoomForOutputsDoesNotPreempt) {
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 10; ++i) reqs.push_back(request(20 + 3 * i, 30 + 2 * i, 0.f, static_cast<uint64_t>(i)));
  SchedulerOptions plain;
  plain.max_num_seqs = 6;
  plain.max_batched_tokens = 64;
  const int64_t kv_tokens = 16 * 12;
  ScriptedEngine roomy_engine(*config_, 6, 4096, true), plain_engine(*config_, 6, kv_tokens, true);
  const auto roomy = run(roomy_engine, reqs, plain);
  SchedulerStats st;
  const auto squeezed = run(plain_engine, reqs, plain, &st);
  EXPECT_GT(st.preemptions, 0u) << "the plain rule must preempt on this cache, or the test shows nothing";

  SchedulerOptions held = plain;
  held.reserve_growth = true;
  held.growth_ratio_decay = 0;
  ScriptedEngine held_engine(*config_, 6, kv_tokens, true);
  const auto reserved = run(held_engine, reqs, held, &st);
  EXPECT_EQ(st.preemptions, 0u);
  EXPECT_EQ(st.requests_finished, reqs.size());

  SchedulerOptions falling = plain;
  falling.reserve_growth = true;
  falling.growth_ratio_decay = 0.05;
  falling.growth_ratio_floor = 0.0;
  ScriptedEngine falling_engine(*config_, 6, kv_tokens, true);
  const auto estimated = run(falling_engine, reqs, falling, &st);
  EXPECT_EQ(st.requests_finished, reqs.size());
  EXPECT_GT(st.preemptions, 0u) << "a ratio falling to 0 is the plain rule: it must preempt here";
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(roomy[i].token_ids, squeezed[i].token_ids) << i;
    EXPECT_EQ(roomy[i].token_ids, reserved[i].token_ids) << i;
    EXPECT_EQ(roomy[i].token_ids, estimated[i].token_ids) << i;
    EXPECT_EQ(reserved[i].token_ids.size(), static_cast<size_t>(reqs[i].max_tokens)) << i;
  }
}

TEST_F(SchedulerTest, BatchedRequestsGiveWhatEachGetsAlone) {
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 12; ++i) reqs.push_back(request(5 + 13 * i, 6 + (i % 5) * 4, i % 3 == 0 ? 0.f : 0.9f, 100 + i));
  SchedulerOptions batched;
  batched.max_num_seqs = 8;
  batched.max_batched_tokens = 40;  // prompts of up to 148 tokens go in chunks
  auto e = engine(8, 4096);
  const auto together = run(*e, reqs, batched);
  SchedulerOptions solo_opts;
  solo_opts.max_num_seqs = 1;
  solo_opts.max_batched_tokens = 512;
  for (size_t i = 0; i < reqs.size(); ++i) {
    auto solo_engine = engine(1, 1024, 512);
    const auto solo = run(*solo_engine, {reqs[i]}, solo_opts);
    EXPECT_EQ(together[i].token_ids, solo[0].token_ids) << "request " << i;
    EXPECT_EQ(together[i].token_ids.size(), static_cast<size_t>(reqs[i].max_tokens));
    EXPECT_EQ(together[i].finish_reason, "length");
  }
  // And generate() (one request through the same path) agrees too.
  auto g_engine = engine(1, 1024, 512);
  GenerateOptions go{reqs[1].max_tokens, true, reqs[1].sampling, {}};
  EXPECT_EQ(generate(*g_engine, *model_->tokenizer, reqs[1].prompt, go).tokens, together[1].token_ids);
}

TEST_F(SchedulerTest, PreemptionWhenTheCacheRunsOutChangesNoOutput) {
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 6; ++i) reqs.push_back(request(30 + i, 40, 0.7f, 7 + i));
  // 12 blocks: 6 requests of up to 76 tokens need 30.
  const auto [squeezed, free_run] = squeezed_and_roomy(reqs, 16 * 12);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(squeezed[i].token_ids, free_run[i].token_ids) << "request " << i;
    EXPECT_EQ(squeezed[i].token_ids.size(), 40u);
  }
}

// Structured output through the scheduler, with a random model (whose unconstrained output is
// noise) sampling at temperature 1 under preemption: every request that finishes with "stop" holds
// exactly the format, and a preempted run draws the same tokens.
TEST_F(SchedulerTest, GrammarsHoldUnderSamplingAndPreemption) {
  const std::vector<std::string> choices = {"alpha", "beta", "gamma delta"};
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 6; ++i) {
    GenerationRequest r = request(31, 60, 1.0f, 100 + i);  // the second token opens a third block
    r.ignore_eos = false;
    if (i % 3 == 0) r.grammar = grammar::compile_choice(choices);
    if (i % 3 == 1) r.grammar = grammar::compile_regex("[0-9]{2}-[a-z]{2,3}");
    if (i % 3 == 2)
      r.grammar = grammar::compile_json_schema(R"({"type": "object", "properties": {"ok": {"type": "boolean"},
          "kind": {"enum": ["x", "y"]}}, "required": ["ok", "kind"], "additionalProperties": false})");
    reqs.push_back(std::move(r));
  }
  const auto [squeezed, free_run] = squeezed_and_roomy(reqs, 16 * 6);  // the longest (91 tokens) fits alone
  for (size_t i = 0; i < reqs.size(); ++i) {
    SCOPED_TRACE("request " + std::to_string(i) + ": " + free_run[i].text);
    EXPECT_EQ(squeezed[i].token_ids, free_run[i].token_ids);
    const GenerationResult& r = free_run[i];
    if (i % 3 == 2 && r.finish_reason == "length") continue;  // whitespace may run past 60 tokens
    ASSERT_EQ(r.finish_reason, "stop");
    // An end token only as the last one, where the format may end or go on ("57-dh" or "57-dhx"):
    // where nothing else may follow the request ends without one.
    ASSERT_FALSE(r.token_ids.empty());
    for (size_t k = 0; k + 1 < r.token_ids.size(); ++k)
      EXPECT_FALSE(model_->tokenizer->is_end_of_generation(r.token_ids[k]));
    if (model_->tokenizer->is_end_of_generation(r.token_ids.back())) EXPECT_EQ(i % 3, 1u);
    if (i % 3 == 0) EXPECT_NE(std::find(choices.begin(), choices.end(), r.text), choices.end());
    if (i % 3 == 1) EXPECT_TRUE(std::regex_match(r.text, std::regex("[0-9]{2}-[a-z]{2,3}")));
    if (i % 3 == 2) {
      const auto j = nlohmann::json::parse(r.text);
      EXPECT_TRUE(j.at("ok").is_boolean());
      EXPECT_TRUE(j.at("kind") == "x" || j.at("kind") == "y");
      EXPECT_EQ(j.size(), 2u);
    }
  }
}

TEST_F(SchedulerTest, CancelFreesBlocksAndStopStringsCutTheText) {
  auto e = engine(4, 2048);
  SchedulerOptions o;
  o.max_num_seqs = 4;
  o.max_batched_tokens = 128;
  Scheduler s(e.operator*(), *model_->tokenizer, o);
  GenerationResult cancelled;
  GenerationCallbacks cb;
  cb.on_finish = [&](const GenerationResult& g) { cancelled = g; };
  const uint64_t id = s.submit(request(50, 200, 0.f, 1), cb);
  for (int i = 0; i < 3; ++i) s.step();
  EXPECT_GT(e->kv().used_blocks(), 0);
  s.cancel(id);
  s.step();
  EXPECT_EQ(cancelled.finish_reason, "cancelled");
  EXPECT_EQ(e->kv().used_blocks(), 0);
  EXPECT_TRUE(s.idle());

  // A stop string taken from the middle of a greedy output ends the text just before it.
  GenerationRequest r = request(12, 48, 0.f, 3);
  const auto full = run(*e, {r}, o)[0];
  ASSERT_GT(full.text.size(), 20u);
  const std::string stop = full.text.substr(full.text.size() / 2, 3);
  r.stop = {stop};
  const auto cut = run(*e, {r}, o)[0];
  EXPECT_EQ(cut.finish_reason, "stop");
  EXPECT_EQ(cut.text, full.text.substr(0, full.text.find(stop)));
  // Its tokens end with the one whose text completed the stop string, although that text is
  // rendered while the next step computes: the next step's token for it is dropped.
  {
    StreamingDetokenizer d(*model_->tokenizer);
    std::string text;
    size_t k = 0;
    while (k < full.token_ids.size() && text.find(stop) == std::string::npos) text += d.push(full.token_ids[k++]);
    EXPECT_EQ(cut.token_ids, std::vector<int32_t>(full.token_ids.begin(), full.token_ids.begin() + k));
  }
  EXPECT_EQ(cut.stop_string, stop);  // what ended it (vLLM's stop_reason)
  EXPECT_FALSE(cut.stop_token_id.has_value());
  EXPECT_FALSE(full.stop_string.has_value());  // a "length" names no stop
  EXPECT_FALSE(full.stop_token_id.has_value());

  // A stop token id taken from the same output ends it at that token's first occurrence, even with
  // ignore_eos: the token is kept in token_ids, the text is that of the tokens before it.
  r.stop.clear();
  const int k = static_cast<int>(full.token_ids.size()) / 2;
  const int32_t stop_id = full.token_ids[k];
  const int first =
      static_cast<int>(std::find(full.token_ids.begin(), full.token_ids.end(), stop_id) - full.token_ids.begin());
  r.stop_token_ids = {stop_id};
  const auto by_id = run(*e, {r}, o)[0];
  EXPECT_EQ(by_id.finish_reason, "stop");
  EXPECT_EQ(by_id.stop_token_id, stop_id);
  EXPECT_FALSE(by_id.stop_string.has_value());
  EXPECT_EQ(by_id.token_ids, std::vector<int32_t>(full.token_ids.begin(), full.token_ids.begin() + first + 1));
  // The text is what a client streams: bytes that can never be UTF-8 (a random model writes them)
  // come out as U+FFFD, which tokenizer->decode() would leave raw.
  StreamingDetokenizer streamed(*model_->tokenizer);
  std::string expected;
  for (int i = 0; i < first; ++i) expected += streamed.push(full.token_ids[i]);
  expected += streamed.flush();
  EXPECT_EQ(by_id.text, expected);
}

// Log probabilities follow the tokens (the deltas carry those of their tokens, the result all of
// them and their sum), beside a request that asks for none; min_tokens holds a stop id back (vLLM's
// meaning: nothing stops the request before it).
// prompt_logprobs: each prompt token after the first gets the log probability its position's
// logits give it, as one forward over the prompt computes them, though the prompt is prefilled in
// chunks cut to the engine's logits rows and a request with the same beginning has filled the
// prefix cache; the generated tokens do not change.
TEST_F(SchedulerTest, PromptLogprobsScoreEveryPromptTokenAsOneForwardDoes) {
  EngineLimits l;
  l.max_context = config_->max_context;
  l.max_step_rows = 4;
  l.max_step_tokens = 64;
  l.kv_cache_tokens = 2048;
  l.max_logit_rows = 7;  // the 37-token prompt in chunks of at most 7 scored positions
  CpuEngine e(*config_, *weights_, l);
  SchedulerOptions o;
  o.max_num_seqs = 4;
  o.max_batched_tokens = 64;
  GenerationRequest plain = request(37, 5, 0.f, 1);
  GenerationRequest scored = plain;
  scored.prompt_logprobs = 2;
  GenerationRequest other = request(20, 30, 0.f, 2);  // decode rows beside the scored chunks
  auto results = run(e, {plain, other, scored}, o);
  results.erase(results.begin() + 1);
  EXPECT_TRUE(results[0].prompt_logprobs.empty());
  EXPECT_EQ(results[1].token_ids, results[0].token_ids);
  const std::vector<TokenLogprobs>& got = results[1].prompt_logprobs;
  ASSERT_EQ(got.size(), plain.prompt.size() - 1);
  CpuRunner runner(*config_, *weights_, static_cast<int>(plain.prompt.size()));
  const int vocab = config_->vocab_size;
  std::vector<float> logits(plain.prompt.size() * vocab);
  runner.forward(plain.prompt, 0, true, logits);
  for (size_t t = 0; t + 1 < plain.prompt.size(); ++t) {
    const TokenLogprobs want =
        Sampler::logprobs(std::span<const float>(logits.data() + t * vocab, vocab), plain.prompt[t + 1], 2);
    EXPECT_NEAR(got[t].logprob, want.logprob, 1e-4) << t;
    EXPECT_EQ(got[t].rank, want.rank) << t;
    ASSERT_EQ(got[t].top.size(), 2u);
    EXPECT_EQ(got[t].top[0].id, want.top[0].id) << t;
  }
}

TEST_F(SchedulerTest, LogprobsFollowTheTokensAndMinTokensHoldsStopsBack) {
  auto e = engine(4, 2048);
  SchedulerOptions o;
  o.max_num_seqs = 4;
  o.max_batched_tokens = 128;
  GenerationRequest r = request(12, 24, 0.f, 3);
  r.sampling.repeat_penalty = 1.f;  // greedy on the raw logits: the sampled token is the top logprob
  const auto full = run(*e, {r}, o)[0];
  EXPECT_TRUE(full.logprobs.empty());
  GenerationRequest lp = r;
  lp.sampling.logprobs = 3;
  Scheduler s(*e, *model_->tokenizer, o);
  std::vector<int32_t> streamed_tokens;
  std::vector<TokenLogprobs> streamed;
  GenerationResult got, plain;
  GenerationCallbacks cb;
  cb.on_delta = [&](uint64_t, std::string_view, std::span<const int32_t> t, std::span<const TokenLogprobs> l) {
    streamed_tokens.insert(streamed_tokens.end(), t.begin(), t.end());
    streamed.insert(streamed.end(), l.begin(), l.end());
  };
  cb.on_finish = [&](const GenerationResult& g) { got = g; };
  GenerationCallbacks plain_cb;
  plain_cb.on_finish = [&](const GenerationResult& g) { plain = g; };
  s.submit(lp, cb);
  s.submit(r, plain_cb);
  s.run_until_idle();
  EXPECT_EQ(got.token_ids, full.token_ids);
  EXPECT_EQ(plain.token_ids, full.token_ids);
  EXPECT_TRUE(plain.logprobs.empty());
  ASSERT_EQ(got.logprobs.size(), got.token_ids.size());
  EXPECT_EQ(streamed_tokens, got.token_ids);
  ASSERT_EQ(streamed.size(), got.logprobs.size());
  double sum = 0;
  for (size_t i = 0; i < got.token_ids.size(); ++i) {
    ASSERT_EQ(got.logprobs[i].top.size(), 3u);
    EXPECT_EQ(got.logprobs[i].top[0].id, got.token_ids[i]) << i;
    EXPECT_EQ(got.logprobs[i].rank, 1) << i;
    EXPECT_EQ(streamed[i].logprob, got.logprobs[i].logprob) << i;
    EXPECT_LE(got.logprobs[i].logprob, 0.f);
    sum += got.logprobs[i].logprob;
  }
  EXPECT_DOUBLE_EQ(got.cumulative_logprob, sum);

  // A stop id from the output: alone it ends the request at its first occurrence; with min_tokens
  // past that, it is masked until min_tokens tokens are out and the request runs on.
  const int32_t stop_id = full.token_ids[full.token_ids.size() / 2];
  const size_t first = std::find(full.token_ids.begin(), full.token_ids.end(), stop_id) - full.token_ids.begin();
  GenerationRequest m = r;
  m.stop_token_ids = {stop_id};
  EXPECT_EQ(run(*e, {m}, o)[0].token_ids.size(), first + 1);
  m.sampling.min_tokens = static_cast<int>(first) + 3;
  const auto held = run(*e, {m}, o)[0];
  ASSERT_GE(held.token_ids.size(), first + 3);
  for (size_t i = 0; i < first + 3 - 1; ++i) EXPECT_NE(held.token_ids[i], stop_id) << i;
  EXPECT_EQ(std::vector<int32_t>(held.token_ids.begin(), held.token_ids.begin() + first),
            std::vector<int32_t>(full.token_ids.begin(), full.token_ids.begin() + first));
  m.sampling.min_tokens = m.max_tokens + 1;
  EXPECT_THROW(s.submit(m, {}), Error);
}

TEST_F(SchedulerTest, RejectsWhatCanNeverRunAndAFullQueue) {
  auto e = engine(2, 256);
  SchedulerOptions o;
  o.max_num_seqs = 2;
  o.max_batched_tokens = 64;
  o.max_waiting = 2;
  Scheduler s(*e, *model_->tokenizer, o);
  EXPECT_NE(test::error_of([&] { s.submit(request(0, 4, 0, 1), {}); }).find("empty"), std::string::npos);
  EXPECT_NE(test::error_of([&] { s.submit(request(10, 0, 0, 1), {}); }).find("max_tokens"), std::string::npos);
  EXPECT_NE(test::error_of([&] { s.submit(request(500, 100, 0, 1), {}); }).find("context"), std::string::npos);
  EXPECT_NE(test::error_of([&] { s.submit(request(200, 100, 0, 1), {}); }).find("KV cache"), std::string::npos);
  auto nan = request(10, 4, 0, 1);
  nan.sampling.top_p = 0;
  EXPECT_EQ(test::error_of([&] { s.submit(nan, {}); }), "\"top_p\" 0 must be in (0, 1] (1 = off)");
  auto bad_stop = request(10, 4, 0, 1);
  bad_stop.stop_token_ids = {3, config_->vocab_size};
  EXPECT_EQ(test::error_of([&] { s.submit(bad_stop, {}); }),
            fmt::format("stop token id {} is out of range [0, {})", config_->vocab_size, config_->vocab_size));
  bad_stop.stop_token_ids.assign(65, 3);
  EXPECT_EQ(test::error_of([&] { s.submit(bad_stop, {}); }), "65 stop token ids: at most 64 are supported");
  s.submit(request(10, 4, 0, 1), {});
  s.submit(request(10, 4, 0, 1), {});
  EXPECT_THROW(s.submit(request(10, 4, 0, 1), {}), QueueFullError);
  s.run_until_idle();
  EXPECT_NO_THROW(s.submit(request(10, 4, 0, 1), {}));  // serves again once the queue drains
  s.run_until_idle();
}

}  // namespace
}  // namespace fdpp
