// 4-bit weights on the GPU (backend/cuda/int4.h): the quantizer bit for bit against the host's
// arithmetic; LinearDispatcher::run_int4 (the flat GEMM over q4 words up to 64 rows, dequantization
// and cuBLASLt above, act-order's gathered x) with every epilogue and group size against an fp64
// reference over the same dequantized 16-bit weights; the AWQ and GPTQ act-order fixtures
// (tests/fixtures/int4) against the CPU engine on the same checkpoint; and --quantization int4 on a
// tiny model against the CPU over the weights the GPU computes with. Skipped without a GPU.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "backend/cpu/cpu_engine.h"
#include "backend/cuda/cuda_engine.h"
#include "backend/cuda/device_model.h"
#include "backend/cuda/int4.h"
#include "backend/cuda/linear_dispatch.h"
#include "gpu/engine_steps.h"
#include "gpu/gpu_test_util.h"
#include "model/model_loader.h"
#include "runtime/backend_select.h"
#include "tiny_model.h"

namespace fdpp::test {
namespace {

using cuda::Epilogue;

class Int4Gpu : public CudaKernels {};

// A 4-bit matrix on the host in int4.h's layout, with its weights dequantized as the GPU does
// (((q - z) * scale) rounded once to the 16-bit type).
struct HostInt4 {
  int N = 0, K = 0, group_size = 0, stride = 0;
  std::vector<uint32_t> q4, zs;
  std::vector<float> w;  // [N, K] in the words' column order

