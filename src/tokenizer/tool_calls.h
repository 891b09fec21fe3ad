// Tool calls as text: the JSON that chat templates print (transformers' tojson filter), and the
// parsers that find a model's tool calls in its output, one per ToolCallFormat (the formats of
// vLLM's hermes, llama3_json and mistral tool parsers). The server turns their result into
// OpenAI's tool_calls; the Python package exposes them as LLM.parse_tool_calls.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace fdpp {

// Python's json.dumps(value, ensure_ascii=False, indent=indent), which transformers' tojson filter
// calls: ", " and ": " between items (indent < 0), or one item per line indented by `indent`
// spaces with "," and ": ". Keys keep the value's order.
std::string tojson(const nlohmann::ordered_json& value, int indent = -1);

// JSON text (a tool definition, a call's arguments) parsed in its key order; throws fdpp::Error
// "{what} is not JSON: ..." for text that is not, or that nests deeper than kMaxJsonDepth.
nlohmann::ordered_json parse_ordered_json(std::string_view text, std::string_view what);

// The end of the JSON object or array that starts at text[start] ('{' or '['): the index one past
// its closing bracket; npos when it is not closed in text or nests deeper than kMaxJsonDepth.
// Only brackets and strings are followed: whether it is valid JSON is for the parser to say.
size_t json_value_end(std::string_view text, size_t start);

struct ParsedToolCalls {
  std::string content;          // the text before the first call; all of it when there is none
  std::vector<ToolCall> calls;  // id empty; arguments as compact JSON text (an object)
};

// The tool calls in a model's whole output. A call that is not a JSON object with a string "name"
// and object "arguments" (Llama 3's "parameters"; an absent one is {}) makes the whole text content,
// without calls, as vLLM's parsers do: the model wrote something that looked like a call and is not.
ParsedToolCalls parse_tool_calls(ToolCallFormat format, std::string_view text);

// Calls written as JSON: one {"name", "arguments"} object or an array of them (the forced calls'
// format, Mistral's after its marker). Empty when text is not that.
std::vector<ToolCall> tool_calls_from_json(std::string_view text);

// Streaming: where the first tool call starts in `text` (output_start: the output so far; else the
// part of it after the bytes already found to be content), or npos while none has. `safe` is set to
// the length of the prefix that is content whatever comes next (the bytes before a partial marker
// at the end; with Llama 3, whitespace at the start of the output, which a '{' may follow).
size_t find_tool_call_start(ToolCallFormat format, std::string_view text, bool output_start, size_t& safe);

// "hermes", "llama3_json", "mistral" (vLLM's parser names).
std::string_view tool_call_format_name(ToolCallFormat format);

}  // namespace fdpp
