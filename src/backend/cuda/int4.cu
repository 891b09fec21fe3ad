// 4-bit weights: dequantization for the prefill GEMM, act-order's column gather and the int4
// quantizer (int4.h). The decode product is flat_gemm.cu's kernel over the same layout.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <type_traits>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/int4.h"
#include "backend/cuda/mma_fragments.cuh"

namespace fdpp::cuda {

namespace {

using detail::check_launch;

constexpr int kThreads = 256;

__device__ __forceinline__ int group_of(int k, int group_size) { return group_size > 0 ? k / group_size : 0; }

// One thread per q4 word: 8 weights, one 16-byte store.
template <class T>
__global__ void __launch_bounds__(kThreads) int4_dequantize_kernel(const uint32_t* __restrict__ q4,
                                                                   const uint32_t* __restrict__ zs, int group_size,
                                                                   int zs_stride, int N, int K, uint4* __restrict__ w) {
  const int64_t words = int64_t(N) * (K / 8);
  for (int64_t i = blockIdx.x * int64_t(kThreads) + threadIdx.x; i < words; i += int64_t(gridDim.x) * kThreads) {
    const int64_t n = i / (K / 8);
    const int k = int(i % (K / 8)) * 8;
    w[i] = detail::int4x8_to<T>(q4[i], zs[n * zs_stride + group_of(k, group_size)]);
  }
}

__global__ void __launch_bounds__(kThreads) gather_columns_kernel(const uint16_t* __restrict__ x,
                                                                  const int32_t* __restrict__ perm, int M, int K,
                                                                  uint16_t* __restrict__ dst) {
  detail::pdl_trigger();
  detail::pdl_wait();
  const int64_t n = int64_t(M) * K;
  for (int64_t i = blockIdx.x * int64_t(kThreads) + threadIdx.x; i < n; i += int64_t(gridDim.x) * kThreads) {
    const int64_t r = i / K;
    dst[i] = x[r * K + perm[i % K]];
  }
}

// One warp per (row, group of 128): lane l quantizes k 4l .. 4l + 3, and lanes 2j, 2j + 1 make word j.
template <class T>
__global__ void __launch_bounds__(kThreads) quantize_int4_kernel(const T* __restrict__ w, int N, int K,
                                                                 uint32_t* __restrict__ q4, uint32_t* __restrict__ zs,
                                                                 int zs_stride) {
  const int lane = threadIdx.x & 31;
  const int groups = K / 128;
  const int64_t task = (blockIdx.x * int64_t(kThreads) + threadIdx.x) / 32;
  if (task >= int64_t(N) * groups) return;
  const int64_t n = task / groups;
  const int g = int(task % groups);
  const T* src = w + n * K + g * 128 + 4 * lane;
  float v[4], mn = 0.f, mx = 0.f;  // the range takes 0 (int4.h)
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    v[i] = detail::to_float(src[i]);
    mn = fminf(mn, v[i]);
    mx = fmaxf(mx, v[i]);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    mn = fminf(mn, __shfl_xor_sync(0xffffffffu, mn, o));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  }
  const T s16 = detail::from_float<T>(fmaxf(mx - mn, 1e-5f) / 15.f);
  const float s = detail::to_float(s16);
  const int z = min(max(__float2int_rn(-mn / s), 0), 15);
  uint32_t word = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t q = uint32_t(min(max(__float2int_rn(v[i] / s) + z, 0), 15));
    const int k = 4 * (lane & 1) + i;  // k within the word
    word |= q << (4 * (k >> 1) + 16 * (k & 1));
  }
  word |= __shfl_xor_sync(0xffffffffu, word, 1);
  if ((lane & 1) == 0) q4[n * (K / 8) + g * 16 + lane / 2] = word;
  if (lane == 0) {
    const T zz = detail::from_float<T>((std::is_same_v<T, __half> ? 1024.f : 128.f) + float(z));
    zs[n * zs_stride + g] = uint32_t(*reinterpret_cast<const uint16_t*>(&s16)) |
                            (uint32_t(*reinterpret_cast<const uint16_t*>(&zz)) << 16);
  }
}

