// GGUF blocks on the GPU (gguf_blocks.h): x's 8-bit quantization, the block GEMVs and the
// dequantization for large products (one thread per task, bit-identical to the loader's conversion).
//
// The GEMV: a warp owns R = 2 weight rows; lane l takes the row's tasks l, l + 32, ... (a task is one
// 32-element block of Q4_0/Q4_1/Q8_0, or 64 elements of a K-quant super-block: Q4_K/Q5_K's groups 2p
// and 2p + 1, which share their bytes' low and high nibbles, and Q6_K's elements 32 kk + l and
// 32 (kk + 2) + l of one half, likewise), U tasks per pass (tasks_per_pass), all of a pass's weight
// bytes loaded before the first use. Each task is unpacked once for every row of x, and x's values
// for a task are loaded once for both weight rows. Blocks are read where they lie: Q4_K and Q5_K
// (144 and 176 bytes) with 16-byte loads, Q4_1 (20) with 4-byte ones and Q4_0, Q8_0 and Q6_K (18, 34
// and 210 bytes, 2-byte aligned) with 2-byte ones; the L1 turns the warp's strided loads into whole
// lines. The integer sums are the CPU's (cpu/quant_matmul.cpp's scalar kernels); only the fp32 order
// of the per-block terms differs. (Products of 4-64 rows over matrices whose types all have a flat
// format go to the flat GEMM instead: flat_gemm.h, flat_gemm_gguf.)
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <type_traits>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/gemv_rows.cuh"
#include "backend/cuda/gguf_block_fields.cuh"
#include "backend/cuda/gguf_blocks.h"

