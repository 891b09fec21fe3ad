// Llama / Mistral checkpoints in Hugging Face's layout (LlamaForCausalLM, MistralForCausalLM):
//   model.embed_tokens, model.layers.N.{input_layernorm, self_attn.{q,k,v,o}_proj,
//   post_attention_layernorm, mlp.{gate,up,down}_proj}, model.norm, lm_head
// q/k/v/o biases with attention_bias, gate/up/down biases with mlp_bias; no lm_head.weight with
// tie_word_embeddings (a copy that is present anyway, as torch.save writes it, is ignored). The
// rows of q_proj/k_proj are already in rotate-half order: no permutation (unlike GGUF).
#include <fmt/format.h>

#include "model/hf_models.h"

namespace fdpp {

std::vector<HfTensorSpec> hf_llama_tensor_specs(const ModelConfig& c) {
  const int64_t h = c.hidden, q = c.q_dim(), kv = c.kv_dim(), ff = c.ffn_hidden, v = c.vocab_size;
  std::vector<HfTensorSpec> s;
  s.push_back(hf_spec("model.embed_tokens.weight", {v, h}, &DecoderWeights::tok_embeddings));
  for (int i = 0; i < c.n_layers; ++i) {
    auto n = [i](const char* suffix) { return fmt::format("model.layers.{}.{}", i, suffix); };
    using L = LayerWeights;
    s.push_back(hf_layer_spec(n("input_layernorm.weight"), {h}, i, &L::attn_norm));
    s.push_back(hf_layer_spec(n("self_attn.q_proj.weight"), {q, h}, i, &L::wq));
    s.push_back(hf_layer_spec(n("self_attn.k_proj.weight"), {kv, h}, i, &L::wk));
    s.push_back(hf_layer_spec(n("self_attn.v_proj.weight"), {kv, h}, i, &L::wv));
    s.push_back(hf_layer_spec(n("self_attn.o_proj.weight"), {h, q}, i, &L::wo));
    if (c.qkv_bias) {
      s.push_back(hf_layer_spec(n("self_attn.q_proj.bias"), {q}, i, &L::bq));
      s.push_back(hf_layer_spec(n("self_attn.k_proj.bias"), {kv}, i, &L::bk));
      s.push_back(hf_layer_spec(n("self_attn.v_proj.bias"), {kv}, i, &L::bv));
    }
    if (c.out_bias) s.push_back(hf_layer_spec(n("self_attn.o_proj.bias"), {h}, i, &L::bo));
    s.push_back(hf_layer_spec(n("post_attention_layernorm.weight"), {h}, i, &L::ffn_norm));
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

}  // namespace fdpp
