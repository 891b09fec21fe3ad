// fdpp bench --device cpu: the CPU backend timed the way llama-bench times llama.cpp, so that one
// command on each side gives comparable lines.
//   ppN: one forward over N random prompt tokens from an empty cache (logits of the last only);
//        tokens/s = N / time.
//   tgN: N single-token forwards (each with its logits), from an empty cache; tokens/s = N / time.
// One untimed warm-up of each test first (it also faults the mapped weights in), then
// `repetitions` timed runs; the table shows mean ± sample standard deviation of tokens/s, as
// llama-bench does.
#include "bench_cpu.h"

#include "subcommands.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>
#include <random>

#include "backend/cpu/cpu_runner.h"
#include "backend/cpu/quant_matmul.h"
#include "backend/cpu/thread_pool.h"
#include "runtime/backend_select.h"
#include "fdpp/error.h"
#include "model/model_loader.h"

namespace fdpp {

namespace {

using Clock = std::chrono::steady_clock;

std::vector<int32_t> random_ids(int n, int vocab, std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> d(0, vocab - 1);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& x : ids) x = d(rng);
  return ids;
}

std::string human_size(uint64_t bytes) {
  const double mib = static_cast<double>(bytes) / (1024.0 * 1024.0);
  return mib >= 1024 ? fmt::format("{:.2f} GiB", mib / 1024) : fmt::format("{:.2f} MiB", mib);
}

std::string human_params(uint64_t n) {
  return n >= 1'000'000'000 ? fmt::format("{:.2f} B", n / 1e9) : fmt::format("{:.2f} M", n / 1e6);
}

// llama-bench's model column: architecture, size class and the most common weight type.
std::string model_label(const ModelDescription& d) {
  std::string dtype;
  int most = 0;
  for (const auto& [t, count] : d.dtype_counts)
    if (t != "F32" && count > most) {
      most = count;
      dtype = t;
    }
  const double p = static_cast<double>(d.n_params);
  const std::string size = p >= 1e9 ? fmt::format("{:.0f}B", p / 1e9) : fmt::format("{:.0f}M", p / 1e6);
  return fmt::format("{} {} {}", d.config.architecture, size, dtype.empty() ? "F32" : dtype);
}

struct Stat {
  double mean = 0, stddev = 0;
};

Stat stat(const std::vector<double>& v) {
  Stat s;
  for (double x : v) s.mean += x;
  s.mean /= static_cast<double>(v.size());
  if (v.size() > 1) {
    double ss = 0;
    for (double x : v) ss += (x - s.mean) * (x - s.mean);
    s.stddev = std::sqrt(ss / static_cast<double>(v.size() - 1));
  }
  return s;
}

}  // namespace

void add_bench_cpu_options(CLI::App* bench, BenchCpuArgs& a) {
  bench->add_option("-n,--n-gen", a.gens, "CPU: decode (tg) lengths, e.g. 128 (0: none)")->delimiter(',')->check(CLI::Range(0, 1 << 20));
  bench->add_option("-t,--threads", a.threads, "CPU: thread counts, e.g. 1,2 (default: the physical cores)")
      ->delimiter(',')
      ->check(CLI::Range(1, 1024));
  bench->add_option("--cpu-weights", a.cpu_weights, "CPU: stored (GGUF blocks in place) or f32 (the reference)")
      ->capture_default_str()
      ->check(CLI::IsMember({"stored", "f32"}));
}