int blocks_for(int64_t threads) {
  return int(std::min<int64_t>((threads + kThreads - 1) / kThreads, int64_t(1) << 20));
}

}  // namespace

int int4_zs_stride(int64_t K, int group_size) {
  const int64_t groups = group_size > 0 ? (K + group_size - 1) / group_size : 1;
  return int((groups + 7) / 8 * 8);
}

const char* int4_group_problem(int64_t K, int group_size) {
  if (K % 32 != 0) return "rows of a 4-bit matrix must hold a multiple of 32 weights";
  if (group_size == 0 || group_size == 32 || group_size == 64 || group_size == 128) return nullptr;
  if (group_size > 0 && group_size % 256 == 0) return nullptr;
  return "the 4-bit kernels take groups of 32, 64, 128 or a multiple of 256 weights, or one group per row";
}

uint16_t int4_zero_bits(int zero, DType dtype) {
  check(zero >= 0 && zero <= 15, "int4: zero point {} is not in 0..15", zero);
  // magic + zero: f16 1024 + z has exponent 10 (0x6400 | z); bf16 128 + z has exponent 7 (0x4300 | z).
  return static_cast<uint16_t>((dtype == DType::BF16 ? 0x4300 : 0x6400) | zero);
}

void int4_dequantize(const uint32_t* q4, const Int4Matrix& m, int N, int K, DType dtype, void* w16,
                     cudaStream_t stream) {
  check(q4 != nullptr && m.zs != nullptr && w16 != nullptr, "int4_dequantize: null pointer");
  check(N >= 1 && K >= 32 && K % 32 == 0, "int4_dequantize: N = {}, K = {} (K a multiple of 32)", N, K);
  check(detail::aligned16(w16), "int4_dequantize: the output must be 16-byte aligned");
  const int blocks = blocks_for(int64_t(N) * (K / 8));
  detail::dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    int4_dequantize_kernel<T><<<blocks, kThreads, 0, stream>>>(q4, m.zs, m.group_size, m.zs_stride, N, K,
                                                                static_cast<uint4*>(w16));
  });
  check_launch("int4_dequantize");
}

void gather_columns(const void* x, const int32_t* perm, int M, int K, void* dst, cudaStream_t stream) {
  check(x != nullptr && perm != nullptr && dst != nullptr && x != dst, "gather_columns: null or aliased pointer");
  check(M >= 1 && K >= 1, "gather_columns: M = {}, K = {}", M, K);
  const detail::LaunchConfig config(dim3(unsigned(blocks_for(int64_t(M) * K))), dim3(kThreads), 0, stream,
                                    programmatic_launch_enabled());
  detail::cuda_check(cudaLaunchKernelEx(config.get(), gather_columns_kernel, static_cast<const uint16_t*>(x), perm, M,
                                        K, static_cast<uint16_t*>(dst)),
                     "cudaLaunchKernelEx(gather_columns)");
  check_launch("gather_columns");
}

void quantize_int4(const void* w16, int N, int K, DType dtype, uint32_t* q4, uint32_t* zs, cudaStream_t stream) {
  check(w16 != nullptr && q4 != nullptr && zs != nullptr, "quantize_int4: null pointer");
  check(N >= 1 && K >= 128 && K % 128 == 0, "--quantization int4: rows of {} weights are not a multiple of 128", K);
  const int64_t tasks = int64_t(N) * (K / 128);
  const int blocks = int((tasks * 32 + kThreads - 1) / kThreads);
  detail::dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    quantize_int4_kernel<T><<<blocks, kThreads, 0, stream>>>(static_cast<const T*>(w16), N, K, q4, zs,
                                                              int4_zs_stride(K, 128));
  });
  check_launch("quantize_int4");
}

}  // namespace fdpp::cuda
