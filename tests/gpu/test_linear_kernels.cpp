// Decode's linear-layer kernels (src/backend/cuda/flat_gemm.h): the tensor-core flat GEMM (ImplB)
// and the CUDA-core GEMV with epilogues (ImplA) against a double-precision CPU reference computed
// from the same 16-bit values. DESIGN.md's conventions: fresh random inputs each run (seed printed;
// FDPP_TEST_SEED replays), outputs poisoned with NaN before every launch (AddF32's accumulator is
// random instead), NMSE <= 5e-4 and NaN never passes. Covered: every M each kernel takes, odd N and
// K (multiples of 8) including tails of every tile, every epilogue, bias or none, fp16 and bf16,
// every [N, K] of the five preset models, forced split-K plans and pipeline depths, the rejection
// of K % 8 != 0, and split-K replays (twice on one workspace, and inside a CUDA graph) that must
// leave the semaphores at zero.
#include <omp.h>

#include <cmath>
#include <cstring>
#include <functional>

#include "backend/cuda/flat_gemm.h"
#include "fdpp/error.h"
#include "gpu/gpu_test_util.h"

namespace fdpp::test {
namespace {

using cuda::Epilogue;

[[maybe_unused]] ::testing::Environment* const nmse_report = ::testing::AddGlobalTestEnvironment(new NmseReport);

constexpr DType kTypes[] = {DType::F16, DType::BF16};
constexpr Epilogue kEpilogues[] = {Epilogue::Store, Epilogue::StoreF32, Epilogue::AddF32, Epilogue::SwiGLU};

const char* epi_name(Epilogue e) {
  switch (e) {
    case Epilogue::Store: return "Store";
    case Epilogue::StoreF32: return "StoreF32";
    case Epilogue::AddF32: return "AddF32";
    default: return "SwiGLU";
  }
}
bool f32_out(Epilogue e) { return e == Epilogue::StoreF32 || e == Epilogue::AddF32; }

// Random values in [-scale, scale), rounded to the 16-bit type, filled in parallel (the model
// shapes hold up to 141M weights): a counter-based hash of (seed, index), the seed drawn from the
// printed test seed.
struct Random16 {
  std::vector<uint16_t> bits;
  std::vector<float> values;
};
Random16 random16(size_t n, DType t, float scale) {
  const uint64_t seed = rng()();
  Random16 r;
  r.bits.resize(n);
  r.values.resize(n);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < int64_t(n); ++i) {
    uint64_t z = seed + 0x9E3779B97F4A7C15ull * uint64_t(i + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const float u = float(z >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    r.bits[i] = to_bits((2.f * u - 1.f) * scale, t);
    r.values[i] = from_bits(r.bits[i], t);
  }
  return r;
}

// acc[m, n] = sum_k x[m, k] w[n, k] in double, for m < M.
std::vector<double> reference_acc(const std::vector<float>& x, const std::vector<float>& w, int M, int N, int K) {
  std::vector<double> acc(size_t(M) * N);
#pragma omp parallel for schedule(dynamic, 16)
  for (int n = 0; n < N; ++n) {
    const float* wr = w.data() + size_t(n) * K;
    for (int m = 0; m < M; ++m) {
      const float* xr = x.data() + size_t(m) * K;
      double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      int k = 0;
      for (; k + 4 <= K; k += 4) {
        s0 += double(wr[k]) * xr[k];
        s1 += double(wr[k + 1]) * xr[k + 1];
        s2 += double(wr[k + 2]) * xr[k + 2];
        s3 += double(wr[k + 3]) * xr[k + 3];
      }
      for (; k < K; ++k) s0 += double(wr[k]) * xr[k];
      acc[size_t(m) * N + n] = (s0 + s1) + (s2 + s3);
    }
  }
  return acc;
}

// The expected output of `epi` for the first M rows (acc computed for >= M rows with row stride N).
std::vector<double> expected(const std::vector<double>& acc, const float* bias, const std::vector<float>& y0, int M,
                             int N, Epilogue epi) {
  if (epi == Epilogue::SwiGLU) {
    const int F = N / 2;
    std::vector<double> out(size_t(M) * F);
    for (int m = 0; m < M; ++m)
      for (int f = 0; f < F; ++f) {
        const double g = acc[size_t(m) * N + f] + (bias ? bias[f] : 0.0);
        const double u = acc[size_t(m) * N + F + f] + (bias ? bias[F + f] : 0.0);
        out[size_t(m) * F + f] = g / (1.0 + std::exp(-g)) * u;
      }
    return out;
  }
  std::vector<double> out(size_t(M) * N);
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      double v = acc[size_t(m) * N + n] + (bias ? bias[n] : 0.0);
      if (epi == Epilogue::AddF32) v += y0[size_t(m) * N + n];
      out[size_t(m) * N + n] = v;
    }
  return out;
}

// One problem on the device: x [Mmax, K], W [N, K], bias [N] (16-bit), y big enough for any
// epilogue, y0 the fp32 values AddF32 starts from.
struct Problem {
  int Mmax, N, K;
  DType t;
  Random16 x, w, b;
  std::vector<float> y0;
  std::vector<double> acc;  // reference x . W^T, [Mmax, N]
  DeviceBuffer<uint16_t> dx, dw, db;
  DeviceBuffer<float> dy;  // fp32-sized: also holds the 16-bit outputs

