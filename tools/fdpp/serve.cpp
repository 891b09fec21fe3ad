// fdpp serve: loads a model behind an OpenAI-compatible HTTP API (src/server/) with continuous
// batching (src/engine/scheduler.h).
//
// Threads: the HTTP pool (one thread per connection), the engine thread (Scheduler::run(): every
// engine step and every callback), a loader thread while the model loads (the server listens from
// the start, so /health answers 503 "loading"), and the main thread, which only waits for signals:
// SIGINT / SIGTERM start the drain (new requests 503, running and queued ones finish, exit 0);
// SIGUSR1 is the other threads' "a fatal error happened" (exit 1). A second SIGINT/SIGTERM while
// draining exits at once (130).
#include "serve.h"

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

#include "attention/calibration.h"
#include "cli_common.h"
#include "engine/backend_select.h"
#include "engine/environment_fallback.h"
#include "engine/linear_chooser.h"
#include "engine/scheduler.h"
#include "fdpp/error.h"
#include "model/hf_config.h"
#include "model/model_loader.h"
#include "server/http_server.h"
#ifdef FDPP_HAVE_CUDA
#include "backend/cuda/cuda_engine.h"
#include "backend/cuda/device_model.h"
#include "backend/cuda/tensor_parallel_engine.h"
#endif

