// FP8 (e4m3) weights on Hopper (--quantization fp8): a 16-bit matrix W[N, K] becomes W8[N, K] in
// e4m3 plus one fp32 scale per output row, W ~= scale[n] * W8[n, :], scale = max|W[n, :]| / 448
// (448: e4m3's largest finite value). Activations stay 16-bit between layers; a GEMM that runs on
// FP8 tensor cores quantizes its input per token the same way (dynamic per-token scales), as
// vLLM's fp8 does.
//
// Three kernels (LinearDispatcher::run_fp8; its auto choice by M is below):
//   fp8_gemv      CUDA cores, the e4m3 bytes converted in registers and multiplied with the
//                 16-bit x in fp32 (no activation quantization); M <= kFp8GemvMaxM.
//   flat_gemm_fp8 tensor cores, e4m3 tiles converted to 16 bits in registers before mma.sync, M
//                 padded to 8 (flat_gemm.h); no activation quantization either.
//   cuBLASLt      any M: x quantized per token (quantize_rows_fp8), then an e4m3 x e4m3 GEMM with
//                 the row and token scales as outer vectors (CublasLtLinear::run_fp8).

#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/flat_gemm.h"
#include "backend/cuda/kernels.h"
#include "core/fp8_e4m3.h"

namespace fdpp::cuda {

// e4m3's largest finite magnitude: a row's max maps to it.
constexpr float kFp8E4M3Max = 448.f;
constexpr int kFp8GemvMaxM = 8;
// The auto choice (measured on the H200 with Llama-3-8B's shapes, docs/PERFORMANCE.md "FP8
// weights"): the GEMV's conversions and FMAs run on CUDA cores for every row of x, so it takes M = 1
// only; cuBLASLt's FP8 GEMM costs about the same at any M up to 32 while the flat GEMM's time grows
// past 16 rows, so the flat GEMM takes M = 2-32 and cuBLASLt the rest.
constexpr int kFp8GemvDefaultMaxM = 1;
constexpr int kFp8FlatDefaultMaxM = 32;

// q[r, :] = e4m3(x[r, :] / scale[r]), scale[r] = max|x[r, :]| / 448 (1 for an all-zero row), for
// rows r < rows of K 16-bit elements (K a multiple of 8, x 16-byte aligned). Weights at load and
// activations per token, with the same rounding (round to nearest even, saturating).
void quantize_rows_fp8(const void* x, DType dtype, int64_t rows, int64_t K, uint8_t* q, float* scale,
                       cudaStream_t stream);

// y = epilogue(x . (scale * W8)^T + bias): x [M, K] 16-bit, w8 [N, K] e4m3, w_scale [N] fp32, bias
// [N] 16-bit or null, the epilogues of flat_gemm.h. M in [1, kFp8GemvMaxM], K a multiple of 16,
// x and w8 16-byte aligned.
void fp8_gemv(const void* x, const uint8_t* w8, const float* w_scale, const void* bias, void* y, int M, int N, int K,
              DType dtype, Epilogue epilogue, cudaStream_t stream);

// The same on the host (core/fp8_e4m3.h, shared with the CPU's FP8 checkpoint loader): e4m3 bits
// of v (round to nearest even, saturating to 448), and the value of e4m3 bits.
using fdpp::fp8_e4m3_from_float;
using fdpp::fp8_e4m3_to_float;

}  // namespace fdpp::cuda
