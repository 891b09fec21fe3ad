// Tools in fdpp serve's wire format (src/server/tools.h): the request's tools and tool_choice
// checked and turned into the template's tools and a forced call's grammar, the replies' tool_calls,
// and the streamed deltas.
#include <gtest/gtest.h>

#include "server/api.h"
#include "server/tools.h"
#include "server_api_fakes.h"

namespace fdpp::server {
namespace {

using nlohmann::json;

constexpr const char* kWeather =
    R"({"type": "function", "function": {"name": "get_weather", "description": "Weather now",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}})";
constexpr const char* kTime =
    R"({"type": "function", "function": {"name": "get_time", "parameters": {"type": "object",
        "properties": {"zone": {"type": "string"}}, "required": ["zone"], "additionalProperties": false}}})";

// What the chat template was given: the codec records the messages and options.
struct Seen {
  std::vector<ChatMessage> messages;
  ChatOptions options;
};

PromptCodec recording_codec(Seen& seen, ToolCallFormat format = ToolCallFormat::kHermes) {
  PromptCodec c = fakes::byte_codec();
  c.encode_chat = [&seen](std::span<const ChatMessage> messages, const ChatOptions& options) {
    seen.messages.assign(messages.begin(), messages.end());
    seen.options = options;
    return std::vector<int32_t>{1, 2, 3};
  };
  c.tool_format = format;
  return c;
}

ParsedRequest parse_chat(const std::string& fields, Seen& seen, ToolCallFormat format = ToolCallFormat::kHermes) {
  const std::string body = R"({"messages": [{"role": "user", "content": "Weather in Paris?"}], )" + fields + "}";
  ApiLimits limits;
  return parse_request(Endpoint::Chat, parse_json_body(body, limits), fakes::tiny_model(),
                       recording_codec(seen, format), limits, body);
}

// The ApiError of a request: status, param and message.
std::tuple<int, std::string, std::string> error_of(const std::string& fields) {
  Seen seen;
  try {
    parse_chat(fields, seen);
  } catch (const ApiError& e) {
    return {e.status, e.param, e.what()};
  }
  return {0, "", "no error"};
}

// Whether a grammar takes text whole (a vocabulary of the 256 bytes and an end token).
bool takes(const std::shared_ptr<const grammar::Grammar>& g, const std::string& text) {
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.push_back(std::string(1, static_cast<char>(b)));
  tokens.push_back("");
  grammar::GrammarMatcher m(g, std::make_shared<grammar::TokenVocabulary>(std::move(tokens), std::vector<int32_t>{256}));
  return m.accept_bytes(text) && m.accepting();
}

TEST(ServerTools, ToolsReachTheTemplateInTheClientsOrder) {
  Seen seen;
  ParsedRequest r = parse_chat(std::string(R"("tools": [)") + kWeather + ", " + kTime + "]", seen);
  EXPECT_EQ(r.tools.choice, ToolChoice::kAuto);  // the default with tools
  EXPECT_EQ(r.generation.grammar, nullptr);
  EXPECT_TRUE(r.tools.parallel);
  ASSERT_EQ(seen.options.tools.size(), 2u);
  // Key order as sent (the template prints it): type before function, name before description.
  EXPECT_EQ(seen.options.tools[0].find(R"({"type":"function","function":{"name":"get_weather",)"), 0u);
  EXPECT_TRUE(r.generation.skip_special_tokens);  // Hermes' <tool_call> is text

  // "none": no tools rendered, nothing parsed.
  r = parse_chat(std::string(R"("tool_choice": "none", "tools": [)") + kWeather + "]", seen);
  EXPECT_EQ(r.tools.choice, ToolChoice::kNone);
  EXPECT_TRUE(seen.options.tools.empty());
  // "auto" without tools (LangChain sends it) is no tools.
  r = parse_chat(R"("tool_choice": "auto", "tools": [])", seen);
  EXPECT_FALSE(r.tools.active());

  // Mistral's and Llama's markers are control tokens: the text keeps them when parsing is on.
  r = parse_chat(std::string(R"("tools": [)") + kWeather + "]", seen, ToolCallFormat::kMistral);
  EXPECT_EQ(r.tools.format, ToolCallFormat::kMistral);
  EXPECT_FALSE(r.generation.skip_special_tokens);
  r = parse_chat(std::string(R"("tools": [)") + kWeather + R"(], "tool_choice": "none")", seen,
                 ToolCallFormat::kLlama3Json);
  EXPECT_TRUE(r.generation.skip_special_tokens);
}

