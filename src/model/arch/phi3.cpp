// Phi-3 and Phi-4 (Phi3ForCausalLM, model_type phi3): the Llama layout with q, k and v fused into
// one qkv_proj and gate and up into one gate_up_proj (gate rows first), split by rows at load; an
// optional partial rotary embedding (partial_rotary_factor: the first rotary_dim dimensions of each
// head rotate, rotate-half within them); Mistral's sliding_window when set (Phi-3-mini-4k: 2047);
// LongRoPE for the 128K variants (rope_scaling type longrope, short_factor and long_factor).
//
// LongRoPE: each frequency is divided by short_factor[i] or long_factor[i], and the rotated
// dimensions are scaled by attention_factor (given, else sqrt(1 + ln(max_position_embeddings /
// original_max_position_embeddings) / ln(original_max_position_embeddings))). Which factor set
// applies is decided once per engine, by its context (llama.cpp's rule, RopeConfig::for_context):
// the long one when the context exceeds original_max_position_embeddings. transformers chooses by
// each forward's sequence length instead, so with a long context a prompt shorter than the
// original length rotates differently than there.
//
// GGUF (general.architecture phi3), as llama.cpp's converter writes it: the Llama layout's keys
// and names except that q, k and v stay fused in blk.N.attn_qkv and gate and up in blk.N.ffn_up
// (gate rows first), split by rows at load (GgufTensorSpec::fused_shape; a stored view is a row
// range of the file's tensor); rows in Hugging Face's order (NeoX-style RoPE, nothing permuted);
// rope.dimension_count is the partial rotary dimension. LongRoPE: the tensors rope_factors_long
// and rope_factors_short (rotary_dim / 2 each), rope.scaling.attn_factor and
// rope.scaling.original_context_length; no rope.scaling.type is written. attention.sliding_window
// (0: none) applies to every layer, as transformers applies it (llama.cpp reads it but runs Phi-3
// without a window for now).
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <cmath>

#include "fdpp/error.h"
#include "io/gguf.h"
#include "io/json_file.h"
#include "model/arch/architecture.h"

