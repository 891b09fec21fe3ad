// Element-wise kernels on 16-bit activations: bias add, SiLU-gated product, ReLU. Memory bound:
// grid-stride loops over 8-element (16-byte) units when the row length is a multiple of 8 and the
// pointers are 16-byte aligned, single elements otherwise. Math in fp32, one rounding at the store.
#include <cmath>

#include "backend/cuda/cuda_common.cuh"

namespace fdpp::cuda {

namespace {

using detail::aligned16;
using detail::check_launch;
using detail::from_float;
using detail::grid_for;
using detail::load8;
using detail::store8;
using detail::to_float;

constexpr int kThreads = 256;

template <class T, bool kVec>
__global__ void add_bias_kernel(T* __restrict__ x, const T* __restrict__ bias, int64_t rows, int n) {
  if constexpr (kVec) {
    const int units_per_row = n / 8;
    const int64_t total = rows * units_per_row;
    for (int64_t u = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; u < total; u += int64_t(gridDim.x) * blockDim.x) {
      const int col = static_cast<int>(u % units_per_row) * 8;
      T* p = x + u * 8;  // rows are contiguous: unit u starts at element 8u
      float a[8], b[8];
      load8(p, a);
      load8(bias + col, b);
#pragma unroll
      for (int i = 0; i < 8; ++i) a[i] += b[i];
      store8(p, a);
    }
  } else {
    const int64_t total = rows * n;
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
      x[i] = from_float<T>(to_float(x[i]) + to_float(bias[i % n]));
    }
  }
}

__device__ __forceinline__ float silu(float g) { return g / (1.f + expf(-g)); }
// PyTorch's tanh GELU (gelu_pytorch_tanh), as cpu::gelu_tanh_mul computes it.
__device__ __forceinline__ float gelu_tanh(float g) {
  constexpr float k = 0.7978845608028654f;  // sqrt(2 / pi)
  return 0.5f * g * (1.f + tanhf(k * (g + 0.044715f * g * g * g)));
}
template <bool kGelu>
__device__ __forceinline__ float gate_act(float g) {
  if constexpr (kGelu) {
    return gelu_tanh(g);
  } else {
    return silu(g);
  }
}

template <class T, bool kVec, bool kGelu = false>
__global__ void silu_mul_kernel(const T* __restrict__ gate_up, T* __restrict__ out, int64_t rows, int n) {
  if constexpr (kVec) {
    const int units_per_row = n / 8;
    const int64_t total = rows * units_per_row;
    for (int64_t u = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; u < total; u += int64_t(gridDim.x) * blockDim.x) {
      const int64_t r = u / units_per_row;
      const int col = static_cast<int>(u - r * units_per_row) * 8;
      const T* g = gate_up + r * 2 * n + col;
      float a[8], b[8];
      load8(g, a);
      load8(g + n, b);
#pragma unroll
      for (int i = 0; i < 8; ++i) a[i] = gate_act<kGelu>(a[i]) * b[i];
      store8(out + r * n + col, a);
    }
  } else {
    const int64_t total = rows * n;
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
      const int64_t r = i / n;
      const int64_t col = i - r * n;
      const T* g = gate_up + r * 2 * n + col;
      out[i] = from_float<T>(gate_act<kGelu>(to_float(g[0])) * to_float(g[n]));
    }
  }
}

template <class T, bool kVec>
__global__ void relu_kernel(T* __restrict__ x, int64_t total) {
  if constexpr (kVec) {
    for (int64_t u = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; u < total / 8; u += int64_t(gridDim.x) * blockDim.x) {
      float a[8];
      load8(x + u * 8, a);
#pragma unroll
      for (int i = 0; i < 8; ++i) a[i] = a[i] > 0.f ? a[i] : 0.f;  // NaN -> 0, as the CPU reference
      store8(x + u * 8, a);
    }
  } else {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
      const float a = to_float(x[i]);
      x[i] = from_float<T>(a > 0.f ? a : 0.f);
    }
  }
}

// One CTA per output row, 16 bytes per thread and step.
__global__ void gather_rows_kernel(const int4* __restrict__ src, const int32_t* __restrict__ index, int row_vecs,
                                   int4* __restrict__ dst) {
  const int64_t from = static_cast<int64_t>(index[blockIdx.x]) * row_vecs;
  const int64_t to = static_cast<int64_t>(blockIdx.x) * row_vecs;
  for (int i = threadIdx.x; i < row_vecs; i += blockDim.x) dst[to + i] = src[from + i];
}

}  // namespace

