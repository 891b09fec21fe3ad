// OPT checkpoints (OPTForCausalLM) in Hugging Face's layout. The decoder's names carry a prefix
// that depends on how the checkpoint was saved: "model.decoder." (OPTForCausalLM), "decoder."
// (OPTModel, as facebook/opt-* ship), or "model." / none in converted copies; the first prefix
// under which embed_tokens.weight exists is used.
//   embed_tokens [vocab, word_embed_proj_dim], embed_positions [max_positions + 2, hidden]
//   (learned, offset 2), project_in / project_out (no bias) when word_embed_proj_dim != hidden,
//   layers.N.{self_attn_layer_norm, self_attn.{q,k,v,out}_proj, final_layer_norm, fc1, fc2}, all
//   with biases (enable_bias), LayerNorms with bias; final_layer_norm after the last layer only
//   with do_layer_norm_before and not _remove_final_layer_norm; lm_head tied to embed_tokens
//   unless tie_word_embeddings is false.
// Pre-LN (do_layer_norm_before) and post-LN (OPT-350m) differ only in where the runner applies
// self_attn_layer_norm / final_layer_norm (ModelConfig::pre_norm).
#include <fmt/format.h>

#include "fdpp/error.h"
#include "model/hf_models.h"

namespace fdpp {

namespace {

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

}  // namespace fdpp
