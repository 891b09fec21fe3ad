// convert_stored (weight_streamer.h): stored checkpoint elements -> fp16/bf16 on the GPU, one thread
// per output element. Every fp32 operation is the one gguf_dequant.cpp does, in its order, with
// __fmul_rn/__fadd_rn so that nvcc cannot contract them into FMAs (the CPU build does not either);
// fp32 -> 16-bit is half.h's rounding, bit for bit. Throughput is not the point: the loader is
// bound by reading files (~10 GB/s), these kernels run at hundreds of GB/s.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "backend/cuda/check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/weight_convert.h"

namespace fdpp::cuda {

namespace {

// ggml's type numbers (io/gguf.h's GgmlType; that header is C++20 and .cu files are C++17).
enum class GgmlType : uint32_t { F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14, BF16 = 30 };

__device__ __forceinline__ uint16_t u16_at(const uint8_t* p) { return uint16_t(p[0]) | uint16_t(p[1]) << 8; }

__device__ __forceinline__ float half_at(const uint8_t* p) { return __half2float(__ushort_as_half(u16_at(p))); }

// half.h's f32_to_fp16 / f32_to_bf16, bit for bit.
__device__ __forceinline__ uint16_t f32_to_fp16_dev(float f) {
  const uint32_t x = __float_as_uint(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) return sign | (abs > 0x7f800000u ? 0x7e00u : 0x7c00u);
  if (abs >= 0x477ff000u) return sign | 0x7c00u;
  if (abs < 0x38800000u) {
    if (abs < 0x33000000u) return sign;
    const uint32_t e = abs >> 23;
    const uint32_t m = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;
    uint32_t half_m = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half_m & 1u))) ++half_m;
    return sign | static_cast<uint16_t>(half_m);
  }
  uint32_t h = ((abs >> 13) - ((127 - 15) << 10));
  const uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return sign | static_cast<uint16_t>(h);
}

__device__ __forceinline__ uint16_t f32_to_bf16_dev(float f) {
  const uint32_t x = __float_as_uint(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  const uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>((x + rounding) >> 16);
}

// Stored element i (whole blocks from src) as fp32, exactly as gguf::dequantize computes it.
template <GgmlType T>
__device__ __forceinline__ float stored_value(const uint8_t* src, int64_t i) {
  if constexpr (T == GgmlType::F32) {
    return __uint_as_float(uint32_t(src[4 * i]) | uint32_t(src[4 * i + 1]) << 8 | uint32_t(src[4 * i + 2]) << 16 |
                           uint32_t(src[4 * i + 3]) << 24);
  } else if constexpr (T == GgmlType::F16) {
    return half_at(src + 2 * i);
  } else if constexpr (T == GgmlType::BF16) {
    return __uint_as_float(uint32_t(u16_at(src + 2 * i)) << 16);
  } else if constexpr (T == GgmlType::Q8_0) {
    const uint8_t* b = src + (i / 32) * 34;
    const int j = int(i % 32);
    return __fmul_rn(float(int8_t(b[2 + j])), half_at(b));
  } else if constexpr (T == GgmlType::Q4_0) {
    const uint8_t* b = src + (i / 32) * 18;
    const int j = int(i % 32);
    const int q = j < 16 ? (b[2 + j] & 0x0F) : (b[2 + j - 16] >> 4);
    return __fmul_rn(float(q - 8), half_at(b));
  } else if constexpr (T == GgmlType::Q4_1) {
    const uint8_t* b = src + (i / 32) * 20;
    const int j = int(i % 32);
    const int q = j < 16 ? (b[4 + j] & 0x0F) : (b[4 + j - 16] >> 4);
    return __fadd_rn(__fmul_rn(float(q), half_at(b)), half_at(b + 2));
  } else if constexpr (T == GgmlType::Q4_K || T == GgmlType::Q5_K) {
    constexpr bool Q5 = T == GgmlType::Q5_K;
    const uint8_t* b = src + (i / 256) * (Q5 ? 176 : 144);
    const int e = int(i % 256), p = e / 64, r = e % 64, high = r >= 32 ? 1 : 0, l = r % 32;
    const int j = 2 * p + high;
    const uint8_t* s = b + 4;
    int sc, m;
    if (j < 4) {
      sc = s[j] & 63;
      m = s[j + 4] & 63;
    } else {
      sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
      m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
    const float d1 = __fmul_rn(half_at(b), float(sc)), m1 = __fmul_rn(half_at(b + 2), float(m));
    const uint8_t qb = b[(Q5 ? 48 : 16) + 32 * p + l];
    // Q5_K: the fifth bit of group j is bit j of qh[l] (qh: the 32 bytes after the scales).
    const int q = (high ? (qb >> 4) : (qb & 0x0F)) | (Q5 ? ((b[16 + l] >> j) & 1) << 4 : 0);
    return __fsub_rn(__fmul_rn(d1, float(q)), m1);
  } else if constexpr (T == GgmlType::Q6_K) {
    const uint8_t* b = src + (i / 256) * 210;
    const int e = int(i % 256), h = e / 128, r = e % 128, k = r / 32, l = r % 32, g = l / 16;
    const uint8_t* ql = b + 64 * h;
    const uint8_t* qh = b + 128 + 32 * h;
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192 + 8 * h);
    const uint8_t qlb = ql[l + 32 * (k & 1)];
    const int nib = k >= 2 ? (qlb >> 4) : (qlb & 0x0F);
    const int q = (nib | (((qh[l] >> (2 * k)) & 3) << 4)) - 32;
    return __fmul_rn(__fmul_rn(half_at(b + 208), float(sc[g + 2 * k])), float(q));
  } else {
    return 0.f;
  }
}

template <GgmlType T, bool BF16>
__global__ void convert_kernel(const uint8_t* __restrict__ src, int64_t n, int64_t cols, int64_t head_dim,
                               uint16_t* __restrict__ dst) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    int64_t i = e;
    if (head_dim > 0) {
      const int64_t row = e / cols, c = e % cols, half = head_dim / 2;
      const int64_t hd = row / head_dim, rr = row % head_dim, j = rr / half, ii = rr % half;
      i = (hd * head_dim + 2 * ii + j) * cols + c;
    }
    const float v = stored_value<T>(src, i);
    dst[e] = BF16 ? f32_to_bf16_dev(v) : f32_to_fp16_dev(v);
  }
}

