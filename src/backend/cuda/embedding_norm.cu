// Embedding lookup into the fp32 residual stream, and the fused residual-add + RMSNorm/LayerNorm.
//
// residual_norm: one block per row. Pass 1 adds the 16-bit delta (and its bias) into the fp32
// row, writes it back and accumulates the sum (LayerNorm) or the sum of squares (RMSNorm); pass 2
// (LayerNorm only) accumulates the squared deviations from the mean (two-pass: no cancellation);
// pass 3 normalizes. Passes 2 and 3 re-read the row from global memory: every thread reads back
// only the elements it wrote itself, so no synchronization is needed beyond the reductions, and a
// row of a few thousand floats is still in L1/L2. Sums are fp32 (per-thread, then a tree over the
// block); the final 1/sqrt(mean + eps) is computed in double as the CPU reference does.
// Vectorized path (8 elements per 16-byte access) when dim % 8 == 0 and every pointer is 16-byte
// aligned; a scalar path otherwise.
#include <cmath>

#include "backend/cuda/cuda_common.cuh"

namespace fdpp::cuda {

namespace {

using detail::aligned16;
using detail::check_launch;
using detail::load8;
using detail::store8;
using detail::to_float;
using detail::from_float;
using detail::warp_sum;

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the total.
// `scratch`: 32 floats of shared memory, reusable across calls.
__device__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // the previous call's readers are done with scratch
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float t = lane < n_warps ? scratch[lane] : 0.f;
  return warp_sum(t);
}

template <class T, bool kVec>
__global__ void embedding_kernel(const T* __restrict__ table, const T* __restrict__ pos_table, int pos_offset,
                                 const int32_t* __restrict__ ids, const int32_t* __restrict__ positions, int dim,
                                 float* __restrict__ x, float scale) {
  const int t = blockIdx.x;
  const int32_t id = ids[t];
  float* xr = x + static_cast<int64_t>(t) * dim;
  if (id < 0) {  // an id the caller should have rejected: write zeros rather than read out of bounds
    for (int i = threadIdx.x; i < dim; i += blockDim.x) xr[i] = 0.f;
    return;
  }
  const T* row = table + static_cast<int64_t>(id) * dim;
  const T* prow = pos_table != nullptr ? pos_table + static_cast<int64_t>(positions[t] + pos_offset) * dim : nullptr;
  if constexpr (kVec) {
    for (int c = threadIdx.x; c < dim / 8; c += blockDim.x) {
      float a[8];
      load8(row + c * 8, a);
#pragma unroll
      for (int i = 0; i < 8; ++i) a[i] *= scale;  // (1: exact)
      if (prow != nullptr) {
        float b[8];
        load8(prow + c * 8, b);
#pragma unroll
        for (int i = 0; i < 8; ++i) a[i] += b[i];
      }
      float4* dst = reinterpret_cast<float4*>(xr + c * 8);
      dst[0] = make_float4(a[0], a[1], a[2], a[3]);
      dst[1] = make_float4(a[4], a[5], a[6], a[7]);
    }
  } else {
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
      float a = to_float(row[i]) * scale;
      if (prow != nullptr) a += to_float(prow[i]);
      xr[i] = a;
    }
  }
}

struct NormArgs {
  float* x;
  const void* delta;
  const void* delta_bias;
  const void* weight;
  const void* bias;
  void* out;
  int dim;
  double eps;
  bool write_back;
};