namespace fdpp::cuda {

namespace {

using detail::check_launch;
using detail::from_float;
using detail::half_bits;
using detail::scale_min_k4;
using detail::to_float;

using namespace detail::ggml_type;  // kQ4_0 .. kQ6_K

constexpr int kWarps = 8;  // per CTA
constexpr int kRows = 2;   // weight rows per warp (a gate row and its up row for SwiGLU)

struct BlockShape {
  int elems, bytes;
};
__host__ __device__ constexpr BlockShape block_shape(uint32_t t) {
  return t == kQ4_0   ? BlockShape{32, 18}
         : t == kQ4_1 ? BlockShape{32, 20}
         : t == kQ8_0 ? BlockShape{32, 34}
         : t == kQ4_K ? BlockShape{256, 144}
         : t == kQ5_K ? BlockShape{256, 176}
         : t == kQ6_K ? BlockShape{256, 210}
                      : BlockShape{0, 0};
}
__host__ __device__ constexpr bool is_k_quant(uint32_t t) { return t == kQ4_K || t == kQ5_K || t == kQ6_K; }
// Elements of one lane task.
__host__ __device__ constexpr int task_elems(uint32_t t) { return is_k_quant(t) ? 64 : 32; }
// Tasks per lane per pass, all loaded before the first is used: two of the small 32-element blocks;
// one K-quant task (64 elements with their scales take the registers of two already) from three
// rows of x, two at one or two rows, where the registers allow it. The first pass's weights are
// read before the programmatic-launch wait, so two tasks a lane put twice the bytes in flight
// while the previous kernel drains (docs/kernels/gguf_blocks.md).
__host__ __device__ constexpr int tasks_per_pass(uint32_t t, int M) { return is_k_quant(t) && M > 2 ? 1 : 2; }

// ---- the quantized-x layout (gguf_act_bytes) --------------------------------------------------

constexpr size_t round16(size_t n) { return (n + 15) / 16 * 16; }

// Offsets of the six arrays for Mt rows of K elements (a family left out takes no bytes).
struct ActLayout {
  size_t qs32, d32, s32, qs256, d256, bsum, total;
  __host__ __device__ ActLayout(int Mt, int K, bool legacy = true, bool k_quants = true) {
    const size_t m = size_t(Mt), k = size_t(K), l = legacy ? 1 : 0, q = k_quants ? 1 : 0;
    qs32 = 0;
    d32 = qs32 + l * round16(m * k);
    s32 = d32 + l * round16(m * (k / 32) * 4);
    qs256 = s32 + l * round16(m * (k / 32) * 4);
    d256 = qs256 + q * round16(m * k);
    bsum = d256 + q * round16(m * (k / 256) * 4);
    total = bsum + q * round16(m * (k / 16) * 2);
  }
};

// ---- x -> 8 bits --------------------------------------------------------------------------------

// Block `block` (of B elements: 32 or 256) of x [M, K] quantized by one warp into act (global or
// shared memory): lane l holds elements l * B / 32 .. (l + 1) * B / 32 - 1.
template <class T, int B>
__device__ __forceinline__ void quantize_block(const T* __restrict__ x, int K, int64_t block, uint8_t* act,
                                               const ActLayout& L) {
  constexpr int E = B / 32;  // elements per lane
  const int lane = threadIdx.x & 31;
  const int per_row = K / B;
  const int m = int(block / per_row), b = int(block % per_row);
  const T* src = x + int64_t(m) * K + int64_t(b) * B + lane * E;
  float v[E], amax = 0.f, bad = 0.f;
#pragma unroll
  for (int i = 0; i < E; ++i) {
    v[i] = to_float(src[i]);
    amax = fmaxf(amax, fabsf(v[i]));
    bad += v[i] * 0.f;  // NaN when an element is NaN or infinite
  }
  amax = detail::warp_max(amax);
  bad = detail::warp_sum(bad);
  const float d = bad == 0.f ? amax / 127.f : __int_as_float(0x7fc00000);
  const float id = d != 0.f ? 1.f / d : 0.f;
  const bool finite = isfinite(d);
  int8_t q[E];
  int sum = 0;
#pragma unroll
  for (int i = 0; i < E; ++i) {
    q[i] = finite ? int8_t(__float2int_rn(v[i] * id)) : int8_t(0);
    sum += q[i];
  }
  const size_t row_elems = size_t(m) * K + size_t(b) * B + size_t(lane) * E;
  int8_t* qs = reinterpret_cast<int8_t*>(act + (B == 32 ? L.qs32 : L.qs256)) + row_elems;
  if constexpr (E == 1) {
    qs[0] = q[0];
  } else {
    uint2 packed;
    packed.x = uint32_t(uint8_t(q[0])) | uint32_t(uint8_t(q[1])) << 8 | uint32_t(uint8_t(q[2])) << 16 |
               uint32_t(uint8_t(q[3])) << 24;
    packed.y = uint32_t(uint8_t(q[4])) | uint32_t(uint8_t(q[5])) << 8 | uint32_t(uint8_t(q[6])) << 16 |
               uint32_t(uint8_t(q[7])) << 24;
    *reinterpret_cast<uint2*>(qs) = packed;
  }
  if constexpr (B == 32) {
    sum = __reduce_add_sync(0xffffffffu, sum);
    if (lane == 0) {
      reinterpret_cast<float*>(act + L.d32)[block] = d;
      reinterpret_cast<float*>(act + L.s32)[block] = d * float(sum);
    }
  } else {
    // Sums per 16 elements: lanes 2g and 2g + 1.
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    if ((lane & 1) == 0) reinterpret_cast<int16_t*>(act + L.bsum)[block * 16 + lane / 2] = int16_t(sum);
    if (lane == 0) reinterpret_cast<float*>(act + L.d256)[block] = d;
  }
}

// One warp per block.
template <class T, int B>
__global__ void __launch_bounds__(kWarps * 32) quantize_x_kernel(const T* __restrict__ x, int M, int K,
                                                                  uint8_t* __restrict__ act, ActLayout L) {
  detail::pdl_trigger();
  detail::pdl_wait();  // x is the previous kernel's
  const int64_t block = (blockIdx.x * int64_t(kWarps)) + (threadIdx.x >> 5);
  if (block >= int64_t(M) * (K / B)) return;
  quantize_block<T, B>(x, K, block, act, L);
}

// ---- weight loads -------------------------------------------------------------------------------

__device__ __forceinline__ uint32_t ld_u16(const uint8_t* p) { return *reinterpret_cast<const uint16_t*>(p); }
__device__ __forceinline__ uint32_t ld_u32(const uint8_t* p) { return *reinterpret_cast<const uint32_t*>(p); }

// W words (4W bytes) at a 2-byte aligned address, read as W / 4 + 1 aligned 16-byte loads from the
// 16-byte boundary at or below p and shifted into place: a warp's 2-byte loads of blocks spread
// over as many cache lines took 2-4x the L1 wavefronts per byte. May read up to 16 bytes past
// p + 4W (kGgufBlocksTailBytes).
template <int W>
__device__ __forceinline__ void load_words_a2(const uint8_t* p, uint32_t (&out)[W]) {
  static_assert(W % 4 == 0, "whole 16-byte loads");
  constexpr int kLoads = W / 4 + 1;
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const uint4* base = reinterpret_cast<const uint4*>(a & ~uintptr_t(15));
  uint32_t raw[4 * kLoads];
#pragma unroll
  for (int i = 0; i < kLoads; ++i) {
    const uint4 v = __ldcs(base + i);
    raw[4 * i] = v.x, raw[4 * i + 1] = v.y, raw[4 * i + 2] = v.z, raw[4 * i + 3] = v.w;
  }
  // Down by (a & 15) / 4 words with selects (a register array indexed at run time would go to
  // local memory), then by the remaining 0 or 2 bytes.
  const int words = int(a & 15) >> 2;
  uint32_t s1[4 * kLoads - 1], s2[4 * kLoads - 3];
#pragma unroll
  for (int j = 0; j < 4 * kLoads - 1; ++j) s1[j] = (words & 1) ? raw[j + 1] : raw[j];
#pragma unroll
  for (int j = 0; j < 4 * kLoads - 3; ++j) s2[j] = (words & 2) ? s1[j + 2] : s1[j];
  const uint32_t shift = uint32_t(a & 2) * 8;
#pragma unroll
  for (int i = 0; i < W; ++i) out[i] = __funnelshift_r(s2[i], s2[i + 1], shift);
}

// One task's weight bytes, as loaded (before the activations are known).
struct TaskWeights {
  uint32_t q[8];   // quant bytes: a block's 32 (Q8_0) / 16 (Q4_0, Q4_1) bytes, the 32 nibble bytes of a K pair
  uint32_t h[8];   // Q5_K: the 32 qh bytes; Q6_K: the 32 qh bytes of the half
  uint32_t dm;     // d (low 16 bits) and dmin / m (high 16 bits); Q6_K: d
  uint32_t sc[3];  // Q4_K/Q5_K: the 12 scale bytes; Q6_K: sc[0] = the two scales of kk, sc[1] those of kk + 2
};

// Task t of a row (row: the row's first byte).
template <uint32_t Q>
__device__ __forceinline__ void load_task(const uint8_t* __restrict__ row, int t, TaskWeights& w) {
  if constexpr (Q == kQ4_0) {
    const uint8_t* b = row + size_t(t) * 18;
    w.dm = ld_u16(b);
    uint32_t q[4];
    load_words_a2<4>(b + 2, q);
#pragma unroll
    for (int i = 0; i < 4; ++i) w.q[i] = q[i];
  } else if constexpr (Q == kQ4_1) {
    const uint8_t* b = row + size_t(t) * 20;
    w.dm = ld_u32(b);
#pragma unroll
    for (int i = 0; i < 4; ++i) w.q[i] = ld_u32(b + 4 + 4 * i);
  } else if constexpr (Q == kQ8_0) {
    const uint8_t* b = row + size_t(t) * 34;
    w.dm = ld_u16(b);
    load_words_a2<8>(b + 2, w.q);
  } else if constexpr (Q == kQ4_K || Q == kQ5_K) {
    const int p = t & 3;
    const uint8_t* b = row + size_t(t >> 2) * (Q == kQ4_K ? 144 : 176);
    const uint4 head = __ldcs(reinterpret_cast<const uint4*>(b));  // d, dmin, 12 scale bytes
    w.dm = head.x;
    w.sc[0] = head.y;
    w.sc[1] = head.z;
    w.sc[2] = head.w;
    const uint4* qs = reinterpret_cast<const uint4*>(b + (Q == kQ4_K ? 16 : 48) + 32 * p);
    const uint4 q0 = __ldcs(qs), q1 = __ldcs(qs + 1);
    w.q[0] = q0.x, w.q[1] = q0.y, w.q[2] = q0.z, w.q[3] = q0.w;
    w.q[4] = q1.x, w.q[5] = q1.y, w.q[6] = q1.z, w.q[7] = q1.w;
    if constexpr (Q == kQ5_K) {
      const uint4* qh = reinterpret_cast<const uint4*>(b + 16);
      const uint4 h0 = __ldg(qh), h1 = __ldg(qh + 1);  // shared by the block's four tasks
      w.h[0] = h0.x, w.h[1] = h0.y, w.h[2] = h0.z, w.h[3] = h0.w;
      w.h[4] = h1.x, w.h[5] = h1.y, w.h[6] = h1.z, w.h[7] = h1.w;
    }
  } else {  // Q6_K: task (h, kk0) = t & 3 as 2 h + kk0
    const int h = (t >> 1) & 1, kk0 = t & 1;
    const uint8_t* b = row + size_t(t >> 2) * 210;
    load_words_a2<8>(b + 64 * h + 32 * kk0, w.q);  // ql (both stay inside the block's 210 bytes)
    load_words_a2<8>(b + 128 + 32 * h, w.h);       // qh
    w.sc[0] = ld_u16(b + 192 + 8 * h + 2 * kk0);
    w.sc[1] = ld_u16(b + 192 + 8 * h + 2 * kk0 + 4);
    w.dm = ld_u16(b + 208);
  }
}

__device__ __forceinline__ int dp4a(uint32_t a, uint32_t b, int c) { return __dp4a(int(a), int(b), c); }

// A task's weights unpacked once, for every row of x: 4-byte groups of 8-bit values in x's element
// order (lo: the task's first 32 elements, hi: its second 32; Q4_0/Q4_1: lo[0..4) elements 0..15,
// hi[0..4) 16..31; Q8_0: lo[0..8)), and the scales that multiply their sums.
struct TaskValues {
  uint32_t lo[8], hi[8];
  float d, m;          // the block's scale and its minimum (Q4_1, K-quants' dmin) or -8 d (Q4_0)
  int s0, s1, s2, s3;  // Q4_K/Q5_K: scale and min of groups 2p, 2p + 1; Q6_K: the four scales of 16
};

template <uint32_t Q>
__device__ __forceinline__ TaskValues unpack_task(const TaskWeights& w, int t) {
  TaskValues v;
  if constexpr (Q == kQ4_0 || Q == kQ4_1) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      v.lo[i] = w.q[i] & 0x0F0F0F0Fu;
      v.hi[i] = (w.q[i] >> 4) & 0x0F0F0F0Fu;
    }
    v.d = half_bits(w.dm & 0xFFFF);
    v.m = Q == kQ4_1 ? half_bits(w.dm >> 16) : -8.f * v.d;
  } else if constexpr (Q == kQ8_0) {
#pragma unroll
    for (int i = 0; i < 8; ++i) v.lo[i] = w.q[i];
    v.d = half_bits(w.dm);
  } else if constexpr (Q == kQ4_K || Q == kQ5_K) {
    const int p = t & 3;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      v.lo[i] = w.q[i] & 0x0F0F0F0Fu;
      v.hi[i] = (w.q[i] >> 4) & 0x0F0F0F0Fu;
      if constexpr (Q == kQ5_K) {
        v.lo[i] |= ((w.h[i] >> (2 * p)) & 0x01010101u) << 4;
        v.hi[i] |= ((w.h[i] >> (2 * p + 1)) & 0x01010101u) << 4;
      }
    }
    scale_min_k4(2 * p, w.sc, v.s0, v.s1);
    scale_min_k4(2 * p + 1, w.sc, v.s2, v.s3);
    v.d = half_bits(w.dm & 0xFFFF);
    v.m = half_bits(w.dm >> 16);
  } else {  // Q6_K: unsigned 6-bit values (q + 32)
    const int kk0 = t & 1;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      v.lo[i] = (w.q[i] & 0x0F0F0F0Fu) | (((w.h[i] >> (2 * kk0)) & 0x03030303u) << 4);
      v.hi[i] = ((w.q[i] >> 4) & 0x0F0F0F0Fu) | (((w.h[i] >> (2 * kk0 + 4)) & 0x03030303u) << 4);
    }
    v.s0 = int(int8_t(w.sc[0] & 0xFF));
    v.s1 = int(int8_t(w.sc[0] >> 8));
    v.s2 = int(int8_t(w.sc[1] & 0xFF));
    v.s3 = int(int8_t(w.sc[1] >> 8));
    v.d = half_bits(w.dm);
  }
  return v;
}

