// The engine options of runtime/engine_args.h as a subcommand's flags: every front end registers
// the table's options it takes, with the table's ranges, choices, help and messages.
#pragma once

#include <CLI/CLI.hpp>

#include "runtime/engine_args.h"

namespace fdpp::cli {

// Adds the flags of every option that `front_end` takes; their values land in `args` (which must
// outlive the app). Bad values are CLI11 validation errors ("--max-num-seqs: 0 must be in [1, 4096]").
void add_engine_flags(CLI::App* app, EngineArgs& args, FrontEnd front_end);

}  // namespace fdpp::cli
