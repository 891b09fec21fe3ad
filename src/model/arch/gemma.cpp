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
//
// GGUF (general.architecture gemma2 / gemma3), as llama.cpp's converter writes and its loader
// reads them:
//   - the Llama layout's names and keys, q/k rows in Hugging Face's order (llama.cpp runs Gemma with
//     NeoX-style RoPE), plus blk.N.post_attention_norm, blk.N.ffn_norm (the pre-feedforward norm),
//     blk.N.post_ffw_norm and, Gemma 3, blk.N.attn_{q,k}_norm; no output.weight when tied (Gemma 2's
//     converter never writes one);
//   - every norm weight already holds 1 + w (the converter adds the 1), so it is loaded as stored;
//   - query_pre_attn_scalar is not stored: llama.cpp scales q.k by head_dim^-1/2, except in the
//     27B sizes (Gemma 2's 46 layers, Gemma 3's 62), where it uses hidden / heads: what those
//     configs' query_pre_attn_scalar is;
//   - attention.sliding_window (absent or 0: no local layer). Gemma 2: every even layer is local,
//     attn_logit_softcapping and final_logit_softcapping (llama.cpp's defaults, 50 and 30, when
//     absent). Gemma 3: attention.sliding_window_pattern, a period p (layer i local unless
//     i % p == p - 1; default 6) or one flag per layer; rope.freq_base_swa for the local layers
//     (default 10000, unscaled) while rope.freq_base and rope.scaling.{type,factor} are the global
//     layers'; an optional final_logit_softcapping.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <variant>

#include "fdpp/error.h"
#include "io/gguf.h"
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

// ---- GGUF ----------------------------------------------------------------------------------------

// llama.cpp's sizes whose attention scale is hidden / heads rather than head_dim (the 27B models).
constexpr int kGemma2LayersOf27B = 46;
constexpr int kGemma3LayersOf27B = 62;
constexpr int kGemma3DefaultPeriod = 6;  // five local layers, then a global one
constexpr double kGemma3DefaultLocalBase = 10000.0;

// Gemma 3's attention.sliding_window_pattern: absent, a period, or a flag per layer -> whether
// each layer is local.
std::vector<bool> gemma3_local_layers(const gguf::GgufFile& f, int n_layers) {
  const std::string key = "gemma3.attention.sliding_window_pattern";
  std::vector<bool> out(static_cast<size_t>(n_layers));
  const gguf::Value* v = f.find(key);
  if (v != nullptr && v->type == gguf::ValueType::ARRAY) {
    std::vector<bool> flags;
    if (const auto* b = std::get_if<std::vector<bool>>(&v->data)) {
      flags = *b;
    } else {
      check(v->element_type != gguf::ValueType::STRING && v->element_type != gguf::ValueType::ARRAY &&
                v->element_type != gguf::ValueType::F32 && v->element_type != gguf::ValueType::F64,
            "{}: metadata {} must be a period or one BOOL per layer", f.path(), key);
      for (int64_t x : f.get_int_array(key)) flags.push_back(x != 0);
    }
    check(flags.size() == out.size(), "{}: metadata {} has {} entries for block_count = {} layers", f.path(), key,
          flags.size(), n_layers);
    return flags;
  }
  const uint64_t period = f.get_uint(key, kGemma3DefaultPeriod);
  // llama.cpp's rule (set_swa_pattern): period 0 makes every layer local, 1 none.
  for (int i = 0; i < n_layers; ++i)
    out[static_cast<size_t>(i)] = period == 0 || static_cast<uint64_t>(i) % period < period - 1;
  return out;
}

