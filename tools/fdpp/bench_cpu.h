// fdpp bench --device cpu (and plain `fdpp bench` in CPU-only builds): llama-bench's pp/tg table
// for the CPU backend. See bench_cpu.cpp.
#pragma once

#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace fdpp {

struct BenchCpuArgs {
  std::string model;
  std::vector<int> prompts{512};  // pp tests (llama-bench -p)
  std::vector<int> gens{128};     // tg tests (llama-bench -n)
  std::vector<int> threads;       // empty: the physical cores (llama-bench -t)
  int repetitions = 5;            // llama-bench -r
  std::string cpu_weights = "stored";
  std::string kv_cache_dtype = "auto";  // llama-bench -ctk/-ctv: f32 (auto) or f16
  bool json = false;
};

// Adds the CPU bench's own options (-n, -t, --cpu-weights) to a bench subcommand whose -m/-p/-r
// land in the given args (the CUDA build's bench registers those itself).
void add_bench_cpu_options(CLI::App* bench, BenchCpuArgs& args);
// The whole `bench` subcommand of a CPU-only build.
CLI::App* register_bench_cpu(CLI::App& app, BenchCpuArgs& args);
int run_bench_cpu(const BenchCpuArgs& args);

}  // namespace fdpp
