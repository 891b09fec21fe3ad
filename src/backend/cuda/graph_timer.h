// Timing by CUDA-graph replay (DESIGN.md's benchmark rule), shared by fdpp bench-attention, the
// linear-layer profiler behind fdpp tune / bench-linear, and the kernel tuning harnesses: `launches`
// calls captured into one graph so that launch overhead is what a decode step's graph pays, one
// warm-up replay, then the median over `replays` replays, per call.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>

namespace fdpp::cuda {

struct GraphTiming {
  double us = 0;      // median microseconds per call
  double spread = 0;  // (max - min) / median over the replays
};

// launch(i) for i = 0 .. launches - 1 must enqueue its work on `stream` (it is captured, not run).
GraphTiming time_graph(cudaStream_t stream, int launches, int replays, const std::function<void(int)>& launch);

}  // namespace fdpp::cuda
