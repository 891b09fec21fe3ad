// FP8 weights (backend/cuda/fp8.h, --quantization fp8): the row quantizer bit for bit against the
// host's conversion; the GEMV and the cuBLASLt path of LinearDispatcher::run_fp8 with every
// epilogue against an fp64 reference over the same e4m3 values (the cuBLASLt path's x quantized per
// token on the host the same way); and a quantized model's steps against the CPU engine running the
// dequantized weights. Skipped without a GPU.
#include <cmath>

#include "backend/cpu/cpu_engine.h"
#include "backend/cuda/cuda_engine.h"
#include "backend/cuda/fp8.h"
#include "backend/cuda/linear_dispatch.h"
#include "gpu/engine_steps.h"
#include "gpu/gpu_test_util.h"
#include "tiny_model.h"

namespace fdpp::test {
namespace {

using cuda::Epilogue;

class Fp8Gpu : public CudaKernels {};

// The quantizer's arithmetic on the host: per-row scale max|x| / 448, e4m3(x * (448 / max)).
struct HostQuantized {
  std::vector<uint8_t> q;
  std::vector<float> scale;
  std::vector<float> dequantized;  // scale * e4m3 value
};
HostQuantized quantize_rows_host(const std::vector<float>& x, int64_t rows, int64_t K) {
  HostQuantized h;
  h.q.resize(x.size());
  h.scale.resize(rows);
  h.dequantized.resize(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    float m = 0;
    for (int64_t k = 0; k < K; ++k) m = std::max(m, std::fabs(x[r * K + k]));
    const float inv = m > 0 ? cuda::kFp8E4M3Max / m : 1.f;
    h.scale[r] = m > 0 ? m / cuda::kFp8E4M3Max : 1.f;
    for (int64_t k = 0; k < K; ++k) {
      h.q[r * K + k] = cuda::fp8_e4m3_from_float(x[r * K + k] * inv);
      h.dequantized[r * K + k] = cuda::fp8_e4m3_to_float(h.q[r * K + k]) * h.scale[r];
    }
  }
  return h;
}

TEST(Fp8Host, E4M3ConversionKnownValues) {
  EXPECT_EQ(cuda::fp8_e4m3_from_float(0.f), 0x00);
  EXPECT_EQ(cuda::fp8_e4m3_from_float(1.f), 0x38);
  EXPECT_EQ(cuda::fp8_e4m3_from_float(-2.f), 0xC0);
  EXPECT_EQ(cuda::fp8_e4m3_from_float(448.f), 0x7E);
  EXPECT_EQ(cuda::fp8_e4m3_from_float(1000.f), 0x7E);  // saturates, never NaN
  EXPECT_EQ(cuda::fp8_e4m3_to_float(0x7E), 448.f);
  EXPECT_EQ(cuda::fp8_e4m3_to_float(0x01), std::ldexp(1.f, -9));  // the smallest subnormal
  for (int b = 0; b < 256; ++b) {
    if ((b & 0x7F) == 0x7F) continue;  // NaN
    const float v = cuda::fp8_e4m3_to_float(static_cast<uint8_t>(b));
    EXPECT_EQ(cuda::fp8_e4m3_from_float(v), b == 0x80 ? 0x80 : b) << "round trip of 0x" << std::hex << b;
  }
}

TEST_F(Fp8Gpu, QuantizeRowsMatchesTheHostBitForBit) {
  for (DType t : {DType::F16, DType::BF16}) {
    const int64_t rows = 37, K = 264;
    std::vector<float> x;
    std::vector<uint16_t> bits = random_bits(rows * K, t, x, 3.f);
    for (int64_t k = 0; k < K; ++k) {  // an all-zero row and a row with one huge value
      bits[5 * K + k] = to_bits(0.f, t);
      x[5 * K + k] = 0.f;
    }
    bits[9 * K + 17] = to_bits(300.f, t);
    x[9 * K + 17] = from_bits(bits[9 * K + 17], t);
    const HostQuantized h = quantize_rows_host(x, rows, K);
    DeviceBuffer<uint16_t> dx(bits);
    DeviceBuffer<uint8_t> dq(rows * K);
    DeviceBuffer<float> ds(rows);
    dq.poison();
    ds.poison();
    cuda::quantize_rows_fp8(dx.get(), t, rows, K, dq.get(), ds.get(), nullptr);
    sync("quantize_rows_fp8");
    EXPECT_EQ(dq.download(), h.q) << name(t);
    EXPECT_EQ(ds.download(), h.scale) << name(t);
  }
}


// run_fp8 at M rows against fp64 over the e4m3 weights (and, where cuBLASLt runs, the per-token
// e4m3 x), in each mode: auto (the GEMV at M = 1, the flat GEMM to 32, cuBLASLt above) and the
// forced ones. N = 1008: rows of y in multiples of 16 bytes, which cuBLASLt's FP8 GEMM needs (not a
// multiple of any tile); N = 1002: cuBLASLt has no algorithm and the flat GEMM takes its rows.
TEST_F(Fp8Gpu, RunFp8MatchesTheReferenceForEveryEpilogue) {
  const int K = 784;  // 49 x 16: a K tail inside the flat GEMM's 128-wide stages
  struct Case {
    DType t;
    int N;
    LinearMode mode;
    std::vector<int> rows;
  };
  const std::vector<Case> cases = {
      {DType::F16, 1008, LinearMode::Auto, {1, 2, 5, 8, 13, 64, 300}},
      {DType::BF16, 1008, LinearMode::Auto, {1, 3, 16, 33, 64, 300}},
      {DType::BF16, 1002, LinearMode::Auto, {5, 70}},
      {DType::F16, 1008, LinearMode::Gemv, {2, 8}},
      {DType::F16, 1008, LinearMode::Flat, {33, 64}},  // the flat GEMM past its auto range
      {DType::BF16, 1008, LinearMode::Cublas, {1, 8}},
  };
  for (const auto& [t, N, mode, rows] : cases) {
    LinearChooser chooser;
    chooser.set_mode(mode);
    cuda::LinearDispatcher dispatcher(t, chooser);
    std::vector<float> wf, bf;
    const std::vector<uint16_t> wbits = random_bits(size_t(N) * K, t, wf, 0.05f);
    const std::vector<uint16_t> bbits = random_bits(N, t, bf, 0.1f);
    const HostQuantized w = quantize_rows_host(wf, N, K);
    DeviceBuffer<uint16_t> w16(wbits), bias(bbits);
    DeviceBuffer<uint8_t> w8(size_t(N) * K);
    DeviceBuffer<float> ws(N);
    cuda::quantize_rows_fp8(w16.get(), t, N, K, w8.get(), ws.get(), nullptr);
    sync("quantize_rows_fp8");
    for (int M : rows) {
      std::vector<float> xf;
      const std::vector<uint16_t> xbits = random_bits(size_t(M) * K, t, xf);
      // Two references: x as it is (the GEMV) and x quantized per token (cuBLASLt's input).
      const std::vector<float> xq = quantize_rows_host(xf, M, K).dequantized;
      DeviceBuffer<uint16_t> x(xbits);
      std::vector<double> dot(size_t(M) * N), dot_q(size_t(M) * N);
      for (int m = 0; m < M; ++m)
        for (int n = 0; n < N; ++n) {
          double s = 0, sq = 0;
          for (int k = 0; k < K; ++k) {
            s += double(xf[size_t(m) * K + k]) * w.dequantized[size_t(n) * K + k];
            sq += double(xq[size_t(m) * K + k]) * w.dequantized[size_t(n) * K + k];
          }
          dot[size_t(m) * N + n] = s;
          dot_q[size_t(m) * N + n] = sq;
        }
      for (Epilogue ep : {Epilogue::Store, Epilogue::StoreF32, Epilogue::AddF32, Epilogue::SwiGLU}) {
        for (bool with_bias : {false, true}) {
          const int cols = ep == Epilogue::SwiGLU ? N / 2 : N;
          // Asked before the call (the call records a shape cuBLASLt has no algorithm for) and after.
          const LinearImpl planned = dispatcher.fp8_choice(M, N, K, ep, with_bias);
          const LinearImpl expected = mode == LinearMode::Gemv ? (M <= 8 ? LinearImpl::Gemv : LinearImpl::Cublas)
                                      : mode == LinearMode::Cublas ? LinearImpl::Cublas
                                      : mode == LinearMode::Flat   ? (M <= cuda::kFlatGemmMaxM ? LinearImpl::Flat
                                                                                               : LinearImpl::Cublas)
                                      : M <= cuda::kFp8GemvDefaultMaxM  ? LinearImpl::Gemv
                                      : M <= cuda::kFp8FlatDefaultMaxM  ? LinearImpl::Flat
                                                                        : LinearImpl::Cublas;
          EXPECT_EQ(planned, expected) << "M = " << M;
          std::vector<float> init(size_t(M) * cols, 0.f), out;
          if (ep == Epilogue::AddF32) init = random_vector(init.size());
          const bool f32 = ep == Epilogue::StoreF32 || ep == Epilogue::AddF32;
          const std::string what = std::string("run_fp8 ") + name(t) + " " + linear_mode_name(mode) + " N=" +
                                   std::to_string(N) + " M=" + std::to_string(M) + " " + epilogue_name(ep) +
                                   (with_bias ? " bias" : "");
          if (f32) {
            DeviceBuffer<float> y(init.size());
            if (ep == Epilogue::AddF32) y.upload(init);
            else y.poison();
            dispatcher.run_fp8(x.get(), w8.get(), ws.get(), with_bias ? bias.get() : nullptr, y.get(), M, N, K, t, ep,
                               nullptr);
            sync(what);
            out = y.download();
          } else {
            DeviceBuffer<uint16_t> y(init.size());
            y.poison();
            dispatcher.run_fp8(x.get(), w8.get(), ws.get(), with_bias ? bias.get() : nullptr, y.get(), M, N, K, t, ep,
                               nullptr);
            sync(what);
            out = from_bits(y.download(), t);
          }
          const LinearImpl ran = dispatcher.fp8_choice(M, N, K, ep, with_bias);
          const bool cublas = ran == LinearImpl::Cublas;
          // The engine's epilogues (16-bit out) must reach cuBLASLt where rows are 16-byte multiples;
          // an fp32 output may lack an algorithm (then the flat GEMM computes it, checked the same way).
          if (N % 8 == 0 && !f32) EXPECT_EQ(ran, planned) << what << ": cuBLASLt found no algorithm";
          else if (N % 8 != 0) EXPECT_FALSE(cublas) << what;
          if (planned == LinearImpl::Cublas && !cublas)
            std::printf("%s: cuBLASLt has no algorithm; the flat GEMM ran\n", what.c_str());
          const std::vector<double>& d = cublas ? dot_q : dot;
          std::vector<float> acc(size_t(M) * N);
          for (int m = 0; m < M; ++m)
            for (int n = 0; n < N; ++n) acc[size_t(m) * N + n] = float(d[size_t(m) * N + n] + (with_bias ? bf[n] : 0.f));
          std::vector<float> ref(size_t(M) * cols);
          for (int m = 0; m < M; ++m)
            for (int j = 0; j < cols; ++j) {
              const float a = acc[size_t(m) * N + j];
              ref[size_t(m) * cols + j] =
                  ep == Epilogue::SwiGLU ? a / (1.f + std::exp(-a)) * acc[size_t(m) * N + cols + j]
                  : ep == Epilogue::AddF32 ? init[size_t(m) * cols + j] + a
                                           : a;
            }
          // The same e4m3 products in fp32 in another order, and one or two roundings to 16 bits
          // (SwiGLU after cuBLASLt rounds gate and up first).
          expect_close(out, ref, {t == DType::F16 ? 1e-5 : 5e-5, 0, 0}, what);
        }
      }
    }
  }
}

// The CPU engine over the weights the GPU computes with: each layer matrix rounded to the 16-bit
// type, then quantized per row and dequantized.
DecoderWeights dequantized_weights(const ModelConfig& c, const DecoderWeights& w, DType t) {
  DecoderWeights d = w;
  auto fake = [&](Weight& m) {
    const int64_t rows = m.shape[0], K = m.shape[1];
    std::vector<float> v(m.data.begin(), m.data.end());
    for (float& x : v) x = from_bits(to_bits(x, t), t);
    const HostQuantized h = quantize_rows_host(v, rows, K);
    std::copy(h.dequantized.begin(), h.dequantized.end(), m.data.begin());
  };
  for (LayerWeights& L : d.layers) {
    for (Weight* m : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_up, &L.w_down}) fake(*m);
    if (c.activation == Activation::SwiGLU) fake(L.w_gate);
  }
  return d;
}

TEST_F(Fp8Gpu, QuantizedModelStepsMatchTheCpuOverDequantizedWeights) {
  for (DType t : {DType::F16, DType::BF16}) {
    ModelConfig c = tiny("llama", 64);
    c.ffn_hidden = 3 * c.hidden + 16;  // fp8 rows are multiples of 16 elements
    const DecoderWeights w = random_weights(c);
    const DecoderWeights wd = dequantized_weights(c, w, t);
    CpuEngine cpu(c, wd, small_step_limits(c));
    cuda::DeviceModel dm(c, w, t);
    dm.quantize_fp8();
    ASSERT_TRUE(dm.fp8());
    cuda::CudaEngine gpu(std::make_shared<const cuda::DeviceModel>(std::move(dm)), small_step_cuda_options());
    // A prefill step (tensor-core path, x quantized per token: the CPU does not quantize x), then
    // decode steps of three rows (the GEMV, x kept 16-bit, but over the prefill's K/V, which carry
    // its quantization). Measured on the H200 (2026-12-05): prefill rows 1.7e-3 to 2.8e-3, decode
    // rows 2.5e-4 to 7.4e-4, in f16 and bf16 alike.
    step_engines_alike({&cpu, &gpu}, c.vocab_size, 3, 100, {40, 1, 1, 1, 1},
                       [&](size_t st, const std::vector<StepOutput>& o) {
      const double bound = st == 0 ? 1e-2 : 2e-3;
      for (int k = 0; k < 3; ++k) {
        const double e = nmse(row_logits(o[1], k, c.vocab_size), row_logits(o[0], k, c.vocab_size));
        EXPECT_LE(e, bound) << name(t) << " step " << st << " row " << k;
        std::printf("fp8 model %s step %zu row %d: NMSE %.3e (bound %.0e)\n", name(t), st, k, e, bound);
      }
    });
  }
}

}  // namespace
}  // namespace fdpp::test
