#include "tokenizer/tool_calls.h"

#include <algorithm>

#include "fdpp/error.h"
#include "io/json_file.h"

namespace fdpp {

using ojson = nlohmann::ordered_json;

namespace {

void dump_to(std::string& out, const ojson& v, int indent, int level) {
  const bool nested = v.is_object() || v.is_array();
  if (!nested || v.empty()) {
    out += v.dump(-1, ' ', false, ojson::error_handler_t::replace);
    return;
  }
  const char open = v.is_object() ? '{' : '[', close = v.is_object() ? '}' : ']';
  const auto newline = [&](int depth) {
    out += '\n';
    out.append(static_cast<size_t>(indent) * static_cast<size_t>(depth), ' ');
  };
  out += open;
  bool first = true;
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (!first) out += indent < 0 ? ", " : ",";
    first = false;
    if (indent >= 0) newline(level + 1);
    if (v.is_object()) {
      out += ojson(it.key()).dump(-1, ' ', false, ojson::error_handler_t::replace);
      out += ": ";
    }
    dump_to(out, *it, indent, level + 1);
  }
  if (indent >= 0) newline(level);
  out += close;
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

size_t skip_space(std::string_view s, size_t i) {
  while (i < s.size() && is_space(s[i])) ++i;
  return i;
}

// The JSON object or array at text[start], parsed; discarded (is_discarded) when it is not one.
ojson json_at(std::string_view text, size_t start, size_t& end) {
  end = json_value_end(text, start);
  if (end == std::string_view::npos) return ojson(ojson::value_t::discarded);
  return ojson::parse(text.substr(start, end - start), nullptr, /*allow_exceptions=*/false);
}

// {"name": "...", "arguments": {...}} (or "parameters") as a call; false when it is not one.
// Arguments given as a JSON string holding an object are taken too (some models quote them).
bool to_call(const ojson& j, ToolCall& call) {
  if (!j.is_object()) return false;
  const auto name = j.find("name");
  if (name == j.end() || !name->is_string() || name->get_ref<const std::string&>().empty()) return false;
  auto args = j.find("arguments");
  if (args == j.end()) args = j.find("parameters");
  ojson a = args == j.end() || args->is_null() ? ojson::object() : *args;
  if (a.is_string()) {
    const std::string& s = a.get_ref<const std::string&>();
    if (json_value_end(s, skip_space(s, 0)) == std::string_view::npos) return false;  // the depth bound too
    a = ojson::parse(s, nullptr, /*allow_exceptions=*/false);
  }
  if (!a.is_object()) return false;
  call.name = name->get<std::string>();
  call.arguments = a.dump(-1, ' ', false, ojson::error_handler_t::replace);
  return true;
}

// One call object, or an array of them.
bool calls_from(const ojson& j, std::vector<ToolCall>& calls) {
  if (j.is_object()) {
    ToolCall call;
    if (!to_call(j, call)) return false;
    calls.push_back(std::move(call));
    return true;
  }
  if (!j.is_array() || j.empty()) return false;
  for (const ojson& item : j) {
    ToolCall call;
    if (!to_call(item, call)) return false;
    calls.push_back(std::move(call));
  }
  return true;
}

constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr std::string_view kMistralMarker = "[TOOL_CALLS]";

// Hermes: each <tool_call> followed by one JSON object; the closing tag may be missing at the end
// (the model stopped right after the object).
bool parse_hermes(std::string_view text, size_t pos, std::vector<ToolCall>& calls) {
  while (pos != std::string_view::npos) {
    const size_t start = skip_space(text, pos + kHermesOpen.size());
    if (start >= text.size() || text[start] != '{') return false;
    size_t end = 0;
    ToolCall call;
    if (!to_call(json_at(text, start, end), call)) return false;
    calls.push_back(std::move(call));
    pos = text.find(kHermesOpen, end);
  }
  return !calls.empty();
}

// Llama 3.1: one or more objects separated by ';' (vLLM's llama3_json); text after the last is
// left out.
bool parse_llama3(std::string_view text, size_t start, std::vector<ToolCall>& calls) {
  size_t i = skip_space(text, start);
  while (i < text.size() && text[i] == '{') {
    size_t end = 0;
    ToolCall call;
    if (!to_call(json_at(text, i, end), call)) return false;
    calls.push_back(std::move(call));
    i = skip_space(text, end);
    if (i < text.size() && text[i] == ';') i = skip_space(text, i + 1);
  }
  return !calls.empty();
}

// Mistral: [TOOL_CALLS] then a JSON array of calls (or one object).
bool parse_mistral(std::string_view text, size_t pos, std::vector<ToolCall>& calls) {
  const size_t start = skip_space(text, pos + kMistralMarker.size());
  if (start >= text.size() || (text[start] != '[' && text[start] != '{')) return false;
  size_t end = 0;
  return calls_from(json_at(text, start, end), calls);
}

std::string_view marker(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kHermes: return kHermesOpen;
    case ToolCallFormat::kLlama3Json: return kPythonTag;
    case ToolCallFormat::kMistral: return kMistralMarker;
  }
  return kHermesOpen;
}

}  // namespace

