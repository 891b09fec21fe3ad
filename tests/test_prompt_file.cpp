// Prompts files (engine/prompt_file.h): both formats, every per-line field, the one set of value
// ranges shared with the CLI's flags, errors naming the line, UTF-8 checks, requests built from
// entries (with the default model's tokenizer when it is fetched).
#include <gtest/gtest.h>

#include <filesystem>

#include "engine/prompt_file.h"
#include "io/gguf.h"
#include "model/model_loader.h"

namespace fdpp {
namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::vector<PromptEntry> jsonl(std::string_view s) { return parse_prompt_file(s, PromptFileFormat::JsonLines, "p.jsonl"); }

TEST(PromptFile, FormatByExtension) {
  EXPECT_EQ(prompt_file_format("a/b.jsonl"), PromptFileFormat::JsonLines);
  EXPECT_EQ(prompt_file_format("B.JSONL"), PromptFileFormat::JsonLines);
  EXPECT_EQ(prompt_file_format("x.ndjson"), PromptFileFormat::JsonLines);
  EXPECT_EQ(prompt_file_format("x.txt"), PromptFileFormat::Text);
  EXPECT_EQ(prompt_file_format("dir.jsonl/prompts"), PromptFileFormat::Text);
  EXPECT_EQ(prompt_file_format("prompts"), PromptFileFormat::Text);
}

TEST(PromptFile, TextOnePromptPerLine) {
  const auto e = parse_prompt_file("first\r\n\n  \nsecond line  \nthird", PromptFileFormat::Text, "p.txt");
  ASSERT_EQ(e.size(), 3u);
  EXPECT_EQ(e[0].prompt, "first");  // the '\r' of a CRLF file is dropped
  EXPECT_EQ(e[0].line, 1);
  EXPECT_EQ(e[1].prompt, "second line  ");  // blank lines skipped, line numbers kept
  EXPECT_EQ(e[1].line, 4);
  EXPECT_EQ(e[2].prompt, "third");  // no final newline
  EXPECT_EQ(e[2].line, 5);
  EXPECT_FALSE(e[0].temperature.has_value());
}

TEST(PromptFile, EmptyFileIsAnError) {
  EXPECT_NE(error_of([] { parse_prompt_file("\n \n", PromptFileFormat::Text, "p.txt"); }).find("p.txt: no prompts"),
            std::string::npos);
  EXPECT_NE(error_of([] { jsonl(""); }).find("p.jsonl: no prompts"), std::string::npos);
}

TEST(PromptFile, JsonLinesEveryField) {
  const auto e = jsonl(
      R"({"prompt": "a", "id": {"k": [1, 2]}, "max_tokens": 7, "temperature": 0, "top_k": 5, "top_p": 0.5,)"
      R"( "min_p": 0.1, "repeat_penalty": 1.1, "repeat_last_n": -1, "seed": 42, "stop": ["x", "yz"], "ignore_eos": true})"
      "\n\n"
      R"({"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}], "stop": "\n"})");
  ASSERT_EQ(e.size(), 2u);
  EXPECT_EQ(e[0].prompt, "a");
  EXPECT_EQ(e[0].id_json, R"({"k":[1,2]})");
  EXPECT_EQ(*e[0].max_tokens, 7);
  EXPECT_EQ(*e[0].temperature, 0.f);
  EXPECT_EQ(*e[0].top_k, 5);
  EXPECT_FLOAT_EQ(*e[0].top_p, 0.5f);
  EXPECT_FLOAT_EQ(*e[0].min_p, 0.1f);
  EXPECT_FLOAT_EQ(*e[0].repeat_penalty, 1.1f);
  EXPECT_EQ(*e[0].repeat_last_n, -1);
  EXPECT_EQ(*e[0].seed, 42u);
  EXPECT_EQ(*e[0].stop, (std::vector<std::string>{"x", "yz"}));
  EXPECT_TRUE(*e[0].ignore_eos);
  EXPECT_EQ(e[1].line, 3);
  ASSERT_EQ(e[1].messages.size(), 2u);
  EXPECT_EQ(e[1].messages[0].role, "system");
  EXPECT_EQ(e[1].messages[1].content, "U");
  EXPECT_EQ(*e[1].stop, (std::vector<std::string>{"\n"}));

  // Fields override the command line's defaults; the rest stay.
  RequestSettings d;
  d.max_tokens = 99;
  d.sampling.temperature = 0.7f;
  d.sampling.top_k = 40;
  d.sampling.seed = 5;
  d.stop = {"END"};
  d.chat = true;
  const RequestSettings s0 = e[0].settings(d);
  EXPECT_EQ(s0.max_tokens, 7);
  EXPECT_EQ(s0.sampling.temperature, 0.f);
  EXPECT_EQ(s0.sampling.seed, 42u);
  EXPECT_EQ(s0.stop, (std::vector<std::string>{"x", "yz"}));
  EXPECT_TRUE(s0.ignore_eos);
  EXPECT_TRUE(s0.chat);
  const RequestSettings s1 = e[1].settings(d);
  EXPECT_EQ(s1.max_tokens, 99);
  EXPECT_FLOAT_EQ(s1.sampling.temperature, 0.7f);
  EXPECT_EQ(s1.sampling.top_k, 40);
  EXPECT_EQ(s1.sampling.seed, 5u);
  EXPECT_FALSE(s1.ignore_eos);
}