__device__ __forceinline__ void load8(const uint8_t* p, uint32_t (&x)[8]) {
  const uint4 a = __ldg(reinterpret_cast<const uint4*>(p)), b = __ldg(reinterpret_cast<const uint4*>(p) + 1);
  x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
}

// Task t's activations of row m of x (its 8-bit values in act), loaded once for all weight rows.
struct TaskX {
  uint32_t lo[8], hi[8];  // Q4_0/Q4_1/Q8_0: lo = the block's 32 values; K-quants: the task's two runs of 32
  float d, s;             // x's block scale; Q4_0/Q4_1: d times the block's value sum
  int bs[4];              // K-quants: the sums of 16 the task's scales and mins multiply
};

template <uint32_t Q>
__device__ __forceinline__ TaskX load_task_x(int t, const uint8_t* __restrict__ act, const ActLayout& L, int m,
                                             int K) {
  TaskX x;
  if constexpr (Q == kQ4_0 || Q == kQ4_1 || Q == kQ8_0) {
    const int64_t block = int64_t(m) * (K / 32) + t;
    load8(act + L.qs32 + size_t(block) * 32, x.lo);
    x.d = __ldg(reinterpret_cast<const float*>(act + L.d32) + block);
    if constexpr (Q != kQ8_0) x.s = __ldg(reinterpret_cast<const float*>(act + L.s32) + block);
  } else {
    const int64_t xblock = int64_t(m) * (K / 256) + (t >> 2);
    x.d = __ldg(reinterpret_cast<const float*>(act + L.d256) + xblock);
    const uint8_t* xq = act + L.qs256 + size_t(xblock) * 256;
    const int16_t* bsum = reinterpret_cast<const int16_t*>(act + L.bsum) + xblock * 16;
    // The task's two runs of 32 elements: Q4_K/Q5_K's groups 2p, 2p + 1; Q6_K's kk0, kk0 + 2.
    const int e_lo = Q == kQ6_K ? 128 * ((t >> 1) & 1) + 32 * (t & 1) : 64 * (t & 3);
    const int e_hi = e_lo + (Q == kQ6_K ? 64 : 32);
    load8(xq + e_lo, x.lo);
    load8(xq + e_hi, x.hi);
    const int g = e_lo / 16;
    // Q4_K/Q5_K: groups g .. g + 3 (the mins of 2p, 2p + 1); Q6_K: g, g + 1, g + 4, g + 5 (its runs).
    const int g2 = Q == kQ6_K ? g + 4 : g + 2;
    x.bs[0] = __ldg(bsum + g), x.bs[1] = __ldg(bsum + g + 1);
    x.bs[2] = __ldg(bsum + g2), x.bs[3] = __ldg(bsum + g2 + 1);
  }
  return x;
}

