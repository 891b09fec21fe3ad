// The CUDA engine's batched step against the CPU engine: steps mixing prefill chunks (varlen
// tensor-core prefill attention) and decode rows give each sequence the CPU's logits; decode-only
// steps (graph-replayed) too; per-row sampling gives a request the same token alone and in a full
// batch; the scheduler's batched output equals each request alone. Skipped where there is no GPU.
#include <gtest/gtest.h>

#include <map>

#include "backend/cpu/cpu_engine.h"
#include "backend/cuda/cuda_engine.h"
#include "engine/sampler.h"
#include "gpu_test_util.h"
#include "../test_util.h"
#include "../tiny_model.h"

namespace fdpp {
namespace {

#define REQUIRE_GPU() \
  if (!test::gpu_available()) GTEST_SKIP() << "no usable GPU"

struct StepCase {
  std::string recipe;
  int head_dim;
  cuda::DType dtype;
  bool async;
  int prefill_config = -1;  // -1: chosen per step (the engine's default)
  bool fp8_cache = false;   // --kv-cache-dtype fp8: e4m3 K and V (scale 1)
};

class CudaStep : public ::testing::TestWithParam<StepCase> {};

TEST_P(CudaStep, MixedStepsMatchTheCpuEngine) {
  REQUIRE_GPU();
  const auto& p = GetParam();
  ModelConfig c = test::tiny(p.recipe, p.head_dim);
  const DecoderWeights w = test::random_weights(c);
  EngineLimits l;
  l.max_context = c.max_context;
  l.max_step_rows = 8;
  l.max_step_tokens = 512;
  CpuEngine cpu(c, w, l);
  cuda::EngineOptions eo;
  eo.max_batch = 8;
  eo.max_prefill_tokens = 512;
  eo.kv_cache_tokens = 4096;
  eo.attention = p.async ? cuda::AttentionMode::Async : cuda::AttentionMode::Sync;
  eo.prefill_attention_config = p.prefill_config;
  if (p.fp8_cache) eo.kv_quant.dtype = cuda::KvDType::Fp8E4M3;
  cuda::CudaEngine gpu(std::make_shared<const cuda::DeviceModel>(c, w, p.dtype), eo);

  const int S = 6;
  std::vector<std::vector<int32_t>> text;
  for (int i = 0; i < S; ++i) text.push_back(test::random_ids(300, c.vocab_size));
  std::vector<int> cs, gs;
  for (int i = 0; i < S; ++i) {
    cs.push_back(cpu.create_sequence());
    gs.push_back(gpu.create_sequence());
  }
  std::vector<int> len(S, 0);
  // bf16 keeps 8 mantissa bits; an e4m3 cache 3 for K and V (per row; test_cuda_engine.cpp bounds the
  // whole model's logits against the 16-bit cache by 5e-3).
  const double bound = p.fp8_cache ? 1e-2 : p.dtype == cuda::DType::F16 ? 5e-4 : 5e-3;
  // Steps: a mix of chunk lengths (1, odd, > 64) and decode rows, sequences joining late, then
  // decode-only steps (the graph path) and a last mixed one.
  const std::vector<std::vector<int>> plan = {
      {37, 0, 0, 0, 0, 0}, {1, 100, 0, 0, 0, 0}, {1, 1, 65, 3, 0, 0}, {1, 1, 1, 1, 130, 17},
      {1, 1, 1, 1, 1, 1},  {1, 1, 1, 1, 1, 1},   {1, 1, 1, 1, 1, 1},  {5, 1, 1, 64, 1, 1}};
  for (size_t st = 0; st < plan.size(); ++st) {
    Batch cb, gb;
    for (int i = 0; i < S; ++i) {
      if (plan[st][i] == 0) continue;
      StepRow r;
      r.tokens = std::span<const int32_t>(text[i].data() + len[i], plan[st][i]);
      r.logits = true;
      r.seq = cs[i];
      cb.rows.push_back(r);
      r.seq = gs[i];
      gb.rows.push_back(r);
      len[i] += plan[st][i];
    }
    const StepOutput co = cpu.step(cb), go = gpu.step(gb);
    ASSERT_EQ(co.logits.size(), go.logits.size());
    for (size_t k = 0; k < cb.rows.size(); ++k) {
      std::span<const float> a(co.logits.data() + k * c.vocab_size, c.vocab_size),
          b(go.logits.data() + k * c.vocab_size, c.vocab_size);
      const double e = test::nmse(b, a);
      EXPECT_LE(e, bound) << "step " << st << " row " << k << " (" << cb.rows[k].tokens.size() << " tokens)";
      if (e > bound / 10) std::printf("step %zu row %zu: %zu tokens, NMSE %.3e\n", st, k, cb.rows[k].tokens.size(), e);
    }
  }
  for (int i = 0; i < S; ++i) EXPECT_EQ(gpu.sequence_length(gs[i]), len[i]);
}

INSTANTIATE_TEST_SUITE_P(Variants, CudaStep,
                         ::testing::Values(StepCase{"llama", 128, cuda::DType::F16, true},
                                           StepCase{"llama", 64, cuda::DType::BF16, true},
                                           StepCase{"chatglm", 128, cuda::DType::F16, false},
                                           StepCase{"llama-tied", 64, cuda::DType::F16, false},
                                           StepCase{"llama-tied", 64, cuda::DType::F16, false, 0},
                                           StepCase{"opt-postln", 64, cuda::DType::F16, true},
                                           StepCase{"opt-postln", 128, cuda::DType::BF16, false},
                                           StepCase{"llama", 128, cuda::DType::F16, true, 0},
                                           StepCase{"llama", 128, cuda::DType::F16, true, -1, true},
                                           StepCase{"llama", 64, cuda::DType::BF16, false, -1, true},
                                           StepCase{"chatglm", 128, cuda::DType::BF16, true, -1, true}),
                         [](const auto& info) {
                           std::string n = info.param.recipe + "_hd" + std::to_string(info.param.head_dim) +
                                           (info.param.dtype == cuda::DType::F16 ? "_f16" : "_bf16") +
                                           (info.param.async ? "_async" : "_sync") +
                                           (info.param.prefill_config < 0 ? std::string()
                                                                          : "_pc" + std::to_string(info.param.prefill_config)) +
                                           (info.param.fp8_cache ? "_fp8" : "");
                           for (auto& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

// A sampled row's token depends on its seed, its index and its logits only: the same request in
// another batch slot, and beside other requests (other seeds, temperatures, filters, greedy rows),
// draws the same tokens on the device. Between batch sizes the linear layers may pick other kernels
// (heuristic dataflow: GEMV at M = 1, flat GEMM or cuBLASLt above), whose fp16 rounding differs:
// there a request alone and in a batch agree on the logits (NMSE), not always on a sampled token
// whose probability sits at a rounding boundary. (The CPU engine is batch-invariant: its tests
// check alone == batched token for token.)
TEST(CudaStepSampling, ARowDrawsTheSameTokensInAnySlotBesideAnyRequests) {
  REQUIRE_GPU();
  ModelConfig c = test::tiny("llama", 64);
  const DecoderWeights w = test::random_weights(c);
  cuda::EngineOptions eo;
  eo.max_batch = 8;
  eo.max_prefill_tokens = 256;
  eo.kv_cache_tokens = 4096;
  auto model = std::make_shared<const cuda::DeviceModel>(c, w, cuda::DType::F16);
  const auto prompt = test::random_ids(20, c.vocab_size);
  auto params = [](int i) {
    SamplingParams s;
    s.temperature = i % 4 == 0 ? 0.f : 0.5f + 0.1f * (i % 8);
    s.top_k = i % 3 == 0 ? 0 : 20 + i % 8;
    s.top_p = i % 2 ? 0.9f : 1.0f;
    s.min_p = 0.0f;
    s.repeat_penalty = i % 2 ? 1.2f : 1.0f;
    s.seed = 1000 + i;
    return s;
  };
  // Eight decode steps of the listed requests (sharing the prompt); request i samples with
  // params(i). Returns each request's tokens and last-step logits.
  struct Run {
    std::map<int, std::vector<int32_t>> tokens;
    std::map<int, std::vector<float>> logits;
  };
  auto run = [&](const std::vector<int>& who) {
    cuda::CudaEngine e(model, eo);
    std::map<int, std::vector<int32_t>> hist;
    std::map<int, int> seq;
    Run out;
    for (int i : who) {
      seq[i] = e.create_sequence();
      hist[i] = prompt;
    }
    for (int step = 0; step < 8; ++step) {
      Batch b;
      for (int i : who) {
        StepRow r;
        r.seq = seq[i];
        r.tokens = step == 0 ? std::span<const int32_t>(hist[i]) : std::span<const int32_t>(&hist[i].back(), 1);
        r.sample = true;
        r.logits = step == 7;
        r.sampling = params(i);
        r.sample_index = static_cast<uint64_t>(step);
        r.history = hist[i];
        b.rows.push_back(r);
      }
      const StepOutput o = e.step(b);
      for (size_t k = 0; k < who.size(); ++k) {
        out.tokens[who[k]].push_back(o.tokens[k]);
        hist[who[k]].push_back(o.tokens[k]);
        if (step == 7)
          out.logits[who[k]].assign(o.logits.begin() + k * c.vocab_size, o.logits.begin() + (k + 1) * c.vocab_size);
      }
    }
    return out;
  };
  const Run batch = run({0, 1, 2, 3, 4, 5, 6, 7});
  const Run reversed = run({7, 6, 5, 4, 3, 2, 1, 0});
  const Run others = run({1, 9, 10, 11, 4, 12, 6, 13});  // 1, 4, 6 in other slots beside other requests
  for (int i = 0; i < 8; ++i) EXPECT_EQ(reversed.tokens.at(i), batch.tokens.at(i)) << "request " << i << " in slot " << 7 - i;
  for (int i : {1, 4, 6}) EXPECT_EQ(others.tokens.at(i), batch.tokens.at(i)) << "request " << i << " beside others";
  // Alone (M = 1, other kernels): the same logits to fp16 rounding, for a request whose tokens match.
  const Run alone = run({0});
  if (alone.tokens.at(0) == batch.tokens.at(0))
    EXPECT_LE(test::nmse(alone.logits.at(0), batch.logits.at(0)), 5e-4);
  const Run alone4 = run({4});
  if (alone4.tokens.at(4) == batch.tokens.at(4)) EXPECT_LE(test::nmse(alone4.logits.at(4), batch.logits.at(4)), 5e-4);
}

// Overlapped steps (Engine::overlaps_steps): step N + 1 begun before step N has ended, its rows
// continuing with the tokens N draws (kPendingToken, read on the device). The same batches run one
// step at a time with the drawn tokens given explicitly produce identical tokens and logits: through
// the graph-replayed decode step and through a mixed step (the pinned staging of its inputs), with
// greedy and seeded rows, in both attention modes.
TEST(CudaStepOverlap, PendingTokensAreTheDrawnOnes) {
  REQUIRE_GPU();
  for (const bool async : {true, false}) {
    ModelConfig c = test::tiny("llama", 128);
    const DecoderWeights w = test::random_weights(c);
    cuda::EngineOptions eo;
    eo.max_batch = 8;
    eo.max_prefill_tokens = 256;
    eo.kv_cache_tokens = 4096;
    eo.attention = async ? cuda::AttentionMode::Async : cuda::AttentionMode::Sync;
    auto model = std::make_shared<const cuda::DeviceModel>(c, w, cuda::DType::F16);
    cuda::CudaEngine one_at_a_time(model, eo), overlapped(model, eo);
    ASSERT_TRUE(overlapped.overlaps_steps());
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i < 5; ++i) prompts.push_back(test::random_ids(9 + 7 * i, c.vocab_size));
    auto sampling = [](int i) {
      SamplingParams s;
      s.temperature = i % 2 ? 0.8f : 0.f;
      s.seed = 77 + i;
      return s;
    };
    // Step 1: prompts 0-3 prefill and draw; step 2: their decode rows (graph-replayed); step 3:
    // their decode rows beside prompt 4's prefill (a mixed step). `drawn` gives the previous
    // step's tokens, or null for kPendingToken.
    static constexpr int32_t kPending[1] = {kPendingToken};
    auto batch = [&](int step, const std::vector<int>& seqs, const std::vector<int32_t>* drawn,
                     std::vector<int32_t>& held) {
      Batch b;
      if (drawn) held = *drawn;
      for (int i = 0; i < 4; ++i) {
        StepRow r;
        r.seq = seqs[static_cast<size_t>(i)];
        if (step == 1) {
          r.tokens = prompts[static_cast<size_t>(i)];
        } else {
          r.tokens = drawn ? std::span<const int32_t>(&held[static_cast<size_t>(i)], 1) : std::span<const int32_t>(kPending);
        }
        r.sample = true;
        r.logits = i == 1;
        r.sampling = sampling(i);
        r.sample_index = static_cast<uint64_t>(step - 1);
        b.rows.push_back(r);
      }
      if (step == 3) {
        StepRow r;
        r.seq = seqs[4];
        r.tokens = prompts[4];
        r.sample = true;
        r.sampling = sampling(4);
        b.rows.push_back(r);
      }
      return b;
    };
    std::vector<int> sa, sb;
    for (int i = 0; i < 5; ++i) {
      sa.push_back(one_at_a_time.create_sequence());
      sb.push_back(overlapped.create_sequence());
    }
    std::vector<int32_t> held_a, held_b;
    const StepOutput a1 = one_at_a_time.step(batch(1, sa, nullptr, held_a));
    const StepOutput a2 = one_at_a_time.step(batch(2, sa, &a1.tokens, held_a));
    const StepOutput a3 = one_at_a_time.step(batch(3, sa, &a2.tokens, held_a));
    overlapped.begin_step(batch(1, sb, nullptr, held_b));
    overlapped.begin_step(batch(2, sb, nullptr, held_b));
    const StepOutput b1 = overlapped.end_step();
    overlapped.begin_step(batch(3, sb, nullptr, held_b));
    const StepOutput b2 = overlapped.end_step();
    const StepOutput b3 = overlapped.end_step();
    EXPECT_EQ(b1.tokens, a1.tokens) << (async ? "async" : "sync");
    EXPECT_EQ(b2.tokens, a2.tokens) << (async ? "async" : "sync");
    EXPECT_EQ(b3.tokens, a3.tokens) << (async ? "async" : "sync");
    EXPECT_EQ(b2.logits, a2.logits) << "the decode step's logits, bit for bit";
    EXPECT_EQ(b3.logits, a3.logits) << "the mixed step's logits, bit for bit";
    for (int i = 0; i < 5; ++i) EXPECT_EQ(overlapped.sequence_length(sb[i]), one_at_a_time.sequence_length(sa[i]));
  }
}

// The engine's sampling with log probabilities, logit_bias, min_tokens and the presence and
// frequency penalties: each row's token and log probabilities equal the CPU Sampler's on the
// step's own logits (returned beside the draw, before the in-place adjustments), rows mixing
// these options in one step. Greedy rows, so the token is exact; the values to 1e-5.
TEST(CudaStepSampling, LogprobsBiasAndPenaltiesMatchTheCpuSamplerOnTheStepLogits) {
  REQUIRE_GPU();
  ModelConfig c = test::tiny("llama", 64);
  const DecoderWeights w = test::random_weights(c);
  cuda::EngineOptions eo;
  eo.max_batch = 8;
  eo.max_prefill_tokens = 256;
  eo.kv_cache_tokens = 4096;
  auto model = std::make_shared<const cuda::DeviceModel>(c, w, cuda::DType::F16);
  cuda::CudaEngine e(model, eo);
  const int n = 6;
  std::vector<std::vector<int32_t>> hist(n);
  std::vector<int> seq(n);
  auto params = [&](int i) {
    SamplingParams s;
    s.temperature = 0.f;
    s.logprobs = i % 3 == 0 ? -1 : (i == 1 ? 0 : 5 + i);
    if (i % 2 == 0) s.logit_bias = {{static_cast<int32_t>(i), 3.f}, {static_cast<int32_t>(7 * i + 1), -50.f}};
    s.min_tokens = i == 1 || i == 4 ? 3 : 0;
    s.min_tokens_ids = {2, 5};
    s.presence_penalty = i >= 3 ? 0.8f : 0.f;
    s.frequency_penalty = i >= 4 ? 0.6f : 0.f;
    s.repeat_penalty = i == 5 ? 1.3f : 1.f;
    s.repeat_last_n = -1;
    return s;
  };
  for (int i = 0; i < n; ++i) {
    seq[i] = e.create_sequence();
    hist[i] = test::random_ids(12 + i, c.vocab_size);
  }
  for (int step = 0; step < 6; ++step) {
    Batch b;
    for (int i = 0; i < n; ++i) {
      StepRow r;
      r.seq = seq[i];
      r.tokens = step == 0 ? std::span<const int32_t>(hist[i]) : std::span<const int32_t>(&hist[i].back(), 1);
      r.sample = true;
      r.logits = true;
      r.sampling = params(i);
      r.sample_index = static_cast<uint64_t>(step);
      r.history = hist[i];
      b.rows.push_back(r);
    }
    const StepOutput o = e.step(b);
    for (int i = 0; i < n; ++i) {
      const std::span<const float> logits(o.logits.data() + size_t(i) * c.vocab_size, c.vocab_size);
      Sampler cpu(params(i));
      TokenLogprobs ref;
      const int32_t want = cpu.sample(logits, hist[i], static_cast<uint64_t>(step), &ref);
      EXPECT_EQ(o.tokens[i], want) << "row " << i << " step " << step;
      if (params(i).logprobs >= 0) {
        ASSERT_EQ(o.logprobs.size(), size_t(n));
        const TokenLogprobs& got = o.logprobs[i];
        EXPECT_NEAR(got.logprob, ref.logprob, 1e-5) << "row " << i << " step " << step;
        EXPECT_EQ(got.rank, ref.rank) << "row " << i << " step " << step;
        ASSERT_EQ(got.top.size(), ref.top.size()) << "row " << i;
        for (size_t k = 0; k < ref.top.size(); ++k) {
          EXPECT_EQ(got.top[k].id, ref.top[k].id) << "row " << i << " step " << step << " #" << k;
          EXPECT_NEAR(got.top[k].logprob, ref.top[k].logprob, 1e-5) << "row " << i << " step " << step << " #" << k;
        }
      }
      if (step < 3 && (i == 1 || i == 4)) EXPECT_TRUE(o.tokens[i] != 2 && o.tokens[i] != 5) << "min_tokens, row " << i;
      hist[i].push_back(o.tokens[i]);
    }
  }
}

}  // namespace
}  // namespace fdpp

namespace fdpp {
namespace {

// Prefix caching on the paged cache: a sequence that maps another's cached blocks and prefills only
// the rest (the chunked-prefill path with context already in place) gets the logits of a recompute
// (NMSE against the GPU's own uncached run and the CPU engine's) and the same greedy token; two
// sequences sharing the blocks decode side by side after the first owner is released.
TEST(CudaPrefixCache, CachedPrefixMatchesRecompute) {
  REQUIRE_GPU();
  for (const bool async : {true, false}) {
    ModelConfig c = test::tiny("llama", 128);
    const DecoderWeights w = test::random_weights(c);
    EngineLimits l;
    l.max_context = c.max_context;
    l.max_step_rows = 8;
    l.max_step_tokens = 512;
    CpuEngine cpu(c, w, l);
    cuda::EngineOptions eo;
    eo.max_batch = 8;
    eo.max_prefill_tokens = 512;
    eo.kv_cache_tokens = 4096;
    eo.attention = async ? cuda::AttentionMode::Async : cuda::AttentionMode::Sync;
    auto model = std::make_shared<const cuda::DeviceModel>(c, w, cuda::DType::F16);
    cuda::CudaEngine gpu(model, eo);
    cuda::CudaEngine fresh(model, eo);  // recomputes everything
    const auto base = test::random_ids(150, c.vocab_size);
    auto with_tail = [&](int shared, int tail) {
      std::vector<int32_t> p(base.begin(), base.begin() + shared);
      const auto t = test::random_ids(tail, c.vocab_size);
      p.insert(p.end(), t.begin(), t.end());
      return p;
    };
    auto last_logits = [&](Engine& e, const std::vector<int32_t>& p, bool cache, int* cached, int* seq) {
      const int s = e.create_sequence();
      *cached = cache ? e.map_cached_prefix(s, p) : 0;
      StepRow r;
      r.seq = s;
      r.tokens = std::span<const int32_t>(p).subspan(static_cast<size_t>(*cached));
      r.logits = true;
      *seq = s;
      return e.step(Batch{{r}}).logits;
    };
    auto argmax = [](const std::vector<float>& v) { return std::max_element(v.begin(), v.end()) - v.begin(); };
    int cached = 0, owner = 0, cpu_owner = 0;
    last_logits(gpu, base, true, &cached, &owner);
    last_logits(cpu, base, true, &cached, &cpu_owner);
    for (const auto& [shared, tail] : std::vector<std::pair<int, int>>{{100, 40}, {96, 1}, {150, 0}, {40, 90}}) {
      const auto p = with_tail(shared, tail);
      int gc = 0, cc = 0, fc = 0, gs = 0, cs = 0, fs = 0;
      const auto g = last_logits(gpu, p, true, &gc, &gs);
      const auto cref = last_logits(cpu, p, true, &cc, &cs);
      const auto f = last_logits(fresh, p, false, &fc, &fs);
      EXPECT_EQ(gc, cc) << "the GPU and CPU engines share the block table's rules";
      EXPECT_GT(gc, 0);
      EXPECT_LE(test::nmse(g, f), 5e-4) << "shared " << shared << (async ? " async" : " sync");
      EXPECT_LE(test::nmse(g, cref), 5e-4) << "shared " << shared;
      EXPECT_EQ(argmax(g), argmax(f)) << "greedy token, shared " << shared;
      gpu.release_sequence(gs);
      cpu.release_sequence(cs);
      fresh.release_sequence(fs);
    }
    // Two sequences map the owner's blocks; the owner goes; both decode together.
    const auto a = with_tail(128, 7), b = with_tail(140, 3);
    const int sa = gpu.create_sequence(), sb = gpu.create_sequence(), ta = cpu.create_sequence(),
              tb = cpu.create_sequence();
    const int ga = gpu.map_cached_prefix(sa, a), gb = gpu.map_cached_prefix(sb, b);
    const int ca = cpu.map_cached_prefix(ta, a), cb = cpu.map_cached_prefix(tb, b);
    EXPECT_EQ(ga, 128);
    EXPECT_EQ(gb, 128);
    gpu.release_sequence(owner);
    cpu.release_sequence(cpu_owner);
    auto two = [&](Engine& e, int x, int y, std::span<const int32_t> tx, std::span<const int32_t> ty) {
      StepRow r1, r2;
      r1.seq = x;
      r1.tokens = tx;
      r1.logits = true;
      r2.seq = y;
      r2.tokens = ty;
      r2.logits = true;
      return e.step(Batch{{r1, r2}}).logits;
    };
    auto go = two(gpu, sa, sb, std::span<const int32_t>(a).subspan(128), std::span<const int32_t>(b).subspan(128));
    auto co = two(cpu, ta, tb, std::span<const int32_t>(a).subspan(static_cast<size_t>(ca)),
                  std::span<const int32_t>(b).subspan(static_cast<size_t>(cb)));
    EXPECT_LE(test::nmse(go, co), 5e-4);
    for (int step = 0; step < 4; ++step) {
      const int32_t t1[] = {static_cast<int32_t>(3 + step)}, t2[] = {static_cast<int32_t>(9 + step)};
      go = two(gpu, sa, sb, t1, t2);
      co = two(cpu, ta, tb, t1, t2);
      EXPECT_LE(test::nmse(go, co), 5e-4) << "decode step " << step;
    }
  }
}

// Prefix caching over an fp8 cache: a sequence that maps another's cached e4m3 blocks and prefills
// the rest gets, bit for bit, the logits of a sequence that computed the same prefix itself with the
// same launches (the owner's whole prompt in one chunk, cut back to the mapped length) and then the
// same rest; the decode steps after it too. The mapped blocks hold the bytes the owner wrote, wherever
// they sit in the pool. Both softmax modes; shared prefixes shorter than, equal to and inside the
// owner's prompt.
TEST(CudaPrefixCache, Fp8CachedPrefixEqualsRecomputeBitForBit) {
  REQUIRE_GPU();
  for (const bool async : {true, false}) {
    ModelConfig c = test::tiny("llama", 128);
    const DecoderWeights w = test::random_weights(c);
    cuda::EngineOptions eo;
    eo.max_batch = 8;
    eo.max_prefill_tokens = 512;
    eo.kv_cache_tokens = 4096;
    eo.attention = async ? cuda::AttentionMode::Async : cuda::AttentionMode::Sync;
    eo.kv_quant.dtype = cuda::KvDType::Fp8E4M3;
    auto model = std::make_shared<const cuda::DeviceModel>(c, w, cuda::DType::BF16);
    cuda::CudaEngine gpu(model, eo);
    cuda::CudaEngine fresh(model, eo);  // computes every prefix itself
    const auto base = test::random_ids(150, c.vocab_size);
    auto with_tail = [&](int shared, int tail) {
      std::vector<int32_t> p(base.begin(), base.begin() + shared);
      const auto t = test::random_ids(tail, c.vocab_size);
      p.insert(p.end(), t.begin(), t.end());
      return p;
    };
    auto step = [](Engine& e, int seq, std::span<const int32_t> tokens) {
      StepRow r;
      r.seq = seq;
      r.tokens = tokens;
      r.logits = true;
      return e.step(Batch{{r}}).logits;
    };
    const int owner = gpu.create_sequence();
    EXPECT_EQ(gpu.map_cached_prefix(owner, base), 0);  // a caching sequence: its blocks get registered
    step(gpu, owner, base);
    for (const auto& [shared, tail] : std::vector<std::pair<int, int>>{{100, 40}, {96, 1}, {150, 0}, {40, 90}}) {
      const std::string what = "shared " + std::to_string(shared) + (async ? " async" : " sync");
      const auto p = with_tail(shared, tail);
      const int s = gpu.create_sequence();
      const int cached = gpu.map_cached_prefix(s, p);
      ASSERT_GT(cached, 0) << what;
      const auto rest = std::span<const int32_t>(p).subspan(static_cast<size_t>(cached));
      const auto g = step(gpu, s, rest);
      const int f = fresh.create_sequence();
      step(fresh, f, base);
      fresh.truncate_sequence(f, cached);
      const auto r = step(fresh, f, rest);
      EXPECT_EQ(g, r) << what << ": the mapped prefix's logits differ from the recomputed one's";
      for (int k = 0; k < 3; ++k) {
        const int32_t t[] = {static_cast<int32_t>(11 + 5 * k)};
        EXPECT_EQ(step(gpu, s, t), step(fresh, f, t)) << what << ", decode step " << k;
      }
      gpu.release_sequence(s);
      fresh.release_sequence(f);
    }
  }
}

}  // namespace
}  // namespace fdpp
