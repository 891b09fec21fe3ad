// Decode attention over the paged KV cache: one query token per sequence.
//
// Design (the plain, synchronized FlashDecoding-style kernel; the split-KV FlashDecoding++ kernel
// with the unified max replaces it later):
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
// A context length <= 0 writes zeros (padding rows of a fixed-size batch); lengths beyond the
// block table's capacity (max_blocks_per_seq * block_size) are clamped to it.
#include <algorithm>
#include <cmath>

#include "backend/cuda/cuda_common.cuh"

namespace fdpp::cuda {

namespace {

using detail::aligned16;
using detail::check_launch;
using detail::cuda_check;
using detail::from_float;
using detail::to_float;
using detail::warp_max;
using detail::warp_sum;

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;

struct DecodeArgs {
  const void* qkv;
  const void* k_cache;
  const void* v_cache;
  const int32_t* block_tables;
  int max_blocks_per_seq;
  const int32_t* context_lens;
  int n_heads, n_kv_heads, group, n_sub;
  int block_shift;
  float scale_log2;  // scale * log2(e)
  void* out;
  // Split-KV (splits > 1): CTA (.., split) takes the split-th slice of the key tiles and writes
  // its unnormalized partial (max m, sum d, sum o, all relative to m) to `partials`
  // [batch][H][splits][D + 2]; decode_combine_kernel merges them. splits == 1 writes out directly.
  int splits;
  float* partials;
};

// K tile row stride in elements: 16 bytes of padding make the row-per-lane reads conflict-free.
template <int D>
constexpr int kKStride = D + 8;

// K and V tile staging (16-bit, per warp [32][D + 8] then [32][D]) during the loop; o per warp
// ([kWarps][GMAX][D] fp32) for the final merge, in the same bytes.
template <int D, int GMAX>
constexpr size_t decode_stage_bytes() {
  constexpr size_t kv = sizeof(uint16_t) * kWarps * 32 * (kKStride<D> + D), o = sizeof(float) * kWarps * GMAX * D;
  return kv > o ? kv : o;
}

template <int D, int GMAX>
constexpr size_t decode_smem_bytes() {
  return sizeof(float) * GMAX * D               // q (scaled)
         + sizeof(float) * kWarps * GMAX * 32   // probabilities of the tile, per warp
         + sizeof(float) * 2 * kWarps * GMAX    // m, d per warp (merge)
         + decode_stage_bytes<D, GMAX>();       // V tiles / o per warp
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

template <class T, int D, int GMAX>
__global__ void __launch_bounds__(kThreads, 1) decode_attention_kernel(DecodeArgs a) {
  static_assert(D == 64 || D == 128, "head_dim");
  constexpr int VPL = D / 32;  // output dims per lane
  constexpr int CH = D / 8;    // 16-byte chunks per K row
  constexpr int KS = kKStride<D>;
  constexpr int RPS = 32 / CH;  // rows copied per warp-wide step (one chunk per lane)

  extern __shared__ __align__(16) unsigned char smem_raw[];
  float* q_s = reinterpret_cast<float*>(smem_raw);             // [GMAX][D]
  float* p_s = q_s + GMAX * D;                                 // [kWarps][GMAX][32]
  float* m_s = p_s + kWarps * GMAX * 32;                       // [kWarps][GMAX]
  float* d_s = m_s + kWarps * GMAX;                            // [kWarps][GMAX]
  float* o_s = d_s + kWarps * GMAX;                            // [kWarps][GMAX][D] (after the loop)
  T* stage = reinterpret_cast<T*>(o_s);                        // per warp K [32][KS], V [32][D] (loop)

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int split = blockIdx.y;
  const int sub = blockIdx.x % a.n_sub;
  const int bk = blockIdx.x / a.n_sub;
  const int kvh = bk % a.n_kv_heads;
  const int b = bk / a.n_kv_heads;
  const int g0 = sub * GMAX;
  const int gc = min(GMAX, a.group - g0);  // query heads of this CTA
  const int head0 = kvh * a.group + g0;
  const int H = a.n_heads, KVH = a.n_kv_heads;

  T* out = static_cast<T*>(a.out) + (int64_t(b) * H + head0) * D;
  int L = a.context_lens[b];
  const int64_t capacity = int64_t(a.max_blocks_per_seq) << a.block_shift;
  if (L > capacity) L = static_cast<int>(capacity);
  // This CTA's slice of the key tiles (all of them when there is one split).
  const int n_tiles = L > 0 ? (L + 31) >> 5 : 0;
  const int tiles_per_split = (n_tiles + a.splits - 1) / a.splits;
  const int tile_begin = split * tiles_per_split;
  const int tile_end = min(n_tiles, tile_begin + tiles_per_split);
  float* partial = a.splits > 1 ? a.partials + ((int64_t(b) * H + head0) * a.splits + split) * (D + 2) : nullptr;
  if (tile_begin >= tile_end) {  // no keys: zeros, or an empty partial (m = -inf, d = 0, o = 0)
    for (int i = tid; i < gc * D; i += kThreads) {
      if (partial == nullptr) {
        out[i] = from_float<T>(0.f);
      } else {
        float* pg = partial + int64_t(i / D) * a.splits * (D + 2);
        const int d = i % D;
        pg[2 + d] = 0.f;
        if (d == 0) {
          pg[0] = -INFINITY;
          pg[1] = 0.f;
        }
      }
    }
    return;
  }

  const T* q = static_cast<const T*>(a.qkv) + int64_t(b) * (H + 2 * KVH) * D + int64_t(head0) * D;
  for (int i = tid; i < GMAX * D; i += kThreads) q_s[i] = i < gc * D ? to_float(q[i]) * a.scale_log2 : 0.f;
  __syncthreads();

  const T* k_cache = static_cast<const T*>(a.k_cache);
  const T* v_cache = static_cast<const T*>(a.v_cache);
  const int32_t* btab = a.block_tables + int64_t(b) * a.max_blocks_per_seq;
  const int shift = a.block_shift;
  const int in_block_mask = (1 << shift) - 1;

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
  for (int tile = tile_begin + warp; tile < tile_end; tile += kWarps) {
    const int j = (tile << 5) + lane;
    const bool valid = j < L;
    int64_t row = 0;  // element offset of this key's row for head kvh
    if (valid) {
      const int64_t blk = btab[j >> shift];
      row = ((blk << shift) + (j & in_block_mask)) * KVH * D + int64_t(kvh) * D;
    }
    // Stage the tile's K and V rows (coalesced: lanes copy consecutive chunks of RPS rows a step).
    const int n_valid = min(32, L - (tile << 5));
#pragma unroll
    for (int step = 0; step < 32 / RPS; ++step) {
      const int jj = step * RPS + copy_row;
      const int64_t src = __shfl_sync(0xffffffffu, row, jj);
      if (jj < n_valid) {
        detail::cp_async16(k_w + jj * KS + copy_chunk * 8, k_cache + src + copy_chunk * 8);
        detail::cp_async16(v_w + jj * D + copy_chunk * 8, v_cache + src + copy_chunk * 8);
      }
    }
    detail::cp_async_commit();
    detail::cp_async_wait_all();
    __syncwarp();  // every lane's copies visible to the whole warp

    // Logits of this lane's key for every head of the group (log2 domain).
    float s[GMAX];
#pragma unroll
    for (int g = 0; g < GMAX; ++g) s[g] = 0.f;
    if (valid) {
      const T* kp = k_w + lane * KS;
#pragma unroll
      for (int c = 0; c < CH; ++c) {
        const uint4 raw = *reinterpret_cast<const uint4*>(kp + c * 8);
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

    // Online softmax update (the tile has at least one valid key, so m_new is finite).
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
    __syncwarp();  // p_w visible to the whole warp

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
    __syncwarp();  // p_w and the stage are rewritten by the next tile
  }

  // Cross-warp merge. o_s overlays the other warps' V tiles: wait until every warp is done.
  __syncthreads();
#pragma unroll
  for (int g = 0; g < GMAX; ++g) {
    const float d_total = warp_sum(dl[g]);
    if (lane == 0) {
      m_s[warp * GMAX + g] = m[g];
      d_s[warp * GMAX + g] = d_total;
    }
#pragma unroll
    for (int v = 0; v < VPL; ++v) o_s[(warp * GMAX + g) * D + lane * VPL + v] = o[g][v];
  }
  __syncthreads();
  for (int i = tid; i < gc * D; i += kThreads) {
    const int g = i / D, d = i - g * D;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, m_s[w * GMAX + g]);
    float num = 0.f, den = 0.f;
    if (M != -INFINITY) {
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const float f = exp2f(m_s[w * GMAX + g] - M);
        num += f * o_s[(w * GMAX + g) * D + d];
        den += f * d_s[w * GMAX + g];
      }
    }
    if (partial == nullptr) {
      out[i] = from_float<T>(den > 0.f ? num / den : 0.f);
    } else {
      float* pg = partial + int64_t(g) * a.splits * (D + 2);
      pg[2 + d] = num;
      if (d == 0) {
        pg[0] = M;
        pg[1] = den;
      }
    }
  }
}

// Merges the splits' partials of one (sequence, query head): out = sum_s 2^(m_s - M) o_s /
// sum_s 2^(m_s - M) d_s with M = max_s m_s (the synchronized FlashDecoding reduction).
template <class T, int D>
__global__ void decode_combine_kernel(const float* __restrict__ partials, int splits, T* __restrict__ out) {
  const int bh = blockIdx.x;  // b * H + h
  const float* p = partials + int64_t(bh) * splits * (D + 2);
  float M = -INFINITY;
  for (int s = 0; s < splits; ++s) M = fmaxf(M, p[s * (D + 2)]);
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float num = 0.f, den = 0.f;
    if (M != -INFINITY) {
      for (int s = 0; s < splits; ++s) {
        const float* ps = p + s * (D + 2);
        const float f = exp2f(ps[0] - M);
        num += f * ps[2 + d];
        den += f * ps[1];
      }
    }
    out[int64_t(bh) * D + d] = from_float<T>(den > 0.f ? num / den : 0.f);
  }
}

template <class T, int D, int GMAX>
void launch_decode(const DecodeArgs& a, int n_ctas, cudaStream_t stream) {
  constexpr size_t smem = decode_smem_bytes<D, GMAX>();
  auto* kernel = decode_attention_kernel<T, D, GMAX>;
  if (smem > 48 * 1024) {
    cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
               "cudaFuncSetAttribute(decode_attention_kernel, max dynamic shared memory)");
  }
  kernel<<<dim3(n_ctas, a.splits), kThreads, smem, stream>>>(a);
}

template <class T, int D>
void launch_decode_g(int gmax, const DecodeArgs& a, int n_ctas, cudaStream_t stream) {
  switch (gmax) {
    case 1: return launch_decode<T, D, 1>(a, n_ctas, stream);
    case 2: return launch_decode<T, D, 2>(a, n_ctas, stream);
    case 4: return launch_decode<T, D, 4>(a, n_ctas, stream);
    case 8: return launch_decode<T, D, 8>(a, n_ctas, stream);
    default: return launch_decode<T, D, 16>(a, n_ctas, stream);
  }
}

}  // namespace

