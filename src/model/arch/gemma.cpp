// Gemma 2 and Gemma 3 (text): the Llama layout's tensors with
//   - RMSNorm scaling by (1 + w): every norm weight (input, post-attention, pre- and post-
//     feedforward, final, q/k) is stored as w and folded into 1 + w when the CPU loads it;
//   - sandwich norms: post_attention_layernorm and post_feedforward_layernorm norm each block's
//     output before the residual add (ModelConfig::sandwich_norm);
//   - GeGLU MLP with PyTorch's tanh GELU; embeddings scaled by sqrt(hidden_size);
//   - attention scaled by query_pre_attn_scalar^-1/2 instead of head_dim^-1/2;
//   - Gemma 2: attention-logit and final-logit soft-capping (cap * tanh(x / cap));
//   - Gemma 3: RMSNorm over each head of q and k (q_norm, k_norm), and local layers with their own
//     rope base (rope_local_base_freq, unscaled) beside the global layers' (rope_theta and any
//     rope_scaling);
//   - local (sliding-window) and global layers by layer_types; without it Gemma 2 alternates
//     (even layers local) and Gemma 3 makes every sliding_window_pattern-th layer global.
// Windows are kept even when as long as the context: they also say which layers are local.
//
// Hugging Face: Gemma2ForCausalLM (model_type gemma2), Gemma3ForCausalLM (gemma3_text; the
// text-only checkpoints; Gemma3ForConditionalGeneration's multimodal ones are not read).
// No GGUF support yet.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <cmath>

#include "fdpp/error.h"
#include "io/json_file.h"
#include "model/arch/architecture.h"

