// The mixture-of-experts kernels (moe.h): routing, the sort of picks into expert tiles, the grouped
// products per tile, and the weighted combine.
#include <algorithm>
#include <climits>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/moe.h"

namespace fdpp::cuda {

namespace {

using detail::check_launch;
using detail::from_float;
using detail::to_float;
using detail::warp_max;
using detail::warp_sum;

constexpr int kRouteWarps = 4;
constexpr int kGroupedWarps = 8;
constexpr int kAlignThreads = 1024;
constexpr int kCombineThreads = 256;

// One warp per token. Lane l owns experts l, l + 32, ...; the k picks are k rounds of a warp arg-max
// over the probabilities not yet taken, ties to the lower expert (cpu::route_experts' order).
__global__ void __launch_bounds__(kRouteWarps * 32)
    moe_route_kernel(const float* __restrict__ logits, int n, int E, int k, bool normalize,
                     int32_t* __restrict__ pick_expert, float* __restrict__ pick_weight) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int t = blockIdx.x * kRouteWarps + warp;
  if (t >= n) return;
  const float* l = logits + int64_t(t) * E;
  float mx = -INFINITY;
  for (int e = lane; e < E; e += 32) mx = fmaxf(mx, l[e]);
  mx = warp_max(mx);
  float sum = 0.f;
  for (int e = lane; e < E; e += 32) sum += expf(l[e] - mx);
  sum = warp_sum(sum);
  uint32_t taken = 0;  // bit i: expert lane + 32 i is picked
  int my_expert = -1;
  float my_p = 0.f, chosen = 0.f;
  for (int j = 0; j < k; ++j) {
    float best = -1.f;
    int best_e = INT_MAX;
    int i = 0;
    for (int e = lane; e < E; e += 32, ++i) {
      if ((taken >> i) & 1u) continue;
      const float p = expf(l[e] - mx) / sum;
      if (p > best) best = p, best_e = e;  // e rises along the loop: a tie keeps the lower one
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int oe = __shfl_xor_sync(0xffffffffu, best_e, o);
      if (ob > best || (ob == best && oe < best_e)) best = ob, best_e = oe;
    }
    if ((best_e & 31) == lane) taken |= 1u << (best_e >> 5);
    if (lane == j) my_expert = best_e, my_p = best;
    chosen += best;
  }
  if (lane < k) {
    pick_expert[int64_t(t) * k + lane] = my_expert;
    pick_weight[int64_t(t) * k + lane] = normalize ? my_p / chosen : my_p;
  }
}

// One CTA: counts per expert, each expert's rows padded to whole tiles, the tiles' experts, and a
// row for every pick (the order within an expert is the atomics' order: each row is computed
// alone and the combine reads by pick, so the output does not depend on it).
__global__ void __launch_bounds__(kAlignThreads)
    moe_align_kernel(const int32_t* __restrict__ pick_expert, int picks, int k, int E, int64_t rows_cap,
                     int64_t tiles_cap, int32_t* __restrict__ pick_row, int32_t* __restrict__ row_token,
                     int32_t* __restrict__ tile_expert) {
  extern __shared__ int32_t smem[];
  int32_t* count = smem;            // [E]
  int32_t* offset = smem + E;       // [E + 1], multiples of the tile
  int32_t* cursor = offset + E + 1;  // [E]
  for (int e = threadIdx.x; e < E; e += blockDim.x) count[e] = 0, cursor[e] = 0;
  __syncthreads();
  for (int p = threadIdx.x; p < picks; p += blockDim.x) atomicAdd(&count[pick_expert[p]], 1);
  __syncthreads();
  if (threadIdx.x == 0) {
    offset[0] = 0;
    for (int e = 0; e < E; ++e) offset[e + 1] = offset[e] + (count[e] + kMoeTileRows - 1) / kMoeTileRows * kMoeTileRows;
  }
  __syncthreads();
  for (int64_t r = threadIdx.x; r < rows_cap; r += blockDim.x) row_token[r] = -1;
  for (int64_t tile = threadIdx.x; tile < tiles_cap; tile += blockDim.x) {
    const int64_t row = tile * kMoeTileRows;
    int e = -1;
    if (row < offset[E]) {
      int lo = 0, hi = E - 1;  // the last expert whose offset <= row (empty experts share offsets)
      while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (offset[mid] <= row) lo = mid;
        else hi = mid - 1;
      }
      e = lo;
    }
    tile_expert[tile] = e;
  }
  __syncthreads();  // the -1 of padding rows lands before the picks' tokens
  for (int p = threadIdx.x; p < picks; p += blockDim.x) {
    const int e = pick_expert[p];
    const int row = offset[e] + atomicAdd(&cursor[e], 1);
    pick_row[p] = row;
    row_token[row] = p / k;
  }
}

