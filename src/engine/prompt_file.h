// Prompts for a batch job (`fdpp generate --file`): a prompts file parsed and checked line by line,
// the per-request sampling values checked against the table of request limits
// (engine/request_limits.h, which the CLI's flags, the server, Python and the sampler share), and
// the GenerationRequests the Scheduler runs. Kept apart from the CLI so that the server and the
// Python package can read the same files and give the same errors.
//
// Formats (chosen by the file's extension: .jsonl / .ndjson / .json are JSON Lines, anything
// else is plain text):
//   JSON Lines: one object per line with "prompt" (a string), "messages" (an array of
//               {"role", "content"}, always rendered with the chat template) or
//               "prompt_token_ids" (token ids, used as they are: vLLM's TokensPrompt), optional "id" (any
//               JSON value, echoed in the output) and optional per-request fields that override the
//               command line: max_tokens, temperature, top_k, top_p, min_p, repeat_penalty,
//               repeat_last_n, seed, stop (a string or an array of strings), ignore_eos. Blank lines
//               are skipped; any other field is an error (a typo must not be ignored silently).
//   plain text: one prompt per line, blank lines skipped, a trailing '\r' removed.
// Every problem is an fdpp::Error "FILE:LINE: ...". A file (or standard input) over
// kMaxPromptFileBytes is refused: /dev/zero or an endless pipe must not exhaust memory.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/request_limits.h"
#include "engine/scheduler.h"
#include "fdpp/sampling.h"
#include "tokenizer/tokenizer.h"

namespace fdpp {

// The settings of one request. The command line gives the defaults; a JSON line overrides fields.
struct RequestSettings {
  SamplingParams sampling;  // sampling.seed: the request's seed
  int max_tokens = 128;
  bool ignore_eos = false;
  std::vector<std::string> stop;
  bool chat = false;    // render a plain prompt with the chat template
  std::string system;   // a system message (implies chat); "" for none
  ChatOptions chat_options;  // --chat-template-kwargs
};

struct PromptEntry {
  int line = 0;  // 1-based line in the file
  std::string prompt;
  std::vector<ChatMessage> messages;  // non-empty: a conversation instead of `prompt`
  std::vector<int32_t> prompt_token_ids;  // non-empty: the prompt's tokens, given instead of text
  std::string id_json;                // the line's "id" as JSON text, "" when absent
  // Fields the line sets; unset ones come from the command line.
  std::optional<int> max_tokens, top_k, repeat_last_n;
  std::optional<float> temperature, top_p, min_p, repeat_penalty;
  std::optional<uint64_t> seed;
  std::optional<std::vector<std::string>> stop;
  std::optional<bool> ignore_eos;

  // The defaults with this line's fields applied.
  RequestSettings settings(const RequestSettings& defaults) const;
};

enum class PromptFileFormat { JsonLines, Text };
PromptFileFormat prompt_file_format(const std::string& path);  // by extension

// source names the file in errors. Throws for a bad line and for a file without prompts.
std::vector<PromptEntry> parse_prompt_file(std::string_view content, PromptFileFormat format,
                                           const std::string& source);
// Reads and parses a file ("-": standard input, plain text).
std::vector<PromptEntry> read_prompt_file(const std::string& path);

// The CLI's flags' checks, each the problem of one entry of the table of request limits
// (engine/request_limits.h) that a JSON line, the server, Python and the sampler check too: "" when
// the value is allowed, else the problem ("must be in (0, 1] (1 = off)"); NaN and infinities are
// never allowed.
std::string temperature_problem(double v);     // [0, 100]; 0 = greedy
std::string top_k_problem(int64_t v);          // [-1, 2^24]; -1 or 0 = off
std::string top_p_problem(double v);           // (0, 1]; 1 = off (0 would keep no token)
std::string min_p_problem(double v);           // [0, 1]; 0 = off
std::string repeat_penalty_problem(double v);  // [0.01, 100]; 1 = off
std::string repeat_last_n_problem(int64_t v);  // [-1, 2^30]; -1 = all
// -n of a single prompt (the table's n_predict): [0, 2^24], 0 = the prompt only (llama.cpp's -n 0).
// A request (a JSON line's max_tokens, and the defaults build_request gets) needs [1, 2^24].
std::string max_tokens_problem(int64_t v);
std::string stop_problem(std::string_view s);  // 1..kMaxStopBytes bytes, valid UTF-8
// The Scheduler's limits on stop strings (engine/scheduler.h) are checked here first, so that the
// flag or the line is named.
inline constexpr size_t kMaxPromptFileBytes = size_t{256} << 20;  // 250K prompts of 1 KB

// "" when text is well-formed UTF-8 (Unicode Table 3-7: no overlongs, surrogates or values above
// U+10FFFF), else where it is not: "byte 0xff at offset 5 is not valid UTF-8".
std::string utf8_problem(std::string_view text);

// A random seed (std::random_device), below 2^63 so that it prints and parses as a JSON integer
// everywhere.
uint64_t random_seed();

// The prompt's token ids as `fdpp generate` builds them: a conversation, or a plain prompt (wrapped
// in the chat template as the user's message when chat or a system message is given); BOS as the
// model wants it, never twice (templates that write the BOS text themselves get no second one, as
// in transformers' apply_chat_template(tokenize=True)).
std::vector<int32_t> encode_prompt(const Tokenizer& tokenizer, const std::string& prompt,
                                   const std::vector<ChatMessage>& messages, bool chat, const std::string& system,
                                   const ChatOptions& chat_options = {});

// A JSON object of chat template variables (llama.cpp's --chat-template-kwargs, the server's
// chat_template_kwargs) -> ChatOptions. Known: enable_thinking (true, false or null). Throws
// fdpp::Error naming the key for another key, a wrong type or text that is not a JSON object.
ChatOptions parse_chat_template_kwargs(std::string_view json_text);

// The request of one entry. Throws "SOURCE:LINE: ..." when the prompt encodes to no tokens or does
// not fit max_context with its max_tokens, or when max_tokens is 0 (a request makes >= 1).
GenerationRequest build_request(const PromptEntry& entry, const RequestSettings& settings, const Tokenizer& tokenizer,
                                int max_context, const std::string& source);

}  // namespace fdpp
