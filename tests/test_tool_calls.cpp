// Tool calls in text (src/tokenizer/tool_calls.h): the three parsers on fixed model outputs,
// tojson against Python's json.dumps, and where a streamed call starts.
#include <gtest/gtest.h>

#include "fdpp/error.h"
#include "tokenizer/tool_calls.h"

namespace fdpp {
namespace {

using ojson = nlohmann::ordered_json;

TEST(ToolCalls, TojsonIsPythonsJsonDumps) {
  const ojson v = ojson::parse(R"({"b": [1, 2.5, {"x": null}], "a": "é \"q\"\n", "e": {}, "f": [], "t": true})");
  // json.dumps(v, ensure_ascii=False): keys in order, ", " and ": ".
  EXPECT_EQ(tojson(v), R"({"b": [1, 2.5, {"x": null}], "a": "é \"q\"\n", "e": {}, "f": [], "t": true})");
  // json.dumps(v, ensure_ascii=False, indent=2).
  EXPECT_EQ(tojson(v, 2),
            "{\n  \"b\": [\n    1,\n    2.5,\n    {\n      \"x\": null\n    }\n  ],\n  \"a\": \"é \\\"q\\\"\\n\",\n"
            "  \"e\": {},\n  \"f\": [],\n  \"t\": true\n}");
  EXPECT_EQ(tojson(ojson("plain")), "\"plain\"");
}

TEST(ToolCalls, JsonValueEnd) {
  EXPECT_EQ(json_value_end(R"(x {"a": "}{", "b": [1, {"c": "\"}"}]} tail)", 2), 37u);
  EXPECT_EQ(json_value_end("[1, [2]] x", 0), 8u);
  EXPECT_EQ(json_value_end(R"({"a": [1})", 0), std::string_view::npos);   // mismatched
  EXPECT_EQ(json_value_end(R"({"a": 1)", 0), std::string_view::npos);     // not closed
  EXPECT_EQ(json_value_end("x", 0), std::string_view::npos);
  EXPECT_EQ(json_value_end(std::string(100, '[') + std::string(100, ']'), 0), std::string_view::npos);  // too deep
}

TEST(ToolCalls, Hermes) {
  const auto p = parse_tool_calls(ToolCallFormat::kHermes,
                                  "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                                  "{\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>\n<tool_call>\n"
                                  "{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>");
  EXPECT_EQ(p.content, "Let me look.\n");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].name, "get_weather");
  EXPECT_EQ(p.calls[0].arguments, R"({"city":"Paris","unit":"celsius"})");  // compact, in the model's order
  EXPECT_EQ(p.calls[1].name, "get_time");
  EXPECT_EQ(p.calls[1].arguments, "{}");
  EXPECT_TRUE(p.calls[0].id.empty());

  // The closing tag missing at the end (the model stopped after the object); arguments quoted as
  // a string; "parameters" for "arguments"; no arguments.
  auto q = parse_tool_calls(ToolCallFormat::kHermes, R"(<tool_call>{"name": "f", "arguments": "{\"x\": 1}"})");
  ASSERT_EQ(q.calls.size(), 1u);
  EXPECT_EQ(q.content, "");
  EXPECT_EQ(q.calls[0].arguments, R"({"x":1})");
  q = parse_tool_calls(ToolCallFormat::kHermes, R"(<tool_call>{"name": "f", "parameters": {"y": [1]}}</tool_call>)");
  ASSERT_EQ(q.calls.size(), 1u);
  EXPECT_EQ(q.calls[0].arguments, R"({"y":[1]})");
  q = parse_tool_calls(ToolCallFormat::kHermes, R"(<tool_call>{"name": "f"}</tool_call>)");
  ASSERT_EQ(q.calls.size(), 1u);
  EXPECT_EQ(q.calls[0].arguments, "{}");

  // Not calls: the whole text is content.
  for (const char* text : {"Just an answer.", "<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": 1</tool_call>",
                           "<tool_call>not json</tool_call>", "<tool_call>{\"arguments\": {}}</tool_call>",
                           "<tool_call>{\"name\": 3}</tool_call>", "<tool_call>{\"name\": \"f\", \"arguments\": [1]}",
                           "<tool_call>{\"name\": \"\", \"arguments\": {}}"}) {
    const auto r = parse_tool_calls(ToolCallFormat::kHermes, text);
    EXPECT_TRUE(r.calls.empty()) << text;
    EXPECT_EQ(r.content, text);
  }
}

