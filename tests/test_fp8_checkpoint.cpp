// FP8 checkpoints as published (model/hf_quantization.h): the host e4m3 conversion, the
// quantization_config parser and its refusals, and the tiny checkpoints of
// tests/fixtures/fp8/make_fp8_fixtures.py (quant_method fp8 with per-tensor scales, compressed-tensors
// with per-channel and per-tensor scales, Phi-3's fused projections) against their "_ref" twins,
// which hold the same weights dequantized to F32. The CPU dequantizes at load with one fp32
// rounding (scale x e4m3 value), as numpy did for the twin, so the weights and every logit are
// bit-identical, not merely close. Bad checkpoints (made by editing a fixture's config.json or its
// safetensors header) each give one line.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include "backend/cpu/cpu_runner.h"
#include "core/fp8_e4m3.h"
#include "core/half.h"
#include "fdpp/error.h"
#include "model/hf_config.h"
#include "model/hf_quantization.h"
#include "model/model_loader.h"
#include "model/tensor_parallel.h"
#include "model/weight_plan.h"
#include "checkpoint_edit.h"
#include "test_util.h"

namespace fdpp {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::error_of;


// The FP8 fixtures (make_fp8_fixtures.py says what each is).
const char* const kFixtures[] = {"llama_fp8_tensor", "llama_ct_channel", "phi3_ct_tensor"};

fs::path fp8_fixture(const std::string& name) { return test::fixture("fp8/" + name); }

// ---- e4m3 ---------------------------------------------------------------------------------------

TEST(Fp8E4M3, KnownValuesRoundingAndRoundTrip) {
  EXPECT_EQ(fp8_e4m3_from_float(0.f), 0x00);
  EXPECT_EQ(fp8_e4m3_from_float(-0.f), 0x80);
  EXPECT_EQ(fp8_e4m3_from_float(1.f), 0x38);
  EXPECT_EQ(fp8_e4m3_from_float(-2.f), 0xC0);
  EXPECT_EQ(fp8_e4m3_from_float(448.f), 0x7E);
  EXPECT_EQ(fp8_e4m3_from_float(464.f), 0x7E);   // halfway to 480: even
  EXPECT_EQ(fp8_e4m3_from_float(1000.f), 0x7E);  // saturates, never NaN
  EXPECT_EQ(fp8_e4m3_from_float(-INFINITY), 0xFE);
  EXPECT_EQ(fp8_e4m3_from_float(-NAN), 0x7F);                  // the canonical NaN, as CUDA gives it
  EXPECT_EQ(fp8_e4m3_from_float(1.0625f), 0x38);               // halfway between 1 and 1.125: even
  EXPECT_EQ(fp8_e4m3_from_float(1.1875f), 0x3A);               // halfway between 1.125 and 1.25: even
  EXPECT_EQ(fp8_e4m3_from_float(std::ldexp(1.f, -10)), 0x00);  // half the smallest subnormal: even
  EXPECT_EQ(fp8_e4m3_from_float(std::ldexp(1.5f, -10)), 0x01);
  EXPECT_EQ(fp8_e4m3_from_float(std::ldexp(7.5f, -9)), 0x08);  // halfway from code 7: the carry into the normals
  EXPECT_EQ(fp8_e4m3_to_float(0x7E), 448.f);
  EXPECT_EQ(fp8_e4m3_to_float(0x01), std::ldexp(1.f, -9));  // the smallest subnormal
  EXPECT_EQ(fp8_e4m3_to_float(0x08), std::ldexp(1.f, -6));  // the smallest normal
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_float(0x7F)) && std::isnan(fp8_e4m3_to_float(0xFF)));
  float previous = -1;
  for (int b = 0; b < 256; ++b) {
    if ((b & 0x7F) == 0x7F) continue;  // NaN
    const float v = fp8_e4m3_to_float(static_cast<uint8_t>(b));
    EXPECT_EQ(fp8_e4m3_from_float(v), b) << "round trip of 0x" << std::hex << b;
    if (b < 0x7F) EXPECT_GT(v, previous) << "codes 0..126 increase";
    if (b < 0x7F) previous = v;
  }
}

// ---- quantization_config ------------------------------------------------------------------------

