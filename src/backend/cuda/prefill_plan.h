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

// Tile configurations (prefill_attention.cu is templated on one; the launcher picks it at run
// time by index, 0 = the default). A CTA owns bq = 16 x warps x m_tiles query rows of one head and
// walks bk-key tiles through `stages` shared K/V buffers; each warp owns 16 x m_tiles rows.
//   m64n64 (default, the first kernel): 4 warps x 16 rows, 64-key tiles, 2 stages, Q fragments in
//     registers. D = 128: Q 32 + O 64 + S 32 registers per thread; shared Q 16 KB + K/V 2 x 32 KB =
//     80 KB: two CTAs (8 warps) per SM.
//   m128n64w8: 8 warps x 16 rows, 64-key tiles, 2 stages: each K/V tile loaded once serves 128
//     query rows instead of 64 (half the cp.async and table traffic per flop); shared 32 + 64 = 96
//     KB, one CTA of 8 warps per SM (255 registers available, so no pressure).
//   m128n64w8s3: the same with 3 stages (32 + 96 = 128 KB): two tiles in flight while one computes.
//   m128n32w4: FlashAttention-2's 32-rows-per-warp layout (its sm86/89 causal D = 128 choice):
//     4 warps x 32 rows (two m16 row blocks per warp), 32-key tiles, Q re-read from shared per
//     k-step: every K (B) fragment feeds two mma instead of one and every V fragment likewise,
//     halving ldmatrix traffic per mma, the limit of the 16-row warps. Q 32 + K/V 2 x 16 = 64 KB,
//     2 CTAs/SM (255 registers, O 128 + S 32).
//   wg128n128 (sm_90a only): warpgroup MMA (wgmma). 2 warpgroups x 64 rows, 128-key tiles, 2 stages;
//     S = Q K^T with Q and K read by the tensor cores straight from 128-byte-swizzled shared tiles,
//     O += P V with P from registers and V from shared memory. D = 64 or 128 with a 16-bit cache;
//     S 64 + O 64 fp32 registers per thread; shared Q 32 + K/V 2 x 64 = 160 KB (D = 128), one CTA
//     of 8 warps per SM.
//   wg128n128ws (sm_90a only): wg128n128's tiles and products in FlashAttention-3's warp-specialized
//     form (ws): one more warpgroup, the producer (128 threads, registers lowered by setmaxnreg),
//     only streams K/V tiles into the stages with cp.async and per-stage full/empty mbarriers (K and V
//     each its own, K streamed a tile ahead of V); the
//     8 compute warps (2 consumer warpgroups of 64 rows, registers raised) take turns on the tensor
//     cores (ping-pong on named barriers) while the other runs its softmax, each overlapping its
//     softmax with its previous tile's P V product. 384 threads; bq stays
//     16 x warps = 128 (the producer owns no rows). Same shared memory as wg128n128;
//   wg128n128wst (sm_90a only; the engine's default there): wg128n128ws with a TMA producer (tma):
//     one thread per page of the tile issues a cp.async.bulk.tensor box per 64-dim column block (a
//     tensor map over each cache, kept per set of inputs), looked up once per page; the producer's 128 threads copy row by row only
//     the pages a tile sees in part (its last visible key, a window's first) and zero-fill the pages
//     it sees nothing of. Pages of 8 keys or more (the box lands on whole 8-row swizzle atoms); a
//     cache of smaller blocks takes wg128n128ws instead (config_fits_cache). Same shared memory.
//   wg128n128wst3v (sm_90a only): wg128n128wst with three V stages (v_stages; 192 KB at D = 128),
//     the producer loading each tile's V with its K: V then arrives three turns before its P V
//     product instead of two (the consumers of wg128n128wst stalled most on V's full barrier).
// Tried and left out because ptxas spills them (sm_90a, nvcc 13.0, D = 128): m128n64w4 (FA2's
// Hopper/Ampere D = 128 forward tile: O 128 + S 64 registers, 348 bytes of spill stores) and
// m128n128w8 (8 x 16 rows, 128-key tiles: 48 bytes).
struct TileConfig {
  const char* name;
  int warps;    // 4 or 8
  int m_tiles;  // 16-row blocks per warp: 1 (Q kept in registers) or 2 (Q re-read from shared)
  int bk;       // keys per tile
  int stages;   // K/V shared buffers (cp.async pipeline depth)
  int min_ctas; // __launch_bounds__ min blocks per SM
  bool wgmma = false;  // warpgroup MMA (prefill_attention.cu's wgmma kernels; sm_90a)
  bool ws = false;     // warp-specialized (wgmma only): a producer warpgroup besides the `warps`
                       // compute warps, which alone own query rows
  bool tma = false;    // (ws only) the producer loads whole KV pages with TMA (tensor maps)
  const char* cp_async_twin = nullptr;  // (tma only) the same tiles with a cp.async producer, for
                                        // caches of blocks TMA cannot take (config_fits_cache)
  int v_stages = 0;  // (ws only) V buffers, when more than `stages` (K's): the producer then loads a
                     // tile's V with its K instead of a tile later
};
inline constexpr TileConfig kConfigs[] = {
    {"m64n64", 4, 1, 64, 2, 2},
    {"m128n64w8", 8, 1, 64, 2, 1},
    {"m128n64w8s3", 8, 1, 64, 3, 1},
    {"m128n32w4", 4, 2, 32, 2, 2},
    {"wg128n128", 8, 1, 128, 2, 1, true},
    {"wg128n128ws", 8, 1, 128, 2, 1, true, true},
    {"wg128n128wst", 8, 1, 128, 2, 1, true, true, true, "wg128n128ws"},
    {"wg128n128wst3v", 8, 1, 128, 2, 1, true, true, true, "wg128n128ws", 3},
};
inline constexpr int kNumConfigs = static_cast<int>(sizeof(kConfigs) / sizeof(kConfigs[0]));
constexpr int config_bq(const TileConfig& c) { return 16 * c.warps * c.m_tiles; }
constexpr int config_v_stages(const TileConfig& c) { return c.v_stages > c.stages ? c.v_stages : c.stages; }
// Producer warpgroup of a warp-specialized configuration: 128 threads that load and own no rows.
constexpr int kProducerThreads = 128;
constexpr int config_threads(const TileConfig& c) { return 32 * c.warps + (c.ws ? kProducerThreads : 0); }
// Only the wgmma kernel has a warp-specialized twin, and only that one a TMA producer.
constexpr bool configs_consistent() {
  for (const TileConfig& c : kConfigs)
    if ((c.ws && !c.wgmma) || (c.tma && !c.ws)) return false;
  return true;
}
static_assert(configs_consistent(), "kConfigs: ws needs wgmma, tma needs ws");
constexpr bool v_stages_consistent() {
  for (const TileConfig& c : kConfigs)
    if (c.v_stages != 0 && (!c.ws || c.v_stages <= c.stages)) return false;
  return true;
}
static_assert(v_stages_consistent(), "kConfigs: v_stages only on ws configurations, and more than stages");

