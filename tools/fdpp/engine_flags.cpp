#include "engine_flags.h"

#include <map>

namespace fdpp::cli {

namespace {

// --help's topic of each option of the table (the CLI's view; the table itself has no groups).
std::string help_group(const std::string& name) {
  static const std::map<std::string, std::string> groups = {
      {"model", "Model"},         {"load_format", "Model"},      {"config", "Model"},
      {"dtype", "Model"},         {"calibration", "Model"},      {"device", "Devices"},
      {"threads", "Devices"},     {"cpu_weights", "Devices"},    {"tensor_parallel", "Devices"},
      {"n_gpu_layers", "Devices"}, {"attention", "Kernels"},     {"linear", "Kernels"},
      {"dispatch_table", "Kernels"}, {"pdl", "Kernels"},         {"decode_path", "Kernels"},
      {"cuda_graphs", "Kernels"}, {"enforce_eager", "Kernels"}, {"step_log", "Diagnostics"}};
  const auto it = groups.find(name);
  return it == groups.end() ? "Engine (context, KV cache, batching)" : it->second;
}

}  // namespace

void add_engine_flags(CLI::App* app, EngineArgs& args, FrontEnd front_end) {
  const EngineArgs defaults;
  for (const EngineOption& o : engine_options()) {
    if ((o.front_ends & front_end) == 0 || o.flags.empty()) continue;
    std::string help = o.help;
    if (!o.env.empty()) help += " ($" + o.env + " when not given)";
    if (o.kind == OptionKind::Switch) {
      app->add_flag_callback(o.flags, [&args, &o] { o.assign(args, o.flag_value ? "true" : "false"); }, help)
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
