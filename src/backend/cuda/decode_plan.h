// Host-side plan of decode attention (decode_attention.cu): the CTAs' shared-memory shapes, which
// loop a call runs and with how many warps (choose_loop), how a GQA group is divided over CTAs
// (plan_groups), the split count of a step (plan_decode_splits) and the launch a call makes
// (decode_attention_launch). Plain C++17 without CUDA, so that the CPU tests check its invariants
// and the kernels compile against the very same shapes. The measurements that set its thresholds
// are in docs/kernels/decode_attention.md (each constant names its section).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <tuple>
#include <type_traits>

#include "backend/cuda/kernel_options.h"
#include "fdpp/error.h"

namespace fdpp::cuda {

// The launch that adds a call's splits after the main kernel (splits > 1, unless the kernel did),
// by rows (batch x query heads) per SM: the CTA shapes of decode_attention_combine.cuh's CombineShape.
enum class CombineLaunch { None, FewRows, SomeRows, ManyRows };
inline const char* combine_launch_name(CombineLaunch c) {
  switch (c) {
    case CombineLaunch::FewRows: return "few_rows";
    case CombineLaunch::SomeRows: return "some_rows";
    case CombineLaunch::ManyRows: return "many_rows";
    case CombineLaunch::None: break;
  }
  return "none";
}

// How a decode-attention call runs: what decode_attention / decode_attention_async (async_mode)
// launch for these arguments on a GPU of `multiprocessors` SMs, under the calling thread's
// KernelOptions. A captured step replays the launches it was captured with, so the engine keys its
// graphs by this.
struct DecodeAttentionLaunch {
  int splits = 1;
  bool tensor_cores = false;       // the loop: tensor cores (mma), else CUDA cores
  int warps = 8;                   // per CTA
  bool unified = false;            // async mode: the unified-max kernels ran (else the synchronized ones)
  bool combine_in_kernel = false;  // unified: the group's last CTA added the splits (else a second launch)
  CombineLaunch combine = CombineLaunch::None;
  // (Ordered for use as a map key; the .cu files are C++17, so no defaulted <=>.)
  auto tied() const { return std::tie(splits, tensor_cores, warps, unified, combine_in_kernel, combine); }
  bool operator<(const DecodeAttentionLaunch& o) const { return tied() < o.tied(); }
  bool operator==(const DecodeAttentionLaunch& o) const { return tied() == o.tied(); }
};

namespace decode {

// ---- CTA shapes -----------------------------------------------------------------------------------

// Warps per CTA, a template parameter of both loops (W). 8 at head_dim <= 128 (one CTA per SM at
// 128); auto (KernelOptions::decode_warps 0) takes 4 where choose_loop says two CTAs per SM pay.
// Head dims 80, 96 and 256 keep their fixed count (default_warps).
constexpr int kDefaultWarps = 8;

// Shared memory an SM gives its CTAs (H100/H200), and what each CTA costs on top of its own (1 KB
// reserved by the system; "CUDA C++ Programming Guide, shared memory").
constexpr size_t kSmemPerSmBytes = 228 * 1024;
constexpr size_t kSmemReservedPerCta = 1024;
// CTAs of `threads` threads and `smem` bytes that fit on one SM by shared memory and threads (2048
// per SM); registers are the compiler's part, bound by the kernel's __launch_bounds__.
constexpr int resident_ctas(int threads, size_t smem) {
  const size_t by_smem = kSmemPerSmBytes / (smem + kSmemReservedPerCta + 64);  // + the flag after it (kFlagBytes)
  const size_t by_threads = size_t(2048 / threads);
  const size_t n = by_smem < by_threads ? by_smem : by_threads;
  return n < 1 ? 1 : static_cast<int>(n);
}

// Dynamic shared memory after a loop's layout (Shape::kSmem, a multiple of 16): the in-kernel
// reduction's flag (decode_attention_kernel).
constexpr size_t kFlagBytes = 16;

// The most splits a launch takes (the synchronized combine keeps one weight per split in shared memory).
constexpr int kMaxSplits = 1024;

// Staged K/V rows (both loops): where a row has a multiple of 8 chunks of 16 bytes (head dims 64,
// 128, 256) the chunks are XOR-swizzled by row and the row stays D wide; otherwise (80, 96) rows
// are padded by 16 bytes. Either way the 8 rows of one ldmatrix hit 8 different bank groups;
// unpadded rows stream faster (docs/kernels/decode_attention.md, staged rows).
template <int D>
constexpr bool kSwizzledRows = (D / 8) % 8 == 0;
template <int D>
constexpr int kStagedRow = kSwizzledRows<D> ? D : D + 8;  // elements from one staged row to the next

// CUDA-core loop: GMAX query heads per CTA, W warps, 32-key tiles.
template <int D, int GMAX, int W>
struct CoreShape {
  static constexpr int kWarps = W;
  static constexpr int kKeys = 32;  // keys per tile
  // K and V tile staging (16-bit, per warp [32][kStagedRow] then [32][D]) during the loop; o per warp
  // ([kWarps][GMAX][D] fp32) for the final merge, in the same bytes.
  static constexpr size_t kStageBytes = sizeof(uint16_t) * kWarps * 32 * (kStagedRow<D> + D);
  static constexpr int kOStride = D;  // floats per row of o (lanes write consecutive dims: no conflict)
  static constexpr size_t kOBytes = sizeof(float) * kWarps * GMAX * kOStride;
  static constexpr size_t kSmem = sizeof(float) * 2 * kWarps * GMAX  // m, d per warp (merge)
                                  + sizeof(float) * GMAX * D           // q (scaled)
                                  + sizeof(float) * kWarps * GMAX * 32  // probabilities of the tile, per warp
                                  + (kStageBytes > kOBytes ? kStageBytes : kOBytes);
};

// Tensor-core loop (GMAX is always 16: the M of the mma). 3 stages of one tile per warp, so that
// two tiles per warp are in flight while the third is computed; W warps (8 by default, 4 at
// head_dim 256, where 8 x 3 stages would not fit in 227 KB; 4 at 64 and 128 with decode_warps 4).
// kFp8: an e4m3 cache (KvDType::Fp8E4M3). A row of D bytes is staged as a 16-bit row of D / 2
// elements (chunks, swizzle, padding), and tiles hold 32 keys: the bytes of a 16-bit 16-key tile.
template <int D, int W, bool kFp8 = false>
struct MmaShape {
  static constexpr int kWarps = W;
  static constexpr int kStages = 3;
  // Keys per tile: 16, or 32 at head_dim 64 with 8 warps (8 KB of K and V, like a 16-key tile at
  // 128: the fixed work of an iteration is shared by twice the bytes; docs/kernels/
  // decode_attention.md, tile size), and 32 on an e4m3 cache.
  static constexpr int kKeys = kFp8 || (D == 64 && W == 8) ? 32 : 16;
  static constexpr int kStagedDim = kFp8 ? D / 2 : D;  // 16-bit elements a staged row stands for
  static constexpr int kStride = D + 8;  // 16-bit elements per row of q (16-byte pad)
  static constexpr size_t kTileBytes = sizeof(uint16_t) * 2 * kKeys * kStagedRow<kStagedDim>;  // K and V of a tile
  static constexpr size_t kStageBytes = size_t(kWarps) * kStages * kTileBytes;
  // Floats per row of o after the loop: D + 8 puts the 4 rows a half-warp stores 8 banks apart
  // (D floats apart they hit the same 8 banks; docs/kernels/decode_attention.md, end of the CTA).
  static constexpr int kOStride = D + 8;
  static constexpr size_t kOBytes = sizeof(float) * kWarps * 16 * kOStride;
  static constexpr size_t kSmem = sizeof(float) * 2 * kWarps * 16 + sizeof(uint16_t) * 16 * kStride +
                                  (kStageBytes > kOBytes ? kStageBytes : kOBytes);
  static_assert(kSmem <= 227 * 1024, "shared memory");
};

// The default warps of a head dim (both loops).
template <int D>
constexpr int default_warps() {
  return D > 128 ? 4 : kDefaultWarps;
}

// Calls f(std::integral_constant<int, D>{}) for the call's head dim: the kernels' head dims, one
// instantiation each (anything else is taken as 256: callers check the head dim first).
template <class F>
void with_head_dim(int head_dim, F&& f) {
  switch (head_dim) {
    case 64: return f(std::integral_constant<int, 64>{});
    case 80: return f(std::integral_constant<int, 80>{});
    case 96: return f(std::integral_constant<int, 96>{});
    case 128: return f(std::integral_constant<int, 128>{});
    default: return f(std::integral_constant<int, 256>{});
  }
}

// ---- which loop, how many warps ----------------------------------------------------------------------
//
// The loop: the tensor cores for a CTA of two or more query heads (one K/V tile serves the whole
// group at tensor-core rate; the CUDA-core loop's dot products per key grow with the group), at head
// dims the CUDA-core loop lacks, and for MHA at head_dim 128 but on short rows at small batch, and at
// head_dim 64 where many CTA groups or long rows pay for it. KernelOptions::decode_path forces one
// (core only at 64 and 128).
// Warps at head dims 64 and 128: KernelOptions::decode_warps when it is 4 or 8; auto: 4 where two
// CTAs of 4 warps per SM have enough CTA groups to share an SM (one streams while the other fills or
// drains), else 8. With fewer groups the plan must split rows to fill the slots, and the extra
// partials cost more than that overlap gains. The thresholds: docs/kernels/decode_attention.md,
// loop and warps.
constexpr int kFourWarpMinSlotsFilledPct = 75;  // tensor cores: groups for 3/4 of two CTAs per SM
constexpr int kCoreFourWarpMinGroupsPerSm = 4;  // CUDA cores (MHA at head_dim 64)
constexpr int kMhaCoreMaxContext = 512;         // MHA at 128: CUDA cores on rows up to this, at small batch
constexpr int kMha64MmaMinGroupsPerSm = 4;      // MHA at 64: tensor cores from this many groups per SM,
constexpr int kMha64CoreMaxContext = 2048;      //   or two CTAs per SM filled on rows longer than this
constexpr int kMhaFourWarpMaxContext = 2048;    // MHA on tensor cores: 4 warps only on rows up to this

struct LoopChoice {
  bool tensor_cores;
  int warps;
};

// gmax: query heads per CTA (plan_groups); max_context_len: the call's longest row, 0 if not known
// (then taken as long).
inline LoopChoice choose_loop(int batch, int n_heads, int n_kv_heads, int head_dim, int gmax, int max_context_len,
                              int multiprocessors) {
  const KernelOptions& o = current_kernel_options();
  check(o.decode_warps == 0 || o.decode_warps == 4 || o.decode_warps == 8,
        "decode attention: decode_warps = {} is not one of 0 (auto), 4, 8", o.decode_warps);
  if (head_dim != 64 && head_dim != 128) return {true, head_dim > 128 ? 4 : kDefaultWarps};
  const int group = n_heads / n_kv_heads;
  const int64_t groups = int64_t(batch) * n_kv_heads * ((group + 15) / 16);
  const int64_t mma_slots = 2 * int64_t(multiprocessors);
  const bool mma_fills_four = groups * 100 >= mma_slots * kFourWarpMinSlotsFilledPct;
  const bool core_fills_four = groups >= int64_t(kCoreFourWarpMinGroupsPerSm) * multiprocessors;
  // MHA on tensor cores: at head_dim 128 but on short rows at small batch; at 64 with many CTA
  // groups, or enough for two CTAs per SM on long rows.
  const bool short_rows = max_context_len > 0 && max_context_len <= kMhaCoreMaxContext;
  const bool rows_to_2k = max_context_len > 0 && max_context_len <= kMha64CoreMaxContext;
  const bool mha128_mma = !(short_rows && !mma_fills_four);
  const bool mha64_mma =
      groups >= int64_t(kMha64MmaMinGroupsPerSm) * multiprocessors || (mma_fills_four && !rows_to_2k);
  const bool mha_mma = group == 1 && (head_dim == 128 ? mha128_mma : mha64_mma);
  // The warps follow the loop whole groups would run (a GQA group split into single heads at small
  // batch runs the CUDA-core loop with the tensor-core loop's count; both give 8 there).
  bool whole_groups_mma = false, loop_mma = false;
  switch (o.decode_path) {
    case DecodePath::Mma: whole_groups_mma = loop_mma = true; break;
    case DecodePath::Core: whole_groups_mma = loop_mma = false; break;
    case DecodePath::Auto:
      whole_groups_mma = group >= 2 || mha_mma;
      loop_mma = gmax >= 2 || mha_mma;
      break;
  }
  bool four = whole_groups_mma ? mma_fills_four : core_fills_four;
  if (group == 1 && whole_groups_mma && four) {
    // MHA on tensor cores: 4 warps on short rows only, and where the rounds of two 4-warp CTAs per
    // SM take no longer than those of one 8-warp CTA (which streams twice as fast).
    const int64_t rounds_four = (groups + mma_slots - 1) / mma_slots;
    const int64_t rounds_eight = (groups + multiprocessors - 1) / multiprocessors;
    four = max_context_len > 0 && max_context_len <= kMhaFourWarpMaxContext && 2 * rounds_four <= rounds_eight;
  }
  if (o.decode_warps != 0) four = o.decode_warps == 4;
  return {loop_mma, four ? 4 : kDefaultWarps};
}

// ---- CTA groups -------------------------------------------------------------------------------------
// One CTA group per (sequence, kv head, sub-group of at most gmax query heads). A CTA normally takes
// the whole GQA group (up to 16 heads), so each K/V tile is read once for all of them. When even
// with `splits` that leaves most SMs idle (short rows at small batch), the group is split over more
// CTAs, halving gmax while fewer than half the SMs would be busy: the sub-groups' extra K/V reads
// hit L2 (such a short cache is a few MB). Long rows split the keys instead and keep whole groups.
// (docs/kernels/decode_attention.md, group plan.)
struct GroupPlan {
  int group, gmax, n_sub;
  int64_t n_groups;
};
inline GroupPlan plan_groups(int batch, int n_heads, int n_kv_heads, int splits, int multiprocessors) {
  GroupPlan g{};
  g.group = n_heads / n_kv_heads;
  g.gmax = g.group <= 1 ? 1 : g.group <= 2 ? 2 : g.group <= 4 ? 4 : g.group <= 8 ? 8 : 16;
  auto n_sub = [&](int gmax) { return (g.group + gmax - 1) / gmax; };
  const int64_t half_sms = multiprocessors / 2;
  while (g.gmax > 1 && int64_t(batch) * n_kv_heads * n_sub(g.gmax) * splits < half_sms) g.gmax /= 2;
  g.n_sub = n_sub(g.gmax);
  g.n_groups = int64_t(batch) * n_kv_heads * g.n_sub;
  return g;
}
// The most groups any plan can have (one query head per CTA): bounds the counters.
inline int64_t max_groups(int batch, int n_heads) { return int64_t(batch) * n_heads; }

// ---- combines -------------------------------------------------------------------------------------
// The combine launch's shape by rows (batch x query heads) per SM: up to one row per SM (many splits)
// 256 threads, up to 4 128 threads with 8 splits per batch, more rows 128 threads with 4
// (decode_attention_combine.cuh, CombineShape; docs/kernels/decode_attention.md, combine shapes).
constexpr int kCombineFewRowsPerSm = 1, kCombineSomeRowsPerSm = 4;

// Async with several splits: where the partials are added (KernelOptions::async_combine). Auto
// takes the in-kernel reduction (the group's last CTA) on rows up to kAsyncKernelCombineMaxContext
// keys with 2 splits, or at batch 1 with up to 4; the separate launch otherwise: a single-wave grid
// cannot hide the launch, but the last CTA alone adding many splits is slow, and the kernel that
// holds the reduction streams a little slower on long rows (docs/kernels/decode_attention.md,
// async combine).
constexpr int kAsyncKernelCombineMaxSplits = 4;
constexpr int kAsyncKernelCombineAnyBatchSplits = 2, kAsyncKernelCombineMaxContext = 8192;

// (max_context_len 0, not known, counts as long.)
inline bool combine_in_kernel(int batch, int splits, int max_context_len) {
  switch (current_kernel_options().async_combine) {
    case AsyncCombine::Kernel: return true;
    case AsyncCombine::Launch: return false;
    case AsyncCombine::Auto: break;
  }
  const bool short_rows = max_context_len > 0 && max_context_len <= kAsyncKernelCombineMaxContext;
  return short_rows && (splits <= kAsyncKernelCombineAnyBatchSplits ||
                        (batch == 1 && splits <= kAsyncKernelCombineMaxSplits));
}

// masked: a sliding window or soft-capped logits (DecodeAttentionParams::window, softcap); those
// calls run only the tensor-core loop at the head dim's default warps (their kernels are separate
// instantiations, kept to one shape each).
inline DecodeAttentionLaunch describe_launch(const GroupPlan& g, int batch, int n_heads, int n_kv_heads,
                                             int head_dim, int splits, int max_context_len, bool async_mode,
                                             int multiprocessors, bool masked = false) {
  const LoopChoice loop =
      masked ? LoopChoice{true, head_dim > 128 ? 4 : kDefaultWarps}
             : choose_loop(batch, n_heads, n_kv_heads, head_dim, g.gmax, max_context_len, multiprocessors);
  DecodeAttentionLaunch c;
  c.splits = splits;
  c.tensor_cores = loop.tensor_cores;
  c.warps = loop.warps;
  // The async mode runs its own (unified max) kernels with several splits on the tensor cores, else
  // the synchronized ones (the reasons are beside that dispatch, in decode_attention_async).
  c.unified = async_mode && splits > 1 && loop.tensor_cores;
  c.combine_in_kernel = c.unified && combine_in_kernel(batch, splits, max_context_len);
  if (splits > 1 && !c.combine_in_kernel) {
    const int64_t rows = int64_t(batch) * n_heads;
    c.combine = rows <= int64_t(kCombineFewRowsPerSm) * multiprocessors    ? CombineLaunch::FewRows
                : rows <= int64_t(kCombineSomeRowsPerSm) * multiprocessors ? CombineLaunch::SomeRows
                                                                           : CombineLaunch::ManyRows;
  }
  return c;
}

// ---- split plan -------------------------------------------------------------------------------------

// What the split plan counts on for a step's shape: CTA groups (one per sequence, kv head and
// 16-head sub-group), warps per CTA (choose_loop, which the launch asks the same), the CTAs resident
// at once (slots: SMs x CTAs per SM by shared memory) and the keys of one tile of the loop the CTA
// runs (on tensor cores 16, or 32 at head_dim 64 with 8 warps; 32 on CUDA cores).
struct SplitShape {
  int64_t groups;
  int warps;
  int64_t slots;
  int tile_keys;
};

// CTAs of `warps` warps the plan counts resident at once on the GPU at `head_dim`, by shared memory:
// at 64 and 128 the smaller count of the two loops' (both run there), above 128 the tensor-core
// loop's (the only one; its warps are the head dim's default, whatever `warps` says), at 80 and 96
// the count at 128 (docs/kernels/decode_attention.md, split plan).
inline int64_t resident_slots(int head_dim, int warps, int multiprocessors) {
  auto per_sm = [](auto core, auto mma) {
    return std::min(resident_ctas(decltype(core)::kWarps * 32, decltype(core)::kSmem),
                    resident_ctas(decltype(mma)::kWarps * 32, decltype(mma)::kSmem));
  };
  int per_sm_ctas = 0;
  with_head_dim(head_dim == 64 ? 64 : std::max(head_dim, 128), [&](auto d) {
    constexpr int D = decltype(d)::value;
    if constexpr (D == 64 || D == 128) {
      per_sm_ctas =
          warps == 4 ? per_sm(CoreShape<D, 4, 4>{}, MmaShape<D, 4>{}) : per_sm(CoreShape<D, 4, 8>{}, MmaShape<D, 8>{});
    } else {
      using S = MmaShape<D, default_warps<D>()>;
      per_sm_ctas = resident_ctas(S::kWarps * 32, S::kSmem);
    }
  });
  return int64_t(multiprocessors) * per_sm_ctas;
}

// Keys per tile of the tensor-core loop of `warps` warps at `head_dim` (MmaShape::kKeys).
inline int mma_tile_keys(int head_dim, int warps) {
  int k = 16;
  with_head_dim(head_dim, [&](auto d) {
    constexpr int D = decltype(d)::value;
    if constexpr (D == 64 || D == 128)
      k = warps == 4 ? MmaShape<D, 4>::kKeys : MmaShape<D, 8>::kKeys;
    else
      k = MmaShape<D, default_warps<D>()>::kKeys;
  });
  return k;
}

// Keys per tile of the loop a launch runs: the tensor-core loop's (mma_tile_keys) or 32 on CUDA cores.
inline int loop_tile_keys(const LoopChoice& loop, int head_dim) {
  return loop.tensor_cores ? mma_tile_keys(head_dim, loop.warps) : 32;
}

inline SplitShape split_shape(int batch, int n_heads, int n_kv_heads, int head_dim, int max_context_len,
                              int multiprocessors) {
  const int group = n_heads / n_kv_heads;
  const LoopChoice loop =
      choose_loop(batch, n_heads, n_kv_heads, head_dim, std::min(group, 16), max_context_len, multiprocessors);
  SplitShape sh;
  sh.groups = int64_t(batch) * n_kv_heads * ((group + 15) / 16);
  sh.warps = loop.warps;
  sh.slots = resident_slots(head_dim, sh.warps, multiprocessors);
  sh.tile_keys = loop_tile_keys(loop, head_dim);
  return sh;
}

// The most splits a plan considers: a split holds at least one tile, the grid at most two waves of
// slots (more splits only add partials; docs/kernels/decode_attention.md, split plan), and 256.
inline int max_splits_of(const SplitShape& sh, int max_context_len) {
  const int64_t tiles = (int64_t(std::max(max_context_len, 0)) + sh.tile_keys - 1) / sh.tile_keys;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>({256, tiles, 2 * sh.slots / sh.groups})));
}

