// Tools (function calling) as OpenAI's chat API has them: the request's tools, tool_choice and
// parallel_tool_calls checked, the grammar that makes a forced call valid JSON for its schema, and
// the choice's text turned into tool_calls, whole or streamed as deltas.
//
// tool_choice:
//  - "none": no tools reach the template, nothing is parsed;
//  - "auto" (the default with tools): the tools go to the chat template, and a call the model
//    writes in its template's syntax (tokenizer/tool_calls.h) becomes tool_calls;
//  - {"type": "function", "function": {"name"}}: the output is held by the structured-output
//    engine to that function's "parameters" schema and becomes the call's arguments;
//  - "required": the output is held to {"name": one of the tools, "arguments": its parameters}
//    (an array of those when parallel_tool_calls is true), parsed into the calls.
// A parameters schema the grammar engine cannot honour (a keyword it refuses) is a 400 for a tool
// with "strict": true; otherwise the forced arguments are held to any JSON object and the field is
// reported as not enforced (the x-fdpp-ignored-fields header), since OpenAI's non-strict tools
// promise no schema either.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "grammar/grammar.h"
#include "tokenizer/tokenizer.h"

namespace fdpp::server {

enum class ToolChoice { kNone, kAuto, kRequired, kNamed };

struct ToolSetup {
  ToolChoice choice = ToolChoice::kNone;            // kNone: no tools, or tool_choice "none"
  ToolCallFormat format = ToolCallFormat::kHermes;  // the model's call syntax (kAuto parses it)
  std::string forced;                               // kNamed: the function
  bool parallel = true;                             // parallel_tool_calls: false keeps the first call
  bool active() const { return choice != ToolChoice::kNone; }
};

struct ToolRequest {
  ToolSetup setup;
  std::vector<std::string> tools;                   // ChatOptions::tools (empty with "none")
  std::shared_ptr<const grammar::Grammar> grammar;  // kRequired, kNamed
  std::vector<std::string> unenforced;              // "tools[i].function.parameters" held to any object
};

// The fields this reads (the request parser lists them as known), and OpenAI's bound on tools.
inline constexpr const char* kToolFields[] = {"tools", "tool_choice", "parallel_tool_calls"};
inline constexpr size_t kMaxTools = 128;

// The request's tools. raw_body: the body's text, read again so that the tools' JSON keeps the
// client's key order (the template prints it); empty: body's (sorted) order. Throws ApiError
// (400 naming the field) for malformed tools, an unknown tool_choice, a function tool_choice does
// not define, "required" without tools.
ToolRequest tool_request(const nlohmann::json& body, std::string_view raw_body, ToolCallFormat format);

// OpenAI's call id: "call_" and 24 letters and digits; Mistral's templates take 9 characters, so
// its format gets 9. Derived from seed and the call's place, so a response's ids are distinct.
std::string tool_call_id(ToolCallFormat format, uint64_t seed, size_t k);

// A finished choice's text as a message: content (nullopt: null, when only calls were made or it
// was all whitespace before them) and the calls, with ids.
struct ToolReply {
  std::optional<std::string> content;
  std::vector<ToolCall> calls;
};
ToolReply tool_reply(const ToolSetup& setup, std::string_view text, uint64_t id_seed);

// message.tool_calls: [{"id", "type": "function", "function": {"name", "arguments"}}]; streamed
// deltas add "index" (first: the index of calls[0]).
nlohmann::json tool_calls_json(std::span<const ToolCall> calls, bool stream = false, size_t first = 0);

// One streamed choice: its text pieces become content deltas until a call starts, then tool_calls
// deltas. A named call streams its arguments as they come (the first delta has the id and the
// name); a parsed call is sent whole once the output ends (its text is held until then).
class ToolStream {
 public:
  ToolStream(ToolSetup setup, uint64_t id_seed) : setup_(std::move(setup)), id_seed_(id_seed) {}
  struct Delta {
    std::string content;
    nlohmann::json tool_calls;  // null, or a delta's tool_calls array
  };
  Delta push(std::string_view text);
  Delta finish();
  bool called() const { return called_; }  // tool_calls were sent: finish_reason "tool_calls"

 private:
  ToolSetup setup_;
  uint64_t id_seed_ = 0;
  std::string text_;   // the output so far
  size_t sent_ = 0;    // bytes of text_ sent as content
  size_t start_ = std::string::npos;  // where the call starts in text_ (kAuto)
  bool called_ = false;
};

}  // namespace fdpp::server