TEST(ToolCalls, Llama3Json) {
  auto p = parse_tool_calls(ToolCallFormat::kLlama3Json,
                            R"({"name": "get_weather", "parameters": {"city": "Paris"}})");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.content, "");
  EXPECT_EQ(p.calls[0].name, "get_weather");
  EXPECT_EQ(p.calls[0].arguments, R"({"city":"Paris"})");
  // <|python_tag|> (written when skip_special_tokens is off), several calls separated by ';'.
  p = parse_tool_calls(ToolCallFormat::kLlama3Json,
                       "<|python_tag|>{\"name\": \"a\", \"parameters\": {\"x\": 1}}; {\"name\": \"b\", \"arguments\": {}}");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].name, "a");
  EXPECT_EQ(p.calls[1].name, "b");
  EXPECT_EQ(p.calls[1].arguments, "{}");
  // Text before the tag is content.
  p = parse_tool_calls(ToolCallFormat::kLlama3Json, "Sure.<|python_tag|>{\"name\": \"a\", \"parameters\": {}}");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.content, "Sure.");
  // Leading whitespace, then the call.
  p = parse_tool_calls(ToolCallFormat::kLlama3Json, "\n {\"name\": \"a\", \"parameters\": {}}");
  ASSERT_EQ(p.calls.size(), 1u);
  // An answer that is JSON but not a call, and an answer with braces later, are content.
  for (const char* text : {R"({"city": "Paris"})", "The set {1, 2} is small.", R"({"name": "a", "parameters": 5})"}) {
    const auto r = parse_tool_calls(ToolCallFormat::kLlama3Json, text);
    EXPECT_TRUE(r.calls.empty()) << text;
    EXPECT_EQ(r.content, text);
  }
}

TEST(ToolCalls, Mistral) {
  auto p = parse_tool_calls(ToolCallFormat::kMistral,
                            R"([TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, )"
                            R"({"name": "get_time", "arguments": {"zone": "CET"}}])");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.content, "");
  EXPECT_EQ(p.calls[0].name, "get_weather");
  EXPECT_EQ(p.calls[0].arguments, R"({"city":"Paris"})");
  EXPECT_EQ(p.calls[1].arguments, R"({"zone":"CET"})");
  p = parse_tool_calls(ToolCallFormat::kMistral, R"(Checking.[TOOL_CALLS]{"name": "f", "arguments": {}})");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.content, "Checking.");
  for (const char* text : {"No call here.", "[TOOL_CALLS] [", "[TOOL_CALLS] []", R"([TOOL_CALLS] [{"name": "f"}, 3])",
                           "[TOOL_CALLS] get_weather"}) {
    const auto r = parse_tool_calls(ToolCallFormat::kMistral, text);
    EXPECT_TRUE(r.calls.empty()) << text;
    EXPECT_EQ(r.content, text);
  }
}

TEST(ToolCalls, CallsFromJson) {
  auto calls = tool_calls_from_json(R"({"name": "f", "arguments": {"a": 1}})");
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].arguments, R"({"a":1})");
  calls = tool_calls_from_json(R"( [{"name": "f", "arguments": {}}, {"name": "g", "arguments": {"b": "x"}}] )");
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[1].name, "g");
  EXPECT_TRUE(tool_calls_from_json(R"({"name": "f", "arguments": {"a": 1)").empty());  // cut short
  EXPECT_TRUE(tool_calls_from_json(R"({"name": "f", "arguments": {}} extra)").empty());
  EXPECT_TRUE(tool_calls_from_json("[]").empty());
}

TEST(ToolCalls, StreamedStart) {
  size_t safe = 0;
  // Hermes: text before a partial marker is safe; the partial marker is held.
  EXPECT_EQ(find_tool_call_start(ToolCallFormat::kHermes, "Hello <tool", true, safe), std::string_view::npos);
  EXPECT_EQ(safe, 6u);
  EXPECT_EQ(find_tool_call_start(ToolCallFormat::kHermes, "Hello <b>", true, safe), std::string_view::npos);
  EXPECT_EQ(safe, 9u);
  EXPECT_EQ(find_tool_call_start(ToolCallFormat::kHermes, "Hi <tool_call>{", true, safe), 3u);
  EXPECT_EQ(safe, 3u);
  // Llama 3: whitespace at the start is held; a '{' first is a call; later braces are not.
  EXPECT_EQ(find_tool_call_start(ToolCallFormat::kLlama3Json, " \n", true, safe), std::string_view::npos);
  EXPECT_EQ(safe, 0u);
  EXPECT_EQ(find_tool_call_start(ToolCallFormat::kLlama3Json, " {\"na", true, safe), 0u);
  EXPECT_EQ(find_tool_call_start(ToolCallFormat::kLlama3Json, "{\"na", false, safe), std::string_view::npos);
  EXPECT_EQ(safe, 4u);
  EXPECT_EQ(find_tool_call_start(ToolCallFormat::kLlama3Json, "Ok <|python", true, safe), std::string_view::npos);
  EXPECT_EQ(safe, 3u);
  EXPECT_EQ(find_tool_call_start(ToolCallFormat::kMistral, "x[TOOL_CALLS] [", true, safe), 1u);
}

TEST(ToolCalls, OrderedJsonErrorsNameTheText) {
  EXPECT_EQ(parse_ordered_json(R"({"b": 1, "a": 2})", "t").begin().key(), "b");
  try {
    (void)parse_ordered_json("{bad", "tools[0]");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tools[0] is not JSON"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace fdpp
