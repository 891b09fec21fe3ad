// The mixture-of-experts kernels (moe.h): routing, the sort of picks into expert tiles, the grouped
// products per tile, and the weighted combine.
#include <algorithm>
#include <climits>
#include <type_traits>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kernel_options.h"
#include "backend/cuda/mma_fragments.cuh"
#include "backend/cuda/moe.h"
#include "backend/cuda/per_device.h"

namespace fdpp::cuda {

namespace {

using detail::check_launch;
using detail::from_float;
using detail::to_float;
using detail::warp_max;
using detail::warp_sum;

constexpr int kRouteWarps = 4;
constexpr int kGroupedWarps = 8;
constexpr int kAlignThreads = 1024;
constexpr int kCombineThreads = 64;

// Programmatic dependent launch (cuda_common.cuh): every kernel here may be scheduled while the
// previous one drains and waits for it (pdl_wait) before it reads anything; the weights' addresses
// depend on the routing, so no load goes before the wait. The launch gaps of a decode step's
// expert kernels overlap their predecessors' tails.

// One token's routing by one warp: the softmax of its E logits (l: global or shared memory), the
// top k by k rounds of a warp arg-max, ties to the lower expert (cpu::route_experts' order), and
// its picks written at t * k. Lane l holds the probabilities of experts l, l + 32, ... in
// registers (L of them: E <= 32 L) and keeps its own best untaken one, so a round is one shuffle
// reduction; L is the fewest that hold E, since the rounds are one warp's dependent chain. A step of one
// token (one_token) is also aligned here: its k picks are k different experts, a tile and a block
// each, in pick order (moe_align's result up to the order of the experts, which nothing reads).
template <bool kGlobal, int L>
__device__ void route_token(const float* l, int E, int k, bool normalize, int64_t t, const MoeRouting& r,
                            bool one_token, int64_t blocks_cap) {
  const int lane = threadIdx.x & 31;
  float p[L];
  float mx = -INFINITY;
#pragma unroll
  for (int i = 0; i < L; ++i) {
    const int e = lane + 32 * i;
    p[i] = e < E ? (kGlobal ? __ldcg(l + e) : l[e]) : -INFINITY;
    mx = fmaxf(mx, p[i]);
  }
  mx = warp_max(mx);
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < L; ++i) {
    p[i] = lane + 32 * i < E ? expf(p[i] - mx) : -1.f;  // -1: no expert, or taken
    sum += fmaxf(p[i], 0.f);
  }
  sum = warp_sum(sum);
#pragma unroll
  for (int i = 0; i < L; ++i) p[i] = p[i] >= 0.f ? p[i] / sum : -1.f;
  // This lane's best untaken probability and its slot (the first of equals: the lower expert).
  auto lane_best = [&](float& best, int& slot) {
    best = -1.f, slot = 0;
#pragma unroll
    for (int i = 0; i < L; ++i)
      if (p[i] > best) best = p[i], slot = i;
  };
  float best;
  int slot;
  lane_best(best, slot);
  int my_expert = -1;
  float my_p = 0.f, chosen = 0.f;
  for (int j = 0; j < k; ++j) {
    float b = best;
    int be = lane + 32 * slot;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, b, o);
      const int oe = __shfl_xor_sync(0xffffffffu, be, o);
      if (ob > b || (ob == b && oe < be)) b = ob, be = oe;
    }
    if ((be & 31) == lane) {
#pragma unroll
      for (int i = 0; i < L; ++i)
        if (i == (be >> 5)) p[i] = -1.f;
      lane_best(best, slot);
    }
    if (lane == j) my_expert = be, my_p = b;
    chosen += b;
  }
  if (lane < k) {
    r.pick_expert[t * k + lane] = my_expert;
    r.pick_weight[t * k + lane] = normalize ? my_p / chosen : my_p;
  }
  if (one_token) {
    if (lane < k) {
      r.pick_row[lane] = lane * kMoeTileRows;
      r.tile_expert[lane] = my_expert;
#pragma unroll
      for (int m = 0; m < kMoeTileRows; ++m) r.row_token[lane * kMoeTileRows + m] = m == 0 ? 0 : -1;
    }
    for (int64_t b = lane; b < blocks_cap; b += 32) r.block_tile[b] = b < k ? int32_t(b) : -1;
  }
}

// Calls f(std::integral_constant<int, L>) with the fewest probability slots per lane that hold E
// experts (E <= 1024, checked by the callers).
template <class F>
void with_route_slots(int E, F&& f) {
  if (E <= 128) f(std::integral_constant<int, 4>{});
  else if (E <= 256) f(std::integral_constant<int, 8>{});
  else f(std::integral_constant<int, 32>{});
}

// One warp per token (route_token).
template <int L>
__global__ void __launch_bounds__(kRouteWarps * 32)
    moe_route_kernel(const float* __restrict__ logits, int n, int E, int k, bool normalize, MoeRouting r,
                     int64_t blocks_cap) {
  detail::pdl_trigger();
  detail::pdl_wait();
  const int t = blockIdx.x * kRouteWarps + (threadIdx.x >> 5);
  if (t >= n) return;
  route_token<false, L>(logits + int64_t(t) * E, E, k, normalize, t, r, n == 1, blocks_cap);
}

