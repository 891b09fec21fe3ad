// Asynchronized softmax with unified max (FlashDecoding++, DESIGN.md section 1; issue 5), the
// safe range [a, b] for a row's max logit relative to the shared shift phi. The reference of
// split-KV decode attention with a unified max, which the CUDA kernels are tested against, is the
// CPU backend's (backend/cpu/unified_max_reference.h).
//
// Softmax does not change under a common shift: softmax(x)_j = e^(x_j - phi) / sum_i e^(x_i - phi)
// for any phi. When every tile of a row uses the same phi (chosen per layer by calibration, see
// attention/calibration.h), the tiles' partial numerators sum_j e^(x_j - phi) v_j and denominators
// sum_j e^(x_j - phi) simply add: no per-tile max, no rescale, no synchronization. The price is a
// range check: a row whose max logit m has m - phi outside [a, b] could overflow (m - phi > b) or
// lose its answer to underflow (m - phi < a) in fp32, and is recomputed with the stable softmax.
#pragma once

#include <cstdint>

namespace fdpp {

// The shift phi and the safe range [a, b] of (row max logit - phi). A row whose max logit m
// satisfies a <= m - phi <= b is computed by the unified-max path exactly to fp32 rounding; any
// other row falls back to the stable (synchronized) softmax.
struct UnifiedMaxBounds {
  float phi = 0.f;
  float a = 0.f;
  float b = 0.f;
  bool contains(float row_max) const { return row_max - phi >= a && row_max - phi <= b; }
};

// Headroom kept for the magnitude of V in the numerator sum_j e^(x_j - phi) v_j: |v| up to 2^16.
inline constexpr double kUnifiedMaxValueHeadroomLog2 = 16.0;

// The range [a, b] for fp32 accumulation over up to max_context keys (derivation with worked
// numbers in unified_max.cpp). For max_context = 131072: a = -57.92, b = 64.85.
UnifiedMaxBounds derive_unified_max_bounds(float phi, int64_t max_context);

// The conservative default without calibration: phi = 0 with the guard (rows whose max logit is
// outside [a, b] fall back).
inline UnifiedMaxBounds default_unified_max_bounds(int64_t max_context) {
  return derive_unified_max_bounds(0.f, max_context);
}

}  // namespace fdpp
