// What the CLI's subcommands share: the usage-error type (exit 2), the generate flags, checked
// writes to stdout, the model-loading progress bar and report.
#pragma once

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>

#include <string>
#include <string_view>
#include <vector>

#include "fdpp/error.h"
#include "fdpp/sampling.h"
#include "model/model_loader.h"
#include "runtime/engine_args.h"
#include "runtime/open_engine.h"

namespace fdpp::cli {

// A bad command line found after parsing (a --prompt that is empty or not UTF-8, --token-ids that
// are not numbers, flags that contradict each other): exits 2 like CLI11's own parse errors.
class UsageError : public Error {
 public:
  using Error::Error;
};

// generate's own flags; the model and the engine's are EngineArgs (runtime/engine_args.h).
struct GenerateArgs {
  std::string prompt;     // after prompt_text(): never "-", never empty when given
  std::string token_ids;
  std::string file;       // --file: a prompts file (generate_file.cpp)
  int max_tokens = 128;
  SamplingParams sampling;  // sampling.seed: the seed used (drawn at random unless --seed S)
  bool ignore_eos = false;
  bool chat = false;
  bool json = false;
  bool unordered = false;  // --file: each result as it finishes, not in input order
  std::string system;
  std::vector<std::string> stop;
  // -cnv / -i: the interactive chat (chat.cpp).
  bool interactive = false;
  bool single_turn = false;     // -st: one reply, then exit
  bool multiline = false;       // -mli: lines continue until one ends in a slash or backslash
  std::string color = "auto";   // -co: on, off, auto (on when stdout is a terminal)
  bool verbose_prompt = false;  // print each turn's rendered prompt on stderr
  ChatOptions chat_options;  // --chat-template-kwargs
};

// -ngl from habit: accepted, and said once on stderr (fdpp never splits a model between CPU and GPU).
void say_gpu_layers(const EngineArgs& args);

// A subcommand as main sees it: its CLI11 app (registered with its flags) and what runs it once the
// command line has parsed. Each subcommand's file has a register function returning one.
struct Subcommand {
  CLI::App* app = nullptr;
  std::function<int()> run;
};

// Validators whose messages are the request checks' ("0.5 must be in [1, 2^24]").
CLI::Validator real_check(std::string (*problem)(double));
CLI::Validator int_check(std::string (*problem)(int64_t));
CLI::Validator int_range(int64_t lo, int64_t hi, std::string range_text);
// The kernel switches of the engine option table (--pdl, --decode-path) for tools that run kernels
// without an engine (bench-attention).
void add_kernel_flags(CLI::App* app, EngineArgs& args);
// EngineArgs::check as a usage error (exit 2): the flags contradict each other.
void check_engine_flags(const EngineArgs& args);

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

// "1.50 GiB"
std::string human_bytes(double bytes);

// Peak resident set size of this process (VmHWM of /proc/self/status), bytes; 0 where unknown.
uint64_t peak_rss_bytes();

// The load's report beside an opened model: the progress bar while the weights stream and the
// numbers after (seconds since open, the streaming's bytes and rate, peak RSS).
class LoadReport {
 public:
  LoadReport(const std::string& label, bool quiet) : bar_(label, quiet) {}
  StreamProgressFn progress() {
    return [this](int t, int tt, uint64_t b, uint64_t bt, double s) { bar_.update(t, tt, b, bt, s); };
  }
  // After the engine exists.
  nlohmann::json stats(const OpenedModel& m);

 private:
  StreamBar bar_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

// open_model with the host load's progress bar (CPU) unless quiet.
OpenedModel open_model_with_progress(const EngineArgs& args, bool quiet);
// What a load reports it opens: the model path (the default model when none is given) or, for
// --load-format dummy, the config whose random weights are made.
std::string model_label(const EngineArgs& args);
// "load: 2.10 s (stream), peak RSS 0.61 GiB, weights 13.48 GB in 1.71 s (7.88 GB/s)"
std::string load_line(const nlohmann::json& stats);

}  // namespace fdpp::cli
