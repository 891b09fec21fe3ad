// The mixture-of-experts kernels (src/backend/cuda/moe.h) against the CPU reference
// (cpu::route_experts, then each pick's expert as fp32 products of the same 16-bit inputs): the
// routing pick for pick, and whole layers whose router logits are built so that the experts get
// chosen counts of tokens: 0 (an idle expert), 1, 7, 8, 9 and 300 (around the 8-row tile and the
// 64-row tensor-core block), all tokens to one expert, and exact ties. Every layer runs through both
// expert kernels (CUDA cores and tensor cores, KernelOptions::moe_path) and the automatic choice.
// fp16 and bf16; outputs poisoned before each launch.
#include <algorithm>
#include <memory>
#include <numeric>
#include <random>
#include <tuple>

#include "backend/cpu/ops.h"
#include "backend/cuda/kernel_options.h"
#include "backend/cuda/linear_dispatch.h"
#include "backend/cuda/moe.h"
#include "gpu/gpu_test_util.h"

namespace fdpp::test {
namespace {

constexpr DType kTypes[] = {DType::F16, DType::BF16};

// The routing buffers of moe.h for steps of up to max_tokens.
struct Routing {
  cuda::MoeRoutingSizes sizes;
  DeviceBuffer<int32_t> pick_expert, pick_row, row_token, tile_expert, block_tile;
  DeviceBuffer<float> pick_weight;
  cuda::MoeRouting r;

