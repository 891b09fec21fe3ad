// The linear-layer dispatcher on the GPU (backend/cuda/linear_dispatch.h): every implementation
// (GEMV, flat GEMM, cuBLASLt) with every epilogue (Store, StoreF32, AddF32, SwiGLU; cuBLAS's last
// two through scratch + element-wise kernels), with and without bias, fp16 and bf16, against the
// CPU reference (NMSE <= 5e-4, outputs poisoned first); the automatic choice over M; CUDA-graph
// capture after reserve() and the one-line error without it; and the profiler's timings (positive,
// finite; NaN with a reason beyond an implementation's limit). Skipped without a GPU.
#include <cmath>
#include <optional>

#include "backend/cpu/ops.h"
#include "backend/cuda/linear_dispatch.h"
#include "backend/cuda/linear_profiler.h"
#include "fdpp/error.h"
#include "gpu/gpu_test_util.h"

namespace fdpp::test {
namespace {

using cuda::Epilogue;
constexpr DType kTypes[] = {DType::F16, DType::BF16};
constexpr Epilogue kEpilogues[] = {Epilogue::Store, Epilogue::StoreF32, Epilogue::AddF32, Epilogue::SwiGLU};
constexpr int kMaxRows = 100;

// Skipped without a GPU (CudaKernels::SetUp).
class LinearDispatchGpu : public CudaKernels {};


// One problem: x [kMaxRows, K], w [N, K], bias [N] (16-bit on the device, the same values as floats
// on the host) and the fp32 reference acc = x . w^T (+ bias) for every row, with and without bias.
struct Problem {
  int N, K;
  DType t;
  std::vector<float> x, w, b, ref, ref_bias;
  DeviceBuffer<uint16_t> xd, wd, bd;
  Problem(int n, int k, DType type)
      : N(n),
        K(k),
        t(type),
        xd(random_bits(size_t(kMaxRows) * k, type, x)),
        wd(random_bits(size_t(n) * k, type, w, 1.0f / std::sqrt(float(k)))),
        bd(random_bits(size_t(n), type, b)) {
    ref.resize(size_t(kMaxRows) * N);
    ref_bias.resize(ref.size());
    cpu::linear(x.data(), kMaxRows, K, w.data(), N, nullptr, ref.data());
    cpu::linear(x.data(), kMaxRows, K, w.data(), N, b.data(), ref_bias.data());
  }
};

// Runs one call and returns (output, expected) as floats.
std::pair<std::vector<float>, std::vector<float>> run_one(cuda::LinearDispatcher& d, const Problem& p,
                                                          std::optional<LinearImpl> impl, int M, Epilogue e,
                                                          bool bias) {
  const int N = p.N, F = N / 2;
  const std::vector<float>& acc = bias ? p.ref_bias : p.ref;
  const int out_cols = e == Epilogue::SwiGLU ? F : N;
  const size_t n_out = size_t(M) * out_cols;
  const bool f32 = e == Epilogue::StoreF32 || e == Epilogue::AddF32;
  std::vector<float> expected(n_out), y0;
  for (int m = 0; m < M; ++m)
    for (int c = 0; c < out_cols; ++c) {
      const size_t row = size_t(m) * N;
      expected[size_t(m) * out_cols + c] =
          e == Epilogue::SwiGLU ? acc[row + c] / (1.f + std::exp(-acc[row + c])) * acc[row + F + c] : acc[row + c];
    }
  DeviceBuffer<float> y32(f32 ? n_out : 0);
  DeviceBuffer<uint16_t> y16(f32 ? 0 : n_out);
  if (e == Epilogue::AddF32) {
    y0 = random_vector(n_out);
    y32.upload(y0);
    for (size_t i = 0; i < n_out; ++i) expected[i] += y0[i];
  } else if (f32) {
    y32.poison();
  } else {
    y16.poison();
  }
  void* y = f32 ? static_cast<void*>(y32.get()) : static_cast<void*>(y16.get());
  const void* bp = bias ? p.bd.get() : nullptr;
  if (impl) d.run_impl(*impl, p.xd.get(), p.wd.get(), bp, y, M, N, p.K, p.t, e, nullptr);
  else d.run(p.xd.get(), p.wd.get(), bp, y, M, N, p.K, p.t, e, nullptr);
  sync("linear dispatch");
  return {f32 ? y32.download() : from_bits(y16.download(), p.t), expected};
}

TEST_F(LinearDispatchGpu, EveryImplementationAndEpilogueMatchesCpu) {
  const std::vector<std::pair<LinearImpl, std::vector<int>>> ms = {
      {LinearImpl::Gemv, {1, 3, 8}}, {LinearImpl::Flat, {1, 7, 9, 33, 64}}, {LinearImpl::Cublas, {1, 9, 100}}};
  for (DType t : kTypes) {
    cuda::LinearDispatcher d(t, LinearChooser{});
    EXPECT_STREQ(cuda::dtype_name(d.dtype()), name(t));
    // Odd N (no SwiGLU there), N not a multiple of any tile, K not a multiple of 64, tiny.
    for (auto [N, K] : {std::pair{1001, 4096}, {1030, 512}, {64, 1000}, {2, 8}}) {
      const Problem p(N, K, t);
      for (const auto& [impl, impl_ms] : ms)
        for (int M : impl_ms)
          for (Epilogue e : kEpilogues) {
            if (e == Epilogue::SwiGLU && N % 2 != 0) continue;
            for (bool bias : {false, true}) {
              const std::string what = fmt::format("linear_{} {} {} M={} N={} K={} bias={} {}", linear_impl_name(impl),
                                                   epilogue_name(e), name(t), M, N, K, bias,
                                                   cuda::LinearDispatcher::fuses(impl, e) ? "fused" : "unfused");
              auto [out, expected] = run_one(d, p, impl, M, e, bias);
              expect_close(out, expected, Tolerance{}, what);
            }
          }
    }
  }
}

TEST_F(LinearDispatchGpu, AutomaticChoiceOverM) {
  // The fallback rule (no table) picks GEMV, flat GEMM and cuBLAS across M = 1..70; every answer
  // matches the CPU.
  cuda::LinearDispatcher d(DType::F16, LinearChooser{});
  const Problem p(1030, 512, DType::F16);
  for (int M = 1; M <= 70; ++M) {
    auto [out, expected] = run_one(d, p, std::nullopt, M, Epilogue::Store, true);
    expect_close(out, expected, Tolerance{},
                 fmt::format("linear_auto M={} ({})", M, linear_impl_name(d.choose(M, p.N, p.K))));
  }
  // Forced modes through the options: forced GEMV hands M > 8 on, it does not fail.
  DispatchSelectOptions o;
  o.mode = "gemv";
  o.search_cache = false;
  o.search_shipped = false;
  cuda::LinearDispatcher g(DType::F16, o);
  EXPECT_EQ(g.choose(8, p.N, p.K), LinearImpl::Gemv);
  EXPECT_EQ(g.choose(9, p.N, p.K), LinearImpl::Flat);
  auto [out, expected] = run_one(g, p, std::nullopt, 20, Epilogue::Store, false);
  expect_close(out, expected, Tolerance{}, "linear_forced_gemv M=20");
  // A call in the wrong dtype is refused.
  const Problem q(64, 64, DType::BF16);
  const std::string msg = error_of([&] { run_one(g, q, LinearImpl::Cublas, 1, Epilogue::Store, false); });
  EXPECT_NE(msg.find("a bf16 call on a dispatcher for f16"), std::string::npos) << msg;
  EXPECT_NE(error_of([&] { run_one(g, p, LinearImpl::Gemv, 9, Epilogue::Store, false); }).find("gemv takes M <= 8"),
            std::string::npos);
}

TEST_F(LinearDispatchGpu, CapturesAfterReserve) {
  const DType t = DType::F16;
  const Problem p(1030, 4096, t);  // K long enough for split-K plans (workspace)
  const int M = 64, F = p.N / 2;
  cudaStream_t s = nullptr;
  cuda_ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  DeviceBuffer<uint16_t> y(size_t(M) * p.N);

  // Without reserve(): cuBLAS's SwiGLU needs scratch, and growing it inside capture is refused.
  {
    cuda::LinearDispatcher d(t, LinearChooser{});
    cudaGraph_t g = nullptr;
    cuda_ok(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "capture");
    const std::string msg = error_of([&] {
      d.run_impl(LinearImpl::Cublas, p.xd.get(), p.wd.get(), p.bd.get(), y.get(), M, p.N, p.K, t, Epilogue::SwiGLU, s);
    });
    cudaStreamEndCapture(s, &g);
    if (g != nullptr) cudaGraphDestroy(g);
    cudaGetLastError();
    EXPECT_NE(msg.find("LinearDispatcher::reserve"), std::string::npos) << msg;
  }
  // With it: flat GEMM (any split plan) and cuBLAS SwiGLU captured, replayed, correct.
  cuda::LinearDispatcher d(t, LinearChooser{});
  const std::vector<LinearShape> shapes{{"gate_up", p.N, p.K}};
  d.reserve(M, shapes, /*cublas_epilogues=*/true, s);
  EXPECT_GE(d.workspace_bytes(), size_t(M) * p.N * sizeof(float));
  DeviceBuffer<uint16_t> y_flat(size_t(M) * p.N), y_swiglu(size_t(M) * F);
  y_flat.poison();
  y_swiglu.poison();
  cudaGraph_t g = nullptr;
  cuda_ok(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "capture");
  try {
    for (int m : {1, 8, 33, M})  // every flat plan up to M, last one writes the checked output
      d.run_impl(LinearImpl::Flat, p.xd.get(), p.wd.get(), p.bd.get(), y_flat.get(), m, p.N, p.K, t, Epilogue::Store, s);
    d.run_impl(LinearImpl::Cublas, p.xd.get(), p.wd.get(), p.bd.get(), y_swiglu.get(), M, p.N, p.K, t,
               Epilogue::SwiGLU, s);
  } catch (...) {
    cudaStreamEndCapture(s, &g);
    throw;
  }
  cuda_ok(cudaStreamEndCapture(s, &g), "end capture");
  cudaGraphExec_t exec = nullptr;
  cuda_ok(cudaGraphInstantiate(&exec, g, 0), "instantiate");
  for (int rep = 0; rep < 3; ++rep) cuda_ok(cudaGraphLaunch(exec, s), "launch");  // semaphores re-zeroed each time
  cuda_ok(cudaStreamSynchronize(s), "replay");
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(g);
  std::vector<float> ref(p.ref_bias.begin(), p.ref_bias.begin() + size_t(M) * p.N), swiglu(size_t(M) * F);
  for (int m = 0; m < M; ++m)
    for (int f = 0; f < F; ++f) {
      const float gate = ref[size_t(m) * p.N + f], up = ref[size_t(m) * p.N + F + f];
      swiglu[size_t(m) * F + f] = gate / (1.f + std::exp(-gate)) * up;
    }
  expect_close(from_bits(y_flat.download(), t), ref, Tolerance{}, "linear_graph flat M=64");
  expect_close(from_bits(y_swiglu.download(), t), swiglu, Tolerance{}, "linear_graph cublas swiglu M=64");
  cudaStreamDestroy(s);
}

TEST_F(LinearDispatchGpu, ProfilerTimesArePositiveAndFinite) {
  cuda::ProfilerOptions o;
  o.replays = 3;
  cuda::LinearProfiler prof(DType::F16, o);
  const int N = 2048, K = 1024;
  for (auto [impl, M] : {std::pair{LinearImpl::Gemv, 1}, {LinearImpl::Gemv, 8}, {LinearImpl::Flat, 1},
                         {LinearImpl::Flat, 64}, {LinearImpl::Cublas, 1}, {LinearImpl::Cublas, 256}}) {
    const cuda::LinearTiming t = prof.time(impl, M, N, K);
    EXPECT_TRUE(std::isfinite(t.us) && t.us > 0) << linear_impl_name(impl) << " M=" << M << ": " << t.us << " " << t.why;
    EXPECT_GE(t.copies, 3);
    EXPECT_GE(t.launches, t.copies);
    EXPECT_EQ(t.launches % t.copies, 0);
    // Bytes over time cannot beat any real GPU by orders of magnitude (a broken timer would).
    EXPECT_LT(cuda::percent_of_bandwidth(cuda::linear_cost(M, N, K), t.us, cuda::kH200ReadBandwidth), 1000.0);
    std::printf("[profiler] %s M=%d [%d, %d]: %.2f us (R %d, %d copies, spread %.1f%%)\n", linear_impl_name(impl), M, N,
                K, t.us, t.launches, t.copies, 100 * t.spread);
  }
  const cuda::LinearTiming beyond = prof.time(LinearImpl::Gemv, 9, N, K);
  EXPECT_TRUE(std::isnan(beyond.us));
  EXPECT_NE(beyond.why.find("gemv takes M <= 8"), std::string::npos) << beyond.why;
  EXPECT_TRUE(std::isnan(prof.time(LinearImpl::Flat, 65, N, K).us));
  prof.release();
  const cuda::LinearCost c = cuda::linear_cost(2, 10, 3, 4);
  EXPECT_DOUBLE_EQ(c.bytes, 2.0 * 10 * 3 + 2.0 * 2 * 3 + 4.0 * 2 * 10);
  EXPECT_DOUBLE_EQ(c.flops, 2.0 * 2 * 10 * 3);
  EXPECT_NEAR(cuda::percent_of_bandwidth({1e6, 0}, 1.0, 1e12), 100.0, 1e-9);
  EXPECT_NEAR(cuda::tflops({0, 1e6}, 1.0), 1.0, 1e-12);
}

}  // namespace
}  // namespace fdpp::test
