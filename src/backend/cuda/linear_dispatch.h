// Heuristic dataflow on the GPU (DESIGN.md idea 3): every linear-layer dispatch decision of the
// CUDA backend in one place. A LinearDispatcher owns the three implementations' state (the
// cuBLASLt plans, the flat GEMM workspace, a scratch buffer for epilogues cuBLAS cannot fuse) and
// a LinearChooser (engine/dispatch_table.h: the tuned table, its lookup, the fallback rule and the
// forced modes), and runs y[M, N] = x[M, K] . W[N, K]^T with the chosen implementation:
//
//   Gemv    gemv_ex()   (flat_gemm.h)  M <= kGemvMaxM       every epilogue fused
//   Flat    flat_gemm() (flat_gemm.h)  M <= kFlatGemmMaxM   every epilogue fused
//   Cublas  CublasLtLinear (linear.h)  any M                Store / StoreF32 fused (bias too);
//           SwiGLU: the GEMM into scratch [M, N] 16-bit, then silu_mul (kernels.h);
//           AddF32: the GEMM into scratch [M, N] fp32, then add_f32 (linear_dispatch.cu).
//
// So run() accepts every epilogue with every implementation; fuses() says which pairs cost an extra
// pass (the engine may prefer to keep its own element-wise kernel there).
//
// Workspaces: one dispatcher serves one stream at a time (the flat GEMM's split-K semaphores live
// in its workspace). reserve() sizes the flat workspace and the scratch for the shapes and largest
// M the caller will use; otherwise they grow on first need, which must happen outside CUDA-graph
// capture (the engine's first, eager decode step does that before it captures; growing during
// capture is an error that says so).
#pragma once

#include <cuda_runtime_api.h>

#include <set>
#include <span>
#include <tuple>
#include <string>

#include "backend/cuda/check.h"
#include "backend/cuda/flat_gemm.h"
#include "backend/cuda/fp8.h"
#include "backend/cuda/gguf_blocks.h"
#include "backend/cuda/int4.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/linear.h"
#include "engine/linear_chooser.h"

namespace fdpp::cuda {

using fdpp::LinearImpl;

// The kernels' M limits as the table logic sees them: {kGemvMaxM, kFlatGemmMaxM}.
LinearLimits kernel_linear_limits();
const char* dtype_name(DType dtype);  // "f16", "bf16"

// The GPU the calls run on (the current device).
struct GpuIdentity {
  int device = 0;
  std::string name;  // cudaDeviceProp::name
  int sm_count = 0;
  size_t l2_bytes = 0;
};
GpuIdentity current_gpu();

// y[i] += d[i] for i < n (fp32): cuBLAS's AddF32 epilogue after a GEMM into scratch.
void add_f32(float* y, const float* d, int64_t n, cudaStream_t stream);

class LinearDispatcher {
 public:
  // Loads the dispatch table for the current GPU and this dtype (lookup order, modes and
  // environment: DispatchSelectOptions in engine/dispatch_table.h).
  explicit LinearDispatcher(DType dtype, const DispatchSelectOptions& options = {});
  // With a given chooser (no files): the profiler and tests.
  LinearDispatcher(DType dtype, LinearChooser chooser);
  LinearDispatcher(const LinearDispatcher&) = delete;
  LinearDispatcher& operator=(const LinearDispatcher&) = delete;

  // Allocates (and zeroes) the flat GEMM workspace for every shape at M = 1 .. min(max_m,
  // kFlatGemmMaxM), and, when cublas_epilogues, the scratch cuBLAS needs for SwiGLU / AddF32 up to
  // max_m rows. Synchronizes the device once. Call before capturing graphs.
  void reserve(int max_m, std::span<const LinearShape> shapes, bool cublas_epilogues, cudaStream_t stream);

