// fdpp bench-attention: decode attention kernels alone (issue 5's benchmark): the asynchronized
// softmax with a unified max and the synchronized split-KV kernel on the same paged KV cache, over
// a grid of batch sizes and context lengths, CUDA-graph timed, each with its % of 4.46 TB/s.
//
// Bytes a call must read: K and V of every key of every sequence (B x L x KVH x D x 2 x 2 bytes)
// plus q; the time is the median over graph replays of R back-to-back calls. Consecutive calls read
// different parts of a pool larger than twice the 60 MB L2 (their block tables point at disjoint
// blocks), so no call is served from L2 by its predecessor. The peers (torch SDPA, cuDNN and
// FlashAttention backends) run the same shapes in bench/peers/peers.py --attention.
// --decode-path mma|core (else FDPP_DECODE_PATH) forces the tensor-core or the CUDA-core loop (the
// "path" field); --pdl on|off (else FDPP_PDL) the programmatic launch of the calls.
// --decode-warps 0|4|8 (else FDPP_DECODE_WARPS; "decode_warps") the warps per CTA at head dims 64
// and 128 (the split plan follows), --async-combine auto|kernel|launch (else FDPP_ASYNC_COMBINE;
// "async_combine") where async adds the splits' partials, --kv-layout head-major|token-major (else
// FDPP_KV_LAYOUT; "kv_layout") the KV cache's layout, --kv-cache-dtype auto|fp8 ("kv_cache_dtype") its
// element type (fp8: e4m3 bytes, half the bytes a call reads).
#include "bench_attention.h"

#include "subcommands.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <numeric>
#include <random>
#include <string>

#include "backend/cuda/check.h"
#include "backend/cuda/device_model.h"
#include "backend/cuda/device_query.h"
#include "backend/cuda/graph_timer.h"
#include "backend/cuda/kernels.h"
#include "attention/unified_max.h"
#include "fdpp/error.h"