// The split counts a plan considers: those the sweeps measure, so that every choice of the model
// has a measured time at the points it was fitted to (docs/kernels/decode_attention.md, split plan).
inline constexpr int kSplitCandidates[] = {1,  2,  3,  4,  5,  6,  7,   8,   10,  12,  14,  16,  20,  24,
                                           28, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256};

// The split plan's cost model, in units of one SM streaming 8 tiles of 16 keys of one kv head, for s
// splits of a row's n tiles on W warps, with the launch plan_groups and choose_loop make of s:
//   T(s) = waves(s) x stream(ceil(n / s)) + [s > 1] (kSplitFixed + kSplitEach x s) + kCtaCost x CTAs(s),
//   stream(t) = (ceil(t / W) + t / W) / 2 x tile_keys / 16 (at least kCoreMinRound on CUDA cores),
//   waves(s) = ceil(CTAs(s) / slots).
// The cheapest s of kSplitCandidates wins (the smallest on ties); both modes plan alike since the
// combines load every split of a row at once. The constants were fitted by grid search at head_dim
// 128 (docs/kernels/decode_attention.md, split plan: the fit, its error and a worked example).
constexpr double kSplitFixed = 1.75, kSplitEach = 0.125, kCtaCost = 0.014, kCoreMinRound = 1.0;

