// ChatGLM2 in THUDM's layout (chatglm2-6b, modeling_chatglm.py; architectures ChatGLMModel or
// ChatGLMForConditionalGeneration, model_type chatglm); no GGUF. config.json: the fields
// modeling_chatglm.py reads, and a rejection for every setting whose code path fdpp does not
// implement (first-generation ChatGLM-6B, multi-query off, LayerNorm, post-norm residuals, biases
// on dense layers, rope_ratio != 1, P-tuning prefixes, quantized checkpoints).
//
// Tensors:
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
// theta 10000; ModelConfig carries that (parse_hf below).
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "fdpp/error.h"
#include "io/json_file.h"
#include "model/arch/architecture.h"

namespace fdpp {

namespace {

void parse_hf(const nlohmann::json& j, const std::string& hf_architecture, const std::string& model_type,
              const std::string& origin, ModelConfig& c) {
  check(model_type.empty() || model_type == "chatglm", "{}: architecture {} with model_type '{}' is not supported",
        origin, hf_architecture, model_type);
  const JsonFields f(j, origin);
  c.architecture = "chatglm";
  check(!f.has("position_encoding_2d") && !f.has("inner_hidden_size"),
        "{}: this is a ChatGLM-6B (first generation) config; only the ChatGLM2 layout is supported", origin);
  auto require = [&](const char* key, bool fallback, bool wanted, const char* why) {
    const bool v = f.boolean_or(key, fallback);
    check(v == wanted, "{}: {} = {} is not supported ({})", origin, key, v, why);
  };
  require("multi_query_attention", false, true, "fdpp implements ChatGLM2's grouped-query layout only");
  require("rmsnorm", true, true, "LayerNorm variant not implemented");
  require("apply_residual_connection_post_layernorm", false, false, "residual after the norm not implemented");
  require("post_layer_norm", true, true, "a final norm is expected");
  require("original_rope", true, true, "only the original rotary embedding is implemented");
  require("add_bias_linear", false, false, "biases on dense / MLP layers not implemented");
  if (f.has("rope_ratio")) {
    const double r = f.number("rope_ratio");
    check(r == 1.0, "{}: rope_ratio = {} is not supported (only 1)", origin, r);
  }
  check(!f.has("pre_seq_len"), "{}: pre_seq_len is set (P-tuning prefix), which is not supported", origin);
  if (f.has("quantization_bit")) {
    const int64_t q = f.integer("quantization_bit");
    check(q == 0, "{}: quantization_bit = {} is not supported (only unquantized checkpoints)", origin, q);
  }
  c.n_layers = f.positive("num_layers");
  c.hidden = f.positive("hidden_size");
  c.n_heads = f.positive("num_attention_heads");
  c.n_kv_heads = f.positive("multi_query_group_num");
  check(c.n_heads % c.n_kv_heads == 0, "{}: num_attention_heads = {} is not a multiple of multi_query_group_num = {}",
        origin, c.n_heads, c.n_kv_heads);
  if (f.has("kv_channels")) {
    c.head_dim = f.positive("kv_channels");
  } else {
    check(c.hidden % c.n_heads == 0, "{}: hidden_size = {} is not a multiple of num_attention_heads = {}", origin,
          c.hidden, c.n_heads);
    c.head_dim = c.hidden / c.n_heads;
  }
  check(c.head_dim % 4 == 0, "{}: kv_channels = {} must be a multiple of 4 (half of each head rotates, in pairs)",
        origin, c.head_dim);
  c.ffn_hidden = f.positive("ffn_hidden_size");
  c.vocab_size = f.positive("padded_vocab_size");
  c.max_context = f.positive("seq_length");
  c.norm_eps = f.number_or("layernorm_epsilon", 1e-5);
  c.qkv_bias = f.boolean_or("add_qkv_bias", false);
  c.tied_embeddings = false;  // transformer.output_layer is always its own matrix
  c.norm = NormType::RMSNorm;
  c.activation = Activation::SwiGLU;
  c.position = PositionEncoding::Rope;
  c.rope_style = RopeStyle::Interleaved;
  c.rope.theta = 10000.0;
  c.rope.rotary_dim = c.head_dim / 2;  // RotaryEmbedding(kv_channels // 2): the first half of each head
}

}  // namespace

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

const Architecture& chatglm_architecture() {
  static const Architecture kChatGlm{
      .family = "chatglm",
      .config_names = {"chatglm"},
      .hf_names = {{"ChatGLMModel", "chatglm"}, {"ChatGLMForConditionalGeneration", nullptr}},
      .gguf_names = {},
      .parse_hf_config = parse_hf,
      .hf_tensor_specs = [](const ModelConfig& c, const WeightSource&) { return chatglm_tensor_specs(c); },
      .gguf_config = nullptr,
      .gguf_tensor_specs = nullptr,
  };
  return kChatGlm;
}

}  // namespace fdpp
