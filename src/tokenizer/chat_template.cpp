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
#include <algorithm>
#include <ctime>

#include "fdpp/error.h"
#include "tokenizer/internal.h"

namespace fdpp::tok {
namespace {

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
  for (size_t i = 0; i < n; ++i) {
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
                           const std::string& bos) {
  std::string system;
  if (!messages.empty() && messages[0].role == "system") {
    system = trim(messages[0].content);
    messages = messages.subspan(1);
  }
  std::string out = bos;
  out += "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: ";
  out += llama31_date(tmpl);
  out += "\n\n" + system + "<|eot_id|>";
  for (const ChatMessage& m : messages) {
    out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n";
    out += trim(m.content);
    out += "<|eot_id|>";
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

std::string render_mistral(std::string_view tmpl, std::span<const ChatMessage> messages, const std::string& bos,
                           const std::string& eos) {
  const MistralStyle style = mistral_style(tmpl);
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
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    check(role == "user" || role == "assistant",
          "chat template (Mistral): only user and assistant messages after an optional first system message, got '{}' "
          "at message {}",
          role, i + offset);
    check((role == "user") == (i % 2 == 0),
          "chat template (Mistral): conversation roles must alternate user/assistant/user/..., got '{}' at message {}",
          role, i + offset);
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
      out += style.inst_open;
      if (has_system && with_system) out += system + "\n\n";
      out += m.content + style.inst_close;
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

std::string render_chat_template(const std::string& tmpl, std::span<const ChatMessage> messages,
                                 bool add_generation_prompt, const std::string& bos_text, const std::string& eos_text,
                                 const ChatOptions& options) {
  if (contains(tmpl, "<|im_start|>") && contains(tmpl, "enable_thinking"))
    return render_qwen3(messages, add_generation_prompt, options);
  if (contains(tmpl, "<|im_start|>")) return render_chatml(tmpl, messages, add_generation_prompt);
  if (contains(tmpl, "<|start_header_id|>")) {
    if (contains(tmpl, "Cutting Knowledge Date")) return render_llama31(tmpl, messages, add_generation_prompt, bos_text);
    return render_llama3(messages, add_generation_prompt, bos_text);
  }
  if (contains(tmpl, "[INST]") && contains(tmpl, "<<SYS>>")) return render_llama2(messages, bos_text, eos_text);
  if (contains(tmpl, "[INST]")) return render_mistral(tmpl, messages, bos_text, eos_text);
  if (tmpl.empty()) fail("chat template not supported: the model has no tokenizer.chat_template");
  std::string head = tmpl.substr(0, 80);
  std::replace(head.begin(), head.end(), '\n', ' ');
  fail("chat template not supported: \"{}{}\" (supported: ChatML, Qwen3, Llama 3, Llama 3.1+, Llama 2, Mistral)", head,
       tmpl.size() > 80 ? "..." : "");
}

}  // namespace fdpp::tok