void gather_rows(const void* src, const int32_t* index, int rows, int row_bytes, void* dst, cudaStream_t stream) {
  check(src != nullptr && index != nullptr && dst != nullptr, "gather_rows: null pointer");
  check(rows > 0 && row_bytes > 0 && row_bytes % 16 == 0 && aligned16(src) && aligned16(dst),
        "gather_rows: {} rows of {} bytes (16-byte multiples, aligned)", rows, row_bytes);
  gather_rows_kernel<<<rows, 256, 0, stream>>>(static_cast<const int4*>(src), index, row_bytes / 16,
                                               static_cast<int4*>(dst));
  check_launch("gather_rows");
}

void add_bias(void* x, const void* bias, int rows, int n, DType dtype, cudaStream_t stream) {
  check(x != nullptr && bias != nullptr, "add_bias: null pointer (x {}, bias {})", x, bias);
  check(rows > 0 && n > 0, "add_bias: rows = {} and n = {} must be positive", rows, n);
  const bool vec = n % 8 == 0 && aligned16(x) && aligned16(bias);
  const int64_t items = int64_t(rows) * n / (vec ? 8 : 1);
  detail::dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    auto* kernel = vec ? add_bias_kernel<T, true> : add_bias_kernel<T, false>;
    kernel<<<grid_for(items, kThreads), kThreads, 0, stream>>>(static_cast<T*>(x), static_cast<const T*>(bias), rows,
                                                               n);
  });
  check_launch("add_bias");
}

void silu_mul(const void* gate_up, void* out, int rows, int n, DType dtype, cudaStream_t stream, bool gelu) {
  check(gate_up != nullptr && out != nullptr, "silu_mul: null pointer (gate_up {}, out {})", gate_up, out);
  check(rows > 0 && n > 0, "silu_mul: rows = {} and n = {} must be positive", rows, n);
  const bool vec = n % 8 == 0 && aligned16(gate_up) && aligned16(out);
  const int64_t items = int64_t(rows) * n / (vec ? 8 : 1);
  detail::dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    auto* kernel = gelu ? (vec ? silu_mul_kernel<T, true, true> : silu_mul_kernel<T, false, true>)
                        : (vec ? silu_mul_kernel<T, true> : silu_mul_kernel<T, false>);
    kernel<<<grid_for(items, kThreads), kThreads, 0, stream>>>(static_cast<const T*>(gate_up), static_cast<T*>(out),
                                                               rows, n);
  });
  check_launch("silu_mul");
}

namespace {
template <class T>
__global__ void add_scalar_kernel(T* __restrict__ x, int64_t n, float value) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = from_float<T>(to_float(x[i]) + value);
}
}  // namespace

void add_scalar(void* x, int64_t n, float value, DType dtype, cudaStream_t stream) {
  check(x != nullptr && n > 0, "add_scalar: null pointer or n = {}", n);
  detail::dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    add_scalar_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream>>>(static_cast<T*>(x), n, value);
  });
  check_launch("add_scalar");
}

namespace {
__global__ void soft_cap_kernel(float* __restrict__ x, int64_t n, float cap) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = cap * tanhf(x[i] / cap);
}
}  // namespace

void soft_cap(float* x, int64_t n, float cap, cudaStream_t stream) {
  check(x != nullptr && n > 0, "soft_cap: null pointer or n = {}", n);
  check(std::isfinite(cap) && cap > 0.f, "soft_cap: cap = {} must be finite and positive", cap);
  soft_cap_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(x, n, cap);
  check_launch("soft_cap");
}

void relu(void* x, int rows, int n, DType dtype, cudaStream_t stream) {
  check(x != nullptr, "relu: null pointer x");
  check(rows > 0 && n > 0, "relu: rows = {} and n = {} must be positive", rows, n);
  const int64_t total = int64_t(rows) * n;
  const bool vec = total % 8 == 0 && aligned16(x);
  const int64_t items = total / (vec ? 8 : 1);
  detail::dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    auto* kernel = vec ? relu_kernel<T, true> : relu_kernel<T, false>;
    kernel<<<grid_for(items, kThreads), kThreads, 0, stream>>>(static_cast<T*>(x), total);
  });
  check_launch("relu");
}

}  // namespace fdpp::cuda