TEST(PromptFile, RandomSeedOnMinusOne) {
  const auto e = jsonl(R"({"prompt": "a", "seed": -1})");
  ASSERT_TRUE(e[0].seed.has_value());
  EXPECT_LT(*e[0].seed, uint64_t{1} << 63);  // drawn now, printable as a JSON integer
}

TEST(PromptFile, BadLinesNameTheLineAndTheProblem) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"prompt": "a"})" "\n" "not json", "p.jsonl:2: not valid JSON"},
      {R"(["prompt"])", "p.jsonl:1: expected a JSON object"},
      {R"({"max_tokens": 3})", "p.jsonl:1: needs exactly one of \"prompt\", \"messages\" and \"prompt_token_ids\""},
      {R"({"prompt": "a", "messages": []})", "needs exactly one of"},
      {R"({"prompt": "a", "prompt_token_ids": [1]})", "needs exactly one of"},
      {R"({"prompt_token_ids": []})", "\"prompt_token_ids\" must be a non-empty array of token ids"},
      {R"({"prompt_token_ids": [1, -2]})", "\"prompt_token_ids\" holds -2, not a token id"},
      {R"({"prompt_token_ids": [1, "a"]})", "\"prompt_token_ids\" holds \"a\", not a token id"},
      {R"({"prompt": ""})", "p.jsonl:1: \"prompt\" is empty"},
      {R"({"prompt": 3})", "\"prompt\" must be a string, not 3"},
      {R"({"messages": []})", "\"messages\" must be a non-empty array"},
      {R"({"messages": [{"role": "user"}]})", "needs \"role\" and \"content\""},
      {R"({"messages": [{"role": "robot", "content": "x"}]})", "role \"robot\" is not one of"},
      {R"({"prompt": "a", "temperture": 1})", "unknown field \"temperture\""},
      {R"({"prompt": "a", "top_p": 0})", "\"top_p\" 0 must be in (0, 1]"},
      {R"({"prompt": "a", "top_p": 1.5})", "\"top_p\" 1.5 must be in (0, 1]"},
      {R"({"prompt": "a", "temperature": -1})", "\"temperature\" -1 must be in [0, 100]"},
      {R"({"prompt": "a", "temperature": "hot"})", "\"temperature\" must be a number, not \"hot\""},
      {R"({"prompt": "a", "top_k": 2.5})", "\"top_k\" must be an integer"},
      {R"({"prompt": "a", "min_p": 2})", "\"min_p\" 2 must be in [0, 1]"},
      {R"({"prompt": "a", "repeat_penalty": 0})", "\"repeat_penalty\" 0 must be in [0.01, 100]"},
      {R"({"prompt": "a", "max_tokens": -1})", "\"max_tokens\" -1 must be in [1, 16777216]"},
      {R"({"prompt": "a", "max_tokens": 0})", "\"max_tokens\" 0 must be in [1, 16777216]"},
      {R"({"prompt": "a", "seed": -2})", "\"seed\" -2 must be in [-1, 9223372036854775807] (-1 = random)"},
      {R"({"prompt": "a", "seed": 18446744073709551615})", "\"seed\" 18446744073709551615 must be in [-1, "},
      {R"({"prompt": "a", "stop": ""})", "\"stop\" is empty"},
      {R"({"prompt": "a", "stop": 5})", "\"stop\" must be a string or an array"},
      {R"({"prompt": "a", "stop": ["1","2","3","4","5","6","7","8","9","10","11","12","13","14","15","16","17"]})",
       "\"stop\" has 17 strings; at most 16"},
      {R"({"prompt": "a", "ignore_eos": 1})", "\"ignore_eos\" must be true or false"},
      {"{\"prompt\": \"a\xff\"}", "p.jsonl:1: byte 0xff at offset 13 is not valid UTF-8"},
  };
  for (const auto& [text, want] : cases) {
    const std::string err = error_of([&] { jsonl(text); });
    EXPECT_NE(err.find(want), std::string::npos) << text << " -> " << err;
    EXPECT_EQ(err.find('\n'), std::string::npos) << "one line: " << err;
  }
  // A line nested a million deep is refused while parsing (printing it overflowed the stack).
  const std::string deep = "{\"prompt\": " + std::string(1'000'000, '[') + std::string(1'000'000, ']') + "}";
  EXPECT_NE(error_of([&] { jsonl(deep); }).find("p.jsonl:1: not valid JSON (nests deeper than 64 levels)"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_prompt_file("ok\nbad \xc3\x28 byte", PromptFileFormat::Text, "p.txt"); })
                .find("p.txt:2: byte 0xc3 at offset 4 is not valid UTF-8"),
            std::string::npos);
}