template <GgmlType T>
void launch(const void* src, int64_t n, int64_t cols, int64_t head_dim, void* dst, DType dtype, cudaStream_t stream) {
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>((n + threads - 1) / threads, 4096);
  const auto* s = static_cast<const uint8_t*>(src);
  auto* d = static_cast<uint16_t*>(dst);
  if (dtype == DType::BF16) convert_kernel<T, true><<<blocks, threads, 0, stream>>>(s, n, cols, head_dim, d);
  else convert_kernel<T, false><<<blocks, threads, 0, stream>>>(s, n, cols, head_dim, d);
}

// GGUF blocks kept as stored (gguf_blocks.h): dst row r of each head = stored row planned_source_row(r)
// (weight_plan.h), whole rows of row_bytes; one thread per byte.
__global__ void permute_rows_kernel(const uint8_t* __restrict__ src, int64_t rows, uint64_t row_bytes,
                                    int64_t head_dim, uint8_t* __restrict__ dst) {
  const int64_t n = rows * int64_t(row_bytes);
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = e / int64_t(row_bytes), c = e % int64_t(row_bytes), half = head_dim / 2;
    const int64_t hd = row / head_dim, rr = row % head_dim, j = rr / half, ii = rr % half;
    dst[e] = src[(hd * head_dim + 2 * ii + j) * int64_t(row_bytes) + c];
  }
}

}  // namespace

void permute_stored_rows(const void* src, int64_t rows, uint64_t row_bytes, int64_t head_dim, void* dst,
                         cudaStream_t stream) {
  const int64_t n = rows * static_cast<int64_t>(row_bytes);
  if (n == 0) return;
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>((n + threads - 1) / threads, 4096);
  permute_rows_kernel<<<blocks, threads, 0, stream>>>(static_cast<const uint8_t*>(src), rows, row_bytes, head_dim,
                                                      static_cast<uint8_t*>(dst));
  FDPP_CUDA_CHECK(cudaGetLastError());
}

bool gpu_converts_type(uint32_t type) {
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::F32: case GgmlType::F16: case GgmlType::BF16: case GgmlType::Q8_0: case GgmlType::Q4_0:
    case GgmlType::Q4_1: case GgmlType::Q4_K: case GgmlType::Q5_K: case GgmlType::Q6_K: return true;
    default: return false;
  }
}

void convert_stored_type(uint32_t type, const void* src, int64_t n, int64_t cols, int64_t permute_head_dim,
                         void* dst, DType dtype, cudaStream_t stream) {
  if (n == 0) return;
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::F32: launch<GgmlType::F32>(src, n, cols, permute_head_dim, dst, dtype, stream); break;
    case GgmlType::F16: launch<GgmlType::F16>(src, n, cols, permute_head_dim, dst, dtype, stream); break;
    case GgmlType::BF16: launch<GgmlType::BF16>(src, n, cols, permute_head_dim, dst, dtype, stream); break;
    case GgmlType::Q8_0: launch<GgmlType::Q8_0>(src, n, cols, permute_head_dim, dst, dtype, stream); break;
    case GgmlType::Q4_0: launch<GgmlType::Q4_0>(src, n, cols, permute_head_dim, dst, dtype, stream); break;
    case GgmlType::Q4_1: launch<GgmlType::Q4_1>(src, n, cols, permute_head_dim, dst, dtype, stream); break;
    case GgmlType::Q4_K: launch<GgmlType::Q4_K>(src, n, cols, permute_head_dim, dst, dtype, stream); break;
    case GgmlType::Q5_K: launch<GgmlType::Q5_K>(src, n, cols, permute_head_dim, dst, dtype, stream); break;
    case GgmlType::Q6_K: launch<GgmlType::Q6_K>(src, n, cols, permute_head_dim, dst, dtype, stream); break;
    default: fail("convert_stored: ggml type {} is not converted on the GPU", type);
  }
  FDPP_CUDA_CHECK(cudaGetLastError());
}

}  // namespace fdpp::cuda
