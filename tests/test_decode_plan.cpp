// Decode attention's host-side plan (backend/cuda/decode_plan.h), without a GPU: over many shapes
// (head dims, GQA ratios 1..48, batches, row lengths, SM counts) and kernel options, the CTA groups
// cover every query head once, the splits cover every row's key tiles exactly, the split counts and
// the groups fit the workspace and counters the engine sizes, and the loop, warps and launch follow
// the forced options and the rules' stated bounds. The kernels' side of the same slicing
// (attend_group) is emulated here line for line.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "backend/cuda/decode_plan.h"
#include "fdpp/error.h"

namespace fdpp::cuda {
namespace {

struct Heads {
  int n_heads, n_kv_heads;
};
// MHA, GQA 2..16, MQA, groups above 16 (split over CTAs), and counts that are no power of two.
const std::vector<Heads> kHeads = {{32, 32}, {40, 40}, {32, 16}, {32, 8}, {28, 4}, {14, 2}, {32, 2}, {52, 4},
                                   {96, 8},  {8, 8},   {12, 1},  {16, 1}, {32, 1}, {48, 1}, {64, 2}, {7, 7}};
const std::vector<int> kHeadDims = {64, 80, 96, 128, 256};
const std::vector<int> kBatches = {1, 2, 3, 5, 8, 13, 32, 64, 200};
const std::vector<int> kLengths = {1,   2,    15,   16,   17,   31,   33,    100,   500,   512,
                                   513, 1000, 2047, 2049, 4096, 5000, 16384, 65536, 131072};
const std::vector<int> kMultiprocessors = {132, 114, 78, 16, 3, 1};

int natural_gmax(int group) { return group <= 1 ? 1 : group <= 2 ? 2 : group <= 4 ? 4 : group <= 8 ? 8 : 16; }

// The kernels' keys per tile for a launch (decode_attention_mma.cuh / _core.cuh).
int launch_tile_keys(const DecodeAttentionLaunch& launch, int head_dim) {
  return decode::loop_tile_keys({launch.tensor_cores, launch.warps}, head_dim);
}

// Every kernel-option set the plan reads: warps auto / 4 / 8, and the forced loops where they exist.
std::vector<KernelOptions> option_sets(int head_dim) {
  std::vector<KernelOptions> sets;
  for (int warps : {0, 4, 8}) {
    for (DecodePath path : {DecodePath::Auto, DecodePath::Mma, DecodePath::Core}) {
      if (path == DecodePath::Core && head_dim != 64 && head_dim != 128) continue;
      KernelOptions o;
      o.decode_warps = warps;
      o.decode_path = path;
      sets.push_back(o);
    }
  }
  return sets;
}

TEST(DecodePlan, GroupPlanCoversEveryQueryHeadOnce) {
  int64_t plans = 0;
  for (const Heads& h : kHeads) {
    const int group = h.n_heads / h.n_kv_heads;
    for (int batch : {1, 2, 3, 8, 64}) {
      for (int splits : {1, 2, 5, 16, 64, 256}) {
        for (int sms : kMultiprocessors) {
          const decode::GroupPlan g = decode::plan_groups(batch, h.n_heads, h.n_kv_heads, splits, sms);
          ++plans;
          SCOPED_TRACE(testing::Message() << "heads " << h.n_heads << "/" << h.n_kv_heads << " batch " << batch
                                          << " splits " << splits << " SMs " << sms);
          ASSERT_EQ(g.group, group);
          ASSERT_TRUE(g.gmax == 1 || g.gmax == 2 || g.gmax == 4 || g.gmax == 8 || g.gmax == 16) << g.gmax;
          ASSERT_LE(g.gmax, natural_gmax(group));
          ASSERT_EQ(g.n_sub, (group + g.gmax - 1) / g.gmax);
          ASSERT_EQ(g.n_groups, int64_t(batch) * h.n_kv_heads * g.n_sub);
          ASSERT_LE(g.n_groups, decode::max_groups(batch, h.n_heads));
          // The sub-groups are split only while the CTAs fill less than half the SMs: the plan stops
          // at the first gmax whose CTAs reach half of them.
          if (g.gmax < natural_gmax(group)) {
            const int64_t wider = int64_t(batch) * h.n_kv_heads * ((group + 2 * g.gmax - 1) / (2 * g.gmax)) * splits;
            EXPECT_LT(wider, sms / 2);
            if (g.gmax > 1) {
              EXPECT_GE(g.n_groups * splits, sms / 2);
            }
          }
          // attend_group's mapping of a CTA group to its heads: every (sequence, query head) once, no
          // CTA without a head.
          std::vector<int> seen(size_t(batch) * h.n_heads, 0);
          for (int64_t gi = 0; gi < g.n_groups; ++gi) {
            const int sub = static_cast<int>(gi % g.n_sub);
            const int64_t bk = gi / g.n_sub;
            const int kvh = static_cast<int>(bk % h.n_kv_heads), b = static_cast<int>(bk / h.n_kv_heads);
            const int g0 = sub * g.gmax, gc = std::min(g.gmax, g.group - g0);
            ASSERT_GE(gc, 1) << "CTA group " << gi << " holds no query head";
            ASSERT_LT(b, batch);
            for (int k = 0; k < gc; ++k) ++seen[size_t(b) * h.n_heads + kvh * g.group + g0 + k];
          }
          for (size_t i = 0; i < seen.size(); ++i) ASSERT_EQ(seen[i], 1) << "query head " << i % h.n_heads;
        }
      }
    }
  }
  EXPECT_GT(plans, 2000);
}

TEST(DecodePlan, SplitsCoverTheKeysOfEveryRow) {
  int64_t plans = 0, several = 0;
  for (int head_dim : kHeadDims) {
    for (const KernelOptions& options : option_sets(head_dim)) {
      const KernelOptionsScope scope(options);
      for (const Heads& h : kHeads) {
        for (int batch : kBatches) {
          for (int sms : {132, 78, 3}) {
            for (int L : kLengths) {
              const int s = plan_decode_splits(batch, h.n_heads, h.n_kv_heads, head_dim, L, sms);
              ++plans;
              several += s > 1;
              SCOPED_TRACE(testing::Message()
                           << "head_dim " << head_dim << " heads " << h.n_heads << "/" << h.n_kv_heads << " batch "
                           << batch << " L " << L << " SMs " << sms << " warps " << options.decode_warps << " path "
                           << decode_path_name(options.decode_path) << ": " << s << " splits");
              ASSERT_TRUE(std::find(std::begin(decode::kSplitCandidates), std::end(decode::kSplitCandidates), s) !=
                          std::end(decode::kSplitCandidates));
              ASSERT_LE(s, decode::kMaxSplits);
              const DecodeAttentionLaunch launch =
                  decode_attention_launch(batch, h.n_heads, h.n_kv_heads, head_dim, s, L, true, sms);
              const int kt = launch_tile_keys(launch, head_dim);
              ASSERT_TRUE(kt == 16 || kt == 32) << kt;
              // No split starts past the longest row's last tile.
              ASSERT_LE(s, (L + kt - 1) / kt);
              // attend_group's slices, for the longest row and shorter ones: consecutive, disjoint,
              // exactly the row's tiles (shorter rows may leave trailing splits empty).
              for (int len : {L, L - 1, L / 2, 1, 0}) {
                if (len < 0) continue;
                const int n_tiles = len > 0 ? (len + kt - 1) / kt : 0;
                const int per_split = (n_tiles + s - 1) / s;
                int next = 0;
                for (int split = 0; split < s; ++split) {
                  const int begin = split * per_split, end = std::min(n_tiles, begin + per_split);
                  if (begin >= end) continue;  // an empty slice: an empty partial
                  ASSERT_EQ(begin, next) << "row of " << len << " keys, split " << split;
                  next = end;
                }
                ASSERT_EQ(next, n_tiles) << "row of " << len << " keys";
              }
            }
          }
        }
      }
    }
  }
  EXPECT_GT(plans, 50000);
  EXPECT_GT(several, plans / 10);  // the grid exercises split plans, not only single splits
}

TEST(DecodePlan, SplitsFitTheWorkspaceAndCountersTheEngineSizes) {
  // As CudaEngine sizes them: for every batch up to max_batch, max_decode_splits at the model's
  // max_context, under the engine's kernel options; the counters for max_batch.
  for (int head_dim : {64, 128, 256}) {
    for (const KernelOptions& options : option_sets(head_dim)) {
      const KernelOptionsScope scope(options);
      for (const Heads& h : kHeads) {
        for (int sms : {132, 16}) {
          for (int max_context : {100, 2048, 8192, 32768}) {
            for (bool async : {false, true}) {
              const int max_batch = 24;
              size_t workspace = 0;
              for (int b = 1; b <= max_batch; ++b) {
                const int splits = max_decode_splits(b, h.n_heads, h.n_kv_heads, head_dim, max_context, sms);
                workspace = std::max(
                    workspace,
                    async ? decode_attention_async_workspace_bytes(b, h.n_heads, h.n_kv_heads, head_dim, splits)
                          : decode_attention_workspace_bytes(b, h.n_heads, head_dim, splits));
              }
              const int counters = decode_attention_async_counters(max_batch, h.n_heads, h.n_kv_heads);
              for (int b : {1, 2, 5, 17, 24}) {
                const int bound = max_decode_splits(b, h.n_heads, h.n_kv_heads, head_dim, max_context, sms);
                for (int L : {1, 17, max_context / 3, max_context / 2 + 1, max_context - 1, max_context}) {
                  // Every count the plan considers (not only the one it picks) is within the bound: at
                  // most one split per tile of the row, two waves of CTAs and 256.
                  const decode::SplitShape whole = decode::split_shape(b, h.n_heads, h.n_kv_heads, head_dim, L, sms);
                  const int considered = decode::max_splits_of(whole, L);
                  ASSERT_LE(considered, bound) << "L " << L;
                  ASSERT_LE(considered, std::max<int64_t>(1, (L + whole.tile_keys - 1) / whole.tile_keys));
                  ASSERT_LE(considered, std::max<int64_t>(1, std::min<int64_t>(256, 2 * whole.slots / whole.groups)));
                  const int s = plan_decode_splits(b, h.n_heads, h.n_kv_heads, head_dim, L, sms);
                  SCOPED_TRACE(testing::Message()
                               << "head_dim " << head_dim << " heads " << h.n_heads << "/" << h.n_kv_heads << " batch "
                               << b << " L " << L << " of " << max_context << " SMs " << sms << " warps "
                               << options.decode_warps << (async ? " async" : " sync"));
                  ASSERT_LE(s, bound);
                  const size_t need =
                      async ? decode_attention_async_workspace_bytes(b, h.n_heads, h.n_kv_heads, head_dim, s)
                            : decode_attention_workspace_bytes(b, h.n_heads, head_dim, s);
                  ASSERT_LE(need, workspace);
                  // The async mode may run the synchronized kernels on the same buffer.
                  ASSERT_GE(decode_attention_async_workspace_bytes(b, h.n_heads, h.n_kv_heads, head_dim, s),
                            decode_attention_workspace_bytes(b, h.n_heads, head_dim, s));
                  // The in-kernel reduction's semaphores: counters[2 + group] for every CTA group.
                  const decode::GroupPlan g = decode::plan_groups(b, h.n_heads, h.n_kv_heads, s, sms);
                  ASSERT_LE(2 + g.n_groups, counters);
                }
              }
            }
          }
        }
      }
    }
  }
}

TEST(DecodePlan, WorkspaceHoldsOnePartialPerSplitAndRow) {
  EXPECT_EQ(decode_attention_workspace_bytes(3, 32, 128, 1), 0u);
  EXPECT_EQ(decode_attention_workspace_bytes(3, 32, 128, 5), sizeof(float) * 3 * 32 * 5 * (128 + 2));
  EXPECT_EQ(decode_attention_async_workspace_bytes(3, 32, 8, 128, 1), 16u);  // never empty
  EXPECT_EQ(decode_attention_async_counters(3, 32, 8), 2 + 3 * 32);
  EXPECT_THROW(decode_attention_async_counters(0, 32, 8), Error);
  EXPECT_THROW(decode_attention_async_workspace_bytes(1, 32, 5, 128, 2), Error);
  try {
    decode_attention_launch(1, 32, 5, 128, 1, 0, false, 132);
    ADD_FAILURE() << "heads 32/5 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("heads 32/5"), std::string::npos) << e.what();
  }
}

TEST(DecodePlan, NoKeysOrNoMultiprocessorsPlanOneSplit) {
  for (int L : {0, -5}) {
    EXPECT_EQ(plan_decode_splits(4, 32, 8, 128, L, 132), 1);
    EXPECT_EQ(max_decode_splits(4, 32, 8, 128, L, 132), 1);
  }
  EXPECT_EQ(plan_decode_splits(4, 32, 8, 128, 4096, 0), 1);
  EXPECT_EQ(max_decode_splits(4, 32, 8, 128, 4096, 0), 1);
  // MHA at batch 64 fills 132 SMs many times over: no split. 32/8 heads at batch 1 are 8 CTA groups:
  // a long row is split.
  EXPECT_EQ(plan_decode_splits(64, 32, 32, 128, 512, 132), 1);
  EXPECT_GT(plan_decode_splits(1, 32, 8, 128, 16384, 132), 1);
}

TEST(DecodePlan, LoopChoiceFollowsTheOptionsAndTheHeadDim) {
  for (int head_dim : kHeadDims) {
    for (const KernelOptions& options : option_sets(head_dim)) {
      const KernelOptionsScope scope(options);
      for (const Heads& h : kHeads) {
        const int group = h.n_heads / h.n_kv_heads;
        for (int batch : kBatches) {
          for (int L : {0, 100, 512, 513, 2048, 2049, 65536}) {
            for (int gmax : {1, 2, 4, 8, 16}) {
              if (gmax > natural_gmax(group)) continue;
              const decode::LoopChoice c = decode::choose_loop(batch, h.n_heads, h.n_kv_heads, head_dim, gmax, L, 132);
              SCOPED_TRACE(testing::Message()
                           << "head_dim " << head_dim << " heads " << h.n_heads << "/" << h.n_kv_heads << " batch "
                           << batch << " L " << L << " gmax " << gmax << " options " << options.decode_warps << " "
                           << decode_path_name(options.decode_path));
              if (head_dim != 64 && head_dim != 128) {
                // Only the tensor-core loop exists there, with the head dim's own warps.
                ASSERT_TRUE(c.tensor_cores);
                ASSERT_EQ(c.warps, head_dim > 128 ? 4 : 8);
                continue;
              }
              ASSERT_TRUE(c.warps == 4 || c.warps == 8);
              if (options.decode_warps != 0) {
                ASSERT_EQ(c.warps, options.decode_warps);
              }
              if (options.decode_path == DecodePath::Mma) {
                ASSERT_TRUE(c.tensor_cores);
              }
              if (options.decode_path == DecodePath::Core) {
                ASSERT_FALSE(c.tensor_cores);
              }
              // Two or more query heads per CTA always run on tensor cores unless forced off.
              if (options.decode_path == DecodePath::Auto && gmax >= 2) {
                ASSERT_TRUE(c.tensor_cores);
              }
            }
          }
        }
      }
    }
  }
  KernelOptions bad;
  bad.decode_warps = 6;
  const KernelOptionsScope scope(bad);
  EXPECT_THROW(decode::choose_loop(1, 32, 8, 128, 4, 1024, 132), Error);
}

TEST(DecodePlan, LaunchCombinesEverySplitRowOnce) {
  for (AsyncCombine combine : {AsyncCombine::Auto, AsyncCombine::Kernel, AsyncCombine::Launch}) {
    KernelOptions options;
    options.async_combine = combine;
    const KernelOptionsScope scope(options);
    for (int head_dim : kHeadDims) {
      for (const Heads& h : kHeads) {
        for (int splits : {1, 2, 3, 4, 8, 48}) {
          for (int L : {0, 512, 8192, 8193, 65536}) {
            for (bool async : {false, true}) {
              CombineLaunch previous = CombineLaunch::FewRows;
              for (int batch : kBatches) {
                const DecodeAttentionLaunch c =
                    decode_attention_launch(batch, h.n_heads, h.n_kv_heads, head_dim, splits, L, async, 132);
                SCOPED_TRACE(testing::Message() << "head_dim " << head_dim << " heads " << h.n_heads << "/"
                                                << h.n_kv_heads << " batch " << batch << " splits " << splits << " L "
                                                << L << (async ? " async " : " sync ") << async_combine_name(combine));
                ASSERT_EQ(c.splits, splits);
                if (!async) {
                  ASSERT_FALSE(c.unified);
                }
                // The unified-max kernels only with several splits on tensor cores.
                if (c.unified) {
                  ASSERT_TRUE(async && splits > 1 && c.tensor_cores);
                }
                if (async && splits > 1 && c.tensor_cores) {
                  ASSERT_TRUE(c.unified);
                }
                if (c.combine_in_kernel) {
                  ASSERT_TRUE(c.unified);
                }
                if (c.unified && combine == AsyncCombine::Kernel) {
                  ASSERT_TRUE(c.combine_in_kernel);
                }
                if (combine == AsyncCombine::Launch) {
                  ASSERT_FALSE(c.combine_in_kernel);
                }
                // Exactly one combine for several splits: in the kernel or one launch; none for one.
                if (splits == 1) {
                  ASSERT_EQ(c.combine, CombineLaunch::None);
                  ASSERT_FALSE(c.combine_in_kernel);
                } else {
                  ASSERT_NE(c.combine == CombineLaunch::None, !c.combine_in_kernel);
                }
                // More rows never take a launch shape meant for fewer.
                if (c.combine != CombineLaunch::None) {
                  ASSERT_GE(static_cast<int>(c.combine), static_cast<int>(previous));
                  previous = c.combine;
                }
              }
            }
          }
        }
      }
    }
  }
}

template <int D, int GMAX, int W>
void expect_core_shape_fits() {
  using S = decode::CoreShape<D, GMAX, W>;
  EXPECT_EQ(S::kSmem % 16, 0u) << D << " " << GMAX << " " << W;
  EXPECT_LE(S::kSmem + decode::kFlagBytes, 227u * 1024) << D << " " << GMAX << " " << W;
  // The merge's o overlays the K/V stages: the larger of the two is reserved.
  EXPECT_GE(S::kSmem, S::kStageBytes) << D << " " << GMAX << " " << W;
  EXPECT_GE(S::kSmem, S::kOBytes) << D << " " << GMAX << " " << W;
}
template <int D, int W>
void expect_mma_shape_fits() {
  using S = decode::MmaShape<D, W>;
  EXPECT_EQ(S::kSmem % 16, 0u) << D << " " << W;
  EXPECT_LE(S::kSmem + decode::kFlagBytes, 227u * 1024) << D << " " << W;
  EXPECT_GE(S::kSmem, S::kStageBytes) << D << " " << W;
  EXPECT_GE(S::kSmem, S::kOBytes) << D << " " << W;
  EXPECT_EQ(decode::mma_tile_keys(D, W), S::kKeys);
  EXPECT_GE(decode::resident_ctas(W * 32, S::kSmem), 1);
}

TEST(DecodePlan, GraphRowsBucketEveryBatch) {
  for (int max_batch : {1, 7, 8, 9, 64, 250, 256, 512}) {
    std::vector<int> buckets;
    for (int b = 1; b <= max_batch; ++b) {
      const int rows = decode_graph_rows(b, max_batch);
      EXPECT_GE(rows, b);
      EXPECT_LE(rows, max_batch);
      EXPECT_LT(rows - b, 8) << b;
      if (b <= 8) EXPECT_EQ(rows, b);
      if (rows < max_batch && b > 8) EXPECT_EQ(rows % 8, 0) << b;
      if (buckets.empty() || buckets.back() != rows) buckets.push_back(rows);
    }
    // Every batch up to max_batch shares one of at most 8 + max_batch / 8 + 1 graphs.
    EXPECT_LE(static_cast<int>(buckets.size()), 8 + max_batch / 8 + 1) << max_batch;
  }
  EXPECT_THROW(decode_graph_rows(0, 8), Error);
  EXPECT_THROW(decode_graph_rows(9, 8), Error);
}

TEST(DecodePlan, SharedMemoryShapesFitAnSm) {
  expect_core_shape_fits<64, 1, 4>();
  expect_core_shape_fits<64, 16, 4>();
  expect_core_shape_fits<64, 16, 8>();
  expect_core_shape_fits<128, 1, 8>();
  expect_core_shape_fits<128, 8, 4>();
  expect_core_shape_fits<128, 16, 4>();
  expect_core_shape_fits<128, 16, 8>();
  expect_mma_shape_fits<64, 4>();
  expect_mma_shape_fits<64, 8>();
  expect_mma_shape_fits<80, 8>();
  expect_mma_shape_fits<96, 8>();
  expect_mma_shape_fits<128, 4>();
  expect_mma_shape_fits<128, 8>();
  expect_mma_shape_fits<256, 4>();
  for (int head_dim : kHeadDims) {
    for (int sms : kMultiprocessors) {
      // Smaller CTAs fit at least as many per SM (max_decode_splits counts on it).
      EXPECT_GE(decode::resident_slots(head_dim, 4, sms), decode::resident_slots(head_dim, 8, sms)) << head_dim;
      EXPECT_GE(decode::resident_slots(head_dim, 8, sms), sms) << head_dim;
    }
  }
}

}  // namespace
}  // namespace fdpp::cuda