// The task's contribution: its unpacked weights v against its activations x of one row of x.
template <uint32_t Q>
__device__ __forceinline__ float task_dot(const TaskValues& v, const TaskX& x) {
  if constexpr (Q == kQ4_0 || Q == kQ4_1 || Q == kQ8_0) {
    int sumi = 0;
    if constexpr (Q == kQ8_0) {
#pragma unroll
      for (int i = 0; i < 8; ++i) sumi = dp4a(v.lo[i], x.lo[i], sumi);
      return v.d * x.d * float(sumi);
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        sumi = dp4a(v.lo[i], x.lo[i], sumi);
        sumi = dp4a(v.hi[i], x.lo[i + 4], sumi);
      }
      return v.d * x.d * float(sumi) + v.m * x.s;
    }
  } else if constexpr (Q == kQ4_K || Q == kQ5_K) {
    int g_lo = 0, g_hi = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      g_lo = dp4a(v.lo[i], x.lo[i], g_lo);
      g_hi = dp4a(v.hi[i], x.hi[i], g_hi);
    }
    const int sumi = v.s0 * g_lo + v.s2 * g_hi;
    const int summ = v.s1 * (x.bs[0] + x.bs[1]) + v.s3 * (x.bs[2] + x.bs[3]);
    return v.d * x.d * float(sumi) - v.m * x.d * float(summ);
  } else {  // Q6_K
    int run[4] = {0, 0, 0, 0};  // sums of 16: (kk0, l < 16), (kk0, l >= 16), (kk0 + 2, ...), (...)
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      run[i / 4] = dp4a(v.lo[i], x.lo[i], run[i / 4]);
      run[2 + i / 4] = dp4a(v.hi[i], x.hi[i], run[2 + i / 4]);
    }
    // q - 32: subtract 32 x the run's activation sum.
    const int sumi = v.s0 * (run[0] - 32 * x.bs[0]) + v.s1 * (run[1] - 32 * x.bs[1]) +
                     v.s2 * (run[2] - 32 * x.bs[2]) + v.s3 * (run[3] - 32 * x.bs[3]);
    return v.d * x.d * float(sumi);
  }
}