template <class T, bool kVec, bool kLayerNorm>
__global__ void residual_norm_kernel(NormArgs a) {
  __shared__ float scratch[32];
  detail::pdl_trigger();
  detail::pdl_wait();  // x and delta are the previous kernels' (programmatic launch: see kernels.h)
  const int dim = a.dim;
  const int64_t row = blockIdx.x;
  float* x = a.x + row * dim;
  const T* delta = a.delta != nullptr ? static_cast<const T*>(a.delta) + row * dim : nullptr;
  const T* dbias = a.delta != nullptr ? static_cast<const T*>(a.delta_bias) : nullptr;
  const T* weight = static_cast<const T*>(a.weight);
  const T* bias = static_cast<const T*>(a.bias);
  T* out = a.out != nullptr ? static_cast<T*>(a.out) + row * dim : nullptr;

  // Pass 1: x += delta (+ delta_bias), accumulate.
  float acc = 0.f;
  if constexpr (kVec) {
    for (int c = threadIdx.x; c < dim / 8; c += blockDim.x) {
      float4* xp = reinterpret_cast<float4*>(x + c * 8);
      const float4 x0 = xp[0], x1 = xp[1];
      float v[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
      if (delta != nullptr) {
        float d[8];
        load8(delta + c * 8, d);
        if (dbias != nullptr) {
          float e[8];
          load8(dbias + c * 8, e);
#pragma unroll
          for (int i = 0; i < 8; ++i) d[i] += e[i];
        }
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] += d[i];
        xp[0] = make_float4(v[0], v[1], v[2], v[3]);
        xp[1] = make_float4(v[4], v[5], v[6], v[7]);
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) acc += kLayerNorm ? v[i] : v[i] * v[i];
    }
  } else {
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
      float v = x[i];
      if (delta != nullptr) {
        float d = to_float(delta[i]);
        if (dbias != nullptr) d += to_float(dbias[i]);
        v += d;
        x[i] = v;
      }
      acc += kLayerNorm ? v : v * v;
    }
  }
  const float total = block_sum(acc, scratch);

  float mean = 0.f, inv;
  if constexpr (kLayerNorm) {
    mean = total / static_cast<float>(dim);
    // Pass 2: squared deviations (each thread re-reads exactly the elements it wrote in pass 1).
    float sq = 0.f;
    if constexpr (kVec) {
      for (int c = threadIdx.x; c < dim / 8; c += blockDim.x) {
        const float4* xp = reinterpret_cast<const float4*>(x + c * 8);
        const float4 x0 = xp[0], x1 = xp[1];
        const float v[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
        for (int i = 0; i < 8; ++i) sq += (v[i] - mean) * (v[i] - mean);
      }
    } else {
      for (int i = threadIdx.x; i < dim; i += blockDim.x) sq += (x[i] - mean) * (x[i] - mean);
    }
    const float var = block_sum(sq, scratch) / static_cast<float>(dim);
    inv = static_cast<float>(1.0 / sqrt(static_cast<double>(var) + a.eps));
  } else {
    inv = static_cast<float>(1.0 / sqrt(static_cast<double>(total) / dim + a.eps));
  }

  // Pass 3: y = norm(x) * weight (+ bias) -> out (16-bit), and x = y (fp32) when write_back.
  if constexpr (kVec) {
    for (int c = threadIdx.x; c < dim / 8; c += blockDim.x) {
      float4* xp = reinterpret_cast<float4*>(x + c * 8);
      const float4 x0 = xp[0], x1 = xp[1];
      const float v[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
      float w[8], y[8];
      load8(weight + c * 8, w);
      if constexpr (kLayerNorm) {
        float b[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        if (bias != nullptr) load8(bias + c * 8, b);
#pragma unroll
        for (int i = 0; i < 8; ++i) y[i] = (v[i] - mean) * inv * w[i] + b[i];
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) y[i] = v[i] * inv * w[i];
      }
      if (out != nullptr) store8(out + c * 8, y);
      if (a.write_back) {
        xp[0] = make_float4(y[0], y[1], y[2], y[3]);
        xp[1] = make_float4(y[4], y[5], y[6], y[7]);
      }
    }
  } else {
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
      const float v = x[i];
      float y;
      if constexpr (kLayerNorm) {
        y = (v - mean) * inv * to_float(weight[i]) + (bias != nullptr ? to_float(bias[i]) : 0.f);
      } else {
        y = v * inv * to_float(weight[i]);
      }
      if (out != nullptr) out[i] = from_float<T>(y);
      if (a.write_back) x[i] = y;
    }
  }
}

// Threads per row-block: one 8-element unit (or one element) per thread up to 1024 threads.
int row_threads(int units) {
  int t = ((units + 31) / 32) * 32;
  if (t < 32) t = 32;
  if (t > 1024) t = 1024;
  return t;
}

