// fdpp: the command-line front end (llama.cpp-style flags: -m, -p, -f, -n, -c, -s, -t, -ngl).
//   fdpp generate  text from a model (the default model when no --model is given); --file runs a
//                  prompts file as one continuously batched job (generate_file.cpp)
//   fdpp logits    logits of every position as a float32 .npy [T, vocab]
//   fdpp tokenize  text to token ids and back
//   fdpp info      what a model is and what it needs, validated without reading the weights
//   fdpp calibrate the unified-max phi per layer from the attention logits of real text
//   fdpp devices   the CPU threads and GPUs fdpp can use
//   fdpp tune      (CUDA) the linear-layer dispatch table of a model on this GPU (tune.cpp)
//   fdpp bench-linear (CUDA) GEMV / flat GEMM / cuBLAS on preset models' shapes (bench_linear.cpp)
// One rule for errors: every failure prints one line "fdpp: error: ..." on stderr. A bad command
// line (unknown flag or subcommand, a value out of range, a bad --prompt) exits 2 and names the
// flag; everything found later (files, models, the run itself, writing the output) exits 1.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <iterator>
#include <optional>

#include "attention/calibration.h"
#include "backend/cpu/quant_matmul.h"
#include "bench_cpu.h"
#include "cli_common.h"
#include "core/npy.h"
#include "core/read_file.h"
#include "engine/backend_select.h"
#include "engine/generate.h"
#include "engine/prompt_file.h"
#include "fdpp/error.h"
#include "generate_file.h"
#include "model/model_loader.h"
#include "serve.h"
#ifdef FDPP_HAVE_CUDA
#include "backend/cuda/cuda_runner.h"
#include "backend/cuda/device_query.h"
#include "bench.h"
#include "bench_attention.h"
#include "tune.h"
#endif

namespace fdpp::cli {

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
    if (item.empty() || ec != std::errc() || end != item.data() + item.size() || v < 0)
      throw UsageError(fmt::format("--token-ids: '{}' is not a non-negative token id", std::string(item)));
    ids.push_back(v);
    pos = comma + 1;
  }
  return ids;
}

void write_stdout(std::string_view text) {
  if (text.empty()) return;
  // Flushed at once: the text streams, and a full disk or closed pipe is found now, not at exit.
  if (std::fwrite(text.data(), 1, text.size(), stdout) != text.size() || std::fflush(stdout) != 0)
    fail("standard output: write failed ({})", std::strerror(errno));
}

LoadProgress::LoadProgress(std::string label) : label_(std::move(label)), enabled_(::isatty(STDERR_FILENO) == 1) {}

ProgressFn LoadProgress::callback() {
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

void LoadProgress::finish() {
  if (enabled_ && last_ >= 0) fmt::print(stderr, "\r\033[K");
}

// Peak resident set size of this process (VmHWM of /proc/self/status), bytes; 0 where unknown.
uint64_t peak_rss_bytes() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return 0;
  char line[256];
  uint64_t kb = 0;
  while (std::fgets(line, sizeof line, f) != nullptr)
    if (std::sscanf(line, "VmHWM: %lu kB", &kb) == 1) break;
  std::fclose(f);
  return kb * 1024;
}

LoadedModel load_with_progress(const std::string& path, const LoadOptions& options) {
  LoadProgress progress("loading " + path);
  LoadedModel m = load_model(path, progress.callback(), options);
  progress.finish();
  return m;
}

RunnerOptions DeviceArgs::options(const std::string& model_path) const {
  RunnerOptions o;
  o.device = parse_device(device);
  if (n_gpu_layers == 0 && device == "auto") o.device = Device::Cpu;  // llama.cpp's -ngl 0: nothing on the GPU
  o.dtype = dtype;
  o.kv_cache_tokens = kv_cache_tokens;
  o.cuda_graphs = !no_cuda_graphs;
  o.attention = attention;
  o.set_linear_flags(linear, dispatch_table);
  o.model_path = model_path;
  o.kernels = resolve_kernel_options(kernels);
  o.threads = threads;
  o.calibration = calibration;
  o.tensor_parallel = tensor_parallel;
  return o;
}

LoadOptions DeviceArgs::load_options() const {
  LoadOptions lo;
  if (cpu_weights == "stored" && resolve_device(options("").device) == Device::Cpu) lo.weights = WeightForm::Stored;
  return lo;
}

void DeviceArgs::check_flags() const {
  if (n_gpu_layers == 0 && device == "cuda")
    throw UsageError("-ngl/--n-gpu-layers 0 asks for no GPU layers but --device cuda for the GPU; give one of them");
  if (tensor_parallel > 1 && device == "cpu")
    throw UsageError("--tensor-parallel splits a model over GPUs; it cannot be combined with --device cpu");
}

