// Decode attention's tensor-core loop: the CTA's query heads (up to 16) as the M = 16 rows of
// mma.sync m16n8k16, the query group as a flat GEMM (as flat_gemm pads M). Runs every CTA with two
// or more query heads, every CTA at head_dim 80, 96 and 256, and MHA where decode_plan.h's
// choose_loop says. Part of decode_attention.cu's translation unit (decode_attention_common.cuh).
//   * Rows past the group are q = 0 and never written. Q sits in shared memory as 16-bit (unscaled:
//     S is scaled in fp32 after the mma) and, up to head_dim 128, in registers as A fragments for the
//     whole walk.
//   * Warps take 16-key tiles (32-key at head_dim 64 with 8 warps: MmaShape) round-robin (tile t ->
//     warp t % W) through a private ring of 3 stages: two tiles of K and V are in flight per warp
//     while the third is computed, more bytes in flight per SM than the bandwidth-latency product
//     needs. No CTA barrier inside the loop.
//   * Rows are staged D wide with their chunks XOR-swizzled, or padded at 80 and 96 (staged()). Keys
//     past the end are zero-filled (cp.async src-size 0): P is 0 there, and 0 * garbage could be NaN.
//   * S = Q K^T: D/16 mma per 8 keys; K fragments by ldmatrix (non-transposed). Online softmax per
//     row (quad shuffles) with a lazy reference max (kRescaleSlack), the scale folded into the
//     exponent's FMA, P converted to 16-bit in registers (the accumulator layout of S is the A layout
//     of P V), P V: D/8 mma per tile with V fragments by ldmatrix.trans.
//   * The block table is read 32 issues ahead, so that no dependent load sits between the wait for
//     one tile and the copies of the next. The loop runs close to a pure copy of its access pattern
//     (bench/kernels/kv_stream_bench.cu); what was tried and measured against it (bulk / TMA copies,
//     padded rows, other patterns) is in docs/kernels/decode_attention.md, tensor-core loop.
//   * The first tiles' copies are issued before the wait for the previous kernel (programmatic
//     launch): only the row's last key is written by the kernels the launch overlaps (kernels.h).
//   * The async (unified max) mode keeps the warp's own reference max inside the loop and converts
//     the warp's sums to phi once at the end (o, d times 2^(m_w - phi)), so P stays <= 2^8 and fp16
//     P keeps the full [a, b] range of the guard (a P of e^(x - phi) up to e^13.7 would overflow
//     fp16). What the unified max saves, the exchange of maxima between splits, is unchanged.
//   * kFp8 (an e4m3 cache): rows of D bytes are copied as 16-bit rows of D / 2 elements would be,
//     32 keys a tile, and converted in registers after ldmatrix: K by fp8_k_fragment (Q staged with
//     its columns in the matching order), V by fp8_v_fragment, whose n-tiles hold the even and the
//     odd dims of 16 (put back in order where o is stored). K's scale is in scale_log2, V's
//     multiplies o at the end.
#pragma once

#include <cmath>

#include "backend/cuda/decode_attention_common.cuh"
#include "backend/cuda/mma_fragments.cuh"

