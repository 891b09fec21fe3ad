#include "backend/cpu/unified_max_reference.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/ops.h"
#include "fdpp/error.h"

namespace fdpp {

void stable_attention_row(const float* q, const float* k, const float* v, int len, int head_dim, int kv_stride,
                          float scale, float* out) {
  check(len >= 1 && head_dim >= 1, "attention row: len {} and head_dim {} must be positive", len, head_dim);
  if (kv_stride == head_dim) {
    cpu::attention(q, k, v, 1, len - 1, 1, 1, head_dim, scale, out);
    return;
  }
  // cpu::attention reads a contiguous head: gather this one.
  std::vector<float> kk(static_cast<size_t>(len) * head_dim), vv(kk.size());
  for (int j = 0; j < len; ++j) {
    std::copy_n(k + static_cast<int64_t>(j) * kv_stride, head_dim, kk.begin() + static_cast<int64_t>(j) * head_dim);
    std::copy_n(v + static_cast<int64_t>(j) * kv_stride, head_dim, vv.begin() + static_cast<int64_t>(j) * head_dim);
  }
  cpu::attention(q, kk.data(), vv.data(), 1, len - 1, 1, 1, head_dim, scale, out);
}

bool unified_max_attention_row(const float* q, const float* k, const float* v, int len, int head_dim, int kv_stride,
                               float scale, const UnifiedMaxBounds& bounds, int tile, float* out) {
  check(len >= 1 && head_dim >= 1, "attention row: len {} and head_dim {} must be positive", len, head_dim);
  check(tile >= 1, "attention row: tile size {} must be positive", tile);
  const float phi = bounds.phi;
  // Accumulators in double: the reference stands for the kernel's fp32 accumulators with their
  // tree reductions, without the drift of a long sequential fp32 sum (2^17 equal terms added one by
  // one in fp32 are off by ~1e-3). The range [a, b] is what keeps the fp32 sums finite: every
  // term p below is an fp32 value, and with the row inside [a, b] every partial sum is below
  // N e^b 2^16 < FLT_MAX (see derive_unified_max_bounds).
  std::vector<double> num(static_cast<size_t>(head_dim), 0.0), tile_num(static_cast<size_t>(head_dim));
  double den = 0.0;
  bool any_high = false, all_low = true, any_nan = false;
  for (int start = 0; start < len; start += tile) {
    const int end = std::min(len, start + tile);
    // One tile: what one thread block of the kernel does, knowing nothing of the other tiles.
    std::fill(tile_num.begin(), tile_num.end(), 0.0);
    double tile_den = 0.0;
    float tile_max = -INFINITY;
    for (int j = start; j < end; ++j) {
      const float x = cpu::attention_dot(q, k + static_cast<int64_t>(j) * kv_stride, head_dim) * scale;
      if (std::isnan(x)) any_nan = true;
      tile_max = std::max(tile_max, x);
      const float p = std::exp(x - phi);  // fp32, as in the kernel
      tile_den += p;
      const float* vj = v + static_cast<int64_t>(j) * kv_stride;
      for (int d = 0; d < head_dim; ++d) tile_num[d] += static_cast<double>(p) * vj[d];
    }
    if (tile_max - phi > bounds.b) any_high = true;
    if (!(tile_max - phi < bounds.a)) all_low = false;
    // The partials simply add (atomics or a last-block reduction on the GPU).
    den += tile_den;
    for (int d = 0; d < head_dim; ++d) num[d] += tile_num[d];
  }
  if (any_high || all_low || any_nan) {
    stable_attention_row(q, k, v, len, head_dim, kv_stride, scale, out);
    return true;
  }
  for (int d = 0; d < head_dim; ++d) out[d] = static_cast<float>(num[d] / den);
  return false;
}

}  // namespace fdpp