// One token's router product and routing in one launch. A warp per expert row: its weights are
// loaded before the wait for the previous kernel (they do not depend on it), as the GEMV does;
// every warp stores its logit, and the last CTA to arrive (a counter in global memory, reset by
// that CTA for the next launch) routes the token from them.
constexpr int kRouterWarps = 4;
constexpr int kRouterUnroll = 8;  // 16-byte chunks a lane loads per pass: a 2,048-wide row in one
template <class T, int L>
__global__ void __launch_bounds__(kRouterWarps * 32)
    moe_route_one_kernel(const T* __restrict__ x, const T* __restrict__ w, int H, int E, int k, bool normalize,
                         float* __restrict__ logits, unsigned* __restrict__ arrivals, MoeRouting r,
                         int64_t blocks_cap) {
  detail::pdl_trigger();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int e = blockIdx.x * kRouterWarps + warp;
  bool waited = false;
  if (e < E) {
    const int chunks = H / 8;
    const uint4* w4 = reinterpret_cast<const uint4*>(w + int64_t(e) * H);
    const uint4* x4 = reinterpret_cast<const uint4*>(x);
    float acc = 0.f;
    for (int base = lane; base < chunks; base += 32 * kRouterUnroll) {
      uint4 wv[kRouterUnroll];
#pragma unroll
      for (int u = 0; u < kRouterUnroll; ++u) {
        const int c = base + 32 * u;
        wv[u] = c < chunks ? __ldcs(w4 + c) : make_uint4(0, 0, 0, 0);
      }
      if (!waited) {  // x is the previous kernel's
        detail::pdl_wait();
        waited = true;
      }
#pragma unroll
      for (int u = 0; u < kRouterUnroll; ++u) {
        const int c = base + 32 * u;
        if (c >= chunks) break;
        float fx[8];
        detail::load8(reinterpret_cast<const T*>(x4 + c), fx);
        const T* ew = reinterpret_cast<const T*>(&wv[u]);
#pragma unroll
        for (int i = 0; i < 8; ++i) acc = fmaf(to_float(ew[i]), fx[i], acc);
      }
    }
    acc = warp_sum(acc);
    if (lane == 0) {
      logits[e] = acc;
      __threadfence();
    }
  }
  if (!waited) detail::pdl_wait();  // the chain of waits stays transitive (cuda_common.cuh)
  __shared__ bool last;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    last = atomicAdd(arrivals, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last || warp != 0) return;
  __threadfence();
  if (lane == 0) *arrivals = 0u;
  route_token<true, L>(logits, E, k, normalize, 0, r, true, blocks_cap);
}

// Exclusive prefix sums over E values, in place of value(e) into out[0..E] (out[E] the total), by
// warp 0 of the CTA in rounds of 32 (the other threads pass through; the caller syncs after).
template <class F>
__device__ void warp0_exclusive_scan(int E, F value, int32_t* out) {
  if (threadIdx.x >= 32) return;
  const int lane = threadIdx.x;
  int carry = 0;
  for (int base = 0; base < E; base += 32) {
    const int e = base + lane;
    const int v = e < E ? value(e) : 0;
    int incl = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int up = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += up;
    }
    if (e < E) out[e] = carry + incl - v;
    carry += __shfl_sync(0xffffffffu, incl, 31);
  }
  if (lane == 0) out[E] = carry;
}

