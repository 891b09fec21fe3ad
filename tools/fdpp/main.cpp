// fdpp: the command-line front end (llama.cpp-style).
//   fdpp generate  text from a model (the default model when no --model is given)
//   fdpp logits    logits of every position as a float32 .npy [T, vocab]
//   fdpp info      what a model is and what it needs, validated without reading the weights
//   fdpp calibrate the unified-max phi per layer from the attention logits of real text
//   fdpp tune      (CUDA) the linear-layer dispatch table of a model on this GPU (tune.cpp)
//   fdpp bench-linear (CUDA) GEMV / flat GEMM / cuBLAS on preset models' shapes (bench_linear.cpp)
// Every failure prints one line "fdpp: error: ..." and exits 1; bad flags exit 2 (CLI11's code).
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <omp.h>
#include <unistd.h>

#include <charconv>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>

#include "attention/calibration.h"
#include "engine/backend_select.h"
#include "core/npy.h"
#include "engine/generate.h"
#include "fdpp/error.h"
#include "io/model_loader.h"
#ifdef FDPP_HAVE_CUDA
#include "backend/cuda/cuda_runner.h"
#include "backend/cuda/device_query.h"
#include "bench.h"
#include "bench_attention.h"
#include "tune.h"
#endif

namespace {

using namespace fdpp;

std::vector<int32_t> parse_token_ids(const std::string& text) {
  std::vector<int32_t> ids;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    if (comma == std::string::npos) comma = text.size();
    std::string_view item(text.data() + pos, comma - pos);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    int32_t v = 0;
    auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    check(!item.empty() && ec == std::errc() && end == item.data() + item.size() && v >= 0,
          "--token-ids: '{}' is not a non-negative token id", std::string(item));
    ids.push_back(v);
    pos = comma + 1;
  }
  return ids;
}

// A progress bar on stderr while a model loads, only when stderr is a terminal.
class LoadProgress {
 public:
  explicit LoadProgress(std::string label) : label_(std::move(label)), enabled_(::isatty(STDERR_FILENO) == 1) {}
  ProgressFn callback() {
    if (!enabled_) return {};
    return [this](double f) {
      const int percent = static_cast<int>(f * 100.0);
      if (percent == last_) return;
      last_ = percent;
      const int filled = percent * kWidth / 100;
      fmt::print(stderr, "\r{} [{}{}] {:3d}%", label_, std::string(filled, '#'), std::string(kWidth - filled, ' '),
                 percent);
      std::fflush(stderr);
    };
  }
  void finish() {
    if (enabled_ && last_ >= 0) fmt::print(stderr, "\r\033[K");
  }

 private:
  static constexpr int kWidth = 30;
  std::string label_;
  bool enabled_;
  int last_ = -1;
};

LoadedModel load_with_progress(const std::string& path) {
  LoadProgress progress("loading " + path);
  LoadedModel m = load_model(path, progress.callback());
  progress.finish();
  return m;
}

struct GenerateArgs {
  std::string model;
  std::string prompt;
  std::string token_ids;
  int max_tokens = 128;
  SamplingParams sampling;
  bool ignore_eos = false;
  bool chat = false;
  bool json = false;
  int ctx_size = 0;
};

// Backend flags shared by generate and logits.
struct DeviceArgs {
  std::string device = "auto";
  // model_path: where to look for the model's unified-max calibration (fdpp calibrate).
  RunnerOptions options(const std::string& model_path) const {
    RunnerOptions o;
    o.device = parse_device(device);
    o.dtype = dtype;
    o.kv_cache_tokens = kv_cache_tokens;
    o.cuda_graphs = !no_cuda_graphs;
    o.attention = attention;
    o.linear = linear;
    o.model_path = model_path;
    o.dispatch_table = dispatch_table;
    if (attention == "async" && o.device != Device::Cpu) {
      if (const std::optional<Calibration> cal = load_calibration(model_path))
        for (const LayerCalibration& l : cal->layers) o.unified_max_phi.push_back(l.bounds.phi);
    }
    return o;
  }
  std::string dtype = "auto";
  int64_t kv_cache_tokens = 0;
  bool no_cuda_graphs = false;
  std::string attention = "async";
  std::string linear;  // "": FDPP_LINEAR, else auto
  std::string dispatch_table;

