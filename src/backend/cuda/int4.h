// 4-bit weights on the GPU (AWQ and GPTQ checkpoints, and --quantization int4): the layout the
// kernels read, and the kernels besides the flat GEMM (flat_gemm.h: flat_gemm_int4).
//
// A matrix W[N, K] (K a multiple of 32) is stored as
//   q4  [N, K / 8] 32-bit words: word j of row n holds k = 8j .. 8j + 7, k = 8j + 2i in nibble i and
//       k = 8j + 2i + 1 in nibble i + 4 (i = 0..3). So (word >> 4i) & 0x000F000F puts the pair
//       (k 8j + 2i, 8j + 2i + 1) in the two 16-bit halves, the order of a 16-bit pair in registers,
//       and one OR with an exponent makes both halves 16-bit floats (magic + q) with no conversion.
//   zs  [N, zs_stride] 32-bit words, one per (row, group): the group's scale in the low 16 bits and
//       magic + zero in the high 16 bits, both in the model's 16-bit type (magic: 1024 for f16, 128
//       for bf16, where the spacing of that type is 1, so 0..15 added to it is exact). zs_stride is
//       the group count rounded up to 8 (32-byte rows: a flat GEMM stage reads up to 8 words of a
//       row; the padding is zero).
//   w[n][k] = ((magic + q) - (magic + z)) * scale: the difference is exact, the product one rounding.
// group_size 32, 64, 128 or a multiple of 256 (no group straddles a flat GEMM stage); 0 is one
// group per row (GPTQ's group_size -1).
//
// GPTQ's act-order (desc_act) assigns input channels to groups by g_idx. The loader sorts the
// columns by group (a stable sort: perm[k'] is the stored column of column k'), so groups are
// contiguous again, and x's columns are gathered the same way before the product (gather_columns).
// Matrices fused into one (q/k/v, gate/up) read the same input, so GPTQ gives them the same g_idx;
// the loader checks that they agree.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/kernels.h"

namespace fdpp::cuda {

// A 4-bit matrix's parts besides its q4 words (DeviceLayer keeps one per matrix).
struct Int4Matrix {
  const uint32_t* zs = nullptr;
  const int32_t* perm = nullptr;  // null: no act-order permutation
  int group_size = 128;           // 0: one group per row
  int zs_stride = 0;              // words per row of zs
};

// The words of zs per row for K columns and this group size (groups rounded up to 8).
int int4_zs_stride(int64_t K, int group_size);
// Whether the kernels take this group size for K columns (the message says why not).
const char* int4_group_problem(int64_t K, int group_size);

// The 16-bit value (bits) that zs holds for magic + zero in `dtype` (zero 0..15).
uint16_t int4_zero_bits(int zero, DType dtype);

// w16 [N, K] (dtype) = the dequantized matrix, in the (permuted) column order of q4: the prefill
// GEMM's weights (M above the flat GEMM's limit).
void int4_dequantize(const uint32_t* q4, const Int4Matrix& m, int N, int K, DType dtype, void* w16,
                     cudaStream_t stream);

// dst[r, k'] = x[r, perm[k']] for rows r < M (16-bit): x in the column order of an act-order matrix.
void gather_columns(const void* x, const int32_t* perm, int M, int K, void* dst, cudaStream_t stream);

// --quantization int4: round to nearest per group of 128 with a zero point over the group's range
// widened to take 0, as GPTQ's quantizer sets it up (so a group of one sign, or a constant one, keeps
// its values): lo = min(min, 0), hi = max(max, 0), scale = max(hi - lo, 1e-5) / 15 (rounded to
// dtype), zero = clamp(round(-lo / scale), 0, 15), q = clamp(round(w / scale) + zero, 0, 15).
// w16 [N, K] 16-bit (dtype), K a multiple of 128; writes q4 [N, K / 8] and zs [N,
// int4_zs_stride(K, 128)].
void quantize_int4(const void* w16, int N, int K, DType dtype, uint32_t* q4, uint32_t* zs, cudaStream_t stream);

}  // namespace fdpp::cuda
