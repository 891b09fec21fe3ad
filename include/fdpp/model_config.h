// What a model is, independent of where its weights came from (GGUF, HF directory) and of the
// backend that runs it. Loaders fill it; fdpp::validate() checks it before any weight is read.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace fdpp {

enum class RopeScaling { None, Linear, Llama3, LongRope };

// The decoder variants fdpp runs. Every supported architecture is one combination of these: the
// forward skeleton (src/model/forward.h) sequences a combination's ops once for every backend, the
// backends implement the ops, the model files only map names.
enum class NormType { RMSNorm, LayerNorm };
enum class Activation {
  SwiGLU,  // silu(gate(x)) * up(x), then down (Llama, ChatGLM2)
  ReLU,    // relu(fc1(x)), then fc2 (OPT)
  GeGLU,   // gelu_tanh(gate(x)) * up(x), then down (Gemma: gelu_pytorch_tanh)
};
enum class PositionEncoding { Rope, Learned };
enum class RopeStyle {
  RotateHalf,   // pairs (i, i + rotary_dim / 2): HF Llama
  Interleaved,  // pairs (2i, 2i + 1): ChatGLM2, GPT-J
};

struct RopeConfig {
  double theta = 10000.0;
  int rotary_dim = 0;  // dimensions of each head that rotate (== head_dim for Llama)
  RopeScaling scaling = RopeScaling::None;
  double factor = 1.0;            // Linear and Llama3
  double low_freq_factor = 1.0;   // Llama3
  double high_freq_factor = 4.0;  // Llama3
  int original_max_positions = 8192;  // Llama3
  // Per-frequency divisors (GGUF rope_freqs.weight, how llama.cpp stores Llama 3 scaling); empty
  // when absent. Applied after `scaling`.
  std::vector<double> freq_factors;
  // LongRope (Phi-3): per-frequency divisors for a context up to original_max_positions (short)
  // and beyond it (long), and the factor that scales the rotated dimensions of q and k.
  std::vector<double> short_factor, long_factor;
  double attention_factor = 1.0;

  // The rope an engine of `context` tokens runs: LongRope's factor set chosen by that context
  // (llama.cpp's rule: long when it exceeds original_max_positions), as freq_factors; the others
  // unchanged.
  RopeConfig for_context(int context) const {
    if (scaling != RopeScaling::LongRope) return *this;
    RopeConfig r = *this;
    r.scaling = RopeScaling::None;
    r.freq_factors = context > original_max_positions ? long_factor : short_factor;
    return r;
  }
};

// One layer's calibrated FP8 KV cache scales, from the checkpoint (model/hf_models.h:
// read_kv_cache_scales): with --kv-cache-dtype fp8 a key element x is cached as e4m3(x / k) and
// read as e4m3 * k, a value element with v. A 16-bit cache ignores them, as vLLM does.
struct KvCacheScales {
  float k = 1.f;
  float v = 1.f;
};

struct ModelConfig {
  std::string architecture;  // "llama" (Llama 2/3, SmolLM2), "mistral", "qwen2", "qwen3", "gemma2", "gemma3",
                             // "phi3", "opt", "chatglm"
  std::string name;
  int n_layers = 0;
  int hidden = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int ffn_hidden = 0;
  int vocab_size = 0;
  int max_context = 0;
  double norm_eps = 1e-5;
  RopeConfig rope;
  bool tied_embeddings = false;

