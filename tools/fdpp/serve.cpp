// fdpp serve: loads a model behind an OpenAI-compatible HTTP API (src/server/) with continuous
// batching (src/engine/scheduler.h).
//
// Threads: the HTTP pool (one thread per connection), the engine thread (Scheduler::run(): every
// engine step and every callback), a loader thread while the model loads (the server listens from
// the start, so /health answers 503 "loading"), and the main thread, which only waits for signals:
// SIGINT / SIGTERM start the drain (new requests 503, running and queued ones finish, exit 0);
// SIGUSR1 is the other threads' "a fatal error happened" (exit 1). A second SIGINT/SIGTERM while
// draining exits at once (130).
#include <fmt/format.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "cli_common.h"
#include "engine/scheduler.h"
#include "engine_flags.h"
#include "fdpp/error.h"
#include "model/model_loader.h"
#include "runtime/open_engine.h"
#include "server/http_server.h"
#include "subcommands.h"

namespace fdpp {
namespace {

// Options of the server itself; the engine's come from the table (runtime/engine_args.h).
struct ServeArgs {
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string api_key;
  std::string served_model_name;
  int max_waiting = 1024;
  int http_threads = 0;
  int64_t max_body_bytes = 8 << 20;
  std::vector<std::string> allowed_origins;
  bool disable_log_requests = false;
  EngineArgs engine;
};
// The server's automatic step: shorter on the GPU than generate -f's (EngineArgs::auto_gpu_step_tokens).
ServeArgs make_serve_args() {
  ServeArgs a;
  a.engine.auto_gpu_step_tokens = 2048;
  return a;
}
ServeArgs g_serve = make_serve_args();

server::ModelInfo model_info(const std::string& given, const std::string& resolved, const ModelConfig& config,
                             int max_context, const std::string& served_name) {
  server::ModelInfo info;
  // The id clients name the model by: the file or directory name (as llama-server and vLLM show
  // a local path's last component); the path as given and as resolved are accepted too.
  std::filesystem::path p(resolved);
  std::string leaf = p.filename().string();
  if (leaf.empty()) leaf = p.parent_path().filename().string();
  info.id = served_name.empty() ? leaf : served_name;
  for (const std::string& a : {leaf, given, resolved})
    if (!a.empty() && a != info.id) info.aliases.push_back(a);
  info.max_context = max_context;
  info.vocab_size = config.vocab_size;
  info.created = static_cast<int64_t>(std::time(nullptr));
  return info;
}

// The model id clients see: --served-model-name, else the file or directory name (a dummy model:
// its config's name + "-dummy").
server::ModelInfo info_of(const ServeArgs& a, const OpenedEngine& e) {
  const EngineArgs& g = a.engine;
  if (e.model.dummy) {
    const std::string name = std::filesystem::path(g.config).stem().string() + "-dummy";
    return model_info(g.config, std::filesystem::absolute(g.config).string(), e.model.config(),
                      e.engine->max_context(), a.served_model_name.empty() ? name : a.served_model_name);
  }
  return model_info(g.model, e.model.path, e.model.config(), e.engine->max_context(), a.served_model_name);
}

}  // namespace

CLI::App* add_serve_command(CLI::App& app) {
  ServeArgs& a = g_serve;
  auto* s = app.add_subcommand("serve", "OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions) with "
                                        "continuous batching");
  const std::string kServer = "Server";
  s->add_option("--host", a.host, "address to listen on")->capture_default_str()->group(kServer);
  s->add_option("--port", a.port, "TCP port (0: any free port, printed at start)")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535))
      ->group(kServer);
  s->add_option("--api-key", a.api_key,
                "require 'Authorization: Bearer KEY' on /v1/* (default: $FDPP_API_KEY, else none)")
      ->envname("FDPP_API_KEY")
      ->group(kServer);
  s->add_option("--served-model-name", a.served_model_name,
                "the model id clients use (default: the file or directory name)")
      ->group(kServer);
  s->add_option("--max-waiting", a.max_waiting, "queued requests beyond which the server answers 503 + Retry-After")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20))
      ->group(kServer);
  s->add_option("--http-threads", a.http_threads,
                "HTTP worker threads; each streamed response holds one (default: 2 x max-num-seqs + 16, at least 64)")
      ->check(CLI::Range(1, 8192))
      ->group(kServer);
  s->add_option("--max-body-bytes", a.max_body_bytes, "request bodies above this get 413")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1024}, int64_t{1} << 30))
      ->group(kServer);
  s->add_option("--allowed-origins", a.allowed_origins,
                "CORS: origins (scheme://host[:port], or *) whose pages may call the server, comma-separated "
                "(default: none, no CORS headers)")
      ->delimiter(',')
      ->check([](const std::string& o) { return server::origin_problem(o); })
      ->group(kServer);
  s->add_flag("--disable-log-requests", a.disable_log_requests, "no log line per finished request")->group(kServer);
  cli::add_engine_flags(s, a.engine, kServe);
  return s;
}

