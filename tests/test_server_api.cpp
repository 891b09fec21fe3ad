// fdpp serve's wire format without sockets: request parsing and validation (src/server/api.h),
// response / SSE chunk shapes, and the Prometheus text (src/server/metrics.h).
#include <gtest/gtest.h>

#include "engine/sampler.h"
#include "server/api.h"
#include "server/metrics.h"
#include "server_api_fakes.h"

namespace fdpp::server {
namespace {

using nlohmann::json;

PromptCodec fake_codec() { return fakes::byte_codec(); }
ModelInfo model() { return fakes::tiny_model(); }

ParsedRequest parse(Endpoint e, const std::string& body) {
  ApiLimits limits;
  return parse_request(e, parse_json_body(body, limits), model(), fake_codec(), limits);
}

// The ApiError a body gets: its status and param.
std::pair<int, std::string> error_of(Endpoint e, const std::string& body, ApiLimits limits = {}) {
  try {
    parse_request(e, parse_json_body(body, limits), model(), fake_codec(), limits);
  } catch (const ApiError& err) {
    return {err.status, err.param};
  }
  return {0, "no error"};
}

TEST(ServerApi, CompletionDefaultsFollowOpenAI) {
  ParsedRequest r = parse(Endpoint::Completions, R"({"model": "tiny.gguf", "prompt": "hi"})");
  EXPECT_EQ(r.generation.prompt, (std::vector<int32_t>{'h' + 1, 'i' + 1}));
  EXPECT_EQ(r.generation.max_tokens, 16);  // OpenAI's legacy completions default
  EXPECT_FLOAT_EQ(r.generation.sampling.temperature, 1.0f);
  EXPECT_FLOAT_EQ(r.generation.sampling.top_p, 1.0f);
  EXPECT_EQ(r.generation.sampling.top_k, 0);
  EXPECT_FLOAT_EQ(r.generation.sampling.min_p, 0.0f);
  EXPECT_FLOAT_EQ(r.generation.sampling.repeat_penalty, 1.0f);
  EXPECT_FALSE(r.stream);
  EXPECT_FALSE(r.seed_given);
  EXPECT_FALSE(r.generation.ignore_eos);
}

TEST(ServerApi, CompletionFields) {
  ParsedRequest r = parse(Endpoint::Completions,
                          R"({"prompt": [5, 6, 7], "max_tokens": 8, "temperature": 0, "top_p": 0.5, "top_k": 7,
                              "min_p": 0.1, "repetition_penalty": 1.2, "seed": 42, "stop": ["a", "bc"],
                              "stream": true, "stream_options": {"include_usage": true}, "ignore_eos": true,
                              "user": "u", "n": 1, "echo": false, "logprobs": null, "presence_penalty": 0,
                              "return_token_ids": true, "stop_token_ids": [2, 299]})");
  EXPECT_EQ(r.generation.prompt, (std::vector<int32_t>{5, 6, 7}));
  EXPECT_EQ(r.generation.stop_token_ids, (std::vector<int32_t>{2, 299}));
  EXPECT_EQ(r.generation.max_tokens, 8);
  EXPECT_FLOAT_EQ(r.generation.sampling.temperature, 0.0f);
  EXPECT_FLOAT_EQ(r.generation.sampling.top_p, 0.5f);
  EXPECT_EQ(r.generation.sampling.top_k, 7);
  EXPECT_FLOAT_EQ(r.generation.sampling.min_p, 0.1f);
  EXPECT_FLOAT_EQ(r.generation.sampling.repeat_penalty, 1.2f);
  EXPECT_EQ(r.generation.sampling.repeat_last_n, -1);
  EXPECT_EQ(r.generation.sampling.seed, 42u);
  EXPECT_TRUE(r.seed_given);
  EXPECT_EQ(r.generation.stop, (std::vector<std::string>{"a", "bc"}));
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_TRUE(r.generation.ignore_eos);
  EXPECT_TRUE(r.return_token_ids);
  // A single stop string, top_k -1 as off, a one-element prompt list, the model by its path.
  r = parse(Endpoint::Completions, R"({"prompt": ["ab"], "stop": "x", "top_k": -1, "model": "/models/tiny.gguf"})");
  EXPECT_EQ(r.generation.stop, (std::vector<std::string>{"x"}));
  EXPECT_TRUE(r.generation.stop_token_ids.empty());
  EXPECT_EQ(r.generation.sampling.top_k, 0);
  EXPECT_EQ(r.generation.prompt.size(), 2u);
  EXPECT_TRUE(r.batch.empty());
  // A batch: one request per prompt, the sampling fields shared, max_tokens by default per prompt.
  r = parse(Endpoint::Completions, R"({"prompt": ["ab", [5, 6, 7]], "temperature": 0, "stop": "x"})");
  ASSERT_EQ(r.batch.size(), 2u);
  EXPECT_EQ(r.batch[0].prompt, (std::vector<int32_t>{'a' + 1, 'b' + 1}));
  EXPECT_EQ(r.batch[1].prompt, (std::vector<int32_t>{5, 6, 7}));
  for (const GenerationRequest& g : r.batch) {
    EXPECT_EQ(g.max_tokens, 16);
    EXPECT_FLOAT_EQ(g.sampling.temperature, 0.0f);
    EXPECT_EQ(g.stop, (std::vector<std::string>{"x"}));
  }
  EXPECT_EQ(r.generation.prompt, r.batch[0].prompt);
  // Near the 64-token context the default shrinks for that prompt alone.
  r = parse(Endpoint::Completions, "{\"prompt\": [\"a\", \"" + std::string(60, 'x') + "\"]}");
  ASSERT_EQ(r.batch.size(), 2u);
  EXPECT_EQ(r.batch[0].max_tokens, 16);
  EXPECT_EQ(r.batch[1].max_tokens, 4);
}

TEST(ServerApi, ChatMessagesAndMaxTokens) {
  ParsedRequest r = parse(Endpoint::Chat, R"({"messages": [{"role": "developer", "content": "s"},
                                                           {"role": "user", "content": [{"type": "text", "text": "q"}]}],
                                              "max_completion_tokens": 5, "max_tokens": 9})");
  EXPECT_EQ(r.generation.prompt, fake_codec().encode("system:s;user:q;"));
  EXPECT_EQ(r.generation.max_tokens, 5);  // max_completion_tokens wins
  // Without a limit a chat may use the rest of the context.
  r = parse(Endpoint::Chat, R"({"messages": [{"role": "user", "content": "q"}]})");
  EXPECT_EQ(r.generation.max_tokens, 64 - static_cast<int>(r.generation.prompt.size()));
}

