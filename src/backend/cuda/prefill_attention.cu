// Causal prefill attention over the paged KV cache on tensor cores (FlashAttention-2 style,
// mma.sync m16n8k16 with ldmatrix; and warpgroup MMA on sm_90a, below, plain and warp-specialized
// in FlashAttention-3's producer/consumer form, its producer on cp.async or on TMA by KV page), for
// a variable-length batch of chunks, with the asynchronized softmax (a shared reference per row
// instead of a running max: no rescale unless a tile's logits pass the reference by what 16-bit P
// can carry) or the synchronized online softmax (its ablation twin and its exact fallback).
//
// CTA = (query head, 64-row query tile of one chunk); 4 warps, 16 query rows each (prefill_plan.h
// has the tile plan and the worked numbers). Per CTA:
//   * Q tile -> shared (cp.async) -> A fragments in registers once (ldmatrix), kept for the whole
//     walk (and the fallback's second walk).
//   * Key tiles 0 .. n_key_tiles - 1 through two shared buffers: tile kt + 1 is in flight
//     (cp.async, one 16-byte copy per 8 elements, block table looked up once per key row) while
//     tile kt is computed. Keys past the tile's last visible key are zero-filled: their P is 0, and
//     0 * V must not meet NaN garbage.
//   * S = Q K^T (fp32 accumulators, 16 x 64 per warp), times scale * log2(e); the causal mask only
//     in tiles that reach past the tile's first query position.
//   * sync: running max m per row (quad shuffle), P = 2^(S - m), O and l rescaled by 2^(m_old - m).
//     async: P = 2^(S - c), l += P, O += P V with c the row's reference, set by its first tile and
//     raised (with one rescale) only by a tile whose max passes c by the effective range's top
//     (softmax_scores): one warp vote per tile where nothing passes.
//   * O += P V with P converted to the 16-bit type in registers (the S accumulator layout is the A
//     fragment layout of the next mma), V through ldmatrix.trans.
//   * async guard at the end: a row whose sum is not finite (a NaN or infinite logit) fails; if
//     any row of the CTA fails, the CTA adds the number of failing rows to *fallback_rows and
//     walks all its keys again with the synchronized softmax (every row of the tile is rewritten
//     by that walk).
//   * O / l staged through the (by then unused) Q buffer and stored with 16-byte writes.
// Shared memory rows (D 16-bit elements = 8 or 16 chunks of 16 bytes) are XOR-swizzled: chunk c of
// row r lives at chunk c ^ (r & 7), so the 8 rows an ldmatrix reads at one logical chunk hit 8
// different 4-bank groups (rows are 128 or 256 bytes: without the swizzle all 8 share one group).
//
// An e4m3 cache (KvQuant, kernels.h) is walked by the same kernel with KV = __nv_fp8_e4m3: K/V
// tiles hold the cache's bytes (rows of D bytes, cp.async as before) and become 16-bit B fragments
// in registers between ldmatrix and mma (mma_fragments.cuh: fp8_k_fragment, fp8_v_fragment). K's
// fragments come out with the dims of each 16 permuted, so Q is staged with its columns permuted
// the same way (q_fp8_k_order); V's give the output accumulators of each 16 dims as an even-dim and
// an odd-dim tile, put back in order where O is written. k_scale folds into the logit scale (so
// the softcap, the unified max and its guard see the true logits), v_scale into 1 / l.
#include <cuda.h>  // CUtensorMap and its enums only: the encoder comes through cudaGetDriverEntryPoint*

#include <cfloat>
#include <cmath>
#include <cstring>
#include <map>
#include <tuple>
#include <type_traits>
#include <utility>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kv_cache_layout.h"
#include "backend/cuda/mma_fragments.cuh"
#include "backend/cuda/per_device.h"
#include "backend/cuda/prefill_plan.h"
#include "backend/cuda/wgmma.cuh"

namespace fdpp::cuda {

namespace {

using detail::aligned16;
using detail::check_launch;
using detail::cp_async16;
using detail::cp_async_commit;
using detail::cp_async_wait_all;
using detail::cuda_check;
using detail::cp_async_wait_group;
using detail::ldmatrix_x4;
using detail::ldmatrix_x4_trans;
using detail::mma16816;
using detail::pack2;
using detail::smem_addr;

// The asynchronized softmax's numbers, log2 units of the scaled logits: the unified max phi2 and the
// range [lo2, hi2] around it where a row's max may lie for P = 2^(x - phi2) in fp32 (decode's guard
// range, attention/unified_max.h), and cap2: how far a logit may pass a row's reference for 16-bit
// P (prefill_plan.h: effective_range's top).
struct AsyncRefs {
  float phi2, lo2, hi2, cap2;
};

struct PrefillArgs {
  const void* qkv;
  const void* k_cache;
  const void* v_cache;
  const int32_t* block_tables;  // [chunks][max_blocks_per_seq]
  int max_blocks_per_seq;
  const int32_t* q_begin;  // device [chunks + 1], or null: one chunk of single_n rows from row 0
  const int32_t* starts;   // device [chunks], or null: single_start
  int single_start, single_n;
  int n_heads, n_kv_heads, group;
  KvCacheLayout kv;  // where the cache's rows are (kv_cache_layout.h)
  float scale_log2;  // scale * log2(e): S is kept in log2 units, P = 2^(...)
  bool async;
  AsyncRefs um;  // async: the unified max and the ranges around it (softmax_scores)
  unsigned long long* fallback_rows;
  void* out;
  // Masked kernels (kMasked): a sliding window of `window` keys per row, soft-capped logits
  // (softcap * tanh(x / softcap) of x = scale q.k); 0: off. scale: the raw logits' multiplier
  // (times k_scale with an e4m3 cache).
  int window;
  float softcap, scale;
  float v_scale;  // the output's multiplier: 1, or the e4m3 cache's v_scale
  // TMA configurations (TileConfig::tma): the tensor maps' dimension of a key in its block, 1 or 2
  // (the kv head is the other): the maps order their middle dimensions by stride (kv_tensor_map).
  int tma_key_dim;
};

// The TMA configurations' tensor maps over the K and V caches (kv_tensor_map), passed by value as
// one __grid_constant__ kernel parameter (64-byte aligned); zero and unread elsewhere.
struct KvTmaMaps {
  CUtensorMap k, v;
};

using detail::fast_exp2;

// Element offset of 16-byte chunk c of row r in a swizzled [rows][D] shared tile of E elements.
// Rows of 8 or 16 chunks: chunk c ^ (r & 7). Rows of 4 (D = 64 e4m3, 64 bytes, two rows per
// 128-byte line): chunk c ^ ((r >> 1) & 3), so 8 consecutive rows at one logical chunk still hit
// 8 different 4-bank groups (4 (r & 1) + chunk). Rows of 12 (D = 96, 192 bytes: row r starts at
// bank group 4 (r & 1)): chunks 0-7 as rows of 8; chunks 8-11 as rows of 4, 8 + ((c - 8) ^
// ((r >> 1) & 3)). Either way 8 consecutive rows at one chunk hit 8 different bank groups.
template <class E, int D>
__device__ __forceinline__ int swz(int r, int c) {
  constexpr int kShift = sizeof(E) == 1 ? 4 : 3;  // log2 of the elements per chunk
  constexpr int CH = D >> kShift;
  static_assert(sizeof(E) <= 2 && (CH % 8 == 0 || CH == 4 || CH == 12), "swizzle: rows of 4, 12 or 8k chunks");
  if constexpr (CH % 8 == 0) {
    return r * D + ((c ^ (r & 7)) << kShift);
  } else if constexpr (CH == 4) {
    return r * D + ((c ^ ((r >> 1) & 3)) << kShift);
  } else {
    const int pc = c < 8 ? c ^ (r & 7) : 8 + ((c - 8) ^ ((r >> 1) & 3));
    return r * D + (pc << kShift);
  }
}

using Fp8 = __nv_fp8_e4m3;  // the cache element of an e4m3 KV cache


// ---- one 16-row block's scores: masks and softmax (both kernels) ---------------------------------

// Soft-cap and masks of one 16-row block's S tile of key tile kt (bk keys; element e of n-tile j
// is row half e >> 1, key kt * bk + 8j + 2t + (e & 1)), in place on the raw logits. lim, low: the
// thread's two rows' last visible key and (kMasked) the key at or below which their window hides
// keys (-1: none). Causal masking only in tiles that reach past the tile's first query position.
template <bool kMasked, int NJ>
__device__ __forceinline__ void mask_scores(float (&s)[NJ][4], int kt, int bk, int t, const prefill::TileWork& w,
                                            const int (&lim)[2], const int (&low)[2], float softcap, float scale) {
  if constexpr (kMasked) {
    // Soft-capping of the raw logits, before the masks (a masked key stays -inf) and before any
    // max: the softmax, the unified max and its guard all see the capped logits.
    if (softcap > 0.f) {
      const float cap_in = scale / softcap, cap_out = softcap / scale;
#pragma unroll
      for (int j = 0; j < NJ; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[j][e] = cap_out * tanhf(s[j][e] * cap_in);
    }
    // Both sides per row, in tiles that reach a row's causal limit or lie below a row's window.
    if (kt >= w.first_masked_tile || kt * bk < w.window_mask_end) {
#pragma unroll
      for (int j = 0; j < NJ; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = kt * bk + 8 * j + 2 * t + (e & 1);
          if (key > lim[e >> 1] || key <= low[e >> 1]) s[j][e] = -INFINITY;
        }
    }
  } else if (kt >= w.first_masked_tile) {
#pragma unroll
    for (int j = 0; j < NJ; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = kt * bk + 8 * j + 2 * t + (e & 1);
        if (key > lim[e >> 1]) s[j][e] = -INFINITY;
      }
  }
}

// Row half hf of a 16-row block's NJ n-tiles: the thread's max of its scores, and P = 2^(x sl2 -
// ref) in place with the row sum's new value (l0 plus this tile's P). Maxima and sums run in four
// independent partials (element e & 1 of even / odd n-tiles), combined at the end: one chain of
// 2 NJ dependent steps per row would set the tile's latency at the few warps per SM of the large
// tiles.
template <int NJ>
__device__ __forceinline__ float row_half_max(const float (&s)[NJ][4], int hf) {
  float mp[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
#pragma unroll
  for (int j = 0; j < NJ; ++j)
#pragma unroll
    for (int b = 0; b < 2; ++b) mp[2 * (j & 1) + b] = fmaxf(mp[2 * (j & 1) + b], s[j][2 * hf + b]);
  return fmaxf(fmaxf(mp[0], mp[1]), fmaxf(mp[2], mp[3]));
}
template <int NJ>
__device__ __forceinline__ float exp_row_half(float (&s)[NJ][4], int hf, float sl2, float ref, float l0) {
  float lp[4] = {l0, 0.f, 0.f, 0.f};
#pragma unroll
  for (int j = 0; j < NJ; ++j)
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      float& x = s[j][2 * hf + b];
      x = fast_exp2(fmaf(x, sl2, -ref));
      lp[2 * (j & 1) + b] += x;
    }
  return (lp[0] + lp[1]) + (lp[2] + lp[3]);
}

// Scores -> P in place for one 16-row block (the raw logits of NJ n-tiles; o: its ND O tiles, rescaled
// here).
// kAsync: the asynchronized softmax. m[] holds each row's reference c (log2 units, the same in the
// row's 4 threads; -inf before the row's first visible key) and P = 2^(x sl2 - c), as with one
// unified max: no running max, no shuffle, no rescale, and a warp vote per tile. A row's first
// visible tile is held to phi (FlashDecoding++'s unified max, in fp32: exact while the row's max
// lies in [lo2, hi2] around it), and then c becomes that tile's max; a later tile whose max passes
// c by more than cap2, what 16-bit P carries into the P.V mma, raises c to it. Either way l and O
// are rescaled once by 2^(c_old - c) (c_old = phi for the first) and the tile's P is taken against
// the new c. So each row's largest P lies in [1, 2^cap2], and only a row whose first tile's max leaves
// phi's fp32 range (its sum set to NaN) or whose logits are not finite goes to the fallback. With
// one offline phi for the whole row in fp16's 13-nat window instead, 2.5% (phi = 0) to 96%
// (calibrated phi) of the rows of real text fell back (docs/kernels/prefill_attention.md).
// Sync: the online softmax (m[] the row max over the row's 4 threads, l rescaled by alpha = 2^(m_old
// - m) every tile).
// kDeferO: O is not touched (a P V product may still be accumulating into it); each row half's
// factor is multiplied into o_scale[hf] instead, for the caller to apply before its next P V.
template <bool kAsync, bool kMasked, int NJ, int ND, bool kDeferO = false>
__device__ __forceinline__ void softmax_scores(float (&s)[NJ][4], float (&o)[ND][4], float (&l)[2], float (&m)[2],
                                               float sl2, const AsyncRefs& u, float* o_scale = nullptr) {
  // O's row half hf times alpha (its ND n-tiles), or that factor kept for later.
  const auto rescale_o = [&](int hf, float alpha) {
    if constexpr (kDeferO) {
      o_scale[hf] *= alpha;
    } else {
#pragma unroll
      for (int j = 0; j < ND; ++j) {
        o[j][2 * hf] *= alpha;
        o[j][2 * hf + 1] *= alpha;
      }
    }
  };
  static_assert(NJ % 2 == 0, "n-tiles in pairs");
  if constexpr (kAsync) {
    // The tile's max first, P after the vote: P is taken against the reference the vote leaves, so
    // a raised row needs no second pass over P (an FMUL per score, which had made this path slower
    // than the synchronized one).
    const float tmax[2] = {row_half_max(s, 0), row_half_max(s, 1)};  // over the thread's own keys
    // (-inf - -inf is NaN: a row with no visible key yet and none here compares false.)
    const bool over = tmax[0] * sl2 - m[0] > u.cap2 || tmax[1] * sl2 - m[1] > u.cap2;
    if (__any_sync(0xffffffffu, over)) {  // warp-uniform: the shuffles see every lane
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        float mx = tmax[hf];
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));  // the row's 4 threads (t = 0..3)
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float c = mx * sl2;
        if (c - m[hf] > u.cap2) {  // the same in the row's 4 threads
          const bool first = m[hf] == -INFINITY;
          // The first tile's P, taken against phi in fp32, would leave fp32's range: the row falls back.
          if (first && !(c - u.phi2 >= u.lo2 && c - u.phi2 <= u.hi2)) l[hf] = NAN;
          const float alpha = fast_exp2((first ? u.phi2 : m[hf]) - c);
          m[hf] = c;
          l[hf] *= alpha;
          rescale_o(hf, alpha);
        }
      }
    }
    // P outside the branch: S's registers written on a path divergent within a warpgroup make
    // ptxas serialize the wgmma kernel's products (warning C7518).
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) l[hf] = exp_row_half(s, hf, sl2, m[hf] == -INFINITY ? u.phi2 : m[hf], l[hf]);
  } else {
    // Key 0 lies in tile 0 and is visible to every row, so m is finite from the first tile on (m_old
    // = -inf there gives alpha = 2^-inf = 0 on zero accumulators).
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float mx = row_half_max(s, hf);
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));  // the row's 4 threads (t = 0..3)
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m[hf], mx);
      // A window can hide a whole tile from some rows: their max stays -inf until their first
      // visible key, and -inf - -inf would make alpha NaN. The exponents then take 0 as their
      // reference (alpha = 2^-inf = 0 on zero accumulators, P = 2^-inf = 0) while m stays -inf, so
      // that the row's first visible tile sets its true max. (Without a window key 0 is visible to
      // every row.)
      const float m_ref = kMasked && m_new == -INFINITY ? 0.f : m_new;
      const float alpha = fast_exp2((m[hf] - m_ref) * sl2);
      const float ms = m_ref * sl2;
      m[hf] = m_new;
      rescale_o(hf, alpha);
      l[hf] = exp_row_half(s, hf, sl2, ms, l[hf] * alpha);
    }
  }
}