namespace fdpp::cuda {
namespace {

// Lazy rescaling in the tensor-core loop: a row's reference max moves (and o, d are rescaled) only
// when a tile's max passes it by more than this many log2 units, so in steady state a tile costs no
// rescale (64 multiplies per lane at head_dim 128). P = 2^(x - m) <= 2^8 stays exact enough in fp16
// and bf16 (their relative precision does not depend on the magnitude; fp16 overflows at 2^16).
constexpr float kRescaleSlack = 8.f;

// The CTA's (up to 16) query heads are the rows of m16n8k16; see the header comment. Leaves per
// warp (m, d, o) for the merge in m_s, d_s, o_s [W][16][kOStride] (returned) and ends with a barrier.
// Fragment layouts (PTX ISA, mma.m16n8k16): lane l holds C/D elements (row l/4, cols 2(l%4), +1)
// in c0, c1 and row l/4 + 8 in c2, c3; A (16 x 16) a0: (row l/4, k 2(l%4), +1), a1: row + 8,
// a2: k + 8, a3: both; B (16 x 8) b0: (k 2(l%4), +1, col l/4), b1: k + 8.
// kMasked: keys before r.lo (the window's first) are neither copied (their blocks may have been given
// back: kFreed entries of the table) nor weighted, and DecodeArgs::softcap caps the logits.
template <class T, int D, bool kAsync, int kW, bool kMasked = false, bool kFp8 = false>
__device__ __forceinline__ float* mma_loop(const DecodeArgs& a, const RowSlice& r, unsigned char* body, float* m_s,
                                           float* d_s) {
  using S = MmaShape<D, kW, kFp8>;
  constexpr int W = S::kWarps, NS = S::kStages, KT = S::kKeys, KS = S::kStride;
  constexpr int DS = S::kStagedDim;  // 16-bit elements of a staged row (D / 2 for e4m3)
  constexpr int CH = DS / 8;         // 16-byte chunks per row
  constexpr int KSTEPS = D / 16;  // k-steps of Q K^T; also 16-dim pairs of n-tiles of P V
  constexpr int NT = D / 8;       // n-tiles of the output
  constexpr bool kQRegs = D <= 128;  // Q fragments kept in registers (at 256 they would cost 64)
  static_assert(D % 16 == 0 && (KT == 16 || KT == 32), "tile shape");
  static_assert(!kFp8 || D % 32 == 0, "e4m3 tiles go 32 dims per ldmatrix.x4");
  constexpr int KH = KT / 16;  // 16-key halves of a tile (each within one block)
  constexpr int NK = KT / 8;   // 8-key n-tiles of S

  constexpr int SR = kStagedRow<DS>;    // staged rows (staged())
  T* q_s = reinterpret_cast<T*>(body);    // [16][KS]
  T* stage = q_s + 16 * KS;               // [W][NS] x (K [16][SR], V [16][SR])
  float* o_s = reinterpret_cast<float*>(stage);  // [W][16][S::kOStride] (after the loop)

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int L = r.L, lo = r.lo, tile_end = r.tile_end;
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
  // shared-memory offsets that are immediates (computing every chunk's row and offset per tile, as
  // below, cost a large part of the loop's instructions: docs/kernels/decode_attention.md, tensor-core
  // loop). Otherwise lanes 0..KT-1 look up one key row each and the rows' offsets are broadcast by
  // shuffles.
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
          int32_t entry = __shfl_sync(0xffffffffu, bt[h], n & 31);
          if constexpr (kMasked) entry = entry < 0 ? 0 : entry;  // a half before the window: no row is read
          const int64_t base = a.kv.row(entry, (j0 + 16 * h) & in_block_mask, 0) + lane_src;  // lane_src: the head
          const T* kp = k_cache + base;
          const T* vp = v_cache + base;
#pragma unroll
          for (int step = h * kSteps / KH; step < (h + 1) * kSteps / KH; ++step) {
            const int row = lane_row + step * kRowsPerStep;
            const bool ok = row < n_valid && (!kMasked || j0 + row >= lo);
            const int at = staged<DS>(row, lane_chunk);
            kv_copy16_zfill(kd + at, kp, ok);
            kv_copy16_zfill(vd + at, vp, ok);
            kp += step_src;
            vp += step_src;
          }
        }
      } else {
        int64_t row = 0;
        if (lane < n_valid && (!kMasked || j0 + lane >= lo)) row = cache_row(a, btab, j0 + lane, r.kvh);
#pragma unroll
        for (int step = 0; step < kSteps; ++step) {
          const int i = step * 32 + lane, rr = i / CH, c = i - rr * CH;
          const int64_t src = __shfl_sync(0xffffffffu, row, rr);
          const bool ok = rr < n_valid && (!kMasked || j0 + rr >= lo);
          const int64_t at = ok ? src + c * 8 : 0;
          kv_copy16_zfill(kd + staged<DS>(rr, c), k_cache + at, ok);
          kv_copy16_zfill(vd + staged<DS>(rr, c), v_cache + at, ok);
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
  // (docs/kernels/decode_attention.md, programmatic launch.)
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
    const int src = kFp8 ? row * D + detail::q_fp8_k_order(col) : i;  // (fp8_k_fragment's k order)
    q_s[row * KS + col] = row < r.gc ? q[src] : from_float<T>(0.f);
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
    if constexpr (kFp8) {
      // One ldmatrix.x4 per 16-key half and 32 dims: matrices (keys 0-7, dims 0-15), (keys 8-15,
      // dims 0-15), (keys 0-7, dims 16-31), (keys 8-15, dims 16-31); each is one k-step of one n-tile.
#pragma unroll
      for (int ks = 0; ks < KSTEPS; ks += 2) {
#pragma unroll
        for (int h = 0; h < KH; ++h) {
          uint32_t kf[4];
          detail::ldmatrix_x4(kf, detail::smem_addr(kb + staged<DS>(16 * h + (lane & 15), ks + (lane >> 4))));
#pragma unroll
          for (int m = 0; m < 4; ++m) {
            uint32_t b0, b1;
            detail::fp8_k_fragment<T>(kf[m], b0, b1);
            const int k_step = ks + (m >> 1);
            if constexpr (kQRegs) {
              detail::mma16816<T>(s[2 * h + (m & 1)], qf[k_step], b0, b1);
            } else {
              uint32_t qa[4];
              q_frag(qa, k_step);
              detail::mma16816<T>(s[2 * h + (m & 1)], qa, b0, b1);
            }
          }
        }
      }
    } else {
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
    }
    if constexpr (kMasked) {
      // Soft-capping, before the mask (a masked logit stays -inf) and before the max (the guard and
      // the unified max see the capped logits, as the reference's softmax does).
      if (a.softcap > 0.f) {
#pragma unroll
        for (int nt = 0; nt < NK; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[nt][e] = cap_raw_logit(s[nt][e], a.scale, a.softcap);
      }
      // Keys outside [lo, L) -inf: the window's first tile and the row's last (each tile walked has
      // a key of the window).
      const int jm = tile * KT + 2 * (lane & 3);
      if (tile * KT + KT > L || tile * KT < lo) {
#pragma unroll
        for (int nt = 0; nt < NK; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int key = jm + nt * 8 + (e & 1);
            s[nt][e] = key < L && key >= lo ? s[nt][e] : -INFINITY;
          }
      }
    }
    // Keys past the end -inf (only the row's last tile can hold any; it has at least one valid key).
    const int j0 = tile * KT + 2 * (lane & 3);
    if (!kMasked && tile * KT + KT > L) {
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
      if constexpr (kFp8) {
        // One ldmatrix.x4.trans per 32 dims: matrices (keys 0-7, dims 0-15), (keys 8-15, dims 0-15),
        // (keys 0-7, dims 16-31), (keys 8-15, dims 16-31); o[2 g] and o[2 g + 1] take the even and
        // the odd dims of 16-dim group g.
#pragma unroll
        for (int dq = 0; dq < D / 32; ++dq) {
          uint32_t vf[4];
          detail::ldmatrix_x4_trans(vf, detail::smem_addr(vb + staged<DS>(16 * h + (lane & 15), 2 * dq + (lane >> 4))));
#pragma unroll
          for (int g = 0; g < 2; ++g) {
            uint32_t even0, odd0, even1, odd1;
            detail::fp8_v_fragment<T>(vf[2 * g], even0, odd0);      // keys 0-7
            detail::fp8_v_fragment<T>(vf[2 * g + 1], even1, odd1);  // keys 8-15
            detail::mma16816<T>(o[4 * dq + 2 * g], pa, even0, even1);
            detail::mma16816<T>(o[4 * dq + 2 * g + 1], pa, odd0, odd1);
          }
        }
      } else {
#pragma unroll
        for (int dp = 0; dp < KSTEPS; ++dp) {
          uint32_t vf[4];
          detail::ldmatrix_x4_trans(vf, detail::smem_addr(vb + staged<D>(16 * h + (lane & 15), 2 * dp + (lane >> 4))));
          detail::mma16816<T>(o[2 * dp], pa, vf[0], vf[1]);
          detail::mma16816<T>(o[2 * dp + 1], pa, vf[2], vf[3]);
        }
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
  if constexpr (kFp8) {
    // Dims 4t .. 4t + 3 of each 16 (t = lane % 4) are (even c0, odd c0, even c1, odd c1); V's scale here.
    const float vs = a.v_scale;
    float* o0 = o_s + (warp * 16 + r0) * S::kOStride + 2 * c0;
    float* o1 = o_s + (warp * 16 + r1) * S::kOStride + 2 * c0;
#pragma unroll
    for (int g = 0; g < D / 16; ++g) {
      const float(&e)[4] = o[2 * g];
      const float(&od)[4] = o[2 * g + 1];
      *reinterpret_cast<float4*>(o0 + 16 * g) = make_float4(vs * e[0], vs * od[0], vs * e[1], vs * od[1]);
      *reinterpret_cast<float4*>(o1 + 16 * g) = make_float4(vs * e[2], vs * od[2], vs * e[3], vs * od[3]);
    }
  } else {
    float* o0 = o_s + (warp * 16 + r0) * S::kOStride + c0;
    float* o1 = o_s + (warp * 16 + r1) * S::kOStride + c0;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      *reinterpret_cast<float2*>(o0 + nt * 8) = make_float2(o[nt][0], o[nt][1]);
      *reinterpret_cast<float2*>(o1 + nt * 8) = make_float2(o[nt][2], o[nt][3]);
    }
  }
  __syncthreads();
  return o_s;
}

}  // namespace
}  // namespace fdpp::cuda
