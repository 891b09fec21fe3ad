// Decode attention over the paged KV cache: one query token per sequence.
//
// Two main loops share one prologue (indices, the CTA's key slice) and one epilogue (the merge of
// the warps, the split-KV partials, the unified-max guard):
//   * CUDA cores (described first below): one query head per CTA (MHA at head_dim 64, MHA at 128 on
//     short rows at small batch, and GQA groups split into single heads at small batch) at head_dim
//     64 and 128; synchronized mode only (the async mode runs the synchronized kernels there:
//     decode_attention_async).
//   * Tensor cores (mma_loop, described after it): every CTA with two or more query heads, every
//     CTA at head_dim 80, 96 and 256, and MHA at head_dim 128 but on short rows at small batch
//     (choose_loop).
// KernelOptions::decode_path (kernel_options.h) forces one of them (for measuring one against the
// other; core only exists at head_dim 64 and 128).
//
// Design of the CUDA-core loop (the synchronized FlashDecoding-style softmax inside each warp); the
// split-KV kernels below (sync, and the asynchronized FlashDecoding++ one with the unified max, whose
// warps convert their sums to phi after the loop) reuse its tiling:
//   * One CTA per (sequence, kv head [, sub-group of 16 query heads when the group is larger]). It
//     handles every query head of the GQA group, so each K/V vector is read from memory once for the
//     whole group.
//   * The CTA's 8 warps take 32-key tiles round-robin (tile t -> warp t % 8). A warp copies its
//     tile's 32 K rows and 32 V rows into its own shared-memory stage with cp.async, coalesced (a
//     row's 16-byte chunks on consecutive lanes, the rows' offsets broadcast from the lanes that
//     looked them up in the block table): K and V of the tile are in flight together, one memory
//     round trip per tile. (First version, measured on the H200, B 1, 32/8 heads, D 128, L 4K:
//     lane-per-key K loads from global and V read row by row in the P.V loop: 132 us; V staged
//     with lane-per-key cp.async: 98 us, and batched cases got slower from the uncoalesced
//     pattern.)
//   * Within a tile each lane owns one key: it reads its K row from the stage (rows padded by 16
//     bytes: conflict-free) and computes its dot product with all the group's query heads (q is in
//     shared memory as fp32, pre-multiplied by scale * log2(e), read as warp-wide broadcasts). No
//     shuffles per key.
//   * Per warp and head an online softmax: running max m, per-lane partial sums d, accumulator o
//     (lane owns D/32 output dims). Per tile: warp max of the 32 logits (5 shuffles), rescale by
//     exp2(m_old - m_new), probabilities to a per-warp shared array, then P.V where each lane reads
//     its D/32 dims of each key's V row from shared memory.
//   * At the end the 8 warps' (m, d, o) are merged in shared memory: o = sum_w 2^(m_w-M) o_w /
//     sum_w 2^(m_w-M) d_w, M = max_w m_w. Warps that saw no key hold m = -inf and contribute 0.
// Stability: every exponent is (logit - running max) <= 0; masked lanes use -inf, exp2(-inf) = 0;
// a tile is only processed when it holds at least one valid key, so the running max is finite
// after the first tile and no inf - inf arises (logits of +-1e4 are fine in fp32).
// Head counts: the group (H / KVH) is padded up to GMAX in {1, 2, 4, 8, 16} (the padded heads get
// q = 0 and are never written); groups above 16 are split over several CTAs of 16 heads.
//
// Design of the tensor-core loop (the query group as a flat GEMM, as flat_gemm pads M):
//   * The CTA's query heads (up to 16) are the M = 16 rows of mma.sync m16n8k16 (rows past the group
//     are q = 0 and never written). Q sits in shared memory as 16-bit (unscaled: S is scaled in
//     fp32 after the mma) and, up to head_dim 128, in registers as A fragments for the whole walk.
//   * Warps take 16-key tiles (32-key at head_dim 64 with 8 warps: MmaShape) round-robin (tile t ->
//     warp t % W; W = 8, 4 at head_dim 256) through a private ring of 3 stages: two tiles of K and V
//     are in flight per warp while the third is computed (per SM 8 x 2 x 8.7 KB = 139 KB in flight
//     at head_dim 128, past the ~35 KB that 4.46 TB/s x ~1 us of latency / 132 SMs needs). No CTA
//     barrier inside the loop.
//   * Rows are staged D wide with their 16-byte chunks XOR-swizzled by row at head dims 64, 128 and
//     256, padded by 16 bytes at 80 and 96 (staged(): the 8 rows an ldmatrix reads hit 8 different
//     bank groups either way; unpadded rows let the K/V copies stream ~5% faster). Keys past the end
//     are zero-filled (cp.async src-size 0): P is 0 there, and 0 * garbage could be NaN.
//   * S = Q K^T: D/16 mma per 8 keys; K fragments by ldmatrix (non-transposed). Online softmax per
//     row (quad shuffles) with a lazy reference max (kRescaleSlack: o and d are rescaled only when a
//     row's max grows by more than 2^8), the scale folded into the exponent's FMA, P converted to
//     16-bit in registers (the accumulator layout of S is the A layout of P V), P V: D/8 mma per tile
//     with V fragments by ldmatrix.trans.
//   * The loop is not bound by its instructions: the former one (per-lane block-table lookups and
//     shuffles for every row, a rescale of o every tile, the scale and the mask on every logit) took
//     485 instructions per 16-key tile at head_dim 128 (SASS), this one ~260, and both stream at 83%
//     of the bandwidth at 32/8, batch 8, 16K (docs/results/2026-12-01h-lean-loop.md). It was held
//     by the block-table read at each issue (now read 32 issues ahead: up to 7% faster; 64-token
//     blocks, which had gained 5-7% by reading the table a quarter as often, now gain ~1%). The
//     paged layout costs 1-2% (a nearly contiguous cache, head-major with sequential 256-token
//     blocks, the layout cuDNN reads, measured 0.99x at the median; docs/results/2026-12-01n-splits.md).
//     The loop runs within 1-3.5% of the time a pure copy of its access pattern takes
//     (bench/kernels/kv_stream_bench.cu). With rows padded to D + 8 elements in shared memory every
//     per-group pattern tried read at most 96-97.5% of what a whole-GPU linear sweep reads
//     (docs/results/2026-12-01p-stream-patterns.md); unpadded, the same warp rings read as much as the
//     sweep (docs/results/2026-12-01s-unpadded-rows.md): the ~5% cuDNN's kernel streamed faster at large
//     sizes. Bulk (TMA) row copies on mbarriers measured 1-15% slower; tensor-map boxes of whole tiles
//     (64 x 16 with the hardware swizzle, one lane per warp issuing) the same speed, 1.002x the time
//     (docs/results/2026-12-01u-copies-and-combines.md).
//   * The first tiles' copies are issued before the wait for the previous kernel (programmatic
//     launch): only the row's last key is written by the kernels the launch overlaps (kernels.h).
//   * The async (unified max) mode keeps the warp's own reference max inside the loop and converts
//     the warp's sums to phi once at the end (o, d times 2^(m_w - phi)), so P stays <= 2^8 and fp16
//     P keeps the full [a, b] range of the guard (a P of e^(x - phi) up to e^13.7 would overflow
//     fp16). What the unified max saves, the exchange of maxima between splits, is unchanged.
//
// Async reduction and fallback. One split: there is nothing to unify, and the async mode runs the
// synchronized kernel (exact for any logits; see decode_attention_async); the same where a launch
// would run the CUDA-core loop (measured faster synchronized). Several splits on tensor cores: each
// CTA writes its partial (sums relative to phi, and its max logit); a second, wide launch
// (decode_async_combine_kernel, one CTA per row) adds them (in a fixed order: deterministic), checks
// the guard and recomputes rows out of range exactly; or, few splits (KernelOptions::async_combine: 2
// up to 8K keys, up to 4 at batch 1), the group's last CTA to arrive at its semaphore does the same
// in the kernel, without the launch, and recomputes rows out of range itself with the synchronized
// loop (no fallback launch: the former fixed fallback grid cost 0.3-1.6 us per call at small sizes,
// issue 13). (The in-kernel reduction alone was slow with many splits: 41.6 us at 32/2 heads, B 1,
// 16K, sync 19.6; docs/results/2026-12-01a-attention-grid.md.)
// A context length <= 0 writes zeros (padding rows of a fixed-size batch); lengths beyond the
// block table's capacity (max_blocks_per_seq * block_size) are clamped to it.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kv_cache_layout.h"
#include "backend/cuda/mma_fragments.cuh"
#include "backend/cuda/per_device.h"