// The last index i in [0, n) with first[i] <= v (first non-decreasing, first[0] <= v).
__device__ __forceinline__ int last_at_or_below(const int32_t* first, int n, int64_t v) {
  int lo = 0, hi = n - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (first[mid] <= v) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// One CTA: counts per expert, each expert's rows padded to whole tiles, the tiles' experts, the
// tensor-core blocks' first tiles, and a row for every pick (the order within an expert is the
// atomics' order: each row is computed alone and the combine reads by pick, so the output does not
// depend on it).
__global__ void __launch_bounds__(kAlignThreads)
    moe_align_kernel(const int32_t* __restrict__ pick_expert, int picks, int k, int E, int64_t rows_cap,
                     int64_t tiles_cap, int64_t blocks_cap, int32_t* __restrict__ pick_row,
                     int32_t* __restrict__ row_token, int32_t* __restrict__ tile_expert,
                     int32_t* __restrict__ block_tile) {
  extern __shared__ int32_t smem[];
  int32_t* count = smem;                 // [E]
  int32_t* offset = smem + E;            // [E + 1] first row of each expert, multiples of the tile
  int32_t* cursor = offset + E + 1;      // [E]
  int32_t* first_block = cursor + E;     // [E + 1] first tensor-core block of each expert
  detail::pdl_trigger();
  detail::pdl_wait();
  for (int e = threadIdx.x; e < E; e += blockDim.x) count[e] = 0, cursor[e] = 0;
  __syncthreads();
  for (int p = threadIdx.x; p < picks; p += blockDim.x) atomicAdd(&count[pick_expert[p]], 1);
  __syncthreads();
  warp0_exclusive_scan(
      E, [&](int e) { return (count[e] + kMoeTileRows - 1) / kMoeTileRows * kMoeTileRows; }, offset);
  __syncthreads();
  warp0_exclusive_scan(
      E,
      [&](int e) {
        const int tiles = (offset[e + 1] - offset[e]) / kMoeTileRows;
        return (tiles + kMoeBlockTiles - 1) / kMoeBlockTiles;
      },
      first_block);
  __syncthreads();
  for (int64_t r = threadIdx.x; r < rows_cap; r += blockDim.x) row_token[r] = -1;
  // Empty experts share their offsets: the owner of a row (a block) is the last expert whose first
  // row (block) is at or below it.
  for (int64_t tile = threadIdx.x; tile < tiles_cap; tile += blockDim.x) {
    const int64_t row = tile * kMoeTileRows;
    tile_expert[tile] = row < offset[E] ? last_at_or_below(offset, E, row) : -1;
  }
  for (int64_t b = threadIdx.x; b < blocks_cap; b += blockDim.x) {
    int32_t first_tile = -1;
    if (b < first_block[E]) {
      const int e = last_at_or_below(first_block, E, b);
      first_tile = offset[e] / kMoeTileRows + int32_t(b - first_block[e]) * kMoeBlockTiles;
    }
    block_tile[b] = first_tile;
  }
  __syncthreads();  // the -1 of padding rows lands before the picks' tokens
  for (int p = threadIdx.x; p < picks; p += blockDim.x) {
    const int e = pick_expert[p];
    const int row = offset[e] + atomicAdd(&cursor[e], 1);
    pick_row[p] = row;
    row_token[row] = p / k;
  }
}

// A warp per output column n of its CTA's tile: the column's weight row(s) of the tile's expert
// against every row of the tile. kSwiglu: gate and up rows together, y = silu(gate) * up; else one
// row, y = the product. kGather: the tile's rows read x at their token (the layer's input), else at
// the row itself (the sorted rows moe_grouped_swiglu wrote).
template <class T, bool kSwiglu, bool kGather, bool kVec>
__global__ void __launch_bounds__(kGroupedWarps * 32)
    moe_grouped_kernel(const T* __restrict__ x, const T* __restrict__ w0, const T* __restrict__ w1,
                       T* __restrict__ y, int K, int N, const int32_t* __restrict__ tile_expert,
                       const int32_t* __restrict__ row_token) {
  detail::pdl_trigger();
  detail::pdl_wait();
  const int tile = blockIdx.x;
  const int e = tile_expert[tile];
  if (e < 0) return;  // past the last tile of this step: the grid is sized for the largest step
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int n = blockIdx.y * kGroupedWarps + warp;
  if (n >= N) return;
  const int64_t row0 = int64_t(tile) * kMoeTileRows;
  const T* xr[kMoeTileRows];
  bool live[kMoeTileRows];
#pragma unroll
  for (int m = 0; m < kMoeTileRows; ++m) {
    const int tok = row_token[row0 + m];
    live[m] = tok >= 0;
    xr[m] = x + (kGather ? int64_t(tok < 0 ? 0 : tok) : row0 + m) * K;
  }
  const T* a = w0 + (int64_t(e) * N + n) * K;
  const T* b = kSwiglu ? w1 + (int64_t(e) * N + n) * K : nullptr;
  float acc0[kMoeTileRows], acc1[kMoeTileRows];
#pragma unroll
  for (int m = 0; m < kMoeTileRows; ++m) acc0[m] = 0.f, acc1[m] = 0.f;
  if constexpr (kVec) {
    // The weights are the stream (decode: each active expert's bytes once per step): every lane
    // issues kUnroll 16-byte loads of each weight row before the first use, as the GEMV does, so
    // that enough bytes are in flight; the last pass is predicated rather than a scalar tail (an
    // expert's down row of 768 is 3 chunks a lane: all in one pass). x comes from L1/L2.
    constexpr int kUnroll = kSwiglu ? 4 : 8;
    const int chunks = K / 8;
    const uint4* a4 = reinterpret_cast<const uint4*>(a);
    const uint4* b4 = reinterpret_cast<const uint4*>(b);
    auto apply = [&](const uint4& wa, const uint4& wb, int c) {
      float fa[8], fb[8];
      const T* ea = reinterpret_cast<const T*>(&wa);
      const T* eb = reinterpret_cast<const T*>(&wb);
#pragma unroll
      for (int i = 0; i < 8; ++i) fa[i] = to_float(ea[i]), fb[i] = kSwiglu ? to_float(eb[i]) : 0.f;
#pragma unroll
      for (int m = 0; m < kMoeTileRows; ++m) {
        if (!live[m]) continue;
        float fx[8];
        detail::load8(xr[m] + int64_t(c) * 8, fx);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          acc0[m] = fmaf(fa[i], fx[i], acc0[m]);
          if constexpr (kSwiglu) acc1[m] = fmaf(fb[i], fx[i], acc1[m]);
        }
      }
    };
    const uint4 zero = make_uint4(0, 0, 0, 0);
    for (int base = lane; base < chunks; base += 32 * kUnroll) {
      uint4 wa[kUnroll], wb[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int c = base + 32 * u;
        wa[u] = c < chunks ? __ldcs(a4 + c) : zero;
        if constexpr (kSwiglu) wb[u] = c < chunks ? __ldcs(b4 + c) : zero;
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int c = base + 32 * u;
        if (c < chunks) apply(wa[u], kSwiglu ? wb[u] : wa[u], c);
      }
    }
  } else {
    for (int c = lane; c < K; c += 32) {
      const float fa = to_float(a[c]);
      const float fb = kSwiglu ? to_float(b[c]) : 0.f;
#pragma unroll
      for (int m = 0; m < kMoeTileRows; ++m) {
        if (!live[m]) continue;
        const float fx = to_float(xr[m][c]);
        acc0[m] = fmaf(fa, fx, acc0[m]);
        if constexpr (kSwiglu) acc1[m] = fmaf(fb, fx, acc1[m]);
      }
    }
  }
#pragma unroll
  for (int m = 0; m < kMoeTileRows; ++m) {
    acc0[m] = warp_sum(acc0[m]);
    if constexpr (kSwiglu) acc1[m] = warp_sum(acc1[m]);
  }
  if (lane == 0) {
#pragma unroll
    for (int m = 0; m < kMoeTileRows; ++m) {
      if (!live[m]) continue;
      const float v = kSwiglu ? acc0[m] / (1.f + expf(-acc0[m])) * acc1[m] : acc0[m];
      y[(row0 + m) * N + n] = from_float<T>(v);
    }
  }
}

