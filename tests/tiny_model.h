// Tiny decoder models with random weights, of each architecture's recipe, for tests that need a
// whole model but not a checkpoint (CPU engine tests and the GPU suite).
#pragma once

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "model/decoder.h"
#include "test_util.h"

namespace fdpp::test {

inline Tensor random_tensor(std::vector<int64_t> shape, float scale, float offset = 0.f) {
  Tensor t(std::move(shape));
  std::normal_distribution<float> d(offset, scale);
  for (auto& x : t.data) x = d(test::rng());
  return t;
}

// A tiny model of a config's recipe with random weights, on the host.
inline DecoderWeights random_weights(const ModelConfig& c) {
  const int64_t H = c.hidden, Q = c.q_dim(), KV = c.kv_dim(), FF = c.ffn_hidden, V = c.vocab_size;
  const bool ln = c.norm == NormType::LayerNorm;
  auto mat = [](int64_t r, int64_t k) { return random_tensor({r, k}, 1.0f / std::sqrt(float(k))); };
  auto vec = [](bool present, int64_t n, float scale = 0.05f, float offset = 0.f) {
    return present ? random_tensor({n}, scale, offset) : Tensor();
  };
  const int64_t E = c.embedding_dim();
  DecoderWeights w;
  w.tok_embeddings = random_tensor({V, E}, 1.0f);
  if (E != H) {  // OPT-350m's projections
    w.project_in = mat(H, E);
    w.project_out = mat(E, H);
  }
  if (c.position == PositionEncoding::Learned)
    w.pos_embeddings = random_tensor({c.max_context + c.learned_position_offset, H}, 0.3f);
  for (int i = 0; i < c.n_layers; ++i) {
    LayerWeights L;
    L.attn_norm = vec(true, H, 0.1f, 1.0f);
    L.attn_norm_bias = vec(ln && c.norm_bias, H);
    L.wq = mat(Q, H);
    L.wk = mat(KV, H);
    L.wv = mat(KV, H);
    L.bq = vec(c.qkv_bias, Q);
    L.bk = vec(c.qkv_bias, KV);
    L.bv = vec(c.qkv_bias, KV);
    L.wo = mat(H, Q);
    L.bo = vec(c.out_bias, H);
    L.ffn_norm = vec(true, H, 0.1f, 1.0f);
    L.ffn_norm_bias = vec(ln && c.norm_bias, H);
    if (c.activation == Activation::SwiGLU || c.activation == Activation::GeGLU) L.w_gate = mat(FF, H);
    L.w_up = mat(FF, H);
    L.w_down = mat(H, FF);
    if (c.qk_norm) {
      L.q_norm = vec(true, c.head_dim, 0.1f, 1.0f);
      L.k_norm = vec(true, c.head_dim, 0.1f, 1.0f);
    }
    if (c.sandwich_norm) {
      L.attn_post_norm = vec(true, H, 0.1f, 1.0f);
      L.ffn_post_norm = vec(true, H, 0.1f, 1.0f);
    }
    if (c.mlp_bias) {
      if (c.activation == Activation::SwiGLU) L.b_gate = vec(true, FF);
      L.b_up = vec(true, FF);
      L.b_down = vec(true, H);
    }
    w.layers.push_back(std::move(L));
  }
  w.final_norm = vec(c.final_norm, H, 0.1f, 1.0f);
  w.final_norm_bias = vec(c.final_norm && ln && c.norm_bias, H);
  if (!c.tied_embeddings) w.lm_head = mat(V, E);
  return w;
}

inline ModelConfig tiny(const std::string& recipe, int head_dim) {
  ModelConfig c;
  c.architecture = recipe;
  c.n_layers = 3;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = head_dim;
  c.hidden = 4 * head_dim;
  c.ffn_hidden = 3 * c.hidden + 8;  // not a multiple of 64
  c.vocab_size = 1003;
  c.max_context = 512;
  c.rope.theta = 10000;
  c.rope.rotary_dim = head_dim;
  if (recipe == "opt" || recipe == "opt-postln") {  // LayerNorm with bias, learned positions, ReLU, biases everywhere
    c.n_kv_heads = 4;
    c.norm = NormType::LayerNorm;
    c.norm_bias = true;
    c.position = PositionEncoding::Learned;
    c.learned_position_offset = 2;
    c.activation = Activation::ReLU;
    c.qkv_bias = c.out_bias = c.mlp_bias = true;
    c.tied_embeddings = true;
    if (recipe == "opt-postln") {  // OPT-350m: the norm after each block, no final norm, project_in/out
      c.pre_norm = false;
      c.final_norm = false;
      c.embed_dim = c.hidden / 2;
    }
  } else if (recipe == "chatglm") {  // interleaved RoPE on half of each head, qkv bias, MQA-ish
    c.n_kv_heads = 1;
    c.rope.rotary_dim = head_dim / 2;
    c.rope_style = RopeStyle::Interleaved;
    c.qkv_bias = true;
  } else if (recipe == "gemma2" || recipe == "gemma3") {
    // Gemma's features at strengths that matter in a tiny model: windows shorter than the tests'
    // prompts, soft-caps near the logits' size (Gemma 2), local layers with their own rope (Gemma 3).
    c.activation = Activation::GeGLU;
    c.sandwich_norm = true;
    c.embed_scale = std::sqrt(static_cast<double>(c.hidden));
    c.attn_scale = 1.0 / std::sqrt(2.0 * head_dim);
    c.tied_embeddings = true;
    c.layer_windows.assign(static_cast<size_t>(c.n_layers), 0);
    if (recipe == "gemma2") {
      c.attn_softcap = 2.0;
      c.final_softcap = 3.0;
      for (int i = 0; i < c.n_layers; i += 2) c.layer_windows[static_cast<size_t>(i)] = 9;
    } else {
      c.qk_norm = true;
      c.rope.theta = 1e6;
      c.has_local_rope = true;
      c.local_rope.theta = 10000;
      c.local_rope.rotary_dim = head_dim;
      for (int i = 0; i + 1 < c.n_layers; ++i) c.layer_windows[static_cast<size_t>(i)] = 7;
    }
  } else if (recipe == "mistral-window") {  // every layer slides: the engine gives back blocks behind the window
    c.layer_windows.assign(static_cast<size_t>(c.n_layers), 9);
  } else if (recipe == "phi3-longrope") {
    // Phi-3 / Phi-4-mini: LongRoPE past its original length (the long factors and the attention
    // factor on the rotated dims), a partial rotary embedding (3/4 of each head), a sliding window.
    c.rope.rotary_dim = head_dim * 3 / 4;
    c.rope.scaling = RopeScaling::LongRope;
    c.rope.original_max_positions = 16;
    for (int i = 0; i < c.rope.rotary_dim / 2; ++i) {
      c.rope.short_factor.push_back(1.0 + 0.05 * i);
      c.rope.long_factor.push_back(1.5 + 0.25 * i);
    }
    c.rope.attention_factor = 1.19;
    c.layer_windows.assign(static_cast<size_t>(c.n_layers), 20);
  } else {
    c.tied_embeddings = recipe == "llama-tied";
  }
  validate(c, recipe);
  return c;
}

inline std::vector<int32_t> random_ids(int n, int vocab) {
  std::uniform_int_distribution<int32_t> d(0, vocab - 1);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = d(test::rng());
  return v;
}

}  // namespace fdpp::test