// The async guard of one thread's two rows after the walk: reduces each row's sum over its 4
// threads (l[] then holds the row sums) and returns how many of the rows (counted by t = 0, rows
// below `rows` only) have a sum that is not finite: a NaN or infinite logit (fmaxf skips a NaN, the
// sum does not), or a first tile whose max left phi's range (softmax_scores). Those CTAs are
// recomputed the synchronized way and counted. row: the thread's first row (the second is row + 8).
__device__ __forceinline__ int failed_rows(float (&l)[2], int row, int rows, int t) {
  int bad = 0;
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    float sum = l[hf];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    l[hf] = sum;
    if (!(sum <= FLT_MAX) && t == 0 && row + 8 * hf < rows) ++bad;
  }
  return bad;
}

// Compile-time view of one prefill::kConfigs entry.
template <int I>
struct Cfg {
  static constexpr prefill::TileConfig c = prefill::kConfigs[I];
  static constexpr int kThreads = 32 * c.warps;
  static constexpr int kMT = c.m_tiles;          // 16-row blocks per warp
  static constexpr int kWarpRows = 16 * c.m_tiles;
  static constexpr int kBQ = prefill::config_bq(c);
  static constexpr int kBK = c.bk;
  static constexpr int kStages = c.stages;
  static constexpr int kMinCtas = c.min_ctas;
  static constexpr bool kQRegs = c.m_tiles == 1;  // Q fragments held for the whole walk
  static_assert(kStages >= 2 && kStages <= 4, "stages");
  static_assert(kBK % 16 == 0, "bk");
};

// ---- the CTA's walk over its key tiles -----------------------------------------------------------

// kMasked: the walk of a sliding window and/or soft-capped logits (PrefillArgs::window, softcap):
// it starts at the window's first key tile, never reads a key below TileWork::key_begin, caps S
// before the masks and masks per row on both sides. Without it the walk is the plain causal one.
// KV: the cache's element, T or Fp8 (e4m3 bytes, turned into T in registers before each mma).
// A wgmma walk's start for this thread's two rows: O, the sums and the maxima.
template <int ND>
__device__ __forceinline__ void clear_rows(float (&o)[ND][4], float (&l)[2], float (&m)[2]) {
#pragma unroll
  for (int j = 0; j < ND; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  l[0] = l[1] = 0.f;
  m[0] = m[1] = -INFINITY;
}

// The wgmma walks' turns (WgCta::walk, WsCta::walk): turn i (0 .. n) issues tile i's S product and
// tile i - 1's P V product; a warpgroup's tiles with products are one range [a, b), so its turns
// come in straight-line kinds: none before a, S alone at a, both for a < i < b, P V alone at b, none
// after b (a = b: none at all). ptxas tracks the wgmma groups of each kind exactly; with the
// products under runtime conditions in one loop body it serialized every wgmma of the kernel
// (C7514, C7515).
template <bool S, bool PV>
struct TurnKind {
  static constexpr bool kS = S, kPV = PV;
};
template <class Turn>
__device__ __forceinline__ void run_turns(int a, int b, int n, const Turn& turn) {
  if (a < b) {
    for (int i = 0; i < a; ++i) turn(i, TurnKind<false, false>{});
    turn(a, TurnKind<true, false>{});
    for (int i = a + 1; i < b; ++i) turn(i, TurnKind<true, true>{});
    turn(b, TurnKind<false, true>{});
    for (int i = b + 1; i <= n; ++i) turn(i, TurnKind<false, false>{});
  } else {
    for (int i = 0; i <= n; ++i) turn(i, TurnKind<false, false>{});
  }
}

// What a CTA of either kernel takes from its launch (blockIdx: head x, query tile y, chunk z): its
// chunk's rows in qkv, its tile of query rows and keys (prefill::tile_work), the cache and the
// scales. begin() is false where the tile has no rows: the CTA returns, before any barrier.
template <class KV>
struct WalkBase {
  const KV* k_cache;
  const KV* v_cache;
  const int32_t* table;
  int start, kvh, tid, lane;
  int q_row0;  // the chunk's first row in qkv and out
  KvCacheLayout kv;
  float sl2;             // scale * log2(e)
  float softcap, scale;  // kMasked
  prefill::TileWork w;

  template <bool kMasked>
  __device__ __forceinline__ bool begin(const PrefillArgs& a, int bq, int bk) {
    const int chunk = blockIdx.z;
    int n;
    if (a.q_begin != nullptr) {
      q_row0 = a.q_begin[chunk];
      n = a.q_begin[chunk + 1] - q_row0;
      start = a.starts[chunk];
    } else {
      q_row0 = 0;
      n = a.single_n;
      start = a.single_start;
    }
    w = prefill::tile_work(start, n, blockIdx.y, bq, bk);
    if (w.rows <= 0) return false;
    if constexpr (kMasked) prefill::apply_window(start, a.window, bk, w);
    kv = a.kv;
    sl2 = a.scale_log2;
    softcap = a.softcap;
    scale = a.scale;
    k_cache = static_cast<const KV*>(a.k_cache);
    v_cache = static_cast<const KV*>(a.v_cache);
    table = a.block_tables + int64_t(chunk) * a.max_blocks_per_seq;
    kvh = blockIdx.x / a.group;
    tid = threadIdx.x;
    lane = threadIdx.x & 31;
    return true;
  }

  // Rows r0 and r0 + 8 of the tile (a wgmma thread's two): the last key each may see, and the
  // highest key below its window (-1 without one).
  __device__ __forceinline__ void row_limits(int r0, int (&lim)[2], int (&low)[2]) const {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      lim[hf] = prefill::row_key_limit(start, w, r0 + 8 * hf);
      low[hf] = w.window > 0 ? lim[hf] - w.window : -1;
    }
  }
};

template <class T, class KV, int D, class C, bool kMasked = false>
struct Cta : WalkBase<KV> {
  using B = WalkBase<KV>;
  using B::k_cache, B::v_cache, B::table, B::start, B::kvh, B::tid, B::lane, B::q_row0, B::kv, B::sl2, B::softcap,
      B::scale, B::w;
  static constexpr bool kFp8 = std::is_same_v<KV, Fp8>;
  static_assert(kFp8 || std::is_same_v<KV, T>, "cache element: T or e4m3");
  static constexpr int kKvEpc = 16 / int(sizeof(KV));  // cache elements per 16-byte chunk
  static constexpr int KCH = D / kKvEpc;               // 16-byte chunks per K/V row
  static constexpr int kBK = C::kBK, kMT = C::kMT, kThreads = C::kThreads;
  static constexpr bool kQRegs = C::kQRegs && D <= 128;  // (at 256: prefill::config_fits)
  static_assert(!kFp8 || kBK % 32 == 0, "e4m3 K: one ldmatrix.x4 covers 32 keys");
  int warp;
  T* q_s;   // [bq][D]; with an e4m3 cache its columns are permuted (q_fp8_k_order)
  KV* k_s;  // [stages][kBK][D]
  KV* v_s;  // [stages][kBK][D]

  // Keys kt * kBK .. + kBK - 1 into buffer `buf`: each thread copies chunks tid + i * kThreads,
  // i.e. where KCH divides the threads chunk column (tid % KCH) of rows tid / KCH + i * (kThreads /
  // KCH): one table lookup per row.
  __device__ __forceinline__ void load_kv(int kt, int buf) const {
    const int mask = (1 << kv.block_shift) - 1;
    // One chunk of key row r: its copy, or zeros past the keys this tile may read.
    auto chunk = [&](int r, int cc) {
      const int key = kt * kBK + r;
      KV* kd = k_s + buf * kBK * D + swz<KV, D>(r, cc);
      KV* vd = v_s + buf * kBK * D + swz<KV, D>(r, cc);
      if (key < w.key_end && (!kMasked || key >= w.key_begin)) {
        const int64_t off = kv.row(table[key >> kv.block_shift], key & mask, kvh) + cc * kKvEpc;
        cp_async16(kd, k_cache + off);
        cp_async16(vd, v_cache + off);
      } else {
        *reinterpret_cast<uint4*>(kd) = make_uint4(0, 0, 0, 0);
        *reinterpret_cast<uint4*>(vd) = make_uint4(0, 0, 0, 0);
      }
    };
    if constexpr (kThreads % KCH == 0) {
      constexpr int kRowsPerPass = kThreads / KCH;  // D = 128, 128 threads: 8 rows per pass (16 if e4m3)
      static_assert(kBK % kRowsPerPass == 0, "tile rows per load pass");
#pragma unroll
      for (int i = 0; i < kBK / kRowsPerPass; ++i) chunk(tid / KCH + i * kRowsPerPass, tid % KCH);
    } else {
      // Rows of 12 chunks (D = 96): a thread's chunks fall in different columns from pass to pass.
      static_assert((kBK * KCH) % kThreads == 0, "tile chunks per load pass");
#pragma unroll
      for (int i = tid; i < kBK * KCH; i += kThreads) chunk(i / KCH, i % KCH);
    }
  }

  // Q A fragments of m-tile mt at k-step ks: lanes 0-15 address rows 0-15 at chunk 2ks, lanes
  // 16-31 the same rows at chunk 2ks + 1 (registers: rows 0-7 / 8-15 x cols 0-7 / 8-15).
  __device__ __forceinline__ void load_q_frag(uint32_t (&qa)[4], int mt, int ks) const {
    ldmatrix_x4(qa, smem_addr(q_s + swz<T, D>(warp * C::kWarpRows + mt * 16 + (lane & 15), 2 * ks + (lane >> 4))));
  }

