// The Llama family: Llama 2/3, Mistral, Mixtral, SmolLM2 and other models in the Llama layout.
// RMSNorm, rotary embeddings (rotate-half), grouped-query attention, SwiGLU MLP, optionally tied
// embeddings. Mixtral is Mistral with an expert layer for every MLP (ModelConfig::n_experts).
//
// Hugging Face (LlamaForCausalLM, MistralForCausalLM):
//   model.embed_tokens, model.layers.N.{input_layernorm, self_attn.{q,k,v,o}_proj,
//   post_attention_layernorm, mlp.{gate,up,down}_proj}, model.norm, lm_head
// q/k/v/o biases with attention_bias, gate/up/down biases with mlp_bias; no lm_head.weight with
// tie_word_embeddings (a copy that is present anyway, as torch.save writes it, is ignored). The
// rows of q_proj/k_proj are already in rotate-half order: no permutation. Mixtral
// (MixtralForCausalLM): model.layers.N.block_sparse_moe.{gate, experts.E.{w1, w3, w2}} (gate, up,
// down) in place of mlp.
//
// GGUF (general.architecture llama or mistral), llama.cpp's names: token_embd, blk.N.{attn_norm,
// attn_q, attn_k, attn_v, attn_output, ffn_norm, ffn_gate, ffn_up, ffn_down}, output_norm, output
// (absent when tied). llama.cpp's converter permutes the rows of attn_q/attn_k within each head
// for its RoPE, which rotates adjacent pairs; loading undoes it (GgufTensorSpec::permute_heads).
// Mixtral is general.architecture llama with llama.expert_count and expert_used_count, and
// blk.N.{ffn_gate_inp, ffn_gate_exps, ffn_up_exps, ffn_down_exps}: the router and the experts'
// matrices stacked in one tensor each.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>

#include "fdpp/error.h"
#include "io/gguf.h"
#include "io/json_file.h"
#include "model/arch/architecture.h"

