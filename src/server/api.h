// The OpenAI wire format, apart from sockets (llama-server keeps the same split: utils/formatting
// vs. the HTTP routes): request bodies of /v1/completions and /v1/chat/completions parsed and
// validated into a GenerationRequest, and the response bodies and server-sent-event chunks built
// from scheduler results. Everything here is a pure function of its inputs, so
// tests/test_server_api.cpp checks it without a server.
//
// Validation policy: a field this server knows and does not implement is rejected by name (400,
// param = the field) unless it is set to the value that means "off" (functions = [], best_of other than
// n, echo in chat, response_format text, ...), since ignoring it silently
// would return something else than the client asked for. A field it does not know at all is
// ignored and reported (ParsedRequest::ignored_fields: a warning in the server's log and the
// x-fdpp-ignored-fields header), as vLLM does: clients written for vLLM, llama-server or newer
// OpenAI versions send extension fields, and refusing them would break those clients outright.
// JSON null means "absent", as the OpenAI clients send it.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "engine/scheduler.h"
#include "server/tools.h"
#include "tokenizer/tokenizer.h"

namespace fdpp::server {

// Limits on what a client may ask for; each is checked before anything is allocated from it.
struct ApiLimits {
  int64_t max_body_bytes = 8 << 20;    // 8 MiB: more than a 128K-token prompt as text or as ids
  int max_messages = 4096;             // chat messages in one request
  // The scheduler's bounds (OpenAI allows 4 stop strings); each is matched every token. The messages
  // are the table of request limits' (engine/request_limits.h), with these limits.
  int max_stop_strings = static_cast<int>(kMaxStopStrings);
  int max_stop_bytes = static_cast<int>(kMaxStopBytes);  // bytes of one stop string
  int max_stop_token_ids = static_cast<int>(kMaxStopTokenIds);
  int max_prompts = 64;                // prompts in one /v1/completions request (a batch)
};

// An error in OpenAI's shape: {"error": {"message", "type", "param", "code"}} with an HTTP status.
class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string param = {}, std::string type = {}, std::string code = {});
  int status;
  std::string param;  // the request field at fault ("" -> null)
  std::string type;   // invalid_request_error, authentication_error, not_found_error, ...
  std::string code;   // "" -> null
};
nlohmann::json error_body(const ApiError& e);
// A 400 invalid_request_error naming the request field at fault.
ApiError bad_request(std::string param, std::string message, std::string code = {});
// The field `key` of a request body when present and not null, else null (json or ordered_json).
template <class J>
const J* present_field(const J& body, const char* key) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

// What the server serves: the id clients name it by (the file or directory name), and the other
// names accepted for it (the path as given and as resolved).
struct ModelInfo {
  std::string id;
  std::vector<std::string> aliases;
  int max_context = 0;      // tokens per sequence (prompt + generated)
  int32_t vocab_size = 0;
  int64_t created = 0;      // unix time the server started
};
nlohmann::json models_body(const ModelInfo& model);
// One model object (GET /v1/models/{id}); a name other than the id or an alias is a 404.
nlohmann::json model_body(const ModelInfo& model, const std::string& name);

// Turns text and conversations into token ids. The server wires these to the model's Tokenizer
// (prompt_codec_for); tests pass fakes.
struct PromptCodec {
  std::function<std::vector<int32_t>(std::string_view text)> encode;
  // The bytes of one token (logprobs' "token" and "bytes"). Unset: decode({id}), or "".
  std::function<std::string(int32_t id)> token_bytes;
  // Renders messages with the chat template and the generation prompt (options: the request's
  // chat_template_kwargs), then encodes them.
  std::function<std::vector<int32_t>(std::span<const ChatMessage> messages, const ChatOptions& options)> encode_chat;
  // Text without the special tokens the model adds by default (add_special_tokens = false: no BOS).
  // Unset: encode.
  std::function<std::vector<int32_t>(std::string_view text)> encode_plain;
  // Token ids back to text, special tokens written out (vLLM's /detokenize). Ids are in range.
  std::function<std::string(std::span<const int32_t> ids)> decode;
  // How the chat template has the model write a tool call (Tokenizer::tool_call_format).
  ToolCallFormat tool_format = ToolCallFormat::kHermes;
};
// A codec over a tokenizer: completions text as `fdpp generate --prompt` encodes it (BOS by the
// model's default, special-token text parsed); chat through apply_chat_template, as
// `fdpp generate --chat` does (no second BOS when the template writes one).
PromptCodec prompt_codec_for(const Tokenizer& tokenizer);

