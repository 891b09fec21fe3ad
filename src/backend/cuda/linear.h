// Linear layers through cuBLASLt: y[M, N] = x[M, K] . W[N, K]^T (+ bias[N]), 16-bit inputs,
// fp32 accumulation, output 16-bit or fp32 (the lm head writes fp32 logits). The algorithm is
// chosen once per (M, N, K, types, bias) by cuBLASLt's heuristic and cached; the workspace is
// fixed, so calls can be captured in CUDA graphs.
//
// cuBLASLt's heuristic ranks algorithms without knowing that decode's GEMMs stream weights from
// HBM; so the first time a shape is seen (outside graph capture) its top candidates are timed
// with L2 flushed before each run and the fastest kept per device, so that every engine on a GPU
// computes a shape the same way (KernelOptions::cublaslt_tune off: take the heuristic's first).
//
// This is ImplC of FlashDecoding++'s linear-layer trio; the GEMV and flat-GEMM kernels (their own
// issue) will sit beside it behind the dispatch table.
#pragma once

#include <cublasLt.h>

#include <cstdint>
#include <map>
#include <tuple>

#include "backend/cuda/check.h"
#include "backend/cuda/kernels.h"

namespace fdpp::cuda {

class CublasLtLinear {
 public:
  explicit CublasLtLinear(size_t workspace_bytes = 32u << 20);
  ~CublasLtLinear();
  CublasLtLinear(const CublasLtLinear&) = delete;
  CublasLtLinear& operator=(const CublasLtLinear&) = delete;

  // x: [M, K] dtype; w: [N, K] dtype; bias: [N] dtype or null; y: [M, N] dtype, or fp32 when
  // fp32_out.
  void run(const void* x, const void* w, const void* bias, void* y, int M, int N, int K, DType dtype, bool fp32_out,
           cudaStream_t stream);

  // FP8 (fp8.h): x8 [M, K] and w8 [N, K] in e4m3 with per-token x_scale [M] and per-row w_scale [N]
  // (fp32, device), y [M, N] 16-bit `dtype` (or fp32) = (x_scale x8) . (w_scale w8)^T + bias. The
  // scales are cuBLASLt's outer vectors (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F).
  void run_fp8(const uint8_t* x8, const float* x_scale, const uint8_t* w8, const float* w_scale, const void* bias,
               void* y, int M, int N, int K, DType dtype, bool fp32_out, cudaStream_t stream);

  size_t workspace_bytes() const { return workspace_.bytes(); }

 private:
  struct Plan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool separate_bias = false;  // no algorithm with the bias epilogue: GEMM, then add_bias
  };
  using Key = std::tuple<int, int, int, int, bool, bool, bool>;  // M, N, K, dtype, bias, fp32 out, fp8
  struct Fp8Scales {
    const float* x = nullptr;
    const float* w = nullptr;
  };
  // fp8 when scales is given (x and w are then e4m3).
  Plan& plan(int M, int N, int K, DType dtype, const void* x, const void* w, const void* bias, void* y, bool fp32_out,
             cudaStream_t stream, const Fp8Scales* scales = nullptr);
  // One call with a plan: its bias (fused, or added after), then the GEMM.
  void matmul(Plan& p, const void* x, const void* w, const void* bias, void* y, int M, int N, DType dtype,
              cudaStream_t stream);
  // Times each candidate on the call's own buffers and returns the fastest.
  cublasLtMatmulAlgo_t tune(Plan& p, const cublasLtMatmulHeuristicResult_t* results, int n, const void* x,
                            const void* w, void* y, cudaStream_t stream);

  cublasLtHandle_t handle_ = nullptr;
  DeviceBuffer workspace_;
  std::map<Key, Plan> plans_;
};

}  // namespace fdpp::cuda
