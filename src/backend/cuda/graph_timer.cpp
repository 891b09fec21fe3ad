#include "backend/cuda/graph_timer.h"

#include <algorithm>
#include <vector>

#include "backend/cuda/check.h"
#include "fdpp/error.h"

namespace fdpp::cuda {

GraphTiming time_graph(cudaStream_t stream, int launches, int replays, const std::function<void(int)>& launch) {
  check(launches >= 1 && replays >= 1, "time_graph: {} launches, {} replays", launches, replays);
  cudaGraph_t graph = nullptr;
  FDPP_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  try {
    for (int i = 0; i < launches; ++i) launch(i);
  } catch (...) {
    cudaStreamEndCapture(stream, &graph);
    if (graph != nullptr) cudaGraphDestroy(graph);
    throw;
  }
  FDPP_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  FDPP_CUDA_CHECK(inst);

  // One event between consecutive replays: the replays run back to back, as in a decode loop.
  std::vector<cudaEvent_t> events(static_cast<size_t>(replays) + 1, nullptr);
  cudaError_t err = cudaSuccess;
  for (auto& e : events)
    if (err == cudaSuccess) err = cudaEventCreate(&e);
  if (err == cudaSuccess) err = cudaGraphLaunch(exec, stream);  // warm-up
  if (err == cudaSuccess) err = cudaEventRecord(events[0], stream);
  for (int i = 0; i < replays && err == cudaSuccess; ++i) {
    err = cudaGraphLaunch(exec, stream);
    if (err == cudaSuccess) err = cudaEventRecord(events[i + 1], stream);
  }
  if (err == cudaSuccess) err = cudaEventSynchronize(events[replays]);
  std::vector<double> us(static_cast<size_t>(replays));
  for (int i = 0; i < replays && err == cudaSuccess; ++i) {
    float ms = 0;
    err = cudaEventElapsedTime(&ms, events[i], events[i + 1]);
    us[i] = 1e3 * ms / launches;
  }
  for (auto e : events)
    if (e != nullptr) cudaEventDestroy(e);
  cudaGraphExecDestroy(exec);
  FDPP_CUDA_CHECK(err);
  std::sort(us.begin(), us.end());
  GraphTiming t;
  t.us = us[us.size() / 2];
  t.spread = t.us > 0 ? (us.back() - us.front()) / t.us : 0;
  return t;
}

}  // namespace fdpp::cuda
