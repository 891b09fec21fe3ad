#include "server/tools.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "fdpp/error.h"
#include "io/json_file.h"
#include "server/api.h"
#include "tokenizer/tool_calls.h"

namespace fdpp::server {

namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;


// OpenAI's function names (letters, digits, '_' and '-', at most 64), and '.', which MCP tool
// names use. The name is printed inside JSON strings by the templates, so nothing else is taken.
bool valid_name(const std::string& name) {
  return !name.empty() && name.size() <= 64 && std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
           c == '.';
  });
}

struct Tool {
  std::string name;
  const ojson* function = nullptr;
  bool strict = false;
};

std::vector<Tool> checked_tools(const ojson& tools) {
  if (!tools.is_array()) throw bad_request("tools", "'tools' must be a list of {\"type\": \"function\", \"function\": {...}}");
  if (tools.size() > kMaxTools)
    throw bad_request("tools", fmt::format("'tools' has {} tools; the limit is {}", tools.size(), kMaxTools));
  std::vector<Tool> out;
  std::set<std::string> names;
  for (size_t i = 0; i < tools.size(); ++i) {
    const ojson& t = tools[i];
    const std::string at = fmt::format("tools[{}]", i);
    if (!t.is_object()) throw bad_request(at, at + " must be an object {\"type\": \"function\", \"function\": {...}}");
    const ojson* type = present_field(t, "type");
    if (!type || *type != "function")
      throw bad_request(at + ".type", fmt::format("{}.type must be \"function\" (the only tool type)", at));
    const ojson* f = present_field(t, "function");
    if (!f || !f->is_object()) throw bad_request(at + ".function", at + ".function must be an object with a \"name\"");
    const ojson* name = present_field(*f, "name");
    if (!name || !name->is_string()) throw bad_request(at + ".function.name", at + ".function.name is required (a string)");
    Tool tool{name->get<std::string>(), f, false};
    if (!valid_name(tool.name))
      throw bad_request(at + ".function.name",
                fmt::format("{}.function.name {} must be 1 to 64 letters, digits, '_', '-' or '.'", at,
                            json_show(json(tool.name))));
    if (!names.insert(tool.name).second)
      throw bad_request(at + ".function.name", fmt::format("{}: the function name '{}' is given twice", at, tool.name));
    if (const ojson* d = present_field(*f, "description"); d && !d->is_string())
      throw bad_request(at + ".function.description", at + ".function.description must be a string");
    if (const ojson* p = present_field(*f, "parameters"); p && !p->is_object())
      throw bad_request(at + ".function.parameters", at + ".function.parameters must be a JSON schema object");
    if (const ojson* s = present_field(*f, "strict")) {
      if (!s->is_boolean()) throw bad_request(at + ".function.strict", at + ".function.strict must be a boolean");
      tool.strict = s->get<bool>();
    }
    out.push_back(std::move(tool));
  }
  return out;
}

// A tool's parameters as the grammar holds them: the schema, or null for any object (none given,
// or one the engine cannot honour in a non-strict tool).
ojson enforced_parameters(const Tool& tool, size_t i, std::vector<std::string>& unenforced) {
  const ojson* p = present_field(*tool.function, "parameters");
  if (!p) return nullptr;
  const std::string param = fmt::format("tools[{}].function.parameters", i);
  try {
    (void)grammar::compile_json_schema(p->dump());
  } catch (const fdpp::Error& e) {
    if (tool.strict) throw bad_request(param, fmt::format("{}: {}", param, e.what()), "unsupported_schema");
    unenforced.push_back(param);
    return nullptr;
  }
  return *p;
}

// References inside a schema moved under `base` ("#/$defs/tool0"), so that they still point into
// it; literal values (const, enum, default, examples) are left alone.
void rebase_refs(ojson& schema, const std::string& base) {
  if (schema.is_array()) {
    for (ojson& v : schema) rebase_refs(v, base);
    return;
  }
  if (!schema.is_object()) return;
  for (auto it = schema.begin(); it != schema.end(); ++it) {
    const std::string& k = it.key();
    if (k == "$ref" && it->is_string()) {
      const std::string ref = it->get<std::string>();
      if (!ref.empty() && ref[0] == '#') *it = base + ref.substr(1);
    } else if (k != "const" && k != "enum" && k != "default" && k != "examples") {
      rebase_refs(*it, base);
    }
  }
}

std::shared_ptr<const grammar::Grammar> compile(const ojson& schema, const std::string& param) {
  try {
    return grammar::compile_json_schema(schema.dump());
  } catch (const fdpp::Error& e) {
    throw bad_request(param, fmt::format("{}: {}", param, e.what()), "unsupported_schema");
  }
}

