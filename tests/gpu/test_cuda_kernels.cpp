// CUDA kernels (src/backend/cuda/kernels.h) against the CPU reference (backend/cpu/ops.h,
// engine/sampler.h): fp16 and bf16, fresh random inputs each run (seed printed; FDPP_TEST_SEED
// replays), outputs poisoned with NaN before every launch, odd sizes, GQA ratios 1..20, paged caches
// with scrambled block tables and NaN in every slot that must not be read, adversarial attention
// logits, and the sampler's filters, tie-breaking, determinism and distribution.
// Skipped (GTEST_SKIP) where no GPU is usable. Sizes are kept small enough for compute-sanitizer.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cmath>
#include <map>
#include <memory>
#include <numeric>
#include <set>
#include <random>

#include "attention/unified_max.h"
#include "backend/cpu/ops.h"
#include "core/fp8_e4m3.h"
#include "engine/sampler.h"
#include "fdpp/error.h"
#include "gpu/gpu_test_util.h"

namespace fdpp::test {
namespace {

using cuda::DeviceSamplingParams;

constexpr DType kTypes[] = {DType::F16, DType::BF16};

[[maybe_unused]] ::testing::Environment* const nmse_report = ::testing::AddGlobalTestEnvironment(new NmseReport);

std::string label(const char* what, DType t) { return std::string(what) + "/" + name(t); }

// ================================================================================================
// embedding
// ================================================================================================

TEST_F(CudaKernels, EmbeddingEqualsTableRowsPlusPositions) {
  for (DType t : kTypes) {
    for (int dim : {1, 7, 64, 4096, 4099}) {
      for (bool with_pos : {false, true}) {
        for (int n_tokens : {1, 5}) {
          const int vocab = 37, n_pos = 40, pos_offset = with_pos ? 2 : 0;
          std::vector<float> table_f, pos_f;
          const auto table = random_bits(size_t(vocab) * dim, t, table_f);
          const auto pos = random_bits(size_t(n_pos) * dim, t, pos_f);
          std::vector<int32_t> ids(n_tokens), positions(n_tokens);
          for (int i = 0; i < n_tokens; ++i) {
            ids[i] = uniform_int(0, vocab - 1);
            positions[i] = uniform_int(0, n_pos - 1 - pos_offset);
          }
          DeviceBuffer<uint16_t> d_table(table), d_pos(pos);
          DeviceBuffer<int32_t> d_ids(ids), d_positions(positions);
          DeviceBuffer<float> d_x(size_t(n_tokens) * dim);
          d_x.poison();
          cuda::embedding(d_table.get(), with_pos ? d_pos.get() : nullptr, pos_offset, t, d_ids.get(),
                          d_positions.get(), n_tokens, dim, d_x.get(), nullptr);
          sync("embedding");
          const auto x = d_x.download();
          size_t mismatches = 0;
          for (int i = 0; i < n_tokens; ++i)
            for (int c = 0; c < dim; ++c) {
              float ref = table_f[size_t(ids[i]) * dim + c];
              if (with_pos) ref += pos_f[size_t(positions[i] + pos_offset) * dim + c];
              if (!(x[size_t(i) * dim + c] == ref)) ++mismatches;  // NaN counts as a mismatch
            }
          EXPECT_EQ(mismatches, 0u) << label("embedding", t) << " dim " << dim << " pos " << with_pos << " tokens "
                                    << n_tokens;
        }
      }
    }
  }
}

TEST_F(CudaKernels, EmbeddingScalarPathOnUnalignedTable) {
  const DType t = DType::BF16;
  const int vocab = 5, dim = 64, n_tokens = 3;
  std::vector<float> table_f;
  const auto table = random_bits(size_t(vocab) * dim + 1, t, table_f);
  const std::vector<int32_t> ids{4, 0, 2};
  DeviceBuffer<uint16_t> d_table(table);
  DeviceBuffer<int32_t> d_ids(ids);
  DeviceBuffer<float> d_x(size_t(n_tokens) * dim);
  d_x.poison();
  cuda::embedding(d_table.get() + 1, nullptr, 0, t, d_ids.get(), nullptr, n_tokens, dim, d_x.get(), nullptr);
  sync("embedding");
  const auto x = d_x.download();
  for (int i = 0; i < n_tokens; ++i)
    for (int c = 0; c < dim; ++c) ASSERT_EQ(x[size_t(i) * dim + c], table_f[1 + size_t(ids[i]) * dim + c]) << i << "," << c;
}

// ================================================================================================
// residual + norm
// ================================================================================================

struct NormCase {
  NormType norm;
  int rows, dim;
  bool delta, delta_bias, bias, write_back, out;
  int misalign;  // elements by which every 16-bit pointer is offset (1: forces the scalar path)
};

void run_norm(DType t, const NormCase& c) {
  const size_t n = size_t(c.rows) * c.dim;
  const int pad = c.misalign;
  std::vector<float> x0 = random_vector(n, 2.f), delta_f, db_f, w_f, b_f;
  for (size_t i = 0; i < n; ++i) x0[i] += 0.5f;  // a non-zero mean for LayerNorm
  const auto delta = random_bits(n + pad, t, delta_f);
  const auto db = random_bits(size_t(c.dim) + pad, t, db_f, 0.3f);
  const auto w = random_bits(size_t(c.dim) + pad, t, w_f);
  const auto b = random_bits(size_t(c.dim) + pad, t, b_f);
  DeviceBuffer<float> d_x(x0);
  DeviceBuffer<uint16_t> d_delta(delta), d_db(db), d_w(w), d_b(b), d_out(n + pad);
  d_out.poison();
  cuda::residual_norm(d_x.get(), c.delta ? d_delta.get() + pad : nullptr,
                      c.delta && c.delta_bias ? d_db.get() + pad : nullptr, d_w.get() + pad,
                      c.bias ? d_b.get() + pad : nullptr, c.out ? d_out.get() + pad : nullptr, c.rows, c.dim, 1e-5,
                      c.norm, c.write_back, t, nullptr);
  sync("residual_norm");

  // Reference: the stream after the add (same fp32 operations as the kernel), then the CPU norm.
  std::vector<float> x1 = x0;
  if (c.delta)
    for (int r = 0; r < c.rows; ++r)
      for (int i = 0; i < c.dim; ++i) {
        float d = delta_f[pad + size_t(r) * c.dim + i];
        if (c.delta_bias) d += db_f[pad + i];
        x1[size_t(r) * c.dim + i] += d;
      }
  const std::vector<float> wv(w_f.begin() + pad, w_f.end()), bv(b_f.begin() + pad, b_f.end());
  std::vector<float> y(n);
  if (c.norm == NormType::RMSNorm) {
    cpu::rms_norm(x1.data(), wv.data(), c.rows, c.dim, 1e-5, y.data());
  } else {
    cpu::layer_norm(x1.data(), wv.data(), c.bias ? bv.data() : nullptr, c.rows, c.dim, 1e-5, y.data());
  }
  std::ostringstream what;
  what << label("residual_norm", t) << (c.norm == NormType::RMSNorm ? " rms" : " layer") << " rows " << c.rows
       << " dim " << c.dim << " delta " << c.delta << " delta_bias " << c.delta_bias << " bias " << c.bias
       << " write_back " << c.write_back << " out " << c.out << " misalign " << c.misalign;
  if (c.out) {
    auto out_bits = d_out.download();
    out_bits.erase(out_bits.begin(), out_bits.begin() + pad);
    expect_close(from_bits(out_bits, t), y, rounding_tolerance(t), what.str() + " [out]");
  }
  const auto x = d_x.download();
  // The stream: y (fp32) when written back, else the sum (bit-exact: the same fp32 additions).
  expect_close(x, c.write_back ? y : x1, {1e-10, 1e-5, 1e-6}, what.str() + " [x]");
}

TEST_F(CudaKernels, ResidualNormMatchesCpu) {
  for (DType t : kTypes) {
    for (NormType norm : {NormType::RMSNorm, NormType::LayerNorm}) {
      const bool ln = norm == NormType::LayerNorm;
      const NormCase cases[] = {
          {norm, 1, 1, true, false, false, false, true, 0},
          {norm, 3, 13, true, true, ln, false, true, 0},
          {norm, 17, 64, false, false, ln, false, true, 0},
          {norm, 2, 576, true, true, ln, true, true, 0},
          {norm, 5, 4096, true, false, ln, false, true, 0},
          {norm, 3, 4099, true, true, ln, true, true, 0},
          {norm, 2, 8192, true, true, ln, true, false, 0},   // write-back only, no 16-bit output
          {norm, 4, 4096, true, true, ln, true, true, 1},    // misaligned: scalar path on dim % 8 == 0
          {norm, 1, 16384, true, false, false, false, true, 0},
      };
      for (const auto& c : cases) run_norm(t, c);
    }
  }
}

// ================================================================================================
// element-wise
// ================================================================================================

TEST_F(CudaKernels, AddBiasSiluMulRelu) {
  for (DType t : kTypes) {
    for (auto [rows, n] : {std::pair{1, 1}, {3, 7}, {2, 8}, {7, 4104}, {3, 11011}}) {
      for (int misalign : {0, 1}) {
        if (misalign && n % 8 != 0) continue;
        const size_t total = size_t(rows) * n;
        std::ostringstream what;
        what << name(t) << " rows " << rows << " n " << n << " misalign " << misalign;
        // add_bias: one fp32 addition and one rounding, so bit-exact with the host rounding.
        {
          std::vector<float> x_f, b_f;
          const auto x = random_bits(total + misalign, t, x_f);
          const auto b = random_bits(size_t(n) + misalign, t, b_f);
          DeviceBuffer<uint16_t> d_x(x), d_b(b);
          cuda::add_bias(d_x.get() + misalign, d_b.get() + misalign, rows, n, t, nullptr);
          sync("add_bias");
          const auto got = d_x.download();
          size_t bad = 0;
          for (size_t i = 0; i < total; ++i) {
            const uint16_t want = to_bits(x_f[misalign + i] + b_f[misalign + i % n], t);
            bad += got[misalign + i] != want;
          }
          EXPECT_EQ(bad, 0u) << "add_bias " << what.str();
        }
        // silu_mul: [rows, 2n] -> [rows, n].
        {
          std::vector<float> gu_f;
          const auto gu = random_bits(2 * total + misalign, t, gu_f, 3.f);
          DeviceBuffer<uint16_t> d_gu(gu), d_out(total + misalign);
          d_out.poison();
          cuda::silu_mul(d_gu.get() + misalign, d_out.get() + misalign, rows, n, t, nullptr);
          sync("silu_mul");
          std::vector<float> gate(total), up(total), ref(total);
          for (int r = 0; r < rows; ++r)
            for (int i = 0; i < n; ++i) {
              gate[size_t(r) * n + i] = gu_f[misalign + size_t(r) * 2 * n + i];
              up[size_t(r) * n + i] = gu_f[misalign + size_t(r) * 2 * n + n + i];
            }
          cpu::silu_mul(gate.data(), up.data(), int64_t(total), ref.data());
          auto got = d_out.download();
          got.erase(got.begin(), got.begin() + misalign);
          expect_close(from_bits(got, t), ref, rounding_tolerance(t), "silu_mul " + what.str());
        }
        // relu: exact.
        {
          std::vector<float> x_f;
          const auto x = random_bits(total + misalign, t, x_f);
          DeviceBuffer<uint16_t> d_x(x);
          cuda::relu(d_x.get() + misalign, rows, n, t, nullptr);
          sync("relu");
          const auto got = d_x.download();
          size_t bad = 0;
          for (size_t i = 0; i < total; ++i) {
            const float want = x_f[misalign + i] > 0 ? x_f[misalign + i] : 0.f;
            bad += from_bits(got[misalign + i], t) != want;
          }
          EXPECT_EQ(bad, 0u) << "relu " << what.str();
        }
      }
    }
  }
}

// head_rms_norm (Qwen3's q/k norms) on the fused qkv rows against cpu::rms_norm over the q and k
// heads, v untouched bit for bit, and on whole rows (one head, no k heads: Gemma's sandwich norms,
// a block per row); add_scalar (a load-time transform) with one rounding.
TEST_F(CudaKernels, HeadRmsNormAndAddScalar) {
  for (DType t : kTypes) {
    for (auto [tokens, heads, kv_heads, hd] : {std::tuple{1, 1, 1, 64}, {3, 4, 2, 128}, {5, 6, 1, 96}, {2, 3, 3, 37},
                                               {1, 1, 0, 3584}, {4, 1, 0, 3584}, {3, 1, 0, 1001}}) {
      const int row = (heads + 2 * kv_heads) * hd;
      std::vector<float> x_f, qw_f, kw_f;
      const auto x = random_bits(size_t(tokens) * row, t, x_f, 3.f);
      const auto qw = random_bits(size_t(hd), t, qw_f);
      const auto kw = random_bits(size_t(hd), t, kw_f);
      DeviceBuffer<uint16_t> d_x(x), d_qw(qw), d_kw(kw);
      cuda::head_rms_norm(d_x.get(), tokens, heads, kv_heads, hd, d_qw.get(), d_kw.get(), 1e-6, t, nullptr);
      sync("head_rms_norm");
      const auto got = d_x.download();
      std::vector<float> ref(x_f), out;
      for (int tok = 0; tok < tokens; ++tok) {
        float* r = ref.data() + size_t(tok) * row;
        cpu::rms_norm(r, qw_f.data(), heads, hd, 1e-6, r);
        cpu::rms_norm(r + size_t(heads) * hd, kw_f.data(), kv_heads, hd, 1e-6, r + size_t(heads) * hd);
      }
      std::ostringstream what;
      what << name(t) << " tokens " << tokens << " heads " << heads << "/" << kv_heads << " hd " << hd;
      expect_close(from_bits(got, t), ref, rounding_tolerance(t), "head_rms_norm " + what.str());
      size_t v_changed = 0;
      for (int tok = 0; tok < tokens; ++tok)
        for (int i = (heads + kv_heads) * hd; i < row; ++i) v_changed += got[size_t(tok) * row + i] != x[size_t(tok) * row + i];
      EXPECT_EQ(v_changed, 0u) << what.str();
    }
    std::vector<float> y_f;
    const auto y = random_bits(1001, t, y_f);
    DeviceBuffer<uint16_t> d_y(y);
    cuda::add_scalar(d_y.get(), 1001, 1.0f, t, nullptr);
    sync("add_scalar");
    const auto got = d_y.download();
    size_t bad = 0;
    for (size_t i = 0; i < y.size(); ++i) bad += got[i] != to_bits(y_f[i] + 1.0f, t);
    EXPECT_EQ(bad, 0u) << name(t);
  }
}

// ================================================================================================
// rope
// ================================================================================================

// rotary_scale (LongRoPE's attention factor) scales the rotated dims only: the last two cases, a
// whole head and Phi-4-mini's partial rotary shape at head_dim 96.
TEST_F(CudaKernels, RopeMatchesCpuBothStylesPartialRotaryLongPositions) {
  struct Case {
    int head_dim, n_freq, n_heads, n_kv_heads, n_tokens;
    float rotary_scale = 1.f;
  };
  const Case cases[] = {{64, 32, 4, 4, 1},  {128, 64, 8, 2, 7},        {128, 32, 16, 1, 5}, {80, 16, 6, 3, 3},
                        {64, 1, 2, 1, 2},   {128, 64, 4, 2, 3, 1.19f}, {96, 36, 6, 2, 4, 1.19f}};
  for (DType t : kTypes) {
    for (RopeStyle style : {RopeStyle::RotateHalf, RopeStyle::Interleaved}) {
      for (const auto& c : cases) {
        const int D = c.head_dim, H = c.n_heads, KVH = c.n_kv_heads, T = c.n_tokens;
        const int width = (H + 2 * KVH) * D;
        std::vector<float> qkv_f;
        const auto qkv = random_bits(size_t(T) * width, t, qkv_f);
        std::vector<int32_t> positions(T);
        for (int i = 0; i < T; ++i) positions[i] = i == 0 ? 0 : uniform_int(0, 131071);
        RopeConfig rc;
        rc.theta = 500000.0;
        rc.rotary_dim = 2 * c.n_freq;
        const auto inv_d = cpu::rope_inv_freq(rc);
        std::vector<float> inv_f(inv_d.begin(), inv_d.end());
        const std::vector<double> inv_exact(inv_f.begin(), inv_f.end());  // what the kernel sees

        DeviceBuffer<uint16_t> d_qkv(qkv);
        DeviceBuffer<int32_t> d_pos(positions);
        DeviceBuffer<float> d_inv(inv_f);
        cuda::rope_qk(d_qkv.get(), d_pos.get(), d_inv.get(), c.n_freq, T, H, KVH, D, style, t, nullptr,
                      c.rotary_scale);
        sync("rope_qk");
        const auto got_bits = d_qkv.download();

        std::vector<float> q(size_t(T) * H * D), k(size_t(T) * KVH * D);
        for (int i = 0; i < T; ++i) {
          std::copy_n(&qkv_f[size_t(i) * width], H * D, &q[size_t(i) * H * D]);
          std::copy_n(&qkv_f[size_t(i) * width + H * D], KVH * D, &k[size_t(i) * KVH * D]);
        }
        cpu::rope(q.data(), T, H, D, style, inv_exact, positions);
        cpu::rope(k.data(), T, KVH, D, style, inv_exact, positions);
        std::vector<float> got_q, got_k, ref_q, ref_k;
        size_t untouched_bad = 0;
        for (int i = 0; i < T; ++i)
          for (int j = 0; j < width; ++j) {
            const size_t at = size_t(i) * width + j;
            const int head_pos = j % D;
            const bool rotated = j < (H + KVH) * D && head_pos < 2 * c.n_freq;
            if (!rotated) {
              untouched_bad += got_bits[at] != qkv[at];  // v heads and the pass-through dims: bit-exact
            } else if (j < H * D) {
              got_q.push_back(from_bits(got_bits[at], t));
              ref_q.push_back(q[size_t(i) * H * D + j] * c.rotary_scale);
            } else {
              got_k.push_back(from_bits(got_bits[at], t));
              ref_k.push_back(k[size_t(i) * KVH * D + j - H * D] * c.rotary_scale);
            }
          }
        std::ostringstream what;
        what << label("rope_qk", t) << (style == RopeStyle::RotateHalf ? " rotate-half" : " interleaved") << " D "
             << D << " n_freq " << c.n_freq << " H " << H << " KVH " << KVH << " T " << T << " rotary_scale "
             << c.rotary_scale;
        EXPECT_EQ(untouched_bad, 0u) << what.str() << ": elements outside the rotary dims changed";
        expect_close(got_q, ref_q, rounding_tolerance(t), what.str() + " [q]");
        expect_close(got_k, ref_k, rounding_tolerance(t), what.str() + " [k]");
      }
    }
  }
}

// ================================================================================================
// KV cache write
// ================================================================================================

TEST_F(CudaKernels, KvCacheWriteCopiesToScrambledSlotsOnly) {
  struct Case {
    int head_dim, n_heads, n_kv_heads, n_tokens, misalign;
  };
  const Case cases[] = {{64, 4, 4, 1, 0}, {128, 32, 8, 13, 0}, {72, 6, 2, 5, 0}, {20, 3, 1, 4, 0}, {128, 8, 2, 3, 1}};
  for (const bool head_major : {true, false})
    for (const auto& c : cases) {
      cuda::KernelOptions options;
      options.kv_head_major = head_major;
      const cuda::KernelOptionsScope scope(options);
      const DType t = DType::F16;  // bits are copied, the type does not matter
      const int D = c.head_dim, H = c.n_heads, KVH = c.n_kv_heads, T = c.n_tokens;
      const int width = (H + 2 * KVH) * D, block_size = 16, num_blocks = 4;
      const int n_slots = num_blocks * block_size;
      std::vector<float> unused;
      const auto qkv = random_bits(size_t(T) * width + c.misalign, t, unused);
      const auto perm = permutation(n_slots);
      std::vector<int32_t> slots(perm.begin(), perm.begin() + T);
      if (T > 2) slots[1] = -1;  // padding token: skipped
      DeviceBuffer<uint16_t> d_qkv(qkv), d_k(size_t(n_slots) * KVH * D + c.misalign),
          d_v(size_t(n_slots) * KVH * D + c.misalign);
      DeviceBuffer<int32_t> d_slots(slots);
      d_k.poison();
      d_v.poison();
      cuda::kv_cache_write(d_qkv.get() + c.misalign, d_slots.get(), T, H, KVH, D, block_size, d_k.get() + c.misalign,
                           d_v.get() + c.misalign, t, nullptr);
      sync("kv_cache_write");
      const auto k = d_k.download(), v = d_v.download();
      std::vector<uint16_t> want_k(k.size(), 0xFFFF), want_v(v.size(), 0xFFFF);
      // Where each row goes, written out for both layouts (not through kv_cache_layout.h, which the
      // kernel uses).
      auto row = [&](int slot, int h) {
        const size_t block = slot / block_size, key = slot % block_size;
        return head_major ? ((block * KVH + h) * block_size + key) * D : (size_t(slot) * KVH + h) * D;
      };
      for (int i = 0; i < T; ++i) {
        if (slots[i] < 0) continue;
        for (int h = 0; h < KVH; ++h)
          for (int d = 0; d < D; ++d) {
            const size_t dst = c.misalign + row(slots[i], h) + d;
            want_k[dst] = qkv[c.misalign + size_t(i) * width + size_t(H + h) * D + d];
            want_v[dst] = qkv[c.misalign + size_t(i) * width + size_t(H + KVH + h) * D + d];
          }
      }
      size_t bad_k = 0, bad_v = 0;
      for (size_t i = 0; i < k.size(); ++i) {
        bad_k += k[i] != want_k[i];
        bad_v += v[i] != want_v[i];
      }
      EXPECT_EQ(bad_k + bad_v, 0u) << "kv_cache_write " << (head_major ? "head-major" : "token-major") << " D " << D
                                   << " H " << H << " KVH " << KVH << " T " << T << " misalign " << c.misalign << ": "
                                   << bad_k << " k and " << bad_v << " v elements differ (written or untouched)";
    }
}

// ---- the fp8 (e4m3) cache: --kv-cache-dtype fp8 ----
// A value x of the model's 16-bit type is stored as e4m3(x / scale), saturating at +-448 (kernels.h:
// KvQuant); the expected bytes come from the host conversion (core/fp8_e4m3.h), bit-exact with
// CUDA's SATFINITE one.

// The tests' fp8 scales: far from 1 and from each other, so that a k_scale or v_scale applied in the
// wrong place, or not at all, shows.
constexpr cuda::KvQuant kFp8Kv{cuda::KvDType::Fp8E4M3, 0.03f, 2.f};
constexpr cuda::KvQuant kFp8Unscaled{cuda::KvDType::Fp8E4M3, 1.f, 1.f};
bool is_fp8(const cuda::KvQuant& q) { return q.dtype == cuda::KvDType::Fp8E4M3; }

// The byte an fp8 cache holds for the 16-bit value `bits`.
uint8_t fp8_of(uint16_t bits, DType t, float scale) { return fp8_e4m3_from_float(from_bits(bits, t) / scale); }

// Random values for an e4m3 cache of scale `scale`, in four kinds by index: ordinary, past +-448 x
// scale about a third of the time (saturating), e4m3 subnormals and zeros (below 2^-6 x scale), and
// around the top of the range; the first few are the edges themselves (448, the tie 464, 2^-10).
std::vector<float> fp8_test_values(size_t n, float scale) {
  std::vector<float> v = random_vector(n, 1.f);
  for (size_t i = 0; i < n; ++i) {
    switch (i % 4) {
      case 0: v[i] *= scale; break;
      case 1: v[i] *= 448.f * scale; break;
      case 2: v[i] *= 0x1p-7f * scale; break;
      case 3: v[i] *= 60.f * scale; break;
    }
  }
  const float edges[] = {448.f, -464.f, 464.f, 0x1p-10f, -0x1p-9f, 0.f, -0.f, 1e4f};
  for (size_t i = 0; i < std::size(edges) && i < n; ++i) v[i] = edges[i] * scale;
  return v;
}

TEST_F(CudaKernels, KvCacheWriteFp8QuantizesIntoScrambledSlotsOnly) {
  struct Case {
    int head_dim, n_heads, n_kv_heads, n_tokens, misalign;  // misalign: elements of qkv, bytes of the caches
  };
  const Case cases[] = {{64, 4, 4, 1, 0}, {128, 32, 8, 13, 0}, {256, 4, 2, 5, 0}, {128, 8, 2, 3, 1}, {64, 6, 3, 9, 1}};
  const cuda::KvQuant quants[] = {kFp8Kv, kFp8Unscaled, {cuda::KvDType::Fp8E4M3, 0.37f, 5.f}};
  for (DType t : kTypes)
    for (const cuda::KvQuant& quant : quants)
      for (const bool head_major : {true, false})
        for (const auto& c : cases) {
          cuda::KernelOptions options;
          options.kv_head_major = head_major;
          const cuda::KernelOptionsScope scope(options);
          const int D = c.head_dim, H = c.n_heads, KVH = c.n_kv_heads, T = c.n_tokens;
          const int width = (H + 2 * KVH) * D, block_size = 16, num_blocks = 4;
          const int n_slots = num_blocks * block_size;
          // k heads sized for k_scale, v heads for v_scale (q heads are not read).
          std::vector<float> values(size_t(T) * width + c.misalign);
          const auto kv = fp8_test_values(values.size(), quant.k_scale), vv = fp8_test_values(values.size(), quant.v_scale);
          for (size_t i = 0; i < values.size(); ++i)
            values[i] = (i + width - c.misalign) % width >= size_t(H + KVH) * D ? vv[i] : kv[i];
          const auto qkv = to_bits(values, t);
          const auto perm = permutation(n_slots);
          std::vector<int32_t> slots(perm.begin(), perm.begin() + T);
          if (T > 2) slots[1] = -1;  // padding token: skipped
          DeviceBuffer<uint16_t> d_qkv(qkv);
          DeviceBuffer<uint8_t> d_k(size_t(n_slots) * KVH * D + c.misalign), d_v(size_t(n_slots) * KVH * D + c.misalign);
          DeviceBuffer<int32_t> d_slots(slots);
          d_k.poison();  // 0xFF: e4m3 NaN
          d_v.poison();
          cuda::kv_cache_write(d_qkv.get() + c.misalign, d_slots.get(), T, H, KVH, D, block_size,
                               d_k.get() + c.misalign, d_v.get() + c.misalign, t, nullptr, quant);
          sync("kv_cache_write (fp8)");
          const auto k = d_k.download(), v = d_v.download();
          std::vector<uint8_t> want_k(k.size(), 0xFF), want_v(v.size(), 0xFF);
          auto row = [&](int slot, int h) {  // written out for both layouts, as the 16-bit test does
            const size_t block = slot / block_size, key = slot % block_size;
            return head_major ? ((block * KVH + h) * block_size + key) * D : (size_t(slot) * KVH + h) * D;
          };
          size_t saturated = 0, subnormal = 0;
          for (int i = 0; i < T; ++i) {
            if (slots[i] < 0) continue;
            for (int h = 0; h < KVH; ++h)
              for (int d = 0; d < D; ++d) {
                const size_t dst = c.misalign + row(slots[i], h) + d;
                const size_t src = c.misalign + size_t(i) * width + size_t(H + h) * D + d;
                want_k[dst] = fp8_of(qkv[src], t, quant.k_scale);
                want_v[dst] = fp8_of(qkv[src + size_t(KVH) * D], t, quant.v_scale);
                saturated += (want_k[dst] & 0x7F) == 0x7E;
                subnormal += (want_k[dst] & 0x78) == 0;
              }
          }
          size_t bad_k = 0, bad_v = 0;
          std::ostringstream first;
          for (size_t i = 0; i < k.size(); ++i) {
            if ((k[i] != want_k[i] || v[i] != want_v[i]) && bad_k + bad_v < 4)
              first << " [" << i << "] k " << int(k[i]) << " want " << int(want_k[i]) << ", v " << int(v[i])
                    << " want " << int(want_v[i]) << ";";
            bad_k += k[i] != want_k[i];
            bad_v += v[i] != want_v[i];
          }
          EXPECT_EQ(bad_k + bad_v, 0u) << "kv_cache_write fp8 " << name(t) << " k_scale " << quant.k_scale
                                       << " v_scale " << quant.v_scale << (head_major ? " head-major" : " token-major")
                                       << " D " << D << " H " << H << " KVH " << KVH << " T " << T << " misalign "
                                       << c.misalign << ": " << bad_k << " k and " << bad_v
                                       << " v bytes differ (written or untouched):" << first.str();
          EXPECT_GT(saturated, 0u) << "no value past 448: the case does not test saturation";
          EXPECT_GT(subnormal, 0u) << "no e4m3 subnormal or zero: the case does not test them";
        }
}

// rope_qk_cache into an fp8 cache writes the bytes of rope_qk then kv_cache_write (bit for bit:
// the rotated k is rounded to the 16-bit type, then quantized), which are the host's quantization of
// rope_qk's output; q is rotated in place as rope_qk does; both styles, partial rotary, every fp8 head
// dim, both layouts, a skipped slot, untouched bytes left as they were.
TEST_F(CudaKernels, RopeQkCacheFp8EqualsRopeThenCacheWriteBitForBit) {
  for (DType t : kTypes)
    for (RopeStyle style : {RopeStyle::RotateHalf, RopeStyle::Interleaved})
      for (int D : {64, 128, 256})
        for (int n_freq : {D / 2, D / 8})
          for (const cuda::KvQuant& quant : {kFp8Kv, kFp8Unscaled})
            for (const bool head_major : {true, false}) {
              cuda::KernelOptions options;
              options.kv_head_major = head_major;
              const cuda::KernelOptionsScope scope(options);
              const int T = 7, H = 6, KVH = 2, block_size = 8, n_slots = 40;
              const int width = (H + 2 * KVH) * D;
              std::vector<float> values(size_t(T) * width);
              const auto kv = fp8_test_values(values.size(), quant.k_scale), vv = fp8_test_values(values.size(), quant.v_scale);
              for (size_t i = 0; i < values.size(); ++i) values[i] = i % width >= size_t(H + KVH) * D ? vv[i] : kv[i];
              const auto qkv = to_bits(values, t);
              const std::vector<int32_t> positions{0, 3, 100, 4095, 7, 131071, 9}, slots{5, 0, 39, -1, 17, 18, 2};
              std::vector<float> inv(n_freq);
              for (int i = 0; i < n_freq; ++i) inv[i] = 1.0f / std::pow(10000.0f, 2.0f * i / (2 * n_freq));
              DeviceBuffer<uint16_t> q1(qkv), q2(qkv);
              DeviceBuffer<int32_t> d_pos(positions), d_slots(slots);
              DeviceBuffer<float> d_inv(inv);
              const size_t cache = size_t(n_slots) * KVH * D;
              DeviceBuffer<uint8_t> k1(cache), v1(cache), k2(cache), v2(cache);
              for (auto* b : {&k1, &v1, &k2, &v2}) b->poison();
              cuda::rope_qk(q1.get(), d_pos.get(), d_inv.get(), n_freq, T, H, KVH, D, style, t, nullptr);
              cuda::kv_cache_write(q1.get(), d_slots.get(), T, H, KVH, D, block_size, k1.get(), v1.get(), t, nullptr,
                                   quant);
              cuda::rope_qk_cache(q2.get(), d_pos.get(), d_inv.get(), n_freq, d_slots.get(), T, H, KVH, D, block_size,
                                  style, k2.get(), v2.get(), t, nullptr, quant);
              sync("rope_qk_cache (fp8)");
              std::ostringstream what;
              what << "rope_qk_cache fp8 " << name(t) << (style == RopeStyle::RotateHalf ? " rotate-half" : " interleaved")
                   << " D " << D << " n_freq " << n_freq << " k_scale " << quant.k_scale
                   << (head_major ? " head-major" : " token-major");
              const auto rotated = q1.download(), fused_q = q2.download();
              const auto k_sep = k1.download(), v_sep = v1.download(), k_fused = k2.download(), v_fused = v2.download();
              EXPECT_TRUE(k_sep == k_fused) << what.str() << ": k bytes differ from rope_qk + kv_cache_write";
              EXPECT_TRUE(v_sep == v_fused) << what.str() << ": v bytes differ from rope_qk + kv_cache_write";
              size_t q_bad = 0;
              for (int i = 0; i < T; ++i)
                for (int j = 0; j < H * D; ++j) q_bad += rotated[size_t(i) * width + j] != fused_q[size_t(i) * width + j];
              EXPECT_EQ(q_bad, 0u) << what.str() << ": q differs from rope_qk's";
              // The host's quantization of rope_qk's rotated k and its v.
              auto row = [&](int slot, int h) {  // written out for both layouts, as the 16-bit test does
                const size_t block = slot / block_size, key = slot % block_size;
                return head_major ? ((block * KVH + h) * block_size + key) * D : (size_t(slot) * KVH + h) * D;
              };
              std::vector<uint8_t> want_k(cache, 0xFF), want_v(cache, 0xFF);
              for (int i = 0; i < T; ++i) {
                if (slots[i] < 0) continue;
                for (int h = 0; h < KVH; ++h)
                  for (int d = 0; d < D; ++d) {
                    const size_t src = size_t(i) * width + size_t(H + h) * D + d;
                    const size_t dst = row(slots[i], h) + d;
                    want_k[dst] = fp8_of(rotated[src], t, quant.k_scale);
                    want_v[dst] = fp8_of(rotated[src + size_t(KVH) * D], t, quant.v_scale);
                  }
              }
              size_t bad = 0;
              for (size_t i = 0; i < cache; ++i) bad += (k_fused[i] != want_k[i]) + (v_fused[i] != want_v[i]);
              EXPECT_EQ(bad, 0u) << what.str() << ": bytes differ from the host's e4m3 of the rotated values";
            }
}

// rope_qk_cache with Qwen3's q/k norms folded in equals head_rms_norm followed by rope_qk_cache,
// bit for bit: q (every dim normed, the rotated ones rotated), the k and v bytes of the 16-bit and
// e4m3 caches in both layouts; both styles, partial rotary, a skipped slot, head dims 64 to 256.
TEST_F(CudaKernels, RopeQkCacheWithHeadNormEqualsHeadNormThenRope) {
  for (DType t : kTypes)
    for (RopeStyle style : {RopeStyle::RotateHalf, RopeStyle::Interleaved})
      for (int D : {64, 128, 256})
        for (int n_freq : {D / 2, D / 8})
          for (const bool fp8 : {false, true})
            for (const bool head_major : {true, false}) {
              cuda::KernelOptions options;
              options.kv_head_major = head_major;
              const cuda::KernelOptionsScope scope(options);
              const cuda::KvQuant quant = fp8 ? kFp8Kv : cuda::KvQuant{};
              const int T = 7, H = 6, KVH = 2, block_size = 8, n_slots = 40;
              const int width = (H + 2 * KVH) * D;
              std::vector<float> x_f, qw_f, kw_f;
              const auto qkv = random_bits(size_t(T) * width, t, x_f, 3.f);
              const auto qw = random_bits(size_t(D), t, qw_f), kw = random_bits(size_t(D), t, kw_f);
              const std::vector<int32_t> positions{0, 3, 100, 4095, 7, 131071, 9}, slots{5, 0, 39, -1, 17, 18, 2};
              std::vector<float> inv(n_freq);
              for (int i = 0; i < n_freq; ++i) inv[i] = 1.0f / std::pow(10000.0f, 2.0f * i / (2 * n_freq));
              DeviceBuffer<uint16_t> q1(qkv), q2(qkv), d_qw(qw), d_kw(kw);
              DeviceBuffer<int32_t> d_pos(positions), d_slots(slots);
              DeviceBuffer<float> d_inv(inv);
              const size_t cache_bytes = size_t(n_slots) * KVH * D * (fp8 ? 1 : 2);
              DeviceBuffer<uint8_t> k1(cache_bytes), v1(cache_bytes), k2(cache_bytes), v2(cache_bytes);
              for (auto* b : {&k1, &v1, &k2, &v2}) b->poison();
              const float eps = 1e-6f;
              cuda::head_rms_norm(q1.get(), T, H, KVH, D, d_qw.get(), d_kw.get(), eps, t, nullptr);
              cuda::rope_qk_cache(q1.get(), d_pos.get(), d_inv.get(), n_freq, d_slots.get(), T, H, KVH, D, block_size,
                                  style, k1.get(), v1.get(), t, nullptr, quant);
              cuda::rope_qk_cache(q2.get(), d_pos.get(), d_inv.get(), n_freq, d_slots.get(), T, H, KVH, D, block_size,
                                  style, k2.get(), v2.get(), t, nullptr, quant, 1.f,
                                  cuda::HeadNorm{d_qw.get(), d_kw.get(), eps});
              sync("rope_qk_cache with the head norm");
              std::ostringstream what;
              what << name(t) << (style == RopeStyle::RotateHalf ? " rotate-half" : " interleaved") << " D " << D
                   << " n_freq " << n_freq << (fp8 ? " fp8" : " 16-bit") << (head_major ? " head-major" : " token-major");
              EXPECT_TRUE(k1.download() == k2.download()) << what.str() << ": k cache differs";
              EXPECT_TRUE(v1.download() == v2.download()) << what.str() << ": v cache differs";
              const auto a = q1.download(), b = q2.download();
              size_t q_bad = 0, q_normed = 0;
              for (int i = 0; i < T; ++i)
                for (int j = 0; j < H * D; ++j) {
                  const size_t at = size_t(i) * width + j;
                  q_bad += a[at] != b[at];
                  q_normed += b[at] != qkv[at];
                }
              EXPECT_EQ(q_bad, 0u) << what.str() << ": q differs from head_rms_norm then rope_qk_cache";
              EXPECT_GT(q_normed, size_t(T) * H * D / 2) << what.str() << ": q was left as it was";
            }
  // One weight without the other, or an eps that is not a finite non-negative number: refused
  // before any launch.
  DeviceBuffer<uint16_t> buf(1 << 12);
  DeviceBuffer<int32_t> ints(16);
  DeviceBuffer<float> f32(64);
  void* p = buf.get();
  const int32_t* ip = ints.get();
  expect_error_naming([&] { cuda::rope_qk_cache(p, ip, f32.get(), 8, ip, 1, 2, 1, 64, 16, RopeStyle::RotateHalf, p, p,
                                                DType::F16, nullptr, {}, 1.f, cuda::HeadNorm{p, nullptr, 1e-6f}); },
                      "both q and k weights");
  expect_error_naming([&] { cuda::rope_qk_cache(p, ip, f32.get(), 8, ip, 1, 2, 1, 64, 16, RopeStyle::RotateHalf, p, p,
                                                DType::F16, nullptr, {}, 1.f, cuda::HeadNorm{p, p, NAN}); },
                      "eps");
  sync("(no launch expected)");
}


// ================================================================================================
// attention
// ================================================================================================

// A paged cache for a set of sequences: block ids handed out from a random permutation (non-
// contiguous, non-monotonic, shared pool), every slot not holding a valid position is NaN so that
// any read of it poisons the result, table entries past a sequence's blocks are -1. With an fp8
// quant the cache holds e4m3 bytes of x / scale (k8, v8; 0xFF = NaN where unused) and the reference
// rows kf, vf the values they stand for, float(e4m3) x scale.
struct PagedCache {
  DType t;
  int D, KVH, block_size, max_blocks = 1, num_blocks = 0;
  cuda::KvQuant quant;
  std::vector<int32_t> tables;         // [n_seq, max_blocks]
  std::vector<uint16_t> k, v;          // [num_blocks * block_size, KVH, D]; empty with fp8
  std::vector<uint8_t> k8, v8;         // the same, e4m3 (fp8 only)
  std::vector<std::vector<float>> kf, vf;  // per sequence, contiguous [len, KVH * D] (the CPU layout)

