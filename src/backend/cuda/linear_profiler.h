// Times one linear-layer implementation on one shape on the present GPU, the DESIGN.md way
// ("Measuring"): random 16-bit data, a warm-up, then R launches captured in a CUDA graph and
// replayed several times, the median replay / R reported; the weights rotate through enough
// copies that no launch finds its weights in L2 (decode streams every weight from HBM once per
// step). fdpp tune and fdpp bench-linear are built on it.
//
// Rotation: copies = max(3, ceil(4 x L2 / weight bytes)) (capped at 64 copies, and by free
// memory), so the copies span >= 4 x L2 (H200: 240 MB) and a copy is reused only after >= 2 x L2
// of other weights have streamed through (R is a multiple of the copy count, so this also holds
// across replays). x and y are one buffer each: in decode x was just written by the previous
// kernel and is as L2-resident as here. No bias (the timed epilogue is Epilogue::Store; cuBLAS
// plain 16-bit output).
//
// Cost: one measurement is a warm-up (plus cuBLASLt's own algorithm timing the first time it sees
// an (M, N, K)), one eager pass over the copies to size R, a graph of R launches lasting about
// target_graph_us, and 1 + replays replays: about 5 ms for decode shapes; a model's 5 shapes x ~140
// (M, implementation) pairs take seconds.
#pragma once

#include <cuda_runtime_api.h>

#include <string>
#include <vector>

#include "backend/cuda/check.h"
#include "backend/cuda/linear_dispatch.h"

namespace fdpp::cuda {

// What a call must move and compute: weights N x K + x M x K (16-bit) + y M x N (y_bytes each;
// 2, or 4 for fp32 output), and 2 M N K flops.
struct LinearCost {
  double bytes = 0;
  double flops = 0;
};
LinearCost linear_cost(int M, int N, int K, int y_bytes = 2);
// % of a bandwidth (bytes/s) that moving cost.bytes in `us` microseconds achieves.
double percent_of_bandwidth(const LinearCost& cost, double us, double bytes_per_second);
double tflops(const LinearCost& cost, double us);

// DESIGN.md: the read-only streaming kernel's rate on the H200.
constexpr double kH200ReadBandwidth = 4.46e12;

struct ProfilerOptions {
  int replays = 7;                // timed replays (after one warm-up replay); the median is reported
  double target_graph_us = 500;   // R launches per graph so that one replay lasts about this long
  int max_launches = 512;         // R at most (rounded to whole rotations)
  double rotate_l2_factor = 4.0;  // weight copies span at least this many L2 sizes
  int min_copies = 3;
  int max_copies = 64;
  uint64_t seed = 0x5eed;
};

struct LinearTiming {
  double us = 0;           // median microseconds per call; NaN when the implementation did not run
  std::string why;         // why not, when it did not
  int launches = 0;        // R
  int copies = 0;          // weight copies rotated through
  double spread = 0;       // (max - min) / median over the replays
};

class LinearProfiler {
 public:
  explicit LinearProfiler(DType dtype, const ProfilerOptions& options = {});
  ~LinearProfiler();
  LinearProfiler(const LinearProfiler&) = delete;
  LinearProfiler& operator=(const LinearProfiler&) = delete;

  // Times impl on y[M, N] = x[M, K] . W[N, K]^T. An implementation that cannot take the call (M
  // beyond its limit, a shape it rejects) gives NaN and the reason; CUDA faults still throw.
  LinearTiming time(LinearImpl impl, int M, int N, int K);
  double time_us(LinearImpl impl, int M, int N, int K) { return time(impl, M, N, K).us; }

  // Frees the buffers of the last shape (they are kept while consecutive calls share [N, K]).
  void release();

  const GpuIdentity& gpu() const { return dispatcher_.gpu(); }
  DType dtype() const { return dtype_; }
  LinearDispatcher& dispatcher() { return dispatcher_; }

 private:
  void prepare(int M, int N, int K);
  void launch(LinearImpl impl, int copy, int M, int N, int K);

  DType dtype_;
  ProfilerOptions options_;
  LinearDispatcher dispatcher_;
  cudaStream_t stream_ = nullptr;
  std::vector<cudaEvent_t> events_;  // 2, for sizing R
  int n_ = 0, k_ = 0, copies_ = 0;
  size_t stride_ = 0;  // bytes between weight copies (256-aligned)
  DeviceBuffer weights_, x_, y_;
};

}  // namespace fdpp::cuda
