// fdpp bench-attention (CUDA builds): see bench_attention.cpp.
#pragma once

#include <string>
#include <vector>

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
};

int run_bench_attention(const BenchAttentionArgs& args);

}  // namespace fdpp