// The TMA producer loads a KV page (one block's keys of one kv head) as boxes of min(block_size,
// 128) rows into 128-byte-swizzled tiles: a box must start on an 8-row (1 KB) swizzle atom, so
// blocks of at least 8 keys (block sizes are powers of two). Either cache layout serves (the tensor
// map has the layout's strides).
constexpr int kTmaMinBlockSize = 8;
constexpr bool config_fits_cache(const TileConfig& c, int block_size) {
  return !c.tma || block_size >= kTmaMinBlockSize;
}
constexpr bool same_name(const char* a, const char* b) {
  for (; *a != 0 && *a == *b; ++a, ++b) {
  }
  return *a == *b;
}
// What runs configuration i over a cache it does not fit (config_fits_cache): a TMA configuration's
// named cp.async twin, else i itself (-1: the twin is not in the table, which cache_fallbacks_fit
// rules out at compile time).
constexpr int config_cache_fallback(int i) {
  const TileConfig& c = kConfigs[i];
  if (!c.tma) return i;
  for (int j = 0; j < kNumConfigs; ++j)
    if (c.cp_async_twin != nullptr && same_name(kConfigs[j].name, c.cp_async_twin)) return j;
  return -1;
}
constexpr bool cache_fallbacks_fit() {
  for (int i = 0; i < kNumConfigs; ++i)
    if (config_cache_fallback(i) < 0 || !config_fits_cache(kConfigs[config_cache_fallback(i)], 1)) return false;
  return true;
}
static_assert(cache_fallbacks_fit(), "kConfigs: a TMA configuration needs a cp.async twin");

// The default configuration's numbers (index 0), kept by name for the callers that predate the
// table.
constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kBQ = 16 * kWarps;  // query rows per CTA
constexpr int kBK = 64;           // keys per tile
static_assert(kConfigs[0].warps == kWarps && config_bq(kConfigs[0]) == kBQ && kConfigs[0].bk == kBK);

