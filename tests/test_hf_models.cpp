// Hugging Face model directories: config.json parsing (both shapes, generation_config, every
// rejection, Qwen2's sliding-window rule), the tensor mappings of Llama / OPT / ChatGLM2 over an
// in-memory WeightSource and over real files written here, and - when tests/fixtures/hf/ holds them
// (made by tests/fixtures/hf/make_hf_fixtures.py) - logits of every position (NMSE <= 1e-6) and a
// 16-token greedy continuation (identical ids) against HF transformers in fp32, for each directory
// and for the GGUF files converted from them (fp32 weights and the CPU fast path's stored views),
// with the text's ids and the chat template's renderings where the fixture has them.
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <map>

#include "backend/cpu/cpu_runner.h"
#include "backend/cpu/quant_matmul.h"
#include "engine/sampler.h"
#include "fdpp/error.h"
#include "io/weight_source.h"
#include "model/arch/architecture.h"
#include "model/hf_config.h"
#include "model/model_loader.h"
#include "test_util.h"

namespace fdpp {
namespace {

using test::error_of;

namespace fs = std::filesystem;
using nlohmann::json;

// ---- helpers ----------------------------------------------------------------------------------


// A WeightSource held in memory (F32, or any dtype name for the checks that reject it).
class MemorySource final : public WeightSource {
 public:
  explicit MemorySource(std::string origin = "mem") : origin_(std::move(origin)) {}
  void add(const std::string& name, std::vector<int64_t> shape, std::vector<float> data = {}, std::string dtype = "F32") {
    const int64_t n = Tensor::numel_of(shape);
    if (data.empty()) data = test::random_vector(static_cast<size_t>(n), 0.1f);
    SourceTensor t{name, std::move(shape), std::move(dtype), static_cast<uint64_t>(n) * 4, origin_};
    remove(name);
    tensors_.push_back(t);
    data_[name] = std::move(data);
  }
  void remove(const std::string& name) {
    std::erase_if(tensors_, [&](const SourceTensor& t) { return t.name == name; });
    data_.erase(name);
  }
  const std::vector<float>& data(const std::string& name) const { return data_.at(name); }

  const std::string& origin() const override { return origin_; }
  std::string format() const override { return "memory"; }
  const std::vector<SourceTensor>& tensors() const override { return tensors_; }
  const SourceTensor* find(std::string_view name) const override {
    for (const auto& t : tensors_)
      if (t.name == name) return &t;
    return nullptr;
  }
  void read_f32(const SourceTensor& t, std::span<float> dst) const override {
    const auto& d = data_.at(t.name);
    check(dst.size() == d.size(), "size mismatch");
    std::copy(d.begin(), d.end(), dst.begin());
  }

 private:
  std::string origin_;
  std::vector<SourceTensor> tensors_;
  std::map<std::string, std::vector<float>> data_;
};

// Fills a source with every tensor the specs ask for, random.
void fill(MemorySource& src, const std::vector<HfTensorSpec>& specs) {
  for (const auto& s : specs) src.add(s.name, s.shape);
}

json tiny_llama_json() {
  return json{{"architectures", {"LlamaForCausalLM"}},
              {"model_type", "llama"},
              {"hidden_size", 32},
              {"intermediate_size", 48},
              {"num_hidden_layers", 2},
              {"num_attention_heads", 4},
              {"num_key_value_heads", 2},
              {"vocab_size", 40},
              {"max_position_embeddings", 64},
              {"rms_norm_eps", 1e-5},
              {"tie_word_embeddings", false},
              {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 10000.0}}},
              {"dtype", "float32"}};
}

json tiny_opt_json() {
  return json{{"architectures", {"OPTForCausalLM"}}, {"model_type", "opt"}, {"hidden_size", 16},
              {"ffn_dim", 24},   {"num_hidden_layers", 2}, {"num_attention_heads", 2},
              {"vocab_size", 30}, {"max_position_embeddings", 20}, {"do_layer_norm_before", true},
              {"word_embed_proj_dim", 16}};
}

json tiny_chatglm_json() {
  return json{{"architectures", {"ChatGLMModel"}}, {"model_type", "chatglm"}, {"num_layers", 2},
              {"hidden_size", 16}, {"ffn_hidden_size", 24}, {"kv_channels", 8}, {"num_attention_heads", 4},
              {"multi_query_attention", true}, {"multi_query_group_num", 2}, {"padded_vocab_size", 30},
              {"seq_length", 32}, {"layernorm_epsilon", 1e-5}, {"rmsnorm", true}, {"add_qkv_bias", true},
              {"add_bias_linear", false}, {"post_layer_norm", true}, {"original_rope", true},
              {"apply_residual_connection_post_layernorm", false}, {"eos_token_id", 2}};
}

HfConfig parse(const json& j, const json* gen = nullptr) { return parse_hf_config(j, gen, "DIR", "DIR/config.json"); }

using test::scratch_dir;
using test::write_text;

// A real model.safetensors (F32) of the given tensors.
void write_safetensors(const fs::path& p, const MemorySource& src) {
  json header = json::object();
  uint64_t offset = 0;
  for (const auto& t : src.tensors()) {
    const uint64_t bytes = src.data(t.name).size() * 4;
    header[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  header["__metadata__"] = {{"format", "pt"}};
  std::string h = header.dump();
  while (h.size() % 8 != 0) h += ' ';
  std::ofstream f(p, std::ios::binary);
  const uint64_t n = h.size();
  f.write(reinterpret_cast<const char*>(&n), 8);
  f << h;
  for (const auto& t : src.tensors()) {
    const auto& d = src.data(t.name);
    f.write(reinterpret_cast<const char*>(d.data()), static_cast<std::streamsize>(d.size() * 4));
  }
}

std::vector<float> forward_all(const ModelConfig& c, const DecoderWeights& w, const std::vector<int32_t>& ids) {
  CpuRunner runner(c, w, static_cast<int>(ids.size()));
  std::vector<float> logits(ids.size() * c.vocab_size);
  runner.forward(ids, 0, true, logits);
  return logits;
}

// ---- config.json ------------------------------------------------------------------------------

TEST(HfConfig, LlamaBothShapesGiveTheSameModel) {
  json v5 = tiny_llama_json();
  v5["rope_parameters"] = {{"rope_type", "llama3"}, {"rope_theta", 500000.0}, {"factor", 8.0},
                           {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                           {"original_max_position_embeddings", 8192}};
  json classic = tiny_llama_json();
  classic.erase("rope_parameters");
  classic.erase("dtype");
  classic["torch_dtype"] = "bfloat16";
  classic["rope_theta"] = 500000.0;
  classic["rope_scaling"] = {{"type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                             {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
  for (const json& j : {v5, classic}) {
    const HfConfig h = parse(j);
    const ModelConfig& c = h.config;
    EXPECT_EQ(c.architecture, "llama");
    EXPECT_EQ(c.n_layers, 2);
    EXPECT_EQ(c.hidden, 32);
    EXPECT_EQ(c.n_heads, 4);
    EXPECT_EQ(c.n_kv_heads, 2);
    EXPECT_EQ(c.head_dim, 8);
    EXPECT_EQ(c.rope.rotary_dim, 8);
    EXPECT_EQ(c.rope.theta, 500000.0);
    EXPECT_EQ(c.rope.scaling, RopeScaling::Llama3);
    EXPECT_EQ(c.rope.factor, 8.0);
    EXPECT_EQ(c.rope.high_freq_factor, 4.0);
    EXPECT_EQ(c.rope.original_max_positions, 8192);
    EXPECT_EQ(c.rope_style, RopeStyle::RotateHalf);
    EXPECT_FALSE(c.tied_embeddings);
  }
  EXPECT_EQ(parse(v5).dtype, "float32");
  EXPECT_EQ(parse(classic).dtype, "bfloat16");
}

TEST(HfConfig, HeadDimBiasesTyingAndLinearScaling) {
  json j = tiny_llama_json();
  j["head_dim"] = 128;
  j["attention_bias"] = true;
  j["mlp_bias"] = true;
  j["tie_word_embeddings"] = true;
  j["rope_parameters"] = {{"rope_type", "linear"}, {"rope_theta", 1e4}, {"factor", 2.0}};
  const ModelConfig c = parse(j).config;
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.q_dim(), 512);
  EXPECT_TRUE(c.qkv_bias && c.out_bias && c.mlp_bias && c.tied_embeddings);
  EXPECT_EQ(c.rope.scaling, RopeScaling::Linear);
  EXPECT_EQ(c.rope.factor, 2.0);

  // Both shapes in one config: rope_scaling's scaling, rope_parameters' theta (as transformers 5.17
  // reads it: LlamaConfig.from_dict gives {rope_type linear, factor 4, rope_theta 1e6}); a null
  // rope_scaling, as classic configs write it, is no scaling.
  j = tiny_llama_json();
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e6}};
  j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 4.0}};
  const RopeConfig both = parse(j).config.rope;
  EXPECT_EQ(both.scaling, RopeScaling::Linear);
  EXPECT_EQ(both.factor, 4.0);
  EXPECT_EQ(both.theta, 1e6);
  j["rope_scaling"] = nullptr;
  EXPECT_EQ(parse(j).config.rope.scaling, RopeScaling::None);
}