size_t decode_attention_workspace_bytes(int batch, int n_heads, int head_dim, int splits) {
  return splits <= 1 ? 0 : sizeof(float) * size_t(batch) * n_heads * splits * (head_dim + 2);
}

int plan_decode_splits(int batch, int n_heads, int n_kv_heads, int max_context_len, int multiprocessors) {
  // One CTA per (sequence, kv head [, 16-head sub-group]). When those fill less than one wave of
  // the GPU, split each sequence's keys over more CTAs, keeping at least 8 tiles of 32 keys per
  // split (one per warp) so that a split's fixed cost (loading q, the merge, the partial write)
  // stays small next to its key traffic. Worked example, H200 (132 SMs), Llama-2-7B, batch 1,
  // context 1024: 32 CTAs, 32 tiles -> 4 splits of 8 tiles -> 128 CTAs in one wave (measured
  // without splits: 17 us, 32 of 132 SMs busy).
  const int group = n_heads / n_kv_heads;
  const int n_sub = (group + 15) / 16;
  const int64_t ctas = int64_t(batch) * n_kv_heads * n_sub;
  if (ctas >= multiprocessors || max_context_len <= 0) return 1;
  const int n_tiles = (max_context_len + 31) / 32;
  const int by_length = std::max(1, n_tiles / kWarps);
  const int by_wave = static_cast<int>((multiprocessors + ctas - 1) / ctas);
  return std::max(1, std::min({by_length, by_wave, 64}));
}