  NormType norm = NormType::RMSNorm;
  Activation activation = Activation::SwiGLU;
  PositionEncoding position = PositionEncoding::Rope;
  RopeStyle rope_style = RopeStyle::RotateHalf;
  int learned_position_offset = 0;  // OPT: 2
  bool pre_norm = true;             // false: post-LN (OPT with do_layer_norm_before = false)
  bool final_norm = true;           // a norm after the last layer
  int embed_dim = 0;                // token embedding width when it differs from hidden (OPT
                                    // project_in/project_out); 0 = hidden
  bool qkv_bias = false;
  bool out_bias = false;
  bool mlp_bias = false;
  bool norm_bias = false;           // LayerNorm with bias
  bool qk_norm = false;             // RMSNorm over each head of q and k before RoPE (Qwen3): weights
                                    // LayerWeights::q_norm, k_norm of [head_dim]
  // Gemma 2/3. A norm on each block's output before the residual add (LayerWeights::attn_post_norm,
  // ffn_post_norm): x += post_norm(block(norm(x))).
  bool sandwich_norm = false;
  double embed_scale = 1.0;    // the token rows are multiplied by this (Gemma: sqrt(hidden))
  double attn_scale = 0.0;     // the q.k multiplier; 0: 1 / sqrt(head_dim) (Gemma: query_pre_attn_scalar^-1/2)
  double attn_softcap = 0.0;   // attention logits -> cap * tanh(logits / cap) before the softmax; 0: none
  double final_softcap = 0.0;  // the same on the lm head's logits; 0: none
  // The rotary embedding of the sliding-window layers when it differs from `rope` (Gemma 3's
  // local layers: rope_local_base_freq, unscaled).
  bool has_local_rope = false;
  RopeConfig local_rope;
  // Sliding-window attention: a token at position p attends to positions (p - window, p] in the
  // layers whose entry is nonzero; empty or 0 = full causal attention (the window never limits the
  // context). Indexed by layer; shorter than n_layers never (validate checks).
  std::vector<int> layer_windows;
  // Mixture of experts (Mixtral, Qwen3-MoE). In a layer that is_moe_layer names, the MLP is
  // n_experts SwiGLU experts of width expert_ffn_hidden: a router (LayerWeights::router) scores
  // them, the softmax's n_experts_used highest run (ties: the lower index), and their outputs add up
  // weighted by those probabilities, renormalized to sum 1 when norm_topk_prob. The other layers
  // keep the dense MLP of ffn_hidden. n_experts 0: no expert layer.
  int n_experts = 0;
  int n_experts_used = 0;
  int expert_ffn_hidden = 0;
  bool norm_topk_prob = true;
  // Which layers are expert layers (Qwen3-MoE's decoder_sparse_step and mlp_only_layers); empty:
  // every layer, when n_experts > 0.
  std::vector<bool> expert_layers;
  // The FP8 KV cache's scales of each layer, as an FP8 checkpoint publishes them (k_scale /
  // v_scale); empty: none published, every scale 1 (vLLM's uncalibrated fp8).
  std::vector<KvCacheScales> kv_cache_scales;

  int q_dim() const { return n_heads * head_dim; }
  int kv_dim() const { return n_kv_heads * head_dim; }
  int embedding_dim() const { return embed_dim > 0 ? embed_dim : hidden; }
  int window(int layer) const { return layer_windows.empty() ? 0 : layer_windows[static_cast<size_t>(layer)]; }
  const RopeConfig& rope_of(int layer) const { return has_local_rope && window(layer) > 0 ? local_rope : rope; }
  double attention_scale() const { return attn_scale > 0 ? attn_scale : 1.0 / std::sqrt(static_cast<double>(head_dim)); }
  bool is_moe_layer(int layer) const {
    return n_experts > 0 && (expert_layers.empty() || expert_layers[static_cast<size_t>(layer)]);
  }
  bool has_moe() const {
    for (int layer = 0; layer < n_layers; ++layer)
      if (is_moe_layer(layer)) return true;
    return false;
  }
  bool has_sliding_window() const {
    for (int w : layer_windows)
      if (w > 0) return true;
    return false;
  }
};

// Throws fdpp::Error ("<origin>: <field> = <value> ...") for zero, negative or inconsistent fields
// (heads not a multiple of kv heads, odd rotary dim, absurd sizes).
void validate(const ModelConfig& config, const std::string& origin);

}  // namespace fdpp
