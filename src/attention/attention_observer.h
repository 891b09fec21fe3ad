// What a backend shows of its attention to whoever measures it (calibration of the unified max):
// one layer's attention for one row of a step.
#pragma once

#include <cstdint>
#include <functional>

namespace fdpp {

// The n_q new queries (after RoPE) and the sequence's K and V caches, laid out as the CPU backend's
// attention takes them.
struct AttentionObservation {
  int layer = 0;
  const float* q = nullptr;  // [n_q, n_heads * head_dim]
  const float* k = nullptr;  // [start_pos + n_q, n_kv_heads * head_dim]
  const float* v = nullptr;
  int64_t n_q = 0;
  int64_t start_pos = 0;
  int n_heads = 0, n_kv_heads = 0, head_dim = 0;
  float scale = 1.f;
};
using AttentionObserver = std::function<void(const AttentionObservation&)>;

}  // namespace fdpp
