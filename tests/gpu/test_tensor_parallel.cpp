// Tensor parallelism (backend/cuda/tensor_parallel_engine.h) on two GPUs against one: the same
// steps (prefill chunks mixed with decode rows, then graph-replayed decode-only steps with the NCCL
// calls captured) give the same logits (NMSE) and the same greedy tokens, for random models of each
// GPU recipe (GQA, tied embeddings, ChatGLM's qkv bias and single KV head, which two ranks
// replicate), every HF fixture the GPU runs, and a GGUF of every stored type (quantized slices read
// in place, blocks cut by a slice dequantized on the host). On a machine with one GPU the same
// tests run the tensor-parallel engine with one rank (NCCL with a group of one, captured in the
// graphs) against the plain engine.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <filesystem>

#include "backend/cuda/cuda_engine.h"
#include "backend/cuda/tensor_parallel_engine.h"
#include "runtime/backend_select.h"
#include "io/gguf.h"
#include "model/model_loader.h"
#include "model/arch/architecture.h"
#include "model/tensor_parallel.h"
#include "../test_util.h"
#include "../tiny_gguf.h"
#include "../tiny_model.h"
#include "gpu_test_util.h"

namespace fdpp {
namespace {

namespace fs = std::filesystem;

int gpu_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

// Two ranks where two GPUs exist, else one.
int tp_ranks() { return std::min(2, gpu_count()); }

#define REQUIRE_GPU() \
  if (!test::gpu_available()) GTEST_SKIP() << "no GPU"

EngineLimits limits_for(const ModelConfig& c) {
  EngineLimits l;
  l.max_context = c.max_context;
  l.max_step_rows = 8;
  l.max_step_tokens = 512;
  l.kv_cache_tokens = 4096;
  return l;
}

// Runs the same steps on both engines and compares every logits row; then decodes greedily on both.
void expect_same_steps(Engine& one, Engine& two, const ModelConfig& c, double bound) {
  const int S = 4;
  std::vector<std::vector<int32_t>> text;
  for (int i = 0; i < S; ++i) text.push_back(test::random_ids(200, c.vocab_size));
  std::vector<int> a, b, len(S, 0);
  for (int i = 0; i < S; ++i) {
    a.push_back(one.create_sequence());
    b.push_back(two.create_sequence());
  }
  // At most 102 tokens per sequence (the tiny GGUF's context is 128), chunks of 1 to 65 tokens.
  // Models of a shorter context (some fixtures hold 64 positions) take the chunks scaled down.
  std::vector<std::vector<int>> plan = {{37, 0, 0, 0}, {1, 50, 3, 0}, {1, 1, 65, 17},
                                        {1, 1, 1, 1},  {1, 1, 1, 1},  {5, 1, 20, 1}};
  for (auto& step : plan)
    for (int& n : step)
      if (n > 1) n = std::max(1, n * std::min(c.max_context, 128) / 128);
  for (size_t st = 0; st < plan.size(); ++st) {
    Batch ba, bb;
    for (int i = 0; i < S; ++i) {
      if (plan[st][i] == 0) continue;
      StepRow r;
      r.tokens = std::span<const int32_t>(text[i].data() + len[i], plan[st][i]);
      r.logits = true;
      r.seq = a[i];
      ba.rows.push_back(r);
      r.seq = b[i];
      bb.rows.push_back(r);
      len[i] += plan[st][i];
    }
    const StepOutput oa = one.step(ba), ob = two.step(bb);
    ASSERT_EQ(oa.logits.size(), ob.logits.size());
    for (size_t k = 0; k < ba.rows.size(); ++k) {
      std::span<const float> x(oa.logits.data() + k * c.vocab_size, c.vocab_size),
          y(ob.logits.data() + k * c.vocab_size, c.vocab_size);
      ASSERT_TRUE(std::all_of(x.begin(), x.end(), [](float v) { return std::isfinite(v); }))
          << "the one-GPU reference is not finite: step " << st << " row " << k;
      EXPECT_LE(test::nmse(y, x), bound) << "step " << st << " row " << k;
    }
  }
  // Greedy decoding, 12 steps of all sequences: the same tokens (a differing token is allowed
  // only where the one-GPU logits of the two candidates tie within fp16 rounding, and reported).
  std::vector<int32_t> ta(S), tb(S);
  for (int i = 0; i < S; ++i) ta[i] = tb[i] = text[i][len[i]];
  int ties = 0;
  for (int st = 0; st < 12; ++st) {
    Batch ba, bb;
    for (int i = 0; i < S; ++i) {
      StepRow r;
      r.sample = true;
      r.logits = true;
      r.sampling.temperature = 0;
      r.tokens = std::span<const int32_t>(&ta[i], 1);
      r.seq = a[i];
      ba.rows.push_back(r);
      r.tokens = std::span<const int32_t>(&tb[i], 1);
      r.seq = b[i];
      bb.rows.push_back(r);
    }
    const StepOutput oa = one.step(ba), ob = two.step(bb);
    for (int i = 0; i < S; ++i) {
      if (oa.tokens[i] != ob.tokens[i]) {
        const float* l = oa.logits.data() + static_cast<size_t>(i) * c.vocab_size;
        const float gap = std::abs(l[oa.tokens[i]] - l[ob.tokens[i]]);
        EXPECT_LE(gap, 2e-3f * std::max(1.f, std::abs(l[oa.tokens[i]])))
            << "step " << st << " row " << i << ": tokens " << oa.tokens[i] << " vs " << ob.tokens[i];
        ++ties;
      }
      ta[i] = oa.tokens[i];
      tb[i] = oa.tokens[i];  // both continue from the one-GPU token
    }
  }
  if (ties > 0) std::printf("greedy: %d near-tie tokens differ\n", ties);
}

struct TpCase {
  std::string recipe;
  int head_dim;
  cuda::DType dtype;
  int kv_heads = 0;  // 0: the recipe's
};

class TensorParallelStep : public ::testing::TestWithParam<TpCase> {};

TEST_P(TensorParallelStep, ShardsMatchOneGpu) {
  REQUIRE_GPU();
  const TpCase& p = GetParam();
  ModelConfig c = test::tiny(p.recipe, p.head_dim);
  if (p.kv_heads > 0) c.n_kv_heads = p.kv_heads;
  const DecoderWeights w = test::random_weights(c);
  const WeightPlan plan = plan_from_weights(w, c);
  cuda::EngineOptions eo;
  eo.max_batch = 8;
  eo.max_prefill_tokens = 512;
  eo.kv_cache_tokens = 4096;
  cuda::CudaEngine one(std::make_shared<const cuda::DeviceModel>(c, w, p.dtype), eo);
  cuda::ShardSource source;
  source.plan = &plan;
  source.dtype = p.dtype;
  cuda::TensorParallelEngine two(c, tp_ranks(), source, eo);
  EXPECT_EQ(two.layout().local.n_heads, c.n_heads / tp_ranks());
  expect_same_steps(one, two, c, p.dtype == cuda::DType::F16 ? 5e-4 : 5e-3);
  // A released sequence frees its blocks on every rank.
  EXPECT_EQ(two.live_sequences(), 4);
}

INSTANTIATE_TEST_SUITE_P(Variants, TensorParallelStep,
                         ::testing::Values(TpCase{"llama", 128, cuda::DType::F16},
                                           TpCase{"llama", 64, cuda::DType::BF16},
                                           TpCase{"llama-tied", 64, cuda::DType::F16},
                                           TpCase{"chatglm", 128, cuda::DType::F16},
                                           TpCase{"llama", 64, cuda::DType::F16, 1}),
                         [](const auto& info) {
                           std::string n = info.param.recipe + "_hd" + std::to_string(info.param.head_dim) +
                                           (info.param.dtype == cuda::DType::F16 ? "_f16" : "_bf16") +
                                           (info.param.kv_heads > 0 ? "_kv" + std::to_string(info.param.kv_heads) : "");
                           for (auto& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

// The front end's path: make_engine with --tensor-parallel 2 streams each rank's slices from the
// files (column slices gathered row by row, cut quantization blocks dequantized on the host).
void expect_files_split(const ModelConfig& c, const WeightPlan& plan, cuda::DType dtype, double bound) {
  RunnerOptions ro;
  ro.device = Device::Cuda;
  ro.dtype = dtype == cuda::DType::F16 ? "f16" : "bf16";
  ro.plan = &plan;
  // Tensor parallelism loads a GGUF file's matrices in 16 bits: the one-GPU reference does too (its
  // default keeps them in their blocks, with 8-bit activations: test_gguf_blocks.cpp holds that).
  ro.gpu_weights = "dequantized";
  auto one = make_engine(c, {}, ro, limits_for(c));
  ro.tensor_parallel = tp_ranks();
  if (ro.tensor_parallel > 1) {
    auto two = make_engine(c, {}, ro, limits_for(c));
    expect_same_steps(*one, *two, c, bound);
  } else {  // make_engine runs -tp 1 on the plain engine: build the one-rank group directly
    const EngineLimits l = limits_for(c);
    cuda::EngineOptions eo;
    eo.max_batch = l.max_step_rows;
    eo.max_prefill_tokens = l.max_step_tokens;
    eo.kv_cache_tokens = l.kv_cache_tokens;
    cuda::ShardSource source;
    source.plan = &plan;
    source.dtype = dtype;
    cuda::TensorParallelEngine two(c, 1, source, eo);
    expect_same_steps(*one, two, c, bound);
  }
}

TEST(TensorParallelFiles, HfFixturesSplitMatchOneGpu) {
  REQUIRE_GPU();
  int checked = 0;
  for (const auto& e : fs::directory_iterator(fs::path(test::fixture("hf")))) {
    if (!e.is_directory() || !fs::exists(e.path() / "config.json")) continue;
    const PlannedModel m = plan_model(e.path().string());
    const ModelConfig& c = m.config();
    if (!c.pre_norm || c.embedding_dim() != c.hidden || !cuda::cuda_model_problem(c).empty() ||
        !cuda::tensor_parallel_model_problem(c).empty() || c.n_heads % 2 != 0 ||
        c.ffn_hidden % 2 != 0 || c.has_moe())  // tensor parallelism does not split experts
      continue;
    SCOPED_TRACE(e.path().filename().string());
    expect_files_split(c, m.plan, cuda::DType::F16, 5e-4);
    ++checked;
  }
  EXPECT_GE(checked, 3);
}

TEST(TensorParallelFiles, GgufOfEveryStoredTypeSplitMatchesOneGpu) {
  REQUIRE_GPU();
  const auto dir = test::scratch_dir("tp_gguf");
  const std::string path = (dir / "tiny.gguf").string();
  test::write_tiny_llama_gguf(path);
  auto file = std::make_shared<const gguf::GgufFile>(gguf::GgufFile::open(path));
  const ModelConfig c = llama_config_from_gguf(*file);
  // bf16: the random blocks (scales up to 0.01 x 63 x 15 per weight) overflow fp16 activations.
  expect_files_split(c, plan_llama_gguf(file, c), cuda::DType::BF16, 5e-3);
  fs::remove_all(dir);
}

TEST(TensorParallelFiles, RefusesMoreGpusThanTheMachineHas) {
  if (!test::gpu_available()) GTEST_SKIP() << "no GPU";
  const ModelConfig c = test::tiny("llama", 64);
  cuda::EngineOptions eo;
  cuda::ShardSource source;
  const int n = gpu_count();
  if (c.n_heads % (n + 1) != 0) GTEST_SKIP() << "the tiny model does not split over " << n + 1;
  try {
    cuda::TensorParallelEngine e(c, n + 1, source, eo);
    ADD_FAILURE() << "no error";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("this machine has"), std::string::npos) << err.what();
  }
}

}  // namespace
}  // namespace fdpp
