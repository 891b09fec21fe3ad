// The stored-format kernels at the build's baseline (-march=x86-64-v3: AVX2, FMA, F16C).
#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define QK_SIMD_NS avx2
#include "backend/cpu/quant_kernels_simd.inc"

namespace fdpp::cpu::qk {
const Kernels* avx2_kernels() { return &avx2::kTable; }
}  // namespace fdpp::cpu::qk
#else
#include "backend/cpu/quant_kernels.h"
namespace fdpp::cpu::qk {
const Kernels* avx2_kernels() { return nullptr; }
}  // namespace fdpp::cpu::qk
#endif