// ---- the tensor-core grouped GEMM ------------------------------------------------------------
// One CTA per (block of up to kMoeBlockTiles tiles of one expert, slice of outputs): C[w, r] =
// W_e[w, :] . X[r, :] with mma.sync m16n8k16, the weights as the 16-row A operand and the block's
// 64 token rows as B (flat_gemm.cu's orientation: a block with one tile fills one n8 column of the
// mma and skips the rest). 4 warps; each owns two m16 weight tiles against all 64 rows: SwiGLU
// puts a feature's gate row in the first and its up row in the second, so silu(g) * u is formed in
// registers; the plain product takes 32 consecutive rows. K streams through shared memory in
// slices of kMmaBK, kMmaStages deep (cp.async), rows of 128 bytes with 16-byte chunks XOR-swizzled
// by the row so that ldmatrix's eight row addresses hit eight different bank groups.
constexpr int kMmaThreads = 128;
constexpr int kMmaRows = kMoeTileRows * kMoeBlockTiles;  // 64 token rows
constexpr int kMmaWRows = 128;                           // weight rows per CTA (SwiGLU: 64 gate + 64 up)
constexpr int kMmaBK = 64;
constexpr int kMmaStages = 3;
constexpr unsigned kMmaWBytes = kMmaWRows * kMmaBK * 2;  // 16 KB
constexpr unsigned kMmaXBytes = kMmaRows * kMmaBK * 2;   // 8 KB
constexpr unsigned kMmaStageBytes = kMmaWBytes + kMmaXBytes;
constexpr size_t kMmaSmemBytes = size_t(kMmaStages) * kMmaStageBytes;  // 72 KB

// Byte offset of 16-byte chunk c (0..7) of row r in a tile of 128-byte rows.
__device__ __forceinline__ unsigned mma_swizzle(int r, int c) { return unsigned(r * 128 + ((c ^ (r & 7)) << 4)); }

template <class T, bool kSwiglu, bool kGather>
__global__ void __launch_bounds__(kMmaThreads)
    moe_grouped_mma_kernel(const T* __restrict__ x, const T* __restrict__ w0, const T* __restrict__ w1,
                           T* __restrict__ y, int K, int N, int tiles, const int32_t* __restrict__ tile_expert,
                           const int32_t* __restrict__ row_token, const int32_t* __restrict__ block_tile) {
  extern __shared__ __align__(128) unsigned char mma_smem[];
  const int t0 = block_tile[blockIdx.x];
  if (t0 < 0) return;  // past the step's last block
  const int e = tile_expert[t0];
  int block_tiles = 1;
  while (block_tiles < kMoeBlockTiles && t0 + block_tiles < tiles && tile_expert[t0 + block_tiles] == e) ++block_tiles;
  const int rows = block_tiles * kMoeTileRows;
  const int64_t row0 = int64_t(t0) * kMoeTileRows;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  // SwiGLU: N features, this CTA's 64 from f0; plain: N output rows, this CTA's 128 from f0.
  const int f0 = blockIdx.y * (kSwiglu ? kMmaWRows / 2 : kMmaWRows);

  // Loads: thread tid copies chunk tid % 8 of weight rows tid / 8 + 16 i (i < 8) and of token rows
  // tid / 8 + 16 i (i < 4) every stage.
  const int ld_chunk = tid & 7, ld_row = tid >> 3;
  const T* w_src[kMmaWRows / 16];
#pragma unroll
  for (int i = 0; i < kMmaWRows / 16; ++i) {
    const int r = ld_row + 16 * i;
    if constexpr (kSwiglu) {
      const int f = min(f0 + (r & 63), N - 1);  // features past N load real rows, never stored
      w_src[i] = (r < 64 ? w0 : w1) + (int64_t(e) * N + f) * K;
    } else {
      w_src[i] = w0 + (int64_t(e) * N + min(f0 + r, N - 1)) * K;
    }
  }
  const T* x_src[kMmaRows / 16];
  bool x_live[kMmaRows / 16];
#pragma unroll
  for (int i = 0; i < kMmaRows / 16; ++i) {
    const int r = ld_row + 16 * i;
    const int tok = r < rows ? row_token[row0 + r] : -1;
    x_live[i] = tok >= 0;  // padding rows are zero-filled without a read
    x_src[i] = x + (kGather ? int64_t(tok < 0 ? 0 : tok) : row0 + r) * K;
  }
  const int k_tiles = (K + kMmaBK - 1) / kMmaBK;
  auto load = [&](int stage, int kt) {
    unsigned char* w_tile = mma_smem + stage * kMmaStageBytes;
    unsigned char* x_tile = w_tile + kMmaWBytes;
    const int k = kt * kMmaBK + ld_chunk * 8;
    const bool in_k = k < K;  // K is a multiple of 8: a chunk is wholly in or out
#pragma unroll
    for (int i = 0; i < kMmaWRows / 16; ++i)
      detail::cp_async16_zfill(w_tile + mma_swizzle(ld_row + 16 * i, ld_chunk), w_src[i] + (in_k ? k : 0), in_k);
#pragma unroll
    for (int i = 0; i < kMmaRows / 16; ++i)
      detail::cp_async16_zfill(x_tile + mma_swizzle(ld_row + 16 * i, ld_chunk), x_src[i] + (in_k ? k : 0),
                               in_k && x_live[i]);
  };

  float acc[2][kMmaRows / 8][4] = {};
  // The first weight row of each of this warp's two m16 tiles within the CTA's 128.
  const int a_row[2] = {kSwiglu ? 16 * warp : 32 * warp, kSwiglu ? 64 + 16 * warp : 32 * warp + 16};
  const int n_pairs = (rows + 15) / 16;  // pairs of n8 tiles holding rows (the rest are skipped)

#pragma unroll
  for (int s = 0; s < kMmaStages - 1; ++s) {
    if (s < k_tiles) load(s, s);
    detail::cp_async_commit();
  }
  for (int kt = 0; kt < k_tiles; ++kt) {
    detail::cp_async_wait_group<kMmaStages - 2>();
    __syncthreads();  // stage kt landed for every thread; stage kt - 1 is free for the next load
    if (kt + kMmaStages - 1 < k_tiles) load((kt + kMmaStages - 1) % kMmaStages, kt + kMmaStages - 1);
    detail::cp_async_commit();
    const unsigned char* w_tile = mma_smem + (kt % kMmaStages) * kMmaStageBytes;
    const unsigned char* x_tile = w_tile + kMmaWBytes;
#pragma unroll
    for (int kk = 0; kk < kMmaBK / 16; ++kk) {
      uint32_t a[2][4];
#pragma unroll
      for (int i = 0; i < 2; ++i)
        detail::ldmatrix_x4(a[i], detail::smem_addr(w_tile + mma_swizzle(a_row[i] + (lane & 15), 2 * kk + (lane >> 4))));
#pragma unroll
      for (int p = 0; p < kMmaRows / 16; ++p) {
        if (p >= n_pairs) break;
        uint32_t b[4];  // n8 tiles 2p (b[0], b[1]) and 2p + 1 (b[2], b[3])
        detail::ldmatrix_x4(
            b, detail::smem_addr(x_tile + mma_swizzle(16 * p + (lane & 7) + ((lane >> 4) << 3), 2 * kk + ((lane >> 3) & 1))));
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          detail::mma16816<T>(acc[i][2 * p], a[i], b[0], b[1]);
          detail::mma16816<T>(acc[i][2 * p + 1], a[i], b[2], b[3]);
        }
      }
    }
  }
  detail::cp_async_wait_group<0>();

  // acc[i][nt][c]: weight row a_row[i] + g (+ 8 for c >= 2), token row 8 nt + 2 q (+ 1 for odd c).
  const int g = lane >> 2, q = lane & 3;
