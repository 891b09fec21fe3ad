// Internal to the stored-format matmul (quant_matmul.cpp): the quantized activation blocks and the
// per-ISA kernel tables. quant_kernels_simd.inc is compiled twice (quant_avx2.cpp at the build's
// x86-64-v3 baseline, quant_avx512.cpp with AVX-512 flags), so this header holds declarations and
// plain structs only: no inline code that one TU could emit with instructions another CPU lacks.
#pragma once

#include <cstdint>

namespace fdpp::cpu::qk {

constexpr int kQK = 32;    // block of Q4_0/Q4_1/Q8_0 and of the activations they meet
constexpr int kQKK = 256;  // super-block of the K-quants and of their activations

// Activations for Q4_0/Q4_1/Q8_0: x ~= d * qs, s = d * sum(qs) (the block sum serves Q4_1's
// minimum and Q4_0's offset of 8 in one multiply). Float scales: nothing is gained by fp16 here.
struct BlockQ8 {
  float d, s;
  int8_t qs[kQK];
};
static_assert(sizeof(BlockQ8) == 40);

// Activations for Q4_K/Q5_K/Q6_K: x ~= d * qs; bsums[j] = sum(qs[16 j .. 16 j + 15]), the granularity
// of Q6_K's scales (Q4_K's groups of 32 add two).
struct BlockQ8K {
  float d;
  int16_t bsums[kQKK / 16];
  int8_t qs[kQKK];
};
static_assert(sizeof(BlockQ8K) == 292);

// out[i] = dot(weight row w, activation row i) for i < m (1 <= m <= 4); activation rows are
// `stride` bytes apart; k is the row length in elements (whole blocks for the block formats).
using RowDot = void (*)(const uint8_t* w, const uint8_t* act, uint64_t stride, int m, int64_t k, float* out);
// Quantizes one fp32 row of k elements (whole blocks) into BlockQ8 / BlockQ8K blocks.
using QuantRow = void (*)(const float* x, int64_t k, uint8_t* out);

// The interleaved layouts (quant_repack.h): out[i * ldo + gi * R + r] = dot(row r of group gi,
// activation row i) for `groups` consecutive groups at g (gi < groups), r < R = the table's
// pack_rows and i < m (1 <= m <= 4).
using GroupDot = void (*)(const uint8_t* g, int groups, const uint8_t* act, uint64_t stride, int m, int64_t k,
                          float* out, int64_t ldo);

// Load-time packing (quant_repack.h): block b of rows[0..R) (file format) into the group block at
// dst + b * R * block bytes, for b < nblocks. False where this table cannot pack R rows.
enum class PackType { Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K };
using PackBlocks = bool (*)(PackType type, int R, const uint8_t* const* rows, int64_t nblocks, uint8_t* dst);

struct Kernels {
  RowDot f32, f16, bf16, q4_0, q4_1, q8_0, q4_k, q5_k, q6_k;
  QuantRow quant_q8, quant_q8k;
  // Rows per interleaved group these kernels read (8: AVX2's 8 int32 lanes; 16: AVX-512's);
  // 0: none (scalar), matrices stay in file order.
  int pack_rows;
  GroupDot g_q4_0, g_q4_1, g_q8_0, g_q4_k, g_q5_k, g_q6_k;
  PackBlocks pack;  // null: quant_repack.cpp's scalar reference packs
};

const Kernels& scalar_kernels();
// Null where the TU was not built (non-x86 targets).
const Kernels* avx2_kernels();
const Kernels* avx512_kernels();

}  // namespace fdpp::cpu::qk