namespace fdpp::cuda {

namespace {

using detail::aligned16;
using detail::check_launch;
using detail::cuda_check;
using detail::from_float;
using detail::to_float;
using detail::warp_max;
using detail::warp_sum;

// Warps per CTA, a template parameter of both loops (W). 8 is the default at head_dim <= 128: one CTA
// per SM at head_dim 128 (135 KB of shared memory on CUDA cores, 214 KB on tensor cores). Auto
// (KernelOptions::decode_warps 0) takes 4 instead where the tensor-core loop has enough CTA groups
// to fill two CTAs per SM (choose_loop, with the H200 measurements). An earlier CUDA-core kernel
// measured 4 warps no better anywhere and 10-50% slower at batch 1 (docs/performance-log.md), with
// a split plan that counted one CTA per SM; plan_decode_splits now counts the resident CTAs.
// Head dims 80, 96 and 256 keep their fixed count (8, 8, 4).
constexpr int kDefaultWarps = 8;

// Shared memory an SM gives its CTAs (228 KB on the H100/H200), and what each CTA costs on top of
// its own (1 KB reserved by the system; docs: "CUDA C++ Programming Guide, shared memory").
constexpr size_t kSmemPerSmBytes = 228 * 1024;
constexpr size_t kSmemReservedPerCta = 1024;
// CTAs of `threads` threads and `smem` bytes that fit on one SM by shared memory and threads (2048
// per SM); registers are the compiler's part, bound by __launch_bounds__ below.
constexpr int resident_ctas(int threads, size_t smem) {
  const size_t by_smem = kSmemPerSmBytes / (smem + kSmemReservedPerCta + 64);  // + the flag after it (kFlagBytes)
  const size_t by_threads = size_t(2048 / threads);
  const size_t n = by_smem < by_threads ? by_smem : by_threads;
  return n < 1 ? 1 : static_cast<int>(n);
}

// The most splits a launch takes (the synchronized combine keeps one weight per split in shared memory).
constexpr int kMaxSplits = 1024;

struct DecodeArgs {
  const void* qkv;
  const void* k_cache;
  const void* v_cache;
  const int32_t* block_tables;
  int max_blocks_per_seq;
  const int32_t* context_lens;
  int batch, n_heads, n_kv_heads, group, n_sub;
  int gmax;  // query heads per CTA (sub-group size; the last sub-group may have fewer)
  int n_groups;  // CTA groups: batch x n_kv_heads x n_sub (plan_groups, once per call)
  KvCacheLayout kv;  // where a key's row of a kv head sits in the paged cache (kv_cache_layout.h)
  float scale_log2;  // scale * log2(e)
  void* out;
  // Split-KV (splits > 1): CTA (.., split) takes the split-th slice of the key tiles and writes
  // its partial to `partials` [batch][H][splits][D + 2] = (m, d, o[D]). Sync mode: m is the
  // slice's running max, d and o are relative to it, and decode_combine_kernel merges the slices.
  // Async mode: m is the slice's max logit (for the guard only), d and o are relative to the
  // unified max phi, and decode_async_combine_kernel adds them up (no rescaling).
  int splits;
  float* partials;
  // Async (unified max) mode, all in log2 units (x * log2 e): phi and the safe range [lo, hi] of
  // (row max - phi). Rows outside it are recomputed by the CTA that finds them.
  float phi2, lo2, hi2;
  // Per-group semaphores of the in-kernel reduction (kKernelCombine): counters[2 + group], zero
  // before the launch and left zero by the group's last CTA. (Ints 0 and 1 are unused: the former
  // fallback list's count; the interface's sizing keeps them.)
  int* counters;
  unsigned long long* fallback_rows;  // cumulative count of rows recomputed (nullable)
};

// ---- shared memory layouts ---------------------------------------------------------------------
// Both loops start with the per-warp merge inputs m [W][GMAX], d [W][GMAX] (fp32); the loop's own
// buffers follow, and after the loop o [W][GMAX][D] (fp32) overlays the loop's K/V stages.

// Staged K/V rows (both loops). A row of D 16-bit elements is D / 8 chunks of 16 bytes; reads take
// one chunk from each of 8 consecutive rows (ldmatrix; the CUDA-core loop's quarter-warp of keys),
// which with rows a multiple of 128 bytes apart all fall on the same 4 banks. Where a row has a
// multiple of 8 chunks (head dims 64, 128, 256) chunk c of row r is stored at c ^ (r & 7): the 8 rows
// of a read hit 8 different chunk positions, and a row stays D elements wide, so each warp's
// cp.async writes whole 128-byte lines of shared memory. Otherwise (80, 96) rows are padded by 16
// bytes (D + 8 elements), which also starts the 8 rows 4, 12 or 20 banks apart. The padded rows
// cost bandwidth: a pure copy of the tensor-core loop's pattern (bench/kernels/kv_stream_bench.cu,
// 8-warp rings of 16-key tiles, one split, token-major; H200, same call) streamed 4307-4371 GB/s into
// padded rows and 4520-4666 into unpadded ones (32/8 batch 64, 16K; 32/2 batch 64, 64K; 32/32 batch
// 8, 16K), where a linear sweep of the same bytes read 4593-4624 (docs/results/
// 2026-12-01s-unpadded-rows.md). The kernel gained 1-10% per context (geomeans), most where few CTAs
// stream: 32/2 batch 8, 16K keys, 2 splits (64 CTAs) 96.4 -> 57.4 us.
template <int D>
constexpr bool kSwizzledRows = (D / 8) % 8 == 0;
template <int D>
constexpr int kStagedRow = kSwizzledRows<D> ? D : D + 8;  // elements from one staged row to the next
// Element offset of chunk c of staged row r.
template <int D>
__device__ __forceinline__ int staged(int r, int c) {
  return r * kStagedRow<D> + (kSwizzledRows<D> ? c ^ (r & 7) : c) * 8;
}

template <int D, int GMAX, int W>
struct CoreShape {
  static constexpr int kWarps = W;
  static constexpr int kKeys = 32;  // keys per tile
  // K and V tile staging (16-bit, per warp [32][kStagedRow] then [32][D]) during the loop; o per warp
  // ([kWarps][GMAX][D] fp32) for the final merge, in the same bytes.
  static constexpr size_t kStageBytes = sizeof(uint16_t) * kWarps * 32 * (kStagedRow<D> + D);
  static constexpr int kOStride = D;  // floats per row of o (lanes write consecutive dims: no conflict)
  static constexpr size_t kOBytes = sizeof(float) * kWarps * GMAX * kOStride;
  static constexpr size_t kSmem = sizeof(float) * 2 * kWarps * GMAX  // m, d per warp (merge)
                                  + sizeof(float) * GMAX * D           // q (scaled)
                                  + sizeof(float) * kWarps * GMAX * 32  // probabilities of the tile, per warp
                                  + (kStageBytes > kOBytes ? kStageBytes : kOBytes);
};

// Tensor-core loop (GMAX is always 16: the M of the mma). 3 stages of one tile per warp; W warps
// (8 by default, 4 at head_dim 256, where 8 x 3 stages would not fit in 227 KB; 4 at 64 and 128 with
// KernelOptions::decode_warps 4: 107 KB at head_dim 128, two CTAs per SM). Stage counts and warps
// await measurement on the H200 (chosen by the in-flight bytes argument in the header comment).
// A tile is 16 keys, or 32 at head_dim 64 with 8 warps: 8 KB of K and V like a 16-key tile at 128,
// so each iteration's fixed work (wait, issue, max, vote) is shared by twice the bytes. H200, fp16,
// against 16-key tiles and the former split plan over batch 1-64 x 512-64K keys, geomeans of the time
// (docs/results/2026-12-02a-wide-tiles-plan.md): 32/2 heads 0.92x (batch 1, 64K keys 15.5 -> 11.6
// us), 32/8 0.96x, MHA 1.00x. Not kept: 32-key tiles with 4 warps (two CTAs per SM instead of four:
// 4-7% slower where that adds a wave, at 512-1K keys) and at head_dim 128 with 4 warps (16 KB
// tiles; where the launcher runs 4 warps up to 10% slower, 1.4-1.5% over the 32/8 and MHA grids).
template <int D, int W>
struct MmaShape {
  static constexpr int kWarps = W;
  static constexpr int kStages = 3;
  // Keys per tile: 16, or 32 at head_dim 64 with 8 warps (above).
  static constexpr int kKeys = D == 64 && W == 8 ? 32 : 16;
  static constexpr int kStride = D + 8;  // 16-bit elements per row of q (16-byte pad)
  static constexpr size_t kTileBytes = sizeof(uint16_t) * 2 * kKeys * kStagedRow<D>;  // K and V of a tile
  static constexpr size_t kStageBytes = size_t(kWarps) * kStages * kTileBytes;
  // Floats per row of o after the loop. A lane stores float2s of rows lane / 4 and + 8 at columns
  // 2 (lane % 4) + 8 n: with rows D floats apart (a multiple of 32 banks) the 4 rows of a half-warp
  // hit the same 8 banks (4-way conflicts on all 2 x D / 8 stores of every warp); 8 more floats
  // put them 8 banks apart. With the merge by 4 dims (attend_group) the CTA's end went from ~3.4 to
  // ~1.5 us at 32/2 heads, batch 64, 1K keys, and GQA/MQA 3-14% faster up to 4K keys (geomeans per
  // context; docs/results/2026-12-01q-prewait-merge.md).
  static constexpr int kOStride = D + 8;
  static constexpr size_t kOBytes = sizeof(float) * kWarps * 16 * kOStride;
  static constexpr size_t kSmem = sizeof(float) * 2 * kWarps * 16 + sizeof(uint16_t) * 16 * kStride +
                                  (kStageBytes > kOBytes ? kStageBytes : kOBytes);
  static_assert(kSmem <= 227 * 1024, "shared memory");
};

// Lazy rescaling in the tensor-core loop: a row's reference max moves (and o, d are rescaled) only
// when a tile's max passes it by more than this many log2 units, so in steady state a tile costs no
// rescale (64 multiplies per lane at head_dim 128). P = 2^(x - m) <= 2^8 stays exact enough in fp16
// and bf16 (their relative precision does not depend on the magnitude; fp16 overflows at 2^16).
constexpr float kRescaleSlack = 8.f;

template <int D, int GMAX, bool kMma, int W>
struct ShapeOf {
  using type = CoreShape<D, GMAX, W>;
};
template <int D, int GMAX, int W>
struct ShapeOf<D, GMAX, true, W> {
  using type = MmaShape<D, W>;
};
// The default warps of a head dim (both loops).
template <int D>
constexpr int default_warps() {
  return D > 128 ? 4 : kDefaultWarps;
}

// 4 or 2 consecutive 16-bit values -> floats (8- or 4-byte load).
template <class T, int N>
__device__ __forceinline__ void load_small(const T* p, float (&f)[N]) {
  static_assert(N == 2 || N == 4, "N");
  if constexpr (N == 4) {
    const uint2 u = *reinterpret_cast<const uint2*>(p);
    const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
    for (int i = 0; i < 4; ++i) f[i] = to_float(e[i]);
  } else {
    const uint32_t u = *reinterpret_cast<const uint32_t*>(p);
    const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
    for (int i = 0; i < 2; ++i) f[i] = to_float(e[i]);
  }
}

// One element of a split's partial result [m, d, o[D]]: o[dim], and m and d with dim 0.
__device__ __forceinline__ void write_partial(float* p, int dim, float m, float d, float o) {
  p[2 + dim] = o;
  if (dim == 0) {
    p[0] = m;
    p[1] = d;
  }
}

// Waits until at most one cp.async group of this thread is still in flight.
__device__ __forceinline__ void cp_async_wait_one() { asm volatile("cp.async.wait_group 1;\n" ::: "memory"); }

// What both loops need to know about the CTA's row.
struct RowSlice {
  int b, kvh, head0, gc;  // sequence, kv head, first query head, query heads of this CTA
  int L;                  // keys of the row
  int tile_begin, tile_end;  // this CTA's key tiles (of the loop's tile size)
};

// K/V copies global -> shared (bypassing L1) with an L2 prefetch size of 128 bytes (the qualifier
// CUTLASS's cp.async uses). A/B on the H200, same session, fp16, D 128, blocks shuffled
// (docs/results/2026-12-01k-l2-prefetch.md), none / 128B / 256B: 32/8 batch 64, 16K 1048.5 /
// 1023.2 / 1038.4 us; 64K 4158.4 / 4057.0 / 4111.9; 32/2 batch 64, 64K 1068.4 / 1045.8 / 1067.3;
// 32/32 batch 8, 16K sync 517.2 / 504.2 / 513.2, async 556.6 / 537.9 / 603.5: 128B is 1.5-4% faster
// at large sizes and no slower elsewhere; 256B is slower for MHA.
__device__ __forceinline__ void kv_copy16(void* smem_dst, const void* gmem_src) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16;\n" ::"r"(dst), "l"(gmem_src) : "memory");
}
// The same, writing 16 zero bytes instead when !valid (src-size 0: nothing is read).
__device__ __forceinline__ void kv_copy16_zfill(void* smem_dst, const void* gmem_src, bool valid) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem_src), "r"(src_bytes)
               : "memory");
}

// Element offset of key j's row of kv head kvh (btab: the sequence's block table).
__device__ __forceinline__ int64_t cache_row(const DecodeArgs& a, const int32_t* btab, int j, int kvh) {
  return a.kv.row(btab[j >> a.kv.block_shift], j & ((1 << a.kv.block_shift) - 1), kvh);
}

// ---- CUDA-core loop -------------------------------------------------------------------------------
// Leaves per warp (m, d, o) for the merge in m_s, d_s, o_s (returned) and ends with a barrier.
template <class T, int D, int GMAX, int kWarps>
__device__ __forceinline__ float* core_loop(const DecodeArgs& a, const RowSlice& r, unsigned char* body, float* m_s,
                                            float* d_s) {
  static_assert(D == 64 || D == 128, "head_dim");
  constexpr int VPL = D / 32;  // output dims per lane
  constexpr int CH = D / 8;    // 16-byte chunks per K row
  constexpr int KS = kStagedRow<D>;
  constexpr int RPS = 32 / CH;  // rows copied per warp-wide step (one chunk per lane)
  constexpr int kThreads = kWarps * 32;

  float* q_s = reinterpret_cast<float*>(body);  // [GMAX][D]
  float* p_s = q_s + GMAX * D;                  // [kWarps][GMAX][32]
  float* o_s = p_s + kWarps * GMAX * 32;        // [kWarps][GMAX][D] (after the loop)
  T* stage = reinterpret_cast<T*>(o_s);         // per warp K [32][KS] (staged()), V [32][D] (loop)

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int L = r.L, tile_end = r.tile_end, kvh = r.kvh;
  const int H = a.n_heads, KVH = a.n_kv_heads;
  const T* k_cache = static_cast<const T*>(a.k_cache);
  const T* v_cache = static_cast<const T*>(a.v_cache);
  const int32_t* btab = a.block_tables + int64_t(r.b) * a.max_blocks_per_seq;

  // m is the warp's running max, d and o are relative to it. Synchronized mode only: an async
  // (unified max) variant of this loop, with its sums converted to phi after the loop (or, earlier,
  // p = 2^(s - phi) inside it), streamed at 86-88% of the bandwidth where this one reaches 93-96%
  // (MHA 32/32; docs/results/2026-12-01i and j), whatever its instruction count (792-953 per tile in
  // three builds) and also with the mode a run-time argument of one kernel (sync then ran at async's
  // speed; docs/results/2026-12-01m). The async mode runs the synchronized kernels wherever a launch
  // would take this loop (decode_attention_async).
  float m[GMAX], dl[GMAX], o[GMAX][VPL];
#pragma unroll
  for (int g = 0; g < GMAX; ++g) {
    m[g] = -INFINITY;
    dl[g] = 0.f;
#pragma unroll
    for (int v = 0; v < VPL; ++v) o[g][v] = 0.f;
  }

  float* p_w = p_s + warp * GMAX * 32;
  T* k_w = stage + warp * 32 * (KS + D);
  T* v_w = k_w + 32 * KS;
  const int copy_row = lane / CH, copy_chunk = lane % CH;
  // This lane's key of a tile: its block-table entry (read one tile of the warp ahead, so the load's
  // latency is not between one tile's wait and the next tile's copies) and, from it, the element offset
  // of its row (head kvh); 0 for keys past the end.
  auto key_entry = [&](int tile) -> int32_t {
    const int j = (tile << 5) + lane;
    return tile < tile_end && j < L ? btab[j >> a.kv.block_shift] : 0;
  };
  auto key_row = [&](int tile, int32_t entry) -> int64_t {
    const int j = (tile << 5) + lane;
    if (j >= L) return 0;
    return a.kv.row(entry, j & ((1 << a.kv.block_shift) - 1), kvh);
  };
  // Stage a tile's K (or V) rows with cp.async, coalesced: the lanes copy consecutive 16-byte
  // chunks of RPS rows per step, the rows' offsets broadcast from the lanes that looked them up.
  // K rows are laid out by staged() (the lanes then read 8 keys' same chunk per quarter-warp), V rows
  // plain D wide (the lanes read consecutive dims of one key).
  auto stage_rows = [&](int tile, int64_t row, const T* src_cache, T* dst, bool is_k) {
    const int n_valid = min(32, L - (tile << 5));
#pragma unroll
    for (int step = 0; step < 32 / RPS; ++step) {
      const int jj = step * RPS + copy_row;
      const int64_t src = __shfl_sync(0xffffffffu, row, jj);
      const int at = is_k ? staged<D>(jj, copy_chunk) : jj * D + copy_chunk * 8;
      if (jj < n_valid) kv_copy16(dst + at, src_cache + src + copy_chunk * 8);
    }
  };
  // Software pipeline per warp (two cp.async groups in flight): while the logits of tile t are
  // computed, V(t) is loading; while P.V(t) runs, K(t + 8) is loading; V(t + 8) is issued right
  // after P.V(t). Without it (load, wait, compute) the loads and the math of a warp never overlap
  // and the kernel reached 61% of read bandwidth at GQA 32/8, B 1, L 64K (docs/performance-log.md).
  int tile = r.tile_begin + warp;
  int64_t row = tile < tile_end ? key_row(tile, key_entry(tile)) : 0;
  int32_t entry_ahead = key_entry(tile + kWarps);  // of the warp's next tile
  // The first tile before pdl_wait where it holds only keys before the row's last (as in mma_loop).
  auto stage_first_tile = [&] {  // two cp.async groups, K then V
    if (tile < tile_end) stage_rows(tile, row, k_cache, k_w, true);
    detail::cp_async_commit();
    if (tile < tile_end) stage_rows(tile, row, v_cache, v_w, false);
    detail::cp_async_commit();
  };
  const bool early = tile < (L - 1) / 32;
  if (early) stage_first_tile();
  detail::pdl_wait();
  if (!early) stage_first_tile();
  // q after the first tiles' loads are in flight (its latency overlaps theirs) and after pdl_wait.
  const T* q = static_cast<const T*>(a.qkv) + int64_t(r.b) * (H + 2 * KVH) * D + int64_t(r.head0) * D;
  for (int i = tid; i < GMAX * D; i += kThreads) q_s[i] = i < r.gc * D ? to_float(q[i]) * a.scale_log2 : 0.f;
  __syncthreads();
  for (; tile < tile_end; tile += kWarps) {
    const bool valid = (tile << 5) + lane < L;
    const int n_valid = min(32, L - (tile << 5));
    cp_async_wait_one();  // K(tile) has landed (V(tile) may still be in flight)
    __syncwarp();         // every lane's copies visible to the whole warp

    // Logits of this lane's key for every head of the group (log2 domain).
    float s[GMAX];
#pragma unroll
    for (int g = 0; g < GMAX; ++g) s[g] = 0.f;
    if (valid) {
#pragma unroll
      for (int c = 0; c < CH; ++c) {
        const uint4 raw = *reinterpret_cast<const uint4*>(k_w + staged<D>(lane, c));
        const T* e = reinterpret_cast<const T*>(&raw);
        float kf[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) kf[i] = to_float(e[i]);
#pragma unroll
        for (int g = 0; g < GMAX; ++g) {
          const float4* qp = reinterpret_cast<const float4*>(q_s + g * D + c * 8);
          const float4 qa = qp[0], qb = qp[1];
          s[g] += qa.x * kf[0] + qa.y * kf[1] + qa.z * kf[2] + qa.w * kf[3] + qb.x * kf[4] + qb.y * kf[5] +
                  qb.z * kf[6] + qb.w * kf[7];
        }
      }
    }

    // Online softmax update (the tile has at least one valid key, so m_new is finite). Async too:
    // its sums go to phi once, after the loop (as in the tensor-core loop).
#pragma unroll
    for (int g = 0; g < GMAX; ++g) {
      const float sg = valid ? s[g] : -INFINITY;
      const float m_new = fmaxf(m[g], warp_max(sg));
      const float alpha = exp2f(m[g] - m_new);  // m = -inf on the first tile: 0
      const float p = exp2f(sg - m_new);        // masked: exp2(-inf) = 0
      dl[g] = dl[g] * alpha + p;
#pragma unroll
      for (int v = 0; v < VPL; ++v) o[g][v] *= alpha;
      m[g] = m_new;
      p_w[g * 32 + lane] = p;
    }
    __syncwarp();  // p_w visible to the whole warp; every lane is done with the K stage
    const int next = tile + kWarps;
    const int64_t next_row = next < tile_end ? key_row(next, entry_ahead) : 0;
    entry_ahead = key_entry(next + kWarps);
    if (next < tile_end) stage_rows(next, next_row, k_cache, k_w, true);
    detail::cp_async_commit();
    cp_async_wait_one();  // V(tile) has landed (K(next) may still be in flight)
    __syncwarp();

    // o += P . V over the tile's valid keys.
#pragma unroll 4
    for (int jj = 0; jj < n_valid; ++jj) {
      float vf[VPL];
      load_small<T, VPL>(v_w + jj * D + lane * VPL, vf);
#pragma unroll
      for (int g = 0; g < GMAX; ++g) {
        const float p = p_w[g * 32 + jj];
#pragma unroll
        for (int v = 0; v < VPL; ++v) o[g][v] += p * vf[v];
      }
    }
    __syncwarp();  // p_w and the V stage are rewritten by the next tile
    if (next < tile_end) stage_rows(next, next_row, v_cache, v_w, false);
    detail::cp_async_commit();
  }
  detail::cp_async_wait_all();  // (only empty groups remain; the stage is about to be reused)

  // o_s overlays the other warps' V tiles: wait until every warp is done.
  __syncthreads();
#pragma unroll
  for (int g = 0; g < GMAX; ++g) {
    const float d_total = warp_sum(dl[g]);
    const float m_total = m[g];
    if (lane == 0) {
      m_s[warp * GMAX + g] = m_total;
      d_s[warp * GMAX + g] = d_total;
    }
#pragma unroll
    for (int v = 0; v < VPL; ++v) o_s[(warp * GMAX + g) * D + lane * VPL + v] = o[g][v];
  }
  __syncthreads();
  return o_s;
}

