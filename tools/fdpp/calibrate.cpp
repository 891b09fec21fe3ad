// fdpp calibrate: the unified-max phi of each layer from the attention logits of real text, run on
// the CPU reference backend (runtime/calibrate.h).
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "subcommands.h"
#include <filesystem>

#include "attention/calibration.h"
#include "runtime/backend_select.h"
#include "runtime/calibrate.h"

namespace fdpp::cli {

namespace {

struct CalibrateArgs {
  std::string model, prompts, out;
  double percentile = 99.0;
  int max_tokens = 0;
};

int run_calibrate(const CalibrateArgs& a) {
  // The prompts first: a bad prompts file fails before the model loads.
  const std::vector<std::string> prompts =
      a.prompts.empty() ? builtin_calibration_prompts() : read_calibration_prompts(a.prompts);
  const std::string path = resolve_model_path(a.model);
  const std::string out = a.out.empty() ? default_calibration_output(path) : a.out;
  {
    // Fail before the model loads and the text runs when the output cannot be written.
    std::error_code ec;
    const std::filesystem::path parent = std::filesystem::path(out).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
    const std::string probe = out + ".probe";
    std::FILE* f = std::fopen(probe.c_str(), "wb");
    check(f != nullptr, "{}: cannot write the calibration file", out);
    std::fclose(f);
    std::filesystem::remove(probe, ec);
  }
  LoadedModel m = load_with_progress(path);
  CalibrationOptions opt;
  opt.percentile = a.percentile;
  opt.max_tokens_per_prompt = a.max_tokens;
  Calibration cal = calibrate_on_cpu(m, path, prompts, opt);
  write_calibration(cal, out);
  for (size_t i = 0; i < cal.layers.size(); ++i) {
    const LayerCalibration& l = cal.layers[i];
    fmt::print("layer {:3d}: phi {:8.3f}  row max [{:8.3f}, {:8.3f}]  logits [{:9.3f}, {:9.3f}]  fallback {:.3f}%\n", i,
               l.bounds.phi, l.row_max.at("min"), l.row_max.at("max"), l.logits.at("min"), l.logits.at("max"),
               100.0 * l.fallback_rate);
  }
  fmt::print("wrote {}: {} prompts, {} tokens, {} layers, phi in [{:.3f}, {:.3f}], [a, b] = [{:.2f}, {:.2f}], "
             "fallback {:.3f}% of rows\n",
             cal.path, cal.prompts, cal.tokens, cal.layers.size(), cal.phi_min(), cal.phi_max(),
             cal.layers[0].bounds.a, cal.layers[0].bounds.b, 100.0 * cal.fallback_rate());
  return 0;
}

}  // namespace

Subcommand register_calibrate(CLI::App& app) {
  static CalibrateArgs cal;
  static int cal_threads = 0;
  auto* calibrate = app.add_subcommand("calibrate", "choose the unified-max phi per layer from real text (CPU)");
  calibrate->add_option("-m,--model", cal.model, "GGUF file or HF model directory (default: the default model)");
  calibrate->add_option("--prompts", cal.prompts, "text file, one prompt per blank-line-separated paragraph "
                        "(default: a built-in English set)");
  calibrate->add_option("-o,--out", cal.out,
                        "calibration file (default: <model>.fdpp-calib.json, else the cache); another path is "
                        "loaded with --calibration FILE");
  calibrate->add_option("--percentile", cal.percentile, "phi = this percentile of each layer's row max logits")
      ->capture_default_str()->check(CLI::Range(0.001, 100.0));
  calibrate->add_option("--max-tokens", cal.max_tokens, "truncate each prompt to N tokens (0: the model's context)")
      ->check(int_range(0, 1 << 24, "[0, 2^24]"));
  calibrate->add_option("-t,--threads", cal_threads, "CPU threads (0: $OMP_NUM_THREADS, else the physical cores)")
      ->check(int_range(0, 4096, "[0, 4096]"));
  return {calibrate, [] {
            set_cpu_threads(cal_threads);
            return run_calibrate(cal);
          }};
}

}  // namespace fdpp::cli
