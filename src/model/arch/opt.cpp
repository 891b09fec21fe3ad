// OPT (OPTForCausalLM, model_type opt) in Hugging Face's layout: LayerNorm, learned positions,
// ReLU MLP, biases everywhere; no GGUF (llama.cpp does not convert OPT).
//
// config.json: hidden_size, num_hidden_layers, num_attention_heads, ffn_dim, vocab_size,
// max_position_embeddings, word_embed_proj_dim, do_layer_norm_before, _remove_final_layer_norm,
// enable_bias, tie_word_embeddings; activation_function must be relu.
//
// Tensors: the decoder's names carry a prefix that depends on how the checkpoint was saved:
// "model.decoder." (OPTForCausalLM), "decoder." (OPTModel, as facebook/opt-* ship), or "model." /
// none in converted copies; the first prefix under which embed_tokens.weight exists is used.
//   embed_tokens [vocab, word_embed_proj_dim], embed_positions [max_positions + 2, hidden]
//   (learned, offset 2), project_in / project_out (no bias) when word_embed_proj_dim != hidden,
//   layers.N.{self_attn_layer_norm, self_attn.{q,k,v,out}_proj, final_layer_norm, fc1, fc2}, all
//   with biases (enable_bias), LayerNorms with bias; final_layer_norm after the last layer only
//   with do_layer_norm_before and not _remove_final_layer_norm; lm_head tied to embed_tokens
//   unless tie_word_embeddings is false.
// Pre-LN (do_layer_norm_before) and post-LN (OPT-350m) differ only in where the runner applies
// self_attn_layer_norm / final_layer_norm (ModelConfig::pre_norm).
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "fdpp/error.h"
#include "io/json_file.h"
#include "model/arch/architecture.h"

