// The Llama family (Llama 2/3, Mistral, SmolLM2): pre-norm decoder, RMSNorm, rotary embeddings
// (rotate-half), grouped-query attention, SwiGLU MLP, optionally tied embeddings.
// This file holds the architecture's tensor-name mapping and its layer recipe over backend ops.
#pragma once

#include <functional>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "fdpp/model_config.h"

namespace fdpp {

namespace gguf {
class GgufFile;
}

struct LlamaLayerWeights {
  Tensor attn_norm;                   // [hidden]
  Tensor wq, wk, wv, wo;              // [q_dim, hidden], [kv_dim, hidden] x2, [hidden, q_dim]
  Tensor bq, bk, bv, bo;              // empty unless attention_bias
  Tensor ffn_norm;                    // [hidden]
  Tensor w_gate, w_up, w_down;        // [ffn, hidden] x2, [hidden, ffn]
  Tensor b_gate, b_up, b_down;        // empty unless mlp_bias
};

struct LlamaWeights {
  Tensor tok_embeddings;  // [vocab, hidden]
  std::vector<LlamaLayerWeights> layers;
  Tensor output_norm;     // [hidden]
  Tensor output;          // [vocab, hidden]; empty when tied to tok_embeddings

  const Tensor& lm_head() const { return output.empty() ? tok_embeddings : output; }
};

// A tensor the model needs, with the shape the config implies (row-major, outer dim first).
struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  bool required = true;
};

using ProgressFn = std::function<void(double fraction)>;

// GGUF (llama.cpp naming: token_embd, blk.N.attn_q, ...).
ModelConfig llama_config_from_gguf(const gguf::GgufFile& file);
std::vector<TensorSpec> llama_gguf_tensor_specs(const ModelConfig& config);
LlamaWeights load_llama_gguf(const gguf::GgufFile& file, const ModelConfig& config, const ProgressFn& progress);

// Runs a Llama model on the CPU backend with its own KV cache.
class LlamaCpu {
 public:
  // max_context bounds the KV cache (positions 0 .. max_context - 1).
  LlamaCpu(const ModelConfig& config, const LlamaWeights& weights, int max_context);

  // Appends tokens at positions start_pos .. start_pos + n - 1 (the cache must already hold
  // 0 .. start_pos - 1) and writes logits: [n, vocab] when all_positions, else [1, vocab] of the
  // last token.
  void forward(std::span<const int32_t> tokens, int start_pos, bool all_positions, std::span<float> logits);

  int max_context() const { return max_context_; }
  const ModelConfig& config() const { return config_; }

 private:
  const ModelConfig& config_;
  const LlamaWeights& weights_;
  int max_context_;
  std::vector<double> inv_freq_;
  std::vector<Tensor> k_cache_, v_cache_;  // per layer [max_context, kv_dim]
};

}  // namespace fdpp
