// What the CLI's subcommands share: the usage-error type (exit 2), the generate and device flags,
// checked writes to stdout, the model-loading progress bar.
#pragma once

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>

#include <string>
#include <string_view>
#include <vector>

#include "engine/backend_select.h"
#include "engine/environment_fallback.h"
#include "engine/linear_chooser.h"
#include "fdpp/error.h"
#include "fdpp/sampling.h"
#include "model/model_loader.h"

namespace fdpp::cli {

// A bad command line found after parsing (a --prompt that is empty or not UTF-8, --token-ids that
// are not numbers, flags that contradict each other): exits 2 like CLI11's own parse errors.
class UsageError : public Error {
 public:
  using Error::Error;
};

struct GenerateArgs {
  std::string model;
  std::string prompt;     // after prompt_text(): never "-", never empty when given
  std::string token_ids;
  std::string file;       // --file: a prompts file (generate_file.cpp)
  int max_tokens = 128;
  SamplingParams sampling;  // sampling.seed: the seed used (drawn at random unless --seed S)
  bool ignore_eos = false;
  bool chat = false;
  bool json = false;
  bool unordered = false;  // --file: each result as it finishes, not in input order
  int ctx_size = 0;
  std::string system;
  std::vector<std::string> stop;
};

// Backend flags shared by generate and logits (and serve).
struct DeviceArgs {
  std::string device = "auto";
  std::string dtype = "auto";
  int64_t kv_cache_tokens = 0;
  bool no_cuda_graphs = false;
  std::string attention = "async";
  std::string linear;  // "": FDPP_LINEAR, else auto
  std::string dispatch_table;
  KernelFlags kernels;  // --pdl, --decode-path
  std::string calibration;
  int threads = 0;
  int n_gpu_layers = -1;  // -1: not given
  bool quiet = false;     // no load progress bar or load line
  std::string cpu_weights = "stored";  // stored: the CPU fast path; f32: the fp32 reference
  int tensor_parallel = 1;             // GPUs the model is split over (-tp)

  void add_to(CLI::App* app);
  // model_path: where to look for the model's calibration and dispatch table.
  RunnerOptions options(const std::string& model_path) const;
  void check_flags() const;      // throws UsageError for contradicting flags
  void say_gpu_layers() const;   // the one stderr line about -ngl, when it was given
  // How to load the model: a GGUF's weights in their stored format when it will run on the CPU
  // fast path (--cpu-weights stored, the default), else dequantized to fp32 (the CPU reference,
  // calibration, the CUDA upload).
  LoadOptions load_options() const;
};

// --pdl on|off and --decode-path auto|mma|core, into `flags` (resolve_kernel_options falls back to
// FDPP_PDL and FDPP_DECODE_PATH where they are not given).
inline void add_kernel_flags(CLI::App* app, KernelFlags& flags) {
  app->add_option("--pdl", flags.pdl,
                  "CUDA: programmatic dependent launch of the decode step's kernels, on or off (default: $FDPP_PDL, "
                  "else on)")
      ->check(CLI::IsMember({"on", "off"}));
  app->add_option("--decode-path", flags.decode_path,
                  "CUDA decode attention's loop: auto, mma (tensor cores) or core (CUDA cores; head dims 64, 128) "
                  "(default: $FDPP_DECODE_PATH, else auto)")
      ->check(CLI::IsMember({"auto", "mma", "core"}));
}

std::vector<int32_t> parse_token_ids(const std::string& text);  // throws UsageError naming --token-ids
// Writes and flushes; throws fdpp::Error when stdout cannot take it (a full disk, a closed pipe).
void write_stdout(std::string_view text);
// The text of a prompt flag; "-" reads stdin. Throws UsageError naming the flag when it is empty or
// not valid UTF-8.
std::string prompt_text(const std::string& flag, const std::string& value);

// A progress bar on stderr while a model loads, only when stderr is a terminal.
class LoadProgress {
 public:
  explicit LoadProgress(std::string label);
  ProgressFn callback();
  void finish();

