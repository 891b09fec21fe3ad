// Decode's linear layers on the GPU: the implementations FlashDecoding++ chooses between
// (ImplA GEMV on CUDA cores, ImplB flat GEMM on tensor cores; ImplC cuBLASLt lives in linear.h)
// and the epilogues they can fuse. Plain C++ header (host code and tests include it).
//
// Every implementation computes y[M, N] = x[M, K] . W[N, K]^T with 16-bit x and W (row-major, W as
// stored by DeviceModel), fp32 accumulation, then the epilogue:
//   Store      y[m, n] = acc + bias[n]                          (16-bit y, dtype)
//   StoreF32   y[m, n] = acc + bias[n]                          (fp32 y: the lm head's logits)
//   AddF32     y[m, n] += acc + bias[n]                         (fp32 y: the residual stream)
//   SwiGLU     W holds [gate; up] (N = 2 * F rows, gate rows 0..F-1, up rows F..2F-1):
//              y[m, f] = silu(g + bias[f]) * (u + bias[F + f])  (16-bit y [M, F])
// bias may be null. M is the batch of a decode step (1..64) or more; x, W and y 16-byte aligned
// for the fast paths (K not a multiple of 8 is handled by a slower path or rejected, see each).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "backend/cuda/kernels.h"

namespace fdpp::cuda {

enum class Epilogue { Store, StoreF32, AddF32, SwiGLU };

// How the flat GEMM's weights are stored: 16-bit, e4m3 with row scales (fp8.h), 4-bit words with
// group scales and zeros (int4.h), or GGUF blocks as the file stores them (gguf_blocks.h: Q4_K,
// Q5_K and Q6_K super-blocks, Q4_0, Q4_1 and Q8_0 blocks). The plan's stage sizes depend on it.
enum class WeightFormat { Bits16, Fp8, Int4, GgufQ4K, GgufQ6K, GgufQ5K, GgufQ4_0, GgufQ4_1, GgufQ8_0 };

// ImplB: flat GEMM on tensor cores, M padded to 8 (not 64), K streamed through shared memory by a
// cp.async pipeline 3 to 6 stages deep (flat_gemm_plan), split-K where N alone cannot fill the GPU.
// M in [1, kFlatGemmMaxM].
constexpr int kFlatGemmMaxM = 64;
// Bytes of device workspace flat_gemm needs for this shape (split-K partials and their
// semaphores; 0 when the plan needs none). The workspace must be zeroed once before first use
// (the kernels leave the semaphores zeroed again when they finish), so one buffer sized for the
// largest shape serves every call on a stream.
size_t flat_gemm_workspace_bytes(int M, int N, int K, int multiprocessors,
                                 WeightFormat format = WeightFormat::Bits16);
// At least flat_gemm_workspace_bytes(M, N, K, multiprocessors, format) for every M <= max_m and
// every N and K (the split rule keeps tiles_n * splits within one resident wave: flat_gemm_plan).
// For callers that reserve before they know the row counts they will see (a GGUF matrix's
// segments).
size_t flat_gemm_workspace_bound(int max_m, int multiprocessors, WeightFormat format = WeightFormat::Bits16);
void flat_gemm(const void* x, const void* w, const void* bias, void* y, int M, int N, int K, DType dtype,
               Epilogue epilogue, void* workspace, size_t workspace_bytes, cudaStream_t stream);

// The plan flat_gemm follows (flat_gemm.cu's flat_gemm_plan says how it is chosen). Exposed so that
// tests and benchmarks can see it and force other tilings; the engine only needs the two calls above.
struct FlatGemmPlan {
  int m_tiles = 1;      // n8 token tiles the kernel is compiled for: 1, 2, 4 or 8 (M <= 8 * m_tiles)
  int stages = 3;       // shared-memory pipeline depth (cp.async groups in flight + 1)
  int block_n = 64;     // weight rows per CTA (SwiGLU: block_n / 2 gate rows and the matching up rows)
  int block_k = 128;    // K per pipeline stage
  int tiles_n = 0;      // CTAs along N
  int splits = 1;       // CTAs along K (split-K); > 1 needs the workspace
  int k_tiles = 0;      // ceil(K / block_k)
  int ctas_per_sm = 1;  // resident CTAs per SM by shared memory (what the split rule assumes)
  size_t smem_bytes = 0;
  size_t workspace_bytes = 0;
};
// splits > 0 forces the split count (clamped to [1, k_tiles]); stages > 0 forces the depth (the
// compiled ones: 3, 4, 6; m_tiles 8 only 3).
FlatGemmPlan flat_gemm_plan(int M, int N, int K, int multiprocessors, int splits = 0, int stages = 0,
                            WeightFormat format = WeightFormat::Bits16);
void flat_gemm(const FlatGemmPlan& plan, const void* x, const void* w, const void* bias, void* y, int M, int N, int K,
               DType dtype, Epilogue epilogue, void* workspace, size_t workspace_bytes, cudaStream_t stream);

// Programmatic dependent launch: linear_programmatic_launch_enabled() in kernels.h (on by default;
// KernelOptions in kernel_options.h). The GEMV and flat GEMM read their first weights before
// waiting for the previous kernel, so the weight stream overlaps its tail; x, y, bias and the
// workspace are touched only after the wait.

// ImplA: GEMV on CUDA cores with the same epilogues (the plain-store version is gemv() in
// kernels.h). M in [1, kGemvMaxM].
// The flat GEMM over FP8 weights (fp8.h): w8 [N, K] e4m3 with per-row w_scale [N] fp32; x stays
// 16-bit, each e4m3 piece is converted to `dtype` in registers before the MMA and the row scale is
// applied in the epilogue. K a multiple of 16; the workspace as flat_gemm_workspace_bytes(..., Fp8).
void flat_gemm_fp8(const void* x, const uint8_t* w8, const float* w_scale, const void* bias, void* y, int M, int N,
                   int K, DType dtype, Epilogue epilogue, void* workspace, size_t workspace_bytes,
                   cudaStream_t stream);
// The flat GEMM over 4-bit weights (int4.h): q4 [N, K / 8] words, zs [N, zs_stride] scale and zero
// words per group; each word is converted to 8 `dtype` values in registers before the MMA. K a
// multiple of 32; group_size and zs_stride as int4.h says; the workspace as
// flat_gemm_workspace_bytes(..., Int4). x in the matrix's column order (an act-order matrix's x is
// gathered first: gather_columns).
void flat_gemm_int4(const void* x, const uint32_t* q4, const uint32_t* zs, int group_size, int zs_stride,
                    const void* bias, void* y, int M, int N, int K, DType dtype, Epilogue epilogue, void* workspace,
                    size_t workspace_bytes, cudaStream_t stream);

// The flat GEMM over GGUF blocks kept in place (gguf_blocks.h): w [N rows of gguf_row_bytes(type, K)],
// a type flat_gemm_gguf_format takes, K a multiple of 256, 16-byte aligned. Each block
// slice a lane reads is converted to `dtype` in registers before the MMA (x stays 16-bit: no 8-bit
// activations). y's columns [col0, col0 + N) of rows of ldy elements (Store, StoreF32, AddF32), or
// for SwiGLU y [M, N / 2] (ldy and col0 ignored). The workspace as flat_gemm_workspace_bytes(...,
// the format).
void flat_gemm_gguf(const void* x, uint32_t ggml_type, const void* w, const void* bias, void* y, int M, int N, int K,
                    int ldy, int col0, DType dtype, Epilogue epilogue, void* workspace, size_t workspace_bytes,
                    cudaStream_t stream);
// The flat GEMM's format for a ggml type (every type gguf_gpu_type keeps: Q4_0, Q4_1, Q8_0, Q4_K,
// Q5_K, Q6_K), or false where it has none.
bool flat_gemm_gguf_format(uint32_t ggml_type, WeightFormat& format);

void gemv_ex(const void* x, const void* w, const void* bias, void* y, int M, int N, int K, DType dtype,
             Epilogue epilogue, cudaStream_t stream);

}  // namespace fdpp::cuda
