#include "engine/prompt_file.h"

#include <nlohmann/json.hpp>

#include <cctype>
#include <cmath>
#include <iostream>
#include <random>

#include "core/read_file.h"
#include "engine/request_limits.h"
#include "fdpp/error.h"
#include "io/json_file.h"

namespace fdpp {

namespace {

std::string lower_ext(const std::string& path) {
  const size_t dot = path.find_last_of('.');
  const size_t slash = path.find_last_of('/');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) return "";
  std::string e = path.substr(dot);
  for (char& c : e) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return e;
}

// A JSON line's value as the type a field needs; the problem names the field and the line.
struct LineContext {
  const std::string& source;
  int line;
  template <class... Args>
  [[noreturn]] void fail_at(fmt::format_string<Args...> f, Args&&... args) const {
    throw Error(fmt::format("{}:{}: {}", source, line, fmt::format(f, std::forward<Args>(args)...)));
  }
};

// A sampling or length field checked against the table of request limits (engine/request_limits.h),
// as the server and the Python package check theirs.
int64_t line_integer(const LineContext& at, const nlohmann::json& v, std::string_view field) {
  JsonParam p = check_json_param(field, v);
  if (!p.message.empty()) at.fail_at("{}", p.message);
  return p.integer;
}

float line_real(const LineContext& at, const nlohmann::json& v, std::string_view field) {
  JsonParam p = check_json_param(field, v);
  if (!p.message.empty()) at.fail_at("{}", p.message);
  return static_cast<float>(p.real);
}

std::string json_text(const LineContext& at, const nlohmann::json& v, std::string_view field) {
  if (!v.is_string()) at.fail_at("\"{}\" must be a string, not {}", field, v.dump());
  return v.get<std::string>();
}

PromptEntry parse_json_line(std::string_view text, const LineContext& at) {
  nlohmann::json j;
  try {
    j = parse_json(text);
  } catch (const JsonSyntaxError& e) {
    at.fail_at("not valid JSON ({})", e.what());
  }
  if (!j.is_object())
    at.fail_at("expected a JSON object with \"prompt\", \"messages\" or \"prompt_token_ids\", got {}", j.type_name());
  PromptEntry e;
  e.line = at.line;
  if (j.contains("prompt") + j.contains("messages") + j.contains("prompt_token_ids") != 1)
    at.fail_at("needs exactly one of \"prompt\", \"messages\" and \"prompt_token_ids\"");
  for (const auto& [key, v] : j.items()) {
    if (key == "prompt") {
      e.prompt = json_text(at, v, key);
      if (e.prompt.empty()) at.fail_at("\"prompt\" is empty");
    } else if (key == "messages") {
      if (!v.is_array() || v.empty()) at.fail_at("\"messages\" must be a non-empty array of {{\"role\", \"content\"}}");
      for (const nlohmann::json& m : v) {
        if (!m.is_object() || !m.contains("role") || !m.contains("content"))
          at.fail_at("each of \"messages\" needs \"role\" and \"content\", got {}", m.dump());
        ChatMessage cm{json_text(at, m["role"], "role"), json_text(at, m["content"], "content")};
        if (cm.role != "system" && cm.role != "user" && cm.role != "assistant")
          at.fail_at("message role \"{}\" is not one of system, user, assistant", cm.role);
        e.messages.push_back(std::move(cm));
      }
    } else if (key == "prompt_token_ids") {
      if (!v.is_array() || v.empty()) at.fail_at("\"prompt_token_ids\" must be a non-empty array of token ids");
      for (const nlohmann::json& t : v) {
        if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > INT32_MAX)
          at.fail_at("\"prompt_token_ids\" holds {}, not a token id", t.dump());
        e.prompt_token_ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
      }
    } else if (key == "id") {
      e.id_json = v.dump();
    } else if (key == "max_tokens") {
      e.max_tokens = static_cast<int>(line_integer(at, v, key));
    } else if (key == "temperature") {
      e.temperature = line_real(at, v, key);
    } else if (key == "top_k") {
      e.top_k = static_cast<int>(line_integer(at, v, key));
    } else if (key == "top_p") {
      e.top_p = line_real(at, v, key);
    } else if (key == "min_p") {
      e.min_p = line_real(at, v, key);
    } else if (key == "repeat_penalty") {
      e.repeat_penalty = line_real(at, v, key);
    } else if (key == "repeat_last_n") {
      e.repeat_last_n = static_cast<int>(line_integer(at, v, key));
    } else if (key == "seed") {
      // -1 means a random seed, as on the command line; it is drawn here so that the output can
      // print the seed that was used.
      const int64_t n = line_integer(at, v, key);
      e.seed = n == -1 ? random_seed() : static_cast<uint64_t>(n);
    } else if (key == "stop") {
      std::vector<std::string> stop;
      if (v.is_string()) {
        stop.push_back(v.get<std::string>());
      } else if (v.is_array()) {
        for (const nlohmann::json& s : v) stop.push_back(json_text(at, s, "stop"));
      } else {
        at.fail_at("\"stop\" must be a string or an array of strings, not {}", v.dump());
      }
      if (std::string m = list_count_message(key, stop.size()); !m.empty()) at.fail_at("{}", m);
      for (const std::string& s : stop)
        if (std::string p = stop_string_problem(s); !p.empty()) at.fail_at("\"stop\" {}", p);
      e.stop = std::move(stop);
    } else if (key == "ignore_eos") {
      if (!v.is_boolean()) at.fail_at("\"ignore_eos\" must be true or false, not {}", v.dump());
      e.ignore_eos = v.get<bool>();
    } else {
      at.fail_at("unknown field \"{}\" (known: prompt, messages, prompt_token_ids, id, max_tokens, temperature, top_k, top_p, min_p, "
                 "repeat_penalty, repeat_last_n, seed, stop, ignore_eos)",
                 key);
    }
  }
  return e;
}

}  // namespace