// A warp per output column n of its CTA's tile: the column's weight row(s) of the tile's expert
// against every row of the tile. kSwiglu: gate and up rows together, y = silu(gate) * up; else one
// row, y = the product. kGather: the tile's rows read x at their token (the layer's input), else at
// the row itself (the sorted rows moe_grouped_swiglu wrote).
template <class T, bool kSwiglu, bool kGather, bool kVec>
__global__ void __launch_bounds__(kGroupedWarps * 32)
    moe_grouped_kernel(const T* __restrict__ x, const T* __restrict__ w0, const T* __restrict__ w1,
                       T* __restrict__ y, int K, int N, const int32_t* __restrict__ tile_expert,
                       const int32_t* __restrict__ row_token) {
  const int tile = blockIdx.x;
  const int e = tile_expert[tile];
  if (e < 0) return;  // past the last tile of this step: the grid is sized for the largest step
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int n = blockIdx.y * kGroupedWarps + warp;
  if (n >= N) return;
  const int64_t row0 = int64_t(tile) * kMoeTileRows;
  const T* xr[kMoeTileRows];
  bool live[kMoeTileRows];
#pragma unroll
  for (int m = 0; m < kMoeTileRows; ++m) {
    const int tok = row_token[row0 + m];
    live[m] = tok >= 0;
    xr[m] = x + (kGather ? int64_t(tok < 0 ? 0 : tok) : row0 + m) * K;
  }
  const T* a = w0 + (int64_t(e) * N + n) * K;
  const T* b = kSwiglu ? w1 + (int64_t(e) * N + n) * K : nullptr;
  float acc0[kMoeTileRows], acc1[kMoeTileRows];
#pragma unroll
  for (int m = 0; m < kMoeTileRows; ++m) acc0[m] = 0.f, acc1[m] = 0.f;
  if constexpr (kVec) {
    // The weights are the stream (decode: each active expert's bytes once per step): every lane
    // issues kUnroll 16-byte loads of each weight row before the first use, as the GEMV does, so
    // that enough bytes are in flight; x comes from L1/L2.
    constexpr int kUnroll = 4;
    const int chunks = K / 8;
    const uint4* a4 = reinterpret_cast<const uint4*>(a);
    const uint4* b4 = reinterpret_cast<const uint4*>(b);
    auto apply = [&](const uint4& wa, const uint4& wb, int c) {
      float fa[8], fb[8];
      const T* ea = reinterpret_cast<const T*>(&wa);
      const T* eb = reinterpret_cast<const T*>(&wb);
#pragma unroll
      for (int i = 0; i < 8; ++i) fa[i] = to_float(ea[i]), fb[i] = kSwiglu ? to_float(eb[i]) : 0.f;
#pragma unroll
      for (int m = 0; m < kMoeTileRows; ++m) {
        if (!live[m]) continue;
        float fx[8];
        detail::load8(xr[m] + int64_t(c) * 8, fx);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          acc0[m] = fmaf(fa[i], fx[i], acc0[m]);
          if constexpr (kSwiglu) acc1[m] = fmaf(fb[i], fx[i], acc1[m]);
        }
      }
    };
    int c = lane;
    for (; c + 32 * (kUnroll - 1) < chunks; c += 32 * kUnroll) {
      uint4 wa[kUnroll], wb[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        wa[u] = __ldg(a4 + c + 32 * u);
        if constexpr (kSwiglu) wb[u] = __ldg(b4 + c + 32 * u);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) apply(wa[u], kSwiglu ? wb[u] : wa[u], c + 32 * u);
    }
    for (; c < chunks; c += 32) apply(__ldg(a4 + c), kSwiglu ? __ldg(b4 + c) : __ldg(a4 + c), c);
  } else {
    for (int c = lane; c < K; c += 32) {
      const float fa = to_float(a[c]);
      const float fb = kSwiglu ? to_float(b[c]) : 0.f;
#pragma unroll
      for (int m = 0; m < kMoeTileRows; ++m) {
        if (!live[m]) continue;
        const float fx = to_float(xr[m][c]);
        acc0[m] = fmaf(fa, fx, acc0[m]);
        if constexpr (kSwiglu) acc1[m] = fmaf(fb, fx, acc1[m]);
      }
    }
  }
