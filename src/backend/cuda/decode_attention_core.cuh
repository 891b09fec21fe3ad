// Decode attention's CUDA-core loop (the synchronized FlashDecoding-style softmax inside each warp),
// run where a CTA holds one query head (decode_plan.h: choose_loop). Part of decode_attention.cu's
// translation unit (decode_attention_common.cuh says why the unnamed namespace).
//   * The CTA's W warps take 32-key tiles round-robin (tile t -> warp t % W). A warp copies its
//     tile's 32 K rows and 32 V rows into its own shared-memory stage with cp.async, coalesced (a
//     row's 16-byte chunks on consecutive lanes, the rows' offsets broadcast from the lanes that
//     looked them up in the block table): K and V of a tile are in flight together, one memory
//     round trip per tile (lane-per-key loads were slower: docs/kernels/decode_attention.md,
//     CUDA-core loop).
//   * Within a tile each lane owns one key: it reads its K row from the stage (staged(): conflict-
//     free) and computes its dot product with all the CTA's query heads (q in shared memory as
//     fp32, pre-multiplied by scale * log2(e), read as warp-wide broadcasts). No shuffles per key.
//   * Per warp and head an online softmax: running max m, per-lane partial sums d, accumulator o
//     (lane owns D/32 output dims). Per tile: warp max of the 32 logits, rescale by
//     exp2(m_old - m_new), probabilities to a per-warp shared array, then P.V where each lane reads
//     its D/32 dims of each key's V row from shared memory.
// Stability: every exponent is (logit - running max) <= 0; masked lanes use -inf, exp2(-inf) = 0; a
// tile is only processed when it holds at least one valid key, so the running max is finite after
// the first tile and no inf - inf arises.
// Head counts: the group (H / KVH) is padded up to GMAX in {1, 2, 4, 8, 16} (the padded heads get
// q = 0 and are never written); groups above 16 are split over several CTAs of 16 heads.
#pragma once

#include <cmath>

#include "backend/cuda/decode_attention_common.cuh"

namespace fdpp::cuda {
namespace {

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

  // m is the warp's running max, d and o are relative to it. Synchronized mode only: the async
  // (unified max) variants of this loop streamed slower, whatever their instruction count
  // (docs/kernels/decode_attention.md, async mode); the async mode runs the synchronized kernels
  // wherever a launch would take this loop (decode_attention_async).
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
  // (docs/kernels/decode_attention.md, CUDA-core loop).
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

}  // namespace
}  // namespace fdpp::cuda
