// fdpp bench-linear: the linear-layer benchmark of issue 6. For every [N, K] the CUDA backend runs
// for the given presets (engine/linear_chooser.h: model_linear_shapes, lm head included), each
// implementation beside cuBLASLt on the same inputs, timed by LinearProfiler (CUDA-graph replay,
// weights rotated past L2): microseconds, % of DESIGN.md's 4.46 TB/s and of the read bandwidth
// measured now (bandwidth.h), TFLOP/s, speed-up over cuBLAS; then per preset the "layer" rows: the
// four per-layer shapes summed (qkv + o + gate/up + down), for each implementation and for the
// fastest per shape ("best": what a perfect dispatch table gives). A Markdown table on stdout, or
// JSON with --json.
#include <fmt/format.h>

#include <cmath>
#include <iostream>
#include <map>
#include <tuple>

#include "subcommands.h"
#include "tune.h"
#include "backend/cuda/bandwidth.h"
#include "backend/cuda/device_query.h"
#include "backend/cuda/linear_profiler.h"
#include "runtime/environment_fallback.h"
#include "engine/linear_chooser.h"
#include "fdpp/error.h"

namespace fdpp {

namespace {

struct BenchLinearArgs {
  std::vector<std::string> presets;
  std::string m_list = "1,2,4,8,16,32,64";
  std::string dtype = "f16";
  double bandwidth = 0;  // bytes/s; 0: measure
  bool json = false;
};
BenchLinearArgs g_args;

struct Row {
  std::string preset, shape;
  int n = 0, k = 0, m = 0;
  std::string impl;  // gemv, flat, cublas, best
  double us = NAN, bytes = 0, flops = 0, cublas_us = NAN;
  int launches = 0, copies = 0;
  double spread = 0;
};

}  // namespace

CLI::App* add_bench_linear_command(CLI::App& app) {
  BenchLinearArgs& a = g_args;
  auto* b = app.add_subcommand("bench-linear", "GEMV / flat GEMM / cuBLAS on the linear shapes of preset models "
                                               "(us, % of read bandwidth, TFLOP/s)");
  b->add_option("--preset", a.presets, "configs under configs/, e.g. llama-2-7b,opt-6.7b")
      ->delimiter(',')
      ->required();
  b->add_option("-M,--m", a.m_list, "M values, e.g. 1,2,4,8 or 1-64")->capture_default_str();
  b->add_option("--dtype", a.dtype, "f16 or bf16")->capture_default_str();
  b->add_option("--bandwidth", a.bandwidth, "read bandwidth in bytes/s for the second roofline (default: measure)")
      ->check(CLI::Range(0.0, 1e15));
  b->add_flag("--json", a.json, "print JSON");
  return b;
}

int run_bench_linear() {
  const BenchLinearArgs& a = g_args;
  check(a.dtype == "f16" || a.dtype == "bf16", "--dtype '{}' is not one of f16, bf16", a.dtype);
  const std::vector<int> ms = parse_m_list(a.m_list, "-M");
  struct Preset {
    std::string name;
    std::vector<LinearShape> shapes;  // per layer (4) + lm head
  };
  std::vector<Preset> presets;
  for (const std::string& p : a.presets) presets.push_back({p, model_linear_shapes(tool_model_config("", p, nullptr))});
  std::string why;
  const auto gpus = cuda::list_gpus(&why);
  check(!gpus.empty(), "fdpp bench-linear measures the GPU: no usable GPU ({})", why);

  const double measured_bw = a.bandwidth > 0 ? a.bandwidth : cuda::measure_read_bandwidth();
  const cuda::DType dtype = a.dtype == "bf16" ? cuda::DType::BF16 : cuda::DType::F16;
  // The kernels are called here, not by an engine: their switches from the environment (FDPP_PDL,
  // FDPP_LINEAR_PDL, FDPP_CUBLASLT_TUNE, ...; environment_fallback.h).
  const cuda::KernelOptions kernels = resolve_kernel_options({});
  const cuda::KernelOptionsScope kernel_scope(kernels);
  cuda::LinearProfiler profiler(dtype);
  const LinearLimits limits = cuda::kernel_linear_limits();

  // Each distinct [N, K] once, whichever presets share it.
  std::vector<LinearShape> all;
  for (const Preset& p : presets) all.insert(all.end(), p.shapes.begin(), p.shapes.end());
  const std::vector<LinearShape> unique = unique_linear_shapes(all);
  int total = 0;
  for (size_t s = 0; s < unique.size(); ++s)
    for (int m : ms)
      for (LinearImpl impl : kAllLinearImpls) total += m <= limits.max_m(impl);
  Progress progress("bench-linear", total, std::max(1, total / static_cast<int>(unique.size())));
  std::map<std::tuple<int, int, int, int>, cuda::LinearTiming> timings;  // (n, k, m, impl)
  for (const LinearShape& sh : unique) {
    for (int m : ms)
      for (LinearImpl impl : kAllLinearImpls) {
        if (m > limits.max_m(impl)) continue;
        timings[{sh.n, sh.k, m, static_cast<int>(impl)}] = profiler.time(impl, m, sh.n, sh.k);
        progress.step(fmt::format("[{}, {}] M={} {}", sh.n, sh.k, m, linear_impl_name(impl)));
      }
    profiler.release();
  }
  progress.finish();
  auto us_of = [&](const LinearShape& sh, int m, LinearImpl impl) {
    auto it = timings.find({sh.n, sh.k, m, static_cast<int>(impl)});
    return it == timings.end() ? NAN : it->second.us;
  };

  std::vector<Row> rows;
  for (const Preset& p : presets) {
    for (const LinearShape& sh : p.shapes)
      for (int m : ms) {
        const double cublas = us_of(sh, m, LinearImpl::Cublas);
        const cuda::LinearCost cost = cuda::linear_cost(m, sh.n, sh.k);
        for (LinearImpl impl : kAllLinearImpls) {
          auto it = timings.find({sh.n, sh.k, m, static_cast<int>(impl)});
          if (it == timings.end()) continue;
          rows.push_back({p.name, sh.name, sh.n, sh.k, m, linear_impl_name(impl), it->second.us, cost.bytes,
                          cost.flops, cublas, it->second.launches, it->second.copies, it->second.spread});
        }
      }
    // The layer: the four per-layer shapes (not the lm head), per implementation and the best.
    for (int m : ms) {
      Row cub{p.name, "layer", 0, 0, m, "", 0, 0, 0, NAN};
      for (int li = 0; li < 4; ++li) cub.us += us_of(p.shapes[li], m, LinearImpl::Cublas);
      for (const char* impl : {"gemv", "flat", "cublas", "best"}) {
        Row r{p.name, "layer (qkv+o+ffn)", 0, 0, m, impl, 0, 0, 0, cub.us};
        for (int li = 0; li < 4; ++li) {
          const LinearShape& sh = p.shapes[li];
          double t = NAN;
          if (std::string(impl) == "best") {
            t = INFINITY;
            for (LinearImpl x : kAllLinearImpls)
              if (std::isfinite(us_of(sh, m, x))) t = std::min(t, us_of(sh, m, x));
          } else {
            t = us_of(sh, m, *parse_linear_impl(impl));
          }
          const cuda::LinearCost cost = cuda::linear_cost(m, sh.n, sh.k);
          r.us += t;
          r.bytes += cost.bytes;
          r.flops += cost.flops;
        }
        if (std::isfinite(r.us)) rows.push_back(r);
      }
    }
  }

  auto pct = [](const Row& r, double bw) { return cuda::percent_of_bandwidth({r.bytes, r.flops}, r.us, bw); };
  if (a.json) {
    nlohmann::ordered_json out;
    out["gpu"] = gpus[0].name;
    out["sm_count"] = gpus[0].multiprocessors;
    out["dtype"] = a.dtype;
    out["read_bandwidth_design"] = cuda::kH200ReadBandwidth;
    out["read_bandwidth_measured"] = measured_bw;
    out["method"] = "CUDA-graph replay of R launches, median of 7 replays, weights rotated over >= 4x L2, no bias";
    nlohmann::ordered_json jr = nlohmann::ordered_json::array();
    auto num = [](double v) { return std::isfinite(v) ? nlohmann::ordered_json(v) : nlohmann::ordered_json(nullptr); };
    for (const Row& r : rows)
      jr.push_back({{"preset", r.preset},
                    {"shape", r.shape},
                    {"n", r.n},
                    {"k", r.k},
                    {"m", r.m},
                    {"impl", r.impl},
                    {"us", num(r.us)},
                    {"bytes", r.bytes},
                    {"flops", r.flops},
                    {"percent_design_bw", num(pct(r, cuda::kH200ReadBandwidth))},
                    {"percent_measured_bw", num(pct(r, measured_bw))},
                    {"tflops", num(cuda::tflops({r.bytes, r.flops}, r.us))},
                    {"speedup_vs_cublas", num(r.cublas_us / r.us)},
                    {"launches", r.launches},
                    {"copies", r.copies},
                    {"spread", r.spread}});
    out["rows"] = jr;
    std::cout << out.dump(1) << "\n";
    return 0;
  }
  fmt::print("GPU: {} ({} SMs) | {} | read bandwidth measured {:.2f} TB/s (design 4.46) | CUDA-graph replay, median "
             "of 7, weights rotated over >= 4x L2, no bias\n\n",
             gpus[0].name, gpus[0].multiprocessors, a.dtype, measured_bw / 1e12);
  fmt::print("| preset | shape | [N, K] | M | impl | us | % of 4.46 TB/s | % of measured BW | TFLOP/s | vs cuBLAS |\n");
  fmt::print("| --- | --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |\n");
  for (const Row& r : rows) {
    const std::string nk = r.n > 0 ? fmt::format("[{}, {}]", r.n, r.k) : "";
    auto cell = [](double v, const char* f) { return std::isfinite(v) ? fmt::format(fmt::runtime(f), v) : "-"; };
    fmt::print("| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n", r.preset, r.shape, nk, r.m, r.impl,
               cell(r.us, "{:.2f}"), cell(pct(r, cuda::kH200ReadBandwidth), "{:.1f}"), cell(pct(r, measured_bw), "{:.1f}"),
               cell(cuda::tflops({r.bytes, r.flops}, r.us), "{:.2f}"), cell(r.cublas_us / r.us, "{:.2f}x"));
  }
  return 0;
}

}  // namespace fdpp

namespace fdpp::cli {

Subcommand register_bench_linear(CLI::App& app) { return {add_bench_linear_command(app), run_bench_linear}; }

}  // namespace fdpp::cli
