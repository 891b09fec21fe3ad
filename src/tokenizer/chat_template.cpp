// Chat templates, recognized by their markers in tokenizer.chat_template and rendered natively (no
// Jinja engine): each renderer reproduces what transformers' apply_chat_template makes of the
// model's template for plain role/content conversations.
//
// - ChatML (<|im_start|>: SmolLM2, Qwen2, ...): "<|im_start|>{role}\n{content}<|im_end|>\n" per
//   message, "<|im_start|>assistant\n" as the generation prompt. A template that writes a fixed
//   system message when the conversation has none (SmolLM2: "You are a helpful AI assistant named
//   SmolLM, trained by Hugging Face"; Qwen2: "You are a helpful assistant"; Qwen2.5: "You are
//   Qwen, created by Alibaba Cloud. You are a helpful assistant.") has that text read out of the
//   template and written before the first message when it is not a system message. Qwen2.5's
//   template also writes tool definitions and tool calls, which plain conversations never reach.
// - Qwen3 (ChatML whose template reads enable_thinking): no default system message; an assistant
//   message after the conversation's last user query is written as "<think>\n{reasoning}\n</think>
//   \n\n{answer}" when it is the last message or has reasoning (its content's "<think>...</think>"
//   part); earlier assistant messages lose their reasoning; "tool" messages are wrapped in
//   <tool_response> inside a user turn; ChatOptions::enable_thinking == false adds an empty
//   "<think>\n\n</think>\n\n" after the generation prompt.
// - Llama 3 (<|start_header_id|>): "<|start_header_id|>{role}<|end_header_id|>\n\n{content|trim}
//   <|eot_id|>", BOS text before the first message.
// - Llama 3.1/3.2/3.3 (<|start_header_id|> and "Cutting Knowledge Date"): as Llama 3, after a
//   system block that is always written: "Cutting Knowledge Date: December 2023\nToday Date: {date}
//   \n\n{system message|trim}"; date is today (local time, "%d %b %Y") when the template calls
//   strftime_now (3.2), else the template's fixed date_string (3.1: "26 Jul 2024"). No tools.
// - Llama 2 ([INST] with <<SYS>>): "<s>[INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST]
//   {assistant} </s>", contents stripped, roles alternating user/assistant.
// - Mistral ([INST] without <<SYS>>): BOS text, then "[INST] {user}[/INST]" and " {assistant}</s>"
//   per message, roles alternating user/assistant after an optional system message, which is
//   written as "{system}\n\n" before one user message's content. The published templates differ
//   in details that are read from the template's text (MistralStyle).
//
// Tools (ChatOptions::tools, assistant tool_calls, "tool" messages) as each family's template
// writes them, with the arguments of earlier calls parsed and printed by tojson (as vLLM hands
// them to the template):
// - Qwen3: its own template's "# Tools" system block and <tool_call> messages.
// - Llama 3.1+: the tools in the first user message (tools_in_user_message, the template's
//   default), "Environment: ipython" in the system block, a call as {"name", "parameters"}, a
//   result as an "ipython" message whose content is printed by tojson (the template tests
//   `content is iterable`, which a string is, so the result is a quoted JSON string).
// - Mistral templates with [AVAILABLE_TOOLS] (v0.3): the tools before the last user message,
//   [TOOL_CALLS] [...] and [TOOL_RESULTS] with 9-character call ids (the last 9 of longer ones).
// - Every other template (ChatML: SmolLM2, Qwen2, Qwen2.5; Llama 3; Llama 2; older Mistral;
//   ChatGLM2) gets the generic format, which is Qwen2.5's: the "# Tools" block appended to the
//   system message (the template's default one, or a new one; the first user message where the
//   template takes no system message), calls written as <tool_call> text in the assistant's
//   content, results as a user message of <tool_response> blocks. For Qwen2.5 this is exactly
//   its template's output.
#include <algorithm>
#include <ctime>

#include "fdpp/error.h"
#include "tokenizer/internal.h"
#include "tokenizer/tool_calls.h"