  void add_to(CLI::App* app) {
    app->add_option("--linear", linear,
                    "CUDA linear layers: auto (the tuned dispatch table), gemv, flat or cublas (default: $FDPP_LINEAR, "
                    "else auto)")
        ->check(CLI::IsMember({"auto", "gemv", "flat", "cublas"}));
    app->add_option("--dispatch-table", dispatch_table, "dispatch table file from fdpp tune (default: looked up)");
    app->add_option("--attention", attention,
                    "CUDA decode attention: async (unified max, FlashDecoding++) or sync (FlashDecoding)")
        ->capture_default_str()
        ->check(CLI::IsMember({"async", "sync"}));
    app->add_option("--device", device, "auto (CUDA when a GPU is present), cpu or cuda")->capture_default_str();
    app->add_option("--dtype", dtype, "CUDA weight/activation type: auto, f16, bf16")->capture_default_str();
    app->add_option("--kv-cache-tokens", kv_cache_tokens, "CUDA KV-cache size in tokens (0: sized to the request)")
        ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
    app->add_flag("--no-cuda-graphs", no_cuda_graphs, "launch the decode step eagerly (for comparison)");
  }
};

int run_generate(const GenerateArgs& a, const DeviceArgs& d) {
  const std::string path = resolve_model_path(a.model);
  LoadedModel m = load_with_progress(path);
  // A bare HF checkpoint (no tokenizer files) can give logits, but text needs a tokenizer.
  check(m.tokenizer != nullptr,
        "{}: no tokenizer (tokenizer.json, tokenizer.model or vocab.json + merges.txt); generate needs one, "
        "logits --token-ids does not",
        path);
  std::vector<int32_t> prompt;
  if (!a.token_ids.empty()) {
    prompt = parse_token_ids(a.token_ids);
  } else {
    std::string text = a.prompt;
    bool add_bos = m.tokenizer->add_bos_by_default();
    if (a.chat) {
      std::vector<ChatMessage> messages{{"user", a.prompt}};
      text = m.tokenizer->apply_chat_template(messages, /*add_generation_prompt=*/true);
      // Templates that write the BOS text themselves (Llama 2/3) get no second BOS, as in
      // transformers' apply_chat_template(tokenize=True).
      const int32_t bos = m.tokenizer->bos_id();
      if (bos >= 0 && text.starts_with(m.tokenizer->token_text(bos))) add_bos = false;
    }
    prompt = m.tokenizer->encode(text, add_bos, /*parse_special=*/true);
  }
  check(!prompt.empty(), "the prompt encodes to no tokens; give --prompt TEXT or --token-ids");
  const ModelConfig& c = m.config();
  const int64_t needed = static_cast<int64_t>(prompt.size()) + a.max_tokens;
  const int ctx = a.ctx_size > 0 ? a.ctx_size : c.max_context;
  check(ctx <= c.max_context, "--ctx-size {} exceeds the model's context length {}", ctx, c.max_context);
  check(needed <= ctx, "prompt ({} tokens) + --max-tokens ({}) exceed the context size {}", prompt.size(),
        a.max_tokens, ctx);

  // One sequence on the batched engine, through the same scheduler the server uses; the whole
  // prompt in one step up to 8192 tokens (longer prompts are prefilled in chunks of that size).
  EngineLimits limits;
  limits.max_context = static_cast<int>(needed);
  limits.max_step_rows = 1;
  limits.max_step_tokens = static_cast<int>(std::min<int64_t>(needed, 8192));
  limits.kv_cache_tokens = needed;
  auto engine = make_engine(c, m.weights, d.options(path), limits);
  GenerateOptions opt{a.max_tokens, a.ignore_eos, a.sampling, {}};
  std::function<void(std::string_view)> stream;
  if (!a.json) stream = [](std::string_view piece) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    };
  GenerateResult r = generate(*engine, *m.tokenizer, prompt, opt, stream);
  if (a.json) {
    nlohmann::json j;
    j["model"] = path;
    j["prompt_token_ids"] = prompt;
    j["token_ids"] = r.tokens;
    j["text"] = r.text;
    j["finish_reason"] = r.finish_reason;
    j["timings"] = {{"prompt_tokens", r.prompt_tokens},
                    {"generated_tokens", r.tokens.size()},
                    {"prefill_seconds", r.prefill_seconds},
                    {"decode_seconds", r.decode_seconds},
                    {"prefill_tokens_per_second", r.prefill_tokens_per_second()},
                    {"decode_tokens_per_second", r.decode_tokens_per_second()}};
#ifdef FDPP_HAVE_CUDA
    // The asynchronized softmax's guard: decode attention rows recomputed (issue 5's fallback rate).
    if (auto* gpu = dynamic_cast<cuda::CudaEngine*>(engine.get())) {
      j["attention"] = {{"mode", d.attention},
                        {"decode_rows", gpu->attention_rows()},
                        {"fallback_rows", gpu->attention_fallback_rows()}};
    }
#endif
    // Invalid UTF-8 (a model can emit it) is replaced rather than aborting the dump.
    std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  } else {
    std::fputc('\n', stdout);
    fmt::print(stderr, "prefill: {} tokens, {:.1f} tokens/s | decode: {} tokens, {:.1f} tokens/s\n", r.prompt_tokens,
               r.prefill_tokens_per_second(), r.tokens.size(), r.decode_tokens_per_second());
  }
  return 0;
}