  PagedCache(DType t_, int D_, int KVH_, int block_size_, const std::vector<int>& lens, float k_scale = 1.f,
             const cuda::KvQuant& quant_ = {})
      : t(t_), D(D_), KVH(KVH_), block_size(block_size_), quant(quant_) {
    std::vector<int> n_blocks;
    for (int len : lens) {
      n_blocks.push_back((len + block_size - 1) / block_size);
      max_blocks = std::max(max_blocks, n_blocks.back() + 1);  // one spare entry: must never be read
      num_blocks += n_blocks.back();
    }
    num_blocks += 3;  // unused blocks in the pool
    const auto perm = permutation(num_blocks);
    tables.assign(lens.size() * max_blocks, -1);
    size_t next = 0;
    for (size_t s = 0; s < lens.size(); ++s)
      for (int i = 0; i < n_blocks[s]; ++i) tables[s * max_blocks + i] = perm[next++];
    const size_t row = size_t(KVH) * D, elements = size_t(num_blocks) * block_size * row;
    if (fp8()) {
      k8.assign(elements, 0xFF);
      v8.assign(elements, 0xFF);
    } else {
      k.assign(elements, 0xFFFF);
      v.assign(elements, 0xFFFF);
    }
    for (size_t s = 0; s < lens.size(); ++s) {
      std::vector<float> ks, vs;
      const auto kb = random_bits(size_t(lens[s]) * row, t, ks, k_scale);
      const auto vb = random_bits(size_t(lens[s]) * row, t, vs);
      for (int j = 0; j < lens[s]; ++j) {
        const size_t slot = size_t(tables[s * max_blocks + j / block_size]) * block_size + j % block_size;
        if (!fp8()) {
          std::copy_n(&kb[j * row], row, &k[slot * row]);
          std::copy_n(&vb[j * row], row, &v[slot * row]);
          continue;
        }
        for (size_t i = 0; i < row; ++i) {
          k8[slot * row + i] = fp8_of(kb[j * row + i], t, quant.k_scale);
          v8[slot * row + i] = fp8_of(vb[j * row + i], t, quant.v_scale);
          ks[j * row + i] = fp8_e4m3_to_float(k8[slot * row + i]) * quant.k_scale;
          vs[j * row + i] = fp8_e4m3_to_float(v8[slot * row + i]) * quant.v_scale;
        }
      }
      kf.push_back(std::move(ks));
      vf.push_back(std::move(vs));
    }
  }
  bool fp8() const { return is_fp8(quant); }
  // Rewrites sequence s's key j (cache and reference) from floats (rounded to the 16-bit type first,
  // as the cache writers see them).
  void set_key(size_t s, int j, const std::vector<float>& row_values) {
    const size_t row = size_t(KVH) * D;
    const size_t slot = size_t(tables[s * max_blocks + j / block_size]) * block_size + j % block_size;
    for (size_t i = 0; i < row; ++i) {
      const uint16_t bits = to_bits(row_values[i], t);
      if (fp8()) {
        k8[slot * row + i] = fp8_of(bits, t, quant.k_scale);
        kf[s][j * row + i] = fp8_e4m3_to_float(k8[slot * row + i]) * quant.k_scale;
      } else {
        k[slot * row + i] = bits;
        kf[s][j * row + i] = from_bits(bits, t);
      }
    }
  }
};

// Mixed: logits of +-1e4 on the even query heads only (rows that fall back beside rows that do not).
enum class Adversarial { None, HugeLogits, OneHugeLogit, ZeroQuery, IdenticalKeys, Mixed };

const char* adversarial_name(Adversarial a) {
  switch (a) {
    case Adversarial::None: return "random";
    case Adversarial::HugeLogits: return "logits +-1e4";
    case Adversarial::OneHugeLogit: return "one huge logit";
    case Adversarial::ZeroQuery: return "q = 0 (all logits equal)";
    case Adversarial::IdenticalKeys: return "identical keys";
    case Adversarial::Mixed: return "+-1e4 on even heads";
  }
  return "?";
}

// Scales q (in place, 16-bit rounded) so that the largest |logit| over the given keys is about
// `target`.
void scale_query_to(std::vector<float>& q, const std::vector<float>& kf, int len, int KVH, int D, int h_kv,
                    float scale, float target) {
  float max_abs = 0;
  for (int j = 0; j < len; ++j) {
    double dot = 0;
    for (int d = 0; d < D; ++d) dot += double(q[d]) * kf[size_t(j) * KVH * D + size_t(h_kv) * D + d];
    max_abs = std::max(max_abs, float(std::fabs(dot) * scale));
  }
  // Capped so that q stays representable in fp16 (max 65504): a row whose logits are all tiny gets
  // large but finite logits instead.
  float q_max = 0;
  for (float x : q) q_max = std::max(q_max, std::fabs(x));
  float f = max_abs > 0 ? target / max_abs : 1.f;
  if (q_max > 0) f = std::min(f, 30000.f / q_max);
  for (float& x : q) x *= f;
}

struct DecodeCase {
  DType t;
  int D, H, KVH, block_size;
  std::vector<int> lens;
  Adversarial adv = Adversarial::None;
  // Asynchronized softmax with a unified max (decode_attention_async) instead of the synchronized
  // kernel; splits 0 = the engine's plan for this shape on this GPU.
  bool async = false;
  int splits = 1;
  float phi = 0.f;
  // KernelOptions::decode_path for this case: "core" (CUDA cores) or "mma" (tensor cores) forced;
  // null = the launcher's own choice (tensor cores for two or more heads per CTA or head_dim
  // 80/96/256).
  const char* path = nullptr;
  // KernelOptions::decode_warps (0: the default) and async_combine ("kernel": the last CTA of a
  // group adds the splits; "launch": a second kernel; null: auto) for this case.
  int warps = 0;
  const char* combine = nullptr;
  // KernelOptions::kv_head_major: the cache is uploaded head-major, [block][kv head][key][D] (the
  // engine's), or token-major [block][key][kv head][D] (kv_cache_layout.h).
  bool head_major = true;
  // The cache's element type: the 16-bit dtype, or e4m3 with its scales (with_fp8).
  cuda::KvQuant kv = {};
  // Sliding window and soft-capping (DecodeAttentionParams; 0: off): the masked kernels.
  int window = 0;
  float softcap = 0.f;
};

// The case on an fp8 (e4m3) cache with the tests' scales (kFp8Kv).
DecodeCase with_fp8(DecodeCase c, const cuda::KvQuant& quant = kFp8Kv) {
  c.kv = quant;
  return c;
}

// A token-major cache [blocks * block_size][KVH][D] rearranged head-major [blocks][KVH][block_size][D]
// (16-bit or e4m3 elements).
template <class E>
std::vector<E> to_head_major(const std::vector<E>& k, int KVH, int D, int block_size) {
  std::vector<E> out(k.size());
  const size_t block = size_t(block_size) * KVH * D, blocks = k.size() / block;
  for (size_t b = 0; b < blocks; ++b)
    for (int j = 0; j < block_size; ++j)
      for (int h = 0; h < KVH; ++h)
        std::copy_n(&k[b * block + (size_t(j) * KVH + h) * D], D, &out[b * block + (size_t(h) * block_size + j) * D]);
  return out;
}

cuda::KernelOptions kernels_for_path(const char* path) {
  cuda::KernelOptions o;
  if (path != nullptr) o.decode_path = std::string(path) == "core" ? cuda::DecodePath::Core : cuda::DecodePath::Mma;
  return o;
}

cuda::KernelOptions kernels_for_case(const DecodeCase& c) {
  cuda::KernelOptions o = kernels_for_path(c.path);
  o.decode_warps = c.warps;
  o.kv_head_major = c.head_major;
  if (c.combine != nullptr)
    o.async_combine = std::string(c.combine) == "kernel" ? cuda::AsyncCombine::Kernel : cuda::AsyncCombine::Launch;
  return o;
}

// A case's inputs: the paged cache, q (with the case's adversarial rows applied) and the CPU
// reference per sequence. They depend only on the fields same_inputs compares, not on how the
// kernels run (mode, splits, loop, warps, combine, cache layout), so cases that differ only there
// share them (decode_inputs): generating them took most of the GPU suite's time.
struct DecodeInputs {
  DType t;
  int D, H, KVH, block_size;
  std::vector<int> lens;
  Adversarial adv;
  cuda::KvQuant kv;
  int window;
  float softcap;
  PagedCache cache;
  std::vector<uint16_t> qkv;
  std::vector<float> qkv_f;
  std::vector<std::vector<float>> ref;  // per sequence, [H * D] (empty for an empty row)
  // The host's view of the unified max's guard for one phi: rows whose max logit - phi is outside /
  // within 0.01 of [a, b], from the same 16-bit inputs (in double).
  struct Guard {
    float phi;
    int64_t out_of_range, ambiguous;
  };
  std::vector<Guard> guards;

