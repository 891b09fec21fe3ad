#include "io/json_file.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>

#include "core/read_file.h"
#include "fdpp/error.h"

namespace fdpp {

using nlohmann::json;

std::string json_show(const json& v) {
  std::string s = v.dump(-1, ' ', true, json::error_handler_t::replace);
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

json parse_json(std::string_view text) {
  // The parser's depth counts the containers around an event: 64 nested arrays reach 63.
  const json::parser_callback_t bound_depth = [](int depth, json::parse_event_t, json&) {
    if (depth >= kMaxJsonDepth) throw JsonSyntaxError(fmt::format("nests deeper than {} levels", kMaxJsonDepth));
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), bound_depth);
  } catch (const json::exception& e) {
    std::string what = e.what();
    if (const size_t p = what.find("] "); what.rfind("[json.exception.", 0) == 0 && p != std::string::npos)
      what = what.substr(p + 2);
    std::replace(what.begin(), what.end(), '\n', ' ');
    // The parser quotes the token it stopped in ("last read: '...'"), which can be the whole rest of
    // the text (an unterminated string): keep the message short, cut at a character boundary.
    constexpr size_t kMaxMessageBytes = 240;
    if (what.size() > kMaxMessageBytes) {
      size_t n = kMaxMessageBytes;
      while (n > 0 && (static_cast<unsigned char>(what[n]) & 0xC0) == 0x80) --n;
      what = what.substr(0, n) + "...";
    }
    throw JsonSyntaxError(what);
  }
}

json read_json_file(const std::string& path) {
  const std::string text = read_file(path, kMaxJsonFileBytes, "a JSON file");
  try {
    return parse_json(text);
  } catch (const JsonSyntaxError& e) {
    fail("{}: not valid JSON ({})", path, e.what());
  }
}

bool JsonFields::has(const char* key) const { return j_.contains(key) && !j_.at(key).is_null(); }

const json& JsonFields::at(const char* key) const {
  check(has(key), "{}: {}{} is missing", origin_, prefix_, key);
  return j_.at(key);
}

int64_t JsonFields::integer(const char* key) const {
  const json& v = at(key);
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e15) return static_cast<int64_t>(d);
  }
  fail("{}: {}{} = {} is not an integer", origin_, prefix_, key, json_show(v));
}

int JsonFields::positive(const char* key) const {
  const int64_t v = integer(key);
  check(v > 0, "{}: {}{} = {} must be positive", origin_, prefix_, key, v);
  check(v <= (int64_t{1} << 30), "{}: {}{} = {} is out of range", origin_, prefix_, key, v);
  return static_cast<int>(v);
}

double JsonFields::number(const char* key) const {
  const json& v = at(key);
  check(v.is_number(), "{}: {}{} = {} is not a number", origin_, prefix_, key, json_show(v));
  const double d = v.get<double>();
  check(std::isfinite(d), "{}: {}{} = {} is not finite", origin_, prefix_, key, json_show(v));
  return d;
}

bool JsonFields::boolean_or(const char* key, bool fallback) const {
  if (!has(key)) return fallback;
  const json& v = j_.at(key);
  check(v.is_boolean(), "{}: {}{} = {} is not true or false", origin_, prefix_, key, json_show(v));
  return v.get<bool>();
}

std::string JsonFields::string_or(const char* key, const std::string& fallback) const {
  if (!has(key)) return fallback;
  const json& v = j_.at(key);
  check(v.is_string(), "{}: {}{} = {} is not a string", origin_, prefix_, key, json_show(v));
  return v.get<std::string>();
}

}  // namespace fdpp
