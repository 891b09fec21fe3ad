// The table of request limits (engine/request_limits.h) and the entrances that check against it: one
// table of bad values (tests/fixtures/request_limits_bad_values.json, which
// tests/python/test_request_limits.py runs through SamplingParams too) fed to a prompts file's line,
// the server's request parser and the sampler's check, each expected to give the same message.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <string>

#include "engine/prompt_file.h"
#include "engine/request_limits.h"
#include "engine/sampler.h"
#include "server/api.h"
#include "server_api_fakes.h"

namespace fdpp {
namespace {

using nlohmann::json;

json bad_values() {
  std::ifstream in(std::string(FDPP_TEST_DIR) + "/fixtures/request_limits_bad_values.json");
  EXPECT_TRUE(in) << "missing tests/fixtures/request_limits_bad_values.json";
  return json::parse(in);
}

std::string with_name(std::string message, const std::string& name) {
  const size_t at = message.find("{name}");
  return at == std::string::npos ? message : message.replace(at, 6, name);
}

// The message each entrance gives; "" when it takes the value.
std::string prompt_file_message(const std::string& name, const json& value) {
  const json line = {{"prompt", "a"}, {name, value}};
  try {
    parse_prompt_file(line.dump(), PromptFileFormat::JsonLines, "p.jsonl");
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.rfind("p.jsonl:1: ", 0), 0u) << m;  // the file and the line, then the table's message
    return m.substr(std::string("p.jsonl:1: ").size());
  }
  return "";
}

std::string server_message(const std::string& name, const json& value,
                           server::Endpoint endpoint = server::Endpoint::Completions) {
  json body = {{name, value}};
  if (endpoint == server::Endpoint::Chat)
    body["messages"] = json::array({{{"role", "user"}, {"content", "a"}}});
  else
    body["prompt"] = "a";
  try {
    server::parse_request(endpoint, body, server::fakes::tiny_model(), server::fakes::byte_codec(), {});
  } catch (const server::ApiError& e) {
    EXPECT_EQ(e.status, 400) << e.what();
    EXPECT_EQ(e.param, name) << e.what();
    return e.what();
  }
  return "";
}

std::string sampler_message(const std::string& name, double value) {
  SamplingParams p;
  if (name == "temperature")
    p.temperature = static_cast<float>(value);
  else if (name == "top_k")
    p.top_k = static_cast<int>(value);
  else if (name == "top_p")
    p.top_p = static_cast<float>(value);
  else if (name == "min_p")
    p.min_p = static_cast<float>(value);
  else if (name == "repeat_penalty")
    p.repeat_penalty = static_cast<float>(value);
  else if (name == "repeat_last_n")
    p.repeat_last_n = static_cast<int>(value);
  else if (name == "presence_penalty")
    p.presence_penalty = static_cast<float>(value);
  else if (name == "frequency_penalty")
    p.frequency_penalty = static_cast<float>(value);
  else if (name == "min_tokens")
    p.min_tokens = static_cast<int>(value);
  else if (name == "logprobs")
    p.logprobs = static_cast<int>(value);
  else
    ADD_FAILURE() << "the sampler has no field " << name;
  try {
    check_sampling_params(p);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

double float_value(const std::string& text) {
  if (text == "nan") return NAN;
  if (text == "inf") return INFINITY;
  if (text == "-inf") return -INFINITY;
  ADD_FAILURE() << "float_value " << text;
  return 0;
}

TEST(RequestLimits, EveryEntranceGivesTheTablesMessage) {
  const json table = bad_values();
  int checked = 0;
  for (const json& c : table["cases"]) {
    const std::string param = c["param"];
    const std::string want = c["message"];
    const json& spellings = table["spellings"][param];
    ASSERT_FALSE(spellings.is_null()) << param;
    SCOPED_TRACE(c.dump().substr(0, 200));
    if (c.contains("value")) {
      const json& v = c["value"];
      if (spellings.contains("file")) {
        const std::string name = spellings["file"];
        EXPECT_EQ(prompt_file_message(name, v), with_name(want, name));
        ++checked;
      }
      if (spellings.contains("server")) {
        const std::string name = spellings["server"];
        // top_logprobs is chat's field (with "logprobs": true there).
        EXPECT_EQ(server_message(name, v, name == "top_logprobs" ? server::Endpoint::Chat : server::Endpoint::Completions),
                  with_name(want, name));
        ++checked;
        if (name == "max_tokens") {  // chat's other spelling: the same range, its own name
          EXPECT_EQ(server_message("max_completion_tokens", v, server::Endpoint::Chat),
                    with_name(want, "max_completion_tokens"));
          ++checked;
        }
      }
    }
    // The sampler's fields are typed: it sees numbers only, and none beyond a float's range (1e+300
    // reaches it as inf, which it names as such).
    if (spellings.contains("sampler") && !c.value("type", false)) {
      const std::string name = spellings["sampler"];
      const double v = c.contains("float_value") ? float_value(c["float_value"]) : c["value"].get<double>();
      if (std::isfinite(v) && !std::isfinite(static_cast<float>(v))) continue;
      EXPECT_EQ(sampler_message(name, v), with_name(want, name));
      ++checked;
    }
  }
  EXPECT_GT(checked, 60);
}

// The fixture's spellings are the table's entrances: a parameter the table says an entrance takes is
// in the bad-value table for it, and no other.
TEST(RequestLimits, FixtureCoversTheTable) {
  const json table = bad_values();
  const std::map<std::string, unsigned> entrance = {{"file", Entrance::prompt_file},
                                                    {"server", Entrance::server},
                                                    {"python", Entrance::python},
                                                    {"sampler", Entrance::sampler}};
  std::map<std::string, int> cases;
  for (const json& c : table["cases"]) cases[c["param"]]++;
  for (const RequestParam& p : request_params()) {
    const std::string name(p.name);
    if ((p.entrances & (Entrance::prompt_file | Entrance::server | Entrance::python | Entrance::sampler)) == 0)
      continue;  // n_predict: the CLI's
    ASSERT_TRUE(table["spellings"].contains(name)) << name;
    EXPECT_GT(cases[name], 0) << name << " has no bad value";
    for (const auto& [key, bit] : entrance) {
      EXPECT_EQ(table["spellings"][name].contains(key), (p.entrances & bit) != 0) << name << " at " << key;
      if (table["spellings"][name].contains(key)) {
        const std::string spelled = table["spellings"][name][key];
        EXPECT_EQ(find_request_param(spelled), &p) << spelled;
      }
    }
  }
  // All but n_predict (the CLI's) and logit_bias_value (a logit_bias entry's range).
  EXPECT_EQ(table["spellings"].size(), request_params().size() - 2);
}

TEST(RequestLimits, TheTable) {
  EXPECT_EQ(range_text(request_param("top_p")), "(0, 1] (1 = off)");
  EXPECT_EQ(range_text(request_param("max_tokens")), "[1, 16777216]");
  EXPECT_EQ(range_text(request_param("n_predict")), "[0, 16777216] (0 = the prompt only)");
  EXPECT_EQ(&request_param("repetition_penalty"), &request_param("repeat_penalty"));
  EXPECT_EQ(&request_param("max_completion_tokens"), &request_param("max_tokens"));
  EXPECT_EQ(find_request_param("temprature"), nullptr);
  EXPECT_THROW(request_param("temprature"), Error);
  // The bounds themselves are in; NaN never is.
  EXPECT_EQ(check_request_param("top_p", 1.0), "");
  EXPECT_EQ(check_request_param("top_p", 1e-9), "");
  EXPECT_EQ(check_request_param("repeat_penalty", 0.01), "");
  EXPECT_EQ(check_request_param("repeat_penalty", 100.0), "");
  EXPECT_EQ(check_request_param("top_k", -1), "");
  EXPECT_EQ(check_request_param("seed", -1), "");
  EXPECT_EQ(check_request_param("seed", INT64_MAX), "");
  EXPECT_EQ(check_request_param("presence_penalty", 0.0), "");
  EXPECT_EQ(check_request_param("min_p", std::nan("")), "\"min_p\" nan must be in [0, 1] (0 = off)");
  EXPECT_EQ(check_request_param("repetition_penalty", 0.0),
            "\"repetition_penalty\" 0 must be in [0.01, 100] (1 = off)");
  // A float field prints as the float it is: 0.1f is "0.1", not 0.10000000149011612.
  EXPECT_EQ(show_value(0.1f), "0.1");
  EXPECT_EQ(list_count_message("stop", 16), "");
  EXPECT_EQ(list_count_message("stop", 3, 2), "\"stop\" has 3 strings; at most 2 are supported");
  EXPECT_EQ(stop_string_problem("\xff"), "byte 0xff at offset 0 is not valid UTF-8");
}

// The defaults a prompts file's lines start from (the CLI's -n) are a request's too: 0 is refused
// when the request is built, as a line's max_tokens 0 is when it is read.
TEST(RequestLimits, MaxTokensZeroIsTheCliFlagsOnly) {
  EXPECT_EQ(max_tokens_problem(0), "");  // -n 0 of one prompt: the prompt only (llama.cpp's)
  EXPECT_EQ(check_request_param("n_predict", 0), "");
  EXPECT_EQ(check_request_param("max_tokens", 0), "\"max_tokens\" 0 must be in [1, 16777216]");
  EXPECT_EQ(prompt_file_message("max_tokens", 0), "\"max_tokens\" 0 must be in [1, 16777216]");
  EXPECT_EQ(server_message("max_tokens", 0), "\"max_tokens\" 0 must be in [1, 16777216]");
}

// Values at the entrances' edges that are allowed everywhere.
TEST(RequestLimits, AllowedEdgesPassEveryEntrance) {
  const std::pair<const char*, json> file_cases[] = {
      {"top_k", -1},        {"seed", -1},          {"seed", INT64_MAX},
      {"max_tokens", 1},    {"top_p", 1},          {"repeat_penalty", 0.01},
      {"temperature", 100}, {"repeat_last_n", -1}, {"min_p", 0}};
  for (const auto& [name, v] : file_cases) EXPECT_EQ(prompt_file_message(name, v), "") << name << " " << v;
  const std::pair<const char*, json> server_cases[] = {{"top_k", -1},
                                                       {"seed", -1},
                                                       {"seed", INT64_MAX},
                                                       {"max_tokens", 1},
                                                       {"top_p", 1},
                                                       {"repetition_penalty", 100},
                                                       {"temperature", 0},
                                                       {"presence_penalty", 0.0},
                                                       {"frequency_penalty", 0}};
  for (const auto& [name, v] : server_cases) EXPECT_EQ(server_message(name, v), "") << name << " " << v;
  // The server's seed -1 is a random one, as an absent seed.
  const server::ParsedRequest r = server::parse_request(server::Endpoint::Completions, {{"prompt", "a"}, {"seed", -1}},
                                                        server::fakes::tiny_model(), server::fakes::byte_codec(), {});
  EXPECT_FALSE(r.seed_given);
  SamplingParams p;
  p.top_k = -1;
  p.repeat_last_n = -1;
  p.temperature = 0;
  EXPECT_NO_THROW(check_sampling_params(p));
  // The lower bound as the entrances keep it: the float nearest 0.01 is below 0.01 as a double.
  p.repeat_penalty = static_cast<float>(0.01);
  EXPECT_NO_THROW(check_sampling_params(p));
  p.temperature = 100;
  p.top_p = 1;
  p.min_p = 1;
  EXPECT_NO_THROW(check_sampling_params(p));
  // What the sampler would see as 0 is refused where the value is given.
  EXPECT_EQ(check_request_param("top_p", 1e-50), "\"top_p\" 1e-50 must be in (0, 1] (1 = off)");
}

}  // namespace
}  // namespace fdpp
