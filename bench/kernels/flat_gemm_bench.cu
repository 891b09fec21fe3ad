// Kernel timing of decode's linear layers on the GPU: gemv_ex (ImplA), flat_gemm (ImplB) and
// cuBLASLt (ImplC, CublasLtLinear with its own tuning) on the same shapes, same buffers, one process.
//
//   fdpp_flat_gemm_bench [--quick] [--sweep]
//
// Method (DESIGN.md "Measuring"): each weight matrix is allocated in enough copies that they total
// >= 256 MB (more than 4x the H200's 60 MB L2) and filled with random values; a CUDA graph of
// kLaunches launches walks the copies round-robin; the graph is replayed kReplays times after a
// warm-up and each replay timed with events; the median replay / kLaunches is the time per call
// (launch gaps included, as in the engine's graphs). Bytes = W + x + y; % of 4.46 TB/s (the
// measured read-streaming rate) beside each time. Epilogue: Store (16-bit y), no bias.
// --sweep adds forced split counts and pipeline depths for flat_gemm on the Llama-2-7B shapes.
// The launch switches come from the environment, as the CLI's do (runtime/environment_fallback.h:
// FDPP_PDL, FDPP_LINEAR_PDL, FDPP_FLAT_SPLIT_PDL, FDPP_CUBLASLT_TUNE).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/graph_timer.h"
#include "backend/cuda/check.h"
#include "backend/cuda/flat_gemm.h"
#include "backend/cuda/linear.h"
#include "runtime/environment_fallback.h"

namespace {

using fdpp::cuda::DType;
using fdpp::cuda::Epilogue;

constexpr double kReadBandwidth = 4.46e12;
constexpr int kLaunches = 20;
constexpr int kReplays = 15;

__global__ void fill_random(uint16_t* p, size_t n, uint64_t seed, float scale) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint64_t z = seed + 0x9E3779B97F4A7C15ull * (i + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const float u = float(z >> 40) * (1.0f / 16777216.0f);
    p[i] = __half_as_ushort(__float2half_rn((2.f * u - 1.f) * scale));
  }
}

struct Shape {
  const char* name;
  int N, K;
};

struct Buffers {
  std::vector<fdpp::cuda::DeviceBuffer> w;
  fdpp::cuda::DeviceBuffer x, y, ws;
};

Buffers make_buffers(const Shape& s, int Mmax) {
  Buffers b;
  const size_t wbytes = size_t(s.N) * s.K * 2;
  const int copies = std::max<int>(2, int((256ull << 20) / wbytes + 1));
  for (int c = 0; c < copies; ++c) {
    b.w.emplace_back(wbytes);
    fill_random<<<1024, 256>>>(static_cast<uint16_t*>(b.w.back().get()), wbytes / 2, 1234 + c, 0.02f);
  }
  b.x = fdpp::cuda::DeviceBuffer(size_t(Mmax) * s.K * 2);
  fill_random<<<256, 256>>>(static_cast<uint16_t*>(b.x.get()), size_t(Mmax) * s.K, 99, 1.f);
  b.y = fdpp::cuda::DeviceBuffer(size_t(Mmax) * s.N * 4);
  size_t ws = 0;
  for (int M = 1; M <= std::min(Mmax, 64); ++M) ws = std::max(ws, fdpp::cuda::flat_gemm_workspace_bytes(M, s.N, s.K, 132));
  ws = std::max<size_t>(ws, 64u << 20);  // forced sweeps may need more
  b.ws = fdpp::cuda::DeviceBuffer(ws);
  FDPP_CUDA_CHECK(cudaMemset(b.ws.get(), 0, ws));
  FDPP_CUDA_CHECK(cudaDeviceSynchronize());
  return b;
}

// Median us per call of launch(copy) over graph replays.
template <class F>
double time_us(cudaStream_t stream, const Buffers& b, F&& launch) {
  launch(0, stream);  // outside capture: first-call setup (cuBLASLt tuning, function attributes)
  FDPP_CUDA_CHECK(cudaStreamSynchronize(stream));
  return fdpp::cuda::time_graph(stream, kLaunches, kReplays, [&](int i) { launch(i % int(b.w.size()), stream); }).us;
}

