// fdpp bench (CUDA builds): see bench.cpp.
#pragma once

#include <string>
#include <vector>

#include "runtime/engine_args.h"

namespace fdpp {

struct BenchArgs {
  // The engine options bench takes (the table's kBench: model, load format, dtype, attention,
  // linear layers, kernels, calibration, tensor parallelism, CUDA graphs).
  EngineArgs engine;
  std::vector<int> batches{1};
  std::vector<int> contexts{1024};
  std::vector<int> prompts{1024};
  int repetitions = 5;
  int steps = 32;
  double bandwidth = 0;  // bytes/s; 0: measure
  bool json = false;
  int mixed_chunk = 512;            // the mixed test's prefill chunk (0: no mixed test)
};

int run_bench(const BenchArgs& args);

}  // namespace fdpp