// vLLM's chat_template_kwargs: enable_thinking reaches the chat template (Qwen3), other names are
// ignored and reported, a wrong type is a 400 naming the field; /tokenize takes it too.
TEST(ServerApi, ChatTemplateKwargs) {
  ParsedRequest r = parse(Endpoint::Chat, R"({"messages": [{"role": "user", "content": "q"}],
                                              "chat_template_kwargs": {"enable_thinking": false, "x": 1}})");
  EXPECT_EQ(r.generation.prompt, fake_codec().encode("user:q;thinking:0;"));
  EXPECT_EQ(r.ignored_fields, std::vector<std::string>{"chat_template_kwargs.x"});
  r = parse(Endpoint::Chat, R"({"messages": [{"role": "user", "content": "q"}],
                                "chat_template_kwargs": {"enable_thinking": true}})");
  EXPECT_EQ(r.generation.prompt, fake_codec().encode("user:q;thinking:1;"));
  r = parse(Endpoint::Chat, R"({"messages": [{"role": "user", "content": "q"}], "chat_template_kwargs": {}})");
  EXPECT_EQ(r.generation.prompt, fake_codec().encode("user:q;"));
  EXPECT_TRUE(r.ignored_fields.empty());
  EXPECT_EQ(error_of(Endpoint::Chat, R"({"messages": [{"role": "user", "content": "q"}],
                                        "chat_template_kwargs": {"enable_thinking": "no"}})"),
            (std::pair<int, std::string>{400, "chat_template_kwargs.enable_thinking"}));
  EXPECT_EQ(error_of(Endpoint::Chat, R"({"messages": [{"role": "user", "content": "q"}],
                                        "chat_template_kwargs": [1]})"),
            (std::pair<int, std::string>{400, "chat_template_kwargs"}));
  // A chat field sent to /v1/completions is refused, not ignored.
  EXPECT_EQ(error_of(Endpoint::Completions, R"({"prompt": "q", "chat_template_kwargs": {"enable_thinking": false}})"),
            (std::pair<int, std::string>{400, "chat_template_kwargs"}));
  ApiLimits limits;
  std::vector<std::string> ignored;
  const json t = tokenize_body(json::parse(R"({"messages": [{"role": "user", "content": "q"}],
                                               "chat_template_kwargs": {"enable_thinking": false}})"),
                               model(), fake_codec(), limits, ignored);
  EXPECT_EQ(t["tokens"], json(fake_codec().encode("user:q;thinking:0;")));
  EXPECT_TRUE(ignored.empty());
}

