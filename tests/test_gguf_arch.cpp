// GGUF metadata -> ModelConfig for the architectures whose llama.cpp files carry more than the
// Llama layout's keys (Gemma 2 and 3, Phi-3), on metadata-only files written here: the rules the
// tiny converted fixtures cannot reach (llama.cpp's 27B attention scale, soft-cap defaults, layer
// patterns) and the one-line refusals. Whole converted models are checked against transformers
// in test_hf_models.cpp (HfFixtures) and against their HF directories in test_weight_plan.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>

#include "fdpp/error.h"
#include "gguf_writer.h"
#include "io/gguf.h"
#include "model/arch/architecture.h"
#include "model/gguf_model.h"
#include "test_util.h"

namespace fdpp {
namespace {

using gguf::ValueType;
using gguftest::GgufWriter;

#define EXPECT_ONE_LINE_ERROR(stmt, fragment)                                           \
  do {                                                                                  \
    const std::string msg_ = test::error_of([&] { stmt; });                             \
    EXPECT_NE(msg_.find(fragment), std::string::npos) << "error was: '" << msg_ << "'"; \
    EXPECT_EQ(msg_.find('\n'), std::string::npos) << msg_;                              \
  } while (0)

// hidden 64 over 4 heads of head_dim 32 (so hidden / heads = 16 differs from head_dim), 2 KV
// heads, ffn 128, vocab 100, context 128; `extra` adds keys and tensors.
ModelConfig config_of(const std::string& arch, int layers, const std::function<void(GgufWriter&)>& extra = {}) {
  GgufWriter w;
  const std::string k = arch + ".";
  w.kv_string("general.architecture", arch).kv_u32(k + "block_count", layers);
  w.kv_u32(k + "embedding_length", 64).kv_u32(k + "feed_forward_length", 128);
  w.kv_u32(k + "attention.head_count", 4).kv_u32(k + "attention.head_count_kv", 2);
  w.kv_u32(k + "context_length", 128).kv_u32(k + "vocab_size", 100);
  w.kv_f32(k + "attention.layer_norm_rms_epsilon", 1e-6f);
  if (arch != "phi3") w.kv_u32(k + "attention.key_length", 32).kv_u32(k + "attention.value_length", 32);
  if (extra) extra(w);
  const gguf::GgufFile f = gguf::GgufFile::from_bytes("t.gguf", w.build());
  const Architecture* a = find_gguf_architecture(arch);
  EXPECT_NE(a, nullptr);
  return a->gguf_config(f);
}

std::vector<uint8_t> f32_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

TEST(GgufArch, Gemma2) {
  const ModelConfig c = config_of("gemma2", 3, [](GgufWriter& w) { w.kv_u32("gemma2.attention.sliding_window", 8); });
  EXPECT_EQ(c.architecture, "gemma2");
  EXPECT_EQ(c.head_dim, 32);
  EXPECT_EQ(c.activation, Activation::GeGLU);
  EXPECT_TRUE(c.sandwich_norm);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_FALSE(c.has_local_rope);
  EXPECT_DOUBLE_EQ(c.embed_scale, 8.0);
  EXPECT_DOUBLE_EQ(c.attention_scale(), 1.0 / std::sqrt(32.0));  // head_dim, not hidden / heads
  EXPECT_EQ(c.layer_windows, (std::vector<int>{8, 0, 8}));       // every even layer is local
  // llama.cpp's defaults when the converter's keys are absent: Gemma 2's released caps.
  EXPECT_DOUBLE_EQ(c.attn_softcap, 50.0);
  EXPECT_DOUBLE_EQ(c.final_softcap, 30.0);
  EXPECT_DOUBLE_EQ(c.rope.theta, 10000.0);

  const ModelConfig capped = config_of("gemma2", 2, [](GgufWriter& w) {
    w.kv_f32("gemma2.attn_logit_softcapping", 1.5f).kv_f32("gemma2.final_logit_softcapping", 2.0f);
  });
  EXPECT_DOUBLE_EQ(capped.attn_softcap, 1.5);
  EXPECT_DOUBLE_EQ(capped.final_softcap, 2.0);
  EXPECT_TRUE(capped.layer_windows.empty());  // no window key: every layer global

  // Gemma 2 27B (46 layers) scales by hidden / heads: its query_pre_attn_scalar.
  EXPECT_DOUBLE_EQ(config_of("gemma2", 46).attention_scale(), 1.0 / std::sqrt(16.0));
}

TEST(GgufArch, Gemma3) {
  const ModelConfig c = config_of("gemma3", 7, [](GgufWriter& w) {
    w.kv_u32("gemma3.attention.sliding_window", 4).kv_f32("gemma3.rope.freq_base", 1e6f);
    w.kv_string("gemma3.rope.scaling.type", "linear").kv_f32("gemma3.rope.scaling.factor", 8.0f);
  });
  EXPECT_EQ(c.architecture, "gemma3");
  EXPECT_TRUE(c.qk_norm && c.sandwich_norm && c.has_local_rope);
  EXPECT_EQ(c.layer_windows, (std::vector<int>{4, 4, 4, 4, 4, 0, 4}));  // every 6th layer global
  EXPECT_DOUBLE_EQ(c.rope.theta, 1e6);
  EXPECT_EQ(c.rope.scaling, RopeScaling::Linear);
  EXPECT_DOUBLE_EQ(c.rope.factor, 8.0);
  EXPECT_DOUBLE_EQ(c.local_rope.theta, 10000.0);  // llama.cpp's local base without the key
  EXPECT_EQ(c.local_rope.scaling, RopeScaling::None);
  EXPECT_EQ(c.local_rope.rotary_dim, 32);
  EXPECT_EQ(c.attn_softcap, 0.0);
  EXPECT_EQ(c.final_softcap, 0.0);
  EXPECT_DOUBLE_EQ(c.attention_scale(), 1.0 / std::sqrt(32.0));
  EXPECT_DOUBLE_EQ(config_of("gemma3", 62).attention_scale(), 1.0 / std::sqrt(16.0));  // 27B
  EXPECT_TRUE(config_of("gemma3", 6).layer_windows.empty());

  const ModelConfig period = config_of("gemma3", 4, [](GgufWriter& w) {
    w.kv_u32("gemma3.attention.sliding_window", 5).kv_u32("gemma3.attention.sliding_window_pattern", 2);
    w.kv_f32("gemma3.rope.freq_base_swa", 100.f).kv_f32("gemma3.final_logit_softcapping", 30.f);
  });
  EXPECT_EQ(period.layer_windows, (std::vector<int>{5, 0, 5, 0}));
  EXPECT_DOUBLE_EQ(period.local_rope.theta, 100.0);
  EXPECT_DOUBLE_EQ(period.final_softcap, 30.0);

  const ModelConfig flags = config_of("gemma3", 3, [](GgufWriter& w) {
    w.kv_u32("gemma3.attention.sliding_window", 5);
    w.kv_array("gemma3.attention.sliding_window_pattern", ValueType::BOOL, std::vector<int>{0, 1, 1});
  });
  EXPECT_EQ(flags.layer_windows, (std::vector<int>{0, 5, 5}));
}

TEST(GgufArch, GemmaRefusals) {
  EXPECT_ONE_LINE_ERROR(
      config_of("gemma3", 3,
                [](GgufWriter& w) {
                  w.kv_u32("gemma3.attention.sliding_window", 5);
                  w.kv_array("gemma3.attention.sliding_window_pattern", ValueType::BOOL, std::vector<int>{1, 0});
                }),
      "gemma3.attention.sliding_window_pattern has 2 entries for block_count = 3 layers");
  EXPECT_ONE_LINE_ERROR(
      config_of("gemma3", 2,
                [](GgufWriter& w) {
                  w.kv_u32("gemma3.attention.sliding_window", 5);
                  w.kv_array("gemma3.attention.sliding_window_pattern", ValueType::F32, std::vector<float>{1, 0});
                }),
      "must be a period or one BOOL per layer");
  EXPECT_ONE_LINE_ERROR(config_of("gemma2", 2, [](GgufWriter& w) { w.kv_f32("gemma2.attn_logit_softcapping", -1.f); }),
                        "soft-capping values must be positive");
  EXPECT_ONE_LINE_ERROR(config_of("gemma3", 2, [](GgufWriter& w) { w.kv_f32("gemma3.rope.freq_base_swa", 0.f); }),
                        "gemma3.rope.freq_base_swa = 0 must be positive");
}

// Phi-3 128K's shape: head_dim 16 here (hidden 64 / 4 heads) with a partial rotary of 12.
void phi3_longrope(GgufWriter& w, size_t long_n = 6, size_t short_n = 6, bool both = true) {
  w.kv_u32("phi3.rope.dimension_count", 12).kv_u32("phi3.rope.scaling.original_context_length", 4);
  w.kv_f32("phi3.rope.scaling.attn_factor", 1.25f).kv_f32("phi3.rope.freq_base", 10000.f);
  w.kv_u32("phi3.attention.sliding_window", 6);
  std::vector<float> long_f(long_n), short_f(short_n);
  for (size_t i = 0; i < long_n; ++i) long_f[i] = 1.f + static_cast<float>(i);
  for (size_t i = 0; i < short_n; ++i) short_f[i] = 1.f + 0.5f * static_cast<float>(i);
  w.tensor("rope_factors_long.weight", {long_n}, gguf::GgmlType::F32, f32_bytes(long_f));
  if (both) w.tensor("rope_factors_short.weight", {short_n}, gguf::GgmlType::F32, f32_bytes(short_f));
}

TEST(GgufArch, Phi3) {
  const ModelConfig c = config_of("phi3", 2, [](GgufWriter& w) { phi3_longrope(w); });
  EXPECT_EQ(c.architecture, "phi3");
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.rope.rotary_dim, 12);
  EXPECT_EQ(c.rope.scaling, RopeScaling::LongRope);
  EXPECT_EQ(c.rope.long_factor, (std::vector<double>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(c.rope.short_factor, (std::vector<double>{1, 1.5, 2, 2.5, 3, 3.5}));
  EXPECT_DOUBLE_EQ(c.rope.attention_factor, 1.25);
  EXPECT_EQ(c.rope.original_max_positions, 4);
  EXPECT_EQ(c.rope.for_context(128).freq_factors, c.rope.long_factor);  // beyond the original length
  EXPECT_EQ(c.layer_windows, (std::vector<int>{6, 6}));
  EXPECT_FALSE(c.qkv_bias || c.out_bias || c.mlp_bias);

  const ModelConfig plain = config_of("phi3", 2, [](GgufWriter& w) { w.kv_u32("phi3.attention.sliding_window", 0); });
  EXPECT_EQ(plain.rope.scaling, RopeScaling::None);
  EXPECT_TRUE(plain.layer_windows.empty());
  EXPECT_EQ(plain.rope.rotary_dim, 16);
}

TEST(GgufArch, Phi3Refusals) {
  EXPECT_ONE_LINE_ERROR(config_of("phi3", 2, [](GgufWriter& w) { phi3_longrope(w, 6, 6, false); }),
                        "LongRoPE needs both rope_factors_long.weight and rope_factors_short.weight");
  EXPECT_ONE_LINE_ERROR(config_of("phi3", 2, [](GgufWriter& w) { phi3_longrope(w, 6, 5); }),
                        "tensor 'rope_factors_short.weight' has 5 elements, expected rotary_dim / 2 = 6");
  EXPECT_ONE_LINE_ERROR(config_of("phi3", 2,
                                  [](GgufWriter& w) {
                                    w.tensor("rope_factors_long.weight", {8}, gguf::GgmlType::F32,
                                             f32_bytes(std::vector<float>(8, -1.f)));
                                    w.tensor("rope_factors_short.weight", {8}, gguf::GgmlType::F32,
                                             f32_bytes(std::vector<float>(8, 1.f)));
                                  }),
                        "tensor 'rope_factors_long.weight' holds -1, expected positive factors");
  EXPECT_ONE_LINE_ERROR(config_of("phi3", 2,
                                  [](GgufWriter& w) {
                                    w.tensor("blk.0.attn_qkv.bias", {128}, gguf::GgmlType::F32,
                                             std::vector<uint8_t>(128 * 4));
                                  }),
                        "tensor 'blk.0.attn_qkv.bias': Phi-3 biases are not supported");
}

// A fused tensor's slots: consecutive row ranges, each checked against the whole tensor's shape.
TEST(GgufArch, FusedRowRanges) {
  const auto specs = fused_gguf_rows("blk.0.attn_qkv.weight", 64, 0,
                                     {{WeightSlot::Wq, 64}, {WeightSlot::Wk, 32}, {WeightSlot::Wv, 32}});
  ASSERT_EQ(specs.size(), 3u);
  EXPECT_EQ(specs[1].slot, WeightSlot::Wk);
  EXPECT_EQ(specs[1].row_begin, 64);
  EXPECT_EQ(specs[2].row_begin, 96);
  EXPECT_EQ(specs[2].shape, (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(specs[2].stored_shape(), (std::vector<int64_t>{128, 64}));

  GgufWriter w;
  w.kv_string("general.architecture", "phi3");
  w.tensor("blk.0.attn_qkv.weight", {64, 120}, gguf::GgmlType::F32, std::vector<uint8_t>(64 * 120 * 4));
  const gguf::GgufFile f = gguf::GgufFile::from_bytes("t.gguf", w.build());
  EXPECT_ONE_LINE_ERROR(find_gguf_tensor(f, specs[1]),
                        "t.gguf: tensor 'blk.0.attn_qkv.weight' has shape [120, 64], expected [128, 64]");
}

}  // namespace
}  // namespace fdpp