HfQuantization parse_q(const json& q) {
  return parse_hf_quantization(json{{"quantization_config", q}}, "DIR/config.json");
}

json ct_group(json weights, json activations = nullptr) {
  return {{"quant_method", "compressed-tensors"},
          {"format", "float-quantized"},
          {"config_groups",
           {{"group_0", {{"targets", {"Linear"}}, {"weights", weights}, {"input_activations", activations}}}}},
          {"ignore", {"lm_head", "re:.*mlp.down_proj$"}}};
}
json float8(const std::string& strategy) {
  return {{"num_bits", 8}, {"type", "float"}, {"strategy", strategy}, {"dynamic", false}, {"symmetric", true}};
}

TEST(HfQuantization, ReadsTheFp8Layouts) {
  EXPECT_FALSE(parse_hf_quantization(json::object(), "c").fp8);
  EXPECT_FALSE(parse_hf_quantization(json{{"quantization_config", nullptr}}, "c").fp8);
  EXPECT_EQ(parse_hf_quantization(json::object(), "c").describe(), "");

  const HfQuantization a = parse_q({{"quant_method", "fp8"},
                                    {"activation_scheme", "static"},
                                    {"ignored_layers", {"lm_head"}},
                                    {"weight_block_size", nullptr}});
  EXPECT_TRUE(a.fp8);
  EXPECT_EQ(a.activations, "static");
  EXPECT_TRUE(a.ignored("lm_head"));
  EXPECT_FALSE(a.ignored("model.layers.0.mlp.down_proj"));
  EXPECT_EQ(a.describe(), "fp8 (quant_method fp8, static input scales unused)");
  // HF FP8Config's name for the list.
  EXPECT_TRUE(parse_q({{"quant_method", "fp8"}, {"modules_to_not_convert", {"lm_head"}}}).ignored("lm_head"));

  json per_token = float8("token");
  per_token["dynamic"] = true;
  const HfQuantization c = parse_q(ct_group(float8("channel"), per_token));
  EXPECT_TRUE(c.fp8);
  EXPECT_EQ(c.weight_strategy, "channel");
  EXPECT_EQ(c.describe(), "fp8 (compressed-tensors float-quantized, per-channel weight scales)");
  EXPECT_TRUE(c.ignored("model.layers.3.mlp.down_proj"));  // "re:" patterns match from the start
  EXPECT_FALSE(c.ignored("model.layers.3.mlp.up_proj"));
  json naive = ct_group(float8("tensor"), float8("tensor"));
  naive["format"] = "naive-quantized";
  EXPECT_EQ(parse_q(naive).weight_strategy, "tensor");
  EXPECT_EQ(parse_q(naive).describe(),
            "fp8 (compressed-tensors naive-quantized, per-tensor weight scales, static input scales unused)");
}

TEST(HfQuantization, RefusesWhatItCannotLoadInOneLine) {
  EXPECT_ERROR(parse_q({{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}}),
               "DIR/config.json: quantization_config.weight_block_size = [128,128] (block-wise FP8 scales) is not "
               "supported");
  EXPECT_ERROR(parse_q({{"quant_method", "bitsandbytes"}, {"load_in_4bit", true}}),
               "quantization_config.quant_method 'bitsandbytes' is not supported");
  EXPECT_ERROR(parse_q({{"bits", 4}}), "quantization_config has no quant_method");
  EXPECT_ERROR(parse_q("fp8"), "quantization_config = \"fp8\" is not an object");
  EXPECT_ERROR(parse_q({{"quant_method", "fp8"}, {"activation_scheme", "sometimes"}}), "activation_scheme 'sometimes'");

  json int4 = ct_group({{"num_bits", 4}, {"type", "int"}, {"strategy", "group"}, {"group_size", 128}});
  int4["format"] = "pack-quantized";
  EXPECT_ERROR(parse_q(int4), "quantization_config.format 'pack-quantized' (compressed-tensors) is not supported");
  int4["format"] = "float-quantized";
  EXPECT_ERROR(parse_q(int4), "config_groups.group_0.weights: int 4-bit (strategy group) weights are not supported");
  EXPECT_ERROR(parse_q(ct_group(float8("block"))), "float 8-bit weights with strategy 'block' are not supported");
  EXPECT_ERROR(parse_q(ct_group(float8("channel"), {{"num_bits", 8}, {"type", "int"}, {"strategy", "token"}})),
               "input_activations: int 8-bit (strategy token) activations are not supported");
  json dynamic_weights = float8("tensor");
  dynamic_weights["dynamic"] = true;
  EXPECT_ERROR(parse_q(ct_group(dynamic_weights)), "weights.dynamic is true");
  json sparse = ct_group(float8("tensor"));
  sparse["sparsity_config"] = {{"format", "sparse-24-bitmask"}};
  EXPECT_ERROR(parse_q(sparse), "sparsity_config (format 'sparse-24-bitmask') is not supported");
  json no_groups = ct_group(float8("tensor"));
  no_groups.erase("config_groups");
  EXPECT_ERROR(parse_q(no_groups), "has no config_groups");
  json bad_regex = ct_group(float8("tensor"));
  bad_regex["ignore"] = {"re:(("};
  EXPECT_ERROR(parse_q(bad_regex), "ignore pattern 're:((' is not a valid regular expression");
}

