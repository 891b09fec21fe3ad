// Sliding windows and soft-capping in the CUDA attention kernels (the masked kernels: kernels.h,
// DecodeAttentionParams::window / softcap, prefill_attention_varlen's window / softcap), against the
// CPU's exact attention (cpu::attention, the CPU engine's arithmetic) on the same 16-bit inputs:
// decode (synchronized, and the unified max with several splits) and prefill (every tile
// configuration, both softmax modes), head dims 64, 128 and 256, windows shorter and longer than
// the rows, caps strong enough to change the result. The blocks wholly before every row's window
// are given back as the engine gives them back (table entries kFreed = -1, their cache NaN): a
// kernel that reads one writes NaN. Plan checks (prefill_plan.h's window) run without a GPU.
#include <algorithm>
#include <cmath>
#include <sstream>
#include <vector>

#include "attention/unified_max.h"
#include "backend/cpu/ops.h"
#include "backend/cuda/decode_plan.h"
#include "backend/cuda/kv_cache_layout.h"
#include "backend/cuda/prefill_plan.h"
#include "gpu_test_util.h"

namespace fdpp::test {
namespace {

namespace pf = cuda::prefill;

// ---- the plan, no GPU needed ---------------------------------------------------------------------

// Every row sees exactly keys max(0, pos - window + 1) .. pos, and nothing below key_begin.
TEST(PrefillPlanWindow, EveryRowSeesExactlyItsWindow) {
  const std::vector<std::pair<int, int>> chunks = {{0, 1}, {0, 200}, {100, 150}, {63, 1}, {999, 70}, {5, 300}};
  for (const pf::TileConfig& cfg : pf::kConfigs)
    for (int window : {1, 7, 16, 64, 100, 5000})
      for (auto [start, n] : chunks) {
        const int bq = pf::config_bq(cfg), bk = cfg.bk;
        const pf::Grid g = pf::plan_grid(1, n, 1, bq);
        for (unsigned y = 0; y < g.y; ++y) {
          pf::TileWork w = pf::tile_work(start, n, static_cast<int>(y), bq, bk);
          if (w.rows == 0) continue;
          pf::apply_window(start, window, bk, w);
          for (int r = 0; r < bq; ++r) {
            const int pos = start + w.q0 + std::min(r, w.rows - 1);
            const int first = std::max(0, pos - window + 1);
            int seen = 0;
            for (int kt = w.first_key_tile; kt < w.n_key_tiles; ++kt)
              for (int key = kt * bk; key < (kt + 1) * bk; ++key) {
                // The kernel masks per row only in tiles past first_masked_tile or below window_mask_end.
                const bool checked = kt >= w.first_masked_tile || kt * bk < w.window_mask_end;
                const bool vis = checked ? (key <= pos && key > pos - window) : true;
                ASSERT_EQ(vis, pf::key_visible(start, w, kt, key, r));
                if (!vis) continue;
                ASSERT_GE(key, w.key_begin) << "a key below key_begin is visible";
                ASSERT_LT(key, w.key_end);
                ASSERT_GE(key, first) << cfg.name << " start " << start << " n " << n << " window " << window;
                ++seen;
              }
            ASSERT_EQ(seen, pos - first + 1) << cfg.name << " start " << start << " n " << n << " window " << window;
          }
        }
      }
}

TEST(PrefillPlanWindow, HeadDim256Configurations) {
  EXPECT_TRUE(pf::config_fits(pf::kConfigs[0], 256)) << "the default must run at head_dim 256";
  for (const pf::TileConfig& c : pf::kConfigs) {
    EXPECT_TRUE(pf::config_fits(c, 64) && pf::config_fits(c, 128)) << c.name;
    if (pf::config_fits(c, 256)) EXPECT_LE(pf::smem_bytes(256, pf::config_bq(c), c.bk, c.stages), 227u * 1024);
  }
}

TEST(DecodePlanWindow, MaskedCallsRunTheTensorCoreLoop) {
  for (int D : {64, 80, 96, 128, 256})
    for (int H : {4, 8, 32}) {
      const auto l = cuda::decode_attention_launch(1, H, H, D, 1, 100, false, 132, true);
      EXPECT_TRUE(l.tensor_cores);
      EXPECT_EQ(l.warps, D > 128 ? 4 : 8);
    }
}

// ---- the kernels ---------------------------------------------------------------------------------

struct Seq {
  int start, n;  // prefill: query rows at positions start .. start + n - 1; decode: n = 1
};

// One case's inputs: per sequence its keys and values [L][KVH * D] (16-bit values as floats), the
// paged cache with the blocks before every row's window given back, and q.
struct Inputs {
  int H, KVH, D, block_size, window, max_blocks = 0, T = 0;
  DType t;
  std::vector<Seq> seqs;
  std::vector<std::vector<float>> k, v;
  std::vector<int32_t> tables, q_begin, starts;
  std::vector<uint16_t> kc, vc, qkv;
  std::vector<float> qkv_f;
  int width() const { return (H + 2 * KVH) * D; }

