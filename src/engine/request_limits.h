// The ranges of a request's parameters, in one table that every entrance checks against: a prompts
// file's JSON line (engine/prompt_file.cpp) and the CLI's sampling flags, the OpenAI-compatible
// server (server/api.cpp), the Python package's SamplingParams (through python/src/bindings.cpp) and
// the sampler itself (check_sampling_params). A value out of range gets the same range and the same
// message everywhere:
//
//   "top_p" 0 must be in (0, 1] (1 = off)
//
// (the name as the entrance spells it, the value as the table prints it, the range, what the special
// values mean). Each entrance throws its own error type around the message: "FILE:LINE: ..." for a
// prompts file, HTTP 400 with param = the name for the server, fdpp.InvalidInputError for Python,
// fdpp::Error for the sampler. Whether a field is allowed at an entrance at all (a prompts file has
// no logit_bias or presence_penalty) is the entrance's business; `entrances` records it for the
// tests and the reader.
//
// The ranges follow what vLLM and llama.cpp users expect; where they differ, the stricter one that no
// sensible request hits:
//   max_tokens         [1, 2^24]      vLLM and OpenAI refuse < 1. The CLI's -n for one prompt is the
//                                     separate entry n_predict, [0, 2^24], where 0 (llama.cpp's -n 0)
//                                     runs the prompt only; `-f` with -n 0 is refused by the CLI.
//   temperature        [0, 100]       0 = greedy (vLLM: >= 0)
//   top_k              [-1, 2^24]     -1 (vLLM) and 0 (llama.cpp) = off
//   top_p              (0, 1]         1 = off; 0 would keep no token
//   min_p              [0, 1]         0 = off
//   repeat_penalty     [0.01, 100]    1 = off; the server and Python spell it repetition_penalty (the
//                                     server takes llama-server's repeat_penalty too)
//   repeat_last_n      [-1, 2^30]     -1 = every token
//   seed               [-1, 2^63)     -1 = a random seed (llama.cpp's --seed -1, vLLM's seed=-1);
//                                     2^63 and above are refused, as vLLM's int64 field does
//   presence_penalty,  [-2, 2]        OpenAI's (and vLLM's) range; 0 = off; over the generated tokens
//   frequency_penalty
//   n                  [1, 64]        choices per prompt (OpenAI allows 128; 64 is a step's rows)
//   best_of            [1, 64]        vLLM's and OpenAI's legacy field; only best_of == n is taken
//   min_tokens         [0, 2^24]      vLLM's: end-of-generation and stop ids held back until reached
//   logprobs           [0, 20]        OpenAI's top_logprobs bound (vLLM's max_logprobs default); the
//   top_logprobs                      chat endpoint's logprobs is a boolean, top_logprobs the count
//   prompt_logprobs    [0, 20]        vLLM's: per prompt token, its log probability and the top k
//   logit_bias         <= 300 entries OpenAI's; each bias (the entry logit_bias_value) in [-100, 100]
//   stop               <= kMaxStopStrings strings of 1..kMaxStopBytes bytes of valid UTF-8
//   stop_token_ids     <= kMaxStopTokenIds ids (each < the vocabulary, checked against the model)
// NaN and infinities are never in range; an integer parameter takes integers only (2.0 and 2.5 are
// refused, as OpenAI and vLLM do). A real parameter is compared as the float the engine keeps, so
// that the bounds (0.01 is not a float) mean the same at the entrances and in the sampler.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

