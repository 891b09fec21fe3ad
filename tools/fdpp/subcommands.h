// The subcommands of the fdpp CLI, one file each (generate.cpp, logits.cpp, serve.cpp, ...): each
// registers its flags on the app and returns what runs it. main.cpp only dispatches.
#pragma once

#include <CLI/CLI.hpp>

#include "cli_common.h"

namespace fdpp::cli {

Subcommand register_generate(CLI::App& app);
Subcommand register_logits(CLI::App& app);
Subcommand register_tokenize(CLI::App& app);
Subcommand register_info(CLI::App& app);
Subcommand register_calibrate(CLI::App& app);
Subcommand register_devices(CLI::App& app);
Subcommand register_serve(CLI::App& app);
// CUDA builds: the GPU benchmark (with --device cpu the CPU's llama-bench table); CPU-only builds:
// the CPU's table alone.
Subcommand register_bench(CLI::App& app);
#ifdef FDPP_HAVE_CUDA
Subcommand register_bench_attention(CLI::App& app);
Subcommand register_tune(CLI::App& app);
Subcommand register_bench_linear(CLI::App& app);
#endif

}  // namespace fdpp::cli
