// The stored-format kernels with AVX-512 (F, BW, VL, VNNI): the same source as quant_avx2.cpp, with
// vpdpbusd for the 8-bit dot products and 32 vector registers. Compiled with its own flags
// (CMakeLists.txt) and called only when __builtin_cpu_supports says the CPU has them.
#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512VNNI__)
#define QK_SIMD_NS avx512
#include "backend/cpu/quant_kernels_simd.inc"

namespace fdpp::cpu::qk {
const Kernels* avx512_kernels() { return &avx512::kTable; }
}  // namespace fdpp::cpu::qk
#else
#include "backend/cpu/quant_kernels.h"
namespace fdpp::cpu::qk {
const Kernels* avx512_kernels() { return nullptr; }
}  // namespace fdpp::cpu::qk
#endif