void decode_attention(const void* qkv, const void* k_cache, const void* v_cache, const int32_t* block_tables,
                      int max_blocks_per_seq, const int32_t* context_lens, int batch, int n_heads, int n_kv_heads,
                      int head_dim, int block_size, float scale, void* out, DType dtype, cudaStream_t stream) {
  decode_attention_split(qkv, k_cache, v_cache, block_tables, max_blocks_per_seq, context_lens, batch, n_heads,
                         n_kv_heads, head_dim, block_size, scale, out, dtype, 1, nullptr, 0, stream);
}

void decode_attention_split(const void* qkv, const void* k_cache, const void* v_cache, const int32_t* block_tables,
                            int max_blocks_per_seq, const int32_t* context_lens, int batch, int n_heads,
                            int n_kv_heads, int head_dim, int block_size, float scale, void* out, DType dtype,
                            int splits, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  check(splits >= 1 && splits <= 1024, "decode_attention: splits = {} out of range [1, 1024]", splits);
  check(splits == 1 || (workspace != nullptr &&
                        workspace_bytes >= decode_attention_workspace_bytes(batch, n_heads, head_dim, splits)),
        "decode_attention: {} splits need {} bytes of workspace, got {}", splits,
        decode_attention_workspace_bytes(batch, n_heads, head_dim, splits), workspace_bytes);
  check(qkv != nullptr && k_cache != nullptr && v_cache != nullptr && block_tables != nullptr &&
            context_lens != nullptr && out != nullptr,
        "decode_attention: null pointer (qkv {}, k_cache {}, v_cache {}, block_tables {}, context_lens {}, out {})",
        qkv, k_cache, v_cache, static_cast<const void*>(block_tables), static_cast<const void*>(context_lens), out);
  check(batch > 0 && n_heads > 0 && n_kv_heads > 0 && max_blocks_per_seq > 0,
        "decode_attention: batch = {}, n_heads = {}, n_kv_heads = {}, max_blocks_per_seq = {} must be positive",
        batch, n_heads, n_kv_heads, max_blocks_per_seq);
  check(n_heads % n_kv_heads == 0, "decode_attention: n_heads = {} is not a multiple of n_kv_heads = {}", n_heads,
        n_kv_heads);
  check(head_dim == 64 || head_dim == 128, "decode_attention: head_dim = {} is not supported (64, 128)", head_dim);
  check(block_size > 0 && (block_size & (block_size - 1)) == 0 && block_size <= (1 << 20),
        "decode_attention: block_size = {} must be a power of two", block_size);
  check(std::isfinite(scale), "decode_attention: scale = {} is not finite", scale);
  check(aligned16(k_cache) && aligned16(v_cache), "decode_attention: k/v cache pointers must be 16-byte aligned");
  check(dtype == DType::F16 || dtype == DType::BF16, "decode_attention: unknown dtype {}", static_cast<int>(dtype));
  const int group = n_heads / n_kv_heads;
  const int gmax = group <= 1 ? 1 : group <= 2 ? 2 : group <= 4 ? 4 : group <= 8 ? 8 : 16;
  const int n_sub = (group + gmax - 1) / gmax;
  const int64_t n_ctas = int64_t(batch) * n_kv_heads * n_sub;
  check(n_ctas <= 0x7fffffff, "decode_attention: {} CTAs exceed the grid limit", n_ctas);
  int shift = 0;
  while ((1 << shift) < block_size) ++shift;
  const DecodeArgs args{qkv,     k_cache,    v_cache, block_tables, max_blocks_per_seq,
                        context_lens, n_heads, n_kv_heads, group,  n_sub,
                        shift,   scale * detail::kLog2e, out, splits, static_cast<float*>(workspace)};
  detail::dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    if (head_dim == 64) {
      launch_decode_g<T, 64>(gmax, args, static_cast<int>(n_ctas), stream);
      if (splits > 1)
        decode_combine_kernel<T, 64><<<batch * n_heads, 64, 0, stream>>>(args.partials, splits, static_cast<T*>(out));
    } else {
      launch_decode_g<T, 128>(gmax, args, static_cast<int>(n_ctas), stream);
      if (splits > 1)
        decode_combine_kernel<T, 128><<<batch * n_heads, 128, 0, stream>>>(args.partials, splits, static_cast<T*>(out));
    }
  });
  check_launch("decode_attention");
}

}  // namespace fdpp::cuda
