// Shared by the kernel files of the CUDA backend (private: included by .cu files only): error
// checks, the 16-bit element types behind DType, and 16-byte vector loads/stores of 8 elements.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/kernels.h"
#include "fdpp/error.h"

namespace fdpp::cuda::detail {

// ---- host-side checks --------------------------------------------------------------------------

// Throws fdpp::Error naming `what` (a CUDA call or a kernel) and the runtime's error string.
inline void cuda_check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    fail("CUDA error in {}: {} ({})", what, cudaGetErrorString(err), cudaGetErrorName(err));
  }
}

// After every launch: a bad configuration (grid, shared memory) is reported here. Faults inside a
// kernel surface at the next synchronizing call; run with CUDA_LAUNCH_BLOCKING=1 to have them
// reported here too, against the kernel that caused them.
inline void check_launch(const char* kernel) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    fail("CUDA kernel {} failed to launch: {} ({})", kernel, cudaGetErrorString(err), cudaGetErrorName(err));
  }
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

inline const char* dtype_name(DType t) { return t == DType::F16 ? "f16" : "bf16"; }

// Grid size for grid-stride loops over n items: enough blocks to fill the GPU several times over,
// never more than needed.
inline unsigned grid_for(int64_t n, int threads, int64_t max_blocks = 65536) {
  int64_t blocks = (n + threads - 1) / threads;
  if (blocks > max_blocks) blocks = max_blocks;
  if (blocks < 1) blocks = 1;
  return static_cast<unsigned>(blocks);
}

// ---- 16-bit element types ----------------------------------------------------------------------

template <DType D>
struct ElemOf;
template <>
struct ElemOf<DType::F16> {
  using type = __half;
};
template <>
struct ElemOf<DType::BF16> {
  using type = __nv_bfloat16;
};

__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

// Round to nearest even, as the host conversions in core/half.h do.
template <class T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ __half from_float<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// The 8 16-bit elements of a 16-byte chunk as floats.
template <class T>
__device__ __forceinline__ void unpack8(const uint4& u, float (&f)[8]) {
  const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
  for (int i = 0; i < 8; ++i) f[i] = to_float(e[i]);
}

// 8 consecutive 16-bit elements <-> 8 floats through one 16-byte access. p must be 16-byte aligned.
template <class T>
__device__ __forceinline__ void load8(const T* p, float (&f)[8]) {
  unpack8<T>(*reinterpret_cast<const uint4*>(p), f);
}

template <class T>
__device__ __forceinline__ void store8(T* p, const float (&f)[8]) {
  uint4 u;
  T* e = reinterpret_cast<T*>(&u);
#pragma unroll
  for (int i = 0; i < 8; ++i) e[i] = from_float<T>(f[i]);
  *reinterpret_cast<uint4*>(p) = u;
}

// Dispatch on DType: calls f(T{}) with T = __half or __nv_bfloat16.
template <class F>
inline void dispatch_dtype(DType dtype, F&& f) {
  if (dtype == DType::F16) {
    f(__half{});
  } else if (dtype == DType::BF16) {
    f(__nv_bfloat16{});
  } else {
    fail("CUDA kernels: unknown dtype {}", static_cast<int>(dtype));
  }
}

// ---- launches ------------------------------------------------------------------------------------

// Programmatic dependent launch (PDL) in the decode step. A kernel launched with it may be
// scheduled while the kernel before it drains (once all that kernel's CTAs have called
// pdl_trigger, or exited); it must call pdl_wait before reading anything the previous kernels
// wrote, and every such kernel calls pdl_wait unconditionally, so that each one completes only
// after its predecessor did (the chain stays transitive). Both are no-ops in a normal launch.
// The GEMV and flat GEMM issue their first weight loads before pdl_wait: the weights do not depend
// on the previous kernel, so their stream starts during its tail.
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// A cudaLaunchKernelEx configuration, optionally a programmatic dependent launch: the kernel may
// be scheduled while the previous kernel on the stream drains, and must execute
// griddepcontrol.wait before it reads anything that kernel wrote.
class LaunchConfig {
 public:
  LaunchConfig(dim3 grid, dim3 block, size_t smem_bytes, cudaStream_t stream, bool programmatic) {
    config_.gridDim = grid;
    config_.blockDim = block;
    config_.dynamicSmemBytes = smem_bytes;
    config_.stream = stream;
    if (programmatic) {
      attribute_.id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attribute_.val.programmaticStreamSerializationAllowed = 1;
      config_.attrs = &attribute_;
      config_.numAttrs = 1;
    }
  }
  LaunchConfig(const LaunchConfig&) = delete;  // config_ points at attribute_
  LaunchConfig& operator=(const LaunchConfig&) = delete;
  const cudaLaunchConfig_t* get() const { return &config_; }

 private:
  cudaLaunchAttribute attribute_{};
  cudaLaunchConfig_t config_{};
};

// ---- warp reductions ---------------------------------------------------------------------------

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// ---- asynchronous global -> shared copies (sm_80+) ------------------------------------------------

// 16 bytes, bypassing L1 (.cg). Both addresses 16-byte aligned.
__device__ __forceinline__ void cp_async16(void* smem_dst, const void* gmem_src) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(gmem_src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits for all of this thread's committed copies; other threads see them after a barrier
// (__syncwarp / __syncthreads).
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

// log2(e): attention kernels fold it into the softmax scale and use exp2f.
constexpr float kLog2e = 1.4426950408889634f;

}  // namespace fdpp::cuda::detail
