#include "backend/cpu/cpu_runner.h"

#include <cmath>
#include <cstring>

#include "backend/cpu/ops.h"
#include "backend/cpu/quant_matmul.h"
#include "fdpp/error.h"

namespace fdpp {

namespace {
const float* bias_or_null(const Tensor& b) { return b.empty() ? nullptr : b.ptr(); }
}  // namespace

CpuRunner::CpuRunner(const ModelConfig& config, const DecoderWeights& weights, int max_context)
    : config_(config), weights_(weights), max_context_(max_context) {
  check(max_context > 0, "context size {} must be positive", max_context);
  check(max_context <= config.max_context, "context size {} exceeds the model's context length {}", max_context,
        config.max_context);
  if (config.position == PositionEncoding::Rope) inv_freq_ = cpu::rope_inv_freq(config.rope);
  k_cache_.reserve(config.n_layers);
  v_cache_.reserve(config.n_layers);
  for (int i = 0; i < config.n_layers; ++i) {
    k_cache_.emplace_back(std::vector<int64_t>{max_context, config.kv_dim()});
    v_cache_.emplace_back(std::vector<int64_t>{max_context, config.kv_dim()});
  }
}

void CpuRunner::norm(const float* x, const Tensor& weight, const Tensor& bias, int64_t rows, float* out) const {
  if (config_.norm == NormType::RMSNorm) {
    cpu::rms_norm(x, weight.ptr(), rows, config_.hidden, config_.norm_eps, out);
  } else {
    cpu::layer_norm(x, weight.ptr(), bias_or_null(bias), rows, config_.hidden, config_.norm_eps, out);
  }
}

void CpuRunner::forward(std::span<const int32_t> tokens, int start_pos, bool all_positions, std::span<float> logits) {
  const ModelConfig& c = config_;
  const int64_t T = static_cast<int64_t>(tokens.size());
  check(T > 0, "forward: no tokens");
  check(start_pos >= 0 && start_pos + T <= max_context_, "context overflow: {} + {} tokens exceed the context size {}",
        start_pos, T, max_context_);
  const int64_t out_rows = all_positions ? T : 1;
  check(static_cast<int64_t>(logits.size()) == out_rows * c.vocab_size, "forward: logits buffer has {} floats, need {}",
        logits.size(), out_rows * c.vocab_size);
  const int64_t H = c.hidden, E = c.embedding_dim(), Q = c.q_dim(), KV = c.kv_dim(), FF = c.ffn_hidden;
  const bool swiglu = c.activation == Activation::SwiGLU;

  std::vector<float> x(T * H), h(T * std::max(H, E)), q(T * Q), attn(T * Q), o(T * H), up(T * FF),
      gate(swiglu ? T * FF : 0), e(T * E);
  for (int64_t t = 0; t < T; ++t) {
    const int32_t id = tokens[t];
    check(id >= 0 && id < c.vocab_size, "token id {} is out of range [0, {})", id, c.vocab_size);
    cpu::embedding_row(weights_.tok_embeddings, id, &e[t * E]);
  }
  if (!weights_.project_in.empty()) {
    cpu::linear(e.data(), T, E, weights_.project_in.ptr(), H, nullptr, x.data());
  } else {
    x = e;
  }
  std::vector<int32_t> positions(T);
  for (int64_t t = 0; t < T; ++t) positions[t] = start_pos + static_cast<int32_t>(t);
  if (c.position == PositionEncoding::Learned) {
    for (int64_t t = 0; t < T; ++t)
      cpu::add_inplace(&x[t * H], weights_.pos_embeddings.ptr() + (positions[t] + c.learned_position_offset) * H, H);
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));

  for (int layer = 0; layer < c.n_layers; ++layer) {
    const LayerWeights& L = weights_.layers[layer];
    float* k_rows = k_cache_[layer].ptr() + static_cast<int64_t>(start_pos) * KV;
    float* v_rows = v_cache_[layer].ptr() + static_cast<int64_t>(start_pos) * KV;

    // Attention block. Pre-norm: x += attn(norm(x)). Post-norm: x = norm(x + attn(x)).
    const float* attn_in = x.data();
    if (c.pre_norm) {
      norm(x.data(), L.attn_norm, L.attn_norm_bias, T, h.data());
      attn_in = h.data();
    }
    cpu::linear(attn_in, T, L.wq, bias_or_null(L.bq), q.data());
    cpu::linear(attn_in, T, L.wk, bias_or_null(L.bk), k_rows);
    cpu::linear(attn_in, T, L.wv, bias_or_null(L.bv), v_rows);
    if (c.position == PositionEncoding::Rope) {
      cpu::rope(q.data(), T, c.n_heads, c.head_dim, c.rope_style, inv_freq_, positions);
      cpu::rope(k_rows, T, c.n_kv_heads, c.head_dim, c.rope_style, inv_freq_, positions);
    }
    if (observer_)
      observer_(AttentionObservation{layer, q.data(), k_cache_[layer].ptr(), v_cache_[layer].ptr(), T, start_pos,
                                     c.n_heads, c.n_kv_heads, c.head_dim, scale});
    cpu::attention(q.data(), k_cache_[layer].ptr(), v_cache_[layer].ptr(), T, start_pos, c.n_heads, c.n_kv_heads,
                   c.head_dim, scale, attn.data());
    cpu::linear(attn.data(), T, L.wo, bias_or_null(L.bo), o.data());
    cpu::add_inplace(x.data(), o.data(), T * H);
    if (!c.pre_norm) norm(x.data(), L.attn_norm, L.attn_norm_bias, T, x.data());

    // MLP block, same norm placement.
    const float* mlp_in = x.data();
    if (c.pre_norm) {
      norm(x.data(), L.ffn_norm, L.ffn_norm_bias, T, h.data());
      mlp_in = h.data();
    }
    cpu::linear(mlp_in, T, L.w_up, bias_or_null(L.b_up), up.data());
    if (swiglu) {
      cpu::linear(mlp_in, T, L.w_gate, bias_or_null(L.b_gate), gate.data());
      cpu::silu_mul(gate.data(), up.data(), T * FF, up.data());
    } else {
      cpu::relu(up.data(), T * FF);
    }
    cpu::linear(up.data(), T, L.w_down, bias_or_null(L.b_down), o.data());
    cpu::add_inplace(x.data(), o.data(), T * H);
    if (!c.pre_norm) norm(x.data(), L.ffn_norm, L.ffn_norm_bias, T, x.data());
  }

  // Only the rows whose logits are wanted go through the final norm and the lm head.
  const float* last = x.data() + (T - out_rows) * H;
  const float* head_in = last;
  if (c.final_norm) {
    norm(last, weights_.final_norm, weights_.final_norm_bias, out_rows, h.data());
    head_in = h.data();
  }
  if (!weights_.project_out.empty()) {
    cpu::linear(head_in, out_rows, H, weights_.project_out.ptr(), E, nullptr, e.data());
    head_in = e.data();
  }
  cpu::linear(head_in, out_rows, weights_.output_matrix(), nullptr, logits.data());
}

}  // namespace fdpp