namespace fdpp {
namespace {

struct ServeArgs {
  std::string model;
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string api_key;
  std::string served_model_name;
  int max_num_seqs = 64;
  int max_batched_tokens = 2048;
  int max_waiting = 1024;
  int http_threads = 0;
  int ctx_size = 0;
  int64_t max_body_bytes = 8 << 20;
  // Backend (as generate's flags).
  std::string device = "auto";
  std::string dtype = "auto";
  int64_t kv_cache_tokens = 0;
  bool no_cuda_graphs = false;
  std::string attention = "async";
  std::string linear;
  std::string dispatch_table;
  KernelFlags kernels;
  std::string load_format = "auto";
  std::string config;
  int tensor_parallel = 1;
};
ServeArgs g_serve;

// Everything the loader thread builds; lives until run_serve returns (the scheduler references the
// engine and tokenizer, the engine the weights).
struct Loaded {
  LoadedModel model;
  std::unique_ptr<Tokenizer> dummy_tokenizer;  // --load-format dummy: no files, ids only
  std::unique_ptr<Engine> engine;
  std::unique_ptr<Scheduler> scheduler;
  server::ModelInfo info;
};

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

// --load-format dummy has no tokenizer files; the scheduler still needs a Tokenizer (end tokens,
// stop strings, text of the deltas). This one spells every id of the config's vocabulary: <unk>,
// <s>, </s>, the 256 byte tokens, then "▁t<i>". Benchmarks send token-id prompts with ignore_eos,
// so what the text looks like does not matter; it is valid UTF-8 and costs what a real one does.
[[maybe_unused]] std::unique_ptr<Tokenizer> dummy_tokenizer(int vocab_size) {
  check(vocab_size >= 300, "--load-format dummy: vocab_size {} is too small for the stand-in tokenizer", vocab_size);
  VocabSpec v;
  v.source = "dummy vocabulary";
  v.model = "llama";
  v.tokens.reserve(vocab_size);
  v.token_types.reserve(vocab_size);
  v.tokens = {"<unk>", "<s>", "</s>"};
  v.token_types = {static_cast<int32_t>(TokenType::kUnknown), static_cast<int32_t>(TokenType::kControl),
                   static_cast<int32_t>(TokenType::kControl)};
  for (int b = 0; b < 256; ++b) {
    v.tokens.push_back(fmt::format("<0x{:02X}>", b));
    v.token_types.push_back(static_cast<int32_t>(TokenType::kByte));
  }
  while (static_cast<int>(v.tokens.size()) < vocab_size) {
    v.tokens.push_back(fmt::format("\u2581t{}", v.tokens.size()));
    v.token_types.push_back(static_cast<int32_t>(TokenType::kNormal));
  }
  v.unk_id = 0;
  v.bos_id = 1;
  v.eos_id = 2;
  v.add_bos = false;
  return Tokenizer::from_vocab(v);
}

void load_dummy(const ServeArgs& a, Loaded& out) {
#ifdef FDPP_HAVE_CUDA
  check(!a.config.empty(), "--load-format dummy needs --config FILE.json (see configs/)");
  check(a.device != "cpu", "--load-format dummy builds random weights on the GPU; it has no CPU form");
  (void)resolve_device(Device::Cuda);  // a clear error without a GPU
  const ModelConfig config = parse_hf_config(read_json_file(a.config), nullptr, a.config, a.config).config;
  check(a.dtype == "auto" || a.dtype == "f16" || a.dtype == "bf16", "--dtype '{}' is not one of auto, f16, bf16", a.dtype);
  const cuda::DType dtype = a.dtype == "bf16" ? cuda::DType::BF16 : cuda::DType::F16;
  // As make_engine does for real weights (fdpp bench --load-format dummy uses the same seed).
  cuda::EngineOptions eo;
  eo.max_batch = a.max_num_seqs;
  eo.max_prefill_tokens = a.max_batched_tokens;
  eo.kv_cache_tokens = a.kv_cache_tokens;
  eo.cuda_graphs = !a.no_cuda_graphs;
  eo.attention = a.attention == "sync" ? cuda::AttentionMode::Sync : cuda::AttentionMode::Async;
  // Flags first, the environment where one is not given (environment_fallback.h).
  const DispatchSelectOptions linear_options = resolve_linear_flags(a.linear, a.dispatch_table);
  eo.linear_mode = linear_options.mode;
  eo.dispatch_table = linear_options.table_path;
  eo.gemv_max_m = linear_options.gemv_max_m;
  eo.kernels = resolve_kernel_options(a.kernels);
  if (a.tensor_parallel > 1) {
    cuda::ShardSource source;  // random shards (no plan)
    source.dtype = dtype;
    out.engine = std::make_unique<cuda::TensorParallelEngine>(config, a.tensor_parallel, source, eo);
  } else {
    out.engine = std::make_unique<cuda::CudaEngine>(
        std::make_shared<const cuda::DeviceModel>(cuda::DeviceModel::dummy(config, dtype, 1234)), eo);
  }
  out.dummy_tokenizer = dummy_tokenizer(config.vocab_size);
  SchedulerOptions so;
  so.max_num_seqs = a.max_num_seqs;
  so.max_batched_tokens = a.max_batched_tokens;
  so.max_waiting = a.max_waiting;
  out.scheduler = std::make_unique<Scheduler>(*out.engine, *out.dummy_tokenizer, so);
  const std::string name = std::filesystem::path(a.config).stem().string() + "-dummy";
  out.info = model_info(a.config, std::filesystem::absolute(a.config).string(), config, out.engine->max_context(),
                        a.served_model_name.empty() ? name : a.served_model_name);
#else
  (void)a;
  (void)out;
  fail("--load-format dummy needs a CUDA build of fdpp (random weights are made on the GPU)");
#endif
}

void load(const ServeArgs& a, Loaded& out) {
  if (a.load_format == "dummy") return load_dummy(a, out);
  const std::string path = resolve_model_path(a.model);
  // On the CPU the GGUF weights stay in their stored format (the fast path, cpu/quant_matmul.h).
  LoadOptions lo;
  if (resolve_device(parse_device(a.device)) == Device::Cpu) lo.weights = WeightForm::Stored;
  out.model = load_model(path, {}, lo);
  check(out.model.tokenizer != nullptr, "{}: no tokenizer files; serve needs one for text prompts", path);
  const ModelConfig& c = out.model.config();
  const int ctx = a.ctx_size > 0 ? a.ctx_size : c.max_context;
  check(ctx <= c.max_context, "--ctx-size {} exceeds the model's context length {}", ctx, c.max_context);

  RunnerOptions o;
  o.device = parse_device(a.device);
  o.dtype = a.dtype;
  o.kv_cache_tokens = a.kv_cache_tokens;
  o.cuda_graphs = !a.no_cuda_graphs;
  o.attention = a.attention;
  o.set_linear_flags(a.linear, a.dispatch_table);
  o.model_path = path;
  o.kernels = resolve_kernel_options(a.kernels);
  o.tensor_parallel = a.tensor_parallel;
  if (a.attention == "async" && o.device != Device::Cpu)
    if (const std::optional<Calibration> cal = load_calibration(path))
      for (const LayerCalibration& l : cal->layers) o.unified_max_phi.push_back(l.bounds.phi);

  EngineLimits limits;
  limits.max_context = ctx;
  limits.max_step_tokens = a.max_batched_tokens;
  limits.max_step_rows = a.max_num_seqs;
  limits.kv_cache_tokens = a.kv_cache_tokens;
  out.engine = make_engine(c, out.model.weights, o, limits);

  SchedulerOptions so;
  so.max_num_seqs = a.max_num_seqs;
  so.max_batched_tokens = a.max_batched_tokens;
  so.max_waiting = a.max_waiting;
  out.scheduler = std::make_unique<Scheduler>(*out.engine, *out.model.tokenizer, so);
  out.info = model_info(a.model, path, c, out.engine->max_context(), a.served_model_name);
}

}  // namespace

CLI::App* register_serve(CLI::App& app) {
  ServeArgs& a = g_serve;
  auto* s = app.add_subcommand("serve", "OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions) with "
                                        "continuous batching");
  s->add_option("-m,--model", a.model, "GGUF file or Hugging Face model directory (default: the default model)");
  s->add_option("--host", a.host, "address to listen on")->capture_default_str();
  s->add_option("--port", a.port, "TCP port (0: any free port, printed at start)")->capture_default_str()->check(CLI::Range(0, 65535));
  s->add_option("--api-key", a.api_key, "require 'Authorization: Bearer KEY' on /v1/* (default: $FDPP_API_KEY, else none)")
      ->envname("FDPP_API_KEY");
  s->add_option("--served-model-name", a.served_model_name, "the model id clients use (default: the file or directory name)");
  s->add_option("--max-num-seqs", a.max_num_seqs, "requests running at once (rows of a decode step)")
      ->capture_default_str()->check(CLI::Range(1, 4096));
  s->add_option("--max-batched-tokens", a.max_batched_tokens, "tokens of one engine step (prefill chunks and decode rows)")
      ->capture_default_str()->check(CLI::Range(1, 1 << 20));
  s->add_option("--max-waiting", a.max_waiting, "queued requests beyond which the server answers 503 + Retry-After")
      ->capture_default_str()->check(CLI::Range(1, 1 << 20));
  s->add_option("--http-threads", a.http_threads,
                "HTTP worker threads; each streamed response holds one (default: 2 x max-num-seqs + 16, at least 64)")
      ->check(CLI::Range(1, 8192));
  s->add_option("-c,--ctx-size", a.ctx_size, "context per request, prompt + output (default: the model's)")->check(CLI::Range(0, 1 << 24));
  s->add_option("--max-body-bytes", a.max_body_bytes, "request bodies above this get 413")
      ->capture_default_str()->check(CLI::Range(int64_t{1024}, int64_t{1} << 30));
  s->add_option("--device", a.device, "auto (CUDA when a GPU is present), cpu or cuda")->capture_default_str();
  s->add_option("--dtype", a.dtype, "CUDA weight/activation type: auto, f16, bf16")->capture_default_str();
  s->add_option("--tensor-parallel,--tensor-parallel-size", a.tensor_parallel,
                "split the model over this many GPUs of the host (-tp; NCCL; 1: one GPU)")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  s->add_option("--kv-cache-tokens", a.kv_cache_tokens, "KV cache size in tokens (0: sized by the engine)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  s->add_flag("--no-cuda-graphs", a.no_cuda_graphs, "launch decode steps eagerly (for comparison)");
  s->add_option("--attention", a.attention, "CUDA decode attention: async (unified max) or sync")
      ->capture_default_str()->check(CLI::IsMember({"async", "sync"}));
  s->add_option("--linear", a.linear, "CUDA linear layers: auto, gemv, flat, cublas (default: $FDPP_LINEAR, else auto)")
      ->check(CLI::IsMember({"auto", "gemv", "flat", "cublas"}));
  s->add_option("--dispatch-table", a.dispatch_table,
                "dispatch table file from fdpp tune (default: $FDPP_DISPATCH_TABLE, else looked up)");
  cli::add_kernel_flags(s, a.kernels);
  s->add_option("--load-format", a.load_format, "auto (read --model) or dummy (random weights of --config, CUDA)")
      ->capture_default_str()->check(CLI::IsMember({"auto", "dummy"}));
  s->add_option("--config", a.config, "config.json for --load-format dummy (see configs/)");
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
  so.http_threads = a.http_threads > 0 ? a.http_threads : std::max(64, 2 * a.max_num_seqs + 16);
  so.limits.max_body_bytes = a.max_body_bytes;
  server::HttpServer http(so);
  http.start([&] { die("the HTTP listener stopped"); });
  const std::string what = a.load_format == "dummy" ? a.config : (a.model.empty() ? default_model_path() : a.model);
  fmt::print(stderr, "fdpp serve: listening on http://{}:{} (loading {})\n", a.host, http.port(), what);

  Loaded loaded;
  std::thread engine_thread;
  std::thread loader([&] {
    try {
      load(a, loaded);
      const Tokenizer& tok = loaded.dummy_tokenizer ? *loaded.dummy_tokenizer : *loaded.model.tokenizer;
      http.attach(*loaded.scheduler, loaded.info, server::prompt_codec_for(tok));
      engine_thread = std::thread([&] {
        try {
          loaded.scheduler->run();
        } catch (const std::exception& e) {
          die(fmt::format("engine: {}", e.what()));
        }
      });
      fmt::print(stderr, "fdpp serve: ready: model '{}' on {}, context {}, {} KV blocks of {} tokens, max-num-seqs {}\n",
                 loaded.info.id, a.device, loaded.info.max_context, loaded.engine->kv().num_blocks(),
                 loaded.engine->kv().block_size(), a.max_num_seqs);
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
             loaded.scheduler->stats().running, loaded.scheduler->stats().waiting);
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