CLI::App* register_bench_cpu(CLI::App& app, BenchCpuArgs& a) {
  auto* bench = app.add_subcommand("bench", "prefill (pp) and decode (tg) speed on the CPU, llama-bench style");
  bench->add_option("-m,--model", a.model, "model file or HF directory (default: the default model)");
  bench->add_option("-p,--prompt", a.prompts, "prefill lengths (pp), e.g. 128,512 (0: none)")->delimiter(',')->check(CLI::Range(0, 1 << 20));
  bench->add_option("-r,--repetitions", a.repetitions, "timed runs per test")->capture_default_str()->check(CLI::Range(1, 1000));
  bench->add_option("--device", [](const CLI::results_t& r) { return r.size() == 1 && (r[0] == "cpu" || r[0] == "auto"); },
                    "cpu (the only device of a CPU-only build)");
  bench->add_flag("--json", a.json, "print JSON");
  add_bench_cpu_options(bench, a);
  // The CUDA build's bench takes --kv-cache-dtype from the engine option table instead.
  bench->add_option("--kv-cache-dtype", a.kv_cache_dtype, "the KV cache's type: auto (f32) or f16 (llama-bench's default)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "f32", "f16"}));
  return bench;
}

int run_bench_cpu(const BenchCpuArgs& a) {
  check(!a.prompts.empty() || !a.gens.empty(), "bench: give at least one -p or -n length");
  const std::string path = resolve_model_path(a.model);
  const LoadedModel m = load_model(path, {}, a.cpu_weights == "f32" ? LoadOptions{} : cpu::stored_load_options());
  const ModelConfig& c = m.config();
  int max_len = 1;
  for (int p : a.prompts) max_len = std::max(max_len, p);
  for (int g : a.gens) max_len = std::max(max_len, g);
  check(max_len <= c.max_context, "bench: length {} exceeds the model's context {}", max_len, c.max_context);
  const std::vector<int> threads = a.threads.empty() ? std::vector<int>{cpu::physical_cores()} : a.threads;

  std::mt19937 rng(1234);
  std::vector<float> logits(static_cast<size_t>(c.vocab_size));
  const std::string label = model_label(m.description);
  const std::string backend = fmt::format("CPU {} {}", a.cpu_weights == "f32" ? "f32" : "stored",
                                          a.cpu_weights == "f32" ? "ref" : cpu::isa_name(cpu::best_isa()));
  nlohmann::json rows = nlohmann::json::array();
  if (!a.json) {
    fmt::print("| model | size | params | backend | threads | test | t/s |\n");
    fmt::print("| --- | ---: | ---: | --- | ---: | ---: | ---: |\n");
  }
  for (int t : threads) {
    RunnerOptions ro;
    ro.device = Device::Cpu;
    ro.threads = t;
    ro.kv_cache_dtype = a.kv_cache_dtype;
    auto runner = make_runner(c, m.weights, max_len, ro);
    auto one = [&](const std::string& test, int n, bool prefill) {
      std::vector<double> tps;
      for (int rep = -1; rep < a.repetitions; ++rep) {  // rep -1: warm-up
        const auto ids = random_ids(n, c.vocab_size, rng);
        const auto t0 = Clock::now();
        if (prefill) {
          runner->forward(ids, 0, false, logits);
        } else {
          for (int i = 0; i < n; ++i) runner->forward(std::span<const int32_t>(&ids[i], 1), i, false, logits);
        }
        const double s = std::chrono::duration<double>(Clock::now() - t0).count();
        if (rep >= 0) tps.push_back(n / s);
      }
      const Stat st = stat(tps);
      if (a.json) {
        rows.push_back({{"model", label}, {"size_bytes", m.description.stored_bytes}, {"params", m.description.n_params},
                        {"backend", backend}, {"threads", t}, {"test", test}, {"tokens_per_second", st.mean},
                        {"stddev", st.stddev}, {"samples", tps}});
      } else {
        fmt::print("| {} | {} | {} | {} | {} | {} | {:.2f} ± {:.2f} |\n", label, human_size(m.description.stored_bytes),
                   human_params(m.description.n_params), backend, t, test, st.mean, st.stddev);
        std::fflush(stdout);
      }
    };
    for (int p : a.prompts)
      if (p > 0) one(fmt::format("pp{}", p), p, true);
    for (int g : a.gens)
      if (g > 0) one(fmt::format("tg{}", g), g, false);
  }
  if (a.json) std::cout << nlohmann::json{{"model", path}, {"results", rows}}.dump(1) << "\n";
  return 0;
}

}  // namespace fdpp

#ifndef FDPP_HAVE_CUDA
namespace fdpp::cli {

Subcommand register_bench(CLI::App& app) {
  static BenchCpuArgs bc;
  return {register_bench_cpu(app, bc), [] { return run_bench_cpu(bc); }};
}

}  // namespace fdpp::cli
#endif