enum class Endpoint { Completions, Chat };

struct ParsedRequest {
  Endpoint endpoint = Endpoint::Completions;
  GenerationRequest generation;
  // /v1/completions given a list of several prompts (OpenAI's batch), or n > 1: one request per
  // choice, in order (choice i * n + j answers prompt i; choice j > 0 draws with
  // derived_seed(seed, j), a fresh seed when none was given); generation is the first. Empty for a
  // single prompt with n = 1.
  std::vector<GenerationRequest> batch;
  int n = 1;                     // choices per prompt
  int logprobs = -1;             // the requests' sampling.logprobs (-1: none)
  int prompt_logprobs = -1;      // vLLM's prompt_logprobs (-1: none)
  bool echo = false;             // completions: the prompt's text in front of each choice
  std::vector<std::string> echo_texts;  // per prompt, when echo
  bool stream = false;
  bool include_usage = false;    // stream_options.include_usage: a last chunk with usage
  bool return_token_ids = false; // extension (vLLM's name): token ids beside the text
  bool seed_given = false;       // false: the caller draws a seed (OpenAI: random per request)
  ToolSetup tools;               // chat: tools, tool_choice, parallel_tool_calls (server/tools.h)
  // Fields this server does not know, by name ("stream_options.x" for a nested one):
  // ignored, and reported in the log and the response's header.
  std::vector<std::string> ignored_fields;
};

// Parses a request body. Throws ApiError (4xx) naming the field for anything invalid or
// unsupported (the sampling and length ranges and their messages: engine/request_limits.h); the
// prompt is encoded with `codec` and checked against the model's context and vocabulary. Sampling
// defaults follow OpenAI: temperature 1, top_p 1, no top-k / min-p / repetition penalty; max_tokens
// defaults to 16 for completions (OpenAI's legacy default) and to the rest of the context for chat.
nlohmann::json parse_json_body(std::string_view body, const ApiLimits& limits);
// raw_body: the body's text, from which a JSON schema is read in the client's property order.
ParsedRequest parse_request(Endpoint endpoint, const nlohmann::json& body, const ModelInfo& model,
                            const PromptCodec& codec, const ApiLimits& limits, std::string_view raw_body = {});

// vLLM's POST /tokenize: {"prompt": text} (add_special_tokens, default true: the BOS the model adds)
// or {"messages": [...]} (the tokens /v1/chat/completions would prefill) -> {"tokens", "count",
// "max_model_len"}. POST /detokenize: {"tokens": [ids]} -> {"prompt": text}. Both throw ApiError
// (400 naming the field) for a bad body; the unknown fields are added to `ignored`.
// raw_body: as parse_request's (the tools' key order).
nlohmann::json tokenize_body(const nlohmann::json& body, const ModelInfo& model, const PromptCodec& codec,
                             const ApiLimits& limits, std::vector<std::string>& ignored, std::string_view raw_body = {});
nlohmann::json detokenize_body(const nlohmann::json& body, const ModelInfo& model, const PromptCodec& codec,
                               std::vector<std::string>& ignored);
// The header that names ignored fields, and its value ("a,b").
inline constexpr const char* kIgnoredFieldsHeader = "x-fdpp-ignored-fields";
std::string join_fields(const std::vector<std::string>& fields);