TEST(ServerApi, BadRequestsNameTheField) {
  const auto C = Endpoint::Completions;
  const auto H = Endpoint::Chat;
  EXPECT_EQ(error_of(C, "{not json"), std::make_pair(400, std::string()));
  EXPECT_EQ(error_of(C, "[1, 2]"), std::make_pair(400, std::string()));
  EXPECT_EQ(error_of(C, R"({"max_tokens": 4})"), std::make_pair(400, std::string("prompt")));
  EXPECT_EQ(error_of(H, R"({"max_tokens": 4})"), std::make_pair(400, std::string("messages")));
  EXPECT_EQ(error_of(H, R"({"messages": []})"), std::make_pair(400, std::string("messages")));
  EXPECT_EQ(error_of(H, R"({"messages": "hi"})"), std::make_pair(400, std::string("messages")));
  EXPECT_EQ(error_of(H, R"({"messages": [{"role": "robot", "content": "x"}]})"), std::make_pair(400, std::string("messages[0].role")));
  EXPECT_EQ(error_of(H, R"({"messages": [{"role": "user", "content": 3}]})"), std::make_pair(400, std::string("messages[0].content")));
  EXPECT_EQ(error_of(H, R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})"),
            std::make_pair(400, std::string("messages[0].content[0]")));
  EXPECT_EQ(error_of(C, R"({"prompt": "a", "max_tokens": 0})"), std::make_pair(400, std::string("max_tokens")));
  EXPECT_EQ(error_of(C, R"({"prompt": "a", "max_tokens": -3})"), std::make_pair(400, std::string("max_tokens")));
  EXPECT_EQ(error_of(C, R"({"prompt": "a", "max_tokens": 1.5})"), std::make_pair(400, std::string("max_tokens")));
  EXPECT_EQ(error_of(C, R"({"prompt": "a", "max_tokens": "5"})"), std::make_pair(400, std::string("max_tokens")));
  EXPECT_EQ(error_of(C, R"({"prompt": "a", "max_tokens": 1000000000000})"), std::make_pair(400, std::string("max_tokens")));
  EXPECT_EQ(error_of(C, R"({"prompt": "a", "max_tokens": 64})"), std::make_pair(400, std::string("max_tokens")));  // 1 + 64 > 64
  EXPECT_EQ(error_of(C, R"({"prompt": "a", "max_tokens": 63})"), std::make_pair(0, std::string("no error")));
  EXPECT_EQ(error_of(C, "{\"prompt\": \"" + std::string(64, 'x') + "\"}"), std::make_pair(400, std::string("prompt")));
  EXPECT_EQ(error_of(C, R"({"prompt": "a", "temperature": -0.1})"), std::make_pair(400, std::string("temperature")));
  EXPECT_EQ(error_of(C, R"({"prompt": "a", "temperature": "hot"})"), std::make_pair(400, std::string("temperature")));
  EXPECT_EQ(error_of(C, R"({"prompt": "a", "top_p": 0})"), std::make_pair(400, std::string("top_p")));
  EXPECT_EQ(error_of(C, R"({"prompt": "a", "top_p": 1.5})"), std::make_pair(400, std::string("top_p")));
  EXPECT_EQ(error_of(C, R"({"prompt": "a", "min_p": 2})"), std::make_pair(400, std::string("min_p")));
  EXPECT_EQ(error_of(C, R"({"prompt": "a", "stream": "yes"})"), std::make_pair(400, std::string("stream")));
  EXPECT_EQ(error_of(C, R"({"prompt": "a", "stop": 5})"), std::make_pair(400, std::string("stop")));
  EXPECT_EQ(error_of(C, R"({"prompt": "a", "stop": [""]})"), std::make_pair(400, std::string("stop")));
  EXPECT_EQ(error_of(C, R"({"prompt": "a", "stream_options": {"include_usage": true}})"),
            std::make_pair(400, std::string("stream_options")));
  EXPECT_EQ(error_of(C, R"({"prompt": "a", "model": "gpt-4"})"), std::make_pair(404, std::string("model")));
  EXPECT_EQ(error_of(C, R"({"prompt": [1, 300]})"), std::make_pair(400, std::string("prompt")));
  EXPECT_EQ(error_of(C, R"({"prompt": "a", "stop_token_ids": [300]})"),
            std::make_pair(400, std::string("stop_token_ids")));
  EXPECT_EQ(error_of(C, R"({"prompt": "a", "stop_token_ids": 3})"), std::make_pair(400, std::string("stop_token_ids")));
  EXPECT_EQ(error_of(C, R"({"prompt": "a", "stop_token_ids": [true]})"),
            std::make_pair(400, std::string("stop_token_ids")));
  json many = {{"prompt", "a"}, {"stop_token_ids", std::vector<int>(65, 1)}};
  EXPECT_EQ(error_of(C, many.dump()), std::make_pair(400, std::string("stop_token_ids")));
  many["stop_token_ids"] = std::vector<int>(64, 1);
  EXPECT_EQ(error_of(C, many.dump()), std::make_pair(0, std::string("no error")));
  EXPECT_EQ(error_of(C, R"({"prompt": [1, -1]})"), std::make_pair(400, std::string("prompt")));
  EXPECT_EQ(error_of(C, R"({"prompt": []})"), std::make_pair(400, std::string("prompt")));
  // Batches (lists of prompts): each element checked, streamed too, at most max_prompts.
  EXPECT_EQ(error_of(C, R"({"prompt": ["a", []]})"), std::make_pair(400, std::string("prompt")));
  EXPECT_EQ(error_of(C, R"({"prompt": ["a", 5]})"), std::make_pair(400, std::string("prompt")));
  EXPECT_EQ(error_of(C, R"({"prompt": [[1], [2, 300]]})"), std::make_pair(400, std::string("prompt[1]")));
  EXPECT_EQ(error_of(C, R"({"prompt": ["a", "b"], "stream": true})"), std::make_pair(0, std::string("no error")));
  EXPECT_EQ(error_of(C, "{\"prompt\": [\"a\", \"" + std::string(64, 'x') + "\"]}"),
            std::make_pair(400, std::string("prompt")));
  EXPECT_EQ(error_of(C, R"({"prompt": ["a", "bcd"], "max_tokens": 61})"), std::make_pair(0, std::string("no error")));
  EXPECT_EQ(error_of(C, R"({"prompt": ["a", "bcd"], "max_tokens": 62})"),
            std::make_pair(400, std::string("max_tokens")));
  EXPECT_EQ(error_of(C, json{{"prompt", std::vector<std::string>(65, "a")}}.dump()),
            std::make_pair(400, std::string("prompt")));
  EXPECT_EQ(error_of(C, json{{"prompt", std::vector<std::string>(64, "a")}}.dump()),
            std::make_pair(0, std::string("no error")));
  EXPECT_EQ(error_of(C, R"({"prompt": ""})"), std::make_pair(400, std::string("prompt")));
  // Nesting: 64 levels parse (the error is then the prompt's type); millions, within the body
  // limit, are refused while parsing: printing the parsed value in a message overflowed the stack.
  const auto nested = [](size_t levels) {
    return "{\"prompt\": " + std::string(levels, '[') + std::string(levels, ']') + "}";
  };
  EXPECT_EQ(error_of(C, nested(63)), std::make_pair(400, std::string("prompt[0]")));
  EXPECT_EQ(error_of(C, nested(64)), std::make_pair(400, std::string()));
  EXPECT_EQ(error_of(C, nested(4'000'000)), std::make_pair(400, std::string()));
  try {
    parse_json_body(nested(4'000'000), ApiLimits{});
    ADD_FAILURE() << "no error";
  } catch (const ApiError& err) {
    EXPECT_NE(std::string(err.what()).find("invalid JSON: nests deeper than 64 levels"), std::string::npos)
        << err.what();
  }
  ApiLimits small;
  small.max_body_bytes = 16;
  EXPECT_EQ(error_of(C, R"({"prompt": "aaaaaaaaaaaaaaaaaaaaaaaa"})", small).first, 413);
  small = ApiLimits{};
  small.max_stop_strings = 2;
  EXPECT_EQ(error_of(C, R"({"prompt": "a", "stop": ["a", "b", "c"]})", small), std::make_pair(400, std::string("stop")));
}

// Structured output: each spelling gives the request a grammar; what the engine cannot honour is a
// 400 naming the field and the schema keyword.
TEST(ServerApi, StructuredOutput) {
  const auto H = Endpoint::Chat;
  const std::string chat = R"("messages": [{"role": "user", "content": "q"}])";
  auto grammar_of = [&](const std::string& extra) { return parse(H, "{" + chat + ", " + extra + "}").generation.grammar; };
  EXPECT_EQ(grammar_of(R"("response_format": {"type": "text"})"), nullptr);
  EXPECT_EQ(grammar_of(R"("user": "u")"), nullptr);
  for (const std::string& extra :
       {std::string(R"("response_format": {"type": "json_object"})"),
        std::string(R"("response_format": {"type": "json_schema", "json_schema": {"name": "n", "strict": true,
            "schema": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
            "additionalProperties": false}}})"),
        std::string(R"("guided_json": {"type": "array", "items": {"type": "string"}})"),
        std::string(R"("guided_json": "{\"type\": \"boolean\"}")"),
        std::string(R"("guided_regex": "[0-9]{3}")"), std::string(R"("guided_choice": ["yes", "no"])"),
        std::string(R"("structured_outputs": {"choice": ["a", "b"], "backend": "xgrammar"})"),
        std::string(R"("structured_outputs": {"json_object": true})")}) {
    const auto g = grammar_of(extra);
    EXPECT_NE(g, nullptr) << extra;
  }
  // The grammar is the one asked for: a json_schema whose properties keep the body's order.
  const auto parsed = parse_request(H, parse_json_body("{" + chat + R"(, "guided_json": {"type": "object",
      "properties": {"zeta": {"type": "integer"}, "alpha": {"type": "integer"}}, "required": ["zeta", "alpha"],
      "additionalProperties": false}})", ApiLimits{}), model(), fake_codec(), ApiLimits{},
      "{" + chat + R"(, "guided_json": {"type": "object", "properties": {"zeta": {"type": "integer"},
      "alpha": {"type": "integer"}}, "required": ["zeta", "alpha"], "additionalProperties": false}})");
  const auto vocab = std::make_shared<grammar::TokenVocabulary>(std::vector<std::string>{"{\"zeta\":1,\"alpha\":2}", "{\"alpha\":2,\"zeta\":1}", ""},
                                                                 std::vector<int32_t>{2});
  grammar::GrammarMatcher m(parsed.generation.grammar, vocab);
  EXPECT_TRUE(m.is_allowed(0));
  EXPECT_FALSE(m.is_allowed(1));

  const std::vector<std::tuple<std::string, std::string, std::string>> bad = {
      {R"("response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "integer", "minimum": 1}}})",
       "response_format", "\"minimum\""},
      {R"("response_format": {"type": "json_schema"})", "response_format", "json_schema"},
      {R"("guided_json": {"type": "string", "format": "hostname"})", "guided_json", "hostname"},
      {R"("guided_regex": "(a)\\1")", "guided_regex", "escape"},
      {R"("guided_choice": [])", "guided_choice", "non-empty"},
      {R"("guided_grammar": "root ::= \"a\"")", "guided_grammar", "not supported"},
      {R"("structured_outputs": {"grammar": "x"})", "structured_outputs.grammar", "not supported"},
      {R"("guided_regex": "a", "guided_choice": ["a"])", "guided_choice", "one structured output"},
  };
  for (const auto& [extra, param, words] : bad) {
    try {
      parse(H, "{" + chat + ", " + extra + "}");
      ADD_FAILURE() << extra << " was accepted";
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400) << extra;
      EXPECT_EQ(e.param, param) << extra;
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  }
}