  uint32_t nibble(int n, int k) const {
    return (q4[size_t(n) * (K / 8) + k / 8] >> (4 * ((k % 8) >> 1) + 16 * (k & 1))) & 15;
  }
};

float zs_scale(uint32_t word, DType t) { return from_bits(static_cast<uint16_t>(word & 0xFFFF), t); }
int zs_zero(uint32_t word, DType t) {
  return int(from_bits(static_cast<uint16_t>(word >> 16), t)) - (t == DType::F16 ? 1024 : 128);
}

void fill_weights(HostInt4& h, DType t) {
  h.w.assign(size_t(h.N) * h.K, 0.f);
  for (int n = 0; n < h.N; ++n)
    for (int k = 0; k < h.K; ++k) {
      const uint32_t word = h.zs[size_t(n) * h.stride + (h.group_size > 0 ? k / h.group_size : 0)];
      const float v = (float(h.nibble(n, k)) - float(zs_zero(word, t))) * zs_scale(word, t);
      h.w[size_t(n) * h.K + k] = from_bits(to_bits(v, t), t);
    }
}

HostInt4 random_int4(int N, int K, int group_size, DType t) {
  HostInt4 h;
  h.N = N;
  h.K = K;
  h.group_size = group_size;
  h.stride = cuda::int4_zs_stride(K, group_size);
  h.q4.resize(size_t(N) * (K / 8));
  for (uint32_t& w : h.q4) w = static_cast<uint32_t>(rng()());
  const int groups = group_size > 0 ? (K + group_size - 1) / group_size : 1;
  h.zs.assign(size_t(N) * h.stride, 0u);
  std::uniform_real_distribution<float> scale(0.002f, 0.02f);
  for (int n = 0; n < N; ++n)
    for (int g = 0; g < groups; ++g) {
      const int z = int(rng()() % 16);
      h.zs[size_t(n) * h.stride + g] = to_bits(scale(rng()), t) | (uint32_t(cuda::int4_zero_bits(z, t)) << 16);
    }
  fill_weights(h, t);
  return h;
}

// The quantizer on the host (int4.h's formula).
HostInt4 quantize_host(const std::vector<float>& w, int N, int K, DType t) {
  HostInt4 h;
  h.N = N;
  h.K = K;
  h.group_size = 128;
  h.stride = cuda::int4_zs_stride(K, 128);
  h.q4.assign(size_t(N) * (K / 8), 0u);
  h.zs.assign(size_t(N) * h.stride, 0u);
  for (int n = 0; n < N; ++n)
    for (int g = 0; g < K / 128; ++g) {
      const float* v = w.data() + size_t(n) * K + g * 128;
      const float mn = std::min(0.f, *std::min_element(v, v + 128)), mx = std::max(0.f, *std::max_element(v, v + 128));
      const uint16_t s_bits = to_bits(std::max(mx - mn, 1e-5f) / 15.f, t);
      const float s = from_bits(s_bits, t);
      const int z = std::clamp(int(std::nearbyint(-mn / s)), 0, 15);
      h.zs[size_t(n) * h.stride + g] = s_bits | (uint32_t(cuda::int4_zero_bits(z, t)) << 16);
      for (int i = 0; i < 128; ++i) {
        const int k = g * 128 + i;
        const uint32_t q = uint32_t(std::clamp(int(std::nearbyint(v[i] / s)) + z, 0, 15));
        h.q4[size_t(n) * (K / 8) + k / 8] |= q << (4 * ((k % 8) >> 1) + 16 * (k & 1));
      }
    }
  fill_weights(h, t);
  return h;
}

TEST_F(Int4Gpu, QuantizerMatchesTheHostBitForBit) {
  const int N = 96, K = 384;
  for (DType t : {DType::F16, DType::BF16}) {
    std::vector<float> wf;
    std::vector<uint16_t> wbits = random_bits(size_t(N) * K, t, wf, 0.05f);
    // A constant group and an all-zero one (the scale floor), and a group of one sign.
    for (int i = 0; i < 128; ++i) {
      wbits[i] = to_bits(0.25f, t);
      wbits[128 + i] = to_bits(0.f, t);
      wbits[size_t(K) + i] = to_bits(std::fabs(from_bits(wbits[size_t(K) + i], t)) + 0.1f, t);
    }
    wf = from_bits(wbits, t);
    const HostInt4 h = quantize_host(wf, N, K, t);
    DeviceBuffer<uint16_t> w(wbits);
    DeviceBuffer<uint32_t> q4(h.q4.size()), zs(h.zs.size());
    cuda_ok(cudaMemset(zs.get(), 0, zs.size() * 4), "memset");
    cuda::quantize_int4(w.get(), N, K, t, q4.get(), zs.get(), nullptr);
    sync("quantize_int4");
    EXPECT_EQ(q4.download(), h.q4) << name(t);
    EXPECT_EQ(zs.download(), h.zs) << name(t);
    // And the round trip stays within half a step of its group (plus the 16-bit rounding of the
    // scale, 15 steps away at most, and of the value).
    for (int n = 0; n < N; ++n)
      for (int k = 0; k < K; ++k) {
        const float s = zs_scale(h.zs[size_t(n) * h.stride + k / 128], t);
        const double err = std::fabs(double(h.w[size_t(n) * K + k]) - wf[size_t(n) * K + k]);
        ASSERT_LE(err, 0.5 * s + 16 * s * unit_roundoff(t) + std::fabs(wf[size_t(n) * K + k]) * unit_roundoff(t))
            << name(t) << " row " << n << " column " << k;
      }
  }
}

// run_int4 at M rows against fp64 over the dequantized 16-bit weights. K = 800: a K tail inside the
// flat GEMM's 128-wide stages, and inside a group for groups of 64 and 128.
TEST_F(Int4Gpu, RunInt4MatchesTheReferenceForEveryEpilogueAndGroupSize) {
  const int K = 800, N = 1008;
  struct Case {
    DType t;
    int group_size;
    bool act_order;
    LinearMode mode;
    std::vector<int> rows;
  };
  const std::vector<Case> cases = {
      {DType::F16, 128, false, LinearMode::Auto, {1, 2, 8, 13, 64, 100}},
      {DType::BF16, 128, false, LinearMode::Auto, {1, 5, 16, 33, 64, 130}},
      {DType::F16, 32, false, LinearMode::Auto, {1, 9, 40}},
      {DType::BF16, 64, false, LinearMode::Auto, {3, 17, 70}},
      {DType::F16, 0, false, LinearMode::Auto, {1, 24}},  // one group per row
      {DType::BF16, 32, true, LinearMode::Auto, {1, 7, 65}},  // act-order: x gathered first
      {DType::F16, 128, false, LinearMode::Cublas, {1, 8}},  // dequantized for cuBLASLt at any M
  };
  for (const auto& [t, gs, act_order, mode, rows] : cases) {
    LinearChooser chooser;
    chooser.set_mode(mode);
    cuda::LinearDispatcher dispatcher(t, chooser);
    const HostInt4 h = random_int4(N, K, gs, t);
    std::vector<int32_t> perm(K);
    std::iota(perm.begin(), perm.end(), 0);
    if (act_order) std::shuffle(perm.begin(), perm.end(), rng());
    std::vector<float> bf;
    const std::vector<uint16_t> bbits = random_bits(N, t, bf, 0.1f);
    DeviceBuffer<uint32_t> q4(h.q4), zs(h.zs);
    DeviceBuffer<int32_t> dperm(perm);
    DeviceBuffer<uint16_t> bias(bbits);
    const cuda::Int4Matrix m{zs.get(), act_order ? dperm.get() : nullptr, gs, h.stride};
    for (int M : rows) {
      std::vector<float> xf;
      const std::vector<uint16_t> xbits = random_bits(size_t(M) * K, t, xf);
      DeviceBuffer<uint16_t> x(xbits);
      std::vector<double> dot(size_t(M) * N);
      for (int r = 0; r < M; ++r)
        for (int n = 0; n < N; ++n) {
          double s = 0;
          for (int k = 0; k < K; ++k) s += double(xf[size_t(r) * K + perm[k]]) * h.w[size_t(n) * K + k];
          dot[size_t(r) * N + n] = s;
        }
      const LinearImpl expected =
          M <= cuda::kFlatGemmMaxM && mode != LinearMode::Cublas ? LinearImpl::Flat : LinearImpl::Cublas;
      EXPECT_EQ(dispatcher.int4_choice(M), expected) << "M = " << M;
      for (Epilogue ep : {Epilogue::Store, Epilogue::StoreF32, Epilogue::AddF32, Epilogue::SwiGLU}) {
        for (bool with_bias : {false, true}) {
          const int cols = ep == Epilogue::SwiGLU ? N / 2 : N;
          std::vector<float> init(size_t(M) * cols, 0.f), out;
          if (ep == Epilogue::AddF32) init = random_vector(init.size());
          const bool f32 = ep == Epilogue::StoreF32 || ep == Epilogue::AddF32;
          const std::string what = std::string("run_int4 ") + name(t) + " group " + std::to_string(gs) +
                                   (act_order ? " act-order" : "") + " " + linear_mode_name(mode) +
                                   " M=" + std::to_string(M) + " " + epilogue_name(ep) + (with_bias ? " bias" : "");
          if (f32) {
            DeviceBuffer<float> y(init.size());
            if (ep == Epilogue::AddF32) y.upload(init);
            else y.poison();
            dispatcher.run_int4(x.get(), q4.get(), m, with_bias ? bias.get() : nullptr, y.get(), M, N, K, t, ep,
                                nullptr);
            sync(what);
            out = y.download();
          } else {
            DeviceBuffer<uint16_t> y(init.size());
            y.poison();
            dispatcher.run_int4(x.get(), q4.get(), m, with_bias ? bias.get() : nullptr, y.get(), M, N, K, t, ep,
                                nullptr);
            sync(what);
            out = from_bits(y.download(), t);
          }
          std::vector<float> ref(size_t(M) * cols);
          for (int r = 0; r < M; ++r)
            for (int j = 0; j < cols; ++j) {
              const float a = float(dot[size_t(r) * N + j] + (with_bias ? bf[j] : 0.f));
              const float u = ep != Epilogue::SwiGLU
                                  ? 0.f
                                  : float(dot[size_t(r) * N + cols + j] + (with_bias ? bf[cols + j] : 0.f));
              ref[size_t(r) * cols + j] = ep == Epilogue::SwiGLU   ? a / (1.f + std::exp(-a)) * u
                                          : ep == Epilogue::AddF32 ? init[size_t(r) * cols + j] + a
                                                                   : a;
            }
          // The same 16-bit weights summed in fp32 in another order, and one or two roundings to 16
          // bits (SwiGLU after cuBLASLt rounds gate and up first).
          expect_close(out, ref, {t == DType::F16 ? 1e-5 : 5e-5, 0, 0}, what);
        }
      }
    }
  }
}

TEST_F(Int4Gpu, RefusesGroupSizesTheKernelsDoNotTake) {
  EXPECT_EQ(cuda::int4_group_problem(4096, 128), nullptr);
  EXPECT_EQ(cuda::int4_group_problem(4096, 0), nullptr);
  EXPECT_NE(cuda::int4_group_problem(4096, 96), nullptr);
  EXPECT_NE(cuda::int4_group_problem(4096, 384), nullptr);  // would straddle a 256-k stage
  EXPECT_NE(cuda::int4_group_problem(4016, 128), nullptr);  // rows not a multiple of 32
}

// The AWQ (bf16 model, group 32) and GPTQ act-order (f16 model, group 32, q/k/v and gate/up sharing
// a permutation) fixtures: repacked from the checkpoint by the loader, run by the 4-bit kernels,
// against the CPU engine over the same checkpoint (fp32 weights, exactly (q - z) * scale).
TEST_F(Int4Gpu, CheckpointStepsMatchTheCpuEngine) {
  for (const char* name : {"llama_awq_g32", "llama_gptq_actorder"}) {
    SCOPED_TRACE(name);
    const std::string dir = fixture(std::string("int4/") + name);
    const PlannedModel p = plan_model(dir);
    const ModelConfig& c = p.config();
    const LoadedModel cpu_model = load_model(dir);
    const EngineLimits l = small_step_limits(c, 1024);
    CpuEngine cpu(c, cpu_model.weights, l);
    std::unique_ptr<Engine> gpu = plan_gpu_engine(c, p.plan, l);
    // A prefill step of 80+ tokens a row (above 64 rows: dequantized for cuBLASLt), then decode
    // steps of three rows (the flat GEMM over the words).
    step_engines_alike({&cpu, gpu.get()}, c.vocab_size, 3, 120, {80, 1, 1, 1},
                       [&](size_t st, const std::vector<StepOutput>& o) {
      for (int r = 0; r < 3; ++r) {
        const double e = nmse(row_logits(o[1], r, c.vocab_size), row_logits(o[0], r, c.vocab_size));
        // 16-bit weights (one rounding of the CPU's fp32 ones) and activations: the HF fixtures'
        // 16-bit bounds; a wrong nibble order, zero or permutation gives O(1).
        EXPECT_LE(e, 2e-3) << "step " << st << " row " << r;
        std::printf("int4 checkpoint %s step %zu row %d: NMSE %.3e\n", name, st, r, e);
      }
    });
  }
}

// --quantization int4 on a tiny model: the GPU's own quantizer, against the CPU engine over the
// weights the GPU then computes with (each layer matrix rounded to 16 bits, quantized on the host
// the same way and dequantized).
TEST_F(Int4Gpu, QuantizedModelStepsMatchTheCpuOverDequantizedWeights) {
  for (DType t : {DType::F16, DType::BF16}) {
    ModelConfig c = tiny("llama", 128);
    c.ffn_hidden = 3 * c.hidden;  // rows of 128 weights for down as well
    const DecoderWeights w = random_weights(c);
    DecoderWeights wd = w;
    for (LayerWeights& L : wd.layers)
      for (Weight* m : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_up, &L.w_down, &L.w_gate}) {
        const int rows = int(m->shape[0]), K = int(m->shape[1]);
        std::vector<float> v(m->data.begin(), m->data.end());
        for (float& x : v) x = from_bits(to_bits(x, t), t);
        const HostInt4 h = quantize_host(v, rows, K, t);
        std::copy(h.w.begin(), h.w.end(), m->data.begin());
      }
    CpuEngine cpu(c, wd, small_step_limits(c));
    cuda::DeviceModel dm(c, w, t);
    dm.quantize_int4();
    ASSERT_TRUE(dm.int4());
    EXPECT_ERROR(dm.quantize_fp8(), "already 4-bit");
    cuda::CudaEngine gpu(std::make_shared<const cuda::DeviceModel>(std::move(dm)), small_step_cuda_options());
    step_engines_alike({&cpu, &gpu}, c.vocab_size, 3, 120, {70, 1, 1},
                       [&](size_t st, const std::vector<StepOutput>& o) {
      EXPECT_LE(nmse(o[1].logits, o[0].logits), 2e-3) << name(t) << " step " << st;
    });
  }
}

}  // namespace
}  // namespace fdpp::test