// Shared memory of one CTA: Q [bq][D] 16-bit, K [stages][bk][D] and V [stages][bk][D] of the
// cache's element (kv_bytes: 2, or 1 for an e4m3 cache).
inline constexpr size_t smem_bytes(int head_dim, int bq = kBQ, int bk = kBK, int stages = 2, int kv_bytes = 2) {
  return size_t(bq) * head_dim * 2 + size_t(2 * stages * bk) * head_dim * kv_bytes;
}

// The same for a configuration, whose V may have more stages than K (TileConfig::v_stages).
inline constexpr size_t config_smem_bytes(const TileConfig& c, int head_dim, int kv_bytes = 2) {
  return size_t(config_bq(c)) * head_dim * 2 + size_t((c.stages + config_v_stages(c)) * c.bk) * head_dim * kv_bytes;
}

// Whether a configuration runs at a head dim: its shared memory within the 227 KB of an SM, and at
// head_dim 256 one 16-row block per warp (two would hold 256 fp32 accumulators of O per thread).
// At 256 Q is re-read from shared memory per k-step (its fragments would take 64 more registers):
// m64n64 (160 KB) and m128n64w8 (192 KB) run there, the others fall back to m64n64. An e4m3 cache
// (kv_bytes 1) halves the K/V buffers: m128n64w8s3 (160 KB) runs at 256 too.
// The wgmma kernels (wg128n128 and its warp-specialized twin) take D = 64 and 128 with a 16-bit
// cache (their rows are whole 64-element swizzle atoms; an e4m3 cache would need its bytes widened
// before the tensor cores read them).
inline constexpr bool config_fits(const TileConfig& c, int head_dim, int kv_bytes = 2) {
  if (c.wgmma) return (head_dim == 64 || head_dim == 128) && kv_bytes == 2;
  return smem_bytes(head_dim, config_bq(c), c.bk, c.stages, kv_bytes) <= 227 * 1024 &&
         (head_dim <= 128 || c.m_tiles == 1);
}

// Grid: x = query head, y = query tile counted from each chunk's heaviest (y = 0 is the chunk's
// last tile, the one that sees the most keys, so the long CTAs start first), z = chunk. Depends on
// host-known bounds only (graph-capturable); a CTA whose tile lies past its chunk's length exits.
struct Grid {
  unsigned x = 0, y = 0, z = 0;
};
inline Grid plan_grid(int chunks, int max_chunk_tokens, int n_heads, int bq = kBQ) {
  Grid g;
  g.x = static_cast<unsigned>(n_heads);
  g.y = static_cast<unsigned>((std::max(max_chunk_tokens, 1) + bq - 1) / bq);
  g.z = static_cast<unsigned>(chunks);
  return g;
}

// What one CTA does for chunk (start, n) at grid row y.
struct TileWork {
  int q0 = 0;                 // first query row (within the chunk) of the tile
  int rows = 0;               // query rows of the chunk in the tile (0: nothing to do)
  int key_end = 0;            // keys [0, key_end) are visible to some row; keys >= key_end are zero-filled
  int n_key_tiles = 0;        // ceil(key_end / bk)
  int first_masked_tile = 0;  // tiles below it are visible to every row of the tile (no mask)
  // Sliding window (apply_window; the masked kernels only): keys below key_begin are visible to no
  // row (zero-filled, never read: their blocks may have been given back), the walk starts at tile
  // first_key_tile, and keys below window_mask_end are hidden from some row (masked per row).
  int window = 0;
  int key_begin = 0;
  int first_key_tile = 0;
  int window_mask_end = 0;
};

// Worked example: start = 100, n = 150 (positions 100..249), kBQ = kBK = 64: 3 query tiles.
//   y = 0 -> tile 2: q0 = 128, rows 22 (positions 228..249), key_end = 250, 4 key tiles, the mask
//   starts at tile (100 + 128 + 1) / 64 = 3 (keys 192..255; keys 0..191 <= 228 are seen by all).
//   y = 2 -> tile 0: q0 = 0, rows 64 (positions 100..163), key_end = 164, 3 key tiles, mask from
//   tile 101 / 64 = 1 (keys 64..127 are not all <= 100).
// (bq, bk: the configuration's query rows per CTA and keys per tile.)
FDPP_PREFILL_HD TileWork tile_work(int start, int n, int y, int bq = kBQ, int bk = kBK) {
  TileWork w;
  const int tiles = n > 0 ? (n + bq - 1) / bq : 0;
  const int t = tiles - 1 - y;
  if (t < 0) return w;
  w.q0 = t * bq;
  w.rows = n - w.q0 < bq ? n - w.q0 : bq;
  w.key_end = start + w.q0 + w.rows;
  w.n_key_tiles = (w.key_end + bk - 1) / bk;
  const int fm = (start + w.q0 + 1) / bk;  // tile kt is unmasked iff kt * bk + bk - 1 <= start + q0
  w.first_masked_tile = fm < w.n_key_tiles ? fm : w.n_key_tiles;
  return w;
}