#pragma unroll
  for (int m = 0; m < kMoeTileRows; ++m) {
    acc0[m] = warp_sum(acc0[m]);
    if constexpr (kSwiglu) acc1[m] = warp_sum(acc1[m]);
  }
  if (lane == 0) {
#pragma unroll
    for (int m = 0; m < kMoeTileRows; ++m) {
      if (!live[m]) continue;
      const float v = kSwiglu ? acc0[m] / (1.f + expf(-acc0[m])) * acc1[m] : acc0[m];
      y[(row0 + m) * N + n] = from_float<T>(v);
    }
  }
}

template <class T>
__global__ void __launch_bounds__(kCombineThreads)
    moe_combine_kernel(const T* __restrict__ y, int k, int N, const int32_t* __restrict__ pick_row,
                       const float* __restrict__ pick_weight, T* __restrict__ out) {
  const int t = blockIdx.x;
  for (int i = threadIdx.x; i < N; i += blockDim.x) {
    float acc = 0.f;
    for (int j = 0; j < k; ++j) {
      const int64_t p = int64_t(t) * k + j;
      acc = fmaf(pick_weight[p], to_float(y[int64_t(pick_row[p]) * N + i]), acc);
    }
    out[int64_t(t) * N + i] = from_float<T>(acc);
  }
}

void check_routing(const MoeRouting& r, const char* what) {
  check(r.pick_expert != nullptr && r.pick_weight != nullptr && r.pick_row != nullptr && r.row_token != nullptr &&
            r.tile_expert != nullptr,
        "{}: a routing buffer is null", what);
}

template <bool kSwiglu, bool kGather>
void launch_grouped(const void* x, const void* w0, const void* w1, void* y, int K, int N, int n_experts, int n,
                    int k, const MoeRouting& r, DType dtype, cudaStream_t stream, const char* what) {
  check(x != nullptr && w0 != nullptr && (!kSwiglu || w1 != nullptr) && y != nullptr, "{}: null pointer", what);
  check(K > 0 && N > 0 && n_experts > 0 && n > 0 && k > 0, "{}: K = {}, N = {}, experts = {}, tokens = {}, "
        "k = {} must be positive", what, K, N, n_experts, n, k);
  check_routing(r, what);
  const MoeRoutingSizes s = moe_routing_sizes(n, k, n_experts);
  const bool vec = K % 8 == 0 && detail::aligned16(x) && detail::aligned16(w0) && (!kSwiglu || detail::aligned16(w1));
  const dim3 grid(static_cast<unsigned>(s.tiles), static_cast<unsigned>((N + kGroupedWarps - 1) / kGroupedWarps));
  detail::dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    auto* kernel = vec ? moe_grouped_kernel<T, kSwiglu, kGather, true> : moe_grouped_kernel<T, kSwiglu, kGather, false>;
    kernel<<<grid, kGroupedWarps * 32, 0, stream>>>(static_cast<const T*>(x), static_cast<const T*>(w0),
                                                     static_cast<const T*>(w1), static_cast<T*>(y), K, N,
                                                     r.tile_expert, r.row_token);
  });
  check_launch(what);
}

}  // namespace

