// Checked CUDA and cuBLAS calls for host code: every failure becomes an fdpp::Error naming the
// call, the file:line and the runtime's own message.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "fdpp/error.h"

#define FDPP_CUDA_CHECK(call)                                                                                   \
  do {                                                                                                          \
    const cudaError_t fdpp_err_ = (call);                                                                       \
    if (fdpp_err_ != cudaSuccess)                                                                               \
      ::fdpp::fail("CUDA error in {} ({}:{}): {}", #call, __FILE__, __LINE__, cudaGetErrorString(fdpp_err_));   \
  } while (0)

#define FDPP_CUBLAS_CHECK(call)                                                                                 \
  do {                                                                                                          \
    const cublasStatus_t fdpp_st_ = (call);                                                                     \
    if (fdpp_st_ != CUBLAS_STATUS_SUCCESS)                                                                      \
      ::fdpp::fail("cuBLAS error in {} ({}:{}): status {}", #call, __FILE__, __LINE__, static_cast<int>(fdpp_st_)); \
  } while (0)

namespace fdpp::cuda {

// Owning device allocation (cudaMalloc), movable.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes > 0) {
      const cudaError_t err = cudaMalloc(&ptr_, bytes);
      if (err != cudaSuccess) {
        size_t free_b = 0, total_b = 0;
        cudaGetLastError();
        cudaMemGetInfo(&free_b, &total_b);
        fail("out of GPU memory: allocating {:.2f} GiB with {:.2f} GiB free of {:.2f} GiB", bytes / 1073741824.0,
             free_b / 1073741824.0, total_b / 1073741824.0);
      }
    }
  }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) {
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      if (ptr_ != nullptr) cudaFree(ptr_);
      ptr_ = o.ptr_;
      bytes_ = o.bytes_;
      o.ptr_ = nullptr;
      o.bytes_ = 0;
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return ptr_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }
  bool empty() const { return ptr_ == nullptr; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace fdpp::cuda