 private:
  static constexpr int kWidth = 30;
  std::string label_;
  bool enabled_;
  int last_ = -1;
};

LoadedModel load_with_progress(const std::string& path, const LoadOptions& options = {});

// The GPU load's progress bar on stderr (tensors, GB as stored, GB/s), only when stderr is a
// terminal and not --quiet.
class StreamBar {
 public:
  StreamBar(std::string label, bool quiet) : label_(std::move(label)), enabled_(!quiet && ::isatty(STDERR_FILENO) == 1) {}
  void update(int tensors_done, int tensors_total, uint64_t bytes_done, uint64_t bytes_total, double seconds) {
    seconds_ = seconds;
    bytes_ = bytes_done;
    if (!enabled_) return;
    const double f = bytes_total > 0 ? static_cast<double>(bytes_done) / static_cast<double>(bytes_total) : 1.0;
    const int filled = static_cast<int>(f * kWidth);
    if (filled == last_filled_ && seconds - last_print_ < 0.1 && tensors_done != tensors_total) return;
    last_filled_ = filled;
    last_print_ = seconds;
    fmt::print(stderr, "\r{} [{}{}] {}/{} tensors {:.2f}/{:.2f} GB {:.2f} GB/s\033[K", label_, std::string(filled, '#'),
               std::string(kWidth - filled, ' '), tensors_done, tensors_total, bytes_done / 1e9, bytes_total / 1e9,
               seconds > 0 ? bytes_done / 1e9 / seconds : 0.0);
    std::fflush(stderr);
    printed_ = true;
  }
  void finish() {
    if (printed_) fmt::print(stderr, "\r\033[K");
  }
  double seconds() const { return seconds_; }
  uint64_t bytes() const { return bytes_; }

 private:
  static constexpr int kWidth = 30;
  std::string label_;
  bool enabled_;
  bool printed_ = false;
  int last_filled_ = -1;
  double last_print_ = -1;
  double seconds_ = 0;
  uint64_t bytes_ = 0;
};

// Peak resident set size of this process (VmHWM of /proc/self/status), bytes; 0 where unknown.
uint64_t peak_rss_bytes();

// A model as its backend takes it: on the GPU a plan that the runner streams from the files (no
// host copy), on the CPU fp32 host weights. options() points the runner at the plan and the bar.
struct CliModel {
  std::string path;
  ModelDescription description;
  DecoderWeights weights;  // CPU
  WeightPlan plan;         // CUDA
  bool planned = false;
  std::unique_ptr<Tokenizer> tokenizer;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  std::unique_ptr<StreamBar> bar;
  const ModelConfig& config() const { return description.config; }

  RunnerOptions options(const DeviceArgs& d) {
    RunnerOptions o = d.options(path);
    if (planned) {
      o.plan = &plan;
      o.load_progress = [this](int t, int tt, uint64_t b, uint64_t bt, double s) { bar->update(t, tt, b, bt, s); };
    }
    return o;
  }
  // After the runner exists: the load's numbers (seconds since open_model, the weights' streaming).
  nlohmann::json load_stats() {
    if (bar) bar->finish();
    const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    nlohmann::json j{{"seconds", total},
                     {"path", planned ? "stream" : "host"},
                     {"stored_bytes", description.stored_bytes},
                     {"peak_rss_bytes", peak_rss_bytes()}};
    if (planned && bar) {
      j["weights_seconds"] = bar->seconds();
      j["weights_gb_per_second"] = bar->seconds() > 0 ? bar->bytes() / 1e9 / bar->seconds() : 0.0;
    }
    return j;
  }
};

// Opens a model for the device the flags pick: plan_model for CUDA (weights streamed to the GPU by
// make_runner/make_engine through CliModel::options), load_model (fp32 host weights) for the CPU.
// quiet: no progress bar.
CliModel open_model(const std::string& path, const DeviceArgs& d, bool quiet);
// "load: 2.10 s (stream), peak RSS 0.61 GiB, weights 13.48 GB in 1.71 s (7.88 GB/s)"
std::string load_line(const nlohmann::json& stats);

}  // namespace fdpp::cli