TEST(PromptFile, ValueRangesAreTheFlagRanges) {
  EXPECT_EQ(temperature_problem(0), "");
  EXPECT_EQ(temperature_problem(100), "");
  EXPECT_NE(temperature_problem(NAN), "");
  EXPECT_NE(temperature_problem(INFINITY), "");
  EXPECT_NE(temperature_problem(-0.1), "");
  EXPECT_NE(top_p_problem(0), "");  // would keep no token
  EXPECT_EQ(top_p_problem(1), "");
  EXPECT_EQ(top_p_problem(1e-6), "");
  EXPECT_NE(top_p_problem(NAN), "");
  EXPECT_EQ(min_p_problem(0), "");
  EXPECT_NE(min_p_problem(1.01), "");
  EXPECT_EQ(top_k_problem(0), "");
  EXPECT_EQ(top_k_problem(-1), "");  // vLLM's off
  EXPECT_NE(top_k_problem(-2), "");
  EXPECT_EQ(repeat_last_n_problem(-1), "");
  EXPECT_NE(repeat_last_n_problem(-2), "");
  EXPECT_EQ(repeat_penalty_problem(1), "");
  EXPECT_NE(repeat_penalty_problem(0), "");
  EXPECT_EQ(max_tokens_problem(0), "");  // -n 0: the prompt only (a request's max_tokens needs >= 1)
  EXPECT_NE(max_tokens_problem(-1), "");
}

TEST(PromptFile, Utf8) {
  EXPECT_EQ(utf8_problem(""), "");
  EXPECT_EQ(utf8_problem("plain ascii"), "");
  EXPECT_EQ(utf8_problem("caf\xc3\xa9 \xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\x98\x80"), "");  // é, 你好, 😀
  EXPECT_EQ(utf8_problem("\xff"), "byte 0xff at offset 0 is not valid UTF-8");
  EXPECT_EQ(utf8_problem("ab\x80"), "byte 0x80 at offset 2 is not valid UTF-8");      // stray continuation
  EXPECT_NE(utf8_problem("\xc0\xaf"), "");                                             // overlong '/'
  EXPECT_NE(utf8_problem("\xe0\x80\xaf"), "");                                         // overlong
  EXPECT_NE(utf8_problem("\xed\xa0\x80"), "");                                         // surrogate U+D800
  EXPECT_NE(utf8_problem("\xf4\x90\x80\x80"), "");                                     // above U+10FFFF
  EXPECT_NE(utf8_problem("\xe4\xbd"), "");                                             // cut short
  EXPECT_EQ(utf8_problem("x\xe4\xbd"), "byte 0xe4 at offset 1 is not valid UTF-8");
}