ModelConfig config_from_gguf(const gguf::GgufFile& f) {
  const std::string a = f.get_string("general.architecture");
  check(a == "gemma2" || a == "gemma3", "{}: unsupported architecture '{}' (supported: gemma2, gemma3)", f.path(), a);
  const bool gemma3 = a == "gemma3";
  ModelConfig c = llama_layout_config_from_gguf(f);
  auto key = [&](const char* suffix) { return fmt::format("{}.{}", a, suffix); };
  c.activation = Activation::GeGLU;
  c.sandwich_norm = true;
  c.embed_scale = std::sqrt(static_cast<double>(c.hidden));
  const bool is_27b = c.n_layers == (gemma3 ? kGemma3LayersOf27B : kGemma2LayersOf27B);
  c.attn_scale = 1.0 / std::sqrt(is_27b ? static_cast<double>(c.hidden) / c.n_heads : c.head_dim);
  if (gemma3) {
    c.final_softcap = f.get_float(key("final_logit_softcapping"), 0.0);
  } else {
    c.attn_softcap = f.get_float(key("attn_logit_softcapping"), 50.0);
    c.final_softcap = f.get_float(key("final_logit_softcapping"), 30.0);
  }
  check(c.attn_softcap >= 0 && c.final_softcap >= 0, "{}: soft-capping values must be positive (or 0: none)", f.path());
  c.qk_norm = gemma3;
  if (gemma3) {
    c.has_local_rope = true;
    c.local_rope.theta = f.get_float(key("rope.freq_base_swa"), kGemma3DefaultLocalBase);
    c.local_rope.rotary_dim = c.rope.rotary_dim;
    check(c.local_rope.theta > 0, "{}: {} = {} must be positive", f.path(), key("rope.freq_base_swa"),
          c.local_rope.theta);
  }
  const uint64_t window = f.get_uint(key("attention.sliding_window"), 0);
  check(window <= (1u << 30), "{}: metadata {} = {} is out of range", f.path(), key("attention.sliding_window"),
        window);
  if (window > 0) {
    std::vector<bool> local(static_cast<size_t>(c.n_layers));
    if (gemma3)
      local = gemma3_local_layers(f, c.n_layers);
    else
      for (int i = 0; i < c.n_layers; ++i) local[static_cast<size_t>(i)] = i % 2 == 0;
    c.layer_windows.assign(static_cast<size_t>(c.n_layers), 0);
    for (int i = 0; i < c.n_layers; ++i)
      if (local[static_cast<size_t>(i)]) c.layer_windows[static_cast<size_t>(i)] = static_cast<int>(window);
  }
  c.architecture = a;
  validate(c, f.path());
  return c;
}

std::vector<GgufTensorSpec> gguf_specs(const ModelConfig& c) {
  std::vector<GgufTensorSpec> s = llama_layout_gguf_tensor_specs(c, /*permuted_qk=*/false);
  const int64_t h = c.hidden, hd = c.head_dim;
  for (int i = 0; i < c.n_layers; ++i) {
    auto add = [&](const char* suffix, int64_t n, WeightSlot slot) {
      s.push_back({fmt::format("blk.{}.{}", i, suffix), {n}, slot, i});
    };
    add("post_attention_norm.weight", h, WeightSlot::AttnPostNorm);
    add("post_ffw_norm.weight", h, WeightSlot::FfnPostNorm);
    if (c.qk_norm) {
      add("attn_q_norm.weight", hd, WeightSlot::QNorm);
      add("attn_k_norm.weight", hd, WeightSlot::KNorm);
    }
  }
  return s;
}

}  // namespace

const Architecture& gemma_architecture() {
  static const Architecture kGemma{
      .family = "gemma",
      .config_names = {"gemma2", "gemma3"},
      .hf_names = {{"Gemma2ForCausalLM", "gemma2"}, {"Gemma3ForCausalLM", "gemma3_text"}},
      .gguf_names = {"gemma2", "gemma3"},
      .parse_hf_config = parse_hf,
      .hf_tensor_specs = hf_specs,
      .gguf_config = config_from_gguf,
      .gguf_tensor_specs = gguf_specs,
  };
  return kGemma;
}

}  // namespace fdpp