namespace fdpp {

namespace {

using nlohmann::json;

// ---- config.json ---------------------------------------------------------------------------------

// hidden / heads when head_dim is not given; the heads must divide hidden then.
int derived_head_dim(const JsonFields& f, int hidden, int heads, const char* hidden_key, const char* heads_key) {
  if (f.has("head_dim")) return f.positive("head_dim");
  check(hidden % heads == 0, "{}: {} = {} is not a multiple of {} = {}", f.origin(), hidden_key, hidden, heads_key,
        heads);
  return hidden / heads;
}

constexpr int kMixtralDefaultMaxPositions = 4096 * 32;  // MixtralConfig's default

void parse_hf(const json& j, const std::string& hf_architecture, const std::string&, const std::string& origin,
              ModelConfig& c) {
  const bool mixtral = hf_architecture == "MixtralForCausalLM";
  const bool mistral = hf_architecture == "MistralForCausalLM" || mixtral;
  const JsonFields f(j, origin);
  parse_llama_layout_hf(j, origin, c);
  c.architecture = mixtral ? "mixtral" : mistral ? "mistral" : "llama";
  c.qkv_bias = c.out_bias = f.boolean_or("attention_bias", false);
  c.mlp_bias = !mixtral && f.boolean_or("mlp_bias", false);
  if (mixtral) {
    if (!f.has("max_position_embeddings")) c.max_context = kMixtralDefaultMaxPositions;
    // Every layer is an expert layer; the router's top-k probabilities are always renormalized.
    c.n_experts = f.positive_or("num_local_experts", 8);
    c.n_experts_used = f.positive_or("num_experts_per_tok", 2);
    check(c.n_experts_used <= c.n_experts, "{}: num_experts_per_tok = {} exceeds num_local_experts = {}", origin,
          c.n_experts_used, c.n_experts);
    c.expert_ffn_hidden = c.ffn_hidden;
    c.norm_topk_prob = true;
  }
  if (mistral && f.has("sliding_window")) {
    // Every layer attends over the window (Mistral v0.1: 4096 of 32768); one at least as long as
    // the context is full attention.
    const int window = f.positive("sliding_window");
    if (window < c.max_context) c.layer_windows.assign(static_cast<size_t>(c.n_layers), window);
  }
}

// ---- GGUF metadata -------------------------------------------------------------------------------

bool is_llama_family(const std::string& arch) { return arch == "llama" || arch == "mistral"; }

int to_int(uint64_t v, const std::string& path, const char* key) {
  check(v <= (1u << 30), "{}: metadata {} = {} is out of range", path, key, v);
  return static_cast<int>(v);
}

}  // namespace

// ---- config.json's rotary embedding ----------------------------------------------------------------

// The rotary embedding, from either shape of config.json: the classic one (rope_theta,
// rope_scaling {rope_type or type, factor, ...}) and transformers 5's (rope_parameters
// {rope_type, rope_theta, ...}). A config with both (rope_scaling added to a transformers 5 one to
// stretch the context) scales as its rope_scaling says, with rope_parameters' rope_theta: what
// transformers 5.17 makes of it.
void parse_hf_rope(const nlohmann::json& j, const std::string& origin, RopeConfig& rope) {
  const JsonFields top(j, origin);
  std::string type = "default";
  const json* params = nullptr;
  std::string prefix;
  rope.theta = top.number_or("rope_theta", 10000.0);
  if (top.has("rope_parameters")) {  // transformers 5
    params = &j.at("rope_parameters");
    check(params->is_object(), "{}: rope_parameters = {} is not an object", origin, json_show(*params));
    prefix = "rope_parameters.";
    rope.theta = JsonFields(*params, origin, prefix).number_or("rope_theta", rope.theta);
  }
  if (top.has("rope_scaling")) {
    params = &j.at("rope_scaling");
    check(params->is_object(), "{}: rope_scaling = {} is not an object", origin, json_show(*params));
    prefix = "rope_scaling.";
  }
  check(rope.theta > 0, "{}: rope_theta = {} must be positive", origin, rope.theta);
  if (params == nullptr) return;
  const JsonFields p(*params, origin, prefix);
  // "rope_type" (current) or "type" (older configs).
  type = p.string_or("rope_type", p.string_or("type", "default"));
  if (p.has("partial_rotary_factor")) {
    const double f = p.number("partial_rotary_factor");
    check(f == 1.0, "{}: {}partial_rotary_factor = {} is not supported for this architecture", origin, prefix, f);
  }
  if (type == "default") return;
  if (type == "linear") {
    rope.scaling = RopeScaling::Linear;
    rope.factor = p.number("factor");
  } else if (type == "llama3") {
    rope.scaling = RopeScaling::Llama3;
    rope.factor = p.number("factor");
    rope.low_freq_factor = p.number("low_freq_factor");
    rope.high_freq_factor = p.number("high_freq_factor");
    rope.original_max_positions = p.positive("original_max_position_embeddings");
    check(rope.high_freq_factor > rope.low_freq_factor,
          "{}: {}high_freq_factor = {} must exceed low_freq_factor = {}", origin, prefix, rope.high_freq_factor,
          rope.low_freq_factor);
    check(rope.low_freq_factor > 0, "{}: {}low_freq_factor = {} must be positive", origin, prefix,
          rope.low_freq_factor);
  } else {
    fail("{}: {}rope_type '{}' is not supported (supported: default, linear, llama3)", origin, prefix, type);
  }
  check(rope.factor >= 1, "{}: {}factor = {} must be >= 1", origin, prefix, rope.factor);
}

// ---- config.json of the Llama layout -------------------------------------------------------------

void parse_llama_layout_hf(const nlohmann::json& j, const std::string& origin, ModelConfig& c) {
  const JsonFields f(j, origin);
  c.hidden = f.positive("hidden_size");
  c.n_layers = f.positive("num_hidden_layers");
  c.n_heads = f.positive("num_attention_heads");
  c.n_kv_heads = f.positive_or("num_key_value_heads", c.n_heads);
  check(c.n_heads % c.n_kv_heads == 0, "{}: num_attention_heads = {} is not a multiple of num_key_value_heads = {}",
        origin, c.n_heads, c.n_kv_heads);
  c.head_dim = derived_head_dim(f, c.hidden, c.n_heads, "hidden_size", "num_attention_heads");
  c.ffn_hidden = f.positive("intermediate_size");
  c.vocab_size = f.positive("vocab_size");
  c.max_context = f.positive_or("max_position_embeddings", 2048);
  c.norm_eps = f.number_or("rms_norm_eps", 1e-6);
  const std::string act = f.string_or("hidden_act", "silu");
  check(act == "silu", "{}: hidden_act = '{}' is not supported (supported: silu)", origin, act);
  c.tied_embeddings = f.boolean_or("tie_word_embeddings", false);
  c.norm = NormType::RMSNorm;
  c.activation = Activation::SwiGLU;
  c.position = PositionEncoding::Rope;
  c.rope_style = RopeStyle::RotateHalf;
  parse_hf_rope(j, origin, c.rope);
  c.rope.rotary_dim = c.head_dim;
}

// ---- Hugging Face tensor names -------------------------------------------------------------------

void append_hf_attention_specs(std::vector<HfTensorSpec>& s, const ModelConfig& c, int i) {
  const int64_t h = c.hidden, q = c.q_dim(), kv = c.kv_dim();
  auto n = [i](const char* suffix) { return fmt::format("model.layers.{}.self_attn.{}", i, suffix); };
  using L = LayerWeights;
  s.push_back(hf_layer_spec(n("q_proj.weight"), {q, h}, i, &L::wq));
  s.push_back(hf_layer_spec(n("k_proj.weight"), {kv, h}, i, &L::wk));
  s.push_back(hf_layer_spec(n("v_proj.weight"), {kv, h}, i, &L::wv));
  s.push_back(hf_layer_spec(n("o_proj.weight"), {h, q}, i, &L::wo));
  if (c.qkv_bias) {
    s.push_back(hf_layer_spec(n("q_proj.bias"), {q}, i, &L::bq));
    s.push_back(hf_layer_spec(n("k_proj.bias"), {kv}, i, &L::bk));
    s.push_back(hf_layer_spec(n("v_proj.bias"), {kv}, i, &L::bv));
  }
  if (c.out_bias) s.push_back(hf_layer_spec(n("o_proj.bias"), {h}, i, &L::bo));
}

void append_hf_expert_specs(std::vector<HfTensorSpec>& s, const ModelConfig& c, int i, const HfExpertNames& names) {
  const int64_t h = c.hidden, ff = c.expert_ffn_hidden;
  using L = LayerWeights;
  const std::string layer = fmt::format("model.layers.{}.{}", i, names.block);
  s.push_back(hf_layer_spec(layer + ".gate.weight", {c.n_experts, h}, i, &L::router));
  for (int e = 0; e < c.n_experts; ++e) {
    auto n = [&](const char* matrix) { return fmt::format("{}.experts.{}.{}.weight", layer, e, matrix); };
    s.push_back(hf_expert_spec(n(names.gate), {ff, h}, i, e, c.n_experts, &L::experts_gate));
    s.push_back(hf_expert_spec(n(names.up), {ff, h}, i, e, c.n_experts, &L::experts_up));
    s.push_back(hf_expert_spec(n(names.down), {h, ff}, i, e, c.n_experts, &L::experts_down));
  }
}

std::vector<HfTensorSpec> hf_llama_tensor_specs(const ModelConfig& c) {
  const int64_t h = c.hidden, ff = c.ffn_hidden, v = c.vocab_size;
  std::vector<HfTensorSpec> s;
  s.push_back(hf_spec("model.embed_tokens.weight", {v, h}, &DecoderWeights::tok_embeddings));
  for (int i = 0; i < c.n_layers; ++i) {
    auto n = [i](const char* suffix) { return fmt::format("model.layers.{}.{}", i, suffix); };
    using L = LayerWeights;
    s.push_back(hf_layer_spec(n("input_layernorm.weight"), {h}, i, &L::attn_norm));
    append_hf_attention_specs(s, c, i);
    s.push_back(hf_layer_spec(n("post_attention_layernorm.weight"), {h}, i, &L::ffn_norm));
    if (c.is_moe_layer(i)) continue;  // the architecture's file adds its experts
    s.push_back(hf_layer_spec(n("mlp.gate_proj.weight"), {ff, h}, i, &L::w_gate));
    s.push_back(hf_layer_spec(n("mlp.up_proj.weight"), {ff, h}, i, &L::w_up));
    s.push_back(hf_layer_spec(n("mlp.down_proj.weight"), {h, ff}, i, &L::w_down));
    if (c.mlp_bias) {
      s.push_back(hf_layer_spec(n("mlp.gate_proj.bias"), {ff}, i, &L::b_gate));
      s.push_back(hf_layer_spec(n("mlp.up_proj.bias"), {ff}, i, &L::b_up));
      s.push_back(hf_layer_spec(n("mlp.down_proj.bias"), {h}, i, &L::b_down));
    }
  }
  s.push_back(hf_spec("model.norm.weight", {h}, &DecoderWeights::final_norm));
  if (!c.tied_embeddings) s.push_back(hf_spec("lm_head.weight", {v, h}, &DecoderWeights::lm_head));
  return s;
}

// ---- GGUF ----------------------------------------------------------------------------------------

ModelConfig llama_config_from_gguf(const gguf::GgufFile& f) {
  const std::string a = f.get_string("general.architecture");
  check(is_llama_family(a), "{}: unsupported architecture '{}' (supported: llama, mistral)", f.path(), a);
  return llama_layout_config_from_gguf(f);
}

ModelConfig llama_layout_config_from_gguf(const gguf::GgufFile& f) {
  const std::string& path = f.path();
  ModelConfig c;
  c.architecture = f.get_string("general.architecture");
  const std::string a = c.architecture;
  auto key = [&](const char* suffix) { return fmt::format("{}.{}", a, suffix); };
  auto get_int = [&](const std::string& k) { return to_int(f.get_uint(k), path, k.c_str()); };
  auto get_int_or = [&](const std::string& k, int fallback) { return to_int(f.get_uint(k, fallback), path, k.c_str()); };

  c.name = f.get_string("general.name", "");
  c.n_layers = get_int(key("block_count"));
  c.hidden = get_int(key("embedding_length"));
  c.ffn_hidden = get_int(key("feed_forward_length"));
  c.n_heads = get_int(key("attention.head_count"));
  c.n_kv_heads = get_int_or(key("attention.head_count_kv"), c.n_heads);
  check(c.n_heads > 0, "{}: {} must be positive", path, key("attention.head_count"));
  c.head_dim = get_int_or(key("attention.key_length"), c.hidden / c.n_heads);
  c.max_context = get_int_or(key("context_length"), 2048);
  c.norm_eps = f.get_float(key("attention.layer_norm_rms_epsilon"), 1e-5);
  c.rope.theta = f.get_float(key("rope.freq_base"), 10000.0);
  c.rope.rotary_dim = get_int_or(key("rope.dimension_count"), c.head_dim);
  const std::string scaling = f.get_string(key("rope.scaling.type"), "none");
  if (scaling == "linear") {
    c.rope.scaling = RopeScaling::Linear;
    c.rope.factor = f.get_float(key("rope.scaling.factor"));
  } else {
    check(scaling == "none", "{}: rope scaling '{}' is not supported (supported: none, linear)", path, scaling);
  }
  if (const auto* factors = f.find_tensor("rope_freqs.weight")) {
    check(factors->n_elements == static_cast<uint64_t>(c.rope.rotary_dim / 2),
          "{}: rope_freqs.weight has {} elements, expected rotary_dim / 2 = {}", path, factors->n_elements,
          c.rope.rotary_dim / 2);
    std::vector<float> v(factors->n_elements);
    f.read_f32(*factors, v);
    for (float x : v) {
      check(std::isfinite(x) && x > 0, "{}: rope_freqs.weight holds {}, expected positive factors", path, x);
      c.rope.freq_factors.push_back(x);
    }
  }
  // vocab size: the metadata key when present, else the tokenizer's vocabulary length, else the
  // embedding's shape.
  if (f.find(key("vocab_size")) != nullptr) {
    c.vocab_size = get_int(key("vocab_size"));
  } else if (f.find("tokenizer.ggml.tokens") != nullptr) {
    c.vocab_size = static_cast<int>(f.get_string_array("tokenizer.ggml.tokens").size());
  } else if (const auto* emb = f.find_tensor("token_embd.weight"); emb != nullptr && emb->dims.size() == 2) {
    c.vocab_size = to_int(emb->dims[1], path, "token_embd.weight dims[1]");
  }
  // Experts (Mixtral under llama, qwen3moe): llama.cpp stacks each layer's experts in one tensor
  // and always renormalizes the router's top-k probabilities.
  c.n_experts = get_int_or(key("expert_count"), 0);
  if (c.n_experts > 0) {
    c.n_experts_used = get_int(key("expert_used_count"));
    c.expert_ffn_hidden = get_int_or(key("expert_feed_forward_length"), c.ffn_hidden);
    c.norm_topk_prob = true;
    check(f.find_tensor("blk.0.ffn_gate_exps.weight") != nullptr || f.find_tensor("blk.0.ffn_gate.0.weight") == nullptr,
          "{}: the experts are stored one tensor each (blk.N.ffn_gate.E.weight), an old llama.cpp layout; convert "
          "the model again with a current llama.cpp",
          path);
  }
  c.tied_embeddings = f.find_tensor("output.weight") == nullptr;
  c.qkv_bias = f.find_tensor("blk.0.attn_q.bias") != nullptr;
  c.out_bias = f.find_tensor("blk.0.attn_output.bias") != nullptr;
  c.mlp_bias = f.find_tensor("blk.0.ffn_up.bias") != nullptr;
  validate(c, path);
  return c;
}

std::vector<GgufTensorSpec> llama_gguf_tensor_specs(const ModelConfig& c) {
  return llama_layout_gguf_tensor_specs(c, /*permuted_qk=*/true);
}

std::vector<GgufTensorSpec> llama_layout_gguf_tensor_specs(const ModelConfig& c, bool permuted_qk) {
  const int64_t h = c.hidden, q = c.q_dim(), kv = c.kv_dim(), ff = c.ffn_hidden, v = c.vocab_size;
  using S = WeightSlot;
  std::vector<GgufTensorSpec> s;
  s.push_back({"token_embd.weight", {v, h}, S::TokEmbeddings});
  for (int i = 0; i < c.n_layers; ++i) {
    auto add = [&](const char* suffix, std::vector<int64_t> shape, WeightSlot slot, int permute_heads = 0) {
      s.push_back({fmt::format("blk.{}.{}", i, suffix), std::move(shape), slot, i, permute_heads});
    };
    add("attn_norm.weight", {h}, S::AttnNorm);
    const int q_heads = permuted_qk ? c.n_heads : 0, k_heads = permuted_qk ? c.n_kv_heads : 0;
    add("attn_q.weight", {q, h}, S::Wq, q_heads);
    add("attn_k.weight", {kv, h}, S::Wk, k_heads);
    add("attn_v.weight", {kv, h}, S::Wv);
    add("attn_output.weight", {h, q}, S::Wo);
    if (c.qkv_bias) {
      add("attn_q.bias", {q}, S::Bq, q_heads);
      add("attn_k.bias", {kv}, S::Bk, k_heads);
      add("attn_v.bias", {kv}, S::Bv);
    }
    if (c.out_bias) add("attn_output.bias", {h}, S::Bo);
    add("ffn_norm.weight", {h}, S::FfnNorm);
    if (c.is_moe_layer(i)) {
      const int64_t e = c.n_experts, fe = c.expert_ffn_hidden;
      add("ffn_gate_inp.weight", {e, h}, S::Router);
      add("ffn_gate_exps.weight", {e, fe, h}, S::ExpertsGate);
      add("ffn_up_exps.weight", {e, fe, h}, S::ExpertsUp);
      add("ffn_down_exps.weight", {e, h, fe}, S::ExpertsDown);
      continue;
    }
    add("ffn_gate.weight", {ff, h}, S::WGate);
    add("ffn_up.weight", {ff, h}, S::WUp);
    add("ffn_down.weight", {h, ff}, S::WDown);
    if (c.mlp_bias) {
      add("ffn_gate.bias", {ff}, S::BGate);
      add("ffn_up.bias", {ff}, S::BUp);
      add("ffn_down.bias", {h}, S::BDown);
    }
  }
  s.push_back({"output_norm.weight", {h}, S::FinalNorm});
  if (!c.tied_embeddings) s.push_back({"output.weight", {v, h}, S::LmHead});
  return s;
}

DecoderWeights load_llama_gguf(const gguf::GgufFile& f, const ModelConfig& c, const ProgressFn& progress) {
  // A non-owning shared_ptr: nothing is kept, since fp32 tensors own their data.
  return load_gguf_weights(std::shared_ptr<const gguf::GgufFile>(&f, [](const gguf::GgufFile*) {}), c,
                           llama_gguf_tensor_specs(c), progress);
}

WeightPlan plan_llama_gguf(std::shared_ptr<const gguf::GgufFile> file, const ModelConfig& c) {
  return plan_gguf_weights(std::move(file), llama_gguf_tensor_specs(c));
}

namespace {

std::vector<HfTensorSpec> hf_specs(const ModelConfig& c, const WeightSource&) {
  std::vector<HfTensorSpec> s = hf_llama_tensor_specs(c);
  for (int i = 0; i < c.n_layers; ++i)
    if (c.is_moe_layer(i)) append_hf_expert_specs(s, c, i, {"block_sparse_moe", "w1", "w3", "w2"});
  return s;
}

}  // namespace

const Architecture& llama_architecture() {
  static const Architecture kLlama{
      .family = "llama",
      .config_names = {"llama", "mistral", "mixtral"},
      .hf_names = {{"LlamaForCausalLM", "llama"},
                   {"MistralForCausalLM", "mistral"},
                   {"MixtralForCausalLM", "mixtral"}},
      .gguf_names = {"llama", "mistral"},
      .parse_hf_config = parse_hf,
      .hf_tensor_specs = hf_specs,
      .gguf_config = llama_config_from_gguf,
      .gguf_tensor_specs = llama_gguf_tensor_specs,
  };
  return kLlama;
}

}  // namespace fdpp