namespace fdpp {

namespace {

constexpr double kDesignReadBandwidth = 4.46e12;  // DESIGN.md: read-only streaming kernel on the H200
constexpr double kL2Bytes = 60e6;
constexpr int kPrefillBlock = 16;

}  // namespace

namespace {
// The GPUs to measure on, after the checks both benchmarks make of their arguments.
std::vector<cuda::GpuInfo> checked_gpus(const BenchAttentionArgs& a) {
  std::string why;
  auto gpus = cuda::list_gpus(&why);
  check(!gpus.empty(), "fdpp bench-attention measures CUDA kernels: no usable GPU ({})", why);
  check(a.heads > 0 && a.kv_heads > 0 && a.heads % a.kv_heads == 0, "--heads {} must be a multiple of --kv-heads {}",
        a.heads, a.kv_heads);
  check(a.head_dim == 64 || a.head_dim == 80 || a.head_dim == 96 || a.head_dim == 128 || a.head_dim == 256,
        "--head-dim {} is not one of 64, 80, 96, 128, 256", a.head_dim);
  check(a.dtype == "f16" || a.dtype == "bf16", "--dtype '{}' is not one of f16, bf16", a.dtype);
  check(a.kv_cache_dtype == "auto" || a.kv_cache_dtype == "fp8", "--kv-cache-dtype '{}' is not one of auto, fp8",
        a.kv_cache_dtype);
  return gpus;
}

cuda::KvQuant kv_quant_of(const BenchAttentionArgs& a) {
  cuda::KvQuant q;
  if (a.kv_cache_dtype == "fp8") q.dtype = cuda::KvDType::Fp8E4M3;
  return q;
}

// Fills a paged K/V pool of `tokens` slots with values uniform in [-1, 1) (like activations after a
// norm): 16-bit ones directly, an e4m3 pool through the cache writer (random bytes would hold the NaN
// codes 0x7F and 0xFF), quantized as the engine's are. The calling thread's layout applies.
void fill_kv_pool(void* k, void* v, int64_t tokens, int kv_heads, int head_dim, int block_size, cuda::DType dtype,
                  const cuda::KvQuant& quant, uint64_t seed, cudaStream_t stream) {
  if (quant.dtype == cuda::KvDType::Model) {
    const int64_t elems = tokens * kv_heads * head_dim;
    cuda::fill_random(k, elems, dtype, 1.f, 0.f, seed, stream);
    cuda::fill_random(v, elems, dtype, 1.f, 0.f, seed + 1, stream);
    return;
  }
  const int64_t row = int64_t(1 + 2 * kv_heads) * head_dim;  // one q head (not read), then the k and v heads
  const int64_t chunk = std::clamp<int64_t>((int64_t{64} << 20) / (row * 2), 1, tokens);  // 64 MiB of rows
  cuda::DeviceBuffer qkv(chunk * row * 2), slots(chunk * sizeof(int32_t));
  std::vector<int32_t> ids(static_cast<size_t>(chunk));
  for (int64_t first = 0; first < tokens; first += chunk) {
    const int n = static_cast<int>(std::min(chunk, tokens - first));
    cuda::fill_random(qkv.get(), n * row, dtype, 1.f, 0.f, seed + 2 + static_cast<uint64_t>(first / chunk), stream);
    std::iota(ids.begin(), ids.begin() + n, static_cast<int32_t>(first));
    // Pageable source: the call returns once `ids` is staged, so the next chunk may refill it.
    FDPP_CUDA_CHECK(cudaMemcpyAsync(slots.get(), ids.data(), n * sizeof(int32_t), cudaMemcpyHostToDevice, stream));
    cuda::kv_cache_write(qkv.get(), slots.as<int32_t>(), n, 1, kv_heads, head_dim, block_size, k, v, dtype, stream,
                         quant);
  }
  FDPP_CUDA_CHECK(cudaStreamSynchronize(stream));
}
}  // namespace

int run_bench_attention(const BenchAttentionArgs& a) {
  const auto gpus = checked_gpus(a);
  check(a.block_size >= 1 && (a.block_size & (a.block_size - 1)) == 0, "--block-size {} is not a power of two",
        a.block_size);
  check(a.block_order == "shuffled" || a.block_order == "sequential", "--block-order '{}' is not shuffled or sequential",
        a.block_order);
  const int block = a.block_size;
  const cuda::KernelOptions kernels = resolve_kernel_options(a.kernels);
  const char* kv_layout = kernels.kv_head_major ? "head-major" : "token-major";
  const cuda::KernelOptionsScope kernel_scope(kernels);  // the kernels are called here, not by an engine
  check(!a.batches.empty() && !a.contexts.empty(), "bench-attention: give batch sizes and context lengths");
  for (const auto& m : a.modes) check(m == "async" || m == "sync", "--modes: '{}' is not one of async, sync", m);
  check(!a.splits.empty(), "bench-attention: give --splits (0: the plan)");
  for (int s : a.splits) check(s >= 0 && s <= 1024, "--splits: {} is not 0 (the plan) or a count in [1, 1024]", s);
  const cuda::DType dtype = a.dtype == "bf16" ? cuda::DType::BF16 : cuda::DType::F16;
  const int H = a.heads, KVH = a.kv_heads, D = a.head_dim;
  const cuda::KvQuant kv_quant = kv_quant_of(a);
  const size_t kv_elem = cuda::kv_element_bytes(kv_quant.dtype);
  const double token_bytes = 2.0 * KVH * D * kv_elem;  // K and V of one position, all kv heads

  // One pool for every point: the largest B x L, and at least 3 x L2 so that calls can rotate.
  int64_t max_tokens = 0;
  for (int b : a.batches)
    for (int l : a.contexts) max_tokens = std::max<int64_t>(max_tokens, int64_t(b) * ((l + block - 1) / block) * block);
  const int64_t pool_tokens = std::max<int64_t>(max_tokens, static_cast<int64_t>(std::ceil(3 * kL2Bytes / token_bytes)));
  const int64_t pool_blocks = (pool_tokens + block - 1) / block;
  size_t free_b = 0, total_b = 0;
  FDPP_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  const double need = 2.0 * pool_blocks * block * KVH * D * kv_elem;
  check(need < 0.9 * free_b, "bench-attention: the KV pool needs {:.1f} GiB, {:.1f} GiB are free", need / 1073741824.0,
        free_b / 1073741824.0);
  cudaStream_t stream = nullptr;
  FDPP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const int64_t pool_elems = pool_blocks * block * KVH * D;
  cuda::DeviceBuffer k(pool_elems * kv_elem), v(pool_elems * kv_elem);
  // Keys and values uniform in [-1, 1) like activations after a norm; q likewise: logits stay
  // within a few units, the regime of real models (no fallback rows).
  fill_kv_pool(k.get(), v.get(), pool_blocks * block, KVH, D, block, dtype, kv_quant, 11, stream);
  const int max_b = *std::max_element(a.batches.begin(), a.batches.end());
  const int64_t qkv_elems = int64_t(max_b) * (H + 2 * KVH) * D;
  cuda::DeviceBuffer qkv(qkv_elems * 2), out(int64_t(max_b) * H * D * 2);
  cuda::fill_random(qkv.get(), qkv_elems, dtype, 1.f, 0.f, 13, stream);
  cuda::DeviceBuffer fallback(sizeof(unsigned long long));
  FDPP_CUDA_CHECK(cudaMemsetAsync(fallback.get(), 0, sizeof(unsigned long long), stream));
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  const UnifiedMaxBounds bounds = default_unified_max_bounds(131072);
  const cuda::UnifiedMaxRange range{bounds.phi, bounds.a, bounds.b};
  std::mt19937 rng(5);

  nlohmann::json results = nlohmann::json::array();
  for (int B : a.batches) {
    for (int L : a.contexts) {
      const int blocks_per_seq = (L + block - 1) / block;
      const int64_t call_blocks = int64_t(B) * blocks_per_seq;
      const double bytes = double(B) * L * token_bytes + double(B) * H * D * 2 * 2;  // + q read, out written
      // Rotations: enough disjoint block sets that R consecutive calls cover > 2 x L2.
      const int rotations = static_cast<int>(std::clamp<int64_t>(
          static_cast<int64_t>(std::ceil(2 * kL2Bytes / (call_blocks * block * token_bytes))), 1,
          pool_blocks / call_blocks));
      std::vector<int32_t> perm(static_cast<size_t>(call_blocks) * rotations);
      std::iota(perm.begin(), perm.end(), 0);
      // Shuffled: the blocks of a rotation in random order (a paged cache is not contiguous once it
      // has served a while). Sequential: each sequence's blocks consecutive.
      if (a.block_order == "shuffled")
        for (int r = 0; r < rotations; ++r)
          std::shuffle(perm.begin() + int64_t(r) * call_blocks, perm.begin() + int64_t(r + 1) * call_blocks, rng);
      cuda::DeviceBuffer tables(perm.size() * sizeof(int32_t));
      FDPP_CUDA_CHECK(cudaMemcpy(tables.get(), perm.data(), perm.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
      std::vector<int32_t> lens_h(B, L);
      cuda::DeviceBuffer lens(B * sizeof(int32_t));
      FDPP_CUDA_CHECK(cudaMemcpy(lens.get(), lens_h.data(), B * sizeof(int32_t), cudaMemcpyHostToDevice));
      const int reps = static_cast<int>(std::clamp(2e-3 / (bytes / kDesignReadBandwidth), 4.0, 50.0));
      // (Both modes plan alike.)
      const int planned_splits = cuda::plan_decode_splits(B, H, KVH, D, L, gpus[0].multiprocessors);
      for (const int split_choice : a.splits)
      for (const auto& mode : a.modes) {
        const bool async = mode == "async";
        const int splits = split_choice == 0 ? planned_splits : split_choice;
        const size_t ws_bytes = async ? cuda::decode_attention_async_workspace_bytes(B, H, KVH, D, splits)
                                      : cuda::decode_attention_workspace_bytes(B, H, D, splits);
        cuda::DeviceBuffer ws(std::max<size_t>(ws_bytes, 16));
        const int n_counters = cuda::decode_attention_async_counters(B, H, KVH);
        cuda::DeviceBuffer counters(sizeof(int) * n_counters);
        FDPP_CUDA_CHECK(cudaMemset(counters.get(), 0, counters.bytes()));
        FDPP_CUDA_CHECK(cudaMemset(fallback.get(), 0, sizeof(unsigned long long)));
        auto launch = [&](int r) {
          const int32_t* t = tables.as<int32_t>() + int64_t(r % rotations) * call_blocks;
          if (async) {
            cuda::decode_attention_async(
                {.qkv = qkv.get(), .k_cache = k.get(), .v_cache = v.get(), .block_tables = t,
                 .max_blocks_per_seq = blocks_per_seq, .context_lens = lens.as<int32_t>(), .out = out.get(),
                 .batch = B, .n_heads = H, .n_kv_heads = KVH, .head_dim = D, .block_size = block, .scale = scale,
                 .dtype = dtype, .splits = splits, .max_context_len = L, .workspace = ws.get(),
                 .workspace_bytes = ws.bytes(), .range = range, .counters = counters.as<int>(),
                 .counter_ints = n_counters, .fallback_rows = fallback.as<unsigned long long>(),
                 .kv_quant = kv_quant},
                stream);
          } else {
            cuda::decode_attention({.qkv = qkv.get(), .k_cache = k.get(), .v_cache = v.get(), .block_tables = t,
                                    .max_blocks_per_seq = blocks_per_seq, .context_lens = lens.as<int32_t>(),
                                    .out = out.get(), .batch = B, .n_heads = H, .n_kv_heads = KVH, .head_dim = D,
                                    .block_size = block, .scale = scale, .dtype = dtype, .splits = splits,
                                    .max_context_len = L, .workspace = ws.get(), .workspace_bytes = ws.bytes(),
                                    .kv_quant = kv_quant},
                                   stream);
          }
        };
        const double us = cuda::time_graph(stream, reps, a.replays, launch).us;
        const cuda::DecodeAttentionLaunch ran =
            cuda::decode_attention_launch(B, H, KVH, D, splits, L, async, gpus[0].multiprocessors);
        unsigned long long fb = 0;
        FDPP_CUDA_CHECK(cudaMemcpy(&fb, fallback.get(), sizeof(fb), cudaMemcpyDeviceToHost));
        results.push_back({{"mode", mode}, {"path", cuda::decode_path_name(kernels.decode_path)},
                           {"decode_warps", kernels.decode_warps},
                           {"async_combine", cuda::async_combine_name(kernels.async_combine)},
                           {"block_size", block}, {"kv_layout", kv_layout}, {"block_order", a.block_order},
                           {"kv_cache_dtype", a.kv_cache_dtype},
                           {"pdl", kernels.programmatic_launch}, {"heads", H}, {"kv_heads", KVH}, {"head_dim", D}, {"batch", B},
                           {"context", L}, {"splits", splits}, {"planned_splits", planned_splits}, {"us", us}, {"bytes", bytes},
                           {"pct_design_bw", bytes / (us * 1e-6) / kDesignReadBandwidth},
                           {"fallback_rows", fb}, {"reps", reps}, {"rotations", rotations},
                           {"tensor_cores", ran.tensor_cores}, {"warps", ran.warps},
                           // async: whether the unified-max kernels ran (else the synchronized ones)
                           {"unified", ran.unified},
                           // async: whether the group's last CTA added the splits (else a second launch)
                           {"combined_in_kernel", ran.combine_in_kernel},
                           // the combine launch's CTA shape (by rows per SM), "none" without one
                           {"combine", cuda::combine_launch_name(ran.combine)}});
        if (!a.json)
          std::cerr << fmt::format("{} H {}/{} D {} B {} L {}: {:.2f} us\n", mode, H, KVH, D, B, L, us);
      }
    }
  }
  FDPP_CUDA_CHECK(cudaStreamDestroy(stream));
  nlohmann::json doc{{"gpu", gpus[0].name}, {"dtype", a.dtype}, {"results", results}};
  if (a.json) {
    std::cout << doc.dump(1) << "\n";
    return 0;
  }
  fmt::print("decode attention | GPU: {} | {}{} | heads {}/{} x {} | graph-timed, L2 rotated\n\n", gpus[0].name,
             a.dtype, a.kv_cache_dtype == "fp8" ? ", fp8 (e4m3) KV cache" : "", H, KVH, D);
  fmt::print("| mode | batch | context | splits | us | % of 4.46 TB/s | fallback rows |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  for (const auto& r : results)
    fmt::print("| {} | {} | {} | {} | {:.2f} | {:.1f} | {} |\n", r["mode"].get<std::string>(), r["batch"].get<int>(),
               r["context"].get<int>(), r["splits"].get<int>(), r["us"].get<double>(),
               100 * r["pct_design_bw"].get<double>(), r["fallback_rows"].get<unsigned long long>());
  return 0;
}

// fdpp bench-attention --prefill: causal prefill attention (prefill_attention_varlen, tensor
// cores) on B sequences of L new tokens each (start 0, one launch), async (unified max) and sync.
// Compute bound: the flops are 4 D per (query, visible key) pair and head (QK^T and PV, 2 each),
// 4 D H B L (L + 1) / 2 in all; e.g. 1 x 32768, H 32, D 128: 8.8e12 flops. Time: median over
// graph replays of R back-to-back calls (R so that a replay takes about 20 ms); K/V are not rotated
// past L2: each call reuses its keys L / 64 times from shared memory, so the first read is not what
// limits it, and the peers (bench/peers/attention_peers.py --prefill) run from the same state.
// --prefill-config A,B,...: every listed tile configuration on the same points and inputs, each in
// every mode, so one run compares them (docs/kernels/prefill_attention.md).
int run_bench_prefill_attention(const BenchAttentionArgs& a) {
  const auto gpus = checked_gpus(a);
  const cuda::KernelOptions kernels = resolve_kernel_options(a.kernels);
  const cuda::KernelOptionsScope kernel_scope(kernels);
  for (const auto& m : a.modes) check(m == "async" || m == "sync", "--modes: '{}' is not one of async, sync", m);
  std::vector<std::pair<int, int>> points;
  for (const auto& p : a.points) {
    const auto x = p.find('x');
    int b = 0, l = 0;
    try {
      check(x != std::string::npos, "");
      b = std::stoi(p.substr(0, x));
      l = std::stoi(p.substr(x + 1));
    } catch (...) {
      fail("--points: '{}' is not BxL (e.g. 8x2048)", p);
    }
    check(b >= 1 && l >= 1 && int64_t(b) * l <= (1 << 24), "--points: '{}' is out of range", p);
    points.push_back({b, l});
  }
  check(!points.empty(), "bench-attention --prefill: give --points");
  std::vector<int> configs;
  for (const auto& name : a.prefill_configs) {
    if (name == "all") {
      for (int i = 0; i < cuda::prefill_attention_configs(); ++i) configs.push_back(i);
      continue;
    }
    const int i = cuda::prefill_attention_config_index(name.c_str());
    if (i < 0) {
      std::string known;
      for (int j = 0; j < cuda::prefill_attention_configs(); ++j)
        known += std::string(j ? ", " : "") + cuda::prefill_attention_config_name(j);
      fail("--prefill-config: '{}' is not one of {}, all", name, known);
    }
    configs.push_back(i);
  }
  check(!configs.empty(), "bench-attention --prefill: give --prefill-config");
  const cuda::DType dtype = a.dtype == "bf16" ? cuda::DType::BF16 : cuda::DType::F16;
  const int H = a.heads, KVH = a.kv_heads, D = a.head_dim;
  const cuda::KvQuant kv_quant = kv_quant_of(a);
  const size_t kv_elem = cuda::kv_element_bytes(kv_quant.dtype);
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  const UnifiedMaxBounds bounds = default_unified_max_bounds(131072);
  const cuda::UnifiedMaxRange range{bounds.phi, bounds.a, bounds.b};
  cudaStream_t stream = nullptr;
  FDPP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cuda::DeviceBuffer fallback(sizeof(unsigned long long));
  std::mt19937 rng(7);
  nlohmann::json results = nlohmann::json::array();
  for (auto [B, L] : points) {
    const int64_t tokens = int64_t(B) * L;
    const int blocks_per_seq = (L + kPrefillBlock - 1) / kPrefillBlock;
    const int64_t blocks = int64_t(B) * blocks_per_seq;
    const int64_t kv_elems = blocks * kPrefillBlock * KVH * D;
    const int64_t qkv_elems = tokens * (H + 2 * KVH) * D;
    cuda::DeviceBuffer k(kv_elems * kv_elem), v(kv_elems * kv_elem), qkv(qkv_elems * 2), out(tokens * H * D * 2);
    // Uniform [-1, 1) like activations after a norm: logits ~ N(0, 1/3), no fallback rows.
    fill_kv_pool(k.get(), v.get(), blocks * kPrefillBlock, KVH, D, kPrefillBlock, dtype, kv_quant, 21, stream);
    cuda::fill_random(qkv.get(), qkv_elems, dtype, 1.f, 0.f, 23, stream);
    std::vector<int32_t> table(blocks);
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), rng);  // a paged cache is not contiguous
    std::vector<int32_t> q_begin(B + 1), starts(B, 0);
    for (int i = 0; i <= B; ++i) q_begin[i] = i * L;
    cuda::DeviceBuffer d_table(table.size() * 4), d_q_begin(q_begin.size() * 4), d_starts(starts.size() * 4);
    FDPP_CUDA_CHECK(cudaMemcpy(d_table.get(), table.data(), table.size() * 4, cudaMemcpyHostToDevice));
    FDPP_CUDA_CHECK(cudaMemcpy(d_q_begin.get(), q_begin.data(), q_begin.size() * 4, cudaMemcpyHostToDevice));
    FDPP_CUDA_CHECK(cudaMemcpy(d_starts.get(), starts.data(), starts.size() * 4, cudaMemcpyHostToDevice));
    const double flops = 4.0 * D * H * B * (double(L) * (L + 1) / 2);
    // About 20 ms of work per replay at 400 TFLOP/s.
    const int reps = static_cast<int>(std::clamp(20e-3 / (flops / 400e12), 1.0, 50.0));
    for (int config : configs)
      for (const auto& mode : a.modes) {
        const bool async = mode == "async";
        const std::string cname = cuda::prefill_attention_config_name(config);
        FDPP_CUDA_CHECK(cudaMemset(fallback.get(), 0, sizeof(unsigned long long)));
        auto launch = [&](int) {
          cuda::prefill_attention_varlen(qkv.get(), k.get(), v.get(), d_table.as<int32_t>(), blocks_per_seq,
                                         d_q_begin.as<int32_t>(), d_starts.as<int32_t>(), B, static_cast<int>(tokens),
                                         L, H, KVH, D, kPrefillBlock, scale, async ? &range : nullptr,
                                         fallback.as<unsigned long long>(), out.get(), dtype, stream, config, 0, 0.f,
                                         kv_quant);
        };
        const auto timing = cuda::time_graph(stream, reps, a.replays, launch);
        unsigned long long fb = 0;
        FDPP_CUDA_CHECK(cudaMemcpy(&fb, fallback.get(), sizeof(fb), cudaMemcpyDeviceToHost));
        const double tflops = flops / (timing.us * 1e-6) / 1e12;
        results.push_back({{"config", cname}, {"mode", mode}, {"kv_cache_dtype", a.kv_cache_dtype}, {"heads", H},
                           {"kv_heads", KVH}, {"head_dim", D},
                           {"batch", B}, {"tokens", L}, {"us", timing.us}, {"spread", timing.spread}, {"flops", flops},
                           {"tflops", tflops}, {"fallback_rows", fb}, {"reps", reps}});
        if (!a.json)
          std::cerr << fmt::format("prefill {} {} H {}/{} D {} {}x{}: {:.1f} us, {:.1f} TFLOP/s\n", cname, mode, H, KVH,
                                   D, B, L, timing.us, tflops);
      }
  }
  FDPP_CUDA_CHECK(cudaStreamDestroy(stream));
  nlohmann::json doc{{"gpu", gpus[0].name}, {"dtype", a.dtype}, {"kernel", "prefill"}, {"results", results}};
  if (a.json) {
    std::cout << doc.dump(1) << "\n";
    return 0;
  }
  fmt::print("prefill attention (causal) | GPU: {} | {} | heads {}/{} x {} | graph-timed\n\n", gpus[0].name, a.dtype,
             H, KVH, D);
  fmt::print(
      "| config | mode | batch x tokens | us | TFLOP/s | fallback rows |\n| --- | --- | ---: | ---: | ---: | ---: |\n");
  for (const auto& r : results)
    fmt::print("| {} | {} | {} x {} | {:.1f} | {:.1f} | {} |\n", r["config"].get<std::string>(),
               r["mode"].get<std::string>(), r["batch"].get<int>(),
               r["tokens"].get<int>(), r["us"].get<double>(), r["tflops"].get<double>(),
               r["fallback_rows"].get<unsigned long long>());
  return 0;
}

}  // namespace fdpp

namespace fdpp::cli {

Subcommand register_bench_attention(CLI::App& app) {
  static BenchAttentionArgs ba;
  static EngineArgs kernel_flags;  // --pdl and --decode-path from the engine option table
  auto* bench_attn = app.add_subcommand("bench-attention", "decode attention kernels alone: async vs sync, graph-timed");
  bench_attn->add_option("--heads", ba.heads, "query heads")->capture_default_str()->check(CLI::Range(1, 1024));
  bench_attn->add_option("--kv-heads", ba.kv_heads, "key/value heads")->capture_default_str()->check(CLI::Range(1, 1024));
  bench_attn->add_option("--head-dim", ba.head_dim, "decode: 64, 80, 96, 128 or 256; --prefill: 64 or 128")->capture_default_str();
  bench_attn->add_option("--dtype", ba.dtype, "f16 or bf16")->capture_default_str();
  bench_attn->add_option("-b,--batch", ba.batches, "batch sizes")->delimiter(',')->check(CLI::Range(1, 4096));
  bench_attn->add_option("-c,--context", ba.contexts, "context lengths")->delimiter(',')->check(CLI::Range(1, 1 << 22));
  bench_attn->add_option("--modes", ba.modes, "async, sync")->delimiter(',');
  bench_attn->add_option("--replays", ba.replays, "graph replays per point (median)")->capture_default_str()->check(CLI::Range(1, 1000));
  bench_attn->add_flag("--json", ba.json, "print JSON");
  bench_attn->add_flag("--prefill", ba.prefill, "causal prefill attention (tensor cores) instead of decode");
  add_kernel_flags(bench_attn, kernel_flags);
  bench_attn->add_option("--decode-warps", ba.kernels.decode_warps,
                         "decode attention's warps per CTA at head dims 64, 128: 0 (auto: 4 for the tensor-core loop at "
                         "groups for 3/4 of two CTAs per SM, else 8), 4 or 8 "
                         "(default: $FDPP_DECODE_WARPS, else 0)")
      ->check(CLI::IsMember({"0", "4", "8"}));
  bench_attn->add_option("--async-combine", ba.kernels.async_combine,
                         "async decode attention's reduction of splits: auto, kernel (the last CTA) or launch "
                         "(a second kernel) (default: $FDPP_ASYNC_COMBINE, else auto)")
      ->check(CLI::IsMember({"auto", "kernel", "launch"}));
  bench_attn->add_option("--block-size", ba.block_size, "decode: KV cache tokens per block (a power of two)")
      ->capture_default_str()
      ->check(CLI::IsMember({"1", "2", "4", "8", "16", "32", "64", "128", "256", "512", "1024"}));
  bench_attn
      ->add_option("--kv-layout", ba.kernels.kv_layout,
                   "KV cache layout, head-major (the engine's: a kv head's rows of a block adjacent) or "
                   "token-major (a token's kv heads adjacent) (default: $FDPP_KV_LAYOUT, else head-major)")
      ->check(CLI::IsMember({"token-major", "head-major"}));
  bench_attn->add_option("--kv-cache-dtype", ba.kv_cache_dtype,
                         "the KV cache's element type: auto (the 16-bit --dtype) or fp8 (e4m3, scale 1; head dims 64, "
                         "128, 256)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "fp8"}));
  bench_attn->add_option("--block-order", ba.block_order,
                         "decode: order of a sequence's KV blocks in memory, shuffled (a fragmented cache) or "
                         "sequential")
      ->capture_default_str()
      ->check(CLI::IsMember({"shuffled", "sequential"}));
  bench_attn->add_option("--splits", ba.splits,
                         "decode: split-KV counts to time at every point (0: the engine's plan)")
      ->delimiter(',')
      ->check(CLI::Range(0, 1024));
  bench_attn->add_option("--points", ba.points, "prefill points BxL (B sequences of L tokens)")->delimiter(',');
  bench_attn->add_option("--prefill-config", ba.prefill_configs,
                         "prefill tile configurations to compare (m64n64, m128n64w8, m128n64w8s3, m128n32w4 or all)")
      ->delimiter(',');
  return {bench_attn, [] {
            ba.kernels.pdl = kernel_flags.kernels.pdl;
            ba.kernels.decode_path = kernel_flags.kernels.decode_path;
            return ba.prefill ? run_bench_prefill_attention(ba) : run_bench_attention(ba);
          }};
}

}  // namespace fdpp::cli