// ---- the fixtures -------------------------------------------------------------------------------

std::vector<float> all_logits(const LoadedModel& m, const std::vector<int32_t>& ids) {
  CpuRunner runner(m.config(), m.weights, static_cast<int>(ids.size()));
  std::vector<float> logits(ids.size() * m.config().vocab_size);
  runner.forward(ids, 0, true, logits);
  return logits;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape == b.shape && std::memcmp(a.ptr(), b.ptr(), a.data.size() * sizeof(float)) == 0;
}

TEST(Fp8Checkpoint, DescribedWithItsFormat) {
  const ModelDescription d = describe_model(fp8_fixture("llama_ct_channel").string());
  EXPECT_EQ(d.quantization, "fp8 (compressed-tensors float-quantized, per-channel weight scales)");
  EXPECT_EQ(d.dtype_counts.at("F8_E4M3"), 2 * 7);  // 2 layers x q, k, v, o, gate, up, down
  EXPECT_EQ(describe_model(fp8_fixture("llama_fp8_tensor").string()).quantization,
            "fp8 (quant_method fp8, static input scales unused)");
  EXPECT_EQ(describe_model(fp8_fixture("llama_fp8_tensor_ref").string()).quantization, "");
}

TEST(Fp8Checkpoint, CpuLoadEqualsTheDequantizedCheckpointBitForBit) {
  for (const char* name : kFixtures) {
    SCOPED_TRACE(name);
    const LoadedModel fp8 = load_model(fp8_fixture(name).string());
    const LoadedModel ref = load_model(fp8_fixture(std::string(name) + "_ref").string());
    ASSERT_EQ(fp8.weights.layers.size(), ref.weights.layers.size());
    // Every slot, FP8 or not: the plan's slot table names them all.
    for (int s = 0; s < kWeightSlots; ++s) {
      const WeightSlot slot = static_cast<WeightSlot>(s);
      if (!is_layer_slot(slot)) {
        EXPECT_TRUE(same_bits(slot_tensor(fp8.weights, slot, -1), slot_tensor(ref.weights, slot, -1)))
            << slot_name(slot);
        continue;
      }
      for (int l = 0; l < fp8.config().n_layers; ++l)
        EXPECT_TRUE(same_bits(slot_tensor(fp8.weights, slot, l), slot_tensor(ref.weights, slot, l)))
            << slot_name(slot) << " layer " << l;
    }
    // The same weights through the same code: logits identical to the bit.
    const std::vector<int32_t> ids = {2, 17, 301, 44, 5, 499, 128, 64, 63, 200, 11, 402};
    const std::vector<float> a = all_logits(fp8, ids), b = all_logits(ref, ids);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
    double energy = 0;
    for (const float x : a) energy += double(x) * x;
    EXPECT_GT(energy, 0.0);  // not a vacuous comparison of zeros
  }
}

