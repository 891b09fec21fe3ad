// libFuzzer target for fdpp serve's request parsing (src/server/api.h), the part of the server that
// reads bytes from the network: any body must either parse into a request the scheduler can run or
// throw ApiError with a 4xx status, with no crash, no other exception (the HTTP layer would answer
// 500), no UB (ASan + UBSan) and no allocation out of proportion to the body (scripts/fuzz.sh:
// -malloc_limit_mb=64). The first byte picks the endpoint; the rest is the body. The model and codec
// are tests/server_api_fakes.h's: text encodes as its bytes, against a 64-token context.
//
// Seed mode: FDPP_API_REQUEST_FUZZ_SEEDS=DIR api_request_fuzz writes request bodies into DIR.
#include <sys/stat.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <string_view>

#include "engine/prompt_file.h"
#include "server/api.h"
#include "server_api_fakes.h"

namespace {

using namespace fdpp::server;

void promise(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "api_request_fuzz: broken promise: %s\n", what);
    std::abort();
  }
}

void write_seeds(const std::string& dir) {
  ::mkdir(dir.c_str(), 0755);
  // The first byte: 'b' (even) for /v1/completions, 'a' (odd) for /v1/chat/completions.
  const char* seeds[] = {
      R"(b{"model": "tiny.gguf", "prompt": "hi", "max_tokens": 4, "temperature": 0})",
      R"(b{"prompt": [1, 2, 3], "stream": true, "stream_options": {"include_usage": true}, "stop": ["a", "bc"]})",
      R"(b{"prompt": "x", "top_p": 0.5, "top_k": 3, "min_p": 0.1, "repetition_penalty": 1.1, "seed": 7})",
      R"(b{"prompt": "x", "n": 1, "logprobs": null, "ignore_eos": true, "return_token_ids": true, "user": "u"})",
      R"(b{"prompt": "x", "stop_token_ids": [2, 7], "max_tokens": 3})",
      R"(b{"prompt": "x", "top_p": 2.5, "a\nb": 1})",  // a quoted key once split the message
      R"(b{"prompt": ["ab", [5, 6]], "max_tokens": 2})",
      R"(a{"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}]})",
      R"(a{"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}], "max_completion_tokens": 3})",
      R"(a{"messages": [{"role": "assistant", "content": "x"}], "response_format": {"type": "text"}})",
      R"(a{"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {}, "x\r\ny": 1, "best_of": 1})",
  };
  int n = 0;
  for (const char* s : seeds) std::ofstream(dir + "/seed" + std::to_string(n++) + ".json") << s;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* dir = std::getenv("FDPP_API_REQUEST_FUZZ_SEEDS")) {
    write_seeds(dir);
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static const ModelInfo m = fakes::tiny_model();
  static const PromptCodec codec = fakes::byte_codec();
  static const ApiLimits limits;
  const Endpoint endpoint = data[0] % 2 ? Endpoint::Chat : Endpoint::Completions;
  const std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  ParsedRequest r;
  try {
    r = parse_request(endpoint, parse_json_body(body, limits), m, codec, limits);
  } catch (const ApiError& e) {
    promise(e.status >= 400 && e.status < 500, "an ApiError is a 4xx");
    promise(std::string_view(e.what()).find('\n') == std::string_view::npos, "the message is one line");
    (void)dump(error_body(e));  // as the server writes it (invalid UTF-8 in the message replaced)
    return 0;
  }
  // Accepted: what the scheduler needs to run it (src/engine/scheduler.h's GenerationRequest), for
  // every prompt of a batch.
  promise(r.batch.empty() || (r.batch.size() >= 2 && static_cast<int>(r.batch.size()) <= limits.max_prompts &&
                              r.batch[0].prompt == r.generation.prompt),
          "a batch has 2..max_prompts prompts, and generation is its first");
  for (const fdpp::GenerationRequest& g : r.batch.empty() ? std::vector<fdpp::GenerationRequest>{r.generation} : r.batch) {
    promise(!g.prompt.empty(), "a non-empty prompt");
    for (int32_t id : g.prompt) promise(id >= 0 && id < m.vocab_size, "prompt ids inside the vocabulary");
    promise(g.max_tokens >= 1, "max_tokens >= 1");
    promise(static_cast<int64_t>(g.prompt.size()) + g.max_tokens <= m.max_context, "prompt + max_tokens fit");
    const fdpp::SamplingParams& s = g.sampling;
    promise(fdpp::temperature_problem(s.temperature).empty(), "temperature in range");
    promise(fdpp::top_p_problem(s.top_p).empty(), "top_p in range");
    promise(fdpp::min_p_problem(s.min_p).empty(), "min_p in range");
    promise(fdpp::top_k_problem(s.top_k).empty(), "top_k in range");
    promise(fdpp::repeat_penalty_problem(s.repeat_penalty).empty(), "repetition_penalty in range");
    promise(static_cast<int>(g.stop.size()) <= limits.max_stop_strings, "at most max_stop_strings");
    for (const std::string& stop : g.stop) promise(fdpp::stop_problem(stop).empty(), "stop strings in range");
    promise(static_cast<int>(g.stop_token_ids.size()) <= limits.max_stop_token_ids, "at most max_stop_token_ids");
    for (int32_t id : g.stop_token_ids) promise(id >= 0 && id < m.vocab_size, "stop token ids inside the vocabulary");
  }
  // The ignored fields' names become a response header: one short line of visible ASCII.
  const std::string header = join_fields(r.ignored_fields);
  promise(header.size() < 4096, "the ignored-fields header is bounded");
  for (const char c : header) promise(c > 0x20 && c < 0x7f, "the ignored-fields header is visible ASCII");
  return 0;
}
