// fdpp generate -cnv / -i: the interactive chat. Each turn renders the whole conversation with the
// model's chat template and runs it as one request on the engine's scheduler, so the reply streams
// as it is sampled. The history is prefilled again each turn (the scheduler's prefix cache, where
// it has one, makes that cheap); nothing of the engine is kept between turns but its KV blocks.
// Ctrl-C during a reply cancels the request at the next step and returns to the prompt; at the
// prompt it ends the program, as does end of input (Ctrl-D) or /exit. A second Ctrl-C before the
// first is handled exits at once with 130 (llama-cli's rule).
#include "chat.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>

#include "core/read_file.h"
#include "engine/prompt_file.h"
#include "engine/scheduler.h"
#include "tokenizer/tokenizer.h"

namespace fdpp::cli {

namespace {

volatile std::sig_atomic_t g_interrupted = 0;

void on_sigint(int) {
  if (g_interrupted != 0) {
    // The first one is still unhandled (a step that does not end): leave now, colors reset.
    static const char reset[] = "\033[0m\n";
    (void)!::write(STDOUT_FILENO, reset, sizeof reset - 1);
    ::_exit(130);
  }
  g_interrupted = 1;
}

// Installs the handler without SA_RESTART, so that a read at the prompt returns EINTR on Ctrl-C;
// restores the previous one when the chat ends.
class SigintGuard {
 public:
  SigintGuard() {
    struct sigaction sa {};
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;
    sigaction(SIGINT, &sa, &old_);
    g_interrupted = 0;
  }
  ~SigintGuard() { sigaction(SIGINT, &old_, nullptr); }
  SigintGuard(const SigintGuard&) = delete;
  SigintGuard& operator=(const SigintGuard&) = delete;

 private:
  struct sigaction old_ {};
};

// Lines from standard input through read(2), so that Ctrl-C (EINTR) is seen while waiting.
class LineReader {
 public:
  enum class Status { Line, Eof, Interrupted };
  Status read_line(std::string& line) {
    line.clear();
    for (;;) {
      if (const size_t nl = buffer_.find('\n'); nl != std::string::npos) {
        line = buffer_.substr(0, nl);
        buffer_.erase(0, nl + 1);
        if (line.ends_with('\r')) line.pop_back();
        return Status::Line;
      }
      char chunk[4096];
      const ssize_t n = ::read(STDIN_FILENO, chunk, sizeof chunk);
      if (n < 0 && errno == EINTR) {
        if (g_interrupted != 0) return Status::Interrupted;
        continue;
      }
      if (n <= 0) {  // end of input: a last line without a newline still counts
        if (buffer_.empty()) return Status::Eof;
        line.swap(buffer_);
        return Status::Line;
      }
      buffer_.append(chunk, static_cast<size_t>(n));
      check(buffer_.size() <= (size_t{64} << 20), "standard input: a line of more than 64 MiB");
    }
  }

 private:
  std::string buffer_;
};

// llama.cpp's console::readline: a line ending in \ toggles multi-line input (so by default it
// continues onto the next line); one ending in / ends the input. With -mli lines continue until
// such a line. Returns Eof / Interrupted only when nothing was typed.
LineReader::Status read_message(LineReader& in, bool multiline, std::string& message) {
  message.clear();
  std::string line;
  for (bool more = true; more;) {
    const LineReader::Status s = in.read_line(line);
    if (s == LineReader::Status::Interrupted) return s;
    if (s == LineReader::Status::Eof) {
      if (message.empty()) return s;
      break;
    }
    more = multiline;
    if (line.ends_with('/')) {
      line.pop_back();
      more = false;
    } else if (line.ends_with('\\')) {
      line.pop_back();
      more = !multiline;
    }
    message += line;
    if (more) message += '\n';
  }
  while (message.ends_with('\n')) message.pop_back();
  return LineReader::Status::Line;
}

bool use_color(const std::string& mode) {
  if (mode == "on") return true;
  if (mode == "off") return false;
  const char* term = std::getenv("TERM");
  return ::isatty(STDOUT_FILENO) == 1 && (term == nullptr || std::strcmp(term, "dumb") != 0);
}

constexpr const char* kUserColor = "\033[32m";  // llama-cli's: the user's input in green
constexpr const char* kReset = "\033[0m";

}  // namespace

std::string process_escapes(std::string_view in) {
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  out.reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '\\' || i + 1 >= in.size()) {
      out += in[i];
      continue;
    }
    const char c = in[++i];
    switch (c) {
      case 'n':
        out += '\n';
        break;
      case 'r':
        out += '\r';
        break;
      case 't':
        out += '\t';
        break;
      case '\'':
        out += '\'';
        break;
      case '"':
        out += '"';
        break;
      case '\\':
        out += '\\';
        break;
      default:
        if (c == 'x' && i + 2 < in.size() && hex(in[i + 1]) >= 0 && hex(in[i + 2]) >= 0) {
          out += static_cast<char>(hex(in[i + 1]) * 16 + hex(in[i + 2]));
          i += 2;
        } else {
          out += '\\';
          out += c;
        }
    }
  }
  return out;
}

