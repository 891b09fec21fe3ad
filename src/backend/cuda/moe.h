// The mixture-of-experts layer on the GPU (Mixtral, Qwen3-MoE: ModelConfig::n_experts), in launches
// that never wait for the host, so that a decode step with expert layers stays one CUDA graph:
// every grid is sized by the step's token count, never by how the router chose. Design and
// measurements: docs/kernels/moe.md.
//
//   moe_route        router logits [n, E] -> each token's top-k experts and weights (softmax in
//                    fp32, ties to the lower index, renormalized when asked: cpu::route_experts);
//                    for one token also its alignment (moe_align has nothing left to do);
//                    moe_route_one also computes that token's router product, in the same launch
//   moe_align        the picks sorted by expert into rows, each expert's rows padded to whole
//                    tiles of kMoeTileRows, and the expert of every tile (-1 past the last)
//   moe_grouped_*    one expert's matrices times its rows, in one of two kernels:
//                    - CUDA cores, per tile (the GEMV's shape with the rows gathered by index):
//                      FlashDecoding++'s flat GEMM per expert, the rows padded to 8 (not 64), each
//                      active expert's bytes read once per tile, so once per decode step; an expert
//                      no token chose costs an early exit. Memory-bound: decode, where a tile holds
//                      the few tokens an expert gets.
//                    - tensor cores (mma.sync), per block of up to kMoeBlockTiles tiles (64 rows) of
//                      one expert: the grouped GEMM of prefill chunks and large batches, where an
//                      expert gets tens to thousands of rows and the CUDA cores would be
//                      compute-bound. The same weights are read once per block.
//                    moe_use_tensor_cores chooses (KernelOptions::moe_path overrides). A step of
//                    one token on the CUDA cores runs a warp per (feature, pick) instead of per
//                    tile, the GEMV's shape, and moe_down_combine does the down products and the
//                    combine in one launch.
//   moe_combine      each token's output: the sum over its picks of weight x expert row
//
// Weights are the stacked form of LayerWeights::experts_*: [E, N, K] 16-bit, expert e's matrix at
// e * N * K.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/kernels.h"

namespace fdpp::cuda {

constexpr int kMoeTileRows = 8;
// Tiles of one expert per tensor-core block: 64 rows, the tokens (n) side of its mma tiles.
constexpr int kMoeBlockTiles = 8;

// The routing of a step of `tokens` tokens: its picks, and at most how many rows and tiles they
// take once each chosen expert's rows are padded to whole tiles (at most min(E, picks) experts are
// chosen, each padded by less than a tile). Device buffers are sized for the largest step
// (reused by every layer: a layer's routing is dead once its combine ran); the grids of a step are
// sized by its own token count, so a decode step launches a few tiles, not the prefill's thousands.
struct MoeRoutingSizes {
  int64_t picks;   // tokens * k
  int64_t rows;    // whole tiles covering picks + (tile - 1) * min(E, picks)
  int64_t tiles;   // rows / tile
  int64_t blocks;  // tiles / kMoeBlockTiles + min(E, picks): each chosen expert ends a partial block
};
MoeRoutingSizes moe_routing_sizes(int tokens, int k, int n_experts);

struct MoeRouting {
  int32_t* pick_expert = nullptr;  // [picks] token t's j-th expert at t * k + j, best first
  float* pick_weight = nullptr;    // [picks]
  int32_t* pick_row = nullptr;     // [picks] the sorted row that computes pick t * k + j
  int32_t* row_token = nullptr;    // [rows] the token a sorted row reads; -1: padding
  int32_t* tile_expert = nullptr;  // [tiles] the expert of each tile of kMoeTileRows rows; -1: none
  int32_t* block_tile = nullptr;   // [blocks] the first tile of each tensor-core block; -1: none
};

// Whether a step of n tokens runs the tensor-core products: KernelOptions::moe_path, else from
// two tokens on (their pipelined weight stream beats the CUDA cores' there, measured; at one token
// the CUDA cores spread the few experts' rows over more SMs).
bool moe_use_tensor_cores(int n);

// logits: [n, E] fp32. k <= 32, E <= 1024.
void moe_route(const float* logits, int n, int n_experts, int k, bool normalize, const MoeRouting& r,
               cudaStream_t stream);

// The router product and moe_route for a step of one token, in one launch: logits = router . x
// (x [H] 16-bit, router [E, H] 16-bit; logits [E] fp32 are written as moe_route reads them), then the
// same picks and alignment. arrivals: one unsigned, zero before the first launch; the kernel's CTAs
// count themselves there (the last one routes) and leave it zero. Needs moe_route_one_fits.
bool moe_route_one_fits(const void* x, const void* router, int H);
void moe_route_one(const void* x, const void* router, float* logits, unsigned* arrivals, int H, int n_experts, int k,
                   bool normalize, const MoeRouting& r, DType dtype, cudaStream_t stream);

// Fills pick_row, row_token, tile_expert and block_tile (the rows, tiles and blocks of
// moe_routing_sizes(n, ...)) from pick_expert for n tokens. Rows of padding get token -1. A step
// of one token needs no launch: moe_route aligns its picks (a tile each, in pick order).
void moe_align(int n, int k, int n_experts, const MoeRouting& r, cudaStream_t stream);

// y[row, :] = silu(x[row_token[row]] . Wg_e^T) * (x[row_token[row]] . Wu_e^T) for every row of every
// tile of a step of n tokens, e = the tile's expert: x [n, K] 16-bit, gate/up [E, N, K], y [rows,
// N] 16-bit (padding rows are left unwritten by the CUDA cores, zero from the tensor cores).
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

// The layer's last two steps: moe_grouped_linear into down [rows, N], then moe_combine into out; a
// one-token step on the CUDA cores does both in one kernel (the picks' rows summed in registers,
// down left unwritten).
void moe_down_combine(const void* act, const void* w, void* down, void* out, int K, int N, int n_experts, int n,
                      int k, const MoeRouting& r, DType dtype, cudaStream_t stream);

}  // namespace fdpp::cuda