  // One walk over all key tiles. kAsync: the asynchronized softmax (m[] each row's reference in
  // log2 units, l[] the thread's partial sum of 2^(x sl2 - m)); sync: online softmax (m[] the row
  // max of the raw logits, l[] the thread's partial sum relative to it; softmax_scores). o: this
  // thread's O fragments, unnormalized. Row (mt, hf) of the thread: warp * kWarpRows + 16 mt + g + 8 hf.
  // Logits stay raw (unscaled) until the exponent: 2^(x sl2 - c) is one FFMA + one MUFU per element.
  template <bool kAsync>
  __device__ __forceinline__ void walk(uint32_t (&qf)[kMT][kQRegs ? D / 16 : 1][4], bool load_q,
                                       const AsyncRefs& u, float (&o)[kMT][D / 8][4], float (&l)[kMT][2], float (&m)[kMT][2]) const {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int j = 0; j < D / 8; ++j) o[mt][j][0] = o[mt][j][1] = o[mt][j][2] = o[mt][j][3] = 0.f;
      l[mt][0] = l[mt][1] = 0.f;
      m[mt][0] = m[mt][1] = -INFINITY;
    }
    const int g = lane >> 2, t = lane & 3;
    const int wr0 = warp * C::kWarpRows;  // the warp's first row of the tile
    int lim[kMT][2];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) lim[mt][hf] = prefill::row_key_limit(start, w, wr0 + 16 * mt + g + 8 * hf);
    // Warp-uniform work bounds: a warp whose rows all lie past the chunk computes nothing (its rows
    // are never written), and a key tile wholly after the warp's last row's limit is all masked
    // for it (with 128-row tiles: half the diagonal tile's keys for the first warps).
    const bool warp_active = wr0 < w.rows;
    const int warp_lim = prefill::row_key_limit(start, w, wr0 + C::kWarpRows - 1);
    // kMasked: the keys each row's window hides (key <= low: -inf; -1 without a window), and the
    // warp's first visible key (a tile wholly below it is all masked for the warp).
    int low[kMT][2];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) low[mt][hf] = w.window > 0 ? lim[mt][hf] - w.window : -1;
    const int warp_first = w.window > 0 ? prefill::row_key_limit(start, w, wr0) - w.window + 1 : 0;
    const int kt0 = kMasked ? w.first_key_tile : 0;

    // Prologue: tiles kt0 .. kt0 + kStages - 2 in flight (one commit group each, empty past the end,
    // so that wait_group counts stay uniform). Q (issued by the caller) joins the first tile's group.
#pragma unroll
    for (int st = 0; st < C::kStages - 1; ++st) {
      if (kt0 + st < w.n_key_tiles) load_kv(kt0 + st, st);
      cp_async_commit();
    }
    int buf = 0;  // (kt - kt0) % kStages
    for (int kt = kt0; kt < w.n_key_tiles; ++kt) {
      cp_async_wait_group<C::kStages - 2>();
      __syncthreads();  // tile kt (and Q) visible; everyone is done with tile kt - 1
      if constexpr (kQRegs) {
        if (load_q && kt == kt0) {
#pragma unroll
          for (int ks = 0; ks < D / 16; ++ks) load_q_frag(qf[0][ks], 0, ks);
        }
      }
      {
        // Tile kt + kStages - 1 into the buffer of tile kt - 1 (everyone passed the barrier above).
        const int nt = kt + C::kStages - 1;
        int nb = buf + C::kStages - 1;
        if (nb >= C::kStages) nb -= C::kStages;
        if (nt < w.n_key_tiles) load_kv(nt, nb);
        cp_async_commit();
      }
      const KV* kb = k_s + buf * kBK * D;
      const KV* vb = v_s + buf * kBK * D;
      if (++buf == C::kStages) buf = 0;
      if (!warp_active || kt * kBK > warp_lim) continue;  // warp-uniform; barriers stay matched
      if (kMasked && kt * kBK + kBK <= warp_first) continue;  // (the same, below the warp's windows)

      // S = Q K^T: n-tiles of 8 keys; one ldmatrix.x4 gives the B fragments of keys n0..n0+15 at
      // k-step ks (lanes 0-7: keys n0+0..7 chunk 2ks; 8-15: same keys chunk 2ks+1; 16-31: keys
      // n0+8..15); with two m-tiles per warp each B fragment feeds two mma.
      float s[kMT][kBK / 8][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int j = 0; j < kBK / 8; ++j) s[mt][j][0] = s[mt][j][1] = s[mt][j][2] = s[mt][j][3] = 0.f;
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks) {
        uint32_t qa[kMT][4];
        if constexpr (!kQRegs) {
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) load_q_frag(qa[mt], mt, ks);
        }
        if constexpr (kFp8) {
          // e4m3 rows: one 8 x 16-byte matrix is 8 keys x the 16 dims of k-step ks, so one x4 gives
          // n-tiles 4nq .. 4nq + 3 (lanes 8i .. 8i + 7 address keys 32nq + 8i + 0..7 at chunk ks);
          // fp8_k_fragment turns each into b0/b1 with the dims in Q's staged order.
#pragma unroll
          for (int nq = 0; nq < kBK / 32; ++nq) {
            uint32_t b[4];
            ldmatrix_x4(b, smem_addr(kb + swz<KV, D>(nq * 32 + lane, ks)));
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              uint32_t b0, b1;
              detail::fp8_k_fragment<T>(b[i], b0, b1);
#pragma unroll
              for (int mt = 0; mt < kMT; ++mt) {
                if constexpr (kQRegs) {
                  mma16816<T>(s[mt][4 * nq + i], qf[mt][ks], b0, b1);
                } else {
                  mma16816<T>(s[mt][4 * nq + i], qa[mt], b0, b1);
                }
              }
            }
          }
        } else {
#pragma unroll
          for (int np = 0; np < kBK / 16; ++np) {
            uint32_t b[4];
            const int key_row = np * 16 + (lane & 7) + ((lane >> 4) << 3);
            ldmatrix_x4(b, smem_addr(kb + swz<KV, D>(key_row, 2 * ks + ((lane >> 3) & 1))));
#pragma unroll
            for (int mt = 0; mt < kMT; ++mt) {
              if constexpr (kQRegs) {
                mma16816<T>(s[mt][2 * np], qf[mt][ks], b[0], b[1]);
                mma16816<T>(s[mt][2 * np + 1], qf[mt][ks], b[2], b[3]);
              } else {
                mma16816<T>(s[mt][2 * np], qa[mt], b[0], b[1]);
                mma16816<T>(s[mt][2 * np + 1], qa[mt], b[2], b[3]);
              }
            }
          }
        }
      }

#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        mask_scores<kMasked>(s[mt], kt, kBK, t, w, lim[mt], low[mt], softcap, scale);
        softmax_scores<kAsync, kMasked>(s[mt], o[mt], l[mt], m[mt], sl2, u);
      }

      // O += P V. The accumulators of n-tiles 2ks and 2ks + 1 are the A fragment of k-step ks
      // (registers only, no shared round trip); one ldmatrix.x4.trans gives V's B fragments for
      // d-tiles 2dp and 2dp + 1 (lanes 0-15: key rows 16ks + 0..15 at chunk 2dp; lanes 16-31: the
      // same rows at chunk 2dp + 1), used by every m-tile of the warp.
#pragma unroll
      for (int ks = 0; ks < kBK / 16; ++ks) {
        uint32_t pa[kMT][4];
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          pa[mt][0] = pack2<T>(s[mt][2 * ks][0], s[mt][2 * ks][1]);
          pa[mt][1] = pack2<T>(s[mt][2 * ks][2], s[mt][2 * ks][3]);
          pa[mt][2] = pack2<T>(s[mt][2 * ks + 1][0], s[mt][2 * ks + 1][1]);
          pa[mt][3] = pack2<T>(s[mt][2 * ks + 1][2], s[mt][2 * ks + 1][3]);
        }
        if constexpr (kFp8) {
          // e4m3 rows: a matrix is 8 keys x 16 dims, so the same lane addresses (chunks 2dp, 2dp + 1
          // now of 16 dims each) give 32 dims: per 16-dim group gi, b[2h] (keys 0-7) and b[2h + 1]
          // (keys 8-15) split into the B fragments of its even-dim tile o[2gi] and odd-dim tile
          // o[2gi + 1] (fp8_v_fragment; the output store puts the dims back in order).
#pragma unroll
          for (int dp = 0; dp < D / 32; ++dp) {
            uint32_t b[4];
            ldmatrix_x4_trans(b, smem_addr(vb + swz<KV, D>(ks * 16 + (lane & 15), 2 * dp + (lane >> 4))));
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const int gi = 2 * dp + h;
              uint32_t even0, odd0, even1, odd1;
              detail::fp8_v_fragment<T>(b[2 * h], even0, odd0);
              detail::fp8_v_fragment<T>(b[2 * h + 1], even1, odd1);
#pragma unroll
              for (int mt = 0; mt < kMT; ++mt) {
                mma16816<T>(o[mt][2 * gi], pa[mt], even0, even1);
                mma16816<T>(o[mt][2 * gi + 1], pa[mt], odd0, odd1);
              }
            }
          }
        } else {
#pragma unroll
          for (int dp = 0; dp < D / 16; ++dp) {
            uint32_t b[4];
            ldmatrix_x4_trans(b, smem_addr(vb + swz<KV, D>(ks * 16 + (lane & 15), 2 * dp + (lane >> 4))));
#pragma unroll
            for (int mt = 0; mt < kMT; ++mt) {
              mma16816<T>(o[mt][2 * dp], pa[mt], b[0], b[1]);
              mma16816<T>(o[mt][2 * dp + 1], pa[mt], b[2], b[3]);
            }
          }
        }
      }
    }
    cp_async_wait_group<0>();  // no copy (only empty groups by now) outlives the walk
  }
};

template <class T, class KV, int D, int I, bool kMasked>
__global__ void __launch_bounds__(Cfg<I>::kThreads, Cfg<I>::kMinCtas) prefill_attention_kernel(PrefillArgs a) {
  static_assert(D == 64 || D == 96 || D == 128 || D == 256, "head_dim");
  using C = Cfg<I>;
  using Walk = Cta<T, KV, D, C, kMasked>;
  constexpr bool kFp8 = Walk::kFp8;
  constexpr int CH = D / 8;
  constexpr int kMT = C::kMT;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  __shared__ int fail_rows;

  Walk c;
  if (!c.template begin<kMasked>(a, C::kBQ, C::kBK)) return;  // uniform over the CTA: before any barrier
  const int h = blockIdx.x;
  const int q_row0 = c.q_row0;
  c.warp = threadIdx.x >> 5;
  c.q_s = reinterpret_cast<T*>(smem_raw);
  c.k_s = reinterpret_cast<KV*>(c.q_s + C::kBQ * D);
  c.v_s = c.k_s + C::kStages * C::kBK * D;
  if (threadIdx.x == 0) fail_rows = 0;  // read after the walk's barriers

  const int H = a.n_heads;
  const int64_t qkv_row = int64_t(H + 2 * a.n_kv_heads) * D;
  // Q tile -> shared (rows past the chunk zero-filled); committed with the walk's first K/V group.
  // With an e4m3 cache Q's columns are permuted as K's fragments come out (q_fp8_k_order): a thread
  // loads the 8 words (dim pairs) of a 16-dim group and stores pairs 0, 2, 4, 6 as the group's
  // first chunk and 1, 3, 5, 7 as its second; plain loads, seen after the walk's first barrier.
  {
    const T* q = static_cast<const T*>(a.qkv) + int64_t(h) * D;
    if constexpr (kFp8) {
      static_assert(detail::q_fp8_k_order(2) == 4 && detail::q_fp8_k_order(8) == 2, "Q staging order");
      constexpr int kGroups = D / 16;
#pragma unroll
      for (int i = threadIdx.x; i < C::kBQ * kGroups; i += C::kThreads) {
        const int r = i / kGroups, gi = i % kGroups;
        uint4 lo = make_uint4(0, 0, 0, 0), hi = lo;  // physical dims 16gi + 0..7, + 8..15
        if (r < c.w.rows) {
          const uint4* src = reinterpret_cast<const uint4*>(q + int64_t(q_row0 + c.w.q0 + r) * qkv_row + gi * 16);
          lo = src[0];
          hi = src[1];
        }
        *reinterpret_cast<uint4*>(c.q_s + swz<T, D>(r, 2 * gi)) = make_uint4(lo.x, lo.z, hi.x, hi.z);
        *reinterpret_cast<uint4*>(c.q_s + swz<T, D>(r, 2 * gi + 1)) = make_uint4(lo.y, lo.w, hi.y, hi.w);
      }
    } else {
#pragma unroll
      for (int i = threadIdx.x; i < C::kBQ * CH; i += C::kThreads) {
        const int r = i / CH, cc = i % CH;
        T* dst = c.q_s + swz<T, D>(r, cc);
        if (r < c.w.rows) {
          cp_async16(dst, q + int64_t(q_row0 + c.w.q0 + r) * qkv_row + cc * 8);
        } else {
          *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
        }
      }
    }
  }

  uint32_t qf[kMT][Walk::kQRegs ? D / 16 : 1][4];
  float o[kMT][D / 8][4], l[kMT][2], m[kMT][2];
  const int g = c.lane >> 2, t = c.lane & 3;
  const int wr0 = c.warp * C::kWarpRows;
  bool sums_reduced = false;  // l[] holds the row sums (else each thread's partial sum)
  if (a.async) {
    c.template walk<true>(qf, true, a.um, o, l, m);
    int bad = 0;
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) bad += failed_rows(l[mt], wr0 + 16 * mt + g, c.w.rows, t);
    sums_reduced = true;
    if (bad > 0) atomicAdd(&fail_rows, bad);
    __syncthreads();  // fail_rows complete; every warp is done with the K/V buffers
    const int failed = fail_rows;
    if (failed > 0) {
      if (threadIdx.x == 0 && a.fallback_rows != nullptr)
        atomicAdd(a.fallback_rows, static_cast<unsigned long long>(failed));
      c.template walk<false>(qf, false, a.um, o, l, m);
      sums_reduced = false;
    }
  } else {
    c.template walk<false>(qf, true, a.um, o, l, m);
  }
  if (!sums_reduced) {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        l[mt][hf] += __shfl_xor_sync(0xffffffffu, l[mt][hf], 1);
        l[mt][hf] += __shfl_xor_sync(0xffffffffu, l[mt][hf], 2);
      }
  }

  // O * v_scale / l -> the warp's own rows of the Q buffer (only this warp ever read them) ->
  // global. The barrier orders the lanes' last ldmatrix reads of those rows before the writes
  // (without it compute-sanitizer's racecheck reports a possible hazard there).
  __syncwarp();
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
    const float v_scale = kFp8 ? a.v_scale : 1.f;  // (1.f / l as before for a 16-bit cache)
    const float inv0 = v_scale / l[mt][0], inv1 = v_scale / l[mt][1];
    const int r0 = wr0 + 16 * mt + g;
    if constexpr (kFp8) {
      // 16-dim group gi: tiles o[2gi] (even dims) and o[2gi + 1] (odd dims) hold, for row g, dims
      // 16gi + 4t .. 4t + 3 as (even e0, odd e0, even e1, odd e1) (fp8_v_dim), for row g + 8 the
      // same with e2, e3: 8 bytes in order, inside one 16-byte chunk.
#pragma unroll
      for (int gi = 0; gi < D / 16; ++gi) {
        const float(&ev)[4] = o[mt][2 * gi];
        const float(&od)[4] = o[mt][2 * gi + 1];
        const int col = 16 * gi + 4 * t;
        *reinterpret_cast<uint2*>(c.q_s + swz<T, D>(r0, col >> 3) + (col & 7)) =
            make_uint2(pack2<T>(ev[0] * inv0, od[0] * inv0), pack2<T>(ev[1] * inv0, od[1] * inv0));
        *reinterpret_cast<uint2*>(c.q_s + swz<T, D>(r0 + 8, col >> 3) + (col & 7)) =
            make_uint2(pack2<T>(ev[2] * inv1, od[2] * inv1), pack2<T>(ev[3] * inv1, od[3] * inv1));
      }
    } else {
#pragma unroll
      for (int j = 0; j < D / 8; ++j) {
        *reinterpret_cast<uint32_t*>(c.q_s + swz<T, D>(r0, j) + 2 * t) =
            pack2<T>(o[mt][j][0] * inv0, o[mt][j][1] * inv0);
        *reinterpret_cast<uint32_t*>(c.q_s + swz<T, D>(r0 + 8, j) + 2 * t) =
            pack2<T>(o[mt][j][2] * inv1, o[mt][j][3] * inv1);
      }
    }
  }
  __syncwarp();
  T* out = static_cast<T*>(a.out);
