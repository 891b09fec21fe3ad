#include "backend/cpu/cpu_engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/ops.h"
#include "backend/cpu/quant_matmul.h"
#include "engine/sampler.h"
#include "fdpp/error.h"

namespace fdpp {

namespace {
const float* bias_or_null(const Tensor& b) { return b.empty() ? nullptr : b.ptr(); }

// The default CPU cache: room for every row of a step at full context, but no more than this many
// bytes of fp32 K and V (a 135M model at 8K context and 64 rows would otherwise ask for 24 GiB).
constexpr double kDefaultCpuCacheBytes = 4.0 * 1073741824.0;
}  // namespace

CpuEngine::CpuEngine(const ModelConfig& config, const DecoderWeights& weights, EngineLimits limits)
    : config_(config), weights_(weights) {
  if (limits.max_context == 0) limits.max_context = config.max_context;
  check(limits.max_context > 0, "context size {} must be positive", limits.max_context);
  check(limits.max_context <= config.max_context, "context size {} exceeds the model's context length {}",
        limits.max_context, config.max_context);
  if (limits.kv_cache_tokens == 0) {
    const double per_token = 2.0 * config.n_layers * config.kv_dim() * sizeof(float);
    const double cap = std::max(1.0, std::floor(kDefaultCpuCacheBytes / per_token));
    limits.kv_cache_tokens = static_cast<int64_t>(
        std::min(cap, static_cast<double>(limits.max_step_rows) * static_cast<double>(limits.max_context)));
    limits.kv_cache_tokens = std::max<int64_t>(limits.kv_cache_tokens, limits.max_context);
  }
  init_engine(limits);
  if (config.position == PositionEncoding::Rope) inv_freq_ = cpu::rope_inv_freq(config.rope);
}

void CpuEngine::norm(const float* x, const Tensor& weight, const Tensor& bias, int64_t rows, float* out) const {
  if (config_.norm == NormType::RMSNorm) {
    cpu::rms_norm(x, weight.ptr(), rows, config_.hidden, config_.norm_eps, out);
  } else {
    cpu::layer_norm(x, weight.ptr(), bias_or_null(bias), rows, config_.hidden, config_.norm_eps, out);
  }
}

void CpuEngine::on_sequence_resized(int seq, int length) {
  if (length == 0 && seq < static_cast<int>(caches_.size())) caches_[seq] = SequenceCache{};
}

void CpuEngine::ensure_cache(int seq, int64_t length) {
  if (seq >= static_cast<int>(caches_.size())) caches_.resize(seq + 1);
  SequenceCache& c = caches_[seq];
  if (length <= c.capacity) return;
  // Geometric growth: a sequence decoding token by token copies its cache O(log n) times.
  const int64_t capacity = std::min<int64_t>(max_context(), std::max<int64_t>(length, std::max<int64_t>(64, 2 * c.capacity)));
  const int64_t kv = config_.kv_dim();
  c.k.resize(config_.n_layers);
  c.v.resize(config_.n_layers);
  for (int l = 0; l < config_.n_layers; ++l) {
    c.k[l].resize(static_cast<size_t>(capacity * kv));
    c.v[l].resize(static_cast<size_t>(capacity * kv));
  }
  c.capacity = capacity;
}

void CpuEngine::run_step(std::span<const RowPlan> rows, int64_t total_tokens, StepOutput& out) {
  const ModelConfig& c = config_;
  const int64_t T = total_tokens;
  const int64_t H = c.hidden, E = c.embedding_dim(), Q = c.q_dim(), KV = c.kv_dim(), FF = c.ffn_hidden;
  const bool swiglu = c.activation == Activation::SwiGLU;

  std::vector<int32_t> positions(T);
  for (const RowPlan& r : rows) {
    ensure_cache(r.row->seq, r.start + static_cast<int64_t>(r.row->tokens.size()));
    for (size_t t = 0; t < r.row->tokens.size(); ++t) positions[r.token_offset + t] = r.start + static_cast<int32_t>(t);
  }

  std::vector<float> x(T * H), h(T * std::max(H, E)), q(T * Q), k(T * KV), v(T * KV), attn(T * Q), o(T * H),
      up(T * FF), gate(swiglu ? T * FF : 0), e(T * E);
  for (const RowPlan& r : rows)
    for (size_t t = 0; t < r.row->tokens.size(); ++t)
      cpu::embedding_row(weights_.tok_embeddings, r.row->tokens[t], &e[(r.token_offset + t) * E]);
  if (!weights_.project_in.empty()) {
    cpu::linear(e.data(), T, E, weights_.project_in.ptr(), H, nullptr, x.data());
  } else {
    x = e;
  }
  if (c.position == PositionEncoding::Learned) {
    for (int64_t t = 0; t < T; ++t)
      cpu::add_inplace(&x[t * H], weights_.pos_embeddings.ptr() + (positions[t] + c.learned_position_offset) * H, H);
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));