TEST(ServerApi, UnsupportedFieldsAreRejectedByName) {
  const auto C = Endpoint::Completions;
  const auto H = Endpoint::Chat;
  const std::string chat = R"("messages": [{"role": "user", "content": "q"}])";
  for (const auto& [field, value] : std::vector<std::pair<std::string, std::string>>{
           {"n", "0"}, {"top_logprobs", "3"}, {"tools", R"({"type": "function"})"},
           {"tool_choice", R"("required")"}, {"response_format", R"({"type": "json_xml"})"},
           {"logit_bias", R"({"5": 101})"}, {"logit_bias", R"({"x": 1})"}, {"logit_bias", R"({"300": 1})"},
           {"logit_bias", "[1]"}, {"presence_penalty", "2.5"}, {"frequency_penalty", "-3"},
           {"audio", "{}"}, {"prompt", R"("x")"}, {"best_of", "2"}, {"min_tokens", "-1"},
           {"skip_special_tokens", "0"}, {"add_special_tokens", "true"}, {"echo", "true"}, {"prompt_logprobs", "21"}})
    EXPECT_EQ(error_of(H, "{" + chat + ", \"" + field + "\": " + value + "}"), std::make_pair(400, field)) << field;
  for (const auto& [field, value] : std::vector<std::pair<std::string, std::string>>{
           {"n", "65"}, {"best_of", "2"}, {"logprobs", "21"}, {"logprobs", "true"}, {"suffix", R"("end")"},
           {"messages", "[]"}, {"tools", "[]"}, {"min_tokens", "17"}, {"skip_special_tokens", "\"no\""},
           {"include_stop_str_in_output", "true"}, {"use_beam_search", "true"}, {"best_of", "1.0"},
           {"add_special_tokens", "1"}})
    EXPECT_EQ(error_of(C, "{\"prompt\": \"a\", \"" + field + "\": " + value + "}"), std::make_pair(400, field)) << field;
  // echo with logprobs scores the prompt, but not when streaming: refused by name.
  EXPECT_EQ(error_of(C, R"({"prompt": "a", "echo": true, "logprobs": 1, "stream": true})"),
            std::make_pair(400, std::string("echo")));
  // top_logprobs without "logprobs": true.
  EXPECT_EQ(error_of(H, "{" + chat + R"(, "top_logprobs": 2, "logprobs": false})"),
            std::make_pair(400, std::string("top_logprobs")));
  // Off values and bookkeeping fields pass.
  EXPECT_EQ(error_of(H, "{" + chat + R"(, "n": 1, "logprobs": false, "tools": [], "tool_choice": "none",
                 "response_format": {"type": "text"}, "user": "u", "metadata": {"a": "b"}, "store": false,
                 "parallel_tool_calls": true, "frequency_penalty": 0})"),
            std::make_pair(0, std::string("no error")));
  // vLLM's and llama-server's extension fields at the values that mean what this server does.
  EXPECT_EQ(error_of(H, "{" + chat + R"(, "best_of": 1, "echo": false, "min_tokens": 0, "skip_special_tokens": true,
                 "tool_choice": "auto", "add_special_tokens": false, "use_beam_search": false,
                 "include_stop_str_in_output": false, "spaces_between_special_tokens": true})"),
            std::make_pair(0, std::string("no error")));
  EXPECT_EQ(error_of(C, R"({"prompt": "a", "best_of": 1, "echo": false, "min_tokens": 0, "add_special_tokens": true})"),
            std::make_pair(0, std::string("no error")));
  EXPECT_TRUE(parse(C, R"({"prompt": "a"})").generation.skip_special_tokens);
  // llama-server's spellings of the repetition penalty and its window.
  const ParsedRequest llama = parse(C, R"({"prompt": "a", "repeat_penalty": 1.3, "repeat_last_n": 64, "cache_prompt": true})");
  EXPECT_FLOAT_EQ(llama.generation.sampling.repeat_penalty, 1.3f);
  EXPECT_EQ(llama.generation.sampling.repeat_last_n, 64);
  EXPECT_TRUE(llama.ignored_fields.empty());
  EXPECT_EQ(parse(C, R"({"prompt": "a"})").generation.sampling.repeat_last_n, -1);
  EXPECT_EQ(error_of(C, R"({"prompt": "a", "repeat_penalty": 1.3, "repetition_penalty": 1.1})"),
            std::make_pair(400, std::string("repeat_penalty")));
  EXPECT_EQ(error_of(C, R"({"prompt": "a", "cache_prompt": 1})"), std::make_pair(400, std::string("cache_prompt")));
  EXPECT_FALSE(parse(C, R"({"prompt": "a", "skip_special_tokens": false})").generation.skip_special_tokens);
}