TEST(ServerTools, HistoryWithCallsAndResults) {
  Seen seen;
  const std::string body = R"({"messages": [{"role": "user", "content": "Weather?"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}], "tools": [)" + std::string(kWeather) + "]}";
  ApiLimits limits;
  (void)parse_request(Endpoint::Chat, parse_json_body(body, limits), fakes::tiny_model(), recording_codec(seen),
                      limits, body);
  ASSERT_EQ(seen.messages.size(), 3u);
  EXPECT_EQ(seen.messages[1].role, "assistant");
  EXPECT_EQ(seen.messages[1].content, "");
  ASSERT_EQ(seen.messages[1].tool_calls.size(), 1u);
  EXPECT_EQ(seen.messages[1].tool_calls[0].id, "call_1");
  EXPECT_EQ(seen.messages[1].tool_calls[0].name, "get_weather");
  EXPECT_EQ(seen.messages[1].tool_calls[0].arguments, R"({"city": "Paris"})");
  EXPECT_EQ(seen.messages[2].role, "tool");
  EXPECT_EQ(seen.messages[2].tool_call_id, "call_1");
  EXPECT_EQ(seen.messages[2].content, "sunny");
}

TEST(ServerTools, ForcedCallsAreHeldToTheSchema) {
  Seen seen;
  const std::string both = std::string(R"("tools": [)") + kWeather + ", " + kTime + "]";
  ParsedRequest r =
      parse_chat(both + R"(, "tool_choice": {"type": "function", "function": {"name": "get_weather"}})", seen);
  EXPECT_EQ(r.tools.choice, ToolChoice::kNamed);
  EXPECT_EQ(r.tools.forced, "get_weather");
  ASSERT_NE(r.generation.grammar, nullptr);
  EXPECT_TRUE(takes(r.generation.grammar, R"({"city": "Paris", "unit": "celsius"})"));
  EXPECT_TRUE(takes(r.generation.grammar, R"({"city": "Oslo"})"));
  EXPECT_FALSE(takes(r.generation.grammar, R"({"unit": "celsius"})"));            // city is required
  EXPECT_FALSE(takes(r.generation.grammar, R"({"city": "Oslo", "unit": "kelvin"})"));
  EXPECT_FALSE(seen.options.tools.empty());  // the template still sees the tools

  // "required", one call: {"name", "arguments"} of either tool.
  r = parse_chat(both + R"(, "tool_choice": "required", "parallel_tool_calls": false)", seen);
  EXPECT_EQ(r.tools.choice, ToolChoice::kRequired);
  EXPECT_FALSE(r.tools.parallel);
  EXPECT_TRUE(takes(r.generation.grammar, R"({"name": "get_time", "arguments": {"zone": "UTC"}})"));
  EXPECT_TRUE(takes(r.generation.grammar, R"({"name": "get_weather", "arguments": {"city": "Rome"}})"));
  EXPECT_FALSE(takes(r.generation.grammar, R"({"name": "get_time", "arguments": {"city": "Rome"}})"));
  EXPECT_FALSE(takes(r.generation.grammar, R"({"name": "other", "arguments": {}})"));
  EXPECT_FALSE(takes(r.generation.grammar, R"([{"name": "get_time", "arguments": {"zone": "UTC"}}])"));
  // Parallel (the default): a non-empty array of them.
  r = parse_chat(both + R"(, "tool_choice": "required")", seen);
  EXPECT_TRUE(takes(r.generation.grammar, R"([{"name": "get_time", "arguments": {"zone": "UTC"}}, )"
                                          R"({"name": "get_weather", "arguments": {"city": "Rome"}}])"));
  EXPECT_FALSE(takes(r.generation.grammar, "[]"));

  // A schema with references to its own $defs still holds inside the "required" envelope.
  const std::string defs = R"("tools": [{"type": "function", "function": {"name": "book", "parameters": {
      "type": "object", "properties": {"guest": {"$ref": "#/$defs/Guest"}}, "required": ["guest"],
      "$defs": {"Guest": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}}}}}])";
  r = parse_chat(defs + R"(, "tool_choice": "required", "parallel_tool_calls": false)", seen);
  EXPECT_TRUE(takes(r.generation.grammar, R"({"name": "book", "arguments": {"guest": {"name": "Ann"}}})"));
  EXPECT_FALSE(takes(r.generation.grammar, R"({"name": "book", "arguments": {"guest": {"age": 3}}})"));
  r = parse_chat(defs + R"(, "tool_choice": "required")", seen);
  EXPECT_TRUE(takes(r.generation.grammar, R"([{"name": "book", "arguments": {"guest": {"name": "Ann"}}}])"));

  // A keyword the engine cannot honour: any object for a non-strict tool (named in the ignored
  // fields), a 400 for a strict one.
  const std::string minimum = R"({"type": "function", "function": {"name": "f", %s"parameters": {"type": "object",
      "properties": {"n": {"type": "integer", "minimum": 1}}}}})";
  std::string loose = minimum, strict = minimum;
  loose.replace(loose.find("%s"), 2, "");
  strict.replace(strict.find("%s"), 2, R"("strict": true, )");
  r = parse_chat(R"("tools": [)" + loose + R"(], "tool_choice": {"type": "function", "function": {"name": "f"}})", seen);
  EXPECT_TRUE(takes(r.generation.grammar, R"({"n": 0, "anything": [1]})"));
  EXPECT_EQ(r.ignored_fields, std::vector<std::string>{"tools[0].function.parameters"});
  const auto [status, param, message] =
      error_of(R"("tools": [)" + strict + R"(], "tool_choice": {"type": "function", "function": {"name": "f"}})");
  EXPECT_EQ(status, 400);
  EXPECT_EQ(param, "tools[0].function.parameters");
  EXPECT_NE(message.find("minimum"), std::string::npos) << message;
  // No parameters: any object.
  r = parse_chat(R"("tools": [{"type": "function", "function": {"name": "ping"}}], "tool_choice": "required",
                    "parallel_tool_calls": false)", seen);
  EXPECT_TRUE(takes(r.generation.grammar, R"({"name": "ping", "arguments": {}})"));
}