  LinearImpl choose(int M, int N, int K) const { return chooser_.choose(M, N, K); }
  // Whether impl computes the epilogue inside its GEMM kernel (no extra pass over y).
  static bool fuses(LinearImpl impl, Epilogue epilogue);

  // y = epilogue(x . W^T + bias) with the chosen implementation. x [M, K], w [N, K], bias [N] or
  // null, all `dtype`; y as the epilogue says (flat_gemm.h). dtype must be the dispatcher's (its
  // table was measured for it).
  void run(const void* x, const void* w, const void* bias, void* y, int M, int N, int K, DType dtype,
           Epilogue epilogue, cudaStream_t stream);
  // FP8 weights (fp8.h): w8 [N, K] e4m3 with per-row w_scale [N]; the rest as run(). fp8_choice
  // says which kernel runs: fp8_gemv and the flat GEMM keep x 16-bit and convert the weights in
  // registers; cuBLASLt's FP8 GEMM gets x quantized per token in the dispatcher's scratch.
  void run_fp8(const void* x, const uint8_t* w8, const float* w_scale, const void* bias, void* y, int M, int N, int K,
               DType dtype, Epilogue epilogue, cudaStream_t stream);
  // Scratch for run_fp8 up to max_m rows of these shapes (the quantized x and its scales, and the
  // cuBLAS epilogues' scratch). Call before capturing graphs.
  void reserve_fp8(int max_m, std::span<const LinearShape> shapes, cudaStream_t stream);
  // The kernel of an FP8 call: in auto mode the GEMV at M = 1, the flat GEMM up to kFlatGemmMaxM,
  // cuBLASLt above (docs/PERFORMANCE.md, FP8 weights); --linear gemv|flat|cublas force one where
  // its M limit allows. Where cuBLASLt has no algorithm for a call (found at its first run) the
  // flat GEMM computes it, kFlatGemmMaxM rows at a time.
  LinearImpl fp8_choice(int M, int N, int K, Epilogue epilogue, bool bias) const;

  // 4-bit weights (int4.h): q4 [N, K / 8] words with m's zs words (and act-order permutation); the
  // rest as run(). Up to kFlatGemmMaxM rows the flat GEMM converts the words in registers (unless
  // --linear cublas); above, the matrix is dequantized into the dispatcher's weight scratch and
  // cuBLASLt multiplies it (prefill: the dequantization is a small part of its time). An act-order
  // matrix's x is gathered into the matrix's column order first.
  void run_int4(const void* x, const uint32_t* q4, const Int4Matrix& m, const void* bias, void* y, int M, int N, int K,
                DType dtype, Epilogue epilogue, cudaStream_t stream);
  // Workspaces for run_int4 up to max_m rows of these shapes: the flat GEMM's 4-bit plans, the
  // dequantized weights and cuBLAS's epilogue scratch when max_m > kFlatGemmMaxM, the gathered x
  // when act_order. Call before capturing graphs.
  void reserve_int4(int max_m, std::span<const LinearShape> shapes, bool act_order, cudaStream_t stream);
  // The kernel of a 4-bit call (Flat or Cublas).
  LinearImpl int4_choice(int M) const;

