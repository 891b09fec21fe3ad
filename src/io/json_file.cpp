#include "io/json_file.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "fdpp/error.h"

namespace fdpp {

using nlohmann::json;

std::string json_show(const json& v) {
  std::string s = v.dump(-1, ' ', true, json::error_handler_t::replace);
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

json read_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  check(in.good(), "{}: cannot open", path);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  check(text.size() <= (size_t{64} << 20), "{}: {} bytes is too large for a JSON config", path, text.size());
  try {
    return json::parse(text);
  } catch (const json::parse_error& e) {
    std::string what = e.what();
    std::replace(what.begin(), what.end(), '\n', ' ');
    fail("{}: not valid JSON ({})", path, what);
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
