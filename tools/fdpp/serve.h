// fdpp serve: the OpenAI-compatible HTTP server over the continuous-batching scheduler. See
// serve.cpp and src/server/.
#pragma once

#include <CLI/CLI.hpp>

namespace fdpp {

// Adds the subcommand to app; its flags live until run_serve() (call it when the returned
// subcommand was parsed).
CLI::App* register_serve(CLI::App& app);
int run_serve();

}  // namespace fdpp