// ---- tensor-core loop -----------------------------------------------------------------------------
// The CTA's (up to 16) query heads are the rows of m16n8k16; see the header comment. Leaves per
// warp (m, d, o) for the merge in m_s, d_s, o_s [W][16][kOStride] (returned) and ends with a barrier.
// Fragment layouts (PTX ISA, mma.m16n8k16): lane l holds C/D elements (row l/4, cols 2(l%4), +1)
// in c0, c1 and row l/4 + 8 in c2, c3; A (16 x 16) a0: (row l/4, k 2(l%4), +1), a1: row + 8,
// a2: k + 8, a3: both; B (16 x 8) b0: (k 2(l%4), +1, col l/4), b1: k + 8.
template <class T, int D, bool kAsync, int kW>
__device__ __forceinline__ float* mma_loop(const DecodeArgs& a, const RowSlice& r, unsigned char* body, float* m_s,
                                           float* d_s) {
  using S = MmaShape<D, kW>;
  constexpr int W = S::kWarps, NS = S::kStages, KT = S::kKeys, KS = S::kStride;
  constexpr int CH = D / 8;       // 16-byte chunks per row
  constexpr int KSTEPS = D / 16;  // k-steps of Q K^T; also 16-dim pairs of n-tiles of P V
  constexpr int NT = D / 8;       // n-tiles of the output
  constexpr bool kQRegs = D <= 128;  // Q fragments kept in registers (at 256 they would cost 64)
  static_assert(D % 16 == 0 && (KT == 16 || KT == 32), "tile shape");
  constexpr int KH = KT / 16;  // 16-key halves of a tile (each within one block)
  constexpr int NK = KT / 8;   // 8-key n-tiles of S

  constexpr int SR = kStagedRow<D>;     // staged rows (staged())
  T* q_s = reinterpret_cast<T*>(body);    // [16][KS]
  T* stage = q_s + 16 * KS;               // [W][NS] x (K [16][SR], V [16][SR])
  float* o_s = reinterpret_cast<float*>(stage);  // [W][16][S::kOStride] (after the loop)

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int L = r.L, tile_end = r.tile_end;
  const int H = a.n_heads, KVH = a.n_kv_heads;
  const T* k_cache = static_cast<const T*>(a.k_cache);
  const T* v_cache = static_cast<const T*>(a.v_cache);
  const int32_t* btab = a.block_tables + int64_t(r.b) * a.max_blocks_per_seq;
  T* my_stage = stage + warp * NS * 2 * KT * SR;

  // Issues tile `tile` into stage `s` (nothing past the slice) and commits a group either way, so
  // that every lane counts the same groups. The 2D chunks of K (and of V) go out 32 per step, chunk
  // i = step * 32 + lane of row i / CH.
  // Blocks of 16 keys or more hold each 16-key half of a tile (halves start at multiples of 16), so
  // a half's rows are one block-table entry plus row x token_stride (a 32-key tile: two entries).
  // Where a step covers whole rows (32 % CH == 0: head dims 64, 128, 256) a lane's chunk moves by the
  // same row count each step: one pointer per cache (per half), advanced by a uniform stride, and
  // shared-memory offsets that are immediates. (Computing every chunk's row and offset per tile, as
  // below, took ~200 instructions per tile at head_dim 128.) Otherwise lanes 0..KT-1 look up one key
  // row each and the rows' offsets are broadcast by shuffles.
  constexpr int kSteps = KT * CH / 32;
  constexpr bool kRowSteps = 32 % CH == 0;
  constexpr int kRowsPerStep = kRowSteps ? 32 / CH : 1;
  const bool whole_tiles = kRowSteps && a.kv.block_shift >= 4;
  const int lane_row = lane / CH, lane_chunk = lane - lane_row * CH;  // (whole_tiles)
  const int64_t lane_src = int64_t(lane_row) * a.kv.token_stride + lane_chunk * 8 + int64_t(r.kvh) * a.kv.head_stride;
  const int64_t step_src = int64_t(kRowsPerStep) * a.kv.token_stride;
  const int in_block_mask = (1 << a.kv.block_shift) - 1;
  // Block-table entries of this warp's tiles, read 32 issues ahead (whole_tiles): lane l of `bt[h]`
  // holds the entry of half h of the warp's issue 32 c + l, `bt_next` those of chunk c + 1, and a
  // tile's entries come by shuffles. Reading btab[] at the issue put a dependent load (an L2 round
  // trip whenever the line was new to the SM) between the wait for one tile and the copies of the next.
  const int warp_tile0 = r.tile_begin + warp;
  auto load_entries = [&](int chunk, int h) -> int32_t {
    const int t = warp_tile0 + (chunk * 32 + lane) * W;
    return whole_tiles && t < tile_end ? btab[(t * KT + 16 * h) >> a.kv.block_shift] : 0;
  };
  int32_t bt[KH], bt_next[KH];
#pragma unroll
  for (int h = 0; h < KH; ++h) bt[h] = load_entries(0, h), bt_next[h] = load_entries(1, h);
  int bt_chunk = 0;
  auto issue = [&](int n, int s) {  // the warp's n-th tile (n = 0, 1, ..., in order)
    const int tile = warp_tile0 + n * W;
    if (whole_tiles && (n >> 5) != bt_chunk) {  // warp-uniform; once every 32 issues
      ++bt_chunk;
#pragma unroll
      for (int h = 0; h < KH; ++h) bt[h] = bt_next[h], bt_next[h] = load_entries(bt_chunk + 1, h);
    }
    if (tile < tile_end) {
      const int j0 = tile * KT;
      const int n_valid = min(KT, L - j0);
      T* kd = my_stage + s * 2 * KT * SR;
      T* vd = kd + KT * SR;
      if (whole_tiles) {
        // Rows past the end stay inside the block (it holds 16 or more): valid addresses, zero-filled.
#pragma unroll
        for (int h = 0; h < KH; ++h) {
          const int32_t entry = __shfl_sync(0xffffffffu, bt[h], n & 31);
          const int64_t base = a.kv.row(entry, (j0 + 16 * h) & in_block_mask, 0) + lane_src;  // lane_src: the head
          const T* kp = k_cache + base;
          const T* vp = v_cache + base;
#pragma unroll
          for (int step = h * kSteps / KH; step < (h + 1) * kSteps / KH; ++step) {
            const int row = lane_row + step * kRowsPerStep;
            const bool ok = row < n_valid;
            const int at = staged<D>(row, lane_chunk);
            kv_copy16_zfill(kd + at, kp, ok);
            kv_copy16_zfill(vd + at, vp, ok);
            kp += step_src;
            vp += step_src;
          }
        }
      } else {
        int64_t row = 0;
        if (lane < n_valid) row = cache_row(a, btab, j0 + lane, r.kvh);
#pragma unroll
        for (int step = 0; step < kSteps; ++step) {
          const int i = step * 32 + lane, rr = i / CH, c = i - rr * CH;
          const int64_t src = __shfl_sync(0xffffffffu, row, rr);
          const bool ok = rr < n_valid;
          const int64_t at = ok ? src + c * 8 : 0;
          kv_copy16_zfill(kd + staged<D>(rr, c), k_cache + at, ok);
          kv_copy16_zfill(vd + staged<D>(rr, c), v_cache + at, ok);
        }
      }
    }
    detail::cp_async_commit();
  };

  int tile = warp_tile0;
  // The first tiles go out before pdl_wait, during the previous kernel's tail, where they hold only
  // keys before the row's last: those were written by earlier steps, and the kernels this launch may
  // overlap write only key L - 1 (rope_qk_cache; the contract in kernels.h). The block table and the
  // lengths were uploaded before the step's first kernel. q, written by them, is read after it.
  // (The early tiles are a prefix of the prologue's: the cp.async groups stay in tile order.)
  // H200, back-to-back calls (docs/results/2026-12-01q-prewait-merge.md): 4-13% faster up to 4K
  // keys (geomeans per context), 0.4-3% at 64K; without programmatic launch no change.
  const int tiles_before_last_key = (L - 1) / KT;
#pragma unroll
  for (int s = 0; s < NS - 1; ++s)
    if (warp_tile0 + s * W < tiles_before_last_key) issue(s, s);
  detail::pdl_wait();
#pragma unroll
  for (int s = 0; s < NS - 1; ++s)
    if (warp_tile0 + s * W >= tiles_before_last_key) issue(s, s);
  // q (16-bit, rows past the CTA's heads zero) while the first tiles are in flight.
  const T* q = static_cast<const T*>(a.qkv) + int64_t(r.b) * (H + 2 * KVH) * D + int64_t(r.head0) * D;
  for (int i = tid; i < 16 * D; i += W * 32) {
    const int row = i / D, col = i - row * D;
    q_s[row * KS + col] = row < r.gc ? q[i] : from_float<T>(0.f);
  }
  __syncthreads();
  auto q_frag = [&](uint32_t(&f)[4], int ks) {
    detail::ldmatrix_x4(f, detail::smem_addr(q_s + (lane & 15) * KS + (2 * ks + (lane >> 4)) * 8));
  };
  uint32_t qf[kQRegs ? KSTEPS : 1][4];
  if constexpr (kQRegs) {
#pragma unroll
    for (int ks = 0; ks < KSTEPS; ++ks) q_frag(qf[ks], ks);
  }

  // Rows r0 = lane / 4 and r1 = r0 + 8: the reference m of o and d (lazy: within kRescaleSlack of
  // the running max), the max logit seen (top; async's guard) and this lane's part of the sum (its
  // 2 columns of each 8-key n-tile), all in log2 units.
  float m0 = -INFINITY, m1 = -INFINITY, top0 = -INFINITY, top1 = -INFINITY, d0 = 0.f, d1 = 0.f;
  float o[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.f;

  for (int i = 0; tile < tile_end; ++i, tile += W) {
    detail::cp_async_wait_group<NS - 2>();  // this tile has landed (NS - 2 younger groups may not)
    __syncwarp();                           // visible to every lane; every lane is done with stage i - 1
    issue(i + NS - 1, (i + NS - 1) % NS);   // into the stage computed at iteration i - 1
    const T* kb = my_stage + (i % NS) * 2 * KT * SR;
    const T* vb = kb + KT * SR;

    // S = Q K^T for keys 0..7 (s[0]), 8..15 (s[1]), ... of the tile. One ldmatrix.x4 per 16-key half
    // h gives K's B fragments of its two n-tiles: matrices (keys 0-7, k 0-7), (keys 0-7, k 8-15),
    // (keys 8-15, ..) of the half.
    float s[NK][4];
#pragma unroll
    for (int nt = 0; nt < NK; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
    for (int ks = 0; ks < KSTEPS; ++ks) {
#pragma unroll
      for (int h = 0; h < KH; ++h) {
        uint32_t kf[4];
        detail::ldmatrix_x4(kf, detail::smem_addr(kb + staged<D>(16 * h + (lane & 7) + ((lane >> 4) << 3),
                                                                 2 * ks + ((lane >> 3) & 1))));
        if constexpr (kQRegs) {
          detail::mma16816<T>(s[2 * h], qf[ks], kf[0], kf[1]);
          detail::mma16816<T>(s[2 * h + 1], qf[ks], kf[2], kf[3]);
        } else {
          uint32_t qa[4];
          q_frag(qa, ks);
          detail::mma16816<T>(s[2 * h], qa, kf[0], kf[1]);
          detail::mma16816<T>(s[2 * h + 1], qa, kf[2], kf[3]);
        }
      }
    }
    // Keys past the end -inf (only the row's last tile can hold any; it has at least one valid key).
    const int j0 = tile * KT + 2 * (lane & 3);
    if (tile * KT + KT > L) {
#pragma unroll
      for (int nt = 0; nt < NK; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nt][e] = j0 + nt * 8 + (e & 1) < L ? s[nt][e] : -INFINITY;
    }
    // The tile's max logit of rows r0 and r1, in log2 units (the scale is positive: max first).
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < NK; ++nt) {
      mx0 = fmaxf(mx0, fmaxf(s[nt][0], s[nt][1]));
      mx1 = fmaxf(mx1, fmaxf(s[nt][2], s[nt][3]));
    }
#pragma unroll
    for (int x = 1; x <= 2; x <<= 1) {
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, x));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, x));
    }
    mx0 *= a.scale_log2;
    mx1 *= a.scale_log2;
    top0 = fmaxf(top0, mx0);
    top1 = fmaxf(top1, mx1);
    // Lazy rescale: o and d stay relative to the reference m until a row's max passes m + kRescaleSlack
    // (the first tile always does: m = -inf). P = 2^(x - m) <= 2^kRescaleSlack then, in range for fp16
    // and bf16 with their full relative precision. The whole warp rescales together (one vote), each
    // row to its own new max.
    if (__any_sync(0xffffffffu, mx0 > m0 + kRescaleSlack || mx1 > m1 + kRescaleSlack)) {
      const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
      const float al0 = detail::fast_exp2(m0 - mn0), al1 = detail::fast_exp2(m1 - mn1);  // m = -inf first: 0
      m0 = mn0;
      m1 = mn1;
      d0 *= al0;
      d1 *= al1;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        o[nt][0] *= al0;
        o[nt][1] *= al0;
        o[nt][2] *= al1;
        o[nt][3] *= al1;
      }
    }
    float p[NK][4];