// The non-streamed response body and the streamed chunks of one request.
struct ResponseContext {
  Endpoint endpoint = Endpoint::Completions;
  std::string id;          // "cmpl-..." / "chatcmpl-..."
  int64_t created = 0;
  std::string model;
  bool return_token_ids = false;
  int n = 1;                            // choices per prompt: usage counts each prompt once
  int logprobs = -1;                    // >= 0: choices carry logprobs in the endpoint's shape
  int prompt_logprobs = -1;             // >= 0: vLLM's prompt_logprobs, with the top k of each
  std::vector<std::string> echo_texts;  // completions' echo: per prompt, in front of its choices' text
  std::function<std::string(int32_t)> token_bytes;  // logprobs' token text (PromptCodec::token_bytes)
  // Chat with tools: each choice's text becomes content and tool_calls (finish_reason "tool_calls"
  // when calls were made and it stopped on its own); the call ids derive from tool_id_seed and the
  // choice's index (tool_id_seed_for).
  ToolSetup tools;
  uint64_t tool_id_seed = 0;
};
uint64_t tool_id_seed_for(const ResponseContext& ctx, int index);
// finish_reason with tool calls: "tool_calls" for a choice that made calls and stopped, else as is.
std::string tool_finish_reason(const std::string& finish_reason, bool called);
std::string response_id(Endpoint endpoint, uint64_t serial);
// finish_reason as OpenAI spells it: "stop" or "length" (cancelled/error never reach a client).
// usage.prompt_tokens_details.cached_tokens: prompt tokens taken from the prefix cache (OpenAI's field).
nlohmann::json usage_json(size_t prompt_tokens, size_t completion_tokens, size_t cached_tokens = 0);
nlohmann::json completion_body(const ResponseContext& ctx, const GenerationResult& result);
// A batch's body: choice i from results[i], usage summed.
nlohmann::json completion_body(const ResponseContext& ctx, std::span<const GenerationResult> results);
// A chunk of choice `index` (its place in a batch, else 0) carrying new text (finish_reason
// null), or the choice's last chunk (finish_reason set, text usually empty). Chat's first chunk
// carries the role (first = true). logprobs: the tokens' (ctx.logprobs >= 0); text_offset: where
// the chunk's text starts in the choice's text (completions' text_offset), advanced past it.
nlohmann::json stream_chunk(const ResponseContext& ctx, int index, std::string_view text,
                            std::span<const int32_t> tokens, const std::string& finish_reason, bool first,
                            bool include_usage_null, std::span<const TokenLogprobs> logprobs = {},
                            size_t* text_offset = nullptr);
// The logprobs object of a choice: chat's {"content": [{token, logprob, bytes, top_logprobs}]},
// completions' {tokens, token_logprobs, top_logprobs, text_offset} with offsets from text_offset
// (advanced). -inf is written as -9999.0, as vLLM does (JSON has no infinities).
nlohmann::json logprobs_json(const ResponseContext& ctx, std::span<const int32_t> tokens,
                             std::span<const TokenLogprobs> logprobs, size_t& text_offset);
// A chat chunk whose delta is tool_calls (ToolStream's deltas).
nlohmann::json tool_calls_chunk(const ResponseContext& ctx, int index, const nlohmann::json& tool_calls,
                                bool include_usage_null);
// stream_options.include_usage: the extra last chunk with empty choices and the usage.
nlohmann::json usage_chunk(const ResponseContext& ctx, size_t prompt_tokens, size_t completion_tokens,
                           size_t cached_tokens = 0);
// "data: <json>\n\n" (invalid UTF-8 replaced, never thrown on); sse_done() is "data: [DONE]\n\n".
std::string sse_event(const nlohmann::json& j);
std::string sse_done();
// JSON text for a response body (invalid UTF-8 replaced).
std::string dump(const nlohmann::json& j);

}  // namespace fdpp::server
