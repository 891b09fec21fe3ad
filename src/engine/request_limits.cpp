#include "engine/request_limits.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <array>
#include <cmath>

#include "engine/prompt_file.h"  // utf8_problem
#include "engine/scheduler.h"    // kMaxStopStrings, kMaxStopBytes, kMaxStopTokenIds
#include "fdpp/error.h"
#include "io/json_file.h"  // json_show

namespace fdpp {

namespace {

constexpr int64_t k2p24 = int64_t{1} << 24;
constexpr int64_t k2p30 = int64_t{1} << 30;
constexpr unsigned kCli = Entrance::cli_flag, kFile = Entrance::prompt_file, kServer = Entrance::server,
                   kPython = Entrance::python, kSampler = Entrance::sampler;
constexpr unsigned kRequest = kFile | kServer | kPython;

RequestParam integer(std::string_view name, std::string_view alias, int64_t lo, int64_t hi, std::string_view note,
                     unsigned entrances) {
  return {name, alias, ParamType::Integer, lo, hi, 0, 0, false, false, note, entrances};
}
RequestParam real(std::string_view name, std::string_view alias, double lo, bool lo_open, double hi,
                  std::string_view note, unsigned entrances) {
  return {name, alias, ParamType::Real, 0, 0, lo, hi, lo_open, false, note, entrances};
}
RequestParam list(std::string_view name, size_t most, unsigned entrances) {
  return {name, "", ParamType::List, 0, static_cast<int64_t>(most), 0, 0, false, false, "", entrances};
}

const std::array<RequestParam, 21>& table() {
  static const std::array<RequestParam, 21> t = {
      integer("max_tokens", "max_completion_tokens", 1, k2p24, "", kRequest),
      integer("n_predict", "", 0, k2p24, "0 = the prompt only", kCli),
      real("temperature", "", 0, false, 100, "0 = greedy", kRequest | kCli | kSampler),
      integer("top_k", "", -1, k2p24, "-1 or 0 = off", kRequest | kCli | kSampler),
      real("top_p", "", 0, true, 1, "1 = off", kRequest | kCli | kSampler),
      real("min_p", "", 0, false, 1, "0 = off", kRequest | kCli | kSampler),
      real("repeat_penalty", "repetition_penalty", 0.01, false, 100, "1 = off", kRequest | kCli | kSampler),
      integer("repeat_last_n", "", -1, k2p30, "-1 = all", kRequest | kCli | kSampler),
      integer("seed", "", -1, INT64_MAX, "-1 = random", kRequest),
      real("presence_penalty", "", -2, false, 2, "0 = off", kServer | kPython | kCli | kSampler),
      real("frequency_penalty", "", -2, false, 2, "0 = off", kServer | kPython | kCli | kSampler),
      integer("n", "", 1, kMaxChoices, "choices per prompt", kServer | kPython),
      integer("best_of", "", 1, kMaxChoices, "must equal n", kServer | kPython),
      integer("min_tokens", "", 0, k2p24, "0 = off", kServer | kPython | kSampler),
      integer("logprobs", "", 0, kMaxLogprobs, "", kServer | kPython | kSampler),
      integer("top_logprobs", "", 0, kMaxLogprobs, "", kServer),
      integer("prompt_logprobs", "", 0, kMaxLogprobs, "", kServer | kPython),
      list("logit_bias", kMaxLogitBias, kServer | kPython),
      // A logit_bias entry's bias, named "logit_bias[ID]" in the messages (no entrance of its own).
      real("logit_bias_value", "", -100, false, 100, "", 0),
      list("stop", kMaxStopStrings, kRequest | kCli),
      list("stop_token_ids", kMaxStopTokenIds, kServer | kPython),
  };
  return t;
}

std::string with_note(std::string text, std::string_view note) {
  if (!note.empty()) text += fmt::format(" ({})", note);
  return text;
}

}  // namespace

std::span<const RequestParam> request_params() { return table(); }

const RequestParam* find_request_param(std::string_view name) {
  for (const RequestParam& p : table())
    if (p.name == name || (!p.alias.empty() && p.alias == name)) return &p;
  return nullptr;
}

const RequestParam& request_param(std::string_view name) {
  const RequestParam* p = find_request_param(name);
  if (!p) fail("request parameter \"{}\" is not in the table of request limits", name);
  return *p;
}

std::string range_text(const RequestParam& p) {
  switch (p.type) {
    case ParamType::Integer:
      if (p.int_lo == p.int_hi) return with_note(show_value(p.int_lo), p.note);
      return with_note(fmt::format("[{}, {}]", p.int_lo, p.int_hi), p.note);
    case ParamType::Real:
      if (p.lo == p.hi && !p.lo_open && !p.hi_open) return with_note(show_value(p.lo), p.note);
      return with_note(
          fmt::format("{}{}, {}{}", p.lo_open ? "(" : "[", show_value(p.lo), show_value(p.hi), p.hi_open ? ")" : "]"),
          p.note);
    case ParamType::List:
      return fmt::format("at most {}", p.int_hi);
  }
  return "";
}

std::string out_of_range_problem(const RequestParam& p) {
  const bool single = (p.type == ParamType::Real && p.lo == p.hi && !p.lo_open && !p.hi_open) ||
                      (p.type == ParamType::Integer && p.int_lo == p.int_hi);
  return (single ? "must be " : "must be in ") + range_text(p);
}

std::string param_problem(const RequestParam& p, int64_t v) {
  if (p.type == ParamType::Real) return param_problem(p, static_cast<double>(v));
  check(p.type == ParamType::Integer, "\"{}\" is a list, not a number", p.name);
  return v < p.int_lo || v > p.int_hi ? out_of_range_problem(p) : "";
}

std::string param_problem(const RequestParam& p, double v) {
  check(p.type == ParamType::Real, "\"{}\" takes an integer, not a real number", p.name);
  // Compared as the float the engine keeps (fdpp::SamplingParams): a value an entrance takes is one
  // the sampler takes. In double, repetition_penalty 0.01 would pass here and its float, 0.00999999977,
  // fail there; rounding to float is monotonic, so the float bounds are the same bounds.
  const float f = static_cast<float>(v), lo = static_cast<float>(p.lo), hi = static_cast<float>(p.hi);
  const bool below = p.lo_open ? !(f > lo) : !(f >= lo);  // NaN compares false: below
  const bool above = p.hi_open ? !(f < hi) : !(f <= hi);
  return !std::isfinite(f) || below || above ? out_of_range_problem(p) : "";
}

std::string show_value(int64_t v) { return fmt::format("{}", v); }
std::string show_value(double v) { return fmt::format("{}", v); }
std::string show_value(float v) { return fmt::format("{}", v); }

std::string param_message(std::string_view name, std::string_view shown, std::string_view problem) {
  return fmt::format("\"{}\" {} {}", name, shown, problem);
}

std::string type_message(const RequestParam& p, std::string_view name, std::string_view shown) {
  const char* what = p.type == ParamType::Integer ? "an integer" : p.type == ParamType::Real ? "a number" : "a list";
  return fmt::format("\"{}\" must be {}, not {}", name, what, shown);
}

std::string check_request_param(std::string_view name, int64_t v) {
  const std::string problem = param_problem(request_param(name), v);
  return problem.empty() ? "" : param_message(name, show_value(v), problem);
}

std::string check_request_param(std::string_view name, double v) {
  const std::string problem = param_problem(request_param(name), v);
  return problem.empty() ? "" : param_message(name, show_value(v), problem);
}

JsonParam check_json_param(std::string_view name, const nlohmann::json& v) {
  const RequestParam& p = request_param(name);
  JsonParam r;
  if (p.type == ParamType::Integer) {
    if (!v.is_number_integer()) {
      r.message = type_message(p, name, json_show(v));
    } else if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      r.message = param_message(name, json_show(v), out_of_range_problem(p));
    } else {
      r.integer = v.get<int64_t>();
      r.message = check_request_param(name, r.integer);
    }
  } else if (p.type == ParamType::Real) {
    if (!v.is_number()) {
      r.message = type_message(p, name, json_show(v));
    } else {
      r.real = v.get<double>();
      r.message = check_request_param(name, r.real);
    }
  } else {
    fail("\"{}\" is a list; check its items one by one", name);
  }
  return r;
}

std::string list_count_message(std::string_view name, size_t count, std::optional<size_t> limit) {
  const RequestParam& p = request_param(name);
  check(p.type == ParamType::List, "\"{}\" is not a list", name);
  const size_t most = limit.value_or(static_cast<size_t>(p.int_hi));
  if (count <= most) return "";
  const char* items = p.name == "stop" ? "strings" : p.name == "logit_bias" ? "entries" : "ids";
  return fmt::format("\"{}\" has {} {}; at most {} are supported", name, count, items, most);
}

std::string stop_string_problem(std::string_view s, std::optional<size_t> max_bytes) {
  const size_t most = max_bytes.value_or(kMaxStopBytes);
  if (s.empty()) return "is empty (an empty stop string would end every request at once)";
  if (s.size() > most) return fmt::format("is {} bytes long; at most {} are supported", s.size(), most);
  return utf8_problem(s);
}

}  // namespace fdpp