#pragma unroll
    for (int nt = 0; nt < NK; ++nt) {
      p[nt][0] = detail::fast_exp2(fmaf(s[nt][0], a.scale_log2, -m0));  // masked: 2^-inf = 0
      p[nt][1] = detail::fast_exp2(fmaf(s[nt][1], a.scale_log2, -m0));
      p[nt][2] = detail::fast_exp2(fmaf(s[nt][2], a.scale_log2, -m1));
      p[nt][3] = detail::fast_exp2(fmaf(s[nt][3], a.scale_log2, -m1));
    }
#pragma unroll
    for (int h = 0; h < KH; ++h) {
      d0 += (p[2 * h][0] + p[2 * h][1]) + (p[2 * h + 1][0] + p[2 * h + 1][1]);
      d1 += (p[2 * h][2] + p[2 * h][3]) + (p[2 * h + 1][2] + p[2 * h + 1][3]);
    }
    // O += P V per 16-key half: one ldmatrix.x4.trans gives V's B fragments of dims 16 dp .. 16 dp + 15
    // (two n-tiles): matrices (keys 0-7, dims 0-7), (keys 8-15, dims 0-7), (keys 0-7, dims 8-15), ...
#pragma unroll
    for (int h = 0; h < KH; ++h) {
      // P (16 rows x 16 keys) as the A fragment: the accumulators of s[2h] are its k 0..7 half.
      const uint32_t pa[4] = {detail::pack2<T>(p[2 * h][0], p[2 * h][1]), detail::pack2<T>(p[2 * h][2], p[2 * h][3]),
                              detail::pack2<T>(p[2 * h + 1][0], p[2 * h + 1][1]),
                              detail::pack2<T>(p[2 * h + 1][2], p[2 * h + 1][3])};
#pragma unroll
      for (int dp = 0; dp < KSTEPS; ++dp) {
        uint32_t vf[4];
        detail::ldmatrix_x4_trans(vf, detail::smem_addr(vb + staged<D>(16 * h + (lane & 15), 2 * dp + (lane >> 4))));
        detail::mma16816<T>(o[2 * dp], pa, vf[0], vf[1]);
        detail::mma16816<T>(o[2 * dp + 1], pa, vf[2], vf[3]);
      }
    }
  }
  detail::cp_async_wait_all();  // (only empty groups remain)

#pragma unroll
  for (int x = 1; x <= 2; x <<= 1) {
    d0 += __shfl_xor_sync(0xffffffffu, d0, x);
    d1 += __shfl_xor_sync(0xffffffffu, d1, x);
  }
  if constexpr (kAsync) {
    // To the unified max: o, d times 2^(m_w - phi) (m_w their reference); top stays the max logit
    // (the guard's input). A warp that saw no key has m = -inf: factor 0, and its sums are 0. A row
    // far above phi may turn inf or NaN here; the guard rejects it (its max is out of range) before
    // anything is written.
    const float f0 = exp2f(m0 - a.phi2), f1 = exp2f(m1 - a.phi2);
    d0 *= f0;
    d1 *= f1;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      o[nt][0] *= f0;
      o[nt][1] *= f0;
      o[nt][2] *= f1;
      o[nt][3] *= f1;
    }
  }
  // o_s overlays every warp's stages: wait until all are done.
  __syncthreads();
  const int r0 = lane >> 2, r1 = r0 + 8, c0 = 2 * (lane & 3);
  if ((lane & 3) == 0) {
    // Sync: the reference of o and d (the merge rescales by it). Async: the max logit (the guard's).
    m_s[warp * 16 + r0] = kAsync ? top0 : m0;
    m_s[warp * 16 + r1] = kAsync ? top1 : m1;
    d_s[warp * 16 + r0] = d0;
    d_s[warp * 16 + r1] = d1;
  }
  float* o0 = o_s + (warp * 16 + r0) * S::kOStride + c0;
  float* o1 = o_s + (warp * 16 + r1) * S::kOStride + c0;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    *reinterpret_cast<float2*>(o0 + nt * 8) = make_float2(o[nt][0], o[nt][1]);
    *reinterpret_cast<float2*>(o1 + nt * 8) = make_float2(o[nt][2], o[nt][3]);
  }
  __syncthreads();
  return o_s;
}

// ---- one CTA's work --------------------------------------------------------------------------------
// The group `group_index` ((b * KVH + kvh) * n_sub + sub), key slice `split`, writing only the heads
// in head_mask (sync mode without splits: the recomputation of rows the guard rejected).
// kKernelCombine (async only): the group's last CTA adds the splits' partials (DecodeAttentionLaunch::
// combine_in_kernel); without it the CTA ends after its partial and the kernel holds no reduction and
// no synchronized recomputation (62 KB of code instead of 131 KB at head_dim 128, fp16).
template <class T, int D, int GMAX, bool kAsync, bool kMma, int kW, bool kKernelCombine = false>
__device__ void attend_group(const DecodeArgs& a, int group_index, unsigned head_mask, int split,
                             unsigned char* smem_raw, int& mask_s) {
  using Shape = typename ShapeOf<D, GMAX, kMma, kW>::type;
  constexpr int W = Shape::kWarps, NTH = W * 32, KT = Shape::kKeys;
  float* m_s = reinterpret_cast<float*>(smem_raw);  // [W][GMAX]
  float* d_s = m_s + W * GMAX;                      // [W][GMAX]
  unsigned char* body = reinterpret_cast<unsigned char*>(d_s + W * GMAX);  // (16-byte aligned: W * GMAX >= 8)

  const int tid = threadIdx.x;
  RowSlice r;
  const int sub = group_index % a.n_sub;
  const int bk = group_index / a.n_sub;
  r.kvh = bk % a.n_kv_heads;
  r.b = bk / a.n_kv_heads;
  const int g0 = sub * a.gmax;
  r.gc = min(a.gmax, a.group - g0);  // query heads of this CTA (<= GMAX)
  r.head0 = r.kvh * a.group + g0;
  const int H = a.n_heads;

  T* out = static_cast<T*>(a.out) + (int64_t(r.b) * H + r.head0) * D;
  int L = a.context_lens[r.b];
  const int64_t capacity = int64_t(a.max_blocks_per_seq) << a.kv.block_shift;
  if (L > capacity) L = static_cast<int>(capacity);
  r.L = L;
  // This CTA's slice of the key tiles (all of them when there is one split).
  const int n_tiles = L > 0 ? (L + KT - 1) / KT : 0;
  const int tiles_per_split = (n_tiles + a.splits - 1) / a.splits;
  r.tile_begin = split * tiles_per_split;
  r.tile_end = min(n_tiles, r.tile_begin + tiles_per_split);
  float* partial = a.splits > 1 ? a.partials + ((int64_t(r.b) * H + r.head0) * a.splits + split) * (D + 2) : nullptr;
  // Everything below reads q or writes global memory after the previous kernel (pdl_wait), except
  // the loops' first copies (each loop waits itself).
  if (n_tiles == 0 || r.tile_begin >= r.tile_end) detail::pdl_wait();
  if (n_tiles == 0) {  // a padding row (length <= 0): zeros, written by every split alike
    for (int i = tid; i < r.gc * D; i += NTH) out[i] = from_float<T>(0.f);
    return;
  }
  if (!kAsync && r.tile_begin >= r.tile_end) {  // sync: no keys in this slice, an empty partial
    for (int i = tid; i < r.gc * D; i += NTH) {
      write_partial(partial + int64_t(i / D) * a.splits * (D + 2), i % D, -INFINITY, 0.f, 0.f);
    }
    return;
  }
  // (Async: an empty slice still arrives at the semaphore below, with zero sums.)

  float* o_s;
  if constexpr (kMma) {
    o_s = mma_loop<T, D, kAsync, kW>(a, r, body, m_s, d_s);
  } else {
    static_assert(!kAsync, "the async mode runs the synchronized kernels on the CUDA-core loop");
    o_s = core_loop<T, D, GMAX, kW>(a, r, body, m_s, d_s);
  }

  // The merges of the warps: VW consecutive dims per thread, 4 (float4 reads of o, a row's max and
  // weights once per 4 outputs) where that still gives every thread work (the tensor-core CTAs'
  // 16 rows), else 1 (one query head per CTA on CUDA cores: 4 measured 1-2% slower there).
  const int gc = r.gc;
  constexpr int OS = Shape::kOStride, VW = GMAX * D >= 4 * NTH ? 4 : 1, NQ = D / VW;
  static_assert(D % 4 == 0 && OS % 4 == 0, "float4 rows");
  auto o_load = [&](int w, int g, int d, float(&v)[VW]) {
    const float* p = o_s + (w * GMAX + g) * OS + d;
    if constexpr (VW == 4) {
      const float4 q = *reinterpret_cast<const float4*>(p);
      v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
    } else {
      v[0] = *p;
    }
  };
  if constexpr (kAsync) {
    // Add the warps' sums (all relative to phi: no rescale) and take the CTA's max logit.
    for (int i = tid; i < gc * NQ; i += NTH) {
      const int g = i / NQ, d = (i - g * NQ) * VW;
      float M = -INFINITY, den = 0.f, num[VW] = {};
#pragma unroll
      for (int w = 0; w < W; ++w) {
        M = fmaxf(M, m_s[w * GMAX + g]);
        float o[VW];
        o_load(w, g, d, o);
#pragma unroll
        for (int k = 0; k < VW; ++k) num[k] += o[k];
        den += d_s[w * GMAX + g];
      }
      float* pg = partial + int64_t(g) * a.splits * (D + 2);
#pragma unroll
      for (int k = 0; k < VW; ++k) write_partial(pg, d + k, M, den, num[k]);
    }
    // The partial is written (this kernel always runs several splits: decode_attention_async sends a
    // single split to the synchronized kernel). Without kKernelCombine the CTA is done: the launch
    // after it, decode_async_combine_kernel (one CTA per row), adds the splits' sums, checks the
    // guard and recomputes rows out of range.
    if constexpr (kKernelCombine) {
      // In-kernel reduction (few splits): every thread's partial stores are made visible device-wide
      // before the CTA arrives at its group's semaphore; the CTA that arrives last (the counter
      // reaches splits - 1 before its add) resets the semaphore for the next launch and adds every
      // split's partial in split order (bitwise the same output whichever CTA is last).
      __threadfence();
      __syncthreads();
      if (tid == 0) {
        int* sem = a.counters + 2 + group_index;
        const bool last = atomicAdd(sem, 1) == a.splits - 1;
        if (last) atomicExch(sem, 0);  // every split has arrived: nobody else touches it this launch
        mask_s = last ? 0 : -1;
      }
      __syncthreads();
      if (mask_s != 0) return;  // (read by every thread before any atomicOr below can change it)
      __threadfence();  // the other CTAs' partials, published before their arrival, are read below
      __syncthreads();
      const float* p0 = a.partials + (int64_t(r.b) * H + r.head0) * a.splits * (D + 2);
      // VW dims per thread as in the merge above; the splits' loads in flight together (4 splits
      // unrolled; auto takes this path with at most kAsyncKernelCombineMaxSplits), each element's
      // sum still in split order.
      for (int i = tid; i < gc * NQ; i += NTH) {
        const int g = i / NQ, d = (i - g * NQ) * VW;
        const float* pg = p0 + int64_t(g) * a.splits * (D + 2);
        float M = -INFINITY, den = 0.f, num[VW] = {};
#pragma unroll 4
        for (int s = 0; s < a.splits; ++s) {  // in split order; L2 reads (other SMs wrote them)
          const float* ps = pg + int64_t(s) * (D + 2);
          M = fmaxf(M, __ldcg(ps));
          den += __ldcg(ps + 1);
#pragma unroll
          for (int k = 0; k < VW; ++k) num[k] += __ldcg(ps + 2 + d + k);
        }
        const float rel = M - a.phi2;
        if (rel >= a.lo2 && rel <= a.hi2) {  // (NaN fails)
#pragma unroll
          for (int k = 0; k < VW; ++k) out[g * D + d + k] = from_float<T>(num[k] / den);
        } else if (d == 0) {
          atomicOr(&mask_s, 1 << g);
        }
      }
      __syncthreads();
      const unsigned mask = static_cast<unsigned>(mask_s);
      if (mask == 0) return;
      // Rows out of range: this CTA recomputes them with the synchronized softmax over all the row's
      // keys (one split, only the masked heads written). The barrier above ended every read of the
      // shared buffers the recomputation reuses.
      if (tid == 0 && a.fallback_rows != nullptr)
        atomicAdd(a.fallback_rows, static_cast<unsigned long long>(__popc(mask)));
      DecodeArgs f = a;
      f.splits = 1;
      f.partials = nullptr;
      attend_group<T, D, GMAX, false, kMma, kW>(f, group_index, mask, 0, smem_raw, mask_s);
    }
  } else {
    for (int i = tid; i < gc * NQ; i += NTH) {
      const int g = i / NQ, d = (i - g * NQ) * VW;
      float M = -INFINITY;
#pragma unroll
      for (int w = 0; w < W; ++w) M = fmaxf(M, m_s[w * GMAX + g]);
      float num[VW] = {}, den = 0.f;
      if (M != -INFINITY) {
#pragma unroll
        for (int w = 0; w < W; ++w) {
          const float f = exp2f(m_s[w * GMAX + g] - M);
          float o[VW];
          o_load(w, g, d, o);
#pragma unroll
          for (int k = 0; k < VW; ++k) num[k] += f * o[k];
          den += f * d_s[w * GMAX + g];
        }
      }
      if (partial == nullptr) {
        if ((head_mask >> g) & 1u) {
#pragma unroll
          for (int k = 0; k < VW; ++k) out[g * D + d + k] = from_float<T>(den > 0.f ? num[k] / den : 0.f);
        }
      } else {
        float* pg = partial + int64_t(g) * a.splits * (D + 2);
#pragma unroll
        for (int k = 0; k < VW; ++k) write_partial(pg, d + k, M, den, num[k]);
      }
    }
  }
}

// Dynamic shared memory after a loop's layout (Shape::kSmem, a multiple of 16): the in-kernel
// reduction's flag (decode_attention_kernel).
constexpr size_t kFlagBytes = 16;

// The resident CTAs per SM an instantiation is built for: 1 at the default 8 warps (the bound of the
// measured kernels, unchanged), else as many as shared memory and threads allow, at most 3 (4 warps
// at head_dim 128: 3 on CUDA cores for groups up to 8, 2 at 16 and on tensor cores). It also caps
// registers at 64K / (threads x CTAs): 168 per thread at 3 x 128 threads. (Uncapped, head_dim 64's
// CUDA-core loop asked for 4-5 CTAs, i.e. 96-128 registers, and spilled up to 340 bytes at groups
// 8-16; -Xptxas -v.)
constexpr int kMaxMinCtasPerSm = 3;
template <int D, int GMAX, bool kMma, int W>
constexpr int min_ctas_per_sm() {
  using Shape = typename ShapeOf<D, GMAX, kMma, W>::type;
  const int n = resident_ctas(W * 32, Shape::kSmem + kFlagBytes);
  return W == kDefaultWarps ? 1 : n < kMaxMinCtasPerSm ? n : kMaxMinCtasPerSm;
}