namespace fdpp::tok {
namespace {

using ojson = nlohmann::ordered_json;

bool contains(std::string_view s, std::string_view what) { return s.find(what) != std::string_view::npos; }

// Python's str.strip() for the whitespace chat contents carry.
std::string_view trim(std::string_view s) {
  const auto ws = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; };
  while (!s.empty() && ws(s.front())) s.remove_prefix(1);
  while (!s.empty() && ws(s.back())) s.remove_suffix(1);
  return s;
}

// The fixed system message of a ChatML template: the literal text between "<|im_start|>system\n"
// and "<|im_end|>" inside one quoted string (so not a "... + message['content'] + ..." expression).
// Jinja string escapes (\n, \t, \\, \', \") are undone. Empty when the template has none.
std::string chatml_default_system(std::string_view tmpl) {
  static constexpr std::string_view kHead = "<|im_start|>system";
  size_t pos = 0;
  while ((pos = tmpl.find(kHead, pos)) != std::string_view::npos) {
    size_t i = pos + kHead.size();
    pos = i;
    if (tmpl.compare(i, 1, "\n") == 0) i += 1;
    else if (tmpl.compare(i, 2, "\\n") == 0) i += 2;
    else continue;
    const size_t end = tmpl.find("<|im_end|>", i);
    if (end == std::string_view::npos) break;
    const std::string_view body = tmpl.substr(i, end - i);
    if (body.empty() || body.find_first_of("'\"{}+") != std::string_view::npos) continue;
    std::string out;
    for (size_t k = 0; k < body.size(); ++k) {
      if (body[k] == '\\' && k + 1 < body.size()) {
        const char c = body[++k];
        out += c == 'n' ? '\n' : c == 't' ? '\t' : c;
      } else {
        out += body[k];
      }
    }
    return out;
  }
  return {};
}

// ---- Tools ----------------------------------------------------------------------------------

std::vector<ojson> parsed_tools(const ChatOptions& options) {
  std::vector<ojson> out;
  for (size_t i = 0; i < options.tools.size(); ++i) {
    ojson t = parse_ordered_json(options.tools[i], fmt::format("tools[{}]", i));
    check(t.is_object(), "chat template: tools[{}] is not an object", i);
    out.push_back(std::move(t));
  }
  return out;
}

ojson call_arguments(const ToolCall& call, size_t message) {
  ojson a = parse_ordered_json(call.arguments.empty() ? std::string_view("{}") : std::string_view(call.arguments),
                               fmt::format("the arguments of message {}'s tool call '{}'", message, call.name));
  return a;
}

bool has_tool_messages(std::span<const ChatMessage> messages) {
  return std::any_of(messages.begin(), messages.end(),
                     [](const ChatMessage& m) { return m.role == "tool" || !m.tool_calls.empty(); });
}

// Qwen's (Hermes') tool prompt: the tool signatures in <tools></tools>, and how to call one.
std::string hermes_tools_prompt(const std::vector<ojson>& tools) {
  std::string out =
      "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with "
      "function signatures within <tools></tools> XML tags:\n<tools>";
  for (const ojson& t : tools) out += "\n" + tojson(t);
  out += "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
         "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
         "<args-json-object>}\n</tool_call>";
  return out;
}

// An assistant message's calls after its content, as Qwen's templates write them: a newline before
// each call but a first one that opens the message.
std::string hermes_calls(std::string_view content, std::span<const ToolCall> calls, size_t message) {
  std::string out;
  for (size_t k = 0; k < calls.size(); ++k) {
    if (k > 0 || !content.empty()) out += '\n';
    out += "<tool_call>\n{\"name\": \"" + calls[k].name + "\", \"arguments\": ";
    out += tojson(call_arguments(calls[k], message));
    out += "}\n</tool_call>";
  }
  return out;
}

}  // namespace

std::vector<ChatMessage> generic_tool_conversation(std::span<const ChatMessage> messages, const ChatOptions& options,
                                                   const std::string& default_system, bool system_ok) {
  const std::vector<ojson> tools = parsed_tools(options);
  const std::string prompt = tools.empty() ? std::string() : hermes_tools_prompt(tools);
  std::vector<ChatMessage> out;
  std::string first_user_prefix;
  size_t i = 0;
  if (!prompt.empty()) {
    if (!messages.empty() && messages[0].role == "system") {
      out.push_back({"system", messages[0].content + "\n\n" + prompt});
      i = 1;
    } else if (system_ok) {
      out.push_back({"system", default_system.empty() ? prompt : default_system + "\n\n" + prompt});
    } else {
      first_user_prefix = prompt + "\n\n";
    }
  }
  for (; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "assistant" && !m.tool_calls.empty()) {
      out.push_back({"assistant", m.content + hermes_calls(m.content, m.tool_calls, i)});
    } else if (m.role == "tool") {
      std::string piece = "<tool_response>\n" + m.content + "\n</tool_response>";
      // Consecutive results share one user message.
      if (i > 0 && messages[i - 1].role == "tool" && !out.empty()) out.back().content += "\n" + piece;
      else out.push_back({"user", std::move(piece)});
    } else {
      out.push_back({m.role, m.content});
    }
    if (!first_user_prefix.empty() && out.back().role == "user") {
      out.back().content = first_user_prefix + out.back().content;
      first_user_prefix.clear();
    }
  }
  return out;
}

