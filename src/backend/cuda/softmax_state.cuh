// The softmax state of split attention, {m, d, o} (as FlashInfer's state.cuh): over the output dims
// a thread holds, o = sum_j w_j v_j and d = sum_j w_j with w_j = 2^(x_j - m) relative to a reference
// m. The merges of decode attention (its warps, its splits in the combines, the combines' lane
// groups) all add such states; the two modes differ in the reference:
//   * synchronized: each state keeps its own max; a merge rescales to the larger one, the state by
//     rescale_to and the other by the weight it is added with (add_weighted: 2^(m_other - m));
//   * unified max (FlashDecoding++): every state is relative to the same phi, so states simply add
//     (add_unified), and m only tracks the max logit seen, for the guard.
// normalized(k) is the output, o / d.
//
// SoftmaxState is a view of the registers that hold a thread's state, {m, o, d} (O: float[N], the
// thread's N consecutive dims, or float2, the combines' lane pair): the kernels keep declaring their
// m, d and o and merge through the view, which leaves their machine code exactly as it was (a state
// held by value, or the members in another order, gets its registers numbered and scheduled
// differently; docs/kernels/decode_attention.md, softmax state). The other state's d is taken by
// reference so that it is read where the merge uses it. The async sums inside attend_group are
// add_unified written out, for the same reason.
// Plain device code in an unnamed namespace: part of decode_attention.cu's translation unit
// (decode_attention_common.cuh says why).
#pragma once

#include <cmath>

namespace fdpp::cuda {
namespace {

// exp2(x - ref), 0 for an empty state (x = -inf; ref = -inf only when every one is empty).
__device__ __forceinline__ float combine_weight(float x, float ref) { return x == -INFINITY ? 0.f : exp2f(x - ref); }

// The dims of an O (float[N] or float2), element-wise: o *= w, o += w * v, o += v, o[k].
template <int N>
__device__ __forceinline__ void scale_dims(float (&o)[N], float w) {
#pragma unroll
  for (int k = 0; k < N; ++k) o[k] *= w;
}
__device__ __forceinline__ void scale_dims(float2& o, float w) { o = make_float2(o.x * w, o.y * w); }
template <int N>
__device__ __forceinline__ void add_dims(float (&o)[N], float w, const float (&v)[N]) {
#pragma unroll
  for (int k = 0; k < N; ++k) o[k] += w * v[k];
}
__device__ __forceinline__ void add_dims(float2& o, float w, float2 v) {
  o = make_float2(o.x + w * v.x, o.y + w * v.y);
}
template <int N>
__device__ __forceinline__ void add_dims(float (&o)[N], const float (&v)[N]) {
#pragma unroll
  for (int k = 0; k < N; ++k) o[k] += v[k];
}
__device__ __forceinline__ void add_dims(float2& o, float2 v) { o = make_float2(o.x + v.x, o.y + v.y); }
template <int N>
__device__ __forceinline__ float dim_of(const float (&o)[N], int k) {
  return o[k];
}
__device__ __forceinline__ float dim_of(float2 o, int k) { return k == 0 ? o.x : o.y; }

template <class O>
struct SoftmaxState {
  float& m;
  O& o;
  float& d;

  // Moves the reference to m_new >= m: o and d times 2^(m - m_new) (0 while the state is empty).
  __device__ __forceinline__ void rescale_to(float m_new) {
    const float keep = combine_weight(m, m_new);
    scale_dims(o, keep);
    d *= keep;
    m = m_new;
  }
  // Adds another state's (o, d) weighted by w (synchronized: 2^(its m - this m), 0 if it is empty).
  __device__ __forceinline__ void add_weighted(float w, const O& other_o, const float& other_d) {
    add_dims(o, w, other_o);
    d += w * other_d;
  }
  // Adds a state relative to the same unified max; m becomes the larger max logit.
  __device__ __forceinline__ void add_unified(const float& other_m, const float& other_d, const O& other_o) {
    m = fmaxf(m, other_m);
    d += other_d;
    add_dims(o, other_o);
  }
  // Output dim k: o / d, 0 where the state saw no key (d = 0).
  __device__ __forceinline__ float normalized(int k) const { return d > 0.f ? dim_of(o, k) / d : 0.f; }
};

}  // namespace
}  // namespace fdpp::cuda
