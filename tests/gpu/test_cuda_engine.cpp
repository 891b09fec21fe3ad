// The CUDA engine end to end against the CPU reference: whole-model logits for every decoder
// variant (random tiny models of each architecture's recipe, and the default model), batched
// decode of sequences of different lengths, CUDA-graph replay against eager launches, and the
// KV-cache-full error. Skipped where there is no GPU.
#include <dirent.h>
#include <filesystem>
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "../test_util.h"
#include "../tiny_model.h"
#include "backend/cpu/cpu_runner.h"
#include "backend/cpu/ops.h"
#include "backend/cuda/check.h"
#include "backend/cuda/cuda_engine.h"
#include "backend/cuda/device_query.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kv_cache_layout.h"
#include "core/half.h"
#include "engine/engine_runner.h"
#include "engine/sampler.h"
#include "fdpp/error.h"
#include "model/model_loader.h"

namespace fdpp {
namespace {

using test::random_ids;
using test::random_tensor;
using test::random_weights;
using test::tiny;

// A one-sequence runner on a CUDA engine of its own, as make_runner builds one: every forward
// pass is Engine::step.
std::unique_ptr<EngineRunner> gpu_runner(std::shared_ptr<const cuda::DeviceModel> model, int max_context,
                                         cuda::EngineOptions eo = {}) {
  eo.max_batch = 1;
  if (eo.kv_cache_tokens == 0) eo.kv_cache_tokens = max_context;
  return std::make_unique<EngineRunner>(std::make_unique<cuda::CudaEngine>(std::move(model), eo), max_context);
}

// Appends a prompt to a sequence (steps of at most max_step_tokens, no logits).
void prefill(Engine& e, int seq, std::span<const int32_t> tokens) {
  const size_t chunk = static_cast<size_t>(e.limits().max_step_tokens);
  for (size_t done = 0; done < tokens.size(); done += chunk) {
    Batch b;
    StepRow row;
    row.seq = seq;
    row.tokens = tokens.subspan(done, std::min(chunk, tokens.size() - done));
    b.rows.push_back(row);
    e.step(b);
  }
}

// A new sequence per prompt, each prefilled: their ids, in order.
std::vector<int> prefilled_sequences(Engine& e, const std::vector<std::vector<int32_t>>& prompts) {
  std::vector<int> seqs;
  for (const auto& p : prompts) {
    seqs.push_back(e.create_sequence());
    prefill(e, seqs.back(), p);
  }
  return seqs;
}

// One decode step of one token per sequence: the logits rows, in order.
std::vector<float> decode(Engine& e, std::span<const int> seqs, std::span<const int32_t> tokens) {
  Batch b;
  for (size_t i = 0; i < seqs.size(); ++i) {
    StepRow row;
    row.seq = seqs[i];
    row.tokens = tokens.subspan(i, 1);
    row.logits = true;
    b.rows.push_back(row);
  }
  return e.step(b).logits;
}

bool have_gpu() { return !cuda::list_gpus().empty(); }

#define REQUIRE_GPU() \
  if (!have_gpu()) GTEST_SKIP() << "no usable GPU"

struct RecipeCase {
  std::string recipe;
  int head_dim;
  cuda::DType dtype;
};

void PrintTo(const RecipeCase& c, std::ostream* os) {
  *os << c.recipe << " head_dim " << c.head_dim << (c.dtype == cuda::DType::F16 ? " f16" : " bf16");
}

class CudaRecipes : public ::testing::TestWithParam<RecipeCase> {};

TEST_P(CudaRecipes, PrefillAndDecodeLogitsMatchCpu) {
  REQUIRE_GPU();
  const auto& p = GetParam();
  const ModelConfig c = tiny(p.recipe, p.head_dim);
  const DecoderWeights w = random_weights(c);
  const int T = 37, steps = 5;
  const auto ids = random_ids(T + steps, c.vocab_size);

  CpuRunner cpu(c, w, T + steps);
  std::vector<float> cpu_prefill(size_t(T) * c.vocab_size), cpu_step(c.vocab_size);
  cpu.forward(std::span(ids.data(), T), 0, true, cpu_prefill);

  auto model = std::make_shared<const cuda::DeviceModel>(c, w, p.dtype);
  auto gpu = gpu_runner(model, T + steps, cuda::EngineOptions{});
  std::vector<float> gpu_prefill(cpu_prefill.size(), NAN), gpu_step(c.vocab_size, NAN);
  gpu->forward(std::span(ids.data(), T), 0, true, gpu_prefill);
  const double bound = p.dtype == cuda::DType::F16 ? 5e-4 : 5e-3;  // bf16 keeps 8 mantissa bits
  const double e = test::nmse(gpu_prefill, cpu_prefill);
  std::printf("%s hd%d %s prefill NMSE %.3e\n", p.recipe.c_str(), p.head_dim,
              p.dtype == cuda::DType::F16 ? "f16" : "bf16", e);
  EXPECT_LE(e, bound);
  for (int s = 0; s < steps; ++s) {
    cpu.forward(std::span(&ids[T + s], 1), T + s, false, cpu_step);
    gpu->forward(std::span(&ids[T + s], 1), T + s, false, gpu_step);
    const double es = test::nmse(gpu_step, cpu_step);
    EXPECT_LE(es, bound) << "decode step " << s;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Variants, CudaRecipes,
    ::testing::Values(RecipeCase{"llama", 64, cuda::DType::F16}, RecipeCase{"llama", 128, cuda::DType::F16},
                      RecipeCase{"llama", 128, cuda::DType::BF16}, RecipeCase{"llama-tied", 64, cuda::DType::F16},
                      RecipeCase{"opt", 64, cuda::DType::F16}, RecipeCase{"opt", 128, cuda::DType::BF16},
                      RecipeCase{"chatglm", 128, cuda::DType::F16}, RecipeCase{"chatglm", 64, cuda::DType::BF16},
                      RecipeCase{"opt-postln", 64, cuda::DType::F16}, RecipeCase{"opt-postln", 128, cuda::DType::BF16},
                      // Gemma's features and sliding windows (windows of 7 and 9 keys under prompts of
                      // 37; mistral-window slides in every layer, so blocks behind it are given back).
                      RecipeCase{"gemma2", 256, cuda::DType::BF16}, RecipeCase{"gemma2", 64, cuda::DType::F16},
                      RecipeCase{"gemma3", 256, cuda::DType::F16}, RecipeCase{"gemma3", 128, cuda::DType::BF16},
                      RecipeCase{"mistral-window", 128, cuda::DType::F16},
                      RecipeCase{"mistral-window", 64, cuda::DType::BF16},
                      // LongRoPE's attention factor with a partial rotary embedding and a window;
                      // head_dim 96 is Phi-3-mini's.
                      RecipeCase{"phi3-longrope", 96, cuda::DType::F16},
                      RecipeCase{"phi3-longrope", 128, cuda::DType::BF16}),
    [](const auto& info) {
      std::string n = info.param.recipe + "_hd" + std::to_string(info.param.head_dim) +
                      (info.param.dtype == cuda::DType::F16 ? "_f16" : "_bf16");
      for (auto& ch : n)
        if (ch == '-') ch = '_';
      return n;
    });

// Split-KV decode attention (partials merged by a second kernel) against the CPU reference and
// against the unsplit kernel, for split counts that divide the tiles unevenly and leave splits
// empty, on a scrambled paged cache with mixed lengths.
TEST(CudaSplitKv, DecodeAttentionMatchesCpuAndUnsplit) {
  REQUIRE_GPU();
  const int B = 3, H = 8, KVH = 2, D = 128, BS = 16;
  const std::vector<int> lens{1, 700, 1500};
  const int max_blocks = (1500 + BS - 1) / BS;
  const int num_blocks = B * max_blocks;
  std::vector<int32_t> perm(num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), test::rng());
  std::vector<int32_t> tables(perm.begin(), perm.end());  // sequence b owns blocks perm[b * max_blocks ..]
  auto to16 = [](const std::vector<float>& f) {
    std::vector<uint16_t> h(f.size());
    for (size_t i = 0; i < f.size(); ++i) h[i] = f32_to_fp16(f[i]);
    return h;
  };
  auto back = [](const std::vector<uint16_t>& h) {
    std::vector<float> f(h.size());
    for (size_t i = 0; i < h.size(); ++i) f[i] = fp16_to_f32(h[i]);
    return f;
  };
  const auto qkv_h = to16(test::random_vector(size_t(B) * (H + 2 * KVH) * D));
  const auto k_h = to16(test::random_vector(size_t(num_blocks) * BS * KVH * D));
  const auto v_h = to16(test::random_vector(size_t(num_blocks) * BS * KVH * D));
  const auto qkv_f = back(qkv_h), k_f = back(k_h), v_f = back(v_h);
  const float scale = 1.0f / std::sqrt(float(D));

  // CPU reference from the same fp16-rounded inputs, over each sequence's cache gathered from the
  // kernels' layout (kv_cache_layout.h).
  const cuda::KvCacheLayout layout = cuda::kv_cache_layout(BS, KVH, D);
  std::vector<float> ref(size_t(B) * H * D);
  for (int b = 0; b < B; ++b) {
    const int L = lens[b];
    std::vector<float> k(size_t(L) * KVH * D), v(k.size());
    for (int j = 0; j < L; ++j) {
      const int64_t slot = int64_t(tables[b * max_blocks + j / BS]) * BS + j % BS;
      for (int h = 0; h < KVH; ++h) {
        std::copy_n(&k_f[layout.slot_row(slot, h)], D, &k[(size_t(j) * KVH + h) * D]);
        std::copy_n(&v_f[layout.slot_row(slot, h)], D, &v[(size_t(j) * KVH + h) * D]);
      }
    }
    cpu::attention(&qkv_f[size_t(b) * (H + 2 * KVH) * D], k.data(), v.data(), 1, L - 1, H, KVH, D, scale,
                   &ref[size_t(b) * H * D]);
  }

  auto dev = [](const void* src, size_t bytes) {
    cuda::DeviceBuffer d(bytes);
    FDPP_CUDA_CHECK(cudaMemcpy(d.get(), src, bytes, cudaMemcpyHostToDevice));
    return d;
  };
  auto qkv_d = dev(qkv_h.data(), qkv_h.size() * 2), k_d = dev(k_h.data(), k_h.size() * 2),
       v_d = dev(v_h.data(), v_h.size() * 2), tab_d = dev(tables.data(), tables.size() * 4),
       len_d = dev(lens.data(), lens.size() * 4);
  cuda::DeviceBuffer out_d(size_t(B) * H * D * 2);
  std::vector<float> unsplit;
  for (int splits : {1, 2, 3, 5, 16, 64}) {
    const size_t ws_bytes = cuda::decode_attention_workspace_bytes(B, H, D, splits);
    cuda::DeviceBuffer ws(ws_bytes);
    FDPP_CUDA_CHECK(cudaMemset(out_d.get(), 0xff, out_d.bytes()));  // poison: NaN in fp16
    cuda::decode_attention({.qkv = qkv_d.get(), .k_cache = k_d.get(), .v_cache = v_d.get(),
                            .block_tables = tab_d.as<int32_t>(), .max_blocks_per_seq = max_blocks,
                            .context_lens = len_d.as<int32_t>(), .out = out_d.get(), .batch = B, .n_heads = H,
                            .n_kv_heads = KVH, .head_dim = D, .block_size = BS, .scale = scale,
                            .dtype = cuda::DType::F16, .splits = splits, .max_context_len = 0, .workspace = ws.get(),
                            .workspace_bytes = ws_bytes},
                           nullptr);
    FDPP_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<uint16_t> out_h(size_t(B) * H * D);
    FDPP_CUDA_CHECK(cudaMemcpy(out_h.data(), out_d.get(), out_h.size() * 2, cudaMemcpyDeviceToHost));
    const auto out = back(out_h);
    const double e = test::nmse(out, ref);
    std::printf("split-KV decode attention, %d splits: NMSE vs CPU %.3e\n", splits, e);
    EXPECT_LE(e, 5e-4) << splits << " splits";
    if (splits == 1) unsplit = out;
    else EXPECT_LE(test::nmse(out, unsplit), 1e-5) << splits << " splits vs unsplit";
  }
}

// The host split plan (no GPU needed: it runs wherever the suite is built) at the points its
// constants were fitted to, and never past the bound the engines size their workspace by.
TEST(CudaSplitPlan, FollowsTheMeasuredOptimaWithinTheWorkspaceBound) {
  // The host plan: Llama-2-7B at batch 1, context 1024 on 132 SMs -> 4 splits on tensor cores (see
  // the .cu; the sweep measured 3 splits 7.29 us, 4 7.59, 8 10.41, one 8.26).
  EXPECT_EQ(cuda::plan_decode_splits(1, 32, 32, 128, 1024, 132), 4);
  EXPECT_EQ(cuda::plan_decode_splits(64, 32, 32, 128, 1024, 132), 1);
  EXPECT_EQ(cuda::plan_decode_splits(1, 32, 32, 128, 100, 132), 1);
  // ChatGLM2's 32/2 heads at batch 1, 16K: 40 splits (80 CTAs; the sweep measured 9.22 us async,
  // the best 48 splits 8.90, the former plan's 43 8.92), and at batch 32, 512 keys one split (two
  // measured 8% slower; docs/results/2026-12-01n-splits.md, 2026-12-01v-split-sweep/).
  EXPECT_EQ(cuda::plan_decode_splits(1, 32, 2, 128, 16384, 132), 40);
  EXPECT_EQ(cuda::plan_decode_splits(32, 32, 2, 128, 512, 132), 1);
  // Batch 1, 512 keys (docs/results/2026-12-01v-split-sweep/): Llama-3-8B's 32/8 5 splits (80 CTAs of
  // two heads on tensor cores: async 4.51 us, sync 4.31; the former plan's 8, 128 CTAs, 4.65 and
  // its sync 4, one head per CTA, 5.50), MHA one split (5.22; 2 splits 4.65, see the sweep).
  EXPECT_EQ(cuda::plan_decode_splits(1, 32, 8, 128, 512, 132), 5);
  EXPECT_EQ(cuda::plan_decode_splits(1, 32, 32, 128, 512, 132), 1);
  // Other head dims plan with their own loop, tiles and (at 64 and from 128) slots
  // (docs/results/2026-12-02a-wide-tiles-plan.md): at 64, 32/8 heads at batch 1, 512 keys one split
  // (3.7 us; the plan at 128's 5 splits 4.0-4.2) and at batch 32, 16K keys two (head-major cache:
  // 247.7 us, one 268.0; docs/results/2026-12-02c-head-major.md); at 256, MHA at batch 1, 512 keys
  // 4 splits (8.31 us; one 10.09).
  EXPECT_EQ(cuda::plan_decode_splits(1, 32, 8, 64, 512, 132), 1);
  EXPECT_EQ(cuda::plan_decode_splits(32, 32, 8, 64, 16384, 132), 2);
  EXPECT_EQ(cuda::plan_decode_splits(1, 32, 32, 256, 512, 132), 4);
  // What the launches run with the plan, MHA at head_dim 128 (decode_plan.h, choose_loop): the
  // CUDA-core loop at up to 512 keys and batch 1-6, else the tensor-core loop; 4 warps where two CTAs
  // per SM fill their rounds (batch 7, 8, 16, 32, 64) up to 2048 keys, 8 beyond and at batch 1-6 and 12
  // (384 CTAs: two rounds of 264 slots against three half-length ones of 132). At head_dim 64 the
  // tensor-core loop from batch 17 (4 CTA groups per SM), and from batch 7 (3/4 of two per SM) on
  // rows longer than 2048 keys; else the CUDA-core loop.
  for (int len : {512, 513, 1024, 2048, 2049, 4096, 65536}) {
    for (int b : {1, 2, 6, 7, 8, 12, 16, 32, 64}) {
      const int splits = cuda::plan_decode_splits(b, 32, 32, 128, len, 132);
      const auto mha = cuda::decode_attention_launch(b, 32, 32, 128, splits, len, true, 132);
      const bool small_batch = b <= 6, four = !small_batch && b != 12 && len <= 2048;
      EXPECT_EQ(mha.tensor_cores, !(small_batch && len <= 512)) << b << " " << len;
      EXPECT_EQ(mha.warps, four ? 4 : 8) << b << " " << len;
      if (b >= 8) EXPECT_EQ(splits, 1) << b << " " << len;
      EXPECT_EQ(mha.unified, splits > 1 && mha.tensor_cores) << b << " " << len;
      EXPECT_EQ(cuda::decode_attention_launch(b, 32, 32, 64, 1, len, false, 132).tensor_cores,
                b >= 17 || (b >= 7 && len > 2048))
          << b << " " << len;
    }
    // A length not known (0) counts as long.
    EXPECT_EQ(cuda::decode_attention_launch(8, 32, 32, 128, 1, 0, true, 132).warps, 8);
  }
  // Llama-3-8B's 32/8 at batch 8, 4K keys: 2 splits on tensor cores, unified, reduced in the kernel;
  // the same length unknown (0) counts as long: the second launch.
  const auto gqa8 = cuda::decode_attention_launch(8, 32, 8, 128, 2, 4096, true, 132);
  EXPECT_TRUE(gqa8.tensor_cores && gqa8.unified && gqa8.combine_in_kernel);
  EXPECT_FALSE(cuda::decode_attention_launch(8, 32, 8, 128, 2, 0, true, 132).combine_in_kernel);
  // Llama-2-7B at batch 1 (4 splits on tensor cores): reduced in the kernel up to 8K keys, by the
  // second launch beyond.
  for (int len : {1024, 8192, 8193, 65536}) {
    const auto mha1 = cuda::decode_attention_launch(1, 32, 32, 128, 4, len, true, 132);
    EXPECT_TRUE(mha1.tensor_cores && mha1.unified) << len;
    EXPECT_EQ(mha1.combine_in_kernel, len <= 8192) << len;
  }
  EXPECT_FALSE(cuda::decode_attention_launch(8, 32, 8, 128, 2, 4096, false, 132).unified);
  // The combine launch's shape, by rows (batch x heads) per SM: up to 1 (batch 4 at 32 heads on 132
  // SMs), up to 4 (batch 16), beyond; none with one split or where the kernel added the splits.
  using cuda::CombineLaunch;
  for (bool async : {false, true}) {
    EXPECT_EQ(cuda::decode_attention_launch(4, 32, 8, 128, 8, 65536, async, 132).combine, CombineLaunch::FewRows);
    EXPECT_EQ(cuda::decode_attention_launch(5, 32, 8, 128, 8, 65536, async, 132).combine, CombineLaunch::SomeRows);
    EXPECT_EQ(cuda::decode_attention_launch(16, 32, 8, 128, 8, 65536, async, 132).combine, CombineLaunch::SomeRows);
    EXPECT_EQ(cuda::decode_attention_launch(17, 32, 8, 128, 8, 65536, async, 132).combine, CombineLaunch::ManyRows);
    EXPECT_EQ(cuda::decode_attention_launch(64, 32, 8, 128, 1, 65536, async, 132).combine, CombineLaunch::None);
  }
  EXPECT_EQ(gqa8.combine, CombineLaunch::None);  // added in the kernel
  EXPECT_EQ(cuda::decode_attention_launch(8, 32, 8, 128, 2, 4096, false, 132).combine, CombineLaunch::SomeRows);
  // With fewer SMs the same rows take the shape for more rows per SM.
  EXPECT_EQ(cuda::decode_attention_launch(4, 32, 8, 128, 8, 65536, true, 66).combine, CombineLaunch::SomeRows);
  // The workspace bound covers every shorter context.
  for (int d : {64, 96, 128, 256})
    for (const auto& [h, kvh] : {std::pair{32, 32}, {32, 8}, {32, 2}, {40, 40}})
      for (int b : {1, 2, 5, 8, 64}) {
        const int bound = cuda::max_decode_splits(b, h, kvh, d, 32768, 132);
        for (int len = 1; len <= 32768; len += 97)
          ASSERT_LE(cuda::plan_decode_splits(b, h, kvh, d, len, 132), bound)
              << "D " << d << " " << h << "/" << kvh << " b " << b << " L " << len;
      }
}

// The fused rope + KV-cache write equals the two separate launches bit for bit (q in qkv, k and v
// in the cache), for both styles, partial rotary, odd token counts and a skipped (-1) slot, with
// and without a rotary_scale (LongRoPE's attention factor).
TEST(CudaFusedRope, RopeQkCacheEqualsRopeThenCacheWrite) {
  REQUIRE_GPU();
  for (auto style : {RopeStyle::RotateHalf, RopeStyle::Interleaved}) {
    for (auto [n_freq, rotary_scale] : {std::pair{64, 1.f}, {32, 1.f}, {16, 1.f}, {48, 1.19f}}) {
      const int T = 7, H = 6, KVH = 2, D = 128, slots_total = 40;
      const size_t row = size_t(H + 2 * KVH) * D;
      std::vector<uint16_t> qkv(T * row);
      for (auto& x : qkv) x = f32_to_fp16(std::normal_distribution<float>()(test::rng()));
      std::vector<int32_t> pos{0, 3, 100, 4095, 7, 8, 9}, slots{5, 0, 39, -1, 17, 18, 2};
      std::vector<float> inv(n_freq);
      for (int i = 0; i < n_freq; ++i) inv[i] = 1.0f / std::pow(10000.0f, 2.0f * i / (2 * n_freq));
      auto dev = [](const void* src, size_t bytes) {
        cuda::DeviceBuffer d(bytes);
        FDPP_CUDA_CHECK(cudaMemcpy(d.get(), src, bytes, cudaMemcpyHostToDevice));
        return d;
      };
      auto q1 = dev(qkv.data(), qkv.size() * 2), q2 = dev(qkv.data(), qkv.size() * 2);
      auto p_d = dev(pos.data(), pos.size() * 4), s_d = dev(slots.data(), slots.size() * 4),
           f_d = dev(inv.data(), inv.size() * 4);
      const size_t cache_bytes = size_t(slots_total) * KVH * D * 2;
      cuda::DeviceBuffer k1(cache_bytes), v1(cache_bytes), k2(cache_bytes), v2(cache_bytes);
      for (auto* b : {&k1, &v1, &k2, &v2}) FDPP_CUDA_CHECK(cudaMemset(b->get(), 0x3c, cache_bytes));
      cuda::rope_qk(q1.get(), p_d.as<int32_t>(), f_d.as<float>(), n_freq, T, H, KVH, D, style, cuda::DType::F16, nullptr,
                    rotary_scale);
      const int block_size = 8;  // 5 blocks of slots_total
      cuda::kv_cache_write(q1.get(), s_d.as<int32_t>(), T, H, KVH, D, block_size, k1.get(), v1.get(), cuda::DType::F16,
                           nullptr);
      cuda::rope_qk_cache(q2.get(), p_d.as<int32_t>(), f_d.as<float>(), n_freq, s_d.as<int32_t>(), T, H, KVH, D,
                          block_size, style, k2.get(), v2.get(), cuda::DType::F16, nullptr, {}, rotary_scale);
      FDPP_CUDA_CHECK(cudaDeviceSynchronize());
      auto host = [](const cuda::DeviceBuffer& b) {
        std::vector<uint16_t> h(b.bytes() / 2);
        FDPP_CUDA_CHECK(cudaMemcpy(h.data(), b.get(), b.bytes(), cudaMemcpyDeviceToHost));
        return h;
      };
      EXPECT_EQ(host(k1), host(k2)) << "k cache, n_freq " << n_freq;
      EXPECT_EQ(host(v1), host(v2)) << "v cache, n_freq " << n_freq;
      const auto a = host(q1), b = host(q2);
      for (int t = 0; t < T; ++t)  // the q heads (k in qkv is left unrotated by the fused kernel)
        for (size_t i = 0; i < size_t(H) * D; ++i) ASSERT_EQ(a[t * row + i], b[t * row + i]) << "q, token " << t;
    }
  }
}

// The CUDA-core GEMV against the CPU reference: every M it takes, odd N, K on the 16-byte path
// and off it, bias, 16-bit and fp32 output, both dtypes; outputs poisoned first.
TEST(CudaGemv, MatchesCpuForEveryM) {
  REQUIRE_GPU();
  for (auto dt : {cuda::DType::F16, cuda::DType::BF16}) {
    for (auto [N, K] : {std::pair{1001, 4096}, {64, 1000}, {37, 1001}, {4096, 11008}}) {
      auto round16 = [dt](std::vector<float> v, std::vector<uint16_t>& bits) {
        bits.resize(v.size());
        for (size_t i = 0; i < v.size(); ++i) {
          bits[i] = dt == cuda::DType::F16 ? f32_to_fp16(v[i]) : f32_to_bf16(v[i]);
          v[i] = dt == cuda::DType::F16 ? fp16_to_f32(bits[i]) : bf16_to_f32(bits[i]);
        }
        return v;
      };
      std::vector<uint16_t> wb, xb, bb;
      const auto w = round16(test::random_vector(size_t(N) * K, 1.0f / std::sqrt(float(K))), wb);
      const auto b = round16(test::random_vector(N), bb);
      const auto x = round16(test::random_vector(size_t(cuda::kGemvMaxM) * K), xb);
      auto dev = [](const void* src, size_t bytes) {
        cuda::DeviceBuffer d(bytes);
        FDPP_CUDA_CHECK(cudaMemcpy(d.get(), src, bytes, cudaMemcpyHostToDevice));
        return d;
      };
      auto w_d = dev(wb.data(), wb.size() * 2), x_d = dev(xb.data(), xb.size() * 2), b_d = dev(bb.data(), bb.size() * 2);
      cuda::DeviceBuffer y_d(size_t(cuda::kGemvMaxM) * N * 4);
      for (int M = 1; M <= cuda::kGemvMaxM; ++M) {
        for (bool with_bias : {false, true}) {
          for (bool fp32_out : {false, true}) {
            std::vector<float> ref(size_t(M) * N);
            cpu::linear(x.data(), M, K, w.data(), N, with_bias ? b.data() : nullptr, ref.data());
            FDPP_CUDA_CHECK(cudaMemset(y_d.get(), 0xff, y_d.bytes()));  // NaN in every format
            cuda::gemv(x_d.get(), w_d.get(), with_bias ? b_d.get() : nullptr, y_d.get(), M, N, K, dt, fp32_out, nullptr);
            FDPP_CUDA_CHECK(cudaDeviceSynchronize());
            std::vector<float> out(size_t(M) * N);
            if (fp32_out) {
              FDPP_CUDA_CHECK(cudaMemcpy(out.data(), y_d.get(), out.size() * 4, cudaMemcpyDeviceToHost));
            } else {
              std::vector<uint16_t> h(out.size());
              FDPP_CUDA_CHECK(cudaMemcpy(h.data(), y_d.get(), h.size() * 2, cudaMemcpyDeviceToHost));
              for (size_t i = 0; i < h.size(); ++i) out[i] = dt == cuda::DType::F16 ? fp16_to_f32(h[i]) : bf16_to_f32(h[i]);
            }
            const double e = test::nmse(out, ref);
            EXPECT_LE(e, fp32_out ? 1e-9 : 5e-4) << "N " << N << " K " << K << " M " << M << " bias " << with_bias
                                                 << " fp32 " << fp32_out;
          }
        }
      }
    }
  }
}

TEST(CudaEngine, BatchedDecodeOfMixedLengthsEqualsOneByOne) {
  REQUIRE_GPU();
  const ModelConfig c = tiny("llama", 128);
  const DecoderWeights w = random_weights(c);
  auto model = std::make_shared<const cuda::DeviceModel>(c, w, cuda::DType::F16);
  const std::vector<int> lengths{1, 17, 64, 200, 5};
  std::vector<std::vector<int32_t>> prompts;
  for (int n : lengths) prompts.push_back(random_ids(n, c.vocab_size));
  const auto next = random_ids(static_cast<int>(lengths.size()), c.vocab_size);

  cuda::EngineOptions eo;
  eo.max_batch = 8;
  eo.kv_cache_tokens = 4096;
  cuda::CudaEngine batched(model, eo);
  const std::vector<int> seqs = prefilled_sequences(batched, prompts);
  const std::vector<float> rows = decode(batched, seqs, next);

  for (size_t i = 0; i < lengths.size(); ++i) {
    auto single = gpu_runner(model, lengths[i] + 1, cuda::EngineOptions{});
    std::vector<float> ignore(c.vocab_size), one(c.vocab_size);
    single->forward(prompts[i], 0, false, ignore);
    single->forward(std::span(&next[i], 1), lengths[i], false, one);
    const double e = test::nmse(std::span<const float>(&rows[i * c.vocab_size], c.vocab_size), one);
    EXPECT_LE(e, 1e-5) << "sequence " << i << " of length " << lengths[i];
  }
}

// One async engine through steps whose batch and split count change (graphs of several (batch,
// splits) keys sharing one workspace and one set of counters), against a sync engine doing the
// same steps: every step's logits agree.
// gemma2: the masked kernels (soft-cap in every layer, windows in every other), graphs included.
TEST(CudaEngine, AsyncEngineVaryingBatchesAndSplitsEqualsSync) {
  REQUIRE_GPU();
  for (const char* recipe : {"llama", "gemma2"}) {
  SCOPED_TRACE(recipe);
  ModelConfig c = tiny(recipe, 128);
  c.max_context = 4096;
  const DecoderWeights w = random_weights(c);
  auto model = std::make_shared<const cuda::DeviceModel>(c, w, cuda::DType::F16);
  const std::vector<int> lengths{3000, 300, 40, 1200};
  std::vector<std::vector<int32_t>> prompts;
  for (int n : lengths) prompts.push_back(random_ids(n, c.vocab_size));
  const std::vector<std::vector<int>> steps{{0}, {0, 1, 2, 3}, {1}, {0, 2}, {3, 1}, {0}, {2}, {0, 1, 2, 3}, {0}};
  std::vector<std::vector<float>> logits[2];
  for (int mode = 0; mode < 2; ++mode) {
    cuda::EngineOptions eo;
    eo.max_batch = 4;
    eo.kv_cache_tokens = 8192;
    eo.attention = mode == 0 ? cuda::AttentionMode::Sync : cuda::AttentionMode::Async;
    cuda::CudaEngine e(model, eo);
    const std::vector<int> seqs = prefilled_sequences(e, prompts);
    int t = 0;
    for (int rep = 0; rep < 2; ++rep)  // the second pass replays the captured graphs
      for (const auto& step : steps) {
        std::vector<int> ss;
        std::vector<int32_t> toks;
        for (int i : step) {
          ss.push_back(seqs[i]);
          toks.push_back((7 * t++ + i) % c.vocab_size);
        }
        logits[mode].push_back(decode(e, ss, toks));
      }
    if (mode == 1 && std::string(recipe) == "llama") EXPECT_EQ(e.attention_fallback_rows(), 0u);
  }
  ASSERT_EQ(logits[0].size(), logits[1].size());
  for (size_t i = 0; i < logits[0].size(); ++i) EXPECT_LE(test::nmse(logits[1][i], logits[0][i]), 5e-4) << "step " << i;
  }
}

// warm_up times the linear layers for every row bucket up to the step's tokens; an engine after it
// computes what one without it computes (the same kernels, possibly other cuBLASLt algorithms).
TEST(CudaEngine, WarmUpKeepsTheResults) {
  REQUIRE_GPU();
  ModelConfig c = tiny("llama", 64);
  c.max_context = 512;
  const DecoderWeights w = random_weights(c);
  auto model = std::make_shared<const cuda::DeviceModel>(c, w, cuda::DType::F16);
  const auto prompt = random_ids(300, c.vocab_size);
  std::vector<float> logits[2];
  for (int warm = 0; warm < 2; ++warm) {
    cuda::EngineOptions eo;
    eo.max_batch = 16;
    eo.max_prefill_tokens = 1024;
    eo.kv_cache_tokens = 2048;
    cuda::CudaEngine e(model, eo);
    if (warm == 1) e.warm_up();
    const int seq = e.create_sequence();
    Batch b;
    StepRow row;
    row.seq = seq;
    row.tokens = prompt;
    row.logits = true;
    b.rows.push_back(row);
    logits[warm] = e.step(b).logits;
  }
  ASSERT_EQ(logits[0].size(), logits[1].size());
  EXPECT_LE(test::nmse(logits[1], logits[0]), 1e-4);
}

TEST(CudaEngine, GraphReplayEqualsEagerLaunches) {
  REQUIRE_GPU();
  const ModelConfig c = tiny("llama", 64);
  const DecoderWeights w = random_weights(c);
  auto model = std::make_shared<const cuda::DeviceModel>(c, w, cuda::DType::F16);
  const auto prompt = random_ids(20, c.vocab_size);
  const auto steps = random_ids(6, c.vocab_size);
  std::vector<std::vector<float>> out[2];
  for (int graphs = 0; graphs < 2; ++graphs) {
    cuda::EngineOptions eo;
    eo.cuda_graphs = graphs == 1;
    auto r = gpu_runner(model, 64, eo);
    std::vector<float> l(c.vocab_size);
    r->forward(prompt, 0, false, l);
    for (size_t s = 0; s < steps.size(); ++s) {  // the first steps run eagerly, later ones replay
      r->forward(std::span(&steps[s], 1), 20 + static_cast<int>(s), false, l);
      out[graphs].push_back(l);
    }
  }
  for (size_t s = 0; s < steps.size(); ++s) EXPECT_EQ(out[0][s], out[1][s]) << "step " << s;
}

// Graph-replayed decode steps run at the batch's bucket (decode_graph_rows) with padding rows: the
// real rows' logits match an eager engine's at the exact batch, steps of 9, 11 and 13 rows share the
// graph of 16, and the padding writes nothing into the cache (later steps still agree).
// mistral-window: every layer slides, so row 0's first blocks have been given back (kFreed) when the
// padding rows copy its table.
// Padded graph batches against eager steps (the tests below), for an engine built from `base`.
void expect_padded_graph_batches_equal_eager_steps(const cuda::EngineOptions& base) {
  for (const char* recipe : {"llama", "mistral-window"}) {
    SCOPED_TRACE(recipe);
    ModelConfig c = tiny(recipe, 64);
    c.max_context = 512;
    const DecoderWeights w = random_weights(c);
    auto model = std::make_shared<const cuda::DeviceModel>(c, w, cuda::DType::F16);
    std::vector<std::vector<int32_t>> prompts;
    // (The longest first under mistral-window: row 0, whose table the padding rows copy, then holds
    // kFreed entries.)
    const bool windowed = c.has_sliding_window();
    for (int i = 0; i < 13; ++i) prompts.push_back(random_ids(5 + 7 * (windowed ? 12 - i : i), c.vocab_size));
    const std::vector<int> batches{11, 9, 13, 11, 3, 13};
    std::vector<std::vector<float>> logits[2];
    for (int graphs = 0; graphs < 2; ++graphs) {
      cuda::EngineOptions eo = base;
      eo.max_batch = 16;
      eo.kv_cache_tokens = 4096;
      eo.cuda_graphs = graphs == 1;
      cuda::CudaEngine e(model, eo);
      const std::vector<int> seqs = prefilled_sequences(e, prompts);
      int t = 0;
      for (int b : batches) {
        std::vector<int> ss(seqs.begin(), seqs.begin() + b);
        std::vector<int32_t> toks;
        for (int i = 0; i < b; ++i) toks.push_back((5 * t++ + 3 * i) % c.vocab_size);
        logits[graphs].push_back(decode(e, ss, toks));
      }
    }
    ASSERT_EQ(logits[0].size(), logits[1].size());
    for (size_t i = 0; i < logits[0].size(); ++i) {
      ASSERT_EQ(logits[0][i].size(), logits[1][i].size());
      EXPECT_LE(test::nmse(logits[1][i], logits[0][i]), 5e-4) << "step " << i;
    }
  }
}

TEST(CudaEngine, PaddedGraphBatchesEqualEagerSteps) {
  REQUIRE_GPU();
  expect_padded_graph_batches_equal_eager_steps(cuda::EngineOptions{});
}

TEST(CudaEngine, DeviceGreedySamplingEqualsHostArgmax) {
  REQUIRE_GPU();
  const ModelConfig c = tiny("llama", 64);
  const DecoderWeights w = random_weights(c);
  auto model = std::make_shared<const cuda::DeviceModel>(c, w, cuda::DType::F16);
  auto r = gpu_runner(model, 64, cuda::EngineOptions{});
  const auto prompt = random_ids(9, c.vocab_size);
  SamplingParams sp;
  sp.temperature = 0;
  Sampler s(sp);
  const int32_t dev = r->forward_sample(prompt, 0, s, prompt, 0);
  auto r2 = gpu_runner(model, 64, cuda::EngineOptions{});
  std::vector<float> l(c.vocab_size);
  r2->forward(prompt, 0, false, l);
  EXPECT_EQ(dev, argmax(l));
}

TEST(CudaEngine, KvCacheFullIsAClearError) {
  REQUIRE_GPU();
  const ModelConfig c = tiny("llama", 64);
  const DecoderWeights w = random_weights(c);
  auto model = std::make_shared<const cuda::DeviceModel>(c, w, cuda::DType::F16);
  cuda::EngineOptions eo;
  eo.kv_cache_tokens = 64;
  cuda::CudaEngine e(model, eo);
  const int seq = e.create_sequence();
  try {
    prefill(e, seq, random_ids(100, c.vocab_size));
    FAIL() << "expected an error";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("KV cache full"), std::string::npos) << err.what();
  }
  // The engine stays usable: a request that fits still runs.
  const int seq2 = e.create_sequence();
  EXPECT_NO_THROW(prefill(e, seq2, random_ids(40, c.vocab_size)));
}

// The default model on the GPU against HF transformers' logits (fixtures of the CPU test).
TEST(CudaEngine, DefaultModelLogitsMatchTransformers) {
  REQUIRE_GPU();
  const std::string path = test::default_model_or_empty();
  if (path.empty()) GTEST_SKIP() << "default model not present";
  const LoadedModel m = load_model(path);
  const auto ref = test::read_npy(test::fixture("smollm2/logits_2.npy"));
  const int T = static_cast<int>(ref.shape[0]);
  std::ifstream f(test::fixture("smollm2/reference.json"));
  const auto j = nlohmann::json::parse(f);
  const auto ids = j["prompts"][2]["ids"].get<std::vector<int32_t>>();
  ASSERT_EQ(static_cast<int>(ids.size()), T);
  for (auto dt : {cuda::DType::F16, cuda::DType::BF16}) {
    auto model = std::make_shared<const cuda::DeviceModel>(m.config(), m.weights, dt);
    auto r = gpu_runner(model, T, cuda::EngineOptions{});
    std::vector<float> logits(static_cast<size_t>(T) * m.config().vocab_size, NAN);
    r->forward(ids, 0, true, logits);
    const double e = test::nmse(logits, ref.data);
    std::printf("default model on GPU (%s): logits NMSE vs transformers %.3e\n", dt == cuda::DType::F16 ? "f16" : "bf16", e);
    EXPECT_LE(e, dt == cuda::DType::F16 ? 5e-4 : 5e-3);
  }
}

// Issue 5: the asynchronized softmax (unified max, the engine's default) against the synchronized
// one, whole model, decode steps over a prompt long enough for split-KV: logits within NMSE 5e-4
// (fp16). With phi = 0 the default model's rows are all in range (no fallback); with phi = 500
// every row falls back and is recomputed, and the logits must not change either (the steps run two
// or more splits, and the async runs take the tensor-core loop even where a CTA holds one head: one
// split or the CUDA-core loop would run the synchronized kernels and recompute nothing).
TEST(CudaEngine, AsyncSoftmaxLogitsEqualSyncWholeModel) {
  REQUIRE_GPU();
  const std::string path = test::default_model_or_empty();
  ModelConfig c;
  DecoderWeights w;
  LoadedModel m;
  if (!path.empty()) {
    m = load_model(path);
    c = m.config();
  } else {
    c = tiny("llama", 64);
    // Long enough for two splits per decode step (600 keys): with one split the async mode runs the
    // synchronized kernel, and phi = 500 would recompute nothing.
    c.max_context = 2048;
    w = random_weights(c);
  }
  const DecoderWeights& weights = path.empty() ? w : m.weights;
  const int T = std::min(600, c.max_context - 40), steps = 24;
  const auto ids = random_ids(T + steps, c.vocab_size);
  auto model = std::make_shared<const cuda::DeviceModel>(c, weights, cuda::DType::F16);
  auto run = [&](cuda::AttentionMode mode, float phi, uint64_t* fallback, uint64_t* rows, uint64_t* unified) {
    cuda::EngineOptions eo;
    eo.attention = mode;
    if (mode == cuda::AttentionMode::Async) eo.kernels.decode_path = cuda::DecodePath::Mma;
    if (phi != 0.f) eo.unified_max_phi.assign(c.n_layers, phi);
    auto r = gpu_runner(model, T + steps, eo);
    std::vector<float> logits(size_t(steps) * c.vocab_size, NAN);
    r->forward(std::span(ids.data(), T), 0, false, std::span(logits.data(), c.vocab_size));
    for (int s = 0; s < steps; ++s)
      r->forward(std::span(&ids[T + s], 1), T + s, false, std::span(logits.data() + size_t(s) * c.vocab_size, c.vocab_size));
    if (fallback != nullptr) *fallback = static_cast<cuda::CudaEngine&>(r->engine()).attention_fallback_rows();
    if (rows != nullptr) *rows = static_cast<cuda::CudaEngine&>(r->engine()).attention_rows();
    if (unified != nullptr) *unified = static_cast<cuda::CudaEngine&>(r->engine()).attention_unified_rows();
    return logits;
  };
  uint64_t fb = 0, rows = 0, fb_all = 0, rows_all = 0, unified = 0, unified_all = 0;
  const auto sync_logits = run(cuda::AttentionMode::Sync, 0.f, nullptr, nullptr, nullptr);
  const auto async_logits = run(cuda::AttentionMode::Async, 0.f, &fb, &rows, &unified);
  const auto forced = run(cuda::AttentionMode::Async, 500.f, &fb_all, &rows_all, &unified_all);
  const double e = test::nmse(async_logits, sync_logits), e_forced = test::nmse(forced, sync_logits);
  std::printf("%s: async vs sync logits NMSE %.3e (fallback %llu of %llu rows); phi = 500: NMSE %.3e (fallback %llu of "
              "%llu rows)\n",
              path.empty() ? "tiny llama" : "default model", e, (unsigned long long)fb, (unsigned long long)rows,
              e_forced, (unsigned long long)fb_all, (unsigned long long)rows_all);
  EXPECT_LE(e, 5e-4);
  EXPECT_LE(e_forced, 5e-4);
  EXPECT_GT(rows, 0u);
  EXPECT_EQ(rows_all, rows);
  EXPECT_EQ(unified_all, rows_all) << "every decode step of 600+ keys runs two or more splits on tensor cores";
  EXPECT_EQ(fb_all, rows_all) << "phi = 500 puts every row's max logit below phi + a: all must fall back";
}

}  // namespace
}  // namespace fdpp

