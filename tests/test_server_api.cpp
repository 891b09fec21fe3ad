// fdpp serve's wire format without sockets: request parsing and validation (src/server/api.h),
// response / SSE chunk shapes, and the Prometheus text (src/server/metrics.h).
#include <gtest/gtest.h>

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

TEST(ServerApi, BadRequestsNameTheField) {
  const auto C = Endpoint::Completions;
  const auto H = Endpoint::Chat;
  EXPECT_EQ(error_of(C, "{not json"), std::make_pair(400, std::string()));
  EXPECT_EQ(error_of(C, "[1, 2]"), std::make_pair(400, std::string()));
  EXPECT_EQ(error_of(C, R"({"max_tokens": 4})"), std::make_pair(400, std::string("prompt")));
  EXPECT_EQ(error_of(H, R"({"max_tokens": 4})"), std::make_pair(400, std::string("messages")));
  EXPECT_EQ(error_of(H, R"({"messages": []})"), std::make_pair(400, std::string("messages")));
  EXPECT_EQ(error_of(H, R"({"messages": "hi"})"), std::make_pair(400, std::string("messages")));
  EXPECT_EQ(error_of(H, R"({"messages": [{"role": "tool", "content": "x"}]})"), std::make_pair(400, std::string("messages[0].role")));
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

TEST(ServerApi, UnsupportedFieldsAreRejectedByName) {
  const auto C = Endpoint::Completions;
  const auto H = Endpoint::Chat;
  const std::string chat = R"("messages": [{"role": "user", "content": "q"}])";
  for (const auto& [field, value] : std::vector<std::pair<std::string, std::string>>{
           {"n", "2"}, {"logprobs", "true"}, {"top_logprobs", "3"}, {"tools", R"([{"type": "function"}])"},
           {"tool_choice", R"("auto")"}, {"response_format", R"({"type": "json_object"})"},
           {"logit_bias", R"({"5": 1})"}, {"presence_penalty", "0.5"}, {"frequency_penalty", "1"},
           {"audio", "{}"}, {"made_up_field", "1"}, {"prompt", R"("x")"}, {"best_of", "1"}})
    EXPECT_EQ(error_of(H, "{" + chat + ", \"" + field + "\": " + value + "}"), std::make_pair(400, field)) << field;
  for (const auto& [field, value] : std::vector<std::pair<std::string, std::string>>{
           {"n", "3"}, {"best_of", "2"}, {"logprobs", "1"}, {"echo", "true"}, {"suffix", R"("end")"},
           {"messages", "[]"}, {"tools", "[]"}})
    EXPECT_EQ(error_of(C, "{\"prompt\": \"a\", \"" + field + "\": " + value + "}"), std::make_pair(400, field)) << field;
  // Off values and bookkeeping fields pass.
  EXPECT_EQ(error_of(H, "{" + chat + R"(, "n": 1, "logprobs": false, "tools": [], "tool_choice": "none",
                 "response_format": {"type": "text"}, "user": "u", "metadata": {"a": "b"}, "store": false,
                 "parallel_tool_calls": true, "frequency_penalty": 0})"),
            std::make_pair(0, std::string("no error")));
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
  EXPECT_EQ(message_of(C, R"({"prompt": "x", "a\nb\u0001": 1})"),
            R"("a\nb\u0001" is not a supported field of /v1/completions)");
  EXPECT_EQ(message_of(H, R"({"messages": [{"role": "us\ner", "content": "q"}]})"),
            R"(messages[0].role "us\ner" is not one of system, developer, user, assistant)");
  EXPECT_EQ(message_of(H, R"({"messages": [{"role": "user", "content": "q", "x\ty": 1}]})"),
            R"(messages[0]: the field "x\ty" is not supported by this server)");
  EXPECT_EQ(message_of(C, R"({"prompt": "x", "stream": true, "stream_options": {"\r": 1}})"),
            R"(stream_options: the field "\r" is not supported)");
  const std::string long_name(5000, 'k');
  for (const std::string& m : {message_of(C, R"({"prompt": "x", "model": ")" + long_name + R"(\n\u00e9"})"),
                               message_of(C, R"({"prompt": "x", ")" + long_name + R"(\u00e9": 1})")}) {
    EXPECT_LT(m.size(), 200u) << m;
    EXPECT_NE(m.find(std::string(40, 'k') + "..."), std::string::npos) << m;
    for (const char c : m) EXPECT_TRUE(c >= 0x20 && c < 0x7f) << m;
  }
  // Invalid JSON: the parser's message quotes the token it stopped in, here a 5000-byte string.
  const std::string m3 = message_of(C, R"({"prompt": ")" + long_name);
  EXPECT_LT(m3.size(), 300u) << m3;
  EXPECT_EQ(m3.rfind("invalid JSON: ", 0), 0u) << m3;
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
  EXPECT_EQ(body["usage"], json({{"prompt_tokens", 3}, {"completion_tokens", 2}, {"total_tokens", 5}}));
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
  json usage = usage_chunk(ctx, 3, 2);
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["total_tokens"], 5);

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
  const GenerationResult both[] = {r, r2};
  body = completion_body(ctx, both);
  ASSERT_EQ(body["choices"].size(), 2u);
  EXPECT_EQ(body["choices"][1]["index"], 1);
  EXPECT_EQ(body["choices"][1]["text"], "b");
  EXPECT_EQ(body["choices"][1]["finish_reason"], "stop");
  EXPECT_EQ(body["choices"][1]["prompt_token_ids"], json({1}));
  EXPECT_EQ(body["usage"], json({{"prompt_tokens", 4}, {"completion_tokens", 5}, {"total_tokens", 9}}));
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
  const std::string text = m.render(s, true);
  for (const char* line :
       {"fdpp_requests_running 2\n", "fdpp_requests_waiting 1\n", "fdpp_kv_blocks_used 5\n", "fdpp_kv_blocks_free 15\n",
        "fdpp_kv_cache_usage_ratio 0.25\n", "fdpp_preemptions_total 4\n", "fdpp_requests_finished_total{finish_reason=\"stop\"} 1\n",
        "fdpp_time_to_first_token_seconds_bucket{le=\"0.04\"} 1\n", "fdpp_time_to_first_token_seconds_bucket{le=\"0.02\"} 0\n",
        "fdpp_time_to_first_token_seconds_count 1\n", "fdpp_inter_token_latency_seconds_count 2\n",
        "fdpp_inter_token_latency_seconds_bucket{le=\"0.01\"} 2\n", "fdpp_http_requests_total{code=\"200\"} 1\n",
        "fdpp_requests_rejected_queue_full_total 1\n", "fdpp_request_prompt_tokens_total 2\n",
        "# TYPE fdpp_time_per_output_token_seconds histogram\n"})
    EXPECT_NE(text.find(line), std::string::npos) << line << "\n" << text;
}

}  // namespace
}  // namespace fdpp::server