namespace fdpp {

namespace {

void parse_hf(const nlohmann::json& j, const std::string&, const std::string&, const std::string& origin,
              ModelConfig& c) {
  const JsonFields f(j, origin);
  c.architecture = "opt";
  c.hidden = f.positive("hidden_size");
  c.n_layers = f.positive("num_hidden_layers");
  c.n_heads = f.positive("num_attention_heads");
  c.n_kv_heads = c.n_heads;
  check(c.hidden % c.n_heads == 0, "{}: hidden_size = {} is not a multiple of num_attention_heads = {}", origin,
        c.hidden, c.n_heads);
  c.head_dim = c.hidden / c.n_heads;
  c.ffn_hidden = f.positive("ffn_dim");
  c.vocab_size = f.positive("vocab_size");
  c.max_context = f.positive("max_position_embeddings");
  const std::string act = f.string_or("activation_function", "relu");
  check(act == "relu", "{}: activation_function = '{}' is not supported (supported: relu)", origin, act);
  check(f.boolean_or("layer_norm_elementwise_affine", true),
        "{}: layer_norm_elementwise_affine = false is not supported (LayerNorms without weight and bias)", origin);
  const int proj = f.positive_or("word_embed_proj_dim", c.hidden);
  c.embed_dim = proj == c.hidden ? 0 : proj;
  c.pre_norm = f.boolean_or("do_layer_norm_before", true);
  c.final_norm = c.pre_norm && !f.boolean_or("_remove_final_layer_norm", false);
  c.tied_embeddings = f.boolean_or("tie_word_embeddings", true);
  c.qkv_bias = c.out_bias = c.mlp_bias = f.boolean_or("enable_bias", true);
  c.norm = NormType::LayerNorm;
  c.norm_bias = true;
  c.norm_eps = 1e-5;  // torch.nn.LayerNorm's default; OPT's config has no field for it
  c.activation = Activation::ReLU;
  c.position = PositionEncoding::Learned;
  c.learned_position_offset = 2;  // OPTLearnedPositionalEmbedding.offset
}

std::string opt_prefix(const WeightSource& source) {
  static const char* kPrefixes[] = {"model.decoder.", "decoder.", "model.", ""};
  for (const char* p : kPrefixes)
    if (source.find(std::string(p) + "embed_tokens.weight") != nullptr) return p;
  fail("{}: tensor 'model.decoder.embed_tokens.weight' is missing (also looked for decoder.embed_tokens.weight, "
       "model.embed_tokens.weight, embed_tokens.weight)",
       source.origin());
}

}  // namespace

std::vector<HfTensorSpec> opt_tensor_specs(const ModelConfig& c, const WeightSource& source) {
  const std::string p = opt_prefix(source);
  const int64_t h = c.hidden, e = c.embedding_dim(), ff = c.ffn_hidden, v = c.vocab_size;
  const int64_t positions = static_cast<int64_t>(c.max_context) + c.learned_position_offset;
  using D = DecoderWeights;
  using L = LayerWeights;
  std::vector<HfTensorSpec> s;
  s.push_back(hf_spec(p + "embed_tokens.weight", {v, e}, &D::tok_embeddings));
  s.push_back(hf_spec(p + "embed_positions.weight", {positions, h}, &D::pos_embeddings));
  if (c.embed_dim != 0) {
    s.push_back(hf_spec(p + "project_in.weight", {h, e}, &D::project_in));
    s.push_back(hf_spec(p + "project_out.weight", {e, h}, &D::project_out));
  }
  for (int i = 0; i < c.n_layers; ++i) {
    auto n = [&](const char* suffix) { return fmt::format("{}layers.{}.{}", p, i, suffix); };
    s.push_back(hf_layer_spec(n("self_attn_layer_norm.weight"), {h}, i, &L::attn_norm));
    s.push_back(hf_layer_spec(n("self_attn_layer_norm.bias"), {h}, i, &L::attn_norm_bias));
    s.push_back(hf_layer_spec(n("self_attn.q_proj.weight"), {h, h}, i, &L::wq));
    s.push_back(hf_layer_spec(n("self_attn.k_proj.weight"), {h, h}, i, &L::wk));
    s.push_back(hf_layer_spec(n("self_attn.v_proj.weight"), {h, h}, i, &L::wv));
    s.push_back(hf_layer_spec(n("self_attn.out_proj.weight"), {h, h}, i, &L::wo));
    if (c.qkv_bias) {
      s.push_back(hf_layer_spec(n("self_attn.q_proj.bias"), {h}, i, &L::bq));
      s.push_back(hf_layer_spec(n("self_attn.k_proj.bias"), {h}, i, &L::bk));
      s.push_back(hf_layer_spec(n("self_attn.v_proj.bias"), {h}, i, &L::bv));
    }
    if (c.out_bias) s.push_back(hf_layer_spec(n("self_attn.out_proj.bias"), {h}, i, &L::bo));
    s.push_back(hf_layer_spec(n("final_layer_norm.weight"), {h}, i, &L::ffn_norm));
    s.push_back(hf_layer_spec(n("final_layer_norm.bias"), {h}, i, &L::ffn_norm_bias));
    s.push_back(hf_layer_spec(n("fc1.weight"), {ff, h}, i, &L::w_up));
    s.push_back(hf_layer_spec(n("fc2.weight"), {h, ff}, i, &L::w_down));
    if (c.mlp_bias) {
      s.push_back(hf_layer_spec(n("fc1.bias"), {ff}, i, &L::b_up));
      s.push_back(hf_layer_spec(n("fc2.bias"), {h}, i, &L::b_down));
    }
  }
  if (c.final_norm) {
    s.push_back(hf_spec(p + "final_layer_norm.weight", {h}, &D::final_norm));
    s.push_back(hf_spec(p + "final_layer_norm.bias", {h}, &D::final_norm_bias));
  }
  if (!c.tied_embeddings) s.push_back(hf_spec("lm_head.weight", {v, e}, &D::lm_head));
  return s;
}

const Architecture& opt_architecture() {
  static const Architecture kOpt{
      .family = "opt",
      .config_names = {"opt"},
      .hf_names = {{"OPTForCausalLM", "opt"}},
      .gguf_names = {},
      .parse_hf_config = parse_hf,
      .hf_tensor_specs = opt_tensor_specs,
      .gguf_config = nullptr,
      .gguf_tensor_specs = nullptr,
  };
  return kOpt;
}

}  // namespace fdpp