#pragma unroll
  for (int nt = 0; nt < kMmaRows / 8; ++nt) {
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int r = 8 * nt + 2 * q + (c & 1);
      if (r >= rows) continue;
      T* out = y + (row0 + r) * N;
      if constexpr (kSwiglu) {
        const int f = f0 + 16 * warp + g + (c >> 1) * 8;
        const float gate = acc[0][nt][c], up = acc[1][nt][c];
        if (f < N) out[f] = from_float<T>(gate / (1.f + expf(-gate)) * up);
      } else {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int n = f0 + a_row[i] + g + (c >> 1) * 8;
          if (n < N) out[n] = from_float<T>(acc[i][nt][c]);
        }
      }
    }
  }
}

// out[t] = sum_j weight_j y[row_j]: a CTA of kCombineThreads per slice of 8 * kCombineThreads columns
// (kVec: 8 columns a thread, 16-byte loads; else one) of one token, so that a decode step's few
// tokens still spread over several SMs and every thread's k loads are in flight together.
template <class T, bool kVec>
__global__ void __launch_bounds__(kCombineThreads)
    moe_combine_kernel(const T* __restrict__ y, int k, int N, const int32_t* __restrict__ pick_row,
                       const float* __restrict__ pick_weight, T* __restrict__ out) {
  detail::pdl_trigger();
  detail::pdl_wait();
  const int t = blockIdx.y;
  constexpr int kPer = kVec ? 8 : 1;
  const int i = (blockIdx.x * kCombineThreads + threadIdx.x) * kPer;
  if (i >= N) return;
  const int64_t p0 = int64_t(t) * k;
  float acc[kPer] = {};
  for (int j = 0; j < k; ++j) {
    const float w = pick_weight[p0 + j];
    const T* src = y + int64_t(pick_row[p0 + j]) * N + i;
    if constexpr (kVec) {
      float v[8];
      detail::load8(src, v);
#pragma unroll
      for (int q = 0; q < 8; ++q) acc[q] = fmaf(w, v[q], acc[q]);
    } else {
      acc[0] = fmaf(w, to_float(*src), acc[0]);
    }
  }
  if constexpr (kVec) {
    uint4 packed;
    T* e = reinterpret_cast<T*>(&packed);
#pragma unroll
    for (int q = 0; q < 8; ++q) e[q] = from_float<T>(acc[q]);
    *reinterpret_cast<uint4*>(out + int64_t(t) * N + i) = packed;
  } else {
    out[int64_t(t) * N + i] = from_float<T>(acc[0]);
  }
}

// One token on the CUDA cores: act[pick_row[j], f] = silu(gate_e[f] . x) * (up_e[f] . x), e the
// token's j-th expert. A warp per (feature, pick), gemv_ex's shape at one row of x: each pass has
// kOneUnroll 16-byte loads of both weight rows in flight per lane (a 2,048-wide row in one pass),
// so that the k experts' bytes stream as one GEMV's would rather than tile by tile.
constexpr int kOneWarps = 4;
constexpr int kOneUnroll = 8;
template <class T>
__global__ void __launch_bounds__(kOneWarps * 32)
    moe_swiglu_one_kernel(const T* __restrict__ x, const T* __restrict__ gate, const T* __restrict__ up,
                          T* __restrict__ y, int K, int N, const int32_t* __restrict__ pick_expert,
                          const int32_t* __restrict__ pick_row) {
  detail::pdl_trigger();
  detail::pdl_wait();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int f = blockIdx.x * kOneWarps + warp, j = blockIdx.y;
  if (f >= N) return;
  const int64_t row = int64_t(pick_expert[j]) * N + f;
  const uint4* g4 = reinterpret_cast<const uint4*>(gate + row * K);
  const uint4* u4 = reinterpret_cast<const uint4*>(up + row * K);
  const int chunks = K / 8;
  const uint4 zero = make_uint4(0, 0, 0, 0);
  float g = 0.f, u = 0.f;
  for (int base = lane; base < chunks; base += 32 * kOneUnroll) {
    uint4 wg[kOneUnroll], wu[kOneUnroll];
#pragma unroll
    for (int i = 0; i < kOneUnroll; ++i) {
      const int c = base + 32 * i;
      wg[i] = c < chunks ? __ldcs(g4 + c) : zero;
      wu[i] = c < chunks ? __ldcs(u4 + c) : zero;
    }
#pragma unroll
    for (int i = 0; i < kOneUnroll; ++i) {
      const int c = base + 32 * i;
      if (c >= chunks) break;
      float fx[8];
      detail::load8(x + int64_t(c) * 8, fx);
      const T* eg = reinterpret_cast<const T*>(&wg[i]);
      const T* eu = reinterpret_cast<const T*>(&wu[i]);
#pragma unroll
      for (int q = 0; q < 8; ++q) {
        g = fmaf(to_float(eg[q]), fx[q], g);
        u = fmaf(to_float(eu[q]), fx[q], u);
      }
    }
  }
  g = warp_sum(g);
  u = warp_sum(u);
  if (lane == 0) y[int64_t(pick_row[j]) * N + f] = from_float<T>(g / (1.f + expf(-g)) * u);
}

