// The CPU reference of split-KV decode attention with a unified max (attention/unified_max.h has
// the idea and the safe range): what the CUDA kernels are tested against, row by row.
#pragma once

#include "attention/unified_max.h"

namespace fdpp {

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
