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
//
// Qwen3-MoE (Qwen3MoeForCausalLM, model_type qwen3_moe; GGUF qwen3moe): Qwen3 whose MLPs are
// expert layers, num_experts SwiGLU experts of moe_intermediate_size with num_experts_per_tok
// chosen per token (norm_topk_prob: their weights renormalized), except the layers that
// decoder_sparse_step skips or mlp_only_layers lists, which keep a dense MLP of intermediate_size.
// Names: model.layers.N.mlp.{gate, experts.E.{gate,up,down}_proj}; GGUF as Mixtral's
// (llama.cpp: every layer has experts, the weights always renormalized;
// qwen3moe.expert_feed_forward_length is the experts' width).
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

// Qwen3-MoE's expert layers: decoder_sparse_step and mlp_only_layers as Qwen3MoeDecoderLayer
// reads them (layer i has experts unless listed, when (i + 1) is a multiple of the step).
void parse_hf_experts(const json& j, const JsonFields& f, const std::string& origin, ModelConfig& c) {
  c.n_experts = f.positive_or("num_experts", 128);  // Qwen3MoeConfig's defaults
  c.n_experts_used = f.positive_or("num_experts_per_tok", 8);
  check(c.n_experts_used <= c.n_experts, "{}: num_experts_per_tok = {} exceeds num_experts = {}", origin,
        c.n_experts_used, c.n_experts);
  c.expert_ffn_hidden = f.positive_or("moe_intermediate_size", 768);
  c.norm_topk_prob = f.boolean_or("norm_topk_prob", false);
  const int step = f.positive_or("decoder_sparse_step", 1);
  std::vector<bool> experts(static_cast<size_t>(c.n_layers));
  for (int i = 0; i < c.n_layers; ++i) experts[static_cast<size_t>(i)] = (i + 1) % step == 0;
  if (f.has("mlp_only_layers")) {
    const json& only = j.at("mlp_only_layers");
    check(only.is_array(), "{}: mlp_only_layers = {} is not a list of layer indices", origin, json_show(only));
    for (const json& v : only) {
      check(v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < c.n_layers,
            "{}: mlp_only_layers holds {}, not a layer index in [0, {})", origin, json_show(v), c.n_layers);
      experts[static_cast<size_t>(v.get<int64_t>())] = false;
    }
  }
  c.expert_layers = std::move(experts);
}

void parse_hf(const json& j, const std::string& hf_architecture, const std::string&, const std::string& origin,
              ModelConfig& c) {
  const bool moe = hf_architecture == "Qwen3MoeForCausalLM";
  const JsonFields f(j, origin);
  parse_llama_layout_hf(j, origin, c);
  if (!f.has("max_position_embeddings")) c.max_context = kDefaultMaxPositions;
  c.architecture = moe ? "qwen3moe" : "qwen3";
  c.qkv_bias = c.out_bias = f.boolean_or("attention_bias", false);
  c.mlp_bias = false;
  c.qk_norm = true;
  if (moe) {
    parse_hf_experts(j, f, origin, c);
    // Qwen3-MoE's attention takes the window in every layer (max_window_layers is not read) unless
    // layer_types says otherwise.
    if (f.boolean_or("use_sliding_window", false) && f.has("sliding_window")) {
      const int window = f.positive("sliding_window");
      const std::vector<bool> sliding =
          hf_sliding_layer_types(j, origin, c.n_layers).value_or(std::vector<bool>(c.n_layers, true));
      if (window < c.max_context)
        for (int i = 0; i < c.n_layers; ++i) {
          if (c.layer_windows.empty()) c.layer_windows.assign(static_cast<size_t>(c.n_layers), 0);
          if (sliding[static_cast<size_t>(i)]) c.layer_windows[static_cast<size_t>(i)] = window;
        }
    }
  } else {
    c.layer_windows = qwen_layer_windows(j, origin, c.n_layers, c.max_context);
  }
}

std::vector<HfTensorSpec> hf_specs(const ModelConfig& c, const WeightSource&) {
  std::vector<HfTensorSpec> s = hf_llama_tensor_specs(c);
  for (int i = 0; i < c.n_layers; ++i)
    if (c.is_moe_layer(i)) append_hf_expert_specs(s, c, i, {"mlp", "gate_proj", "up_proj", "down_proj"});
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
  check(a == "qwen3" || a == "qwen3moe", "{}: unsupported architecture '{}' (supported: qwen3, qwen3moe)", f.path(),
        a);
  ModelConfig c = llama_layout_config_from_gguf(f);
  c.qk_norm = true;
  // llama.cpp's qwen3moe has experts in every layer (dense layers are not in its format).
  check(a != "qwen3moe" || c.n_experts > 0, "{}: qwen3moe.expert_count is missing or 0", f.path());
  check(a != "qwen3" || c.n_experts == 0, "{}: qwen3 with experts; a Qwen3-MoE file is qwen3moe", f.path());
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
      .config_names = {"qwen3", "qwen3moe"},
      .hf_names = {{"Qwen3ForCausalLM", "qwen3"}, {"Qwen3MoeForCausalLM", "qwen3_moe"}},
      .gguf_names = {"qwen3", "qwen3moe"},
      .parse_hf_config = parse_hf,
      .hf_tensor_specs = hf_specs,
      .gguf_config = config_from_gguf,
      .gguf_tensor_specs = gguf_specs,
  };
  return kQwen3;
}

}  // namespace fdpp
