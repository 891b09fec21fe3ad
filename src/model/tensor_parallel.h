// Megatron-style tensor parallelism: how a model splits over N GPUs of one host, as a plan of which
// rows and columns of each weight a rank owns. Each rank holds whole attention heads: q/k/v and
// gate/up are split by output rows, o and down by input columns (their partial outputs are summed
// by an all-reduce, and only rank 0 adds their bias), the lm head by vocabulary rows (the logits
// are gathered). Norms, position and token embeddings are replicated: a lookup reads only the
// step's rows, so splitting the table would buy memory with one more all-reduce per step.
// When a model has fewer KV heads than ranks (MQA/GQA), each KV head is replicated on the ranks
// whose query heads use it.
//
// The same plan drives the GPU loader (each rank streams only its slices from the files) and the
// CPU test that checks the slices against the whole model.
#pragma once

#include <cstdint>

#include "fdpp/model_config.h"
#include "model/weight_plan.h"

namespace fdpp {

struct TensorParallelLayout {
  int ranks = 1;
  // Each rank's shapes: n_heads, n_kv_heads and ffn_hidden divided (KV heads replicated when fewer
  // than the ranks); vocab_size stays the model's (the token ids, the gathered logits).
  ModelConfig local;
  int64_t vocab_per_rank = 0;  // lm head rows of every rank but possibly the last: ceil(vocab / ranks)
  int kv_replicas = 1;         // ranks holding each KV head (> 1 when the model has fewer than ranks)

  int q_head_begin(int rank) const { return rank * local.n_heads; }
  int kv_head_begin(int rank) const { return rank / kv_replicas * local.n_kv_heads; }
  int64_t ffn_begin(int rank) const { return static_cast<int64_t>(rank) * local.ffn_hidden; }
  int64_t vocab_begin(int rank) const { return rank * vocab_per_rank; }
  int64_t vocab_rows(int rank) const;  // the lm head rows rank owns (the last rank may own fewer)
};

// The layout of `config` over `ranks` GPUs. Throws fdpp::Error with one line naming what does not
// split (heads, KV heads, the FFN width) when the model cannot be sharded that way.
TensorParallelLayout plan_tensor_parallel(const ModelConfig& config, int ranks);

// The part of a whole-model plan that `rank` loads: every slot sliced (or dropped: the row-parallel
// biases on ranks > 0) to the shapes of layout.local, plus the rank's lm head rows (taken from the
// token embeddings when they are tied). The result refers to the same stored bytes: nothing is read.
WeightPlan shard_plan(const WeightPlan& plan, const ModelConfig& config, const TensorParallelLayout& layout, int rank);

}  // namespace fdpp