  bool same_inputs(const DecodeCase& c) const {
    return c.t == t && c.D == D && c.H == H && c.KVH == KVH && c.block_size == block_size && c.lens == lens &&
           c.adv == adv && c.kv.dtype == kv.dtype && c.kv.k_scale == kv.k_scale && c.kv.v_scale == kv.v_scale &&
           c.window == window && c.softcap == softcap;
  }
  int width() const { return (H + 2 * KVH) * D; }
  float scale() const { return 1.f / std::sqrt(float(D)); }

  explicit DecodeInputs(const DecodeCase& c)
      : t(c.t), D(c.D), H(c.H), KVH(c.KVH), block_size(c.block_size), lens(c.lens), adv(c.adv), kv(c.kv),
        window(c.window), softcap(c.softcap), cache(c.t, c.D, c.KVH, c.block_size, c.lens, 1.f, c.kv) {
    const int B = int(lens.size()), G = H / KVH, w = width();
    qkv = random_bits(size_t(B) * w, t, qkv_f);
    // Adversarial inputs, per sequence (q heads of the sequence's row; keys in the cache).
    for (int s = 0; s < B; ++s) {
      const int len = lens[s];
      if (len <= 0) continue;
      for (int h = 0; h < H; ++h) {
        std::vector<float> q(&qkv_f[size_t(s) * w + size_t(h) * D], &qkv_f[size_t(s) * w + size_t(h + 1) * D]);
        if (adv == Adversarial::HugeLogits || (adv == Adversarial::Mixed && h % 2 == 0))
          scale_query_to(q, cache.kf[s], len, KVH, D, h / G, scale(), 1e4f);
        if (adv == Adversarial::ZeroQuery) std::fill(q.begin(), q.end(), 0.f);
        for (int d = 0; d < D; ++d) {
          const size_t at = size_t(s) * w + size_t(h) * D + d;
          qkv[at] = to_bits(q[d], t);
          qkv_f[at] = from_bits(qkv[at], t);
        }
      }
      if (adv == Adversarial::OneHugeLogit) {
        // Key j* = 8 x (q of the group's first head): its logit dominates every other by far.
        const int js = uniform_int(0, len - 1);
        std::vector<float> row(size_t(KVH) * D);
        for (int h_kv = 0; h_kv < KVH; ++h_kv)
          for (int d = 0; d < D; ++d) row[size_t(h_kv) * D + d] = 8.f * qkv_f[size_t(s) * w + size_t(h_kv * G) * D + d];
        cache.set_key(s, js, row);
      }
      if (adv == Adversarial::IdenticalKeys) {
        std::vector<float> row(cache.kf[s].begin(), cache.kf[s].begin() + size_t(KVH) * D);
        for (int j = 0; j < len; ++j) cache.set_key(s, j, row);
      }
    }
    ref.resize(B);
    for (int s = 0; s < B; ++s) {
      if (lens[s] <= 0) continue;
      ref[s].resize(size_t(H) * D);
      cpu::attention(&qkv_f[size_t(s) * w], cache.kf[s].data(), cache.vf[s].data(), 1, lens[s] - 1, H, KVH, D,
                     scale(), ref[s].data(), window, softcap);
    }
  }

