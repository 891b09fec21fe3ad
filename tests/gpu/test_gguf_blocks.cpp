// GGUF blocks on the GPU (backend/cuda/gguf_blocks.h): the block GEMV of every type against the CPU's
// stored path (the same 8-bit activations and integer sums: only the fp32 order differs); the
// dispatcher's segments, epilogues and dequantized cuBLASLt path against fp64 over the dequantized
// weights; NaN in x; and a GGUF model whose layers stay in their blocks against the CPU engine on the
// same file. Skipped without a GPU.
#include <algorithm>
#include <cmath>
#include <filesystem>

#include "backend/cpu/cpu_engine.h"
#include "backend/cpu/quant_matmul.h"
#include "backend/cuda/device_model.h"
#include "backend/cuda/gguf_blocks.h"
#include "backend/cuda/linear_dispatch.h"
#include "gpu/engine_steps.h"
#include "gpu/gpu_test_util.h"
#include "io/gguf.h"
#include "model/arch/architecture.h"
#include "model/gguf_model.h"
#include "model/model_loader.h"
#include "tiny_gguf.h"

namespace fdpp::test {
namespace {

namespace fs = std::filesystem;
using cuda::Epilogue;
using gguf::GgmlType;

class GgufBlocksGpu : public CudaKernels {};

const GgmlType kTypes[] = {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0,
                           GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K};

uint32_t u32(GgmlType t) { return static_cast<uint32_t>(t); }

// y [M, N] = x . W^T by the CPU's scalar stored-format kernels (8-bit activations).
std::vector<float> cpu_stored(GgmlType t, const std::vector<uint8_t>& w, int N, int K, const std::vector<float>& x,
                              int M) {
  StoredMatrix s;
  s.type = t;
  s.data = w.data();
  s.rows = N;
  s.cols = K;
  s.row_bytes = gguf::block_bytes(t) * static_cast<uint64_t>(K) / gguf::block_elements(t);
  std::vector<float> y(size_t(M) * N);
  cpu::stored_linear(x.data(), M, s, nullptr, y.data(), cpu::Isa::Scalar);
  return y;
}

// The loader's rule (model/weight_plan.h) sends the kernels exactly the types they have (host code).
TEST(GgufBlocksRule, KernelsTakeEveryTypeTheLoaderKeepsInBlocks) {
  for (uint32_t t = 0; t < 40; ++t) EXPECT_EQ(cuda::gguf_gpu_type(t), gguf_gpu_block_type(static_cast<GgmlType>(t))) << t;
  for (const GgmlType t : kTypes) EXPECT_EQ(cuda::gguf_shape_problem(u32(t), 4096), nullptr);
}

// Where a matrix leaves the block GEMV for the flat GEMM (host code): Q4_0 from 6 rows, every
// other type from kGgufFlatMinM, a matrix of several types at the largest of its segments'.
TEST(GgufBlocksRule, FlatGemmThresholdPerType) {
  using cuda::LinearDispatcher;
  EXPECT_EQ(LinearDispatcher::gguf_flat_min_m(u32(GgmlType::Q4_0)), 6);
  for (const GgmlType t : {GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K})
    EXPECT_EQ(LinearDispatcher::gguf_flat_min_m(u32(t)), LinearDispatcher::kGgufFlatMinM) << u32(t);
  cuda::GgufMatrix k_quants, mixed;
  k_quants.count = mixed.count = 2;
  k_quants.segments[0].type = mixed.segments[0].type = u32(GgmlType::Q4_K);
  k_quants.segments[1].type = u32(GgmlType::Q6_K);
  mixed.segments[1].type = u32(GgmlType::Q4_0);
  EXPECT_EQ(LinearDispatcher::gguf_flat_min_m(k_quants), LinearDispatcher::kGgufFlatMinM);
  EXPECT_EQ(LinearDispatcher::gguf_flat_min_m(mixed), 6);
}

TEST_F(GgufBlocksGpu, GemvOfEveryTypeMatchesTheCpuStoredPath) {
  for (const GgmlType t : kTypes) {
    const bool kq = cuda::gguf_k_quant(u32(t));
    for (const int K : kq ? std::vector<int>{256, 2816, 4352} : std::vector<int>{32, 2080}) {
      const int N = 37;  // odd: the last warp's second row is past the end
      const std::vector<uint8_t> w = random_stored(t, uint64_t(N) * K);
      ASSERT_EQ(w.size(), cuda::gguf_row_bytes(u32(t), K) * N);
      cuda::DeviceBuffer blocks(w.size() + cuda::kGgufBlocksTailBytes);
      cuda_ok(cudaMemcpy(blocks.get(), w.data(), w.size(), cudaMemcpyHostToDevice), "upload");
      const cuda::GgufSegment seg{u32(t), N, blocks.get()};
      for (const DType dt : {DType::F16, DType::BF16})
        for (const int M : {1, 2, 3, 8}) {
          const std::string what = fmt::format("gguf_gemv {} {} K={} M={}", gguf::type_name(t), name(dt), K, M);
          std::vector<float> xf;
          DeviceBuffer<uint16_t> x(random_bits(size_t(M) * K, dt, xf));
          cuda::DeviceBuffer act(cuda::gguf_act_bytes(M, K));
          DeviceBuffer<float> y(size_t(M) * N);
          const std::vector<float> want = cpu_stored(t, w, N, K, xf, M);
          y.poison();
          cuda::gguf_quantize_x(x.get(), M, K, dt, !kq, kq, act.get(), nullptr);
          cuda::gguf_gemv(seg, act.get(), M, 0, M, K, nullptr, y.get(), N, 0, dt, Epilogue::StoreF32, nullptr);
          sync(what);
          // The same integers; the fp32 sums of the per-block terms in another order.
          const double e = nmse(y.download(), want);
          EXPECT_LE(e, 1e-9) << what;
          std::printf("%s: NMSE %.2e against the CPU\n", what.c_str(), e);
        }
    }
  }
}

TEST_F(GgufBlocksGpu, NanInARowOfXReachesOnlyThatRow) {
  const int N = 16, K = 512, M = 3;
  for (const GgmlType t : {GgmlType::Q4_0, GgmlType::Q4_K}) {
    const bool kq = cuda::gguf_k_quant(u32(t));
    const std::vector<uint8_t> w = random_stored(t, uint64_t(N) * K);
    cuda::DeviceBuffer blocks(w.size() + cuda::kGgufBlocksTailBytes);
    cuda_ok(cudaMemcpy(blocks.get(), w.data(), w.size(), cudaMemcpyHostToDevice), "upload");
    std::vector<float> xf;
    std::vector<uint16_t> xb = random_bits(size_t(M) * K, DType::F16, xf);
    xb[size_t(K) + 7] = 0x7e00;  // NaN in row 1
    DeviceBuffer<uint16_t> x(xb);
    cuda::DeviceBuffer act(cuda::gguf_act_bytes(M, K));
    DeviceBuffer<float> y(size_t(M) * N);
    cuda::gguf_quantize_x(x.get(), M, K, DType::F16, !kq, kq, act.get(), nullptr);
    cuda::gguf_gemv({u32(t), N, blocks.get()}, act.get(), M, 0, M, K, nullptr, y.get(), N, 0, DType::F16,
                    Epilogue::StoreF32, nullptr);
    sync("gguf_gemv NaN");
    const std::vector<float> got = y.download();
    for (int r = 0; r < M; ++r)
      for (int n = 0; n < N; ++n)
        EXPECT_EQ(std::isnan(got[size_t(r) * N + n]), r == 1) << gguf::type_name(t) << " row " << r << " col " << n;
  }
}

// The flat GEMM over GGUF blocks (16-bit x, tensor cores), every type it takes: every m_tiles (M
// 1..64), split-K (few 64-row tiles over a long K), a segment's columns inside a wider y, bias, and
// the SwiGLU of one segment, against fp64 over the dequantized weights. Q6_K's rows start at every
// even offset from the 16-byte boundary (210-byte blocks, 17 of them a row); Q4_0's and Q8_0's
// blocks (18 and 34 bytes) at every even offset within a stage.
TEST_F(GgufBlocksGpu, FlatGemmOverEveryFlatTypeMatchesTheDequantizedProduct) {
  int dev = 0, sms = 0;
  cuda_ok(cudaGetDevice(&dev), "cudaGetDevice");
  cuda_ok(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute");
  const int N = 100, ldy = 117, col0 = 9;
  cuda::WeightFormat none;
  EXPECT_FALSE(cuda::flat_gemm_gguf_format(u32(GgmlType::Q5_0), none)) << "a type the GPU does not keep";
  for (const GgmlType t : kTypes) {
    cuda::WeightFormat format;
    ASSERT_TRUE(cuda::flat_gemm_gguf_format(u32(t), format)) << gguf::type_name(t);
    for (const int K : {256, 4352}) {
      const std::vector<uint8_t> w = random_stored(t, uint64_t(N) * K);
      std::vector<float> wf(size_t(N) * K);
      gguf::dequantize(t, w.data(), wf.data(), wf.size());
      cuda::DeviceBuffer blocks(w.size() + cuda::kGgufBlocksTailBytes);
      cuda_ok(cudaMemcpy(blocks.get(), w.data(), w.size(), cudaMemcpyHostToDevice), "upload");
      size_t ws_bytes = 16384;
      for (int M = 1; M <= cuda::kFlatGemmMaxM; ++M)
        ws_bytes = std::max(ws_bytes, cuda::flat_gemm_workspace_bytes(M, N, K, sms, format));
      cuda::DeviceBuffer ws(ws_bytes);
      cuda_ok(cudaMemset(ws.get(), 0, ws_bytes), "zero the workspace");
      for (const DType dt : {DType::F16, DType::BF16})
        for (const int M : {1, 3, 8, 9, 17, 40, 64}) {
          std::vector<float> xf, bf;
          DeviceBuffer<uint16_t> x(random_bits(size_t(M) * K, dt, xf, 0.05f));
          DeviceBuffer<uint16_t> bias(random_bits(size_t(N), dt, bf, 0.1f));
          std::vector<double> dot(size_t(M) * N);
          for (int r = 0; r < M; ++r)
            for (int n = 0; n < N; ++n) {
              double acc = bf[n];
              for (int k = 0; k < K; ++k) acc += double(xf[size_t(r) * K + k]) * wf[size_t(n) * K + k];
              dot[size_t(r) * N + n] = acc;
            }
          const std::string what =
              fmt::format("flat_gemm_gguf {} {} K={} M={}", gguf::type_name(t), name(dt), K, M);
          // StoreF32 into columns [col0, col0 + N) of rows of ldy; the other columns stay as they were.
          std::vector<float> init(size_t(M) * ldy, -7.f);
          DeviceBuffer<float> y(init);
          cuda::flat_gemm_gguf(x.get(), u32(t), blocks.get(), bias.get(), y.get(), M, N, K, ldy, col0, dt,
                               Epilogue::StoreF32, ws.get(), ws_bytes, nullptr);
          sync(what);
          const std::vector<float> got = y.download();
          std::vector<float> out, ref;
          bool others_kept = true;
          for (int r = 0; r < M; ++r)
            for (int j = 0; j < ldy; ++j) {
              const float v = got[size_t(r) * ldy + j];
              if (j >= col0 && j < col0 + N) {
                out.push_back(v);
                ref.push_back(float(dot[size_t(r) * N + j - col0]));
              } else {
                others_kept = others_kept && v == -7.f;
              }
            }
          EXPECT_TRUE(others_kept) << what << ": a column outside the segment's was written";
          // The weights are rounded to 16 bits (scale and minimum each once, then one fused
          // multiply-add): the 16-bit kernels' bound. A wrong nibble, scale or offset gives O(1).
          expect_close(out, ref, {dt == DType::F16 ? 1e-4 : 2e-4, 0, 0}, what);
          // SwiGLU of the one segment: y [M, N / 2] = silu(gate) * up.
          DeviceBuffer<uint16_t> ys(size_t(M) * N / 2);
          ys.poison();
          cuda::flat_gemm_gguf(x.get(), u32(t), blocks.get(), bias.get(), ys.get(), M, N, K, 0, 0, dt,
                               Epilogue::SwiGLU, ws.get(), ws_bytes, nullptr);
          sync(what + " SwiGLU");
          std::vector<float> sref(size_t(M) * N / 2);
          for (int r = 0; r < M; ++r)
            for (int f = 0; f < N / 2; ++f) {
              const double g = dot[size_t(r) * N + f], u = dot[size_t(r) * N + N / 2 + f];
              sref[size_t(r) * N / 2 + f] = float(g / (1 + std::exp(-g)) * u);
            }
          expect_close(from_bits(ys.download(), dt), sref, {dt == DType::F16 ? 2e-4 : 4e-4, 0, 0}, what + " SwiGLU");
        }
    }
  }
}

// The prefill path's dequantization: the host's dequantization rounded to 16 bits, bit for bit.
TEST_F(GgufBlocksGpu, DequantizeIsTheHostDequantizationBitForBit) {
  const int N = 5;
  for (const GgmlType t : kTypes) {
    // A warp converts 256 weights of a row: rows of 32-element blocks may end in a partial span.
    const std::vector<int> ks =
        gguf::block_elements(t) == 256 ? std::vector<int>{256, 768} : std::vector<int>{96, 512, 800};
    for (const int K : ks) {
      const std::vector<uint8_t> w = random_stored(t, uint64_t(N) * K);
      std::vector<float> f(size_t(N) * K);
      gguf::dequantize(t, w.data(), f.data(), f.size());
      cuda::DeviceBuffer blocks(w.size() + cuda::kGgufBlocksTailBytes);
      cuda_ok(cudaMemcpy(blocks.get(), w.data(), w.size(), cudaMemcpyHostToDevice), "upload");
      for (const DType dt : {DType::F16, DType::BF16}) {
        DeviceBuffer<uint16_t> out(f.size());
        out.poison();
        cuda::gguf_dequantize({u32(t), N, blocks.get()}, K, dt, out.get(), nullptr);
        sync("gguf_dequantize");
        EXPECT_EQ(out.download(), to_bits(f, dt)) << gguf::type_name(t) << " " << name(dt) << " K=" << K;
      }
    }
  }
}

// run_gguf over a matrix of three segments (q/k/v of a Q4_K_M file: two types, and a third), a
// gate/up of one segment and of two, by the dispatcher's choice and with the block GEMV forced: every epilogue, M across the GEMV's 8-row launches and past
// kFlatGemmMaxM (dequantized for cuBLASLt), against fp64 over the dequantized weights.
TEST_F(GgufBlocksGpu, RunGgufMatchesTheReferenceForSegmentsEpiloguesAndRows) {
  const int K = 768;
  struct Part {
    GgmlType t;
    int rows;
  };
  const std::vector<std::vector<Part>> matrices = {
      {{GgmlType::Q4_K, 40}, {GgmlType::Q6_K, 24}, {GgmlType::Q8_0, 64}},
      {{GgmlType::Q5_K, 96}},                        // one segment: SwiGLU fused in the kernel
      {{GgmlType::Q4_K, 48}, {GgmlType::Q6_K, 48}},  // SwiGLU over two types: through silu_mul
      {{GgmlType::Q6_K, 40}, {GgmlType::Q4_K, 64}},  // segments' columns of y
      {{GgmlType::Q4_K, 128}},                       // SwiGLU fused, two 64-row tiles
      {{GgmlType::Q4_K, 40}, {GgmlType::Q4_1, 24}, {GgmlType::Q8_0, 64}},
      {{GgmlType::Q4_1, 48}, {GgmlType::Q5_K, 48}},  // SwiGLU over two types
  };
  // The dispatcher's own choice (the block GEMV at one or two rows, the flat GEMM to 64, cuBLASLt
  // above), and --linear gemv (the block GEMV at every M, 8 rows a launch).
  for (const LinearMode mode : {LinearMode::Auto, LinearMode::Gemv}) {
    for (const DType dt : {DType::F16, DType::BF16}) {
      LinearChooser chooser;
      chooser.set_mode(mode);
      cuda::LinearDispatcher dispatcher(dt, chooser);
      for (const auto& parts : matrices) {
        int N = 0;
        std::vector<std::vector<uint8_t>> stored;
        std::vector<float> wf;  // [N, K] dequantized
        size_t bytes = 0;
        for (const Part& p : parts) {
          stored.push_back(random_stored(p.t, uint64_t(p.rows) * K));
          std::vector<float> f(size_t(p.rows) * K);
          gguf::dequantize(p.t, stored.back().data(), f.data(), f.size());
          wf.insert(wf.end(), f.begin(), f.end());
          N += p.rows;
          bytes += (stored.back().size() + 15) / 16 * 16;
        }
        cuda::DeviceBuffer blocks(bytes + cuda::kGgufBlocksTailBytes);
        cuda::GgufMatrix m;
        size_t at = 0;
        for (size_t i = 0; i < parts.size(); ++i) {
          cuda_ok(cudaMemcpy(blocks.as<uint8_t>() + at, stored[i].data(), stored[i].size(), cudaMemcpyHostToDevice),
                  "upload");
          m.segments[m.count++] = {u32(parts[i].t), parts[i].rows, blocks.as<uint8_t>() + at};
          at += (stored[i].size() + 15) / 16 * 16;
        }
        std::vector<float> bf;
        DeviceBuffer<uint16_t> bias(random_bits(size_t(N), dt, bf, 0.1f));
        for (const int M : {1, 5, 12, 70}) {
          std::vector<float> xf;  // small: the random blocks' products would overflow f16 in SwiGLU
          DeviceBuffer<uint16_t> x(random_bits(size_t(M) * K, dt, xf, 0.05f));
          std::vector<double> dot(size_t(M) * N);
          for (int r = 0; r < M; ++r)
            for (int n = 0; n < N; ++n) {
              double s = 0;
              for (int k = 0; k < K; ++k) s += double(xf[size_t(r) * K + k]) * wf[size_t(n) * K + k];
              dot[size_t(r) * N + n] = s + bf[n];
            }
          for (const Epilogue ep : {Epilogue::Store, Epilogue::AddF32, Epilogue::SwiGLU}) {
            const int cols = ep == Epilogue::SwiGLU ? N / 2 : N;
            const std::string what = fmt::format("run_gguf {} {} {} segments M={} {}", linear_mode_name(mode), name(dt),
                                                 parts.size(), M, epilogue_name(ep));
            std::vector<float> init(size_t(M) * cols, 0.f), out;
            if (ep == Epilogue::AddF32) {
              init = random_vector(init.size());
              DeviceBuffer<float> y(init);
              dispatcher.run_gguf(x.get(), m, bias.get(), y.get(), M, N, K, dt, ep, nullptr);
              sync(what);
              out = y.download();
            } else {
              DeviceBuffer<uint16_t> y(init.size());
              y.poison();
              dispatcher.run_gguf(x.get(), m, bias.get(), y.get(), M, N, K, dt, ep, nullptr);
              sync(what);
              out = from_bits(y.download(), dt);
            }
            std::vector<float> ref(init.size());
            for (int r = 0; r < M; ++r)
              for (int j = 0; j < cols; ++j) {
                const float a = float(dot[size_t(r) * N + j]);
                const float u = ep == Epilogue::SwiGLU ? float(dot[size_t(r) * N + cols + j]) : 0.f;
                ref[size_t(r) * cols + j] = ep == Epilogue::SwiGLU   ? a / (1.f + std::exp(-a)) * u
                                            : ep == Epilogue::AddF32 ? init[size_t(r) * cols + j] + a
                                                                     : a;
              }
            // The block GEMV: x in 8 bits per block, the CPU's stored path (1.3e-4 measured on an H100
            // with these random blocks, whose K-quant minimums make each block's sum count; SwiGLU
            // multiplies two such products, and one draw gave 6.1e-4 there): 5e-4, twice that for
            // SwiGLU, against the fp32 reference; the flat GEMM and cuBLASLt: the weights rounded to
            // 16 bits. A wrong nibble, scale or segment offset gives O(1).
            const bool blocks = dispatcher.gguf_choice(M, m) == LinearImpl::Gemv;
            const double block_bound = ep == Epilogue::SwiGLU ? 1e-3 : 5e-4;
            expect_close(out, ref, {blocks ? block_bound : dt == DType::F16 ? 1e-4 : 2e-4, 0, 0}, what);
          }
        }
      }
    }
  }
}

// A GGUF of every stored type (tests/tiny_gguf.h; q/k of different types, llama.cpp's row order)
// on the GPU with its layer matrices in their blocks, against the CPU engine on the same file
// (which computes the same blocks with 8-bit activations, and keeps the types it has no kernels
// for in fp32). The layers of types the GPU keeps are checked to be blocks.
TEST_F(GgufBlocksGpu, TinyGgufInItsBlocksStepsLikeTheCpuEngine) {
  const auto dir = scratch_dir("gguf_blocks_gpu");
  const std::string path = (dir / "tiny.gguf").string();
  write_tiny_llama_gguf(path);
  // No tokenizer in the file: the loaders below, not load_model.
  auto file = std::make_shared<const gguf::GgufFile>(gguf::GgufFile::open(path));
  const ModelConfig c = llama_config_from_gguf(*file);
  const WeightPlan plan = plan_llama_gguf(file, c);
  const LoadOptions stored = cpu::stored_load_options();
  DecoderWeights cpu_weights = load_gguf_weights(file, c, llama_gguf_tensor_specs(c), {}, stored.stored_types);
  if (stored.prepare_stored) stored.prepare_stored(cpu_weights, true);
  const cuda::DeviceModel dm = cuda::DeviceModel::from_plan(c, plan, DType::F16, {}, nullptr, true);
  ASSERT_TRUE(dm.gguf());
  // Layer 0: q/k/v are Q6_K, Q8_0, Q4_0 (three segments), o Q4_1; gate/up F16/BF16 stay 16-bit.
  EXPECT_EQ(dm.layers[0].g_qkv.count, 3);
  EXPECT_EQ(dm.layers[0].g_o.count, 1);
  EXPECT_TRUE(dm.layers[0].g_in.empty());
  const EngineLimits l = small_step_limits(c, 1024);
  CpuEngine cpu(c, cpu_weights, l);
  // Decode steps of three rows after a prefill of 70+ tokens a row (dequantized for cuBLASLt). The
  // block GEMV (--linear gemv) computes the CPU's 8-bit arithmetic; with --linear flat the matrices
  // whose parts all have a flat format (layer 0's q/k/v and o, layer 1's down) go to the flat GEMM
  // (16-bit x), whose distance from the CPU is then the CPU's own 8-bit rounding (bounded on the
  // CPU: test_quant_repack.cpp); the default is one of the two by the row count.
  for (const std::string linear : {"gemv", "flat", ""}) {
    const std::string mode = linear.empty() ? "default" : linear;
    std::unique_ptr<Engine> gpu = plan_gpu_engine(c, plan, l, "none", linear);
    step_engines_alike({&cpu, gpu.get()}, c.vocab_size, 3, 100, {70, 1, 1, 1},
                       [&](size_t st, const std::vector<StepOutput>& o) {
      for (int r = 0; r < 3; ++r) {
        const auto a = row_logits(o[1], r, c.vocab_size), b = row_logits(o[0], r, c.vocab_size);
        // A value not finite on either side fails the bound (nmse gives infinity or NaN).
        const double e = nmse(a, b);
        // 16-bit activations and weights of the 16-bit layers on the GPU; the blocks' products agree
        // (--linear gemv), or differ by the CPU's 8-bit rounding of one product's x (the flat GEMM),
        // which the CPU's own test bounds at 5e-3 over the whole model.
        EXPECT_LE(e, linear == "gemv" ? 2e-3 : 5e-3) << mode << " step " << st << " row " << r;
        std::printf("tiny GGUF in blocks (%s) step %zu row %d: NMSE %.3e\n", mode.c_str(), st, r, e);
      }
    });
  }
  fs::remove_all(dir);
}

// The default model's GGUF (SmolLM2-135M, Q4_1 and Q8_0 blocks) on the GPU in its blocks against the
// CPU engine on the same file: logits and teacher-forced greedy tokens. Skipped where the model is
// not fetched (scripts/fetch-default-model.sh; gpu-check.sh carries it in parts).
TEST_F(GgufBlocksGpu, DefaultModelInItsBlocksMatchesTheCpuEngine) {
  const std::string path = default_model_or_empty();
  if (path.empty()) GTEST_SKIP() << "default model not present";
  const PlannedModel p = plan_model(path);
  const ModelConfig& c = p.config();
  const LoadedModel cpu_model = load_model(path, {}, cpu::stored_load_options());
  const EngineLimits l = small_step_limits(c, 1024);
  CpuEngine cpu(c, cpu_model.weights, l);
  std::unique_ptr<Engine> gpu = plan_gpu_engine(c, p.plan, l);
  int same = 0, total = 0;
  step_engines_alike({&cpu, gpu.get()}, c.vocab_size, 3, 200, {100, 1, 1, 1, 1, 1, 1, 1},
                     [&](size_t st, const std::vector<StepOutput>& o) {
    for (int r = 0; r < 3; ++r) {
      const auto a = row_logits(o[1], r, c.vocab_size), b = row_logits(o[0], r, c.vocab_size);
      const double e = nmse(a, b);
      EXPECT_LE(e, 5e-3) << "step " << st << " row " << r;
      same += std::max_element(a.begin(), a.end()) - a.begin() == std::max_element(b.begin(), b.end()) - b.begin();
      ++total;
      std::printf("default model in blocks step %zu row %d: NMSE %.3e\n", st, r, e);
    }
  });
  std::printf("default model in blocks: greedy token equal to the CPU's in %d of %d rows\n", same, total);
  EXPECT_GE(same, total - 1);
}

}  // namespace
}  // namespace fdpp::test