// Fields the server does not know are ignored and named (vLLM's behaviour), never refused; the names
// go into a header, so they are made one bounded line of visible ASCII there.
TEST(ServerApi, UnknownFieldsAreIgnoredAndNamed) {
  ParsedRequest r = parse(Endpoint::Chat, R"({"messages": [{"role": "user", "content": "q"}], "made_up": 1,
                          "chat_template_kwargs": {"enable_thinking": false, "other": 1}, "n_probs": 0,
                          "max_tokens": 2, "stream": true, "stream_options": {"include_usage": true, "extra": 1}})");
  EXPECT_EQ(r.ignored_fields, (std::vector<std::string>{"made_up", "n_probs", "stream_options.extra",
                                                        "chat_template_kwargs.other"}));
  EXPECT_EQ(r.generation.max_tokens, 2);
  EXPECT_TRUE(r.include_usage);
  EXPECT_EQ(join_fields(r.ignored_fields), "made_up,n_probs,stream_options.extra,chat_template_kwargs.other");
  EXPECT_TRUE(parse(Endpoint::Completions, R"({"prompt": "a"})").ignored_fields.empty());
  // Known fields keep their checks: a mistyped value of one is still a 400.
  EXPECT_EQ(error_of(Endpoint::Completions, R"({"prompt": "a", "made_up": 1, "top_p": "x"})"),
            std::make_pair(400, std::string("top_p")));
  EXPECT_EQ(join_fields({"a\nb\x01", "c,d", std::string(5000, 'k')}), "a?b?,c?d," + std::string(64, 'k'));
  std::vector<std::string> many(100, "x");
  const std::string joined = join_fields(many);
  EXPECT_LT(joined.size(), 120u);
  EXPECT_NE(joined.find("(68 more)"), std::string::npos) << joined;
  // add_special_tokens false leaves out what encode_plain leaves out (here: the codec's marker).
  ApiLimits limits;
  PromptCodec codec = fake_codec();
  codec.encode_plain = [](std::string_view text) { return std::vector<int32_t>(text.size(), 7); };
  const ParsedRequest plain = parse_request(Endpoint::Completions,
                                            json::parse(R"({"prompt": "ab", "add_special_tokens": false})"), model(),
                                            codec, limits);
  EXPECT_EQ(plain.generation.prompt, (std::vector<int32_t>{7, 7}));
}

// Names and values from the request that an error message quotes are shown as json_show writes them:
// one line, ASCII, short. A key with a newline once split the message (found by
// fuzz/api_request_fuzz.cpp).
TEST(ServerApi, QuotedRequestTextIsOneBoundedLine) {
  auto message_of = [](Endpoint e, const std::string& body) -> std::string {
    try {
      parse(e, body);
    } catch (const ApiError& err) {
      return err.what();
    }
    return "no error";
  };
  const auto C = Endpoint::Completions;
  const auto H = Endpoint::Chat;
  EXPECT_EQ(message_of(C, R"({"prompt": "x", "tools": 1, "a\nb\u0001": 1})"),
            R"("tools" is a field of /v1/chat/completions, not of /v1/completions)");
  EXPECT_EQ(message_of(H, R"({"messages": [{"role": "us\ner", "content": "q"}]})"),
            R"(messages[0].role "us\ner" is not one of system, developer, user, assistant, tool)");
  EXPECT_EQ(message_of(H, R"({"messages": [{"role": "user", "content": "q", "x\ty": 1}]})"),
            R"(messages[0]: the field "x\ty" is not supported by this server)");
  const std::string long_name(5000, 'k');
  for (const std::string& m : {message_of(C, R"({"prompt": "x", "model": ")" + long_name + R"(\n\u00e9"})"),
                               message_of(C, R"({"prompt": "x", "top_k": ")" + long_name + R"(\u00e9"})")}) {
    EXPECT_LT(m.size(), 200u) << m;
    EXPECT_NE(m.find(std::string(40, 'k') + "..."), std::string::npos) << m;
    for (const char c : m) EXPECT_TRUE(c >= 0x20 && c < 0x7f) << m;
  }
  // Invalid JSON: the parser's message quotes the token it stopped in, here a 5000-byte string.
  const std::string m3 = message_of(C, R"({"prompt": ")" + long_name);
  EXPECT_LT(m3.size(), 300u) << m3;
  EXPECT_EQ(m3.rfind("invalid JSON: ", 0), 0u) << m3;
}

TEST(ServerApi, SamplingFieldsAndChoices) {
  const std::string chat = R"("messages": [{"role": "user", "content": "q"}])";
  ParsedRequest r = parse(Endpoint::Chat, "{" + chat + R"(, "presence_penalty": -1.5, "frequency_penalty": 2,
                              "logit_bias": {"5": -100, "17": 2.5}, "min_tokens": 3, "logprobs": true,
                              "top_logprobs": 4, "max_tokens": 9})");
  const SamplingParams& s = r.generation.sampling;
  EXPECT_FLOAT_EQ(s.presence_penalty, -1.5f);
  EXPECT_FLOAT_EQ(s.frequency_penalty, 2.f);
  ASSERT_EQ(s.logit_bias.size(), 2u);
  EXPECT_EQ(s.logit_bias[0].id + s.logit_bias[1].id, 22);
  EXPECT_EQ(s.min_tokens, 3);
  EXPECT_EQ(s.logprobs, 4);
  EXPECT_EQ(r.logprobs, 4);
  EXPECT_TRUE(r.batch.empty());
  EXPECT_EQ(parse(Endpoint::Chat, "{" + chat + R"(, "logprobs": true})").generation.sampling.logprobs, 0);
  EXPECT_EQ(parse(Endpoint::Chat, "{" + chat + R"(, "logprobs": false, "top_logprobs": 0})").generation.sampling.logprobs, -1);
  EXPECT_EQ(parse(Endpoint::Completions, R"({"prompt": "a", "logprobs": 2})").generation.sampling.logprobs, 2);
  EXPECT_EQ(parse(Endpoint::Completions, R"({"prompt": "a"})").generation.sampling.logprobs, -1);
  // n choices per prompt: choice i * n + j answers prompt i; a seeded request derives the others' seeds.
  r = parse(Endpoint::Completions, R"({"prompt": ["ab", "c"], "n": 3, "best_of": 3, "seed": 7})");
  ASSERT_EQ(r.batch.size(), 6u);
  EXPECT_EQ(r.n, 3);
  for (int j = 0; j < 3; ++j) {
    EXPECT_EQ(r.batch[j].prompt, (std::vector<int32_t>{'a' + 1, 'b' + 1}));
    EXPECT_EQ(r.batch[3 + j].prompt, (std::vector<int32_t>{'c' + 1}));
    EXPECT_EQ(r.batch[j].sampling.seed, j == 0 ? 7u : derived_seed(7, j));
    EXPECT_EQ(r.batch[3 + j].sampling.seed, r.batch[j].sampling.seed);
  }
  r = parse(Endpoint::Chat, "{" + chat + R"(, "n": 2})");
  EXPECT_EQ(r.batch.size(), 2u);
  // echo: the prompts' text in front (ids decoded by the codec); refused in chat.
  r = parse(Endpoint::Completions, R"({"prompt": ["ab", "c"], "echo": true})");
  EXPECT_TRUE(r.echo);
  EXPECT_EQ(r.echo_texts, (std::vector<std::string>{"ab", "c"}));
}