int run_logits(const std::string& model, const std::string& token_ids, const std::string& out, const DeviceArgs& d) {
  const std::string path = resolve_model_path(model);
  const std::vector<int32_t> ids = parse_token_ids(token_ids);
  LoadedModel m = load_with_progress(path);
  const ModelConfig& c = m.config();
  for (int32_t id : ids) check(id < c.vocab_size, "--token-ids: id {} is out of range [0, {})", id, c.vocab_size);
  check(static_cast<int64_t>(ids.size()) <= c.max_context, "{} tokens exceed the model's context length {}",
        ids.size(), c.max_context);
  auto runner = make_runner(c, m.weights, static_cast<int>(ids.size()), d.options(path));
  std::vector<float> logits(ids.size() * static_cast<size_t>(c.vocab_size));
  runner->forward(ids, 0, /*all_positions=*/true, logits);
  write_npy_f32(out, {static_cast<int64_t>(ids.size()), c.vocab_size}, logits);
  fmt::print(stderr, "wrote {} [{} x {}] float32\n", out, ids.size(), c.vocab_size);
  return 0;
}

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  return fmt::format("{:.2f} {}", b, units[u]);
}

int run_info(const std::string& model, bool json) {
  const std::string path = resolve_model_path(model);
  const ModelDescription d = describe_model(path);
  const ModelConfig& c = d.config;
  // Memory the CPU backend needs: weights dequantized to fp32, plus the fp32 KV cache at the
  // model's full context length.
  const double weight_bytes = 4.0 * static_cast<double>(d.n_params);
  const double kv_bytes = 2.0 * 4.0 * c.n_layers * static_cast<double>(c.kv_dim()) * c.max_context;
  const std::optional<Calibration> cal = load_calibration(path);
  if (cal)
    check(static_cast<int>(cal->layers.size()) == c.n_layers, "{}: calibration has {} layers, the model {}",
          cal->path, cal->layers.size(), c.n_layers);
  // The linear-layer dispatch the CUDA backend would use for this model (engine/dispatch_table.h).
  nlohmann::json dispatch_json = {{"available", false}, {"reason", "not compiled in (CPU-only build)"}};
  std::string dispatch = "not compiled in (CPU-only build: the CUDA linear layers are not built)";
#ifdef FDPP_HAVE_CUDA
  dispatch = describe_dispatch_for_model(path, c, &dispatch_json);
#endif
  std::string dtypes;
  for (const auto& [t, n] : d.dtype_counts) dtypes += fmt::format("{}{} x{}", dtypes.empty() ? "" : ", ", t, n);
  if (json) {
    nlohmann::json j{{"path", d.path},
                     {"format", d.format},
                     {"architecture", c.architecture},
                     {"name", c.name},
                     {"n_layers", c.n_layers},
                     {"hidden_size", c.hidden},
                     {"n_heads", c.n_heads},
                     {"n_kv_heads", c.n_kv_heads},
                     {"head_dim", c.head_dim},
                     {"ffn_hidden_size", c.ffn_hidden},
                     {"vocab_size", c.vocab_size},
                     {"context_length", c.max_context},
                     {"rope_theta", c.rope.theta},
                     {"norm_eps", c.norm_eps},
                     {"tied_embeddings", c.tied_embeddings},
                     {"n_params", d.n_params},
                     {"stored_bytes", d.stored_bytes},
                     {"dtypes", d.dtype_counts},
                     {"cpu_weight_bytes", weight_bytes},
                     {"cpu_kv_cache_bytes", kv_bytes}};
    if (cal) {
      j["calibration"] = {{"path", cal->path},
                          {"phi_min", cal->phi_min()},
                          {"phi_max", cal->phi_max()},
                          {"fallback_rate", cal->fallback_rate()}};
    } else {
      j["calibration"] = nullptr;
    }
    j["dispatch"] = dispatch_json;
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  fmt::print("model:        {}\n", d.path);
  fmt::print("format:       {}\n", d.format);
  fmt::print("architecture: {}{}\n", c.architecture, c.name.empty() ? "" : " (" + c.name + ")");
  fmt::print("layers:       {}\n", c.n_layers);
  fmt::print("hidden:       {}   ffn: {}   vocab: {}   context: {}\n", c.hidden, c.ffn_hidden, c.vocab_size,
             c.max_context);
  fmt::print("attention:    {} heads, {} kv heads, head dim {}, rope theta {}{}\n", c.n_heads, c.n_kv_heads,
             c.head_dim, c.rope.theta, c.rope.freq_factors.empty() ? "" : " (with frequency factors)");
  fmt::print("embeddings:   {}\n", c.tied_embeddings ? "tied (lm head = token embeddings)" : "separate lm head");
  fmt::print("dtypes:       {}\n", dtypes);
  fmt::print("parameters:   {} ({:.1f} M)\n", d.n_params, d.n_params / 1e6);
  fmt::print("stored:       {}\n", human_bytes(static_cast<double>(d.stored_bytes)));
  fmt::print("memory (cpu): {} weights (fp32) + {} KV cache at {} tokens = {}\n", human_bytes(weight_bytes),
             human_bytes(kv_bytes), c.max_context, human_bytes(weight_bytes + kv_bytes));
  if (cal) {
    fmt::print("calibration:  {} (phi range [{:.2f}, {:.2f}], a = {:.2f}, b = {:.2f}, fallback {:.3f}% of rows)\n",
               cal->path, cal->phi_min(), cal->phi_max(), cal->layers[0].bounds.a, cal->layers[0].bounds.b,
               100.0 * cal->fallback_rate());
  } else {
    const UnifiedMaxBounds b = default_unified_max_bounds(c.max_context);
    fmt::print("calibration:  none (conservative default phi = 0 with guard, a = {:.2f}, b = {:.2f}; run fdpp calibrate)\n",
               b.a, b.b);
  }
  for (size_t pos = 0, line = 0; pos <= dispatch.size(); ++line) {
    const size_t nl = std::min(dispatch.find('\n', pos), dispatch.size());
    fmt::print("{:<14}{}\n", line == 0 ? "dispatch:" : "", dispatch.substr(pos, nl - pos));
    pos = nl + 1;
  }
  return 0;
}

struct CalibrateArgs {
  std::string model, prompts, out;
  double percentile = 99.0;
  int max_tokens = 0;
};

int run_calibrate(const CalibrateArgs& a) {
  // The prompts first: a bad prompts file fails before the model loads.
  const std::vector<std::string> prompts =
      a.prompts.empty() ? builtin_calibration_prompts() : read_calibration_prompts(a.prompts);
  const std::string path = resolve_model_path(a.model);
  const std::string out = a.out.empty() ? default_calibration_output(path) : a.out;
  {
    // Fail before the model loads and the text runs when the output cannot be written.
    std::error_code ec;
    const std::filesystem::path parent = std::filesystem::path(out).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
    const std::string probe = out + ".probe";
    std::FILE* f = std::fopen(probe.c_str(), "wb");
    check(f != nullptr, "{}: cannot write the calibration file", out);
    std::fclose(f);
    std::filesystem::remove(probe, ec);
  }
  LoadedModel m = load_with_progress(path);
  CalibrationOptions opt;
  opt.percentile = a.percentile;
  opt.max_tokens_per_prompt = a.max_tokens;
  Calibration cal = calibrate_model(m, path, prompts, opt);
  write_calibration(cal, out);
  for (size_t i = 0; i < cal.layers.size(); ++i) {
    const LayerCalibration& l = cal.layers[i];
    fmt::print("layer {:3d}: phi {:8.3f}  row max [{:8.3f}, {:8.3f}]  logits [{:9.3f}, {:9.3f}]  fallback {:.3f}%\n", i,
               l.bounds.phi, l.row_max.at("min"), l.row_max.at("max"), l.logits.at("min"), l.logits.at("max"),
               100.0 * l.fallback_rate);
  }
  fmt::print("wrote {}: {} prompts, {} tokens, {} layers, phi in [{:.3f}, {:.3f}], [a, b] = [{:.2f}, {:.2f}], "
             "fallback {:.3f}% of rows\n",
             cal.path, cal.prompts, cal.tokens, cal.layers.size(), cal.phi_min(), cal.phi_max(),
             cal.layers[0].bounds.a, cal.layers[0].bounds.b, 100.0 * cal.fallback_rate());
  return 0;
}

int run_devices() {
  fmt::print("cpu: {} threads (OpenMP)\n", omp_get_max_threads());
#ifdef FDPP_HAVE_CUDA
  std::string why;
  const auto gpus = cuda::list_gpus(&why);
  if (gpus.empty()) fmt::print("cuda: no usable GPU ({})\n", why);
  for (const auto& g : gpus)
    fmt::print("cuda:{} {} (sm_{}{}, {} SMs, {} memory, {} L2)\n", g.index, g.name, g.sm_major, g.sm_minor,
               g.multiprocessors, human_bytes(static_cast<double>(g.total_memory)), human_bytes(static_cast<double>(g.l2_bytes)));
#else
  fmt::print("cuda: not compiled in (built with FDPP_CUDA=OFF or without nvcc)\n");
#endif
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fdpp: fast LLM decoding (FlashDecoding++)", "fdpp"};
  app.require_subcommand(1);
  // Bad flags: one line, like every other error (CLI11's default adds a second line).
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return fmt::format("fdpp: error: {} (see --help)\n", e.what());
  });
  app.set_version_flag("--version", "fdpp 0.1.0");

  GenerateArgs g;
  DeviceArgs g_dev, l_dev;
  auto* gen = app.add_subcommand("generate", "generate text (streams to stdout)");
  g_dev.add_to(gen);
  gen->add_option("-m,--model", g.model, "GGUF file or Hugging Face model directory (default: the default model)");
  auto* prompt_opt = gen->add_option("-p,--prompt", g.prompt, "prompt text");
  auto* ids_opt = gen->add_option("--token-ids", g.token_ids, "prompt as token ids, e.g. 1,2,3");
  prompt_opt->excludes(ids_opt);
  gen->add_option("-n,--max-tokens", g.max_tokens, "tokens to generate")->capture_default_str()->check(CLI::Range(0, 1 << 24));
  gen->add_option("--temperature,--temp", g.sampling.temperature, "0 = greedy")->capture_default_str()->check(CLI::Range(0.0, 100.0));
  gen->add_option("--top-k", g.sampling.top_k, "keep the k most likely tokens (0 = off)")->capture_default_str()->check(CLI::Range(0, 1 << 24));
  gen->add_option("--top-p", g.sampling.top_p, "nucleus sampling mass (1 = off)")->capture_default_str()->check(CLI::Range(0.0, 1.0));
  gen->add_option("--min-p", g.sampling.min_p, "drop tokens below min-p x the top probability (0 = off)")->capture_default_str()->check(CLI::Range(0.0, 1.0));
  gen->add_option("--repeat-penalty", g.sampling.repeat_penalty, "penalty for repeated tokens (1 = off)")->capture_default_str()->check(CLI::Range(0.01, 100.0));
  gen->add_option("--repeat-last-n", g.sampling.repeat_last_n, "tokens the penalty looks back over (-1 = all)")->capture_default_str()->check(CLI::Range(-1, 1 << 30));
  gen->add_option("-s,--seed", g.sampling.seed, "random seed")->capture_default_str();
  gen->add_option("-c,--ctx-size", g.ctx_size, "context size (default: the model's)")->check(CLI::Range(0, 1 << 24));
  gen->add_flag("--ignore-eos", g.ignore_eos, "keep generating past end-of-generation tokens");
  gen->add_flag("--chat", g.chat, "wrap the prompt in the model's chat template");
  gen->add_flag("--json", g.json, "print one JSON object (token_ids, text, timings) instead of streaming");

  std::string l_model, l_ids, l_out;
  auto* logits = app.add_subcommand("logits", "write the logits of every position as float32 .npy [T, vocab]");
  logits->add_option("-m,--model", l_model, "GGUF file or HF model directory (default: the default model)");
  logits->add_option("--token-ids", l_ids, "token ids, e.g. 1,2,3")->required();
  logits->add_option("-o,--out", l_out, "output .npy file")->required();
  l_dev.add_to(logits);

  std::string i_model;
  bool i_json = false;
  auto* info = app.add_subcommand("info", "describe and validate a model without loading its weights");
  info->add_option("-m,--model", i_model, "GGUF file or HF model directory (default: the default model)");
  info->add_flag("--json", i_json, "print JSON");

  CalibrateArgs cal;
  auto* calibrate = app.add_subcommand("calibrate", "choose the unified-max phi per layer from real text (CPU)");
  calibrate->add_option("-m,--model", cal.model, "GGUF file or HF model directory (default: the default model)");
  calibrate->add_option("--prompts", cal.prompts, "text file, one prompt per blank-line-separated paragraph "
                        "(default: a built-in English set)");
  calibrate->add_option("-o,--out", cal.out, "calibration file (default: <model>.fdpp-calib.json, else the cache)");
  calibrate->add_option("--percentile", cal.percentile, "phi = this percentile of each layer's row max logits")
      ->capture_default_str()->check(CLI::Range(0.001, 100.0));
  calibrate->add_option("--max-tokens", cal.max_tokens, "truncate each prompt to N tokens (0: the model's context)")
      ->check(CLI::Range(0, 1 << 24));

  auto* devices = app.add_subcommand("devices", "list the CPU threads and CUDA GPUs fdpp can use");