inline int plan_splits(int batch, int n_heads, int n_kv_heads, int head_dim, int max_context_len, int multiprocessors) {
  if (max_context_len <= 0 || multiprocessors <= 0) return 1;
  const SplitShape whole = split_shape(batch, n_heads, n_kv_heads, head_dim, max_context_len, multiprocessors);
  const int max_splits = max_splits_of(whole, max_context_len);
  int best_s = 1;
  double best = 0.0;
  for (const int s : kSplitCandidates) {
    if (s > max_splits) break;
    const GroupPlan g = plan_groups(batch, n_heads, n_kv_heads, s, multiprocessors);
    const LoopChoice loop = choose_loop(batch, n_heads, n_kv_heads, head_dim, g.gmax, max_context_len, multiprocessors);
    const int tile_keys = loop_tile_keys(loop, head_dim);
    const int64_t ctas = g.n_groups * s, slots = resident_slots(head_dim, loop.warps, multiprocessors);
    const int64_t n_tiles = (int64_t(max_context_len) + tile_keys - 1) / tile_keys;
    const int64_t tiles = (n_tiles + s - 1) / s;  // per split
    const int64_t waves = (ctas + slots - 1) / slots;
    double stream = 0.5 * (double((tiles + loop.warps - 1) / loop.warps) + double(tiles) / loop.warps);
    if (!loop.tensor_cores) stream = std::max(stream, kCoreMinRound);
    stream *= tile_keys / 16.0;
    const double t =
        double(waves) * stream + (s > 1 ? kSplitFixed + kSplitEach * s : 0.0) + kCtaCost * double(ctas);
    if (s == 1 || t < best - 1e-9) {
      best = t;
      best_s = s;
    }
  }
  return best_s;
}