template <class T, int D, int GMAX, bool kAsync, bool kMma, int W, bool kKernelCombine>
__global__ void __launch_bounds__(W * 32, (min_ctas_per_sm<D, GMAX, kMma, W>()))
    decode_attention_kernel(DecodeArgs a) {
  // No static __shared__ here: it would come first and move the dynamic buffer's start off a 128-byte
  // line, and with it every staged K/V row (each warp's copies would then straddle one more line per
  // 512 bytes, as padded rows did). The in-kernel reduction's flag (the one such variable; unused
  // elsewhere) lives after the dynamic layout instead (kFlagBytes). With a static flag, the kernel
  // holding the reduction measured 130.5 us against the launch-combined kernel's 57.4 at 32/2 heads,
  // batch 8, 16K keys, 2 splits (H200; docs/results/2026-12-01s-unpadded-rows.md).
  extern __shared__ __align__(128) unsigned char smem_raw[];
  using Shape = typename ShapeOf<D, GMAX, kMma, W>::type;
  int& mask_s = *reinterpret_cast<int*>(smem_raw + Shape::kSmem);
  // The next launch (the O projection) may be scheduled now: its CTAs take SMs as this grid's
  // retire. attend_group waits for the previous kernel (rope: qkv and the cache's last key) once it
  // has issued the copies of older keys. See kernels.h, programmatic launch.
  detail::pdl_trigger();
  attend_group<T, D, GMAX, kAsync, kMma, W, kKernelCombine>(a, blockIdx.x, 0xffffffffu, blockIdx.y, smem_raw, mask_s);
}

// The combine launches: one CTA per (sequence, query head) row, in one of three shapes (threads,
// splits per batch, and the registers that leave room for the CTAs an SM should hold at once):
//   rows <= SMs (batch 1-4 at 32 heads; many splits): 256 threads, 8 splits per batch;
//   rows <= 4 x SMs: 128 threads, 8 per batch (64 registers: 8 CTAs per SM);
//   more rows (few splits): 128 threads, 4 per batch (48 registers: 10 per SM).
// Under programmatic launch a combine's CTAs become resident while the main kernel still runs, and
// the next kernel launches only once every combine CTA has started. H200, fp16, D 128, the
// synchronized combine of 1024 rows (32/2 heads, batch 32, 1K keys, 2 splits), in all, against the
// former loops (42-48 registers) in the same calls: 16 splits per batch in 128 threads (92-109
// registers, 4 CTAs per SM) 15.41 against 13.32 us; 8 per batch everywhere (64 registers) 13.76
// against 13.25; these three shapes 13.22 against 13.31. Few rows, many splits (32/2 heads, batch 1,
// 64K keys, 48-64 splits, async, same calls): 16 per batch in 128 threads 21.59 against 22.84; 8 in
// 128 threads 22.30 against 23.12; 8 in 256 threads 21.20 against 22.89
// (docs/results/2026-12-01v-combines.md).
template <int NT, int B>
struct CombineShape {
  static constexpr int kThreads = NT, kBatch = B;
  static constexpr int kMaxRegisters = B >= 8 ? 64 : 48;
  static constexpr int kMinCtasPerSm = 65536 / (NT * kMaxRegisters);
};
using CombineFewRows = CombineShape<256, 8>;
using CombineSomeRows = CombineShape<128, 8>;
using CombineManyRows = CombineShape<128, 4>;
constexpr int kCombineFewRowsPerSm = 1, kCombineSomeRowsPerSm = 4;

// How a combine's threads share a row: the D dims as D / 2 lanes of two (float2 loads: a split's
// partial is D + 2 floats, so 8-byte aligned), the splits dealt round-robin to the kGroups groups of
// lanes that fit the CTA (D 128: 2 groups of 64 lanes in 128 threads, 4 in 256; D 256: 1 group in
// 128 threads), each group taking up to kBatch of its splits' loads in flight at once; the groups'
// results meet in shared memory, added in group order. Every load of a row goes out before any
// value is used: one L2 round trip up to kGroups x kBatch splits. The former loops (every thread
// all splits of its dims, the maxima first, then 4-8 splits' sums per round trip; a block-wide
// reduction of the maxima past 16 splits) took 2-4 dependent round trips at few splits and 7-8 at
// 48 (ncu, H200, each kernel alone with the L2 flushed: 32/2 heads, batch 1, 64K keys, 48 splits:
// async combine 7.1 us, sync 6.3; with 16 per batch in 128 threads 5.2 and 5.5).
template <int D, class Shape>
struct CombineLayout {
  static constexpr int kLanes = D / 2;
  static constexpr int kGroups = Shape::kThreads / kLanes >= 1 ? Shape::kThreads / kLanes : 1;
  static constexpr int kBatch = Shape::kBatch;
  static_assert(D % 2 == 0 && kLanes <= Shape::kThreads, "combine layout");
};

// Thread `lane` of group `group`: the row's splits group, group + kGroups, ... in batches of up to
// kBatch, each batch's loads in flight together, as use(md, o, n): md[k] = (m, d) and o[k] = the
// lane's two dims of the batch's k-th split, for k < n. p: the row's partials, splits x (D + 2)
// floats [m, d, o[D]] (other SMs wrote them in the previous kernel: L2 reads).
template <int D, class Shape, class Use>
__device__ __forceinline__ void for_lane_split_batches(const float* __restrict__ p, int splits, int group, int lane,
                                                       Use use) {
  using Layout = CombineLayout<D, Shape>;
  constexpr int G = Layout::kGroups, B = Layout::kBatch;
  for (int s0 = group; s0 < splits; s0 += G * B) {
    float2 md[B], o[B];
#pragma unroll
    for (int k = 0; k < B; ++k) {
      const int s = s0 + k * G;
      if (s < splits) {
        const float* ps = p + int64_t(s) * (D + 2);
        md[k] = __ldcg(reinterpret_cast<const float2*>(ps));
        o[k] = __ldcg(reinterpret_cast<const float2*>(ps + 2 + 2 * lane));
      }
    }
    use(md, o, min(B, (splits - s0 + G - 1) / G));
  }
}

// exp2(x - ref), 0 for an empty split or group (x = -inf; ref = -inf only when every one is empty).
__device__ __forceinline__ float combine_weight(float x, float ref) { return x == -INFINITY ? 0.f : exp2f(x - ref); }

// The groups' (m, d, o) of a combine in shared memory, for the merge after the barrier.
template <int D, class Shape>
struct CombineGroups {
  using Layout = CombineLayout<D, Shape>;
  float m[Layout::kGroups], d[Layout::kGroups];
  float2 o[Layout::kGroups][Layout::kLanes];
  __device__ __forceinline__ void put(int group, int lane, float group_m, float group_d, float2 group_o) {
    if (lane == 0) m[group] = group_m, d[group] = group_d;
    o[group][lane] = group_o;
  }
  __device__ __forceinline__ float max_m() const {
    float M = m[0];
#pragma unroll
    for (int g = 1; g < Layout::kGroups; ++g) M = fmaxf(M, m[g]);
    return M;
  }
  // The lane's two dims and the denominator summed over the groups in group order, each group
  // weighted by 2^(m_g - M) (kRescale: the synchronized combine, whose groups keep their own
  // maxima) or not (the async combine: every split is relative to the same phi).
  template <bool kRescale>
  __device__ __forceinline__ float2 sum(int lane, float M, float& den) const {
    float2 num = make_float2(0.f, 0.f);
    den = 0.f;
#pragma unroll
    for (int g = 0; g < Layout::kGroups; ++g) {
      const float w = kRescale ? combine_weight(m[g], M) : 1.f;
      const float2 og = o[g][lane];
      num = make_float2(num.x + w * og.x, num.y + w * og.y);
      den += w * d[g];
    }
    return num;
  }
};

// A combine's output: the lane's two dims of the row, num / den (0 where every split was empty).
template <class T>
__device__ __forceinline__ void store_lane_dims(T* row, int lane, float2 num, float den) {
  row[2 * lane] = from_float<T>(den > 0.f ? num.x / den : 0.f);
  row[2 * lane + 1] = from_float<T>(den > 0.f ? num.y / den : 0.f);
}

// Merges the splits' partials of one (sequence, query head): out = sum_s 2^(m_s - M) o_s /
// sum_s 2^(m_s - M) d_s with M = max_s m_s (the synchronized FlashDecoding reduction). Each group
// of lanes keeps its own running max over its splits (its sums rescaled once per batch, where the
// max grows); the merge weighs the groups by 2^(m_g - M).
template <class T, int D, class Shape>
__global__ void __launch_bounds__(Shape::kThreads, Shape::kMinCtasPerSm)
    decode_combine_kernel(const float* __restrict__ partials, int splits, T* __restrict__ out) {
  detail::pdl_trigger();
  detail::pdl_wait();
  using Layout = CombineLayout<D, Shape>;
  constexpr int G = Layout::kGroups, NL = Layout::kLanes;
  __shared__ CombineGroups<D, Shape> groups_s;
  const int tid = threadIdx.x, group = tid / NL, lane = tid - group * NL;
  const int64_t bh = blockIdx.x;  // b * H + h
  const float* p = partials + bh * splits * (D + 2);
  T* o_row = out + bh * D;
  if (group < G) {
    float m = -INFINITY, den = 0.f;
    float2 num = make_float2(0.f, 0.f);
    for_lane_split_batches<D, Shape>(p, splits, group, lane, [&](const float2(&md)[Layout::kBatch],
                                                                 const float2(&os)[Layout::kBatch], int n) {
      float m_new = m;  // the batch's weights are independent of one another: one rescale per batch
#pragma unroll
      for (int k = 0; k < Layout::kBatch; ++k)
        if (k < n) m_new = fmaxf(m_new, md[k].x);
      if (m_new == -INFINITY) return;  // every split so far empty
      const float keep = combine_weight(m, m_new);
      num = make_float2(num.x * keep, num.y * keep);
      den *= keep;
#pragma unroll
      for (int k = 0; k < Layout::kBatch; ++k) {
        if (k < n) {
          const float w = combine_weight(md[k].x, m_new);
          num = make_float2(num.x + w * os[k].x, num.y + w * os[k].y);
          den += w * md[k].y;
        }
      }
      m = m_new;
    });
    if (G == 1) return store_lane_dims(o_row, lane, num, den);
    groups_s.put(group, lane, m, den, num);
  }
  if constexpr (G > 1) {
    __syncthreads();
    if (group != 0) return;
    float den;
    const float2 num = groups_s.template sum<true>(lane, groups_s.max_m(), den);
    store_lane_dims(o_row, lane, num, den);
  }
}

// A block-wide max or sum of NT values, the same on every thread and in the same order on every run
// (deterministic). red_s: NT / 32 floats.
template <int NT>
__device__ __forceinline__ float combine_block_reduce(float v, bool is_max, float* red_s) {
  constexpr int NW = NT / 32;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = is_max ? warp_max(v) : warp_sum(v);
  if (lane == 0) red_s[warp] = v;
  __syncthreads();
  float r = red_s[0];
#pragma unroll
  for (int w = 1; w < NW; ++w) r = is_max ? fmaxf(r, red_s[w]) : r + red_s[w];
  __syncthreads();
  return r;
}

// Async (unified max) reduction of the splits, one CTA per (sequence, query head), launched after
// the main kernel like the synchronized combine. The partials are relative to the same phi, so they
// simply add: out = sum_s o_s / sum_s d_s (each group of lanes in its split order, then the groups
// in order: deterministic, no atomics). A row whose max logit (the max of the splits' maxima)
// leaves [phi + a, phi + b], or is NaN, is recomputed here exactly (fp32 synchronized softmax over
// all its keys) and counted in fallback_rows.
// Why not the former last-CTA reduction inside the main kernel: the last CTA of a group to finish
// summed splits x heads x (D + 2) floats alone on one SM after every other CTA had retired: at
// ChatGLM2's 32/2 heads, batch 1, 55 splits x 16 heads it took ~22 us of the 41.6 us at 16K (sync,
// whose combine is this wide launch, 19.6 us; docs/results/2026-12-01a-attention-grid.md, rows
// 32/2 B 1). Spreading it with red.global.add.f32 would make outputs change in the last bits from
// run to run; this launch costs what sync's combine costs and stays bitwise reproducible.
template <class T, int D, class Shape>
__global__ void __launch_bounds__(Shape::kThreads, Shape::kMinCtasPerSm) decode_async_combine_kernel(DecodeArgs a) {
  detail::pdl_trigger();
  using Layout = CombineLayout<D, Shape>;
  constexpr int NT = Shape::kThreads, NW = NT / 32, VPT = (D + NT - 1) / NT, G = Layout::kGroups,
                NL = Layout::kLanes;
  __shared__ float red_s[NW];
  __shared__ float q_s[D];
  __shared__ float p_s[NT];
  __shared__ int64_t row_s[NT];
  __shared__ CombineGroups<D, Shape> groups_s;
  const int tid = threadIdx.x, group = tid / NL, lane = tid - group * NL;
  const int bh = blockIdx.x, H = a.n_heads, b = bh / H, h = bh - b * H;
  T* out = static_cast<T*>(a.out) + int64_t(bh) * D;
  const int splits = a.splits;
  const float* p = a.partials + int64_t(bh) * splits * (D + 2);
  // The row's length, into shared memory before the wait for the main kernel (the lengths are
  // written before the step's first kernel; the main kernel reads them before its wait too). Read
  // after the wait into a register, it held the partials' loads for a round trip: the register
  // spilled, and the spill's store waited for the load (SASS).
  __shared__ int len_s;
  if (tid == 0) len_s = a.context_lens[b];
  detail::pdl_wait();
  if (group < G) {
    float m = -INFINITY, den = 0.f;
    float2 num = make_float2(0.f, 0.f);
    for_lane_split_batches<D, Shape>(p, splits, group, lane, [&](const float2(&md)[Layout::kBatch],
                                                                 const float2(&os)[Layout::kBatch], int n) {
#pragma unroll
      for (int k = 0; k < Layout::kBatch; ++k) {
        if (k < n) {
          m = fmaxf(m, md[k].x);
          den += md[k].y;
          num = make_float2(num.x + os[k].x, num.y + os[k].y);
        }
      }
    });
    groups_s.put(group, lane, m, den, num);
  }
  __syncthreads();  // (also publishes len_s)
  const float M = groups_s.max_m();
  int L = len_s;
  const int64_t capacity = int64_t(a.max_blocks_per_seq) << a.kv.block_shift;
  if (L > capacity) L = static_cast<int>(capacity);
  if (L <= 0) {  // (the main kernel wrote the zeros already; written again, alike)
    for (int d = tid; d < D; d += NT) out[d] = from_float<T>(0.f);
    return;
  }
  auto block_reduce = [&](float v, bool is_max) { return combine_block_reduce<NT>(v, is_max, red_s); };
  const float rel = M - a.phi2;
  if (rel >= a.lo2 && rel <= a.hi2) {  // (NaN fails)
    if (group == 0) {
      float den;
      const float2 num = groups_s.template sum<false>(lane, M, den);
      store_lane_dims(out, lane, num, den);
    }
    return;
  }
  // Out of range: the exact recomputation, NT keys per step (logit of key j0 + tid on thread tid,
  // then P V with thread tid owning dims tid, tid + NT, ..).
  if (tid == 0 && a.fallback_rows != nullptr) atomicAdd(a.fallback_rows, 1ull);
  const int KVH = a.n_kv_heads, kvh = h / a.group;
  const T* q = static_cast<const T*>(a.qkv) + int64_t(b) * (H + 2 * KVH) * D + int64_t(h) * D;
  for (int d = tid; d < D; d += NT) q_s[d] = to_float(q[d]) * a.scale_log2;
  const T* k_cache = static_cast<const T*>(a.k_cache);
  const T* v_cache = static_cast<const T*>(a.v_cache);
  const int32_t* btab = a.block_tables + int64_t(b) * a.max_blocks_per_seq;
  __syncthreads();
  float m = -INFINITY, den = 0.f, o[VPT];
#pragma unroll
  for (int v = 0; v < VPT; ++v) o[v] = 0.f;
  for (int j0 = 0; j0 < L; j0 += NT) {
    const int j = j0 + tid;
    float s = -INFINITY;
    if (j < L) {
      const int64_t row = cache_row(a, btab, j, kvh);
      row_s[tid] = row;
      const T* kr = k_cache + row;
      float dot = 0.f;
#pragma unroll
      for (int c = 0; c < D / 8; ++c) {
        const uint4 raw = *reinterpret_cast<const uint4*>(kr + c * 8);
        const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
        for (int i = 0; i < 8; ++i) dot += q_s[c * 8 + i] * to_float(e[i]);
      }
      s = dot;
    }
    const float m_new = fmaxf(m, block_reduce(s, true));  // finite: the step has a valid key
    const float alpha = exp2f(m - m_new);                  // m = -inf on the first step: 0
    const float pj = exp2f(s - m_new);                     // masked: exp2(-inf) = 0
    p_s[tid] = pj;
    den = den * alpha + block_reduce(pj, false);  // (its barriers publish p_s and row_s)
    const int n = min(NT, L - j0);
#pragma unroll
    for (int v = 0; v < VPT; ++v) {
      const int d = tid + v * NT;
      if (d < D) {
        float acc = 0.f;
        for (int jj = 0; jj < n; ++jj) acc += p_s[jj] * to_float(v_cache[row_s[jj] + d]);
        o[v] = o[v] * alpha + acc;
      }
    }
    m = m_new;
    __syncthreads();  // p_s and row_s are rewritten by the next step
  }
#pragma unroll
  for (int v = 0; v < VPT; ++v) {
    const int d = tid + v * NT;
    if (d < D) out[d] = from_float<T>(o[v] / den);
  }
}

