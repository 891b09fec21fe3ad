#include "backend/cpu/cpu_engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>

#include "backend/cpu/ops.h"
#include "core/half.h"
#include "backend/cpu/quant_matmul.h"
#include "engine/sampler.h"
#include "fdpp/error.h"
#include "model/forward.h"

namespace fdpp {

namespace {
const float* bias_or_null(const Tensor& b) { return b.empty() ? nullptr : b.ptr(); }

// The default CPU cache: room for every row of a step at full context, but no more than this many
// bytes of fp32 K and V (a 135M model at 8K context and 64 rows would otherwise ask for 24 GiB).
constexpr double kDefaultCpuCacheBytes = 4.0 * 1073741824.0;
}  // namespace

CpuEngine::CpuEngine(const ModelConfig& config, const DecoderWeights& weights, EngineLimits limits, bool f16_cache)
    : config_(config), weights_(weights), f16_cache_(f16_cache) {
  if (limits.max_context == 0) limits.max_context = config.max_context;
  check(limits.max_context > 0, "context size {} must be positive", limits.max_context);
  check(limits.max_context <= config.max_context, "context size {} exceeds the model's context length {}",
        limits.max_context, config.max_context);
  if (limits.kv_cache_tokens == 0) {
    const double per_token = 2.0 * config.n_layers * config.kv_dim() * (f16_cache ? sizeof(uint16_t) : sizeof(float));
    const double cap = std::max(1.0, std::floor(kDefaultCpuCacheBytes / per_token));
    limits.kv_cache_tokens = static_cast<int64_t>(
        std::min(cap, static_cast<double>(limits.max_step_rows) * static_cast<double>(limits.max_context)));
    limits.kv_cache_tokens = std::max<int64_t>(limits.kv_cache_tokens, limits.max_context);
  }
  init_engine(limits);
  pool_layer_floats_ = static_cast<size_t>(kv().num_blocks()) * kv().block_size() * config.kv_dim();
  if (f16_cache)
    pool16_.reset(new uint16_t[2 * static_cast<size_t>(config.n_layers) * pool_layer_floats_]);
  else
    pool_.reset(new float[2 * static_cast<size_t>(config.n_layers) * pool_layer_floats_]);
  if (config.position == PositionEncoding::Rope) inv_freq_ = cpu::rope_inv_freq(config.rope.for_context(limits.max_context));
  if (config.has_local_rope) local_inv_freq_ = cpu::rope_inv_freq(config.local_rope);
}

void CpuEngine::norm(const float* x, const Tensor& weight, const Tensor& bias, int64_t rows, float* out) const {
  if (config_.norm == NormType::RMSNorm) {
    cpu::rms_norm(x, weight.ptr(), rows, config_.hidden, config_.norm_eps, out);
  } else {
    cpu::layer_norm(x, weight.ptr(), bias_or_null(bias), rows, config_.hidden, config_.norm_eps, out);
  }
}

// The op set of model/forward.h in fp32: q, k and v as three products, the cache per sequence,
// attention row by row; the skeleton decides which ops run.
struct CpuEngine::Forward {
  CpuEngine& engine;
  const ModelConfig& c;
  const DecoderWeights& w;
  std::span<const RowPlan> rows;
  const int64_t T, H, E, Q, KV, FF;
  std::vector<int32_t> positions;
  std::vector<float> x, h, o, up, e;
  // q, k, v and attn live from qkv to out_proj, the gate of a gated MLP only inside mlp_up_act: one
  // buffer holds both (a 512-token prefill of the default model peaks 3 MB lower).
  std::vector<float> scratch;
  std::span<float> q, k, v, attn, gate;
  const float* input = nullptr;  // h, or x itself after stream_as_input / a write-back norm
  const float* up_act = nullptr;
  // The head: the last token of each row whose logits are wanted (or sampled from), every token of
  // an all_logits row; only these go through the final norm and the lm head.
  std::vector<int64_t> head_tokens;
  std::vector<float> head_x, head_h, head_e, logits;
  const float* head = nullptr;

