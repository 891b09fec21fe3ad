// The forward pass of a decoder, written once for every architecture and both backends: which ops
// run, in which order, for the variant a ModelConfig describes (pre- or post-norm, RoPE or learned
// positions, SwiGLU, ReLU or expert MLPs, OPT-350m's embedding projections, a final norm or none).
// Each backend implements the op set below over its own buffers (backend/cpu/cpu_engine.cpp in fp32,
// backend/cuda/cuda_engine.cpp in 16-bit with its fusions) and calls run_decoder once per step; an
// architecture that combines these variants differently needs no backend change.
//
// The ops name no buffers: they work on four activations every backend keeps for a step.
//   stream  the fp32 residual stream x, [tokens, hidden]
//   input   what the next linear layer reads: the output of the last norm (post-norm models: the
//           stream itself, which the norms write back)
//   delta   the last attention or MLP block's output, [tokens, hidden], added by a later add_norm
//   head    the rows whose logits are wanted (the backend knows which), from the final norm on
// Tensor parallelism is the backends' business: out_proj and mlp_down return summed outputs.
#pragma once

#include "fdpp/model_config.h"

namespace fdpp {

// Where embed() takes the stream's rows from: the token table (width hidden), or the rows
// project_in() made from gather_tokens()' narrower ones.
enum class EmbedRows { Tokens, Projected };

// A layer's two norms (LayerWeights::attn_norm, ffn_norm): before their block in pre-norm models,
// after it in post-norm ones.
enum class BlockNorm { Attention, Mlp };

template <class Ops>
concept DecoderOps = requires(Ops& ops, int layer, bool flag, EmbedRows rows, BlockNorm norm, Activation act) {
  ops.gather_tokens();         // token rows of the embedding width into scratch (project_in's input)
  ops.project_in();            // scratch -> rows of the hidden width
  ops.embed(rows, flag);       // stream = rows (+ learned position rows when flag)
  ops.stream_as_input();       // input = stream (post-norm models read the stream itself)
  // Adds delta to the stream when flag; input = norm(stream); write_back: stream = input too.
  ops.add_norm(layer, norm, flag, /*write_back=*/flag);
  ops.qkv(layer);              // q, k, v projections of input (+ biases)
  ops.qk_norm(layer);          // RMSNorm over each head of q and of k (ModelConfig::qk_norm)
  ops.rope_and_write_cache(layer);  // rotates q and k by their positions, writes k and v to the cache
  ops.write_cache(layer);      // writes k and v to the cache as they are
  ops.attention(layer);        // every row over its sequence's cache (causal within the step; the
                               // last ModelConfig::window(layer) positions when that is nonzero)
  ops.out_proj(layer);         // delta = o projection of the attention output (+ bias)
  ops.post_norm(layer, norm);  // delta = norm(delta) with the block's post norm (sandwich_norm)
  ops.mlp_up_act(layer, act);  // the MLP's up (and gate) projections of input, activated
  ops.mlp_down(layer);         // delta = down projection of the activation (+ bias)
  ops.moe_mlp(layer);          // an expert layer's MLP: delta = the sum over each token's chosen
                               // experts of their SwiGLU output of input, weighted by the router
  ops.final_norm(flag);        // head = the final norm of the head rows of stream (+ delta when flag)
  ops.head_rows(flag);         // head = the head rows of stream (+ delta when flag), no norm
  ops.project_out();           // head = project_out of head (back to the embedding width)
  ops.lm_head();               // logits of head
};

template <DecoderOps Ops>
void run_decoder(const ModelConfig& c, Ops& ops) {
  const bool projected = c.embedding_dim() != c.hidden;
  const bool learned = c.position == PositionEncoding::Learned;
  if (projected) {
    // OPT-350m: narrower token rows, projected to the hidden size before positions are added.
    ops.gather_tokens();
    ops.project_in();
    ops.embed(EmbedRows::Projected, learned);
  } else {
    ops.embed(EmbedRows::Tokens, learned);
  }
  if (!c.pre_norm) ops.stream_as_input();

  // Pre-norm: x += block(norm(x)); the MLP's output waits in delta for the next norm (or the final
  // one) to add it, so that a backend can fuse the add into the norm. Post-norm: x = norm(x +
  // block(x)), written back.
  bool pending = false;  // delta holds a block output the stream has not yet received
  for (int layer = 0; layer < c.n_layers; ++layer) {
    if (c.pre_norm) ops.add_norm(layer, BlockNorm::Attention, pending, false);
    ops.qkv(layer);
    if (c.qk_norm) ops.qk_norm(layer);
    if (c.position == PositionEncoding::Rope) {
      ops.rope_and_write_cache(layer);
    } else {
      ops.write_cache(layer);
    }
    ops.attention(layer);
    ops.out_proj(layer);
    if (c.sandwich_norm) ops.post_norm(layer, BlockNorm::Attention);
    if (c.pre_norm) {
      ops.add_norm(layer, BlockNorm::Mlp, true, false);
    } else {
      ops.add_norm(layer, BlockNorm::Attention, true, true);
    }
    if (c.is_moe_layer(layer)) {
      ops.moe_mlp(layer);
    } else {
      ops.mlp_up_act(layer, c.activation);
      ops.mlp_down(layer);
    }
    if (c.sandwich_norm) ops.post_norm(layer, BlockNorm::Mlp);
    if (c.pre_norm) {
      pending = true;
    } else {
      ops.add_norm(layer, BlockNorm::Mlp, true, true);
    }
  }

  if (c.final_norm) {
    ops.final_norm(pending);
  } else {
    ops.head_rows(pending);
  }
  if (projected) ops.project_out();
  ops.lm_head();
}

}  // namespace fdpp