void DeviceArgs::say_gpu_layers() const {
  // llama.cpp users pass -ngl from habit; fdpp never splits a model between CPU and GPU, so say once
  // what it does instead.
  if (n_gpu_layers < 0) return;
  if (n_gpu_layers == 0) {
    fmt::print(stderr, "fdpp: -ngl 0: running on the CPU\n");
    return;
  }
  const bool gpu = resolve_device(parse_device(device)) == Device::Cuda;
  fmt::print(stderr, "fdpp: -ngl {}: {}\n", n_gpu_layers,
             gpu ? "every layer runs on the GPU (fdpp does not split a model between CPU and GPU)"
                 : "no GPU is used here, every layer runs on the CPU");
}

std::string number_problem_int(const std::string& s, int64_t lo, int64_t hi, std::string_view range_text) {
  int64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size()) return fmt::format("'{}' is not an integer", s);
  if (v < lo || v > hi) return fmt::format("{} must be in {}", s, range_text);
  return "";
}

CLI::Validator real_check(std::string (*problem)(double)) {
  return CLI::Validator(
      [problem](std::string& s) -> std::string {
        // strtod accepts "nan" and "inf"; the problem functions reject them (a NaN would pass any
        // range test written as lo <= v <= hi).
        char* end = nullptr;
        const double v = std::strtod(s.c_str(), &end);
        if (s.empty() || end != s.c_str() + s.size()) return fmt::format("'{}' is not a number", s);
        const std::string p = problem(v);
        return p.empty() ? "" : s + " " + p;
      },
      "");
}

CLI::Validator int_check(std::string (*problem)(int64_t)) {
  return CLI::Validator(
      [problem](std::string& s) -> std::string {
        int64_t v = 0;
        auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
        if (s.empty() || ec != std::errc() || end != s.data() + s.size()) return fmt::format("'{}' is not an integer", s);
        const std::string p = problem(v);
        return p.empty() ? "" : s + " " + p;
      },
      "");
}

CLI::Validator int_range(int64_t lo, int64_t hi, std::string range_text) {
  return CLI::Validator(
      [lo, hi, range_text](std::string& s) -> std::string { return number_problem_int(s, lo, hi, range_text); }, "");
}

void DeviceArgs::add_to(CLI::App* app) {
  app->add_option("--cpu-weights", cpu_weights,
                  "CPU weights: stored (GGUF blocks used in place, the fast path) or f32 (dequantized, the reference)")
      ->capture_default_str()
      ->check(CLI::IsMember({"stored", "f32"}));
  app->add_option("--linear", linear,
                  "CUDA linear layers: auto (the tuned dispatch table), gemv, flat or cublas (default: $FDPP_LINEAR, "
                  "else auto)")
      ->check(CLI::IsMember({"auto", "gemv", "flat", "cublas"}));
  app->add_option("--dispatch-table", dispatch_table,
                  "dispatch table file from fdpp tune (default: $FDPP_DISPATCH_TABLE, else looked up)");
  add_kernel_flags(app, kernels);
  app->add_option("--calibration", calibration,
                  "unified-max calibration file from fdpp calibrate (default: <model>.fdpp-calib.json, else the cache)");
  app->add_option("--attention", attention,
                  "CUDA decode attention: async (unified max, FlashDecoding++) or sync (FlashDecoding)")
      ->capture_default_str()
      ->check(CLI::IsMember({"async", "sync"}));
  app->add_option("--device", device, "auto (CUDA when a GPU is present), cpu or cuda")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app->add_option("--dtype", dtype, "CUDA weight/activation type: auto, f16, bf16 (the CPU computes in fp32)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "f16", "bf16"}));
  app->add_option("--kv-cache-tokens", kv_cache_tokens, "CUDA KV-cache size in tokens (0: sized to the request)")
      ->check(int_range(0, int64_t{1} << 30, "[0, 2^30]"));
  app->add_flag("--no-cuda-graphs", no_cuda_graphs, "launch the decode step eagerly (for comparison)");
  app->add_flag("--quiet", quiet, "no load progress bar or load line on stderr");
  app->add_option("-t,--threads", threads, "CPU threads (0: $OMP_NUM_THREADS, else the physical cores)")
      ->check(int_range(0, 4096, "[0, 4096]"));
  app->add_option("--tensor-parallel,--tensor-parallel-size", tensor_parallel,
                  "split the model over this many GPUs of the host (-tp; NCCL; 1: one GPU)")
      ->capture_default_str()
      ->check(int_range(1, 64, "[1, 64]"));
  app->add_option("--n-gpu-layers,--gpu-layers", n_gpu_layers,
                  "llama.cpp's -ngl: accepted; every layer runs on the GPU when there is one, 0 means the CPU")
      ->check(int_range(-1, 1 << 20, "[-1, 2^20]"));
}

// The text of --prompt: "-" reads standard input (one trailing newline dropped, as $(...) does).
// Empty and non-UTF-8 prompts are usage errors naming the flag. Non-UTF-8 bytes are refused rather
// than replaced: a replaced prompt is a different prompt, and the user should know.
std::string prompt_text(const std::string& flag, const std::string& value) {
  std::string text = value;
  std::string where = flag;
  if (value == "-") {
    constexpr size_t kMaxPromptBytes = size_t{64} << 20;  // 1000x a 128K-token context's text
    text = read_all(std::cin, kMaxPromptBytes, flag + " - (standard input)");
    if (text.ends_with("\r\n")) text.resize(text.size() - 2);
    else if (text.ends_with('\n')) text.pop_back();
    where = flag + " - (standard input)";
  }
  if (text.empty()) throw UsageError(fmt::format("{}: the prompt is empty", where));
  if (std::string p = utf8_problem(text); !p.empty()) throw UsageError(fmt::format("{}: {}", where, p));
  return text;
}

CliModel open_model(const std::string& path, const DeviceArgs& d, bool quiet) {
  CliModel m;
  m.path = path;
  if (resolve_device(d.options("").device) == Device::Cuda) {
    PlannedModel p = plan_model(path);
    m.description = std::move(p.description);
    m.plan = std::move(p.plan);
    m.tokenizer = std::move(p.tokenizer);
    m.planned = true;
    m.bar = std::make_unique<StreamBar>("loading " + path, quiet);
  } else {
    LoadedModel l = quiet ? load_model(path, {}, d.load_options()) : load_with_progress(path, d.load_options());
    m.description = std::move(l.description);
    m.weights = std::move(l.weights);
    m.tokenizer = std::move(l.tokenizer);
  }
  return m;
}

std::string load_line(const nlohmann::json& s) {
  std::string line = fmt::format("load: {:.2f} s ({}), peak RSS {:.2f} GiB", s["seconds"].get<double>(),
                                 s["path"].get<std::string>(), s["peak_rss_bytes"].get<uint64_t>() / 1073741824.0);
  if (s.contains("weights_seconds"))
    line += fmt::format(", weights {:.2f} GB in {:.2f} s ({:.2f} GB/s)", s["stored_bytes"].get<uint64_t>() / 1e9,
                        s["weights_seconds"].get<double>(), s["weights_gb_per_second"].get<double>());
  return line;
}

}  // namespace fdpp::cli

