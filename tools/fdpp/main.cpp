// fdpp: the command-line front end (llama.cpp-style flags: -m, -p, -f, -n, -c, -s, -t; llama.cpp's
// multi-letter ones such as -ngl and -cnv through the table of llama_flags.h).
//   fdpp generate  text from a model (the default model when no --model is given); --file runs a
//                  prompts file as one continuously batched job (generate_file.cpp)
//   fdpp logits    logits of every position as a float32 .npy [T, vocab]
//   fdpp tokenize  text to token ids and back
//   fdpp info      what a model is and what it needs, validated without reading the weights
//   fdpp calibrate the unified-max phi per layer from the attention logits of real text
//   fdpp devices   the CPU threads and GPUs fdpp can use
//   fdpp serve     an OpenAI-compatible HTTP server (serve.cpp)
//   fdpp bench     prefill and decode speed, llama-bench style (bench.cpp; bench_cpu.cpp)
//   fdpp bench-attention, bench-linear, tune (CUDA) kernel benchmarks and the dispatch table
// Each subcommand lives in its own file (subcommands.h lists them); this file only dispatches.
// One rule for errors: every failure prints one line "fdpp: error: ..." on stderr. A bad command
// line (unknown flag or subcommand, a value out of range, a bad --prompt) exits 2 and names the
// flag; everything found later (files, models, the run itself, writing the output) exits 1.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "core/version.h"
#include "cli_common.h"
#include "fdpp/error.h"
#include "help_format.h"
#include "llama_flags.h"
#include "subcommands.h"

namespace {

// What the rewrite of llama.cpp's flags needs to know of a subcommand's own flags.
fdpp::cli::FlagLookup lookup_in(const CLI::App* sub) {
  auto find = [sub](const std::string& flag) -> const CLI::Option* {
    return sub == nullptr ? nullptr : sub->get_option_no_throw(flag);
  };
  return {[find](const std::string& flag) { return find(flag) != nullptr; },
          [find](const std::string& flag) {
            const CLI::Option* o = find(flag);
            return o != nullptr && o->get_items_expected_min() > 0;
          }};
}

}  // namespace

int main(int argc, char** argv) {
  using namespace fdpp;
  using namespace fdpp::cli;
  CLI::App app{"fdpp: fast LLM decoding (FlashDecoding++)", "fdpp"};
  app.require_subcommand(0, 1);
  // Bad flags: one line, like every other error (CLI11's default adds a second line).
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return fmt::format("fdpp: error: {} (see --help)\n", e.what());
  });
  app.set_version_flag("--version", fmt::format("fdpp {}", kVersion));
  // Set before the subcommands exist: each takes its parent's formatter.
  app.formatter(std::make_shared<HelpFormatter>());

  std::vector<Subcommand> commands{register_generate(app), register_logits(app),   register_tokenize(app),
                                   register_info(app),     register_calibrate(app), register_devices(app),
                                   register_serve(app),    register_bench(app)};
#ifdef FDPP_HAVE_CUDA
  commands.push_back(register_bench_attention(app));
  commands.push_back(register_tune(app));
  commands.push_back(register_bench_linear(app));
#endif

  // Subcommand names come from the app, so that ones registered elsewhere (serve) are listed too.
  std::string subcommands;
  bool known = false;
  std::vector<std::string> args(argv + 1, argv + argc);
  const CLI::App* chosen = nullptr;
  for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    subcommands += (subcommands.empty() ? "" : ", ") + sub->get_name();
    if (!args.empty() && sub->check_name(args[0])) chosen = sub;
  }
  known = chosen != nullptr;
  if (args.empty()) {
    fmt::print(stderr, "fdpp: error: a subcommand is required: {} (see --help)\n", subcommands);
    return 2;
  }
  if (!args[0].starts_with("-") && !known) {
    fmt::print(stderr, "fdpp: error: '{}' is not a subcommand; the subcommands are {} (see --help)\n", args[0],
               subcommands);
    return 2;
  }

  int rc = 0;
  try {
    // llama.cpp's multi-letter flags (llama_flags.h) become fdpp's, or a note, or a refusal by name.
    if (chosen != nullptr) {
      RewrittenArgs r =
          rewrite_foreign_flags(std::vector<std::string>(args.begin() + 1, args.end()), lookup_in(chosen));
      for (const std::string& note : r.notes) fmt::print(stderr, "fdpp: {}\n", note);
      r.args.insert(r.args.begin(), args[0]);
      args = std::move(r.args);
    }
    try {
      std::reverse(args.begin(), args.end());  // CLI11 takes a vector in reverse order
      app.parse(args);
    } catch (const CLI::ParseError& e) {
      const int code = app.exit(e);  // prints --help / the one-line error
      if (code != 0) return 2;       // usage errors exit 2, like getopt tools
      std::fflush(stdout);
      return std::ferror(stdout) ? 1 : 0;
    }
    if (app.get_subcommands().empty()) {
      fmt::print(stderr, "fdpp: error: a subcommand is required: {} (see --help)\n", subcommands);
      return 2;
    }
    for (const Subcommand& c : commands)
      if (c.app->parsed()) rc = c.run();
    // What was printed with fmt::print / std::cout is checked here: a full disk must not exit 0.
    if (std::fflush(stdout) != 0 || std::ferror(stdout))
      fail("standard output: write failed ({})", errno != 0 ? std::strerror(errno) : "I/O error");
  } catch (const UsageError& e) {
    std::fflush(stdout);
    fmt::print(stderr, "fdpp: error: {}\n", e.what());
    return 2;
  } catch (const fdpp::Error& e) {
    std::fflush(stdout);
    fmt::print(stderr, "fdpp: error: {}\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    fmt::print(stderr, "fdpp: error: out of memory\n");
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "fdpp: error: {}\n", e.what());
    return 1;
  }
  return rc;
}