TEST(HfConfig, EndOfGenerationIdsFromBothFiles) {
  json j = tiny_llama_json();
  j["eos_token_id"] = 2;
  j["bos_token_id"] = 1;
  const json gen = {{"eos_token_id", {7, 2, 9}}, {"bos_token_id", 1}};
  const HfConfig h = parse(j, &gen);
  EXPECT_EQ(h.eos_token_ids, (std::vector<int32_t>{2, 7, 9}));
  EXPECT_EQ(h.bos_token_id, 1);
  j["eos_token_id"] = json::array({3, 4});
  EXPECT_EQ(parse(j).eos_token_ids, (std::vector<int32_t>{3, 4}));
  j["eos_token_id"] = "x";
  EXPECT_ERROR(parse(j), "eos_token_id holds \"x\"");
}

// A sliding window limits what each token attends to, not the context (issue 44).
TEST(HfConfig, MistralSlidingWindowIsPerLayerNotAContextCap) {
  json j = tiny_llama_json();
  j["architectures"] = {"MistralForCausalLM"};
  j["model_type"] = "mistral";
  j["max_position_embeddings"] = 32768;
  j["sliding_window"] = 4096;
  const ModelConfig c = parse(j).config;
  EXPECT_EQ(c.architecture, "mistral");
  EXPECT_EQ(c.max_context, 32768);
  EXPECT_EQ(c.layer_windows, std::vector<int>(static_cast<size_t>(c.n_layers), 4096));
  EXPECT_TRUE(c.has_sliding_window());
  j["sliding_window"] = nullptr;
  EXPECT_TRUE(parse(j).config.layer_windows.empty());
  j["sliding_window"] = 32768;  // as long as the context: full attention
  EXPECT_FALSE(parse(j).config.has_sliding_window());
  j["sliding_window"] = 0;
  EXPECT_ERROR(parse(j), "sliding_window = 0 must be positive");
}

// Qwen2.5-0.5B-Instruct's config.json, shrunk.
json tiny_qwen2_json() {
  return json{{"architectures", {"Qwen2ForCausalLM"}},
              {"model_type", "qwen2"},
              {"hidden_size", 32},
              {"intermediate_size", 48},
              {"num_hidden_layers", 4},
              {"num_attention_heads", 4},
              {"num_key_value_heads", 2},
              {"vocab_size", 40},
              {"max_position_embeddings", 32768},
              {"max_window_layers", 2},
              {"rms_norm_eps", 1e-6},
              {"rope_theta", 1000000.0},
              {"rope_scaling", nullptr},
              {"sliding_window", 32768},
              {"use_sliding_window", false},
              {"tie_word_embeddings", true},
              {"torch_dtype", "bfloat16"}};
}

TEST(HfConfig, Qwen2) {
  json j = tiny_qwen2_json();
  const ModelConfig c = parse(j).config;
  EXPECT_EQ(c.architecture, "qwen2");
  EXPECT_TRUE(c.qkv_bias);  // always, without an attention_bias key
  EXPECT_FALSE(c.out_bias || c.mlp_bias);
  EXPECT_TRUE(c.tied_embeddings);
  EXPECT_EQ(c.rope.theta, 1e6);
  EXPECT_EQ(c.rope_style, RopeStyle::RotateHalf);
  EXPECT_EQ(c.max_context, 32768);
  EXPECT_EQ(c.head_dim, 8);
  const auto specs = hf_tensor_specs(c, MemorySource());
  auto has = [&](const std::string& name) {
    return std::any_of(specs.begin(), specs.end(), [&](const HfTensorSpec& s) { return s.name == name; });
  };
  EXPECT_TRUE(has("model.layers.3.self_attn.k_proj.bias"));
  EXPECT_FALSE(has("model.layers.0.self_attn.o_proj.bias"));
  EXPECT_FALSE(has("lm_head.weight"));
  j.erase("architectures");  // the model_type alone says Qwen2
  EXPECT_EQ(parse(j).config.architecture, "qwen2");
}