namespace {

bool wants_tools(std::span<const ChatMessage> messages, const ChatOptions& options) {
  return !options.tools.empty() || has_tool_messages(messages);
}

std::string render_chatml(std::string_view tmpl, std::span<const ChatMessage> messages, bool add_generation_prompt) {
  std::string out;
  const std::string default_system = chatml_default_system(tmpl);
  if (!default_system.empty() && !messages.empty() && messages[0].role != "system")
    out += "<|im_start|>system\n" + default_system + "<|im_end|>\n";
  for (const ChatMessage& m : messages) out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

// Python's str.strip(chars) family over one character, as Qwen3's template calls them with '\n'.
std::string_view lstrip_nl(std::string_view s) {
  while (!s.empty() && s.front() == '\n') s.remove_prefix(1);
  return s;
}
std::string_view rstrip_nl(std::string_view s) {
  while (!s.empty() && s.back() == '\n') s.remove_suffix(1);
  return s;
}

bool is_tool_response(std::string_view s) {
  return s.starts_with("<tool_response>") && s.ends_with("</tool_response>");
}

std::string render_qwen3(std::span<const ChatMessage> messages, bool add_generation_prompt,
                         const ChatOptions& options) {
  const size_t n = messages.size();
  // The last user message that is not a tool response: assistant messages after it keep their
  // reasoning.
  size_t last_query = n == 0 ? 0 : n - 1;
  for (size_t i = n; i-- > 0;)
    if (messages[i].role == "user" && !is_tool_response(messages[i].content)) {
      last_query = i;
      break;
    }
  std::string out;
  const std::vector<ojson> tools = parsed_tools(options);
  size_t first = 0;
  if (!tools.empty()) {
    // The system message goes into the tools block, before it.
    out += "<|im_start|>system\n";
    if (n > 0 && messages[0].role == "system") {
      out += messages[0].content + "\n\n";
      first = 1;
    }
    out += hermes_tools_prompt(tools) + "<|im_end|>\n";
  }
  for (size_t i = first; i < n; ++i) {
    const ChatMessage& m = messages[i];
    const bool last = i + 1 == n;
    if (m.role == "user" || m.role == "system") {
      out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
    } else if (m.role == "assistant") {
      std::string_view content = m.content, reasoning;
      if (const size_t close = content.find("</think>"); close != std::string_view::npos) {
        // content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n')
        std::string_view before = rstrip_nl(content.substr(0, close));
        if (const size_t open = before.rfind("<think>"); open != std::string_view::npos)
          before = before.substr(open + 7);
        reasoning = lstrip_nl(before);
        content = lstrip_nl(content.substr(content.rfind("</think>") + 8));
      }
      out += "<|im_start|>assistant\n";
      if (i > last_query && (last || !reasoning.empty())) {
        out += "<think>\n";
        out += lstrip_nl(rstrip_nl(reasoning));
        out += "\n</think>\n\n";
        out += lstrip_nl(content);
      } else {
        out += content;
      }
      out += hermes_calls(content, m.tool_calls, i);
      out += "<|im_end|>\n";
    } else if (m.role == "tool") {
      if (i == 0 || messages[i - 1].role != "tool") out += "<|im_start|>user";
      out += "\n<tool_response>\n" + m.content + "\n</tool_response>";
      if (last || messages[i + 1].role != "tool") out += "<|im_end|>\n";
    } else {
      fail("chat template (Qwen3): unknown role '{}' at message {} (supported: system, user, assistant, tool)", m.role,
           i);
    }
  }
  if (add_generation_prompt) {
    out += "<|im_start|>assistant\n";
    if (options.enable_thinking == false) out += "<think>\n\n</think>\n\n";
  }
  return out;
}

std::string render_llama3(std::span<const ChatMessage> messages, bool add_generation_prompt, const std::string& bos) {
  std::string out;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (i == 0) out += bos;
    out += "<|start_header_id|>" + messages[i].role + "<|end_header_id|>\n\n";
    out += trim(messages[i].content);
    out += "<|eot_id|>";
  }
  if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

// The date a Llama 3.1+ template writes as "Today Date".
std::string llama31_date(std::string_view tmpl) {
  if (contains(tmpl, "strftime_now")) {
    // transformers' strftime_now is datetime.now().strftime(format): local time.
    const std::time_t now = std::time(nullptr);
    std::tm local{};
    localtime_r(&now, &local);
    char buf[32];
    std::strftime(buf, sizeof(buf), "%d %b %Y", &local);
    return buf;
  }
  static constexpr std::string_view kSet = "date_string = \"";
  const size_t pos = tmpl.find(kSet);
  if (pos != std::string_view::npos) {
    const size_t start = pos + kSet.size(), end = tmpl.find('"', start);
    if (end != std::string_view::npos && end - start < 40) return std::string(tmpl.substr(start, end - start));
  }
  return "26 Jul 2024";
}

std::string render_llama31(std::string_view tmpl, std::span<const ChatMessage> messages, bool add_generation_prompt,
                           const std::string& bos, const ChatOptions& options) {
  const std::vector<ojson> tools = parsed_tools(options);
  std::string system;
  size_t offset = 0;  // messages dropped from the front, for the indices in messages
  if (!messages.empty() && messages[0].role == "system") {
    system = trim(messages[0].content);
    messages = messages.subspan(1);
    offset = 1;
  }
  std::string out = bos;
  out += "<|start_header_id|>system<|end_header_id|>\n\n";
  if (!tools.empty()) out += "Environment: ipython\n";
  out += "Cutting Knowledge Date: December 2023\nToday Date: ";
  out += llama31_date(tmpl);
  out += "\n\n" + system + "<|eot_id|>";
  if (!tools.empty()) {
    // The template's default tools_in_user_message: the first message after the system one
    // carries the tools, whatever its role.
    check(!messages.empty(),
          "chat template (Llama 3.1): cannot put tools in the first user message when there's no first user message");
    out += "<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please respond with a JSON for "
           "a function call with its proper arguments that best answers the given prompt.\n\nRespond in the format "
           "{\"name\": function name, \"parameters\": dictionary of argument name and its value}.Do not use "
           "variables.\n\n";
    for (const ojson& t : tools) out += tojson(t, 4) + "\n\n";
    out += trim(messages[0].content);
    out += "<|eot_id|>";
    messages = messages.subspan(1);
    ++offset;
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (!m.tool_calls.empty()) {
      check(m.tool_calls.size() == 1, "chat template (Llama 3.1): this model only supports single tool-calls at once "
            "(message {} has {})", i + offset, m.tool_calls.size());
      const ToolCall& call = m.tool_calls[0];
      out += "<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"" + call.name + "\", \"parameters\": ";
      out += tojson(call_arguments(call, i + offset));
      out += "}<|eot_id|>";
    } else if (m.role == "tool" || m.role == "ipython") {
      out += "<|start_header_id|>ipython<|end_header_id|>\n\n" + tojson(ojson(m.content)) + "<|eot_id|>";
    } else {
      out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n";
      out += trim(m.content);
      out += "<|eot_id|>";
    }
  }
  if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

std::string render_llama2(std::span<const ChatMessage> messages, const std::string& bos, const std::string& eos) {
  std::string out;
  std::string system;
  bool has_system = false;
  if (!messages.empty() && messages[0].role == "system") {
    system = messages[0].content;
    has_system = true;
    messages = messages.subspan(1);
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    const bool user_turn = i % 2 == 0;
    check((m.role == "user") == user_turn && (m.role == "user" || m.role == "assistant"),
          "chat template (Llama 2): conversation roles must alternate user/assistant/user/..., got '{}' at message {}",
          m.role, i + (has_system ? 1 : 0));
    std::string content = m.content;
    if (i == 0 && has_system) content = "<<SYS>>\n" + system + "\n<</SYS>>\n\n" + content;
    if (m.role == "user") {
      out.append(bos).append("[INST] ").append(trim(content)).append(" [/INST]");
    } else {
      out.append(" ").append(trim(content)).append(" ").append(eos);
    }
  }
  return out;
}

// What a Mistral template does, from its text. Published forms (tokenizer_config.json):
//   v0.1 / Mixtral:  "[INST] " + content + " [/INST]", assistant content + eos; no system message.
//   v0.2:            " [INST] " ... " [/INST]", the system message on the first user message,
//                    assistant " " + content + eos.
//   v0.3:            "[INST] " ... "[/INST]", the system message on every user message equal to the
//                    last one (the template compares messages with ==), assistant " " + content|trim
//                    + eos.
//   Others put it on the user message that ends the conversation ("loop.last").
struct MistralStyle {
  enum class System { None, First, LastMessage, EqualToLastUser } system = System::None;
  std::string inst_open = "[INST] ", inst_close = "[/INST]";
  bool assistant_space = false, assistant_trim = false, space_after_eos = false;
};

MistralStyle mistral_style(std::string_view t) {
  // Each marker in both quote styles, as templates spell them either way.
  const auto has = [&](std::string_view single_quoted) {
    std::string double_quoted(single_quoted);
    std::replace(double_quoted.begin(), double_quoted.end(), '\'', '"');
    return contains(t, single_quoted) || contains(t, double_quoted);
  };
  MistralStyle s;
  if (has("' [INST] '")) s.inst_open = " [INST] ";
  if (has("' [/INST]'")) s.inst_close = " [/INST]";
  if (contains(t, "system_message")) {
    using S = MistralStyle::System;
    s.system = contains(t, "loop.first and system_message")  ? S::First
               : contains(t, "loop.last and system_message") ? S::LastMessage
                                                             : S::EqualToLastUser;
  }
  s.assistant_space = has("' ' + message['content']");
  s.assistant_trim = has("message['content']|trim") || has("message['content'] | trim");
  s.space_after_eos = has("eos_token + ' '");
  return s;
}

// A call id as Mistral's templates take it: 9 characters (vLLM keeps the last 9 of longer ids).
std::string mistral_call_id(const std::string& id, size_t message) {
  check(id.size() >= 9, "chat template (Mistral): tool call ids must be 9 characters, got '{}' at message {}", id,
        message);
  return id.substr(id.size() - 9);
}

// [AVAILABLE_TOOLS] [...][/AVAILABLE_TOOLS] as v0.3 writes it: each function's items but "return",
// strings quoted as they are, other values by tojson.
std::string mistral_tools(const std::vector<ojson>& tools) {
  std::string out = "[AVAILABLE_TOOLS] [";
  for (size_t k = 0; k < tools.size(); ++k) {
    const auto f = tools[k].find("function");
    check(f != tools[k].end() && f->is_object(), "chat template (Mistral): tools[{}] has no \"function\" object", k);
    out += "{\"type\": \"function\", \"function\": {";
    bool first = true;
    for (auto it = f->begin(); it != f->end(); ++it) {
      if (it.key() == "return") continue;
      if (!first) out += ", ";
      first = false;
      if (it->is_string()) out += "\"" + it.key() + "\": \"" + it->get<std::string>() + "\"";
      else out += "\"" + it.key() + "\": " + tojson(*it);
    }
    out += "}}";
    out += k + 1 < tools.size() ? ", " : "]";
  }
  return out + "[/AVAILABLE_TOOLS]";
}

std::string render_mistral(std::string_view tmpl, std::span<const ChatMessage> messages, const std::string& bos,
                           const std::string& eos, const ChatOptions& options) {
  const MistralStyle style = mistral_style(tmpl);
  // Templates with tool syntax (v0.3) write tools natively; the older ones get the generic format.
  const bool tool_syntax = contains(tmpl, "[AVAILABLE_TOOLS]");
  std::vector<ChatMessage> generic;
  if (!tool_syntax && wants_tools(messages, options)) {
    generic = generic_tool_conversation(messages, options, "", style.system != MistralStyle::System::None);
    messages = generic;
  }
  const std::vector<ojson> tools = tool_syntax ? parsed_tools(options) : std::vector<ojson>{};
  std::string system;
  bool has_system = false;
  if (!messages.empty() && messages[0].role == "system") {
    check(style.system != MistralStyle::System::None,
          "chat template (Mistral): this model's template takes no system message");
    system = messages[0].content;
    has_system = true;
    messages = messages.subspan(1);
  }
  const size_t offset = has_system ? 1 : 0;
  // Roles alternate user/assistant, the tool calls and their results aside.
  size_t turn = 0;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    const std::string& role = m.role;
    const bool tool_message = tool_syntax && (role == "tool" || !m.tool_calls.empty());
    check(role == "user" || role == "assistant" || (tool_syntax && role == "tool"),
          "chat template (Mistral): only user and assistant messages{} after an optional first system message, got "
          "'{}' at message {}",
          tool_syntax ? " (and tool results)" : "", role, i + offset);
    if (tool_message) continue;
    check((role == "user") == (turn % 2 == 0),
          "chat template (Mistral): conversation roles must alternate user/assistant/user/..., got '{}' at message {}",
          role, i + offset);
    ++turn;
  }
  const std::string* last_user = nullptr;
  for (const ChatMessage& m : messages)
    if (m.role == "user") last_user = &m.content;
  std::string out = bos;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "user") {
      bool with_system = false;
      switch (style.system) {
        case MistralStyle::System::None:
          break;
        case MistralStyle::System::First:
          with_system = i == 0;
          break;
        case MistralStyle::System::LastMessage:
          with_system = i + 1 == messages.size();
          break;
        case MistralStyle::System::EqualToLastUser:
          with_system = m.content == *last_user;
          break;
      }
      if (!tools.empty() && m.content == *last_user) out += mistral_tools(tools);
      out += style.inst_open;
      if (has_system && with_system) out += system + "\n\n";
      out += m.content + style.inst_close;
    } else if (tool_syntax && !m.tool_calls.empty()) {
      out += "[TOOL_CALLS] [";
      for (size_t k = 0; k < m.tool_calls.size(); ++k) {
        const ToolCall& call = m.tool_calls[k];
        ojson function = ojson::object();
        function["name"] = call.name;
        function["arguments"] = call_arguments(call, i + offset);
        const std::string f = tojson(function);
        out += f.substr(0, f.size() - 1) + ", \"id\": \"" + mistral_call_id(call.id, i + offset) + "\"}";
        out += k + 1 < m.tool_calls.size() ? ", " : "]" + eos;
      }
    } else if (m.role == "tool") {
      out += "[TOOL_RESULTS] {\"content\": " + m.content + ", \"call_id\": \"" +
             mistral_call_id(m.tool_call_id, i + offset) + "\"}[/TOOL_RESULTS]";
    } else {
      if (style.assistant_space) out += ' ';
      out += style.assistant_trim ? std::string(trim(m.content)) : m.content;
      out += eos;
      if (style.space_after_eos) out += ' ';
    }
  }
  return out;
}

}  // namespace

