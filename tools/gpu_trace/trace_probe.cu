// fdpp_gpu_trace_probe: GPU work of known shape for tests/gpu_trace_test.py, run under
// libfdpp_gpu_trace.so. Exit 77 where no GPU is usable (the test reports "skipped").
//
//   fdpp_gpu_trace_probe run            200 spin kernels of 50 us back to back, one copy and one
//                                       memset, a CUDA graph of 10 spin kernels launched 5 times,
//                                       20 ms of host sleep, 50 more spin kernels; exits 0
//   fdpp_gpu_trace_probe until-signal   batches of 100 spin kernels of 20 us; "ready" on stdout after
//                                       the first 10 batches; runs until a signal ends it (120 s at most)
#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <thread>

namespace {

__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// One name per phase, so that the test tells the phases apart in the trace.
__global__ void probe_warmup_kernel() {}
__global__ void probe_spin_kernel(uint64_t ns) {
  const uint64_t t0 = global_ns();
  while (global_ns() - t0 < ns) {
  }
}
__global__ void probe_graph_kernel(uint64_t ns) {
  const uint64_t t0 = global_ns();
  while (global_ns() - t0 < ns) {
  }
}
__global__ void probe_tail_kernel(uint64_t ns) {
  const uint64_t t0 = global_ns();
  while (global_ns() - t0 < ns) {
  }
}

#define CHECK(call)                                                                    \
  do {                                                                                 \
    const cudaError_t e_ = (call);                                                     \
    if (e_ != cudaSuccess) {                                                           \
      std::fprintf(stderr, "probe: %s: %s\n", #call, cudaGetErrorString(e_));          \
      return 1;                                                                        \
    }                                                                                  \
  } while (0)

int run() {
  constexpr uint64_t kNs = 50000;
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  constexpr size_t kBytes = size_t{4} << 20;
  void* dev = nullptr;
  CHECK(cudaMalloc(&dev, kBytes));
  static char host[kBytes];
  // Loads the module before the phases.
  probe_warmup_kernel<<<1, 32, 0, s>>>();
  CHECK(cudaStreamSynchronize(s));

  for (int i = 0; i < 200; ++i) probe_spin_kernel<<<1, 32, 0, s>>>(kNs);
  CHECK(cudaMemcpyAsync(dev, host, kBytes, cudaMemcpyHostToDevice, s));
  CHECK(cudaMemsetAsync(dev, 0, kBytes, s));

  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < 10; ++i) probe_graph_kernel<<<1, 32, 0, s>>>(kNs);
  CHECK(cudaStreamEndCapture(s, &graph));
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < 5; ++i) CHECK(cudaGraphLaunch(exec, s));
  CHECK(cudaStreamSynchronize(s));

  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  for (int i = 0; i < 50; ++i) probe_tail_kernel<<<1, 32, 0, s>>>(kNs);
  CHECK(cudaStreamSynchronize(s));
  CHECK(cudaGetLastError());
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  CHECK(cudaFree(dev));
  std::printf("{\"spin\": 200, \"graph\": 50, \"tail\": 50, \"kernel_ns\": %llu, \"memcpy_bytes\": %zu}\n",
              static_cast<unsigned long long>(kNs), kBytes);
  return 0;
}

int until_signal() {
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const auto t0 = std::chrono::steady_clock::now();
  for (int batch = 0; std::chrono::steady_clock::now() - t0 < std::chrono::seconds(120); ++batch) {
    for (int i = 0; i < 100; ++i) probe_spin_kernel<<<1, 32, 0, s>>>(20000);
    CHECK(cudaStreamSynchronize(s));
    if (batch == 9) {
      std::printf("ready\n");
      std::fflush(stdout);
    }
  }
  std::fprintf(stderr, "probe: no signal came in 120 s\n");
  return 3;
}

}  // namespace

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "run";
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    std::fprintf(stderr, "probe: no usable GPU (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return 77;
  }
  if (std::strcmp(mode, "run") == 0) return run();
  if (std::strcmp(mode, "until-signal") == 0) return until_signal();
  std::fprintf(stderr, "usage: fdpp_gpu_trace_probe [run|until-signal]\n");
  return 2;
}
