// fdpp bench-attention (CUDA builds): see bench_attention.cpp.
#pragma once

#include <string>
#include <vector>

#include "runtime/environment_fallback.h"

namespace fdpp {

struct BenchAttentionArgs {
  int heads = 32;
  int kv_heads = 32;
  int head_dim = 128;
  std::string dtype = "f16";
  std::vector<int> batches{1, 8, 32, 64};
  std::vector<int> contexts{512, 1024, 4096, 16384, 65536};
  std::vector<std::string> modes{"async", "sync"};
  int replays = 7;
  bool json = false;
  // --prefill: causal prefill attention (prefill_attention_varlen) over `points`, each "BxL":
  // B sequences of L new tokens each (start 0), one launch.
  bool prefill = false;
  std::vector<std::string> points{"1x1024", "1x4096", "1x16384", "1x32768", "8x2048"};
  // --prefill-config: the kernel's tile configurations to time on every point and mode (names from
  // prefill_plan.h kConfigs; "all": every one). Default: the default configuration alone.
  std::vector<std::string> prefill_configs{"m64n64"};
  // Decode: the KV cache's tokens per block (its layout: kernels.kv_layout).
  int block_size = 16;
  // The order of a sequence's blocks in the pool: "shuffled" (a long-running server's fragmented
  // cache) or "sequential" (a fresh engine's allocator hands out consecutive blocks; the order of
  // the dense K/V the peers read).
  std::string block_order = "shuffled";
  // Decode: the split-KV counts to time at every point; 0 is the engine's plan (plan_decode_splits).
  // A list measures the plan against its alternatives (the "splits" and "planned_splits" fields).
  std::vector<int> splits{0};
  KernelFlags kernels;  // --pdl, --decode-path (else FDPP_PDL, FDPP_DECODE_PATH)
  // The KV cache's element type: "auto" (the 16-bit dtype) or "fp8" (e4m3, scale 1: the engine's
  // --kv-cache-dtype fp8).
  std::string kv_cache_dtype = "auto";
};

int run_bench_prefill_attention(const BenchAttentionArgs& args);

int run_bench_attention(const BenchAttentionArgs& args);

}  // namespace fdpp