namespace fdpp {

namespace {

using nlohmann::json;

std::vector<double> factors(const json& p, const char* key, int n, const std::string& origin) {
  check(p.contains(key) && p.at(key).is_array() && p.at(key).size() == static_cast<size_t>(n),
        "{}: rope_scaling.{} must be a list of rotary_dim / 2 = {} numbers", origin, key, n);
  std::vector<double> out;
  for (const json& x : p.at(key)) {
    check(x.is_number() && x.get<double>() > 0 && std::isfinite(x.get<double>()),
          "{}: rope_scaling.{} holds {}, expected positive numbers", origin, key, json_show(x));
    out.push_back(x.get<double>());
  }
  return out;
}

void parse_hf(const json& j, const std::string&, const std::string&, const std::string& origin, ModelConfig& c) {
  const JsonFields f(j, origin);
  // parse_llama_layout_hf refuses rope_scaling types it does not know: longrope is read here.
  json base = j;
  base.erase("rope_scaling");
  base.erase("partial_rotary_factor");
  parse_llama_layout_hf(base, origin, c);
  c.architecture = "phi3";
  c.qkv_bias = c.out_bias = c.mlp_bias = false;
  const double partial = f.number_or("partial_rotary_factor", 1.0);
  check(partial > 0 && partial <= 1, "{}: partial_rotary_factor = {} must be in (0, 1]", origin, partial);
  c.rope.rotary_dim = static_cast<int>(c.head_dim * partial);
  c.rope.rotary_dim -= c.rope.rotary_dim % 2;
  if (f.has("rope_scaling")) {
    const json& p = j.at("rope_scaling");
    check(p.is_object(), "{}: rope_scaling = {} is not an object", origin, json_show(p));
    const JsonFields rp(p, origin, "rope_scaling.");
    const std::string type = rp.string_or("rope_type", rp.string_or("type", "default"));
    if (type == "longrope") {
      const int half = c.rope.rotary_dim / 2;
      c.rope.scaling = RopeScaling::LongRope;
      c.rope.short_factor = factors(p, "short_factor", half, origin);
      c.rope.long_factor = factors(p, "long_factor", half, origin);
      c.rope.original_max_positions = f.positive_or("original_max_position_embeddings", c.max_context);
      const double factor = static_cast<double>(c.max_context) / c.rope.original_max_positions;
      c.rope.attention_factor =
          rp.has("attention_factor") ? rp.number("attention_factor")
          : factor <= 1.0           ? 1.0
                                    : std::sqrt(1 + std::log(factor) / std::log(c.rope.original_max_positions));
      check(c.rope.attention_factor > 0, "{}: rope_scaling.attention_factor must be positive", origin);
    } else {
      parse_hf_rope(j, origin, c.rope);  // default, linear, llama3 (or its one-line refusal)
    }
  }
  if (f.has("sliding_window")) {
    const int window = f.positive("sliding_window");
    if (window < c.max_context) c.layer_windows.assign(static_cast<size_t>(c.n_layers), window);
  }
}

std::vector<HfTensorSpec> hf_specs(const ModelConfig& c, const WeightSource&) {
  const int64_t h = c.hidden, q = c.q_dim(), kv = c.kv_dim(), ff = c.ffn_hidden, v = c.vocab_size;
  using D = DecoderWeights;
  using L = LayerWeights;
  std::vector<HfTensorSpec> s;
  s.push_back(hf_spec("model.embed_tokens.weight", {v, h}, &D::tok_embeddings));
  for (int i = 0; i < c.n_layers; ++i) {
    auto n = [i](const char* suffix) { return fmt::format("model.layers.{}.{}", i, suffix); };
    s.push_back(hf_layer_spec(n("input_layernorm.weight"), {h}, i, &L::attn_norm));
    s.push_back({n("self_attn.qkv_proj.weight"), {q + 2 * kv, h}, [i, q, kv](D& w, Tensor&& t) {
                   auto parts = split_rows(t, {q, kv, kv});
                   w.layers.at(i).wq = std::move(parts[0]);
                   w.layers.at(i).wk = std::move(parts[1]);
                   w.layers.at(i).wv = std::move(parts[2]);
                 },
                 {{WeightSlot::Wq, i, 0, {q, h}}, {WeightSlot::Wk, i, q, {kv, h}}, {WeightSlot::Wv, i, q + kv, {kv, h}}}});
    s.push_back(hf_layer_spec(n("self_attn.o_proj.weight"), {h, q}, i, &L::wo));
    s.push_back(hf_layer_spec(n("post_attention_layernorm.weight"), {h}, i, &L::ffn_norm));
    s.push_back({n("mlp.gate_up_proj.weight"), {2 * ff, h}, [i, ff](D& w, Tensor&& t) {
                   auto parts = split_rows(t, {ff, ff});
                   w.layers.at(i).w_gate = std::move(parts[0]);
                   w.layers.at(i).w_up = std::move(parts[1]);
                 },
                 {{WeightSlot::WGate, i, 0, {ff, h}}, {WeightSlot::WUp, i, ff, {ff, h}}}});
    s.push_back(hf_layer_spec(n("mlp.down_proj.weight"), {h, ff}, i, &L::w_down));
  }
  s.push_back(hf_spec("model.norm.weight", {h}, &D::final_norm));
  if (!c.tied_embeddings) s.push_back(hf_spec("lm_head.weight", {v, h}, &D::lm_head));
  return s;
}

// ---- GGUF ----------------------------------------------------------------------------------------

// A LongRoPE factor tensor: rotary_dim / 2 positive numbers.
std::vector<double> gguf_factors(const gguf::GgufFile& f, const gguf::TensorInfo& t, int half) {
  check(t.n_elements == static_cast<uint64_t>(half), "{}: tensor '{}' has {} elements, expected rotary_dim / 2 = {}",
        f.path(), t.name, t.n_elements, half);
  std::vector<float> v(t.n_elements);
  f.read_f32(t, v);
  std::vector<double> out;
  for (float x : v) {
    check(std::isfinite(x) && x > 0, "{}: tensor '{}' holds {}, expected positive factors", f.path(), t.name, x);
    out.push_back(x);
  }
  return out;
}

ModelConfig config_from_gguf(const gguf::GgufFile& f) {
  const std::string a = f.get_string("general.architecture");
  check(a == "phi3", "{}: unsupported architecture '{}' (supported: phi3)", f.path(), a);
  ModelConfig c = llama_layout_config_from_gguf(f);
  // Phi-3 has no biases; a file with some would otherwise run without them.
  for (const char* t : {"blk.0.attn_qkv.bias", "blk.0.attn_output.bias", "blk.0.ffn_up.bias", "blk.0.ffn_down.bias"})
    check(f.find_tensor(t) == nullptr, "{}: tensor '{}': Phi-3 biases are not supported", f.path(), t);
  const gguf::TensorInfo* long_factors = f.find_tensor("rope_factors_long.weight");
  const gguf::TensorInfo* short_factors = f.find_tensor("rope_factors_short.weight");
  check((long_factors == nullptr) == (short_factors == nullptr),
        "{}: LongRoPE needs both rope_factors_long.weight and rope_factors_short.weight (one is missing)", f.path());
  if (long_factors != nullptr) {
    check(c.rope.scaling == RopeScaling::None && c.rope.freq_factors.empty(),
          "{}: rope_factors_long.weight cannot be combined with another rope scaling", f.path());
    const int half = c.rope.rotary_dim / 2;
    c.rope.scaling = RopeScaling::LongRope;
    c.rope.long_factor = gguf_factors(f, *long_factors, half);
    c.rope.short_factor = gguf_factors(f, *short_factors, half);
    const uint64_t original = f.get_uint("phi3.rope.scaling.original_context_length", c.max_context);
    check(original > 0 && original <= (1u << 30),
          "{}: metadata phi3.rope.scaling.original_context_length = {} is out of range", f.path(), original);
    c.rope.original_max_positions = static_cast<int>(original);
    c.rope.attention_factor = f.get_float("phi3.rope.scaling.attn_factor", 1.0);
    check(c.rope.attention_factor > 0 && std::isfinite(c.rope.attention_factor),
          "{}: metadata phi3.rope.scaling.attn_factor = {} must be positive", f.path(), c.rope.attention_factor);
  }
  const uint64_t window = f.get_uint("phi3.attention.sliding_window", 0);
  if (window > 0 && window < static_cast<uint64_t>(c.max_context))
    c.layer_windows.assign(static_cast<size_t>(c.n_layers), static_cast<int>(window));
  c.architecture = "phi3";
  validate(c, f.path());
  return c;
}

std::vector<GgufTensorSpec> gguf_specs(const ModelConfig& c) {
  const int64_t h = c.hidden, q = c.q_dim(), kv = c.kv_dim(), ff = c.ffn_hidden, v = c.vocab_size;
  using S = WeightSlot;
  std::vector<GgufTensorSpec> s;
  s.push_back({"token_embd.weight", {v, h}, S::TokEmbeddings});
  for (int i = 0; i < c.n_layers; ++i) {
    auto name = [i](const char* suffix) { return fmt::format("blk.{}.{}", i, suffix); };
    s.push_back({name("attn_norm.weight"), {h}, S::AttnNorm, i});
    for (GgufTensorSpec& p : fused_gguf_rows(name("attn_qkv.weight"), h, i, {{S::Wq, q}, {S::Wk, kv}, {S::Wv, kv}}))
      s.push_back(std::move(p));
    s.push_back({name("attn_output.weight"), {h, q}, S::Wo, i});
    s.push_back({name("ffn_norm.weight"), {h}, S::FfnNorm, i});
    for (GgufTensorSpec& p : fused_gguf_rows(name("ffn_up.weight"), h, i, {{S::WGate, ff}, {S::WUp, ff}}))
      s.push_back(std::move(p));
    s.push_back({name("ffn_down.weight"), {h, ff}, S::WDown, i});
  }
  s.push_back({"output_norm.weight", {h}, S::FinalNorm});
  if (!c.tied_embeddings) s.push_back({"output.weight", {v, h}, S::LmHead});
  return s;
}

}  // namespace

const Architecture& phi3_architecture() {
  static const Architecture kPhi3{
      .family = "phi3",
      .config_names = {"phi3"},
      .hf_names = {{"Phi3ForCausalLM", "phi3"}},
      .gguf_names = {"phi3"},
      .parse_hf_config = parse_hf,
      .hf_tensor_specs = hf_specs,
      .gguf_config = config_from_gguf,
      .gguf_tensor_specs = gguf_specs,
  };
  return kPhi3;
}

}  // namespace fdpp