// The last key row r (0 .. bq - 1) of the tile may see. Rows past the chunk (r >= rows) copy the
// last real row's limit: they are computed like it (every row has key 0, no empty softmax) and
// never written.
FDPP_PREFILL_HD int row_key_limit(int start, const TileWork& w, int r) {
  return start + w.q0 + (r < w.rows ? r : w.rows - 1);
}

// Whether key `key` (a key of tile kt) contributes to row r: the kernel masks to -inf exactly the
// keys for which this is false, and only in tiles kt >= first_masked_tile (in earlier tiles every
// key is visible to every row, so the check is skipped there).
FDPP_PREFILL_HD bool key_visible(int start, const TileWork& w, int kt, int key, int r) {
  if (w.window > 0 && key <= row_key_limit(start, w, r) - w.window) return false;
  if (kt < w.first_masked_tile) return true;
  return key <= row_key_limit(start, w, r);
}

// A sliding window of `window` keys (0: none): row r sees keys (limit - window, limit] with limit
// its row_key_limit. The tile's first row sees the lowest keys, its last row the highest first key.
FDPP_PREFILL_HD void apply_window(int start, int window, int bk, TileWork& w) {
  if (window <= 0 || w.rows <= 0) return;
  w.window = window;
  const int first = row_key_limit(start, w, 0) - window + 1;
  w.key_begin = first > 0 ? first : 0;
  w.first_key_tile = w.key_begin / bk;
  const int last = row_key_limit(start, w, w.rows - 1) - window + 1;
  w.window_mask_end = last > 0 ? last : 0;
}

// The key tiles that the 64 rows r0 .. r0 + 63 of the tile (one wgmma warpgroup) compute, as one
// range: tiles kt0 + a .. kt0 + b - 1 of a walk of n tiles from kt0 (a = b = 0: none). A tile is
// computed where some of the rows are in the chunk, it starts at or below their last row's causal
// limit and (masked walks) ends above their first row's window start. The wgmma walks issue their
// products in straight-line kinds over the range (prefill_attention.cu, run_turns).
FDPP_PREFILL_HD void warpgroup_tile_range(int start, const TileWork& w, int r0, int bk, int kt0, int n, bool masked,
                                          int& a, int& b) {
  a = b = 0;
  if (r0 >= w.rows) return;
  const int lim = row_key_limit(start, w, r0 + 63);
  const int first = w.window > 0 ? row_key_limit(start, w, r0) - w.window + 1 : 0;
  const int lo = (masked && first > 0 ? first / bk : 0) - kt0, hi = lim / bk - kt0 + 1;
  a = lo > 0 ? lo : 0;
  b = hi < n ? hi : n;
  if (b <= a) a = b = 0;
}

// The range of (logit - a row's reference c), in natural-log units, that 16-bit P = e^(x - c)
// carries into the P.V mma: the caller's [a, b] intersected with 16-bit P's.
//   bf16 P has fp32's exponent range, so [a, b] (derived for fp32 in attention/unified_max.cpp)
//   holds as given.
//   fp16 P overflows above 65504 = e^11.09, so b <= 11.0 (e^11 = 59874). Below, fp16 goes
//   subnormal at 2^-14: the synchronized path has its largest P at 1 (= 2^0), so its P keep full
//   precision down to 2^-14 relative to the max; a largest P of at least 2^-3 (a >= -3 ln 2 =
//   -2.08) keeps the resolution within 8x of that.
// The kernel's asynchronized softmax keeps each row's largest P in [1, e^b] (its reference follows
// the row's maxima, prefill_attention.cu: softmax_scores), so only the top bounds it; the whole
// 13.1-nat fp16 window around one offline phi held too few rows of real text. phi and [a, b] still
// bound a row's first key tile, whose P is taken against phi in fp32.
constexpr float kF16MaxLogitRel = 11.0f;
constexpr float kF16MinLogitRel = -2.0794415f;  // -3 ln 2
inline void effective_range(bool fp16, float a, float b, float* lo, float* hi) {
  *lo = fp16 ? std::max(a, kF16MinLogitRel) : a;
  *hi = fp16 ? std::min(b, kF16MaxLogitRel) : b;
}

}  // namespace fdpp::cuda::prefill