// acc[r][m] += task t of every row r (its weights tw[r], unpacked once) against every row of x
// (its activations loaded once for all r).
template <uint32_t Q, int R, int M>
__device__ __forceinline__ void accumulate_task(const TaskWeights (&tw)[R], int t, const uint8_t* __restrict__ act,
                                                const ActLayout& L, int row0, int K, float (&acc)[R][M]) {
  TaskValues v[R];
#pragma unroll
  for (int r = 0; r < R; ++r) v[r] = unpack_task<Q>(tw[r], t);
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const TaskX x = load_task_x<Q>(t, act, L, row0 + m, K);
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r][m] += task_dot<Q>(v[r], x);
  }
}

template <class T, uint32_t Q, int M>
__global__ void __launch_bounds__(kWarps * 32)
    gguf_gemv_kernel(const uint8_t* __restrict__ w, uint64_t row_bytes, int N, int K,
                     const uint8_t* __restrict__ act, ActLayout L, int row0, const T* __restrict__ bias,
                     void* __restrict__ y, int ldy, int col0, Epilogue epilogue) {
  constexpr int R = kRows, U = tasks_per_pass(Q, M);
  detail::pdl_trigger();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int unit = blockIdx.x * kWarps + warp;
  const detail::WarpRows<R> wr(unit, N, epilogue == Epilogue::SwiGLU);
  const int(&rows)[R] = wr.row;
  if (!wr.valid[0]) {  // whole warps: no shuffle below runs with missing lanes
    detail::pdl_wait();
    return;
  }
  const int tasks = K / task_elems(Q);
  float acc[R][M];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) acc[r][m] = 0.f;
  bool waited = false;
  for (int base = lane; base < tasks; base += 32 * U) {
    TaskWeights tw[R][U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int t = base + 32 * u;
#pragma unroll
      for (int r = 0; r < R; ++r)
        if (t < tasks) load_task<Q>(w + size_t(rows[r]) * row_bytes, t, tw[r][u]);
    }
    if (!waited) {  // act, bias and y may be the previous kernels': wait after the first weights
      detail::pdl_wait();
      waited = true;
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int t = base + 32 * u;
      if (t >= tasks) break;
      TaskWeights tu[R];
#pragma unroll
      for (int r = 0; r < R; ++r) tu[r] = tw[r][u];
      accumulate_task<Q, R, M>(tu, t, act, L, row0, K, acc);
    }
  }
  if (!waited) detail::pdl_wait();
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) acc[r][m] = detail::warp_sum(acc[r][m]);

  // y is this launch's rows (the host offsets it); act's rows start at row0.
  detail::store_rows<T, R, M>(acc, wr, N, lane, nullptr, bias, y, ldy, col0, epilogue);
}

