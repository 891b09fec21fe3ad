// Causal prefill attention of one sequence over the paged KV cache (flash-attention style on CUDA
// cores, fp32 throughout; a tensor-core version can replace it without changing the contract).
//
// One CTA of 256 threads per (64-query tile, query head); query tiles are scheduled longest first
// (the last tile of a causal sequence sees the most keys). The CTA walks 64-key tiles from key 0 to
// its last query's position:
//   * Q tile (fp32, pre-scaled by scale * log2(e)) and K tile (fp32) in shared memory, rows padded to
//     D + 4 floats so the column-interleaved reads below are bank-conflict free; V tile kept 16-bit.
//   * Thread (ty, tx) of a 16 x 16 grid computes S for rows ty + 16i and keys tx + 16j (4 x 4),
//     masks keys beyond each row's position with -inf, and updates the row's online softmax (max m,
//     sum l, both replicated over the 16 threads of a row; the row max is a 4-step shuffle).
//   * P goes through shared memory; each thread accumulates O for its 4 rows and D/16 columns
//     (tx*4 .. tx*4+3, and +64 for D = 128).
// Key 0 is visible to every row, so after the first tile every row's max is finite: no inf - inf.
// Rows past n_tokens (a partial last tile) are computed but never written.
// Shared memory: D = 128: 102 KB (two CTAs per SM); D = 64: 56 KB.
#include <cmath>

#include "backend/cuda/cuda_common.cuh"