TEST(Fp8Checkpoint, PlanKeepsTheBytesAndScalesPerRow) {
  for (const char* name : kFixtures) {
    SCOPED_TRACE(name);
    const PlannedModel p = plan_model(fp8_fixture(name).string());
    const ModelConfig& c = p.config();
    int fp8_parts = 0;
    for (const PlannedTensor& t : p.plan.tensors) {
      if (!t.fp8()) continue;
      ++fp8_parts;
      EXPECT_EQ(t.src.type, gguf::GgmlType::I8);
      EXPECT_EQ(t.src.n_bytes, static_cast<uint64_t>(t.numel()));
      EXPECT_EQ(static_cast<int64_t>(t.fp8_scales.size()), t.rows());
      EXPECT_FALSE(t.src.file.empty());  // streamed from the file, not through read_f32
    }
    EXPECT_EQ(fp8_parts, 7 * c.n_layers);  // Phi-3's fused tensors split into the seven slots
    // Per-tensor scales: q, k and v each constant over their rows, and not all equal (so that the
    // fused matrix's row scales must carry each one over its own rows).
    if (std::string(name) == "llama_fp8_tensor") {
      const PlannedTensor* q = p.plan.find(WeightSlot::Wq, 0);
      const PlannedTensor* k = p.plan.find(WeightSlot::Wk, 0);
      ASSERT_TRUE(q != nullptr && k != nullptr);
      for (const float s : q->fp8_scales) EXPECT_EQ(s, q->fp8_scales[0]);
      EXPECT_NE(q->fp8_scales[0], k->fp8_scales[0]);
    }
    // The plan's reference semantics (what the GPU is given) equal the CPU's load.
    const DecoderWeights planned = materialize_plan(p.plan, c);
    const LoadedModel loaded = load_model(fp8_fixture(name).string());
    for (int l = 0; l < c.n_layers; ++l)
      for (const WeightSlot s : {WeightSlot::Wq, WeightSlot::Wk, WeightSlot::Wv, WeightSlot::Wo, WeightSlot::WGate,
                                 WeightSlot::WUp, WeightSlot::WDown})
        EXPECT_TRUE(same_bits(slot_tensor(planned, s, l), slot_tensor(loaded.weights, s, l)))
            << slot_name(s) << " " << l;
  }
}

TEST(Fp8Checkpoint, TensorParallelShardingRefusesFp8Tensors) {
  // The sharded engine has no FP8 weights yet: slicing an FP8 plan is an error, never a plan that
  // silently lost its scales (the runtime refuses earlier, naming --tensor-parallel).
  const PlannedModel p = plan_model(fp8_fixture("llama_ct_channel").string());
  const TensorParallelLayout t = plan_tensor_parallel(p.config(), 2);
  EXPECT_ERROR(shard_plan(p.plan, p.config(), t, 1), "FP8 checkpoints do not run under tensor parallelism yet");
}

// ---- bad checkpoints ----------------------------------------------------------------------------

fs::path copy_fixture(const std::string& name, const std::string& as) {
  return test::copy_fixture(fp8_fixture(name), as);
}

