// The weights of a decoder-only transformer in the one layout every backend consumes. Model files
// (llama.cpp, opt.cpp, chatglm.cpp) map a checkpoint's tensor names into this; a tensor that the
// ModelConfig does not call for stays empty.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "fdpp/model_config.h"

namespace fdpp {

struct LayerWeights {
  Tensor attn_norm, attn_norm_bias;  // [hidden]
  Tensor wq, wk, wv;                 // [q_dim, hidden], [kv_dim, hidden] x2
  Tensor bq, bk, bv;                 // qkv_bias
  Tensor wo, bo;                     // [hidden, q_dim]; out_bias
  Tensor ffn_norm, ffn_norm_bias;    // [hidden]
  Tensor w_gate;                     // [ffn, hidden], SwiGLU only
  Tensor w_up, w_down;               // [ffn, hidden], [hidden, ffn] (OPT fc1, fc2)
  Tensor b_gate, b_up, b_down;       // mlp_bias
};

struct DecoderWeights {
  Tensor tok_embeddings;             // [vocab, embedding_dim]
  Tensor pos_embeddings;             // [max_context + offset, hidden], learned positions only
  Tensor project_in, project_out;    // [hidden, embed_dim], [embed_dim, hidden] when embed_dim set
  std::vector<LayerWeights> layers;
  Tensor final_norm, final_norm_bias;
  Tensor lm_head;                    // [vocab, embedding_dim]; empty when tied to tok_embeddings

  const Tensor& output_matrix() const { return lm_head.empty() ? tok_embeddings : lm_head; }
};

// A tensor the model needs, with the shape the config implies (row-major, outer dim first).
struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  bool required = true;
};

using ProgressFn = std::function<void(double fraction)>;

}  // namespace fdpp