inline int max_splits(int batch, int n_heads, int n_kv_heads, int head_dim, int max_context_len, int multiprocessors) {
  if (max_context_len <= 0 || multiprocessors <= 0) return 1;
  // Whatever loop and warps a row of any length up to max_context_len takes (choose_loop changes
  // them with the length), its plan has at most the splits of the smallest tile (16 keys, tensor
  // cores) and the most slots (4-warp CTAs).
  SplitShape bound = split_shape(batch, n_heads, n_kv_heads, head_dim, max_context_len, multiprocessors);
  bound.tile_keys = 16;
  bound.slots = std::max(bound.slots, resident_slots(head_dim, 4, multiprocessors));
  return max_splits_of(bound, max_context_len);
}

}  // namespace decode

// ---- the plan's public functions (kernels.h documents the calls they size) -------------------------

// Bytes of workspace decode_attention needs for `splits` (the splits' partials, [batch][H][splits][D + 2]
// floats; none for one split).
inline size_t decode_attention_workspace_bytes(int batch, int n_heads, int head_dim, int splits) {
  return splits <= 1 ? 0 : sizeof(float) * size_t(batch) * n_heads * splits * (head_dim + 2);
}

// Bytes of workspace decode_attention_async needs: the splits' partials (which also cover the
// synchronized kernels it may run instead), at least 16.
inline size_t decode_attention_async_workspace_bytes(int batch, int n_heads, int n_kv_heads, int head_dim,
                                                     int splits) {
  check(batch > 0 && n_heads > 0 && n_kv_heads > 0 && n_heads % n_kv_heads == 0 && splits >= 1,
        "decode_attention_async_workspace_bytes: batch {}, heads {}/{}, splits {}", batch, n_heads, n_kv_heads, splits);
  return std::max<size_t>(decode_attention_workspace_bytes(batch, n_heads, head_dim, splits), 16);
}