TEST(Fp8Checkpoint, BadCheckpointsGetOneLine) {
  const std::string k = "model.layers.0.self_attn.k_proj";
  {
    const fs::path d = copy_fixture("llama_fp8_tensor", "fp8_missing_scale");
    test::edit_header(d, [&](json& h) { h.erase(k + ".weight_scale"); });
    EXPECT_ERROR(describe_model(d.string()),
                 "FP8 tensor '" + k + ".weight' has no scale: tensor '" + k + ".weight_scale' is missing");
    EXPECT_ERROR(load_model(d.string()), "has no scale");
  }
  {
    // DeepSeek's layout: the scale is named weight_scale_inv.
    const fs::path d = copy_fixture("llama_fp8_tensor", "fp8_scale_inv");
    test::edit_header(d, [&](json& h) {
      h[k + ".weight_scale_inv"] = h[k + ".weight_scale"];
      h.erase(k + ".weight_scale");
    });
    EXPECT_ERROR(describe_model(d.string()), "has block-wise scales ('" + k + ".weight_scale_inv')");
  }
  {
    // A scale that is not a number: found when the scales are read (load and plan), not by info.
    const fs::path d = copy_fixture("llama_fp8_tensor", "fp8_nan_scale");
    const float nan = std::nanf("");
    test::patch_tensor(d, k + ".weight_scale", &nan, sizeof nan);
    EXPECT_ERROR(load_model(d.string()), "tensor '" + k + ".weight_scale' holds nan, not a finite scale");
    EXPECT_ERROR(plan_model(d.string()), "not a finite scale");
  }
  {
    const fs::path d = copy_fixture("llama_fp8_tensor", "fp8_block");
    test::edit_config(d, [](json& c) { c["quantization_config"]["weight_block_size"] = {128, 128}; });
    EXPECT_ERROR(describe_model(d.string()), "quantization_config.weight_block_size = [128,128]");
  }
  {
    const fs::path d = copy_fixture("llama_ct_channel", "fp8_int4");
    test::edit_config(d, [](json& c) {
      c["quantization_config"]["format"] = "pack-quantized";
      c["quantization_config"]["config_groups"]["group_0"]["weights"] = {
          {"num_bits", 4}, {"type", "int"}, {"strategy", "group"}, {"group_size", 128}};
    });
    EXPECT_ERROR(describe_model(d.string()), "quantization_config.format 'pack-quantized'");
    test::edit_config(d, [](json& c) { c["quantization_config"].erase("format"); });
    EXPECT_ERROR(describe_model(d.string()), "int 4-bit (strategy group) weights are not supported");
  }
  {
    // [128, 1] per-channel scales of BF16 read as [64, 2]: the same bytes, the wrong shape.
    const fs::path d = copy_fixture("llama_ct_channel", "fp8_scale_shape");
    test::edit_header(d, [&](json& h) { h[k + ".weight_scale"]["shape"] = {64, 2}; });
    EXPECT_ERROR(describe_model(d.string()), "tensor '" + k + ".weight_scale' has shape [64, 2]; the FP8 weight");
  }
  {
    // Per-tensor scales where the config says channel.
    const fs::path d = copy_fixture("llama_fp8_tensor", "fp8_strategy");
    test::edit_config(d, [](json& c) {
      json ct = {{"quant_method", "compressed-tensors"},
                 {"format", "float-quantized"},
                 {"config_groups", {{"g", {{"weights", float8("channel")}}}}}};
      c["quantization_config"] = ct;
    });
    EXPECT_ERROR(describe_model(d.string()), "quantization_config says weight strategy 'channel'");
  }
  {
    const fs::path d = copy_fixture("llama_fp8_tensor", "fp8_e5m2");
    test::edit_header(d, [&](json& h) { h[k + ".weight"]["dtype"] = "F8_E5M2"; });
    EXPECT_ERROR(describe_model(d.string()),
                 "tensor '" + k + ".weight' is stored F8_E5M2; fdpp loads FP8 weights in e4m3");
  }
  {
    const fs::path d = copy_fixture("llama_fp8_tensor", "fp8_no_config");
    test::edit_config(d, [](json& c) { c.erase("quantization_config"); });
    EXPECT_ERROR(describe_model(d.string()), "is stored F8_E4M3, but");
    EXPECT_ERROR(describe_model(d.string()), "has no quantization_config");
  }
  {
    const fs::path d = copy_fixture("llama_fp8_tensor", "fp8_ignored");
    test::edit_config(d, [&](json& c) { c["quantization_config"]["ignored_layers"] = {"lm_head", k}; });
    EXPECT_ERROR(describe_model(d.string()), "lists '" + k + "' as ignored");
  }
}

TEST(Fp8Checkpoint, OnlyProjectionsMayBeFp8) {
  // The lm head's first 512 x 64 bytes read as an e4m3 [512, 64] tensor (the rest of its F16 span
  // left unused): the right shape in FP8, which fdpp keeps 16-bit.
  const fs::path d = copy_fixture("llama_fp8_tensor", "fp8_lm_head");
  test::edit_header(d, [](json& h) {
    json& t = h["lm_head.weight"];
    const uint64_t begin = t["data_offsets"][0];
    t["dtype"] = "F8_E4M3";
    t["data_offsets"] = {begin, begin + 512 * 64};  // the first half of its F16 bytes, as e4m3
  });
  EXPECT_ERROR(
      describe_model(d.string()),
      "tensor 'lm_head.weight' is stored F8_E4M3, but fdpp loads FP8 only for the q/k/v/o and MLP projections");
}

// ---- KV cache scales ----------------------------------------------------------------------------

