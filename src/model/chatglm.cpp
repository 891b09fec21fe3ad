// ChatGLM2 checkpoints in THUDM's layout (chatglm2-6b, modeling_chatglm.py, "ChatGLMModel"):
//   transformer.embedding.word_embeddings            [padded_vocab, hidden]
//   transformer.encoder.layers.N.input_layernorm     RMSNorm
//     .self_attention.query_key_value (weight, bias) [q_dim + 2 kv_dim, hidden]: q (heads x
//                                                    kv_channels) then k then v (groups x
//                                                    kv_channels each)
//     .self_attention.dense                          [hidden, q_dim], no bias
//     .post_attention_layernorm                      RMSNorm
//     .mlp.dense_h_to_4h                             [2 ffn, hidden]: gate rows then up rows
//                                                    (swiglu: silu(first half) * second half)
//     .mlp.dense_4h_to_h                             [hidden, ffn]
//   transformer.encoder.final_layernorm, transformer.output_layer [padded_vocab, hidden]
// Rotary embedding on the first kv_channels / 2 dims of each head, adjacent pairs (interleaved),
// theta 10000; ModelConfig carries that (hf_config.cpp).
#include <fmt/format.h>

#include "model/hf_models.h"

namespace fdpp {

std::vector<HfTensorSpec> chatglm_tensor_specs(const ModelConfig& c) {
  const int64_t h = c.hidden, q = c.q_dim(), kv = c.kv_dim(), ff = c.ffn_hidden, v = c.vocab_size;
  using D = DecoderWeights;
  using L = LayerWeights;
  std::vector<HfTensorSpec> s;
  s.push_back(hf_spec("transformer.embedding.word_embeddings.weight", {v, h}, &D::tok_embeddings));
  for (int i = 0; i < c.n_layers; ++i) {
    auto n = [i](const char* suffix) { return fmt::format("transformer.encoder.layers.{}.{}", i, suffix); };
    s.push_back(hf_layer_spec(n("input_layernorm.weight"), {h}, i, &L::attn_norm));
    s.push_back({n("self_attention.query_key_value.weight"), {q + 2 * kv, h}, [i, q, kv](D& w, Tensor&& t) {
                   auto parts = split_rows(t, {q, kv, kv});
                   w.layers.at(i).wq = std::move(parts[0]);
                   w.layers.at(i).wk = std::move(parts[1]);
                   w.layers.at(i).wv = std::move(parts[2]);
                 },
                 {{WeightSlot::Wq, i, 0, {q, h}}, {WeightSlot::Wk, i, q, {kv, h}}, {WeightSlot::Wv, i, q + kv, {kv, h}}}});
    if (c.qkv_bias) {
      s.push_back({n("self_attention.query_key_value.bias"), {q + 2 * kv}, [i, q, kv](D& w, Tensor&& t) {
                     auto parts = split_rows(t, {q, kv, kv});
                     w.layers.at(i).bq = std::move(parts[0]);
                     w.layers.at(i).bk = std::move(parts[1]);
                     w.layers.at(i).bv = std::move(parts[2]);
                   },
                   {{WeightSlot::Bq, i, 0, {q}}, {WeightSlot::Bk, i, q, {kv}}, {WeightSlot::Bv, i, q + kv, {kv}}}});
    }
    s.push_back(hf_layer_spec(n("self_attention.dense.weight"), {h, q}, i, &L::wo));
    s.push_back(hf_layer_spec(n("post_attention_layernorm.weight"), {h}, i, &L::ffn_norm));
    s.push_back({n("mlp.dense_h_to_4h.weight"), {2 * ff, h}, [i, ff](D& w, Tensor&& t) {
                   auto parts = split_rows(t, {ff, ff});
                   w.layers.at(i).w_gate = std::move(parts[0]);
                   w.layers.at(i).w_up = std::move(parts[1]);
                 },
                 {{WeightSlot::WGate, i, 0, {ff, h}}, {WeightSlot::WUp, i, ff, {ff, h}}}});
    s.push_back(hf_layer_spec(n("mlp.dense_4h_to_h.weight"), {h, ff}, i, &L::w_down));
  }
  if (c.final_norm) s.push_back(hf_spec("transformer.encoder.final_layernorm.weight", {h}, &D::final_norm));
  s.push_back(hf_spec("transformer.output_layer.weight", {v, h}, &D::lm_head));
  return s;
}

}  // namespace fdpp