ToolCallFormat chat_tool_call_format(const std::string& tmpl) {
  if (contains(tmpl, "<|start_header_id|>") && contains(tmpl, "Cutting Knowledge Date")) return ToolCallFormat::kLlama3Json;
  if (!contains(tmpl, "<|im_start|>") && contains(tmpl, "[INST]") && !contains(tmpl, "<<SYS>>") &&
      contains(tmpl, "[AVAILABLE_TOOLS]"))
    return ToolCallFormat::kMistral;
  return ToolCallFormat::kHermes;
}

std::string render_chat_template(const std::string& tmpl, std::span<const ChatMessage> messages,
                                 bool add_generation_prompt, const std::string& bos_text, const std::string& eos_text,
                                 const ChatOptions& options) {
  if (contains(tmpl, "<|im_start|>") && contains(tmpl, "enable_thinking"))
    return render_qwen3(messages, add_generation_prompt, options);
  // The families without tool syntax of their own: the generic format, rendered by the template.
  std::vector<ChatMessage> generic;
  const auto with_generic_tools = [&](const std::string& default_system) {
    if (!wants_tools(messages, options)) return messages;
    generic = generic_tool_conversation(messages, options, default_system, /*system_ok=*/true);
    return std::span<const ChatMessage>(generic);
  };
  if (contains(tmpl, "<|im_start|>"))
    return render_chatml(tmpl, with_generic_tools(chatml_default_system(tmpl)), add_generation_prompt);
  if (contains(tmpl, "<|start_header_id|>")) {
    if (contains(tmpl, "Cutting Knowledge Date"))
      return render_llama31(tmpl, messages, add_generation_prompt, bos_text, options);
    return render_llama3(with_generic_tools(""), add_generation_prompt, bos_text);
  }
  if (contains(tmpl, "[INST]") && contains(tmpl, "<<SYS>>"))
    return render_llama2(with_generic_tools(""), bos_text, eos_text);
  if (contains(tmpl, "[INST]")) return render_mistral(tmpl, messages, bos_text, eos_text, options);
  if (tmpl.empty()) fail("chat template not supported: the model has no tokenizer.chat_template");
  std::string head = tmpl.substr(0, 80);
  std::replace(head.begin(), head.end(), '\n', ' ');
  fail("chat template not supported: \"{}{}\" (supported: ChatML, Qwen3, Llama 3, Llama 3.1+, Llama 2, Mistral)", head,
       tmpl.size() > 80 ? "..." : "");
}

}  // namespace fdpp::tok