TEST(PromptFile, ReadFile) {
  const std::string dir = ::testing::TempDir();
  const std::string path = dir + "/fdpp_prompts_test.jsonl";
  {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::fputs("{\"prompt\": \"one\"}\n{\"prompt\": \"two\", \"max_tokens\": 3}\n", f);
    std::fclose(f);
  }
  const auto e = read_prompt_file(path);
  ASSERT_EQ(e.size(), 2u);
  EXPECT_EQ(e[1].prompt, "two");
  EXPECT_EQ(*e[1].max_tokens, 3);
  std::filesystem::remove(path);
  const std::string err = error_of([&] { read_prompt_file(path); });
  EXPECT_NE(err.find(path + ": cannot open the prompts file"), std::string::npos) << err;
}

// The default model's tokenizer (SmolLM2, ChatML) when it is fetched.
const Tokenizer* smollm2() {
  static std::unique_ptr<Tokenizer> t = []() -> std::unique_ptr<Tokenizer> {
    const std::string path = default_model_path();
    if (!std::filesystem::exists(path)) return nullptr;
    return load_tokenizer(path);
  }();
  return t.get();
}

TEST(PromptFile, BuildRequests) {
  const Tokenizer* tok = smollm2();
  if (tok == nullptr) GTEST_SKIP() << "default model not fetched: " << default_model_path();
  RequestSettings s;
  s.max_tokens = 8;
  s.sampling.temperature = 0;
  s.sampling.seed = 11;
  s.stop = {"."};
  PromptEntry plain;
  plain.line = 3;
  plain.prompt = "Hello world";
  const GenerationRequest r = build_request(plain, s, *tok, 2048, "p.txt");
  EXPECT_EQ(r.prompt, (std::vector<int32_t>{19556, 905}));  // SmolLM2 adds no BOS to plain text
  EXPECT_EQ(r.max_tokens, 8);
  EXPECT_EQ(r.sampling.seed, 11u);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"."}));

  // Chat: the same tokens as the conversation rendered by the template, one BOS at most.
  RequestSettings chat = s;
  chat.chat = true;
  chat.system = "Be brief.";
  const GenerationRequest c = build_request(plain, chat, *tok, 2048, "p.txt");
  const std::vector<ChatMessage> conv{{"system", "Be brief."}, {"user", "Hello world"}};
  EXPECT_EQ(c.prompt, tok->encode(tok->apply_chat_template(conv, true), false, true));
  PromptEntry msgs;
  msgs.line = 4;
  msgs.messages = conv;
  EXPECT_EQ(build_request(msgs, s, *tok, 2048, "p.txt").prompt, c.prompt);
  // Token ids go in as they are, chat template or not.
  const std::vector<PromptEntry> ids = jsonl(R"({"prompt_token_ids": [5, 0, 49151], "max_tokens": 2})");
  ASSERT_EQ(ids.size(), 1u);
  EXPECT_EQ(build_request(ids[0], chat, *tok, 2048, "p.jsonl").prompt, (std::vector<int32_t>{5, 0, 49151}));

  // Errors name the file and the line.
  EXPECT_NE(error_of([&] { build_request(plain, s, *tok, 9, "p.txt"); })
                .find("p.txt:3: prompt (2 tokens) + max_tokens (8) exceed the context size 9"),
            std::string::npos);
  RequestSettings zero = s;
  zero.max_tokens = 0;
  EXPECT_NE(error_of([&] { build_request(plain, zero, *tok, 2048, "p.txt"); })
                .find("p.txt:3: \"max_tokens\" 0 must be in [1, "),
            std::string::npos);
}

}  // namespace
}  // namespace fdpp