double pct(const Shape& s, int M, double us) {
  const double bytes = 2.0 * (double(s.N) * s.K + double(M) * s.K + double(M) * s.N);
  return 100.0 * bytes / (us * 1e-6) / kReadBandwidth;
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false, sweep = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) quick = true;
    if (std::strcmp(argv[i], "--sweep") == 0) sweep = true;
  }
  try {
    const fdpp::cuda::KernelOptions kernels = fdpp::resolve_kernel_options({});
    const fdpp::cuda::KernelOptionsScope kernel_scope(kernels);
    cudaDeviceProp prop{};
    FDPP_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    std::printf("# %s, %d SMs, L2 %d MB; times: median us per call (graph of %d calls, %d replays); %% of %.2f TB/s\n",
                prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20, kLaunches, kReplays,
                kReadBandwidth / 1e12);
    const int sms = prop.multiProcessorCount;
    cudaStream_t stream;
    FDPP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    fdpp::cuda::CublasLtLinear cublas;
    const DType t = DType::F16;

    const Shape llama7[] = {{"qkv", 12288, 4096}, {"o", 4096, 4096}, {"gate_up", 22016, 4096}, {"down", 4096, 11008}};
    const int Ms[] = {1, 2, 4, 8, 16, 32, 64};
    // Per M: the layer sums of each implementation.
    double layer[3][7] = {};
    std::printf("\n## Llama-2-7B shapes, fp16, Store epilogue\n");
    std::printf("%-8s %3s | %9s %6s | %9s %6s %3s %2s | %9s %6s | %s\n", "shape", "M", "gemv us", "%bw", "flat us",
                "%bw", "spl", "st", "cublas us", "%bw", "flat/cublas");
    for (const Shape& s : llama7) {
      Buffers b = make_buffers(s, 64);
      for (int mi = 0; mi < 7; ++mi) {
        const int M = Ms[mi];
        if (quick && M != 1 && M != 16) continue;
        double g = 0;
        if (M <= fdpp::cuda::kGemvMaxM) {
          g = time_us(stream, b, [&](int c, cudaStream_t st) {
            fdpp::cuda::gemv_ex(b.x.get(), b.w[c].get(), nullptr, b.y.get(), M, s.N, s.K, t, Epilogue::Store, st);
          });
        }
        const auto plan = fdpp::cuda::flat_gemm_plan(M, s.N, s.K, sms);
        const double f = time_us(stream, b, [&](int c, cudaStream_t st) {
          fdpp::cuda::flat_gemm(b.x.get(), b.w[c].get(), nullptr, b.y.get(), M, s.N, s.K, t, Epilogue::Store,
                                b.ws.get(), b.ws.bytes(), st);
        });
        const double cb = time_us(stream, b, [&](int c, cudaStream_t st) {
          cublas.run(b.x.get(), b.w[c].get(), nullptr, b.y.get(), M, s.N, s.K, t, false, st);
        });
        layer[0][mi] += g;
        layer[1][mi] += f;
        layer[2][mi] += cb;
        char gs[32] = "-", gp[16] = "-";
        if (g > 0) {
          std::snprintf(gs, sizeof gs, "%.2f", g);
          std::snprintf(gp, sizeof gp, "%.1f", pct(s, M, g));
        }
        std::printf("%-8s %3d | %9s %6s | %9.2f %6.1f %3d %2d | %9.2f %6.1f | %.3f\n", s.name, M, gs, gp, f,
                    pct(s, M, f), plan.splits, plan.stages, cb, pct(s, M, cb), cb / f);
        std::fflush(stdout);
      }
      if (sweep) {
        for (int M : {1, 16, 64}) {
          std::printf("  sweep %s M %d:", s.name, M);
          for (int stages : {3, 4, 6}) {
            if (M > 32 && stages != 3) continue;  // m_tiles 8: 3 stages only
            for (int splits : {1, 2, 3, 4, 6, 8}) {
              const auto plan = fdpp::cuda::flat_gemm_plan(M, s.N, s.K, sms, splits, stages);
              if (plan.workspace_bytes > b.ws.bytes()) continue;
              const double f = time_us(stream, b, [&](int c, cudaStream_t st) {
                fdpp::cuda::flat_gemm(plan, b.x.get(), b.w[c].get(), nullptr, b.y.get(), M, s.N, s.K, t,
                                      Epilogue::Store, b.ws.get(), b.ws.bytes(), st);
              });
              std::printf(" s%d/k%d %.2f", stages, splits, f);
            }
          }
          std::printf("\n");
          std::fflush(stdout);
        }
      }
    }
    std::printf("\n## Llama-2-7B layer (qkv + o + gate_up + down), us\n");
    std::printf("%3s | %9s | %9s | %9s | %s\n", "M", "gemv", "flat", "cublas", "cublas/best-of-ours");
    double layer_bytes = 0;
    for (const Shape& s : llama7) layer_bytes += 2.0 * s.N * s.K;
    for (int mi = 0; mi < 7; ++mi) {
      if (layer[1][mi] == 0) continue;
      const double best = layer[0][mi] > 0 ? std::min(layer[0][mi], layer[1][mi]) : layer[1][mi];
      std::printf("%3d | %9.2f | %9.2f | %9.2f | %.3f  (flat %.1f%%, cublas %.1f%% of bw)\n", Ms[mi], layer[0][mi],
                  layer[1][mi], layer[2][mi], layer[2][mi] / best, 100 * layer_bytes / (layer[1][mi] * 1e-6) / kReadBandwidth,
                  100 * layer_bytes / (layer[2][mi] * 1e-6) / kReadBandwidth);
    }

    if (!quick) {
      // Every preset model shape at M = 1 (GEMV goal: >= 90%) and M = 16 (flat goal: >= 85%).
      const Shape others[] = {{"13b qkv", 15360, 5120}, {"13b o", 5120, 5120},       {"13b gate_up", 27648, 5120},
                              {"13b down", 5120, 13824}, {"l3 qkv", 6144, 4096},     {"l3 gate_up", 28672, 4096},
                              {"l3 down", 4096, 14336},  {"opt fc1", 16384, 4096},   {"opt fc2", 4096, 16384},
                              {"glm qkv", 4608, 4096},   {"glm gate_up", 27392, 4096}, {"glm down", 4096, 13696}};
      std::printf("\n## Other preset shapes (fp16, Store)\n%-12s %3s | %9s %6s | %9s %6s | %9s %6s\n", "shape", "M",
                  "gemv us", "%bw", "flat us", "%bw", "cublas us", "%bw");
      for (const Shape& s : others) {
        Buffers b = make_buffers(s, 16);
        for (int M : {1, 16}) {
          double g = 0;
          if (M <= fdpp::cuda::kGemvMaxM)
            g = time_us(stream, b, [&](int c, cudaStream_t st) {
              fdpp::cuda::gemv_ex(b.x.get(), b.w[c].get(), nullptr, b.y.get(), M, s.N, s.K, t, Epilogue::Store, st);
            });
          const double f = time_us(stream, b, [&](int c, cudaStream_t st) {
            fdpp::cuda::flat_gemm(b.x.get(), b.w[c].get(), nullptr, b.y.get(), M, s.N, s.K, t, Epilogue::Store,
                                  b.ws.get(), b.ws.bytes(), st);
          });
          const double cb = time_us(stream, b, [&](int c, cudaStream_t st) {
            cublas.run(b.x.get(), b.w[c].get(), nullptr, b.y.get(), M, s.N, s.K, t, false, st);
          });
          std::printf("%-12s %3d | %9.2f %6.1f | %9.2f %6.1f | %9.2f %6.1f\n", s.name, M, g, g > 0 ? pct(s, M, g) : 0.0,
                      f, pct(s, M, f), cb, pct(s, M, cb));
          std::fflush(stdout);
        }
      }
    }
    cudaStreamDestroy(stream);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fdpp_flat_gemm_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