// Ints of counters decode_attention_async needs: the per-group semaphores of the in-kernel reduction,
// counters[2 + group] for the most groups any plan of this batch has. (Ints 0 and 1 are unused: the
// former fallback list's count; the interface's sizing keeps them.)
inline int decode_attention_async_counters(int batch, int n_heads, int n_kv_heads) {
  check(batch > 0 && n_heads > 0 && n_kv_heads > 0 && n_heads % n_kv_heads == 0,
        "decode_attention_async_counters: batch {}, heads {}/{}", batch, n_heads, n_kv_heads);
  const int64_t n = 2 + decode::max_groups(batch, n_heads);
  check(n <= 0x7fffffff, "decode_attention_async_counters: {} groups", n);
  return static_cast<int>(n);
}

inline DecodeAttentionLaunch decode_attention_launch(int batch, int n_heads, int n_kv_heads, int head_dim, int splits,
                                                     int max_context_len, bool async_mode, int multiprocessors,
                                                     bool masked = false) {
  check(batch > 0 && n_heads > 0 && n_kv_heads > 0 && n_heads % n_kv_heads == 0 && splits >= 1 &&
            multiprocessors > 0,
        "decode_attention_launch: batch {}, heads {}/{}, splits {}, {} multiprocessors", batch, n_heads, n_kv_heads,
        splits, multiprocessors);
  return decode::describe_launch(decode::plan_groups(batch, n_heads, n_kv_heads, splits, multiprocessors), batch,
                                 n_heads, n_kv_heads, head_dim, splits, max_context_len, async_mode, multiprocessors,
                                 masked);
}