// One token on the CUDA cores: out[0, c] = sum_j weight_j (act[pick_row[j]] . W_{e_j}[c]), the down
// products and the combine in one launch. A warp per output column, kDownWarps a CTA; each pass has
// U 16-byte chunks of the column's row of P experts in flight per lane (P x U = kDownLoads), so that
// a decode step's 8 rows of 1.5 KB (Qwen3-30B-A3B) stream together rather than one after the other.
// 8 loads a lane and 8 warps a CTA measured faster than 24 and 4 (docs/kernels/moe.md).
constexpr int kDownLoads = 8;
constexpr int kDownWarps = 8;
template <class T, int P>
__global__ void __launch_bounds__(kDownWarps * 32)
    moe_down_combine_one_kernel(const T* __restrict__ act, const T* __restrict__ w, T* __restrict__ out, int K, int N,
                                int k, const int32_t* __restrict__ pick_expert, const float* __restrict__ pick_weight,
                                const int32_t* __restrict__ pick_row) {
  constexpr int U = kDownLoads / P;
  detail::pdl_trigger();
  detail::pdl_wait();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int n = blockIdx.x * kDownWarps + warp;
  if (n >= N) return;
  const int chunks = K / 8;
  const uint4 zero = make_uint4(0, 0, 0, 0);
  float total = 0.f;  // this lane's share of sum_j weight_j (x_j . w_j)
  for (int j0 = 0; j0 < k; j0 += P) {
    const uint4* wr[P];
    const T* xr[P];
    float acc[P];
#pragma unroll
    for (int jj = 0; jj < P; ++jj) {
      const int j = min(j0 + jj, k - 1);  // past k: a real row, its loads predicated off
      wr[jj] = reinterpret_cast<const uint4*>(w + (int64_t(pick_expert[j]) * N + n) * K);
      xr[jj] = act + int64_t(pick_row[j]) * K;
      acc[jj] = 0.f;
    }
    for (int base = lane; base < chunks; base += 32 * U) {
      uint4 wv[P][U];
#pragma unroll
      for (int jj = 0; jj < P; ++jj)
#pragma unroll
        for (int i = 0; i < U; ++i) {
          const int c = base + 32 * i;
          wv[jj][i] = j0 + jj < k && c < chunks ? __ldcs(wr[jj] + c) : zero;
        }
#pragma unroll
      for (int jj = 0; jj < P; ++jj) {
        if (j0 + jj >= k) break;
#pragma unroll
        for (int i = 0; i < U; ++i) {
          const int c = base + 32 * i;
          if (c >= chunks) break;
          float fx[8];
          detail::load8(xr[jj] + int64_t(c) * 8, fx);
          const T* ew = reinterpret_cast<const T*>(&wv[jj][i]);
#pragma unroll
          for (int q = 0; q < 8; ++q) acc[jj] = fmaf(to_float(ew[q]), fx[q], acc[jj]);
        }
      }
    }
#pragma unroll
    for (int jj = 0; jj < P; ++jj)
      if (j0 + jj < k) total = fmaf(pick_weight[j0 + jj], acc[jj], total);
  }
  total = warp_sum(total);
  if (lane == 0) out[n] = from_float<T>(total);
}

void check_routing(const MoeRouting& r, const char* what) {
  check(r.pick_expert != nullptr && r.pick_weight != nullptr && r.pick_row != nullptr && r.row_token != nullptr &&
            r.tile_expert != nullptr && r.block_tile != nullptr,
        "{}: a routing buffer is null", what);
}