namespace fdpp {
namespace {

// Every HF fixture checkpoint (tests/fixtures/hf/*, made by transformers) on the GPU against
// HF's fp32 logits, sliding windows shorter than the ids and soft-capping included (Gemma 2/3,
// Mistral, Phi-3, Qwen3 with windows). Models the CUDA backend refuses (cuda_model_problem: head
// dims 16 and 32, expert layers) are reported and skipped by name.
TEST(CudaHfFixtures, LogitsMatchTransformers) {
  REQUIRE_GPU();
  namespace fs = std::filesystem;
  const fs::path root = test::fixture("hf");
  if (!fs::exists(root)) GTEST_SKIP() << "no HF fixtures";
  int ran = 0;
  for (const auto& entry : fs::directory_iterator(root)) {
    const fs::path dir = entry.path();
    if (!entry.is_directory() || !fs::exists(dir / "reference.json")) continue;
    std::ifstream f(dir / "reference.json");
    const auto ref = nlohmann::json::parse(f);
    // A GGUF variant names its file; the others are the directory itself.
    const LoadedModel m = load_model(ref.contains("model") ? (dir / ref["model"].get<std::string>()).string()
                                                           : dir.string());
    const ModelConfig& c = m.config();
    if (const std::string problem = cuda::cuda_model_problem(c); !problem.empty()) {
      std::printf("%-28s skipped: %s\n", dir.filename().c_str(), problem.c_str());
      continue;
    }
    const auto ids = ref["ids"].get<std::vector<int32_t>>();
    // What the masked attention kernels meet here: windows shorter than the ids, soft-capping.
    int shortest = 0;
    for (int w : c.layer_windows)
      if (w > 0 && w < static_cast<int>(ids.size()) && (shortest == 0 || w < shortest)) shortest = w;
    if (shortest > 0 || c.attn_softcap > 0 || c.final_softcap > 0)
      std::printf("%-28s window %d of %zu ids, attention softcap %g, final softcap %g\n", dir.filename().c_str(),
                  shortest, ids.size(), c.attn_softcap, c.final_softcap);
    const auto expected = test::read_npy((dir / ref["logits"].get<std::string>()).string());
    for (auto dt : {cuda::DType::F16, cuda::DType::BF16}) {
      auto model = std::make_shared<const cuda::DeviceModel>(c, m.weights, dt);
      auto r = gpu_runner(model, static_cast<int>(ids.size()), cuda::EngineOptions{});
      std::vector<float> logits(ids.size() * c.vocab_size, NAN);
      r->forward(ids, 0, true, logits);
      const double e = test::nmse(logits, expected.data);
      std::printf("%-28s %s on GPU: logits NMSE vs transformers %.3e\n", dir.filename().c_str(),
                  dt == cuda::DType::F16 ? "f16 " : "bf16", e);
      EXPECT_LE(e, dt == cuda::DType::F16 ? 5e-4 : 5e-3) << dir.filename();
      if (shortest > 0 || c.attn_softcap > 0 || c.has_moe()) {
        // The same ids as a prompt of 8 and then one decode step each: decode attention with the
        // window (past it, where every layer slides, the blocks behind it given back) and the cap;
        // expert layers through their one-token kernels (the prompt took the tensor-core ones).
        auto d = gpu_runner(model, static_cast<int>(ids.size()), cuda::EngineOptions{});
        std::vector<float> step_logits(ids.size() * c.vocab_size, NAN);
        const size_t prompt = std::min<size_t>(8, ids.size());
        const std::span<const int32_t> all(ids);
        d->forward(all.first(prompt), 0, true, std::span<float>(step_logits).first(prompt * c.vocab_size));
        for (size_t t = prompt; t < ids.size(); ++t)
          d->forward(all.subspan(t, 1), static_cast<int>(t), true,
                     std::span<float>(step_logits).subspan(t * c.vocab_size, c.vocab_size));
        const double ed = test::nmse(step_logits, expected.data);
        std::printf("%-28s %s on GPU, decode steps: logits NMSE vs transformers %.3e\n", dir.filename().c_str(),
                    dt == cuda::DType::F16 ? "f16 " : "bf16", ed);
        EXPECT_LE(ed, dt == cuda::DType::F16 ? 5e-4 : 5e-3) << dir.filename() << " (decode steps)";
      }
    }
    ++ran;
  }
  EXPECT_GT(ran, 0);
}

// ---- the fp8 (e4m3) KV cache (--kv-cache-dtype fp8) ----

cuda::EngineOptions fp8_cache(cuda::EngineOptions eo = {}) {
  eo.kv_quant.dtype = cuda::KvDType::Fp8E4M3;  // scales 1, as the runtime passes them
  return eo;
}

// The share of rows of vocab logits whose argmax is the same in a and b.
double argmax_agreement(const std::vector<float>& a, const std::vector<float>& b, int vocab) {
  const size_t rows = a.size() / vocab;
  size_t same = 0;
  for (size_t r = 0; r < rows; ++r) {
    const auto ra = a.begin() + r * vocab, rb = b.begin() + r * vocab;
    same += std::max_element(ra, ra + vocab) - ra == std::max_element(rb, rb + vocab) - rb;
  }
  return rows == 0 ? 1.0 : double(same) / rows;
}

class CudaFp8KvCache : public ::testing::TestWithParam<RecipeCase> {};

// The same engine with an e4m3 cache against the 16-bit one: K and V keep 3 mantissa bits (an error
// up to 2^-4 relative, about 2.5% rms over the tiny models' ~N(0, 1) keys and values; e4m3 -> 16 bits
// is exact, so nothing else differs), read back by prefill and by decode attention. Bound: the
// logits' NMSE over a 37-token prefill (every position) and 5 decode steps at most 5e-3 (the CPU's f16
// cache test bounds 2^-11 roundings by 1e-5; this is that bound scaled by the squared rounding, with
// room), never 0, and the greedy token the same at 3 positions of 4 or more. Every fp8 head dim, both
// dtypes, MQA with interleaved rope, soft-capping and sliding windows.
TEST_P(CudaFp8KvCache, LogitsStayCloseToThe16BitCache) {
  REQUIRE_GPU();
  const auto& p = GetParam();
  const ModelConfig c = tiny(p.recipe, p.head_dim);
  const DecoderWeights w = random_weights(c);
  const int T = 37, steps = 5;
  const auto ids = random_ids(T + steps, c.vocab_size);
  auto model = std::make_shared<const cuda::DeviceModel>(c, w, p.dtype);
  std::vector<float> logits[2];  // 16-bit cache, fp8 cache: T prefill rows, then one row per step
  for (int fp8 = 0; fp8 < 2; ++fp8) {
    auto r = gpu_runner(model, T + steps, fp8 == 1 ? fp8_cache() : cuda::EngineOptions{});
    std::vector<float> rows(size_t(T) * c.vocab_size, NAN), step(c.vocab_size, NAN);
    r->forward(std::span(ids.data(), T), 0, true, rows);
    for (int s = 0; s < steps; ++s) {
      r->forward(std::span(&ids[T + s], 1), T + s, false, step);
      rows.insert(rows.end(), step.begin(), step.end());
    }
    logits[fp8] = std::move(rows);
  }
  const double e = test::nmse(logits[1], logits[0]);
  const double same = argmax_agreement(logits[1], logits[0], c.vocab_size);
  std::printf("%s hd%d %s: fp8 KV cache against the 16-bit one: logits NMSE %.3e, greedy tokens %.0f%% the same\n",
              p.recipe.c_str(), p.head_dim, p.dtype == cuda::DType::F16 ? "f16" : "bf16", e, 100 * same);
  EXPECT_LE(e, 5e-3);
  EXPECT_GT(e, 0.0) << "the e4m3 cache rounds K and V: the logits cannot be the 16-bit cache's";
  EXPECT_GE(same, 0.75);
}

INSTANTIATE_TEST_SUITE_P(
    Variants, CudaFp8KvCache,
    ::testing::Values(RecipeCase{"llama", 64, cuda::DType::F16}, RecipeCase{"llama", 128, cuda::DType::BF16},
                      RecipeCase{"chatglm", 128, cuda::DType::F16}, RecipeCase{"opt", 64, cuda::DType::BF16},
                      RecipeCase{"gemma2", 256, cuda::DType::BF16}, RecipeCase{"gemma3", 128, cuda::DType::F16},
                      RecipeCase{"mistral-window", 64, cuda::DType::BF16}),
    [](const auto& info) {
      std::string n = info.param.recipe + "_hd" + std::to_string(info.param.head_dim) +
                      (info.param.dtype == cuda::DType::F16 ? "_f16" : "_bf16");
      for (auto& ch : n)
        if (ch == '-') ch = '_';
      return n;
    });

// CUDA graphs replay what eager launches compute on an fp8 cache, bit for bit (one sequence, the
// first steps eager and later ones replayed), in both softmax modes.
TEST(CudaFp8KvCacheEngine, GraphReplayEqualsEagerLaunches) {
  REQUIRE_GPU();
  for (const bool async : {true, false}) {
    const ModelConfig c = tiny("llama", 128);
    const DecoderWeights w = random_weights(c);
    auto model = std::make_shared<const cuda::DeviceModel>(c, w, cuda::DType::BF16);
    const auto prompt = random_ids(20, c.vocab_size);
    const auto steps = random_ids(6, c.vocab_size);
    std::vector<std::vector<float>> out[2];
    for (int graphs = 0; graphs < 2; ++graphs) {
      cuda::EngineOptions eo = fp8_cache();
      eo.cuda_graphs = graphs == 1;
      eo.attention = async ? cuda::AttentionMode::Async : cuda::AttentionMode::Sync;
      auto r = gpu_runner(model, 64, eo);
      std::vector<float> l(c.vocab_size);
      r->forward(prompt, 0, false, l);
      for (size_t s = 0; s < steps.size(); ++s) {
        r->forward(std::span(&steps[s], 1), 20 + static_cast<int>(s), false, l);
        out[graphs].push_back(l);
      }
    }
    for (size_t s = 0; s < steps.size(); ++s)
      EXPECT_EQ(out[0][s], out[1][s]) << "step " << s << (async ? " async" : " sync");
  }
}

// Padded graph batches (decode_graph_rows) on an fp8 cache: the real rows agree with an eager
// engine's steps at the exact batch, and the padding rows write nothing into the cache (later steps
// still agree); mistral-window gives blocks behind the window back.
TEST(CudaFp8KvCacheEngine, PaddedGraphBatchesEqualEagerSteps) {
  REQUIRE_GPU();
  expect_padded_graph_batches_equal_eager_steps(fp8_cache());
}

// memory(): at the same memory fraction the e4m3 cache holds about twice the tokens of the 16-bit
// one (one byte an element instead of two; the free memory both see differs only by what the first
// engine left behind, such as cuBLAS's handles), and each holds exactly its tokens' bytes. A cache
// sized in tokens holds those tokens either way, in half the bytes.
TEST(CudaFp8KvCacheEngine, HoldsTwiceTheTokensInTheSameMemory) {
  REQUIRE_GPU();
  const ModelConfig c = tiny("llama", 128);
  const DecoderWeights w = random_weights(c);
  auto model = std::make_shared<const cuda::DeviceModel>(c, w, cuda::DType::F16);
  const uint64_t elements_per_token = 2 * uint64_t(c.n_layers) * c.kv_dim();  // K and V of every layer
  cuda::MemoryReport by_fraction[2], by_tokens[2];
  for (int fp8 = 0; fp8 < 2; ++fp8) {
    cuda::EngineOptions eo = fp8 == 1 ? fp8_cache() : cuda::EngineOptions{};
    eo.memory_fraction = 0.25;
    {
      cuda::CudaEngine e(model, eo);
      by_fraction[fp8] = e.memory();
    }
    eo.kv_cache_tokens = 4096;
    cuda::CudaEngine e(model, eo);
    by_tokens[fp8] = e.memory();
    EXPECT_EQ(by_fraction[fp8].kv_cache, uint64_t(by_fraction[fp8].kv_tokens) * elements_per_token * (2 - fp8));
  }
  const double ratio = double(by_fraction[1].kv_tokens) / double(by_fraction[0].kv_tokens);
  std::printf("KV tokens at memory fraction 0.25: %lld (16-bit), %lld (fp8): %.3fx\n",
              static_cast<long long>(by_fraction[0].kv_tokens), static_cast<long long>(by_fraction[1].kv_tokens), ratio);
  EXPECT_NEAR(ratio, 2.0, 0.1);
  EXPECT_EQ(by_tokens[0].kv_tokens, 4096);
  EXPECT_EQ(by_tokens[1].kv_tokens, 4096);
  EXPECT_EQ(by_tokens[1].kv_cache * 2, by_tokens[0].kv_cache);
}

// randomize_kv_cache (fdpp bench's setup) fills an fp8 cache with e4m3 bytes of small values, never
// the NaN codes 0x7F and 0xFF: a decode step over a context of nearly the whole randomized cache
// gives finite logits, in both softmax modes.
TEST(CudaFp8KvCacheEngine, RandomizedCacheDecodesToFiniteLogits) {
  REQUIRE_GPU();
  for (const bool async : {true, false}) {
    const ModelConfig c = tiny("llama", 64);
    const DecoderWeights w = random_weights(c);
    auto model = std::make_shared<const cuda::DeviceModel>(c, w, cuda::DType::F16);
    cuda::EngineOptions eo = fp8_cache();
    eo.max_batch = 2;
    eo.kv_cache_tokens = 1024;  // 400 + 100 tokens and the step's next block
    eo.attention = async ? cuda::AttentionMode::Async : cuda::AttentionMode::Sync;
    cuda::CudaEngine e(model, eo);
    const int seqs[] = {e.create_sequence(), e.create_sequence()};
    e.reserve_for_benchmark(seqs[0], 400);
    e.reserve_for_benchmark(seqs[1], 100);
    e.randomize_kv_cache(99);
    const int32_t toks[] = {5, 6};
    const std::vector<float> l = decode(e, seqs, toks);
    EXPECT_TRUE(std::all_of(l.begin(), l.end(), [](float x) { return std::isfinite(x); }))
        << (async ? "async" : "sync") << ": a NaN byte in the randomized cache was read";
  }
}

// The engine refuses fp8 scales that are not positive and finite, naming the option.
TEST(CudaFp8KvCacheEngine, RefusesBadScales) {
  REQUIRE_GPU();
  const ModelConfig c = tiny("llama", 64);
  const DecoderWeights w = random_weights(c);
  auto model = std::make_shared<const cuda::DeviceModel>(c, w, cuda::DType::F16);
  cuda::EngineOptions eo = fp8_cache();
  eo.kv_cache_tokens = 256;
  eo.kv_quant.v_scale = 0.f;
  try {
    cuda::CudaEngine e(model, eo);
    FAIL() << "expected an error";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("--kv-cache-dtype fp8"), std::string::npos) << err.what();
  }
}

// ---- the checkpoint's KV cache scales (ModelConfig::kv_cache_scales) ----

// Per-layer scales as an FP8 checkpoint publishes them: none a power of two (which would round
// every value as scale 1 does, so the runs below could not tell them from 1), and none so large
// that ~N(0, 1) keys and values fall into e4m3's subnormals.
ModelConfig with_checkpoint_scales(ModelConfig c) {
  const float k[] = {0.37f, 0.81f, 1.43f}, v[] = {1.29f, 0.53f, 0.91f};
  for (int l = 0; l < c.n_layers; ++l) c.kv_cache_scales.push_back({k[l % 3], v[l % 3]});
  return c;
}

// A 37-token prefill (every position's logits) and then 5 decode steps, on a runner of its own.
std::vector<float> prefill_then_decode(std::shared_ptr<const cuda::DeviceModel> model, const std::vector<int32_t>& ids,
                                       int prompt, const cuda::EngineOptions& eo) {
  const int vocab = model->config().vocab_size;
  auto r = gpu_runner(std::move(model), static_cast<int>(ids.size()), eo);
  std::vector<float> rows(size_t(prompt) * vocab, NAN), step(vocab, NAN);
  r->forward(std::span(ids.data(), prompt), 0, true, rows);
  for (size_t t = prompt; t < ids.size(); ++t) {
    r->forward(std::span(&ids[t], 1), static_cast<int>(t), false, step);
    rows.insert(rows.end(), step.begin(), step.end());
  }
  return rows;
}

// An e4m3 cache with each layer's scales from the model's config: every cache write and attention
// call of a layer uses that layer's, so the logits stay as close to the 16-bit cache's as with
// scales 1 (the same bound as LogitsStayCloseToThe16BitCache; a layer written with its scale and
// read with another would be far off), and differ from the run with scales 1 (so the scales reach
// the kernels). A 16-bit cache ignores the scales, bit for bit.
TEST(CudaFp8KvCacheEngine, UsesTheCheckpointsScalesPerLayer) {
  REQUIRE_GPU();
  for (const RecipeCase& p : {RecipeCase{"llama", 128, cuda::DType::BF16}, RecipeCase{"chatglm", 128, cuda::DType::F16},
                              RecipeCase{"mistral-window", 64, cuda::DType::BF16}}) {
    SCOPED_TRACE(p.recipe);
    const ModelConfig plain = tiny(p.recipe, p.head_dim);
    const ModelConfig scaled = with_checkpoint_scales(plain);
    const DecoderWeights w = random_weights(plain);
    auto model = std::make_shared<const cuda::DeviceModel>(plain, w, p.dtype);
    auto scaled_model = std::make_shared<const cuda::DeviceModel>(scaled, w, p.dtype);
    const int T = 37;
    const auto ids = random_ids(T + 5, plain.vocab_size);
    const std::vector<float> ref16 = prefill_then_decode(model, ids, T, cuda::EngineOptions{});
    const std::vector<float> ones = prefill_then_decode(model, ids, T, fp8_cache());
    const std::vector<float> per_layer = prefill_then_decode(scaled_model, ids, T, fp8_cache());
    const double e = test::nmse(per_layer, ref16), e_ones = test::nmse(ones, ref16);
    const double from_ones = test::nmse(per_layer, ones);
    std::printf("%s hd%d %s: fp8 KV cache with per-layer scales against the 16-bit one: logits NMSE %.3e (scales 1: "
                "%.3e; against scales 1: %.3e)\n",
                p.recipe.c_str(), p.head_dim, p.dtype == cuda::DType::F16 ? "f16" : "bf16", e, e_ones, from_ones);
    EXPECT_LE(e, 5e-3);
    EXPECT_GE(argmax_agreement(per_layer, ref16, plain.vocab_size), 0.75);
    EXPECT_GT(from_ones, 0.0) << "the per-layer scales round K and V differently from scale 1";
    EXPECT_EQ(prefill_then_decode(scaled_model, ids, T, cuda::EngineOptions{}), ref16)
        << "a 16-bit cache must ignore the checkpoint's scales";
  }
}

// The engine refuses per-layer scales that do not fit the model or are not positive and finite
// (the loader refuses them first; a config built in code reaches the engine as it is).
TEST(CudaFp8KvCacheEngine, RefusesBadPerLayerScales) {
  REQUIRE_GPU();
  const ModelConfig plain = tiny("llama", 64);
  const DecoderWeights w = random_weights(plain);
  cuda::EngineOptions eo = fp8_cache();
  eo.kv_cache_tokens = 256;
  ModelConfig zero = with_checkpoint_scales(plain);
  zero.kv_cache_scales[1].v = 0.f;
  ModelConfig short_list = with_checkpoint_scales(plain);
  short_list.kv_cache_scales.pop_back();
  for (const auto& [c, fragment] : {std::pair{zero, "(layer 1): fp8 KV cache scales must be positive and finite (k_scale 0.81, v_scale 0)"},
                                    std::pair{short_list, "2 layers of KV cache scales for a model of 3 layers"}}) {
    auto model = std::make_shared<const cuda::DeviceModel>(c, w, cuda::DType::F16);
    EXPECT_ERROR(cuda::CudaEngine e(model, eo), fragment);
    // A 16-bit cache has no scales to refuse.
    cuda::EngineOptions sixteen;
    sixteen.kv_cache_tokens = 256;
    EXPECT_NO_THROW({ cuda::CudaEngine e(model, sixteen); });
  }
}

}  // namespace
}  // namespace fdpp
