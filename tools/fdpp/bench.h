// fdpp bench (CUDA builds): see bench.cpp.
#pragma once

#include <string>
#include <vector>

#include "engine/environment_fallback.h"

namespace fdpp {

struct BenchArgs {
  std::string model;
  std::string config;
  std::string load_format = "auto";
  std::string dtype = "f16";
  std::vector<int> batches{1};
  std::vector<int> contexts{1024};
  std::vector<int> prompts{1024};
  int repetitions = 5;
  int steps = 32;
  double bandwidth = 0;  // bytes/s; 0: measure
  bool json = false;
  bool no_cuda_graphs = false;
  std::string attention = "async";  // decode attention: async (unified max) or sync
  std::string linear;               // linear layers: "" (FDPP_LINEAR, else auto), auto, gemv, flat, cublas
  std::string dispatch_table;       // explicit dispatch table file
  std::string calibration;          // explicit unified-max calibration file (fdpp calibrate --out)
  int mixed_chunk = 512;            // the mixed test's prefill chunk (0: no mixed test)
  std::string prefill_config;       // prefill attention tile configuration ("": the engine's default)
  int tensor_parallel = 1;          // GPUs the model is split over
  KernelFlags kernels;              // --pdl, --decode-path (else FDPP_PDL, FDPP_DECODE_PATH)
};

int run_bench(const BenchArgs& args);

}  // namespace fdpp
