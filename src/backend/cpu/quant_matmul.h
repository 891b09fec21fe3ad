// The CPU fast path: matrix products over weights in their GGUF stored format (no fp32 copy).
//
//   y[m, n] = sum_k x[m, k] * W[n, k] (+ bias[n]),  W a StoredMatrix [N, K], x fp32 [M, K]
//
// Formats: F32, F16, BF16 (fp32 activations, fp32 accumulation) and Q4_0, Q4_1, Q8_0, Q4_K, Q6_K
// (integer dot products: each activation row is first quantized to 8 bits per block, as llama.cpp
// does; blocks of 32 with a float scale and the scaled block sum for Q4_0/Q4_1/Q8_0, super-blocks
// of 256 with sums per 16 for the K-quants, so that offsets and minimums cost one multiply per
// block). Three implementations with one set of semantics: scalar (portable, and the reference the
// vector code is tested against), AVX2+FMA (the x86-64-v3 baseline) and AVX-512 (VNNI vpdpbusd for
// the 8-bit products; its own translation unit with its own flags), chosen at run time.
// Threads: cpu::parallel_for over blocks of output rows (thread_pool.h), never OpenMP.
//
// Accuracy against the fp32 reference (cpu::linear on the dequantized weights): the float formats
// differ only by summation order; the 8-bit activation rounding costs an NMSE of ~1e-5 relative to
// the output (tests/test_quant_matmul.cpp gives each format its bound with the measurement).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/decoder.h"
#include "model/model_loader.h"

namespace fdpp::cpu {

// Whether the fast path has kernels for this stored type (else the loader keeps an fp32 Tensor).
bool stored_supported(gguf::GgmlType type);
// How to load a model for the fast path: GGUF matrices of the types above stay in the mapped file,
// and those with an interleaved layout are repacked for best_isa() (cpu::repack_weights).
LoadOptions stored_load_options();

enum class Isa { Auto, Scalar, Avx2, Avx512 };
const char* isa_name(Isa isa);
// The best implementation this CPU runs (Auto resolved), and whether a given one runs here.
Isa best_isa();
bool isa_available(Isa isa);
// Rows per interleaved group of that ISA's kernels (quant_repack.h); 0: it reads file order only.
int pack_rows(Isa isa);

// y[M, w.rows] = x[M, w.cols] W^T (+ bias). Throws fdpp::Error (one line) for a type without
// kernels or a row length that is not whole blocks. isa Auto: best_isa().
void stored_linear(const float* x, int64_t M, const StoredMatrix& w, const float* bias, float* y,
                   Isa isa = Isa::Auto);

// The one entry point for every projection of the CPU runner: the stored-format kernel when w has
// a stored view, else the fp32 reference cpu::linear(x, M, K, w.ptr(), N, bias, y).
void linear(const float* x, int64_t M, const Weight& w, const float* bias, float* y);

// The same for expert `expert` of a stacked weight (LayerWeights::experts_*: [n_experts, N, K] in
// fp32, or a stored view of n_experts matrices), without a bias.
void expert_linear(const float* x, int64_t M, const Weight& stack, int expert, float* y);

// Row `row` of an embedding matrix in either form, as fp32 (out has cols floats).
void embedding_row(const Weight& w, int64_t row, float* out);


}  // namespace fdpp::cpu
