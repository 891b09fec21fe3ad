// GGUF block fields read on the GPU: Q4_K's 6-bit scales and mins, the fields of a slice of 8
// consecutive weights of 256 (a Q4_K, Q5_K or Q6_K super-block, or eight Q4_0, Q4_1 or Q8_0 blocks),
// which the prefill's dequantization (gguf_blocks.cu) turns into fp32 as the host does, and their
// conversion to the 16-bit values of an MMA fragment (flat_gemm.cu). The block GEMV shares the
// scale decoding. The layouts are ggml's: Q4_K = d, dmin (f16), 12 scale bytes, 128 nibble
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

// ggml's type numbers (io/gguf.h's GgmlType) of the blocks the GPU keeps.
namespace ggml_type {
inline constexpr uint32_t kQ4_0 = 2, kQ4_1 = 3, kQ8_0 = 8, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14;
}  // namespace ggml_type

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

// 8 bytes at a 2-byte aligned shared-memory address: three aligned words, funnel-shifted.
__device__ __forceinline__ uint2 load8_a2(const unsigned char* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const uint32_t* w = reinterpret_cast<const uint32_t*>(a & ~uintptr_t(3));
  const uint32_t w0 = w[0], w1 = w[1], w2 = w[2];
  const uint32_t shift = uint32_t(a & 3) * 8;
  return make_uint2(__funnelshift_r(w0, w1, shift), __funnelshift_r(w1, w2, shift));
}

// Bits [shift, shift + bits) of each of the 8 bytes in q, as the low bits of 4 pairs of 16-bit
// halves (byte 2i in the low half of pair i).
__device__ __forceinline__ void quant_pairs(const uint2& q, int shift, int bits, uint32_t (&pairs)[4]) {
  const uint32_t mask = ((1u << bits) - 1) * 0x00010001u;
#pragma unroll
  for (int i = 0; i < 4; ++i) pairs[i] = (byte_pair(q.x, q.y, i) >> shift) & mask;
}

// Weights k = 8c .. 8c + 7 (c = 0..31) of 256 k of a row of ggml type Q (Q4_K, Q5_K, Q6_K, Q4_0,
// Q4_1; Q8_0's signed quants are read apart) at blk: weight i is (q_i - offset) scale + add, q_i
// the unsigned quant (below 128) in the 16-bit halves of pairs (weight 2i in the low half of pair
// i), scale and add in fp32 as the host's dequantization forms them (add 0 where the type has
// none). blk 16-byte aligned for Q4_K and Q5_K, 2-byte aligned for the others (4 bytes readable
// past the last byte); shared or global memory.
struct ChunkFields {
  uint32_t pairs[4];
  uint32_t offset;
  float scale, add;
};
template <uint32_t Q>
__device__ __forceinline__ ChunkFields gguf_chunk_fields(const unsigned char* blk, int c) {
  using namespace ggml_type;
  ChunkFields f;
  if constexpr (Q == kQ4_K || Q == kQ5_K) {
    // T(d sc_j) q - T(dmin m_j); Q5_K's fifth bit of element 32 j + l is bit j of qh[l].
    const int j = c >> 2, l0 = 8 * (c & 3);  // the 32-element group, the first of its 8 elements
    const uint4 head = *reinterpret_cast<const uint4*>(blk);
    const uint32_t sc[3] = {head.y, head.z, head.w};
    int s, m;
    scale_min_k4(j, sc, s, m);
    quant_pairs(*reinterpret_cast<const uint2*>(blk + (Q == kQ5_K ? 48 : 16) + 32 * (j >> 1) + l0), 4 * (j & 1), 4,
                f.pairs);
    if constexpr (Q == kQ5_K) {
      uint32_t high[4];
      quant_pairs(*reinterpret_cast<const uint2*>(blk + 16 + l0), j, 1, high);
#pragma unroll
      for (int i = 0; i < 4; ++i) f.pairs[i] |= high[i] << 4;
    }
    f.offset = 0;
    f.scale = __fmul_rn(half_bits(head.x & 0xFFFF), float(s));
    f.add = -__fmul_rn(half_bits(head.x >> 16), float(m));
  } else if constexpr (Q == kQ6_K) {
    // d sc (q - 32)
    const int h = c >> 4, kk = (c >> 2) & 3, l0 = 8 * (c & 3);  // half, quarter of the half, first l
    uint32_t high[4];
    quant_pairs(load8_a2(blk + 64 * h + 32 * (kk & 1) + l0), 4 * (kk >> 1), 4, f.pairs);
    quant_pairs(load8_a2(blk + 128 + 32 * h + l0), 2 * kk, 2, high);
#pragma unroll
    for (int i = 0; i < 4; ++i) f.pairs[i] |= high[i] << 4;
    const int sc = int(static_cast<int8_t>(blk[192 + 8 * h + 2 * kk + (l0 >> 4)]));
    f.offset = 32;
    f.scale = __fmul_rn(half_bits(uint32_t(blk[208]) | uint32_t(blk[209]) << 8), float(sc));
    f.add = 0.f;
  } else {
    static_assert(Q == kQ4_0 || Q == kQ4_1, "gguf_chunk_fields: Q4_K, Q5_K, Q6_K, Q4_0 or Q4_1");
    // (q - 8) d, or q d + m; element e of a block in the low nibble of its byte e (e < 16) or the
    // high nibble of byte e - 16.
    constexpr int kHead = Q == kQ4_1 ? 4 : 2;  // d (and m), f16
    const unsigned char* b = blk + (16 + kHead) * (c >> 2);
    quant_pairs(load8_a2(b + kHead + 8 * (c & 1)), 4 * ((c >> 1) & 1), 4, f.pairs);
    f.offset = Q == kQ4_1 ? 0 : 8;
    f.scale = half_bits(uint32_t(b[0]) | uint32_t(b[1]) << 8);
    f.add = Q == kQ4_1 ? half_bits(uint32_t(b[2]) | uint32_t(b[3]) << 8) : 0.f;
  }
  return f;
}

// The same 8 weights as T in register order (k 8c in the low half of .x): (q - offset) T(scale) +
// T(add), q - offset converted exactly ((magic + q) - (magic + offset)) and the fused multiply-add
// rounded once.
template <class T, uint32_t Q>
__device__ __forceinline__ uint4 gguf_chunk_to(const unsigned char* blk, int c) {
  using T2 = std::conditional_t<std::is_same_v<T, __half>, __half2, __nv_bfloat162>;
  const ChunkFields f = gguf_chunk_fields<Q>(blk, c);
  const T scale = from_float<T>(f.scale), add = from_float<T>(f.add);
  const T2 s2{scale, scale}, a2{add, add};
  const uint32_t magic = int4_magic2<T>(), magic_offset = magic + f.offset * 0x00010001u;
  const T2 offset2 = *reinterpret_cast<const T2*>(&magic_offset);
  uint32_t r[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t u = f.pairs[i] | magic;
    const T2 v = __hfma2(__hsub2(*reinterpret_cast<const T2*>(&u), offset2), s2, a2);
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