#pragma unroll
  for (int i = c.lane; i < C::kWarpRows * CH; i += 32) {
    const int r = wr0 + i / CH, cc = i % CH;
    if (r < c.w.rows) {
      *reinterpret_cast<uint4*>(out + int64_t(q_row0 + c.w.q0 + r) * H * D + int64_t(h) * D + cc * 8) =
          *reinterpret_cast<const uint4*>(c.q_s + swz<T, D>(r, cc));
    }
  }
}


// The wgmma walks' products and P, for one warpgroup's 64 rows of 128-byte-swizzled tiles (WgCta's
// layout: 128 rows per column block of 64 dims, for Q, K and V alike).
// S = Q K^T: k-step ks reads dims 16ks .. 16ks + 15, column block ks / 4, 32 bytes per step inside
// its 128-byte rows. One group, committed.
template <class T, int D>
__device__ __forceinline__ void issue_s_product(float (&sf)[64], uint32_t q_addr, uint32_t kb) {
  detail::wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    const uint32_t col = (ks >> 2) * 128 * 128 + (ks & 3) * 32;  // (Q and K tiles both have 128 rows)
    detail::wgmma_m64n128k16_ss<T>(sf, detail::wgmma_desc_sw128(q_addr + col), detail::wgmma_desc_sw128(kb + col),
                                   ks > 0);
  }
  detail::wgmma_commit();
}
// O += P V: keys 16ks .. 16ks + 15 are rows 16ks .. of each 64-dim column block of V (2 KB per
// k-step); dims 64h .. 64h + 63 are O's n-tiles 8h .. 8h + 7. One group, committed.
template <class T, int ND>
__device__ __forceinline__ void issue_pv_product(float (&o)[ND][4], const uint32_t (&pa)[8][4], uint32_t vb) {
  detail::wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < 8; ++ks)
#pragma unroll
    for (int h = 0; h < ND / 8; ++h) {
      float(&oh)[32] = *reinterpret_cast<float(*)[32]>(&o[8 * h][0]);
      detail::wgmma_m64n64k16_rs<T>(oh, pa[ks], detail::wgmma_desc_sw128(vb + h * 128 * 128 + ks * 16 * 128), true);
    }
  detail::wgmma_commit();
}
// P in 16 bits, the A fragments of P V's k-steps. Every A fragment is packed before the next fence: a
// register written between two wgmma of a batch makes ptxas serialize them (warning C7519).
template <class T>
__device__ __forceinline__ void pack_p(const float (&s)[16][4], uint32_t (&pa)[8][4]) {
#pragma unroll
  for (int ks = 0; ks < 8; ++ks) {
    pa[ks][0] = pack2<T>(s[2 * ks][0], s[2 * ks][1]);
    pa[ks][1] = pack2<T>(s[2 * ks][2], s[2 * ks][3]);
    pa[ks][2] = pack2<T>(s[2 * ks + 1][0], s[2 * ks + 1][1]);
    pa[ks][3] = pack2<T>(s[2 * ks + 1][2], s[2 * ks + 1][3]);
  }
}
// Once P V is done: O takes the softmax's deferred rescale (o_scale, then reset) and pa the tile's P.
template <class T, int ND>
__device__ __forceinline__ void rescale_o_pack_p(float (&o)[ND][4], float (&o_scale)[2], const float (&s)[16][4],
                                                 uint32_t (&pa)[8][4]) {
#pragma unroll
  for (int j = 0; j < ND; ++j) {
    o[j][0] *= o_scale[0];
    o[j][1] *= o_scale[0];
    o[j][2] *= o_scale[1];
    o[j][3] *= o_scale[1];
  }
  o_scale[0] = o_scale[1] = 1.f;
  pack_p<T>(s, pa);
}

// ---- the warpgroup-MMA kernel (sm_90a; prefill_plan.h: wg128n128) --------------------------------
//
// CTA = (query head, 128-row query tile of one chunk): 2 warpgroups (8 warps) of 64 rows each. Q,
// K and V tiles live in shared memory in 128-byte-swizzled atoms (wgmma.cuh: sw128_offset), loaded
// by every thread with cp.async as in the mma.sync kernel (one block table lookup per key row,
// zeros past the visible keys), tile kt + 1 in flight while tile kt is computed. Per warpgroup and
// key tile of 128:
//   * S = Q K^T: D / 16 wgmma m64n128k16, both operands read by the tensor cores from shared
//     memory (K-major descriptors: Q's rows and K's rows hold contiguous dims).
//   * masks and softmax in registers: the accumulator layout of each warp's 16 rows is the
//     mma.sync one (row g / g + 8, keys 8j + 2t, + 1), so mask_scores and softmax_scores serve both
//     kernels, and so do the unified max, its guard and the exact fallback walk.
//   * O += P V: P packed to 16 bits in registers (the accumulators of keys 16ks .. 16ks + 15 are
//     the A fragment of k-step ks), V read from shared memory as an MN-major operand (its rows hold
//     contiguous dims), one wgmma m64n64k16 per 64 dims.
// A warpgroup whose rows lie past the chunk, or before the tile's keys, skips the tile (uniform
// over the warpgroup, as wgmma requires); the barriers stay matched.
template <class T, int D, int I, bool kMasked>
struct WgCta : WalkBase<T> {
  using B = WalkBase<T>;
  using B::k_cache, B::v_cache, B::table, B::start, B::kvh, B::tid, B::lane, B::q_row0, B::kv, B::sl2, B::softcap,
      B::scale, B::w;
  static constexpr prefill::TileConfig kConfig = prefill::kConfigs[I];
  static constexpr int kBQ = prefill::config_bq(kConfig), kBK = kConfig.bk;
  static constexpr int kThreads = prefill::config_threads(kConfig), kStages = kConfig.stages;
  static constexpr int kD = D;
  static constexpr int KCH = D / 8;  // 16-byte chunks per row
  static_assert(kBQ == 128 && kThreads == 256 && kBK == 128 && (D == 64 || D == 128), "wgmma tile");
  static constexpr uint32_t kTileBytes = kBK * D * 2;
  int wg, warp;  // warp: within the warpgroup
  unsigned char* q_s;  // [kBQ][D] swizzled, 1 KB aligned
  unsigned char* k_s;  // [stages][kBK][D]
  unsigned char* v_s;

  // Key tile kt of K and V into buffer buf of their stages: cp.async of the visible rows, zeros for
  // the others.
  __device__ __forceinline__ void load_kv(int kt, int buf) const {
    const int mask = (1 << kv.block_shift) - 1;
    constexpr int kRowsPerPass = kThreads / KCH;
#pragma unroll
    for (int i = 0; i < kBK / kRowsPerPass; ++i) {
      const int r = tid / KCH + i * kRowsPerPass, cc = tid % KCH;
      const int key = kt * kBK + r;
      const uint32_t off = buf * kTileBytes + detail::sw128_offset(kBK, r, cc);
      if (key < w.key_end && (!kMasked || key >= w.key_begin)) {
        const int64_t src = kv.row(table[key >> kv.block_shift], key & mask, kvh) + cc * 8;
        cp_async16(k_s + off, k_cache + src);
        cp_async16(v_s + off, v_cache + src);
      } else {
        *reinterpret_cast<uint4*>(k_s + off) = make_uint4(0, 0, 0, 0);
        *reinterpret_cast<uint4*>(v_s + off) = make_uint4(0, 0, 0, 0);
      }
    }
  }

  // One walk over all key tiles (the mma.sync kernel's Cta::walk, for this thread's two rows): per
  // tile, S, its softmax, then P V. Every warpgroup takes every tile's CTA barrier, outside its
  // range too. FlashAttention-3's intra-warpgroup overlap (WsCta's turns) measured slower here on
  // the H100 (docs/kernels/prefill_attention.md), and its per-warpgroup ranges of turns would put
  // the CTA barrier under divergent conditions.
  template <bool kAsync>
  __device__ __forceinline__ void walk(const AsyncRefs& u, float (&o)[D / 8][4], float (&l)[2], float (&m)[2]) const {
    clear_rows(o, l, m);
    const int g = lane >> 2, t = lane & 3;
    const int wg0 = wg * 64;        // the warpgroup's first row of the tile
    const int r0 = wg0 + warp * 16 + g;  // this thread's rows: r0, r0 + 8
    int lim[2], low[2];
    this->row_limits(r0, lim, low);
    const int kt0 = kMasked ? w.first_key_tile : 0;
    int a, b;
    prefill::warpgroup_tile_range(start, w, wg0, kBK, kt0, w.n_key_tiles - kt0, kMasked, a, b);
    const uint32_t q_addr = detail::smem_addr(q_s) + wg0 * 128;  // the warpgroup's rows of each column block
    const uint32_t k_addr = detail::smem_addr(k_s), v_addr = detail::smem_addr(v_s);
    float(&of)[D / 2] = reinterpret_cast<float(&)[D / 2]>(o);

#pragma unroll
    for (int st = 0; st < kStages - 1; ++st) {
      if (kt0 + st < w.n_key_tiles) load_kv(kt0 + st, st);
      cp_async_commit();
    }
    int buf = 0;
    for (int kt = kt0; kt < w.n_key_tiles; ++kt) {
      cp_async_wait_group<kStages - 2>();
      detail::fence_proxy_async_shared();  // this thread's copies and zero stores, seen by wgmma
      __syncthreads();  // tile kt (and Q) visible; every warpgroup is done with tile kt - 1
      const uint32_t kb = k_addr + buf * kTileBytes, vb = v_addr + buf * kTileBytes;
      // Tile kt + kStages - 1 into the buffer of tile kt - 1, issued once this warpgroup's S product
      // is under way: the table lookups and copies then overlap the tensor cores' work.
      const auto load_next = [&] {
        const int nt = kt + kStages - 1;
        int nb = buf + kStages - 1;
        if (nb >= kStages) nb -= kStages;
        if (nt < w.n_key_tiles) load_kv(nt, nb);
        cp_async_commit();
        if (++buf == kStages) buf = 0;
      };
      if (kt - kt0 < a || kt - kt0 >= b) {
        load_next();
        continue;
      }
      float s[kBK / 8][4];
      float(&sf)[kBK / 2] = reinterpret_cast<float(&)[kBK / 2]>(s);
      issue_s_product<T, D>(sf, q_addr, kb);
      detail::wgmma_pin(sf);
      load_next();
      detail::wgmma_wait<0>();
      detail::wgmma_pin(sf);
      mask_scores<kMasked>(s, kt, kBK, t, w, lim, low, softcap, scale);
      softmax_scores<kAsync, kMasked, kBK / 8, D / 8>(s, o, l, m, sl2, u);
      uint32_t pa[kBK / 16][4];
      pack_p<T>(s, pa);
      issue_pv_product<T>(o, pa, vb);
      detail::wgmma_pin(of);
      detail::wgmma_wait<0>();
      detail::wgmma_pin(of);
    }
    cp_async_wait_group<0>();
  }
};