namespace fdpp::cuda {

namespace {

using detail::aligned16;
using detail::check_launch;
using detail::cuda_check;
using detail::from_float;
using detail::load8;
using detail::to_float;

constexpr int kBQ = 64;   // queries per tile
constexpr int kBK = 64;   // keys per tile
constexpr int kThreads = 256;
constexpr int kPS = kBK + 16;  // P row stride (floats): rows ty and ty+1 of a warp land 16 banks apart

struct PrefillArgs {
  const void* qkv;
  const void* k_cache;
  const void* v_cache;
  const int32_t* block_table;
  int start_pos, n_tokens, n_heads, n_kv_heads, group;
  int block_shift;
  float scale_log2;
  void* out;
};

template <int D>
constexpr size_t prefill_smem_bytes() {
  return sizeof(float) * (kBQ + kBK) * (D + 4)  // Q, K
         + sizeof(float) * kBQ * kPS            // P
         + sizeof(uint16_t) * kBK * D;          // V (16-bit)
}

template <class T, int D>
__global__ void __launch_bounds__(kThreads, 2) prefill_attention_kernel(PrefillArgs a) {
  static_assert(D == 64 || D == 128, "head_dim");
  constexpr int QS = D + 4;       // Q/K row stride in floats (16-byte multiple: float4 rows stay aligned)
  constexpr int CH = D / 8;       // 16-byte chunks per row
  constexpr int NO = D / 16;      // output columns per thread
  extern __shared__ __align__(16) unsigned char smem_raw[];
  float* q_s = reinterpret_cast<float*>(smem_raw);  // [kBQ][QS]
  float* k_s = q_s + kBQ * QS;                      // [kBK][QS]
  float* p_s = k_s + kBK * QS;                      // [kBQ][kPS]
  T* v_s = reinterpret_cast<T*>(p_s + kBQ * kPS);   // [kBK][D]

  const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
  const int q_tile = gridDim.x - 1 - blockIdx.x;  // heaviest tiles first
  const int q0 = q_tile * kBQ;
  const int h = blockIdx.y;
  const int kvh = h / a.group;
  const int T_ = a.n_tokens, H = a.n_heads, KVH = a.n_kv_heads;
  const int kv_len = a.start_pos + T_;
  const int64_t row_stride = int64_t(H + 2 * KVH) * D;
  const int shift = a.block_shift, in_block_mask = (1 << shift) - 1;
  const T* k_cache = static_cast<const T*>(a.k_cache);
  const T* v_cache = static_cast<const T*>(a.v_cache);

  // Q tile -> shared (fp32, scaled); rows past n_tokens are zero.
  {
    const T* q = static_cast<const T*>(a.qkv) + int64_t(h) * D;
    for (int c = tid; c < kBQ * CH; c += kThreads) {
      const int r = c / CH, cc = c - r * CH;
      float f[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
      if (q0 + r < T_) load8(q + int64_t(q0 + r) * row_stride + cc * 8, f);
      float4* dst = reinterpret_cast<float4*>(q_s + r * QS + cc * 8);
      dst[0] = make_float4(f[0] * a.scale_log2, f[1] * a.scale_log2, f[2] * a.scale_log2, f[3] * a.scale_log2);
      dst[1] = make_float4(f[4] * a.scale_log2, f[5] * a.scale_log2, f[6] * a.scale_log2, f[7] * a.scale_log2);
    }
  }

  // The last key any row of this tile may see (inclusive), per row of this thread.
  int lim[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) lim[i] = min(a.start_pos + q0 + ty + 16 * i, kv_len - 1);
  const int k_end = a.start_pos + min(q0 + kBQ, T_);  // keys 0 .. k_end - 1 are visible to some row
  const int n_k_tiles = (k_end + kBK - 1) / kBK;

  float m[4], l[4], o[4][NO];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.f;
#pragma unroll
    for (int c = 0; c < NO; ++c) o[i][c] = 0.f;
  }

  for (int kt = 0; kt < n_k_tiles; ++kt) {
    const int k0 = kt * kBK;
    // K (fp32) and V (16-bit) tiles -> shared; keys past the cache are zero.
    for (int c = tid; c < kBK * CH; c += kThreads) {
      const int r = c / CH, cc = c - r * CH;
      const int key = k0 + r;
      uint4 kraw = make_uint4(0, 0, 0, 0), vraw = make_uint4(0, 0, 0, 0);
      if (key < kv_len) {
        const int64_t blk = a.block_table[key >> shift];
        const int64_t off = ((blk << shift) + (key & in_block_mask)) * KVH * D + int64_t(kvh) * D + cc * 8;
        kraw = *reinterpret_cast<const uint4*>(k_cache + off);
        vraw = *reinterpret_cast<const uint4*>(v_cache + off);
      }
      const T* ke = reinterpret_cast<const T*>(&kraw);
      float4* kd = reinterpret_cast<float4*>(k_s + r * QS + cc * 8);
      kd[0] = make_float4(to_float(ke[0]), to_float(ke[1]), to_float(ke[2]), to_float(ke[3]));
      kd[1] = make_float4(to_float(ke[4]), to_float(ke[5]), to_float(ke[6]), to_float(ke[7]));
      *reinterpret_cast<uint4*>(v_s + r * D + cc * 8) = vraw;
    }
    __syncthreads();

    // S = Q K^T for rows ty + 16i, keys tx + 16j.
    float s[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) s[i][j] = 0.f;
#pragma unroll 4
    for (int d = 0; d < D; d += 4) {
      float4 qv[4], kv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) qv[i] = *reinterpret_cast<const float4*>(q_s + (ty + 16 * i) * QS + d);
#pragma unroll
      for (int j = 0; j < 4; ++j) kv[j] = *reinterpret_cast<const float4*>(k_s + (tx + 16 * j) * QS + d);
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
          s[i][j] += qv[i].x * kv[j].x + qv[i].y * kv[j].y + qv[i].z * kv[j].z + qv[i].w * kv[j].w;
    }

    // Mask, online softmax, P -> shared.
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if (k0 + tx + 16 * j > lim[i]) s[i][j] = -INFINITY;
        mx = fmaxf(mx, s[i][j]);
      }
#pragma unroll
      for (int off = 1; off < 16; off <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
      const float m_new = fmaxf(m[i], mx);  // finite: key 0 is in the first tile for every row
      const float alpha = exp2f(m[i] - m_new);
      m[i] = m_new;
      l[i] *= alpha;
#pragma unroll
      for (int c = 0; c < NO; ++c) o[i][c] *= alpha;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float p = exp2f(s[i][j] - m_new);
        l[i] += p;
        p_s[(ty + 16 * i) * kPS + tx + 16 * j] = p;
      }
    }
    __syncthreads();