int run_chat(const GenerateArgs& a, const EngineArgs& e, bool quiet) {
  LoadReport report("loading " + model_label(e), quiet);
  OpenedModel m = open_model_with_progress(e, quiet);
  check(m.tokenizer != nullptr, "{}: no tokenizer files (tokenizer.json, tokenizer.model, ...): the chat needs text",
        m.path);
  const Tokenizer& tok = *m.tokenizer;
  const ModelConfig& c = m.config();
  const int ctx = e.max_model_len > 0 ? e.max_model_len : std::min(c.max_context, kDefaultChatContext);
  check(ctx <= c.max_context, "--ctx-size {} exceeds the model's context length {}", ctx, c.max_context);
  try {
    (void)tok.apply_chat_template(std::vector<ChatMessage>{{"user", "hello"}}, true);
  } catch (const Error& err) {
    fail("{}: {} (the chat of -cnv/-i renders each turn with the model's template)", m.path, err.what());
  }

  EngineLimits limits;
  limits.max_context = ctx;
  limits.max_step_rows = 1;
  limits.max_step_tokens = std::min(ctx, 8192);
  limits.kv_cache_tokens = ctx;
  auto engine = m.make_engine(e, limits, report.progress());
  const nlohmann::json load = report.stats(m);
  SchedulerOptions so;
  so.max_num_seqs = 1;
  so.max_batched_tokens = limits.max_step_tokens;
  Scheduler scheduler(*engine, tok, so);

  const bool color = use_color(a.color);
  if (!quiet) {
    fmt::print(stderr, "{}\n", load_line(load));
    fmt::print(
        stderr,
        "fdpp chat: {} | context {} tokens{}\n"
        "  /exit or Ctrl-D  quit          /clear  start over       /regen  answer the last message again\n"
        "  /read FILE       add a file to the next message          Ctrl-C   stop a reply (at the prompt: quit)\n"
        "  a line ending in \\ continues on the next one{}\n",
        m.path, ctx, a.system.empty() ? "" : " | with a system prompt",
        a.multiline ? "; -mli: the message ends with a line ending in /" : "");
  }

  SigintGuard guard;
  LineReader in;
  std::vector<ChatMessage> messages;
  if (!a.system.empty()) messages.push_back({"system", a.system});
  std::string first = a.prompt;  // -p: the first message
  std::string attached;          // /read FILE: text that goes before the next message
  uint64_t turn = 0;
  for (;;) {
    std::string text;
    bool regen = false;
    if (!first.empty()) {
      text = std::move(first);
      first.clear();
      write_stdout(fmt::format("\n> {}\n", text));
    } else {
      g_interrupted = 0;  // a Ctrl-C from now on stops the reply to this message, from its prefill on
      write_stdout(color ? fmt::format("\n> {}", kUserColor) : std::string("\n> "));
      const LineReader::Status s = read_message(in, a.multiline, text);
      if (color) write_stdout(kReset);
      if (s != LineReader::Status::Line) {
        write_stdout("\n");
        break;  // Ctrl-D or Ctrl-C at the prompt
      }
    }
    if (text.empty()) continue;
    if (text == "/exit" || text == "/quit") break;
    if (text == "/clear") {
      messages.erase(
          std::remove_if(messages.begin(), messages.end(), [](const ChatMessage& msg) { return msg.role != "system"; }),
          messages.end());
      attached.clear();
      write_stdout("(the conversation is cleared)\n");
      continue;
    }
    if (text == "/regen") {
      if (messages.empty() || messages.back().role != "assistant") {
        write_stdout("(no reply to answer again)\n");
        continue;
      }
      messages.pop_back();
      regen = true;
    } else if (text.starts_with("/read ")) {
      std::string path = text.substr(6);
      while (!path.empty() && path.front() == ' ') path.erase(0, 1);
      while (!path.empty() && path.back() == ' ') path.pop_back();
      try {
        std::string content = read_file(path, size_t{64} << 20, "/read");
        if (std::string p = utf8_problem(content); !p.empty()) fail("{}: {}", path, p);
        attached += fmt::format("--- File: {} ---\n{}\n", path, content);
        write_stdout(fmt::format("(read {}: {} bytes, sent with the next message)\n", path, content.size()));
      } catch (const Error& err) {
        write_stdout(fmt::format("(cannot read it: {})\n", err.what()));
      }
      continue;
    } else if (text.starts_with('/') && text.find(' ') == std::string::npos && text.size() > 1 &&
               text.find('/', 1) == std::string::npos) {
      write_stdout(fmt::format("(unknown command {}; the commands are /exit, /clear, /regen, /read FILE)\n", text));
      continue;
    }
    if (!regen) {
      if (std::string p = utf8_problem(text); !p.empty()) {
        write_stdout(fmt::format("(the message is not UTF-8: {})\n", p));
        continue;
      }
      messages.push_back({"user", attached + text});
      attached.clear();
    }

    // The whole conversation, checked against the context before it runs.
    std::vector<int32_t> prompt = encode_prompt(tok, "", messages, true, "", a.chat_options);
    const int64_t room = ctx - static_cast<int64_t>(prompt.size());
    const int64_t want = a.max_tokens < 0 ? 1 : a.max_tokens;
    if (room < want) {
      write_stdout(
          fmt::format("(this turn does not fit: the conversation is {} tokens{}, the context {}; /clear "
                      "starts over, -c sets a larger context)\n",
                      prompt.size(), a.max_tokens < 0 ? "" : fmt::format(" + -n {}", a.max_tokens), ctx));
      if (!regen) messages.pop_back();
      continue;
    }
    if (a.verbose_prompt) {
      fmt::print(stderr, "--- prompt ({} tokens) ---\n{}\n--- reply ---\n", prompt.size(), tok.decode(prompt, false));
      std::fflush(stderr);
    }

    GenerationRequest request;
    request.prompt = std::move(prompt);
    request.sampling = a.sampling;
    request.sampling.seed = a.sampling.seed + turn++;  // each turn draws afresh, repeatably
    request.max_tokens = static_cast<int>(a.max_tokens < 0 ? room : a.max_tokens);
    request.ignore_eos = a.ignore_eos;
    request.stop = a.stop;
    std::string reply;
    GenerationResult result;
    GenerationCallbacks callbacks;
    callbacks.on_delta = [&](uint64_t, std::string_view piece, std::span<const int32_t>, std::span<const TokenLogprobs>) {
      reply += piece;
      write_stdout(piece);
    };
    callbacks.on_finish = [&](const GenerationResult& g) { result = g; };
    const uint64_t id = scheduler.submit(std::move(request), std::move(callbacks));
    bool cancelled = false;
    while (!scheduler.idle()) {
      if (g_interrupted != 0 && !cancelled) {
        scheduler.cancel(id);
        cancelled = true;
      }
      scheduler.step();
    }
    g_interrupted = 0;
    check(result.finish_reason != "error", "{}", result.error);
    // The reply as far as it went stays in the history (llama-cli keeps an interrupted one too).
    messages.push_back({"assistant", reply});
    write_stdout(cancelled ? "\n(interrupted)\n" : "\n");
    if (!quiet) {
      const double decode = result.total_time - result.time_to_first_token;
      const size_t n = result.token_ids.size();
      fmt::print(
          stderr, "[ prompt: {} tokens, {:.1f} t/s | reply: {} tokens, {:.1f} t/s{} ]\n", result.prompt.size(),
          result.time_to_first_token > 0 ? static_cast<double>(result.prompt.size()) / result.time_to_first_token : 0.0,
          n, n > 1 && decode > 0 ? (n - 1) / decode : 0.0,
          result.finish_reason == "length" ? ", stopped at the token limit" : "");
      std::fflush(stderr);
    }
    if (a.single_turn) break;
  }
  return 0;
}

}  // namespace fdpp::cli
