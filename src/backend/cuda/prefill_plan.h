// Tile plan of the tensor-core prefill attention (prefill_attention.cu): which query rows a CTA
// owns, which key tiles it walks, where the causal mask starts, and the unified-max range the
// kernel can honour with 16-bit P. Plain C++ usable on the host (tests check coverage and masks
// without a GPU) and on the device (the kernel calls the very same functions).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define FDPP_PREFILL_HD __host__ __device__ __forceinline__
#else
#define FDPP_PREFILL_HD inline
#endif

namespace fdpp::cuda::prefill {

// 4 warps, 16 query rows each (one m16n8k16 row block per warp): a CTA owns 64 query rows of one
// head and walks 64-key tiles. D = 128: Q frags 32 + O 64 + S 32 registers per thread, about 160
// in all, and 80 KB of shared memory (Q 16 KB + K, V double-buffered 4 x 16 KB): two CTAs per SM.
constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kBQ = 16 * kWarps;  // query rows per CTA
constexpr int kBK = 64;           // keys per tile

// Shared memory of one CTA: Q [kBQ][D], K [2][kBK][D], V [2][kBK][D], 16-bit.
inline constexpr size_t smem_bytes(int head_dim) { return size_t(kBQ + 4 * kBK) * head_dim * 2; }

// Grid: x = query head, y = query tile counted from each chunk's heaviest (y = 0 is the chunk's
// last tile, the one that sees the most keys, so the long CTAs start first), z = chunk. Depends on
// host-known bounds only (graph-capturable); a CTA whose tile lies past its chunk's length exits.
struct Grid {
  unsigned x = 0, y = 0, z = 0;
};
inline Grid plan_grid(int chunks, int max_chunk_tokens, int n_heads) {
  Grid g;
  g.x = static_cast<unsigned>(n_heads);
  g.y = static_cast<unsigned>((std::max(max_chunk_tokens, 1) + kBQ - 1) / kBQ);
  g.z = static_cast<unsigned>(chunks);
  return g;
}

// What one CTA does for chunk (start, n) at grid row y.
struct TileWork {
  int q0 = 0;                 // first query row (within the chunk) of the tile
  int rows = 0;               // query rows of the chunk in the tile (0: nothing to do)
  int key_end = 0;            // keys [0, key_end) are visible to some row; keys >= key_end are zero-filled
  int n_key_tiles = 0;        // ceil(key_end / kBK)
  int first_masked_tile = 0;  // tiles below it are visible to every row of the tile (no mask)
};

// Worked example: start = 100, n = 150 (positions 100..249), kBQ = kBK = 64: 3 query tiles.
//   y = 0 -> tile 2: q0 = 128, rows 22 (positions 228..249), key_end = 250, 4 key tiles, the mask
//   starts at tile (100 + 128 + 1) / 64 = 3 (keys 192..255; keys 0..191 <= 228 are seen by all).
//   y = 2 -> tile 0: q0 = 0, rows 64 (positions 100..163), key_end = 164, 3 key tiles, mask from
//   tile 101 / 64 = 1 (keys 64..127 are not all <= 100).
FDPP_PREFILL_HD TileWork tile_work(int start, int n, int y) {
  TileWork w;
  const int tiles = n > 0 ? (n + kBQ - 1) / kBQ : 0;
  const int t = tiles - 1 - y;
  if (t < 0) return w;
  w.q0 = t * kBQ;
  w.rows = n - w.q0 < kBQ ? n - w.q0 : kBQ;
  w.key_end = start + w.q0 + w.rows;
  w.n_key_tiles = (w.key_end + kBK - 1) / kBK;
  const int fm = (start + w.q0 + 1) / kBK;  // tile kt is unmasked iff kt * kBK + kBK - 1 <= start + q0
  w.first_masked_tile = fm < w.n_key_tiles ? fm : w.n_key_tiles;
  return w;
}

// The last key row r (0 .. kBQ - 1) of the tile may see. Rows past the chunk (r >= rows) copy the
// last real row's limit: they are computed like it (every row has key 0, no empty softmax) and
// never written.
FDPP_PREFILL_HD int row_key_limit(int start, const TileWork& w, int r) {
  return start + w.q0 + (r < w.rows ? r : w.rows - 1);
}

// Whether key `key` (a key of tile kt) contributes to row r: the kernel masks to -inf exactly the
// keys for which this is false, and only in tiles kt >= first_masked_tile (in earlier tiles every
// key is visible to every row, so the check is skipped there).
FDPP_PREFILL_HD bool key_visible(int start, const TileWork& w, int kt, int key, int r) {
  if (kt < w.first_masked_tile) return true;
  return key <= row_key_limit(start, w, r);
}

// The unified-max range the kernel applies, in natural-log units of (row max logit - phi): the
// caller's range intersected with what 16-bit P = e^(x - phi) can carry into the P.V mma.
//   bf16 P has fp32's exponent range, so [a, b] (derived for fp32 in attention/unified_max.cpp)
//   holds as given.
//   fp16 P overflows above 65504 = e^11.09, so b <= 11.0 (e^11 = 59874). Below, fp16 goes
//   subnormal at 2^-14: the synchronized path has its largest P at 1 (= 2^0), so its P keep full
//   precision down to 2^-14 relative to the max; requiring the unified path's largest P to be at
//   least 2^-3 (a >= -3 ln 2 = -2.08) keeps its resolution within 8x of that. The fp16 range is
//   13.1 nats wide: rows outside it fall back (exact, counted), so phi for fp16 prefill wants
//   calibrating to the row maxima of prefill.
// An empty intersection (lo > hi) sends every row to the fallback.
constexpr float kF16MaxLogitRel = 11.0f;
constexpr float kF16MinLogitRel = -2.0794415f;  // -3 ln 2
inline void effective_range(bool fp16, float a, float b, float* lo, float* hi) {
  *lo = fp16 ? std::max(a, kF16MinLogitRel) : a;
  *hi = fp16 ? std::min(b, kF16MaxLogitRel) : b;
}

}  // namespace fdpp::cuda::prefill