namespace {

using namespace fdpp;
using namespace fdpp::cli;

int run_generate(GenerateArgs a, const DeviceArgs& d) {
  const std::string path = resolve_model_path(a.model);
  CliModel m = open_model(path, d, d.quiet || a.json);
  // A bare HF checkpoint (no tokenizer files) runs by token ids: the ids are the output, the text
  // stays empty.
  const bool has_tokenizer = m.tokenizer != nullptr;
  if (!has_tokenizer) {
    check(!a.token_ids.empty(),
          "{}: no tokenizer (tokenizer.json, tokenizer.model or vocab.json + merges.txt); give --token-ids instead of "
          "--prompt",
          path);
    m.tokenizer = Tokenizer::ids_only(m.config().vocab_size, m.description.eos_token_ids, m.description.bos_token_id);
  }
  std::vector<int32_t> prompt;
  if (!a.token_ids.empty()) {
    prompt = parse_token_ids(a.token_ids);
  } else {
    prompt = encode_prompt(*m.tokenizer, a.prompt, {}, a.chat, a.system);
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
  for (int32_t id : prompt) check(id < c.vocab_size, "--token-ids: id {} is out of range [0, {})", id, c.vocab_size);
  auto engine = make_engine(c, m.weights, m.options(d), limits);
  const nlohmann::json load = m.load_stats();
  GenerateOptions opt{a.max_tokens, a.ignore_eos, a.sampling, a.stop};
  std::function<void(std::string_view)> stream;
  bool ends_with_newline = true;  // nothing written yet
  if (!a.json) stream = [&](std::string_view piece) {
      write_stdout(piece);
      ends_with_newline = piece.ends_with('\n');
    };
  GenerateResult r = generate(*engine, *m.tokenizer, prompt, opt, stream);
  if (a.json) {
    nlohmann::json j;
    j["model"] = path;
    j["seed"] = a.sampling.seed;
    j["prompt_token_ids"] = prompt;
    j["token_ids"] = r.tokens;
    j["text"] = r.text;
    if (!has_tokenizer) j["note"] = "no tokenizer files: text is empty, token_ids are the output";
    j["finish_reason"] = r.finish_reason;
    j["load"] = load;
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
                        {"unified_rows", gpu->attention_unified_rows()},
                        {"fallback_rows", gpu->attention_fallback_rows()},
                        {"prefill_rows", gpu->prefill_attention_rows()},
                        {"prefill_fallback_rows", gpu->prefill_attention_fallback_rows()}};
    }
#endif
    // Invalid UTF-8 (a model can emit it) is replaced rather than aborting the dump.
    write_stdout(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
  } else {
    // The stats go to stderr on a line of their own: stdout ends with a newline (flushed) first, so
    // the two never run together when they share a terminal or a pipe.
    if (!ends_with_newline || r.text.empty()) write_stdout("\n");
    if (!has_tokenizer) {  // no text to stream: the ids are the output
      std::string ids;
      for (int32_t t : r.tokens) ids += fmt::format("{}{}", ids.empty() ? "" : ",", t);
      write_stdout(ids + "\n");
    }
    if (!d.quiet) fmt::print(stderr, "{}\n", load_line(load));
    fmt::print(stderr, "prefill: {} tokens, {:.1f} tokens/s | decode: {} tokens, {:.1f} tokens/s | seed {}\n",
               r.prompt_tokens, r.prefill_tokens_per_second(), r.tokens.size(), r.decode_tokens_per_second(),
               a.sampling.seed);
  }
  return 0;
}

int run_logits(const std::string& model, const std::string& token_ids, const std::string& prompt,
               const std::string& out, const DeviceArgs& d) {
  const std::string path = resolve_model_path(model);
  std::vector<int32_t> ids;
  if (!token_ids.empty()) ids = parse_token_ids(token_ids);
  CliModel m = open_model(path, d, d.quiet);
  const ModelConfig& c = m.config();
  if (!prompt.empty()) {
    check(m.tokenizer != nullptr, "{}: no tokenizer; use --token-ids", path);
    // As generate encodes a plain prompt: BOS when the model wants one, special tokens parsed.
    ids = encode_prompt(*m.tokenizer, prompt, {}, false, "");
    check(!ids.empty(), "--prompt: the prompt encodes to no tokens");
  }
  for (int32_t id : ids) check(id < c.vocab_size, "--token-ids: id {} is out of range [0, {})", id, c.vocab_size);
  check(static_cast<int64_t>(ids.size()) <= c.max_context, "{} tokens exceed the model's context length {}",
        ids.size(), c.max_context);
  auto runner = make_runner(c, m.weights, static_cast<int>(ids.size()), m.options(d));
  const nlohmann::json load = m.load_stats();
  std::vector<float> logits(ids.size() * static_cast<size_t>(c.vocab_size));
  runner->forward(ids, 0, /*all_positions=*/true, logits);
  write_npy_f32(out, {static_cast<int64_t>(ids.size()), c.vocab_size}, logits);
  fmt::print(stderr, "wrote {} [{} x {}] float32\n", out, ids.size(), c.vocab_size);
  // After success only: an error stays the one line on stderr.
  if (!d.quiet) fmt::print(stderr, "{}\n", load_line(load));
  return 0;
}

struct TokenizeArgs {
  std::string model, prompt, ids, system;
  bool chat = false, no_bos = false, json = false;
};

// Text to ids (one comma-separated line, ready for --token-ids) or, with --ids, ids to text (special
// tokens written out, so that what a prompt really holds is visible). Reads only the tokenizer.
int run_tokenize(const TokenizeArgs& a) {
  std::vector<int32_t> ids;
  if (!a.ids.empty()) ids = parse_token_ids(a.ids);
  const std::string path = resolve_model_path(a.model);
  const std::unique_ptr<Tokenizer> tok = load_tokenizer(path);
  if (!a.ids.empty()) {
    for (int32_t id : ids)
      check(id < tok->vocab_size(), "--ids: id {} is out of range [0, {})", id, tok->vocab_size());
    const std::string text = tok->decode(ids, /*skip_special=*/false);
    if (a.json) {
      write_stdout(nlohmann::json{{"token_ids", ids}, {"text", text}}.dump(-1, ' ', false,
                                                                            nlohmann::json::error_handler_t::replace) +
                   "\n");
    } else {
      write_stdout(text + "\n");
    }
    return 0;
  }
  // encode_prompt decides BOS as generate does; --no-bos drops a leading BOS whichever way it came.
  ids = encode_prompt(*tok, a.prompt, {}, a.chat, a.system);
  if (a.no_bos && !ids.empty() && ids.front() == tok->bos_id()) ids.erase(ids.begin());
  if (a.json) {
    std::vector<std::string> pieces;
    for (int32_t id : ids) pieces.push_back(tok->token_bytes(id));
    write_stdout(nlohmann::json{{"token_ids", ids}, {"pieces", pieces}, {"count", ids.size()}}.dump(
                     -1, ' ', false, nlohmann::json::error_handler_t::replace) +
                 "\n");
  } else {
    std::string line;
    for (size_t i = 0; i < ids.size(); ++i) line += (i ? "," : "") + std::to_string(ids[i]);
    write_stdout(line + "\n");
  }
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
  fmt::print("cpu: {} threads by default ({} physical cores; OMP_NUM_THREADS or -t/--threads sets it), kernels {}\n",
             std::getenv("OMP_NUM_THREADS") != nullptr ? omp_get_max_threads() : physical_cpu_cores(),
             physical_cpu_cores(), cpu::isa_name(cpu::best_isa()));
#ifdef FDPP_HAVE_CUDA
  std::string why;
  const auto gpus = cuda::list_gpus(&why);
  if (gpus.empty()) fmt::print("cuda: {}; the CPU backend will be used\n", why);
  for (const auto& g : gpus)
    fmt::print("cuda:{} {} (sm_{}{}, {} SMs, {} memory, {} L2)\n", g.index, g.name, g.sm_major, g.sm_minor,
               g.multiprocessors, human_bytes(static_cast<double>(g.total_memory)), human_bytes(static_cast<double>(g.l2_bytes)));
#else
  fmt::print("cuda: not compiled in (built with FDPP_CUDA=OFF or without nvcc); the CPU backend will be used\n");
#endif
  return 0;
}

// llama.cpp spells its GPU-layers flag "-ngl", which CLI11 would read as "-n gl" (a confusing
// "--max-tokens: gl ..." error), and vLLM its tensor-parallel size "-tp" (read as "-t p"); they
// become the long flags before parsing.
std::vector<std::string> llama_cpp_spellings(int argc, char** argv) {
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-ngl") a = "--n-gpu-layers";
    else if (a.starts_with("-ngl=")) a = "--n-gpu-layers=" + a.substr(5);
    else if (a == "-tp") a = "--tensor-parallel";
    else if (a.starts_with("-tp=")) a = "--tensor-parallel=" + a.substr(4);
    args.push_back(std::move(a));
  }
  return args;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fdpp: fast LLM decoding (FlashDecoding++)", "fdpp"};
  app.require_subcommand(0, 1);
  // Bad flags: one line, like every other error (CLI11's default adds a second line).
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return fmt::format("fdpp: error: {} (see --help)\n", e.what());
  });
  app.set_version_flag("--version", "fdpp 0.1.0");

  GenerateArgs g;
  DeviceArgs g_dev, l_dev;
  int64_t g_seed = -1;
  auto* gen = app.add_subcommand("generate", "generate text (streams to stdout), or run a prompts file (--file)");
  gen->add_option("-m,--model", g.model, "GGUF file or Hugging Face model directory (default: the default model)");
  auto* prompt_opt = gen->add_option("-p,--prompt", g.prompt, "prompt text; - reads it from stdin");
  auto* ids_opt = gen->add_option("--token-ids", g.token_ids, "prompt as token ids, e.g. 1,2,3")
                      ->check(CLI::Validator(
                          [](std::string& s) -> std::string {
                            try {
                              parse_token_ids(s);
                              return "";
                            } catch (const UsageError& e) {
                              return std::string(e.what()).substr(std::string("--token-ids: ").size());
                            }
                          },
                          ""));
  auto* file_opt = gen->add_option("-f,--file", g.file,
                                    "prompts file run as one batch: .jsonl (\"prompt\" or \"messages\", optional "
                                    "sampling fields per line) or text (one prompt per line; - reads stdin); "
                                    "writes JSON Lines");
  prompt_opt->excludes(ids_opt);
  file_opt->excludes(prompt_opt)->excludes(ids_opt);
  gen->add_option("-n,--max-tokens,--n-predict", g.max_tokens, "tokens to generate")
      ->capture_default_str()
      ->check(int_check(max_tokens_problem));
  gen->add_option("--temperature,--temp", g.sampling.temperature, "0 = greedy")
      ->capture_default_str()
      ->check(real_check(temperature_problem));
  gen->add_option("--top-k", g.sampling.top_k, "keep the k most likely tokens (0 = off)")
      ->capture_default_str()
      ->check(int_check(top_k_problem));
  gen->add_option("--top-p", g.sampling.top_p, "nucleus sampling mass in (0, 1] (1 = off)")
      ->capture_default_str()
      ->check(real_check(top_p_problem));
  gen->add_option("--min-p", g.sampling.min_p, "drop tokens below min-p x the top probability (0 = off)")
      ->capture_default_str()
      ->check(real_check(min_p_problem));
  gen->add_option("--repeat-penalty", g.sampling.repeat_penalty, "penalty for repeated tokens (1 = off)")
      ->capture_default_str()
      ->check(real_check(repeat_penalty_problem));
  gen->add_option("--repeat-last-n", g.sampling.repeat_last_n, "tokens the penalty looks back over (-1 = all)")
      ->capture_default_str()
      ->check(int_check(repeat_last_n_problem));
  gen->add_option("-s,--seed", g_seed, "random seed; -1 (default): a random one, printed with the stats / in --json")
      ->capture_default_str()
      ->check(int_range(-1, INT64_MAX, "[-1, 2^63)"));
  gen->add_option("-c,--ctx-size", g.ctx_size, "context size (default: the model's)")
      ->check(int_range(0, 1 << 24, "[0, 2^24]"));
  auto* system_opt = gen->add_option("--system", g.system, "system message (implies --chat)");
  gen->add_option("--stop", g.stop, "stop string: the text ends before it (repeatable)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->check(CLI::Validator(
          [](std::string& s) -> std::string {
            const std::string p = stop_problem(s);
            return p.empty() ? "" : fmt::format("'{}' {}", s, p);
          },
          ""));
  gen->add_flag("--ignore-eos", g.ignore_eos, "keep generating past end-of-generation tokens");
  auto* chat_opt = gen->add_flag("--chat", g.chat, "wrap the prompt in the model's chat template");
  gen->add_flag("--json", g.json, "print one JSON object (token_ids, text, seed, timings) instead of streaming");
  gen->add_flag("--unordered", g.unordered, "with --file: write each result as it finishes (with its index)");
  ids_opt->excludes(system_opt)->excludes(chat_opt);
  g_dev.add_to(gen);

  std::string l_model, l_ids, l_prompt, l_out;
  auto* logits = app.add_subcommand("logits", "write the logits of every position as float32 .npy [T, vocab]");
  logits->add_option("-m,--model", l_model, "GGUF file or HF model directory (default: the default model)");
  auto* l_ids_opt = logits->add_option("--token-ids", l_ids, "token ids, e.g. 1,2,3");
  auto* l_prompt_opt = logits->add_option("-p,--prompt", l_prompt, "text, encoded as generate does; - reads stdin");
  l_ids_opt->excludes(l_prompt_opt);
  logits->add_option("-o,--out", l_out, "output .npy file")->required();
  l_dev.add_to(logits);

  TokenizeArgs t;
  auto* tokenize = app.add_subcommand("tokenize", "text to token ids (comma-separated), or --ids back to text");
  tokenize->add_option("-m,--model", t.model, "GGUF file or HF model directory (default: the default model)");
  auto* t_prompt_opt = tokenize->add_option("-p,--prompt", t.prompt, "text to encode; - reads stdin");
  auto* t_ids_opt = tokenize->add_option("--ids", t.ids, "token ids to decode, e.g. 1,2,3");
  t_prompt_opt->excludes(t_ids_opt);
  tokenize->add_flag("--chat", t.chat, "wrap the text in the model's chat template first");
  tokenize->add_option("--system", t.system, "system message (implies --chat)");
  tokenize->add_flag("--no-bos", t.no_bos, "drop the BOS token the model would add");
  tokenize->add_flag("--json", t.json, "print JSON (token_ids and pieces, or token_ids and text)");

  std::string i_model;
  bool i_json = false;
  auto* info = app.add_subcommand("info", "describe and validate a model without loading its weights");
  info->add_option("-m,--model", i_model, "GGUF file or HF model directory (default: the default model)");
  info->add_flag("--json", i_json, "print JSON");

  CalibrateArgs cal;
  int cal_threads = 0;
  auto* calibrate = app.add_subcommand("calibrate", "choose the unified-max phi per layer from real text (CPU)");
  calibrate->add_option("-m,--model", cal.model, "GGUF file or HF model directory (default: the default model)");
  calibrate->add_option("--prompts", cal.prompts, "text file, one prompt per blank-line-separated paragraph "
                        "(default: a built-in English set)");
  calibrate->add_option("-o,--out", cal.out,
                        "calibration file (default: <model>.fdpp-calib.json, else the cache); another path is "
                        "loaded with --calibration FILE");
  calibrate->add_option("--percentile", cal.percentile, "phi = this percentile of each layer's row max logits")
      ->capture_default_str()->check(CLI::Range(0.001, 100.0));
  calibrate->add_option("--max-tokens", cal.max_tokens, "truncate each prompt to N tokens (0: the model's context)")
      ->check(int_range(0, 1 << 24, "[0, 2^24]"));
  calibrate->add_option("-t,--threads", cal_threads, "CPU threads (0: $OMP_NUM_THREADS, else the physical cores)")
      ->check(int_range(0, 4096, "[0, 4096]"));

  auto* devices = app.add_subcommand("devices", "list the CPU threads and CUDA GPUs fdpp can use");
  auto* serve = register_serve(app);

  BenchCpuArgs bc;