// The wgmma kernels' epilogue: this thread's two rows (r0, r0 + 8 of the tile, first query row
// `row0`) of O / l straight from the registers; each row's 4 threads (t) write 16 contiguous bytes
// per n-tile. The row sums are reduced over the 4 threads first unless failed_rows did it.
template <class T, int D>
__device__ __forceinline__ void store_wgmma_rows(const PrefillArgs& a, const float (&o)[D / 8][4], float (&l)[2],
                                                 bool sums_reduced, int r0, int rows, int row0, int h, int t) {
  if (!sums_reduced) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      l[hf] += __shfl_xor_sync(0xffffffffu, l[hf], 1);
      l[hf] += __shfl_xor_sync(0xffffffffu, l[hf], 2);
    }
  }
  T* out = static_cast<T*>(a.out);
  const int H = a.n_heads;
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int r = r0 + 8 * hf;
    if (r >= rows) continue;
    const float inv = 1.f / l[hf];
    T* row = out + int64_t(row0 + r) * H * D + int64_t(h) * D + 2 * t;
#pragma unroll
    for (int j = 0; j < D / 8; ++j)
      *reinterpret_cast<uint32_t*>(row + 8 * j) = pack2<T>(o[j][2 * hf] * inv, o[j][2 * hf + 1] * inv);
  }
}

template <class T, int D, int I, bool kMasked>
__global__ void __launch_bounds__(prefill::config_threads(prefill::kConfigs[I]), 1)
    prefill_attention_wgmma_kernel(PrefillArgs a) {
#if FDPP_WGMMA_DEVICE
  using Walk = WgCta<T, D, I, kMasked>;
  constexpr int KCH = D / 8;
  extern __shared__ unsigned char smem_raw[];
  __shared__ int fail_rows;

  Walk c;
  if (!c.template begin<kMasked>(a, Walk::kBQ, Walk::kBK)) return;  // uniform over the CTA
  const int h = blockIdx.x;
  const int q_row0 = c.q_row0;
  c.wg = threadIdx.x >> 7;
  c.warp = (threadIdx.x >> 5) & 3;
  // Swizzled tiles need 1 KB alignment: the launch adds 1 KB of slack.
  unsigned char* base = smem_raw + ((1024 - (detail::smem_addr(smem_raw) & 1023)) & 1023);
  c.q_s = base;
  c.k_s = base + Walk::kBQ * D * 2;
  c.v_s = c.k_s + Walk::kStages * Walk::kBK * D * 2;
  if (threadIdx.x == 0) fail_rows = 0;

  const int H = a.n_heads;
  const int64_t qkv_row = int64_t(H + 2 * a.n_kv_heads) * D;
  {
    const T* q = static_cast<const T*>(a.qkv) + int64_t(h) * D;
#pragma unroll
    for (int i = threadIdx.x; i < Walk::kBQ * KCH; i += Walk::kThreads) {
      const int r = i / KCH, cc = i % KCH;
      unsigned char* dst = c.q_s + detail::sw128_offset(Walk::kBQ, r, cc);
      if (r < c.w.rows) {
        cp_async16(dst, q + int64_t(q_row0 + c.w.q0 + r) * qkv_row + cc * 8);
      } else {
        *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
      }
    }
  }

  float o[D / 8][4], l[2], m[2];
  const int g = c.lane >> 2, t = c.lane & 3;
  const int r0 = c.wg * 64 + c.warp * 16 + g;
  bool sums_reduced = false;
  auto walk = [&](auto async_tag) { c.template walk<decltype(async_tag)::value>(a.um, o, l, m); };
  if (a.async) {
    walk(std::true_type{});
    const int bad = failed_rows(l, r0, c.w.rows, t);
    sums_reduced = true;
    if (bad > 0) atomicAdd(&fail_rows, bad);
    __syncthreads();
    const int failed = fail_rows;
    if (failed > 0) {
      if (threadIdx.x == 0 && a.fallback_rows != nullptr)
        atomicAdd(a.fallback_rows, static_cast<unsigned long long>(failed));
      walk(std::false_type{});
      sums_reduced = false;
    }
  } else {
    walk(std::false_type{});
  }
  store_wgmma_rows<T, D>(a, o, l, sums_reduced, r0, c.w.rows, q_row0 + c.w.q0, h, t);
#else
  __trap();  // never launched: launch() sends wgmma configurations elsewhere off sm_90a builds
#endif
}

// ---- the warp-specialized warpgroup-MMA kernel (sm_90a; prefill_plan.h: wg128n128ws) -------------
//
// wg128n128's CTA (128 query rows of one head, 128-key tiles, the same 128-byte-swizzled shared
// tiles and the same two products per tile and warpgroup) in FlashAttention-3's producer/consumer
// form, 3 warpgroups (384 threads):
//   * Warpgroup 0, the producer (registers lowered to kProducerRegs by setmaxnreg), only loads: it
//     walks the key tiles, looks each key row up in the block table and issues the cp.async copies
//     of K and V into a ring of `stages` buffers. Keys past the visible ones (and below a window)
//     are zero-filled by the copy itself (src-size 0), so every byte of a stage is written by a
//     cp.async whose completion is tracked. Per stage and tensor (K, V): a "full" mbarrier (128
//     arrivals: cp.async.mbarrier.arrive.noinc by each producer thread after its copies of the
//     tile) and an "empty" one (8 arrivals: one per consumer warp once its product has read the
//     tile), which the producer waits on before it refills that tensor's half of the stage. K is
//     read by S and V by P V a turn later, so each is freed as soon as its own product is done,
//     and the producer streams K a tile ahead of V: step j loads K(j), then V(j - 1), so that
//     K(i + 2) and V(i + 1) are loading while the consumers run turn i. Stage and phase follow a
//     running tile count that producer and consumers keep alike (stage it % stages, phase
//     (it / stages) & 1).
//   * Warpgroups 1 and 2, the consumers (registers raised to kConsumerRegs): 64 query rows each,
//     their Q loaded by the warpgroup itself. Per key tile a consumer waits on the stage's full
//     barriers (then fence.proxy.async: the copies were generic-proxy writes, wgmma reads through
//     the async proxy), and runs WgCta's S = Q K^T, masks and softmax in registers (mask_scores,
//     softmax_scores) and O += P V, with WgCta's skips of tiles its rows see nothing of.
//   * Ping-pong: the consumers take turns on the tensor cores. A turn issues the previous tile's PV
//     product and this tile's S product back to back; the warpgroup then hands the turn over (one
//     named barrier per consumer: bar.sync on its own takes the turn, bar.arrive on the other's
//     gives it), waits for its products and runs its softmax while the other's products run.
//     Consumer 0 takes its first turn without waiting and consumer 1 does not hand back its last,
//     so the barriers are balanced at the end of every walk.
//   * The async fallback: after the async walk the consumers count the failing rows (failed_rows)
//     and all 384 threads meet at a named barrier; if any row failed, the producer streams the
//     keys once more and the consumers walk them again with the synchronized softmax.
// A consumer with no work in a tile (rows past the chunk, a tile past its rows' causal limit or
// below their windows) still waits on the tile's full barriers, takes and hands over its turn and
// arrives on the empty barrier, only without products: every barrier stays matched.
//
// The TMA producer (TileConfig::tma, wg128n128wst; stream_tma): the consumers are the same, only the
// producer loads differently. A tile of 128 keys is 128 / R pages of R = min(block_size, 128) keys
// (one block's keys of the CTA's kv head, or a 128-key part of a larger block). The launcher builds
// one tensor map per cache (kv_tensor_map: dims (D, key in block, kv head, block) with the cache's
// strides, box (64, R, 1, 1), 128-byte swizzle), so that one box lands a page's 64-dim column block
// at rows p R .. of the stage's column block in exactly sw128_offset's layout (R >= 8: whole 1 KB
// atoms). Per tile, K and V alike:
//   * pages the tile's rows see throughout ([p_lo, p_hi): below key_end, and at or above a window's
//     key_begin) come by TMA: lane p of producer warp 0 looks page p up in the block table (once for
//     K and V, before the wait on the empty barrier) and issues D / 64 boxes; lane 0 first adds the
//     tile's bytes to the full barrier (arrive.expect_tx);
//   * the other pages (the one holding the last visible key, the one holding a window's first, and
//     those wholly past or below: their table entries may be invalid) are written by the producer's
//     128 threads as before, row by row: cp.async of the visible rows, zeros (src-size 0) for the
//     rest, so a stale or NaN slot of a partly visible page is never read (0 x NaN = NaN in P V).
//     Each thread then waits for its copies and fences them for the async proxy (the consumers'
//     wgmma);
//   * each producer warp arrives on the full barrier once (lane 0, after __syncwarp): the full
//     barriers count 4 + 1 arrivals (the warps and the expect_tx) and the TMA bytes. Tiles wholly
//     visible (all but a walk's last and a window's first) have no row copies at all.
template <class T, int D, int I, bool kMasked>
struct WsCta : WalkBase<T> {
  using B = WalkBase<T>;
  using B::k_cache, B::v_cache, B::table, B::start, B::kvh, B::lane, B::kv, B::sl2, B::softcap, B::scale, B::w;
  static constexpr prefill::TileConfig kConfig = prefill::kConfigs[I];
  static constexpr int kBQ = prefill::config_bq(kConfig), kBK = kConfig.bk, kStages = kConfig.stages;
  // V's stages (kStages are K's), and how many tiles the producer loads V behind K: one with as many
  // stages as K (V is freed a turn after K), none with more.
  static constexpr int kStagesV = prefill::config_v_stages(kConfig);
  static constexpr int kVLag = kStagesV > kStages ? 0 : 1;
  static constexpr int kThreads = prefill::config_threads(kConfig);
  static constexpr int kProducerThreads = prefill::kProducerThreads;
  static constexpr int kConsumerThreads = kThreads - kProducerThreads;
  static constexpr int kD = D;
  static constexpr int KCH = D / 8;  // 16-byte chunks per row
  static_assert(kConfig.ws && kBQ == 128 && kThreads == 384 && kConsumerThreads == 256 && kBK == 128 &&
                    (D == 64 || D == 128) && kStages >= 2,
                "warp-specialized wgmma tile");
  static constexpr uint32_t kTileBytes = kBK * D * 2;
  static constexpr bool kTma = kConfig.tma;
  static constexpr int kProducerWarps = kProducerThreads / 32;
  // Arrivals per phase of a full barrier: each producer thread's cp.async.mbarrier.arrive.noinc, or
  // (TMA) each producer warp's lane 0 plus the arrive.expect_tx of the TMA bytes.
  static constexpr int kFullArrivals = kTma ? kProducerWarps + 1 : kProducerThreads;
  // Registers per thread after setmaxnreg. The CTA is launched with 168 per thread (launch bounds
  // 384 threads, 1 CTA: 65536 / 384 rounded down to 8), 64512 in all, and setmaxnreg only moves
  // them between warpgroups: producer 128 x 40 + consumers 256 x 232 = 64512.
  static constexpr int kProducerRegs = 40, kConsumerRegs = 232;
  static_assert(kProducerRegs * kProducerThreads + kConsumerRegs * kConsumerThreads <= 168 * 384, "registers");
  // Named barriers (0 is __syncthreads): the CTA's verdict after the async walk (384 threads), each
  // consumer's turn (256: its own bar.sync, the other's bar.arrive), each consumer's Q (128).
  static constexpr int kBarVerdict = 1, kBarTurn = 2, kBarQ = 4;
  int cw, warp;                    // consumer warpgroup (0, 1); warp within it
  uint32_t q_s, k_s, v_s;          // shared addresses: Q [kBQ][D], K [kStages][kBK][D], V [kStagesV][kBK][D], 1 KB aligned
  // Shared addresses of `stages` mbarriers each, 8 bytes apart.
  uint32_t full_k, full_v, empty_k, empty_v;