// "required": {"name": <a tool>, "arguments": <its parameters>}, or a non-empty array of those.
std::shared_ptr<const grammar::Grammar> required_grammar(const std::vector<Tool>& tools, bool parallel,
                                                         std::vector<std::string>& unenforced) {
  // Each tool's parameters go under the root's $defs (JSON pointers through objects only), where
  // their own references are moved too.
  ojson alternatives = ojson::array();
  ojson defs = ojson::object();
  for (size_t i = 0; i < tools.size(); ++i) {
    ojson args = enforced_parameters(tools[i], i, unenforced);
    if (args.is_null()) {
      args = ojson{{"type", "object"}};
    } else {
      const std::string name = fmt::format("tool{}", i);
      rebase_refs(args, "#/$defs/" + name);
      defs[name] = std::move(args);
      args = ojson{{"$ref", "#/$defs/" + name}};
    }
    ojson alt = ojson::object();
    alt["type"] = "object";
    alt["properties"] = ojson::object();
    alt["properties"]["name"] = ojson{{"const", tools[i].name}};
    alt["properties"]["arguments"] = std::move(args);
    alt["required"] = ojson::array({"name", "arguments"});
    alternatives.push_back(std::move(alt));
  }
  ojson one = ojson::object();
  one["anyOf"] = std::move(alternatives);
  ojson root = one;
  if (parallel) {
    root = ojson::object();
    root["type"] = "array";
    root["minItems"] = 1;
    root["items"] = std::move(one);
  }
  if (!defs.empty()) root["$defs"] = std::move(defs);
  return compile(root, "tools");
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

void limit_and_name(const ToolSetup& setup, std::vector<ToolCall>& calls, uint64_t id_seed, size_t first = 0) {
  if (!setup.parallel && calls.size() > 1) calls.resize(1);
  for (size_t k = 0; k < calls.size(); ++k) calls[k].id = tool_call_id(setup.format, id_seed, first + k);
}

bool all_space(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; });
}

}  // namespace

ToolRequest tool_request(const json& body, std::string_view raw_body, ToolCallFormat format) {
  ToolRequest r;
  r.setup.format = format;
  if (const json* p = present_field(body, "parallel_tool_calls")) {
    if (!p->is_boolean()) throw bad_request("parallel_tool_calls", "'parallel_tool_calls' must be a boolean");
    r.setup.parallel = p->get<bool>();
  }
  const json* tools_field = present_field(body, "tools");
  const json* choice = present_field(body, "tool_choice");
  if (!tools_field && !choice) return r;
  // The tools in the client's key order, which the templates print.
  ojson ordered;
  if (tools_field) {
    ordered = ojson::parse(tools_field->dump());
    if (!raw_body.empty()) {
      const ojson whole = ojson::parse(raw_body, nullptr, /*allow_exceptions=*/false);
      if (whole.is_object() && whole.contains("tools")) ordered = whole["tools"];
    }
  }
  const std::vector<Tool> tools = tools_field ? checked_tools(ordered) : std::vector<Tool>{};

  ToolChoice mode = tools.empty() ? ToolChoice::kNone : ToolChoice::kAuto;
  if (choice) {
    if (choice->is_string()) {
      const std::string c = choice->get<std::string>();
      if (c == "none") mode = ToolChoice::kNone;
      else if (c == "required") mode = ToolChoice::kRequired;
      else if (c != "auto")
        throw bad_request("tool_choice", fmt::format("tool_choice {} is not one of \"none\", \"auto\", \"required\" or "
                                             "{{\"type\": \"function\", \"function\": {{\"name\": ...}}}}",
                                             json_show(*choice)));
    } else if (choice->is_object()) {
      const json* type = present_field(*choice, "type");
      const json* f = present_field(*choice, "function");
      const json* name = f && f->is_object() ? present_field(*f, "name") : nullptr;
      if (!type || *type != "function" || !name || !name->is_string())
        throw bad_request("tool_choice", "tool_choice must be a string or {\"type\": \"function\", \"function\": {\"name\": ...}}");
      mode = ToolChoice::kNamed;
      r.setup.forced = name->get<std::string>();
    } else {
      throw bad_request("tool_choice", "tool_choice must be a string or {\"type\": \"function\", \"function\": {\"name\": ...}}");
    }
  }
  if ((mode == ToolChoice::kRequired || mode == ToolChoice::kNamed) && tools.empty())
    throw bad_request("tool_choice", fmt::format("tool_choice {} needs 'tools' that define the functions", json_show(*choice)));
  r.setup.choice = mode;
  if (mode == ToolChoice::kNone) return r;
  for (const ojson& t : ordered) r.tools.push_back(t.dump(-1, ' ', false, ojson::error_handler_t::replace));
  if (mode == ToolChoice::kNamed) {
    const auto it = std::find_if(tools.begin(), tools.end(), [&](const Tool& t) { return t.name == r.setup.forced; });
    if (it == tools.end())
      throw bad_request("tool_choice", fmt::format("tool_choice names the function '{}', which 'tools' does not define",
                                           r.setup.forced));
    const size_t i = static_cast<size_t>(it - tools.begin());
    const ojson args = enforced_parameters(*it, i, r.unenforced);
    r.grammar = args.is_null() ? grammar::compile_json_object()
                               : compile(args, fmt::format("tools[{}].function.parameters", i));
  } else if (mode == ToolChoice::kRequired) {
    r.grammar = required_grammar(tools, r.setup.parallel, r.unenforced);
  }
  return r;
}