template <class T, uint32_t Q>
void launch_type(const GgufSegment& seg, const uint8_t* act, const ActLayout& L, int row0, int M, int K,
                 const void* bias, void* y, int ldy, int col0, Epilogue ep, cudaStream_t stream) {
  const int N = seg.rows;
  const int units = ep == Epilogue::SwiGLU ? (N / 2 + kRows / 2 - 1) / (kRows / 2) : (N + kRows - 1) / kRows;
  const detail::LaunchConfig config(dim3(unsigned((units + kWarps - 1) / kWarps)), dim3(kWarps * 32), 0, stream,
                                    linear_programmatic_launch_enabled());
  const auto* w = static_cast<const uint8_t*>(seg.blocks);
  const uint64_t rb = gguf_row_bytes(Q, K);
  const auto* b = static_cast<const T*>(bias);
  auto go = [&](auto kernel) {
    detail::cuda_check(cudaLaunchKernelEx(config.get(), kernel, w, rb, N, K, act, L, row0, b, y, ldy, col0, ep),
                       "cudaLaunchKernelEx(gguf_gemv)");
  };
  switch (M) {
    case 1: return go(gguf_gemv_kernel<T, Q, 1>);
    case 2: return go(gguf_gemv_kernel<T, Q, 2>);
    case 3: return go(gguf_gemv_kernel<T, Q, 3>);
    case 4: return go(gguf_gemv_kernel<T, Q, 4>);
    case 5: return go(gguf_gemv_kernel<T, Q, 5>);
    case 6: return go(gguf_gemv_kernel<T, Q, 6>);
    case 7: return go(gguf_gemv_kernel<T, Q, 7>);
    default: return go(gguf_gemv_kernel<T, Q, 8>);
  }
}

// ---- dequantization (products above kFlatGemmMaxM rows) -------------------------------------------

