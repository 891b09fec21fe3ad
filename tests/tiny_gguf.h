// A tiny Llama GGUF whose weight matrices cycle through the stored types fdpp reads (F32, F16,
// BF16 and every supported quantization), with q/k biases, for the tests of the weight plan
// (tests/test_weight_plan.cpp) and of the GPU streaming loader (tests/gpu/test_weight_streamer.cpp).
// Block bytes are random except the scales, which are finite fp16 (random bytes would make NaN
// and infinity scales, whose payloads need not survive conversion).
#pragma once

#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "core/half.h"
#include "gguf_writer.h"
#include "io/gguf.h"
#include "test_util.h"

namespace fdpp::test {

// weight_rms > 0: the quantized blocks' scales are then rescaled so that the dequantized weights'
// root mean square is weight_rms, as the 16-bit types' (otherwise random scale bytes times random
// quants give weights of magnitude 1-40, whose activations leave fp16's range in a two-layer model).
inline std::vector<uint8_t> random_stored(gguf::GgmlType t, uint64_t n, float weight_rms = 0.f) {
  using gguf::GgmlType;
  std::normal_distribution<float> normal(0.f, 0.05f);
  std::uniform_int_distribution<int> byte(0, 255);
  const uint64_t be = gguf::block_elements(t), bb = gguf::block_bytes(t);
  std::vector<uint8_t> out(n / be * bb);
  if (t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16) {
    for (uint64_t i = 0; i < n; ++i) {
      const float x = normal(rng());
      if (t == GgmlType::F32) std::memcpy(&out[4 * i], &x, 4);
      const uint16_t h = t == GgmlType::F16 ? f32_to_fp16(x) : f32_to_bf16(x);
      if (t != GgmlType::F32) std::memcpy(&out[2 * i], &h, 2);
    }
    return out;
  }
  for (auto& b : out) b = static_cast<uint8_t>(byte(rng()));
  // Offsets of the fp16 scales in each block (ggml-common.h).
  std::vector<int> halves;
  switch (t) {
    case GgmlType::Q8_0: case GgmlType::Q4_0: case GgmlType::Q5_0: halves = {0}; break;
    case GgmlType::Q4_1: case GgmlType::Q5_1: case GgmlType::Q4_K: case GgmlType::Q5_K: halves = {0, 2}; break;
    case GgmlType::Q2_K: halves = {80, 82}; break;
    case GgmlType::Q3_K: halves = {108}; break;
    case GgmlType::Q6_K: halves = {208}; break;
    default: break;
  }
  std::uniform_real_distribution<float> scale(-0.01f, 0.01f);
  for (uint64_t b = 0; b < n / be; ++b) {
    for (int o : halves) {
      const uint16_t h = f32_to_fp16(scale(rng()));
      std::memcpy(&out[b * bb + o], &h, 2);
    }
    if (t == GgmlType::Q8_K) {
      const float d = scale(rng());
      std::memcpy(&out[b * bb], &d, 4);
    }
  }
  if (weight_rms > 0.f) {
    std::vector<float> w(n);
    gguf::dequantize(t, out.data(), w.data(), n);
    double sq = 0;
    for (float v : w) sq += double(v) * v;
    // Every weight is linear in its block's scales (d and dmin): one factor rescales them all.
    const float factor = sq > 0 ? weight_rms / float(std::sqrt(sq / double(n))) : 1.f;
    for (uint64_t b = 0; b < n / be; ++b) {
      for (int o : halves) {
        uint16_t h;
        std::memcpy(&h, &out[b * bb + o], 2);
        h = f32_to_fp16(fp16_to_f32(h) * factor);
        std::memcpy(&out[b * bb + o], &h, 2);
      }
      if (t == GgmlType::Q8_K) {
        float d;
        std::memcpy(&d, &out[b * bb], 4);
        d *= factor;
        std::memcpy(&out[b * bb], &d, 4);
      }
    }
  }
  return out;
}

// An F32 vector of n values around offset (norm weights near 1, biases near 0).
inline void add_f32_vector(gguftest::GgufWriter& w, const std::string& name, uint64_t n, float offset) {
  std::vector<float> v(n);
  std::normal_distribution<float> d(offset, 0.1f);
  for (auto& x : v) x = d(rng());
  std::vector<uint8_t> b(n * 4);
  std::memcpy(b.data(), v.data(), b.size());
  w.tensor(name, {n}, gguf::GgmlType::F32, std::move(b));
}

// The matrix types, in the order the tiny model's matrices take them.
inline std::vector<gguf::GgmlType> tiny_gguf_matrix_types() {
  using G = gguf::GgmlType;
  return {G::Q4_K, G::Q6_K, G::Q8_0, G::Q4_0, G::Q4_1, G::F16, G::BF16, G::F32, G::Q5_0,
          G::Q5_1, G::Q2_K, G::Q3_K, G::Q5_K, G::Q8_K};
}

// The root mean square of the tiny model's weights, whatever their type (random_stored).
inline constexpr float kTinyWeightRms = 0.05f;

// hidden 256 (K-quant rows), 4 heads of 64, 2 KV heads, ffn 512, 2 layers, vocab 300, untied.
inline std::vector<uint8_t> tiny_llama_gguf();

// The same, written to `path` (the tests that open it as a file).
inline void write_tiny_llama_gguf(const std::string& path) {
  const auto bytes = tiny_llama_gguf();
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

inline std::vector<uint8_t> tiny_llama_gguf() {
  using G = gguf::GgmlType;
  const uint64_t H = 256, Q = 256, KV = 128, FF = 512, V = 300;
  gguftest::GgufWriter w;
  w.kv_string("general.architecture", "llama").kv_u32("llama.block_count", 2);
  w.kv_u32("llama.embedding_length", H).kv_u32("llama.feed_forward_length", FF);
  w.kv_u32("llama.attention.head_count", 4).kv_u32("llama.attention.head_count_kv", 2);
  w.kv_u32("llama.context_length", 128).kv_u32("llama.vocab_size", V);
  w.kv_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f).kv_f32("llama.rope.freq_base", 10000.0f);
  const auto types = tiny_gguf_matrix_types();
  size_t k = 0;
  auto matrix = [&](const std::string& name, uint64_t rows, uint64_t cols) {
    const G t = types[k++ % types.size()];
    w.tensor(name, {cols, rows}, t, random_stored(t, rows * cols, kTinyWeightRms));
  };
  auto vec = [&](const std::string& name, uint64_t n, float offset) { add_f32_vector(w, name, n, offset); };
  matrix("token_embd.weight", V, H);
  for (int i = 0; i < 2; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    vec(p + "attn_norm.weight", H, 1.f);
    matrix(p + "attn_q.weight", Q, H);
    matrix(p + "attn_k.weight", KV, H);
    matrix(p + "attn_v.weight", KV, H);
    matrix(p + "attn_output.weight", H, Q);
    vec(p + "attn_q.bias", Q, 0.f);
    vec(p + "attn_k.bias", KV, 0.f);
    vec(p + "attn_v.bias", KV, 0.f);
    vec(p + "ffn_norm.weight", H, 1.f);
    matrix(p + "ffn_gate.weight", FF, H);
    matrix(p + "ffn_up.weight", FF, H);
    matrix(p + "ffn_down.weight", H, FF);
  }
  vec("output_norm.weight", H, 1.f);
  matrix("output.weight", V, H);
  return w.build();
}

// A tiny Mixtral-shaped GGUF (general.architecture llama with experts): hidden 256, 4 heads of 64,
// 2 KV heads, one layer of 4 experts of width `expert_ffn` with 2 per token, vocab 300, untied. The
// experts' stacks are stored in expert_types (gate, up, down); every other matrix is F16, so that
// on the CPU's stored path only the experts meet 8-bit activations (the router's input is then the
// same up to fp32 summation order, and no token changes experts). Ids 0..299 route to every expert.
inline std::vector<uint8_t> tiny_moe_gguf(int64_t expert_ffn, const std::vector<gguf::GgmlType>& expert_types) {
  using G = gguf::GgmlType;
  const uint64_t H = 256, Q = 256, KV = 128, E = 4, V = 300, FE = static_cast<uint64_t>(expert_ffn);
  gguftest::GgufWriter w;
  w.kv_string("general.architecture", "llama").kv_u32("llama.block_count", 1);
  w.kv_u32("llama.embedding_length", H).kv_u32("llama.feed_forward_length", FE);
  w.kv_u32("llama.attention.head_count", 4).kv_u32("llama.attention.head_count_kv", 2);
  w.kv_u32("llama.context_length", 128).kv_u32("llama.vocab_size", V);
  w.kv_u32("llama.expert_count", E).kv_u32("llama.expert_used_count", 2);
  w.kv_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f).kv_f32("llama.rope.freq_base", 10000.0f);
  auto matrix = [&](const std::string& name, std::vector<uint64_t> dims, G t) {
    uint64_t n = 1;
    for (uint64_t d : dims) n *= d;
    w.tensor(name, std::move(dims), t, random_stored(t, n));
  };
  auto vec = [&](const std::string& name, uint64_t n, float offset) { add_f32_vector(w, name, n, offset); };
  matrix("token_embd.weight", {H, V}, G::F16);
  vec("blk.0.attn_norm.weight", H, 1.f);
  matrix("blk.0.attn_q.weight", {H, Q}, G::F16);
  matrix("blk.0.attn_k.weight", {H, KV}, G::F16);
  matrix("blk.0.attn_v.weight", {H, KV}, G::F16);
  // A zero attention output: the stream stays each token's own embedding, so that the router sends
  // different tokens to different experts (mixing over positions would route them alike).
  w.tensor("blk.0.attn_output.weight", {Q, H}, G::F16, std::vector<uint8_t>(Q * H * 2, 0));
  vec("blk.0.ffn_norm.weight", H, 1.f);
  // A router of scale 1, so that tokens spread over the experts with clear margins.
  std::vector<float> router(E * H);
  for (auto& x : router) x = std::normal_distribution<float>(0.f, 1.f)(rng());
  std::vector<uint8_t> rb(router.size() * 4);
  std::memcpy(rb.data(), router.data(), rb.size());
  w.tensor("blk.0.ffn_gate_inp.weight", {H, E}, G::F32, std::move(rb));
  matrix("blk.0.ffn_gate_exps.weight", {H, FE, E}, expert_types.at(0));
  matrix("blk.0.ffn_up_exps.weight", {H, FE, E}, expert_types.at(1));
  matrix("blk.0.ffn_down_exps.weight", {FE, H, E}, expert_types.at(2));
  vec("output_norm.weight", H, 1.f);
  matrix("output.weight", {H, V}, G::F16);
  return w.build();
}

}  // namespace fdpp::test