std::string tool_call_id(ToolCallFormat format, uint64_t seed, size_t k) {
  static constexpr char kAlnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  const size_t n = format == ToolCallFormat::kMistral ? 9 : 24;
  std::string out = format == ToolCallFormat::kMistral ? "" : "call_";
  uint64_t x = splitmix64(seed ^ splitmix64(k + 1));
  for (size_t i = 0; i < n; ++i) {
    if (i % 8 == 0) x = splitmix64(x);
    out += kAlnum[(x >> (8 * (i % 8))) % 62];
  }
  return out;
}

ToolReply tool_reply(const ToolSetup& setup, std::string_view text, uint64_t id_seed) {
  ToolReply out;
  switch (setup.choice) {
    case ToolChoice::kNone:
      out.content = std::string(text);
      return out;
    case ToolChoice::kNamed:
      out.calls.push_back({"", setup.forced, std::string(text)});
      break;
    case ToolChoice::kRequired:
      out.calls = tool_calls_from_json(text);
      if (out.calls.empty()) out.content = std::string(text);  // cut short by max_tokens
      break;
    case ToolChoice::kAuto: {
      ParsedToolCalls p = parse_tool_calls(setup.format, text);
      out.calls = std::move(p.calls);
      if (out.calls.empty() || !all_space(p.content)) out.content = std::move(p.content);
      break;
    }
  }
  limit_and_name(setup, out.calls, id_seed);
  return out;
}

json tool_calls_json(std::span<const ToolCall> calls, bool stream, size_t first) {
  json out = json::array();
  for (size_t k = 0; k < calls.size(); ++k) {
    json c = json::object();
    if (stream) c["index"] = first + k;
    c["id"] = calls[k].id;
    c["type"] = "function";
    c["function"] = {{"name", calls[k].name}, {"arguments", calls[k].arguments}};
    out.push_back(std::move(c));
  }
  return out;
}

ToolStream::Delta ToolStream::push(std::string_view piece) {
  Delta d;
  text_ += piece;
  switch (setup_.choice) {
    case ToolChoice::kNone:
      d.content = std::string(piece);
      sent_ = text_.size();
      break;
    case ToolChoice::kNamed:
      // The whole output is the arguments: the first delta names the call, the rest extend it.
      if (!called_) {
        std::vector<ToolCall> call{{tool_call_id(setup_.format, id_seed_, 0), setup_.forced, std::string(piece)}};
        d.tool_calls = tool_calls_json(call, /*stream=*/true);
        called_ = true;
      } else if (!piece.empty()) {
        d.tool_calls = json::array({{{"index", 0}, {"function", {{"arguments", std::string(piece)}}}}});
      }
      sent_ = text_.size();
      break;
    case ToolChoice::kRequired:
      break;  // parsed once whole
    case ToolChoice::kAuto: {
      if (start_ != std::string::npos) break;
      const std::string_view rest = std::string_view(text_).substr(sent_);
      size_t safe = 0;
      const size_t pos = find_tool_call_start(setup_.format, rest, sent_ == 0, safe);
      if (pos != std::string_view::npos) {
        d.content = std::string(rest.substr(0, pos));
        sent_ += pos;
        start_ = sent_;
      } else {
        d.content = std::string(rest.substr(0, safe));
        sent_ += safe;
      }
      break;
    }
  }
  return d;
}

ToolStream::Delta ToolStream::finish() {
  Delta d;
  std::vector<ToolCall> calls;
  switch (setup_.choice) {
    case ToolChoice::kNone:
      return d;
    case ToolChoice::kNamed:
      if (!called_) d = push("");
      return d;
    case ToolChoice::kRequired:
      calls = tool_calls_from_json(text_);
      break;
    case ToolChoice::kAuto:
      if (start_ != std::string::npos) calls = parse_tool_calls(setup_.format, std::string_view(text_).substr(start_)).calls;
      break;
  }
  if (calls.empty()) {
    d.content = text_.substr(sent_);  // no call after all: the held text is content
    sent_ = text_.size();
    return d;
  }
  limit_and_name(setup_, calls, id_seed_);
  d.tool_calls = tool_calls_json(calls, /*stream=*/true);
  called_ = true;
  sent_ = text_.size();
  return d;
}

}  // namespace fdpp::server