#ifndef FDPP_HAVE_CUDA
  auto* bench_cpu = register_bench_cpu(app, bc);
#endif

#ifdef FDPP_HAVE_CUDA
  BenchArgs b;
  auto* bench = app.add_subcommand("bench", "prefill (pp) and decode (tg) speed on the GPU, llama-bench style");
  bench->add_option("-m,--model", b.model, "model file or HF directory (default: the default model)");
  bench->add_option("--config", b.config, "config.json for --load-format dummy (see configs/)");
  bench->add_option("--load-format", b.load_format, "auto (read the weights) or dummy (random weights on the GPU)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "dummy"}));
  bench->add_option("--dtype", b.dtype, "f16 or bf16")->capture_default_str()->check(CLI::IsMember({"f16", "bf16"}));
  bench->add_option("-b,--batch", b.batches, "decode batch sizes, e.g. 1,8,32")->delimiter(',')->check(CLI::Range(1, 1024));
  bench->add_option("-c,--context", b.contexts, "decode context lengths, e.g. 1024,4096")->delimiter(',')->check(CLI::Range(2, 1 << 22));
  bench->add_option("-p,--prompt", b.prompts, "prefill lengths (0 entries: none; --device cpu: 0 for none)")->delimiter(',')->check(CLI::Range(0, 1 << 22));
  bench->add_option("-r,--repetitions", b.repetitions, "timed prefill runs per length")->capture_default_str()->check(CLI::Range(1, 1000));
  bench->add_option("--steps", b.steps, "timed decode steps per (batch, context)")->capture_default_str()->check(CLI::Range(1, 100000));
  bench->add_option("--bandwidth", b.bandwidth, "read bandwidth in bytes/s for the roofline (default: measure)");
  bench->add_flag("--json", b.json, "print JSON");
  bench->add_flag("--no-cuda-graphs", b.no_cuda_graphs, "launch decode steps eagerly");
  bench->add_option("--tensor-parallel,--tensor-parallel-size", b.tensor_parallel,
                    "split the model over this many GPUs (-tp); reports per-GPU bandwidth and the collectives' time")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  bench->add_option("--prefill-config", b.prefill_config, "prefill attention tile configuration (bench-attention --prefill lists them)");
  bench->add_option("--mixed-chunk", b.mixed_chunk,
                    "mixed test: batch - 1 sequences decode while one prefills a chunk of this many tokens (0: off)")
      ->capture_default_str();
  bench->add_option("--linear", b.linear, "linear layers: auto (dispatch table), gemv, flat, cublas (default: $FDPP_LINEAR, else auto)")
      ->check(CLI::IsMember({"auto", "gemv", "flat", "cublas"}));
  bench->add_option("--dispatch-table", b.dispatch_table,
                    "dispatch table file from fdpp tune (default: $FDPP_DISPATCH_TABLE, else looked up)");
  add_kernel_flags(bench, b.kernels);
  bench->add_option("--calibration", b.calibration,
                    "unified-max calibration file from fdpp calibrate (default: <model>.fdpp-calib.json, else the cache)");
  bench->add_option("--attention", b.attention, "decode attention: async (unified max) or sync")
      ->capture_default_str()
      ->check(CLI::IsMember({"async", "sync"}));
  std::string bench_device = "cuda";
  bench->add_option("--device", bench_device, "cuda, or cpu (llama-bench's pp/tg table for the CPU backend)")
      ->capture_default_str()
      ->check(CLI::IsMember({"cuda", "cpu"}));
  add_bench_cpu_options(bench, bc);

  BenchAttentionArgs ba;
  auto* bench_attn = app.add_subcommand("bench-attention", "decode attention kernels alone: async vs sync, graph-timed");
  bench_attn->add_option("--heads", ba.heads, "query heads")->capture_default_str()->check(CLI::Range(1, 1024));
  bench_attn->add_option("--kv-heads", ba.kv_heads, "key/value heads")->capture_default_str()->check(CLI::Range(1, 1024));
  bench_attn->add_option("--head-dim", ba.head_dim, "decode: 64, 80, 96, 128 or 256; --prefill: 64 or 128")->capture_default_str();
  bench_attn->add_option("--dtype", ba.dtype, "f16 or bf16")->capture_default_str();
  bench_attn->add_option("-b,--batch", ba.batches, "batch sizes")->delimiter(',')->check(CLI::Range(1, 4096));
  bench_attn->add_option("-c,--context", ba.contexts, "context lengths")->delimiter(',')->check(CLI::Range(1, 1 << 22));
  bench_attn->add_option("--modes", ba.modes, "async, sync")->delimiter(',');
  bench_attn->add_option("--replays", ba.replays, "graph replays per point (median)")->capture_default_str()->check(CLI::Range(1, 1000));
  bench_attn->add_flag("--json", ba.json, "print JSON");
  bench_attn->add_flag("--prefill", ba.prefill, "causal prefill attention (tensor cores) instead of decode");
  add_kernel_flags(bench_attn, ba.kernels);
  bench_attn->add_option("--decode-warps", ba.kernels.decode_warps,
                         "decode attention's warps per CTA at head dims 64, 128: 0 (auto: 4 for the tensor-core loop at "
                         "groups for 3/4 of two CTAs per SM, else 8), 4 or 8 "
                         "(default: $FDPP_DECODE_WARPS, else 0)")
      ->check(CLI::IsMember({"0", "4", "8"}));
  bench_attn->add_option("--async-combine", ba.kernels.async_combine,
                         "async decode attention's reduction of splits: auto, kernel (the last CTA) or launch "
                         "(a second kernel) (default: $FDPP_ASYNC_COMBINE, else auto)")
      ->check(CLI::IsMember({"auto", "kernel", "launch"}));
  bench_attn->add_option("--block-size", ba.block_size, "decode: KV cache tokens per block (a power of two)")
      ->capture_default_str()
      ->check(CLI::IsMember({"1", "2", "4", "8", "16", "32", "64", "128", "256", "512", "1024"}));
  bench_attn
      ->add_option("--kv-layout", ba.kernels.kv_layout,
                   "KV cache layout, head-major (the engine's: a kv head's rows of a block adjacent) or "
                   "token-major (a token's kv heads adjacent) (default: $FDPP_KV_LAYOUT, else head-major)")
      ->check(CLI::IsMember({"token-major", "head-major"}));
  bench_attn->add_option("--block-order", ba.block_order,
                         "decode: order of a sequence's KV blocks in memory, shuffled (a fragmented cache) or "
                         "sequential")
      ->capture_default_str()
      ->check(CLI::IsMember({"shuffled", "sequential"}));
  bench_attn->add_option("--splits", ba.splits,
                         "decode: split-KV counts to time at every point (0: the engine's plan)")
      ->delimiter(',')
      ->check(CLI::Range(0, 1024));
  bench_attn->add_option("--points", ba.points, "prefill points BxL (B sequences of L tokens)")->delimiter(',');
  bench_attn->add_option("--prefill-config", ba.prefill_configs,
                         "prefill tile configurations to compare (m64n64, m128n64w8, m128n64w8s3, m128n32w4 or all)")
      ->delimiter(',');
  auto* tune = register_tune(app);
  auto* bench_linear = register_bench_linear(app);
#endif

  // Subcommand names come from the app, so that ones registered elsewhere (serve) are listed too.
  std::string subcommands;
  bool known = false;
  std::vector<std::string> args = llama_cpp_spellings(argc, argv);
  for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    subcommands += (subcommands.empty() ? "" : ", ") + sub->get_name();
    known = known || (!args.empty() && sub->check_name(args[0]));
  }
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
    if (*gen) {
      g_dev.check_flags();
      // A random seed unless one is given (llama.cpp's rule); it is printed, so a run can be repeated.
      g.sampling.seed = g_seed >= 0 ? static_cast<uint64_t>(g_seed) : random_seed();
      if (prompt_opt->count() > 0) g.prompt = prompt_text("--prompt", g.prompt);
      if (!g.system.empty()) {
        if (std::string p = utf8_problem(g.system); !p.empty()) throw UsageError("--system: " + p);
      }
      if (g.stop.size() > kMaxStopStrings)
        throw UsageError(fmt::format("--stop: given {} times; at most {} stop strings are supported", g.stop.size(),
                                     kMaxStopStrings));
      if (g.unordered && g.file.empty()) throw UsageError("--unordered: only with --file");
      if (!g.file.empty() && g.max_tokens == 0)
        throw UsageError("--max-tokens 0: each request of a prompts file generates at least 1 token");
      if (!g.file.empty()) {
        g_dev.say_gpu_layers();
        rc = run_generate_file(g, g_dev);
      } else {
        if (prompt_opt->count() == 0 && g.token_ids.empty())
          throw UsageError("generate needs --prompt TEXT, --token-ids 1,2,3 or --file FILE");
        g_dev.say_gpu_layers();
        rc = run_generate(g, g_dev);
      }
    } else if (*logits) {
      l_dev.check_flags();
      if (l_ids_opt->count() == 0 && l_prompt_opt->count() == 0)
        throw UsageError("logits needs --token-ids 1,2,3 or --prompt TEXT");
      if (l_prompt_opt->count() > 0) l_prompt = prompt_text("--prompt", l_prompt);
      if (l_ids_opt->count() > 0) parse_token_ids(l_ids);  // usage errors before the model loads
      l_dev.say_gpu_layers();
      rc = run_logits(l_model, l_ids, l_prompt, l_out, l_dev);
    } else if (*tokenize) {
      if (t_prompt_opt->count() == 0 && t_ids_opt->count() == 0)
        throw UsageError("tokenize needs --prompt TEXT or --ids 1,2,3");
      if (t_prompt_opt->count() > 0) t.prompt = prompt_text("--prompt", t.prompt);
      if (std::string p = utf8_problem(t.system); !p.empty()) throw UsageError("--system: " + p);
      if (t_ids_opt->count() > 0) {
        try {
          parse_token_ids(t.ids);
        } catch (const UsageError& e) {
          throw UsageError("--ids" + std::string(e.what()).substr(std::string("--token-ids").size()));
        }
      }
      rc = run_tokenize(t);
    } else if (*info) {
      rc = run_info(i_model, i_json);
    } else if (*calibrate) {
      set_cpu_threads(cal_threads);
      rc = run_calibrate(cal);
    } else if (*devices) {
      rc = run_devices();
    } else if (*serve) {
      rc = run_serve();
#ifndef FDPP_HAVE_CUDA
    } else if (*bench_cpu) {
      rc = run_bench_cpu(bc);
#endif
#ifdef FDPP_HAVE_CUDA
    } else if (*bench && bench_device == "cpu") {
      bc.model = b.model;
      bc.repetitions = b.repetitions;
      bc.json = b.json;
      if (bench->count("-p") > 0) bc.prompts = b.prompts;
      rc = run_bench_cpu(bc);
    } else if (*bench) {
      rc = run_bench(b);
    } else if (*bench_attn) {
      rc = ba.prefill ? run_bench_prefill_attention(ba) : run_bench_attention(ba);
    } else if (*tune) {
      rc = run_tune();
    } else if (*bench_linear) {
      rc = run_bench_linear();
#endif
    }
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
