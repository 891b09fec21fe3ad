// The CPU reference backend: every op a decoder layer needs, fp32 in and out with fp32
// accumulation, parallel over output rows (thread_pool.h). These functions define the truth that
// every CUDA kernel and the CPU fast path (quant_matmul.h) are tested against, so they favour plain,
// obviously-right loops; speed comes from threads and the compiler's vectorization (AVX2 + FMA),
// not from cleverness.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "fdpp/model_config.h"

namespace fdpp::cpu {

// y[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n]); w is [N, K] row-major (out x in). bias may be null.
void linear(const float* x, int64_t M, int64_t K, const float* w, int64_t N, const float* bias, float* y);

// out[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * weight  (out may alias x)
void rms_norm(const float* x, const float* weight, int64_t rows, int64_t dim, double eps, float* out);

// out[r, :] = (x[r, :] - mean) / sqrt(var + eps) * weight + bias  (out may alias x)
void layer_norm(const float* x, const float* weight, const float* bias, int64_t rows, int64_t dim, double eps,
                float* out);

// x[i] += y[i]
void add_inplace(float* x, const float* y, int64_t n);

// out[r, i] = silu(gate[r, i]) * up[r, i]  (out may alias gate or up)
void silu_mul(const float* gate, const float* up, int64_t n, float* out);

// x[i] = max(x[i], 0)
void relu(float* x, int64_t n);

// out[i] = gelu_tanh(gate[i]) * up[i] (out may alias gate or up): PyTorch's gelu(approximate="tanh"),
// 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))).
void gelu_tanh_mul(const float* gate, const float* up, int64_t n, float* out);

// Mixture-of-experts routing: for each of `tokens` rows of router logits [tokens, n_experts], the
// n_used experts of highest softmax probability, best first (ties: the lower index), and their
// probabilities, divided by their sum when normalize. experts and weights: [tokens, n_used].
void route_experts(const float* logits, int64_t tokens, int n_experts, int n_used, bool normalize, int32_t* experts,
                   float* weights);

// x[i] = cap * tanh(x[i] / cap): Gemma 2's logit soft-capping.
void soft_cap(float* x, int64_t n, float cap);

// Inverse frequencies of the rotary embedding (rotary_dim / 2 of them), with Linear or Llama 3
// frequency scaling applied as HF transformers does.
std::vector<double> rope_inv_freq(const RopeConfig& rope);

// Rotates the first rotary_dim (= 2 * inv_freq.size()) dims of every head in
// x[n_tokens, n_heads * head_dim] in place; the rest of each head passes through. Pair i (with
// frequency inv_freq[i]) is (i, i + rotary_dim / 2) in RotateHalf style and (2i, 2i + 1) in
// Interleaved style. positions[t] gives each token's position.
void rope(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_dim, RopeStyle style,
          std::span<const double> inv_freq, std::span<const int32_t> positions);

// Causal attention of n_q new query tokens (at positions start_pos .. start_pos + n_q - 1) over a
// cache holding positions 0 .. start_pos + n_q - 1.
//   q:   [n_q, n_heads * head_dim]
//   k,v: [>= start_pos + n_q, n_kv_heads * head_dim] (the layer's cache)
//   out: [n_q, n_heads * head_dim]
// Query head h reads kv head h / (n_heads / n_kv_heads) (GQA). scale is usually 1/sqrt(head_dim).
// Softmax is the stable one (max subtracted) in fp32 with a double-precision denominator.
// window > 0: a query at position p reads only keys p - window + 1 .. p (sliding-window attention,
// transformers' "kv_idx > q_idx - sliding_window"); 0 reads every earlier key. softcap > 0: each
// scaled logit s becomes softcap * tanh(s / softcap) before the softmax (Gemma 2).
void attention(const float* q, const float* k, const float* v, int64_t n_q, int64_t start_pos, int64_t n_heads,
               int64_t n_kv_heads, int64_t head_dim, float scale, float* out, int64_t window = 0,
               float softcap = 0.f);
// The same over a paged cache: position j's key is row blocks[j / block_size] * block_size +
// j % block_size of k (and its value of v), so sequences can share blocks (prefix caching). The
// arithmetic is attention()'s, in the same order: the results are equal bit for bit.
void attention_paged(const float* q, const float* k, const float* v, std::span<const int32_t> blocks,
                     int64_t block_size, int64_t n_q, int64_t start_pos, int64_t n_heads, int64_t n_kv_heads,
                     int64_t head_dim, float scale, float* out, int64_t window = 0, float softcap = 0.f);

// The same over an fp16 cache (CpuEngine with an f16 KV cache): each K and V row is converted to
// fp32 before the same arithmetic (in a prefill chunk once per kv head, not per query token and
// head), so the result equals attention_paged over the converted values bit for bit.
void attention_paged(const float* q, const uint16_t* k, const uint16_t* v, std::span<const int32_t> blocks,
                     int64_t block_size, int64_t n_q, int64_t start_pos, int64_t n_heads, int64_t n_kv_heads,
                     int64_t head_dim, float scale, float* out, int64_t window = 0, float softcap = 0.f);

// The dot product attention() computes its logits with (the same code, so the same fp32 result):
// for references that must see exactly the logits attention() sees.
float attention_dot(const float* a, const float* b, int64_t n);

}  // namespace fdpp::cpu
