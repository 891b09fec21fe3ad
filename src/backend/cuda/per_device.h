// State that belongs to a device, not to the process: kernel attributes (cudaFuncSetAttribute acts
// on the current device only) and device properties. With tensor parallelism one process drives
// several GPUs, so a "once per process" static would leave the second GPU unconfigured.
#pragma once

#include <cuda_runtime_api.h>

#include <map>
#include <mutex>
#include <set>
#include <utility>

#include "backend/cuda/check.h"

namespace fdpp::cuda {

inline int current_device() {
  int device = 0;
  FDPP_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

// Runs configure() the first time (key, current device) is seen; later calls return at once.
// configure runs under a lock (it is a handful of attribute calls, done before graph capture).
template <class F>
void once_per_device(const void* key, F&& configure) {
  static std::mutex mu;
  static std::set<std::pair<const void*, int>> done;
  const int device = current_device();
  std::lock_guard<std::mutex> lock(mu);
  if (done.count({key, device}) != 0) return;
  configure();
  done.insert({key, device});
}

// An attribute of the current device (cached per device and attribute).
inline int current_device_attribute(cudaDeviceAttr attribute) {
  static std::mutex mu;
  static std::map<std::pair<int, int>, int> known;  // (device, attribute) -> value
  const int device = current_device();
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(device, static_cast<int>(attribute));
  if (const auto it = known.find(key); it != known.end()) return it->second;
  int value = 0;
  FDPP_CUDA_CHECK(cudaDeviceGetAttribute(&value, attribute, device));
  known.emplace(key, value);
  return value;
}

// The current device's multiprocessor count.
inline int multiprocessors_of_current_device() {
  return current_device_attribute(cudaDevAttrMultiProcessorCount);
}

}  // namespace fdpp::cuda