  Inputs(DType dt, int h, int kvh, int d, int bs, int win, std::vector<Seq> s, float logit_scale)
      : H(h), KVH(kvh), D(d), block_size(bs), window(win), t(dt), seqs(std::move(s)) {
    const int S = static_cast<int>(seqs.size());
    q_begin.assign(S + 1, 0);
    for (int i = 0; i < S; ++i) {
      q_begin[i + 1] = q_begin[i] + seqs[i].n;
      starts.push_back(seqs[i].start);
      max_blocks = std::max(max_blocks, (seqs[i].start + seqs[i].n + bs - 1) / bs);
    }
    T = q_begin[S];
    max_blocks += 1;
    int pool = 2;
    for (const Seq& q : seqs) pool += (q.start + q.n + bs - 1) / bs;
    const auto perm = permutation(pool);
    const cuda::KvCacheLayout layout = cuda::kv_cache_layout(bs, KVH, D);
    kc.assign(size_t(pool) * bs * KVH * D, 0xFFFF);  // NaN wherever nothing is written
    vc.assign(kc.size(), 0xFFFF);
    tables.assign(size_t(S) * max_blocks, -1);
    for (int i = 0, next = 0; i < S; ++i) {
      const int L = seqs[i].start + seqs[i].n;
      std::vector<float> tmp;
      random_bits(size_t(L) * KVH * D, t, tmp);
      k.push_back(tmp);
      random_bits(size_t(L) * KVH * D, t, tmp);
      v.push_back(tmp);
      // The engine gives back every block wholly before the first key any row reads (its first row's
      // window): kFreed in the table, and the block's slots stay NaN.
      const int first_read = window > 0 ? std::max(0, seqs[i].start - window + 1) : 0;
      for (int b = 0; b * bs < L; ++b) {
        const int32_t blk = perm[next++];
        tables[size_t(i) * max_blocks + b] = b < first_read / bs ? -1 : blk;
        if (b < first_read / bs) continue;
        for (int p = b * bs; p < std::min(L, (b + 1) * bs); ++p)
          for (int kh = 0; kh < KVH; ++kh)
            for (int e = 0; e < D; ++e) {
              const int64_t slot = int64_t(blk) * bs + p % bs;
              kc[layout.slot_row(slot, kh) + e] = to_bits(k[i][(size_t(p) * KVH + kh) * D + e], t);
              vc[layout.slot_row(slot, kh) + e] = to_bits(v[i][(size_t(p) * KVH + kh) * D + e], t);
            }
      }
    }
    // q scaled so that the logits are large enough for the cap to matter.
    qkv = random_bits(size_t(T) * width(), t, qkv_f, logit_scale);
  }

