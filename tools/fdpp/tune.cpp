// fdpp tune: the dispatch table of FlashDecoding++'s heuristic dataflow for one model on the
// present GPU. For each [N, K] the CUDA backend runs for the model (engine/linear_chooser.h:
// model_linear_shapes) it times GEMV (M <= kGemvMaxM), flat GEMM (M <= kFlatGemmMaxM) and cuBLASLt
// (every M) with LinearProfiler (CUDA-graph replay, weights rotated past L2) for M in
// {1..64, 128, 256, 512, 1024, 4096}, chooses per M (ranges_from_times: within --tolerance of the
// fastest at every measured M, fewest ranges), writes the table, and prints per shape M1, M2, the
// ranges and what each static choice would lose against them.
//
// Where the table goes: --out FILE; else, for --model, beside the model when that is writable
// (<model>.fdpp-dispatch.json, found there first), else the cache; for --preset, the cache
// (${FDPP_CACHE:-~/.cache/fdpp}/dispatch/<gpu>-<SMs>sm.fdpp-dispatch.json), which every model with
// those shapes then uses. An existing file is merged into (other GPUs, dtypes and shapes kept).
#include "tune.h"

#include "subcommands.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <functional>
#include <iostream>

#include "backend/cuda/device_query.h"
#include "backend/cuda/linear_dispatch.h"
#include "backend/cuda/linear_profiler.h"
#include "runtime/environment_fallback.h"
#include "engine/linear_chooser.h"
#include "fdpp/error.h"
#include "model/hf_config.h"
#include "model/model_loader.h"