  Routing(int max_tokens, int k, int experts)
      : sizes(cuda::moe_routing_sizes(max_tokens, k, experts)),
        pick_expert(sizes.picks),
        pick_row(sizes.picks),
        row_token(sizes.rows),
        tile_expert(sizes.tiles),
        block_tile(sizes.blocks),
        pick_weight(sizes.picks) {
    for (auto* b : {&pick_expert, &pick_row, &row_token, &tile_expert, &block_tile}) b->poison();
    pick_weight.poison();
    r = {pick_expert.get(), pick_weight.get(), pick_row.get(), row_token.get(), tile_expert.get(), block_tile.get()};
  }
};

TEST_F(CudaKernels, MoeRouteMatchesTheCpuPicks) {
  for (int experts : {4, 8, 64, 128, 200, 300}) {  // 4, 8 and 32 probability slots a lane
    for (int k : {1, 2, 8}) {
      if (k > experts) continue;
      for (bool normalize : {false, true}) {
        const int n = 37;
        std::vector<float> logits = random_vector(static_cast<size_t>(n) * experts, 2.f);
        // Token 0: every logit equal (ties everywhere); token 1: a tie for the last pick.
        std::fill(logits.begin(), logits.begin() + experts, 0.5f);
        for (int e = 0; e < experts; ++e) logits[experts + e] = e < k + 1 ? 3.f : -1.f;
        std::vector<int32_t> ref_e(static_cast<size_t>(n) * k);
        std::vector<float> ref_w(ref_e.size());
        cpu::route_experts(logits.data(), n, experts, k, normalize, ref_e.data(), ref_w.data());
        DeviceBuffer<float> d_logits(logits);
        Routing rt(n, k, experts);
        cuda::moe_route(d_logits.get(), n, experts, k, normalize, rt.r, nullptr);
        sync("moe_route");
        const std::string what =
            "moe_route E=" + std::to_string(experts) + " k=" + std::to_string(k) + (normalize ? " normalized" : "");
        EXPECT_EQ(rt.pick_expert.download(), ref_e) << what;
        const auto w = rt.pick_weight.download();
        for (size_t i = 0; i < w.size(); ++i) ASSERT_NEAR(w[i], ref_w[i], 1e-5f * std::max(1.f, ref_w[i])) << what;
        // The ties went to the lowest experts, in order.
        for (int j = 0; j < k; ++j) EXPECT_EQ(rt.pick_expert.download()[j], j) << what;
      }
    }
  }
}

// Router logits that make token t pick exactly the experts of picks[t] (best first).
std::vector<float> logits_for(const std::vector<std::vector<int>>& picks, int experts) {
  std::vector<float> l(picks.size() * experts);
  std::uniform_real_distribution<float> low(-1.f, 0.f);
  for (size_t t = 0; t < picks.size(); ++t) {
    for (int e = 0; e < experts; ++e) l[t * experts + e] = low(rng());
    // Above every other logit (which are at most 0), falling by 0.5 a pick.
    const size_t k = picks[t].size();
    for (size_t j = 0; j < k; ++j) l[t * experts + picks[t][j]] = 1.f + 0.5f * float(k - j);
  }
  return l;
}

// A whole expert layer for these picks: GPU kernels against the fp32 reference.
void check_layer(const std::vector<std::vector<int>>& picks, int experts, int H, int FE, bool normalize, DType t,
                 const std::string& what_layer) {
  const std::string& what = what_layer;
  const int n = static_cast<int>(picks.size()), k = static_cast<int>(picks[0].size());
  const int max_tokens = n + 3;  // buffers sized for a larger step, as a captured graph's are
  const std::vector<float> logits = logits_for(picks, experts);
  std::vector<float> x, wg, wu, wd;
  const auto bx = random_bits(size_t(n) * H, t, x);
  const auto bg = random_bits(size_t(experts) * FE * H, t, wg, 0.2f);
  const auto bu = random_bits(size_t(experts) * FE * H, t, wu, 0.2f);
  const auto bd = random_bits(size_t(experts) * H * FE, t, wd, 0.2f);

  // Reference: every pick's expert in fp32 from the same rounded values.
  std::vector<int32_t> re(size_t(n) * k);
  std::vector<float> rw(re.size());
  cpu::route_experts(logits.data(), n, experts, k, normalize, re.data(), rw.data());
  for (int tok = 0; tok < n; ++tok)
    for (int j = 0; j < k; ++j) ASSERT_EQ(re[size_t(tok) * k + j], picks[tok][j]) << what << ": logits_for is wrong";
  std::vector<float> ref(size_t(n) * H, 0.f), g(FE), u(FE), y(H);
  for (int tok = 0; tok < n; ++tok)
    for (int j = 0; j < k; ++j) {
      const int e = re[size_t(tok) * k + j];
      cpu::linear(&x[size_t(tok) * H], 1, H, &wg[size_t(e) * FE * H], FE, nullptr, g.data());
      cpu::linear(&x[size_t(tok) * H], 1, H, &wu[size_t(e) * FE * H], FE, nullptr, u.data());
      cpu::silu_mul(g.data(), u.data(), FE, u.data());
      cpu::linear(u.data(), 1, FE, &wd[size_t(e) * H * FE], H, nullptr, y.data());
      for (int i = 0; i < H; ++i) ref[size_t(tok) * H + i] += rw[size_t(tok) * k + j] * y[i];
    }

  DeviceBuffer<float> d_logits(logits);
  DeviceBuffer<uint16_t> d_x(bx), d_g(bg), d_u(bu), d_d(bd);
  for (cuda::MoePath path : {cuda::MoePath::Core, cuda::MoePath::Mma, cuda::MoePath::Auto}) {
    cuda::KernelOptions options;
    options.moe_path = path;
    const cuda::KernelOptionsScope scope(options);
    const std::string what = what_layer + " " + cuda::moe_path_name(path);
    Routing rt(max_tokens, k, experts);
    DeviceBuffer<uint16_t> act(size_t(rt.sizes.rows) * FE), down(size_t(rt.sizes.rows) * H), out(size_t(n) * H);
    act.poison();
    down.poison();
    out.poison();
    cuda::moe_route(d_logits.get(), n, experts, k, normalize, rt.r, nullptr);
    cuda::moe_align(n, k, experts, rt.r, nullptr);
    cuda::moe_grouped_swiglu(d_x.get(), d_g.get(), d_u.get(), act.get(), H, FE, experts, n, k, rt.r, t, nullptr);
    cuda::moe_down_combine(act.get(), d_d.get(), down.get(), out.get(), FE, H, experts, n, k, rt.r, t, nullptr);
    sync("moe layer " + what);

    // The tile schedule: each expert's picks in whole tiles of its own, nothing else.
    std::vector<int> count(experts, 0);
    for (const auto& p : picks)
      for (int e : p) ++count[e];
    auto tiles = rt.tile_expert.download();
    tiles.resize(cuda::moe_routing_sizes(n, k, experts).tiles);  // the step's tiles; the rest are not its
    for (int e = 0; e < experts; ++e)
      EXPECT_EQ(std::count(tiles.begin(), tiles.end(), e), (count[e] + cuda::kMoeTileRows - 1) / cuda::kMoeTileRows)
          << what << " expert " << e;
    // The buffers hold max_tokens' picks; the step's are the first n * k.
    auto rows = rt.pick_row.download();
    rows.resize(size_t(n) * k);
    const auto row_token = rt.row_token.download();
    std::vector<int32_t> sorted_rows(rows.begin(), rows.end());
    std::sort(sorted_rows.begin(), sorted_rows.end());
    EXPECT_TRUE(std::adjacent_find(sorted_rows.begin(), sorted_rows.end()) == sorted_rows.end()) << what;
    for (size_t p = 0; p < rows.size(); ++p) {
      EXPECT_EQ(row_token[rows[p]], static_cast<int32_t>(p / k)) << what;
      EXPECT_EQ(tiles[rows[p] / cuda::kMoeTileRows], re[p]) << what;
    }
    // The tensor-core blocks: each expert's tiles in runs of kMoeBlockTiles from its first tile, every
    // tile of the step in exactly one block of its own expert; the rest of the step's blocks -1.
    auto blocks = rt.block_tile.download();
    blocks.resize(cuda::moe_routing_sizes(n, k, experts).blocks);
    std::vector<int> covered(tiles.size(), 0);
    int64_t expected_blocks = 0;
    for (int e = 0; e < experts; ++e)
      expected_blocks +=
          ((count[e] + cuda::kMoeTileRows - 1) / cuda::kMoeTileRows + cuda::kMoeBlockTiles - 1) / cuda::kMoeBlockTiles;
    for (size_t b = 0; b < blocks.size(); ++b) {
      if (static_cast<int64_t>(b) >= expected_blocks) {
        EXPECT_EQ(blocks[b], -1) << what << " block " << b;
        continue;
      }
      ASSERT_GE(blocks[b], 0) << what << " block " << b;
      ASSERT_LT(blocks[b], static_cast<int32_t>(tiles.size())) << what << " block " << b;
      const int e = tiles[blocks[b]];
      EXPECT_TRUE(blocks[b] == 0 || tiles[blocks[b] - 1] != e ||
                  (blocks[b] >= cuda::kMoeBlockTiles && tiles[blocks[b] - cuda::kMoeBlockTiles] == e))
          << what << ": block " << b << " does not start a run of its expert";
      for (int j = 0;
           j < cuda::kMoeBlockTiles && blocks[b] + j < static_cast<int32_t>(tiles.size()) && tiles[blocks[b] + j] == e;
           ++j)
        ++covered[blocks[b] + j];
    }
    for (size_t i = 0; i < tiles.size(); ++i) EXPECT_EQ(covered[i], tiles[i] >= 0 ? 1 : 0) << what << " tile " << i;

    expect_close(from_bits(out.download(), t), ref, Tolerance{5e-4}, "moe_layer " + what);
  }
}

TEST_F(CudaKernels, MoeLayerMatchesTheCpuForEveryTokenCount) {
  // Expert e gets counts[e] tokens as first pick; the second pick cycles over the others.
  const std::vector<int> counts{0, 1, 7, 8, 9, 300, 0, 2};
  const int experts = static_cast<int>(counts.size());
  for (DType t : kTypes) {
    for (int k : {1, 2}) {
      std::vector<std::vector<int>> picks;
      for (int e = 0; e < experts; ++e)
        for (int c = 0; c < counts[e]; ++c) {
          std::vector<int> p{e};
          if (k == 2) p.push_back((e + 1 + c % (experts - 1)) % experts);
          picks.push_back(p);
        }
      std::shuffle(picks.begin(), picks.end(), rng());
      for (bool normalize : {true, false})
        check_layer(picks, experts, 64, 48, normalize, t,
                    std::string(name(t)) + " k=" + std::to_string(k) + (normalize ? " normalized" : ""));
    }
  }
}

TEST_F(CudaKernels, MoeLayerAllTokensToOneExpertAndOddWidths) {
  for (DType t : kTypes) {
    // Every token to expert 5 (one expert's tiles only), hidden and expert widths off the 8-element
    // vector path.
    std::vector<std::vector<int>> one(37, std::vector<int>{5});
    check_layer(one, 6, 60, 36, true, t, std::string(name(t)) + " all to one, scalar path");
    // Qwen3-MoE's shape of routing, scaled down: 64 experts, 8 per token, decode-sized batches.
    for (int n : {1, 3, 16}) {
      std::vector<std::vector<int>> picks(n);
      for (auto& p : picks) {
        std::vector<int> all(64);
        std::iota(all.begin(), all.end(), 0);
        std::shuffle(all.begin(), all.end(), rng());
        p.assign(all.begin(), all.begin() + 8);
      }
      check_layer(picks, 64, 64, 32, true, t, std::string(name(t)) + " 64 experts top 8, n=" + std::to_string(n));
    }
    // One token with more picks than the fused one-token down kernel takes in one pass (8).
    std::vector<std::vector<int>> ten(1);
    for (int e = 15; e >= 6; --e) ten[0].push_back(e);
    check_layer(ten, 16, 64, 40, false, t, std::string(name(t)) + " one token, top 10 of 16");
    // One token with long rows: gate/up rows 2,056 wide (past the 256 16-byte chunks a warp loads in
    // one pass), down rows 800 and 3,080 wide (several chunks a lane, 8 picks and 2).
    auto one_token = [](int experts, int k) {
      std::vector<int> all(experts);
      std::iota(all.begin(), all.end(), 0);
      std::shuffle(all.begin(), all.end(), rng());
      return std::vector<std::vector<int>>{std::vector<int>(all.begin(), all.begin() + k)};
    };
    check_layer(one_token(10, 8), 10, 2056, 40, true, t, std::string(name(t)) + " one token, H 2056");
    check_layer(one_token(10, 8), 10, 64, 800, true, t, std::string(name(t)) + " one token, FE 800");
    check_layer(one_token(4, 2), 4, 64, 3080, false, t, std::string(name(t)) + " one token top 2, FE 3080");
  }
}

// moe_route_one: the router product and the routing of one token in one launch. Its logits against
// the CPU's product of the same 16-bit values, and its routing against moe_route's from those
// logits, buffer for buffer; each case launches twice (the CTA counter must be back at zero).
TEST_F(CudaKernels, MoeRouteOneMatchesRouterThenRoute) {
  DeviceBuffer<uint32_t> arrivals(std::vector<uint32_t>{0u});
  for (DType t : kTypes) {
    for (const auto [experts, H, k] : {std::tuple{8, 4096, 2}, std::tuple{128, 2048, 8}, std::tuple{60, 2056, 4},
                                        std::tuple{1000, 64, 32}, std::tuple{3, 8, 1}}) {
      for (bool normalize : {false, true}) {
        const std::string what = std::string(name(t)) + " E=" + std::to_string(experts) + " H=" + std::to_string(H) +
                                 " k=" + std::to_string(k) + (normalize ? " normalized" : "");
        std::vector<float> x, w;
        const auto bx = random_bits(size_t(H), t, x);
        const auto bw = random_bits(size_t(experts) * H, t, w, 0.2f);
        std::vector<float> ref(experts);
        cpu::linear(x.data(), 1, H, w.data(), experts, nullptr, ref.data());
        DeviceBuffer<uint16_t> d_x(bx), d_w(bw);
        ASSERT_TRUE(cuda::moe_route_one_fits(d_x.get(), d_w.get(), H)) << what;
        for (int launch = 0; launch < 2; ++launch) {
          DeviceBuffer<float> logits(static_cast<size_t>(experts));
          logits.poison();
          Routing fused(1, k, experts), plain(1, k, experts);
          cuda::moe_route_one(d_x.get(), d_w.get(), logits.get(), arrivals.get(), H, experts, k, normalize, fused.r, t,
                              nullptr);
          sync("moe_route_one " + what);
          expect_close(logits.download(), ref, Tolerance{1e-5}, "moe_route_one logits " + what);
          cuda::moe_route(logits.get(), 1, experts, k, normalize, plain.r, nullptr);
          sync("moe_route " + what);
          EXPECT_EQ(arrivals.download()[0], 0u) << what;
          EXPECT_EQ(fused.pick_expert.download(), plain.pick_expert.download()) << what;
          EXPECT_EQ(fused.pick_weight.download(), plain.pick_weight.download()) << what;
          EXPECT_EQ(fused.pick_row.download(), plain.pick_row.download()) << what;
          EXPECT_EQ(fused.row_token.download(), plain.row_token.download()) << what;
          EXPECT_EQ(fused.tile_expert.download(), plain.tile_expert.download()) << what;
          EXPECT_EQ(fused.block_tile.download(), plain.block_tile.download()) << what;
        }
      }
    }
  }
}

// FDPP_GPU_BENCH=1: one expert layer, from the router's logits to the combined output, of
// Qwen3-30B-A3B and Mixtral 8x7B in bf16 at several token counts: fdpp's kernels (the automatic
// choice) against the second peer, the dense path called once per chosen expert
// (LinearDispatcher::run with gate and up fused by the SwiGLU epilogue, then down, then
// moe_combine). The peer gets its routing and its tokens' rows sorted by expert for free (made on
// the host before timing), so its times are a lower bound on a real per-expert loop, which would
// also wait for the routing on the host. Eight routings take turns, so that the experts read
// change from run to run as they do from layer to layer.
TEST_F(CudaKernels, BenchMoeLayer) {
  if (!bench::enabled()) GTEST_SKIP() << "set FDPP_GPU_BENCH=1";
  struct Shape {
    const char* name;
    int E, k, H, FE;
    bool normalize;
  };
  const Shape shapes[] = {{"qwen3-30b-a3b", 128, 8, 2048, 768, true}, {"mixtral-8x7b", 8, 2, 4096, 14336, false}};
  const DType t = DType::BF16;
  constexpr int kRoutings = 8;
  auto fill = [](DeviceBuffer<uint16_t>& b) { cuda_ok(cudaMemset(b.get(), 0x3c, b.size() * 2), "cudaMemset"); };
  for (const Shape& s : shapes) {
    const size_t per_matrix = size_t(s.E) * s.FE * s.H;
    DeviceBuffer<uint16_t> gate(per_matrix), up(per_matrix), down(per_matrix), gate_up(2 * per_matrix);
    for (auto* b : {&gate, &up, &down, &gate_up}) fill(*b);
    cuda::LinearDispatcher dispatcher(t);
    for (int n : {1, 8, 64, 256}) {
      const int picks = n * s.k;
      DeviceBuffer<uint16_t> x(size_t(n) * s.H);
      fill(x);
      const cuda::MoeRoutingSizes sizes = cuda::moe_routing_sizes(n, s.k, s.E);
      DeviceBuffer<uint16_t> act(size_t(sizes.rows) * s.FE), dn(size_t(sizes.rows) * s.H), out(size_t(n) * s.H);
      DeviceBuffer<uint16_t> peer_x(size_t(picks) * s.H), peer_act(size_t(picks) * s.FE),
          peer_dn(size_t(picks) * s.H), peer_out(size_t(n) * s.H);
      fill(peer_x);
      struct Run {
        int expert, first, count;
      };
      std::vector<DeviceBuffer<float>> logits;
      std::vector<std::unique_ptr<Routing>> ours, peer;
      std::vector<std::vector<Run>> runs(kRoutings);
      double touched = 0;
      for (int i = 0; i < kRoutings; ++i) {
        const std::vector<float> l = random_vector(size_t(n) * s.E, 2.f);
        logits.emplace_back(l);
        ours.push_back(std::make_unique<Routing>(n, s.k, s.E));
        std::vector<int32_t> e(picks);
        std::vector<float> w(picks);
        cpu::route_experts(l.data(), n, s.E, s.k, s.normalize, e.data(), w.data());
        // The peer's rows: the picks sorted by expert, one run of rows per chosen expert.
        std::vector<int32_t> order(picks), row(picks);
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return e[a] < e[b]; });
        for (int r = 0; r < picks; ++r) {
          row[order[r]] = r;
          if (r == 0 || e[order[r]] != e[order[r - 1]]) runs[i].push_back({e[order[r]], r, 0});
          ++runs[i].back().count;
        }
        touched += double(runs[i].size()) * 3 * s.FE * s.H * 2 / kRoutings;
        peer.push_back(std::make_unique<Routing>(n, s.k, s.E));
        peer.back()->pick_row.upload(row);
        peer.back()->pick_weight.upload(w);
      }
      const double fdpp_us = bench::median_us(30, [&](int i) {
        const cuda::MoeRouting& r = ours[i % kRoutings]->r;
        cuda::moe_route(logits[i % kRoutings].get(), n, s.E, s.k, s.normalize, r, nullptr);
        cuda::moe_align(n, s.k, s.E, r, nullptr);
        cuda::moe_grouped_swiglu(x.get(), gate.get(), up.get(), act.get(), s.H, s.FE, s.E, n, s.k, r, t, nullptr);
        cuda::moe_down_combine(act.get(), down.get(), dn.get(), out.get(), s.FE, s.H, s.E, n, s.k, r, t, nullptr);
      });
      size_t calls = 0;
      const double peer_us = bench::median_us(30, [&](int i) {
        for (const Run& run : runs[i % kRoutings]) {
          dispatcher.run(peer_x.get() + size_t(run.first) * s.H, gate_up.get() + size_t(run.expert) * 2 * s.FE * s.H,
                         nullptr, peer_act.get() + size_t(run.first) * s.FE, run.count, 2 * s.FE, s.H, t,
                         cuda::Epilogue::SwiGLU, nullptr);
          dispatcher.run(peer_act.get() + size_t(run.first) * s.FE, down.get() + size_t(run.expert) * s.H * s.FE,
                         nullptr, peer_dn.get() + size_t(run.first) * s.H, run.count, s.H, s.FE, t,
                         cuda::Epilogue::Store, nullptr);
        }
        cuda::moe_combine(peer_dn.get(), n, s.k, s.H, peer[i % kRoutings]->r, peer_out.get(), t, nullptr);
        calls = 2 * runs[i % kRoutings].size() + 1;
      });
      std::printf("[perf] moe_layer %s bf16 tokens %d: fdpp %.1f us (%.1f%% of 4.46 TB/s), dense per expert %.1f us "
                  "(%zu launches), %.1f MB of experts read, fdpp %.2fx\n",
                  s.name, n, fdpp_us, 100 * touched / (fdpp_us * 1e-6) / bench::kReadBandwidth, peer_us, calls,
                  touched / 1e6, peer_us / fdpp_us);
    }
  }
}

}  // namespace
}  // namespace fdpp::test
