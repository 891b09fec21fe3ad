// fdpp tune and fdpp bench-linear (CUDA builds): the linear-layer dispatch table and the
// implementations' benchmark. See tune.cpp and bench_linear.cpp.
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <string>
#include <vector>

#include "fdpp/model_config.h"
#include "tune_table.h"

namespace fdpp {

// Adds the subcommand to app; its flags live until the matching run_*() (call it when the
// returned subcommand was parsed).
CLI::App* add_tune_command(CLI::App& app);
int run_tune();
CLI::App* add_bench_linear_command(CLI::App& app);
int run_bench_linear();

// fdpp info's dispatch line(s) for a model on the present GPU (f16, the engine's default dtype):
// the table in use, from where, and M1/M2/ranges per shape; one line saying why not when there is
// no usable GPU. *json (when given) receives the same as JSON.
std::string describe_dispatch_for_model(const std::string& model_path, const ModelConfig& config,
                                        nlohmann::json* json);

// The config of --model PATH (read without weights) or --preset NAME (configs/NAME.json); exactly
// one of the two. *name receives what to call it in reports.
ModelConfig tool_model_config(const std::string& model, const std::string& preset, std::string* name);

// Progress on stderr: a bar redrawn in place when stderr is a terminal, else a plain line every
// `plain_every` steps and at the end.
class Progress {
 public:
  Progress(std::string label, int total, int plain_every);
  void step(const std::string& what);  // one more done; `what` is shown beside the bar
  void line(const std::string& text);  // a plain line (clears the bar first)
  void finish();

 private:
  std::string label_;
  int total_, done_ = 0, plain_every_;
  bool tty_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace fdpp