TEST(HfConfig, Qwen2SlidingWindowOnlyWhenTurnedOnAndShorterThanTheContext) {
  json j = tiny_qwen2_json();
  // Turned off (every Qwen2.5 config): the window is ignored, as transformers ignores it.
  j["sliding_window"] = 4;
  EXPECT_TRUE(parse(j).config.layer_windows.empty());
  // Turned on, shorter than the context: layers from max_window_layers (2) on attend over it.
  j["use_sliding_window"] = true;
  EXPECT_EQ(parse(j).config.layer_windows, (std::vector<int>{0, 0, 4, 4}));
  EXPECT_EQ(parse(j).config.max_context, 32768);
  // layer_types (transformers 5's configs) decides which layers slide.
  j["layer_types"] = {"full_attention", "sliding_attention", "full_attention", "sliding_attention"};
  EXPECT_EQ(parse(j).config.layer_windows, (std::vector<int>{0, 4, 0, 4}));
  j["layer_types"] = {"full_attention", "full_attention", "full_attention", "full_attention"};
  EXPECT_TRUE(parse(j).config.layer_windows.empty());
  j["layer_types"] = {"full_attention"};
  EXPECT_ERROR(parse(j), "is not a list of num_hidden_layers = 4 names");
  j["layer_types"] = {"full_attention", "chunked_attention", "full_attention", "full_attention"};
  EXPECT_ERROR(parse(j), "layer_types[1] = \"chunked_attention\" is not supported");
  j.erase("layer_types");
  // No layer reaches max_window_layers: nothing slides.
  j["max_window_layers"] = 4;
  EXPECT_TRUE(parse(j).config.layer_windows.empty());
  j["max_window_layers"] = 0;
  EXPECT_EQ(parse(j).config.layer_windows, (std::vector<int>{4, 4, 4, 4}));
  j["max_window_layers"] = -1;
  EXPECT_ERROR(parse(j), "max_window_layers = -1 is not a layer count");
  // A window as long as the context never drops a key: full attention is exact.
  j["max_window_layers"] = 2;
  j["sliding_window"] = 32768;
  EXPECT_TRUE(parse(j).config.layer_windows.empty());
  j["sliding_window"] = nullptr;
  EXPECT_TRUE(parse(j).config.layer_windows.empty());
}

// Qwen3-0.6B's config.json, shrunk: head_dim given (not hidden / heads), q/k norms, no biases.
json tiny_qwen3_json() {
  json j = tiny_qwen2_json();
  j["architectures"] = {"Qwen3ForCausalLM"};
  j["model_type"] = "qwen3";
  j["head_dim"] = 16;
  j["attention_bias"] = false;
  j["max_window_layers"] = 4;
  return j;
}

TEST(HfConfig, Qwen3) {
  json j = tiny_qwen3_json();
  const ModelConfig c = parse(j).config;
  EXPECT_EQ(c.architecture, "qwen3");
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.qkv_bias || c.out_bias || c.mlp_bias);
  EXPECT_EQ(c.head_dim, 16);  // hidden / heads would be 8
  EXPECT_EQ(c.q_dim(), 64);
  EXPECT_EQ(c.rope.rotary_dim, 16);
  EXPECT_EQ(c.rope.theta, 1e6);
  EXPECT_TRUE(c.tied_embeddings);
  const auto specs = hf_tensor_specs(c, MemorySource());
  auto find = [&](const std::string& name) -> const HfTensorSpec* {
    for (const HfTensorSpec& s : specs)
      if (s.name == name) return &s;
    return nullptr;
  };
  ASSERT_NE(find("model.layers.3.self_attn.q_norm.weight"), nullptr);
  EXPECT_EQ(find("model.layers.3.self_attn.k_norm.weight")->shape, (std::vector<int64_t>{16}));
  EXPECT_EQ(find("model.layers.0.self_attn.q_proj.weight")->shape, (std::vector<int64_t>{64, 32}));
  EXPECT_EQ(find("model.layers.0.self_attn.q_proj.bias"), nullptr);
  j["attention_bias"] = true;
  EXPECT_TRUE(parse(j).config.qkv_bias);
  j.erase("architectures");
  EXPECT_EQ(parse(j).config.architecture, "qwen3");
  j["use_sliding_window"] = true;
  j["sliding_window"] = 8;
  j["max_window_layers"] = 3;
  EXPECT_EQ(parse(j).config.layer_windows, (std::vector<int>{0, 0, 0, 8}));
}

// Gemma 2's config.json (google/gemma-2-9b), shrunk.
json tiny_gemma2_json() {
  return json{{"architectures", {"Gemma2ForCausalLM"}},
              {"model_type", "gemma2"},
              {"hidden_size", 32},
              {"intermediate_size", 48},
              {"num_hidden_layers", 4},
              {"num_attention_heads", 4},
              {"num_key_value_heads", 2},
              {"head_dim", 16},
              {"vocab_size", 40},
              {"max_position_embeddings", 8192},
              {"hidden_act", "gelu_pytorch_tanh"},
              {"hidden_activation", "gelu_pytorch_tanh"},
              {"query_pre_attn_scalar", 24},
              {"attn_logit_softcapping", 50.0},
              {"final_logit_softcapping", 30.0},
              {"sliding_window", 4096},
              {"rms_norm_eps", 1e-6},
              {"rope_theta", 10000.0}};
}

TEST(HfConfig, Gemma2AndGemma3) {
  json j = tiny_gemma2_json();
  ModelConfig c = parse(j).config;
  EXPECT_EQ(c.architecture, "gemma2");
  EXPECT_EQ(c.activation, Activation::GeGLU);
  EXPECT_TRUE(c.sandwich_norm);
  EXPECT_TRUE(c.tied_embeddings);  // Gemma's default
  EXPECT_FALSE(c.qk_norm || c.has_local_rope);
  EXPECT_NEAR(c.embed_scale, std::sqrt(32.0), 1e-12);
  EXPECT_NEAR(c.attention_scale(), 1.0 / std::sqrt(24.0), 1e-12);  // not head_dim's
  EXPECT_EQ(c.attn_softcap, 50.0);
  EXPECT_EQ(c.final_softcap, 30.0);
  EXPECT_EQ(c.layer_windows, (std::vector<int>{4096, 0, 4096, 0}));  // even layers local
  EXPECT_EQ(c.max_context, 8192);
  const auto specs = hf_tensor_specs(c, MemorySource());
  auto has = [&](const std::string& name) {
    return std::any_of(specs.begin(), specs.end(), [&](const HfTensorSpec& s) { return s.name == name; });
  };
  EXPECT_TRUE(has("model.layers.3.pre_feedforward_layernorm.weight"));
  EXPECT_TRUE(has("model.layers.3.post_feedforward_layernorm.weight"));
  EXPECT_FALSE(has("model.layers.0.self_attn.q_norm.weight"));
  j["final_logit_softcapping"] = nullptr;
  EXPECT_EQ(parse(j).config.final_softcap, 0.0);
  j["hidden_activation"] = "relu";
  EXPECT_ERROR(parse(j), "hidden_activation = 'relu' is not supported");
  j["hidden_activation"] = "gelu_pytorch_tanh";
  j["layer_types"] = {"full_attention", "sliding_attention", "full_attention", "full_attention"};
  EXPECT_EQ(parse(j).config.layer_windows, (std::vector<int>{0, 4096, 0, 0}));

  // Gemma 3 text: q/k norms, local rope base, every 6th layer global without layer_types.
  j = tiny_gemma2_json();
  j["architectures"] = {"Gemma3ForCausalLM"};
  j["model_type"] = "gemma3_text";
  j["num_hidden_layers"] = 7;
  j["attn_logit_softcapping"] = nullptr;
  j["final_logit_softcapping"] = nullptr;
  j["rope_theta"] = 1e6;
  j["rope_local_base_freq"] = 10000.0;
  j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 8.0}};
  j["sliding_window"] = 512;
  c = parse(j).config;
  EXPECT_EQ(c.architecture, "gemma3");
  EXPECT_TRUE(c.qk_norm && c.has_local_rope);
  EXPECT_EQ(c.attn_softcap, 0.0);
  EXPECT_EQ(c.layer_windows, (std::vector<int>{512, 512, 512, 512, 512, 0, 512}));
  EXPECT_EQ(c.rope_of(5).theta, 1e6);
  EXPECT_EQ(c.rope_of(5).factor, 8.0);
  EXPECT_EQ(c.rope_of(0).theta, 10000.0);
  EXPECT_EQ(c.rope_of(0).scaling, RopeScaling::None);
  j["sliding_window_pattern"] = 2;
  EXPECT_EQ(parse(j).config.layer_windows, (std::vector<int>{512, 0, 512, 0, 512, 0, 512}));
  const auto g3_specs = hf_tensor_specs(c, MemorySource());
  EXPECT_TRUE(std::any_of(g3_specs.begin(), g3_specs.end(),
                          [](const HfTensorSpec& s) { return s.name == "model.layers.6.self_attn.k_norm.weight"; }));
  // transformers 5's shape: one rope per layer type.
  j.erase("rope_scaling");
  j.erase("rope_theta");
  j.erase("rope_local_base_freq");
  j["rope_parameters"] = {{"full_attention", {{"rope_type", "linear"}, {"factor", 4.0}, {"rope_theta", 2e6}}},
                          {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 5000.0}}}};
  c = parse(j).config;
  EXPECT_EQ(c.rope.theta, 2e6);
  EXPECT_EQ(c.rope.factor, 4.0);
  EXPECT_EQ(c.local_rope.theta, 5000.0);
  // Gemma's norms are (1 + w): the CPU load folds the 1 in.
  MemorySource src;
  const auto gspecs = hf_tensor_specs(c, src);
  fill(src, gspecs);
  const DecoderWeights w = load_hf_decoder(src, c, gspecs);
  EXPECT_FLOAT_EQ(w.layers[2].attn_post_norm.ptr()[3],
                  src.data("model.layers.2.post_attention_layernorm.weight")[3] + 1.0f);
  EXPECT_FLOAT_EQ(w.layers[1].q_norm.ptr()[0], src.data("model.layers.1.self_attn.q_norm.weight")[0] + 1.0f);
  EXPECT_FLOAT_EQ(w.final_norm.ptr()[7], src.data("model.norm.weight")[7] + 1.0f);
  EXPECT_FLOAT_EQ(w.layers[1].wq.ptr()[5], src.data("model.layers.1.self_attn.q_proj.weight")[5]);
}

