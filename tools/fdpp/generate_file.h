// fdpp generate --file: a prompts file (engine/prompt_file.h) run as one continuously batched job
// on the Scheduler, results written as JSON Lines.
#pragma once

#include "cli_common.h"

namespace fdpp::cli {

int run_generate_file(const GenerateArgs& args, const EngineArgs& engine, bool quiet);

}  // namespace fdpp::cli
