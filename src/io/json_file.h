// JSON files as configs hold them (HF config.json, generation_config.json, tokenizer files):
// reading one with a size bound, and typed access to an object's fields whose every error is one
// line naming the file and the field ("DIR/config.json: num_attention_heads is missing", "... = 0
// must be positive", "... = \"many\" is not an integer"). What the fields mean is the model's
// business (model/hf_config.h, model/arch/).
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>
#include <string_view>

#include "fdpp/error.h"

namespace fdpp {

// The deepest nesting fdpp takes in any JSON it reads: files and HTTP requests. Real inputs nest
// a few levels (a chat request's content parts are 4 deep); nlohmann::json copies, compares and
// prints values recursively, so a parsed document of millions of '[' (8 MB is enough) overflowed
// the stack when an error message printed it.
inline constexpr int kMaxJsonDepth = 64;
// The largest JSON file fdpp reads (a tokenizer.json is ~10 MB).
inline constexpr size_t kMaxJsonFileBytes = size_t{64} << 20;

// Text that is not JSON, or nests deeper than kMaxJsonDepth. what() is one line: where the parser
// stopped and why, without nlohmann's "[json.exception.parse_error.101] " prefix.
class JsonSyntaxError : public Error {
 public:
  using Error::Error;
};

// Parses text; throws JsonSyntaxError.
nlohmann::json parse_json(std::string_view text);

// Reads a JSON file; throws fdpp::Error "PATH: not valid JSON (...)" / "PATH: cannot open".
nlohmann::json read_json_file(const std::string& path);

// A value as it appears in a message: short, one line.
std::string json_show(const nlohmann::json& v);

// Typed access to one JSON object; origin names the file in messages, prefix the enclosing object
// ("rope_scaling.").
class JsonFields {
 public:
  JsonFields(const nlohmann::json& j, std::string origin, std::string prefix = "")
      : j_(j), origin_(std::move(origin)), prefix_(std::move(prefix)) {}

  bool has(const char* key) const;  // present and not null
  const nlohmann::json& at(const char* key) const;

  int64_t integer(const char* key) const;
  // A size: required, in [1, 2^30].
  int positive(const char* key) const;
  int positive_or(const char* key, int fallback) const { return has(key) ? positive(key) : fallback; }
  double number(const char* key) const;
  double number_or(const char* key, double fallback) const { return has(key) ? number(key) : fallback; }
  bool boolean_or(const char* key, bool fallback) const;
  std::string string_or(const char* key, const std::string& fallback) const;

  const std::string& origin() const { return origin_; }

 private:
  const nlohmann::json& j_;
  std::string origin_;
  std::string prefix_;
};

}  // namespace fdpp