// Phi-3-mini-128k's config.json, shrunk: LongRope, a sliding window, fused tensors.
json tiny_phi3_json() {
  return json{{"architectures", {"Phi3ForCausalLM"}},
              {"model_type", "phi3"},
              {"hidden_size", 32},
              {"intermediate_size", 48},
              {"num_hidden_layers", 2},
              {"num_attention_heads", 4},
              {"num_key_value_heads", 4},
              {"vocab_size", 40},
              {"max_position_embeddings", 131072},
              {"original_max_position_embeddings", 4096},
              {"rms_norm_eps", 1e-5},
              {"rope_theta", 10000.0},
              {"sliding_window", 262144},
              {"rope_scaling", {{"type", "longrope"}, {"short_factor", {1.0, 1.1, 1.2, 1.3}},
                                {"long_factor", {2.0, 4.0, 8.0, 16.0}}}}};
}

TEST(HfConfig, Phi3LongRope) {
  json j = tiny_phi3_json();
  ModelConfig c = parse(j).config;
  EXPECT_EQ(c.architecture, "phi3");
  EXPECT_EQ(c.rope.scaling, RopeScaling::LongRope);
  EXPECT_EQ(c.rope.original_max_positions, 4096);
  // transformers' default: sqrt(1 + ln(131072 / 4096) / ln(4096)).
  EXPECT_NEAR(c.rope.attention_factor, std::sqrt(1 + std::log(32.0) / std::log(4096.0)), 1e-12);
  EXPECT_TRUE(c.layer_windows.empty());  // a window beyond the context
  // The factor set follows the engine's context (llama.cpp's rule).
  EXPECT_EQ(c.rope.for_context(4096).freq_factors, (std::vector<double>{1.0, 1.1, 1.2, 1.3}));
  EXPECT_EQ(c.rope.for_context(4097).freq_factors, (std::vector<double>{2.0, 4.0, 8.0, 16.0}));
  EXPECT_EQ(c.rope.for_context(4097).scaling, RopeScaling::None);
  const auto specs = hf_tensor_specs(c, MemorySource());
  ASSERT_TRUE(std::any_of(specs.begin(), specs.end(),
                          [](const HfTensorSpec& s) { return s.name == "model.layers.1.self_attn.qkv_proj.weight"; }));
  j["rope_scaling"]["attention_factor"] = 1.5;
  EXPECT_EQ(parse(j).config.rope.attention_factor, 1.5);
  j["rope_scaling"]["long_factor"] = {1.0, 2.0};
  EXPECT_ERROR(parse(j), "rope_scaling.long_factor must be a list of rotary_dim / 2 = 4 numbers");
  j = tiny_phi3_json();
  j["partial_rotary_factor"] = 0.5;  // rotary_dim 4: two factors each
  j["rope_scaling"]["short_factor"] = {1.0, 1.5};
  j["rope_scaling"]["long_factor"] = {3.0, 5.0};
  j["sliding_window"] = 2047;
  c = parse(j).config;
  EXPECT_EQ(c.rope.rotary_dim, 4);
  EXPECT_EQ(c.layer_windows, (std::vector<int>{2047, 2047}));
  j["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}};
  EXPECT_ERROR(parse(j), "rope_type 'yarn' is not supported");
  // The fused tensors split by rows, as the GPU plan's parts say.
  j = tiny_phi3_json();
  j.erase("rope_scaling");
  c = parse(j).config;
  MemorySource src;
  const auto pspecs = hf_tensor_specs(c, src);
  fill(src, pspecs);
  const DecoderWeights w = load_hf_decoder(src, c, pspecs);
  const auto& qkv = src.data("model.layers.0.self_attn.qkv_proj.weight");
  EXPECT_EQ(w.layers[0].wk.ptr()[0], qkv[static_cast<size_t>(c.q_dim() * c.hidden)]);
  EXPECT_EQ(w.layers[0].wv.ptr()[3], qkv[static_cast<size_t>((c.q_dim() + c.kv_dim()) * c.hidden + 3)]);
  const auto& gate_up = src.data("model.layers.1.mlp.gate_up_proj.weight");
  EXPECT_EQ(w.layers[1].w_gate.ptr()[1], gate_up[1]);
  EXPECT_EQ(w.layers[1].w_up.ptr()[1], gate_up[static_cast<size_t>(c.ffn_hidden * c.hidden + 1)]);
}

TEST(HfConfig, OptVariants) {
  json j = tiny_opt_json();
  ModelConfig c = parse(j).config;
  EXPECT_EQ(c.architecture, "opt");
  EXPECT_EQ(c.norm, NormType::LayerNorm);
  EXPECT_EQ(c.activation, Activation::ReLU);
  EXPECT_EQ(c.position, PositionEncoding::Learned);
  EXPECT_EQ(c.learned_position_offset, 2);
  EXPECT_TRUE(c.pre_norm && c.final_norm && c.tied_embeddings && c.qkv_bias && c.mlp_bias && c.norm_bias);
  EXPECT_EQ(c.embed_dim, 0);
  EXPECT_EQ(c.head_dim, 8);
  j["do_layer_norm_before"] = false;
  j["word_embed_proj_dim"] = 8;
  c = parse(j).config;
  EXPECT_FALSE(c.pre_norm);
  EXPECT_FALSE(c.final_norm);  // post-LN OPT has no final layer norm
  EXPECT_EQ(c.embed_dim, 8);
  j = tiny_opt_json();
  j["_remove_final_layer_norm"] = true;
  EXPECT_FALSE(parse(j).config.final_norm);
  j["enable_bias"] = false;
  EXPECT_FALSE(parse(j).config.qkv_bias);
  j["activation_function"] = "gelu";
  EXPECT_ERROR(parse(j), "activation_function = 'gelu' is not supported");
}

TEST(HfConfig, ChatGLM2) {
  const ModelConfig c = parse(tiny_chatglm_json()).config;
  EXPECT_EQ(c.architecture, "chatglm");
  EXPECT_EQ(c.n_heads, 4);
  EXPECT_EQ(c.n_kv_heads, 2);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.rope.rotary_dim, 4);
  EXPECT_EQ(c.rope_style, RopeStyle::Interleaved);
  EXPECT_EQ(c.vocab_size, 30);
  EXPECT_EQ(c.max_context, 32);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_FALSE(c.out_bias || c.mlp_bias || c.tied_embeddings);
}

