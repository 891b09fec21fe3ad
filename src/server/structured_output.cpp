#include "server/structured_output.h"

#include <algorithm>

#include "fdpp/error.h"
#include "server/api.h"

namespace fdpp::server {

namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;


// Compiles one form; the grammar engine's message (naming the keyword) becomes the 400's.
template <class F>
std::shared_ptr<const grammar::Grammar> compiled(const std::string& param, F&& f) {
  try {
    return f();
  } catch (const fdpp::Error& e) {
    throw bad_request(param, fmt::format("{}: {}", param, e.what()), "unsupported_schema");
  }
}

std::shared_ptr<const grammar::Grammar> json_schema(const std::string& param, const ojson& schema) {
  if (schema.is_string()) {  // vLLM accepts the schema as a JSON string too
    ojson parsed;
    try {
      parsed = ojson::parse(schema.get<std::string>());
    } catch (const nlohmann::json::exception&) {
      throw bad_request(param, fmt::format("{} is a string that is not a JSON schema", param));
    }
    return json_schema(param, parsed);
  }
  if (!schema.is_object() && !schema.is_boolean()) throw bad_request(param, fmt::format("{} must be a JSON schema object", param));
  return compiled(param, [&] { return grammar::compile_json_schema(schema.dump()); });
}

std::shared_ptr<const grammar::Grammar> choice(const std::string& param, const ojson& v) {
  if (!v.is_array() || v.empty()) throw bad_request(param, fmt::format("{} must be a non-empty array of strings", param));
  std::vector<std::string> choices;
  for (const auto& c : v) {
    if (!c.is_string()) throw bad_request(param, fmt::format("{} must be a non-empty array of strings", param));
    choices.push_back(c.get<std::string>());
  }
  return compiled(param, [&] { return grammar::compile_choice(choices); });
}

std::shared_ptr<const grammar::Grammar> regex(const std::string& param, const ojson& v) {
  if (!v.is_string()) throw bad_request(param, fmt::format("{} must be a string (a regular expression)", param));
  return compiled(param, [&] { return grammar::compile_regex(v.get<std::string>()); });
}

std::shared_ptr<const grammar::Grammar> response_format(const ojson& rf) {
  if (!rf.is_object()) throw bad_request("response_format", "'response_format' must be an object with a \"type\"");
  const auto t = rf.find("type");
  if (t == rf.end() || !t->is_string())
    throw bad_request("response_format.type", "'response_format' needs a \"type\": \"text\", \"json_object\" or \"json_schema\"");
  const std::string type = t->get<std::string>();
  if (type == "text") return nullptr;
  if (type == "json_object") return grammar::compile_json_object();
  if (type == "json_schema") {
    const ojson* js = present_field(rf, "json_schema");
    if (!js || !js->is_object())
      throw bad_request("response_format.json_schema", "response_format of type \"json_schema\" needs a \"json_schema\" object");
    const ojson* schema = present_field(*js, "schema");
    // OpenAI allows a schema-less json_schema (any JSON); strict and name change nothing here.
    if (!schema) return grammar::compile_json_value();
    return json_schema("response_format.json_schema.schema", *schema);
  }
  throw bad_request("response_format.type",
            fmt::format("response_format type \"{}\" is not supported (\"text\", \"json_object\" or \"json_schema\")", type));
}

}  // namespace

std::shared_ptr<const grammar::Grammar> structured_output(const json& parsed, std::string_view raw_body) {
  // Most requests ask for none: no second parse of their body.
  if (std::none_of(std::begin(kStructuredOutputFields), std::end(kStructuredOutputFields),
                   [&](const char* f) { return parsed.contains(f); }))
    return nullptr;
  ojson body;
  if (!raw_body.empty()) {
    try {
      body = ojson::parse(raw_body);
    } catch (const nlohmann::json::exception&) {
      body = ojson::parse(parsed.dump());
    }
  } else {
    body = ojson::parse(parsed.dump());
  }
  std::vector<std::pair<std::string, std::shared_ptr<const grammar::Grammar>>> asked;
  if (const ojson* rf = present_field(body, "response_format")) {
    // One param for the whole object, as OpenAI names it; the message names the keyword's path.
    std::shared_ptr<const grammar::Grammar> g;
    try {
      g = response_format(*rf);
    } catch (const ApiError& e) {
      throw ApiError(e.status, e.what(), "response_format", e.type, e.code);
    }
    if (g) asked.emplace_back("response_format", std::move(g));
  }
  if (const ojson* v = present_field(body, "guided_json")) asked.emplace_back("guided_json", json_schema("guided_json", *v));
  if (const ojson* v = present_field(body, "guided_regex")) asked.emplace_back("guided_regex", regex("guided_regex", *v));
  if (const ojson* v = present_field(body, "guided_choice")) asked.emplace_back("guided_choice", choice("guided_choice", *v));
  if (present_field(body, "guided_grammar"))
    throw bad_request("guided_grammar", "guided_grammar (an EBNF/GBNF grammar) is not supported; use guided_json, guided_regex "
                                "or guided_choice", "unsupported_parameter");
  if (const ojson* w = present_field(body, "guided_whitespace_pattern"))
    throw bad_request("guided_whitespace_pattern", fmt::format("guided_whitespace_pattern {} is not supported (JSON whitespace is "
                                                       "bounded to 20 bytes per gap)", w->dump()), "unsupported_parameter");
  if (const ojson* b = present_field(body, "guided_decoding_backend"); b && !b->is_string())
    throw bad_request("guided_decoding_backend", "'guided_decoding_backend' must be a string");  // one backend here: ignored
  if (const ojson* so = present_field(body, "structured_outputs")) {
    if (!so->is_object()) throw bad_request("structured_outputs", "'structured_outputs' must be an object");
    for (const auto& [k, v] : so->items()) {
      if (v.is_null()) continue;
      const std::string param = "structured_outputs." + k;
      if (k == "json") asked.emplace_back(param, json_schema(param, v));
      else if (k == "regex") asked.emplace_back(param, regex(param, v));
      else if (k == "choice") asked.emplace_back(param, choice(param, v));
      else if (k == "json_object") {
        if (!v.is_boolean()) throw bad_request(param, param + " must be a boolean");
        if (v.get<bool>()) asked.emplace_back(param, grammar::compile_json_object());
      } else if (k == "backend" || k == "disable_fallback" || k == "disable_additional_properties" ||
                 k == "disable_any_whitespace") {
        // Options of vLLM's backends; this server has one engine, which behaves as "strict".
        continue;
      } else {
        throw bad_request(param, fmt::format("{} is not supported (json, regex, choice or json_object)", param),
                  "unsupported_parameter");
      }
    }
  }
  if (asked.size() > 1)
    throw bad_request(asked[1].first, fmt::format("give one structured output format, not both {} and {}", asked[0].first,
                                          asked[1].first));
  return asked.empty() ? nullptr : asked[0].second;
}

}  // namespace fdpp::server