std::string tojson(const ojson& value, int indent) {
  std::string out;
  dump_to(out, value, indent, 0);
  return out;
}

size_t json_value_end(std::string_view text, size_t start) {
  if (start >= text.size() || (text[start] != '{' && text[start] != '[')) return std::string_view::npos;
  std::string brackets;  // the closers expected, innermost last
  bool in_string = false;
  for (size_t i = start; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (static_cast<int>(brackets.size()) >= kMaxJsonDepth) return std::string_view::npos;
      brackets += c == '{' ? '}' : ']';
    } else if (c == '}' || c == ']') {
      if (brackets.empty() || brackets.back() != c) return std::string_view::npos;
      brackets.pop_back();
      if (brackets.empty()) return i + 1;
    }
  }
  return std::string_view::npos;
}

ojson parse_ordered_json(std::string_view text, std::string_view what) {
  try {
    (void)parse_json(text);  // the depth bound and a one-line message
  } catch (const JsonSyntaxError& e) {
    fail("{} is not JSON: {}", what, e.what());
  }
  return ojson::parse(text);
}

ParsedToolCalls parse_tool_calls(ToolCallFormat format, std::string_view text) {
  ParsedToolCalls out;
  size_t pos = std::string_view::npos;
  bool ok = false;
  switch (format) {
    case ToolCallFormat::kHermes:
      pos = text.find(kHermesOpen);
      ok = pos != std::string_view::npos && parse_hermes(text, pos, out.calls);
      break;
    case ToolCallFormat::kLlama3Json: {
      // The call is the whole output: after <|python_tag|> (wherever it is), or alone.
      pos = text.find(kPythonTag);
      size_t start = pos == std::string_view::npos ? std::string_view::npos : pos + kPythonTag.size();
      if (pos == std::string_view::npos) {
        start = skip_space(text, 0);
        if (start < text.size() && text[start] == '{') pos = 0;
      }
      ok = pos != std::string_view::npos && parse_llama3(text, start, out.calls);
      break;
    }
    case ToolCallFormat::kMistral:
      pos = text.find(kMistralMarker);
      ok = pos != std::string_view::npos && parse_mistral(text, pos, out.calls);
      break;
  }
  if (!ok) {
    out.calls.clear();
    out.content = std::string(text);
    return out;
  }
  out.content = std::string(text.substr(0, pos));
  return out;
}

std::vector<ToolCall> tool_calls_from_json(std::string_view text) {
  std::vector<ToolCall> calls;
  const size_t start = skip_space(text, 0);
  size_t end = 0;
  if (!calls_from(json_at(text, start, end), calls) || end == std::string_view::npos ||
      skip_space(text, end) != text.size())
    calls.clear();
  return calls;
}

size_t find_tool_call_start(ToolCallFormat format, std::string_view text, bool output_start, size_t& safe) {
  const std::string_view m = marker(format);
  if (format == ToolCallFormat::kLlama3Json && output_start) {
    // A call is the output itself: whitespace at the start is held until the first other byte
    // says whether a '{' opens the call.
    const size_t first = skip_space(text, 0);
    if (first == text.size()) {
      safe = 0;
      return std::string_view::npos;
    }
    if (text[first] == '{') {
      safe = 0;
      return 0;
    }
  }
  if (const size_t pos = text.find(m); pos != std::string_view::npos) {
    safe = pos;
    return pos;
  }
  // The longest end of text that begins the marker may become it.
  safe = text.size();
  for (size_t k = std::min(m.size() - 1, text.size()); k > 0; --k)
    if (text.substr(text.size() - k) == m.substr(0, k)) {
      safe = text.size() - k;
      break;
    }
  return std::string_view::npos;
}

std::string_view tool_call_format_name(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kHermes: return "hermes";
    case ToolCallFormat::kLlama3Json: return "llama3_json";
    case ToolCallFormat::kMistral: return "mistral";
  }
  return "hermes";
}

}  // namespace fdpp