int run_serve() {
  const ServeArgs& a = g_serve;
  // The signals main waits for are blocked in every thread (threads inherit the mask), so they are
  // delivered to sigwait below and never interrupt the engine or an HTTP write. SIGPIPE: a client
  // that closed its socket must be a failed write (which cancels its request), not the end of us.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
  const pthread_t main_thread = pthread_self();

  std::mutex fatal_mutex;
  std::string fatal;  // why SIGUSR1 was sent
  auto die = [&](const std::string& why) {
    {
      std::lock_guard lock(fatal_mutex);
      if (fatal.empty()) fatal = why;
    }
    pthread_kill(main_thread, SIGUSR1);
  };

  server::ServerOptions so;
  so.host = a.host;
  so.port = a.port;
  so.api_key = a.api_key;
  // Each open stream holds an HTTP thread: room for every running request twice (the GPU's sizes when
  // the device is not yet known) and some for /health and /metrics.
  const Device sized_for = a.engine.requested_device() == Device::Cpu ? Device::Cpu : Device::Cuda;
  so.http_threads =
      a.http_threads > 0 ? a.http_threads : std::max(64, 2 * a.engine.step_sizes(sized_for).max_num_seqs + 16);
  so.limits.max_body_bytes = a.max_body_bytes;
  so.allowed_origins = a.allowed_origins;
  so.log_requests = !a.disable_log_requests;
  server::HttpServer http(so);
  http.start([&] { die("the HTTP listener stopped"); });
  const EngineArgs& g = a.engine;
  fmt::print(stderr, "fdpp serve: listening on http://{}:{} (loading {})\n", a.host, http.port(), cli::model_label(g));

  std::unique_ptr<OpenedEngine> loaded;
  std::thread engine_thread;
  std::thread loader([&] {
    try {
      loaded = open_engine(a.engine, a.max_waiting);
      check(loaded->scheduler != nullptr, "{}: no tokenizer files; serve needs one for text prompts", loaded->model.path);
      const server::ModelInfo info = info_of(a, *loaded);
      http.attach(*loaded->scheduler, info, server::prompt_codec_for(*loaded->model.tokenizer));
      engine_thread = std::thread([&] {
        try {
          loaded->scheduler->run();
        } catch (const std::exception& e) {
          die(fmt::format("engine: {}", e.what()));
        }
      });
      fmt::print(stderr, "fdpp serve: ready: model '{}' on {}, context {}, {} KV blocks of {} tokens{}, max-num-seqs {}\n",
                 info.id, device_description(loaded->model.device, a.engine.tensor_parallel), info.max_context, loaded->engine->kv().num_blocks(),
                 loaded->engine->kv().block_size(),
                 a.engine.kv_cache_dtype == "auto" ? std::string() : " in " + a.engine.kv_cache_dtype,
                 loaded->scheduler->options().max_num_seqs);
    } catch (const std::exception& e) {
      die(e.what());
    }
  });

  int sig = 0;
  sigwait(&set, &sig);
  if (sig == SIGUSR1) {
    loader.join();
    std::string why;
    {
      std::lock_guard lock(fatal_mutex);
      why = fatal;
    }
    // A failed engine leaves requests waiting for callbacks that never come: exit without the
    // orderly teardown (threads blocked on them would never join).
    std::fflush(stdout);
    fmt::print(stderr, "fdpp: error: {}\n", why);
    std::fflush(stderr);
    std::_Exit(1);
  }
  if (!http.ready()) {
    // Loading cannot be interrupted midway; nothing is running, so leave at once.
    fmt::print(stderr, "fdpp serve: {} while loading; exiting\n", strsignal(sig));
    std::_Exit(0);
  }
  loader.join();
  fmt::print(stderr, "fdpp serve: {}: finishing {} running and {} waiting requests\n", strsignal(sig),
             loaded->scheduler->stats().running, loaded->scheduler->stats().waiting);
  // A second signal while draining (a stuck client, an impatient operator) ends the process.
  std::thread([set] {
    int again = 0;
    sigwait(&set, &again);
    fmt::print(stderr, "fdpp serve: {} again while draining; exiting without finishing\n", strsignal(again));
    std::_Exit(again == SIGUSR1 ? 1 : 130);
  }).detach();
  http.drain();
  if (engine_thread.joinable()) engine_thread.join();
  http.stop();
  fmt::print(stderr, "fdpp serve: stopped\n");
  return 0;
}

}  // namespace fdpp

namespace fdpp::cli {

Subcommand register_serve(CLI::App& app) {
  auto* s = add_serve_command(app);
  return {s, [] {
            check_engine_flags(g_serve.engine);
            say_gpu_layers(g_serve.engine);
            return run_serve();
          }};
}

}  // namespace fdpp::cli
