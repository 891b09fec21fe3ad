#include "engine_flags.h"

namespace fdpp::cli {

void add_engine_flags(CLI::App* app, EngineArgs& args, FrontEnd front_end) {
  const EngineArgs defaults;
  for (const EngineOption& o : engine_options()) {
    if ((o.front_ends & front_end) == 0 || o.flags.empty()) continue;
    std::string help = o.help;
    if (!o.env.empty()) help += " ($" + o.env + " when not given)";
    if (o.kind == OptionKind::Switch) {
      app->add_flag_callback(o.flags, [&args, &o] { o.assign(args, o.flag_value ? "true" : "false"); }, help);
      continue;
    }
    CLI::Option* opt =
        app->add_option_function<std::string>(o.flags, [&args, &o](const std::string& v) { o.assign(args, v); }, help);
    opt->check(CLI::Validator([&o](std::string& v) { return option_problem(o, v); }, ""));
    opt->type_name(o.kind == OptionKind::Integer ? "INT"
                   : o.kind == OptionKind::Real ? "NUM"
                   : o.kind == OptionKind::Choice ? "CHOICE"
                                                  : "TEXT");
    if (const std::string d = o.value(defaults); !d.empty() && o.env.empty()) opt->default_str(d);
  }
}

}  // namespace fdpp::cli