template <class T, int D, int GMAX, bool kAsync, bool kMma, int W, bool kKernelCombine>
void launch_decode(const DecodeArgs& a, bool dependent, cudaStream_t stream) {
  using Shape = typename ShapeOf<D, GMAX, kMma, W>::type;
  constexpr size_t smem = Shape::kSmem + kFlagBytes;
  static_assert(Shape::kSmem % 16 == 0 && smem <= 227 * 1024, "shared memory layout");
  auto* kernel = decode_attention_kernel<T, D, GMAX, kAsync, kMma, W, kKernelCombine>;
  // Once per (instantiation, device), before any graph capture uses it: the attribute belongs to
  // the current device, and one process drives several under tensor parallelism.
  once_per_device(reinterpret_cast<const void*>(kernel), [&] {
    if (smem > 48 * 1024)
      cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
                 "cudaFuncSetAttribute(decode_attention_kernel, max dynamic shared memory)");
    // Several CTAs per SM need the whole shared-memory carveout (the driver may otherwise pick a
    // smaller one and fit fewer CTAs).
    if (min_ctas_per_sm<D, GMAX, kMma, W>() > 1)
      cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                      cudaSharedmemCarveoutMaxShared),
                 "cudaFuncSetAttribute(decode_attention_kernel, shared memory carveout)");
  });
  const detail::LaunchConfig config(dim3(a.n_groups, a.splits), dim3(Shape::kWarps * 32), smem, stream, dependent);
  cuda_check(cudaLaunchKernelEx(config.get(), kernel, a), "cudaLaunchKernelEx(decode_attention_kernel)");
}

// Which loop a call runs, and with how many warps per CTA (choose_loop).
//
// The loop: the tensor cores for a CTA of two or more query heads (one K/V tile serves the whole
// group at tensor-core rate; the CUDA-core loop's dot products per key grow with the group: 16 heads
// x 128 dims per lane and key at ChatGLM2's 32/2, compute-bound at 35% of the read bandwidth at batch
// 64, 16K, issue 13), at head dims the CUDA-core loop lacks, and for MHA at head_dim 128 but on short
// rows at small batch (kMhaCoreMaxContext), and at head_dim 64 where many CTA groups or long rows
// (kMha64MmaMinGroupsPerSm) pay for it. KernelOptions::decode_path forces one (core only at 64 and 128).
//
// Warps per CTA at head dims 64 and 128 (the others always run their default): KernelOptions::
// decode_warps when it is 4 or 8; auto (0): 4 where the tensor-core loop has CTA groups (without
// splits) for at least 3/4 of the slots of two CTAs per SM, or the CUDA-core loop at least 4 groups
// per SM (below), else 8; MHA on tensor cores has its own rule (kMhaFourWarpMaxContext). Measured on
// the H200, fp16, D 128, sequential blocks, 4 vs 8 warps (docs/results/2026-12-01i-order-warps.md):
// GQA 32/8 at batch 32 (256 groups, 264 slots on 132 SMs) 2-14% faster at every context, at batch 64
// (512) 1-17% faster; batch 8 (64 groups) within -3..+5%; MQA 32/2 at batch 64 (128 groups) 28%
// slower at 512 keys, 3% faster at 16K; MHA (CUDA-core loop) up to 27% slower at batch 1-8. Two CTAs
// of 4 warps share an SM, so one streams while the other fills or drains; with fewer groups the plan
// must split rows to fill the slots, and the extra partials cost more than that overlap gains.
constexpr int kFourWarpMinSlotsFilledPct = 75;
// The CUDA-core loop (MHA at head_dim 64) takes 4 warps from this many CTA groups per SM on (docs/
// results/2026-12-01n-splits.md, head_dim 128, blocks shuffled, 4 vs 8 warps): 32/32 at batch 32
// (1024 groups, 7.8 per SM) and 64 10-11% faster at 512 keys, 2-4% at 1K, within 1% from 4K on; at
// batch 8 (256 groups, 1.9 per SM) 13-30% slower, at batch 1 up to 33% slower.
constexpr int kCoreFourWarpMinGroupsPerSm = 4;
// MHA at head_dim 128 runs the tensor-core loop (a K/V tile for one query head, padded to the mma's
// 16 rows: the tensor cores idle, but the loop streams rows D wide with no per-key shuffles) except
// where the longest row has at most 512 keys and the groups fill less than 3/4 of two CTAs per SM
// (batch 1-6 at 32 heads on 132 SMs). H200, fp16, blocks shuffled, async us, the tensor-core loop
// against the CUDA-core loop in the same call, one split unless said (docs/results/2026-12-01t-mha-
// tensor-cores.md, call 1): batch 1 (4 splits) 1K / 4K / 16K 7.61 / 17.52 / 61.7 against 7.91 /
// 18.90 / 63.0; batch 8, 8 warps, 4K / 16K / 64K 119.5 / 471.5 / 1880 against 121.3 / 477.1 /
// 1903; batch 32, 4 warps, 4K / 16K 473 / 1874 against 487 / 2108-2188; batch 64, 8 warps, 16K /
// 64K 3698 / 14822 against 3752 / 15091. At 512 keys (call 2): batch 1 5.72 on the plan's 4 splits
// (5.09 on one) against 5.22, batch 4 9.05-9.58 against 8.87, batch 2 6.32 against 6.33; batch 8
// (4 warps) 16.00 against 17.62 (call 1).
constexpr int kMhaCoreMaxContext = 512;
// MHA at head_dim 64 runs the tensor-core loop where its CTA groups fill at least 4 per SM (batch 17
// and up at 32 heads on 132 SMs), or 3/4 of two per SM with rows longer than 2048 keys (or not
// known); else the CUDA-core loop. H200, fp16, blocks shuffled, one split, the faster of two rounds,
// tensor-core against CUDA-core loop in the same call, async us (docs/results/2026-12-01w-length-
// plan.md, call 7): batch 32, 512 / 4K / 64K 32.52 / 255.78 / 4065 against 34.56 / 293.69 / 4707;
// batch 64, 512 / 16K 64.79 / 2024 against 68.49 / 2143; batch 8, 4K / 64K 62.67 / 1010 against
// 64.16 / 1035, but 512 / 1K 9.59 / 17.57 against 8.48 / 16.67; batch 1 (4 splits), 1K / 16K 5.71 /
// 49.63 against 4.99 / 34.39.
constexpr int kMha64MmaMinGroupsPerSm = 4, kMha64CoreMaxContext = 2048;
// MHA on tensor cores takes 4 warps (where they fill 3/4 of two CTAs per SM) only on rows of up to
// this many keys and where the rounds of two 4-warp CTAs per SM take no longer than the rounds of one
// 8-warp CTA (which streams twice as fast), else 8. Same calls, 4 against 8 warps, one split: batch
// 64 4K / 16K / 64K 937 / 3765 / 15160 against 931 / 3698 / 14822 (call 2: 1.007 / 1.020 / 1.025
// of 8 warps' time), batch 8 16K / 64K 476 / 1895 against 471 / 1880; batch 16 and 32 within
// +-0.6% from 4K on; at 512 and 1K keys 4 warps 1-4% faster at batch 8 to 64 (batch 64, 512: 122.3
// against 126.8). Batch 12 (384 CTAs on 264 slots: 2 rounds against 8 warps' 3 half-length ones) at
// 512 / 1K keys ran 28.4 / 52.8 us on 4 warps against 27.3 / 49.6 on the CUDA-core loop with 8
// (docs/results/2026-12-01s-unpadded-rows.md); batch 7 (224 CTAs: one round either way) 14.7 against
// 17.2 at 512 keys, but 58.8 against 57.3 at 2K (call 3).
constexpr int kMhaFourWarpMaxContext = 2048;

struct LoopChoice {
  bool tensor_cores;
  int warps;
};

// gmax: query heads per CTA (plan_groups); max_context_len: the call's longest row, 0 if not known
// (then taken as long).
LoopChoice choose_loop(int batch, int n_heads, int n_kv_heads, int head_dim, int gmax, int max_context_len,
                       int multiprocessors) {
  const KernelOptions& o = current_kernel_options();
  check(o.decode_warps == 0 || o.decode_warps == 4 || o.decode_warps == 8,
        "decode attention: decode_warps = {} is not one of 0 (auto), 4, 8", o.decode_warps);
  if (head_dim != 64 && head_dim != 128) return {true, head_dim > 128 ? 4 : kDefaultWarps};
  const int group = n_heads / n_kv_heads;
  const int64_t groups = int64_t(batch) * n_kv_heads * ((group + 15) / 16);
  const int64_t mma_slots = 2 * int64_t(multiprocessors);
  const bool mma_fills_four = groups * 100 >= mma_slots * kFourWarpMinSlotsFilledPct;
  const bool core_fills_four = groups >= int64_t(kCoreFourWarpMinGroupsPerSm) * multiprocessors;
  // MHA on tensor cores (kMhaCoreMaxContext, kMha64MmaMinGroupsPerSm): at head_dim 128 but on short
  // rows at small batch; at 64 with many CTA groups, or enough for two CTAs per SM on long rows.
  const bool short_rows = max_context_len > 0 && max_context_len <= kMhaCoreMaxContext;
  const bool rows_to_2k = max_context_len > 0 && max_context_len <= kMha64CoreMaxContext;
  const bool mha128_mma = !(short_rows && !mma_fills_four);
  const bool mha64_mma =
      groups >= int64_t(kMha64MmaMinGroupsPerSm) * multiprocessors || (mma_fills_four && !rows_to_2k);
  const bool mha_mma = group == 1 && (head_dim == 128 ? mha128_mma : mha64_mma);
  // The warps follow the loop whole groups would run (a GQA group split into single heads at small
  // batch runs the CUDA-core loop with the tensor-core loop's count; both give 8 there).
  bool whole_groups_mma = false, loop_mma = false;
  switch (o.decode_path) {
    case DecodePath::Mma: whole_groups_mma = loop_mma = true; break;
    case DecodePath::Core: whole_groups_mma = loop_mma = false; break;
    case DecodePath::Auto:
      whole_groups_mma = group >= 2 || mha_mma;
      loop_mma = gmax >= 2 || mha_mma;
      break;
  }
  bool four = whole_groups_mma ? mma_fills_four : core_fills_four;
  if (group == 1 && whole_groups_mma && four) {
    const int64_t rounds_four = (groups + mma_slots - 1) / mma_slots;
    const int64_t rounds_eight = (groups + multiprocessors - 1) / multiprocessors;
    four = max_context_len > 0 && max_context_len <= kMhaFourWarpMaxContext && 2 * rounds_four <= rounds_eight;
  }
  if (o.decode_warps != 0) four = o.decode_warps == 4;
  return {loop_mma, four ? 4 : kDefaultWarps};
}

template <class T, int D, bool kAsync, int W>
void launch_decode_gw(const DecodeAttentionLaunch& c, const DecodeArgs& a, bool dependent, cudaStream_t stream) {
  if (c.tensor_cores) {
    if constexpr (kAsync) {
      if (c.combine_in_kernel) return launch_decode<T, D, 16, true, true, W, true>(a, dependent, stream);
    }
    return launch_decode<T, D, 16, kAsync, true, W, false>(a, dependent, stream);
  }
  // (The async mode never gets here: the CUDA-core loop runs synchronized only; decode_attention_async.)
  if constexpr (!kAsync && (D == 64 || D == 128)) {
    switch (a.gmax) {
      case 1: return launch_decode<T, D, 1, false, false, W, false>(a, dependent, stream);
      case 2: return launch_decode<T, D, 2, false, false, W, false>(a, dependent, stream);
      case 4: return launch_decode<T, D, 4, false, false, W, false>(a, dependent, stream);
      case 8: return launch_decode<T, D, 8, false, false, W, false>(a, dependent, stream);
      default: return launch_decode<T, D, 16, false, false, W, false>(a, dependent, stream);
    }
  }
  check(false, "decode attention: no CUDA-core kernel at head_dim {} (async {})", D, kAsync);
}

template <class T, int D, bool kAsync>
void launch_decode_g(const DecodeAttentionLaunch& c, const DecodeArgs& a, bool dependent, cudaStream_t stream) {
  if constexpr (D == 64 || D == 128) {
    if (c.warps == 4) return launch_decode_gw<T, D, kAsync, 4>(c, a, dependent, stream);
    return launch_decode_gw<T, D, kAsync, 8>(c, a, dependent, stream);
  } else {
    return launch_decode_gw<T, D, kAsync, default_warps<D>()>(c, a, dependent, stream);
  }
}

