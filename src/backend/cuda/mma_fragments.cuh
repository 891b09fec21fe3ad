// Tensor-core fragment primitives shared by the attention kernels (prefill_attention.cu,
// decode_attention.cu): ldmatrix into mma.sync m16n8k16 operand fragments, the mma itself with
// fp32 accumulators, and fp32 -> 16-bit packing of an A fragment held in registers. Private: .cu
// files only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

namespace fdpp::cuda::detail {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 2^x, one MUFU instruction (exp2f adds a range check and two multiplies for subnormal results);
// subnormal results flush to 0 (unified_max.cpp's range assumes it), 2^-inf = 0.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// c += a (16x16, row) . b (16x8, col), fp32 accumulators.
template <class T>
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);
template <>
__device__ __forceinline__ void mma16816<__half>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma16816<__nv_bfloat16>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                                        uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats -> one register of two 16-bit values (lo in the low half), round to nearest.
template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// 16 bytes global -> shared (bypassing L1) when `valid`, else 16 zero bytes written (src-size 0:
// nothing is read, but src must still be a valid address expression).
__device__ __forceinline__ void cp_async16_zfill(void* smem_dst, const void* gmem_src, bool valid) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem_src), "r"(src_bytes)
               : "memory");
}

// cp.async.wait_group N: all but this thread's N most recent groups have landed.
template <int N>
__device__ __forceinline__ void cp_async_wait_group() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// ---- e4m3 operands (the FP8 KV cache, FP8 weights) -------------------------------------------------
// Two e4m3 values (the low 16 bits of `pair`, element 0 lowest) as two T in one register, exactly:
// e4m3 -> f16 is exact, and f16 -> f32 -> bf16 too (e4m3 has 3 mantissa bits).
template <class T>
__device__ __forceinline__ uint32_t fp8x2_to(uint32_t pair) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair & 0xFFFFu), __NV_E4M3);
  if constexpr (std::is_same_v<T, __half>) {
    return uint32_t(h.x) | (uint32_t(h.y) << 16);
  } else {
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
    const __nv_bfloat162 b = __float22bfloat162_rn(f);
    return *reinterpret_cast<const uint32_t*>(&b);
  }
}

// One e4m3 value as a float (exact).
__device__ __forceinline__ float fp8_to_float(uint8_t e) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(e), __NV_E4M3);
  return __half2float(*reinterpret_cast<const __half*>(&h));
}

// 8 e4m3 values (8 bytes) as 8 T in register order (element 0 in the low half of .x).
template <class T>
__device__ __forceinline__ uint4 fp8x8_to(uint2 v) {
  return make_uint4(fp8x2_to<T>(v.x), fp8x2_to<T>(v.x >> 16), fp8x2_to<T>(v.y), fp8x2_to<T>(v.y >> 16));
}

// ---- 4-bit weights (int4.h) ---------------------------------------------------------------------
// The magic exponent of int4.h: 1024 (f16) or 128 (bf16) in both halves of a register.
template <class T>
__device__ __forceinline__ constexpr uint32_t int4_magic2() {
  return std::is_same_v<T, __half> ? 0x64006400u : 0x43004300u;
}
// One 32-bit word of int4.h's q4 layout (8 k) as 8 T in register order (k 0 in the low half of
// .x), with its group's zs word (scale low, magic + zero high): ((magic + q) - (magic + z)) * scale,
// the subtraction exact and the product rounded once.
template <class T>
__device__ __forceinline__ uint4 int4x8_to(uint32_t word, uint32_t zs) {
  using T2 = std::conditional_t<std::is_same_v<T, __half>, __half2, __nv_bfloat162>;
  const uint32_t s_bits = __byte_perm(zs, 0, 0x1010), z_bits = __byte_perm(zs, 0, 0x3232);
  const T2 s = *reinterpret_cast<const T2*>(&s_bits), z = *reinterpret_cast<const T2*>(&z_bits);
  uint32_t r[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    // One LOP3 for the mask and the exponent ((a & b) | c: 0xea), which the compiler emits as two.
    uint32_t u;
    asm("lop3.b32 %0, %1, %2, %3, 0xea;\n" : "=r"(u) : "r"(word >> (4 * i)), "n"(0x000F000F), "r"(int4_magic2<T>()));
    const T2 v = __hmul2(__hsub2(*reinterpret_cast<const T2*>(&u), z), s);
    r[i] = *reinterpret_cast<const uint32_t*>(&v);
  }
  return make_uint4(r[0], r[1], r[2], r[3]);
}

// An e4m3 K tile as the B operand of S = Q K^T (keys the n dimension, dims the k dimension), with no
// shuffle: ldmatrix (b16) on rows of e4m3 bytes hands lane l the 4 bytes of dims 4t .. 4t + 3 of key
// g (t = l % 4, g = l / 4) of each 8-key x 16-dim matrix. Those are b0 = (k 2t, 2t + 1) and
// b1 = (k 2t + 8, 2t + 9) once the k order of each 16 dims is permuted: logical k pair w holds the
// physical dims of pair kFp8KPair[w]. The dot product does not care about the order, so Q (the A
// operand) is staged in the same permuted order: q_fp8_k_order gives the physical column of a
// logical one.
template <class T>
__device__ __forceinline__ void fp8_k_fragment(uint32_t reg, uint32_t& b0, uint32_t& b1) {
  b0 = fp8x2_to<T>(reg);
  b1 = fp8x2_to<T>(reg >> 16);
}
// The physical dim (within the row) of logical column `col` of Q when K is e4m3 (fp8_k_fragment):
// within each 16 dims, logical pair w (0..7) is physical pair {0, 2, 4, 6, 1, 3, 5, 7}[w].
__host__ __device__ __forceinline__ constexpr int q_fp8_k_order(int col) {
  const int group = col & ~15, pair = (col >> 1) & 7, e = col & 1;
  const int phys_pair = pair < 4 ? 2 * pair : 2 * (pair - 4) + 1;
  return group + 2 * phys_pair + e;
}

// An e4m3 V tile as the B operand of O = P V (keys the k dimension, dims the n dimension):
// ldmatrix.trans (b16) on rows of e4m3 bytes hands lane l, of each 8-key x 16-dim matrix, the bytes
// (key 2t: dims 2g, 2g + 1; key 2t + 1: dims 2g, 2g + 1). One byte permute splits them into the
// (key 2t, 2t + 1) pairs of dim 2g (`even`) and of dim 2g + 1 (`odd`): the B fragments' b0 (or b1,
// for the matrix of keys 8..15) of two n-tiles, E (the even dims of the 16) and O (the odd ones).
// Their accumulators come out with E's columns 2t, 2t + 1 = dims 4t, 4t + 2 and O's = dims 4t + 1,
// 4t + 3 of the 16: fp8_v_dims says where each accumulator goes.
template <class T>
__device__ __forceinline__ void fp8_v_fragment(uint32_t reg, uint32_t& even, uint32_t& odd) {
  const uint32_t split = __byte_perm(reg, 0u, 0x3120);  // bytes (k2t d2g, k2t+1 d2g, k2t d2g+1, k2t+1 d2g+1)
  even = fp8x2_to<T>(split);
  odd = fp8x2_to<T>(split >> 16);
}
// Accumulator element e (0, 1: row g; 2, 3: row g + 8; c = e & 1 the column 2t + c) of the E (odd =
// false) or O tile of a 16-dim group: its dim within the 16.
__device__ __forceinline__ int fp8_v_dim(int lane, bool odd, int e) { return 4 * (lane & 3) + 2 * (e & 1) + (odd ? 1 : 0); }

}  // namespace fdpp::cuda::detail