  Forward(CpuEngine& eng, std::span<const RowPlan> step_rows, int64_t total_tokens)
      : engine(eng), c(eng.config_), w(eng.weights_), rows(step_rows), T(total_tokens), H(c.hidden),
        E(c.embedding_dim()), Q(c.q_dim()), KV(c.kv_dim()), FF(c.ffn_hidden), positions(T), x(T * H),
        h(T * std::max(H, E)), o(T * H), up(T * FF) {
    const bool gated = c.activation == Activation::SwiGLU || c.activation == Activation::GeGLU;
    scratch.resize(static_cast<size_t>(T * std::max(2 * Q + 2 * KV, gated ? FF : 0)));
    float* s = scratch.data();
    q = {s, static_cast<size_t>(T * Q)};
    k = {q.data() + q.size(), static_cast<size_t>(T * KV)};
    v = {k.data() + k.size(), static_cast<size_t>(T * KV)};
    attn = {v.data() + v.size(), static_cast<size_t>(T * Q)};
    if (gated) gate = {s, static_cast<size_t>(T * FF)};
    for (const RowPlan& r : rows) {
      for (size_t t = 0; t < r.row->tokens.size(); ++t) positions[r.token_offset + t] = r.start + static_cast<int32_t>(t);
      const int64_t n = static_cast<int64_t>(r.row->tokens.size());
      if (r.row->all_logits) {
        for (int64_t t = 0; t < n; ++t) head_tokens.push_back(r.token_offset + t);
      } else if (r.row->logits || r.row->sample) {
        head_tokens.push_back(r.token_offset + n - 1);
      }
    }
  }
  int64_t head_count() const { return static_cast<int64_t>(head_tokens.size()); }