// Calls f(std::integral_constant<int, D>{}) for the call's head dim: the kernels' head dims, one
// instantiation each (make_call accepted only these).
template <class F>
void with_head_dim(int head_dim, F&& f) {
  switch (head_dim) {
    case 64: return f(std::integral_constant<int, 64>{});
    case 80: return f(std::integral_constant<int, 80>{});
    case 96: return f(std::integral_constant<int, 96>{});
    case 128: return f(std::integral_constant<int, 128>{});
    default: return f(std::integral_constant<int, 256>{});
  }
}

// CTA groups of a launch: one per (sequence, kv head, sub-group of at most gmax query heads).
// A CTA normally takes the whole GQA group (up to 16 heads), so each K/V tile is read once for
// all of them. When even with `splits` that leaves most SMs idle (short contexts at small batch:
// ChatGLM2-6B, 32 query heads on 2 kv heads, batch 1, context 1024 ran 8 CTAs of 16 heads each,
// 56% of the roofline end to end), the group is split over more CTAs, halving gmax while fewer
// than half the SMs would be busy: the extra K/V reads of the sub-groups hit L2 (the cache of
// such a short context is a few MB). Long contexts split the keys instead and keep whole groups.
struct GroupPlan {
  int group, gmax, n_sub;
  int64_t n_groups;
};
GroupPlan plan_groups(int batch, int n_heads, int n_kv_heads, int splits, int multiprocessors) {
  GroupPlan g{};
  g.group = n_heads / n_kv_heads;
  g.gmax = g.group <= 1 ? 1 : g.group <= 2 ? 2 : g.group <= 4 ? 4 : g.group <= 8 ? 8 : 16;
  auto n_sub = [&](int gmax) { return (g.group + gmax - 1) / gmax; };
  const int64_t half_sms = multiprocessors / 2;
  while (g.gmax > 1 && int64_t(batch) * n_kv_heads * n_sub(g.gmax) * splits < half_sms) g.gmax /= 2;
  g.n_sub = n_sub(g.gmax);
  g.n_groups = int64_t(batch) * n_kv_heads * g.n_sub;
  return g;
}
// The most groups any plan can have (one query head per CTA): bounds the counters and the list.
int64_t max_groups(int batch, int n_heads) { return int64_t(batch) * n_heads; }

// The async workspace: the splits' partials (splits > 1). (The fallback list of the former second
// launch is gone: the CTA that finds a row out of range recomputes it.)
struct AsyncWorkspace {
  size_t partial_bytes, total;
};
AsyncWorkspace async_workspace_layout(int batch, int n_heads, int /*n_kv_heads*/, int head_dim, int splits) {
  AsyncWorkspace w{};
  w.partial_bytes = decode_attention_workspace_bytes(batch, n_heads, head_dim, splits);
  w.total = std::max<size_t>(w.partial_bytes, 16);
  return w;
}

// Async with several splits: where the partials are added (KernelOptions::async_combine). Auto
// takes the in-kernel reduction (the group's last CTA) up to 8K keys with 2 splits, or at batch 1
// with up to 4, the separate launch otherwise. Measured on the H200, fp16, head_dim 128, same
// grid, kernel vs launch (docs/results/2026-12-01d-attention-iteration3.md): batch 1, 512-1K keys (2-4 splits): 7.06 vs
// 8.03, 8.71 vs 9.59 us (32/2), 7.24 vs 8.35, 8.59 vs 9.42 (32/8), 7.65 vs 8.48, 9.53 vs 10.39
// (32/32): the launch's ~1 us is what a single-wave grid cannot hide. Batch 8-64 with few splits the
// kernel is no faster and up to 27% slower (32/2, batch 8, 4K: 21.83 vs 17.14; batch 32, 512: 16.69
// vs 13.10). Many splits: the last CTA alone adds them all (32/2, batch 1, 16K: 46.6 vs 16.1).
// Again after the launch read few splits' maxima directly (docs/results/2026-12-01j-final.md):
// batch 1, 512 / 1K keys, kernel vs launch 7.33 / 8.71 vs 8.44 / 9.30 us (32/8), 7.08 / 8.82 vs
// 8.14 / 9.47 (32/2), 7.70 / 9.63 vs 8.56 / 10.25 (32/32); sync (its own combine launch) 7.48 /
// 7.93 at 32/8: async's extra ~0.8 us at 1K is not found yet.
// Those few-split points ran the CUDA-core loop (one head per CTA), which async now leaves to the
// synchronized kernels. On the tensor-core loop at batch 1 with 8 splits the launch measured faster
// at every point (docs/results/2026-12-01o-pool-async-core.md): 32/8, 512 to 4K keys, kernel 7.03 /
// 7.99 / 10.01 / 12.78 vs launch 6.82 / 7.82 / 9.80 / 12.52 us; 32/2 6.48 / 7.80 / 9.76 / 12.49 vs
// 6.32 / 7.68 / 9.53 / 12.26. Up to 4 splits the kernel stays at batch 1 (no tensor-core point of
// that kind was measured; the CUDA-core ones above favoured the kernel).
// Two splits at any batch: the kernel, since its reduction takes 4 dims per thread with every split's
// loads in flight (it had taken one element per thread, one split after another). H200, fp16, D 128,
// kernel vs launch (docs/results/2026-12-01r-combine-plan.md): 32/2 batch 32, 1K / 4K / 16K keys
// 13.62 / 36.99 / 133.69 vs 14.09 / 38.72 / 132.41 us; 32/8 batch 8 11.51 / 34.44 / 131.18 vs
// 12.45 / 35.77 / 129.94. Longer rows favour the launch (same call, auto vs launch: 8K keys 32/8
// batch 8 66.74 vs 67.11, 32/2 batch 32 69.57 vs 69.60; 16K 130.61 vs 129.60 and 133.85 vs 132.93;
// 64K 511.12 vs 504.93 and 512.02 vs 510.56): the kernel that holds the reduction streams ~1%
// slower. With 4 or more splits the launch stays faster (32/2 batch 8, 512 keys, 4 splits: 6.98 vs
// 6.64; 1K, 8 splits: 10.04 vs 7.35).
// The length bound holds at batch 1 too: MHA there runs 4 splits on tensor cores, and at 64K keys
// the kernel measured 240.5 us against 236.2 for sync, whose combine is a launch; at 16K 61.7 against
// 61.8; 1K 7.63 against 8.34 (docs/results/2026-12-01t-mha-tensor-cores.md).
constexpr int kAsyncKernelCombineMaxSplits = 4;
constexpr int kAsyncKernelCombineAnyBatchSplits = 2, kAsyncKernelCombineMaxContext = 8192;

// (max_context_len 0, not known, counts as long.)
bool combine_in_kernel(int batch, int splits, int max_context_len) {
  switch (current_kernel_options().async_combine) {
    case AsyncCombine::Kernel: return true;
    case AsyncCombine::Launch: return false;
    case AsyncCombine::Auto: break;
  }
  const bool short_rows = max_context_len > 0 && max_context_len <= kAsyncKernelCombineMaxContext;
  return short_rows && (splits <= kAsyncKernelCombineAnyBatchSplits ||
                        (batch == 1 && splits <= kAsyncKernelCombineMaxSplits));
}

DecodeAttentionLaunch describe_launch(const GroupPlan& g, int batch, int n_heads, int n_kv_heads, int head_dim,
                                      int splits, int max_context_len, bool async_mode, int multiprocessors) {
  const LoopChoice loop = choose_loop(batch, n_heads, n_kv_heads, head_dim, g.gmax, max_context_len, multiprocessors);
  DecodeAttentionLaunch c;
  c.splits = splits;
  c.tensor_cores = loop.tensor_cores;
  c.warps = loop.warps;
  // The async mode runs its own (unified max) kernels with several splits on the tensor cores, else
  // the synchronized ones (the reasons are beside that dispatch, in decode_attention_async).
  c.unified = async_mode && splits > 1 && loop.tensor_cores;
  c.combine_in_kernel = c.unified && combine_in_kernel(batch, splits, max_context_len);
  if (splits > 1 && !c.combine_in_kernel) {
    const int64_t rows = int64_t(batch) * n_heads;
    c.combine = rows <= int64_t(kCombineFewRowsPerSm) * multiprocessors    ? CombineLaunch::FewRows
                : rows <= int64_t(kCombineSomeRowsPerSm) * multiprocessors ? CombineLaunch::SomeRows
                                                                           : CombineLaunch::ManyRows;
  }
  return c;
}

}  // namespace

size_t decode_attention_workspace_bytes(int batch, int n_heads, int head_dim, int splits) {
  return splits <= 1 ? 0 : sizeof(float) * size_t(batch) * n_heads * splits * (head_dim + 2);
}

size_t decode_attention_async_workspace_bytes(int batch, int n_heads, int n_kv_heads, int head_dim, int splits) {
  check(batch > 0 && n_heads > 0 && n_kv_heads > 0 && n_heads % n_kv_heads == 0 && splits >= 1,
        "decode_attention_async_workspace_bytes: batch {}, heads {}/{}, splits {}", batch, n_heads, n_kv_heads, splits);
  return async_workspace_layout(batch, n_heads, n_kv_heads, head_dim, splits).total;
}

DecodeAttentionLaunch decode_attention_launch(int batch, int n_heads, int n_kv_heads, int head_dim, int splits,
                                              int max_context_len, bool async_mode, int multiprocessors) {
  check(batch > 0 && n_heads > 0 && n_kv_heads > 0 && n_heads % n_kv_heads == 0 && splits >= 1 &&
            multiprocessors > 0,
        "decode_attention_launch: batch {}, heads {}/{}, splits {}, {} multiprocessors", batch, n_heads, n_kv_heads,
        splits, multiprocessors);
  return describe_launch(plan_groups(batch, n_heads, n_kv_heads, splits, multiprocessors), batch, n_heads,
                         n_kv_heads, head_dim, splits, max_context_len, async_mode, multiprocessors);
}

int decode_attention_async_counters(int batch, int n_heads, int n_kv_heads) {
  check(batch > 0 && n_heads > 0 && n_kv_heads > 0 && n_heads % n_kv_heads == 0,
        "decode_attention_async_counters: batch {}, heads {}/{}", batch, n_heads, n_kv_heads);
  const int64_t n = 2 + max_groups(batch, n_heads);
  check(n <= 0x7fffffff, "decode_attention_async_counters: {} groups", n);
  return static_cast<int>(n);
}

namespace {

// What the split plan counts on for a step's shape: CTA groups (one per sequence, kv head and
// 16-head sub-group), warps per CTA (choose_loop, which the launch asks the same), the CTAs resident
// at once (slots: SMs x CTAs per SM by shared memory) and the keys of one tile of the loop the CTA
// runs (on tensor cores 16, or 32 at head_dim 64 with 8 warps; 32 on CUDA cores).
struct SplitShape {
  int64_t groups;
  int warps;
  int64_t slots;
  int tile_keys;
};

// CTAs of `warps` warps the plan counts resident at once on the GPU at `head_dim`, by shared memory:
// at 64 and 128 the smaller count of the two loops' (both run there), above 128 the tensor-core
// loop's (the only one; its warps are the head dim's default, whatever `warps` says), at 80 and 96
// the count at 128. At 64 this counts four CTAs of 4 warps per SM, and the plan takes 2 splits for
// 32/8 heads at batch 32 from 1K keys, the only point of the 64 grid where it differs from
// counting 128's slots: on the token-major cache 2-4% slower than one split
// (docs/results/2026-12-02a-wide-tiles-plan.md), on the head-major one 4-8% faster at 4K-64K keys
// (65.0 / 247.7 / 967.7 us against 68.7 / 268.0 / 1006.6; docs/results/2026-12-02c-head-major.md).
int64_t resident_slots(int head_dim, int warps, int multiprocessors) {
  auto per_sm = [](auto core, auto mma) {
    return std::min(resident_ctas(decltype(core)::kWarps * 32, decltype(core)::kSmem),
                    resident_ctas(decltype(mma)::kWarps * 32, decltype(mma)::kSmem));
  };
  int per_sm_ctas = 0;
  with_head_dim(head_dim == 64 ? 64 : std::max(head_dim, 128), [&](auto d) {
    constexpr int D = decltype(d)::value;
    if constexpr (D == 64 || D == 128) {
      per_sm_ctas =
          warps == 4 ? per_sm(CoreShape<D, 4, 4>{}, MmaShape<D, 4>{}) : per_sm(CoreShape<D, 4, 8>{}, MmaShape<D, 8>{});
    } else {
      using S = MmaShape<D, default_warps<D>()>;
      per_sm_ctas = resident_ctas(S::kWarps * 32, S::kSmem);
    }
  });
  return int64_t(multiprocessors) * per_sm_ctas;
}

// Keys per tile of the tensor-core loop of `warps` warps at `head_dim` (MmaShape::kKeys).
int mma_tile_keys(int head_dim, int warps) {
  int k = 16;
  with_head_dim(head_dim, [&](auto d) {
    constexpr int D = decltype(d)::value;
    if constexpr (D == 64 || D == 128)
      k = warps == 4 ? MmaShape<D, 4>::kKeys : MmaShape<D, 8>::kKeys;
    else
      k = MmaShape<D, default_warps<D>()>::kKeys;
  });
  return k;
}

// Keys per tile of the loop a launch runs: the tensor-core loop's (mma_tile_keys) or 32 on CUDA cores.
int loop_tile_keys(const LoopChoice& loop, int head_dim) {
  return loop.tensor_cores ? mma_tile_keys(head_dim, loop.warps) : 32;
}

SplitShape split_shape(int batch, int n_heads, int n_kv_heads, int head_dim, int max_context_len, int multiprocessors) {
  const int group = n_heads / n_kv_heads;
  const LoopChoice loop =
      choose_loop(batch, n_heads, n_kv_heads, head_dim, std::min(group, 16), max_context_len, multiprocessors);
  SplitShape sh;
  sh.groups = int64_t(batch) * n_kv_heads * ((group + 15) / 16);
  sh.warps = loop.warps;
  sh.slots = resident_slots(head_dim, sh.warps, multiprocessors);
  sh.tile_keys = loop_tile_keys(loop, head_dim);
  return sh;
}

// The most splits a plan considers: a split holds at least one tile, the grid at most two waves of
// slots (more splits only add partials; the sweeps' only optima past two waves were at MHA batch
// 32-64 with 64K keys, within those points' 7-9% run-to-run noise), and 256.
int max_splits_of(const SplitShape& sh, int max_context_len) {
  const int64_t tiles = (int64_t(std::max(max_context_len, 0)) + sh.tile_keys - 1) / sh.tile_keys;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>({256, tiles, 2 * sh.slots / sh.groups})));
}

}  // namespace

