// What the CLI's subcommands share: the usage-error type (exit 2), the generate and device flags,
// checked writes to stdout, the model-loading progress bar.
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <string_view>
#include <vector>

#include "engine/backend_select.h"
#include "fdpp/error.h"
#include "fdpp/sampling.h"
#include "io/model_loader.h"

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
  std::string calibration;
  int threads = 0;
  int n_gpu_layers = -1;  // -1: not given

  void add_to(CLI::App* app);
  // model_path: where to look for the model's calibration and dispatch table.
  RunnerOptions options(const std::string& model_path) const;
  void check_flags() const;      // throws UsageError for contradicting flags
  void say_gpu_layers() const;   // the one stderr line about -ngl, when it was given
};

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

LoadedModel load_with_progress(const std::string& path);

}  // namespace fdpp::cli
