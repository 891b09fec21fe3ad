// fdpp generate -cnv / -i: an interactive chat, as llama.cpp's llama-cli runs one (chat.cpp).
#pragma once

#include <string>
#include <string_view>

#include "cli_common.h"

namespace fdpp::cli {

// The context a chat gets when -c is not given: llama.cpp's default (-c 4096), within the model's.
inline constexpr int kDefaultChatContext = 4096;

// Runs the chat until /exit, end of input (Ctrl-D) or Ctrl-C at the prompt. a.prompt (from -p), when
// given, is the first message. Returns the exit status (0).
int run_chat(const GenerateArgs& a, const EngineArgs& e, bool quiet);

// llama.cpp's escape processing of -p (common.cpp's string_process_escapes): \n \r \t \' \" \\ and
// \xNN (two hex digits); any other backslash pair stays as it is.
std::string process_escapes(std::string_view text);

}  // namespace fdpp::cli