// head_rms_norm: one warp per (token, head); the head's elements are strided over the lanes. Row r
// of the grid is token r / heads_total, head r % heads_total, q heads first, then k heads. Launched
// programmatically (Qwen3's q/k norms sit between the q/k/v product and the rotary kernel).
template <class T>
__global__ void head_rms_norm_kernel(T* __restrict__ qkv, int64_t rows, int row_stride, int n_heads, int n_kv_heads,
                                     int head_dim, const T* __restrict__ q_weight, const T* __restrict__ k_weight,
                                     float eps) {
  detail::pdl_trigger();
  detail::pdl_wait();  // qkv is the previous kernel's
  const int64_t r = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (r >= rows) return;  // whole warps leave together: rows are warp-uniform
  const int heads = n_heads + n_kv_heads;
  const int64_t t = r / heads;
  const int h = static_cast<int>(r - t * heads);
  T* x = qkv + t * row_stride + static_cast<int64_t>(h) * head_dim;  // k heads follow the q heads
  const T* w = h < n_heads ? q_weight : k_weight;
  float ss = 0.f;
  for (int i = lane; i < head_dim; i += 32) {
    const float v = to_float(x[i]);
    ss += v * v;
  }
  ss = warp_sum(ss);
  const float inv = static_cast<float>(1.0 / sqrt(static_cast<double>(ss) / head_dim + eps));
  for (int i = lane; i < head_dim; i += 32) x[i] = from_float<T>(to_float(x[i]) * inv * to_float(w[i]));
}

// Whole rows (head_rms_norm with one head and no k heads: Gemma's sandwich norms on a block's
// output): one block per row, as residual_norm, where a warp per row would walk a hidden size of
// thousands alone. Launched programmatically like the decode step's other kernels.
template <class T, bool kVec>
__global__ void row_rms_norm_kernel(T* __restrict__ x, int dim, const T* __restrict__ weight, float eps) {
  __shared__ float scratch[32];
  detail::pdl_trigger();
  detail::pdl_wait();  // x is the previous kernel's
  T* row = x + static_cast<int64_t>(blockIdx.x) * dim;
  float ss = 0.f;
  if constexpr (kVec) {
    for (int c = threadIdx.x; c < dim / 8; c += blockDim.x) {
      float v[8];
      load8(row + c * 8, v);
#pragma unroll
      for (int i = 0; i < 8; ++i) ss += v[i] * v[i];
    }
  } else {
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
      const float v = to_float(row[i]);
      ss += v * v;
    }
  }
  const float inv = static_cast<float>(1.0 / sqrt(static_cast<double>(block_sum(ss, scratch)) / dim + eps));
  if constexpr (kVec) {
    for (int c = threadIdx.x; c < dim / 8; c += blockDim.x) {
      float v[8], w[8];
      load8(row + c * 8, v);
      load8(weight + c * 8, w);
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = v[i] * inv * w[i];
      store8(row + c * 8, v);
    }
  } else {
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
      row[i] = from_float<T>(to_float(row[i]) * inv * to_float(weight[i]));
    }
  }
}

}  // namespace

void head_rms_norm(void* qkv, int n_tokens, int n_heads, int n_kv_heads, int head_dim, const void* q_weight,
                   const void* k_weight, double eps, DType dtype, cudaStream_t stream) {
  check(qkv != nullptr && q_weight != nullptr && (k_weight != nullptr || n_kv_heads == 0),
        "head_rms_norm: null pointer");
  check(n_tokens > 0 && n_heads > 0 && n_kv_heads >= 0 && head_dim > 0,
        "head_rms_norm: tokens = {}, heads = {}/{}, head_dim = {} must be positive", n_tokens, n_heads, n_kv_heads,
        head_dim);
  check(eps >= 0 && std::isfinite(eps), "head_rms_norm: eps = {} must be finite and non-negative", eps);
  if (n_heads == 1 && n_kv_heads == 0) {
    const bool vec = head_dim % 8 == 0 && aligned16(qkv) && aligned16(q_weight);
    const detail::LaunchConfig config(dim3(n_tokens), dim3(row_threads(vec ? head_dim / 8 : head_dim)), 0, stream,
                                      programmatic_launch_enabled());
    detail::dispatch_dtype(dtype, [&](auto tag) {
      using T = decltype(tag);
      auto* kernel = vec ? row_rms_norm_kernel<T, true> : row_rms_norm_kernel<T, false>;
      detail::cuda_check(cudaLaunchKernelEx(config.get(), kernel, static_cast<T*>(qkv), head_dim,
                                            static_cast<const T*>(q_weight), static_cast<float>(eps)),
                         "cudaLaunchKernelEx(head_rms_norm, whole rows)");
    });
    check_launch("head_rms_norm");
    return;
  }
  const int64_t rows = static_cast<int64_t>(n_tokens) * (n_heads + n_kv_heads);
  constexpr int kThreads = 256;  // 8 heads per block
  const int64_t blocks = (rows * 32 + kThreads - 1) / kThreads;
  const int row_stride = (n_heads + 2 * n_kv_heads) * head_dim;
  const detail::LaunchConfig config(dim3(static_cast<unsigned>(blocks)), dim3(kThreads), 0, stream,
                                    programmatic_launch_enabled());
  detail::dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    detail::cuda_check(cudaLaunchKernelEx(config.get(), head_rms_norm_kernel<T>, static_cast<T*>(qkv), rows,
                                          row_stride, n_heads, n_kv_heads, head_dim, static_cast<const T*>(q_weight),
                                          static_cast<const T*>(k_weight), static_cast<float>(eps)),
                       "cudaLaunchKernelEx(head_rms_norm)");
  });
  check_launch("head_rms_norm");
}