  // The producer (thread ptid of 128): every key tile of one walk into the stages; `it` tiles were
  // streamed before.
  __device__ __forceinline__ void stream(int it, int ptid, const KvTmaMaps& maps, int tma_key_dim) const {
    if constexpr (kTma) {
      stream_tma(it, ptid, maps, tma_key_dim);
    } else {
      stream_cp_async(it, ptid);
    }
  }

  // The cp.async producer: thread ptid copies chunk column ptid % KCH of rows ptid / KCH + i
  // kRowsPerPass: within a column block the swizzle of those rows is the same (r & 7), so row i lies
  // i kRowsPerPass 128-byte rows after row 0's chunk.
  __device__ __forceinline__ void stream_cp_async(int it, int ptid) const {
    constexpr int kRowsPerPass = kProducerThreads / KCH;  // 8 (D = 128) or 16 (D = 64)
    static_assert(kBK % kRowsPerPass == 0 && kRowsPerPass % 8 == 0, "rows per pass");
    const int pr = ptid / KCH, cc = ptid % KCH;
    const int mask = (1 << kv.block_shift) - 1;
    const int64_t col = int64_t(kvh) * kv.head_stride + cc * 8;
    const uint32_t chunk_off = detail::sw128_offset(kBK, pr, cc);
    const int kt0 = kMasked ? w.first_key_tile : 0;
    const auto copy_tile = [&](const T* src, uint32_t dst, int kt) {
#pragma unroll
      for (int i = 0; i < kBK / kRowsPerPass; ++i) {
        const int key = kt * kBK + pr + i * kRowsPerPass;
        const bool ok = key < w.key_end && (!kMasked || key >= w.key_begin);
        int64_t off = 0;  // (a zero fill reads nothing; the address only has to be a valid one)
        if (ok) off = kv.row(table[key >> kv.block_shift], key & mask, 0) + col;
        detail::cp_async16_zfill(dst + i * kRowsPerPass * 128, src + off, ok);
      }
    };
    const int n = w.n_key_tiles - kt0;
    for (int j = 0; j < n + kVLag; ++j) {  // K(j), then V(j - kVLag)
      if (j < n) {
        const int st = (it + j) % kStages;
        detail::mbarrier_wait(empty_k + 8 * st, (((it + j) / kStages) & 1) ^ 1);  // both consumers' S is done
        copy_tile(k_cache, k_s + st * kTileBytes + chunk_off, kt0 + j);
        detail::cp_async_mbarrier_arrive_noinc(full_k + 8 * st);
      }
      if (j >= kVLag) {
        const int jv = j - kVLag;
        const int st = (it + jv) % kStagesV;
        detail::mbarrier_wait(empty_v + 8 * st, (((it + jv) / kStagesV) & 1) ^ 1);  // both consumers' P V is done
        copy_tile(v_cache, v_s + st * kTileBytes + chunk_off, kt0 + jv);
        detail::cp_async_mbarrier_arrive_noinc(full_v + 8 * st);
      }
    }
  }

  // The TMA producer (the header above). Lane p of warp 0 owns page p of each tile (at most 16:
  // R >= 8); the row copies of partly visible pages follow stream_cp_async's thread-to-chunk map.
  // Step j loads K(j), then V(j - kVLag), as stream_cp_async.
  __device__ __forceinline__ void stream_tma(int it, int ptid, const KvTmaMaps& maps, int tma_key_dim) const {
    const int kt0 = kMasked ? w.first_key_tile : 0;
    const int n = w.n_key_tiles - kt0;
    for (int j = 0; j < n + kVLag; ++j) {
      if (j < n) load_tile_tma<kStages>(it + j, kt0 + j, ptid, &maps.k, k_cache, k_s, full_k, empty_k, tma_key_dim);
      if (j >= kVLag)
        load_tile_tma<kStagesV>(it + j - kVLag, kt0 + j - kVLag, ptid, &maps.v, v_cache, v_s, full_v, empty_v,
                                tma_key_dim);
    }
  }

  // Key tile kt of one tensor (K or V: its map, cache, stages and barriers; S stages) into the stage
  // of running tile count `idx`.
  template <int S>
  __device__ __forceinline__ void load_tile_tma(int idx, int kt, int ptid, const CUtensorMap* map, const T* cache,
                                                uint32_t tiles_s, uint32_t full, uint32_t empty,
                                                int tma_key_dim) const {
    constexpr int kRowsPerPass = kProducerThreads / KCH;  // 8 (D = 128) or 16 (D = 64)
    static_assert(kBK % kRowsPerPass == 0 && kRowsPerPass % 8 == 0, "rows per pass");
    const int pw = ptid >> 5;
    const int pr = ptid / KCH, cc = ptid % KCH;
    const int mask = (1 << kv.block_shift) - 1;
    const int log_rows = kv.block_shift < 7 ? kv.block_shift : 7;  // R = min(block_size, kBK) rows per page
    const int pages = kBK >> log_rows;
    const uint32_t page_bytes = uint32_t(D * 2) << log_rows;
    const int st = idx % S;
    const uint32_t ph = (idx / S) & 1;
    const int k0 = kt * kBK;
    // Pages [p_lo, p_hi) are visible throughout (k0 < key_end: the walk's tiles hold a visible key).
    const int p_hi = min((w.key_end - k0) >> log_rows, pages);
    const int p_lo =
        kMasked && w.key_begin > k0 ? min((w.key_begin - k0 + (1 << log_rows) - 1) >> log_rows, pages) : 0;
    const uint32_t tx = p_hi > p_lo ? uint32_t(p_hi - p_lo) * page_bytes : 0u;
    // Lane p's page: its block and first key in the block, looked up before the wait.
    const int p = ptid;  // (warp 0 only)
    const bool tma_page = pw == 0 && p >= p_lo && p < p_hi;
    int block = 0, key_in_block = 0;
    if (tma_page) {
      const int key = k0 + (p << log_rows);
      block = table[key >> kv.block_shift];
      key_in_block = key & mask;
    }
    const uint32_t fb = full + 8 * st;
    detail::mbarrier_wait(empty + 8 * st, ph ^ 1);  // both consumers are done with its last tile
    if (pw == 0) {
      if (ptid == 0) detail::mbarrier_arrive_expect_tx(fb, tx);
      __syncwarp();
      if (tma_page) {
        const int c1 = tma_key_dim == 1 ? key_in_block : kvh, c2 = tma_key_dim == 1 ? kvh : key_in_block;
        const uint32_t dst = tiles_s + st * kTileBytes + uint32_t(p) * (128u << log_rows);  // rows p R .. of block 0
#pragma unroll
        for (int cb = 0; cb < D / 64; ++cb) detail::tma_load_4d(dst + cb * kBK * 128, map, cb * 64, c1, c2, block, fb);
      }
    }
    if (p_lo > 0 || p_hi < pages) {  // (uniform over the producer)
      // Rows of the pages TMA does not load: the visible ones copied, the others zeroed.
      // (Not unrolled: a rare path, kept within the producer's registers.)
      const int64_t col = int64_t(kvh) * kv.head_stride + cc * 8;
      const uint32_t d0 = tiles_s + st * kTileBytes + detail::sw128_offset(kBK, pr, cc);
#pragma unroll 1
      for (int i = 0; i < kBK / kRowsPerPass; ++i) {
        const int r = pr + i * kRowsPerPass;
        const int pg = r >> log_rows;
        if (pg >= p_lo && pg < p_hi) continue;
        const int key = k0 + r;
        const bool ok = key < w.key_end && (!kMasked || key >= w.key_begin);
        int64_t off = 0;  // (a zero fill reads nothing; the address only has to be a valid one)
        if (ok) off = kv.row(table[key >> kv.block_shift], key & mask, 0) + col;
        detail::cp_async16_zfill(d0 + i * kRowsPerPass * 128, cache + off, ok);
      }
      cp_async_commit();
      cp_async_wait_group<0>();
      detail::fence_proxy_async_shared();  // this thread's writes, seen by the consumers' wgmma
    }
    __syncwarp();
    if ((ptid & 31) == 0) detail::mbarrier_arrive(fb);
  }

  // A consumer's walk over all key tiles (WgCta::walk's products, masks and softmax for this
  // thread's two rows); `it` tiles were streamed before it.
  //
  // Turn i (0 .. n) issues tile i's S product and tile i - 1's P V product, S first (FlashAttention-3's
  // intra-warpgroup overlap): after wgmma.wait_group 1 S is done while P V still accumulates into O,
  // and this tile's mask and softmax run meanwhile. So the softmax must not touch O: its rescale
  // factor (o_scale) is applied after the wait for P V, when P is packed into pa (which P V reads).
  // The turns come in run_turns' straight-line kinds. Every turn waits on its tile's full
  // barriers, takes and hands over the turn and frees its stages (K once S is done, V once P V is),
  // so every barrier stays matched.
  template <bool kAsync>
  __device__ __forceinline__ void walk(int it, const AsyncRefs& u, float (&o)[D / 8][4], float (&l)[2],
                                       float (&m)[2]) const {
    clear_rows(o, l, m);
    const int g = lane >> 2, t = lane & 3;
    const int wg0 = cw * 64;             // the warpgroup's first row of the tile
    const int r0 = wg0 + warp * 16 + g;  // this thread's rows: r0, r0 + 8
    int lim[2], low[2];
    this->row_limits(r0, lim, low);
    const int kt0 = kMasked ? w.first_key_tile : 0;
    const int n = w.n_key_tiles - kt0;
    int a, b;
    prefill::warpgroup_tile_range(start, w, wg0, kBK, kt0, n, kMasked, a, b);
    const uint32_t q_addr = q_s + wg0 * 128;  // the warpgroup's rows of each column block
    const int own_turn = kBarTurn + cw, other_turn = kBarTurn + (cw ^ 1);
    float(&of)[D / 2] = reinterpret_cast<float(&)[D / 2]>(o);
    float o_scale[2] = {1.f, 1.f};  // O's rescale from this turn's softmax, due once P V is done
    uint32_t pa[kBK / 16][4];        // the last softmax's P, packed: the A fragments of its k-steps

    const auto turn = [&](int i, auto kind) {
      constexpr bool kS = decltype(kind)::kS, kPV = decltype(kind)::kPV;
      const int kt = kt0 + i;
      // This tile's K stage and the previous tile's V stage, with their phases.
      const int st = (it + i) % kStages, pst = (it + i + kStagesV - 1) % kStagesV;
      const uint32_t ph = ((it + i) / kStages) & 1, pph = ((it + i + kStagesV - 1) / kStagesV - 1) & 1;
      if (i < n) detail::mbarrier_wait(full_k + 8 * st, ph);
      if (i > 0) detail::mbarrier_wait(full_v + 8 * pst, pph);
      // The cp.async producer's copies, seen by wgmma (the TMA producer's land in the async proxy,
      // and it fences its own row copies before it arrives).
      if constexpr (!kTma) detail::fence_proxy_async_shared();
      if (cw == 1 || i > 0) detail::named_barrier_sync(own_turn, kConsumerThreads);

      float s[kBK / 8][4];
      float(&sf)[kBK / 2] = reinterpret_cast<float(&)[kBK / 2]>(s);
      if constexpr (kS) issue_s_product<T, D>(sf, q_addr, k_s + st * kTileBytes);
      if constexpr (kPV) issue_pv_product<T>(o, pa, v_s + pst * kTileBytes);  // the previous tile's
      if (cw == 0 || i < n) detail::named_barrier_arrive(other_turn, kConsumerThreads);  // the other's turn
      if constexpr (kS) detail::wgmma_pin(sf);
      if constexpr (kPV) detail::wgmma_pin(of);
      // S done (P V, committed after it, may still run): this tile's K is read.
      if constexpr (kS && kPV) {
        detail::wgmma_wait<1>();
      } else {
        detail::wgmma_wait<0>();
      }
      if constexpr (kS) detail::wgmma_pin(sf);
      if (i < n && lane == 0) detail::mbarrier_arrive(empty_k + 8 * st);
      if constexpr (kS) {
        mask_scores<kMasked>(s, kt, kBK, t, w, lim, low, softcap, scale);
        softmax_scores<kAsync, kMasked, kBK / 8, D / 8, true>(s, o, l, m, sl2, u, o_scale);
      }
      if constexpr (kS && kPV) detail::wgmma_wait<0>();
      if constexpr (kPV) detail::wgmma_pin(of);
      // P V done: the previous tile's V is read, O may take this softmax's rescale, and pa is free
      // for this tile's P. (O rescaled before the next turn's P V instead, between the products, made
      // ptxas serialize them: C7520, a compiler-inserted warpgroup arrive in a divergent path.)
      if (i > 0 && lane == 0) detail::mbarrier_arrive(empty_v + 8 * pst);
      if constexpr (kS) rescale_o_pack_p<T>(o, o_scale, s, pa);
    };

    run_turns(a, b, n, turn);
  }
};