template <bool kSwiglu, bool kGather>
void launch_grouped(const void* x, const void* w0, const void* w1, void* y, int K, int N, int n_experts, int n,
                    int k, const MoeRouting& r, DType dtype, cudaStream_t stream, const char* what) {
  check(x != nullptr && w0 != nullptr && (!kSwiglu || w1 != nullptr) && y != nullptr, "{}: null pointer", what);
  check(K > 0 && N > 0 && n_experts > 0 && n > 0 && k > 0, "{}: K = {}, N = {}, experts = {}, tokens = {}, "
        "k = {} must be positive", what, K, N, n_experts, n, k);
  check_routing(r, what);
  const MoeRoutingSizes s = moe_routing_sizes(n, k, n_experts);
  const bool aligned = K % 8 == 0 && detail::aligned16(x) && detail::aligned16(w0) && (!kSwiglu || detail::aligned16(w1));
  if (aligned && moe_use_tensor_cores(n)) {
    const int per_cta = kSwiglu ? kMmaWRows / 2 : kMmaWRows;
    const dim3 grid(static_cast<unsigned>(s.blocks), static_cast<unsigned>((N + per_cta - 1) / per_cta));
    detail::dispatch_dtype(dtype, [&](auto tag) {
      using T = decltype(tag);
      auto* kernel = moe_grouped_mma_kernel<T, kSwiglu, kGather>;
      once_per_device(reinterpret_cast<const void*>(kernel), [&] {
        detail::cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                static_cast<int>(kMmaSmemBytes)),
                           "moe_grouped: cudaFuncSetAttribute");
      });
      kernel<<<grid, kMmaThreads, kMmaSmemBytes, stream>>>(
          static_cast<const T*>(x), static_cast<const T*>(w0), static_cast<const T*>(w1), static_cast<T*>(y), K, N,
          static_cast<int>(s.tiles), r.tile_expert, r.row_token, r.block_tile);
    });
    check_launch(what);
    return;
  }
  if (kSwiglu && kGather && aligned && n == 1) {
    const dim3 grid(static_cast<unsigned>((N + kOneWarps - 1) / kOneWarps), static_cast<unsigned>(k));
    const detail::LaunchConfig config(grid, dim3(kOneWarps * 32), 0, stream, programmatic_launch_enabled());
    detail::dispatch_dtype(dtype, [&](auto tag) {
      using T = decltype(tag);
      detail::cuda_check(cudaLaunchKernelEx(config.get(), moe_swiglu_one_kernel<T>, static_cast<const T*>(x),
                                            static_cast<const T*>(w0), static_cast<const T*>(w1), static_cast<T*>(y),
                                            K, N, static_cast<const int32_t*>(r.pick_expert),
                                            static_cast<const int32_t*>(r.pick_row)),
                         "cudaLaunchKernelEx(moe_swiglu_one)");
    });
    check_launch(what);
    return;
  }
  const dim3 grid(static_cast<unsigned>(s.tiles), static_cast<unsigned>((N + kGroupedWarps - 1) / kGroupedWarps));
  const detail::LaunchConfig config(grid, dim3(kGroupedWarps * 32), 0, stream, programmatic_launch_enabled());
  detail::dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    auto* kernel = aligned ? moe_grouped_kernel<T, kSwiglu, kGather, true> : moe_grouped_kernel<T, kSwiglu, kGather, false>;
    detail::cuda_check(cudaLaunchKernelEx(config.get(), kernel, static_cast<const T*>(x), static_cast<const T*>(w0),
                                          static_cast<const T*>(w1), static_cast<T*>(y), K, N,
                                          static_cast<const int32_t*>(r.tile_expert),
                                          static_cast<const int32_t*>(r.row_token)),
                       "cudaLaunchKernelEx(moe_grouped)");
  });
  check_launch(what);
}

}  // namespace

MoeRoutingSizes moe_routing_sizes(int tokens, int k, int n_experts) {
  check(tokens > 0 && k > 0 && n_experts > 0, "moe_routing_sizes: tokens {}, k {}, experts {} must be positive", tokens,
        k, n_experts);
  MoeRoutingSizes s;
  s.picks = int64_t(tokens) * k;
  const int64_t chosen = std::min<int64_t>(n_experts, s.picks);
  s.rows = (s.picks + chosen * (kMoeTileRows - 1) + kMoeTileRows - 1) / kMoeTileRows * kMoeTileRows;
  s.tiles = s.rows / kMoeTileRows;
  s.blocks = s.tiles / kMoeBlockTiles + chosen;
  return s;
}

bool moe_use_tensor_cores(int n) {
  switch (current_kernel_options().moe_path) {
    case MoePath::Mma: return true;
    case MoePath::Core: return false;
    case MoePath::Auto: break;
  }
  // Qwen3-30B-A3B on an H100 (docs/performance-log.md, MoE: the tensor-core grouped GEMM): the
  // CUDA cores led by 2% at one token, the tensor cores by 3% at 8 and 1.6x at 64.
  return n >= 2;
}

void moe_route(const float* logits, int n, int n_experts, int k, bool normalize, const MoeRouting& r,
               cudaStream_t stream) {
  check(logits != nullptr, "moe_route: null logits");
  check_routing(r, "moe_route");
  check(n > 0 && n_experts > 0 && n_experts <= 1024 && k > 0 && k <= 32 && k <= n_experts,
        "moe_route: n = {}, experts = {} (at most 1024), k = {} (at most 32 and the experts) out of range", n,
        n_experts, k);
  const detail::LaunchConfig config(dim3((n + kRouteWarps - 1) / kRouteWarps), dim3(kRouteWarps * 32), 0, stream,
                                    programmatic_launch_enabled());
  with_route_slots(n_experts, [&](auto slots) {
    detail::cuda_check(cudaLaunchKernelEx(config.get(), moe_route_kernel<decltype(slots)::value>, logits, n, n_experts,
                                          k, normalize, r, moe_routing_sizes(n, k, n_experts).blocks),
                       "cudaLaunchKernelEx(moe_route)");
  });
  check_launch("moe_route");
}

bool moe_route_one_fits(const void* x, const void* router, int H) {
  return H % 8 == 0 && detail::aligned16(x) && detail::aligned16(router);
}