TEST(HfConfig, ChatGLMFeaturesNotImplementedAreRejected) {
  const std::vector<std::pair<std::pair<const char*, json>, const char*>> cases = {
      {{"rope_ratio", 50}, "rope_ratio = 50 is not supported"},
      {{"multi_query_attention", false}, "multi_query_attention = false is not supported"},
      {{"apply_residual_connection_post_layernorm", true}, "apply_residual_connection_post_layernorm = true"},
      {{"post_layer_norm", false}, "post_layer_norm = false"},
      {{"original_rope", false}, "original_rope = false"},
      {{"rmsnorm", false}, "rmsnorm = false"},
      {{"add_bias_linear", true}, "add_bias_linear = true"},
      {{"pre_seq_len", 128}, "pre_seq_len is set"},
      {{"quantization_bit", 4}, "quantization_bit = 4"},
      {{"position_encoding_2d", true}, "ChatGLM-6B (first generation)"},
  };
  for (const auto& [kv, fragment] : cases) {
    json j = tiny_chatglm_json();
    j[kv.first] = kv.second;
    EXPECT_ERROR(parse(j), fragment);
  }
  json j = tiny_chatglm_json();
  j["rope_ratio"] = 1;  // the default, accepted
  EXPECT_NO_THROW(parse(j));
}