TEST(ServerApi, LogprobsShapes) {
  ResponseContext ctx;
  ctx.endpoint = Endpoint::Chat;
  ctx.logprobs = 2;
  ctx.token_bytes = [](int32_t id) { return id == 9 ? std::string("\xc3") : std::string(1, static_cast<char>('a' + id)); };
  GenerationResult r;
  r.prompt = {1, 2};
  r.token_ids = {0, 1};
  r.text = "ab";
  r.finish_reason = "length";
  r.logprobs = {{-0.5f, 1, {{0, -0.5f}, {2, -1.5f}}}, {-2.f, 3, {{4, -0.25f}, {9, -INFINITY}}}};
  json body = completion_body(ctx, r);
  const json& content = body["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 2u);
  EXPECT_EQ(content[0]["token"], "a");
  EXPECT_DOUBLE_EQ(content[0]["logprob"].get<double>(), -0.5);
  EXPECT_EQ(content[0]["bytes"], json({97}));
  EXPECT_EQ(content[0]["top_logprobs"][1], json({{"token", "c"}, {"logprob", -1.5}, {"bytes", json({99})}}));
  EXPECT_EQ(content[1]["top_logprobs"][1]["logprob"], -9999.0);  // -inf, as vLLM writes it
  EXPECT_EQ(content[1]["top_logprobs"][1]["bytes"], json({0xc3}));
  // Completions: tokens, token_logprobs, top_logprobs as {token: logprob}, text_offset after the echo.
  ctx.endpoint = Endpoint::Completions;
  ctx.echo_texts = {"hé"};
  body = completion_body(ctx, r);
  EXPECT_EQ(body["choices"][0]["text"], "héab");
  const json& lp = body["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"], json({"a", "b"}));
  EXPECT_EQ(lp["token_logprobs"], json({-0.5, -2.0}));
  EXPECT_EQ(lp["top_logprobs"][0], json({{"a", -0.5}, {"c", -1.5}}));
  EXPECT_EQ(lp["text_offset"], json({2, 3}));  // characters: "hé" is 2
  // n = 2: the prompt counts once in the usage.
  ctx.n = 2;
  ctx.echo_texts.clear();
  const GenerationResult two[] = {r, r};
  body = completion_body(ctx, two);
  EXPECT_EQ(body["usage"]["prompt_tokens"], 2);
  EXPECT_EQ(body["usage"]["completion_tokens"], 4);
  EXPECT_EQ(body["choices"][1]["index"], 1);
  // Streamed: a chunk's logprobs are its tokens', text_offset continuing.
  size_t offset = 5;
  const int32_t toks[] = {1};
  json chunk = stream_chunk(ctx, 1, "b", toks, "", false, false, std::span<const TokenLogprobs>(&r.logprobs[1], 1), &offset);
  EXPECT_EQ(chunk["choices"][0]["logprobs"]["text_offset"], json({5}));
  EXPECT_EQ(offset, 6u);
  ctx.logprobs = -1;
  EXPECT_TRUE(completion_body(ctx, r)["choices"][0]["logprobs"].is_null());
}

// vLLM's prompt_logprobs: parsed for both endpoints (refused when streaming), the prompt scored with
// the larger of it and echo's logprobs, and answered per completions choice or once beside chat's.
TEST(ServerApi, PromptLogprobsInVllmShape) {
  const auto C = Endpoint::Completions;
  const auto H = Endpoint::Chat;
  ParsedRequest p = parse(C, R"({"prompt": "ab", "prompt_logprobs": 2})");
  EXPECT_EQ(p.prompt_logprobs, 2);
  EXPECT_EQ(p.generation.prompt_logprobs, 2);
  EXPECT_EQ(p.logprobs, -1);
  p = parse(C, R"({"prompt": "ab", "prompt_logprobs": 1, "echo": true, "logprobs": 3})");
  EXPECT_EQ(p.generation.prompt_logprobs, 3);
  p = parse(H, R"({"messages": [{"role": "user", "content": "q"}], "prompt_logprobs": 0})");
  EXPECT_EQ(p.generation.prompt_logprobs, 0);
  EXPECT_EQ(parse(C, R"({"prompt": "ab", "prompt_logprobs": null})").generation.prompt_logprobs, -1);
  EXPECT_EQ(error_of(C, R"({"prompt": "a", "prompt_logprobs": 1, "stream": true})"),
            std::make_pair(400, std::string("prompt_logprobs")));

  ResponseContext ctx;
  ctx.endpoint = C;
  ctx.prompt_logprobs = 1;
  ctx.token_bytes = [](int32_t id) { return std::string(1, static_cast<char>('a' + id)); };
  GenerationResult r;
  r.prompt = {1, 2, 3};
  r.token_ids = {4};
  r.finish_reason = "length";
  // Scored with k = 2 (another field asked more): each position shows its token and the top 1.
  r.prompt_logprobs.resize(2);
  r.prompt_logprobs[0] = {-0.5f, 1, {{2, -0.5f}, {7, -1.5f}}};
  r.prompt_logprobs[1] = {-3.0f, 4, {{0, -0.1f}, {5, -2.0f}}};
  const json expected = json::array(
      {nullptr,
       {{"2", {{"logprob", -0.5}, {"rank", 1}, {"decoded_token", "c"}}}},
       {{"3", {{"logprob", -3.0}, {"rank", 4}, {"decoded_token", "d"}}},
        {"0", {{"logprob", -0.1f}, {"rank", 1}, {"decoded_token", "a"}}}}});
  json body = completion_body(ctx, r);
  EXPECT_EQ(body["choices"][0]["prompt_logprobs"], expected) << body.dump();
  EXPECT_FALSE(body.contains("prompt_logprobs"));
  ctx.endpoint = H;
  body = completion_body(ctx, r);
  EXPECT_EQ(body["prompt_logprobs"], expected) << body.dump();
  EXPECT_FALSE(body["choices"][0].contains("prompt_logprobs"));
  ctx.prompt_logprobs = -1;
  EXPECT_FALSE(completion_body(ctx, r).contains("prompt_logprobs"));
}

