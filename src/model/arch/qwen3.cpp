// Qwen3 (dense): the Llama layout with an RMSNorm over each head of q and of k before RoPE
// (q_norm, k_norm: one [head_dim] weight each, shared by the heads), an explicit head_dim (128 in
// every released size, whatever hidden / heads is), no biases unless attention_bias, rope_theta
// 1e6, tied embeddings in the small sizes. Sliding window as Qwen2 (qwen_layer_windows).
//
// Hugging Face (Qwen3ForCausalLM, model_type qwen3): Llama's tensor names plus
// self_attn.{q,k}_norm.weight.
//
// GGUF (general.architecture qwen3): llama.cpp's Llama names plus blk.N.attn_{q,k}_norm.weight;
// head_dim is qwen3.attention.key_length; q/k rows in Hugging Face's order (NeoX-style RoPE).
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "fdpp/error.h"
#include "io/gguf.h"
#include "io/json_file.h"
#include "model/arch/architecture.h"

namespace fdpp {

namespace {

using nlohmann::json;

constexpr int kDefaultMaxPositions = 32768;  // Qwen3Config's default

void parse_hf(const json& j, const std::string&, const std::string&, const std::string& origin, ModelConfig& c) {
  const JsonFields f(j, origin);
  parse_llama_layout_hf(j, origin, c);
  if (!f.has("max_position_embeddings")) c.max_context = kDefaultMaxPositions;
  c.architecture = "qwen3";
  c.qkv_bias = c.out_bias = f.boolean_or("attention_bias", false);
  c.mlp_bias = false;
  c.qk_norm = true;
  c.layer_windows = qwen_layer_windows(j, origin, c.n_layers, c.max_context);
}

std::vector<HfTensorSpec> hf_specs(const ModelConfig& c, const WeightSource&) {
  std::vector<HfTensorSpec> s = hf_llama_tensor_specs(c);
  for (int i = 0; i < c.n_layers; ++i) {
    s.push_back(hf_layer_spec(fmt::format("model.layers.{}.self_attn.q_norm.weight", i), {c.head_dim}, i,
                              &LayerWeights::q_norm));
    s.push_back(hf_layer_spec(fmt::format("model.layers.{}.self_attn.k_norm.weight", i), {c.head_dim}, i,
                              &LayerWeights::k_norm));
  }
  return s;
}

ModelConfig config_from_gguf(const gguf::GgufFile& f) {
  const std::string a = f.get_string("general.architecture");
  check(a == "qwen3", "{}: unsupported architecture '{}' (supported: qwen3)", f.path(), a);
  ModelConfig c = llama_layout_config_from_gguf(f);
  c.qk_norm = true;
  return c;
}

std::vector<GgufTensorSpec> gguf_specs(const ModelConfig& c) {
  std::vector<GgufTensorSpec> s = llama_layout_gguf_tensor_specs(c, /*permuted_qk=*/false);
  for (int i = 0; i < c.n_layers; ++i) {
    s.push_back({fmt::format("blk.{}.attn_q_norm.weight", i), {c.head_dim}, WeightSlot::QNorm, i});
    s.push_back({fmt::format("blk.{}.attn_k_norm.weight", i), {c.head_dim}, WeightSlot::KNorm, i});
  }
  return s;
}

}  // namespace

const Architecture& qwen3_architecture() {
  static const Architecture kQwen3{
      .family = "qwen3",
      .config_names = {"qwen3"},
      .hf_names = {{"Qwen3ForCausalLM", "qwen3"}},
      .gguf_names = {"qwen3"},
      .parse_hf_config = parse_hf,
      .hf_tensor_specs = hf_specs,
      .gguf_config = config_from_gguf,
      .gguf_tensor_specs = gguf_specs,
  };
  return kQwen3;
}

}  // namespace fdpp
