// The weight plan (model/weight_plan.h) that the GPU loader streams: read back on the CPU, it must
// give exactly the fp32 weights of the CPU loaders (same slots, shapes and bits) for every HF
// fixture (Llama, Mistral, OPT with its prefixes, ChatGLM2's fused q/k/v and gate/up split by
// rows, safetensors and .bin, F32/F16/BF16), for a GGUF of every stored type (q/k rows permuted
// back), for a Qwen2 GGUF (q/k rows as stored), Phi-3 GGUFs (fused tensors split by rows) and Gemma
// GGUFs (norms stored as 1 + w).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "backend/cpu/quant_matmul.h"
#include "backend/cpu/quant_repack.h"
#include "io/gguf.h"
#include "model/arch/architecture.h"
#include "model/gguf_model.h"
#include "model/model_loader.h"
#include "model/weight_plan.h"
#include "test_util.h"
#include "tiny_gguf.h"

namespace fdpp {
namespace {

namespace fs = std::filesystem;

// Every slot of a against b: both absent, or the same shape and the same bits.
void expect_same_weights(const DecoderWeights& a, const DecoderWeights& b, int n_layers) {
  for (int s = 0; s < kWeightSlots; ++s) {
    const WeightSlot slot = WeightSlot(s);
    for (int l = is_layer_slot(slot) ? 0 : -1; l < (is_layer_slot(slot) ? n_layers : 0); ++l) {
      SCOPED_TRACE(fmt::format("slot {} layer {}", slot_name(slot), l));
      const Tensor& x = slot_tensor(a, slot, l);
      const Tensor& y = slot_tensor(b, slot, l);
      ASSERT_EQ(x.empty(), y.empty());
      if (x.empty()) continue;
      ASSERT_EQ(x.shape, y.shape);
      EXPECT_EQ(std::memcmp(x.ptr(), y.ptr(), x.data.size() * sizeof(float)), 0);
    }
  }
}

std::vector<fs::path> hf_fixture_dirs() {
  std::vector<fs::path> out;
  const fs::path root = test::fixture("hf");
  if (!fs::exists(root)) return out;
  for (const auto& e : fs::directory_iterator(root))
    if (e.is_directory() && fs::exists(e.path() / "config.json")) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(WeightPlan, SlotOfMembers) {
  EXPECT_EQ(slot_of(&LayerWeights::wq), WeightSlot::Wq);
  EXPECT_EQ(slot_of(&LayerWeights::b_down), WeightSlot::BDown);
  EXPECT_EQ(slot_of(&LayerWeights::attn_norm), WeightSlot::AttnNorm);
  EXPECT_EQ(slot_of(&DecoderWeights::tok_embeddings), WeightSlot::TokEmbeddings);
  EXPECT_EQ(slot_of(&DecoderWeights::lm_head), WeightSlot::LmHead);
  EXPECT_EQ(slot_of(&DecoderWeights::final_norm_bias), WeightSlot::FinalNormBias);
  DecoderWeights w;
  w.layers.resize(2);
  EXPECT_EQ(&slot_tensor(w, WeightSlot::WUp, 1), &w.layers[1].w_up);
  EXPECT_EQ(&slot_tensor(w, WeightSlot::PosEmbeddings, -1), &w.pos_embeddings);
  EXPECT_STREQ(slot_name(WeightSlot::WGate), "w_gate");
}

TEST(WeightPlan, SourceRowUndoesGgufPermutation) {
  // 2 heads of 4 rows: stored rows (per head) 0 1 2 3 hold HF rows 0 2 1 3.
  const std::vector<int64_t> expected = {0, 2, 1, 3, 4, 6, 5, 7};
  for (int64_t n = 0; n < 8; ++n) EXPECT_EQ(planned_source_row(n, 8, 2), expected[n]) << n;
  EXPECT_EQ(planned_source_row(5, 8, 0), 5);
}

TEST(WeightPlan, HfFixturesGiveTheFp32LoadersWeights) {
  const auto dirs = hf_fixture_dirs();
  if (dirs.empty()) GTEST_SKIP() << "no HF fixtures in tests/fixtures/hf/";
  for (const fs::path& dir : dirs) {
    SCOPED_TRACE(dir.filename().string());
    const LoadedModel loaded = load_model(dir.string());
    const PlannedModel planned = plan_model(dir.string());
    EXPECT_EQ(planned.description.stored_bytes, loaded.description.stored_bytes);
    uint64_t in_files = 0;
    for (const PlannedTensor& p : planned.plan.tensors) {
      EXPECT_NE(p.src.data, nullptr) << p.src.name;  // every fixture tensor is contiguous in its file
      EXPECT_FALSE(p.src.file.empty()) << p.src.name;
      in_files += p.src.n_bytes;
    }
    EXPECT_EQ(in_files, planned.description.stored_bytes);
    expect_same_weights(materialize_plan(planned.plan, planned.config()), loaded.weights, planned.config().n_layers);
    // The plan's file offsets name the same bytes as its mapping pointers.
    for (const PlannedTensor& p : planned.plan.tensors) {
      std::ifstream f(p.src.file, std::ios::binary);
      f.seekg(static_cast<std::streamoff>(p.src.file_offset));
      std::vector<char> b(std::min<uint64_t>(p.src.n_bytes, 64));
      f.read(b.data(), static_cast<std::streamsize>(b.size()));
      EXPECT_EQ(std::memcmp(b.data(), p.src.data, b.size()), 0) << p.src.name;
    }
  }
}

TEST(WeightPlan, ChatGlmFusedTensorsSplitByRows) {
  const fs::path dir = test::fixture("hf/chatglm2_f16");
  if (!fs::exists(dir)) GTEST_SKIP() << "no ChatGLM2 fixture";
  const PlannedModel planned = plan_model(dir.string());
  const ModelConfig& c = planned.config();
  const PlannedTensor* q = planned.plan.find(WeightSlot::Wq, 0);
  const PlannedTensor* k = planned.plan.find(WeightSlot::Wk, 0);
  const PlannedTensor* v = planned.plan.find(WeightSlot::Wv, 0);
  ASSERT_TRUE(q && k && v);
  EXPECT_EQ(q->src.name, k->src.name);
  EXPECT_EQ(k->src.data, q->src.data + c.q_dim() * c.hidden * 2);
  EXPECT_EQ(v->src.file_offset, k->src.file_offset + static_cast<uint64_t>(c.kv_dim() * c.hidden * 2));
  const PlannedTensor* gate = planned.plan.find(WeightSlot::WGate, 1);
  const PlannedTensor* up = planned.plan.find(WeightSlot::WUp, 1);
  ASSERT_TRUE(gate && up);
  EXPECT_EQ(up->src.data, gate->src.data + c.ffn_hidden * c.hidden * 2);
}

// llama.cpp converts Qwen2 for NeoX-style RoPE: q and k rows stay in Hugging Face's order, and the
// GGUF gives the very weights of the directory it was converted from.
TEST(WeightPlan, Qwen2GgufKeepsQAndKRowsInPlace) {
  const std::string path = test::fixture("hf/qwen2_tied_gqa_gguf/model.gguf");
  if (!fs::exists(path)) GTEST_SKIP() << "no Qwen2 GGUF fixture";
  const LoadedModel loaded = load_model(path);
  const PlannedModel planned = plan_model(path);
  const ModelConfig& c = planned.config();
  EXPECT_TRUE(c.qkv_bias && c.tied_embeddings);
  for (const PlannedTensor& p : planned.plan.tensors) EXPECT_EQ(p.permute_heads, 0) << p.src.name;
  expect_same_weights(materialize_plan(planned.plan, c), loaded.weights, c.n_layers);
  const LoadedModel hf = load_model(test::fixture("hf/qwen2_tied_gqa_bf16"));
  expect_same_weights(loaded.weights, hf.weights, c.n_layers);
}

// llama.cpp keeps Phi-3's q/k/v in one attn_qkv and gate/up in one ffn_up: each slot is a row
// range of the file's tensor, in the plan (consecutive bytes of one tensor), in the fp32 load and
// in the stored views; all give the weights of the directory the file was converted from, and the
// description counts a fused tensor once.
TEST(WeightPlan, Phi3GgufFusedTensorsSplitByRows) {
  for (const auto& [gguf_name, hf_name] : {std::pair{"phi3_longrope_gqa_gguf", "phi3_longrope_gqa_bf16"},
                                           std::pair{"phi3_partial_window_gguf", "phi3_partial_window_f16"}}) {
    SCOPED_TRACE(gguf_name);
    const fs::path dir = test::fixture("hf");
    const std::string path = (dir / gguf_name / "model.gguf").string();
    if (!fs::exists(path)) GTEST_SKIP() << "no Phi-3 GGUF fixture";
    const std::string hf_dir = (dir / hf_name).string();
    const LoadedModel loaded = load_model(path);
    const PlannedModel planned = plan_model(path);
    const ModelConfig& c = planned.config();
    const int64_t row = static_cast<int64_t>(c.hidden) * 2;  // bytes of one row (F16 / BF16)
    for (int l = 0; l < c.n_layers; ++l) {
      const PlannedTensor* q = planned.plan.find(WeightSlot::Wq, l);
      const PlannedTensor* k = planned.plan.find(WeightSlot::Wk, l);
      const PlannedTensor* v = planned.plan.find(WeightSlot::Wv, l);
      const PlannedTensor* gate = planned.plan.find(WeightSlot::WGate, l);
      const PlannedTensor* up = planned.plan.find(WeightSlot::WUp, l);
      ASSERT_TRUE(q && k && v && gate && up);
      EXPECT_EQ(q->src.name, fmt::format("blk.{}.attn_qkv.weight", l));
      EXPECT_EQ(v->src.name, q->src.name);
      EXPECT_EQ(k->src.data, q->src.data + c.q_dim() * row);
      EXPECT_EQ(v->src.file_offset, k->src.file_offset + static_cast<uint64_t>(c.kv_dim() * row));
      EXPECT_EQ(v->src.n_bytes, static_cast<uint64_t>(c.kv_dim() * row));
      EXPECT_EQ(up->src.name, gate->src.name);
      EXPECT_EQ(up->src.data, gate->src.data + c.ffn_hidden * row);
    }
    expect_same_weights(materialize_plan(planned.plan, c), loaded.weights, c.n_layers);
    const LoadedModel hf = load_model(hf_dir);
    expect_same_weights(loaded.weights, hf.weights, c.n_layers);
    // The stored views are the same rows: k's view starts q_dim rows into attn_qkv, on the bytes
    // the plan names.
    const LoadedModel stored =
        load_model(path, {}, LoadOptions{WeightForm::Stored, [](gguf::GgmlType) { return true; }});
    const StoredMatrix& wq = stored.weights.layers.at(1).wq.stored;
    const StoredMatrix& wk = stored.weights.layers.at(1).wk.stored;
    ASSERT_FALSE(wk.empty() || wq.empty());
    EXPECT_EQ(wk.rows, c.kv_dim());
    EXPECT_EQ(wk.row(0), wq.row(0) + c.q_dim() * row);
    EXPECT_EQ(std::memcmp(wk.row(0), planned.plan.find(WeightSlot::Wk, 1)->src.data, wk.row_bytes * wk.rows), 0);
    const ModelDescription gguf_description = describe_model(path), hf_description = describe_model(hf_dir);
    EXPECT_EQ(gguf_description.n_params, hf_description.n_params);
    EXPECT_EQ(gguf_description.tensors.size(), hf_description.tensors.size());
  }
}

// Gemma's converter stores every norm weight as 1 + w: loaded as it is, it gives the HF directory's
// weights (whose loader adds the 1) bit for bit, as the converter adds it in fp32 to a bf16 w.
TEST(WeightPlan, GemmaGgufNormsHoldOnePlusW) {
  for (const auto& [gguf_name, hf_name] : {std::pair{"gemma2_tied_gqa_gguf", "gemma2_tied_gqa_bf16"},
                                           std::pair{"gemma3_tied_6layer_gguf", "gemma3_tied_6layer_bf16"}}) {
    SCOPED_TRACE(gguf_name);
    const fs::path dir = test::fixture("hf");
    const std::string path = (dir / gguf_name / "model.gguf").string();
    if (!fs::exists(path)) GTEST_SKIP() << "no Gemma GGUF fixture";
    const LoadedModel loaded = load_model(path);
    const PlannedModel planned = plan_model(path);
    const ModelConfig& c = planned.config();
    for (const PlannedTensor& p : planned.plan.tensors) {
      EXPECT_EQ(p.permute_heads, 0) << p.src.name;
      EXPECT_EQ(p.add, 0.f) << p.src.name;
    }
    expect_same_weights(materialize_plan(planned.plan, c), loaded.weights, c.n_layers);
    expect_same_weights(loaded.weights, load_model((dir / hf_name).string()).weights, c.n_layers);
    EXPECT_EQ(describe_model(path).n_params, describe_model((dir / hf_name).string()).n_params);
  }
}

// Phi-3's fused tensors in quantized types (as llama.cpp's quantizer leaves them: whole rows of
// blocks): every slot's rows, through the plan, the fp32 load and the CPU's stored views once
// repacked into row groups, are the same bytes of the file's tensor.
TEST(WeightPlan, QuantizedFusedTensorsSplitByRows) {
  using G = gguf::GgmlType;
  const uint64_t H = 256, Q = 256, KV = 128, FF = 164, V = 40;  // gate/up: leftover rows past the groups
  gguftest::GgufWriter w;
  w.kv_string("general.architecture", "phi3").kv_u32("phi3.block_count", 2);
  w.kv_u32("phi3.embedding_length", H).kv_u32("phi3.feed_forward_length", FF);
  w.kv_u32("phi3.attention.head_count", 4).kv_u32("phi3.attention.head_count_kv", 2);
  w.kv_u32("phi3.context_length", 64).kv_u32("phi3.vocab_size", V);
  auto put = [&](const std::string& name, uint64_t rows, uint64_t cols, G t) {
    w.tensor(name, cols == 0 ? std::vector<uint64_t>{rows} : std::vector<uint64_t>{cols, rows}, t,
             test::random_stored(t, rows * std::max<uint64_t>(cols, 1)));
  };
  put("token_embd.weight", V, H, G::Q8_0);
  for (int i = 0; i < 2; ++i) {
    const std::string b = "blk." + std::to_string(i) + ".";
    put(b + "attn_norm.weight", H, 0, G::F32);
    put(b + "attn_qkv.weight", Q + 2 * KV, H, i == 0 ? G::Q4_K : G::Q6_K);
    put(b + "attn_output.weight", H, Q, G::Q8_0);
    put(b + "ffn_norm.weight", H, 0, G::F32);
    put(b + "ffn_up.weight", 2 * FF, H, i == 0 ? G::Q4_0 : G::Q5_K);
    put(b + "ffn_down.weight", H, FF, G::F16);
  }
  put("output_norm.weight", H, 0, G::F32);
  auto file = std::make_shared<const gguf::GgufFile>(gguf::GgufFile::from_bytes("phi3.gguf", w.build()));
  const Architecture& arch = phi3_architecture();
  const ModelConfig c = arch.gguf_config(*file);
  const auto specs = arch.gguf_tensor_specs(c);
  const DecoderWeights f32 = load_gguf_weights(file, c, specs, {});
  expect_same_weights(materialize_plan(plan_gguf_weights(file, specs), c), f32, c.n_layers);
  DecoderWeights stored = load_gguf_weights(file, c, specs, {}, cpu::stored_supported);
  cpu::repack_weights(stored, /*mapped=*/false);
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerWeights &a = f32.layers[l], &b = stored.layers[l];
    for (auto [fp, st] :
         {std::pair{&a.wq, &b.wq}, {&a.wk, &b.wk}, {&a.wv, &b.wv}, {&a.w_gate, &b.w_gate}, {&a.w_up, &b.w_up}}) {
      const StoredMatrix& m = st->stored;
      ASSERT_FALSE(m.empty());
      ASSERT_EQ(m.rows, fp->shape[0]);
      if (cpu::pack_rows(cpu::best_isa()) > 0 && cpu::repack_supported(m.type)) EXPECT_GT(m.packed_rows, 0);
      std::vector<uint8_t> bytes(m.row_bytes);
      std::vector<float> row(static_cast<size_t>(m.cols));
      for (int64_t n = 0; n < m.rows; ++n) {
        cpu::stored_row_bytes(m, n, bytes.data());
        gguf::dequantize(m.type, bytes.data(), row.data(), static_cast<uint64_t>(m.cols));
        ASSERT_EQ(std::memcmp(row.data(), fp->ptr() + n * m.cols, row.size() * sizeof(float)), 0)
            << "layer " << l << " row " << n << " of " << gguf::type_name(m.type);
      }
    }
  }
}

// Which GGUF tensors the GPU keeps in their blocks (gguf_gpu_block_tensors, asked by the GPU loader
// and fdpp info): a fused layer matrix stays in blocks only when every part can, mixed block types
// included (each becomes a segment). A part in F16 or an unsupported type, rows of partial blocks,
// an expert's part, a column slice, an added constant and the model-wide slots are converted.
TEST(WeightPlan, GgufGpuBlockRuleTakesWholeLayerMatricesOfItsTypes) {
  using G = gguf::GgmlType;
  using S = WeightSlot;
  static const uint8_t byte = 0;  // data only needs to be present
  WeightPlan plan;
  auto add = [&](S slot, int layer, int64_t rows, int64_t cols, G type) -> PlannedTensor& {
    PlannedTensor& p = plan.tensors.emplace_back();
    p.slot = slot;
    p.layer = layer;
    p.shape = {rows, cols};
    p.src.name = fmt::format("{}.{}", slot_name(slot), layer);
    p.src.type = type;
    p.src.data = &byte;
    return p;
  };
  add(S::TokEmbeddings, -1, 32, 256, G::Q8_0);
  // Layer 0: q/k/v of three block types, o, gate/up and down all kept.
  add(S::Wq, 0, 256, 256, G::Q4_K), add(S::Wk, 0, 64, 256, G::Q5_K), add(S::Wv, 0, 64, 256, G::Q6_K);
  add(S::Wo, 0, 256, 256, G::Q8_0);
  add(S::WGate, 0, 512, 256, G::Q4_0), add(S::WUp, 0, 512, 256, G::Q4_1);
  add(S::WDown, 0, 256, 512, G::Q6_K);
  // Layer 1: one F16 part converts the whole q/k/v; a Q2_K o; gate/up with rows of 96 elements
  // (whole Q4_0 blocks but not Q4_K ones: the parts mix); down shifted.
  add(S::Wq, 1, 256, 256, G::Q4_K), add(S::Wk, 1, 64, 256, G::F16), add(S::Wv, 1, 64, 256, G::Q4_K);
  add(S::Wo, 1, 256, 256, G::Q2_K);
  add(S::WGate, 1, 512, 96, G::Q4_0), add(S::WUp, 1, 512, 96, G::Q4_K);
  add(S::WDown, 1, 256, 512, G::Q4_K).add = 1.f;
  // Layer 2: an expert's part and a column slice are converted; up alone (no gate) is kept.
  add(S::Wq, 2, 256, 256, G::Q4_K).expert = 0;
  add(S::Wo, 2, 256, 256, G::Q4_K).stored_cols = 512;
  add(S::WUp, 2, 512, 256, G::Q4_K);
  std::set<std::string> kept;
  for (const PlannedTensor* p : gguf_gpu_block_tensors(plan)) kept.insert(p->src.name);
  EXPECT_EQ(kept, (std::set<std::string>{"wq.0", "wk.0", "wv.0", "wo.0", "w_gate.0", "w_up.0", "w_down.0", "w_up.2"}));
  for (const uint32_t t : {0u, 1u, 2u, 3u, 6u, 8u, 10u, 12u, 13u, 14u, 15u, 30u})
    EXPECT_EQ(gguf_gpu_block_type(static_cast<G>(t)), t == 2 || t == 3 || t == 8 || t == 12 || t == 13 || t == 14)
        << t;
}

TEST(WeightPlan, GgufOfEveryTypeGivesTheFp32LoadersWeights) {
  const auto dir = test::scratch_dir("weight_plan_gguf");
  const std::string path = (dir / "tiny.gguf").string();
  test::write_tiny_llama_gguf(path);
  auto file = std::make_shared<const gguf::GgufFile>(gguf::GgufFile::open(path));
  const ModelConfig c = llama_config_from_gguf(*file);
  EXPECT_TRUE(c.qkv_bias);
  const DecoderWeights loaded = load_llama_gguf(*file, c, {});
  const WeightPlan plan = plan_llama_gguf(file, c);
  std::set<gguf::GgmlType> types;
  for (const PlannedTensor& p : plan.tensors) {
    types.insert(p.src.type);
    EXPECT_EQ(p.permute_heads, p.slot == WeightSlot::Wq || p.slot == WeightSlot::Bq   ? c.n_heads
                               : p.slot == WeightSlot::Wk || p.slot == WeightSlot::Bk ? c.n_kv_heads
                                                                                      : 0)
        << p.src.name;
  }
  EXPECT_EQ(types.size(), test::tiny_gguf_matrix_types().size());
  expect_same_weights(materialize_plan(plan, c), loaded, c.n_layers);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace fdpp