MoeRoutingSizes moe_routing_sizes(int tokens, int k, int n_experts) {
  check(tokens > 0 && k > 0 && n_experts > 0, "moe_routing_sizes: tokens {}, k {}, experts {} must be positive", tokens,
        k, n_experts);
  MoeRoutingSizes s;
  s.picks = int64_t(tokens) * k;
  const int64_t chosen = std::min<int64_t>(n_experts, s.picks);
  s.rows = (s.picks + chosen * (kMoeTileRows - 1) + kMoeTileRows - 1) / kMoeTileRows * kMoeTileRows;
  s.tiles = s.rows / kMoeTileRows;
  return s;
}

void moe_route(const float* logits, int n, int n_experts, int k, bool normalize, const MoeRouting& r,
               cudaStream_t stream) {
  check(logits != nullptr, "moe_route: null logits");
  check_routing(r, "moe_route");
  check(n > 0 && n_experts > 0 && n_experts <= 1024 && k > 0 && k <= 32 && k <= n_experts,
        "moe_route: n = {}, experts = {} (at most 1024), k = {} (at most 32 and the experts) out of range", n,
        n_experts, k);
  moe_route_kernel<<<(n + kRouteWarps - 1) / kRouteWarps, kRouteWarps * 32, 0, stream>>>(
      logits, n, n_experts, k, normalize, r.pick_expert, r.pick_weight);
  check_launch("moe_route");
}

void moe_align(int n, int k, int n_experts, const MoeRouting& r, cudaStream_t stream) {
  check_routing(r, "moe_align");
  check(n > 0 && n_experts > 0 && n_experts <= 1024 && k > 0,
        "moe_align: n = {}, experts = {} (at most 1024), k = {} out of range", n, n_experts, k);
  const MoeRoutingSizes s = moe_routing_sizes(n, k, n_experts);
  const size_t smem = (3 * size_t(n_experts) + 1) * sizeof(int32_t);
  moe_align_kernel<<<1, kAlignThreads, smem, stream>>>(r.pick_expert, n * k, k, n_experts, s.rows, s.tiles,
                                                       r.pick_row, r.row_token, r.tile_expert);
  check_launch("moe_align");
}

void moe_grouped_swiglu(const void* x, const void* gate, const void* up, void* y, int K, int N, int n_experts, int n,
                        int k, const MoeRouting& r, DType dtype, cudaStream_t stream) {
  launch_grouped<true, true>(x, gate, up, y, K, N, n_experts, n, k, r, dtype, stream, "moe_grouped_swiglu");
}

void moe_grouped_linear(const void* x, const void* w, void* y, int K, int N, int n_experts, int n, int k,
                        const MoeRouting& r, DType dtype, cudaStream_t stream) {
  launch_grouped<false, false>(x, w, nullptr, y, K, N, n_experts, n, k, r, dtype, stream, "moe_grouped_linear");
}

void moe_combine(const void* y, int n, int k, int N, const MoeRouting& r, void* out, DType dtype,
                 cudaStream_t stream) {
  check(y != nullptr && out != nullptr, "moe_combine: null pointer");
  check_routing(r, "moe_combine");
  check(n > 0 && k > 0 && N > 0, "moe_combine: n = {}, k = {}, N = {} must be positive", n, k, N);
  detail::dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    moe_combine_kernel<T><<<n, kCombineThreads, 0, stream>>>(static_cast<const T*>(y), k, N, r.pick_row,
                                                             r.pick_weight, static_cast<T*>(out));
  });
  check_launch("moe_combine");
}

}  // namespace fdpp::cuda