// The CLI's flags: the table's problems, which the validators print after the value typed.
std::string temperature_problem(double v) { return param_problem(request_param("temperature"), v); }
std::string top_k_problem(int64_t v) { return param_problem(request_param("top_k"), v); }
std::string top_p_problem(double v) { return param_problem(request_param("top_p"), v); }
std::string min_p_problem(double v) { return param_problem(request_param("min_p"), v); }
std::string repeat_penalty_problem(double v) { return param_problem(request_param("repeat_penalty"), v); }
std::string repeat_last_n_problem(int64_t v) { return param_problem(request_param("repeat_last_n"), v); }
std::string max_tokens_problem(int64_t v) { return param_problem(request_param("n_predict"), v); }
std::string stop_problem(std::string_view s) { return stop_string_problem(s); }

std::string utf8_problem(std::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  for (size_t i = 0; i < n;) {
    const unsigned char b = s[i];
    size_t len = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // the allowed range of the second byte (Table 3-7)
    if (b < 0x80) len = 1;
    else if (b >= 0xC2 && b <= 0xDF) len = 2;
    else if (b == 0xE0) len = 3, lo = 0xA0;
    else if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) len = 3;
    else if (b == 0xED) len = 3, hi = 0x9F;  // no surrogates
    else if (b == 0xF0) len = 4, lo = 0x90;
    else if (b >= 0xF1 && b <= 0xF3) len = 4;
    else if (b == 0xF4) len = 4, hi = 0x8F;  // nothing above U+10FFFF
    bool ok = len > 0 && i + len <= n;
    for (size_t k = 1; ok && k < len; ++k) {
      const unsigned char c = s[i + k];
      ok = k == 1 ? (c >= lo && c <= hi) : (c >= 0x80 && c <= 0xBF);
    }
    if (!ok) return fmt::format("byte 0x{:02x} at offset {} is not valid UTF-8", b, i);
    i += len;
  }
  return "";
}

uint64_t random_seed() {
  std::random_device rd;
  const uint64_t hi = rd(), lo = rd();
  return ((hi << 32) | lo) >> 1;
}

RequestSettings PromptEntry::settings(const RequestSettings& defaults) const {
  RequestSettings s = defaults;
  if (max_tokens) s.max_tokens = *max_tokens;
  if (temperature) s.sampling.temperature = *temperature;
  if (top_k) s.sampling.top_k = *top_k;
  if (top_p) s.sampling.top_p = *top_p;
  if (min_p) s.sampling.min_p = *min_p;
  if (repeat_penalty) s.sampling.repeat_penalty = *repeat_penalty;
  if (repeat_last_n) s.sampling.repeat_last_n = *repeat_last_n;
  if (seed) s.sampling.seed = *seed;
  if (stop) s.stop = *stop;
  if (ignore_eos) s.ignore_eos = *ignore_eos;
  return s;
}

PromptFileFormat prompt_file_format(const std::string& path) {
  const std::string e = lower_ext(path);
  return e == ".jsonl" || e == ".ndjson" || e == ".json" ? PromptFileFormat::JsonLines : PromptFileFormat::Text;
}