namespace fdpp {

namespace {

using nlohmann::json;

bool is_gemma3(const std::string& hf_architecture, const std::string& model_type) {
  return hf_architecture == "Gemma3ForCausalLM" || model_type == "gemma3_text";
}

// Whether layer i is local (sliding window).
std::vector<bool> local_layers(const json& j, const JsonFields& f, int n_layers, bool gemma3) {
  std::vector<bool> out(static_cast<size_t>(n_layers));
  if (auto types = hf_sliding_layer_types(j, f.origin(), n_layers)) return *types;
  const int pattern = gemma3 ? f.positive_or("sliding_window_pattern", 6) : 2;
  for (int i = 0; i < n_layers; ++i) out[static_cast<size_t>(i)] = (i + 1) % pattern != 0;
  return out;
}

void parse_hf(const json& j, const std::string& hf_architecture, const std::string& model_type,
              const std::string& origin, ModelConfig& c) {
  const JsonFields f(j, origin);
  const bool gemma3 = is_gemma3(hf_architecture, model_type);
  c.architecture = gemma3 ? "gemma3" : "gemma2";
  c.hidden = f.positive("hidden_size");
  c.n_layers = f.positive("num_hidden_layers");
  c.n_heads = f.positive("num_attention_heads");
  c.n_kv_heads = f.positive_or("num_key_value_heads", c.n_heads);
  check(c.n_heads % c.n_kv_heads == 0, "{}: num_attention_heads = {} is not a multiple of num_key_value_heads = {}",
        origin, c.n_heads, c.n_kv_heads);
  c.head_dim = f.positive_or("head_dim", 256);
  c.ffn_hidden = f.positive("intermediate_size");
  c.vocab_size = f.positive("vocab_size");
  c.max_context = f.positive_or("max_position_embeddings", gemma3 ? 131072 : 8192);
  c.norm_eps = f.number_or("rms_norm_eps", 1e-6);
  // transformers reads hidden_activation (hidden_act is the older key both configs still carry).
  const std::string act = f.string_or("hidden_activation", f.string_or("hidden_act", "gelu_pytorch_tanh"));
  check(act == "gelu_pytorch_tanh", "{}: hidden_activation = '{}' is not supported (supported: gelu_pytorch_tanh)",
        origin, act);
  c.tied_embeddings = f.boolean_or("tie_word_embeddings", true);
  c.norm = NormType::RMSNorm;
  c.activation = Activation::GeGLU;
  c.position = PositionEncoding::Rope;
  c.rope_style = RopeStyle::RotateHalf;
  c.qkv_bias = c.out_bias = f.boolean_or("attention_bias", false);
  c.sandwich_norm = true;
  c.embed_scale = std::sqrt(static_cast<double>(c.hidden));
  c.attn_scale = 1.0 / std::sqrt(f.number_or("query_pre_attn_scalar", 256));
  c.attn_softcap = f.number_or("attn_logit_softcapping", 0.0);
  c.final_softcap = f.number_or("final_logit_softcapping", 0.0);
  check(c.attn_softcap >= 0 && c.final_softcap >= 0, "{}: soft-capping values must be positive (or null)", origin);
  c.qk_norm = gemma3;

  if (gemma3 && f.has("rope_parameters") && j.at("rope_parameters").contains("full_attention")) {
    // transformers 5: one rope per layer type.
    const json& rp = j.at("rope_parameters");
    parse_hf_rope(json{{"rope_parameters", rp.at("full_attention")}}, origin, c.rope);
    check(rp.contains("sliding_attention"), "{}: rope_parameters has no sliding_attention entry", origin);
    parse_hf_rope(json{{"rope_parameters", rp.at("sliding_attention")}}, origin, c.local_rope);
  } else {
    parse_hf_rope(j, origin, c.rope);
    c.local_rope.theta = f.number_or("rope_local_base_freq", 10000.0);
  }
  c.rope.rotary_dim = c.local_rope.rotary_dim = c.head_dim;
  c.has_local_rope = gemma3;

  const int window = f.positive_or("sliding_window", 4096);
  const std::vector<bool> local = local_layers(j, f, c.n_layers, gemma3);
  c.layer_windows.assign(static_cast<size_t>(c.n_layers), 0);
  for (int i = 0; i < c.n_layers; ++i)
    if (local[static_cast<size_t>(i)]) c.layer_windows[static_cast<size_t>(i)] = window;
}

// A norm weight w stored for Gemma's (1 + w) scaling, loaded as 1 + w: by the fp32 load, and by
// the GPU plan (HfSlotPart::add, applied once the weights are on the device).
HfTensorSpec plus_one(HfTensorSpec s) {
  for (HfSlotPart& part : s.parts) part.add = 1.f;
  s.assign = [inner = std::move(s.assign)](DecoderWeights& w, Tensor&& t) {
    float* p = t.ptr();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] += 1.0f;
    inner(w, std::move(t));
  };
  return s;
}

std::vector<HfTensorSpec> hf_specs(const ModelConfig& c, const WeightSource&) {
  const int64_t h = c.hidden, ff = c.ffn_hidden, v = c.vocab_size, hd = c.head_dim;
  std::vector<HfTensorSpec> s;
  s.push_back(hf_spec("model.embed_tokens.weight", {v, h}, &DecoderWeights::tok_embeddings));
  using L = LayerWeights;
  for (int i = 0; i < c.n_layers; ++i) {
    auto n = [i](const char* suffix) { return fmt::format("model.layers.{}.{}", i, suffix); };
    s.push_back(plus_one(hf_layer_spec(n("input_layernorm.weight"), {h}, i, &L::attn_norm)));
    append_hf_attention_specs(s, c, i);
    if (c.qk_norm) {
      s.push_back(plus_one(hf_layer_spec(n("self_attn.q_norm.weight"), {hd}, i, &L::q_norm)));
      s.push_back(plus_one(hf_layer_spec(n("self_attn.k_norm.weight"), {hd}, i, &L::k_norm)));
    }
    s.push_back(plus_one(hf_layer_spec(n("post_attention_layernorm.weight"), {h}, i, &L::attn_post_norm)));
    s.push_back(plus_one(hf_layer_spec(n("pre_feedforward_layernorm.weight"), {h}, i, &L::ffn_norm)));
    s.push_back(plus_one(hf_layer_spec(n("post_feedforward_layernorm.weight"), {h}, i, &L::ffn_post_norm)));
    s.push_back(hf_layer_spec(n("mlp.gate_proj.weight"), {ff, h}, i, &L::w_gate));
    s.push_back(hf_layer_spec(n("mlp.up_proj.weight"), {ff, h}, i, &L::w_up));
    s.push_back(hf_layer_spec(n("mlp.down_proj.weight"), {h, ff}, i, &L::w_down));
  }
  s.push_back(plus_one(hf_spec("model.norm.weight", {h}, &DecoderWeights::final_norm)));
  if (!c.tied_embeddings) s.push_back(hf_spec("lm_head.weight", {v, h}, &DecoderWeights::lm_head));
  return s;
}

}  // namespace

const Architecture& gemma_architecture() {
  static const Architecture kGemma{
      .family = "gemma",
      .config_names = {"gemma2", "gemma3"},
      .hf_names = {{"Gemma2ForCausalLM", "gemma2"}, {"Gemma3ForCausalLM", "gemma3_text"}},
      .gguf_names = {},
      .parse_hf_config = parse_hf,
      .hf_tensor_specs = hf_specs,
      .gguf_config = nullptr,
      .gguf_tensor_specs = nullptr,
  };
  return kGemma;
}

}  // namespace fdpp
