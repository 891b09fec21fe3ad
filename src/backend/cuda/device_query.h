// Which CUDA GPUs this process can use. Compiled only in CUDA builds (FDPP_HAVE_CUDA); a machine
// without a GPU or driver reports none rather than failing.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fdpp::cuda {

struct GpuInfo {
  int index = 0;
  std::string name;
  int sm_major = 0, sm_minor = 0;
  int multiprocessors = 0;
  uint64_t total_memory = 0;
  uint64_t l2_bytes = 0;
};

// Empty when there is no usable GPU; `why` (if given) then says what the runtime answered.
std::vector<GpuInfo> list_gpus(std::string* why = nullptr);

}  // namespace fdpp::cuda
