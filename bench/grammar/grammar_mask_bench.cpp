// The per-token host cost of structured output: a JSON schema's mask computed and the matcher
// advanced for each token of a real answer, tokenized by the model's own tokenizer. Cold: a fresh
// matcher per pass (every state's mask computed by walking the vocabulary trie); warm: the same
// matcher's caches reused (states met again cost a lookup). docs/PERFORMANCE.md has the numbers.
//
//   build/fdpp_grammar_mask_bench [model.gguf] [passes]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "fdpp/error.h"
#include "grammar/grammar.h"
#include "io/gguf.h"
#include "tokenizer/tokenizer.h"

using namespace fdpp;
using Clock = std::chrono::steady_clock;

namespace {
double us_since(Clock::time_point t) { return std::chrono::duration<double, std::micro>(Clock::now() - t).count(); }

struct Stats {
  std::vector<double> us;
  void print(const char* what) {
    std::sort(us.begin(), us.end());
    double sum = 0;
    for (double x : us) sum += x;
    std::printf("%-34s tokens %5zu  mean %8.1f us  median %8.1f us  p99 %8.1f us  max %8.1f us\n", what, us.size(),
                sum / us.size(), us[us.size() / 2], us[us.size() * 99 / 100], us.back());
  }
};
}  // namespace

int main(int argc, char** argv) {
  try {
    std::string path = argc > 1 ? argv[1] : std::string();
    if (path.empty()) {
      const char* home = std::getenv("HOME");
      path = std::string(home ? home : ".") + "/.cache/fdpp/models/SmolLM2-135M-Instruct.Q4_1.gguf";
    }
    const int passes = argc > 2 ? std::stoi(argv[2]) : 5;
    auto file = gguf::GgufFile::open(path);
    const auto tok = Tokenizer::from_gguf(file);
    auto t0 = Clock::now();
    const auto vocab = std::make_shared<grammar::TokenVocabulary>(*tok, tok->vocab_size());
    std::printf("vocabulary %d tokens, trie of %zu nodes built in %.1f ms\n", vocab->size(), vocab->nodes().size(),
                us_since(t0) / 1000);

    const char* schema = R"({"type": "object", "properties": {
        "name": {"type": "string"}, "age": {"type": "integer"}, "email": {"type": "string", "format": "email"},
        "tags": {"type": "array", "items": {"type": "string"}}, "address": {"type": "object", "properties": {
        "city": {"type": "string"}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}, "required": ["city", "zip"],
        "additionalProperties": false}}, "required": ["name", "age", "email", "tags", "address"],
        "additionalProperties": false})";
    const std::string answer =
        "{\n  \"name\": \"Ada Lovelace, Countess of Lovelace\",\n  \"age\": 36,\n  \"email\": \"ada@example.org\",\n"
        "  \"tags\": [\"mathematician\", \"writer\", \"first programmer\"],\n  \"address\": {\"city\": \"London\", "
        "\"zip\": \"12345\"}\n}";
    t0 = Clock::now();
    const auto g = grammar::compile_json_schema(schema);
    std::printf("schema compiled in %.1f us (%d rules)\n", us_since(t0), g->rule_count());
    const std::vector<int32_t> ids = tok->encode(answer, false, false);

    Stats cold, warm, advance;
    grammar::GrammarMatcher reused(g, vocab);
    for (int p = 0; p < passes; ++p) {
      grammar::GrammarMatcher m(g, vocab);
      for (int32_t id : ids) {
        auto t = Clock::now();
        check(m.is_allowed(id), "token {} ({:?}) not allowed", id, vocab->bytes(id));
        cold.us.push_back(us_since(t));
        t = Clock::now();
        check(m.accept_token(id), "token {} refused", id);
        advance.us.push_back(us_since(t));
      }
      reused.reset();  // the start again, with the caches of the passes before
      for (int32_t id : ids) {
        auto t = Clock::now();
        check(reused.is_allowed(id), "token {} not allowed", id);
        warm.us.push_back(us_since(t));
        reused.accept_token(id);
      }
    }
    cold.print("mask, fresh matcher (cold)");
    warm.print("mask, caches of earlier passes");
    advance.print("advance by the sampled token");

    // Unconstrained JSON (response_format json_object) over the same answer.
    Stats obj;
    for (int p = 0; p < passes; ++p) {
      grammar::GrammarMatcher m(grammar::compile_json_object(), vocab);
      for (int32_t id : ids) {
        auto t = Clock::now();
        check(m.is_allowed(id), "token {} not allowed", id);
        obj.us.push_back(us_since(t));
        m.accept_token(id);
      }
    }
    obj.print("json_object mask, fresh matcher");
  } catch (const Error& e) {
    std::fprintf(stderr, "fdpp_grammar_mask_bench: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