TEST(ServerApi, ResponseShapes) {
  ResponseContext ctx;
  ctx.endpoint = Endpoint::Chat;
  ctx.id = response_id(Endpoint::Chat, 7);
  ctx.created = 123;
  ctx.model = "tiny.gguf";
  GenerationResult r;
  r.prompt = {1, 2, 3};
  r.token_ids = {4, 5};
  r.text = "hé";
  r.finish_reason = "length";
  json body = completion_body(ctx, r);
  EXPECT_EQ(body["id"], "chatcmpl-0000000000000007");
  EXPECT_EQ(body["object"], "chat.completion");
  EXPECT_EQ(body["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(body["choices"][0]["message"]["content"], "hé");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(body["usage"], json({{"prompt_tokens", 3},
                                 {"completion_tokens", 2},
                                 {"total_tokens", 5},
                                 {"prompt_tokens_details", {{"cached_tokens", 0}}}}));
  EXPECT_FALSE(body["choices"][0].contains("token_ids"));

  json first = stream_chunk(ctx, 0, "", {}, "", true, true);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"], json({{"role", "assistant"}, {"content", ""}}));
  EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
  EXPECT_TRUE(first.contains("usage") && first["usage"].is_null());
  json last = stream_chunk(ctx, 0, "", {}, "stop", false, false);
  EXPECT_EQ(last["choices"][0]["delta"], json::object());
  EXPECT_EQ(last["choices"][0]["finish_reason"], "stop");
  EXPECT_FALSE(last.contains("usage"));
  json usage = usage_chunk(ctx, 3, 2, 1);
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["total_tokens"], 5);
  EXPECT_EQ(usage["usage"]["prompt_tokens_details"]["cached_tokens"], 1);

  ctx.endpoint = Endpoint::Completions;
  ctx.return_token_ids = true;
  body = completion_body(ctx, r);
  EXPECT_EQ(body["object"], "text_completion");
  EXPECT_EQ(body["choices"][0]["text"], "hé");
  EXPECT_EQ(body["choices"][0]["token_ids"], json({4, 5}));
  // A batch: a choice per result in order, usage summed.
  GenerationResult r2 = r;
  r2.prompt = {1};
  r2.token_ids = {6, 7, 8};
  r2.text = "b";
  r2.finish_reason = "stop";
  r.cached_tokens = 2;  // prefix-cached prompt tokens are summed too
  const GenerationResult both[] = {r, r2};
  body = completion_body(ctx, both);
  ASSERT_EQ(body["choices"].size(), 2u);
  EXPECT_EQ(body["choices"][1]["index"], 1);
  EXPECT_EQ(body["choices"][1]["text"], "b");
  EXPECT_EQ(body["choices"][1]["finish_reason"], "stop");
  EXPECT_EQ(body["choices"][1]["prompt_token_ids"], json({1}));
  EXPECT_EQ(body["usage"], json({{"prompt_tokens", 4},
                                 {"completion_tokens", 5},
                                 {"total_tokens", 9},
                                 {"prompt_tokens_details", {{"cached_tokens", 2}}}}));
  const int32_t toks[] = {9};
  json chunk = stream_chunk(ctx, 1, "x", toks, "", false, false);  // prompt 1 of a streamed batch
  EXPECT_EQ(chunk["choices"][0]["index"], 1);
  EXPECT_EQ(chunk["choices"][0]["text"], "x");
  EXPECT_EQ(chunk["choices"][0]["token_ids"], json({9}));

  EXPECT_EQ(sse_done(), "data: [DONE]\n\n");
  const std::string ev = sse_event(json{{"a", 1}});
  EXPECT_EQ(ev, "data: {\"a\":1}\n\n");
  // A model can emit invalid UTF-8: replaced, never thrown.
  EXPECT_NO_THROW(sse_event(json{{"t", std::string("\xff\xfe")}}));

  const json err = error_body(ApiError(400, "bad thing", "max_tokens"));
  EXPECT_EQ(err["error"]["message"], "bad thing");
  EXPECT_EQ(err["error"]["type"], "invalid_request_error");
  EXPECT_EQ(err["error"]["param"], "max_tokens");
  EXPECT_TRUE(err["error"]["code"].is_null());
  EXPECT_EQ(models_body(model())["data"][0]["id"], "tiny.gguf");
}

TEST(ServerMetrics, PrometheusText) {
  Metrics m;
  GenerationResult r;
  r.prompt = {1, 2};
  r.token_ids = {3, 4, 5};
  r.finish_reason = "stop";
  r.time_to_first_token = 0.03;
  r.total_time = 0.5;
  m.observe_finished(r);
  m.observe_inter_token(0.02, 2);
  m.count_http(200);
  m.count_rejected_queue_full();
  SchedulerStats s;
  s.running = 2;
  s.waiting = 1;
  s.kv_blocks_used = 5;
  s.kv_blocks_free = 15;
  s.preemptions = 4;
  s.prefix_cache_queries = 40;
  s.prefix_cache_hits = 30;
  s.prefix_cache_evictions = 3;
  s.kv_blocks_cached = 6;
  const std::string text = m.render(s, true);
  for (const char* line :
       {"fdpp_requests_running 2\n", "fdpp_requests_waiting 1\n", "fdpp_kv_blocks_used 5\n", "fdpp_kv_blocks_free 15\n",
        "fdpp_kv_cache_usage_ratio 0.25\n", "fdpp_preemptions_total 4\n", "fdpp_requests_finished_total{finish_reason=\"stop\"} 1\n",
        "fdpp_time_to_first_token_seconds_bucket{le=\"0.04\"} 1\n", "fdpp_time_to_first_token_seconds_bucket{le=\"0.02\"} 0\n",
        "fdpp_time_to_first_token_seconds_count 1\n", "fdpp_inter_token_latency_seconds_count 2\n",
        "fdpp_inter_token_latency_seconds_bucket{le=\"0.01\"} 2\n", "fdpp_http_requests_total{code=\"200\"} 1\n",
        "fdpp_requests_rejected_queue_full_total 1\n", "fdpp_request_prompt_tokens_total 2\n",
        "# TYPE fdpp_time_per_output_token_seconds histogram\n", "fdpp_prefix_cache_queries_total 40\n",
        "fdpp_prefix_cache_hits_total 30\n", "fdpp_prefix_cache_hit_rate 0.75\n", "fdpp_prefix_cache_evictions_total 3\n",
        "fdpp_kv_blocks_cached 6\n"})
    EXPECT_NE(text.find(line), std::string::npos) << line << "\n" << text;
}