// The split count for a decode step (decode::plan_splits). Both modes plan alike.
inline int plan_decode_splits(int batch, int n_heads, int n_kv_heads, int head_dim, int max_context_len,
                              int multiprocessors) {
  return decode::plan_splits(batch, n_heads, n_kv_heads, head_dim, max_context_len, multiprocessors);
}

// The rows a graph-replayed decode step of `batch` sequences runs (the rest padding): the batch itself
// up to 8, then the next multiple of 8 (the flat GEMM's tile rows, so padding adds no GEMM work), at
// most max_batch. A server's batch changes nearly every step; buckets keep the graphs few.
inline int decode_graph_rows(int batch, int max_batch) {
  check(batch >= 1 && batch <= max_batch, "decode_graph_rows: batch {} outside [1, {}]", batch, max_batch);
  if (batch <= 8) return batch;
  return std::min(max_batch, (batch + 7) / 8 * 8);
}

// The most splits plan_decode_splits returns for any context up to max_context_len (workspace sizing).
inline int max_decode_splits(int batch, int n_heads, int n_kv_heads, int head_dim, int max_context_len,
                             int multiprocessors) {
  return decode::max_splits(batch, n_heads, n_kv_heads, head_dim, max_context_len, multiprocessors);
}

}  // namespace fdpp::cuda