namespace fdpp {

namespace fs = std::filesystem;

// ---- shared with bench_linear.cpp ------------------------------------------------------------------

Progress::Progress(std::string label, int total, int plain_every)
    : label_(std::move(label)),
      total_(std::max(total, 1)),
      plain_every_(std::max(plain_every, 1)),
      tty_(::isatty(STDERR_FILENO) == 1),
      start_(std::chrono::steady_clock::now()) {}

void Progress::step(const std::string& what) {
  ++done_;
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  if (tty_) {
    constexpr int kWidth = 30;
    const int filled = std::min(kWidth, done_ * kWidth / total_);
    fmt::print(stderr, "\r\033[K{} [{}{}] {:3d}% {:5.1f} s  {}", label_, std::string(filled, '#'),
               std::string(kWidth - filled, ' '), done_ * 100 / total_, secs, what);
    std::fflush(stderr);
    drawn_ = true;
  } else if (done_ % plain_every_ == 0 || done_ == total_) {
    fmt::print(stderr, "{}: {}/{} ({:.1f} s) {}\n", label_, done_, total_, secs, what);
  }
}

void Progress::line(const std::string& text) {
  if (drawn_) fmt::print(stderr, "\r\033[K");
  drawn_ = false;
  fmt::print(stderr, "{}\n", text);
}

void Progress::finish() {
  if (drawn_) fmt::print(stderr, "\r\033[K");
  drawn_ = false;
}

ModelConfig tool_model_config(const std::string& model, const std::string& preset, std::string* name) {
  check(model.empty() != preset.empty(), "give exactly one of --model PATH and --preset NAME");
  if (!preset.empty()) {
    const std::string path = preset_config_path(preset);
    ModelConfig c = parse_hf_config(read_json_file(path), nullptr, path, path).config;
    if (name != nullptr) *name = preset;
    return c;
  }
  const std::string path = resolve_model_path(model);
  if (name != nullptr) *name = path;
  return describe_model(path).config;  // validated, no weights read
}

std::string describe_dispatch_for_model(const std::string& model_path, const ModelConfig& config,
                                        nlohmann::json* json) {
  std::string why;
  const auto gpus = cuda::list_gpus(&why);
  if (gpus.empty()) {
    const std::string line = fmt::format("no usable GPU ({}): the CUDA backend's dispatch does not apply", why);
    if (json != nullptr) *json = {{"available", false}, {"reason", line}};
    return line;
  }
  DispatchSelectOptions o;
  o.model_path = model_path;
  apply_linear_environment(o);  // what generate would use without flags
  const LinearChooser chooser =
      LinearChooser::load(o, gpus[0].name, gpus[0].multiprocessors, "f16", cuda::kernel_linear_limits());
  const auto shapes = unique_linear_shapes(model_linear_shapes(config));
  if (json != nullptr) {
    *json = chooser.describe_json(shapes);
    (*json)["available"] = true;
  }
  return chooser.describe(shapes);
}

// ---- fdpp tune ---------------------------------------------------------------------------------------

namespace {

struct TuneArgs {
  std::string model, preset, dtype = "f16", out, m_list = "1-64,128,256,512,1024,4096";
  double tolerance = 0.02;
  bool json = false;
};
TuneArgs g_tune;

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string loss_cell(const StaticChoiceLoss& l) {
  if (!std::isfinite(l.worst)) return "-";
  return fmt::format("{:+.1f}% (M={}), mean {:+.1f}%{}", 100 * l.worst, l.at_m, 100 * l.mean,
                     l.missing > 0 ? fmt::format(", {} M unmeasured", l.missing) : "");
}

}  // namespace

CLI::App* add_tune_command(CLI::App& app) {
  TuneArgs& a = g_tune;
  auto* t = app.add_subcommand("tune", "measure GEMV / flat GEMM / cuBLAS per linear shape and M on this GPU and "
                                       "write the dispatch table (heuristic dataflow)");
  auto* model = t->add_option("-m,--model", a.model, "model file or HF directory (its config only is read)");
  auto* preset = t->add_option("--preset", a.preset, "a config under configs/ (llama-2-7b, llama-2-13b, llama-3-8b, "
                                                      "opt-6.7b, chatglm2-6b) or a config.json path");
  model->excludes(preset);
  t->add_option("--dtype", a.dtype, "f16 or bf16")->capture_default_str();
  t->add_option("-o,--out", a.out, "table file (default: beside the model if writable, else the cache; merged "
                                   "into when it exists)");
  t->add_option("--m", a.m_list, "M values, e.g. 1-64,128,4096")->capture_default_str();
  t->add_option("--tolerance", a.tolerance, "the chosen implementation is within this fraction of the fastest at "
                                            "every measured M (the goal is 3%; 2% leaves room for noise)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 0.5));
  t->add_flag("--json", a.json, "print the full measurement as JSON instead of the summary");
  return t;
}

int run_tune() {
  const TuneArgs& a = g_tune;
  check(a.dtype == "f16" || a.dtype == "bf16", "--dtype '{}' is not one of f16, bf16", a.dtype);
  const std::vector<int> ms = parse_m_list(a.m_list, "--m");
  std::string model_name;
  const ModelConfig config = tool_model_config(a.model, a.preset, &model_name);
  const std::vector<LinearShape> shapes = unique_linear_shapes(model_linear_shapes(config));
  std::string why;
  const auto gpus = cuda::list_gpus(&why);
  check(!gpus.empty(), "fdpp tune measures the GPU: no usable GPU ({})", why);
  const cuda::DType dtype = a.dtype == "bf16" ? cuda::DType::BF16 : cuda::DType::F16;
  const LinearLimits limits = cuda::kernel_linear_limits();
  // The kernels are called here, not by an engine: their switches from the environment (FDPP_PDL,
  // FDPP_LINEAR_PDL, FDPP_CUBLASLT_TUNE, ...; environment_fallback.h).
  const cuda::KernelOptions kernels = resolve_kernel_options({});
  const cuda::KernelOptionsScope kernel_scope(kernels);

  cuda::LinearProfiler profiler(dtype);
  const cuda::GpuIdentity& gpu = profiler.gpu();
  const std::string out = a.out.empty() ? default_tune_output(a.model.empty() ? "" : model_name, gpu.name, gpu.sm_count) : a.out;
  // Before measuring: an existing table must be readable (it is merged into) and the file writable.
  DispatchFile file;
  {
    std::error_code ec;
    if (fs::exists(out, ec)) file = read_dispatch_file(out, limits);
    const fs::path parent = fs::path(out).parent_path();
    if (!parent.empty()) fs::create_directories(parent, ec);
    const std::string probe = out + ".probe";
    std::FILE* f = std::fopen(probe.c_str(), "wb");
    check(f != nullptr, "{}: cannot write the dispatch table", out);
    std::fclose(f);
    fs::remove(probe, ec);
  }

  int total = 0;
  for (size_t s = 0; s < shapes.size(); ++s)
    for (int m : ms)
      for (LinearImpl impl : kAllLinearImpls) total += m <= limits.max_m(impl);
  // Plain (non-terminal) progress: one line per shape.
  Progress progress("tune", total, total / static_cast<int>(shapes.size()));
  const auto t0 = std::chrono::steady_clock::now();

  DispatchTable table;
  table.gpu = gpu.name;
  table.sm_count = gpu.sm_count;
  table.dtype = a.dtype;
  table.tolerance = a.tolerance;
  table.created_by = fmt::format("fdpp tune {} {} --dtype {} ({}, tolerance {})",
                                 a.preset.empty() ? "--model" : "--preset", model_name, a.dtype, utc_now(),
                                 a.tolerance);
  std::vector<std::vector<std::string>> refusals(shapes.size());
  for (size_t si = 0; si < shapes.size(); ++si) {
    const LinearShape& sh = shapes[si];
    ShapeDispatch d;
    d.name = sh.name;
    d.n = sh.n;
    d.k = sh.k;
    d.measured.m = ms;
    std::string refused[kLinearImpls];
    for (LinearImpl impl : kAllLinearImpls) d.measured.us[static_cast<int>(impl)].assign(ms.size(), NAN);
    for (size_t i = 0; i < ms.size(); ++i) {
      for (LinearImpl impl : kAllLinearImpls) {
        if (ms[i] > limits.max_m(impl)) continue;
        const cuda::LinearTiming t = profiler.time(impl, ms[i], sh.n, sh.k);
        d.measured.us[static_cast<int>(impl)][i] = t.us;
        if (!std::isfinite(t.us) && refused[static_cast<int>(impl)].empty())
          refused[static_cast<int>(impl)] = fmt::format("{} refused M={}: {}", linear_impl_name(impl), ms[i], t.why);
        progress.step(fmt::format("{} [{}, {}] M={} {}", sh.name, sh.n, sh.k, ms[i], linear_impl_name(impl)));
      }
    }
    profiler.release();
    for (const std::string& r : refused)
      if (!r.empty()) refusals[si].push_back(r);
    d.ranges = ranges_from_times(d.measured, a.tolerance, limits);
    table.shapes.push_back(std::move(d));
  }
  progress.finish();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  merge_dispatch_table(file, table);
  write_dispatch_file(file, out);

  // What each static choice loses against the table (the paper: up to 50.25% for one choice).
  const auto current_rule = [](int m) { return m <= 1 ? LinearImpl::Gemv : LinearImpl::Cublas; };
  const auto fallback = [&](int m) { return fallback_choice(m, limits); };
  auto forced = [&](LinearImpl impl) { return [impl, &limits](int m) { return forced_choice(impl, m, limits); }; };
  if (a.json) {
    nlohmann::ordered_json j;
    j["gpu"] = gpu.name;
    j["sm_count"] = gpu.sm_count;
    j["dtype"] = a.dtype;
    j["model"] = model_name;
    j["out"] = out;
    j["seconds"] = secs;
    j["tolerance"] = a.tolerance;
    nlohmann::ordered_json sj = nlohmann::ordered_json::array();
    const nlohmann::ordered_json tj = dispatch_file_json(DispatchFile{out, {table}});
    for (size_t si = 0; si < table.shapes.size(); ++si) {
      const ShapeDispatch& d = table.shapes[si];
      nlohmann::ordered_json e = tj["tables"][0]["shapes"][si];
      e["ranges_text"] = d.ranges_string();
      nlohmann::ordered_json loss;
      auto put = [&](const char* name, const StaticChoiceLoss& l) {
        loss[name] = {{"worst", std::isfinite(l.worst) ? nlohmann::ordered_json(l.worst) : nullptr},
                      {"at_m", l.at_m},
                      {"mean", std::isfinite(l.mean) ? nlohmann::ordered_json(l.mean) : nullptr},
                      {"unmeasured", l.missing}};
      };
      for (LinearImpl impl : kAllLinearImpls) put(linear_impl_name(impl), static_choice_loss(d.measured, d.ranges, forced(impl)));
      put("gemv_m1_then_cublas", static_choice_loss(d.measured, d.ranges, current_rule));
      put("fallback_rule", static_choice_loss(d.measured, d.ranges, fallback));
      // The chosen one against the fastest at each M (<= tolerance by construction).
      StaticChoiceLoss vs_best;
      for (size_t i = 0; i < d.measured.m.size(); ++i) {
        double best = INFINITY;
        for (LinearImpl impl : kAllLinearImpls)
          if (std::isfinite(d.measured.at(impl, i))) best = std::min(best, d.measured.at(impl, i));
        const double r = d.measured.at(d.choose(d.measured.m[i]), i) / best - 1.0;
        if (!(r <= vs_best.worst)) {
          vs_best.worst = r;
          vs_best.at_m = d.measured.m[i];
        }
      }
      put("chosen_vs_fastest", vs_best);
      e["loss_vs_chosen"] = loss;
      e["refused"] = refusals[si];
      sj.push_back(e);
    }
    j["shapes"] = sj;
    std::cout << j.dump(1) << "\n";
    return 0;
  }

  fmt::print("fdpp tune: {} | {} ({} SMs) | {} | {} M values | {:.1f} s | wrote {}\n\n", model_name, gpu.name,
             gpu.sm_count, a.dtype, ms.size(), secs, out);
  fmt::print("| shape | [N, K] | M1 | M2 | ranges | static gemv | static flat | static cublas | GEMV M=1 + cuBLAS "
             "| fallback rule |\n");
  fmt::print("| --- | --- | ---: | ---: | --- | --- | --- | --- | --- | --- |\n");
  for (const ShapeDispatch& d : table.shapes) {
    fmt::print("| {} | [{}, {}] | {} | {} | {} | {} | {} | {} | {} | {} |\n", d.name, d.n, d.k, d.m1(), d.m2(),
               d.ranges_string(), loss_cell(static_choice_loss(d.measured, d.ranges, forced(LinearImpl::Gemv))),
               loss_cell(static_choice_loss(d.measured, d.ranges, forced(LinearImpl::Flat))),
               loss_cell(static_choice_loss(d.measured, d.ranges, forced(LinearImpl::Cublas))),
               loss_cell(static_choice_loss(d.measured, d.ranges, current_rule)),
               loss_cell(static_choice_loss(d.measured, d.ranges, fallback)));
  }
  fmt::print("\nStatic columns: the time of always using that implementation (the next one up beyond its max M: "
             "gemv <= {}, flat <= {}) over the table's choice, worst over the measured M and mean.\n",
             limits.gemv_max_m, limits.flat_max_m);
  for (size_t si = 0; si < shapes.size(); ++si)
    for (const std::string& r : refusals[si]) fmt::print("note: {} [{}, {}]: {}\n", shapes[si].name, shapes[si].n,
                                                         shapes[si].k, r);
  return 0;
}

}  // namespace fdpp

namespace fdpp::cli {

Subcommand register_tune(CLI::App& app) { return {add_tune_command(app), run_tune}; }

}  // namespace fdpp::cli