  // The CPU engine's attention of sequence i's rows (n_q rows from its query row `first`).
  std::vector<float> reference(int i, float scale, float softcap) const {
    const int n = seqs[i].n;
    std::vector<float> q(size_t(n) * H * D), out(q.size());
    for (int r = 0; r < n; ++r)
      std::copy_n(&qkv_f[size_t(q_begin[i] + r) * width()], H * D, &q[size_t(r) * H * D]);
    cpu::attention(q.data(), k[i].data(), v[i].data(), n, seqs[i].start, H, KVH, D, scale, out.data(), window,
                   softcap);
    return out;
  }
};

std::string describe(const char* kernel, const Inputs& in, float softcap, const char* mode) {
  std::ostringstream s;
  s << kernel << " " << name(in.t) << " D " << in.D << " H " << in.H << " KVH " << in.KVH << " window "
    << in.window << " softcap " << softcap << " " << mode << " seqs";
  for (const Seq& q : in.seqs) s << " " << q.start << "+" << q.n;
  return s.str();
}

void run_prefill(DType t, int D, int H, int KVH, int window, float softcap, std::vector<Seq> seqs) {
  const float scale = 1.f / std::sqrt(float(D));
  Inputs in(t, H, KVH, D, 16, window, std::move(seqs), softcap > 0 ? 3.f : 1.f);
  const int S = static_cast<int>(in.seqs.size());
  int max_n = 1;
  for (const Seq& q : in.seqs) max_n = std::max(max_n, q.n);
  DeviceBuffer<uint16_t> d_qkv(in.qkv), d_k(in.kc), d_v(in.vc), d_out(size_t(in.T) * H * D);
  DeviceBuffer<int32_t> d_tables(in.tables), d_q_begin(in.q_begin), d_starts(in.starts);
  DeviceBuffer<unsigned long long> d_fallback(std::vector<unsigned long long>{0});
  const auto b = derive_unified_max_bounds(0.f, 32768);
  const cuda::UnifiedMaxRange range{b.phi, b.a, b.b};
  for (int config = 0; config < cuda::prefill_attention_configs(); ++config)
    for (bool async : {false, true}) {
      d_out.poison();
      cuda::prefill_attention_varlen(d_qkv.get(), d_k.get(), d_v.get(), d_tables.get(), in.max_blocks,
                                     d_q_begin.get(), d_starts.get(), S, in.T, max_n, H, KVH, D, 16, scale,
                                     async ? &range : nullptr, d_fallback.get(), d_out.get(), t, nullptr, config,
                                     window, softcap);
      sync("prefill_attention_varlen (masked)");
      const auto out = from_bits(d_out.download(), t);
      for (int i = 0; i < S; ++i) {
        const auto ref = in.reference(i, scale, softcap);
        std::vector<float> got(out.begin() + size_t(in.q_begin[i]) * H * D,
                               out.begin() + size_t(in.q_begin[i + 1]) * H * D);
        // (P is rounded to 16 bits before P V: the NMSE bound, as the prefill kernel's own tests.)
        expect_close(got, ref, Tolerance{5e-4, 0, 0},
                     describe("prefill_window", in, softcap, async ? "async" : "sync") + " " +
                         cuda::prefill_attention_config_name(config) + " seq " + std::to_string(i));
      }
    }
}

void run_decode(DType t, int D, int H, int KVH, int window, float softcap, const std::vector<int>& lens, bool async,
                int splits, float phi = 0.f) {
  const float scale = 1.f / std::sqrt(float(D));
  std::vector<Seq> seqs;
  for (int L : lens) seqs.push_back({L - 1, 1});
  Inputs in(t, H, KVH, D, 16, window, seqs, softcap > 0 ? 3.f : 1.f);
  const int B = static_cast<int>(lens.size());
  int max_len = 0;
  for (int L : lens) max_len = std::max(max_len, L);
  DeviceBuffer<uint16_t> d_qkv(in.qkv), d_k(in.kc), d_v(in.vc), d_out(size_t(B) * H * D);
  DeviceBuffer<int32_t> d_tables(in.tables), d_lens(lens);
  d_out.poison();
  if (!async) {
    const size_t ws_bytes = cuda::decode_attention_workspace_bytes(B, H, D, splits);
    DeviceBuffer<uint8_t> ws(std::vector<uint8_t>(std::max<size_t>(ws_bytes, 1), 0xFF));
    cuda::decode_attention({.qkv = d_qkv.get(), .k_cache = d_k.get(), .v_cache = d_v.get(),
                            .block_tables = d_tables.get(), .max_blocks_per_seq = in.max_blocks,
                            .context_lens = d_lens.get(), .out = d_out.get(), .batch = B, .n_heads = H,
                            .n_kv_heads = KVH, .head_dim = D, .block_size = 16, .scale = scale, .dtype = t,
                            .splits = splits, .max_context_len = max_len,
                            .workspace = splits > 1 ? ws.get() : nullptr, .workspace_bytes = ws_bytes,
                            .window = window, .softcap = softcap},
                           nullptr);
    sync("decode_attention (masked)");
  } else {
    const size_t ws_bytes = cuda::decode_attention_async_workspace_bytes(B, H, KVH, D, splits);
    DeviceBuffer<uint8_t> ws(std::vector<uint8_t>(ws_bytes, 0xFF));
    const int n_counters = cuda::decode_attention_async_counters(B, H, KVH);
    DeviceBuffer<int32_t> counters(std::vector<int32_t>(n_counters, 0));
    DeviceBuffer<unsigned long long> fallback(std::vector<unsigned long long>{0});
    const auto bounds = derive_unified_max_bounds(phi, 32768);
    cuda::decode_attention_async(
        {.qkv = d_qkv.get(), .k_cache = d_k.get(), .v_cache = d_v.get(), .block_tables = d_tables.get(),
         .max_blocks_per_seq = in.max_blocks, .context_lens = d_lens.get(), .out = d_out.get(), .batch = B,
         .n_heads = H, .n_kv_heads = KVH, .head_dim = D, .block_size = 16, .scale = scale, .dtype = t,
         .splits = splits, .max_context_len = max_len, .workspace = ws.get(), .workspace_bytes = ws_bytes,
         .range = {bounds.phi, bounds.a, bounds.b}, .counters = counters.get(), .counter_ints = n_counters,
         .fallback_rows = fallback.get(), .window = window, .softcap = softcap},
        nullptr);
    sync("decode_attention_async (masked)");
    const auto left = counters.download();
    EXPECT_TRUE(std::all_of(left.begin(), left.end(), [](int32_t x) { return x == 0; }))
        << "decode_attention_async (masked) left its semaphores non-zero";
  }
  const auto out = from_bits(d_out.download(), t);
  std::ostringstream mode;
  mode << (async ? "async" : "sync") << " splits " << splits << " phi " << phi;
  for (int i = 0; i < B; ++i) {
    const auto ref = in.reference(i, scale, softcap);
    std::vector<float> got(out.begin() + size_t(i) * H * D, out.begin() + size_t(i + 1) * H * D);
    Tolerance tol = rounding_tolerance(t);
    tol.atol = 16 * unit_roundoff(t);  // the tensor-core loop's 16-bit P (as the decode kernel's own tests)
    expect_close(got, ref, tol, describe("decode_window", in, softcap, mode.str().c_str()) + " seq " + std::to_string(i));
  }
}

constexpr DType kTypes[] = {DType::F16, DType::BF16};

// Windows shorter than the chunks (rows whose window starts mid-tile and mid-block, tiles wholly
// hidden from some rows of a query tile), longer than them, and a window of one key.
TEST_F(CudaKernels, PrefillSlidingWindow) {
  const std::vector<Seq> seqs = {{0, 200}, {37, 100}, {500, 70}, {3, 1}, {129, 65}};
  for (DType t : kTypes)
    for (int D : {64, 96, 128, 256})
      for (int window : {1, 16, 45, 100, 4096}) run_prefill(t, D, 8, 2, window, 0.f, seqs);
}

// Soft-capping strong enough to matter (q scaled x3: logits of several caps), alone and with a
// window, MHA and GQA.
TEST_F(CudaKernels, PrefillSoftCap) {
  const std::vector<Seq> seqs = {{0, 150}, {60, 90}};
  for (DType t : kTypes)
    for (int D : {64, 128, 256}) {
      run_prefill(t, D, 4, 4, 0, 2.f, seqs);
      run_prefill(t, D, 8, 2, 33, 5.f, seqs);
    }
}

TEST_F(CudaKernels, DecodeSlidingWindowAndSoftCap) {
  const std::vector<int> lens = {1, 17, 100, 333, 1000, 2049};
  for (DType t : kTypes)
    for (int D : {64, 96, 128, 256})
      for (auto [window, cap] : {std::pair{0, 3.f}, std::pair{1, 0.f}, std::pair{40, 0.f}, std::pair{500, 2.f},
                                 std::pair{5000, 0.f}}) {
        // Every head dim with GQA, one split and several, both softmax modes; MHA and one KV head
        // at 128 (the grid of all of them took 75 s of the GPU suite's time on an H100).
        run_decode(t, D, 8, 2, window, cap, lens, false, 1);
        run_decode(t, D, 8, 2, window, cap, lens, false, 3);
        run_decode(t, D, 8, 2, window, cap, lens, true, 2);
        if (D != 128) continue;
        for (auto [H, KVH] : {std::pair{8, 8}, std::pair{16, 1}}) {
          run_decode(t, D, H, KVH, window, cap, lens, false, 3);
          run_decode(t, D, H, KVH, window, cap, lens, true, 4);
        }
      }
}

// phi far above every capped logit: every row of the unified max falls back to the exact
// recomputation (the in-kernel one with few splits, the combine launch's with many), which must
// honour the window and the cap too.
TEST_F(CudaKernels, DecodeMaskedFallbackIsExact) {
  const std::vector<int> lens = {50, 700, 3000};
  for (DType t : kTypes)
    for (int D : {128, 256})
      for (int splits : {2, 8}) run_decode(t, D, 8, 2, 300, 4.f, lens, true, splits, 400.f);
}

}  // namespace
}  // namespace fdpp::test
