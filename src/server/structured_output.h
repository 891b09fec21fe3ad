// Structured output as the OpenAI and vLLM clients ask for it: OpenAI's response_format
// ({"type": "json_object"} and {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}),
// vLLM's guided_json / guided_regex / guided_choice and its newer structured_outputs object. Compiled
// here, at the entrance, so that a schema the grammar engine cannot honour is a 400 naming the
// keyword, before anything is queued.
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <string_view>

#include "grammar/grammar.h"

namespace fdpp::server {

// The fields this reads (the request parser lists them as known).
inline constexpr const char* kStructuredOutputFields[] = {
    "response_format", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
    "guided_decoding_backend", "guided_whitespace_pattern", "structured_outputs"};

// The request's grammar, or null when it asks for none (absent fields, response_format "text").
// raw_body: the body's text, re-read in order so that a schema's properties keep the order the
// client wrote (the parsed body's objects are sorted by key); empty: use body. Throws ApiError.
std::shared_ptr<const grammar::Grammar> structured_output(const nlohmann::json& body, std::string_view raw_body);

}  // namespace fdpp::server