  for (int layer = 0; layer < c.n_layers; ++layer) {
    const LayerWeights& L = weights_.layers[layer];

    // Attention block. Pre-norm: x += attn(norm(x)). Post-norm: x = norm(x + attn(x)).
    const float* attn_in = x.data();
    if (c.pre_norm) {
      norm(x.data(), L.attn_norm, L.attn_norm_bias, T, h.data());
      attn_in = h.data();
    }
    cpu::linear(attn_in, T, L.wq, bias_or_null(L.bq), q.data());
    cpu::linear(attn_in, T, L.wk, bias_or_null(L.bk), k.data());
    cpu::linear(attn_in, T, L.wv, bias_or_null(L.bv), v.data());
    if (c.position == PositionEncoding::Rope) {
      cpu::rope(q.data(), T, c.n_heads, c.head_dim, c.rope_style, inv_freq_, positions);
      cpu::rope(k.data(), T, c.n_kv_heads, c.head_dim, c.rope_style, inv_freq_, positions);
    }
    for (const RowPlan& r : rows) {
      const int64_t n = static_cast<int64_t>(r.row->tokens.size());
      SequenceCache& cache = caches_[r.row->seq];
      float* kc = cache.k[layer].data();
      float* vc = cache.v[layer].data();
      std::memcpy(kc + r.start * KV, &k[r.token_offset * KV], n * KV * sizeof(float));
      std::memcpy(vc + r.start * KV, &v[r.token_offset * KV], n * KV * sizeof(float));
      const float* qr = &q[r.token_offset * Q];
      if (observer_)
        observer_(AttentionObservation{layer, qr, kc, vc, n, r.start, c.n_heads, c.n_kv_heads, c.head_dim, scale});
      cpu::attention(qr, kc, vc, n, r.start, c.n_heads, c.n_kv_heads, c.head_dim, scale, &attn[r.token_offset * Q]);
    }
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

  // Only the rows whose logits are wanted (or sampled from) go through the final norm and the head:
  // the last token of each such row, every token of an all_logits row.
  std::vector<int64_t> head_tokens;
  for (const RowPlan& r : rows) {
    const int64_t n = static_cast<int64_t>(r.row->tokens.size());
    if (r.row->all_logits) {
      for (int64_t t = 0; t < n; ++t) head_tokens.push_back(r.token_offset + t);
    } else if (r.row->logits || r.row->sample) {
      head_tokens.push_back(r.token_offset + n - 1);
    }
  }
  if (head_tokens.empty()) return;
  const int64_t R = static_cast<int64_t>(head_tokens.size());
  std::vector<float> head_x(R * H), head_h(R * std::max(H, E)), head_e(R * E), logits(R * c.vocab_size);
  for (int64_t i = 0; i < R; ++i) std::memcpy(&head_x[i * H], &x[head_tokens[i] * H], H * sizeof(float));
  const float* head_in = head_x.data();
  if (c.final_norm) {
    norm(head_x.data(), weights_.final_norm, weights_.final_norm_bias, R, head_h.data());
    head_in = head_h.data();
  }
  if (!weights_.project_out.empty()) {
    cpu::linear(head_in, R, H, weights_.project_out.ptr(), E, nullptr, head_e.data());
    head_in = head_e.data();
  }
  cpu::linear(head_in, R, weights_.output_matrix(), nullptr, logits.data());

  int64_t head_row = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const StepRow& row = *rows[i].row;
    const int64_t n = row.all_logits ? static_cast<int64_t>(row.tokens.size()) : (row.logits || row.sample ? 1 : 0);
    if (n == 0) continue;
    const float* first = &logits[head_row * c.vocab_size];
    if (rows[i].logits_index >= 0)
      std::copy(first, first + n * c.vocab_size, out.logits.begin() + static_cast<int64_t>(rows[i].logits_index) * c.vocab_size);
    if (row.sample) {
      Sampler sampler(row.sampling);
      const float* last = first + (n - 1) * c.vocab_size;
      out.tokens[i] = sampler.sample(std::span<const float>(last, c.vocab_size), row.history, row.sample_index);
    }
    head_row += n;
  }
}

}  // namespace fdpp