namespace fdpp {

inline constexpr int64_t kMaxChoices = 64;      // n and best_of
inline constexpr size_t kMaxLogitBias = 300;    // logit_bias entries

enum class ParamType {
  Integer,  // [int_lo, int_hi]
  Real,     // lo..hi, each end open or closed; NaN and infinities refused
  List,     // at most int_hi items (stop: strings, stop_token_ids: ids)
};

// Where a parameter is taken (bits of RequestParam::entrances); for the tests and the reader.
struct Entrance {
  static constexpr unsigned cli_flag = 1;     // fdpp generate's flag (--top-p, -n, ...)
  static constexpr unsigned prompt_file = 2;  // a JSON line of `fdpp generate -f`
  static constexpr unsigned server = 4;       // fdpp serve's request body
  static constexpr unsigned python = 8;       // fdpp.SamplingParams
  static constexpr unsigned sampler = 16;     // check_sampling_params (fdpp::SamplingParams' fields)
};

struct RequestParam {
  std::string_view name;   // as the APIs spell it
  std::string_view alias;  // the other spelling, "" for none (repetition_penalty, max_completion_tokens)
  ParamType type;
  int64_t int_lo = 0, int_hi = 0;  // Integer: the closed range; List: int_hi = the most items
  double lo = 0, hi = 0;           // Real
  bool lo_open = false, hi_open = false;
  std::string_view note;  // what the special values mean ("0 = greedy"); "" for none
  unsigned entrances = 0;
};

// Every parameter, in the order of the table above.
std::span<const RequestParam> request_params();
// The entry named `name` or its alias; nullptr for a name the table does not have.
const RequestParam* find_request_param(std::string_view name);
// The same, throwing fdpp::Error for an unknown name (a programming error at the call site).
const RequestParam& request_param(std::string_view name);

// The range as the messages write it: "(0, 1] (1 = off)", "[1, 16777216]", "0 (not implemented; ...)".
std::string range_text(const RequestParam& p);
// The problem of a value: "" when allowed, else "must be in (0, 1] (1 = off)" (or "must be 0 (...)").
// An Integer parameter takes the int64_t overload; the double one is for Real parameters (an
// Integer one given a double is a type problem, see type_message).
std::string param_problem(const RequestParam& p, int64_t v);
std::string param_problem(const RequestParam& p, double v);
inline std::string param_problem(const RequestParam& p, int v) { return param_problem(p, int64_t{v}); }
// The problem of an integer that does not even fit int64 (a JSON 2^64 - 1, a Python 10**30).
std::string out_of_range_problem(const RequestParam& p);
// A value as the messages print it: integers in decimal, reals in the shortest form that reads back
// to the same double ("0.1", "1e-05", "nan", "inf"); a float field (fdpp::SamplingParams) prints as
// the shortest form of the float, so 0.1f is "0.1" too.
std::string show_value(int64_t v);
std::string show_value(double v);
std::string show_value(float v);

// The one message form: "\"top_p\" 0 must be in (0, 1] (1 = off)". name: as the caller spelled it
// (an alias stays an alias); shown: the value as show_value prints it, or the entrance's own text for
// what show_value cannot print (a JSON integer beyond int64).
std::string param_message(std::string_view name, std::string_view shown, std::string_view problem);
// A value of the wrong type: "\"top_k\" must be an integer, not 2.5" / "\"temperature\" must be a
// number, not \"hot\"" (shown in the entrance's own syntax: JSON, Python repr).
std::string type_message(const RequestParam& p, std::string_view name, std::string_view shown);

// Lookup and check in one: "" when allowed, else the message (name: the caller's spelling).
std::string check_request_param(std::string_view name, int64_t v);
std::string check_request_param(std::string_view name, double v);
inline std::string check_request_param(std::string_view name, int v) { return check_request_param(name, int64_t{v}); }

// A JSON value (a prompts file's line, a server request's body) checked against the entry `name`
// (the caller's spelling): integers only for an Integer entry (JSON 16.0 is refused, as OpenAI does),
// any number for a Real one. message is "" when the value is allowed, else the message above (the
// value shown by show_value, or by json_show for a type problem or an integer beyond int64).
struct JsonParam {
  int64_t integer = 0;  // an Integer entry's value
  double real = 0;      // a Real entry's value
  std::string message;
};
JsonParam check_json_param(std::string_view name, const nlohmann::json& v);

// Lists. count_message: "\"stop\" has 17 strings; at most 16 are supported" (limit: the entry's
// int_hi unless the caller, a server with a lower bound, gives its own).
std::string list_count_message(std::string_view name, size_t count, std::optional<size_t> limit = std::nullopt);
// One stop string's problem: "" or "is empty (...)", "is 300 bytes long; at most 256 are supported",
// "byte 0xff at offset 5 is not valid UTF-8". The message is "\"stop\" " + the problem.
std::string stop_string_problem(std::string_view s, std::optional<size_t> max_bytes = std::nullopt);

}  // namespace fdpp
