// FP8 checkpoints as published (tests/fixtures/fp8, model/hf_quantization.h) on the GPU: the e4m3
// bytes streamed as they are with per-row scales (q, k and v of a per-tensor checkpoint each with
// its own), run through the FP8 kernels, against the CPU engine over the same checkpoint (which
// dequantizes it exactly). The host e4m3 conversion (core/fp8_e4m3.h) against CUDA's own runs
// without a GPU.
#include <cuda_fp8.h>

#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_engine.h"
#include "backend/cuda/cuda_engine.h"
#include "backend/cuda/device_model.h"
#include "core/fp8_e4m3.h"
#include "gpu/engine_steps.h"
#include "gpu/gpu_test_util.h"
#include "model/model_loader.h"
#include "runtime/backend_select.h"
#include "tiny_model.h"

namespace fdpp::test {
namespace {

// CUDA's host conversion is the one the GPU's quantizer rounds like (fp8.cu); the CPU's must agree
// on every float class: every bf16-representable value (all exponents and signs, NaN and inf),
// each midpoint between neighbouring e4m3 values, and random bit patterns.
TEST(Fp8HostConversion, MatchesCudasOwn) {
  auto expect_same = [](float v) {
    const uint8_t ours = fp8_e4m3_from_float(v), theirs = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
    if (ours != theirs)
      ADD_FAILURE() << "e4m3(" << v << "): ours 0x" << std::hex << int(ours) << ", CUDA's 0x" << int(theirs);
    return ours == theirs;
  };
  for (uint32_t hi = 0; hi < 65536; ++hi) {
    const uint32_t bits = hi << 16;
    float v;
    std::memcpy(&v, &bits, 4);
    if (!expect_same(v)) return;
  }
  for (int b = 0; b < 126; ++b) {
    const float lo = fp8_e4m3_to_float(static_cast<uint8_t>(b)), hi = fp8_e4m3_to_float(static_cast<uint8_t>(b + 1));
    const float mid = lo + (hi - lo) / 2;
    if (!expect_same(mid) || !expect_same(-mid) || !expect_same(std::nextafter(mid, 0.f)) ||
        !expect_same(std::nextafter(mid, 1000.f)))
      return;
  }
  for (int i = 0; i < 1000000; ++i) {
    const uint32_t bits = static_cast<uint32_t>(rng()());
    float v;
    std::memcpy(&v, &bits, 4);
    if (!expect_same(v)) return;
  }
  for (int b = 0; b < 256; ++b) {
    const float ours = fp8_e4m3_to_float(static_cast<uint8_t>(b));
    const float theirs = __half2float(__half(__nv_cvt_fp8_to_halfraw(static_cast<uint8_t>(b), __NV_E4M3)));
    if (std::isnan(theirs))
      EXPECT_TRUE(std::isnan(ours)) << b;
    else
      EXPECT_EQ(ours, theirs) << b;
  }
}

class Fp8CheckpointGpu : public CudaKernels {};

std::vector<uint8_t> bytes_of(const cuda::DeviceBuffer& b) {
  std::vector<uint8_t> h(b.bytes());
  if (!h.empty()) cuda_ok(cudaMemcpy(h.data(), b.get(), h.size(), cudaMemcpyDeviceToHost), "download");
  return h;
}

// The e4m3 bytes land at byte offsets (the 16-bit tensors at 2-byte ones): staging buffers of an
// odd size, far smaller than a matrix, split every tensor into many chunks, read by pread threads
// or copied from the mapping; the device model must not change by a bit.
TEST_F(Fp8CheckpointGpu, StreamingInSmallChunksGivesTheSameBytes) {
  for (const char* name : {"llama_fp8_tensor", "llama_ct_channel"}) {
    SCOPED_TRACE(name);
    const PlannedModel p = plan_model(fixture(std::string("fp8/") + name));
    const DType t = gpu_dtype("auto", &p.plan) == "bf16" ? DType::BF16 : DType::F16;
    const cuda::DeviceModel whole = cuda::DeviceModel::from_plan(p.config(), p.plan, t);
    for (const int threads : {0, 3}) {
      cuda::StreamOptions so;
      so.staging_bytes = 1001;
      so.read_threads = threads;
      const cuda::DeviceModel chunked = cuda::DeviceModel::from_plan(p.config(), p.plan, t, so);
      EXPECT_EQ(chunked.bytes(), whole.bytes());
      EXPECT_EQ(bytes_of(chunked.tok_embeddings), bytes_of(whole.tok_embeddings));
      EXPECT_EQ(bytes_of(chunked.lm_head), bytes_of(whole.lm_head));
      for (size_t l = 0; l < whole.layers.size(); ++l) {
        const cuda::DeviceLayer &a = chunked.layers[l], &b = whole.layers[l];
        for (auto m : {&cuda::DeviceLayer::w_qkv, &cuda::DeviceLayer::w_o, &cuda::DeviceLayer::w_in,
                       &cuda::DeviceLayer::w_down, &cuda::DeviceLayer::s_qkv, &cuda::DeviceLayer::s_o,
                       &cuda::DeviceLayer::s_in, &cuda::DeviceLayer::s_down, &cuda::DeviceLayer::attn_norm})
          EXPECT_EQ(bytes_of(a.*m), bytes_of(b.*m)) << "layer " << l << ", read threads " << threads;
      }
      // And the bytes are the file's.
      const PlannedTensor* down = p.plan.find(WeightSlot::WDown, 1);
      const std::vector<uint8_t> d = bytes_of(chunked.layers[1].w_down);
      ASSERT_EQ(d.size(), down->src.n_bytes);
      EXPECT_EQ(std::memcmp(d.data(), down->src.data, d.size()), 0);
    }
  }
}

// fixture, the 16-bit type auto picks for it (f16 and bf16 checkpoints).
struct Case {
  const char* name;
  DType dtype;
};

TEST_F(Fp8CheckpointGpu, StepsMatchTheCpuEngineOnTheSameCheckpoint) {
  // Phi-3's fixture has head_dim 32, which the CUDA backend refuses: the two Llama ones run here.
  for (const Case& k : {Case{"llama_fp8_tensor", DType::F16}, Case{"llama_ct_channel", DType::BF16}}) {
    SCOPED_TRACE(k.name);
    const std::string dir = fixture(std::string("fp8/") + k.name);
    const PlannedModel p = plan_model(dir);
    const ModelConfig& c = p.config();
    EXPECT_EQ(gpu_dtype("auto", &p.plan), k.dtype == DType::BF16 ? "bf16" : "f16");

    // The device model as streamed: e4m3 bytes as stored and the plan's scales, row for row.
    {
      const cuda::DeviceModel dm = cuda::DeviceModel::from_plan(c, p.plan, k.dtype);
      ASSERT_TRUE(dm.fp8());
      const cuda::DeviceLayer& L = dm.layers[0];
      const int64_t rows = c.q_dim() + 2 * c.kv_dim();
      ASSERT_EQ(L.w_qkv.bytes(), static_cast<size_t>(rows * c.hidden));
      std::vector<float> scales(static_cast<size_t>(rows));
      cuda_ok(cudaMemcpy(scales.data(), L.s_qkv.get(), scales.size() * 4, cudaMemcpyDeviceToHost), "scales");
      std::vector<float> expected;
      for (const WeightSlot s : {WeightSlot::Wq, WeightSlot::Wk, WeightSlot::Wv}) {
        const PlannedTensor* t = p.plan.find(s, 0);
        expected.insert(expected.end(), t->fp8_scales.begin(), t->fp8_scales.end());
      }
      EXPECT_EQ(scales, expected);
      std::vector<uint8_t> bytes(static_cast<size_t>(c.kv_dim() * c.hidden));
      const PlannedTensor* wk = p.plan.find(WeightSlot::Wk, 0);
      cuda_ok(
          cudaMemcpy(bytes.data(), L.w_qkv.as<uint8_t>() + c.q_dim() * c.hidden, bytes.size(), cudaMemcpyDeviceToHost),
          "k bytes");
      EXPECT_EQ(std::memcmp(bytes.data(), wk->src.data, bytes.size()), 0);
      EXPECT_FALSE(L.s_o.empty() || L.s_in.empty() || L.s_down.empty());
    }

    const LoadedModel cpu_model = load_model(dir);
    const EngineLimits l = small_step_limits(c, 1024);
    CpuEngine cpu(c, cpu_model.weights, l);
    // --quantization fp8 on an FP8 checkpoint keeps it as it is: the same logits as none.
    std::unique_ptr<Engine> gpu = plan_gpu_engine(c, p.plan, l);
    std::unique_ptr<Engine> gpu_q = plan_gpu_engine(c, p.plan, l, "fp8");

    // A prefill step (cuBLASLt's FP8 GEMM, x quantized per token, which the CPU does not do), then
    // decode steps of three rows (GEMV and flat GEMM, x kept 16-bit). Bounds as test_fp8.cpp's
    // model test, whose CPU reference also runs the very weights the GPU holds.
    step_engines_alike({&cpu, gpu.get(), gpu_q.get()}, c.vocab_size, 3, 60, {40, 1, 1, 1, 1},
                       [&](size_t st, const std::vector<StepOutput>& o) {
      // The same weights (re-quantizing would differ by ~1e-3); the bound only allows for a kernel
      // that sums in a nondeterministic order.
      EXPECT_LE(nmse(o[2].logits, o[1].logits), 1e-10) << "--quantization fp8 changed an FP8 checkpoint";
      // Looser than test_fp8.cpp's (1e-2, 2e-3): on an H100 (2026-12-05) these fixtures' prefill
      // rows reached 1.1e-2 (llama_ct_channel) and their decode rows 2.0e-3 to 3.7e-3, carried in
      // the KV cache from the prefill's per-token quantized activations; with other random tokens
      // (the suite run without the tests before it, 2026-12-06) a decode row reached 7.4e-3. A
      // wrong scale gives O(1).
      const double bound = st == 0 ? 2e-2 : 1e-2;
      for (int r = 0; r < 3; ++r) {
        const double e = nmse(row_logits(o[1], r, c.vocab_size), row_logits(o[0], r, c.vocab_size));
        EXPECT_LE(e, bound) << "step " << st << " row " << r;
        std::printf("fp8 checkpoint %s step %zu row %d: NMSE %.3e (bound %.0e)\n", k.name, st, r, e, bound);
      }
    });
  }
}

}  // namespace
}  // namespace fdpp::test
