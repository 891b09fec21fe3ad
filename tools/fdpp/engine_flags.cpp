#include "engine_flags.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace fdpp::cli {

namespace {

// --help's topic of each option of the table (the CLI's view; the table itself has no groups).
std::string help_group(const std::string& name) {
  static const std::vector<std::pair<std::string, std::vector<std::string>>> groups = {
      {"Model", {"model", "load_format", "config", "dtype", "calibration"}},
      {"Devices", {"device", "threads", "cpu_weights", "gpu_weights", "tensor_parallel", "n_gpu_layers"}},
      {"Kernels", {"attention", "prefill_attention", "linear", "dispatch_table", "pdl", "decode_path", "cuda_graphs",
                   "enforce_eager"}},
      {"Diagnostics", {"step_log"}},
  };
  for (const auto& [group, names] : groups)
    if (std::find(names.begin(), names.end(), name) != names.end()) return group;
  return "Engine (context, KV cache, batching)";
}

}  // namespace

void add_engine_flags(CLI::App* app, EngineArgs& args, FrontEnd front_end) {
  const EngineArgs defaults;
  for (const EngineOption& o : engine_options()) {
    if ((o.front_ends & front_end) == 0 || o.flags.empty()) continue;
    std::string help = o.help;
    if (!o.env.empty()) help += " ($" + o.env + " when not given)";
    if (o.kind == OptionKind::Switch) {
      app->add_flag_callback(
             o.flags, [&args, &o] { o.assign(args, o.flag_value ? "true" : "false"); }, help)
          ->group(help_group(o.name));
      continue;
    }
    CLI::Option* opt =
        app->add_option_function<std::string>(o.flags, [&args, &o](const std::string& v) { o.assign(args, v); }, help);
    opt->check(CLI::Validator([&o](std::string& v) { return option_problem(o, v); }, ""));
    opt->group(help_group(o.name));
    opt->type_name(o.kind == OptionKind::Integer ? "INT"
                   : o.kind == OptionKind::Real ? "NUM"
                   : o.kind == OptionKind::Choice ? "CHOICE"
                                                  : "TEXT");
    if (const std::string d = o.value(defaults); !d.empty() && o.env.empty()) opt->default_str(d);
  }
}

}  // namespace fdpp::cli
