// AWQ and GPTQ checkpoints (model/hf_packed_int.h): the quantization_config parser, and the tiny
// checkpoints of tests/fixtures/int4/make_int4_fixtures.py (AWQ gemm 4-bit; GPTQ 4-bit act-order with
// v1 zeros and placeholder biases; GPTQ 8-bit, one group, v2 zeros, experts quantized) against their
// "_ref" twins, which hold the same weights dequantized to F32 by numpy. The CPU dequantizes at load
// with the same single rounding, so weights and logits are bit-identical. Bad checkpoints (edited
// configs, headers and bytes) each give one line. Their plans (the GPU loader's input) materialize to
// the same weights.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>

#include "backend/cpu/cpu_runner.h"
#include "checkpoint_edit.h"
#include "fdpp/error.h"
#include "model/hf_quantization.h"
#include "model/model_loader.h"
#include "model/tensor_parallel.h"
#include "model/weight_plan.h"
#include "test_util.h"

namespace fdpp {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::error_of;


const char* const kFixtures[] = {"llama_awq_g32", "llama_gptq_actorder", "qwen3moe_gptq8_nogroup"};

fs::path int4_fixture(const std::string& name) { return test::fixture("int4/" + name); }

HfQuantization parse_q(const json& q) {
  return parse_hf_quantization(json{{"quantization_config", q}}, "DIR/config.json");
}

TEST(HfQuantization, ReadsAwqAndGptq) {
  const HfQuantization awq = parse_q({{"quant_method", "awq"}, {"bits", 4}, {"group_size", 128},
                                      {"zero_point", true}, {"version", "gemm"}, {"modules_to_not_convert", nullptr}});
  EXPECT_TRUE(awq.packed_int);
  EXPECT_FALSE(awq.fp8);
  EXPECT_EQ(awq.describe(), "awq (4-bit, group 128)");
  const HfQuantization gptq = parse_q({{"quant_method", "gptq"}, {"bits", 8}, {"group_size", -1}, {"desc_act", true},
                                       {"checkpoint_format", "gptq"}, {"lm_head", true}});
  EXPECT_TRUE(gptq.packed_int && gptq.act_order && gptq.zeros_minus_one && gptq.quantized_lm_head);
  EXPECT_EQ(gptq.describe(), "gptq (8-bit, one group per matrix, act-order, lm head quantized)");
  EXPECT_FALSE(parse_q({{"quant_method", "gptq"}, {"checkpoint_format", "gptq_v2"}}).zeros_minus_one);
  EXPECT_EQ(parse_q({{"quant_method", "gptq"}}).group_size, 128);  // AutoGPTQ's default
}

TEST(HfQuantization, RefusesAwqAndGptqVariantsInOneLine) {
  EXPECT_ERROR(parse_q({{"quant_method", "awq"}, {"version", "gemv"}}), "version 'gemv' (AWQ) is not supported");
  EXPECT_ERROR(parse_q({{"quant_method", "awq"}, {"bits", 8}}), "bits = 8: fdpp loads 4-bit AWQ");
  EXPECT_ERROR(parse_q({{"quant_method", "awq"}, {"zero_point", false}}), "zero_point is false");
  EXPECT_ERROR(parse_q({{"quant_method", "gptq"}, {"bits", 3}}), "bits = 3: fdpp loads 4- and 8-bit GPTQ");
  EXPECT_ERROR(parse_q({{"quant_method", "gptq"}, {"group_size", 100}}), "group_size = 100 is not supported");
  EXPECT_ERROR(parse_q({{"quant_method", "gptq"}, {"checkpoint_format", "marlin"}}),
               "checkpoint_format 'marlin' is not supported");
  EXPECT_ERROR(parse_q({{"quant_method", "gptq"}, {"desc_act", "yes"}}), "desc_act = \"yes\" is not true or false");
}

std::vector<float> all_logits(const LoadedModel& m, const std::vector<int32_t>& ids) {
  CpuRunner runner(m.config(), m.weights, static_cast<int>(ids.size()));
  std::vector<float> logits(ids.size() * m.config().vocab_size);
  runner.forward(ids, 0, true, logits);
  return logits;
}

TEST(PackedIntCheckpoint, CpuLoadEqualsTheDequantizedCheckpointBitForBit) {
  for (const char* name : kFixtures) {
    SCOPED_TRACE(name);
    const LoadedModel q = load_model(int4_fixture(name).string());
    const LoadedModel ref = load_model(int4_fixture(std::string(name) + "_ref").string());
    ASSERT_EQ(q.weights.layers.size(), ref.weights.layers.size());
    for (int s = 0; s < kWeightSlots; ++s) {
      const WeightSlot slot = static_cast<WeightSlot>(s);
      for (int l = is_layer_slot(slot) ? 0 : -1; l < (is_layer_slot(slot) ? q.config().n_layers : 0); ++l) {
        const Tensor &a = slot_tensor(q.weights, slot, l), &b = slot_tensor(ref.weights, slot, l);
        EXPECT_TRUE(a.shape == b.shape && std::memcmp(a.ptr(), b.ptr(), a.data.size() * sizeof(float)) == 0)
            << slot_name(slot) << " layer " << l;
      }
    }
    const std::vector<int32_t> ids = {2, 17, 301, 44, 5, 499, 128, 64, 63, 200, 11, 402};
    const std::vector<float> a = all_logits(q, ids), b = all_logits(ref, ids);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
    double energy = 0;
    for (const float x : a) energy += double(x) * x;
    EXPECT_GT(energy, 0.0);
  }
}

TEST(PackedIntCheckpoint, DescribedWithItsFormatAndCounts) {
  const ModelDescription awq = describe_model(int4_fixture("llama_awq_g32").string());
  const ModelDescription ref = describe_model(int4_fixture("llama_awq_g32_ref").string());
  EXPECT_EQ(awq.quantization, "awq (4-bit, group 32)");
  EXPECT_EQ(awq.dtype_counts.at("AWQ4"), 2 * 7);  // 2 layers x q, k, v, o, gate, up, down
  EXPECT_EQ(awq.n_params, ref.n_params);
  EXPECT_LT(awq.stored_bytes, ref.stored_bytes);
  const ModelDescription moe = describe_model(int4_fixture("qwen3moe_gptq8_nogroup").string());
  EXPECT_EQ(moe.quantization, "gptq (8-bit, one group per matrix)");
  EXPECT_EQ(moe.dtype_counts.at("GPTQ8"), 2 * (4 + 3 * 8));  // attention + every expert's three matrices
}

TEST(PackedIntCheckpoint, PlansKeepThePackedMatricesAndMaterializeToTheCpuWeights) {
  for (const char* name : kFixtures) {
    SCOPED_TRACE(name);
    const PlannedModel p = plan_model(int4_fixture(name).string());
    const ModelConfig& c = p.config();
    int packed = 0;
    for (const PlannedTensor& t : p.plan.tensors)
      if (t.packed()) {
        ++packed;
        EXPECT_EQ(t.src.n_bytes, 0u);  // nothing streamed: the loader unpacks them
        EXPECT_EQ(t.packed_int->in, t.cols());
      }
    EXPECT_GT(packed, 0);
    // The plan's reference semantics (what the GPU is given) equal the CPU's load, bit for bit.
    const DecoderWeights planned = materialize_plan(p.plan, c);
    const LoadedModel loaded = load_model(int4_fixture(name).string());
    for (int s = 0; s < kWeightSlots; ++s)
      for (int l = 0; l < c.n_layers; ++l) {
        const WeightSlot slot = WeightSlot(s);
        if (!is_layer_slot(slot)) continue;
        const Tensor& a = slot_tensor(planned, slot, l);
        const Tensor& b = slot_tensor(loaded.weights, slot, l);
        ASSERT_EQ(a.shape, b.shape) << slot_name(slot) << " " << l;
        EXPECT_EQ(std::memcmp(a.ptr(), b.ptr(), static_cast<size_t>(a.numel()) * sizeof(float)), 0)
            << slot_name(slot) << " " << l;
      }
  }
}

TEST(PackedIntCheckpoint, TensorParallelShardingRefusesThem) {
  const PlannedModel p = plan_model(int4_fixture("llama_awq_g32").string());
  const TensorParallelLayout t = plan_tensor_parallel(p.config(), 2);
  EXPECT_ERROR(shard_plan(p.plan, p.config(), t, 1), "AWQ and GPTQ checkpoints do not run under tensor parallelism");
}

TEST(PackedIntCheckpoint, BadCheckpointsGetOneLine) {
  const std::string q = "model.layers.0.self_attn.q_proj";
  {
    const fs::path d = test::copy_fixture(int4_fixture("llama_awq_g32"), "int4_group");
    test::edit_config(d, [](json& c) { c["quantization_config"]["group_size"] = 64; });
    EXPECT_ERROR(describe_model(d.string()), "tensor '" + q + ".qzeros' has shape [4, 16], expected [2, 16]");
  }
  {
    const fs::path d = test::copy_fixture(int4_fixture("llama_awq_g32"), "int4_no_scales");
    test::edit_header(d, [&](json& h) { h.erase(q + ".scales"); });
    EXPECT_ERROR(describe_model(d.string()), "tensor '" + q + ".scales' is missing");
  }
  {
    const fs::path d = test::copy_fixture(int4_fixture("llama_awq_g32"), "int4_no_config");
    test::edit_config(d, [](json& c) { c.erase("quantization_config"); });
    EXPECT_ERROR(describe_model(d.string()), "is stored as packed integers (qweight), but config.json has no AWQ");
  }
  {
    const fs::path d = test::copy_fixture(int4_fixture("llama_awq_g32"), "int4_not_converted");
    test::edit_config(d, [&](json& c) { c["quantization_config"]["modules_to_not_convert"] = {q}; });
    EXPECT_ERROR(describe_model(d.string()), "'" + q + "' is stored as packed integers, but");
  }
  {
    // The placeholder bias AutoGPTQ writes is zeros: a nonzero one is a bias the config lacks.
    const fs::path d = test::copy_fixture(int4_fixture("llama_gptq_actorder"), "int4_bias");
    EXPECT_NO_THROW(describe_model(d.string()));
    const uint16_t one = 0x3C00;  // 1.0 in fp16
    test::patch_tensor(d, q + ".bias", &one, sizeof one);
    EXPECT_ERROR(describe_model(d.string()), "tensor '" + q + ".bias' is in the checkpoint, but");
  }
  {
    const fs::path d = test::copy_fixture(int4_fixture("llama_gptq_actorder"), "int4_g_idx");
    const int32_t bad = 7;  // 64 input channels in groups of 32: 2 groups
    test::patch_tensor(d, q + ".g_idx", &bad, sizeof bad);
    EXPECT_ERROR(load_model(d.string()), "tensor '" + q + ".g_idx' gives input channel 0 group 7, not in [0, 2)");
  }
  {
    const fs::path d = test::copy_fixture(int4_fixture("llama_gptq_actorder"), "int4_no_g_idx");
    test::edit_header(d, [&](json& h) { h.erase(q + ".g_idx"); });
    EXPECT_ERROR(describe_model(d.string()), "tensor '" + q + ".g_idx' is missing (desc_act is true");
  }
  {
    const fs::path d = test::copy_fixture(int4_fixture("llama_gptq_actorder"), "int4_dtype");
    test::edit_header(d, [&](json& h) { h[q + ".qweight"]["dtype"] = "F32"; });
    EXPECT_ERROR(describe_model(d.string()), "tensor '" + q + ".qweight' has dtype F32, expected I32");
  }
}

}  // namespace
}  // namespace fdpp