// A warp per 256 weights of a row (a super-block, or eight blocks of 32), lane c converting weights
// 8c .. 8c + 7 and storing them as one 16-byte store, so that each store instruction of the warp
// writes 512 contiguous bytes (a thread per 32- or 64-weight task wrote 16 bytes each at a
// 128-byte stride). The values are the host's dequantization's (gguf_dequant.cpp's fp32 operations,
// uncontracted), rounded to T.
template <uint32_t Q>
__device__ __forceinline__ void chunk_fp32(const uint8_t* __restrict__ span, int c, float (&v)[8]) {
  if constexpr (Q == kQ8_0) {
    const uint8_t* b = span + 34 * (c >> 2);
    const float d = half_bits(uint32_t(b[0]) | uint32_t(b[1]) << 8);
    const uint2 q = detail::load8_a2(b + 2 + 8 * (c & 3));
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = __fmul_rn(float(int8_t(uint8_t((i < 4 ? q.x : q.y) >> (8 * (i & 3))))), d);
  } else {
    const detail::ChunkFields f = detail::gguf_chunk_fields<Q>(span, c);
    constexpr bool kAdd = Q == kQ4_1 || Q == kQ4_K || Q == kQ5_K;  // no "+ 0": it would turn -0 into +0
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int q = int((f.pairs[i >> 1] >> (16 * (i & 1))) & 0xFFFF) - int(f.offset);
      const float x = __fmul_rn(float(q), f.scale);
      v[i] = kAdd ? __fadd_rn(x, f.add) : x;
    }
  }
}

template <class T, uint32_t Q>
__global__ void __launch_bounds__(kWarps * 32) dequantize_kernel(const uint8_t* __restrict__ w, uint64_t row_bytes,
                                                                 int N, int K, T* __restrict__ out) {
  constexpr int kSpanBytes = block_shape(Q).bytes * (256 / block_shape(Q).elems);
  const int spans = (K + 255) / 256;  // the last one partial where K is not a multiple of 256 (32-blocks)
  const int64_t span = blockIdx.x * int64_t(kWarps) + (threadIdx.x >> 5);
  const int c = threadIdx.x & 31;
  if (span >= int64_t(N) * spans) return;
  const int n = int(span / spans), s = int(span % spans);
  const int e = 256 * s + 8 * c;
  if (e >= K) return;
  float v[8];
  chunk_fp32<Q>(w + size_t(n) * row_bytes + size_t(s) * kSpanBytes, c, v);
  alignas(16) T h[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) h[i] = from_float<T>(v[i]);
  *reinterpret_cast<uint4*>(out + int64_t(n) * K + e) = *reinterpret_cast<const uint4*>(h);
}

}  // namespace

bool gguf_gpu_type(uint32_t t) { return block_shape(t).elems > 0; }

bool gguf_k_quant(uint32_t t) { return is_k_quant(t); }

uint64_t gguf_row_bytes(uint32_t t, int64_t K) {
  const BlockShape s = block_shape(t);
  return s.elems == 0 ? 0 : uint64_t(K / s.elems) * uint64_t(s.bytes);
}

const char* gguf_shape_problem(uint32_t t, int64_t K) {
  if (!gguf_gpu_type(t)) return "the GPU keeps only Q4_0, Q4_1, Q8_0, Q4_K, Q5_K and Q6_K blocks";
  if (K <= 0 || K % block_shape(t).elems != 0) return "rows are not whole blocks";
  if (K > (int64_t(1) << 24)) return "rows longer than 2^24 elements";
  return nullptr;
}

bool GgufMatrix::has_k_quants() const {
  for (int i = 0; i < count; ++i)
    if (is_k_quant(segments[i].type)) return true;
  return false;
}
bool GgufMatrix::has_legacy() const {
  for (int i = 0; i < count; ++i)
    if (!is_k_quant(segments[i].type)) return true;
  return false;
}

size_t gguf_act_bytes(int M, int K) { return ActLayout(M, K).total; }

void gguf_quantize_x(const void* x, int M, int K, DType dtype, bool legacy, bool k_quants, void* act,
                     cudaStream_t stream) {
  check(x != nullptr && act != nullptr, "gguf_quantize_x: null pointer");
  check(M >= 1 && K >= 32 && K % 32 == 0 && (!k_quants || K % 256 == 0),
        "gguf_quantize_x: M = {}, K = {} (K whole blocks)", M, K);
  const ActLayout L(M, K);
  detail::dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    auto launch = [&](auto kernel, int B) {
      const int64_t warps = int64_t(M) * (K / B);
      const detail::LaunchConfig config(dim3(unsigned((warps + kWarps - 1) / kWarps)), dim3(kWarps * 32), 0, stream,
                                        programmatic_launch_enabled());
      detail::cuda_check(
          cudaLaunchKernelEx(config.get(), kernel, static_cast<const T*>(x), M, K, static_cast<uint8_t*>(act), L),
          "cudaLaunchKernelEx(gguf_quantize_x)");
    };
    if (legacy) launch(quantize_x_kernel<T, 32>, 32);
    if (k_quants) launch(quantize_x_kernel<T, 256>, 256);
  });
  check_launch("gguf_quantize_x");
}