TEST(ServerTools, BadToolsAreA400NamingTheField) {
  const std::string weather = std::string(R"("tools": [)") + kWeather + "]";
  const std::vector<std::tuple<std::string, std::string, std::string>> cases = {
      {R"("tools": {"type": "function"})", "tools", "must be a list"},
      {R"("tools": [3])", "tools[0]", "must be an object"},
      {R"("tools": [{"function": {"name": "f"}}])", "tools[0].type", "\"function\""},
      {R"("tools": [{"type": "retrieval", "function": {"name": "f"}}])", "tools[0].type", "\"function\""},
      {R"("tools": [{"type": "function"}])", "tools[0].function", "must be an object"},
      {R"("tools": [{"type": "function", "function": {"description": "no name"}}])", "tools[0].function.name",
       "required"},
      {R"("tools": [{"type": "function", "function": {"name": "a b"}}])", "tools[0].function.name", "letters"},
      {R"("tools": [{"type": "function", "function": {"name": "f", "parameters": "object"}}])",
       "tools[0].function.parameters", "JSON schema object"},
      {R"("tools": [{"type": "function", "function": {"name": "f", "parameters": []}}])",
       "tools[0].function.parameters", "JSON schema object"},
      {R"("tools": [{"type": "function", "function": {"name": "f", "description": 1}}])",
       "tools[0].function.description", "string"},
      {R"("tools": [{"type": "function", "function": {"name": "f"}}, {"type": "function", "function": {"name": "f"}}])",
       "tools[1].function.name", "twice"},
      {weather + R"(, "tool_choice": "sometimes")", "tool_choice", "is not one of"},
      {weather + R"(, "tool_choice": {"type": "function", "function": {"name": "get_time"}})", "tool_choice",
       "'get_time', which 'tools' does not define"},
      {weather + R"(, "tool_choice": {"type": "function"})", "tool_choice", "must be a string or"},
      {weather + R"(, "tool_choice": 5)", "tool_choice", "must be a string or"},
      {R"("tool_choice": "required")", "tool_choice", "needs 'tools'"},
      {R"("tools": [], "tool_choice": {"type": "function", "function": {"name": "f"}})", "tool_choice", "needs 'tools'"},
      {weather + R"(, "parallel_tool_calls": "yes")", "parallel_tool_calls", "boolean"},
      {weather + R"(, "tool_choice": "required", "response_format": {"type": "json_object"})", "tool_choice",
       "cannot be combined"},
      {R"("functions": [{"name": "f"}])", "functions", "use 'tools'"},
  };
  for (const auto& [fields, want_param, words] : cases) {
    const auto [status, param, message] = error_of(fields);
    EXPECT_EQ(status, 400) << fields;
    EXPECT_EQ(param, want_param) << fields << ": " << message;
    EXPECT_NE(message.find(words), std::string::npos) << fields << ": " << message;
  }
  // Messages: calls only on assistant messages, ids only on tool messages, arguments a JSON object.
  ApiLimits limits;
  Seen seen;
  const auto message_error = [&](const std::string& messages) -> std::pair<std::string, std::string> {
    const std::string body = R"({"messages": )" + messages + "}";
    try {
      parse_request(Endpoint::Chat, parse_json_body(body, limits), fakes::tiny_model(), recording_codec(seen), limits,
                    body);
    } catch (const ApiError& e) {
      return {e.param, e.what()};
    }
    return {"", "no error"};
  };
  EXPECT_EQ(message_error(R"([{"role": "user", "content": "x", "tool_call_id": "c"}])").first, "messages[0].tool_call_id");
  EXPECT_EQ(message_error(R"([{"role": "user", "content": "x", "tool_calls": []}])").first, "messages[0].tool_calls");
  EXPECT_EQ(message_error(R"([{"role": "tool"}])").first, "messages[0].content");
  EXPECT_EQ(message_error(R"([{"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f",
              "arguments": "{oops"}}]}])").first,
            "messages[0].tool_calls[0].function.arguments");
  EXPECT_EQ(message_error(R"([{"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f",
              "arguments": "[1]"}}]}])").first,
            "messages[0].tool_calls[0].function.arguments");
  EXPECT_EQ(message_error(R"([{"role": "assistant", "tool_calls": [{"id": "c", "function": {}}]}])").first,
            "messages[0].tool_calls[0].function");
  EXPECT_EQ(message_error(R"([{"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f",
              "arguments": {"a": 1}}}]}])").first,
            "");  // vLLM takes the arguments as an object too
}