template <class T, int D, int I, bool kMasked>
__global__ void __launch_bounds__(prefill::config_threads(prefill::kConfigs[I]), 1)
    prefill_attention_ws_kernel(PrefillArgs a, const __grid_constant__ KvTmaMaps maps) {
#if FDPP_WGMMA_DEVICE
  using Walk = WsCta<T, D, I, kMasked>;
  constexpr int KCH = D / 8;
  constexpr int kStages = Walk::kStages, kStagesV = Walk::kStagesV;
  extern __shared__ unsigned char smem_raw[];
  __shared__ __align__(8) uint64_t bars[2 * (kStages + kStagesV)];  // full K, full V, empty K, empty V
  __shared__ int fail_rows;

  Walk c;
  if (!c.template begin<kMasked>(a, Walk::kBQ, Walk::kBK)) return;  // uniform over the CTA
  const int h = blockIdx.x;
  const int q_row0 = c.q_row0;
  // Swizzled tiles need 1 KB alignment: the launch adds 1 KB of slack.
  c.q_s = (detail::smem_addr(smem_raw) + 1023u) & ~1023u;
  c.k_s = c.q_s + Walk::kBQ * D * 2;
  c.v_s = c.k_s + kStages * Walk::kTileBytes;
  c.full_k = detail::smem_addr(bars);
  c.full_v = c.full_k + 8 * kStages;
  c.empty_k = c.full_v + 8 * kStagesV;
  c.empty_v = c.empty_k + 8 * kStages;
  if (threadIdx.x == 0) {
    for (int st = 0; st < kStages; ++st) {
      detail::mbarrier_init(c.full_k + 8 * st, Walk::kFullArrivals);
      detail::mbarrier_init(c.empty_k + 8 * st, Walk::kConsumerThreads / 32);
    }
    for (int st = 0; st < kStagesV; ++st) {
      detail::mbarrier_init(c.full_v + 8 * st, Walk::kFullArrivals);
      detail::mbarrier_init(c.empty_v + 8 * st, Walk::kConsumerThreads / 32);
    }
    fail_rows = 0;
    detail::mbarrier_init_fence();
  }
  __syncthreads();  // the barriers initialized and fail_rows 0, for every warpgroup
  const int kt0 = kMasked ? c.w.first_key_tile : 0;
  const int tiles = c.w.n_key_tiles - kt0;  // per walk

  if (threadIdx.x < Walk::kProducerThreads) {
    // The producer: the async walk's keys, then, only if a row failed, the fallback walk's.
    detail::setmaxnreg_dec<Walk::kProducerRegs>();
    if (Walk::kTma && threadIdx.x == 0) {
      detail::prefetch_tensormap(&maps.k);
      detail::prefetch_tensormap(&maps.v);
    }
    c.stream(0, threadIdx.x, maps, a.tma_key_dim);
    if (a.async) {
      detail::named_barrier_sync(Walk::kBarVerdict, Walk::kThreads);
      if (fail_rows > 0) c.stream(tiles, threadIdx.x, maps, a.tma_key_dim);
    }
    cp_async_commit();
    cp_async_wait_group<0>();  // no copy outlives the producer
    return;
  }

  detail::setmaxnreg_inc<Walk::kConsumerRegs>();
  const int ctid = threadIdx.x - Walk::kProducerThreads;  // 0 .. 255
  c.cw = ctid >> 7;
  c.warp = (ctid >> 5) & 3;
  const int H = a.n_heads;
  const int64_t qkv_row = int64_t(H + 2 * a.n_kv_heads) * D;
  {
    // The warpgroup's 64 Q rows (rows past the chunk zero-filled), seen by its wgmma after the wait,
    // the proxy fence and the warpgroup's barrier.
    const T* q = static_cast<const T*>(a.qkv) + int64_t(h) * D;
#pragma unroll
    for (int i = ctid & 127; i < 64 * KCH; i += 128) {
      const int r = c.cw * 64 + i / KCH, cc = i % KCH;
      const bool ok = r < c.w.rows;
      const T* src = ok ? q + int64_t(q_row0 + c.w.q0 + r) * qkv_row + cc * 8 : q;
      detail::cp_async16_zfill(c.q_s + detail::sw128_offset(Walk::kBQ, r, cc), src, ok);
    }
    cp_async_commit();
    cp_async_wait_group<0>();
    detail::fence_proxy_async_shared();
    detail::named_barrier_sync(Walk::kBarQ + c.cw, 128);
  }

  float o[D / 8][4], l[2], m[2];
  const int g = c.lane >> 2, t = c.lane & 3;
  const int r0 = c.cw * 64 + c.warp * 16 + g;
  bool sums_reduced = false;
  if (a.async) {
    c.template walk<true>(0, a.um, o, l, m);
    const int bad = failed_rows(l, r0, c.w.rows, t);
    sums_reduced = true;
    if (bad > 0) atomicAdd(&fail_rows, bad);
    detail::named_barrier_sync(Walk::kBarVerdict, Walk::kThreads);  // with the producer
    const int failed = fail_rows;
    if (failed > 0) {
      if (ctid == 0 && a.fallback_rows != nullptr)
        atomicAdd(a.fallback_rows, static_cast<unsigned long long>(failed));
      c.template walk<false>(tiles, a.um, o, l, m);
      sums_reduced = false;
    }
  } else {
    c.template walk<false>(0, a.um, o, l, m);
  }
  store_wgmma_rows<T, D>(a, o, l, sums_reduced, r0, c.w.rows, q_row0 + c.w.q0, h, t);
#else
  __trap();  // never launched: launch() sends wgmma configurations elsewhere off sm_90a builds
#endif
}

template <class T, class KV, int D, int I, bool kMasked>
void launch_prefill(const PrefillArgs& a, int chunks, int max_chunk_tokens, cudaStream_t stream, const char* what) {
  using C = Cfg<I>;
  const prefill::Grid g = prefill::plan_grid(chunks, max_chunk_tokens, a.n_heads, C::kBQ);
  check(g.y <= 65535 && g.x <= 0x7fffffffu, "{}: {} query tiles of {} rows exceed the grid limit 65535", what, g.y,
        C::kBQ);
  const size_t smem = prefill::smem_bytes(D, C::kBQ, C::kBK, C::kStages, int(sizeof(KV)));
  auto* kernel = prefill_attention_kernel<T, KV, D, I, kMasked>;
  // Once per (instantiation, device): the attribute belongs to the current device.
  once_per_device(reinterpret_cast<const void*>(kernel), [&] {
    cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
               "cudaFuncSetAttribute(prefill_attention_kernel, max dynamic shared memory)");
  });
  kernel<<<dim3(g.x, g.y, g.z), C::kThreads, smem, stream>>>(a);
}

// The wgmma kernels' grid and shared memory (CTA type C, 16-bit tiles, 1 KB of slack: the kernel
// aligns its swizzled tiles to 1 KB), the kernel's shared-memory limit raised once per device.
template <class C, class Kernel>
size_t prepare_wgmma_launch(Kernel* kernel, const PrefillArgs& a, int chunks, int max_chunk_tokens, const char* what,
                            prefill::Grid& g) {
  g = prefill::plan_grid(chunks, max_chunk_tokens, a.n_heads, C::kBQ);
  check(g.y <= 65535 && g.x <= 0x7fffffffu, "{}: {} query tiles of {} rows exceed the grid limit 65535", what, g.y,
        C::kBQ);
  const size_t smem = prefill::config_smem_bytes(C::kConfig, C::kD) + 1024;
  once_per_device(reinterpret_cast<const void*>(kernel), [&] {
    cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
               "cudaFuncSetAttribute(prefill attention wgmma kernel, max dynamic shared memory)");
  });
  return smem;
}

template <class T, int D, int I, bool kMasked>
void launch_prefill_wgmma(const PrefillArgs& a, int chunks, int max_chunk_tokens, cudaStream_t stream,
                          const char* what) {
  using C = WgCta<T, D, I, kMasked>;
  auto* kernel = prefill_attention_wgmma_kernel<T, D, I, kMasked>;
  prefill::Grid g;
  const size_t smem = prepare_wgmma_launch<C>(kernel, a, chunks, max_chunk_tokens, what, g);
  kernel<<<dim3(g.x, g.y, g.z), C::kThreads, smem, stream>>>(a);
}

// cuTensorMapEncodeTiled, through the runtime's driver entry point (no link to libcuda).
using TensorMapEncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                          const cuuint64_t*, const cuuint32_t*, const cuuint32_t*,
                                          CUtensorMapInterleave, CUtensorMapSwizzle, CUtensorMapL2promotion,
                                          CUtensorMapFloatOOBfill);
TensorMapEncodeTiled tensor_map_encoder() {
  static const TensorMapEncodeTiled encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
    const cudaError_t err =
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found);
#else
    const cudaError_t err = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &fn, cudaEnableDefault, &found);
#endif
    check(err == cudaSuccess && found == cudaDriverEntryPointSuccess && fn != nullptr,
          "prefill attention: the driver has no cuTensorMapEncodeTiled ({}, query result {})", cudaGetErrorString(err),
          static_cast<int>(found));
    return reinterpret_cast<TensorMapEncodeTiled>(fn);
  }();
  return encode;
}

