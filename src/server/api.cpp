#include "server/api.h"
#include "server/structured_output.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "engine/request_limits.h"
#include "engine/sampler.h"  // derived_seed
#include "fdpp/error.h"
#include "io/json_file.h"

namespace fdpp::server {

using nlohmann::json;

ApiError::ApiError(int status_, std::string message, std::string param_, std::string type_, std::string code_)
    : std::runtime_error(std::move(message)), status(status_), param(std::move(param_)), type(std::move(type_)),
      code(std::move(code_)) {
  if (type.empty()) {
    switch (status) {
      case 401: type = "authentication_error"; break;
      case 404: type = "not_found_error"; break;
      case 413: type = "invalid_request_error"; break;
      case 429:
      case 503: type = "server_busy_error"; break;
      default: type = status >= 500 ? "server_error" : "invalid_request_error";
    }
  }
}

ApiError bad_request(std::string param, std::string message, std::string code) {
  return ApiError(400, std::move(message), std::move(param), "invalid_request_error", std::move(code));
}

json error_body(const ApiError& e) {
  json err = {{"message", e.what()}, {"type", e.type}, {"param", nullptr}, {"code", nullptr}};
  if (!e.param.empty()) err["param"] = e.param;
  if (!e.code.empty()) err["code"] = e.code;
  return json{{"error", std::move(err)}};
}

namespace {
json model_object(const ModelInfo& model) {
  return json{{"id", model.id},
            {"object", "model"},
            {"created", model.created},
            {"owned_by", "fdpp"},
            {"max_model_len", model.max_context},
            {"vocab_size", model.vocab_size}};  // extension: bench/serve_bench.py draws random prompts from it
}
bool model_matches(const ModelInfo& model, const std::string& name);
}  // namespace

json models_body(const ModelInfo& model) { return json{{"object", "list"}, {"data", json::array({model_object(model)})}}; }

json model_body(const ModelInfo& model, const std::string& name) {
  if (!model_matches(model, name))
    throw ApiError(404, fmt::format("the model {} does not exist; this server serves '{}'", json_show(name), model.id),
                   "model", "invalid_request_error", "model_not_found");
  return model_object(model);
}

PromptCodec prompt_codec_for(const Tokenizer& tokenizer) {
  PromptCodec c;
  c.encode = [&tokenizer](std::string_view text) {
    return tokenizer.encode(text, tokenizer.add_bos_by_default(), /*parse_special=*/true);
  };
  c.encode_chat = [&tokenizer](std::span<const ChatMessage> messages, const ChatOptions& options) {
    const std::string text = tokenizer.apply_chat_template(messages, /*add_generation_prompt=*/true, options);
    // Templates that write the BOS text themselves (Llama 2/3) get no second BOS (as the CLI's
    // --chat and transformers' apply_chat_template(tokenize=True)).
    bool add_bos = tokenizer.add_bos_by_default();
    const int32_t bos = tokenizer.bos_id();
    if (bos >= 0 && text.starts_with(tokenizer.token_text(bos))) add_bos = false;
    return tokenizer.encode(text, add_bos, /*parse_special=*/true);
  };
  c.encode_plain = [&tokenizer](std::string_view text) { return tokenizer.encode(text, false, /*parse_special=*/true); };
  c.decode = [&tokenizer](std::span<const int32_t> ids) { return tokenizer.decode(ids, /*skip_special=*/false); };
  c.token_bytes = [&tokenizer](int32_t id) { return id < tokenizer.vocab_size() ? tokenizer.token_bytes(id) : std::string(); };
  c.tool_format = tokenizer.tool_call_format();
  return c;
}

namespace {


std::optional<bool> opt_bool(const json& body, const char* key) {
  const json* v = present_field(body, key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) throw bad_request(key, fmt::format("'{}' must be a boolean", key));
  return v->get<bool>();
}

// A sampling or length field checked against the table of request limits (engine/request_limits.h),
// the one a prompts file's line, Python's SamplingParams and the sampler check: the same ranges and
// the same message ("\"top_p\" 0 must be in (0, 1] (1 = off)"). Integers only where the table says
// so (16.0 and 1.5 are refused, as OpenAI does).
std::optional<JsonParam> opt_param(const json& body, const char* key) {
  const json* v = present_field(body, key);
  if (!v) return std::nullopt;
  JsonParam p = check_json_param(key, *v);
  if (!p.message.empty()) throw bad_request(key, p.message);
  return p;
}

// Fields accepted only at the value that turns them off; anything else is refused by name.
void require_off(const json& body, const char* key, const std::function<bool(const json&)>& is_off,
                 const char* what) {
  const json* v = present_field(body, key);
  if (v && !is_off(*v)) throw bad_request(key, fmt::format("'{}' is not supported by this server ({})", key, what), "unsupported_parameter");
}

bool is_false(const json& v) { return v.is_boolean() && !v.get<bool>(); }
bool is_true(const json& v) { return v.is_boolean() && v.get<bool>(); }
bool is_empty_container(const json& v) { return (v.is_object() || v.is_array()) && v.empty(); }

// A JSON array of token ids, each in [0, vocab).
std::vector<int32_t> checked_ids(const json& arr, const char* param, const ModelInfo& model) {
  std::vector<int32_t> ids;
  ids.reserve(arr.size());
  for (size_t i = 0; i < arr.size(); ++i) {
    const json& t = arr[i];
    if (!t.is_number_integer() || (t.is_number_unsigned() ? t.get<uint64_t>() >= static_cast<uint64_t>(model.vocab_size)
                                                          : (t.get<int64_t>() < 0 || t.get<int64_t>() >= model.vocab_size)))
      throw bad_request(param, fmt::format("{}[{}] = {} is not a token id in [0, {})", param, i, t.dump(), model.vocab_size));
    ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  return ids;
}

// Token ids of a prompt given as ids: each in [0, vocab).
std::vector<int32_t> token_ids(const json& arr, const char* param, const ModelInfo& model) {
  // Bounded before the copy: a prompt cannot be longer than the context anyway.
  if (arr.size() >= static_cast<size_t>(model.max_context))
    throw bad_request(param,
              fmt::format("the prompt is {} tokens; this model's context is {} tokens", arr.size(), model.max_context),
              "context_length_exceeded");
  return checked_ids(arr, param, model);
}

// vLLM's stop_token_ids: null, or a list of at most max_stop_token_ids ids.
std::vector<int32_t> stop_token_ids(const json& body, const ModelInfo& model, const ApiLimits& limits) {
  const json* s = present_field(body, "stop_token_ids");
  if (!s) return {};
  if (!s->is_array()) throw bad_request("stop_token_ids", "'stop_token_ids' must be a list of token ids");
  if (std::string m = list_count_message("stop_token_ids", s->size(), limits.max_stop_token_ids); !m.empty())
    throw bad_request("stop_token_ids", m);
  return checked_ids(*s, "stop_token_ids", model);
}

// The prompts of /v1/completions: a string, a list of token ids, or (OpenAI's batch) a list of up
// to max_prompts strings or id lists.
std::vector<std::vector<int32_t>> completion_prompts(const json& body, const ModelInfo& model, const PromptCodec& codec_in,
                                                     const ApiLimits& limits) {
  // vLLM's add_special_tokens (default true): false leaves out the BOS the model adds to a text.
  PromptCodec codec = codec_in;
  if (!opt_bool(body, "add_special_tokens").value_or(true) && codec.encode_plain) codec.encode = codec.encode_plain;
  const json* p = present_field(body, "prompt");
  if (!p) throw bad_request("prompt", "'prompt' is required (a string or a list of token ids)");
  if (p->is_string()) return {codec.encode(p->get_ref<const std::string&>())};
  if (!p->is_array()) throw bad_request("prompt", "'prompt' must be a string or a list of token ids");
  if (p->empty()) throw bad_request("prompt", "'prompt' is an empty list");
  if ((*p)[0].is_number()) return {token_ids(*p, "prompt", model)};
  if (p->size() > static_cast<size_t>(limits.max_prompts))
    throw bad_request("prompt",
              fmt::format("'prompt' is a list of {} prompts; the limit is {}", p->size(), limits.max_prompts));
  std::vector<std::vector<int32_t>> prompts;
  for (size_t i = 0; i < p->size(); ++i) {
    const json& one = (*p)[i];
    const std::string param = fmt::format("prompt[{}]", i);
    if (one.is_string()) {
      prompts.push_back(codec.encode(one.get_ref<const std::string&>()));
    } else if (one.is_array() && !one.empty()) {
      prompts.push_back(token_ids(one, param.c_str(), model));
    } else {
      throw bad_request("prompt", fmt::format("{} must be a string or a non-empty list of token ids", param));
    }
  }
  return prompts;
}

// chat_template_kwargs (vLLM's field): the template variables a chat template reads. Known:
// enable_thinking (Qwen3); others are ignored and reported as "chat_template_kwargs.<name>".
ChatOptions chat_options(const json& body, std::vector<std::string>& ignored) {
  ChatOptions o;
  const json* kw = present_field(body, "chat_template_kwargs");
  if (!kw) return o;
  if (!kw->is_object()) throw bad_request("chat_template_kwargs", "'chat_template_kwargs' must be an object");
  for (const auto& [k, v] : kw->items()) {
    if (k == "enable_thinking") {
      if (v.is_null()) continue;
      if (!v.is_boolean())
        throw bad_request("chat_template_kwargs.enable_thinking", "'chat_template_kwargs.enable_thinking' must be a boolean");
      o.enable_thinking = v.get<bool>();
    } else {
      ignored.push_back("chat_template_kwargs." + k);
    }
  }
  return o;
}

// An assistant message's tool_calls: [{"id", "type": "function", "function": {"name", "arguments"}}],
// the arguments a JSON object as text (OpenAI's) or as an object (vLLM takes both).
std::vector<ToolCall> message_tool_calls(const json& calls, const std::string& at) {
  if (!calls.is_array()) throw bad_request(at, at + " must be a list of tool calls");
  std::vector<ToolCall> out;
  for (size_t j = 0; j < calls.size(); ++j) {
    const json& c = calls[j];
    const std::string cat = fmt::format("{}[{}]", at, j);
    if (!c.is_object()) throw bad_request(cat, cat + " must be {\"id\", \"type\": \"function\", \"function\": {...}}");
    if (const json* type = present_field(c, "type"); type && *type != "function")
      throw bad_request(cat + ".type", cat + ".type must be \"function\"");
    ToolCall call;
    if (const json* id = present_field(c, "id")) {
      if (!id->is_string()) throw bad_request(cat + ".id", cat + ".id must be a string");
      call.id = id->get<std::string>();
    }
    const json* f = present_field(c, "function");
    const json* name = f && f->is_object() ? present_field(*f, "name") : nullptr;
    if (!name || !name->is_string())
      throw bad_request(cat + ".function", cat + ".function must be an object with a string \"name\"");
    call.name = name->get<std::string>();
    const json* args = present_field(*f, "arguments");
    json parsed = json::object();
    if (args && args->is_string()) {
      try {
        parsed = parse_json(args->get_ref<const std::string&>());
      } catch (const JsonSyntaxError& e) {
        throw bad_request(cat + ".function.arguments", fmt::format("{}.function.arguments is not JSON: {}", cat, e.what()));
      }
    } else if (args) {
      parsed = *args;
    }
    if (!parsed.is_object())
      throw bad_request(cat + ".function.arguments", cat + ".function.arguments must be a JSON object (as a string)");
    // The text as sent keeps its key order, which the template prints.
    call.arguments = args && args->is_string() ? args->get<std::string>() : parsed.dump();
    out.push_back(std::move(call));
  }
  return out;
}

std::vector<ChatMessage> chat_messages(const json& body, const ApiLimits& limits) {
  const json* m = present_field(body, "messages");
  if (!m) throw bad_request("messages", "'messages' is required (a list of {role, content} objects)");
  if (!m->is_array()) throw bad_request("messages", "'messages' must be a list of {role, content} objects");
  if (m->empty()) throw bad_request("messages", "'messages' is empty");
  if (m->size() > static_cast<size_t>(limits.max_messages))
    throw bad_request("messages", fmt::format("{} messages; the limit is {}", m->size(), limits.max_messages));
  std::vector<ChatMessage> out;
  out.reserve(m->size());
  for (size_t i = 0; i < m->size(); ++i) {
    const json& msg = (*m)[i];
    const std::string at = fmt::format("messages[{}]", i);
    if (!msg.is_object()) throw bad_request(at, at + " must be an object with 'role' and 'content'");
    for (const auto& [k, v] : msg.items()) {
      if (k == "role" || k == "content" || k == "name" || k == "tool_calls" || k == "tool_call_id") continue;
      if (v.is_null()) continue;
      throw bad_request(at + "." + k, fmt::format("{}: the field {} is not supported by this server", at, json_show(k)),
                "unsupported_parameter");
    }
    const json* role = present_field(msg, "role");
    if (!role || !role->is_string()) throw bad_request(at + ".role", at + ".role must be a string");
    std::string r = role->get<std::string>();
    // "developer" is OpenAI's newer name for the system role.
    if (r == "developer") r = "system";
    if (r != "system" && r != "user" && r != "assistant" && r != "tool")
      throw bad_request(at + ".role",
                fmt::format("{}.role {} is not one of system, developer, user, assistant, tool", at, json_show(*role)));
    ChatMessage message{r, ""};
    if (const json* calls = present_field(msg, "tool_calls")) {
      if (r != "assistant") throw bad_request(at + ".tool_calls", at + ".tool_calls is only for assistant messages");
      message.tool_calls = message_tool_calls(*calls, at + ".tool_calls");
    }
    if (const json* id = present_field(msg, "tool_call_id")) {
      if (r != "tool") throw bad_request(at + ".tool_call_id", at + ".tool_call_id is only for tool messages");
      if (!id->is_string()) throw bad_request(at + ".tool_call_id", at + ".tool_call_id must be a string");
      message.tool_call_id = id->get<std::string>();
    }
    std::string content;
    const json* c = present_field(msg, "content");
    if (!c) {
      if (r != "assistant") throw bad_request(at + ".content", at + ".content is required");
    } else if (c->is_string()) {
      content = c->get<std::string>();
    } else if (c->is_array()) {
      // Content parts: only text, concatenated (as vLLM does for text-only models).
      for (size_t j = 0; j < c->size(); ++j) {
        const json& part = (*c)[j];
        const std::string pat = fmt::format("{}.content[{}]", at, j);
        if (!part.is_object() || !part.contains("type") || part["type"] != "text" || !part.contains("text") ||
            !part["text"].is_string())
          throw bad_request(pat, pat + " is not a {\"type\": \"text\", \"text\": ...} part (only text is supported)");
        content += part["text"].get<std::string>();
      }
    } else {
      throw bad_request(at + ".content", at + ".content must be a string or a list of text parts");
    }
    message.content = std::move(content);
    out.push_back(std::move(message));
  }
  return out;
}

std::vector<std::string> stop_strings(const json& body, const ApiLimits& limits) {
  const json* s = present_field(body, "stop");
  std::vector<std::string> out;
  if (!s) return out;
  auto add = [&](const json& v) {
    if (!v.is_string()) throw bad_request("stop", "'stop' must be a string or a list of strings");
    const std::string& str = v.get_ref<const std::string&>();
    if (std::string p = stop_string_problem(str, limits.max_stop_bytes); !p.empty()) throw bad_request("stop", "\"stop\" " + p);
    out.push_back(str);
  };
  if (s->is_array()) {
    if (std::string m = list_count_message("stop", s->size(), limits.max_stop_strings); !m.empty())
      throw bad_request("stop", m);
    for (const json& v : *s) add(v);
  } else {
    add(*s);
  }
  return out;
}

bool model_matches(const ModelInfo& model, const std::string& name) {
  if (name == model.id) return true;
  for (const std::string& a : model.aliases)
    if (name == a) return true;
  return false;
}

}  // namespace

json parse_json_body(std::string_view body, const ApiLimits& limits) {
  if (body.size() > static_cast<size_t>(limits.max_body_bytes))
    throw ApiError(413, fmt::format("the request body is {} bytes; the limit is {}", body.size(), limits.max_body_bytes));
  json j;
  try {
    j = parse_json(body);
  } catch (const JsonSyntaxError& e) {
    throw bad_request("", fmt::format("invalid JSON: {}", e.what()), "invalid_json");
  }
  if (!j.is_object()) throw bad_request("", "the request body must be a JSON object");
  return j;
}

namespace {

// OpenAI's logit_bias: {"token id as a string": bias in [-100, 100]}.
std::vector<LogitBias> logit_bias(const json& body, const ModelInfo& model) {
  const json* v = present_field(body, "logit_bias");
  if (!v) return {};
  if (!v->is_object()) throw bad_request("logit_bias", "'logit_bias' must be an object of token ids (as strings) to biases");
  if (std::string m = list_count_message("logit_bias", v->size()); !m.empty()) throw bad_request("logit_bias", m);
  std::vector<LogitBias> out;
  for (const auto& [key, bias] : v->items()) {
    int64_t id = -1;
    const bool digits = !key.empty() && key.size() <= 10 && std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (digits) id = std::stoll(key);
    if (!digits || id >= model.vocab_size)
      throw bad_request("logit_bias", fmt::format("'logit_bias' key {} is not a token id in [0, {})", json_show(key), model.vocab_size));
    const std::string name = fmt::format("logit_bias[{}]", id);
    if (!bias.is_number()) throw bad_request("logit_bias", fmt::format("{} must be a number, not {}", name, json_show(bias)));
    const double b = bias.get<double>();
    if (std::string problem = param_problem(request_param("logit_bias_value"), b); !problem.empty())
      throw bad_request("logit_bias", param_message(name, show_value(b), problem));
    out.push_back({static_cast<int32_t>(id), static_cast<float>(b)});
  }
  return out;
}

}  // namespace

ParsedRequest parse_request(Endpoint endpoint, const json& body, const ModelInfo& model, const PromptCodec& codec,
                            const ApiLimits& limits, std::string_view raw_body) {
  const bool chat = endpoint == Endpoint::Chat;
  // Every top-level field this server reads, accepts as harmless or refuses when not off; the rest
  // are unknown: ignored and reported.
  static const std::set<std::string> common = {
      "model", "max_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "seed", "stop", "stream",
      "stream_options", "ignore_eos", "return_token_ids", "stop_token_ids",
      // Cannot change the output: bookkeeping fields.
      "user", "metadata", "store", "service_tier",
      "n", "logprobs", "presence_penalty", "frequency_penalty", "logit_bias",
      // Accepted only when off (checked below).
      "response_format",
      // vLLM's and llama-server's extensions (echo: implemented for completions, off in chat).
      "best_of", "echo", "min_tokens", "skip_special_tokens", "include_stop_str_in_output",
      "spaces_between_special_tokens", "use_beam_search", "add_special_tokens", "prompt_logprobs",
      // llama-server's spellings of the repetition penalty, and its prompt-cache hint (no effect on
      // the output: a hint about reusing the KV cache).
      "repeat_penalty", "repeat_last_n", "cache_prompt",
      // Structured output (server/structured_output.h): response_format, vLLM's guided_* and
      // structured_outputs.
      "guided_json", "guided_regex", "guided_choice", "guided_grammar", "guided_decoding_backend",
      "guided_whitespace_pattern", "structured_outputs"};
  static const std::set<std::string> completions_only = {"prompt", "suffix"};
  static const std::set<std::string> chat_only = {"messages",  "max_completion_tokens", "top_logprobs", "tools",
                                                  "tool_choice", "functions", "function_call", "parallel_tool_calls",
                                                  "modalities", "audio", "prediction", "reasoning_effort",
                                                  "web_search_options", "chat_template_kwargs"};
  std::vector<std::string> ignored;
  for (const auto& [k, v] : body.items()) {
    if (common.count(k) || (chat ? chat_only.count(k) : completions_only.count(k))) continue;
    // The other endpoint's fields are known: a chat's tools sent to /v1/completions would not do
    // what the client meant, so they are refused, not ignored.
    if (chat ? completions_only.count(k) : chat_only.count(k))
      throw bad_request(k,
                fmt::format("{} is a field of {}, not of {}", json_show(k),
                            chat ? "/v1/completions" : "/v1/chat/completions",
                            chat ? "/v1/chat/completions" : "/v1/completions"),
                "unsupported_parameter");
    ignored.push_back(k);
  }

  if (const json* m = present_field(body, "model")) {
    if (!m->is_string()) throw bad_request("model", "'model' must be a string");
    if (!model_matches(model, m->get<std::string>()))
      throw ApiError(404, fmt::format("the model {} does not exist; this server serves '{}'", json_show(*m), model.id),
                     "model", "invalid_request_error", "model_not_found");
  }

  // n choices per prompt: n requests with derived seeds (parse_request's end); best_of only as n.
  const int n_choices = static_cast<int>(opt_param(body, "n").value_or(JsonParam{1, 0, ""}).integer);
  if (const auto best_of = opt_param(body, "best_of"); best_of && best_of->integer != n_choices)
    throw bad_request("best_of",
              fmt::format("'best_of' = {} with n = {} is not supported: fdpp returns every choice it samples, so "
                          "best_of must equal n",
                          best_of->integer, n_choices),
              "unsupported_parameter");
  require_off(body, "spaces_between_special_tokens", is_true, "special tokens are left out of the text");
  require_off(body, "include_stop_str_in_output", is_false, "the text ends before a stop string");
  require_off(body, "use_beam_search", is_false, "no beam search");
  if (chat) {
    require_off(body, "echo", is_false, "the last message is not echoed");
    // OpenAI's deprecated functions / function_call: tools and tool_choice say the same.
    require_off(body, "functions", is_empty_container, "use 'tools'");
    require_off(body, "function_call", [](const json& v) { return v == "none"; }, "use 'tool_choice'");
    require_off(body, "modalities", [](const json& v) { return v == json::array({"text"}); }, "text only");
    require_off(body, "audio", [](const json&) { return false; }, "text only");
    require_off(body, "prediction", [](const json&) { return false; }, "no predicted outputs");
    require_off(body, "reasoning_effort", [](const json&) { return false; }, "not a reasoning model");
    require_off(body, "web_search_options", [](const json&) { return false; }, "no web search");
    // vLLM's chat default: the template writes the special tokens, none are added around it.
    require_off(body, "add_special_tokens", is_false, "the chat template writes the special tokens");
  } else {
    require_off(body, "suffix", [](const json& v) { return v == ""; }, "no insertion");
  }

  ParsedRequest r;
  r.endpoint = endpoint;
  r.stream = opt_bool(body, "stream").value_or(false);
  if (const json* so = present_field(body, "stream_options")) {
    if (!so->is_object()) throw bad_request("stream_options", "'stream_options' must be an object");
    for (const auto& [k, v] : so->items())
      if (k != "include_usage" && k != "continuous_usage_stats") ignored.push_back("stream_options." + k);
    if (!r.stream) throw bad_request("stream_options", "'stream_options' is only allowed with \"stream\": true");
    r.include_usage = opt_bool(*so, "include_usage").value_or(false);
    if (opt_bool(*so, "continuous_usage_stats").value_or(false))
      throw bad_request("stream_options.continuous_usage_stats", "stream_options.continuous_usage_stats is not supported",
                "unsupported_parameter");
  }
  r.return_token_ids = opt_bool(body, "return_token_ids").value_or(false);
  r.ignored_fields = std::move(ignored);

  // Sampling: OpenAI's defaults (temperature 1, top_p 1, nothing else), not the CLI's llama.cpp
  // ones, so that a client gets what the same request gets from OpenAI or vLLM.
  SamplingParams& s = r.generation.sampling;
  auto real = [&](const char* key, double otherwise) {
    const auto p = opt_param(body, key);
    return static_cast<float>(p ? p->real : otherwise);
  };
  s.temperature = real("temperature", 1.0);
  s.top_p = real("top_p", 1.0);
  // top_k: -1 (vLLM) and 0 (llama.cpp) both mean off.
  s.top_k = std::max(static_cast<int>(opt_param(body, "top_k").value_or(JsonParam{}).integer), 0);
  s.min_p = real("min_p", 0.0);
  // As vLLM / HF: the penalty sees every token of the prompt and the output (repeat_last_n -1)
  // unless a llama-server client gives its window.
  if (present_field(body, "repetition_penalty") && present_field(body, "repeat_penalty"))
    throw bad_request("repeat_penalty", "give 'repetition_penalty' or llama-server's 'repeat_penalty', not both");
  s.repeat_penalty = real(present_field(body, "repeat_penalty") ? "repeat_penalty" : "repetition_penalty", 1.0);
  s.repeat_last_n = static_cast<int>(opt_param(body, "repeat_last_n").value_or(JsonParam{-1, 0, ""}).integer);
  (void)opt_bool(body, "cache_prompt");
  // -1 asks for a random seed, as an absent one (vLLM's seed=-1, llama.cpp's --seed -1).
  if (const auto seed = opt_param(body, "seed"); seed && seed->integer != -1) {
    s.seed = static_cast<uint64_t>(seed->integer);
    r.seed_given = true;
  }
  s.presence_penalty = real("presence_penalty", 0.0);
  s.frequency_penalty = real("frequency_penalty", 0.0);
  s.min_tokens = static_cast<int>(opt_param(body, "min_tokens").value_or(JsonParam{}).integer);
  s.logit_bias = logit_bias(body, model);
  // Log probabilities: chat's "logprobs": true with "top_logprobs": k, completions' "logprobs": k.
  if (chat) {
    const bool want = opt_bool(body, "logprobs").value_or(false);
    const auto top = opt_param(body, "top_logprobs");
    if (top && !want && top->integer > 0)
      throw bad_request("top_logprobs", "'top_logprobs' needs \"logprobs\": true");
    if (want) s.logprobs = static_cast<int>(top ? top->integer : 0);
  } else {
    if (const auto k = opt_param(body, "logprobs")) s.logprobs = static_cast<int>(k->integer);
    r.echo = opt_bool(body, "echo").value_or(false);
    // echo with logprobs scores the prompt too (lm-evaluation-harness's loglikelihood requests):
    // every prompt token after the first gets its log probability and the top alternatives.
    if (r.echo && s.logprobs >= 0) {
      if (r.stream)
        throw bad_request("echo",
                          "'echo' with 'logprobs' is not supported when streaming (the prompt's log probabilities "
                          "come with the whole response)",
                          "unsupported_parameter");
      r.generation.prompt_logprobs = s.logprobs;
    }
  }
  // vLLM's prompt_logprobs: each prompt token after the first gets its log probability and the top
  // k alternatives, in the response's "prompt_logprobs" (the choice's, or chat's body's).
  if (const auto k = opt_param(body, "prompt_logprobs")) {
    if (r.stream)
      throw bad_request("prompt_logprobs",
                        "'prompt_logprobs' is not supported when streaming (they come with the whole response)",
                        "unsupported_parameter");
    r.prompt_logprobs = static_cast<int>(k->integer);
    r.generation.prompt_logprobs = std::max(r.generation.prompt_logprobs, r.prompt_logprobs);
  }
  r.logprobs = s.logprobs;
  r.n = n_choices;
  r.generation.ignore_eos = opt_bool(body, "ignore_eos").value_or(false);
  r.generation.skip_special_tokens = opt_bool(body, "skip_special_tokens").value_or(true);
  r.generation.stop = stop_strings(body, limits);
  r.generation.stop_token_ids = stop_token_ids(body, model, limits);
  r.generation.grammar = structured_output(body, raw_body);
  ToolRequest tools;
  if (chat) {
    tools = tool_request(body, raw_body, codec.tool_format);
    r.tools = tools.setup;
    for (std::string& f : tools.unenforced) r.ignored_fields.push_back(std::move(f));
    if (tools.grammar) {
      if (r.generation.grammar)
        throw bad_request("tool_choice", "a forced tool call (tool_choice \"required\" or a function) holds the output to the "
                                 "call's JSON; it cannot be combined with a structured output format");
      r.generation.grammar = tools.grammar;
    }
    // Mistral's [TOOL_CALLS] and Llama's <|python_tag|> are control tokens, which the text would
    // otherwise leave out before the parser sees them (vLLM does the same for Mistral).
    if (r.tools.choice == ToolChoice::kAuto && r.tools.format != ToolCallFormat::kHermes)
      r.generation.skip_special_tokens = false;
  }

  std::optional<int64_t> max_tokens;
  if (auto p = opt_param(body, "max_tokens")) max_tokens = p->integer;
  const char* max_param = "max_tokens";
  if (chat) {
    if (auto mct = opt_param(body, "max_completion_tokens")) {
      max_tokens = mct->integer;
      max_param = "max_completion_tokens";
    }
  }

  // The prompt last: encoding is the expensive part, done once the cheap checks passed.
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::string> prompt_texts;  // echo: the prompts given as text (ids are decoded)
  if (r.echo) {
    const json& p = body["prompt"];
    if (p.is_string()) prompt_texts.push_back(p.get<std::string>());
    if (p.is_array() && !p.empty() && p[0].is_string())
      for (const json& t : p) prompt_texts.push_back(t.is_string() ? t.get<std::string>() : std::string());
  }
  const char* prompt_param = chat ? "messages" : "prompt";
  try {
    if (chat) {
      ChatOptions options = chat_options(body, r.ignored_fields);
      options.tools = std::move(tools.tools);
      prompts.push_back(codec.encode_chat(chat_messages(body, limits), options));
    }
    else
      prompts = completion_prompts(body, model, codec, limits);
  } catch (const fdpp::Error& e) {  // a chat template this model lacks, text the tokenizer refuses
    throw bad_request(prompt_param, e.what());
  }
  const bool batch = prompts.size() > 1;
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::vector<int32_t>& prompt = prompts[i];
    const std::string which = batch ? fmt::format("prompt[{}]", i) : std::string("the prompt");
    if (prompt.empty()) throw bad_request(prompt_param, fmt::format("{} encodes to no tokens", which));
    const int64_t n = static_cast<int64_t>(prompt.size());
    if (n >= model.max_context)
      throw bad_request(prompt_param,
                fmt::format("{} is {} tokens; this model's context is {} tokens (prompt and output)", which, n,
                            model.max_context),
                "context_length_exceeded");
    const int64_t room = model.max_context - n;
    if (max_tokens && *max_tokens > room)
      throw bad_request(max_param,
                fmt::format("{} = {} with {} of {} tokens exceeds this model's context of {} tokens", max_param,
                            *max_tokens, batch ? which : "a prompt", n, model.max_context),
                "context_length_exceeded");
    GenerationRequest g = r.generation;
    g.max_tokens = static_cast<int>(max_tokens ? *max_tokens : (chat ? room : std::min<int64_t>(16, room)));
    if (g.sampling.min_tokens > g.max_tokens)
      throw bad_request("min_tokens", fmt::format("'min_tokens' = {} exceeds {} = {}", g.sampling.min_tokens,
                                          max_tokens ? max_param : "the default max_tokens", g.max_tokens));
    if (r.echo) r.echo_texts.push_back(prompt_texts.empty() ? (codec.decode ? codec.decode(prompt) : "") : prompt_texts[i]);
    g.prompt = std::move(prompt);
    if (batch || r.n > 1) {
      // Choice i * n + j answers prompt i (OpenAI's order); choice j > 0 draws from a seed derived
      // from the request's, so that a seeded request is reproducible and its choices differ.
      for (int j = 0; j < r.n; ++j) {
        GenerationRequest c = g;
        if (j > 0) {
          c.sampling.seed = derived_seed(g.sampling.seed, static_cast<uint64_t>(j));
          // The prompt's scores (prompt_logprobs, echo with logprobs) come from choice 0
          // (completion_body): the others skip that work and may reuse the cached prefix.
          c.prompt_logprobs = -1;
        }
        r.batch.push_back(std::move(c));
      }
    } else {
      r.generation = std::move(g);
    }
  }
  if (!r.batch.empty()) r.generation = r.batch[0];
  return r;
}

json tokenize_body(const json& body, const ModelInfo& model, const PromptCodec& codec, const ApiLimits& limits,
                   std::vector<std::string>& ignored, std::string_view raw_body) {
  static const std::set<std::string> known = {"model", "prompt", "messages", "add_special_tokens",
                                              "add_generation_prompt", "chat_template_kwargs", "tools",
                                              "tool_choice", "parallel_tool_calls"};
  for (const auto& [k, v] : body.items())
    if (!known.count(k)) ignored.push_back(k);
  if (const json* m = present_field(body, "model")) {
    if (!m->is_string()) throw bad_request("model", "'model' must be a string");
    (void)model_body(model, m->get<std::string>());
  }
  const json* prompt = present_field(body, "prompt");
  const json* messages = present_field(body, "messages");
  if ((prompt != nullptr) == (messages != nullptr))
    throw bad_request(prompt ? "messages" : "prompt", "give either 'prompt' (a string) or 'messages' (a chat), not both or neither");
  // The chat template always ends with the assistant's turn here, as in /v1/chat/completions.
  require_off(body, "add_generation_prompt", is_true, "the generation prompt is always added");
  const bool special = opt_bool(body, "add_special_tokens").value_or(true);
  std::vector<int32_t> tokens;
  try {
    if (prompt) {
      if (!prompt->is_string()) throw bad_request("prompt", "'prompt' must be a string");
      const std::string& text = prompt->get_ref<const std::string&>();
      tokens = !special && codec.encode_plain ? codec.encode_plain(text) : codec.encode(text);
    } else {
      ChatOptions options = chat_options(body, ignored);
      options.tools = tool_request(body, raw_body, codec.tool_format).tools;
      tokens = codec.encode_chat(chat_messages(body, limits), options);
    }
  } catch (const fdpp::Error& e) {
    throw bad_request(prompt ? "prompt" : "messages", e.what());
  }
  return json{{"tokens", tokens}, {"count", tokens.size()}, {"max_model_len", model.max_context}};
}

json detokenize_body(const json& body, const ModelInfo& model, const PromptCodec& codec,
                     std::vector<std::string>& ignored) {
  for (const auto& [k, v] : body.items())
    if (k != "model" && k != "tokens") ignored.push_back(k);
  if (const json* m = present_field(body, "model")) {
    if (!m->is_string()) throw bad_request("model", "'model' must be a string");
    (void)model_body(model, m->get<std::string>());
  }
  const json* t = present_field(body, "tokens");
  if (!t) throw bad_request("tokens", "'tokens' is required (a list of token ids)");
  if (!t->is_array()) throw bad_request("tokens", "'tokens' must be a list of token ids");
  // A body of ids is bounded by the body limit; nothing larger is allocated from it.
  const std::vector<int32_t> ids = checked_ids(*t, "tokens", model);
  std::string text;
  try {
    text = codec.decode ? codec.decode(ids) : std::string();
  } catch (const fdpp::Error& e) {  // an id the model has and its tokenizer lacks (a padded vocabulary)
    throw bad_request("tokens", e.what());
  }
  return json{{"prompt", text}};
}

std::string join_fields(const std::vector<std::string>& fields) {
  // Bounded: a body of thousands of unknown fields must not become a header of megabytes.
  constexpr size_t kMostNames = 32, kMostNameBytes = 64;
  std::string out;
  for (size_t i = 0; i < fields.size(); ++i) {
    if (i == kMostNames) {
      out += fmt::format(",...({} more)", fields.size() - i);
      break;
    }
    if (i > 0) out += ',';
    const std::string_view f = std::string_view(fields[i]).substr(0, kMostNameBytes);
    // Header values are one line of visible text: anything else in a client's field name is
    // replaced, so that it cannot split or forge headers.
    for (unsigned char c : f) out += c >= 0x21 && c < 0x7f && c != ',' ? static_cast<char>(c) : '?';
  }
  return out;
}

std::string response_id(Endpoint endpoint, uint64_t serial) {
  return fmt::format("{}-{:016x}", endpoint == Endpoint::Chat ? "chatcmpl" : "cmpl", serial);
}

json usage_json(size_t prompt_tokens, size_t completion_tokens, size_t cached_tokens) {
  return json{{"prompt_tokens", prompt_tokens},
              {"completion_tokens", completion_tokens},
              {"total_tokens", prompt_tokens + completion_tokens},
              {"prompt_tokens_details", {{"cached_tokens", cached_tokens}}}};
}

namespace {
json envelope(const ResponseContext& ctx, bool chunk) {
  const char* object = ctx.endpoint == Endpoint::Chat ? (chunk ? "chat.completion.chunk" : "chat.completion")
                                                      : "text_completion";
  return json{{"id", ctx.id}, {"object", object}, {"created", ctx.created}, {"model", ctx.model}};
}
json finish_json(const std::string& reason) { return reason.empty() ? json(nullptr) : json(reason); }
// vLLM's stop_reason: the stop token id or stop string that ended a "stop", else null.
json stop_reason_json(const GenerationResult& r) {
  if (r.stop_token_id) return *r.stop_token_id;
  if (r.stop_string) return *r.stop_string;
  return nullptr;
}
}  // namespace

namespace {
std::string token_string(const ResponseContext& ctx, int32_t id) { return ctx.token_bytes ? ctx.token_bytes(id) : ""; }
// vLLM's stand-in for -inf (JSON has no infinities).
double finite_logprob(float v) { return std::isfinite(v) ? static_cast<double>(v) : -9999.0; }
json bytes_json(const std::string& t) {
  json b = json::array();
  for (unsigned char c : t) b.push_back(static_cast<int>(c));
  return b;
}
// Characters (code points) of UTF-8 bytes, counting the lead bytes, as Python's len() would count
// the decoded text; a token holding part of a character counts what it starts.
size_t characters(const std::string& t) {
  size_t n = 0;
  for (unsigned char c : t) n += (c & 0xC0) != 0x80;
  return n;
}
}  // namespace

json logprobs_json(const ResponseContext& ctx, std::span<const int32_t> tokens, std::span<const TokenLogprobs> lps,
                   size_t& text_offset) {
  const size_t n = std::min(tokens.size(), lps.size());
  if (ctx.endpoint == Endpoint::Chat) {
    json content = json::array();
    for (size_t i = 0; i < n; ++i) {
      const std::string t = token_string(ctx, tokens[i]);
      json top = json::array();
      for (const TokenLogprob& e : lps[i].top) {
        const std::string et = token_string(ctx, e.id);
        top.push_back({{"token", et}, {"logprob", finite_logprob(e.logprob)}, {"bytes", bytes_json(et)}});
      }
      content.push_back(
          {{"token", t}, {"logprob", finite_logprob(lps[i].logprob)}, {"bytes", bytes_json(t)}, {"top_logprobs", top}});
    }
    return json{{"content", std::move(content)}, {"refusal", nullptr}};
  }
  json toks = json::array(), token_logprobs = json::array(), top = json::array(), offsets = json::array();
  for (size_t i = 0; i < n; ++i) {
    const std::string t = token_string(ctx, tokens[i]);
    toks.push_back(t);
    token_logprobs.push_back(finite_logprob(lps[i].logprob));
    json alternatives = json::object();
    for (const TokenLogprob& e : lps[i].top) {
      const std::string et = token_string(ctx, e.id);
      if (!alternatives.contains(et)) alternatives[et] = finite_logprob(e.logprob);
    }
    top.push_back(std::move(alternatives));
    offsets.push_back(text_offset);
    text_offset += characters(t);
  }
  return json{{"tokens", std::move(toks)},
              {"token_logprobs", std::move(token_logprobs)},
              {"top_logprobs", std::move(top)},
              {"text_offset", std::move(offsets)}};
}

// vLLM's prompt_logprobs: null for the first prompt token, then per token an object keyed by token
// id holding the prompt token's entry and its top ctx.prompt_logprobs alternatives, each
// {logprob, rank, decoded_token}.
json prompt_logprobs_json(const ResponseContext& ctx, const GenerationResult& result) {
  json out = json::array();
  if (result.prompt.empty()) return out;
  out.push_back(nullptr);
  const size_t n = std::min(result.prompt_logprobs.size(), result.prompt.size() - 1);
  const auto entry = [&](int32_t id, float logprob, int64_t rank) {
    return json{{"logprob", finite_logprob(logprob)}, {"rank", rank}, {"decoded_token", token_string(ctx, id)}};
  };
  for (size_t i = 0; i < n; ++i) {
    const TokenLogprobs& lp = result.prompt_logprobs[i];
    const int32_t id = result.prompt[i + 1];
    json position = json::object();
    position[std::to_string(id)] = entry(id, lp.logprob, lp.rank);
    const size_t k = std::min(lp.top.size(), static_cast<size_t>(std::max(ctx.prompt_logprobs, 0)));
    for (size_t e = 0; e < k; ++e) {
      const std::string key = std::to_string(lp.top[e].id);
      if (!position.contains(key)) position[key] = entry(lp.top[e].id, lp.top[e].logprob, static_cast<int64_t>(e) + 1);
    }
    out.push_back(std::move(position));
  }
  return out;
}

json completion_body(const ResponseContext& ctx, std::span<const GenerationResult> results) {
  json body = envelope(ctx, false);
  json choices = json::array();
  size_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
  for (size_t i = 0; i < results.size(); ++i) {
    const GenerationResult& result = results[i];
    json choice = {{"index", i}};
    const size_t prompt_index = i / static_cast<size_t>(std::max(ctx.n, 1));
    const GenerationResult& scored = results[prompt_index * static_cast<size_t>(std::max(ctx.n, 1))];  // choice 0
    const std::string echo = prompt_index < ctx.echo_texts.size() ? ctx.echo_texts[prompt_index] : std::string();
    std::string finish_reason = result.finish_reason;
    if (ctx.endpoint == Endpoint::Chat && ctx.tools.active()) {
      const ToolReply reply = tool_reply(ctx.tools, result.text, tool_id_seed_for(ctx, static_cast<int>(i)));
      choice["message"] = {{"role", "assistant"}, {"content", reply.content ? json(*reply.content) : json(nullptr)}};
      if (!reply.calls.empty()) choice["message"]["tool_calls"] = tool_calls_json(reply.calls);
      finish_reason = tool_finish_reason(finish_reason, !reply.calls.empty());
    } else if (ctx.endpoint == Endpoint::Chat) {
      choice["message"] = {{"role", "assistant"}, {"content", result.text}};
    } else {
      choice["text"] = echo + result.text;
    }
    size_t offset = characters(echo);
    if (ctx.logprobs >= 0 && !echo.empty() && scored.prompt_logprobs.size() + 1 == result.prompt.size()) {
      // echo with logprobs: the prompt's tokens first, the first without a log probability (null,
      // as OpenAI gives it), then the generated ones.
      std::vector<int32_t> tokens = result.prompt;
      tokens.insert(tokens.end(), result.token_ids.begin(), result.token_ids.end());
      std::vector<TokenLogprobs> lps(1);
      lps.insert(lps.end(), scored.prompt_logprobs.begin(), scored.prompt_logprobs.end());
      // The prompt was scored with the larger of logprobs and prompt_logprobs: echo shows logprobs' k.
      for (TokenLogprobs& lp : lps)
        if (lp.top.size() > static_cast<size_t>(ctx.logprobs)) lp.top.resize(static_cast<size_t>(ctx.logprobs));
      lps.insert(lps.end(), result.logprobs.begin(), result.logprobs.end());
      offset = 0;
      json lp = logprobs_json(ctx, tokens, lps, offset);
      lp["token_logprobs"][0] = nullptr;
      lp["top_logprobs"][0] = nullptr;
      choice["logprobs"] = std::move(lp);
    } else {
      choice["logprobs"] =
          ctx.logprobs >= 0 ? logprobs_json(ctx, result.token_ids, result.logprobs, offset) : json(nullptr);
    }
    if (ctx.prompt_logprobs >= 0 && ctx.endpoint != Endpoint::Chat)
      choice["prompt_logprobs"] = prompt_logprobs_json(ctx, scored);
    choice["finish_reason"] = finish_json(finish_reason);
    choice["stop_reason"] = stop_reason_json(result);
    if (ctx.return_token_ids) {
      choice["token_ids"] = result.token_ids;
      choice["prompt_token_ids"] = result.prompt;
    }
    choices.push_back(std::move(choice));
    // OpenAI counts a prompt once however many choices it has (its cached part with it).
    if (i % static_cast<size_t>(std::max(ctx.n, 1)) == 0) {
      prompt_tokens += result.prompt.size();
      cached_tokens += static_cast<size_t>(result.cached_tokens);
    }
    completion_tokens += result.token_ids.size();
  }
  body["choices"] = std::move(choices);
  // Chat has one prompt: vLLM gives its log probabilities once, beside the choices.
  if (ctx.prompt_logprobs >= 0 && ctx.endpoint == Endpoint::Chat && !results.empty())
    body["prompt_logprobs"] = prompt_logprobs_json(ctx, results[0]);
  body["usage"] = usage_json(prompt_tokens, completion_tokens, cached_tokens);
  return body;
}

json completion_body(const ResponseContext& ctx, const GenerationResult& result) {
  return completion_body(ctx, std::span<const GenerationResult>(&result, 1));
}

json stream_chunk(const ResponseContext& ctx, int index, std::string_view text, std::span<const int32_t> tokens,
                  const std::string& finish_reason, bool first, bool include_usage_null,
                  std::span<const TokenLogprobs> logprobs, size_t* text_offset) {
  json body = envelope(ctx, true);
  json choice = {{"index", index}};
  if (ctx.endpoint == Endpoint::Chat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!text.empty() || (first && finish_reason.empty())) delta["content"] = std::string(text);
    choice["delta"] = std::move(delta);
  } else {
    choice["text"] = std::string(text);
  }
  size_t scratch = 0;
  choice["logprobs"] = ctx.logprobs >= 0 && !logprobs.empty()
                           ? logprobs_json(ctx, tokens, logprobs, text_offset ? *text_offset : scratch)
                           : json(nullptr);
  choice["finish_reason"] = finish_json(finish_reason);
  if (ctx.return_token_ids) choice["token_ids"] = std::vector<int32_t>(tokens.begin(), tokens.end());
  body["choices"] = json::array({std::move(choice)});
  // With include_usage every chunk but the last carries "usage": null (OpenAI's shape).
  if (include_usage_null) body["usage"] = nullptr;
  return body;
}

json tool_calls_chunk(const ResponseContext& ctx, int index, const json& tool_calls, bool include_usage_null) {
  json body = envelope(ctx, true);
  body["choices"] = json::array(
      {{{"index", index}, {"delta", {{"tool_calls", tool_calls}}}, {"logprobs", nullptr}, {"finish_reason", nullptr}}});
  if (include_usage_null) body["usage"] = nullptr;
  return body;
}

uint64_t tool_id_seed_for(const ResponseContext& ctx, int index) {
  return ctx.tool_id_seed + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(index);
}

std::string tool_finish_reason(const std::string& finish_reason, bool called) {
  return called && finish_reason == "stop" ? "tool_calls" : finish_reason;
}

json usage_chunk(const ResponseContext& ctx, size_t prompt_tokens, size_t completion_tokens, size_t cached_tokens) {
  json body = envelope(ctx, true);
  body["choices"] = json::array();
  body["usage"] = usage_json(prompt_tokens, completion_tokens, cached_tokens);
  return body;
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }
std::string sse_event(const json& j) { return "data: " + dump(j) + "\n\n"; }
std::string sse_done() { return "data: [DONE]\n\n"; }

}  // namespace fdpp::server