  void gather_tokens() {
    e.resize(T * E);
    for (const RowPlan& r : rows)
      for (size_t t = 0; t < r.row->tokens.size(); ++t)
        cpu::embedding_row(w.tok_embeddings, r.row->tokens[t], &e[(r.token_offset + t) * E]);
  }
  void project_in() { cpu::linear(e.data(), T, E, w.project_in.ptr(), H, nullptr, x.data()); }
  void embed(EmbedRows from, bool learned_positions) {
    if (from == EmbedRows::Tokens)
      for (const RowPlan& r : rows)
        for (size_t t = 0; t < r.row->tokens.size(); ++t)
          cpu::embedding_row(w.tok_embeddings, r.row->tokens[t], &x[(r.token_offset + t) * H]);
    // EmbedRows::Projected: project_in wrote the rows into x already.
    if (c.embed_scale != 1.0) {
      const float s = static_cast<float>(c.embed_scale);
      for (float& v : x) v *= s;
    }
    if (learned_positions)
      for (int64_t t = 0; t < T; ++t)
        cpu::add_inplace(&x[t * H], w.pos_embeddings.ptr() + (positions[t] + c.learned_position_offset) * H, H);
  }
  void stream_as_input() { input = x.data(); }
  void add_norm(int layer, BlockNorm which, bool add_delta, bool write_back) {
    const LayerWeights& L = w.layers[layer];
    const bool attention_norm = which == BlockNorm::Attention;
    if (add_delta) cpu::add_inplace(x.data(), o.data(), T * H);
    float* out = write_back ? x.data() : h.data();
    engine.norm(x.data(), attention_norm ? L.attn_norm : L.ffn_norm,
                attention_norm ? L.attn_norm_bias : L.ffn_norm_bias, T, out);
    input = out;
  }
  void qkv(int layer) {
    const LayerWeights& L = w.layers[layer];
    cpu::linear(input, T, L.wq, bias_or_null(L.bq), q.data());
    cpu::linear(input, T, L.wk, bias_or_null(L.bk), k.data());
    cpu::linear(input, T, L.wv, bias_or_null(L.bv), v.data());
  }
  void qk_norm(int layer) {
    const LayerWeights& L = w.layers[layer];
    cpu::rms_norm(q.data(), L.q_norm.ptr(), T * c.n_heads, c.head_dim, c.norm_eps, q.data());
    cpu::rms_norm(k.data(), L.k_norm.ptr(), T * c.n_kv_heads, c.head_dim, c.norm_eps, k.data());
  }
  void rope_and_write_cache(int layer) {
    const bool local = c.has_local_rope && c.window(layer) > 0;
    const std::vector<double>& inv_freq = local ? engine.local_inv_freq_ : engine.inv_freq_;
    cpu::rope(q.data(), T, c.n_heads, c.head_dim, c.rope_style, inv_freq, positions);
    cpu::rope(k.data(), T, c.n_kv_heads, c.head_dim, c.rope_style, inv_freq, positions);
    if (const RopeConfig& r = c.rope_of(layer); r.attention_factor != 1.0) {
      // LongRope scales cos and sin, so the rotated dimensions of q and k.
      const float f = static_cast<float>(r.attention_factor);
      for (int64_t row = 0; row < T * c.n_heads; ++row)
        for (int d = 0; d < r.rotary_dim; ++d) q[row * c.head_dim + d] *= f;
      for (int64_t row = 0; row < T * c.n_kv_heads; ++row)
        for (int d = 0; d < r.rotary_dim; ++d) k[row * c.head_dim + d] *= f;
    }
    write_cache(layer);
  }
  void write_cache(int layer) {
    const int64_t bs = engine.kv().block_size();
    const bool half = engine.f16_cache_;
    for (const RowPlan& r : rows) {
      const int64_t n = static_cast<int64_t>(r.row->tokens.size());
      for (int64_t t = 0; t < n; ++t) {
        const int64_t pos = r.start + t;
        const int64_t slot = static_cast<int64_t>(r.sequence->blocks[pos / bs]) * bs + pos % bs;
        const float* kt = &k[(r.token_offset + t) * KV];
        const float* vt = &v[(r.token_offset + t) * KV];
        if (half) {
          f32_to_fp16_row(kt, engine.k_pool16(layer) + slot * KV, KV);
          f32_to_fp16_row(vt, engine.v_pool16(layer) + slot * KV, KV);
        } else {
          std::memcpy(engine.k_pool(layer) + slot * KV, kt, KV * sizeof(float));
          std::memcpy(engine.v_pool(layer) + slot * KV, vt, KV * sizeof(float));
        }
      }
    }
  }
  // The observer's contiguous view of a row's cache (calibration only).
  std::vector<float> gathered_k, gathered_v;
  void gather(int layer, const RowPlan& r, int64_t len) {
    const int64_t bs = engine.kv().block_size();
    gathered_k.resize(len * KV);
    gathered_v.resize(len * KV);
    for (int64_t pos = 0; pos < len; ++pos) {
      const int64_t slot = static_cast<int64_t>(r.sequence->blocks[pos / bs]) * bs + pos % bs;
      if (engine.f16_cache_) {
        fp16_to_f32_row(engine.k_pool16(layer) + slot * KV, &gathered_k[pos * KV], KV);
        fp16_to_f32_row(engine.v_pool16(layer) + slot * KV, &gathered_v[pos * KV], KV);
      } else {
        std::memcpy(&gathered_k[pos * KV], engine.k_pool(layer) + slot * KV, KV * sizeof(float));
        std::memcpy(&gathered_v[pos * KV], engine.v_pool(layer) + slot * KV, KV * sizeof(float));
      }
    }
  }
  void attention(int layer) {
    const float scale = static_cast<float>(c.attention_scale());
    for (const RowPlan& r : rows) {
      const int64_t n = static_cast<int64_t>(r.row->tokens.size());
      const float* qr = &q[r.token_offset * Q];
      if (engine.observer_) {
        gather(layer, r, r.start + n);
        engine.observer_(AttentionObservation{layer, qr, gathered_k.data(), gathered_v.data(), n, r.start, c.n_heads,
                                              c.n_kv_heads, c.head_dim, scale});
      }
      if (engine.f16_cache_)
        cpu::attention_paged(qr, engine.k_pool16(layer), engine.v_pool16(layer), r.sequence->blocks,
                             engine.kv().block_size(), n, r.start, c.n_heads, c.n_kv_heads, c.head_dim, scale,
                             &attn[r.token_offset * Q], c.window(layer), static_cast<float>(c.attn_softcap));
      else
        cpu::attention_paged(qr, engine.k_pool(layer), engine.v_pool(layer), r.sequence->blocks,
                             engine.kv().block_size(), n, r.start, c.n_heads, c.n_kv_heads, c.head_dim, scale,
                             &attn[r.token_offset * Q], c.window(layer), static_cast<float>(c.attn_softcap));
    }
  }
  void out_proj(int layer) {
    const LayerWeights& L = w.layers[layer];
    cpu::linear(attn.data(), T, L.wo, bias_or_null(L.bo), o.data());
  }
  void post_norm(int layer, BlockNorm which) {
    const LayerWeights& L = w.layers[layer];
    cpu::rms_norm(o.data(), (which == BlockNorm::Attention ? L.attn_post_norm : L.ffn_post_norm).ptr(), T, H,
                  c.norm_eps, o.data());
  }
  void mlp_up_act(int layer, Activation activation) {
    const LayerWeights& L = w.layers[layer];
    cpu::linear(input, T, L.w_up, bias_or_null(L.b_up), up.data());
    if (activation == Activation::SwiGLU || activation == Activation::GeGLU) {
      cpu::linear(input, T, L.w_gate, bias_or_null(L.b_gate), gate.data());
      if (activation == Activation::SwiGLU) {
        cpu::silu_mul(gate.data(), up.data(), T * FF, up.data());
      } else {
        cpu::gelu_tanh_mul(gate.data(), up.data(), T * FF, up.data());
      }
    } else {
      cpu::relu(up.data(), T * FF);
    }
  }
  void mlp_down(int layer) {
    const LayerWeights& L = w.layers[layer];
    cpu::linear(up.data(), T, L.w_down, bias_or_null(L.b_down), o.data());
  }
  // Tokens go to their experts in expert order, each expert's rows through its three products
  // at once; every token's outputs add up in expert order, as transformers accumulates them.
  std::vector<float> router_logits, route_weights, xe, ge, ue, ye;
  std::vector<int32_t> routes;
  std::vector<int64_t> expert_begin, expert_next, picks;  // picks sorted by expert (counting sort), reused by layers
  void moe_mlp(int layer) {
    const LayerWeights& L = w.layers[layer];
    const int NE = c.n_experts, K = c.n_experts_used;
    const int64_t FE = c.expert_ffn_hidden;
    router_logits.resize(T * NE);
    cpu::linear(input, T, H, L.router.ptr(), NE, nullptr, router_logits.data());
    routes.resize(T * K);
    route_weights.resize(T * K);
    cpu::route_experts(router_logits.data(), T, NE, K, c.norm_topk_prob, routes.data(), route_weights.data());
    // Indices into routes grouped by expert, in token order within each.
    expert_begin.assign(static_cast<size_t>(NE) + 1, 0);
    for (int64_t i = 0; i < T * K; ++i) ++expert_begin[routes[i] + 1];
    for (int e = 0; e < NE; ++e) expert_begin[e + 1] += expert_begin[e];
    picks.resize(T * K);
    expert_next.assign(expert_begin.begin(), expert_begin.end() - 1);
    for (int64_t i = 0; i < T * K; ++i) picks[expert_next[routes[i]]++] = i;
    std::fill(o.begin(), o.end(), 0.f);
    for (int e = 0; e < NE; ++e) {
      const int64_t* p = picks.data() + expert_begin[e];
      const int64_t n = expert_begin[e + 1] - expert_begin[e];
      if (n == 0) continue;
      xe.resize(n * H);
      for (int64_t r = 0; r < n; ++r) std::memcpy(&xe[r * H], input + (p[r] / K) * H, H * sizeof(float));
      ge.resize(n * FE);
      ue.resize(n * FE);
      ye.resize(n * H);
      cpu::expert_linear(xe.data(), n, L.experts_gate, e, ge.data());
      cpu::expert_linear(xe.data(), n, L.experts_up, e, ue.data());
      cpu::silu_mul(ge.data(), ue.data(), n * FE, ue.data());
      cpu::expert_linear(ue.data(), n, L.experts_down, e, ye.data());
      for (int64_t r = 0; r < n; ++r) {
        const float weight = route_weights[p[r]];
        float* out = &o[(p[r] / K) * H];
        for (int64_t j = 0; j < H; ++j) out[j] += weight * ye[r * H + j];
      }
    }
  }
  void head_rows(bool add_delta) {
    if (head_tokens.empty()) return;
    if (add_delta) cpu::add_inplace(x.data(), o.data(), T * H);
    head_x.resize(head_count() * H);
    for (int64_t i = 0; i < head_count(); ++i)
      std::memcpy(&head_x[i * H], &x[head_tokens[i] * H], H * sizeof(float));
    head = head_x.data();
  }
  void final_norm(bool add_delta) {
    if (head_tokens.empty()) return;
    head_rows(add_delta);
    head_h.resize(head_count() * H);
    engine.norm(head_x.data(), w.final_norm, w.final_norm_bias, head_count(), head_h.data());
    head = head_h.data();
  }
  void project_out() {
    if (head_tokens.empty()) return;
    head_e.resize(head_count() * E);
    cpu::linear(head, head_count(), H, w.project_out.ptr(), E, nullptr, head_e.data());
    head = head_e.data();
  }
  void lm_head() {
    if (head_tokens.empty()) return;
    logits.resize(head_count() * c.vocab_size);
    cpu::linear(head, head_count(), w.output_matrix(), nullptr, logits.data());
    if (c.final_softcap > 0)
      cpu::soft_cap(logits.data(), static_cast<int64_t>(logits.size()), static_cast<float>(c.final_softcap));
  }
};

void CpuEngine::run_step(std::span<const RowPlan> rows, int64_t total_tokens, StepOutput& out) {
  const ModelConfig& c = config_;
  Forward f(*this, rows, total_tokens);
  run_decoder(c, f);
  if (f.head_tokens.empty()) return;

  int64_t head_row = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const StepRow& row = *rows[i].row;
    const int64_t n = row.all_logits ? static_cast<int64_t>(row.tokens.size()) : (row.logits || row.sample ? 1 : 0);
    if (n == 0) continue;
    const float* first = &f.logits[head_row * c.vocab_size];
    if (rows[i].logits_index >= 0)
      std::copy(first, first + n * c.vocab_size, out.logits.begin() + static_cast<int64_t>(rows[i].logits_index) * c.vocab_size);
    if (row.sample) {
      Sampler sampler(row.sampling);
      const float* last = first + (n - 1) * c.vocab_size;
      out.tokens[i] = sampler.sample(std::span<const float>(last, c.vocab_size), row.history, row.sample_index,
                                     row.sampling.logprobs >= 0 ? &out.logprobs[i] : nullptr, row.allowed_tokens);
    }
    head_row += n;
  }
}

}  // namespace fdpp