  const Guard& guard(float phi, const UnifiedMaxBounds& bounds) {
    for (const Guard& g : guards)
      if (g.phi == phi) return g;
    const int B = int(lens.size()), G = H / KVH, w = width();
    Guard g{phi, 0, 0};
    for (int s = 0; s < B; ++s) {
      for (int h = 0; h < H; ++h) {
        if (lens[s] <= 0) continue;
        double mx = -INFINITY;
        // The keys the row reads (its window) and its logits as the softmax sees them (capped).
        for (int j = window > 0 ? std::max(0, lens[s] - window) : 0; j < lens[s]; ++j) {
          double dot = 0;
          for (int d = 0; d < D; ++d)
            dot += double(qkv_f[size_t(s) * w + size_t(h) * D + d]) * cache.kf[s][size_t(j) * KVH * D + size_t(h / G) * D + d];
          const double x = dot * scale();
          mx = std::max(mx, softcap > 0 ? softcap * std::tanh(x / softcap) : x);
        }
        const double rel = mx - phi;
        if (rel < bounds.a || rel > bounds.b) ++g.out_of_range;
        if (std::fabs(rel - bounds.a) < 1e-2 || std::fabs(rel - bounds.b) < 1e-2) ++g.ambiguous;
      }
    }
    guards.push_back(g);
    return guards.back();
  }
};

// The inputs of the last few distinct cases (tests loop over kernel variants innermost; a few
// entries cover loops that alternate two or three input sets).
DecodeInputs& decode_inputs(const DecodeCase& c) {
  constexpr size_t kKept = 4;
  static std::vector<std::unique_ptr<DecodeInputs>> kept;  // most recent last
  for (size_t i = 0; i < kept.size(); ++i)
    if (kept[i]->same_inputs(c)) {
      std::rotate(kept.begin() + i, kept.begin() + i + 1, kept.end());
      return *kept.back();
    }
  if (kept.size() == kKept) kept.erase(kept.begin());
  kept.push_back(std::make_unique<DecodeInputs>(c));
  return *kept.back();
}

void run_decode(const DecodeCase& c) {
  const int D = c.D, H = c.H, KVH = c.KVH, B = int(c.lens.size()), G = H / KVH;
  const cuda::KernelOptions kernels = kernels_for_case(c);
  const cuda::KernelOptionsScope kernel_scope(kernels);
  int max_len = 0;
  for (int len : c.lens) max_len = std::max(max_len, len);
  int sms = 0;
  cuda_ok(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "SM count");
  const int splits = c.splits != 0 ? c.splits : cuda::plan_decode_splits(B, H, KVH, D, max_len, sms);
  // What the launch runs (the same choice as inside the call).
  const bool masked = c.window > 0 || c.softcap > 0;
  const bool fp8 = is_fp8(c.kv);
  // An fp8 cache, like the masked kernels, runs on tensor cores only: the launch the plan describes
  // with `masked` set (what decode_attention asks it for).
  const cuda::DecodeAttentionLaunch launch =
      cuda::decode_attention_launch(B, H, KVH, D, splits, max_len, c.async, sms, masked || fp8);
  // The tensor-core loop rounds P to 16 bits before P V (as FlashAttention does; the sums stay
  // fp32): weights off by up to half a unit roundoff, so outputs by about u x rms; the element
  // bound is 16 u x rms there (an indexing error is O(rms)). (A GQA group split into single heads
  // runs the CUDA-core loop; the looser bound covers it too.)
  const bool maybe_mma = launch.tensor_cores || G >= 2 || fp8;
  DecodeInputs& in = decode_inputs(c);
  const PagedCache& cache = in.cache;
  const float scale = in.scale();

  DeviceBuffer<uint16_t> d_qkv(in.qkv), d_out(size_t(B) * H * D);
  auto laid_out = [&](const auto& host) { return c.head_major ? to_head_major(host, KVH, D, c.block_size) : host; };
  DeviceBuffer<uint16_t> d_k(laid_out(cache.k)), d_v(laid_out(cache.v));      // empty with fp8
  DeviceBuffer<uint8_t> d_k8(laid_out(cache.k8)), d_v8(laid_out(cache.v8));  // fp8 only
  const void* k_cache = fp8 ? static_cast<const void*>(d_k8.get()) : d_k.get();
  const void* v_cache = fp8 ? static_cast<const void*>(d_v8.get()) : d_v.get();
  DeviceBuffer<int32_t> d_tables(cache.tables), d_lens(std::vector<int32_t>(c.lens.begin(), c.lens.end()));
  d_out.poison();
  const auto bounds = derive_unified_max_bounds(c.phi, 131072);
  int64_t expected_fallback = 0, ambiguous = 0;  // rows whose max logit - phi is outside / near [a, b]
  if (!c.async) {
    // Several splits: the partials in a workspace poisoned with NaN (every element the combine reads
    // is written by the main kernel first).
    const size_t ws_bytes = cuda::decode_attention_workspace_bytes(B, H, D, splits);
    DeviceBuffer<uint8_t> ws(std::vector<uint8_t>(std::max<size_t>(ws_bytes, 1), 0xFF));
    cuda::decode_attention({.qkv = d_qkv.get(), .k_cache = k_cache, .v_cache = v_cache,
                            .block_tables = d_tables.get(), .max_blocks_per_seq = cache.max_blocks,
                            .context_lens = d_lens.get(), .out = d_out.get(), .batch = B, .n_heads = H,
                            .n_kv_heads = KVH, .head_dim = D, .block_size = c.block_size, .scale = scale, .dtype = c.t,
                            .splits = splits, .max_context_len = max_len,
                            .workspace = splits > 1 ? ws.get() : nullptr, .workspace_bytes = ws_bytes,
                            .window = c.window, .softcap = c.softcap, .kv_quant = c.kv},
                           nullptr);
    sync("decode_attention");
  } else {
    const size_t ws_bytes = cuda::decode_attention_async_workspace_bytes(B, H, KVH, D, splits);
    DeviceBuffer<uint8_t> ws(std::vector<uint8_t>(ws_bytes, 0xFF));  // no initialization needed
    const int n_counters = cuda::decode_attention_async_counters(B, H, KVH) + 5;  // larger than needed is fine
    DeviceBuffer<int32_t> counters(std::vector<int32_t>(n_counters, 0));
    DeviceBuffer<unsigned long long> fallback(std::vector<unsigned long long>{0});
    const DecodeInputs::Guard& guard = in.guard(c.phi, bounds);
    expected_fallback = guard.out_of_range;
    ambiguous = guard.ambiguous;
    // One split, or the CUDA-core loop, runs the synchronized kernels: no row is recomputed, whatever phi.
    if (!launch.unified) expected_fallback = ambiguous = 0;
    const cuda::UnifiedMaxRange range{bounds.phi, bounds.a, bounds.b};
    // Twice on the same workspace: the counters must stay at zero, and the outputs must be bitwise
    // the same (the splits' sums are added in split order, no atomics).
    std::vector<uint16_t> first;
    for (int rep = 0; rep < 2; ++rep) {
      d_out.poison();
      cuda::decode_attention_async(
          {.qkv = d_qkv.get(), .k_cache = k_cache, .v_cache = v_cache, .block_tables = d_tables.get(),
           .max_blocks_per_seq = cache.max_blocks, .context_lens = d_lens.get(), .out = d_out.get(), .batch = B,
           .n_heads = H, .n_kv_heads = KVH, .head_dim = D, .block_size = c.block_size, .scale = scale, .dtype = c.t,
           .splits = splits, .max_context_len = max_len, .workspace = ws.get(), .workspace_bytes = ws_bytes,
           .range = range, .counters = counters.get(), .counter_ints = n_counters, .fallback_rows = fallback.get(),
           .window = c.window, .softcap = c.softcap, .kv_quant = c.kv},
          nullptr);
      sync("decode_attention_async");
      if (rep == 0) first = d_out.download();
    }
    EXPECT_TRUE(first == d_out.download()) << label("decode_attention_async", c.t) << " " << adversarial_name(c.adv)
                                           << " splits " << splits << ": two launches gave different outputs";
    const int64_t counted = int64_t(fallback.download()[0]);
    EXPECT_LE(std::llabs(counted - 2 * expected_fallback), 2 * ambiguous)
        << label("decode_attention_async", c.t) << " " << adversarial_name(c.adv) << " splits " << splits
        << " warps " << c.warps << " combine " << (c.combine != nullptr ? c.combine : "auto")
        << ": device fallback count (two launches) " << counted << ", rows out of range on the host "
        << expected_fallback << " (" << ambiguous << " within 0.01 of an edge)";
    const auto left = counters.download();
    EXPECT_TRUE(std::all_of(left.begin(), left.end(), [](int32_t x) { return x == 0; }))
        << "decode_attention_async left its semaphores or list count non-zero";
  }
  const auto out = from_bits(d_out.download(), c.t);

  for (int s = 0; s < B; ++s) {
    const int len = c.lens[s];
    std::vector<float> got(out.begin() + size_t(s) * H * D, out.begin() + size_t(s + 1) * H * D);
    std::ostringstream what;
    what << label(c.async ? "decode_attention_async" : "decode_attention", c.t) << " splits " << c.splits << " D " << D << " H " << H << " KVH " << KVH << " block " << c.block_size
         << " seq " << s << " len " << len << " " << adversarial_name(c.adv) << " path "
         << (c.path != nullptr ? c.path : "auto") << " warps " << c.warps << " combine "
         << (c.combine != nullptr ? c.combine : "auto") << (c.head_major ? "" : " token-major");
    if (fp8) what << " fp8 k_scale " << c.kv.k_scale << " v_scale " << c.kv.v_scale;
    if (masked) what << " window " << c.window << " softcap " << c.softcap;
    if (len <= 0) {
      EXPECT_TRUE(std::all_of(got.begin(), got.end(), [](float x) { return x == 0.f; }))
          << what.str() << ": an empty context must give zeros";
      continue;
    }
    // Logits of 1e4 carry fp32 rounding of ~1e-3 in absolute terms, which moves near-tied weights by
    // ~0.1%: only the NMSE bound there.
    Tolerance tol = c.adv == Adversarial::HugeLogits || c.adv == Adversarial::Mixed ? Tolerance{5e-4, 0, 0}
                                                                                 : rounding_tolerance(c.t);
    if (maybe_mma && tol.atol > 0) tol.atol = 16 * unit_roundoff(c.t);
    expect_close(got, in.ref[s], tol, what.str());
  }
}

// Few and short: these run under compute-sanitizer (scripts/gpu-check.sh filters on "Small").
TEST_F(CudaKernels, DecodeAttentionSmallCases) {
  for (DType t : kTypes) {
    run_decode({t, 64, 8, 2, 16, {0, 1, 17, 40}});
    run_decode({t, 128, 20, 1, 16, {33, 5}});
    run_decode({t, 128, 3, 3, 4, {70}, Adversarial::OneHugeLogit});
  }
}

TEST_F(CudaKernels, DecodeAttentionMixedLengthsAllGroupSizes) {
  const std::vector<int> lens{1, 15, 16, 17, 1000, 4097};
  const std::pair<int, int> heads[] = {{1, 1}, {4, 4}, {8, 4}, {6, 2}, {10, 2}, {14, 2}, {32, 4}, {16, 1}, {40, 2}};
  for (DType t : kTypes)
    for (int D : {64, 128})
      for (auto [H, KVH] : heads) run_decode({t, D, H, KVH, 16, lens});
}

// MHA at head_dim 128 in each of choose_loop's regimes (decode_plan.h), with the launch each
// takes asserted first: the CUDA-core loop on short rows at small batch, the tensor-core loop on
// longer rows there, and at the batch whose CTAs fill
// two per SM the tensor-core loop with 4 warps up to kMhaFourWarpMaxContext keys and 8 beyond. Both
// modes (async with the plan's splits and with 3: the unified-max kernels on tensor cores), fp16 and
// bf16, empty rows, a dominant key.
TEST_F(CudaKernels, DecodeAttentionMhaLoopsAndWarps) {
  int sms = 0;
  cuda_ok(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "SM count");
  const int H = 32, short_rows = 512, four_warp_rows = 2048;
  // A batch of 32 heads whose CTAs fill one round of two per SM (8 on 132 SMs), and one that fills
  // less than 3/4 of it.
  const int full_batch = 2 * sms / H;
  ASSERT_LT(int64_t(2) * H * 100, 2 * int64_t(sms) * 75) << "this GPU leaves no small batch for the rule";
  ASSERT_GT(int64_t(full_batch) * H, sms) << "this GPU leaves no batch for 4 warps";
  struct Regime {
    int batch, longest;
    bool tensor_cores;
    int warps;
  };
  for (const Regime r : {Regime{1, short_rows, false, 8}, Regime{2, short_rows + 1, true, 8},
                         Regime{full_batch, four_warp_rows, true, 4}, Regime{full_batch, four_warp_rows + 1, true, 8}}) {
    const std::string what = "MHA batch " + std::to_string(r.batch) + ", longest row " + std::to_string(r.longest);
    const int splits = cuda::plan_decode_splits(r.batch, H, H, 128, r.longest, sms);
    const cuda::DecodeAttentionLaunch launch = cuda::decode_attention_launch(r.batch, H, H, 128, splits, r.longest, true, sms);
    EXPECT_EQ(launch.tensor_cores, r.tensor_cores) << what;
    EXPECT_EQ(launch.warps, r.warps) << what;
    std::vector<int> lens(r.batch);
    for (int i = 0; i < r.batch; ++i) lens[i] = i == 0 ? r.longest : i == 1 ? 0 : 1 + (i * 389) % r.longest;
    for (DType t : kTypes) {
      run_decode({t, 128, H, H, 16, lens});
      for (int s : {0, 3}) run_decode({t, 128, H, H, 16, lens, Adversarial::None, true, s});
    }
    run_decode({DType::F16, 128, H, H, 16, lens, Adversarial::OneHugeLogit, true, 3});
  }
}

// MHA at head_dim 64 in each regime of its loop rule (choose_loop, kMha64MmaMinGroupsPerSm): the
// CUDA-core loop at batch 1 and where two CTAs per SM fill 3/4 of a round on rows up to 2048 keys,
// the tensor-core loop there on longer rows and from 4 CTA groups per SM; both modes, mixed lengths,
// an empty row.
TEST_F(CudaKernels, DecodeAttentionMha64LoopRule) {
  int sms = 0;
  cuda_ok(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "SM count");
  const int H = 32;
  const int filling_batch = (2 * sms * 75 + H * 100 - 1) / (H * 100), many_batch = (4 * sms + H - 1) / H;
  ASSERT_LT(filling_batch, many_batch) << "this GPU leaves no batch between the rule's two thresholds";
  struct Regime {
    int batch, longest;
    bool tensor_cores;
  };
  for (const Regime r : {Regime{1, 4097, false}, Regime{filling_batch, 2048, false}, Regime{filling_batch, 2049, true},
                         Regime{many_batch, 600, true}}) {
    const std::string what = "MHA D 64, batch " + std::to_string(r.batch) + ", longest row " + std::to_string(r.longest);
    const int splits = cuda::plan_decode_splits(r.batch, H, H, 64, r.longest, sms);
    EXPECT_EQ(cuda::decode_attention_launch(r.batch, H, H, 64, splits, r.longest, true, sms).tensor_cores, r.tensor_cores)
        << what;
    std::vector<int> lens(r.batch);
    for (int i = 0; i < r.batch; ++i) lens[i] = i == 0 ? r.longest : i == 1 ? 0 : 1 + (i * 389) % r.longest;
    for (DType t : kTypes) {
      run_decode({t, 64, H, H, 16, lens});
      run_decode({t, 64, H, H, 16, lens, Adversarial::None, true, 0});
    }
  }
}

TEST_F(CudaKernels, DecodeAttentionOtherBlockSizesAndEmptyContext) {
  for (int bs : {1, 8, 32, 256}) run_decode({DType::BF16, 128, 8, 2, bs, {0, 1, 33, 300}});
  run_decode({DType::F16, 64, 12, 3, 16, {0, 5}});
}

TEST_F(CudaKernels, DecodeAttentionLongContext) {
  run_decode({DType::BF16, 128, 16, 2, 16, {32768, 3}});
  run_decode({DType::F16, 64, 16, 16, 16, {20000}});
}

TEST_F(CudaKernels, DecodeAttentionAdversarialLogitsStayFinite) {
  for (DType t : kTypes)
    for (Adversarial adv :
         {Adversarial::HugeLogits, Adversarial::OneHugeLogit, Adversarial::ZeroQuery, Adversarial::IdenticalKeys}) {
      run_decode({t, 128, 8, 2, 16, {1, 17, 1000}, adv});
      run_decode({t, 64, 16, 1, 16, {300, 2}, adv});
    }
}

// Asynchronized softmax (unified max): the same cases as the synchronized kernel, split and
// unsplit, with the guard's fallback count checked against the host's view of every row.
TEST_F(CudaKernels, DecodeAsyncSmallCases) {
  for (DType t : kTypes)
    for (int splits : {1, 3}) {
      run_decode({t, 64, 8, 2, 16, {0, 1, 17, 40}, Adversarial::None, true, splits});
      run_decode({t, 128, 20, 1, 16, {33, 5}, Adversarial::None, true, splits});
      run_decode({t, 128, 3, 3, 4, {70}, Adversarial::OneHugeLogit, true, splits});
      run_decode({t, 128, 8, 2, 16, {1, 300}, Adversarial::Mixed, true, splits});
    }
}

TEST_F(CudaKernels, DecodeAsyncMixedLengthsAllGroupSizes) {
  const std::vector<int> lens{1, 15, 16, 17, 1000, 4097};
  const std::pair<int, int> heads[] = {{1, 1}, {4, 4}, {8, 4}, {6, 2}, {10, 2}, {14, 2}, {32, 4}, {16, 1}, {40, 2},
                                       {24, 8}, {12, 1}};
  for (DType t : kTypes)
    for (int D : {64, 128})
      for (auto [H, KVH] : heads)
        for (int splits : {0, 1, 5}) run_decode({t, D, H, KVH, 16, lens, Adversarial::None, true, splits});
}

TEST_F(CudaKernels, DecodeAsyncBatch256MixedLengths) {
  std::vector<int> lens(256);
  for (int& l : lens) l = uniform_int(0, 300);
  lens[7] = 2000;  // one long row among short ones: the split plan follows the longest
  for (int splits : {0, 1}) run_decode({DType::BF16, 128, 32, 8, 16, lens, Adversarial::None, true, splits});
  run_decode({DType::F16, 64, 12, 4, 16, lens, Adversarial::Mixed, true, 0});
}

TEST_F(CudaKernels, DecodeAsyncLongContextTo128K) {
  run_decode({DType::BF16, 128, 8, 2, 16, {131072, 3}, Adversarial::None, true, 0});
  run_decode({DType::F16, 128, 16, 2, 16, {65536, 1000}, Adversarial::None, true, 0});
  run_decode({DType::F16, 64, 16, 16, 16, {20000}, Adversarial::None, true, 7});
}

TEST_F(CudaKernels, DecodeAsyncAdversarialFallsBackExactly) {
  for (DType t : kTypes)
    for (Adversarial adv : {Adversarial::HugeLogits, Adversarial::OneHugeLogit, Adversarial::ZeroQuery,
                            Adversarial::IdenticalKeys, Adversarial::Mixed})
      for (int splits : {1, 4}) {
        run_decode({t, 128, 8, 2, 16, {1, 17, 1000}, adv, true, splits});
        run_decode({t, 64, 16, 1, 16, {300, 2}, adv, true, splits});
      }
}

// Many splits (the plan's range at few groups and long rows, up to 256): the reduction launch adds
// up to hundreds of partials per row, slices past a short row's end are empty (max -inf, zero sums),
// and rows out of range are recomputed by the reduction launch with the exact count. Short rows
// only: these run under compute-sanitizer (scripts/gpu-check.sh filters on "Small").
TEST_F(CudaKernels, DecodeAsyncManySplitsSmall) {
  for (DType t : kTypes)
    for (int D : {64, 128, 256})
      for (Adversarial adv : {Adversarial::None, Adversarial::Mixed, Adversarial::OneHugeLogit})
        for (int splits : {64, 256}) run_decode({t, D, 32, 2, 16, {0, 1, 300, 2000}, adv, true, splits});
  for (float phi : {200.f, -200.f})
    run_decode({DType::F16, 96, 16, 1, 8, {5, 1500}, Adversarial::None, true, 100, phi});
}

// The combine launches take one of three shapes by rows (batch x heads) per SM (CombineShape in
// decode_attention_combine.cuh, chosen by decode_plan.h: 256 threads up to one row per SM, 128
// threads with 8 splits per batch up to four, 4 per batch beyond), with 2 to 4 groups of lanes at
// head dims 64, 80 and 128: each shape with few and many splits (past one batch per group), both
// modes, adversarial rows (the async launch recomputes rows out of range with all its threads) and
// empty rows.
TEST_F(CudaKernels, DecodeCombineShapesByRowCountSmall) {
  int sms = 0;
  cuda_ok(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "SM count");
  constexpr int H = 32;
  for (int rows_per_sm : {1, 2, 5}) {
    const int batch = std::max(1, rows_per_sm * sms / H + (rows_per_sm > 4 ? 1 : 0));
    const cuda::CombineLaunch shape = cuda::decode_attention_launch(batch, H, 8, 128, 40, 200, false, sms).combine;
    EXPECT_EQ(shape, rows_per_sm == 1   ? cuda::CombineLaunch::FewRows
                     : rows_per_sm == 2 ? cuda::CombineLaunch::SomeRows
                                        : cuda::CombineLaunch::ManyRows)
        << rows_per_sm << " rows per SM, batch " << batch;
    std::vector<int> lens(batch);
    for (int& l : lens) l = uniform_int(0, 200);
    lens[0] = 0;
    for (int D : {64, 80, 128})
      for (int splits : {3, 40})
        for (bool async : {false, true})
          run_decode({D == 80 ? DType::BF16 : DType::F16, D, H, 8, 16, lens, Adversarial::Mixed, async, splits});
  }
}

// The plan's split counts at few groups and long rows (ChatGLM2-like 32/2 and Llama-3-like 32/8 at
// batch 1, 16K-64K: 16 to 65 splits), adversarial rows included.
TEST_F(CudaKernels, DecodeAsyncPlannedSplitsLongRows) {
  run_decode({DType::F16, 128, 32, 2, 16, {16384}, Adversarial::None, true, 0});
  run_decode({DType::BF16, 128, 32, 2, 16, {65536}, Adversarial::Mixed, true, 0});
  run_decode({DType::F16, 128, 32, 8, 16, {65536}, Adversarial::OneHugeLogit, true, 0});
  run_decode({DType::BF16, 128, 32, 2, 16, {16384}, Adversarial::None, true, 0, 200.f});
}

// phi far from the logits: every row leaves [a, b] from below (phi = +200) or above (phi = -200)
// and is recomputed (with several splits; one split runs the synchronized kernel, and no row is
// recomputed); the results still equal the stable softmax.
TEST_F(CudaKernels, DecodeAsyncPhiOutOfRangeRecomputesEveryRow) {
  for (float phi : {200.f, -200.f, 3.f})
    for (int splits : {1, 6}) run_decode({DType::F16, 128, 32, 8, 16, {1, 64, 999}, Adversarial::None, true, splits, phi});
}

// ---- decode attention on tensor cores (the query group as the M = 16 rows of mma.m16n8k16) ----
// Every head dim, fp16 and bf16, group sizes 1..20 (above 16 a group spans CTAs), sync and async,
// split and unsplit, lengths around the 16-key tile (15, 16, 17) and the 8-warp round (the tile
// slice per warp), adversarial rows with the exact fallback count.

constexpr int kHeadDims[] = {64, 80, 96, 128, 256};

// Few and short: these run under compute-sanitizer (scripts/gpu-check.sh filters on "Small").
TEST_F(CudaKernels, DecodeAttentionTensorCoreSmallCases) {
  for (DType t : kTypes)
    for (int D : kHeadDims) {
      run_decode({t, D, 8, 2, 16, {0, 1, 17, 40}});
      run_decode({t, D, 16, 1, 8, {33, 5}});
      run_decode({t, D, 3, 3, 4, {70}, Adversarial::OneHugeLogit});  // MHA: tensor cores at 80, 96, 256
      for (int splits : {1, 3}) {
        run_decode({t, D, 8, 2, 16, {0, 1, 17, 40}, Adversarial::None, true, splits});
        run_decode({t, D, 8, 2, 16, {1, 300}, Adversarial::Mixed, true, splits});
      }
    }
  // MHA at head_dim 128 on rows past 512 keys: tensor cores (choose_loop), unsplit and split.
  int sms = 0;
  cuda_ok(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "SM count");
  for (int splits : {1, 3}) {
    EXPECT_TRUE(cuda::decode_attention_launch(3, 4, 4, 128, splits, 600, true, sms).tensor_cores) << splits;
    for (DType t : kTypes) run_decode({t, 128, 4, 4, 16, {600, 0, 3}, Adversarial::OneHugeLogit, true, splits});
  }
}

// The tensor-core loop's 32-key tiles (head_dim 64 with 8 warps; two 16-key halves, each with its own
// block-table entry): lengths around one and two tiles; blocks smaller than a half (the copy that
// looks up each row), of one half, and holding both halves or more; MHA (tensor cores forced) and
// GQA; sync and async, split and unsplit, adversarial rows. Few and short: these run under
// compute-sanitizer.
TEST_F(CudaKernels, DecodeAttentionWideTilesSmallCases) {
  for (DType t : kTypes)
    for (int bs : {1, 8, 16, 32, 256}) {
      run_decode({t, 64, 8, 2, bs, {0, 1, 31, 32, 33, 300}, Adversarial::None, false, 1, 0.f, nullptr, 8});
      run_decode({t, 64, 4, 4, bs, {31, 65}, Adversarial::None, false, 1, 0.f, "mma", 8});
      for (int splits : {1, 3})
        run_decode({t, 64, 8, 2, bs, {1, 31, 33, 300}, Adversarial::Mixed, true, splits, 0.f, nullptr, 8});
    }
}

TEST_F(CudaKernels, DecodeAttentionAllHeadDimsAllGroupSizes) {
  const std::vector<int> lens{1, 15, 16, 17, 129, 1000, 4097};
  // Groups 1, 2, 3, 4, 5, 8, 12, 16, 20.
  const std::pair<int, int> heads[] = {{2, 2}, {4, 2}, {6, 2}, {8, 2}, {10, 2}, {16, 2}, {24, 2}, {16, 1}, {40, 2}};
  for (DType t : kTypes)
    for (int D : kHeadDims)
      for (auto [H, KVH] : heads) {
        run_decode({t, D, H, KVH, 16, lens});
        for (int splits : {0, 5}) run_decode({t, D, H, KVH, 16, lens, Adversarial::None, true, splits});
      }
}

// Each loop forced where the launcher would pick the other: CUDA cores for GQA (the former path,
// kept for comparison), tensor cores for MHA.
TEST_F(CudaKernels, DecodeAttentionForcedPaths) {
  const std::vector<int> lens{0, 1, 17, 1000, 4097};
  for (DType t : kTypes)
    for (int D : {64, 128}) {
      for (auto [H, KVH] : {std::pair{8, 4}, std::pair{32, 2}, std::pair{12, 1}})
        for (int splits : {1, 0}) {
          run_decode({t, D, H, KVH, 16, lens, Adversarial::None, false, 1, 0.f, "core"});
          run_decode({t, D, H, KVH, 16, lens, Adversarial::None, true, splits, 0.f, "core"});
        }
      for (auto [H, KVH] : {std::pair{4, 4}, std::pair{1, 1}})
        for (int splits : {1, 0}) {
          run_decode({t, D, H, KVH, 16, lens, Adversarial::None, false, 1, 0.f, "mma"});
          run_decode({t, D, H, KVH, 16, lens, Adversarial::None, true, splits, 0.f, "mma"});
        }
    }
}

// The token-major cache (KernelOptions::kv_head_major = false, bench-attention --kv-layout
// token-major; the other tests run the engine's head-major one): both loops, both modes, blocks of 8
// (per-row copies) and 16 or more (whole tiles), lengths around the tile. Few and short: these run
// under compute-sanitizer (scripts/gpu-check.sh filters on "Small").
TEST_F(CudaKernels, DecodeAttentionTokenMajorCacheSmall) {
  for (DType t : kTypes)
    for (int D : {64, 128})
      for (int bs : {8, 16, 64}) {
        DecodeCase c{t, D, 8, 2, bs, {0, 1, 15, 16, 17, 40, 300}};
        c.head_major = false;
        run_decode(c);
        c.async = true;
        c.splits = 3;
        c.adv = Adversarial::Mixed;
        run_decode(c);
        DecodeCase mha{t, D, 4, 4, bs, {600, 0, 3}, Adversarial::OneHugeLogit};
        mha.head_major = false;
        run_decode(mha);  // the CUDA-core loop
        mha.path = "mma";
        run_decode(mha);
      }
}

TEST_F(CudaKernels, DecodeAttentionTensorCoreBlockSizesAndLongContext) {
  for (int bs : {1, 8, 32, 256}) {
    run_decode({DType::BF16, 96, 8, 2, bs, {0, 1, 33, 300}});
    run_decode({DType::F16, 256, 16, 2, bs, {0, 1, 33, 300}, Adversarial::None, true, 3});
  }
  run_decode({DType::BF16, 256, 16, 2, 16, {32768, 3}});
  run_decode({DType::F16, 80, 32, 2, 16, {20000}, Adversarial::None, true, 0});
  run_decode({DType::BF16, 128, 32, 8, 16, {65536, 1000}, Adversarial::None, true, 0});
}

TEST_F(CudaKernels, DecodeAsyncTensorCoreAdversarialFallsBackExactly) {
  for (DType t : kTypes)
    for (int D : {80, 128, 256})
      for (Adversarial adv : {Adversarial::HugeLogits, Adversarial::OneHugeLogit, Adversarial::ZeroQuery,
                              Adversarial::IdenticalKeys, Adversarial::Mixed})
        for (int splits : {1, 4}) {
          run_decode({t, D, 8, 2, 16, {1, 17, 1000}, adv, true, splits});
          run_decode({t, D, 32, 2, 16, {300, 2}, adv, true, splits});
        }
  // Synchronized kernel on the same inputs: stays finite and exact.
  for (DType t : kTypes)
    for (Adversarial adv : {Adversarial::HugeLogits, Adversarial::OneHugeLogit, Adversarial::IdenticalKeys})
      run_decode({t, 96, 16, 1, 16, {300, 2}, adv});
}

TEST_F(CudaKernels, DecodeAsyncTensorCorePhiOutOfRangeRecomputesEveryRow) {
  for (float phi : {200.f, -200.f, 3.f})
    for (int D : {80, 128})
      for (int splits : {1, 6}) run_decode({DType::F16, D, 32, 8, 16, {1, 64, 999}, Adversarial::None, true, splits, phi});
}

// ---- decode attention: warps per CTA and the async reduction (KernelOptions::decode_warps and
// async_combine) ----
// Every loop at 4 and 8 warps (head dims 64 and 128), sync and async, split and unsplit, GQA groups
// 1, 4, 8, 16, each loop also forced where the launcher would pick the other; the async splits
// added by the last CTA in the kernel and by the second launch, with adversarial rows (exact
// fallback counts), semaphores left zero and two launches bitwise the same (run_decode checks all).

// Few and short: these run under compute-sanitizer (scripts/gpu-check.sh filters on "Small").
TEST_F(CudaKernels, DecodeWarpsAndCombineSmallCases) {
  for (DType t : kTypes)
    for (int warps : {4, 8})
      for (const char* combine : {"kernel", "launch"}) {
        run_decode({t, 128, 8, 2, 16, {0, 1, 17, 300}, Adversarial::Mixed, true, 3, 0.f, nullptr, warps, combine});
        run_decode({t, 64, 4, 4, 16, {0, 1, 17, 300}, Adversarial::OneHugeLogit, true, 3, 0.f, nullptr, warps, combine});
        run_decode({t, 128, 32, 2, 8, {5, 700}, Adversarial::None, true, 8, 0.f, "core", warps, combine});
      }
}

TEST_F(CudaKernels, DecodeWarpsAllGroupSizesBothPaths) {
  const std::vector<int> lens{0, 1, 17, 129, 1000, 4097};
  // Groups 1, 4, 8, 16.
  const std::pair<int, int> heads[] = {{8, 8}, {32, 8}, {32, 4}, {32, 2}};
  for (DType t : kTypes)
    for (int D : {64, 128})
      for (auto [H, KVH] : heads)
        for (int warps : {4, 8}) {
          // The launcher's own loop, then the other one forced (CUDA cores for GQA, tensor cores for MHA).
          const char* other = H == KVH ? "mma" : "core";
          for (const char* path : {static_cast<const char*>(nullptr), other}) {
            run_decode({t, D, H, KVH, 16, lens, Adversarial::None, false, 1, 0.f, path, warps});
            for (int splits : {1, 0, 5})
              run_decode({t, D, H, KVH, 16, lens, Adversarial::None, true, splits, 0.f, path, warps});
          }
        }
}

// Both reductions at few and many splits (the in-kernel one forced up to 64 splits as well).
TEST_F(CudaKernels, DecodeAsyncCombineModesAllGroupSizes) {
  const std::vector<int> lens{0, 1, 17, 300, 2000};
  const std::pair<int, int> heads[] = {{8, 8}, {32, 8}, {32, 2}};
  for (DType t : kTypes)
    for (int D : {64, 128})
      for (auto [H, KVH] : heads)
        for (int warps : {4, 8})
          for (const char* combine : {"kernel", "launch"})
            for (int splits : {2, 8, 64})
              run_decode({t, D, H, KVH, 16, lens, Adversarial::None, true, splits, 0.f, nullptr, warps, combine});
}

TEST_F(CudaKernels, DecodeAsyncKernelCombineAdversarialFallsBackExactly) {
  for (DType t : kTypes)
    for (int D : {64, 128})
      for (Adversarial adv : {Adversarial::HugeLogits, Adversarial::OneHugeLogit, Adversarial::ZeroQuery,
                              Adversarial::IdenticalKeys, Adversarial::Mixed})
        for (int warps : {4, 8})
          for (int splits : {4, 8}) {
            run_decode({t, D, 8, 2, 16, {1, 17, 1000}, adv, true, splits, 0.f, nullptr, warps, "kernel"});
            run_decode({t, D, 16, 1, 16, {300, 2}, adv, true, splits, 0.f, "core", warps, "kernel"});
          }
  // phi far from the logits: every row is recomputed by the group's last CTA.
  for (float phi : {200.f, -200.f})
    for (int warps : {4, 8})
      run_decode({DType::F16, 128, 32, 8, 16, {1, 64, 999}, Adversarial::None, true, 6, phi, nullptr, warps, "kernel"});
}

// Long rows with the plan of each warp count (4 warps: two resident CTAs per SM, more splits).
TEST_F(CudaKernels, DecodeWarpsPlannedSplitsLongRows) {
  for (int warps : {4, 8})
    run_decode({DType::F16, 128, 32, 8, 16, {65536}, Adversarial::OneHugeLogit, true, 0, 0.f, nullptr, warps});
  for (int warps : {4, 8})
    run_decode({DType::BF16, 128, 32, 32, 16, {16384, 3}, Adversarial::None, true, 0, 0.f, nullptr, warps});
  for (int warps : {4, 8})
    run_decode({DType::BF16, 64, 32, 2, 16, {16384}, Adversarial::Mixed, true, 0, 0.f, nullptr, warps, "kernel"});
  for (int warps : {4, 8})
    run_decode({DType::F16, 128, 32, 32, 16, {16384}, Adversarial::None, false, 1, 0.f, nullptr, warps});
}

// ---- decode attention on an fp8 (e4m3) cache (--kv-cache-dtype fp8) ----
// The cache holds e4m3(x / scale) and the reference reads float(e4m3) x scale: exactly the values the
// kernels convert (e4m3 -> f16 and -> bf16 are exact), so the 16-bit cache's tolerances hold. Scales
// k 0.03 and v 2 (kFp8Kv), so that one folded into the wrong place shows; unused bytes are 0xFF (NaN).
// An fp8 cache runs the tensor-core loop whatever the plan would pick for a 16-bit one (run_decode
// plans the launch as decode_attention does); some cases force that loop, others leave the choice.

// Few and short: these run under compute-sanitizer (scripts/gpu-check.sh filters on "Small").
TEST_F(CudaKernels, DecodeAttentionFp8CacheSmallCases) {
  for (DType t : kTypes)
    for (int D : {64, 128, 256}) {
      run_decode(with_fp8({t, D, 8, 2, 16, {0, 1, 17, 40}}));
      // MHA where the 16-bit cache takes the CUDA-core loop (short rows at small batch).
      run_decode(with_fp8({t, D, 4, 4, 16, {600, 0, 3}, Adversarial::OneHugeLogit}));
      run_decode(with_fp8({t, D, 3, 3, 8, {70, 33}, Adversarial::None, false, 3}));
      for (int splits : {1, 3}) {
        run_decode(with_fp8({t, D, 8, 2, 16, {0, 1, 17, 40}, Adversarial::None, true, splits, 0.f, "mma"}));
        run_decode(with_fp8({t, D, 8, 2, 16, {1, 300}, Adversarial::Mixed, true, splits, 0.f, "mma"}));
      }
    }
  // Scale 1 (the engine's today).
  run_decode(with_fp8({DType::F16, 128, 8, 2, 16, {1, 17, 300}}, kFp8Unscaled));
  run_decode(with_fp8({DType::BF16, 64, 8, 2, 16, {1, 17, 300}, Adversarial::None, true, 3, 0.f, "mma"}, kFp8Unscaled));
}

// GQA groups 1 (MHA), 4, 8 (and one KV head) and 20 (a group over two CTAs), every fp8 head dim,
// lengths around the 16- and 32-key tiles, sync and async, one split, the plan's and five.
TEST_F(CudaKernels, DecodeAttentionFp8CacheAllHeadDimsAndGroups) {
  const std::vector<int> lens{1, 15, 16, 17, 31, 32, 33, 129, 1000, 4097};
  const std::pair<int, int> heads[] = {{4, 4}, {8, 2}, {16, 2}, {8, 1}, {40, 2}};
  for (DType t : kTypes)
    for (int D : {64, 128, 256})
      for (auto [H, KVH] : heads)
        for (int splits : {1, 0, 5}) {
          run_decode(with_fp8({t, D, H, KVH, 16, lens, Adversarial::None, false, splits}));
          run_decode(with_fp8({t, D, H, KVH, 16, lens, Adversarial::None, true, splits}));
        }
}

// Block sizes (1 and 8: rows looked up one by one; 32, 256: whole tiles), the token-major layout,
// 4 and 8 warps, both async reductions.
TEST_F(CudaKernels, DecodeAttentionFp8CacheBlocksLayoutsWarpsAndCombines) {
  for (DType t : kTypes)
    for (int bs : {1, 8, 32, 256}) {
      run_decode(with_fp8({t, 128, 8, 2, bs, {0, 1, 33, 300}}));
      run_decode(with_fp8({t, 64, 16, 2, bs, {0, 1, 31, 32, 33, 300}, Adversarial::None, true, 3, 0.f, "mma"}));
      run_decode(with_fp8({t, 256, 16, 2, bs, {0, 1, 33, 300}, Adversarial::Mixed, true, 3, 0.f, "mma"}));
    }
  for (DType t : kTypes)
    for (int D : {64, 128, 256})
      for (int bs : {8, 16}) {
        DecodeCase c = with_fp8({t, D, 8, 2, bs, {0, 1, 15, 16, 17, 40, 300}});
        c.head_major = false;
        run_decode(c);
        c.async = true;
        c.splits = 3;
        c.adv = Adversarial::Mixed;
        c.path = "mma";
        run_decode(c);
      }
  for (DType t : kTypes)
    for (int warps : {4, 8})
      for (const char* combine : {"kernel", "launch"}) {
        run_decode(with_fp8({t, 128, 8, 2, 16, {0, 1, 17, 300}, Adversarial::Mixed, true, 3, 0.f, "mma", warps, combine}));
        run_decode(with_fp8({t, 64, 4, 4, 16, {0, 1, 17, 300}, Adversarial::OneHugeLogit, true, 3, 0.f, "mma", warps,
                             combine}));
      }
  run_decode(with_fp8({DType::BF16, 128, 32, 8, 16, {65536, 1000}, Adversarial::None, true, 0, 0.f, "mma"}));
}

// Rows outside the unified max's range recompute exactly from the e4m3 bytes (in the kernel, in the
// group's last CTA and in the combine launch), with the host's count; the synchronized kernel stays
// finite and exact on the same inputs.
TEST_F(CudaKernels, DecodeAsyncFp8CacheAdversarialFallsBackExactly) {
  for (DType t : kTypes)
    for (int D : {64, 128, 256})
      for (Adversarial adv : {Adversarial::HugeLogits, Adversarial::OneHugeLogit, Adversarial::ZeroQuery,
                              Adversarial::IdenticalKeys, Adversarial::Mixed})
        for (int splits : {1, 4}) {
          run_decode(with_fp8({t, D, 8, 2, 16, {1, 17, 1000}, adv, true, splits, 0.f, "mma"}));
          run_decode(with_fp8({t, D, 32, 2, 16, {300, 2}, adv, true, splits, 0.f, "mma"}));
        }
  for (float phi : {200.f, -200.f})
    for (const char* combine : {"kernel", "launch"})
      run_decode(with_fp8({DType::F16, 128, 32, 8, 16, {1, 64, 999}, Adversarial::None, true, 6, phi, "mma", 0, combine}));
  for (DType t : kTypes)
    for (Adversarial adv : {Adversarial::HugeLogits, Adversarial::OneHugeLogit, Adversarial::IdenticalKeys})
      run_decode(with_fp8({t, 128, 16, 1, 16, {300, 2}, adv}));
}

// The masked kernels (sliding window, soft-capping, both) on an fp8 cache: the cap applies to the
// logits with k_scale folded in, the window to the keys read; the guard counts the capped logits.
TEST_F(CudaKernels, DecodeAttentionFp8CacheWindowAndSoftcap) {
  for (DType t : kTypes)
    for (int D : {64, 128, 256})
      for (auto [window, cap] : {std::pair{0, 3.f}, std::pair{40, 0.f}, std::pair{100, 2.f}}) {
        DecodeCase c = with_fp8({t, D, 8, 2, 16, {1, 17, 100, 101, 1000}});
        c.window = window;
        c.softcap = cap;
        run_decode(c);
        c.splits = 3;
        run_decode(c);
        c.async = true;
        c.path = "mma";
        for (int splits : {1, 4}) {
          c.splits = splits;
          run_decode(c);
        }
        c.adv = Adversarial::Mixed;
        run_decode(c);
      }
}

struct PrefillCase {
  DType t;
  int D, H, KVH, block_size, start_pos, n_tokens;
  Adversarial adv = Adversarial::None;
  bool time_it = false;
  bool head_major = true;  // the cache's layout (kv_cache_layout.h): the engine's, or token-major
};

void run_prefill(const PrefillCase& c) {
  cuda::KernelOptions layout;
  layout.kv_head_major = c.head_major;
  const cuda::KernelOptionsScope scope(layout);
  const int D = c.D, H = c.H, KVH = c.KVH, T = c.n_tokens, len = c.start_pos + T;
  const int width = (H + 2 * KVH) * D, G = H / KVH;
  const float scale = 1.f / std::sqrt(float(D));
  PagedCache cache(c.t, D, KVH, c.block_size, {len});
  std::vector<float> qkv_f;
  auto qkv = random_bits(size_t(T) * width, c.t, qkv_f);
  if (c.adv != Adversarial::None) {
    for (int i = 0; i < T; ++i)
      for (int h = 0; h < H; ++h) {
        std::vector<float> q(&qkv_f[size_t(i) * width + size_t(h) * D], &qkv_f[size_t(i) * width + size_t(h + 1) * D]);
        if (c.adv == Adversarial::HugeLogits) scale_query_to(q, cache.kf[0], c.start_pos + i + 1, KVH, D, h / G, scale, 1e4f);
        if (c.adv == Adversarial::ZeroQuery) std::fill(q.begin(), q.end(), 0.f);
        for (int d = 0; d < D; ++d) {
          const size_t at = size_t(i) * width + size_t(h) * D + d;
          qkv[at] = to_bits(q[d], c.t);
          qkv_f[at] = from_bits(qkv[at], c.t);
        }
      }
  }
  DeviceBuffer<uint16_t> d_qkv(qkv), d_out(size_t(T) * H * D);
  DeviceBuffer<uint16_t> d_k(c.head_major ? to_head_major(cache.k, KVH, D, c.block_size) : cache.k);
  DeviceBuffer<uint16_t> d_v(c.head_major ? to_head_major(cache.v, KVH, D, c.block_size) : cache.v);
  DeviceBuffer<int32_t> d_table(cache.tables);
  std::vector<float> q(size_t(T) * H * D), ref(size_t(T) * H * D);
  for (int i = 0; i < T; ++i) std::copy_n(&qkv_f[size_t(i) * width], H * D, &q[size_t(i) * H * D]);
  cpu::attention(q.data(), cache.kf[0].data(), cache.vf[0].data(), T, c.start_pos, H, KVH, D, scale, ref.data());
  // Every tile configuration (prefill_plan.h kConfigs) against the same reference.
  for (int config = 0; config < cuda::prefill_attention_configs(); ++config) {
    d_out.poison();
    cuda::prefill_attention(d_qkv.get(), d_k.get(), d_v.get(), d_table.get(), c.start_pos, T, H, KVH, D, c.block_size,
                            scale, d_out.get(), c.t, nullptr, nullptr, nullptr, config);
    sync("prefill_attention");
    std::ostringstream what;
    what << label("prefill_attention", c.t) << " " << cuda::prefill_attention_config_name(config) << " D " << D << " H "
         << H << " KVH " << KVH << " block " << c.block_size << (c.head_major ? " head-major" : " token-major")
         << " start " << c.start_pos << " T " << T << " " << adversarial_name(c.adv);
    if (c.time_it) {
      cudaEvent_t e0, e1;
      cuda_ok(cudaEventCreate(&e0), "cudaEventCreate");
      cuda_ok(cudaEventCreate(&e1), "cudaEventCreate");
      const int reps = 5;
      cuda_ok(cudaEventRecord(e0), "cudaEventRecord");
      for (int r = 0; r < reps; ++r)
        cuda::prefill_attention(d_qkv.get(), d_k.get(), d_v.get(), d_table.get(), c.start_pos, T, H, KVH, D,
                                c.block_size, scale, d_out.get(), c.t, nullptr, nullptr, nullptr, config);
      cuda_ok(cudaEventRecord(e1), "cudaEventRecord");
      sync("prefill_attention (timed)");
      float ms = 0;
      cuda_ok(cudaEventElapsedTime(&ms, e0, e1), "cudaEventElapsedTime");
      const double flops = 4.0 * H * D * (double(T) * c.start_pos + 0.5 * double(T) * (T + 1));
      std::printf("[perf] %s: %.3f ms (%.1f TFLOP/s)\n", what.str().c_str(), ms / reps,
                  flops / (ms / reps * 1e-3) / 1e12);
      cudaEventDestroy(e0);
      cudaEventDestroy(e1);
    }
    const auto got = from_bits(d_out.download(), c.t);
    // The tensor-core kernel rounds P to the 16-bit type before P.V (as FlashAttention does): one more
    // rounding than a 16-bit output of an fp32 result. The absolute part scales with |V| (about 1
    // here), not with the output's rms (an average over T keys, ~0.12 at T = 1024): 8u x rms. The
    // H200 run saw 2 of 4M elements of a 1024-token case at 4.5u x rms with 4u allowed.
    const double u = unit_roundoff(c.t);
    const Tolerance tol = c.adv == Adversarial::HugeLogits ? Tolerance{5e-4, 0, 0} : Tolerance{5e-4, 8 * u, 8 * u};
    expect_close(got, ref, tol, what.str());
  }
}

// Under compute-sanitizer too ("Small").
TEST_F(CudaKernels, PrefillAttentionSmallCases) {
  for (DType t : kTypes) {
    run_prefill({t, 64, 4, 2, 16, 3, 70});
    run_prefill({t, 128, 2, 1, 8, 0, 17, Adversarial::ZeroQuery});
    // The token-major cache (bench-attention --kv-layout token-major).
    run_prefill({t, 64, 4, 2, 16, 3, 70, Adversarial::None, false, false});
    run_prefill({t, 128, 8, 2, 8, 5, 40, Adversarial::None, false, false});
  }
}

TEST_F(CudaKernels, PrefillAttentionCausalOverPagedCache) {
  const std::pair<int, int> heads[] = {{4, 4}, {8, 2}, {16, 1}};
  const std::pair<int, int> spans[] = {{0, 1}, {37, 1}, {0, 7}, {0, 64}, {3, 65}, {100, 200}};
  for (DType t : kTypes)
    for (int D : {64, 128})
      for (auto [H, KVH] : heads)
        for (auto [start, T] : spans) run_prefill({t, D, H, KVH, 16, start, T});
  run_prefill({DType::BF16, 128, 8, 8, 1, 5, 70});
  run_prefill({DType::F16, 64, 6, 3, 64, 0, 129});
}

TEST_F(CudaKernels, PrefillAttentionAdversarialLogitsStayFinite) {
  for (DType t : kTypes)
    for (Adversarial adv : {Adversarial::HugeLogits, Adversarial::ZeroQuery}) {
      run_prefill({t, 128, 4, 2, 16, 0, 130, adv});
      run_prefill({t, 64, 4, 1, 16, 20, 33, adv});
    }
}

TEST_F(CudaKernels, PrefillAttentionLargeTimed) {
  run_prefill({DType::F16, 128, 32, 8, 16, 0, 1024, Adversarial::None, true});
  run_prefill({DType::BF16, 128, 8, 8, 16, 512, 1536, Adversarial::None, true});
}

// ================================================================================================
// sampling
// ================================================================================================

struct SampleRun {
  std::vector<int32_t> ids;
  std::vector<float> logits_after;  // the logits buffer after the call (penalty applied in place)
};

// Runs cuda::sample over `logits` ([rows, vocab]) with optional histories (one per row).
SampleRun gpu_sample(const std::vector<float>& logits, int rows, int vocab, const DeviceSamplingParams& p,
                     const std::vector<uint64_t>& offsets, const std::vector<std::vector<int32_t>>& histories = {}) {
  DeviceBuffer<float> d_logits(logits);
  DeviceBuffer<int32_t> d_out{size_t(rows)};
  DeviceBuffer<uint64_t> d_offsets(offsets.empty() ? std::vector<uint64_t>(size_t(rows), 0) : offsets);
  d_out.poison();
  int stride = 0;
  std::vector<int32_t> hist, lens(size_t(rows), 0);
  for (const auto& h : histories) stride = std::max(stride, int(h.size()) + 3);
  if (!histories.empty()) {
    // Token 0 past each row's length: reading it would penalize token 0 and fail the exact check.
    hist.assign(size_t(rows) * std::max(stride, 1), 0);
    for (int r = 0; r < rows; ++r) {
      std::copy(histories[r].begin(), histories[r].end(), hist.begin() + size_t(r) * stride);
      lens[r] = int(histories[r].size());
    }
  }
  DeviceBuffer<int32_t> d_hist(hist), d_lens(lens);
  const size_t ws_bytes = cuda::sampling_workspace_bytes(rows, vocab);
  DeviceBuffer<uint8_t> d_ws(ws_bytes);
  cuda::sample(d_logits.get(), rows, vocab, histories.empty() ? nullptr : d_hist.get(), d_lens.get(), stride, p,
               offsets.empty() && p.temperature <= 0 ? nullptr : d_offsets.get(), d_out.get(), d_ws.get(), ws_bytes,
               nullptr);
  sync("sample");
  return {d_out.download(), d_logits.download()};
}

DeviceSamplingParams params(float temperature, int top_k, float top_p, float min_p, float penalty = 1.f,
                            uint64_t seed = 1234) {
  return {temperature, top_k, top_p, min_p, penalty, seed};
}

std::string describe(const DeviceSamplingParams& p) {
  std::ostringstream s;
  s << "T " << p.temperature << " top_k " << p.top_k << " top_p " << p.top_p << " min_p " << p.min_p << " penalty "
    << p.repeat_penalty;
  return s.str();
}

// The CPU Sampler's kept candidates (with probabilities) for one row of already-penalized logits.
std::vector<Candidate> cpu_filtered(std::span<const float> logits, float temperature, int top_k, float top_p,
                                    float min_p) {
  std::vector<Candidate> c;
  c.reserve(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) c.push_back({int32_t(i), logits[i] / temperature, 0.f});
  if (top_k > 0 && size_t(top_k) < c.size()) {
    std::partial_sort(c.begin(), c.begin() + top_k, c.end(), [](const Candidate& a, const Candidate& b) {
      return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
    });
    c.resize(top_k);
  }
  Sampler::softmax(c);
  Sampler::top_p(c, top_p);
  Sampler::min_p(c, min_p);
  return c;
}

// The set the GPU may return: the CPU's kept set with top-p and min-p loosened by 1e-4 relative, so
// that a candidate exactly at a threshold (where fp32 exp rounding on the two sides may differ) is
// not counted as a violation.
std::set<int32_t> allowed_ids(std::span<const float> logits, const DeviceSamplingParams& p) {
  const float top_p = p.top_p >= 1.f ? 1.f : std::min(1.f, p.top_p * 1.0001f);
  const auto c = cpu_filtered(logits, p.temperature, p.top_k, top_p, p.min_p * 0.9999f);
  std::set<int32_t> ids;
  for (const auto& x : c) ids.insert(x.id);
  return ids;
}

std::vector<float> random_logits(int rows, int vocab, float scale) { return random_vector(size_t(rows) * vocab, scale); }

TEST_F(CudaKernels, SampleGreedyIsCpuArgmaxIncludingTies) {
  for (int vocab : {1, 7, 1000, 151936, 256000}) {
    const int rows = vocab > 100000 ? 3 : 37;
    auto logits = random_logits(rows, vocab, 3.f);
    for (int r = 0; r < rows; ++r) {
      float* row = &logits[size_t(r) * vocab];
      if (r % 3 == 1 && vocab > 2) {  // planted ties at the maximum: the lowest index must win
        const float top = *std::max_element(row, row + vocab) + 1.f;
        for (int k = 0; k < 4; ++k) row[uniform_int(0, vocab - 1)] = top;
      }
      if (r % 5 == 2) std::fill(row, row + vocab, -INFINITY);  // all -inf: index 0
      if (r % 7 == 3) std::fill(row, row + vocab, 0.5f);       // all equal: index 0
    }
    const auto run = gpu_sample(logits, rows, vocab, params(0.f, 40, 0.9f, 0.05f), {});
    for (int r = 0; r < rows; ++r)
      EXPECT_EQ(run.ids[r], argmax(std::span<const float>(&logits[size_t(r) * vocab], vocab)))
          << "vocab " << vocab << " row " << r;
  }
}

TEST_F(CudaKernels, SampleRepetitionPenaltyMatchesCpuInPlace) {
  const int rows = 9, vocab = 5000;
  const auto logits = random_logits(rows, vocab, 2.f);
  std::vector<std::vector<int32_t>> histories(rows);
  for (int r = 0; r < rows; ++r) {
    const int n = r == 0 ? 0 : uniform_int(1, r == 8 ? 3000 : 64);
    for (int i = 0; i < n; ++i) histories[r].push_back(uniform_int(0, vocab / (r + 1)));  // many repeats
    if (n > 3) {
      histories[r][1] = -1;         // ignored
      histories[r][2] = vocab + 5;  // out of range: ignored
    }
  }
  for (float penalty : {1.3f, 0.7f}) {
    const auto run = gpu_sample(logits, rows, vocab, params(0.f, 0, 1.f, 0.f, penalty), {}, histories);
    for (int r = 0; r < rows; ++r) {
      std::vector<float> ref(logits.begin() + size_t(r) * vocab, logits.begin() + size_t(r + 1) * vocab);
      Sampler::apply_repetition_penalty(ref, histories[r], penalty, -1);
      const std::vector<float> got(run.logits_after.begin() + size_t(r) * vocab,
                                   run.logits_after.begin() + size_t(r + 1) * vocab);
      EXPECT_EQ(got, ref) << "penalty " << penalty << " row " << r << " (" << histories[r].size() << " history)";
      EXPECT_EQ(run.ids[r], argmax(ref)) << "penalty " << penalty << " row " << r;
    }
  }
}

TEST_F(CudaKernels, SampleTopK1EqualsGreedy) {
  const int rows = 64, vocab = 32000;
  const auto logits = random_logits(rows, vocab, 4.f);
  std::vector<uint64_t> offsets(rows);
  std::iota(offsets.begin(), offsets.end(), 100);
  const auto run = gpu_sample(logits, rows, vocab, params(1.f, 1, 0.5f, 0.1f), offsets);
  for (int r = 0; r < rows; ++r)
    EXPECT_EQ(run.ids[r], argmax(std::span<const float>(&logits[size_t(r) * vocab], vocab))) << "row " << r;
}

TEST_F(CudaKernels, SampleSameSeedAndOffsetSameTokens) {
  const int rows = 32, vocab = 3000;
  const auto logits = random_logits(rows, vocab, 1.f);
  std::vector<uint64_t> offsets(rows);
  std::iota(offsets.begin(), offsets.end(), uint64_t(1) << 40);
  for (const auto& p : {params(1.f, 50, 0.95f, 0.f, 1.f, 7), params(1.f, 0, 0.95f, 0.f, 1.f, 7)}) {
    const auto a = gpu_sample(logits, rows, vocab, p, offsets);
    const auto b = gpu_sample(logits, rows, vocab, p, offsets);
    EXPECT_EQ(a.ids, b.ids) << describe(p);
    auto shifted = offsets;
    for (auto& o : shifted) o += 1000;
    const auto c = gpu_sample(logits, rows, vocab, p, shifted);
    EXPECT_NE(a.ids, c.ids) << describe(p) << ": other offsets should give other draws";
  }
}

// rows of identical logits with distinct offsets: 20000 draws against the CPU-filtered
// distribution, every token within 5 sigma, filtered tokens never drawn.
void check_distribution(int vocab, float logit_scale, const DeviceSamplingParams& p) {
  const int rows = 250, launches = 80, draws = rows * launches;
  const auto one = random_vector(size_t(vocab), logit_scale);
  std::vector<float> logits;
  for (int r = 0; r < rows; ++r) logits.insert(logits.end(), one.begin(), one.end());
  std::vector<int64_t> counts(vocab, 0);
  for (int l = 0; l < launches; ++l) {
    std::vector<uint64_t> offsets(rows);
    for (int r = 0; r < rows; ++r) offsets[r] = uint64_t(l) * rows + r;
    const auto run = gpu_sample(logits, rows, vocab, p, offsets);
    for (int id : run.ids) {
      ASSERT_TRUE(id >= 0 && id < vocab) << describe(p) << ": id " << id << " out of range";
      ++counts[id];
    }
  }
  const auto kept = cpu_filtered(one, p.temperature, p.top_k, p.top_p, p.min_p);
  std::vector<double> expected(vocab, 0.0);
  for (const auto& c : kept) expected[c.id] = c.prob;
  int bad = 0;
  std::ostringstream first;
  for (int i = 0; i < vocab; ++i) {
    const double mean = draws * expected[i];
    const double sigma = std::sqrt(draws * expected[i] * (1 - expected[i]));
    const bool ok = expected[i] == 0 ? counts[i] == 0 : std::fabs(counts[i] - mean) <= 5 * sigma + 1;
    if (!ok) {
      if (bad++ < 5) first << " [" << i << "] drawn " << counts[i] << " expected " << mean << " (p " << expected[i] << ");";
    }
  }
  EXPECT_EQ(bad, 0) << "vocab " << vocab << " " << describe(p) << " (" << kept.size() << " kept):" << first.str();
}

TEST_F(CudaKernels, SampleDistributionMatchesCpuFilters) {
  check_distribution(64, 2.f, params(0.8f, 10, 1.f, 0.f));      // top-k (select path)
  check_distribution(64, 2.f, params(1.3f, 40, 0.95f, 0.05f));  // all filters (select path)
  check_distribution(64, 2.f, params(1.f, 0, 0.9f, 0.f));       // top-p only (sort path)
  check_distribution(64, 2.f, params(0.7f, 0, 1.f, 0.1f));      // min-p only (sort path)
  check_distribution(64, 1.f, params(1.f, 0, 1.f, 0.f));        // plain softmax (sort path)
  check_distribution(3000, 6.f, params(1.f, 1500, 0.99f, 0.f)); // top_k > 1024 (sort path, truncated)
  check_distribution(20000, 3.f, params(1.f, 50, 0.9f, 0.f));   // select path, threshold fast path
  check_distribution(5000, 0.02f, params(1.f, 20, 1.f, 0.f));   // select path, radix-select fallback
}

TEST_F(CudaKernels, SampleNeverReturnsAFilteredToken) {
  struct Setting {
    int vocab;
    DeviceSamplingParams p;
  };
  const Setting settings[] = {
      {100, params(1.f, 5, 1.f, 0.f)},        {5000, params(0.5f, 40, 0.9f, 0.05f)},
      {5000, params(2.f, 1024, 0.5f, 0.f)},   {32000, params(1.f, 0, 0.8f, 0.f)},
      {32000, params(0.9f, 0, 1.f, 0.2f)},    {32000, params(1.5f, 3000, 0.95f, 0.02f)},
      {7, params(1.f, 3, 0.6f, 0.3f)},        {256000, params(0.8f, 40, 0.95f, 0.05f)},
      {256000, params(1.f, 0, 0.9f, 0.f)},
  };
  for (const auto& s : settings) {
    const int rows = s.vocab > 100000 ? 2 : 96;
    // scale 0.01: the logits are so flat that the top-k kernel's threshold fast path overflows and
    // its radix-select fallback runs.
    for (int rep = 0; rep < 3; ++rep) {
      const float scale = rep == 0 ? 1.f : rep == 1 ? 5.f : 0.01f;
      const auto logits = random_logits(rows, s.vocab, scale);
      std::vector<uint64_t> offsets(rows);
      for (int r = 0; r < rows; ++r) offsets[r] = uint64_t(rep) << 32 | r;
      const auto run = gpu_sample(logits, rows, s.vocab, s.p, offsets);
      for (int r = 0; r < rows; ++r) {
        const auto allowed = allowed_ids(std::span<const float>(&logits[size_t(r) * s.vocab], s.vocab), s.p);
        EXPECT_TRUE(allowed.count(run.ids[r])) << "vocab " << s.vocab << " " << describe(s.p) << " scale " << scale
                                               << " row " << r << ": id " << run.ids[r] << " is filtered out ("
                                               << allowed.size() << " allowed)";
      }
    }
  }
}

TEST_F(CudaKernels, SampleTiesKeepTheLowerIds) {
  // All logits equal: top-k keeps ids 0..k-1; top-p keeps the lowest ids reaching the mass.
  struct Setting {
    int vocab;
    DeviceSamplingParams p;
    int max_id;  // exclusive bound on the allowed ids
  };
  const Setting settings[] = {
      {1000, params(1.f, 5, 1.f, 0.f), 5},         // select path, all ties at the threshold
      {100000, params(1.f, 17, 1.f, 0.f), 17},     // select path, ordered tie gather over a long row
      {1000, params(1.f, 0, 0.5f, 0.f), 500},      // sort path: stable sort keeps ids ascending
      {5000, params(1.f, 2000, 1.f, 0.f), 2000},   // sort path truncated to top_k
  };
  for (const auto& s : settings) {
    const int rows = 64;
    const std::vector<float> logits(size_t(rows) * s.vocab, 0.25f);
    std::vector<uint64_t> offsets(rows);
    std::iota(offsets.begin(), offsets.end(), 5);
    const auto run = gpu_sample(logits, rows, s.vocab, s.p, offsets);
    int max_seen = -1;
    for (int r = 0; r < rows; ++r) {
      EXPECT_TRUE(run.ids[r] >= 0 && run.ids[r] < s.max_id)
          << "vocab " << s.vocab << " " << describe(s.p) << " row " << r << ": id " << run.ids[r];
      max_seen = std::max(max_seen, run.ids[r]);
    }
    EXPECT_GT(max_seen, s.max_id / 4) << describe(s.p) << ": draws should spread over the kept ids";
  }
  // Ties straddling the top-k threshold: 3 distinct top logits, then ties; top-k 5 keeps the 2
  // lowest-id ties.
  const int vocab = 50000, rows = 128;
  std::vector<float> row(vocab, 1.f);
  row[40000] = 5.f;
  row[7] = 4.f;
  row[30000] = 3.f;
  std::vector<float> logits;
  for (int r = 0; r < rows; ++r) logits.insert(logits.end(), row.begin(), row.end());
  std::vector<uint64_t> offsets(rows);
  std::iota(offsets.begin(), offsets.end(), 0);
  const auto run = gpu_sample(logits, rows, vocab, params(0.5f, 5, 1.f, 0.f), offsets);
  const std::set<int32_t> allowed{40000, 7, 30000, 0, 1};
  for (int r = 0; r < rows; ++r) EXPECT_TRUE(allowed.count(run.ids[r])) << "row " << r << ": id " << run.ids[r];

  // The same through the threshold fast path (the tie group fits in shared memory): 3 distinct top
  // logits, 100 ties at 1.0 on scattered ids, the rest far below; top-k 10 keeps the 7 lowest-id ties.
  const int vocab2 = 10000;
  std::vector<float> row2(vocab2, -30.f);
  std::vector<int32_t> tie_ids;
  for (int i = 0; i < 100; ++i) tie_ids.push_back(97 * i + 13);
  for (int id : tie_ids) row2[id] = 1.f;
  row2[9999] = 2.5f;
  row2[5] = 2.f;
  row2[4444] = 1.5f;
  std::vector<float> logits2;
  for (int r = 0; r < rows; ++r) logits2.insert(logits2.end(), row2.begin(), row2.end());
  std::set<int32_t> allowed2{9999, 5, 4444};
  std::sort(tie_ids.begin(), tie_ids.end());
  allowed2.insert(tie_ids.begin(), tie_ids.begin() + 7);
  const auto p2 = params(0.3f, 10, 1.f, 0.f);
  EXPECT_EQ(allowed2, allowed_ids(row2, p2));
  const auto run2 = gpu_sample(logits2, rows, vocab2, p2, offsets);
  for (int r = 0; r < rows; ++r) EXPECT_TRUE(allowed2.count(run2.ids[r])) << "row " << r << ": id " << run2.ids[r];
}

TEST_F(CudaKernels, SampleSingleRowSortPath) {
  // rows == 1 takes the device-wide radix sort instead of the segmented one.
  const int vocab = 50000;
  const auto logits = random_logits(1, vocab, 2.f);
  const auto p = params(1.f, 0, 0.9f, 0.02f);
  const auto allowed = allowed_ids(logits, p);
  std::set<int32_t> seen;
  for (uint64_t off = 0; off < 60; ++off) {
    const auto run = gpu_sample(logits, 1, vocab, p, {off});
    EXPECT_TRUE(allowed.count(run.ids[0])) << "offset " << off << ": id " << run.ids[0] << " is filtered out";
    seen.insert(run.ids[0]);
  }
  EXPECT_GT(seen.size(), 1u) << "60 draws all gave the same token";
  {  // a workspace sized for a larger batch serves one row (runners size it once)
    DeviceBuffer<float> d_logits(logits);
    DeviceBuffer<int32_t> d_out{size_t(1)};
    DeviceBuffer<uint64_t> d_off(std::vector<uint64_t>{3});
    const size_t bytes = cuda::sampling_workspace_bytes(8, vocab);
    DeviceBuffer<uint8_t> ws(bytes);
    cuda::sample(d_logits.get(), 1, vocab, nullptr, nullptr, 0, p, d_off.get(), d_out.get(), ws.get(), bytes, nullptr);
    sync("sample");
    EXPECT_TRUE(allowed.count(d_out.download()[0]));
  }
  const std::vector<float> flat(1000, -1.5f);
  for (uint64_t off = 0; off < 30; ++off) {
    const auto run = gpu_sample(flat, 1, 1000, params(1.f, 0, 0.5f, 0.f), {off});
    EXPECT_TRUE(run.ids[0] >= 0 && run.ids[0] < 500) << "offset " << off << ": id " << run.ids[0];
  }
}

// Structured output's device-side mask: only the masked rows change, only outside their masks (to
// -inf), and draws from a masked row (greedy, and sampled with every filter off, where the -inf
// candidates are last and carry no mass) stay inside the mask.
TEST_F(CudaKernels, TokenMaskThenSampleStaysInsideTheMask) {
  const int rows = 3, vocab = 5003, words = (vocab + 31) / 32;
  const auto logits = random_logits(rows, vocab, 3.f);
  std::mt19937 rng(11);
  std::vector<uint32_t> masks(size_t(2) * words, 0u);
  std::vector<std::set<int32_t>> allowed(2);
  for (int m = 0; m < 2; ++m)
    for (int i = 0; i < vocab; ++i)
      if (rng() % 10 == 0) {
        masks[size_t(m) * words + (i >> 5)] |= 1u << (i & 31);
        allowed[m].insert(i);
      }
  const std::vector<int32_t> heads = {0, 2};  // row 1 has no mask
  DeviceBuffer<float> d_logits(logits);
  DeviceBuffer<uint32_t> d_masks(masks);
  DeviceBuffer<int32_t> d_heads(heads);
  cuda::apply_token_masks(d_logits.get(), vocab, d_masks.get(), words, d_heads.get(), 2, nullptr);
  sync("apply_token_masks");
  const std::vector<float> masked = d_logits.download();
  for (int r = 0; r < rows; ++r)
    for (int i = 0; i < vocab; ++i) {
      const size_t k = size_t(r) * vocab + i;
      const bool keep = r == 1 || allowed[r == 0 ? 0 : 1].count(i);
      if (keep) ASSERT_EQ(masked[k], logits[k]) << r << "," << i;
      else ASSERT_TRUE(std::isinf(masked[k]) && masked[k] < 0) << r << "," << i;
    }
  const auto greedy = gpu_sample(masked, rows, vocab, params(0.f, 0, 1.f, 0.f), {});
  for (int r : {0, 2}) {
    const int m = r == 0 ? 0 : 1;
    int32_t best = *allowed[m].begin();
    for (int32_t i : allowed[m])
      if (logits[size_t(r) * vocab + i] > logits[size_t(r) * vocab + best]) best = i;
    EXPECT_EQ(greedy.ids[r], best) << "row " << r;
  }
  for (uint64_t off = 0; off < 40; ++off) {
    const auto run = gpu_sample(masked, rows, vocab, params(1.f, 0, 1.f, 0.f), {off, off, off});
    EXPECT_TRUE(allowed[0].count(run.ids[0])) << "offset " << off << ": id " << run.ids[0];
    EXPECT_TRUE(allowed[1].count(run.ids[2])) << "offset " << off << ": id " << run.ids[2];
  }
}

// ================================================================================================
// argument validation
// ================================================================================================

TEST_F(CudaKernels, LaunchersRejectBadArguments) {
  DeviceBuffer<uint16_t> buf(1 << 16);
  DeviceBuffer<int32_t> ints(256);
  DeviceBuffer<float> f32(1 << 14);
  void* p = buf.get();
  const int32_t* ip = ints.get();
  // A valid call (1 sequence, 8/2 heads, head_dim 64, 16-key blocks) but for the one field each case changes.
  const cuda::DecodeAttentionParams valid{.qkv = p, .k_cache = p, .v_cache = p, .block_tables = ip,
                                          .max_blocks_per_seq = 4, .context_lens = ip, .out = p, .batch = 1,
                                          .n_heads = 8, .n_kv_heads = 2, .head_dim = 64, .block_size = 16,
                                          .scale = 0.1f, .dtype = DType::F16};
  auto with = [&](auto change) {
    cuda::DecodeAttentionParams q = valid;
    change(q);
    return q;
  };
  expect_error_naming(
      [&] { cuda::decode_attention(with([](auto& q) { q.head_dim = 72; }), nullptr); }, "head_dim = 72");
  expect_error_naming(
      [&] { cuda::decode_attention(with([](auto& q) { q.n_kv_heads = 3; }), nullptr); }, "not a multiple");
  expect_error_naming(
      [&] { cuda::decode_attention(with([](auto& q) { q.block_size = 12; }), nullptr); }, "block_size = 12");
  expect_error_naming([&] { cuda::decode_attention(with([](auto& q) { q.k_cache = nullptr; }), nullptr); },
                      "decode_attention: null pointer");
  expect_error_naming([&] { cuda::prefill_attention(p, p, p, ip, 0, 0, 8, 2, 64, 16, 0.1f, p, DType::F16, nullptr); },
                      "prefill_attention");
  expect_error_naming([&] { cuda::prefill_attention(p, p, p, ip, -1, 4, 8, 2, 64, 16, 0.1f, p, DType::F16, nullptr); },
                      "start_pos = -1");
  expect_error_naming([&] { cuda::rope_qk(p, ip, f32.get(), 33, 1, 2, 1, 64, RopeStyle::RotateHalf, DType::F16, nullptr); },
                      "n_freq = 33");
  expect_error_naming([&] { cuda::residual_norm(f32.get(), nullptr, nullptr, p, nullptr, nullptr, 1, 8, 1e-5,
                                                NormType::RMSNorm, false, DType::BF16, nullptr); },
                      "nothing to write");
  expect_error_naming([&] { cuda::embedding(p, nullptr, 0, DType::F16, ip, ip, 0, 8, f32.get(), nullptr); }, "embedding");
  expect_error_naming([&] { cuda::silu_mul(p, nullptr, 1, 8, DType::F16, nullptr); }, "silu_mul: null pointer");
  expect_error_naming([&] { cuda::add_bias(p, p, -1, 8, DType::F16, nullptr); }, "add_bias");
  expect_error_naming([&] { cuda::relu(p, 1, 0, DType::F16, nullptr); }, "relu");
  expect_error_naming([&] { cuda::kv_cache_write(p, ip, 1, 2, 0, 64, 16, p, p, DType::F16, nullptr); },
                      "kv_cache_write");
  expect_error_naming([&] { cuda::kv_cache_write(p, ip, 1, 2, 1, 64, 12, p, p, DType::F16, nullptr); }, "block_size");
  const DeviceSamplingParams ok = params(1.f, 40, 0.9f, 0.f);
  expect_error_naming([&] { cuda::sample(f32.get(), 1, 100, nullptr, nullptr, 0, ok, nullptr, ints.get(), nullptr, 0,
                                         nullptr); },
                      "offsets");
  expect_error_naming([&] { cuda::sample(f32.get(), 1, 100, nullptr, nullptr, 0, params(1.f, 0, 0.f, 0.f), nullptr,
                                         ints.get(), nullptr, 0, nullptr); },
                      "top-p");
  DeviceBuffer<uint64_t> offs(4);
  expect_error_naming([&] { cuda::sample(f32.get(), 1, 100, nullptr, nullptr, 0, params(1.f, 0, 0.9f, 0.f), offs.get(),
                                         ints.get(), p, 16, nullptr); },
                      "too small");
  sync("(no launch expected)");
}

// An fp8 cache takes head dims 64, 128 and 256 and positive finite scales: anything else is one clear
// error from each writer (before any launch).
TEST_F(CudaKernels, Fp8CacheWritersRejectOtherHeadDimsAndBadScales) {
  DeviceBuffer<uint16_t> buf(1 << 16);
  DeviceBuffer<int32_t> ints(256);
  DeviceBuffer<float> f32(256);
  void* p = buf.get();
  const int32_t* ip = ints.get();
  for (int D : {80, 96, 32}) {
    const std::string needle = "head_dim 64, 128 or 256, not " + std::to_string(D);
    expect_error_naming([&] { cuda::kv_cache_write(p, ip, 1, 2, 1, D, 16, p, p, DType::F16, nullptr, kFp8Kv); },
                        needle);
    expect_error_naming([&] { cuda::rope_qk_cache(p, ip, f32.get(), 8, ip, 1, 2, 1, D, 16, RopeStyle::RotateHalf, p, p,
                                                  DType::BF16, nullptr, kFp8Kv); },
                        needle);
  }
  for (float bad : {0.f, -1.f, INFINITY, NAN}) {
    expect_error_naming([&] { cuda::kv_cache_write(p, ip, 1, 2, 1, 64, 16, p, p, DType::F16, nullptr,
                                                   {cuda::KvDType::Fp8E4M3, bad, 1.f}); },
                        "scales must be positive and finite");
    expect_error_naming([&] { cuda::rope_qk_cache(p, ip, f32.get(), 8, ip, 1, 2, 1, 128, 16, RopeStyle::RotateHalf, p,
                                                  p, DType::F16, nullptr, {cuda::KvDType::Fp8E4M3, 1.f, bad}); },
                        "scales must be positive and finite");
  }
  // Decode attention (kernels.h: head dims 64, 128 and 256 on an fp8 cache): 80 and 96 run on a
  // 16-bit cache only, and are refused naming the head dim.
  for (int D : {80, 96}) {
    cuda::DecodeAttentionParams q{.qkv = p, .k_cache = p, .v_cache = p, .block_tables = ip, .max_blocks_per_seq = 4,
                                  .context_lens = ip, .out = p, .batch = 1, .n_heads = 8, .n_kv_heads = 2,
                                  .head_dim = D, .block_size = 16, .scale = 0.1f, .dtype = DType::F16,
                                  .kv_quant = kFp8Kv};
    expect_error_naming([&] { cuda::decode_attention(q, nullptr); }, std::to_string(D));
  }
  sync("(no launch expected)");
}

// ================================================================================================
// benchmarks (FDPP_GPU_BENCH=1; skipped otherwise)
// ================================================================================================

TEST_F(CudaKernels, BenchDecodeAttention) {
  if (!bench::enabled()) GTEST_SKIP() << "set FDPP_GPU_BENCH=1";
  struct Case {
    int B, H, KVH, L;
  };
  const Case cases[] = {{1, 32, 32, 1024}, {1, 32, 32, 16384}, {8, 32, 32, 4096}, {1, 32, 8, 4096},
                        {32, 32, 8, 1024}, {64, 32, 8, 4096}, {1, 32, 8, 131072}};
  const int D = 128, bs = 16;
  const DType t = DType::BF16;
  for (const auto& c : cases) {
    const int nb = (c.L + bs - 1) / bs;
    const size_t cache_elems = size_t(c.B) * nb * bs * c.KVH * D;
    const size_t bytes = 2 * cache_elems * 2;  // K and V, 16-bit
    const int copies = int(std::max<size_t>(1, (256u << 20) / bytes + 1));  // working set past L2
    std::vector<DeviceBuffer<uint16_t>> k, v;
    for (int i = 0; i < copies; ++i) {
      k.emplace_back(cache_elems);
      v.emplace_back(cache_elems);
      cuda_ok(cudaMemset(k.back().get(), 0x3c, cache_elems * 2), "cudaMemset");
      cuda_ok(cudaMemset(v.back().get(), 0x3c, cache_elems * 2), "cudaMemset");
    }
    std::vector<int32_t> tables(size_t(c.B) * nb);
    for (size_t i = 0; i < tables.size(); ++i) tables[i] = int32_t(i);
    DeviceBuffer<int32_t> d_tables(tables), d_lens(std::vector<int32_t>(c.B, c.L));
    DeviceBuffer<uint16_t> qkv(size_t(c.B) * (c.H + 2 * c.KVH) * D), out(size_t(c.B) * c.H * D);
    cuda_ok(cudaMemset(qkv.get(), 0x3c, qkv.size() * 2), "cudaMemset");
    const double us = bench::median_us(50, [&](int i) {
      cuda::decode_attention({.qkv = qkv.get(), .k_cache = k[i % copies].get(), .v_cache = v[i % copies].get(),
                              .block_tables = d_tables.get(), .max_blocks_per_seq = nb, .context_lens = d_lens.get(),
                              .out = out.get(), .batch = c.B, .n_heads = c.H, .n_kv_heads = c.KVH, .head_dim = D,
                              .block_size = bs, .scale = 0.088f, .dtype = t},
                             nullptr);
    });
    const double moved = 2.0 * c.B * c.L * c.KVH * D * 2;
    std::printf("[perf] decode_attention bf16 B %d H %d KVH %d D %d L %d: %.1f us, %.1f%% of 4.46 TB/s\n", c.B, c.H,
                c.KVH, D, c.L, us, 100 * moved / (us * 1e-6) / bench::kReadBandwidth);
  }
}

TEST_F(CudaKernels, BenchPrefillAttention) {
  if (!bench::enabled()) GTEST_SKIP() << "set FDPP_GPU_BENCH=1";
  const int D = 128, H = 32, KVH = 8, bs = 16;
  for (int T : {512, 1024, 4096, 8192}) {
    const int nb = (T + bs - 1) / bs;
    const size_t cache_elems = size_t(nb) * bs * KVH * D;
    DeviceBuffer<uint16_t> k(cache_elems), v(cache_elems), qkv(size_t(T) * (H + 2 * KVH) * D), out(size_t(T) * H * D);
    for (auto* b : {&k, &v, &qkv}) cuda_ok(cudaMemset(b->get(), 0x3c, b->size() * 2), "cudaMemset");
    std::vector<int32_t> table(nb);
    std::iota(table.begin(), table.end(), 0);
    DeviceBuffer<int32_t> d_table(table);
    const double us = bench::median_us(T >= 4096 ? 5 : 20, [&](int) {
      cuda::prefill_attention(qkv.get(), k.get(), v.get(), d_table.get(), 0, T, H, KVH, D, bs, 0.088f, out.get(),
                              DType::BF16, nullptr);
    });
    const double flops = 4.0 * H * D * 0.5 * double(T) * (T + 1);
    std::printf("[perf] prefill_attention bf16 H %d KVH %d D %d T %d: %.3f ms, %.1f TFLOP/s\n", H, KVH, D, T, us / 1e3,
                flops / (us * 1e-6) / 1e12);
  }
}

// logit_bias with the min_tokens mask (-inf entries, an id biased then masked), the repetition
// penalty and the presence / frequency penalties, per row, against the CPU Sampler's steps in its
// order: the logits after the call equal the CPU's bit for bit, and greedy picks their argmax.
TEST_F(CudaKernels, SampleLogitAdjustMatchesCpuInPlace) {
  const int rows = 7, vocab = 5000;
  const auto logits = random_logits(rows, vocab, 2.f);
  std::vector<std::vector<int32_t>> histories(rows), generated(rows);
  std::vector<std::vector<LogitBias>> biases(rows);
  std::vector<float> presence(rows), frequency(rows);
  std::vector<int32_t> bias_off{0}, bias_ids, gen_off{0}, gen_ids;
  std::vector<float> bias_vals;
  for (int r = 0; r < rows; ++r) {
    const int n = r == 0 ? 0 : uniform_int(1, r == 6 ? 3000 : 80);
    for (int i = 0; i < n; ++i) histories[r].push_back(uniform_int(0, vocab / (r + 1)));  // many repeats
    generated[r].assign(histories[r].begin() + n / 2, histories[r].end());
    presence[r] = r == 3 ? 0.f : static_cast<float>(uniform_int(-200, 200)) / 100.f;
    frequency[r] = r == 4 ? 0.f : static_cast<float>(uniform_int(-200, 200)) / 100.f;
    for (int i = 0; i < (r == 2 ? 0 : 12); ++i)
      biases[r].push_back({uniform_int(0, vocab - 1), static_cast<float>(uniform_int(-10000, 10000)) / 100.f});
    if (r % 2 == 1) {  // the min_tokens mask, one id also biased before it
      biases[r].push_back({biases[r][0].id, -INFINITY});
      biases[r].push_back({uniform_int(0, vocab - 1), -INFINITY});
    }
    for (const LogitBias& b : biases[r]) {
      bias_ids.push_back(b.id);
      bias_vals.push_back(b.bias);
    }
    bias_off.push_back(static_cast<int32_t>(bias_ids.size()));
    gen_ids.insert(gen_ids.end(), generated[r].begin(), generated[r].end());
    gen_off.push_back(static_cast<int32_t>(gen_ids.size()));
  }
  DeviceBuffer<int32_t> d_bias_off(bias_off), d_bias_ids(bias_ids), d_gen_off(gen_off), d_gen_ids(gen_ids);
  DeviceBuffer<float> d_bias_vals(bias_vals), d_presence(presence), d_frequency(frequency);
  cuda::LogitAdjust adjust{d_bias_off.get(), d_bias_ids.get(), d_bias_vals.get(), d_gen_off.get(),
                           d_gen_ids.get(),  d_presence.get(), d_frequency.get()};
  for (float penalty : {1.f, 1.3f}) {
    DeviceBuffer<float> d_logits(logits);
    DeviceBuffer<int32_t> d_out{size_t(rows)};
    int stride = 1;
    for (const auto& h : histories) stride = std::max(stride, int(h.size()));
    std::vector<int32_t> hist(size_t(rows) * stride, -1), lens(rows);
    for (int r = 0; r < rows; ++r) {
      std::copy(histories[r].begin(), histories[r].end(), hist.begin() + size_t(r) * stride);
      lens[r] = int(histories[r].size());
    }
    DeviceBuffer<int32_t> d_hist(hist), d_lens(lens);
    const size_t ws_bytes = cuda::sampling_workspace_bytes(rows, vocab);
    DeviceBuffer<uint8_t> d_ws(ws_bytes);
    cuda::sample(d_logits.get(), rows, vocab, d_hist.get(), d_lens.get(), stride, params(0.f, 0, 1.f, 0.f, penalty),
                 nullptr, d_out.get(), d_ws.get(), ws_bytes, nullptr, nullptr, &adjust);
    sync("sample with adjustments");
    const auto after = d_logits.download();
    const auto ids = d_out.download();
    for (int r = 0; r < rows; ++r) {
      std::vector<float> ref(logits.begin() + size_t(r) * vocab, logits.begin() + size_t(r + 1) * vocab);
      SamplingParams p;
      p.logit_bias = biases[r];
      Sampler::apply_logit_bias(ref, p, 0);
      Sampler::apply_repetition_penalty(ref, histories[r], penalty, -1);
      Sampler::apply_presence_frequency(ref, generated[r], presence[r], frequency[r]);
      const std::vector<float> got(after.begin() + size_t(r) * vocab, after.begin() + size_t(r + 1) * vocab);
      EXPECT_EQ(got, ref) << "penalty " << penalty << " row " << r;
      EXPECT_EQ(ids[r], argmax(ref)) << "penalty " << penalty << " row " << r;
    }
  }
}

// Log probabilities on the device against the CPU Sampler::logprobs on the same logits: the top k
// ids (ties by the lower id, NaN as -inf), the rank, and the values to 1e-5.
TEST_F(CudaKernels, TokenLogprobsMatchCpu) {
  for (int vocab : {7, 1000, 151936}) {
    const int rows = vocab > 100000 ? 3 : 9;
    auto logits = random_logits(rows, vocab, 3.f);
    for (int r = 0; r < rows; ++r) {
      float* row = &logits[size_t(r) * vocab];
      if (r % 3 == 1 && vocab > 4) {  // ties at the top
        const float top = *std::max_element(row, row + vocab) + 0.5f;
        for (int k = 0; k < 3; ++k) row[uniform_int(0, vocab - 1)] = top;
      }
      if (r % 4 == 2) row[uniform_int(0, vocab - 1)] = NAN;
      if (r % 4 == 3) row[uniform_int(0, vocab - 1)] = -INFINITY;
    }
    std::vector<int32_t> tokens(rows), lp_rows;
    for (int r = 0; r < rows; ++r) {
      tokens[r] = uniform_int(0, vocab - 1);
      if (r != 1) lp_rows.push_back(r);  // a subset of the rows, as the engine passes
    }
    for (int k : {0, 1, 5, 20}) {
      const int kk = std::min(k, vocab);
      const int stride = 2 + 2 * kk;
      DeviceBuffer<float> d_logits(logits), d_out{lp_rows.size() * size_t(stride)};
      DeviceBuffer<int32_t> d_rows(lp_rows), d_tokens(tokens);
      d_out.poison();
      cuda::token_logprobs(d_logits.get(), vocab, d_rows.get(), int(lp_rows.size()), d_tokens.get(), kk, d_out.get(),
                           stride, nullptr);
      sync("token_logprobs");
      const auto out = d_out.download();
      for (size_t j = 0; j < lp_rows.size(); ++j) {
        const int r = lp_rows[j];
        const TokenLogprobs ref =
            Sampler::logprobs(std::span<const float>(&logits[size_t(r) * vocab], vocab), tokens[r], kk);
        const float* o = &out[j * stride];
        // A token at a NaN or -inf logit has logprob -inf on both sides.
        if (std::isinf(ref.logprob))
          EXPECT_EQ(o[0], ref.logprob) << "vocab " << vocab << " row " << r;
        else
          EXPECT_NEAR(o[0], ref.logprob, 1e-5) << "vocab " << vocab << " row " << r;
        EXPECT_EQ(static_cast<int>(o[1]), ref.rank) << "vocab " << vocab << " row " << r;
        for (int e = 0; e < kk; ++e) {
          EXPECT_EQ(static_cast<int>(o[2 + 2 * e]), ref.top[e].id) << "vocab " << vocab << " row " << r << " #" << e;
          if (std::isinf(ref.top[e].logprob))
            EXPECT_EQ(o[3 + 2 * e], ref.top[e].logprob) << "vocab " << vocab << " row " << r << " #" << e;
          else
            EXPECT_NEAR(o[3 + 2 * e], ref.top[e].logprob, 1e-5) << "vocab " << vocab << " row " << r << " #" << e;
        }
      }
    }
  }
}

TEST_F(CudaKernels, BenchSample) {
  if (!bench::enabled()) GTEST_SKIP() << "set FDPP_GPU_BENCH=1";
  for (int vocab : {32000, 128256, 256000}) {
    for (int rows : {1, 64}) {
      DeviceBuffer<float> logits(random_logits(rows, vocab, 3.f));
      DeviceBuffer<int32_t> out{size_t(rows)};
      std::vector<uint64_t> offs(rows);
      std::iota(offs.begin(), offs.end(), 0);
      DeviceBuffer<uint64_t> d_offs(offs);
      const size_t ws_bytes = cuda::sampling_workspace_bytes(rows, vocab);
      DeviceBuffer<uint8_t> ws(ws_bytes);
      for (const auto& p : {params(0.f, 0, 1.f, 0.f), params(0.8f, 40, 0.95f, 0.05f), params(1.f, 0, 0.9f, 0.f)}) {
        const double us = bench::median_us(20, [&](int) {
          cuda::sample(logits.get(), rows, vocab, nullptr, nullptr, 0, p, d_offs.get(), out.get(), ws.get(), ws_bytes,
                       nullptr);
        });
        std::printf("[perf] sample vocab %d rows %d %s: %.1f us (workspace %.1f MiB)\n", vocab, rows,
                    describe(p).c_str(), us, ws_bytes / 1048576.0);
      }
      // Log probabilities of every row (k = 20, OpenAI's most): the passes over the row it costs.
      std::vector<int32_t> all_rows(rows);
      std::iota(all_rows.begin(), all_rows.end(), 0);
      DeviceBuffer<int32_t> d_rows(all_rows), d_tokens(all_rows);
      DeviceBuffer<float> lp_out{size_t(rows) * 42};
      const double lp_us = bench::median_us(20, [&](int) {
        cuda::token_logprobs(logits.get(), vocab, d_rows.get(), rows, d_tokens.get(), 20, lp_out.get(), 42, nullptr);
      });
      std::printf("[perf] token_logprobs vocab %d rows %d k 20: %.1f us\n", vocab, rows, lp_us);
    }
  }
}

}  // namespace
}  // namespace fdpp::test
