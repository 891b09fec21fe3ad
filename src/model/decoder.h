// The weights of a decoder-only transformer in the one layout every backend consumes. The
// architectures' files (model/arch/) map a checkpoint's tensor names into this; a tensor that the
// ModelConfig does not call for stays empty.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "fdpp/model_config.h"
#include "io/gguf.h"

namespace fdpp {

// A weight matrix [rows, cols] as the model file stores it (a GGUF type's blocks, row after row),
// viewed in place inside the file's mapping: nothing owned, nothing copied. Row n of the matrix is
// stored row row_order[n] when row_order is set (GGUF's attn_q/attn_k rows are permuted for
// llama.cpp's RoPE; the view undoes that without touching the bytes), else row n.
struct StoredMatrix {
  gguf::GgmlType type = gguf::GgmlType::F32;
  const uint8_t* data = nullptr;
  int64_t rows = 0, cols = 0;
  uint64_t row_bytes = 0;  // cols / block_elements(type) * block_bytes(type)
  std::shared_ptr<const std::vector<int32_t>> row_order;
  // Set by the CPU backend at load (cpu::repack_weights): the bytes regrouped into its interleaved
  // layout of `packed_rows` rows per group (backend/cpu/quant_repack.h), held by `packed`; data
  // then points there and row() is not valid. 0: the stored rows as the file has them.
  int packed_rows = 0;
  std::shared_ptr<const void> packed;
  // A stack of this many matrices of rows / matrices rows each, one after another (a layer's
  // experts); 1: one matrix.
  int64_t matrices = 1;

  bool empty() const { return data == nullptr; }
  const uint8_t* row(int64_t n) const {
    return data + static_cast<uint64_t>(row_order ? (*row_order)[static_cast<size_t>(n)] : n) * row_bytes;
  }
};

// Which form a loader gives the weight matrices (and embeddings) of a GGUF file: fp32 Tensors (the
// reference path, calibration, the CUDA upload) or StoredMatrix views into the mapped file (the CPU
// fast path; a tensor type without fast-path kernels still comes as fp32).
enum class WeightForm { F32, Stored };
// Which stored types the consumer of WeightForm::Stored multiplies in place (the CPU backend's
// cpu::stored_supported); the loader keeps the others as fp32.
using StoredTypeFilter = std::function<bool(gguf::GgmlType)>;

// A view over bytes held elsewhere (the mapped file, tests, benchmarks): rows x cols of `type`,
// contiguous rows. Throws for a row length that is not whole blocks.
StoredMatrix make_stored_view(gguf::GgmlType type, const uint8_t* data, int64_t rows, int64_t cols);

// A weight matrix in one of two forms: the fp32 Tensor (the reference path, calibration, the CUDA
// upload) or a StoredMatrix view (the CPU fast path), the other left empty. Derived from Tensor so
// that code written for fp32 tensors (ptr(), shape, assignment from a Tensor) keeps working.
struct Weight : Tensor {
  StoredMatrix stored;

  Weight() = default;
  Weight(Tensor t) : Tensor(std::move(t)) {}  // NOLINT: implicit, a Tensor is an fp32 weight
  Weight& operator=(Tensor t) {
    static_cast<Tensor&>(*this) = std::move(t);
    stored = {};
    return *this;
  }
  // Present in either form (empty() alone says only that the fp32 form is absent).
  bool present() const { return !empty() || !stored.empty(); }
};

struct LayerWeights {
  Tensor attn_norm, attn_norm_bias;  // [hidden]
  Weight wq, wk, wv;                 // [q_dim, hidden], [kv_dim, hidden] x2
  Tensor bq, bk, bv;                 // qkv_bias
  Weight wo;                         // [hidden, q_dim]
  Tensor bo;                         // out_bias
  Tensor q_norm, k_norm;             // [head_dim], qk_norm
  Tensor ffn_norm, ffn_norm_bias;    // [hidden]
  Tensor attn_post_norm, ffn_post_norm;  // [hidden], sandwich_norm
  Weight w_gate;                     // [ffn, hidden], SwiGLU only
  Weight w_up, w_down;               // [ffn, hidden], [hidden, ffn] (OPT fc1, fc2)
  Tensor b_gate, b_up, b_down;       // mlp_bias
  // An expert layer (ModelConfig::is_moe_layer) in place of w_gate/w_up/w_down: the router and
  // every expert's matrices stacked, expert e's [rows, cols] block at e * rows * cols.
  Tensor router;                     // [n_experts, hidden]
  Weight experts_gate, experts_up;   // [n_experts, expert_ffn, hidden]
  Weight experts_down;               // [n_experts, hidden, expert_ffn]
};

struct DecoderWeights {
  Weight tok_embeddings;             // [vocab, embedding_dim]
  Tensor pos_embeddings;             // [max_context + offset, hidden], learned positions only
  Tensor project_in, project_out;    // [hidden, embed_dim], [embed_dim, hidden] when embed_dim set
  std::vector<LayerWeights> layers;
  Tensor final_norm, final_norm_bias;
  Weight lm_head;                    // [vocab, embedding_dim]; absent when tied to tok_embeddings
  // Keeps alive what StoredMatrix views point into (the model file's mapping); null when every
  // weight is an fp32 Tensor.
  std::shared_ptr<const void> storage;

  const Weight& output_matrix() const { return lm_head.present() ? lm_head : tok_embeddings; }
};

using ProgressFn = std::function<void(double fraction)>;

}  // namespace fdpp