TEST(ServerTools, RepliesCarryToolCalls) {
  ResponseContext ctx;
  ctx.endpoint = Endpoint::Chat;
  ctx.tools.choice = ToolChoice::kAuto;
  ctx.tool_id_seed = 42;
  GenerationResult r;
  r.prompt = {1};
  r.token_ids = {2, 3};
  r.finish_reason = "stop";
  r.text = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
           "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"CET\"}}\n</tool_call>";
  json body = completion_body(ctx, r);
  json message = body["choices"][0]["message"];
  EXPECT_TRUE(message["content"].is_null());
  ASSERT_EQ(message["tool_calls"].size(), 2u);
  const json& call = message["tool_calls"][0];
  EXPECT_EQ(call["type"], "function");
  EXPECT_EQ(call["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(call["function"]["arguments"].get<std::string>()), json({{"city", "Paris"}}));
  const std::string id = call["id"];
  EXPECT_EQ(id.substr(0, 5), "call_");
  EXPECT_EQ(id.size(), 29u);
  EXPECT_NE(message["tool_calls"][1]["id"], call["id"]);
  EXPECT_EQ(body["choices"][0]["finish_reason"], "tool_calls");
  // The same ids for the same seed; another choice gets others.
  EXPECT_EQ(completion_body(ctx, r)["choices"][0]["message"]["tool_calls"][0]["id"], call["id"]);
  const GenerationResult two[] = {r, r};
  EXPECT_NE(completion_body(ctx, two)["choices"][1]["message"]["tool_calls"][0]["id"], call["id"]);

  // parallel_tool_calls false keeps the first.
  ctx.tools.parallel = false;
  EXPECT_EQ(completion_body(ctx, r)["choices"][0]["message"]["tool_calls"].size(), 1u);
  // Text before the call is content; a cut-off call stays "length".
  r.text = "Checking. <tool_call>{\"name\": \"f\", \"arguments\": {}}";
  message = completion_body(ctx, r)["choices"][0]["message"];
  EXPECT_EQ(message["content"], "Checking. ");
  EXPECT_EQ(message["tool_calls"][0]["function"]["arguments"], "{}");
  r.finish_reason = "length";
  EXPECT_EQ(completion_body(ctx, r)["choices"][0]["finish_reason"], "length");
  // No call: a plain answer, without tool_calls.
  r.text = "It is sunny.";
  r.finish_reason = "stop";
  body = completion_body(ctx, r);
  EXPECT_EQ(body["choices"][0]["message"]["content"], "It is sunny.");
  EXPECT_FALSE(body["choices"][0]["message"].contains("tool_calls"));
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");

  // A named call: the output is the arguments.
  ctx.tools = ToolSetup{ToolChoice::kNamed, ToolCallFormat::kMistral, "get_weather", true};
  r.text = R"({"city": "Oslo"})";
  body = completion_body(ctx, r);
  message = body["choices"][0]["message"];
  EXPECT_TRUE(message["content"].is_null());
  EXPECT_EQ(message["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(message["tool_calls"][0]["function"]["arguments"], R"({"city": "Oslo"})");
  EXPECT_EQ(message["tool_calls"][0]["id"].get<std::string>().size(), 9u);  // Mistral's ids
  EXPECT_EQ(body["choices"][0]["finish_reason"], "tool_calls");
  // "required": the JSON becomes the calls.
  ctx.tools = ToolSetup{ToolChoice::kRequired, ToolCallFormat::kHermes, "", true};
  r.text = R"([{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}])";
  message = completion_body(ctx, r)["choices"][0]["message"];
  ASSERT_EQ(message["tool_calls"].size(), 2u);
  EXPECT_EQ(message["tool_calls"][1]["function"]["name"], "b");
  EXPECT_EQ(message["tool_calls"][0]["function"]["arguments"], R"({"x":1})");
}

// The deltas of a stream, joined as a client joins them.
struct Joined {
  std::string content;
  json calls = json::array();
  void add(const ToolStream::Delta& d) {
    content += d.content;
    if (d.tool_calls.is_null()) return;
    for (const json& c : d.tool_calls) {
      const size_t i = c["index"];
      if (i >= calls.size()) calls.push_back({{"id", ""}, {"name", ""}, {"arguments", ""}});
      if (c.contains("id")) calls[i]["id"] = c["id"];
      if (c.contains("function") && c["function"].contains("name")) calls[i]["name"] = c["function"]["name"];
      if (c.contains("function") && c["function"].contains("arguments"))
        calls[i]["arguments"] = calls[i]["arguments"].get<std::string>() + c["function"]["arguments"].get<std::string>();
    }
  }
};

TEST(ServerTools, StreamedDeltas) {
  // Auto: text until the marker (a partial one held back), then the calls whole at the end.
  ToolStream s(ToolSetup{ToolChoice::kAuto, ToolCallFormat::kHermes, "", true}, 7);
  Joined j;
  EXPECT_EQ(s.push("Let me ").content, "Let me ");
  EXPECT_EQ(s.push("check <tool").content, "check ");
  ToolStream::Delta d = s.push("_call>\n{\"name\": \"get_weather\", ");
  EXPECT_EQ(d.content, "");
  EXPECT_TRUE(d.tool_calls.is_null());
  j.add(s.push("\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"));
  EXPECT_FALSE(s.called());
  d = s.finish();
  ASSERT_TRUE(d.tool_calls.is_array());
  EXPECT_EQ(d.tool_calls[0]["index"], 0);
  EXPECT_EQ(d.tool_calls[0]["type"], "function");
  j.add(d);
  EXPECT_TRUE(s.called());
  ASSERT_EQ(j.calls.size(), 1u);
  EXPECT_EQ(j.calls[0]["name"], "get_weather");
  EXPECT_EQ(j.calls[0]["arguments"], R"({"city":"Paris"})");
  EXPECT_EQ(j.calls[0]["id"], tool_call_id(ToolCallFormat::kHermes, 7, 0));

  // A partial marker that becomes something else is content; so is a call that does not parse.
  ToolStream t(ToolSetup{ToolChoice::kAuto, ToolCallFormat::kHermes, "", true}, 7);
  EXPECT_EQ(t.push("a <tool").content, "a ");
  EXPECT_EQ(t.push("box> b").content, "<toolbox> b");
  EXPECT_EQ(t.push(" <tool_call>{oops").content, " ");
  d = t.finish();
  EXPECT_EQ(d.content, "<tool_call>{oops");
  EXPECT_TRUE(d.tool_calls.is_null());
  EXPECT_FALSE(t.called());

  // Llama 3: leading whitespace is held until a '{' shows a call.
  ToolStream l(ToolSetup{ToolChoice::kAuto, ToolCallFormat::kLlama3Json, "", true}, 1);
  EXPECT_EQ(l.push("\n").content, "");
  EXPECT_EQ(l.push("{\"name\": \"f\", ").content, "");
  l.push("\"parameters\": {\"a\": 2}}");
  Joined lj;
  lj.add(l.finish());
  ASSERT_EQ(lj.calls.size(), 1u);
  EXPECT_EQ(lj.calls[0]["arguments"], R"({"a":2})");
  ToolStream l2(ToolSetup{ToolChoice::kAuto, ToolCallFormat::kLlama3Json, "", true}, 1);
  EXPECT_EQ(l2.push(" ").content, "");
  EXPECT_EQ(l2.push("Hi {x}").content, " Hi {x}");
  EXPECT_EQ(l2.finish().content, "");

  // Named: the arguments stream as they come; the first delta has the id and the name.
  ToolStream n(ToolSetup{ToolChoice::kNamed, ToolCallFormat::kHermes, "get_weather", true}, 3);
  Joined nj;
  d = n.push("{\"city\"");
  EXPECT_EQ(d.tool_calls[0]["function"]["name"], "get_weather");
  EXPECT_EQ(d.tool_calls[0]["id"], tool_call_id(ToolCallFormat::kHermes, 3, 0));
  nj.add(d);
  d = n.push(": \"Oslo\"}");
  EXPECT_FALSE(d.tool_calls[0].contains("id"));
  nj.add(d);
  nj.add(n.finish());
  EXPECT_TRUE(n.called());
  ASSERT_EQ(nj.calls.size(), 1u);
  EXPECT_EQ(nj.calls[0]["arguments"], R"({"city": "Oslo"})");

  // Required, one call.
  ToolStream q(ToolSetup{ToolChoice::kRequired, ToolCallFormat::kHermes, "", false}, 3);
  EXPECT_EQ(q.push(R"({"name": "f", )").content, "");
  q.push(R"("arguments": {"b": true}})");
  Joined qj;
  qj.add(q.finish());
  ASSERT_EQ(qj.calls.size(), 1u);
  EXPECT_EQ(qj.calls[0]["name"], "f");

  // The chunk that carries the deltas.
  ResponseContext ctx;
  ctx.endpoint = Endpoint::Chat;
  const json chunk = tool_calls_chunk(ctx, 2, nj.calls, true);
  EXPECT_EQ(chunk["object"], "chat.completion.chunk");
  EXPECT_EQ(chunk["choices"][0]["index"], 2);
  EXPECT_EQ(chunk["choices"][0]["delta"]["tool_calls"], nj.calls);
  EXPECT_TRUE(chunk["choices"][0]["finish_reason"].is_null());
  EXPECT_TRUE(chunk["usage"].is_null());
}

}  // namespace
}  // namespace fdpp::server
