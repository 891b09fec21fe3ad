#include "backend/cuda/linear_profiler.h"

#include "backend/cuda/graph_timer.h"

#include <algorithm>
#include <cmath>

#include "backend/cuda/device_model.h"

namespace fdpp::cuda {

LinearCost linear_cost(int M, int N, int K, int y_bytes) {
  const double m = M, n = N, k = K;
  return {2.0 * n * k + 2.0 * m * k + static_cast<double>(y_bytes) * m * n, 2.0 * m * n * k};
}

double percent_of_bandwidth(const LinearCost& cost, double us, double bytes_per_second) {
  return us > 0 && bytes_per_second > 0 ? 100.0 * cost.bytes / (us * 1e-6) / bytes_per_second : NAN;
}

double tflops(const LinearCost& cost, double us) { return us > 0 ? cost.flops / (us * 1e-6) / 1e12 : NAN; }

LinearProfiler::LinearProfiler(DType dtype, const ProfilerOptions& options)
    : dtype_(dtype), options_(options), dispatcher_(dtype, LinearChooser{}) {
  check(options.replays >= 1 && options.replays <= 1000, "profiler: replays {} not in [1, 1000]", options.replays);
  check(options.min_copies >= 1 && options.max_copies >= options.min_copies && options.max_copies <= 4096,
        "profiler: copies range [{}, {}] is invalid", options.min_copies, options.max_copies);
  check(options.max_launches >= 1 && options.target_graph_us > 0, "profiler: bad launch limits");
  FDPP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  events_.assign(2, nullptr);
  for (cudaEvent_t& e : events_) FDPP_CUDA_CHECK(cudaEventCreate(&e));
}

LinearProfiler::~LinearProfiler() {
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  for (cudaEvent_t e : events_)
    if (e != nullptr) cudaEventDestroy(e);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

void LinearProfiler::release() {
  if (stream_ != nullptr) FDPP_CUDA_CHECK(cudaStreamSynchronize(stream_));
  weights_ = DeviceBuffer();
  x_ = DeviceBuffer();
  y_ = DeviceBuffer();
  n_ = k_ = copies_ = 0;
  stride_ = 0;
}

void LinearProfiler::prepare(int M, int N, int K) {
  const size_t x_bytes = static_cast<size_t>(M) * K * 2, y_bytes = static_cast<size_t>(M) * N * 2;
  if (N != n_ || K != k_) {
    release();
    const size_t w_bytes = static_cast<size_t>(N) * K * 2;
    stride_ = (w_bytes + 255) / 256 * 256;  // every copy 16-byte aligned whatever N x K is
    const double l2 = static_cast<double>(gpu().l2_bytes > 0 ? gpu().l2_bytes : size_t{60} << 20);
    int copies = static_cast<int>(std::ceil(options_.rotate_l2_factor * l2 / static_cast<double>(w_bytes)));
    copies = std::clamp(copies, options_.min_copies, options_.max_copies);
    size_t free_b = 0, total_b = 0;
    FDPP_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    // Leave room for x, y, the flat GEMM workspace and cuBLASLt's tuning buffers.
    const double usable = 0.8 * static_cast<double>(free_b) - 2.0 * (x_bytes + y_bytes) - double(256 << 20);
    while (copies > 1 && static_cast<double>(copies) * stride_ > usable) --copies;
    check(static_cast<double>(stride_) <= usable, "profiler: a [{}, {}] weight ({:.2f} GiB) does not fit in GPU memory",
          N, K, w_bytes / 1073741824.0);
    weights_ = DeviceBuffer(static_cast<size_t>(copies) * stride_);
    fill_random(weights_.get(), static_cast<int64_t>(weights_.bytes() / 2), dtype_, 1.0f / std::sqrt(float(K)), 0.f,
                options_.seed, stream_);
    copies_ = copies;
    n_ = N;
    k_ = K;
  }
  if (x_bytes > x_.bytes()) {
    x_ = DeviceBuffer(x_bytes);
    fill_random(x_.get(), static_cast<int64_t>(x_bytes / 2), dtype_, 1.0f, 0.f, options_.seed + 1, stream_);
  }
  if (y_bytes > y_.bytes()) y_ = DeviceBuffer(y_bytes);
}

void LinearProfiler::launch(LinearImpl impl, int copy, int M, int N, int K) {
  const void* w = static_cast<const char*>(weights_.get()) + static_cast<size_t>(copy) * stride_;
  dispatcher_.run_impl(impl, x_.get(), w, nullptr, y_.get(), M, N, K, dtype_, Epilogue::Store, stream_);
}

LinearTiming LinearProfiler::time(LinearImpl impl, int M, int N, int K) {
  LinearTiming r;
  r.us = NAN;
  check(M >= 1 && M <= kDispatchMaxM && N >= 1 && N <= kDispatchMaxDim && K >= 1 && K <= kDispatchMaxDim,
        "profiler: shape M={} N={} K={} out of range", M, N, K);
  const int limit = dispatcher_.chooser().limits().max_m(impl);
  if (M > limit) {
    r.why = fmt::format("{} takes M <= {}", linear_impl_name(impl), limit);
    return r;
  }
  prepare(M, N, K);
  r.copies = copies_;

  // Warm-up: also cuBLASLt's algorithm timing and the flat GEMM's workspace, outside capture. An
  // implementation that refuses the call is an answer (NaN); a fault on the device is not.
  try {
    launch(impl, 0, M, N, K);
  } catch (const Error& e) {
    FDPP_CUDA_CHECK(cudaStreamSynchronize(stream_));
    r.why = e.what();
    return r;
  }
  FDPP_CUDA_CHECK(cudaStreamSynchronize(stream_));

  // R from one eager pass over the copies (launch overhead makes this an overestimate for tiny
  // calls, so R errs small, never large).
  cudaEvent_t a = events_[0], b = events_[1];
  FDPP_CUDA_CHECK(cudaEventRecord(a, stream_));
  for (int c = 0; c < copies_; ++c) launch(impl, c, M, N, K);
  FDPP_CUDA_CHECK(cudaEventRecord(b, stream_));
  FDPP_CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  FDPP_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  const double estimate_us = std::max(1e-3, 1e3 * ms / copies_);
  int R = static_cast<int>(std::ceil(options_.target_graph_us / estimate_us));
  R = std::clamp(R, copies_, std::max(copies_, options_.max_launches));
  R = (R + copies_ - 1) / copies_ * copies_;  // whole rotations: every reuse >= copies - 1 launches apart
  r.launches = R;

  const GraphTiming t =
      time_graph(stream_, R, options_.replays, [&](int i) { launch(impl, i % copies_, M, N, K); });
  r.us = t.us;
  r.spread = t.spread;
  return r;
}

}  // namespace fdpp::cuda
