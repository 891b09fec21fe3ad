// A model and a prompt codec for exercising fdpp serve's request parsing without a tokenizer
// (tests/test_server_api.cpp and fuzz/api_request_fuzz.cpp).
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "server/api.h"

namespace fdpp::server::fakes {

// Ids are the bytes of the text (+1, so that no id is 0); chat renders "role:content;" per
// message (then "thinking:0;" or "thinking:1;" when enable_thinking is given), so tests can
// predict prompts exactly.
inline PromptCodec byte_codec() {
  PromptCodec c;
  c.encode = [](std::string_view text) {
    std::vector<int32_t> ids;
    for (unsigned char ch : text) ids.push_back(ch + 1);
    return ids;
  };
  c.encode_chat = [c](std::span<const ChatMessage> messages, const ChatOptions& options) {
    std::string s;
    for (const ChatMessage& m : messages) s += m.role + ":" + m.content + ";";
    if (options.enable_thinking) s += *options.enable_thinking ? "thinking:1;" : "thinking:0;";
    return c.encode(s);
  };
  return c;
}

// A 64-token context and a 300-token vocabulary: every byte's id fits, long prompts do not.
inline ModelInfo tiny_model() {
  ModelInfo m;
  m.id = "tiny.gguf";
  m.aliases = {"/models/tiny.gguf"};
  m.max_context = 64;
  m.vocab_size = 300;
  return m;
}

}  // namespace fdpp::server::fakes