// The TMA producer's tensor map over one layer's K or V cache (WsCta::stream_tma): 4 dimensions,
// innermost first: D, then the key in its block and the kv head ordered by their strides (head-major:
// key, head; token-major: head, key; key_dim says which is 1), then the block. Box (64, R, 1, 1)
// (the head's 1 and the key's R = min(block_size, 128) in their dimensions): one 128-byte row segment
// per key, 128-byte swizzle. The block count is not known here; the map claims a bound no block
// number of a cache in one device's memory reaches (1 TB of blocks, at most 2^31 - 1), since no box
// is ever issued for a block the table does not hold.
template <class T>
CUtensorMap kv_tensor_map(const void* cache, int head_dim, int n_kv_heads, const KvCacheLayout& kv, int key_dim,
                          const char* what) {
  static_assert(sizeof(T) == 2, "16-bit cache");
  const uint64_t block_size = uint64_t(1) << kv.block_shift;
  const uint64_t rows = std::min<uint64_t>(block_size, 128);
  const uint64_t block_bytes = uint64_t(kv.block_stride) * 2;
  const uint64_t blocks = std::max<uint64_t>(1, std::min<uint64_t>((uint64_t(1) << 40) / block_bytes, 0x7fffffffu));
  const bool key_first = key_dim == 1;
  const cuuint64_t dims[4] = {cuuint64_t(head_dim), key_first ? block_size : cuuint64_t(n_kv_heads),
                              key_first ? cuuint64_t(n_kv_heads) : block_size, blocks};
  const cuuint64_t strides[3] = {cuuint64_t(key_first ? kv.token_stride : kv.head_stride) * 2,
                                 cuuint64_t(key_first ? kv.head_stride : kv.token_stride) * 2, block_bytes};
  const cuuint32_t box[4] = {64, cuuint32_t(key_first ? rows : 1), cuuint32_t(key_first ? 1 : rows), 1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  CUtensorMap map;
  const CUresult r = tensor_map_encoder()(
      &map, std::is_same_v<T, __half> ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4,
      const_cast<void*>(cache), dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  check(r == CUDA_SUCCESS,
        "{}: cuTensorMapEncodeTiled failed ({}) for the KV cache at {} (head_dim {}, {} kv heads, block_size {})", what,
        static_cast<int>(r), cache, head_dim, n_kv_heads, block_size);
  return map;
}

// kv_tensor_map, encoded once per set of inputs: a prefill step launches the TMA kernel twice per
// layer, and the map is a pure function of its inputs, so a hit needs no invalidation. Per thread
// (each device's engine runs its own); emptied when it holds kMaxMaps (caches come and go).
template <class T>
CUtensorMap cached_kv_tensor_map(const void* cache, int head_dim, int n_kv_heads, const KvCacheLayout& kv, int key_dim,
                                 const char* what) {
  using Key = std::tuple<const void*, int, int, int, int64_t, int64_t, int64_t, int>;
  constexpr size_t kMaxMaps = 1024;
  thread_local std::map<Key, CUtensorMap> maps;
  const Key key{cache, head_dim, n_kv_heads, kv.block_shift, kv.block_stride, kv.token_stride, kv.head_stride, key_dim};
  if (const auto it = maps.find(key); it != maps.end()) return it->second;
  if (maps.size() >= kMaxMaps) maps.clear();
  return maps.emplace(key, kv_tensor_map<T>(cache, head_dim, n_kv_heads, kv, key_dim, what)).first->second;
}

template <class T, int D, int I, bool kMasked>
void launch_prefill_ws(PrefillArgs a, int chunks, int max_chunk_tokens, cudaStream_t stream, const char* what) {
  using C = WsCta<T, D, I, kMasked>;
  auto* kernel = prefill_attention_ws_kernel<T, D, I, kMasked>;
  prefill::Grid g;
  const size_t smem = prepare_wgmma_launch<C>(kernel, a, chunks, max_chunk_tokens, what, g);
  KvTmaMaps maps;
  std::memset(&maps, 0, sizeof(maps));
  if constexpr (C::kTma) {
    // (launch: the block size fits, prefill::config_fits_cache.) Head-major (a kv head's keys of a
    // block adjacent, head_stride > token_stride): the key is the maps' dimension 1; token-major: 2.
    a.tma_key_dim = a.kv.head_stride > a.kv.token_stride ? 1 : 2;
    maps.k = cached_kv_tensor_map<T>(a.k_cache, D, a.n_kv_heads, a.kv, a.tma_key_dim, what);
    maps.v = cached_kv_tensor_map<T>(a.v_cache, D, a.n_kv_heads, a.kv, a.tma_key_dim, what);
  }
  kernel<<<dim3(g.x, g.y, g.z), C::kThreads, smem, stream>>>(a, maps);
}

// Whether the current device runs the wgmma kernels: built for sm_90a and a compute capability 9.x
// device (sm_90a code runs on 9.0 only).
bool wgmma_runs_here() {
#if defined(FDPP_BUILT_SM90A)
  return current_device_attribute(cudaDevAttrComputeCapabilityMajor) == 9 &&
         current_device_attribute(cudaDevAttrComputeCapabilityMinor) == 0;
#else
  return false;
#endif
}

// Configuration `config` at head dim D (one prefill::config_fits; launch() picks one), masked or not.
template <class T, class KV, int D, int I>
void launch_one(int config, const PrefillArgs& a, int chunks, int max_chunk_tokens, cudaStream_t stream,
                const char* what) {
  if constexpr (prefill::config_fits(prefill::kConfigs[I], D, int(sizeof(KV)))) {
    if (config != I) return;
    const bool masked = a.window > 0 || a.softcap > 0.f;
    if constexpr (prefill::kConfigs[I].wgmma) {
      if constexpr (!std::is_same_v<KV, T>) {
        // (config_fits: a 16-bit cache only)
      } else if constexpr (prefill::kConfigs[I].ws) {
        if (masked) {
          launch_prefill_ws<T, D, I, true>(a, chunks, max_chunk_tokens, stream, what);
        } else {
          launch_prefill_ws<T, D, I, false>(a, chunks, max_chunk_tokens, stream, what);
        }
      } else {
        if (masked) {
          launch_prefill_wgmma<T, D, I, true>(a, chunks, max_chunk_tokens, stream, what);
        } else {
          launch_prefill_wgmma<T, D, I, false>(a, chunks, max_chunk_tokens, stream, what);
        }
      }
    } else if (masked) {
      launch_prefill<T, KV, D, I, true>(a, chunks, max_chunk_tokens, stream, what);
    } else {
      launch_prefill<T, KV, D, I, false>(a, chunks, max_chunk_tokens, stream, what);
    }
  }
}

template <class T, class KV, int D, int... I>
void launch_config(int config, const PrefillArgs& a, int chunks, int max_chunk_tokens, cudaStream_t stream,
                   const char* what, std::integer_sequence<int, I...>) {
  (launch_one<T, KV, D, I>(config, a, chunks, max_chunk_tokens, stream, what), ...);
}

template <class T, class KV>
void launch_head_dim(int head_dim, int config, const PrefillArgs& a, int chunks, int max_chunk_tokens,
                     cudaStream_t stream, const char* what) {
  constexpr auto all = std::make_integer_sequence<int, prefill::kNumConfigs>{};
  if (head_dim == 64) {
    launch_config<T, KV, 64>(config, a, chunks, max_chunk_tokens, stream, what, all);
  } else if (head_dim == 96) {
    // (16-bit caches only: check_kv_quant refuses e4m3 at 96.)
    if constexpr (std::is_same_v<KV, T>) {
      launch_config<T, KV, 96>(config, a, chunks, max_chunk_tokens, stream, what, all);
    }
  } else if (head_dim == 128) {
    launch_config<T, KV, 128>(config, a, chunks, max_chunk_tokens, stream, what, all);
  } else {
    launch_config<T, KV, 256>(config, a, chunks, max_chunk_tokens, stream, what, all);
  }
}

void launch(PrefillArgs a, int chunks, int max_chunk_tokens, int head_dim, int block_size, float scale,
            const UnifiedMaxRange* unified_max, DType dtype, int config, const KvQuant& kv_quant, cudaStream_t stream,
            const char* what) {
  check(config >= 0 && config < prefill::kNumConfigs, "{}: tile configuration {} is not one of 0..{}", what, config,
        prefill::kNumConfigs - 1);
  check(a.qkv != nullptr && a.k_cache != nullptr && a.v_cache != nullptr && a.block_tables != nullptr &&
            a.out != nullptr,
        "{}: null pointer (qkv {}, k_cache {}, v_cache {}, block_tables {}, out {})", what, a.qkv, a.k_cache,
        a.v_cache, static_cast<const void*>(a.block_tables), a.out);
  check(a.n_heads > 0 && a.n_kv_heads > 0 && a.n_heads % a.n_kv_heads == 0,
        "{}: n_heads = {} must be a positive multiple of n_kv_heads = {}", what, a.n_heads, a.n_kv_heads);
  check(a.n_heads <= 0x7fffffff / 4, "{}: n_heads = {} is out of range", what, a.n_heads);
  check_kv_quant(kv_quant, head_dim, what);
  const bool fp8 = kv_quant.dtype == KvDType::Fp8E4M3;
  check(head_dim == 64 || head_dim == 96 || head_dim == 128 || head_dim == 256,
        "{}: head_dim = {} is not supported (64, 96, 128, 256)", what, head_dim);
  check(std::isfinite(scale) && scale > 0.f, "{}: scale = {} must be finite and positive", what, scale);
  // The kernel's logits are q . k of the stored values: k_scale joins the logit scale (the softcap
  // and the unified max see the true logits), v_scale multiplies the output.
  const float logit_scale = fp8 ? scale * kv_quant.k_scale : scale;
  a.v_scale = fp8 ? kv_quant.v_scale : 1.f;
  check(std::isfinite(logit_scale) && logit_scale > 0.f, "{}: scale = {} times k_scale = {} is out of range", what,
        scale, kv_quant.k_scale);
  check(a.window >= 0 && std::isfinite(a.softcap) && a.softcap >= 0.f && std::isfinite(a.softcap / logit_scale),
        "{}: window = {}, softcap = {} out of range", what, a.window, a.softcap);
  a.scale = logit_scale;
  // A configuration that does not run at this head dim (its shared memory, its registers), or a
  // wgmma one where the device or the build lacks sm_90a, gives way to the default, which runs
  // everywhere.
  if (!prefill_attention_config_runs(config, head_dim, kv_quant.dtype)) config = 0;
  check(aligned16(a.qkv) && aligned16(a.k_cache) && aligned16(a.v_cache) && aligned16(a.out),
        "{}: qkv, out and the k/v cache pointers must be 16-byte aligned", what);
  check(dtype == DType::F16 || dtype == DType::BF16, "{}: unknown dtype {}", what, static_cast<int>(dtype));
  check(chunks >= 1 && chunks <= 65535, "{}: chunks = {} must be in 1..65535 (grid z)", what, chunks);
  check(max_chunk_tokens >= 1, "{}: max_chunk_tokens = {} must be positive", what, max_chunk_tokens);
  a.group = a.n_heads / a.n_kv_heads;
  a.kv = kv_cache_layout(block_size, a.n_kv_heads, head_dim, what);
  // A TMA configuration over blocks too small for its page boxes takes its cp.async twin.
  if (!prefill::config_fits_cache(prefill::kConfigs[config], block_size))
    config = prefill::config_cache_fallback(config);
  a.scale_log2 = logit_scale * detail::kLog2e;
  a.async = unified_max != nullptr;
  if (a.async) {
    check(std::isfinite(unified_max->phi) && std::isfinite(unified_max->a) && std::isfinite(unified_max->b) &&
              unified_max->a < unified_max->b,
          "{}: unified max phi = {}, range [{}, {}] is not a finite, non-empty interval", what, unified_max->phi,
          unified_max->a, unified_max->b);
    float lo = 0.f, hi = 0.f;
    prefill::effective_range(dtype == DType::F16, unified_max->a, unified_max->b, &lo, &hi);
    check(hi > 0.f, "{}: unified max range [{}, {}] leaves 16-bit P no room above its reference", what,
          unified_max->a, unified_max->b);
    a.um = {unified_max->phi * detail::kLog2e, unified_max->a * detail::kLog2e, unified_max->b * detail::kLog2e,
            hi * detail::kLog2e};
  }
  detail::dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    if (fp8) {
      launch_head_dim<T, Fp8>(head_dim, config, a, chunks, max_chunk_tokens, stream, what);
    } else {
      launch_head_dim<T, T>(head_dim, config, a, chunks, max_chunk_tokens, stream, what);
    }
  });
  check_launch(what);
}

}  // namespace

int prefill_attention_configs() { return prefill::kNumConfigs; }

const char* prefill_attention_config_name(int config) {
  return config >= 0 && config < prefill::kNumConfigs ? prefill::kConfigs[config].name : nullptr;
}

bool prefill_attention_config_runs(int config, int head_dim, KvDType kv_dtype) {
  if (config < 0 || config >= prefill::kNumConfigs) return false;
  const prefill::TileConfig& c = prefill::kConfigs[config];
  return prefill::config_fits(c, head_dim, static_cast<int>(kv_element_bytes(kv_dtype))) &&
         (!c.wgmma || wgmma_runs_here());
}

int prefill_attention_config_index(const char* name) {
  for (int i = 0; name != nullptr && i < prefill::kNumConfigs; ++i)
    if (std::strcmp(prefill::kConfigs[i].name, name) == 0) return i;
  return -1;
}

UnifiedMaxRange prefill_attention_effective_range(const UnifiedMaxRange& range, DType dtype) {
  UnifiedMaxRange r = range;
  prefill::effective_range(dtype == DType::F16, range.a, range.b, &r.a, &r.b);
  return r;
}

void prefill_attention_varlen(const void* qkv, const void* k_cache, const void* v_cache, const int32_t* block_tables,
                              int max_blocks_per_seq, const int32_t* q_begin, const int32_t* starts, int chunks,
                              int total_q_tokens, int max_chunk_tokens, int n_heads, int n_kv_heads, int head_dim,
                              int block_size, float scale, const UnifiedMaxRange* unified_max,
                              unsigned long long* fallback_rows, void* out, DType dtype, cudaStream_t stream,
                              int config, int window, float softcap, const KvQuant& kv_quant) {
  check(q_begin != nullptr && starts != nullptr, "prefill_attention_varlen: null q_begin or starts");
  check(max_blocks_per_seq >= 1, "prefill_attention_varlen: max_blocks_per_seq = {} must be positive",
        max_blocks_per_seq);
  check(total_q_tokens >= 1 && max_chunk_tokens <= total_q_tokens,
        "prefill_attention_varlen: max_chunk_tokens = {} must be in 1..total_q_tokens = {}", max_chunk_tokens,
        total_q_tokens);
  PrefillArgs a{};
  a.qkv = qkv;
  a.k_cache = k_cache;
  a.v_cache = v_cache;
  a.block_tables = block_tables;
  a.max_blocks_per_seq = max_blocks_per_seq;
  a.q_begin = q_begin;
  a.starts = starts;
  a.n_heads = n_heads;
  a.n_kv_heads = n_kv_heads;
  a.fallback_rows = fallback_rows;
  a.out = out;
  a.window = window;
  a.softcap = softcap;
  launch(a, chunks, max_chunk_tokens, head_dim, block_size, scale, unified_max, dtype, config, kv_quant, stream,
         "prefill_attention_varlen");
}

void prefill_attention(const void* qkv, const void* k_cache, const void* v_cache, const int32_t* block_table,
                       int start_pos, int n_tokens, int n_heads, int n_kv_heads, int head_dim, int block_size,
                       float scale, void* out, DType dtype, cudaStream_t stream, const UnifiedMaxRange* unified_max,
                       unsigned long long* fallback_rows, int config, int window, float softcap,
                       const KvQuant& kv_quant) {
  check(n_tokens > 0, "prefill_attention: n_tokens = {} must be positive", n_tokens);
  check(start_pos >= 0 && int64_t(start_pos) + n_tokens <= 0x7fffffff,
        "prefill_attention: start_pos = {} with {} tokens is out of range", start_pos, n_tokens);
  PrefillArgs a{};
  a.qkv = qkv;
  a.k_cache = k_cache;
  a.v_cache = v_cache;
  a.block_tables = block_table;
  a.max_blocks_per_seq = 0;  // one chunk: its table is row 0
  a.single_start = start_pos;
  a.single_n = n_tokens;
  a.n_heads = n_heads;
  a.n_kv_heads = n_kv_heads;
  a.fallback_rows = fallback_rows;
  a.out = out;
  a.window = window;
  a.softcap = softcap;
  launch(a, 1, n_tokens, head_dim, block_size, scale, unified_max, dtype, config, kv_quant, stream,
         "prefill_attention");
}

}  // namespace fdpp::cuda