void embedding(const void* table, const void* pos_table, int pos_offset, DType dtype, const int32_t* ids,
               const int32_t* positions, int n_tokens, int dim, float* x, cudaStream_t stream, float scale) {
  check(table != nullptr && ids != nullptr && x != nullptr, "embedding: null pointer (table {}, ids {}, x {})",
        table, static_cast<const void*>(ids), static_cast<const void*>(x));
  check(n_tokens > 0 && dim > 0, "embedding: n_tokens = {} and dim = {} must be positive", n_tokens, dim);
  check(pos_table == nullptr || positions != nullptr, "embedding: pos_table given without positions");
  check(pos_offset >= 0, "embedding: pos_offset = {} is negative", pos_offset);
  check(std::isfinite(scale), "embedding: scale = {} is not finite", scale);
  const bool vec = dim % 8 == 0 && aligned16(table) && (pos_table == nullptr || aligned16(pos_table)) && aligned16(x);
  const int threads = row_threads(vec ? dim / 8 : dim);
  detail::dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    auto* kernel = vec ? embedding_kernel<T, true> : embedding_kernel<T, false>;
    kernel<<<n_tokens, threads, 0, stream>>>(static_cast<const T*>(table), static_cast<const T*>(pos_table),
                                             pos_offset, ids, positions, dim, x, scale);
  });
  check_launch("embedding");
}

void residual_norm(float* x, const void* delta, const void* delta_bias, const void* weight, const void* bias,
                   void* out, int rows, int dim, double eps, NormType norm, bool write_back, DType dtype,
                   cudaStream_t stream) {
  check(x != nullptr && weight != nullptr, "residual_norm: null pointer (x {}, weight {})",
        static_cast<const void*>(x), weight);
  check(out != nullptr || write_back, "residual_norm: out is null and write_back is off: nothing to write");
  check(rows > 0 && dim > 0, "residual_norm: rows = {} and dim = {} must be positive", rows, dim);
  check(eps >= 0 && std::isfinite(eps), "residual_norm: eps = {} must be finite and non-negative", eps);
  check(norm == NormType::RMSNorm || norm == NormType::LayerNorm, "residual_norm: unknown norm type {}",
        static_cast<int>(norm));
  check(norm == NormType::LayerNorm || bias == nullptr, "residual_norm: RMSNorm takes no bias");
  const bool vec = dim % 8 == 0 && aligned16(x) && aligned16(weight) && (delta == nullptr || aligned16(delta)) &&
                   (delta_bias == nullptr || aligned16(delta_bias)) && (bias == nullptr || aligned16(bias)) &&
                   (out == nullptr || aligned16(out));
  const int threads = row_threads(vec ? dim / 8 : dim);
  const NormArgs args{x, delta, delta_bias, weight, bias, out, dim, eps, write_back};
  detail::dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    void (*kernel)(NormArgs);
    if (norm == NormType::LayerNorm) {
      kernel = vec ? residual_norm_kernel<T, true, true> : residual_norm_kernel<T, false, true>;
    } else {
      kernel = vec ? residual_norm_kernel<T, true, false> : residual_norm_kernel<T, false, false>;
    }
    const detail::LaunchConfig config(dim3(rows), dim3(threads), 0, stream, programmatic_launch_enabled());
    detail::cuda_check(cudaLaunchKernelEx(config.get(), kernel, args), "cudaLaunchKernelEx(residual_norm)");
  });
  check_launch("residual_norm");
}

}  // namespace fdpp::cuda