TEST(HfConfig, MissingZeroAndInconsistentFieldsAreOneLineErrors) {
  json j = tiny_llama_json();
  j.erase("num_attention_heads");
  EXPECT_ERROR(parse(j), "DIR/config.json: num_attention_heads is missing");
  j = tiny_llama_json();
  j["num_attention_heads"] = 0;
  EXPECT_ERROR(parse(j), "DIR/config.json: num_attention_heads = 0 must be positive");
  j = tiny_llama_json();
  j["hidden_size"] = 30;  // not a multiple of 4 heads, and no head_dim
  EXPECT_ERROR(parse(j), "hidden_size = 30 is not a multiple of num_attention_heads = 4");
  j = tiny_llama_json();
  j["num_key_value_heads"] = 3;
  EXPECT_ERROR(parse(j), "num_attention_heads = 4 is not a multiple of num_key_value_heads = 3");
  j = tiny_llama_json();
  j["vocab_size"] = "many";
  EXPECT_ERROR(parse(j), "vocab_size = \"many\" is not an integer");
  j = tiny_llama_json();
  j["rope_parameters"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  EXPECT_ERROR(parse(j), "rope_type 'yarn' is not supported");
  // rope_scaling beside rope_parameters is read (transformers 5 does), not passed over.
  j = tiny_llama_json();
  j["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}};
  EXPECT_ERROR(parse(j), "rope_scaling.rope_type 'yarn' is not supported");
  j = tiny_llama_json();
  j["rope_parameters"] = {{"rope_type", "llama3"}, {"factor", 8.0}};
  EXPECT_ERROR(parse(j), "rope_parameters.low_freq_factor is missing");
  j = tiny_llama_json();
  j["hidden_act"] = "gelu";
  EXPECT_ERROR(parse(j), "hidden_act = 'gelu' is not supported");
  j = tiny_opt_json();
  j.erase("ffn_dim");
  EXPECT_ERROR(parse(j), "ffn_dim is missing");
  j = tiny_chatglm_json();
  j.erase("padded_vocab_size");
  EXPECT_ERROR(parse(j), "padded_vocab_size is missing");
  EXPECT_ERROR(parse(json::array()), "expected a JSON object");
}

TEST(HfConfig, UnsupportedArchitectureIsNamed) {
  json j = tiny_llama_json();
  j["architectures"] = {"GPTNeoXForCausalLM"};
  EXPECT_ERROR(parse(j), "unsupported architecture 'GPTNeoXForCausalLM'");
  j.erase("architectures");
  j["model_type"] = "gpt_neox";
  EXPECT_ERROR(parse(j), "model_type ('gpt_neox')");
  j["model_type"] = "llama";  // no architectures: the model_type decides
  EXPECT_EQ(parse(j).config.architecture, "llama");
}

TEST(HfConfig, FilesOnDisk) {
  const fs::path d = scratch_dir("config");
  EXPECT_ERROR(read_hf_config(d.string()), "no config.json");
  write_text(d / "config.json", "{\"hidden_size\": 32,");
  EXPECT_ERROR(read_hf_config(d.string()), "config.json: not valid JSON");
  write_text(d / "config.json", tiny_llama_json().dump());
  write_text(d / "generation_config.json", R"({"eos_token_id": [5, 6]})");
  const HfConfig h = read_hf_config(d.string());
  EXPECT_EQ(h.eos_token_ids, (std::vector<int32_t>{5, 6}));
  EXPECT_TRUE(is_hf_directory(d.string()));
  write_text(d / "generation_config.json", "nope");
  EXPECT_ERROR(read_hf_config(d.string()), "generation_config.json: not valid JSON");
  write_text(d / "generation_config.json",
             "{\"eos_token_id\": " + std::string(100'000, '[') + std::string(100'000, ']') + "}");
  EXPECT_ERROR(read_hf_config(d.string()), "generation_config.json: not valid JSON (nests deeper than 64 levels)");
  fs::remove_all(d);
}

// The published config.json files under configs/ (every family there).
TEST(HfConfig, PresetConfigsOfThePaperModels) {
  const std::string dir = std::string(FDPP_TEST_DIR) + "/../configs/";
  if (!fs::exists(dir + "chatglm2-6b.json")) GTEST_SKIP() << "configs/ not present";
  auto load = [&](const char* name) { return parse_hf_config(read_json_file(dir + name), nullptr, dir, dir + name); };
  const ModelConfig glm = load("chatglm2-6b.json").config;
  EXPECT_EQ(glm.n_layers, 28);
  EXPECT_EQ(glm.n_heads, 32);
  EXPECT_EQ(glm.n_kv_heads, 2);
  EXPECT_EQ(glm.head_dim, 128);
  EXPECT_EQ(glm.rope.rotary_dim, 64);
  EXPECT_EQ(glm.ffn_hidden, 13696);
  EXPECT_EQ(glm.vocab_size, 65024);
  const ModelConfig opt = load("opt-6.7b.json").config;
  EXPECT_EQ(opt.n_layers, 32);
  EXPECT_EQ(opt.ffn_hidden, 16384);
  EXPECT_EQ(opt.embed_dim, 0);
  const ModelConfig l2 = load("llama-2-7b.json").config;
  EXPECT_EQ(l2.n_kv_heads, 32);
  EXPECT_EQ(l2.ffn_hidden, 11008);
  const ModelConfig l3 = load("llama-3-8b.json").config;
  EXPECT_EQ(l3.n_kv_heads, 8);
  EXPECT_EQ(l3.rope.theta, 500000.0);
  EXPECT_EQ(l3.vocab_size, 128256);
  // Qwen2.5-7B: q/k/v biases, no o bias, its window off (use_sliding_window false).
  const ModelConfig q = load("qwen2.5-7b.json").config;
  EXPECT_EQ(q.n_layers, 28);
  EXPECT_EQ(q.n_heads, 28);
  EXPECT_EQ(q.n_kv_heads, 4);
  EXPECT_EQ(q.head_dim, 128);
  EXPECT_EQ(q.ffn_hidden, 18944);
  EXPECT_EQ(q.vocab_size, 152064);
  EXPECT_TRUE(q.qkv_bias);
  EXPECT_FALSE(q.out_bias);
  EXPECT_EQ(q.rope.theta, 1000000.0);
  // Qwen3-8B: head_dim 128 given, q/k norms, no biases, no window.
  const ModelConfig q3 = load("qwen3-8b.json").config;
  EXPECT_EQ(q3.architecture, "qwen3");
  EXPECT_EQ(q3.n_layers, 36);
  EXPECT_EQ(q3.q_dim(), 4096);
  EXPECT_EQ(q3.n_kv_heads, 8);
  EXPECT_TRUE(q3.qk_norm);
  EXPECT_FALSE(q3.qkv_bias);
  EXPECT_TRUE(q3.layer_windows.empty());
  // Gemma-2-9B: soft-capping, every other layer local over 4096 of 8192.
  const ModelConfig g2 = load("gemma-2-9b.json").config;
  EXPECT_EQ(g2.architecture, "gemma2");
  EXPECT_EQ(g2.head_dim, 256);
  EXPECT_EQ(g2.q_dim(), 4096);  // not hidden (3584)
  EXPECT_EQ(g2.attn_softcap, 50.0);
  EXPECT_EQ(g2.final_softcap, 30.0);
  EXPECT_EQ(g2.window(0), 4096);
  EXPECT_EQ(g2.window(1), 0);
  EXPECT_NEAR(g2.embed_scale, std::sqrt(3584.0), 1e-9);
  // Gemma-3-12B (text): 5 local layers (window 1024, base 10000) per global one (1e6, linear 8).
  const ModelConfig g3 = load("gemma-3-12b.json").config;
  EXPECT_EQ(g3.architecture, "gemma3");
  EXPECT_EQ(g3.n_layers, 48);
  EXPECT_TRUE(g3.qk_norm);
  EXPECT_EQ(g3.attn_softcap, 0.0);
  EXPECT_EQ(g3.window(4), 1024);
  EXPECT_EQ(g3.window(5), 0);
  EXPECT_EQ(g3.rope_of(5).theta, 1e6);
  EXPECT_EQ(g3.rope_of(5).scaling, RopeScaling::Linear);
  EXPECT_EQ(g3.rope_of(4).theta, 10000.0);
  EXPECT_EQ(g3.rope_of(4).scaling, RopeScaling::None);
  // Phi-4: fused qkv / gate_up (split at load), GQA 4:1, head_dim 128, no rope scaling.
  const ModelConfig p4 = load("phi-4.json").config;
  EXPECT_EQ(p4.architecture, "phi3");
  EXPECT_EQ(p4.n_layers, 40);
  EXPECT_EQ(p4.head_dim, 128);
  EXPECT_EQ(p4.n_kv_heads, 10);
  EXPECT_EQ(p4.ffn_hidden, 17920);
  EXPECT_EQ(p4.rope.theta, 250000.0);
  EXPECT_EQ(p4.rope.scaling, RopeScaling::None);
  EXPECT_TRUE(p4.layer_windows.empty());
  // Phi-3-mini-4k: MHA at head_dim 96, a window of 2047 in every layer of its 4096 positions.
  const ModelConfig p3 = load("phi-3-mini-4k.json").config;
  EXPECT_EQ(p3.architecture, "phi3");
  EXPECT_EQ(p3.head_dim, 96);
  EXPECT_EQ(p3.n_kv_heads, 32);
  EXPECT_EQ(p3.vocab_size, 32064);
  EXPECT_EQ(p3.window(0), 2047);
  EXPECT_EQ(p3.window(31), 2047);
  EXPECT_EQ(p3.max_context, 4096);
}

// ---- tensor mappings --------------------------------------------------------------------------

TEST(HfModels, LlamaMappingLoadsAndRuns) {
  for (const bool tied : {false, true}) {
    json j = tiny_llama_json();
    j["tie_word_embeddings"] = tied;
    const HfConfig h = parse(j);
    MemorySource src;
    fill(src, hf_llama_tensor_specs(h.config));
    EXPECT_EQ(src.find("lm_head.weight") != nullptr, !tied);
    if (tied) src.add("lm_head.weight", {40, 32});  // a tied copy as torch.save writes it: ignored
    const ModelDescription d = describe_hf_model(h, src);
    EXPECT_EQ(d.tensors.size(), tied ? 20u : 21u);
    const DecoderWeights w = load_hf_model_weights(h, src);
    EXPECT_EQ(w.layers[1].wk.data, src.data("model.layers.1.self_attn.k_proj.weight"));
    EXPECT_EQ(w.output_matrix().data,
              src.data(tied ? "model.embed_tokens.weight" : "lm_head.weight"));
    const auto logits = forward_all(h.config, w, {1, 5, 7, 39});
    for (const float x : logits) ASSERT_TRUE(std::isfinite(x));
  }
}

TEST(HfModels, ChatGLMFusedTensorsAreSplitByRows) {
  const HfConfig h = parse(tiny_chatglm_json());
  MemorySource src;
  fill(src, chatglm_tensor_specs(h.config));
  src.add("transformer.rotary_pos_emb.inv_freq", {2});  // a buffer the real checkpoint has: ignored
  const DecoderWeights w = load_hf_model_weights(h, src);
  const int64_t q = 4 * 8, kv = 2 * 8, ff = 24, hid = 16;
  const auto& qkv = src.data("transformer.encoder.layers.1.self_attention.query_key_value.weight");
  const auto& L = w.layers[1];
  ASSERT_EQ(L.wq.shape, (std::vector<int64_t>{q, hid}));
  ASSERT_EQ(L.wk.shape, (std::vector<int64_t>{kv, hid}));
  EXPECT_TRUE(std::equal(L.wq.data.begin(), L.wq.data.end(), qkv.begin()));
  EXPECT_TRUE(std::equal(L.wk.data.begin(), L.wk.data.end(), qkv.begin() + q * hid));
  EXPECT_TRUE(std::equal(L.wv.data.begin(), L.wv.data.end(), qkv.begin() + (q + kv) * hid));
  const auto& bias = src.data("transformer.encoder.layers.1.self_attention.query_key_value.bias");
  EXPECT_TRUE(std::equal(L.bv.data.begin(), L.bv.data.end(), bias.begin() + q + kv));
  const auto& h4h = src.data("transformer.encoder.layers.1.mlp.dense_h_to_4h.weight");
  EXPECT_TRUE(std::equal(L.w_gate.data.begin(), L.w_gate.data.end(), h4h.begin()));  // gate first
  EXPECT_TRUE(std::equal(L.w_up.data.begin(), L.w_up.data.end(), h4h.begin() + ff * hid));
  EXPECT_EQ(w.lm_head.data, src.data("transformer.output_layer.weight"));
  const auto logits = forward_all(h.config, w, {0, 3, 29});
  for (const float x : logits) ASSERT_TRUE(std::isfinite(x));
}

TEST(HfModels, OptNamePrefixesAndProjections) {
  json j = tiny_opt_json();
  j["do_layer_norm_before"] = false;
  j["word_embed_proj_dim"] = 8;
  const HfConfig h = parse(j);
  std::vector<float> reference;
  for (const std::string prefix : {"model.decoder.", "decoder.", "model.", ""}) {
    MemorySource probe;
    probe.add("model.decoder.embed_tokens.weight", {30, 8});
    // Same values under each prefix: the same model.
    std::mt19937 gen(1234);
    std::normal_distribution<float> dist(0.f, 0.1f);
    MemorySource src;
    for (const auto& s : opt_tensor_specs(h.config, probe)) {
      const std::string name = s.name.rfind("model.decoder.", 0) == 0 ? prefix + s.name.substr(14) : s.name;
      std::vector<float> v(static_cast<size_t>(Tensor::numel_of(s.shape)));
      for (auto& x : v) x = dist(gen);
      src.add(name, s.shape, v);
    }
    const DecoderWeights w = load_hf_model_weights(h, src);
    EXPECT_EQ(w.project_in.shape, (std::vector<int64_t>{16, 8}));
    EXPECT_EQ(w.project_out.shape, (std::vector<int64_t>{8, 16}));
    EXPECT_EQ(w.pos_embeddings.shape, (std::vector<int64_t>{22, 16}));  // max positions + offset 2
    EXPECT_TRUE(w.final_norm.empty());
    const auto logits = forward_all(h.config, w, {2, 9, 17, 4});
    if (reference.empty()) reference = logits;
    EXPECT_EQ(logits, reference) << prefix;
  }
  MemorySource none;
  none.add("transformer.wte.weight", {30, 8});
  EXPECT_ERROR(load_hf_model_weights(h, none), "tensor 'model.decoder.embed_tokens.weight' is missing (also looked");
}

TEST(HfModels, CheckpointsThatContradictConfigJsonAreRejected) {
  const HfConfig h = parse(tiny_llama_json());
  const auto specs = hf_llama_tensor_specs(h.config);
  {
    MemorySource src("DIR");
    fill(src, specs);
    src.remove("model.layers.1.mlp.up_proj.weight");
    EXPECT_ERROR(describe_hf_model(h, src), "DIR: tensor 'model.layers.1.mlp.up_proj.weight' is missing");
  }
  {
    MemorySource src("DIR");
    fill(src, specs);
    src.add("model.layers.0.self_attn.q_proj.weight", {16, 32});
    EXPECT_ERROR(describe_hf_model(h, src),
                 "tensor 'model.layers.0.self_attn.q_proj.weight' has shape [16, 32], but DIR/config.json implies [32, 32]");
  }
  {
    MemorySource src("DIR");
    fill(src, specs);
    src.add("model.layers.0.self_attn.q_proj.bias", {32});
    EXPECT_ERROR(describe_hf_model(h, src), "'model.layers.0.self_attn.q_proj.bias' is in the checkpoint, but");
  }
  {
    MemorySource src("DIR");
    fill(src, specs);
    src.add("model.layers.2.input_layernorm.weight", {32});
    EXPECT_ERROR(describe_hf_model(h, src), "belongs to layer 2, but DIR/config.json says the model has 2 layers");
  }
  {
    MemorySource src("DIR");
    fill(src, specs);
    src.add("model.norm.weight", {32}, {}, "I8");
    EXPECT_ERROR(describe_hf_model(h, src), "tensor 'model.norm.weight' has dtype I8, which fdpp cannot read");
  }
  {
    MemorySource src("DIR");
    fill(src, specs);
    src.add("model.layers.0.self_attn.rotary_emb.inv_freq", {4});  // old checkpoints carry it
    EXPECT_NO_THROW(describe_hf_model(h, src));
  }
}

// Expert configs and checkpoints that disagree are refused with one line naming the field or the
// tensor; Qwen3-MoE's layer rule is transformers' own.
TEST(HfModels, ExpertLayersFollowTheConfigAndMismatchesAreRefused) {
  json q = tiny_llama_json();
  q["architectures"] = {"Qwen3MoeForCausalLM"};
  q["model_type"] = "qwen3_moe";
  q["num_hidden_layers"] = 6;
  q["num_experts"] = 4;
  q["num_experts_per_tok"] = 2;
  q["moe_intermediate_size"] = 16;
  q["decoder_sparse_step"] = 2;
  q["mlp_only_layers"] = {3};
  const ModelConfig c = parse(q).config;
  EXPECT_EQ(c.architecture, "qwen3moe");
  EXPECT_FALSE(c.norm_topk_prob);  // Qwen3MoeConfig's default
  std::vector<bool> moe;
  for (int i = 0; i < c.n_layers; ++i) moe.push_back(c.is_moe_layer(i));
  EXPECT_EQ(moe, (std::vector<bool>{false, true, false, false, false, true}));

  json bad = q;
  bad["num_experts_per_tok"] = 5;
  EXPECT_ERROR(parse(bad), "num_experts_per_tok = 5 exceeds num_experts = 4");
  bad = q;
  bad["mlp_only_layers"] = {6};
  EXPECT_ERROR(parse(bad), "mlp_only_layers holds 6, not a layer index in [0, 6)");
  json m = tiny_llama_json();
  m["architectures"] = {"MixtralForCausalLM"};
  m["model_type"] = "mixtral";
  m["num_local_experts"] = 0;
  EXPECT_ERROR(parse(m), "num_local_experts");

  // A checkpoint with one expert more than config.json says, or one missing.
  m["num_local_experts"] = 3;
  const HfConfig h = parse(m);
  EXPECT_EQ(h.config.n_experts_used, 2);  // MixtralConfig's default
  const auto specs = hf_tensor_specs(h.config, MemorySource());
  {
    MemorySource src("DIR");
    fill(src, specs);
    EXPECT_NO_THROW(describe_hf_model(h, src));
    src.add("model.layers.0.block_sparse_moe.experts.3.w1.weight", {48, 32});
    EXPECT_ERROR(describe_hf_model(h, src), "belongs to expert 3, but DIR/config.json says the model has 3 experts");
  }
  {
    MemorySource src("DIR");
    fill(src, specs);
    src.remove("model.layers.1.block_sparse_moe.experts.2.w2.weight");
    EXPECT_ERROR(describe_hf_model(h, src), "tensor 'model.layers.1.block_sparse_moe.experts.2.w2.weight' is missing");
  }
}

// The whole path through real files: config.json + model.safetensors in a directory, read by
// describe_model / load_model as `fdpp info` and `fdpp logits` do.
TEST(HfModels, DirectoryWithSafetensorsLoadsLikeTheInMemorySource) {
  const fs::path d = scratch_dir("dir");
  const HfConfig h = parse(tiny_chatglm_json());
  MemorySource src;
  fill(src, chatglm_tensor_specs(h.config));
  write_text(d / "config.json", tiny_chatglm_json().dump(1));
  write_safetensors(d / "model.safetensors", src);

  const ModelDescription desc = describe_model(d.string());
  EXPECT_EQ(desc.format, "safetensors");
  EXPECT_EQ(desc.config.architecture, "chatglm");
  EXPECT_EQ(desc.dtype_counts.at("F32"), static_cast<int>(desc.tensors.size()));
  const LoadedModel m = load_model(d.string());
  EXPECT_EQ(m.tokenizer, nullptr);  // a bare checkpoint: no tokenizer files
  const std::vector<int32_t> ids{1, 2, 3, 4, 5};
  const DecoderWeights direct = load_hf_model_weights(parse(tiny_chatglm_json()), src);
  EXPECT_EQ(forward_all(m.config(), m.weights, ids), forward_all(h.config, direct, ids));

  // Shapes that disagree with config.json are caught by describe_model (fdpp info) already.
  json wrong = tiny_chatglm_json();
  wrong["ffn_hidden_size"] = 20;
  write_text(d / "config.json", wrong.dump());
  EXPECT_ERROR(describe_model(d.string()), "has shape [48, 16], but");
  write_text(d / "config.json", "not json");
  EXPECT_ERROR(describe_model(d.string()), "config.json: not valid JSON");
  fs::remove(d / "config.json");
  EXPECT_ERROR(describe_model(d.string()), "is a directory without config.json");
  fs::remove_all(d);
}

// ---- HF transformers references ---------------------------------------------------------------

std::vector<fs::path> fixture_dirs() {
  std::vector<fs::path> out;
  const fs::path root = test::fixture("hf");
  if (!fs::exists(root)) return out;
  for (const auto& e : fs::directory_iterator(root))
    if (e.is_directory() && fs::exists(e.path() / "reference.json")) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(HfFixtures, LogitsAndGreedyDecodeMatchTransformers) {
  const auto dirs = fixture_dirs();
  if (dirs.empty())
    GTEST_SKIP() << "no HF fixtures in tests/fixtures/hf/ (make them with tests/fixtures/hf/make_hf_fixtures.py "
                    "on a machine with torch, then unpack hf_fixtures.tar.gz there)";
  for (const fs::path& dir : dirs) {
    SCOPED_TRACE(dir.filename().string());
    std::ifstream f(dir / "reference.json");
    const json ref = json::parse(f);
    // A GGUF variant names its file; the others are the directory itself.
    const bool gguf = ref.contains("model");
    const std::string path = gguf ? (dir / ref["model"].get<std::string>()).string() : dir.string();
    const LoadedModel m = load_model(path);
    const ModelConfig& c = m.config();
    const auto ids = ref["ids"].get<std::vector<int32_t>>();
    const auto expected = test::read_npy((dir / ref["logits"].get<std::string>()).string());
    ASSERT_EQ(expected.shape, (std::vector<int64_t>{static_cast<int64_t>(ids.size()), c.vocab_size}));
    const auto prompt = ref["prompt"].get<std::vector<int32_t>>();
    const auto greedy = ref["greedy"].get<std::vector<int32_t>>();

    // fp32 weights, and for a GGUF also the CPU fast path's stored views into the file (its
    // F16/BF16 kernels accumulate in fp32 like the reference path).
    std::vector<std::pair<const char*, const LoadedModel*>> forms{{"f32", &m}};
    LoadedModel stored;
    if (gguf) {
      stored = load_model(path, {}, cpu::stored_load_options());
      EXPECT_FALSE(stored.weights.layers.at(0).wq.stored.empty());
      EXPECT_TRUE(stored.weights.layers.at(0).wq.empty());  // no fp32 copy
      forms.emplace_back("stored", &stored);
    }
    for (const auto& [form, model] : forms) {
      SCOPED_TRACE(form);
      const auto logits = forward_all(c, model->weights, ids);
      const double e = test::nmse(logits, expected.data);
      std::printf("%-28s %-12s %-7s %s: logits NMSE %.3e\n", dir.filename().c_str(), m.description.format.c_str(), form,
                  c.architecture.c_str(), e);
      EXPECT_LE(e, 1e-6);

      // Greedy: prefill the prompt, then one token at a time through the KV cache.
      CpuRunner runner(c, model->weights, static_cast<int>(prompt.size() + greedy.size()));
      std::vector<float> last(c.vocab_size);
      runner.forward(prompt, 0, false, last);
      std::vector<int32_t> ours;
      for (size_t i = 0; i < greedy.size(); ++i) {
        ours.push_back(argmax(last));
        if (i + 1 < greedy.size())
          runner.forward(std::span<const int32_t>(&ours.back(), 1), static_cast<int>(prompt.size() + i), false, last);
      }
      EXPECT_EQ(ours, greedy);
    }

    if (ref.contains("text")) {
      ASSERT_NE(m.tokenizer, nullptr);
      const auto text_ids = ref["text_ids"].get<std::vector<int32_t>>();
      EXPECT_EQ(m.tokenizer->encode(ref["text"].get<std::string>(), m.tokenizer->add_bos_by_default(), true), text_ids);
    }
    // The chat template as the checkpoint ships it, against transformers' apply_chat_template.
    for (const json& chat : ref.value("chat", json::array())) {
      ASSERT_NE(m.tokenizer, nullptr);
      std::vector<ChatMessage> messages;
      for (const json& msg : chat["messages"]) messages.push_back({msg["role"], msg["content"]});
      ChatOptions options;  // transformers' apply_chat_template keywords the reference passed
      if (chat.contains("enable_thinking")) options.enable_thinking = chat["enable_thinking"].get<bool>();
      const std::string rendered = m.tokenizer->apply_chat_template(messages, chat["add_generation_prompt"], options);
      EXPECT_EQ(rendered, chat["rendered"].get<std::string>());
      EXPECT_EQ(m.tokenizer->encode(rendered, false, true), chat["ids"].get<std::vector<int32_t>>()) << rendered;
    }
  }
}

}  // namespace
}  // namespace fdpp
