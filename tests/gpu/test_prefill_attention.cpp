// Tensor-core prefill attention (prefill_attention.cu): the tile plan checked on the CPU (every
// query row owned once, every row sees exactly keys 0 .. its position), then the kernel against the
// CPU's stable softmax (NMSE <= 5e-4, outputs poisoned first, NaN never passes) over variable-length
// batches of chunks with start offsets anywhere, GQA groups 1..16, head_dim 64, 96 and 128, block
// sizes 8 to 256 (either cache layout), lengths 1..32K, in the synchronized and the unified-max mode, every tile
// configuration (prefill_plan.h kConfigs) on the same inputs; adversarial rows
// (logits far above or below phi) must come out exact and be counted exactly as the CPU counts
// rows outside the range. The same runs over an e4m3 (fp8) cache with k_scale, v_scale != 1 against
// the CPU given exactly the cache's values (e4m3 * scale), head dims 64, 128 and 256, windows and
// soft-capping included.
#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <set>
#include <sstream>
#include <vector>

#include "attention/unified_max.h"
#include "backend/cpu/unified_max_reference.h"
#include "backend/cpu/ops.h"
#include "backend/cuda/kv_cache_layout.h"
#include "backend/cuda/prefill_plan.h"
#include "core/fp8_e4m3.h"
#include "gpu_test_util.h"