// The split counts a plan considers: those the sweeps measure (docs/results/2026-12-01v-split-sweep/),
// so that every choice of the model below has a measured time at the points it was fitted to.
constexpr int kSplitCandidates[] = {1,  2,  3,  4,  5,  6,  7,   8,   10,  12,  14,  16,  20,  24,
                                    28, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256};

int plan_decode_splits(int batch, int n_heads, int n_kv_heads, int head_dim, int max_context_len, int multiprocessors) {
  // A launch has one CTA per (sequence, kv head, sub-group of query heads: plan_groups, which divides
  // the group further the fewer CTAs the splits make) and split. Its time, in units of one SM
  // streaming 8 tiles of 16 keys of one kv head (at head_dim 128, 70 KB: ~2 us at an SM's 1/132
  // share of 4.46 TB/s), for s splits of a row's n tiles (tile_keys each) on W warps, with the
  // launch plan_groups and choose_loop make of s (CTAs, loop, warps, resident slots):
  //   T(s) = waves(s) x stream(ceil(n / s)) + [s > 1] (kSplitFixed + kSplitEach x s) + kCtaCost x CTAs(s),
  //   stream(t) = (ceil(t / W) + t / W) / 2 x tile_keys / 16 (at least one round on CUDA cores),
  //   waves(s) = ceil(CTAs(s) / slots).
  // The cost per CTA is what the sweeps of batch 1-2 show: launches of 80-112 CTAs beat 128 at the
  // same work per CTA (32/8 heads, batch 1, 4K keys: 12 splits, 96 CTAs of 4 heads, 7.29 us; 16
  // splits, 128 CTAs, 8.64), and from 16K-32K keys on the shorter streams of 128 CTAs win. The
  // cheapest s of kSplitCandidates wins (the smallest on ties); both modes plan alike since the
  // combines load every split of a row at once. Fitted by grid search to the sweeps of
  // docs/results/2026-12-01v-split-sweep/ (32/2, 32/8 and 32/32 heads, batch 1-64, 512-64K keys,
  // both modes; H200, fp16, D 128): the plan is 0.85% (async) and 0.70% (sync) slower than each
  // point's best on average, at most 14% and 12% (the former model: 1.3% and 1.5%, at most 19% and
  // 31%); on the batch 1-2 sweep of another call, not fitted to, 2.1% and 1.4% (4.9% and 5.2%).
  // Other head dims run the same model with their own loop, tiles and slots (resident_slots); its
  // constants are head_dim 128's (docs/results/2026-12-02a-wide-tiles-plan.md). At 256, against the
  // plan of 128's launch shapes, on a sweep of the 12 points where the two differ: 1.026x (async)
  // and 1.035x (sync) each point's best instead of 1.045x and 1.051x; worst point 32/2 heads, batch
  // 32, 512 keys: 2 splits, 1.21x the one the former plan took. At 96 no point changes.
  //   32 heads MHA, batch 1, context 1024: 32 groups, 32 tiles of 32 keys on CUDA cores (up to 2
  //   splits: CUDA cores, 8 warps); 4 splits, 128 CTAs on tensor cores -> 4 splits.
  // Host cost, with decode_attention_launch after it (once per decode step in the engine, again in
  // the call): 0.26 us at batch 1 (all 28 candidates), 0.03 us at 64 (development machine, -O2).
  if (max_context_len <= 0 || multiprocessors <= 0) return 1;
  constexpr double kSplitFixed = 1.75, kSplitEach = 0.125, kCtaCost = 0.014, kCoreMinRound = 1.0;
  const SplitShape whole = split_shape(batch, n_heads, n_kv_heads, head_dim, max_context_len, multiprocessors);
  const int max_splits = max_splits_of(whole, max_context_len);
  int best_s = 1;
  double best = 0.0;
  for (const int s : kSplitCandidates) {
    if (s > max_splits) break;
    const GroupPlan g = plan_groups(batch, n_heads, n_kv_heads, s, multiprocessors);
    const LoopChoice loop = choose_loop(batch, n_heads, n_kv_heads, head_dim, g.gmax, max_context_len, multiprocessors);
    const int tile_keys = loop_tile_keys(loop, head_dim);
    const int64_t ctas = g.n_groups * s, slots = resident_slots(head_dim, loop.warps, multiprocessors);
    const int64_t n_tiles = (int64_t(max_context_len) + tile_keys - 1) / tile_keys;
    const int64_t tiles = (n_tiles + s - 1) / s;  // per split
    const int64_t waves = (ctas + slots - 1) / slots;
    double stream = 0.5 * (double((tiles + loop.warps - 1) / loop.warps) + double(tiles) / loop.warps);
    if (!loop.tensor_cores) stream = std::max(stream, kCoreMinRound);
    stream *= tile_keys / 16.0;
    const double t =
        double(waves) * stream + (s > 1 ? kSplitFixed + kSplitEach * s : 0.0) + kCtaCost * double(ctas);
    if (s == 1 || t < best - 1e-9) {
      best = t;
      best_s = s;
    }
  }
  return best_s;
}

int max_decode_splits(int batch, int n_heads, int n_kv_heads, int head_dim, int max_context_len, int multiprocessors) {
  if (max_context_len <= 0 || multiprocessors <= 0) return 1;
  // Whatever loop and warps a row of any length up to max_context_len takes (choose_loop changes
  // them with the length), its plan has at most the splits of the smallest tile (16 keys, tensor
  // cores) and the most slots (4-warp CTAs).
  SplitShape bound = split_shape(batch, n_heads, n_kv_heads, head_dim, max_context_len, multiprocessors);
  bound.tile_keys = 16;
  bound.slots = std::max(bound.slots, resident_slots(head_dim, 4, multiprocessors));
  return max_splits_of(bound, max_context_len);
}

namespace {

// A call: the kernel's arguments and how it launches.
struct Call {
  DecodeArgs args;
  DecodeAttentionLaunch launch;
};

// Checks the arguments shared by both modes, fills the kernel's arguments and chooses the launch.
Call make_call(const DecodeAttentionParams& p, bool async_mode) {
  const int splits = p.splits, batch = p.batch, n_heads = p.n_heads, n_kv_heads = p.n_kv_heads, head_dim = p.head_dim;
  check(splits >= 1 && splits <= kMaxSplits, "decode_attention: splits = {} out of range [1, {}]", splits,
        kMaxSplits);
  check(p.qkv != nullptr && p.k_cache != nullptr && p.v_cache != nullptr && p.block_tables != nullptr &&
            p.context_lens != nullptr && p.out != nullptr,
        "decode_attention: null pointer (qkv {}, k_cache {}, v_cache {}, block_tables {}, context_lens {}, out {})",
        p.qkv, p.k_cache, p.v_cache, static_cast<const void*>(p.block_tables),
        static_cast<const void*>(p.context_lens), p.out);
  check(batch > 0 && n_heads > 0 && n_kv_heads > 0 && p.max_blocks_per_seq > 0,
        "decode_attention: batch = {}, n_heads = {}, n_kv_heads = {}, max_blocks_per_seq = {} must be positive",
        batch, n_heads, n_kv_heads, p.max_blocks_per_seq);
  check(n_heads % n_kv_heads == 0, "decode_attention: n_heads = {} is not a multiple of n_kv_heads = {}", n_heads,
        n_kv_heads);
  check(head_dim == 64 || head_dim == 80 || head_dim == 96 || head_dim == 128 || head_dim == 256,
        "decode_attention: head_dim = {} is not supported (64, 80, 96, 128, 256)", head_dim);
  check(std::isfinite(p.scale), "decode_attention: scale = {} is not finite", p.scale);
  check(aligned16(p.k_cache) && aligned16(p.v_cache), "decode_attention: k/v cache pointers must be 16-byte aligned");
  check(p.dtype == DType::F16 || p.dtype == DType::BF16, "decode_attention: unknown dtype {}",
        static_cast<int>(p.dtype));
  const int multiprocessors = multiprocessors_of_current_device();
  const GroupPlan g = plan_groups(batch, n_heads, n_kv_heads, splits, multiprocessors);
  check(g.n_groups <= 0x7fffffff, "decode_attention: {} CTAs exceed the grid limit", g.n_groups);
  DecodeArgs a{};
  a.qkv = p.qkv;
  a.k_cache = p.k_cache;
  a.v_cache = p.v_cache;
  a.block_tables = p.block_tables;
  a.max_blocks_per_seq = p.max_blocks_per_seq;
  a.context_lens = p.context_lens;
  a.batch = batch;
  a.n_heads = n_heads;
  a.n_kv_heads = n_kv_heads;
  a.group = g.group;
  a.n_sub = g.n_sub;
  a.gmax = g.gmax;
  a.n_groups = static_cast<int>(g.n_groups);
  a.kv = kv_cache_layout(p.block_size, n_kv_heads, head_dim, "decode_attention");
  a.scale_log2 = p.scale * detail::kLog2e;
  a.out = p.out;
  a.splits = splits;
  return {a, describe_launch(g, batch, n_heads, n_kv_heads, head_dim, splits, p.max_context_len, async_mode,
                                     multiprocessors)};
}

}  // namespace

namespace {

// Calls f(Shape{}) with the CombineShape of the launch describe_launch chose.
template <class F>
void with_combine_shape(CombineLaunch combine, F&& f) {
  switch (combine) {
    case CombineLaunch::FewRows: return f(CombineFewRows{});
    case CombineLaunch::SomeRows: return f(CombineSomeRows{});
    case CombineLaunch::ManyRows: return f(CombineManyRows{});
    case CombineLaunch::None: break;
  }
  check(false, "decode_attention: the launch has several splits but no combine shape");
}

// The synchronized kernels (and their combine when a.splits > 1) for arguments make_call filled;
// a.partials holds decode_attention_workspace_bytes when there are several splits.
void launch_synchronized(const DecodeArgs& a, const DecodeAttentionLaunch& c, int head_dim, DType dtype,
                         cudaStream_t stream) {
  const int splits = a.splits;
  detail::dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    const bool pdl = programmatic_launch_enabled();
    with_head_dim(head_dim, [&](auto dim) {
      constexpr int D = decltype(dim)::value;
      launch_decode_g<T, D, false>(c, a, pdl, stream);
      if (splits == 1) return;
      with_combine_shape(c.combine, [&](auto shape) {
        using Shape = decltype(shape);
        const detail::LaunchConfig config(dim3(a.batch * a.n_heads), dim3(Shape::kThreads), 0, stream, pdl);
        cuda_check(cudaLaunchKernelEx(config.get(), decode_combine_kernel<T, D, Shape>,
                                      static_cast<const float*>(a.partials), splits, static_cast<T*>(a.out)),
                   "cudaLaunchKernelEx(decode_combine_kernel)");
      });
    });
  });
  check_launch("decode_attention");
}

}  // namespace

void decode_attention(const DecodeAttentionParams& p, cudaStream_t stream) {
  Call call = make_call(p, false);
  const size_t need = decode_attention_workspace_bytes(p.batch, p.n_heads, p.head_dim, p.splits);
  check(p.splits == 1 || (p.workspace != nullptr && p.workspace_bytes >= need),
        "decode_attention: {} splits need {} bytes of workspace, got {}", p.splits, need, p.workspace_bytes);
  call.args.partials = static_cast<float*>(p.workspace);
  launch_synchronized(call.args, call.launch, p.head_dim, p.dtype, stream);
}

void decode_attention_async(const DecodeAttentionParams& p, cudaStream_t stream) {
  Call call = make_call(p, true);
  DecodeArgs& a = call.args;
  const DecodeAttentionLaunch& c = call.launch;
  const UnifiedMaxRange& range = p.range;
  check(std::isfinite(range.phi) && std::isfinite(range.a) && std::isfinite(range.b) && range.a < range.b,
        "decode_attention_async: unified max phi = {}, range [{}, {}] is not a finite, non-empty interval", range.phi,
        range.a, range.b);
  const size_t need_bytes =
      decode_attention_async_workspace_bytes(p.batch, p.n_heads, p.n_kv_heads, p.head_dim, p.splits);
  check(p.workspace != nullptr && p.workspace_bytes >= need_bytes && aligned16(p.workspace),
        "decode_attention_async: needs {} bytes of 16-byte aligned workspace, got {} at {}", need_bytes,
        p.workspace_bytes, p.workspace);
  const int need_counters = decode_attention_async_counters(p.batch, p.n_heads, p.n_kv_heads);
  check(p.counters != nullptr && p.counter_ints >= need_counters,
        "decode_attention_async: needs {} zeroed counters, got {} at {}", need_counters, p.counter_ints,
        static_cast<const void*>(p.counters));
  a.partials = static_cast<float*>(p.workspace);  // (the async size covers the synchronized combine's partials too)
  if (!c.unified) {
    // The synchronized kernels instead, where they measured faster. One split: no partials, so
    // nothing for the unified max to unify, and the synchronized kernel is exact for any logits (no
    // guard, no recomputation). The CUDA-core loop (CTAs of one query head: MHA, and GQA rows split
    // into single heads at small batch): the async kernel's compiled loop streams slower than the
    // sync kernel's from the same source, and its combine saves less than that. Measured on the
    // H200, fp16, D 128, blocks shuffled, async (its best combine) vs sync at equal splits: MHA batch
    // 8-64, one split, 7-21% slower (docs/results/2026-12-01m-async-dispatch.md); batch 1, 4 splits,
    // 512 to 4K keys 7.07 / 9.61 / 14.32 / 23.14 vs 6.93 / 9.22 / 13.59 / 21.79 us; GQA 32/8 batch 1
    // with 4 splits (one head per CTA) 8.75 / 12.55 / 19.58 vs 7.82 / 10.75 / 15.92 us at 1K / 2K /
    // 4K keys (docs/results/2026-12-01o-pool-async-core.md). On the tensor-core loop async is the
    // faster (32/2 batch 1, 4K keys, 16 splits: 10.65 vs 11.39 us).
    launch_synchronized(a, c, p.head_dim, p.dtype, stream);
    return;
  }
  a.counters = p.counters;
  a.fallback_rows = p.fallback_rows;
  // The kernel works in log2 units: 2^(x log2 e - phi log2 e) = e^(x - phi).
  a.phi2 = range.phi * detail::kLog2e;
  a.lo2 = range.a * detail::kLog2e;
  a.hi2 = range.b * detail::kLog2e;
  const int batch = p.batch, n_heads = p.n_heads;
  detail::dispatch_dtype(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    const bool pdl = programmatic_launch_enabled();
    with_head_dim(p.head_dim, [&](auto dim) {
      constexpr int D = decltype(dim)::value;
      launch_decode_g<T, D, true>(c, a, pdl, stream);
      if (c.combine_in_kernel) return;
      with_combine_shape(c.combine, [&](auto shape) {
        using Shape = decltype(shape);
        const detail::LaunchConfig config(dim3(batch * n_heads), dim3(Shape::kThreads), 0, stream, pdl);
        cuda_check(cudaLaunchKernelEx(config.get(), decode_async_combine_kernel<T, D, Shape>, a),
                   "cudaLaunchKernelEx(decode_async_combine_kernel)");
      });
    });
  });
  check_launch("decode_attention_async");
}

}  // namespace fdpp::cuda