std::vector<PromptEntry> parse_prompt_file(std::string_view content, PromptFileFormat format,
                                           const std::string& source) {
  std::vector<PromptEntry> entries;
  int line_no = 0;
  for (size_t pos = 0; pos < content.size();) {
    size_t nl = content.find('\n', pos);
    if (nl == std::string_view::npos) nl = content.size();
    std::string_view line = content.substr(pos, nl - pos);
    pos = nl + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    const LineContext at{source, line_no};
    // Checked before JSON parsing too: nlohmann rejects bad UTF-8 in strings with a less clear message.
    if (std::string p = utf8_problem(line); !p.empty()) at.fail_at("{}", p);
    if (line.find_first_not_of(" \t") == std::string_view::npos) continue;  // blank
    if (format == PromptFileFormat::JsonLines) {
      entries.push_back(parse_json_line(line, at));
    } else {
      PromptEntry e;
      e.line = line_no;
      e.prompt = std::string(line);
      entries.push_back(std::move(e));
    }
  }
  check(!entries.empty(), "{}: no prompts (the file is empty or every line is blank)", source);
  return entries;
}

std::vector<PromptEntry> read_prompt_file(const std::string& path) {
  if (path == "-")
    return parse_prompt_file(read_all(std::cin, kMaxPromptFileBytes, "standard input"), PromptFileFormat::Text,
                             "<stdin>");
  return parse_prompt_file(read_file(path, kMaxPromptFileBytes, "the prompts file"), prompt_file_format(path), path);
}

std::vector<int32_t> encode_prompt(const Tokenizer& tokenizer, const std::string& prompt,
                                   const std::vector<ChatMessage>& messages, bool chat, const std::string& system,
                                   const ChatOptions& chat_options) {
  bool add_bos = tokenizer.add_bos_by_default();
  std::string text = prompt;
  if (!messages.empty() || chat || !system.empty()) {
    std::vector<ChatMessage> conversation;
    if (!system.empty() && (messages.empty() || messages.front().role != "system"))
      conversation.push_back({"system", system});
    if (messages.empty()) conversation.push_back({"user", prompt});
    conversation.insert(conversation.end(), messages.begin(), messages.end());
    text = tokenizer.apply_chat_template(conversation, /*add_generation_prompt=*/true, chat_options);
    const int32_t bos = tokenizer.bos_id();
    if (bos >= 0 && text.starts_with(tokenizer.token_text(bos))) add_bos = false;
  }
  return tokenizer.encode(text, add_bos, /*parse_special=*/true);
}

ChatOptions parse_chat_template_kwargs(std::string_view json_text) {
  const nlohmann::json j = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  check(j.is_object(), "chat template kwargs: expected a JSON object such as {{\"enable_thinking\": false}}, got '{}'",
        json_text.substr(0, 80));
  ChatOptions o;
  for (const auto& [k, v] : j.items()) {
    check(k == "enable_thinking", "chat template kwargs: '{}' is not supported (supported: enable_thinking)", k);
    if (v.is_null()) continue;
    check(v.is_boolean(), "chat template kwargs: enable_thinking must be true or false, got {}", v.dump());
    o.enable_thinking = v.get<bool>();
  }
  return o;
}

GenerationRequest build_request(const PromptEntry& entry, const RequestSettings& s, const Tokenizer& tokenizer,
                                int max_context, const std::string& source) {
  const LineContext at{source, entry.line};
  // The defaults come from the CLI's -n, where 0 runs a single prompt only; a request needs >= 1.
  if (std::string m = check_request_param("max_tokens", s.max_tokens); !m.empty()) at.fail_at("{}", m);
  GenerationRequest r;
  try {
    r.prompt = !entry.prompt_token_ids.empty() ? entry.prompt_token_ids
                                               : encode_prompt(tokenizer, entry.prompt, entry.messages, s.chat, s.system,
                                                               s.chat_options);
  } catch (const Error& e) {
    at.fail_at("{}", e.what());
  }
  if (r.prompt.empty()) at.fail_at("the prompt encodes to no tokens");
  if (static_cast<int64_t>(r.prompt.size()) + s.max_tokens > max_context)
    at.fail_at("prompt ({} tokens) + max_tokens ({}) exceed the context size {}", r.prompt.size(), s.max_tokens,
               max_context);
  r.sampling = s.sampling;
  r.max_tokens = s.max_tokens;
  r.ignore_eos = s.ignore_eos;
  r.stop = s.stop;
  return r;
}

}  // namespace fdpp
