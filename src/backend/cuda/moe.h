// The mixture-of-experts layer on the GPU (Mixtral, Qwen3-MoE: ModelConfig::n_experts), in four
// launches that never wait for the host, so that a decode step with expert layers stays one CUDA
// graph: every grid is sized by the step's token count, never by how the router chose.
//
//   moe_route        router logits [n, E] -> each token's top-k experts and weights (softmax in
//                    fp32, ties to the lower index, renormalized when asked: cpu::route_experts)
//   moe_align        the picks sorted by expert into rows, each expert's rows padded to whole
//                    tiles of kMoeTileRows, and the expert of every tile (-1 past the last)
//   moe_grouped_*    per tile, one expert's matrices times its rows: FlashDecoding++'s flat GEMM per
//                    expert, the rows padded to 8 (not 64), the weights of an expert read once per
//                    tile of up to 8 rows, so at decode each active expert's bytes once per step;
//                    an expert no token chose costs an early exit
//   moe_combine      each token's output: the sum over its picks of weight x expert row
//
// The grouped products run on CUDA cores (the GEMV's kernel shape with the rows gathered by
// index): memory-bound at decode, where a tile holds the few tokens an expert gets. A prefill chunk
// with hundreds of rows per expert is compute-bound there; a tensor-core path is the next step.
//
// Weights are the stacked form of LayerWeights::experts_*: [E, N, K] 16-bit, expert e's matrix at
// e * N * K.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/kernels.h"

namespace fdpp::cuda {

constexpr int kMoeTileRows = 8;

// The routing of a step of `tokens` tokens: its picks, and at most how many rows and tiles they
// take once each chosen expert's rows are padded to whole tiles (at most min(E, picks) experts are
// chosen, each padded by less than a tile). Device buffers are sized for the largest step
// (reused by every layer: a layer's routing is dead once its combine ran); the grids of a step are
// sized by its own token count, so a decode step launches a few tiles, not the prefill's thousands.
struct MoeRoutingSizes {
  int64_t picks;  // tokens * k
  int64_t rows;   // whole tiles covering picks + (tile - 1) * min(E, picks)
  int64_t tiles;  // rows / tile
};
MoeRoutingSizes moe_routing_sizes(int tokens, int k, int n_experts);

struct MoeRouting {
  int32_t* pick_expert = nullptr;  // [picks] token t's j-th expert at t * k + j, best first
  float* pick_weight = nullptr;    // [picks]
  int32_t* pick_row = nullptr;     // [picks] the sorted row that computes pick t * k + j
  int32_t* row_token = nullptr;    // [rows] the token a sorted row reads; -1: padding
  int32_t* tile_expert = nullptr;  // [tiles] the expert of each tile of kMoeTileRows rows; -1: none
};

// logits: [n, E] fp32. k <= 32, E <= 1024.
void moe_route(const float* logits, int n, int n_experts, int k, bool normalize, const MoeRouting& r,
               cudaStream_t stream);

// Fills pick_row, row_token and tile_expert (the rows and tiles of moe_routing_sizes(n, ...))
// from pick_expert for n tokens.
void moe_align(int n, int k, int n_experts, const MoeRouting& r, cudaStream_t stream);

// y[row, :] = silu(x[row_token[row]] . Wg_e^T) * (x[row_token[row]] . Wu_e^T) for every row of every
// tile of a step of n tokens, e = the tile's expert: x [n, K] 16-bit, gate/up [E, N, K], y [rows,
// N] 16-bit (padding rows are left unwritten).
void moe_grouped_swiglu(const void* x, const void* gate, const void* up, void* y, int K, int N, int n_experts, int n,
                        int k, const MoeRouting& r, DType dtype, cudaStream_t stream);

// y[row, :] = x[row] . W_e^T for every row of every tile: x [rows, K] (the sorted rows themselves,
// as moe_grouped_swiglu wrote them), W [E, N, K], y [rows, N] 16-bit.
void moe_grouped_linear(const void* x, const void* w, void* y, int K, int N, int n_experts, int n, int k,
                        const MoeRouting& r, DType dtype, cudaStream_t stream);

// out[t, :] = sum_j pick_weight[t * k + j] * y[pick_row[t * k + j], :], j = 0..k-1 in order; out
// [n, N] 16-bit.
void moe_combine(const void* y, int n, int k, int N, const MoeRouting& r, void* out, DType dtype,
                 cudaStream_t stream);

}  // namespace fdpp::cuda