void gguf_gemv(const GgufSegment& seg, const void* act, int act_rows, int row0, int M, int K, const void* bias,
               void* y, int ldy, int col0, DType dtype, Epilogue epilogue, cudaStream_t stream) {
  check(seg.blocks != nullptr && act != nullptr && y != nullptr, "gguf_gemv: null pointer");
  check(M >= 1 && M <= kGgufGemvMaxRows && row0 >= 0 && row0 + M <= act_rows,
        "gguf_gemv: rows [{}, {}) of {} quantized (at most {} a launch)", row0, row0 + M, act_rows, kGgufGemvMaxRows);
  check(seg.rows >= 1, "gguf_gemv: a segment of {} rows", seg.rows);
  if (const char* why = gguf_shape_problem(seg.type, K)) fail("gguf_gemv: type {}, K = {}: {}", seg.type, K, why);
  check(detail::aligned16(seg.blocks) && detail::aligned16(act), "gguf_gemv: blocks and act must be 16-byte aligned");
  check(epilogue != Epilogue::SwiGLU || seg.rows % 2 == 0, "gguf_gemv: SwiGLU needs an even number of rows");
  const ActLayout L(act_rows, K);
  const auto* a = static_cast<const uint8_t*>(act);
  // This launch's first row of y.
  const size_t y_elem = epilogue == Epilogue::StoreF32 || epilogue == Epilogue::AddF32 ? 4 : 2;
  const size_t y_row = epilogue == Epilogue::SwiGLU ? size_t(seg.rows / 2) : size_t(ldy);
  void* y0 = static_cast<uint8_t*>(y) + size_t(row0) * y_row * y_elem;
  detail::dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    switch (seg.type) {
      case kQ4_0: return launch_type<T, kQ4_0>(seg, a, L, row0, M, K, bias, y0, ldy, col0, epilogue, stream);
      case kQ4_1: return launch_type<T, kQ4_1>(seg, a, L, row0, M, K, bias, y0, ldy, col0, epilogue, stream);
      case kQ8_0: return launch_type<T, kQ8_0>(seg, a, L, row0, M, K, bias, y0, ldy, col0, epilogue, stream);
      case kQ4_K: return launch_type<T, kQ4_K>(seg, a, L, row0, M, K, bias, y0, ldy, col0, epilogue, stream);
      case kQ5_K: return launch_type<T, kQ5_K>(seg, a, L, row0, M, K, bias, y0, ldy, col0, epilogue, stream);
      default: return launch_type<T, kQ6_K>(seg, a, L, row0, M, K, bias, y0, ldy, col0, epilogue, stream);
    }
  });
  check_launch("gguf_gemv");
}

void gguf_dequantize(const GgufSegment& seg, int K, DType dtype, void* w16, cudaStream_t stream) {
  check(seg.blocks != nullptr && w16 != nullptr, "gguf_dequantize: null pointer");
  if (const char* why = gguf_shape_problem(seg.type, K)) fail("gguf_dequantize: type {}, K = {}: {}", seg.type, K, why);
  check(detail::aligned16(seg.blocks) && detail::aligned16(w16), "gguf_dequantize: pointers must be 16-byte aligned");
  const int64_t warps = int64_t(seg.rows) * ((K + 255) / 256);
  const unsigned blocks = unsigned((warps + kWarps - 1) / kWarps);
  const auto* w = static_cast<const uint8_t*>(seg.blocks);
  const uint64_t rb = gguf_row_bytes(seg.type, K);
  detail::dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    T* out = static_cast<T*>(w16);
    switch (seg.type) {
      case kQ4_0: return dequantize_kernel<T, kQ4_0><<<blocks, kWarps * 32, 0, stream>>>(w, rb, seg.rows, K, out);
      case kQ4_1: return dequantize_kernel<T, kQ4_1><<<blocks, kWarps * 32, 0, stream>>>(w, rb, seg.rows, K, out);
      case kQ8_0: return dequantize_kernel<T, kQ8_0><<<blocks, kWarps * 32, 0, stream>>>(w, rb, seg.rows, K, out);
      case kQ4_K: return dequantize_kernel<T, kQ4_K><<<blocks, kWarps * 32, 0, stream>>>(w, rb, seg.rows, K, out);
      case kQ5_K: return dequantize_kernel<T, kQ5_K><<<blocks, kWarps * 32, 0, stream>>>(w, rb, seg.rows, K, out);
      default: return dequantize_kernel<T, kQ6_K><<<blocks, kWarps * 32, 0, stream>>>(w, rb, seg.rows, K, out);
    }
  });
  check_launch("gguf_dequantize");
}

}  // namespace fdpp::cuda