void moe_route_one(const void* x, const void* router, float* logits, unsigned* arrivals, int H, int n_experts, int k,
                   bool normalize, const MoeRouting& r, DType dtype, cudaStream_t stream) {
  check(x != nullptr && router != nullptr && logits != nullptr && arrivals != nullptr, "moe_route_one: null pointer");
  check_routing(r, "moe_route_one");
  check(n_experts > 0 && n_experts <= 1024 && k > 0 && k <= 32 && k <= n_experts,
        "moe_route_one: experts = {} (at most 1024), k = {} (at most 32 and the experts) out of range", n_experts, k);
  check(moe_route_one_fits(x, router, H), "moe_route_one: H = {} must be a multiple of 8 with 16-byte aligned rows", H);
  const detail::LaunchConfig config(dim3((n_experts + kRouterWarps - 1) / kRouterWarps), dim3(kRouterWarps * 32), 0,
                                    stream, programmatic_launch_enabled());
  detail::dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    with_route_slots(n_experts, [&](auto slots) {
      detail::cuda_check(cudaLaunchKernelEx(config.get(), moe_route_one_kernel<T, decltype(slots)::value>,
                                            static_cast<const T*>(x), static_cast<const T*>(router), H, n_experts, k,
                                            normalize, logits, arrivals, r, moe_routing_sizes(1, k, n_experts).blocks),
                         "cudaLaunchKernelEx(moe_route_one)");
    });
  });
  check_launch("moe_route_one");
}

void moe_align(int n, int k, int n_experts, const MoeRouting& r, cudaStream_t stream) {
  check_routing(r, "moe_align");
  check(n > 0 && n_experts > 0 && n_experts <= 1024 && k > 0,
        "moe_align: n = {}, experts = {} (at most 1024), k = {} out of range", n, n_experts, k);
  if (n == 1) return;  // moe_route aligned the one token's picks
  const MoeRoutingSizes s = moe_routing_sizes(n, k, n_experts);
  const size_t smem = (4 * size_t(n_experts) + 2) * sizeof(int32_t);
  const detail::LaunchConfig config(dim3(1), dim3(kAlignThreads), smem, stream, programmatic_launch_enabled());
  detail::cuda_check(cudaLaunchKernelEx(config.get(), moe_align_kernel, static_cast<const int32_t*>(r.pick_expert),
                                        n * k, k, n_experts, s.rows, s.tiles, s.blocks, r.pick_row, r.row_token,
                                        r.tile_expert, r.block_tile),
                     "cudaLaunchKernelEx(moe_align)");
  check_launch("moe_align");
}

void moe_grouped_swiglu(const void* x, const void* gate, const void* up, void* y, int K, int N, int n_experts, int n,
                        int k, const MoeRouting& r, DType dtype, cudaStream_t stream) {
  launch_grouped<true, true>(x, gate, up, y, K, N, n_experts, n, k, r, dtype, stream, "moe_grouped_swiglu");
}

void moe_grouped_linear(const void* x, const void* w, void* y, int K, int N, int n_experts, int n, int k,
                        const MoeRouting& r, DType dtype, cudaStream_t stream) {
  launch_grouped<false, false>(x, w, nullptr, y, K, N, n_experts, n, k, r, dtype, stream, "moe_grouped_linear");
}

void moe_combine(const void* y, int n, int k, int N, const MoeRouting& r, void* out, DType dtype,
                 cudaStream_t stream) {
  check(y != nullptr && out != nullptr, "moe_combine: null pointer");
  check_routing(r, "moe_combine");
  check(n > 0 && k > 0 && N > 0, "moe_combine: n = {}, k = {}, N = {} must be positive", n, k, N);
  const bool vec = N % 8 == 0 && detail::aligned16(y) && detail::aligned16(out);
  const int per_cta = kCombineThreads * (vec ? 8 : 1);
  const detail::LaunchConfig config(dim3(static_cast<unsigned>((N + per_cta - 1) / per_cta), static_cast<unsigned>(n)),
                                    dim3(kCombineThreads), 0, stream, programmatic_launch_enabled());
  detail::dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    auto* kernel = vec ? moe_combine_kernel<T, true> : moe_combine_kernel<T, false>;
    detail::cuda_check(cudaLaunchKernelEx(config.get(), kernel, static_cast<const T*>(y), k, N,
                                          static_cast<const int32_t*>(r.pick_row),
                                          static_cast<const float*>(r.pick_weight), static_cast<T*>(out)),
                       "cudaLaunchKernelEx(moe_combine)");
  });
  check_launch("moe_combine");
}

void moe_down_combine(const void* act, const void* w, void* down, void* out, int K, int N, int n_experts, int n,
                      int k, const MoeRouting& r, DType dtype, cudaStream_t stream) {
  const bool fused = n == 1 && !moe_use_tensor_cores(n) && K % 8 == 0 && detail::aligned16(act) &&
                     detail::aligned16(w);
  if (!fused) {
    moe_grouped_linear(act, w, down, K, N, n_experts, n, k, r, dtype, stream);
    moe_combine(down, n, k, N, r, out, dtype, stream);
    return;
  }
  check(out != nullptr && K > 0 && N > 0 && k > 0, "moe_down_combine: null output or K = {}, N = {}, k = {}", K, N, k);
  check_routing(r, "moe_down_combine");
  const detail::LaunchConfig config(dim3(static_cast<unsigned>((N + kDownWarps - 1) / kDownWarps)),
                                    dim3(kDownWarps * 32), 0, stream, programmatic_launch_enabled());
  detail::dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    // As many picks a pass as k needs (up to 8), the rest of the kDownLoads a lane along K.
    auto* kernel = k <= 2 ? moe_down_combine_one_kernel<T, 2>
                 : k <= 4 ? moe_down_combine_one_kernel<T, 4>
                          : moe_down_combine_one_kernel<T, 8>;
    detail::cuda_check(cudaLaunchKernelEx(config.get(), kernel, static_cast<const T*>(act), static_cast<const T*>(w),
                                          static_cast<T*>(out), K, N, k, static_cast<const int32_t*>(r.pick_expert),
                                          static_cast<const float*>(r.pick_weight),
                                          static_cast<const int32_t*>(r.pick_row)),
                       "cudaLaunchKernelEx(moe_down_combine)");
  });
  check_launch("moe_down_combine");
}

}  // namespace fdpp::cuda
