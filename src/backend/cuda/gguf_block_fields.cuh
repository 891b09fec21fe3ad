// GGUF block fields read on the GPU: Q4_K's 6-bit scales and mins, and the conversions of a slice
// of 8 consecutive weights of 256 (a Q4_K, Q5_K or Q6_K super-block, or eight Q4_0, Q4_1 or Q8_0 blocks)
// to the 16-bit values of an MMA fragment (flat_gemm.cu). The block GEMV (gguf_blocks.cu) shares
// the scale decoding. The layouts are ggml's: Q4_K = d, dmin (f16), 12 scale bytes, 128 nibble
// bytes (bytes 32p .. 32p + 31 hold elements 64p .. 64p + 31 in their low nibbles, 64p + 32 ..
// 64p + 63 in their high ones); Q5_K = Q4_K's head, 32 bytes of fifth bits, then its nibbles; Q6_K
// = 128 low-nibble bytes, 64 bytes of 2-bit highs, 16 int8 scales (one per 16 elements), d (f16);
// Q4_0 = d (f16), 16 nibble bytes; Q4_1 = d, m (f16), 16 nibble bytes; Q8_0 = d (f16), 32 int8.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/mma_fragments.cuh"

namespace fdpp::cuda::detail {

__device__ __forceinline__ float half_bits(uint32_t h) { return __half2float(__ushort_as_half(uint16_t(h))); }

// ggml's get_scale_min_k4: group j's 6-bit scale and min from the 12 scale bytes.
__device__ __forceinline__ void scale_min_k4(int j, const uint32_t (&sc)[3], int& s, int& m) {
  // Selects, not an index: a register array indexed at run time would go to local memory.
  auto byte = [&](int i) {
    const uint32_t word = i < 4 ? sc[0] : i < 8 ? sc[1] : sc[2];
    return int((word >> (8 * (i & 3))) & 0xFF);
  };
  if (j < 4) {
    s = byte(j) & 63;
    m = byte(j + 4) & 63;
  } else {
    s = (byte(j + 4) & 0x0F) | ((byte(j - 4) >> 6) << 4);
    m = (byte(j + 4) >> 4) | ((byte(j) >> 6) << 4);
  }
}

// Bytes (2i, 2i + 1) of the 8 in (lo, hi) as the low bytes of two 16-bit halves.
__device__ __forceinline__ uint32_t byte_pair(uint32_t lo, uint32_t hi, int i) {
  const uint32_t word = i < 2 ? lo : hi;
  return __byte_perm(word, 0, (i & 1) ? 0x4342 : 0x4140);
}

// Weights k = 8c .. 8c + 7 (c = 0..31) of the Q4_K super-block at blk (16-byte aligned, shared
// memory) as 8 T in register order (k 8c in the low half of .x): T(d sc_j) q - T(dmin m_j), the
// nibble's conversion exact ((magic + q) - magic) and the fused multiply-add rounded once.
template <class T>
__device__ __forceinline__ uint4 gguf_q4k_chunk_to(const unsigned char* blk, int c) {
  using T2 = std::conditional_t<std::is_same_v<T, __half>, __half2, __nv_bfloat162>;
  const int j = c >> 2;  // the 32-element group
  const uint4 head = *reinterpret_cast<const uint4*>(blk);
  const uint32_t sc[3] = {head.y, head.z, head.w};
  int s, m;
  scale_min_k4(j, sc, s, m);
  const T scale = from_float<T>(half_bits(head.x & 0xFFFF) * float(s));
  const T neg_min = from_float<T>(-(half_bits(head.x >> 16) * float(m)));
  const T2 s2{scale, scale}, nm2{neg_min, neg_min};
  const uint32_t magic = int4_magic2<T>();
  const T2 magic2 = *reinterpret_cast<const T2*>(&magic);
  const uint2 q = *reinterpret_cast<const uint2*>(blk + 16 + 32 * (j >> 1) + 8 * (c & 3));
  const int shift = 4 * (j & 1);
  uint32_t r[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t u = ((byte_pair(q.x, q.y, i) >> shift) & 0x000F000Fu) | magic;
    const T2 v = __hfma2(__hsub2(*reinterpret_cast<const T2*>(&u), magic2), s2, nm2);
    r[i] = *reinterpret_cast<const uint32_t*>(&v);
  }
  return make_uint4(r[0], r[1], r[2], r[3]);
}

// 8 bytes at a 2-byte aligned shared-memory address: three aligned words, funnel-shifted.
__device__ __forceinline__ uint2 load8_a2(const unsigned char* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const uint32_t* w = reinterpret_cast<const uint32_t*>(a & ~uintptr_t(3));
  const uint32_t w0 = w[0], w1 = w[1], w2 = w[2];
  const uint32_t shift = uint32_t(a & 3) * 8;
  return make_uint2(__funnelshift_r(w0, w1, shift), __funnelshift_r(w1, w2, shift));
}

// Weights k = 8c .. 8c + 7 of the Q6_K super-block at blk (2-byte aligned, shared memory; 4 bytes
// past its 210 readable) as 8 T in register order: T(d sc) (q - 32), the 6-bit value's conversion
// exact ((magic + q) - (magic + 32)) and the product rounded once.
template <class T>
__device__ __forceinline__ uint4 gguf_q6k_chunk_to(const unsigned char* blk, int c) {
  using T2 = std::conditional_t<std::is_same_v<T, __half>, __half2, __nv_bfloat162>;
  const int h = c >> 4, kk = (c >> 2) & 3, l0 = 8 * (c & 3);  // half, quarter of the half, first l
  const uint2 ql = load8_a2(blk + 64 * h + 32 * (kk & 1) + l0);
  const uint2 qh = load8_a2(blk + 128 + 32 * h + l0);
  const int sc = int(static_cast<int8_t>(blk[192 + 8 * h + 2 * kk + (l0 >> 4)]));
  const uint32_t d_bits = uint32_t(blk[208]) | uint32_t(blk[209]) << 8;
  const T scale = from_float<T>(half_bits(d_bits) * float(sc));
  const T2 s2{scale, scale};
  const uint32_t magic = int4_magic2<T>(), magic32 = magic + 0x00200020u;  // magic + 32: exact in both types
  const T2 offset2 = *reinterpret_cast<const T2*>(&magic32);
  const int shift_l = 4 * (kk >> 1), shift_h = 2 * kk;
  uint32_t r[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t low = (byte_pair(ql.x, ql.y, i) >> shift_l) & 0x000F000Fu;
    const uint32_t high = ((byte_pair(qh.x, qh.y, i) >> shift_h) & 0x00030003u) << 4;
    const uint32_t u = low | high | magic;
    const T2 v = __hmul2(__hsub2(*reinterpret_cast<const T2*>(&u), offset2), s2);
    r[i] = *reinterpret_cast<const uint32_t*>(&v);
  }
  return make_uint4(r[0], r[1], r[2], r[3]);
}

// Weights k = 8c .. 8c + 7 (c = 0..31) of the Q5_K super-block at blk (16-byte aligned): Q4_K's
// nibbles with a fifth bit, bit j of qh[l] for element 32 j + l, as T(d sc_j) q - T(dmin m_j).
template <class T>
__device__ __forceinline__ uint4 gguf_q5k_chunk_to(const unsigned char* blk, int c) {
  using T2 = std::conditional_t<std::is_same_v<T, __half>, __half2, __nv_bfloat162>;
  const int j = c >> 2, l0 = 8 * (c & 3);
  const uint4 head = *reinterpret_cast<const uint4*>(blk);
  const uint32_t sc[3] = {head.y, head.z, head.w};
  int s, m;
  scale_min_k4(j, sc, s, m);
  const T scale = from_float<T>(half_bits(head.x & 0xFFFF) * float(s));
  const T neg_min = from_float<T>(-(half_bits(head.x >> 16) * float(m)));
  const T2 s2{scale, scale}, nm2{neg_min, neg_min};
  const uint32_t magic = int4_magic2<T>();
  const T2 magic2 = *reinterpret_cast<const T2*>(&magic);
  const uint2 qh = *reinterpret_cast<const uint2*>(blk + 16 + l0);
  const uint2 q = *reinterpret_cast<const uint2*>(blk + 48 + 32 * (j >> 1) + l0);
  const int shift = 4 * (j & 1);
  uint32_t r[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t high = ((byte_pair(qh.x, qh.y, i) >> j) & 0x00010001u) << 4;
    const uint32_t u = ((byte_pair(q.x, q.y, i) >> shift) & 0x000F000Fu) | high | magic;
    const T2 v = __hfma2(__hsub2(*reinterpret_cast<const T2*>(&u), magic2), s2, nm2);
    r[i] = *reinterpret_cast<const uint32_t*>(&v);
  }
  return make_uint4(r[0], r[1], r[2], r[3]);
}

// Weights k = 8c .. 8c + 7 (c = 0..31) of the eight Q4_0 blocks of 32 at blk (18 bytes each, 2-byte
// aligned; 4 bytes past the last readable): d (q - 8), element e of a block in the low nibble of its
// byte e (e < 16) or the high nibble of byte e - 16; q - 8 converted exactly, then multiplied by
// T(d) (exact in f16; bf16 rounds d first).
template <class T>
__device__ __forceinline__ uint4 gguf_q4_0_chunk_to(const unsigned char* blk, int c) {
  using T2 = std::conditional_t<std::is_same_v<T, __half>, __half2, __nv_bfloat162>;
  const unsigned char* b = blk + 18 * (c >> 2);
  const uint32_t d_bits = uint32_t(b[0]) | uint32_t(b[1]) << 8;
  const T d = from_float<T>(half_bits(d_bits));
  const T2 d2{d, d};
  const uint32_t magic = int4_magic2<T>(), magic8 = magic + 0x00080008u;  // magic + 8: exact in both types
  const T2 offset2 = *reinterpret_cast<const T2*>(&magic8);
  const uint2 q = load8_a2(b + 2 + 8 * (c & 1));
  const int shift = 4 * ((c >> 1) & 1);
  uint32_t r[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t u = ((byte_pair(q.x, q.y, i) >> shift) & 0x000F000Fu) | magic;
    const T2 v = __hmul2(__hsub2(*reinterpret_cast<const T2*>(&u), offset2), d2);
    r[i] = *reinterpret_cast<const uint32_t*>(&v);
  }
  return make_uint4(r[0], r[1], r[2], r[3]);
}

// Weights k = 8c .. 8c + 7 (c = 0..31) of the eight Q4_1 blocks of 32 at blk (20 bytes each, 4-byte
// aligned; 4 bytes past the last readable): q T(d) + T(m), Q4_0's nibble order, q converted exactly
// and the fused multiply-add rounded once.
template <class T>
__device__ __forceinline__ uint4 gguf_q4_1_chunk_to(const unsigned char* blk, int c) {
  using T2 = std::conditional_t<std::is_same_v<T, __half>, __half2, __nv_bfloat162>;
  const unsigned char* b = blk + 20 * (c >> 2);
  const uint32_t dm = *reinterpret_cast<const uint32_t*>(b);
  const T d = from_float<T>(half_bits(dm & 0xFFFF)), m = from_float<T>(half_bits(dm >> 16));
  const T2 d2{d, d}, m2{m, m};
  const uint32_t magic = int4_magic2<T>();
  const T2 magic2 = *reinterpret_cast<const T2*>(&magic);
  const uint2 q = load8_a2(b + 4 + 8 * (c & 1));
  const int shift = 4 * ((c >> 1) & 1);
  uint32_t r[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t u = ((byte_pair(q.x, q.y, i) >> shift) & 0x000F000Fu) | magic;
    const T2 v = __hfma2(__hsub2(*reinterpret_cast<const T2*>(&u), magic2), d2, m2);
    r[i] = *reinterpret_cast<const uint32_t*>(&v);
  }
  return make_uint4(r[0], r[1], r[2], r[3]);
}

// Weights k = 8c .. 8c + 7 (c = 0..31) of the eight Q8_0 blocks of 32 at blk (34 bytes each, 2-byte
// aligned; 4 bytes past the last readable): d q for the int8 q in fp32, rounded once to T.
template <class T>
__device__ __forceinline__ uint4 gguf_q8_0_chunk_to(const unsigned char* blk, int c) {
  const unsigned char* b = blk + 34 * (c >> 2);
  const uint32_t d_bits = uint32_t(b[0]) | uint32_t(b[1]) << 8;
  const float d = half_bits(d_bits);
  const uint2 q = load8_a2(b + 2 + 8 * (c & 3));
  uint32_t r[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t word = i < 2 ? q.x : q.y;
    const int lo = int(int8_t(word >> (16 * (i & 1)))), hi = int(int8_t(word >> (16 * (i & 1) + 8)));
    r[i] = pack2<T>(d * float(lo), d * float(hi));
  }
  return make_uint4(r[0], r[1], r[2], r[3]);
}

}  // namespace fdpp::cuda::detail
