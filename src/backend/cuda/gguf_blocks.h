// GGUF weights on the GPU in their stored blocks (no 16-bit copy): Q4_0, Q4_1, Q8_0, Q4_K, Q5_K and
// Q6_K layer matrices stay as the file stores them, row after row, and the decode product reads
// those bytes (llama.cpp's CUDA backend does the same; vLLM's GGUF path too).
//
// Products up to kGgufGemvMaxRows rows of x (decode, small prefill chunks) follow the CPU's stored
// path (cpu/quant_matmul.h) in integer arithmetic: x is first quantized to 8 bits per block
// (gguf_quantize_x: amax / 127 per 32 elements for Q4_0/Q4_1/Q8_0, per 256 with sums per 16 for the
// K-quants), then each warp streams R weight rows and takes 8-bit dot products (dp4a) of the
// unpacked weights with it, scaling once per block as the CPU kernels do. x is quantized once per
// product and read from L1/L2 by every warp; the weights are read once per 8 rows of x.
// Larger products dequantize the matrix into a 16-bit scratch (weight_convert's kernels) and run
// cuBLASLt: prefill is compute-bound, and 16-bit activations keep its accuracy.
//
// A fused matrix (q/k/v, gate/up) may hold parts of different types (Q4_K_M files keep v and
// down in Q6_K): it is a list of segments, each a run of rows of one type, computed by its own
// launch into its columns of y.
//
// .cu files are C++17 and cannot include io/gguf.h: ggml type numbers (gguf::GgmlType) as uint32_t.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "backend/cuda/flat_gemm.h"
#include "backend/cuda/kernels.h"

namespace fdpp::cuda {

// Rows of x one quantized product takes in one launch (larger M: launches of this many rows each).
constexpr int kGgufGemvMaxRows = 8;

// Whether the GPU keeps a ggml type in its blocks (the others are converted to 16 bits at load).
bool gguf_gpu_type(uint32_t ggml_type);
// Bytes of one stored row of K elements of that type (whole blocks).
uint64_t gguf_row_bytes(uint32_t ggml_type, int64_t K);
// Null when the kernels take rows of K elements of this type, else why not.
const char* gguf_shape_problem(uint32_t ggml_type, int64_t K);
// Whether the type's activations are the K-quants' (256-element blocks) or the 32-element ones.
bool gguf_k_quant(uint32_t ggml_type);

// Readable bytes a buffer of blocks needs past its last block: the GEMV reads the 2-byte aligned
// types (Q4_0, Q8_0) with aligned 16-byte loads, which may reach that far beyond a block.
constexpr uint64_t kGgufBlocksTailBytes = 16;

// A run of rows of one type: rows x gguf_row_bytes(type, K) bytes at `blocks` (16-byte aligned, in
// a buffer with kGgufBlocksTailBytes more after its last segment).
struct GgufSegment {
  uint32_t type = 0;
  int rows = 0;
  const void* blocks = nullptr;
};
// A matrix [N, K]: its segments in row order (N = the sum of their rows).
struct GgufMatrix {
  static constexpr int kMaxSegments = 3;
  GgufSegment segments[kMaxSegments];
  int count = 0;

  bool empty() const { return count == 0; }
  int rows() const {
    int n = 0;
    for (int i = 0; i < count; ++i) n += segments[i].rows;
    return n;
  }
  bool has_k_quants() const;
  bool has_legacy() const;
};

// Bytes of the quantized-x scratch for M rows of K elements (both block sizes' activations).
size_t gguf_act_bytes(int M, int K);
// act = x [M, K] (16-bit dtype) quantized to 8 bits: the 32-element blocks (legacy) and/or the
// 256-element ones (k_quants), as cpu::qk's quant_q8 / quant_q8k round them. K a multiple of 32
// (of 256 for k_quants). A block holding a NaN or infinity gets a NaN scale, as on the CPU.
void gguf_quantize_x(const void* x, int M, int K, DType dtype, bool legacy, bool k_quants, void* act,
                     cudaStream_t stream);

// y columns [col0, col0 + seg.rows) of rows [row0, row0 + M) (row stride ldy elements of y's type)
// = epilogue(x . seg^T + bias), with x as gguf_quantize_x left it in act for act_rows rows
// (M <= kGgufGemvMaxRows). bias: seg.rows values or null. SwiGLU: the segment is [gate; up]
// (seg.rows even) and y is [rows, seg.rows / 2] (ldy, col0 ignored).
void gguf_gemv(const GgufSegment& seg, const void* act, int act_rows, int row0, int M, int K, const void* bias,
               void* y, int ldy, int col0, DType dtype, Epilogue epilogue, cudaStream_t stream);

// w16 [seg.rows, K] (dtype) = the segment dequantized, bit for bit as the loader converts it.
void gguf_dequantize(const GgufSegment& seg, int K, DType dtype, void* w16, cudaStream_t stream);

}  // namespace fdpp::cuda