namespace fdpp::test {
namespace {

namespace pf = cuda::prefill;

// ---- the plan, no GPU needed ------------------------------------------------------------------

TEST(PrefillPlan, EveryRowOnceAndExactlyItsCausalKeys) {
  const std::vector<std::pair<int, int>> chunks = {{0, 1},   {0, 64},   {0, 65},  {100, 150}, {63, 1},   {64, 64},
                                                   {1, 127}, {999, 3},  {5, 200}, {0, 1000},  {4095, 2}, {7, 129}};
  for (const pf::TileConfig& cfg : pf::kConfigs)
    for (auto [start, n] : chunks) {
      const int kBQ = pf::config_bq(cfg), kBK = cfg.bk;
      const pf::Grid g = pf::plan_grid(1, n + 37, 1, kBQ);  // a grid sized for a longer chunk: extra y exit
      std::vector<int> owner(n, 0);
      for (unsigned y = 0; y < g.y; ++y) {
        const pf::TileWork w = pf::tile_work(start, n, static_cast<int>(y), kBQ, kBK);
        if (w.rows == 0) continue;
        ASSERT_GE(w.q0, 0);
        ASSERT_LE(w.q0 + w.rows, n);
        ASSERT_LE(w.rows, kBQ);
        ASSERT_EQ(w.q0 % kBQ, 0);
        ASSERT_EQ(w.n_key_tiles, (w.key_end + kBK - 1) / kBK);
        for (int r = 0; r < w.rows; ++r) ++owner[w.q0 + r];
        // Walk the keys as the kernel does: keys >= key_end are zero-filled AND must be masked.
        for (int r = 0; r < kBQ; ++r) {
          const int pos = start + w.q0 + std::min(r, w.rows - 1);
          int seen = 0, last = -1;
          for (int kt = 0; kt < w.n_key_tiles; ++kt)
            for (int key = kt * kBK; key < (kt + 1) * kBK; ++key) {
              const bool vis = pf::key_visible(start, w, kt, key, r);
              if (vis) {
                ASSERT_LT(key, w.key_end) << "a zero-filled key is visible: start " << start << " n " << n;
                ++seen;
                last = key;
              }
            }
          ASSERT_EQ(seen, pos + 1) << "start " << start << " n " << n << " y " << y << " r " << r;
          ASSERT_EQ(last, pos);
        }
        // Tiles below first_masked_tile are fully visible to row 0, the row that sees the least.
        if (w.first_masked_tile > 0) ASSERT_LE(w.first_masked_tile * kBK - 1, start + w.q0);
      }
      for (int i = 0; i < n; ++i)
        ASSERT_EQ(owner[i], 1) << cfg.name << " start " << start << " n " << n << " row " << i;
      // Heaviest first: y = 0 is the tile with the most key tiles.
      if (n > 0) {
        const int top = pf::tile_work(start, n, 0, kBQ, kBK).n_key_tiles;
        for (unsigned y = 1; y < g.y; ++y) {
          const auto w = pf::tile_work(start, n, static_cast<int>(y), kBQ, kBK);
          if (w.rows > 0) ASSERT_LE(w.n_key_tiles, top);
        }
      }
    }
}

// The wgmma walks compute each warpgroup's key tiles as one range (warpgroup_tile_range): it holds
// exactly the tiles of the per-tile rule the walks used before (some rows in the chunk, the tile at
// or below the last row's causal limit, above the first row's window start), and every key any of
// the warpgroup's rows sees.
TEST(PrefillPlan, WarpgroupTileRangeHoldsEveryKeyItsRowsSee) {
  constexpr int kBQ = 128, kBK = 128;
  const std::vector<std::pair<int, int>> chunks = {{0, 1},   {0, 64},   {0, 65},     {0, 128},  {0, 129}, {100, 150},
                                                   {127, 1}, {128, 64}, {1, 255},    {999, 3},  {5, 700}, {4095, 300},
                                                   {0, 2000}, {63, 64}, {8191, 129}, {300, 1}};
  int checked = 0;
  for (const int window : {0, 1, 63, 64, 100, 128, 129, 500, 4096})
    for (const bool masked : {false, true}) {
      if (window > 0 && !masked) continue;  // a window is always a masked walk
      for (auto [start, n] : chunks)
        for (int y = 0; y < (n + kBQ - 1) / kBQ; ++y) {
          pf::TileWork w = pf::tile_work(start, n, y, kBQ, kBK);
          pf::apply_window(start, window, kBK, w);
          const int kt0 = masked ? w.first_key_tile : 0;
          const int tiles = w.n_key_tiles - kt0;
          for (const int wg0 : {0, 64}) {
            int a = -1, b = -1;
            pf::warpgroup_tile_range(start, w, wg0, kBK, kt0, tiles, masked, a, b);
            ASSERT_TRUE(a >= 0 && a <= b && b <= tiles) << a << " " << b << " of " << tiles;
            const int lim = pf::row_key_limit(start, w, wg0 + 63);
            const int first = w.window > 0 ? pf::row_key_limit(start, w, wg0) - w.window + 1 : 0;
            for (int i = 0; i < tiles; ++i) {
              const int kt = kt0 + i;
              const bool rule = wg0 < w.rows && kt * kBK <= lim && !(masked && kt * kBK + kBK <= first);
              ASSERT_EQ(i >= a && i < b, rule) << "start " << start << " n " << n << " y " << y << " window "
                                               << window << " rows " << wg0 << " tile " << kt;
            }
            for (int r = wg0; r < std::min(wg0 + 64, w.rows); ++r)
              for (int kt = kt0; kt < w.n_key_tiles; ++kt)
                for (int key = kt * kBK; key < (kt + 1) * kBK; ++key)
                  if (key < w.key_end && (w.window == 0 || key >= w.key_begin) && pf::key_visible(start, w, kt, key, r))
                    ASSERT_TRUE(kt - kt0 >= a && kt - kt0 < b)
                        << "row " << r << " sees key " << key << " of an uncomputed tile: start " << start << " n " << n
                        << " y " << y << " window " << window;
            ++checked;
          }
        }
    }
  EXPECT_GT(checked, 500);
}

TEST(PrefillPlan, ConfigurationsByNameAndIndex) {
  ASSERT_EQ(cuda::prefill_attention_configs(), pf::kNumConfigs);
  ASSERT_GE(pf::kNumConfigs, 1);
  EXPECT_STREQ(cuda::prefill_attention_config_name(0), "m64n64");  // the default stays the first kernel
  for (int i = 0; i < pf::kNumConfigs; ++i) {
    EXPECT_EQ(cuda::prefill_attention_config_index(cuda::prefill_attention_config_name(i)), i);
    const auto& c = pf::kConfigs[i];
    // (+ 1 KB: the wgmma kernels align their swizzled tiles.)
    EXPECT_LE(pf::config_smem_bytes(c, 128) + (c.wgmma ? 1024 : 0), size_t(227) * 1024) << c.name;
    EXPECT_EQ(pf::config_smem_bytes(c, 128) - pf::smem_bytes(128, pf::config_bq(c), c.bk, c.stages),
              size_t(pf::config_v_stages(c) - c.stages) * c.bk * 128 * 2)
        << c.name;
  }
  EXPECT_EQ(cuda::prefill_attention_config_index("nope"), -1);
  EXPECT_EQ(cuda::prefill_attention_config_name(pf::kNumConfigs), nullptr);
}

// An e4m3 cache halves the K/V buffers (Q stays 16-bit); the 16-bit cache's choices are unchanged.
TEST(PrefillPlan, Fp8CacheSharedMemory) {
  for (const pf::TileConfig& c : pf::kConfigs)
    for (int D : {64, 128, 256}) {
      const int bq = pf::config_bq(c);
      EXPECT_EQ(pf::smem_bytes(D, bq, c.bk, c.stages, 1), size_t(bq + c.stages * c.bk) * D * 2) << c.name;
      EXPECT_EQ(pf::config_fits(c, D), pf::config_fits(c, D, 2)) << c.name;
      // (The wgmma kernel reads 16-bit caches only: an e4m3 cache takes the default there.)
      if (pf::config_fits(c, D) && !c.wgmma) EXPECT_TRUE(pf::config_fits(c, D, 1)) << c.name << " D " << D;
      if (pf::config_fits(c, D, 1))
        EXPECT_LE(pf::smem_bytes(D, bq, c.bk, c.stages, 1), size_t(227) * 1024) << c.name << " D " << D;
    }
  // The wgmma configuration: head dims 64 and 128 with a 16-bit cache only.
  for (const pf::TileConfig& c : pf::kConfigs) {
    if (!c.wgmma) continue;
    EXPECT_TRUE(pf::config_fits(c, 64) && pf::config_fits(c, 128)) << c.name;
    EXPECT_FALSE(pf::config_fits(c, 96) || pf::config_fits(c, 256) || pf::config_fits(c, 128, 1)) << c.name;
  }
  // m128n64w8s3 (256 KB of 16-bit Q/K/V at head_dim 256) fits with e4m3 K/V (160 KB).
  const int s3 = cuda::prefill_attention_config_index("m128n64w8s3");
  if (s3 >= 0) {
    EXPECT_FALSE(pf::config_fits(pf::kConfigs[s3], 256));
    EXPECT_TRUE(pf::config_fits(pf::kConfigs[s3], 256, 1));
  }
}

TEST(PrefillPlan, WarpSpecializedProducerOwnsNoRows) {
  // A warp-specialized configuration adds a producer warpgroup that owns no rows: its query rows
  // per CTA are its compute warps' (wg128n128ws: 8 x 16 = 128 rows, 256 + 128 = 384 threads).
  for (const pf::TileConfig& c : pf::kConfigs) {
    EXPECT_TRUE(!c.ws || c.wgmma) << c.name;
    EXPECT_EQ(pf::config_bq(c), 16 * c.warps * c.m_tiles) << c.name;
    EXPECT_EQ(pf::config_threads(c), 32 * c.warps + (c.ws ? pf::kProducerThreads : 0)) << c.name;
  }
  const int ws = cuda::prefill_attention_config_index("wg128n128ws");
  if (ws >= 0) {
    EXPECT_EQ(pf::config_bq(pf::kConfigs[ws]), 128);
    EXPECT_EQ(pf::config_threads(pf::kConfigs[ws]), 384);
  }
}

// A TMA configuration reads KV pages as boxes of whole 8-row swizzle atoms: blocks of 8 keys or
// more, in either layout; over smaller blocks the launcher runs its cp.async twin (same tiles).
TEST(PrefillPlan, TmaConfigurationsTakeTheirTwinOverSmallBlocks) {
  for (int i = 0; i < pf::kNumConfigs; ++i) {
    const pf::TileConfig& c = pf::kConfigs[i];
    EXPECT_TRUE(!c.tma || c.ws) << c.name;
    const int twin = pf::config_cache_fallback(i);
    ASSERT_TRUE(twin >= 0 && twin < pf::kNumConfigs) << c.name;
    if (!c.tma) {
      EXPECT_EQ(twin, i) << c.name;
      for (int bs : {1, 2, 8, 16, 1024}) EXPECT_TRUE(pf::config_fits_cache(c, bs)) << c.name << " block " << bs;
      continue;
    }
    const pf::TileConfig& t = pf::kConfigs[twin];
    EXPECT_FALSE(t.tma) << c.name;
    EXPECT_TRUE(t.ws == c.ws && t.wgmma == c.wgmma && t.warps == c.warps && t.m_tiles == c.m_tiles && t.bk == c.bk &&
                t.stages == c.stages)
        << c.name << " -> " << t.name;
    for (int bs : {1, 2, 4}) EXPECT_FALSE(pf::config_fits_cache(c, bs)) << c.name << " block " << bs;
    for (int bs : {8, 16, 32, 64, 128, 256, 1 << 20})
      EXPECT_TRUE(pf::config_fits_cache(c, bs)) << c.name << " block " << bs;
  }
  const int wst = cuda::prefill_attention_config_index("wg128n128wst");
  if (wst >= 0) EXPECT_STREQ(pf::kConfigs[pf::config_cache_fallback(wst)].name, "wg128n128ws");
}

TEST(PrefillPlan, EffectiveRangeOfSixteenBitP) {
  const auto b = derive_unified_max_bounds(0.f, 131072);
  const cuda::UnifiedMaxRange r{1.5f, b.a, b.b};
  const auto f16 = cuda::prefill_attention_effective_range(r, DType::F16);
  const auto bf16 = cuda::prefill_attention_effective_range(r, DType::BF16);
  EXPECT_EQ(f16.phi, 1.5f);
  EXPECT_FLOAT_EQ(f16.a, -3 * std::log(2.f));
  EXPECT_EQ(f16.b, 11.f);
  EXPECT_LT(std::exp(double(f16.b)), 65504.0);  // fp16 P never overflows
  EXPECT_EQ(bf16.a, b.a);
  EXPECT_EQ(bf16.b, b.b);
}

// ---- the kernel ---------------------------------------------------------------------------------

struct Chunk {
  int start, n;
};

// Adversarial: rows far above or below any fixed phi. Rising: logits that climb by about 45 nats
// (D = 128) from the first key to the last, so that rows pass their reference several times.
enum class Rows { Normal, Adversarial, Rising };

struct VarlenCase {
  DType t;
  int D, H, KVH, block_size;
  std::vector<Chunk> chunks;
  Rows rows = Rows::Normal;
  float phi = -1.f;         // unified max of the async run (logits of random data are ~N(0, 1))
  int check_rows = 1 << 30;  // per chunk; more rows than this: a sample (first, last, random)
  bool wrapper = false;      // through prefill_attention (one chunk, host start)
  // An e4m3 cache (KvDType::Fp8E4M3) of the values x / scale; the reference reads e4m3 * scale.
  bool fp8 = false;
  float k_scale = 1.f, v_scale = 1.f;
  // The masked kernels: a sliding window, soft-capped logits (q scaled by q_scale so the cap bites).
  int window = 0;
  float softcap = 0.f, q_scale = 1.f;
  int nan_row = -1;  // a query row (every head) of NaN: its CTAs fall back, its output is NaN
};

// An e4m3 case of `c`, with scales that show a mis-folded k_scale or a missing v_scale.
VarlenCase fp8_case(VarlenCase c, float k_scale = 0.03f, float v_scale = 2.f) {
  c.fp8 = true;
  c.k_scale = k_scale;
  c.v_scale = v_scale;
  return c;
}

// The CPU engine's attention of one query row over keys 0 .. len - 1 ([len][D]) with a sliding
// window and soft-capping (cpu::attention's definition); returns the row's max visible logit.
float masked_attention_row(const float* q, const float* k, const float* v, int len, int D, float scale, int window,
                           float softcap, float* out) {
  const int first = window > 0 ? std::max(0, len - window) : 0;
  std::vector<float> s(len);
  float mx = -INFINITY;
  for (int j = first; j < len; ++j) {
    float x = cpu::attention_dot(q, k + size_t(j) * D, D) * scale;
    if (softcap > 0.f) x = softcap * std::tanh(x / softcap);
    s[j] = x;
    mx = std::max(mx, x);
  }
  std::vector<double> acc(D, 0.0);
  double sum = 0;
  for (int j = first; j < len; ++j) {
    const double p = std::exp(double(s[j]) - mx);
    sum += p;
    for (int d = 0; d < D; ++d) acc[d] += p * v[size_t(j) * D + d];
  }
  for (int d = 0; d < D; ++d) out[d] = static_cast<float>(acc[d] / sum);
  return mx;
}

// The max logit of the first key tile (bk keys, tiles from key 0) that row (keys 0 .. len - 1, a
// window of `window` keys) sees: the async softmax takes that tile against phi.
float first_tile_max(const float* q, const float* k, int len, int D, float scale, int window, float softcap, int bk) {
  const int first = window > 0 ? std::max(0, len - window) : 0;
  const int end = std::min(len - 1, (first / bk + 1) * bk - 1);
  float mx = -INFINITY;
  for (int j = first; j <= end; ++j) {
    float x = cpu::attention_dot(q, k + size_t(j) * D, D) * scale;
    if (softcap > 0.f) x = softcap * std::tanh(x / softcap);
    mx = std::max(mx, x);
  }
  return mx;
}

void run_varlen(const VarlenCase& c) {
  const int D = c.D, H = c.H, KVH = c.KVH, G = H / KVH, C = static_cast<int>(c.chunks.size());
  const int width = (H + 2 * KVH) * D;
  const float scale = 1.f / std::sqrt(float(D));
  std::vector<int32_t> q_begin(C + 1, 0), starts(C);
  int max_n = 1;
  for (int i = 0; i < C; ++i) {
    q_begin[i + 1] = q_begin[i] + c.chunks[i].n;
    starts[i] = c.chunks[i].start;
    max_n = std::max(max_n, c.chunks[i].n);
  }
  const int T = q_begin[C];

  // Keys and values per chunk on the host as [kvh][pos][D] (contiguous rows for the reference).
  // Adversarial rows: K gets +2 on every element, so a query of all +4 (all -4) has logits near
  // +4 * 2 * D * scale = +90 (-90) for D = 128 (+-64 for D = 64): far above or below any range.
  // An e4m3 cache holds e = e4m3(x / scale) of the 16-bit x (cache byte per element, same layout):
  // kf / vf become e * scale, exactly what the kernel reads.
  std::vector<std::vector<float>> kf(C), vf(C);
  std::vector<std::vector<uint8_t>> ke(C), ve(C);
  for (int i = 0; i < C; ++i) {
    const int L = c.chunks[i].start + c.chunks[i].n;
    std::vector<float> tmp;
    auto kb = random_bits(size_t(KVH) * L * D, c.t, tmp);
    if (c.rows == Rows::Adversarial)
      for (auto& x : tmp) x += 2.f;
    if (c.rows == Rows::Rising)
      for (size_t j = 0; j < tmp.size(); ++j) tmp[j] += 4.f * float(j / D % L) / float(L);  // [kvh][pos][D]
    kf[i] = from_bits(to_bits(tmp, c.t), c.t);
    random_bits(size_t(KVH) * L * D, c.t, vf[i]);
    if (c.fp8) {
      auto quantize = [](std::vector<float>& x, std::vector<uint8_t>& e, float scale) {
        e.resize(x.size());
        for (size_t j = 0; j < x.size(); ++j) {
          e[j] = fp8_e4m3_from_float(x[j] / scale);
          x[j] = fp8_e4m3_to_float(e[j]) * scale;
        }
      };
      quantize(kf[i], ke[i], c.k_scale);
      quantize(vf[i], ve[i], c.v_scale);
    }
  }
  std::vector<float> qkv_f;
  auto qkv = random_bits(size_t(T) * width, c.t, qkv_f, c.q_scale);
  if (c.rows == Rows::Adversarial) {
    // About a quarter of the (row, head) pairs: 1 in 8 high, 1 in 8 low.
    for (int r = 0; r < T; ++r)
      for (int h = 0; h < H; ++h) {
        const int kind = uniform_int(0, 7);
        if (kind > 1) continue;
        for (int d = 0; d < D; ++d) {
          const size_t at = size_t(r) * width + size_t(h) * D + d;
          qkv[at] = to_bits(kind == 0 ? 4.f : -4.f, c.t);
          qkv_f[at] = from_bits(qkv[at], c.t);
        }
      }
  }
  if (c.rows == Rows::Rising)
    for (int r = 0; r < T; ++r)
      for (int at = r * width; at < r * width + H * D; ++at) {
        qkv[at] = to_bits(qkv_f[at] + 1.f, c.t);
        qkv_f[at] = from_bits(qkv[at], c.t);
      }
  if (c.nan_row >= 0)
    for (int at = c.nan_row * width; at < c.nan_row * width + H * D; ++at) {
      qkv[at] = to_bits(NAN, c.t);
      qkv_f[at] = NAN;
    }

  // Paged cache in the engine's layout (kv_cache_layout.h): blocks handed out in random order from a
  // pool with spare blocks; every slot the kernel must not read holds NaN (0xFFFF; e4m3 0xFF), every
  // unused table entry -1. With a window the blocks wholly before the chunk's first row's window are
  // given back, as the engine does (-1 in the table, NaN slots).
  const cuda::KvCacheLayout layout = cuda::kv_cache_layout(c.block_size, KVH, D);
  int max_blocks = 1, used_blocks = 0;
  for (const auto& ch : c.chunks) {
    const int nb = (ch.start + ch.n + c.block_size - 1) / c.block_size;
    max_blocks = std::max(max_blocks, nb);
    used_blocks += nb;
  }
  max_blocks += 1;  // a table row longer than any chunk needs
  const int pool = used_blocks + 3;
  const auto perm = permutation(pool);
  std::vector<int32_t> tables(size_t(C) * max_blocks, -1);
  const size_t slot_elems = size_t(KVH) * D;
  const size_t cache_elems = size_t(pool) * c.block_size * slot_elems;
  std::vector<uint16_t> kc(c.fp8 ? 0 : cache_elems, 0xFFFF), vc(kc.size(), 0xFFFF);
  std::vector<uint8_t> kc8(c.fp8 ? cache_elems : 0, 0xFF), vc8(kc8.size(), 0xFF);
  for (int i = 0, next = 0; i < C; ++i) {
    const int L = c.chunks[i].start + c.chunks[i].n;
    const int first_block = c.window > 0 ? std::max(0, c.chunks[i].start - c.window + 1) / c.block_size : 0;
    for (int b = 0; b * c.block_size < L; ++b) {
      const int32_t blk = perm[next++];
      tables[size_t(i) * max_blocks + b] = b < first_block ? -1 : blk;
    }
    for (int p = first_block * c.block_size; p < L; ++p) {
      const int64_t slot = int64_t(tables[size_t(i) * max_blocks + p / c.block_size]) * c.block_size + p % c.block_size;
      for (int kh = 0; kh < KVH; ++kh)
        for (int d = 0; d < D; ++d) {
          const size_t at = layout.slot_row(slot, kh) + d, src = (size_t(kh) * L + p) * D + d;
          if (c.fp8) {
            kc8[at] = ke[i][src];
            vc8[at] = ve[i][src];
          } else {
            kc[at] = to_bits(kf[i][src], c.t);
            vc[at] = to_bits(vf[i][src], c.t);
          }
        }
    }
  }
  cuda::KvQuant kv_quant;
  if (c.fp8) kv_quant = {cuda::KvDType::Fp8E4M3, c.k_scale, c.v_scale};

  DeviceBuffer<uint16_t> d_qkv(qkv), d_k(kc), d_v(vc), d_out(size_t(T) * H * D);
  DeviceBuffer<uint8_t> d_k8(kc8), d_v8(vc8);
  const void* k_cache = c.fp8 ? static_cast<const void*>(d_k8.get()) : d_k.get();
  const void* v_cache = c.fp8 ? static_cast<const void*>(d_v8.get()) : d_v.get();
  DeviceBuffer<int32_t> d_tables(tables), d_q_begin(q_begin), d_starts(starts);
  DeviceBuffer<unsigned long long> d_fallback(1);
  const auto b = derive_unified_max_bounds(c.phi, 32768);
  const cuda::UnifiedMaxRange range{b.phi, b.a, b.b};

  std::ostringstream what0;
  what0 << "prefill_varlen " << name(c.t) << " D " << D << " H " << H << " KVH " << KVH << " block " << c.block_size
        << (c.rows == Rows::Adversarial ? " adversarial" : c.rows == Rows::Rising ? " rising" : "")
        << (c.nan_row >= 0 ? " NaN row" : "") << (c.wrapper ? " (one-chunk API)" : "");
  if (c.fp8) what0 << " fp8 cache k_scale " << c.k_scale << " v_scale " << c.v_scale;
  if (c.window > 0 || c.softcap > 0.f) what0 << " window " << c.window << " softcap " << c.softcap;
  what0 << " chunks";
  for (const auto& ch : c.chunks) what0 << " " << ch.start << "+" << ch.n;

  // Rows to check (the NaN row aside), and the reference: the stable softmax; for the fallback
  // count, each row's first tile max per tile width.
  std::vector<std::pair<int, int>> checked;  // (chunk, row in chunk)
  bool all_rows = true;
  for (int i = 0; i < C; ++i) {
    const int n = c.chunks[i].n;
    if (n <= c.check_rows) {
      for (int r = 0; r < n; ++r)
        if (q_begin[i] + r != c.nan_row) checked.push_back({i, r});
      continue;
    }
    all_rows = false;
    std::set<int> pick;
    for (int r = 0; r < 4; ++r) pick.insert({r, n - 1 - r});
    while (static_cast<int>(pick.size()) < c.check_rows) pick.insert(uniform_int(0, n - 1));
    for (int r : pick)
      if (q_begin[i] + r != c.nan_row) checked.push_back({i, r});
  }
  std::vector<float> ref(checked.size() * H * D);
  // Async rows that fall back: a first tile's max outside phi's fp32 range [a, b] (the ends within
  // fp32 rounding of the GPU's logits may go either way), per configuration's tile width.
  std::map<int, std::pair<long long, long long>> expect_fallback;  // bk -> (rows, ambiguous)
  for (const auto& cfg : cuda::prefill::kConfigs) expect_fallback[cfg.bk] = {0, 0};
  for (size_t k = 0; k < checked.size(); ++k) {
    const auto [i, r] = checked[k];
    const int L = c.chunks[i].start + c.chunks[i].n, len = c.chunks[i].start + r + 1;
    for (int h = 0; h < H; ++h) {
      const float* q = &qkv_f[size_t(q_begin[i] + r) * width + size_t(h) * D];
      const float* kk = &kf[i][size_t(h / G) * L * D];
      const float* vv = &vf[i][size_t(h / G) * L * D];
      if (c.window > 0 || c.softcap > 0.f) {
        masked_attention_row(q, kk, vv, len, D, scale, c.window, c.softcap, &ref[(k * H + h) * D]);
      } else {
        stable_attention_row(q, kk, vv, len, D, D, scale, &ref[(k * H + h) * D]);
      }
      if (!all_rows) continue;
      for (auto& [bk, e] : expect_fallback) {
        const float rel = first_tile_max(q, kk, len, D, scale, c.window, c.softcap, bk) - range.phi;
        if (!(rel >= range.a && rel <= range.b)) ++e.first;
        if (std::fabs(rel - range.a) < 1e-3f || std::fabs(rel - range.b) < 1e-3f) ++e.second;
      }
    }
  }

  for (int config = 0; config < cuda::prefill_attention_configs(); ++config)
    for (bool async : {false, true}) {
      d_out.poison();
      cuda_ok(cudaMemset(d_fallback.get(), 0, sizeof(unsigned long long)), "cudaMemset");
      const cuda::UnifiedMaxRange* um = async ? &range : nullptr;
      if (c.wrapper) {
        cuda::prefill_attention(d_qkv.get(), k_cache, v_cache, d_tables.get(), c.chunks[0].start, c.chunks[0].n, H, KVH,
                                D, c.block_size, scale, d_out.get(), c.t, nullptr, um, d_fallback.get(), config,
                                c.window, c.softcap, kv_quant);
      } else {
        cuda::prefill_attention_varlen(d_qkv.get(), k_cache, v_cache, d_tables.get(), max_blocks, d_q_begin.get(),
                                       d_starts.get(), C, T, max_n, H, KVH, D, c.block_size, scale, um,
                                       d_fallback.get(), d_out.get(), c.t, nullptr, config, c.window, c.softcap,
                                       kv_quant);
      }
      sync("prefill_attention_varlen");
      const auto out = from_bits(d_out.download(), c.t);
      std::vector<float> got(ref.size());
      for (size_t k = 0; k < checked.size(); ++k) {
        const auto [i, r] = checked[k];
        std::copy_n(&out[size_t(q_begin[i] + r) * H * D], H * D, &got[k * H * D]);
      }
      const std::string what =
          what0.str() + (async ? " async " : " sync ") + cuda::prefill_attention_config_name(config);
      expect_close(got, ref, Tolerance{5e-4, 0, 0}, what);
      // Every row of every chunk written (no poison left), checked or not; the NaN row is NaN.
      size_t nan = 0;
      for (float x : out) nan += !std::isfinite(x);
      EXPECT_EQ(nan, c.nan_row >= 0 ? size_t(H) * D : 0u) << what << ": unwritten or non-finite outputs";
      // Sync never falls back. Async: the rows whose first tile leaves phi's range, however far
      // their later logits wander (each row's reference follows its maxima), and a NaN row once
      // per head.
      const long long fb = static_cast<long long>(d_fallback.download()[0]);
      if (!async) {
        EXPECT_EQ(fb, 0) << what << ": the synchronized mode counted fallbacks";
      } else if (all_rows) {
        const auto [rows, ambiguous] = expect_fallback[cuda::prefill::kConfigs[config].bk];
        const long long nan_rows = c.nan_row >= 0 ? H : 0;
        EXPECT_GE(fb, rows + nan_rows - ambiguous) << what;
        EXPECT_LE(fb, rows + nan_rows + ambiguous) << what;
        if (c.rows == Rows::Adversarial) EXPECT_GT(fb, 0) << what << ": adversarial rows did not fall back";
        if (c.rows == Rows::Rising) EXPECT_EQ(rows, 0) << what << ": rising rows start in range";
      }
    }
}

constexpr DType kTypes[] = {DType::F16, DType::BF16};

// Several chunks of different lengths in one launch, start offsets on no tile boundary; every
// group size 1..16, head dims 64, 96 and 128, block sizes 16 and 32.
TEST_F(CudaKernels, PrefillVarlenChunksEveryGroup) {
  const std::vector<Chunk> chunks = {{0, 1}, {37, 100}, {500, 333}, {1, 64}, {63, 65}, {0, 200}, {129, 2}};
  int k = 0;
  for (DType t : kTypes)
    for (int D : {64, 96, 128})
      for (int G : {1, 2, 4, 8, 16}) {
        const int KVH = G == 16 ? 1 : 2;
        run_varlen({t, D, G * KVH, KVH, (k++ % 2) ? 32 : 16, chunks});
      }
}

TEST_F(CudaKernels, PrefillOneChunkApiAndShortRows) {
  for (DType t : kTypes) {
    run_varlen({t, 128, 8, 2, 16, {{77, 190}}, Rows::Normal, -1.f, 1 << 30, true});
    run_varlen({t, 64, 4, 4, 32, {{0, 1}}, Rows::Normal, -1.f, 1 << 30, true});
    run_varlen({t, 64, 4, 1, 16, {{0, 1}, {0, 1}, {3, 1}}});  // decode-like chunks
  }
}

TEST_F(CudaKernels, PrefillLongSequences) {
  run_varlen({DType::F16, 128, 8, 1, 16, {{0, 32768}}, Rows::Normal, -1.f, 24});
  run_varlen({DType::BF16, 128, 4, 2, 32, {{0, 16384}}, Rows::Normal, -1.f, 24});
  run_varlen({DType::BF16, 64, 4, 2, 16, {{1000, 4097}}, Rows::Normal, -1.f, 48});
  run_varlen({DType::F16, 128, 4, 1, 32, {{0, 1025}, {3000, 2047}, {0, 2048}}, Rows::Normal, -1.f, 40});
}

// Block sizes that the TMA producer (wg128n128wst) reads differently, every configuration on the
// same inputs: 8 (16 page boxes per 128-key tile), 64 and 128 (2 and 1), 256 (a tile is a part of
// one block: the box starts inside it). Pages cut by a chunk's last visible key (the rest of the
// block NaN) and by a window's first (the blocks wholly below it given back: -1, NaN), and the
// token-major cache (its tensor map orders kv head before key).
TEST_F(CudaKernels, PrefillVarlenBlockSizesAndLayouts) {
  const std::vector<Chunk> chunks = {{0, 1}, {37, 100}, {500, 333}, {63, 65}, {0, 200}, {129, 2}};
  for (DType t : kTypes)
    for (int bs : {8, 64, 128, 256}) {
      run_varlen({t, 128, 8, 2, bs, chunks});
      VarlenCase c{t, 64, 8, 2, bs, {{0, 130}, {300, 77}, {40, 1}, {700, 300}}, Rows::Normal, 0.f};
      c.window = bs == 8 ? 45 : 150;
      run_varlen(c);
    }
  cuda::KernelOptions token_major;
  token_major.kv_head_major = false;
  const cuda::KernelOptionsScope scope(token_major);
  for (DType t : kTypes)
    for (int bs : {8, 16, 256}) {
      run_varlen({t, 128, 8, 2, bs, chunks});
      run_varlen({t, 64, 4, 1, bs, chunks});  // one kv head: its stride and the key's coincide
    }
}

// Rows far above or below phi: recomputed exactly and counted; rows whose logits climb past their
// reference several times (rising): exact, none recomputed.
TEST_F(CudaKernels, PrefillAdversarialRowsFallBackRisingRowsDoNot) {
  for (DType t : kTypes)
    for (int D : {64, 96, 128}) {
      run_varlen({t, D, 8, 2, 16, {{0, 130}, {17, 300}, {200, 5}}, Rows::Adversarial, 0.f});
      run_varlen({t, D, 4, 4, 32, {{0, 64}, {64, 64}}, Rows::Adversarial, 0.f});
      run_varlen({t, D, 8, 2, 16, {{0, 700}, {300, 257}}, Rows::Rising, 0.f});
    }
  run_varlen({DType::F16, 128, 4, 1, 16, {{0, 8192}}, Rows::Rising, 0.f, 40});
}

// phi far from the logits: every row's first tile leaves phi's range (from below with phi = +200,
// from above with phi = -200) and is recomputed exactly; phi = 3 keeps every row in range.
TEST_F(CudaKernels, PrefillPhiOutOfRangeRecomputesEveryRow) {
  for (float phi : {200.f, -200.f, 3.f})
    for (DType t : kTypes) run_varlen({t, 128, 4, 2, 16, {{5, 100}, {0, 70}}, Rows::Normal, phi});
}

// A NaN query row: the guard finds its sum non-finite, its CTAs recompute (counted once per head),
// and every other row stays exact.
TEST_F(CudaKernels, PrefillNanRowFallsBackAndIsCounted) {
  for (DType t : kTypes) {
    VarlenCase c{t, 128, 4, 2, 16, {{0, 100}, {30, 150}}};
    c.nan_row = 130;  // the second chunk's row 30
    run_varlen(c);
    c.D = 64;
    c.nan_row = 0;
    run_varlen(c);
  }
}

// ---- an e4m3 (fp8) cache ------------------------------------------------------------------------
// k_scale 0.03 and v_scale 2: a k_scale left out of the logit scale (or applied twice) and a v_scale
// left out of the output are far outside the tolerance.

TEST_F(CudaKernels, PrefillFp8CacheVarlenChunks) {
  const std::vector<Chunk> chunks = {{0, 1}, {37, 100}, {500, 333}, {1, 64}, {63, 65}, {0, 200}, {129, 2}};
  int k = 0;
  for (DType t : kTypes)
    for (int D : {64, 128, 256})
      for (auto [H, KVH] : {std::pair{8, 8}, std::pair{8, 2}, std::pair{16, 1}})  // MHA, GQA 4, GQA 16
        run_varlen(fp8_case({t, D, H, KVH, (k++ % 2) ? 32 : 16, chunks}));
}

TEST_F(CudaKernels, PrefillFp8CacheOneChunkApiAndScales) {
  for (DType t : kTypes) {
    run_varlen(fp8_case({t, 128, 8, 2, 16, {{77, 190}}, Rows::Normal, -1.f, 1 << 30, true}));
    run_varlen(fp8_case({t, 64, 4, 4, 32, {{0, 1}}, Rows::Normal, -1.f, 1 << 30, true}));
    run_varlen(fp8_case({t, 256, 4, 1, 16, {{0, 1}, {0, 1}, {3, 1}}}));  // decode-like chunks
    // Scale 1 (uncalibrated: small values subnormal in e4m3) and scales the other way round.
    run_varlen(fp8_case({t, 128, 8, 2, 16, {{5, 150}, {0, 64}}}, 1.f, 1.f));
    run_varlen(fp8_case({t, 64, 8, 2, 32, {{5, 150}, {0, 64}}}, 4.f, 0.01f));
  }
  run_varlen(fp8_case({DType::BF16, 128, 4, 2, 16, {{1000, 2500}}, Rows::Normal, -1.f, 40}));
}

// Rows far above or below phi, and rising rows, with an e4m3 cache: the guard and the references
// see the true (k_scale-folded) logits, so exactly the rows the CPU finds out of range fall back.
TEST_F(CudaKernels, PrefillFp8CacheAdversarialRowsFallBack) {
  for (DType t : kTypes)
    for (int D : {64, 128, 256}) {
      run_varlen(fp8_case({t, D, 8, 2, 16, {{0, 130}, {17, 300}, {200, 5}}, Rows::Adversarial, 0.f}));
      run_varlen(fp8_case({t, D, 4, 4, 32, {{0, 64}, {64, 64}}, Rows::Adversarial, 0.f}));
      run_varlen(fp8_case({t, D, 8, 2, 16, {{0, 700}, {300, 257}}, Rows::Rising, 0.f}));
    }
  for (float phi : {200.f, -200.f, 3.f})
    for (DType t : kTypes) run_varlen(fp8_case({t, 128, 4, 2, 16, {{5, 100}, {0, 70}}, Rows::Normal, phi}));
}

// The masked kernels over an e4m3 cache: windows (blocks before every row's window given back) and
// a soft cap that bites (its multiplier is the k_scale-folded logit scale).
TEST_F(CudaKernels, PrefillFp8CacheWindowAndSoftcap) {
  const std::vector<Chunk> chunks = {{0, 130}, {300, 77}, {40, 1}};
  for (DType t : kTypes)
    for (int D : {64, 128, 256})
      for (auto [window, cap] : {std::pair{45, 0.f}, std::pair{0, 3.f}, std::pair{100, 2.f}}) {
        VarlenCase c = fp8_case({t, D, 8, 2, 16, chunks, Rows::Normal, 0.f});
        c.window = window;
        c.softcap = cap;
        c.q_scale = cap > 0.f ? 3.f : 1.f;
        run_varlen(c);
      }
}

TEST_F(CudaKernels, PrefillVarlenRejectsBadArguments) {
  const void* p = reinterpret_cast<const void*>(uintptr_t(256));
  const int32_t* ip = reinterpret_cast<const int32_t*>(uintptr_t(256));
  void* o = reinterpret_cast<void*>(uintptr_t(256));
  auto call = [&](int chunks, int max_chunk, int H, int KVH, int D, int bs, const int32_t* qb) {
    cuda::prefill_attention_varlen(p, p, p, ip, 4, qb, ip, chunks, 64, max_chunk, H, KVH, D, bs, 0.1f, nullptr,
                                   nullptr, o, DType::F16, nullptr);
  };
  EXPECT_NE(error_of([&] { call(1, 64, 8, 3, 128, 16, ip); }).find("prefill_attention_varlen"), std::string::npos);
  EXPECT_NE(error_of([&] { call(1, 64, 8, 2, 80, 16, ip); }).find("head_dim"), std::string::npos);
  EXPECT_NE(error_of([&] { call(1, 64, 8, 2, 128, 24, ip); }).find("block_size"), std::string::npos);
  EXPECT_NE(error_of([&] { call(0, 64, 8, 2, 128, 16, ip); }).find("chunks"), std::string::npos);
  EXPECT_NE(error_of([&] { call(1, 65, 8, 2, 128, 16, ip); }).find("max_chunk_tokens"), std::string::npos);
  EXPECT_NE(error_of([&] { call(1, 64, 8, 2, 128, 16, nullptr); }).find("q_begin"), std::string::npos);
  EXPECT_NE(error_of([&] {
              cuda::prefill_attention_varlen(p, p, p, ip, 4, ip, ip, 1, 64, 64, 8, 2, 128, 16, 0.1f, nullptr, nullptr, o,
                                             DType::F16, nullptr, cuda::prefill_attention_configs());
            }).find("tile configuration"),
            std::string::npos);
  auto fp8_call = [&](int D, float k_scale, float v_scale) {
    cuda::prefill_attention_varlen(p, p, p, ip, 4, ip, ip, 1, 64, 64, 8, 2, D, 16, 0.1f, nullptr, nullptr, o,
                                   DType::F16, nullptr, 0, 0, 0.f, {cuda::KvDType::Fp8E4M3, k_scale, v_scale});
  };
  const std::string bad_dim = error_of([&] { fp8_call(96, 1.f, 1.f); });
  EXPECT_NE(bad_dim.find("head_dim"), std::string::npos) << bad_dim;
  EXPECT_NE(bad_dim.find("fp8"), std::string::npos) << bad_dim;
  EXPECT_NE(error_of([&] { fp8_call(128, 0.f, 1.f); }).find("k_scale"), std::string::npos);
  EXPECT_NE(error_of([&] { fp8_call(128, 1.f, NAN); }).find("v_scale"), std::string::npos);
}

}  // namespace
}  // namespace fdpp::test