TEST(ServerApi, ModelByIdAndAlias) {
  EXPECT_EQ(model_body(model(), "tiny.gguf")["id"], "tiny.gguf");
  EXPECT_EQ(model_body(model(), "/models/tiny.gguf")["object"], "model");
  try {
    model_body(model(), "gpt-4o");
    ADD_FAILURE() << "no error";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 404);
    EXPECT_EQ(error_body(e)["error"]["code"], "model_not_found");
  }
}

// vLLM's /tokenize and /detokenize: a prompt or a chat to ids and back; every bad body a 400 naming
// the field.
TEST(ServerApi, TokenizeAndDetokenize) {
  ApiLimits limits;
  PromptCodec codec = fake_codec();
  codec.encode_plain = [](std::string_view text) { return std::vector<int32_t>(text.size(), 7); };
  codec.decode = [](std::span<const int32_t> ids) {
    std::string s;
    for (int32_t id : ids) s += static_cast<char>(id - 1);
    return s;
  };
  std::vector<std::string> ignored;
  json t = tokenize_body(json::parse(R"({"prompt": "hi", "extra": 1})"), model(), codec, limits, ignored);
  EXPECT_EQ(t["tokens"], json::array({'h' + 1, 'i' + 1}));
  EXPECT_EQ(t["count"], 2);
  EXPECT_EQ(t["max_model_len"], 64);
  EXPECT_EQ(ignored, std::vector<std::string>{"extra"});
  t = tokenize_body(json::parse(R"({"prompt": "hi", "add_special_tokens": false})"), model(), codec, limits, ignored);
  EXPECT_EQ(t["tokens"], json::array({7, 7}));
  t = tokenize_body(json::parse(R"({"messages": [{"role": "user", "content": "q"}]})"), model(), codec, limits, ignored);
  EXPECT_EQ(t["count"], std::string("user:q;").size());
  ignored.clear();
  EXPECT_EQ(detokenize_body(json::parse(R"({"tokens": [105, 106]})"), model(), codec, ignored)["prompt"], "hi");
  EXPECT_EQ(detokenize_body(json::parse(R"({"tokens": []})"), model(), codec, ignored)["prompt"], "");
  EXPECT_TRUE(ignored.empty());
  auto tokenize_error = [&](const std::string& body) -> std::pair<int, std::string> {
    try {
      tokenize_body(json::parse(body), model(), codec, limits, ignored);
    } catch (const ApiError& e) {
      return {e.status, e.param};
    }
    return {0, "no error"};
  };
  auto detokenize_error = [&](const std::string& body) -> std::pair<int, std::string> {
    try {
      detokenize_body(json::parse(body), model(), codec, ignored);
    } catch (const ApiError& e) {
      return {e.status, e.param};
    }
    return {0, "no error"};
  };
  EXPECT_EQ(tokenize_error("{}"), std::make_pair(400, std::string("prompt")));
  EXPECT_EQ(tokenize_error(R"({"prompt": 5})"), std::make_pair(400, std::string("prompt")));
  EXPECT_EQ(tokenize_error(R"({"prompt": "a", "messages": []})"), std::make_pair(400, std::string("messages")));
  EXPECT_EQ(tokenize_error(R"({"messages": "a"})"), std::make_pair(400, std::string("messages")));
  EXPECT_EQ(tokenize_error(R"({"prompt": "a", "add_special_tokens": "yes"})"),
            std::make_pair(400, std::string("add_special_tokens")));
  EXPECT_EQ(tokenize_error(R"({"prompt": "a", "model": "other"})"), std::make_pair(404, std::string("model")));
  EXPECT_EQ(detokenize_error("{}"), std::make_pair(400, std::string("tokens")));
  EXPECT_EQ(detokenize_error(R"({"tokens": "ab"})"), std::make_pair(400, std::string("tokens")));
  EXPECT_EQ(detokenize_error(R"({"tokens": [300]})"), std::make_pair(400, std::string("tokens")));
  EXPECT_EQ(detokenize_error(R"({"tokens": [-1]})"), std::make_pair(400, std::string("tokens")));
  EXPECT_EQ(detokenize_error(R"({"tokens": [1.5]})"), std::make_pair(400, std::string("tokens")));
  EXPECT_EQ(detokenize_error(R"({"tokens": [18446744073709551615]})"), std::make_pair(400, std::string("tokens")));
}

TEST(ServerApi, LogLines) {
  SchedulerStats before, now;
  EXPECT_EQ(throughput_line(before, now, 10), "");  // idle: quiet
  now.prompt_tokens = 200;
  now.generated_tokens = 50;
  now.running = 3;
  now.waiting = 1;
  now.kv_blocks_used = 25;
  now.kv_blocks_free = 75;
  EXPECT_EQ(throughput_line(before, now, 10),
            "prompt throughput: 20.0 tokens/s, generation throughput: 5.0 tokens/s, running: 3 reqs, waiting: 1 reqs, "
            "KV cache usage: 25.0%");
  now.prefix_cache_queries = 200;  // the interval's prefix cache hit rate joins the line
  now.prefix_cache_hits = 150;
  EXPECT_EQ(throughput_line(before, now, 10),
            "prompt throughput: 20.0 tokens/s, generation throughput: 5.0 tokens/s, running: 3 reqs, waiting: 1 reqs, "
            "KV cache usage: 25.0%, prefix cache hit rate: 75.0%");
  GenerationResult r;
  r.prompt = {1, 2, 3};
  r.token_ids = {4, 5};
  r.finish_reason = "length";
  r.total_time = 0.25;
  EXPECT_EQ(request_line("cmpl-1", r), "request cmpl-1: prompt 3 tokens, output 2 tokens, finish length, 0.250 s");
}

}  // namespace
}  // namespace fdpp::server