// A scale as a checkpoint stores it: one number of dtype F32, F16 or BF16.
void add_scale(const fs::path& dir, const std::string& name, float value, const std::string& dtype = "F32",
               const std::vector<int64_t>& shape = {}) {
  if (dtype == "F32") return test::add_tensor(dir, name, dtype, shape, &value, sizeof value);
  const uint16_t h = dtype == "F16" ? f32_to_fp16(value) : f32_to_bf16(value);
  test::add_tensor(dir, name, dtype, shape, &h, sizeof h);
}

std::vector<std::pair<float, float>> scales_of(const ModelConfig& c) {
  std::vector<std::pair<float, float>> out;
  for (const KvCacheScales& s : c.kv_cache_scales) out.emplace_back(s.k, s.v);
  return out;
}

// Each naming vLLM reads (maybe_remap_kv_scale_name, get_cache_scale), per layer, through every
// path from a checkpoint (info's description, the CPU load, the GPU's plan). Values exact in 16 bits.
TEST(Fp8KvCacheScales, ReadPerLayerByEveryPublishedName) {
  struct Naming {
    const char* what;
    const char* fixture;
    std::string k, v;  // v empty: one kv_scale for both
    const char* dtype;
    std::vector<int64_t> shape;
  };
  const Naming namings[] = {
      {"k_scale", "llama_fp8_tensor", ".k_scale", ".v_scale", "F32", {}},
      {"output_scale", "llama_ct_channel", ".k_proj.output_scale", ".v_proj.output_scale", "BF16", {1}},
      {"modelopt", "llama_fp8_tensor", ".k_proj.k_scale", ".v_proj.v_scale", "F16", {1}},
      {"kv_scale", "llama_fp8_tensor", ".kv_scale", "", "F32", {1}},
  };
  const float k[] = {0.25f, 1.5f}, v[] = {0.625f, 3.f};
  for (const Naming& n : namings) {
    SCOPED_TRACE(n.what);
    const fs::path d = copy_fixture(n.fixture, std::string("kv_scales_") + n.what);
    if (std::string(n.fixture) == "llama_ct_channel")
      test::edit_config(d, [](json& c) { c["quantization_config"]["kv_cache_scheme"] = float8("tensor"); });
    std::vector<std::pair<float, float>> expected;
    for (int l = 0; l < 2; ++l) {
      const std::string prefix = "model.layers." + std::to_string(l) + ".self_attn";
      add_scale(d, prefix + n.k, k[l], n.dtype, n.shape);
      if (!n.v.empty()) add_scale(d, prefix + n.v, v[l], n.dtype, n.shape);
      expected.emplace_back(k[l], n.v.empty() ? k[l] : v[l]);
    }
    EXPECT_EQ(scales_of(describe_model(d.string()).config), expected);
    EXPECT_EQ(scales_of(load_model(d.string()).config()), expected);
    EXPECT_EQ(scales_of(plan_model(d.string()).config()), expected);
  }
  // None published: none read (every scale 1 in the engine).
  EXPECT_TRUE(describe_model(fp8_fixture("llama_fp8_tensor").string()).config.kv_cache_scales.empty());
  EXPECT_TRUE(plan_model(fp8_fixture("phi3_ct_tensor").string()).config().kv_cache_scales.empty());
}

