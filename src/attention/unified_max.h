// Asynchronized softmax with unified max (FlashDecoding++, DESIGN.md section 1; issue 5), the
// CPU side: the safe range [a, b] for a row's max logit relative to the shared shift phi, and the
// reference of split-KV decode attention with a unified max that the CUDA kernel is tested
// against.
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

// Reference of one query row of decode attention with a unified max, split into tiles of `tile`
// keys as the CUDA kernel splits the KV cache.
//   q: [head_dim]; k, v: len rows of head_dim floats, kv_stride floats apart; out: [head_dim].
// Logits x_j = (q . k_j) * scale in fp32, the very values cpu::attention computes. Each tile t,
// independently of the others:
//   - accumulates num_t = sum_j e^(x_j - phi) v_j and den_t = sum_j e^(x_j - phi), with e^
//     evaluated in fp32 on fp32 (x_j - phi) as the kernel does; the sums are kept in double so that
//     the reference is accurate at any length (the kernel's fp32 accumulators cannot overflow
//     inside [a, b]; their rounding is the kernel's test tolerance);
//   - raises flag_high when its own max logit - phi > b, flag_low when its own max logit - phi < a.
// The row falls back when any tile raised flag_high or every tile raised flag_low, which is
// exactly "the row's max logit - phi is outside [a, b]" (a NaN logit also falls back). Otherwise
// out = (sum_t num_t) / (sum_t den_t), the partials added in tile order. A row that falls back is
// recomputed by cpu::attention (the stable softmax: max subtracted, double denominator) and the
// partials are discarded.
// Returns true when the row fell back.
bool unified_max_attention_row(const float* q, const float* k, const float* v, int len, int head_dim, int kv_stride,
                               float scale, const UnifiedMaxBounds& bounds, int tile, float* out);

// The stable softmax attention of one row: cpu::attention on it (k/v rows gathered when strided),
// the fallback path.
void stable_attention_row(const float* q, const float* k, const float* v, int len, int head_dim, int kv_stride,
                          float scale, float* out);

}  // namespace fdpp