  Problem(int Mmax_, int N_, int K_, DType t_)
      : Mmax(Mmax_), N(N_), K(K_), t(t_),
        x(random16(size_t(Mmax_) * K_, t_, 1.f)),
        w(random16(size_t(N_) * K_, t_, 1.f / std::sqrt(float(K_)))),
        b(random16(size_t(N_), t_, 0.5f)),
        dx(x.bits), dw(w.bits), db(b.bits), dy(size_t(Mmax_) * N_) {
    // AddF32's starting values: a tenth of the product's scale (~0.58 rms), so that a kernel that
    // leaves y unchanged or adds the wrong thing fails by far.
    Random16 r = random16(size_t(Mmax_) * N_, DType::F16, 0.1f);
    y0 = std::move(r.values);
    acc = reference_acc(x.values, w.values, Mmax, N, K);
  }

  // Runs `launch` (which writes dy) for the first M rows under `epi` and compares with the reference.
  double check(int M, Epilogue epi, bool with_bias, const std::function<void()>& launch, const std::string& what) {
    const bool f32 = f32_out(epi);
    const size_t n_out = size_t(M) * (epi == Epilogue::SwiGLU ? N / 2 : N);
    if (epi == Epilogue::AddF32) {
      std::vector<float> init(y0.begin(), y0.begin() + size_t(M) * N);
      cuda_ok(cudaMemcpy(dy.get(), init.data(), init.size() * 4, cudaMemcpyHostToDevice), "upload y0");
    } else {
      dy.poison();
    }
    launch();
    sync(what);
    std::vector<float> out(n_out);
    if (f32) {
      cuda_ok(cudaMemcpy(out.data(), dy.get(), n_out * 4, cudaMemcpyDeviceToHost), "download y");
    } else {
      std::vector<uint16_t> h(n_out);
      cuda_ok(cudaMemcpy(h.data(), dy.get(), n_out * 2, cudaMemcpyDeviceToHost), "download y");
      for (size_t i = 0; i < n_out; ++i) out[i] = from_bits(h[i], t);
    }
    const std::vector<double> ref = expected(acc, with_bias ? b.values.data() : nullptr, y0, M, N, epi);
    std::vector<float> ref_f(ref.begin(), ref.end());
    return expect_close(out, ref_f, Tolerance{}, what);
  }
};

std::string describe(const char* kernel, int M, int N, int K, DType t, Epilogue e, bool bias) {
  return std::string(kernel) + " M " + std::to_string(M) + " N " + std::to_string(N) + " K " + std::to_string(K) +
         " " + name(t) + " " + epi_name(e) + (bias ? " +bias" : "");
}

int sm_count() {
  int dev = 0, n = 0;
  cuda_ok(cudaGetDevice(&dev), "cudaGetDevice");
  cuda_ok(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute");
  return n;
}

// A zeroed workspace as large as any flat_gemm plan of these tests needs (flat_gemm.h: zeroed once).
class Workspace {
 public:
  explicit Workspace(size_t bytes) : buf_(std::max<size_t>(bytes, 16384) / 4 + 1) {
    cuda_ok(cudaMemset(buf_.get(), 0, buf_.size() * 4), "cudaMemset workspace");
  }
  void* get() const { return buf_.get(); }
  size_t bytes() const { return buf_.size() * 4; }
  // The semaphores (the first 16 KB) are all zero again.
  bool semaphores_zero() const {
    std::vector<uint32_t> h(4096);
    cuda_ok(cudaMemcpy(h.data(), buf_.get(), h.size() * 4, cudaMemcpyDeviceToHost), "download semaphores");
    for (uint32_t v : h)
      if (v != 0) return false;
    return true;
  }

 private:
  DeviceBuffer<uint32_t> buf_;
};

size_t max_workspace(int Mmax, int N, int K) {
  size_t bytes = 0;
  for (int M = 1; M <= Mmax; ++M) bytes = std::max(bytes, cuda::flat_gemm_workspace_bytes(M, N, K, sm_count()));
  return bytes;
}

// Small odd shapes: N = 1 .. 2002 (odd N, N = 2 * odd F for SwiGLU), K = 8 .. 4104 (a multiple of
// 8 with tails of the 128-wide k tile), some planned with split-K (few tiles, long K).
struct Shape {
  int N, K;
};
constexpr Shape kOddShapes[] = {{1, 8}, {7, 72}, {33, 1000}, {66, 136}, {1000, 72}, {2002, 1000}, {130, 4104}};

// ================================================================================================
// flat GEMM
// ================================================================================================

TEST_F(CudaKernels, FlatGemmEveryMOddShapesEveryEpilogue) {
  for (DType t : kTypes) {
    for (const Shape s : kOddShapes) {
      Problem p(cuda::kFlatGemmMaxM, s.N, s.K, t);
      Workspace ws(max_workspace(cuda::kFlatGemmMaxM, s.N, s.K));
      for (int M = 1; M <= cuda::kFlatGemmMaxM; ++M) {
        for (Epilogue e : kEpilogues) {
          if (e == Epilogue::SwiGLU && s.N % 2 != 0) continue;
          const bool bias = (M + int(e)) % 2 == 0;
          p.check(M, e, bias,
                  [&] {
                    cuda::flat_gemm(p.dx.get(), p.dw.get(), bias ? p.db.get() : nullptr, p.dy.get(), M, s.N, s.K, t,
                                    e, ws.get(), ws.bytes(), nullptr);
                  },
                  describe("flat_gemm", M, s.N, s.K, t, e, bias));
        }
      }
      EXPECT_TRUE(ws.semaphores_zero()) << "N " << s.N << " K " << s.K;
    }
  }
}

// Every compiled pipeline depth and forced split counts (1 .. k_tiles, uneven K ranges) on each
// m_tiles variant.
TEST_F(CudaKernels, FlatGemmForcedPlansSplitsAndStages) {
  const int N = 200, K = 2056;  // 4 tiles (one partial), 17 k tiles (the last partial)
  for (DType t : kTypes) {
    Problem p(cuda::kFlatGemmMaxM, N, K, t);
    for (int M : {1, 8, 9, 16, 17, 32, 33, 64}) {
      for (int stages : {3, 4, 6}) {
        if (M > 32 && stages != 3) continue;  // m_tiles 8: 3 stages only (flat_gemm_plan)
        for (int splits : {1, 2, 3, 7, 17}) {
          const auto plan = cuda::flat_gemm_plan(M, N, K, sm_count(), splits, stages);
          ASSERT_EQ(plan.splits, splits);
          Workspace ws(plan.workspace_bytes);
          const Epilogue e = kEpilogues[(stages + splits + M) % 4];
          p.check(M, e, true,
                  [&] {
                    cuda::flat_gemm(plan, p.dx.get(), p.dw.get(), p.db.get(), p.dy.get(), M, N, K, t, e, ws.get(),
                                    ws.bytes(), nullptr);
                  },
                  describe("flat_gemm", M, N, K, t, e, true) + " stages " + std::to_string(stages) + " splits " +
                      std::to_string(splits));
          if (splits > 1) EXPECT_TRUE(ws.semaphores_zero()) << "splits " << splits;
        }
      }
    }
  }
}

// Split-K replays: twice on one workspace (the semaphores must be back at zero, the results
// identical bit for bit: partials are summed in split order), then inside a CUDA graph replayed
// three times with y poisoned between replays.
TEST_F(CudaKernels, FlatGemmSplitKReplaysAndCudaGraph) {
  const int N = 4096, K = 4096, M = 16;
  const DType t = DType::BF16;
  Problem p(M, N, K, t);
  const auto plan = cuda::flat_gemm_plan(M, N, K, sm_count());
  ASSERT_GT(plan.splits, 1) << "expected a split-K plan for [4096, 4096] at M = 16";
  ASSERT_EQ(plan.workspace_bytes, cuda::flat_gemm_workspace_bytes(M, N, K, sm_count()));
  Workspace ws(plan.workspace_bytes);
  std::vector<uint16_t> first;
  for (int rep = 0; rep < 2; ++rep) {
    p.check(M, Epilogue::Store, true,
            [&] {
              cuda::flat_gemm(p.dx.get(), p.dw.get(), p.db.get(), p.dy.get(), M, N, K, t, Epilogue::Store, ws.get(),
                              ws.bytes(), nullptr);
            },
            describe("flat_gemm", M, N, K, t, Epilogue::Store, true) + " replay " + std::to_string(rep));
    EXPECT_TRUE(ws.semaphores_zero()) << "after launch " << rep;
    std::vector<uint16_t> y(size_t(M) * N);
    cuda_ok(cudaMemcpy(y.data(), p.dy.get(), y.size() * 2, cudaMemcpyDeviceToHost), "download");
    if (rep == 0) first = y;
    else EXPECT_EQ(std::memcmp(first.data(), y.data(), y.size() * 2), 0) << "split-K results differ between launches";
  }

  // Graph: a SwiGLU launch into its own buffer, then an AddF32 launch into p.dy, both split-K on
  // the same workspace (the second finds the semaphores the first left at zero).
  DeviceBuffer<uint16_t> y_swiglu(size_t(M) * N / 2);
  const std::vector<double> ref_swiglu = expected(p.acc, p.b.values.data(), p.y0, M, N, Epilogue::SwiGLU);
  cudaStream_t stream = nullptr;
  cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  cuda_ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "begin capture");
  cuda::flat_gemm(p.dx.get(), p.dw.get(), p.db.get(), y_swiglu.get(), M, N, K, t, Epilogue::SwiGLU, ws.get(),
                  ws.bytes(), stream);
  cuda::flat_gemm(p.dx.get(), p.dw.get(), nullptr, p.dy.get(), M, N, K, t, Epilogue::AddF32, ws.get(), ws.bytes(),
                  stream);
  cuda_ok(cudaStreamEndCapture(stream, &graph), "end capture");
  cuda_ok(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  for (int rep = 0; rep < 3; ++rep) {
    y_swiglu.poison();
    p.check(M, Epilogue::AddF32, false,  // check() sets p.dy to y0 first
            [&] {
              cuda_ok(cudaGraphLaunch(exec, stream), "graph launch");
              cuda_ok(cudaStreamSynchronize(stream), "graph sync");
            },
            "flat_gemm-graph AddF32 replay " + std::to_string(rep));
    const auto h = y_swiglu.download();
    std::vector<float> out(h.size()), ref(ref_swiglu.begin(), ref_swiglu.end());
    for (size_t i = 0; i < h.size(); ++i) out[i] = from_bits(h[i], t);
    expect_close(out, ref, Tolerance{}, "flat_gemm-graph SwiGLU replay " + std::to_string(rep));
    EXPECT_TRUE(ws.semaphores_zero()) << "after graph replay " << rep;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// Planning only (no GPU): the workspace bound that callers reserve before they know their N is at
// least every plan's workspace, and not far above the largest of them.
TEST(FlatGemmPlanning, WorkspaceBoundCoversEveryShape) {
  using cuda::WeightFormat;
  for (const int sms : {114, 132})
    for (const WeightFormat f : {WeightFormat::Bits16, WeightFormat::Fp8, WeightFormat::Int4, WeightFormat::GgufQ4K,
                                 WeightFormat::GgufQ6K, WeightFormat::GgufQ5K, WeightFormat::GgufQ4_0,
                                 WeightFormat::GgufQ4_1, WeightFormat::GgufQ8_0})
      for (const int max_m : {1, 3, 8, 33, 64}) {
        const size_t bound = cuda::flat_gemm_workspace_bound(max_m, sms, f);
        size_t largest = 0;
        for (int m = 1; m <= max_m; ++m)
          for (const int K : {256, 4096, 14336, 28672})
            for (int n = 1; n <= 64 * (sms + 2); n += n < 256 ? 7 : 64) {
              const size_t ws = cuda::flat_gemm_workspace_bytes(m, n, K, sms, f);
              ASSERT_LE(ws, bound) << "M " << m << " N " << n << " K " << K << " SMs " << sms << " format "
                                   << static_cast<int>(f);
              largest = std::max(largest, ws);
            }
        EXPECT_LE(bound, 2 * largest + 16384) << "max M " << max_m << " SMs " << sms << " format "
                                              << static_cast<int>(f);
      }
  EXPECT_NE(error_of([] { cuda::flat_gemm_workspace_bound(0, 132); }).find("max_m = 0"), std::string::npos);
}

TEST_F(CudaKernels, FlatGemmRejectsBadArguments) {
  DeviceBuffer<uint16_t> buf(1 << 16);
  void* q = buf.get();
  auto fg = [&](int M, int N, int K, Epilogue e, void* ws, size_t wsb) {
    cuda::flat_gemm(q, q, nullptr, q, M, N, K, DType::F16, e, ws, wsb, nullptr);
  };
  EXPECT_NE(error_of([&] { fg(1, 16, 100, Epilogue::Store, nullptr, 0); }).find("K = 100 is not a multiple of 8"),
            std::string::npos);
  EXPECT_NE(error_of([&] { fg(1, 16, 7, Epilogue::Store, nullptr, 0); }).find("multiple of 8"), std::string::npos);
  EXPECT_NE(error_of([&] { fg(0, 16, 64, Epilogue::Store, nullptr, 0); }).find("M = 0"), std::string::npos);
  EXPECT_NE(error_of([&] { fg(65, 16, 64, Epilogue::Store, nullptr, 0); }).find("M = 65"), std::string::npos);
  EXPECT_NE(error_of([&] { fg(1, 15, 64, Epilogue::SwiGLU, nullptr, 0); }).find("SwiGLU"), std::string::npos);
  EXPECT_NE(error_of([&] {
              cuda::flat_gemm(static_cast<char*>(q) + 2, q, nullptr, q, 1, 16, 64, DType::F16, Epilogue::Store,
                              nullptr, 0, nullptr);
            }).find("aligned"),
            std::string::npos);
  // A split-K plan without (enough) workspace.
  const auto plan = cuda::flat_gemm_plan(1, 16, 4096, sm_count());
  ASSERT_GT(plan.splits, 1);
  EXPECT_NE(error_of([&] {
              cuda::flat_gemm(plan, q, q, nullptr, q, 1, 16, 4096, DType::F16, Epilogue::Store, nullptr, 0, nullptr);
            }).find("workspace"),
            std::string::npos);
  EXPECT_EQ(cuda::flat_gemm_workspace_bytes(1, 16, 4096, sm_count()), plan.workspace_bytes);
  EXPECT_NE(error_of([&] { cuda::flat_gemm_plan(64, 16, 4096, sm_count(), 0, 4); }).find("3 stages only"),
            std::string::npos);
  EXPECT_EQ(cuda::flat_gemm_workspace_bytes(16, 22016, 4096, sm_count()), 0u) << "no split expected";
  // gemv_ex
  EXPECT_NE(error_of([&] { cuda::gemv_ex(q, q, nullptr, q, 1, 16, 100, DType::F16, Epilogue::Store, nullptr); })
                .find("K = 100 is not a multiple of 8"),
            std::string::npos);
  EXPECT_NE(error_of([&] { cuda::gemv_ex(q, q, nullptr, q, 9, 16, 64, DType::F16, Epilogue::Store, nullptr); })
                .find("M = 9"),
            std::string::npos);
  sync("(no launch expected)");
}

// ================================================================================================
// GEMV with epilogues
// ================================================================================================

TEST_F(CudaKernels, GemvExEveryMOddShapesEveryEpilogue) {
  for (DType t : kTypes) {
    for (const Shape s : kOddShapes) {
      Problem p(cuda::kGemvMaxM, s.N, s.K, t);
      for (int M = 1; M <= cuda::kGemvMaxM; ++M) {
        for (Epilogue e : kEpilogues) {
          if (e == Epilogue::SwiGLU && s.N % 2 != 0) continue;
          for (bool bias : {false, true}) {
            p.check(M, e, bias,
                    [&] {
                      cuda::gemv_ex(p.dx.get(), p.dw.get(), bias ? p.db.get() : nullptr, p.dy.get(), M, s.N, s.K, t,
                                    e, nullptr);
                    },
                    describe("gemv_ex", M, s.N, s.K, t, e, bias));
          }
        }
      }
    }
  }
}

// The plain gemv() of kernels.h now runs gemv_ex's kernel on its fast path: the same checks
// through its own signature (the old kernel keeps K % 8 != 0, see test_cuda_engine.cpp).
TEST_F(CudaKernels, GemvPlainApiOnFastPath) {
  for (DType t : kTypes) {
    Problem p(cuda::kGemvMaxM, 1001, 4096, t);
    for (int M = 1; M <= cuda::kGemvMaxM; ++M)
      for (bool f32 : {false, true})
        p.check(M, f32 ? Epilogue::StoreF32 : Epilogue::Store, true,
                [&] { cuda::gemv(p.dx.get(), p.dw.get(), p.db.get(), p.dy.get(), M, 1001, 4096, t, f32, nullptr); },
                describe("gemv", M, 1001, 4096, t, f32 ? Epilogue::StoreF32 : Epilogue::Store, true));
  }
}

// ================================================================================================
// the five preset models' shapes
// ================================================================================================

struct ModelShape {
  const char* what;
  int N, K;
  Epilogue epi;
  bool bias;
};
// From configs/*.json: QKV fused [(H + 2 KVH) * D, hidden], O [hidden, H * D], gate+up fused
// [2 * FF, hidden] (SwiGLU; OPT: fc1 [FF, hidden], ReLU applied after a Store), down [hidden, FF].
// Shapes repeated across models ([4096, 4096], [12288, 4096]) are listed once.
constexpr ModelShape kModelShapes[] = {
    {"llama-2-7b qkv", 12288, 4096, Epilogue::Store, false},  // also opt-6.7b qkv (bias below)
    {"llama-2-7b o", 4096, 4096, Epilogue::AddF32, false},    // also llama-3-8b, opt, chatglm2 o
    {"llama-2-7b gate_up", 22016, 4096, Epilogue::SwiGLU, false},
    {"llama-2-7b down", 4096, 11008, Epilogue::AddF32, false},
    {"llama-2-13b qkv", 15360, 5120, Epilogue::Store, false},
    {"llama-2-13b o", 5120, 5120, Epilogue::AddF32, false},
    {"llama-2-13b gate_up", 27648, 5120, Epilogue::SwiGLU, false},
    {"llama-2-13b down", 5120, 13824, Epilogue::AddF32, false},
    {"llama-3-8b qkv", 6144, 4096, Epilogue::Store, false},
    {"llama-3-8b gate_up", 28672, 4096, Epilogue::SwiGLU, false},
    {"llama-3-8b down", 4096, 14336, Epilogue::AddF32, false},
    {"opt-6.7b fc1", 16384, 4096, Epilogue::Store, true},
    {"opt-6.7b fc2", 4096, 16384, Epilogue::AddF32, true},
    {"chatglm2-6b qkv", 4608, 4096, Epilogue::Store, true},
    {"chatglm2-6b gate_up", 27392, 4096, Epilogue::SwiGLU, false},
    {"chatglm2-6b down", 4096, 13696, Epilogue::AddF32, false},
};

TEST_F(CudaKernels, FlatGemmAndGemvOnPresetModelShapes) {
  int index = 0;
  for (const ModelShape& s : kModelShapes) {
    const DType t = kTypes[index++ % 2];
    Problem p(cuda::kFlatGemmMaxM, s.N, s.K, t);
    Workspace ws(max_workspace(cuda::kFlatGemmMaxM, s.N, s.K));
    for (int M : {1, 2, 8, 13, 16, 32, 64}) {
      p.check(M, s.epi, s.bias,
              [&] {
                cuda::flat_gemm(p.dx.get(), p.dw.get(), s.bias ? p.db.get() : nullptr, p.dy.get(), M, s.N, s.K, t,
                                s.epi, ws.get(), ws.bytes(), nullptr);
              },
              describe("flat_gemm", M, s.N, s.K, t, s.epi, s.bias) + " (" + s.what + ")");
      if (M > cuda::kGemvMaxM) continue;
      p.check(M, s.epi, s.bias,
              [&] {
                cuda::gemv_ex(p.dx.get(), p.dw.get(), s.bias ? p.db.get() : nullptr, p.dy.get(), M, s.N, s.K, t,
                              s.epi, nullptr);
              },
              describe("gemv_ex", M, s.N, s.K, t, s.epi, s.bias) + " (" + s.what + ")");
    }
    EXPECT_TRUE(ws.semaphores_zero()) << s.what;
  }
}

}  // namespace
}  // namespace fdpp::test