    // O += P V.
#pragma unroll 2
    for (int k = 0; k < kBK; k += 4) {
      float4 pv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) pv[i] = *reinterpret_cast<const float4*>(p_s + (ty + 16 * i) * kPS + k);
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        float vf[NO];
#pragma unroll
        for (int half = 0; half < NO / 4; ++half) {
          const uint2 raw = *reinterpret_cast<const uint2*>(v_s + (k + kk) * D + half * 64 + tx * 4);
          const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
          for (int x = 0; x < 4; ++x) vf[half * 4 + x] = to_float(e[x]);
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float p = kk == 0 ? pv[i].x : kk == 1 ? pv[i].y : kk == 2 ? pv[i].z : pv[i].w;
#pragma unroll
          for (int c = 0; c < NO; ++c) o[i][c] += p * vf[c];
        }
      }
    }
    __syncthreads();  // K, V, P are overwritten by the next tile
  }

  T* out = static_cast<T*>(a.out);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float lt = l[i];
#pragma unroll
    for (int off = 1; off < 16; off <<= 1) lt += __shfl_xor_sync(0xffffffffu, lt, off);
    const int qi = q0 + ty + 16 * i;
    if (qi < T_) {
      const float inv = 1.f / lt;
      T* dst = out + int64_t(qi) * H * D + int64_t(h) * D;
#pragma unroll
      for (int c = 0; c < NO; ++c) dst[(c / 4) * 64 + tx * 4 + (c & 3)] = from_float<T>(o[i][c] * inv);
    }
  }
}

template <class T, int D>
void launch_prefill(const PrefillArgs& a, dim3 grid, cudaStream_t stream) {
  constexpr size_t smem = prefill_smem_bytes<D>();
  auto* kernel = prefill_attention_kernel<T, D>;
  if (smem > 48 * 1024) {
    cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
               "cudaFuncSetAttribute(prefill_attention_kernel, max dynamic shared memory)");
  }
  kernel<<<grid, kThreads, smem, stream>>>(a);
}

}  // namespace

void prefill_attention(const void* qkv, const void* k_cache, const void* v_cache, const int32_t* block_table,
                       int start_pos, int n_tokens, int n_heads, int n_kv_heads, int head_dim, int block_size,
                       float scale, void* out, DType dtype, cudaStream_t stream) {
  check(qkv != nullptr && k_cache != nullptr && v_cache != nullptr && block_table != nullptr && out != nullptr,
        "prefill_attention: null pointer (qkv {}, k_cache {}, v_cache {}, block_table {}, out {})", qkv, k_cache,
        v_cache, static_cast<const void*>(block_table), out);
  check(n_tokens > 0 && n_heads > 0 && n_kv_heads > 0,
        "prefill_attention: n_tokens = {}, n_heads = {}, n_kv_heads = {} must be positive", n_tokens, n_heads,
        n_kv_heads);
  check(start_pos >= 0 && int64_t(start_pos) + n_tokens <= 0x7fffffff,
        "prefill_attention: start_pos = {} with {} tokens is out of range", start_pos, n_tokens);
  check(n_heads % n_kv_heads == 0, "prefill_attention: n_heads = {} is not a multiple of n_kv_heads = {}", n_heads,
        n_kv_heads);
  check(n_heads <= 65535, "prefill_attention: n_heads = {} exceeds the grid limit 65535", n_heads);
  check(head_dim == 64 || head_dim == 128, "prefill_attention: head_dim = {} is not supported (64, 128)", head_dim);
  check(block_size > 0 && (block_size & (block_size - 1)) == 0 && block_size <= (1 << 20),
        "prefill_attention: block_size = {} must be a power of two", block_size);
  check(std::isfinite(scale), "prefill_attention: scale = {} is not finite", scale);
  check(aligned16(qkv) && aligned16(k_cache) && aligned16(v_cache),
        "prefill_attention: qkv and k/v cache pointers must be 16-byte aligned");
  check(dtype == DType::F16 || dtype == DType::BF16, "prefill_attention: unknown dtype {}", static_cast<int>(dtype));
  int shift = 0;
  while ((1 << shift) < block_size) ++shift;
  const PrefillArgs args{qkv,       k_cache,    v_cache,          block_table, start_pos, n_tokens, n_heads,
                         n_kv_heads, n_heads / n_kv_heads, shift, scale * detail::kLog2e, out};
  const dim3 grid((n_tokens + kBQ - 1) / kBQ, n_heads);
  detail::dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    if (head_dim == 64) {
      launch_prefill<T, 64>(args, grid, stream);
    } else {
      launch_prefill<T, 128>(args, grid, stream);
    }
  });
  check_launch("prefill_attention");
}

}  // namespace fdpp::cuda