  // GGUF blocks (gguf_blocks.h): m's segments hold [N, K] in row order. Up to kFlatGemmMaxM rows
  // each segment is multiplied in its blocks (a SwiGLU over segments of two types goes through the
  // scratch and silu_mul): by the flat GEMM (16-bit x, tensor cores) from gguf_flat_min_m rows where
  // every segment's type has one (flat_gemm_gguf_format), else by the block GEMV, x quantized to 8
  // bits into the dispatcher's scratch as the CPU computes blocks (8 rows of x a launch). Above,
  // the segments are dequantized into the weight scratch and cuBLASLt multiplies them. --linear
  // gemv|flat|cublas forces one way where its limit allows.
  void run_gguf(const void* x, const GgufMatrix& m, const void* bias, void* y, int M, int N, int K, DType dtype,
                Epilogue epilogue, cudaStream_t stream);
  // Workspaces for run_gguf up to max_m rows of these shapes. Call before capturing graphs.
  void reserve_gguf(int max_m, std::span<const LinearShape> shapes, cudaStream_t stream);
  // The kernel of a GGUF call over m: Gemv (the block GEMV), Flat (the flat GEMM over the blocks) or
  // Cublas (dequantized); flat_types: whether every segment's type has the flat GEMM.
  LinearImpl gguf_choice(int M, const GgufMatrix& m) const;
  LinearImpl gguf_choice(int M, bool flat_types, int flat_min_m = kGgufFlatMinM) const;
  // The fewest rows of x that go to the GGUF flat GEMM rather than the block GEMV: at 3 rows the
  // GEMV measured faster on a Q4_K_M file, at 4 the flat GEMM (docs/PERFORMANCE.md).
  static constexpr int kGgufFlatMinM = 4;
  // The same per ggml type, where it was measured elsewhere: Q4_0's GEMV led up to 5 rows, the flat
  // GEMM from 6 (H100, docs/results/2026-12-07d-h100). A matrix of several types takes the largest.
  static int gguf_flat_min_m(uint32_t ggml_type);
  static int gguf_flat_min_m(const GgufMatrix& m);

  // The same with the implementation given (no choice, no fallback): M must be within its limit.
  void run_impl(LinearImpl impl, const void* x, const void* w, const void* bias, void* y, int M, int N, int K,
                DType dtype, Epilogue epilogue, cudaStream_t stream);

  // fdpp info: the table in use and M1/M2/ranges per shape (LinearChooser::describe).
  std::string describe(std::span<const LinearShape> shapes) const { return chooser_.describe(shapes); }
  const LinearChooser& chooser() const { return chooser_; }
  LinearChooser& chooser() { return chooser_; }
  DType dtype() const { return dtype_; }
  const GpuIdentity& gpu() const { return gpu_; }
  CublasLtLinear& cublas() { return cublas_; }
  // Device memory held: flat workspace + scratch + cuBLASLt workspace.
  size_t workspace_bytes() const {
    return flat_ws_.bytes() + scratch_.bytes() + cublas_.workspace_bytes() + fp8_x_.bytes() + int4_x_.bytes() +
           w16_.bytes() + gguf_x_.bytes();
  }

 private:
  void ensure_flat_workspace(size_t bytes, cudaStream_t stream);
  void run_cublas(const void* x, const void* w, const void* bias, void* y, int M, int N, int K, DType dtype,
                  Epilogue epilogue, cudaStream_t stream);
  // The flat GEMM over any M, kFlatGemmMaxM rows at a time.
  void run_flat_rows(const void* x, const void* w, const void* bias, void* y, int M, int N, int K, DType dtype,
                     Epilogue epilogue, cudaStream_t stream);
  void* scratch(size_t bytes, cudaStream_t stream);

  DType dtype_;
  GpuIdentity gpu_;
  LinearChooser chooser_;
  CublasLtLinear cublas_;
  DeviceBuffer flat_ws_;  // zeroed when allocated; the kernels leave it zeroed
  DeviceBuffer scratch_;
  DeviceBuffer fp8_x_;  // run_fp8's quantized x: [M, K] e4m3, then [M] fp32 scales
  DeviceBuffer int4_x_;  // run_int4's gathered x (act-order): [M, K] 16-bit
  DeviceBuffer w16_;  // run_int4's and run_gguf's dequantized weights above kFlatGemmMaxM rows: [N, K] 16-bit
  DeviceBuffer gguf_x_;  // run_gguf's 8-bit x (gguf_quantize_x)
  // (M, N, K, epilogue, bias) cuBLASLt found no algorithm for: computed by the flat GEMM.
  std::set<std::tuple<int, int, int, int, bool>> cublas_unsupported_;
};

}  // namespace fdpp::cuda