TEST(Fp8KvCacheScales, BadScalesGetOneLine) {
  const std::string a0 = "model.layers.0.self_attn", a1 = "model.layers.1.self_attn";
  {
    // Layer 1 has none: its cache would silently run with 1.
    const fs::path d = copy_fixture("llama_fp8_tensor", "kv_scales_missing_layer");
    add_scale(d, a0 + ".k_scale", 0.5f);
    add_scale(d, a0 + ".v_scale", 0.5f);
    EXPECT_ERROR(describe_model(d.string()), "tensor '" + a1 + ".k_scale' is missing: the checkpoint publishes KV "
                                             "cache scales for other layers ('" + a0 + ".k_scale')");
    EXPECT_ERROR(plan_model(d.string()), "tensor '" + a1 + ".k_scale' is missing");
  }
  {
    // K everywhere, V nowhere: the V tensor named after the layer's K.
    const fs::path d = copy_fixture("llama_ct_channel", "kv_scales_no_v");
    add_scale(d, a0 + ".k_proj.output_scale", 0.5f);
    add_scale(d, a1 + ".k_proj.output_scale", 0.5f);
    EXPECT_ERROR(load_model(d.string()), "tensor '" + a0 + ".v_proj.output_scale' is missing");
  }
  {
    const fs::path d = copy_fixture("llama_fp8_tensor", "kv_scales_zero");
    for (const std::string& a : {a0, a1}) {
      add_scale(d, a + ".k_scale", 0.5f);
      add_scale(d, a + ".v_scale", a == a1 ? 0.f : 0.5f);
    }
    EXPECT_ERROR(describe_model(d.string()), "tensor '" + a1 + ".v_scale' holds 0, not a positive finite KV cache scale");
  }
  {
    const fs::path d = copy_fixture("llama_fp8_tensor", "kv_scales_negative_inf");
    add_scale(d, a0 + ".kv_scale", -0.5f);
    add_scale(d, a1 + ".kv_scale", INFINITY);
    EXPECT_ERROR(plan_model(d.string()), "tensor '" + a0 + ".kv_scale' holds -0.5, not a positive finite");
  }
  {
    const fs::path d = copy_fixture("llama_fp8_tensor", "kv_scales_inf");
    add_scale(d, a0 + ".kv_scale", 1.f);
    add_scale(d, a1 + ".kv_scale", INFINITY);
    EXPECT_ERROR(plan_model(d.string()), "tensor '" + a1 + ".kv_scale' holds inf, not a positive finite");
  }
  {
    // Per-head scales (kv_cache_scheme strategy attn_head) are not one number.
    const fs::path d = copy_fixture("llama_fp8_tensor", "kv_scales_per_head");
    const float two[] = {0.5f, 0.5f};
    for (const std::string& a : {a0, a1}) {
      test::add_tensor(d, a + ".k_scale", "F32", {2}, two, sizeof two);
      test::add_tensor(d, a + ".v_scale", "F32", {2}, two, sizeof two);
    }
    EXPECT_ERROR(describe_model(d.string()),
                 "tensor '" + a0 + ".k_scale' has shape [2]; a KV cache scale is one number ([] or [1])");
  }
  {
    // Two names for one scale: which one vLLM would keep depends on the order it meets them.
    const fs::path d = copy_fixture("llama_fp8_tensor", "kv_scales_twice");
    for (const std::string& a : {a0, a1}) add_scale(d, a + ".kv_scale", 0.5f);
    add_scale(d, a1 + ".k_scale", 0.5f);
    EXPECT_ERROR(describe_model(d.string()), "both give layer 1's K cache scale");
  }
  {
    const fs::path d = copy_fixture("llama_fp8_tensor", "kv_scales_dtype");
    const uint8_t e4m3 = fp8_e4m3_from_float(0.5f);
    for (const std::string& a : {a0, a1}) {
      test::add_tensor(d, a + ".k_scale", "F8_E4M3", {}, &e4m3, 1);
      test::add_tensor(d, a + ".v_scale", "F8_E4M3", {}, &e4m3, 1);
    }
    EXPECT_ERROR(describe_model(d.string()), "tensor '" + a0 + ".k_scale' has dtype F8_E4M3, which fdpp cannot read");
  }
}

// compressed-tensors' kv_cache_scheme: float 8-bit per-tensor scales, as vLLM takes them.
TEST(Fp8KvCacheScales, KvCacheSchemeIsFloat8PerTensor) {
  json ok = ct_group(float8("channel"));
  ok["kv_cache_scheme"] = float8("tensor");
  EXPECT_TRUE(parse_q(ok).fp8);
  json int8 = ok;
  int8["kv_cache_scheme"] = {{"num_bits", 8}, {"type", "int"}, {"strategy", "tensor"}};
  EXPECT_ERROR(parse_q(int8),
               "quantization_config.kv_cache_scheme: int 8-bit (strategy tensor) KV cache quantization is not supported");
  json per_head = ok;
  per_head["kv_cache_scheme"] = float8("attn_head");
  EXPECT_ERROR(parse_q(per_head), "quantization_config.kv_cache_scheme: strategy 'attn_head' is not supported");
}

}  // namespace
}  // namespace fdpp