#ifdef FDPP_HAVE_CUDA
  BenchArgs b;
  auto* bench = app.add_subcommand("bench", "prefill (pp) and decode (tg) speed on the GPU, llama-bench style");
  bench->add_option("-m,--model", b.model, "model file or HF directory (default: the default model)");
  bench->add_option("--config", b.config, "config.json for --load-format dummy (see configs/)");
  bench->add_option("--load-format", b.load_format, "auto (read the weights) or dummy (random weights on the GPU)")->capture_default_str();
  bench->add_option("--dtype", b.dtype, "f16 or bf16")->capture_default_str();
  bench->add_option("-b,--batch", b.batches, "decode batch sizes, e.g. 1,8,32")->delimiter(',')->check(CLI::Range(1, 1024));
  bench->add_option("-c,--context", b.contexts, "decode context lengths, e.g. 1024,4096")->delimiter(',')->check(CLI::Range(2, 1 << 22));
  bench->add_option("-p,--prompt", b.prompts, "prefill lengths (0 entries: none)")->delimiter(',')->check(CLI::Range(1, 1 << 22));
  bench->add_option("-r,--repetitions", b.repetitions, "timed prefill runs per length")->capture_default_str()->check(CLI::Range(1, 1000));
  bench->add_option("--steps", b.steps, "timed decode steps per (batch, context)")->capture_default_str()->check(CLI::Range(1, 100000));
  bench->add_option("--bandwidth", b.bandwidth, "read bandwidth in bytes/s for the roofline (default: measure)");
  bench->add_flag("--json", b.json, "print JSON");
  bench->add_flag("--no-cuda-graphs", b.no_cuda_graphs, "launch decode steps eagerly");
  bench->add_option("--linear", b.linear, "linear layers: auto (dispatch table), gemv, flat, cublas (default: $FDPP_LINEAR, else auto)")
      ->check(CLI::IsMember({"auto", "gemv", "flat", "cublas"}));
  bench->add_option("--dispatch-table", b.dispatch_table, "dispatch table file from fdpp tune (default: looked up)");
  bench->add_option("--attention", b.attention, "decode attention: async (unified max) or sync")
      ->capture_default_str()
      ->check(CLI::IsMember({"async", "sync"}));

  BenchAttentionArgs ba;
  auto* bench_attn = app.add_subcommand("bench-attention", "decode attention kernels alone: async vs sync, graph-timed");
  bench_attn->add_option("--heads", ba.heads, "query heads")->capture_default_str()->check(CLI::Range(1, 1024));
  bench_attn->add_option("--kv-heads", ba.kv_heads, "key/value heads")->capture_default_str()->check(CLI::Range(1, 1024));
  bench_attn->add_option("--head-dim", ba.head_dim, "64 or 128")->capture_default_str();
  bench_attn->add_option("--dtype", ba.dtype, "f16 or bf16")->capture_default_str();
  bench_attn->add_option("-b,--batch", ba.batches, "batch sizes")->delimiter(',')->check(CLI::Range(1, 4096));
  bench_attn->add_option("-c,--context", ba.contexts, "context lengths")->delimiter(',')->check(CLI::Range(1, 1 << 22));
  bench_attn->add_option("--modes", ba.modes, "async, sync")->delimiter(',');
  bench_attn->add_option("--replays", ba.replays, "graph replays per point (median)")->capture_default_str()->check(CLI::Range(1, 1000));
  bench_attn->add_flag("--json", ba.json, "print JSON");
  bench_attn->add_flag("--prefill", ba.prefill, "causal prefill attention (tensor cores) instead of decode");
  bench_attn->add_option("--points", ba.points, "prefill points BxL (B sequences of L tokens)")->delimiter(',');
  auto* tune = register_tune(app);
  auto* bench_linear = register_bench_linear(app);
#endif

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);  // prints --help / the one-line error
    return code == 0 ? 0 : 2;      // usage errors exit 2, like getopt tools
  }
  try {
    if (*gen) {
      if (g.prompt.empty() && g.token_ids.empty()) fdpp::fail("generate needs --prompt TEXT or --token-ids 1,2,3");
      return run_generate(g, g_dev);
    }
    if (*logits) return run_logits(l_model, l_ids, l_out, l_dev);
    if (*info) return run_info(i_model, i_json);
    if (*calibrate) return run_calibrate(cal);
    if (*devices) return run_devices();
#ifdef FDPP_HAVE_CUDA
    if (*bench) return run_bench(b);
    if (*bench_attn) return ba.prefill ? run_bench_prefill_attention(ba) : run_bench_attention(ba);
    if (*tune) return run_tune();
    if (*bench_linear) return run_bench_linear();
#endif
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
  return 0;
}
