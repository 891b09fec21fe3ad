// The helpers every subcommand shares (cli_common.h).
#include "cli_common.h"

#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <iostream>

#include "core/read_file.h"
#include "engine/prompt_file.h"
#include "tokenizer/tokenizer.h"

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

void say_gpu_layers(const EngineArgs& a) {
  // llama.cpp users pass -ngl from habit; fdpp never splits a model between CPU and GPU, so say once
  // what it does instead.
  if (a.n_gpu_layers < 0) return;
  if (a.n_gpu_layers == 0) {
    fmt::print(stderr, "fdpp: -ngl 0: running on the CPU\n");
    return;
  }
  const bool gpu = resolve_device(a.requested_device()) == Device::Cuda;
  fmt::print(stderr, "fdpp: -ngl {}: {}\n", a.n_gpu_layers,
             gpu ? "every layer runs on the GPU (fdpp does not split a model between CPU and GPU)"
                 : "no GPU is used here, every layer runs on the CPU");
}

namespace {

std::string number_problem_int(const std::string& s, int64_t lo, int64_t hi, std::string_view range_text) {
  int64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size()) return fmt::format("'{}' is not an integer", s);
  if (v < lo || v > hi) return fmt::format("{} must be in {}", s, range_text);
  return "";
}

}  // namespace

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

void check_engine_flags(const EngineArgs& args) {
  try {
    args.check();
  } catch (const UsageError&) {
    throw;
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
}

void add_kernel_flags(CLI::App* app, EngineArgs& args) {
  for (const char* name : {"pdl", "decode_path"}) {
    const EngineOption& o = *find_engine_option(name);
    app->add_option_function<std::string>(o.flags, [&args, &o](const std::string& v) { o.assign(args, v); },
                                          o.help + " ($" + o.env + " when not given)")
        ->check(CLI::Validator([&o](std::string& v) { return option_problem(o, v); }, ""));
  }
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

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  return fmt::format("{:.2f} {}", b, units[u]);
}

std::string model_label(const EngineArgs& args) {
  if (args.load_format == "dummy") return "random weights of " + args.config;
  return args.model.empty() ? default_model_path() : args.model;
}

OpenedModel open_model_with_progress(const EngineArgs& args, bool quiet) {
  const std::string label = "loading " + model_label(args);
  if (quiet) return open_model(args);
  LoadProgress progress(label);
  OpenedModel m = open_model(args, progress.callback());
  progress.finish();
  return m;
}

nlohmann::json LoadReport::stats(const OpenedModel& m) {
  bar_.finish();
  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  nlohmann::json j{{"seconds", total},
                   {"path", m.planned ? "stream" : m.dummy ? "dummy" : "host"},
                   {"stored_bytes", m.description.stored_bytes},
                   {"peak_rss_bytes", peak_rss_bytes()}};
  // A checkpoint published in FP8 or 4 bits (AWQ, GPTQ) runs as stored on the GPU whatever
  // --quantization says (as vLLM runs it), and dequantized to fp32 on the CPU: the load line says which.
  if (!m.description.quantization.empty()) {
    const bool packed = m.description.quantization.starts_with("awq") || m.description.quantization.starts_with("gptq");
    j["quantization"] = m.description.quantization + (m.device != Device::Cuda ? ": dequantized to fp32 on the CPU"
                                                      : packed                 ? ": runs in 4 bits"
                                                                               : ": runs as FP8");
  }
  if (m.planned) {
    j["weights_seconds"] = bar_.seconds();
    j["weights_gb_per_second"] = bar_.seconds() > 0 ? bar_.bytes() / 1e9 / bar_.seconds() : 0.0;
  }
  return j;
}

std::string load_line(const nlohmann::json& s) {
  std::string line = fmt::format("load: {:.2f} s ({}), peak RSS {:.2f} GiB", s["seconds"].get<double>(),
                                 s["path"].get<std::string>(), s["peak_rss_bytes"].get<uint64_t>() / 1073741824.0);
  if (s.contains("weights_seconds"))
    line += fmt::format(", weights {:.2f} GB in {:.2f} s ({:.2f} GB/s)", s["stored_bytes"].get<uint64_t>() / 1e9,
                        s["weights_seconds"].get<double>(), s["weights_gb_per_second"].get<double>());
  if (s.contains("quantization")) line += "; " + s["quantization"].get<std::string>();
  return line;
}

}  // namespace fdpp::cli
