// Tokenizer tests against references made by tests/fixtures/tokenizer/make_fixtures.py:
// - smollm2.json: HF tokenizers' ids and decodes for the default model's byte-level BPE vocabulary
//   (SmolLM2-135M-Instruct GGUF, skipped when absent), with the pre-tokenizers smollm, gpt2, llama3
//   and qwen2, and transformers' apply_chat_template output (ChatML, Llama 3, Llama 3.1, Llama 2,
//   Mistral v0.1-v0.3).
// - mistral_v3.gguf / mistral_v3.json: a SentencePiece vocabulary (Mistral v3, 32768 pieces with
//   control, user-defined and byte tokens) and sentencepiece's own ids and decodes.
#include <gtest/gtest.h>

#include <chrono>
#include <ctime>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "fdpp/error.h"
#include "io/gguf.h"
#include "tokenizer/tokenizer.h"
#include "test_util.h"

namespace fdpp {
namespace {

using test::error_of;

using nlohmann::json;

std::string fixture_path(const std::string& name) { return std::string(FDPP_TEST_DIR) + "/fixtures/tokenizer/" + name; }

json load_json(const std::string& name) {
  std::ifstream in(fixture_path(name));
  if (!in) throw std::runtime_error("cannot open fixture " + fixture_path(name));
  return json::parse(in);
}

std::string model_path() {
  const char* cache = std::getenv("FDPP_CACHE");
  const char* home = std::getenv("HOME");
  const std::string root = cache ? cache : std::string(home ? home : ".") + "/.cache/fdpp";
  return root + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

std::vector<int32_t> ids_of(const json& j) { return j.get<std::vector<int32_t>>(); }

// Printable form of a text for failure messages.
std::string show(const std::string& s) { return json(s).dump(-1, ' ', false, json::error_handler_t::replace); }

bool valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<uint8_t>(s[i]);
    size_t n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<uint8_t>(s[i + k]) & 0xC0) != 0x80) return false;
    i += n;
  }
  return true;
}

// Streams ids through a StreamingDetokenizer; returns the pieces (flush last).
std::vector<std::string> stream(const Tokenizer& t, const std::vector<int32_t>& ids, bool skip_special) {
  StreamingDetokenizer d(t, skip_special);
  std::vector<std::string> out;
  for (const int32_t id : ids) out.push_back(d.push(id));
  out.push_back(d.flush());
  return out;
}

std::string concat(const std::vector<std::string>& parts) {
  std::string s;
  for (const auto& p : parts) s += p;
  return s;
}

// ---- SmolLM2 (byte-level BPE, the default model) ------------------------------------------------

struct SmolLM2 {
  gguf::GgufFile file;
  VocabSpec spec;
  std::unique_ptr<Tokenizer> tok;
  json fx;
};

const SmolLM2* smollm2() {
  static std::unique_ptr<SmolLM2> s = []() -> std::unique_ptr<SmolLM2> {
    if (!std::filesystem::exists(model_path())) return nullptr;
    auto file = gguf::GgufFile::open(model_path());
    auto spec = VocabSpec::from_gguf(file);
    auto tok = Tokenizer::from_vocab(spec);
    return std::make_unique<SmolLM2>(SmolLM2{std::move(file), std::move(spec), std::move(tok), load_json("smollm2.json")});
  }();
  return s.get();
}

#define REQUIRE_SMOLLM2(var)                                                       \
  const SmolLM2* var = smollm2();                                                  \
  if (var == nullptr) GTEST_SKIP() << "default model not fetched: " << model_path()

TEST(TokenizerSmolLM2, Metadata) {
  REQUIRE_SMOLLM2(s);
  const Tokenizer& t = *s->tok;
  EXPECT_EQ(t.vocab_size(), 49152);
  EXPECT_EQ(t.bos_id(), 1);  // <|im_start|>
  EXPECT_EQ(t.eos_id(), 2);  // <|im_end|>
  EXPECT_FALSE(t.add_bos_by_default());
  EXPECT_TRUE(t.is_end_of_generation(2));
  EXPECT_TRUE(t.is_end_of_generation(0));  // <|endoftext|>
  EXPECT_FALSE(t.is_end_of_generation(1));
  EXPECT_FALSE(t.is_end_of_generation(19556));
  EXPECT_FALSE(t.is_end_of_generation(-1));
  EXPECT_TRUE(t.is_special(1));
  EXPECT_FALSE(t.is_special(19556));
  EXPECT_EQ(t.token_type(16), TokenType::kControl);
  EXPECT_EQ(t.token_text(19556), "Hello");
  EXPECT_EQ(t.token_id("<|im_end|>"), 2);
  EXPECT_EQ(t.token_id("no such token"), -1);
  EXPECT_EQ(t.token_bytes(216), " ");  // "Ġ"
  EXPECT_EQ(t.token_bytes(1), "<|im_start|>");
  const auto from_gguf = Tokenizer::from_gguf(s->file);
  EXPECT_EQ(from_gguf->encode("Hello world 123", false, true), t.encode("Hello world 123", false, true));
  // The fixture was made from this file's template.
  EXPECT_EQ(s->spec.chat_template, s->fx["chat_template"].get<std::string>());
}

TEST(TokenizerSmolLM2, EncodeMatchesHF) {
  REQUIRE_SMOLLM2(s);
  int n = 0;
  for (const auto& c : s->fx["cases"]) {
    const std::string text = c["text"];
    EXPECT_EQ(s->tok->encode(text, false, true), ids_of(c["ids"])) << show(text);
    EXPECT_EQ(s->tok->encode(text, false, false), ids_of(c["ids_no_special"])) << show(text);
    auto with_bos = s->tok->encode(text, true, true);
    ASSERT_FALSE(with_bos.empty());
    EXPECT_EQ(with_bos[0], s->tok->bos_id());
    ++n;
  }
  EXPECT_GE(n, 30);
}

TEST(TokenizerSmolLM2, DecodeMatchesHF) {
  REQUIRE_SMOLLM2(s);
  int lossy = 0;
  for (const auto& c : s->fx["cases"]) {
    const auto ids = ids_of(c["ids"]);
    for (const bool skip : {false, true}) {
      const std::string expected = c[skip ? "decoded_skip" : "decoded"];
      const std::string ours = s->tok->decode(ids, skip);
      if (valid_utf8(ours)) {
        EXPECT_EQ(ours, expected) << show(c["text"]);
      } else {
        // decode() keeps invalid bytes (here: the vocabulary has no token for byte 0xF1, so
        // U+50000 lost its lead byte); HF's decode replaces them with U+FFFD, as the streaming
        // detokenizer does.
        EXPECT_EQ(concat(stream(*s->tok, ids, skip)), expected) << show(c["text"]);
        ++lossy;
      }
    }
  }
  EXPECT_GT(lossy, 0);
}

TEST(TokenizerSmolLM2, PreTokenizerVariantsMatchHF) {
  REQUIRE_SMOLLM2(s);
  const auto& cases = s->fx["cases"];
  for (const char* pre : {"gpt2", "llama3", "qwen2"}) {
    VocabSpec spec = s->spec;
    spec.pre = pre;
    const auto tok = Tokenizer::from_vocab(spec);
    const auto& expected = s->fx["pre_variants"][pre];
    ASSERT_EQ(expected.size(), cases.size());
    for (size_t i = 0; i < cases.size(); ++i)
      EXPECT_EQ(tok->encode(cases[i]["text"].get<std::string>(), false, true), ids_of(expected[i]))
          << pre << " " << show(cases[i]["text"]);
    if (std::string(pre) == "llama3") {
      spec.add_bos.reset();  // the GGUF says false; without the key llama.cpp's default is true
      EXPECT_TRUE(Tokenizer::from_vocab(spec)->add_bos_by_default());
    }
  }
}

TEST(TokenizerSmolLM2, StreamingConcatenationEqualsDecode) {
  REQUIRE_SMOLLM2(s);
  int held_back = 0;
  for (const auto& c : s->fx["cases"]) {
    const auto ids = ids_of(c["ids"]);
    for (const bool skip : {true, false}) {
      const auto parts = stream(*s->tok, ids, skip);
      if (!valid_utf8(s->tok->decode(ids, skip))) continue;  // compared with HF in DecodeMatchesHF
      EXPECT_EQ(concat(parts), s->tok->decode(ids, skip)) << show(c["text"]);
      for (size_t i = 0; i + 1 < parts.size(); ++i) EXPECT_TRUE(valid_utf8(parts[i])) << show(c["text"]);
      EXPECT_EQ(parts.back(), "");  // valid text leaves nothing held back
      if (skip)
        for (size_t i = 0; i < ids.size(); ++i)
          if (parts[i].empty() && !s->tok->is_special(ids[i]) && !s->tok->token_bytes(ids[i]).empty()) ++held_back;
    }
  }
  EXPECT_GT(held_back, 0) << "no fixture token ended inside a UTF-8 character";
}

TEST(TokenizerSmolLM2, StreamingHoldsBackSplitCharacters) {
  REQUIRE_SMOLLM2(s);
  for (const std::string text : {"😀", "👨‍👩‍👧‍👦", "𝔘", "龥"}) {
    const auto ids = s->tok->encode(text, false, false);
    ASSERT_GT(ids.size(), 1u) << text << " is one token; pick a rarer character";
    StreamingDetokenizer d(*s->tok);
    std::string out;
    for (const int32_t id : ids) {
      const std::string piece = d.push(id);
      EXPECT_TRUE(valid_utf8(piece));
      out += piece;
    }
    EXPECT_EQ(out, text);
    EXPECT_EQ(d.flush(), "");
  }
  // The first byte of "😀" alone is held back; flush gives it out as it is.
  const auto ids = s->tok->encode("😀", false, false);
  StreamingDetokenizer d(*s->tok);
  EXPECT_EQ(d.push(ids[0]), "");
  EXPECT_EQ(d.flush(), s->tok->token_bytes(ids[0]));
}

TEST(TokenizerSmolLM2, ParseSpecial) {
  REQUIRE_SMOLLM2(s);
  const Tokenizer& t = *s->tok;
  const std::string text = "<|im_start|>user\nhi<|im_end|>";
  const auto on = t.encode(text, false, true);
  ASSERT_GE(on.size(), 3u);
  EXPECT_EQ(on.front(), 1);
  EXPECT_EQ(on.back(), 2);
  const auto off = t.encode(text, false, false);
  for (const int32_t id : off) EXPECT_FALSE(t.is_special(id)) << id;
  EXPECT_EQ(t.decode(off, true), text);  // as plain text it survives skip_special
  EXPECT_EQ(t.decode(on, true), "user\nhi");
  // Longest match first, and partial or differently cased names are text.
  EXPECT_EQ(t.encode("<|im_start|", false, true), t.encode("<|im_start|", false, false));
  EXPECT_EQ(t.encode("<|IM_END|>", false, true), t.encode("<|IM_END|>", false, false));
}

TEST(TokenizerSmolLM2, ChatTemplateMatchesHF) {
  REQUIRE_SMOLLM2(s);
  for (const auto& c : s->fx["chat"]) {
    std::vector<ChatMessage> msgs;
    for (const auto& m : c["messages"]) msgs.push_back({m["role"], m["content"]});
    EXPECT_EQ(s->tok->apply_chat_template(msgs, c["add_generation_prompt"].get<bool>()), c["rendered"].get<std::string>())
        << c["messages"].dump();
  }
}

TEST(TokenizerSmolLM2, FreshTokenizersEncodeAlikeAndTheirTimesArePrinted) {
  REQUIRE_SMOLLM2(s);
  using clock = std::chrono::steady_clock;
  auto ms = [](clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); };
  std::string text;
  for (const auto& c : s->fx["cases"]) text += c["text"].get<std::string>() + "\n";
  while (text.size() < 4096) text += text;
  // Best of three fresh tokenizers (cold: no piece cached yet), so a busy machine does not fail it.
  double build_ms = 1e9, cold_ms = 1e9, warm_ms = 1e9;
  std::vector<int32_t> ids;
  for (int attempt = 0; attempt < 3; ++attempt) {
    const auto t0 = clock::now();
    const auto tok = Tokenizer::from_vocab(s->spec);
    build_ms = std::min(build_ms, ms(clock::now() - t0));
    const auto t1 = clock::now();
    ids = tok->encode(text, false, true);
    cold_ms = std::min(cold_ms, ms(clock::now() - t1));
    const auto t2 = clock::now();
    const auto again = tok->encode(text, false, true);
    warm_ms = std::min(warm_ms, ms(clock::now() - t2));
    EXPECT_EQ(ids, again);
  }
  EXPECT_EQ(ids, s->tok->encode(text, false, true));
  std::printf("[ tokenizer ] build %.1f ms (49152 tokens, 48900 merges); encode %zu bytes -> %zu ids: cold %.2f ms, "
              "warm %.2f ms\n", build_ms, text.size(), ids.size(), cold_ms, warm_ms);
  // The times are printed for a reader (targets: build ~100 ms, a few KB well under 10 ms); no
  // bound is asserted, since a test's timing on a shared machine measures the machine.
}

// ---- SentencePiece-style vocabulary (Mistral v3) ----------------------------------------------------

struct Mistral {
  VocabSpec spec;
  std::unique_ptr<Tokenizer> tok;
  json fx;
};

const Mistral& mistral() {
  static const std::unique_ptr<Mistral> m = [] {
    auto file = gguf::GgufFile::open(fixture_path("mistral_v3.gguf"));
    auto spec = VocabSpec::from_gguf(file);
    auto tok = Tokenizer::from_gguf(file);
    return std::make_unique<Mistral>(Mistral{std::move(spec), std::move(tok), load_json("mistral_v3.json")});
  }();
  return *m;
}

TEST(TokenizerSpm, Metadata) {
  const Tokenizer& t = *mistral().tok;
  EXPECT_EQ(t.vocab_size(), 32768);
  EXPECT_EQ(t.bos_id(), 1);
  EXPECT_EQ(t.eos_id(), 2);
  EXPECT_TRUE(t.add_bos_by_default());
  EXPECT_TRUE(t.is_end_of_generation(2));
  EXPECT_FALSE(t.is_end_of_generation(1));
  EXPECT_EQ(t.token_type(781), TokenType::kByte);  // <0x0A>
  EXPECT_EQ(t.token_bytes(781), "\n");
  EXPECT_EQ(t.token_bytes(t.token_id("\xE2\x96\x81hi")), " hi");
  EXPECT_EQ(t.encode("", true, true), std::vector<int32_t>{1});
  EXPECT_TRUE(t.encode("", false, true).empty());
}

TEST(TokenizerSpm, EncodeMatchesSentencepiece) {
  const Mistral& m = mistral();
  for (const auto& c : m.fx["cases"]) {
    const std::string text = c["text"];
    EXPECT_EQ(m.tok->encode(text, false, true), ids_of(c["ids"])) << show(text);
    EXPECT_EQ(m.tok->encode(text, false, false), ids_of(c["ids_no_special"])) << show(text);
  }
}

TEST(TokenizerSpm, DecodeMatchesSentencepiece) {
  const Mistral& m = mistral();
  for (const auto& c : m.fx["cases"]) {
    const auto ids = ids_of(c["ids"]);
    EXPECT_EQ(m.tok->decode(ids, true), c["decoded_skip"].get<std::string>()) << show(c["text"]);
    // With BOS in front (skipped) the leading-space rule is unchanged.
    std::vector<int32_t> with_bos{1};
    with_bos.insert(with_bos.end(), ids.begin(), ids.end());
    EXPECT_EQ(m.tok->decode(with_bos, true), c["decoded_skip"].get<std::string>()) << show(c["text"]);
  }
  // Not skipped, a control token is the first emitted token, so the next piece keeps its space.
  const Tokenizer& t = *m.tok;
  EXPECT_EQ(t.decode(t.encode("Hello", true, false), false), "<s> Hello");
  EXPECT_EQ(t.decode(t.encode("Hello", true, false), true), "Hello");
}

TEST(TokenizerSpm, StreamingConcatenationEqualsDecode) {
  const Mistral& m = mistral();
  for (const auto& c : m.fx["cases"]) {
    const auto ids = ids_of(c["ids"]);
    for (const bool skip : {true, false}) {
      const auto parts = stream(*m.tok, ids, skip);
      EXPECT_EQ(concat(parts), m.tok->decode(ids, skip)) << show(c["text"]);
      for (const auto& p : parts) EXPECT_TRUE(valid_utf8(p)) << show(c["text"]);
    }
  }
}

TEST(TokenizerSpm, StreamingByteFallbackAndInvalidBytes) {
  const Tokenizer& t = *mistral().tok;
  // A character the vocabulary lacks is spelled by byte tokens, one byte each: nothing comes out
  // until the last one.
  const std::string text = "\xF0\x9F\xA6\x8B";  // U+1F98B butterfly
  const auto ids = t.encode(text, false, false);
  std::vector<int32_t> bytes(ids.begin(), ids.end());
  ASSERT_GE(bytes.size(), 4u);
  const int32_t b0 = t.token_id("<0xF0>");
  EXPECT_NE(std::find(bytes.begin(), bytes.end(), b0), bytes.end());
  StreamingDetokenizer d(t);
  std::string out;
  for (size_t i = 0; i < bytes.size(); ++i) {
    const std::string p = d.push(bytes[i]);
    if (i + 1 < bytes.size() && t.token_type(bytes[i]) == TokenType::kByte) {
      EXPECT_EQ(p, "") << i;
    }
    out += p;
  }
  EXPECT_EQ(d.flush(), "");
  EXPECT_EQ(out, t.decode(ids, true));

  // Bytes that can never be valid come out as U+FFFD at once, one per maximal invalid subpart.
  const int32_t ff = t.token_id("<0xFF>"), e4 = t.token_id("<0xE4>"), a = t.token_id("<0x41>");
  StreamingDetokenizer bad(t);
  EXPECT_EQ(bad.push(ff), "\xEF\xBF\xBD");
  EXPECT_EQ(bad.push(e4), "");               // may still complete
  EXPECT_EQ(bad.push(a), "\xEF\xBF\xBD" "A");  // cannot any more
  EXPECT_EQ(bad.push(e4), "");
  EXPECT_EQ(bad.flush(), "\xE4");  // flush gives held bytes as they are
}

TEST(TokenizerSpm, UserDefinedAlwaysControlOnlyWithParseSpecial) {
  const Tokenizer& t = *mistral().tok;
  const int32_t ref = t.token_id("[REFERENCE_DOC_1]"), inst = t.token_id("[INST]");
  ASSERT_EQ(t.token_type(ref), TokenType::kUserDefined);
  ASSERT_EQ(t.token_type(inst), TokenType::kControl);
  for (const bool parse : {true, false}) {
    const auto ids = t.encode("a[REFERENCE_DOC_1]b", false, parse);
    EXPECT_NE(std::find(ids.begin(), ids.end(), ref), ids.end());
  }
  auto has_inst = [&](bool parse) {
    const auto ids = t.encode("[INST] hi", false, parse);
    return std::find(ids.begin(), ids.end(), inst) != ids.end();
  };
  EXPECT_TRUE(has_inst(true));
  EXPECT_FALSE(has_inst(false));
  EXPECT_EQ(t.decode(t.encode("[INST] hi", false, true), true), " hi");
}

TEST(TokenizerSpm, LargeInputs) {
  const Tokenizer& t = *mistral().tok;
  // One long symbol sequence (SentencePiece has no pre-splitting): the merge heap holds ~10^6 pairs.
  std::string text;
  while (text.size() < (1 << 20)) text += "Lorem ipsum dolor sit amet, 😀 中文 \xFF\t\n";
  const auto ids = t.encode(text, false, false);
  EXPECT_EQ(t.decode(ids, true), text);
  const std::string word(100000, 'x');
  EXPECT_EQ(t.decode(t.encode(word, false, false), true), word);
}

TEST(TokenizerSpm, AddSpacePrefixOff) {
  VocabSpec spec = mistral().spec;
  spec.add_space_prefix = false;
  const auto t = Tokenizer::from_vocab(spec);
  const auto ids = t->encode("Hello world", false, false);
  EXPECT_EQ(t->token_text(ids[0]), "Hello");
  EXPECT_EQ(t->decode(ids, true), "Hello world");
  EXPECT_EQ(t->decode(t->encode(" x", false, false), true), " x");
}

// A tiny hand-made SentencePiece vocabulary: merges follow scores, not order; unused pieces are
// split back; without byte tokens an unknown character is <unk>, consecutive ones once.
TEST(TokenizerSpm, TinyVocabulary) {
  VocabSpec spec;
  spec.model = "llama";
  spec.tokens = {"<unk>", "<s>", "</s>", "\xE2\x96\x81", "a", "b", "c", "ab", "bc", "\xE2\x96\x81" "a", "abc"};
  spec.scores = {0, 0, 0, -1, -1, -1, -1, -3, -2, -5, -4};
  spec.token_types = {2, 3, 3, 1, 1, 1, 1, 1, 1, 1, 5};  // "abc" unused
  spec.bos_id = 1;
  spec.eos_id = 2;
  spec.unk_id = 0;
  const auto t = Tokenizer::from_vocab(spec);
  // "▁abc": bc (-2), then a+bc = abc (-4, unused, so split back), "▁a" (-5) never applies.
  EXPECT_EQ(t->encode("abc", false, false), (std::vector<int32_t>{3, 4, 8}));
  EXPECT_EQ(t->encode("ab", false, false), (std::vector<int32_t>{3, 7}));
  EXPECT_EQ(t->encode("xy a", false, false), (std::vector<int32_t>{3, 0, 9}));
  EXPECT_EQ(t->decode(t->encode("abc", true, false), true), "abc");
}

// ---- Byte-level BPE without a model file -----------------------------------------------------------

VocabSpec tiny_bpe() {
  VocabSpec spec;
  spec.model = "gpt2";
  spec.pre = "gpt2";
  // All 256 byte tokens, in GPT-2's alphabet, then merges.
  auto cp_utf8 = [](uint32_t cp) {
    std::string s;
    if (cp < 0x80) s += static_cast<char>(cp);
    else {
      s += static_cast<char>(0xC0 | (cp >> 6));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    }
    return s;
  };
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    spec.tokens.push_back(cp_utf8(printable ? b : next++));
  }
  spec.tokens.insert(spec.tokens.end(), {"ll", "he", "hell", "hello", "\xC4\xA0" "w", "<|end|>"});
  spec.merges = {"l l", "h e", "he ll", "hell o", "\xC4\xA0 w"};
  spec.token_types.assign(spec.tokens.size(), 1);
  spec.token_types.back() = 3;
  spec.eos_id = static_cast<int32_t>(spec.tokens.size()) - 1;
  return spec;
}

TEST(TokenizerBpe, TinyVocabulary) {
  const auto t = Tokenizer::from_vocab(tiny_bpe());
  const int32_t hello = 259, gw = 260, end = 261;
  EXPECT_EQ(t->encode("hello", false, false), std::vector<int32_t>{hello});
  const auto ids = t->encode("hello world<|end|>", false, true);
  ASSERT_EQ(ids.size(), 7u);  // hello Ġw o r l d <|end|>
  EXPECT_EQ(ids[0], hello);
  EXPECT_EQ(ids[1], gw);
  EXPECT_EQ(ids.back(), end);
  EXPECT_EQ(t->decode(ids, false), "hello world<|end|>");
  EXPECT_EQ(t->decode(ids, true), "hello world");
  EXPECT_TRUE(t->is_end_of_generation(end));
  EXPECT_EQ(t->bos_id(), -1);
  EXPECT_FALSE(t->add_bos_by_default());
  EXPECT_THROW(t->encode("x", true, false), Error);  // no BOS to add
}

TEST(TokenizerBpe, LargeInputs) {
  for (const char* pre : {"gpt2", "smollm", "llama3", "qwen2"}) {
    VocabSpec spec = tiny_bpe();
    spec.pre = pre;
    const auto t = Tokenizer::from_vocab(spec);
    // Long runs stress the regexes (backtracking in \s+(?!\S), \s*[\r\n]+) and the merge heap.
    for (const std::string& run : {std::string(1 << 20, ' '), std::string(1 << 18, '\t') + "\n \n",
                                  std::string(1 << 18, '!'), std::string(1 << 18, '7')}) {
      const std::string text = run + "x";
      EXPECT_EQ(t->decode(t->encode(text, false, false), false), text) << pre;
    }
    const std::string word(100000, 'l');
    EXPECT_EQ(t->encode(word, false, false).size(), 50000u) << pre;
    // Invalid UTF-8 in the input is kept byte for byte.
    const std::string bad = "a\xFF\xFE\xC3(b \xE4\xBD";
    EXPECT_EQ(t->decode(t->encode(bad, false, false), false), bad) << pre;
  }
}

// ---- Errors ----------------------------------------------------------------------------------------

TEST(TokenizerErrors, BadVocabularies) {
  VocabSpec spec = tiny_bpe();
  spec.source = "model.gguf";
  spec.model = "bert";
  EXPECT_NE(error_of([&] { Tokenizer::from_vocab(spec); }).find("model.gguf: tokenizer model 'bert'"), std::string::npos);
  spec = tiny_bpe();
  spec.pre = "no-such-pre";
  EXPECT_NE(error_of([&] { Tokenizer::from_vocab(spec); }).find("pre-tokenizer 'no-such-pre'"), std::string::npos);
  spec = tiny_bpe();
  spec.merges.push_back("zz q");
  EXPECT_NE(error_of([&] { Tokenizer::from_vocab(spec); }).find("merges[5]"), std::string::npos);
  spec = tiny_bpe();
  spec.token_types.pop_back();
  EXPECT_NE(error_of([&] { Tokenizer::from_vocab(spec); }).find("token_type has"), std::string::npos);
  spec = tiny_bpe();
  spec.eos_id = 100000;
  EXPECT_NE(error_of([&] { Tokenizer::from_vocab(spec); }).find("eos_token_id id 100000"), std::string::npos);
  spec = tiny_bpe();
  spec.tokens.clear();
  EXPECT_THROW(Tokenizer::from_vocab(spec), Error);
  spec = tiny_bpe();
  spec.model = "llama";
  spec.token_types[0] = 6;  // a byte token must be spelled <0xNN>
  EXPECT_THROW(Tokenizer::from_vocab(spec), Error);
}

TEST(TokenizerErrors, BadIdsAndTemplates) {
  const auto t = Tokenizer::from_vocab(tiny_bpe());
  const std::vector<int32_t> bad{1, -5};
  EXPECT_THROW(t->decode(bad, false), Error);
  EXPECT_THROW(t->token_bytes(t->vocab_size()), Error);
  const std::vector<ChatMessage> msgs{{"user", "hi"}};
  EXPECT_NE(error_of([&] { t->apply_chat_template(msgs, true); }).find("chat template not supported"), std::string::npos);
  VocabSpec spec = tiny_bpe();
  spec.chat_template = "{{ messages }} something else";
  EXPECT_NE(error_of([&] { Tokenizer::from_vocab(spec)->apply_chat_template(msgs, true); })
                .find("chat template not supported: \"{{ messages }}"),
            std::string::npos);
}

// ---- Other chat templates --------------------------------------------------------------------------

// Llama 3, 3.1, 2 and Mistral v0.1-v0.3: transformers' output, or an error where the template
// raises one (a system message v0.1 takes none of, roles not alternating).
TEST(TokenizerChatTemplate, OtherTemplatesMatchTransformers) {
  const json fx = load_json("smollm2.json");  // the template fixtures need no model file
  int n = 0;
  for (const auto& tmpl : fx["other_templates"]) {
    VocabSpec spec = tiny_bpe();
    spec.tokens.push_back(tmpl["bos"]);
    spec.tokens.push_back(tmpl["eos"]);
    spec.token_types.push_back(3);
    spec.token_types.push_back(3);
    spec.bos_id = static_cast<int32_t>(spec.tokens.size()) - 2;
    spec.eos_id = static_cast<int32_t>(spec.tokens.size()) - 1;
    spec.chat_template = tmpl["template"];
    const auto t = Tokenizer::from_vocab(spec);
    for (const auto& c : tmpl["chat"]) {
      std::vector<ChatMessage> msgs;
      for (const auto& m : c["messages"]) msgs.push_back({m["role"], m["content"]});
      const bool gen = c["add_generation_prompt"].get<bool>();
      if (c["rendered"].is_null()) {
        EXPECT_NE(error_of([&] { t->apply_chat_template(msgs, gen); }).find("chat template"), std::string::npos)
            << tmpl["name"] << " " << c["messages"].dump();
      } else {
        EXPECT_EQ(t->apply_chat_template(msgs, gen), c["rendered"].get<std::string>())
            << tmpl["name"] << " " << c["messages"].dump();
      }
      ++n;
    }
  }
  EXPECT_GE(n, 72);  // 3 templates x 4 conversations + 3 Mistral templates x 8, with and without the prompt
}

TEST(TokenizerChatTemplate, Llama32UsesTodaysDate) {
  const json fx = load_json("smollm2.json");
  VocabSpec spec = tiny_bpe();
  spec.chat_template = fx["llama3.2_template"];
  spec.tokens.push_back("<|begin_of_text|>");
  spec.token_types.push_back(3);
  spec.bos_id = static_cast<int32_t>(spec.tokens.size()) - 1;
  const auto t = Tokenizer::from_vocab(spec);
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char date[32];
  std::strftime(date, sizeof(date), "%d %b %Y", &local);
  const std::vector<ChatMessage> msgs{{"system", " Be brief. "}, {"user", "Hi"}};
  EXPECT_EQ(t->apply_chat_template(msgs, true),
            std::string("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: "
                        "December 2023\nToday Date: ") +
                date +
                "\n\nBe brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

// ---- Tools in chat templates ------------------------------------------------------------------

// A tokenizer for rendering one template: the tiny vocabulary with the template's BOS and EOS.
std::unique_ptr<Tokenizer> template_tokenizer(const std::string& tmpl, const std::string& bos, const std::string& eos) {
  VocabSpec spec = tiny_bpe();
  if (!bos.empty()) {
    spec.tokens.push_back(bos);
    spec.token_types.push_back(3);
    spec.bos_id = static_cast<int32_t>(spec.tokens.size()) - 1;
  }
  spec.tokens.push_back(eos);
  spec.token_types.push_back(3);
  spec.eos_id = static_cast<int32_t>(spec.tokens.size()) - 1;
  spec.chat_template = tmpl;
  return Tokenizer::from_vocab(spec);
}

std::vector<ChatMessage> tool_messages(const nlohmann::ordered_json& messages) {
  std::vector<ChatMessage> out;
  for (const auto& m : messages) {
    ChatMessage msg{m["role"], m.value("content", std::string())};
    if (m.contains("tool_calls"))
      for (const auto& c : m["tool_calls"])
        msg.tool_calls.push_back({c["id"], c["function"]["name"], c["function"]["arguments"]});
    msg.tool_call_id = m.value("tool_call_id", std::string());
    out.push_back(std::move(msg));
  }
  return out;
}

// Qwen2.5, Qwen3, Llama 3.1, Mistral v0.3 and SmolLM2 (the generic format, defined as Qwen2.5's
// template with SmolLM2's default system message): tools, calls and results as the templates render
// them (tests/fixtures/tokenizer/make_tool_fixtures.py), or an error where the template raises one
// (Llama 3.1 takes one call per message).
TEST(TokenizerChatTemplate, ToolsMatchTheTemplates) {
  std::ifstream in(fixture_path("tool_templates.json"));
  ASSERT_TRUE(in) << fixture_path("tool_templates.json");
  const auto fx = nlohmann::ordered_json::parse(in);  // the tools' key order is what is printed
  int n = 0, refused = 0;
  for (const auto& tmpl : fx["templates"]) {
    const auto t = template_tokenizer(tmpl["template"], tmpl["bos"], tmpl["eos"]);
    for (const auto& c : tmpl["chat"]) {
      const std::vector<ChatMessage> msgs = tool_messages(c["messages"]);
      ChatOptions options;
      if (c["tools"].is_array())
        for (const auto& tool : c["tools"]) options.tools.push_back(tool.dump());
      const bool gen = c["add_generation_prompt"].get<bool>();
      if (c["rendered"].is_null()) {
        EXPECT_NE(error_of([&] { t->apply_chat_template(msgs, gen, options); }).find("chat template"),
                  std::string::npos)
            << tmpl["name"] << " " << c["messages"].dump();
        ++refused;
      } else {
        EXPECT_EQ(t->apply_chat_template(msgs, gen, options), c["rendered"].get<std::string>())
            << tmpl["name"] << " " << c["messages"].dump();
      }
      ++n;
    }
  }
  EXPECT_EQ(n, 50);
  EXPECT_EQ(refused, 2);
}

TEST(TokenizerChatTemplate, ToolCallFormatOfEachFamily) {
  std::ifstream in(fixture_path("tool_templates.json"));
  const auto fx = nlohmann::ordered_json::parse(in);
  std::map<std::string, ToolCallFormat> want = {{"qwen2.5", ToolCallFormat::kHermes},
                                                {"qwen3", ToolCallFormat::kHermes},
                                                {"llama3.1", ToolCallFormat::kLlama3Json},
                                                {"mistral-v0.3", ToolCallFormat::kMistral},
                                                {"smollm2", ToolCallFormat::kHermes}};
  for (const auto& tmpl : fx["templates"])
    EXPECT_EQ(template_tokenizer(tmpl["template"], tmpl["bos"], tmpl["eos"])->tool_call_format(),
              want.at(tmpl["name"].get<std::string>()))
        << tmpl["name"];
  const json other = load_json("smollm2.json");
  for (const auto& tmpl : other["other_templates"])  // Llama 3 and 2, Mistral v0.1-v0.3, Llama 3.1
    EXPECT_EQ(template_tokenizer(tmpl["template"], tmpl["bos"], tmpl["eos"])->tool_call_format(),
              tmpl["name"] == "llama3.1"       ? ToolCallFormat::kLlama3Json
              : tmpl["name"] == "mistral-v0.3" ? ToolCallFormat::kMistral
                                               : ToolCallFormat::kHermes)
        << tmpl["name"];
}

// Templates without tool syntax get the generic format through their own rendering: Llama 3's
// system message, Mistral v0.1's first user message (it takes no system message).
TEST(TokenizerChatTemplate, GenericToolFormatInOtherTemplates) {
  const json fx = load_json("smollm2.json");
  const auto find = [&](const std::string& name) {
    for (const auto& t : fx["other_templates"])
      if (t["name"] == name) return template_tokenizer(t["template"], t["bos"], t["eos"]);
    throw std::runtime_error("no template " + name);
  };
  ChatOptions options;
  options.tools = {R"({"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}})"};
  std::vector<ChatMessage> msgs{{"user", "Call f."}};
  msgs.push_back({"assistant", "", {{"call_1", "f", R"({"a": 1})"}}});
  msgs.push_back({"tool", "done", {}, "call_1"});
  const std::string prompt =
      "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function "
      "signatures within <tools></tools> XML tags:\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"f\", "
      "\"parameters\": {\"type\": \"object\"}}}\n</tools>\n\nFor each function call, return a json object with function "
      "name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
      "\"arguments\": <args-json-object>}\n</tool_call>";
  EXPECT_EQ(find("llama3")->apply_chat_template(msgs, true, options),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n" + prompt +
                "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nCall f.<|eot_id|><|start_header_id|>assistant"
                "<|end_header_id|>\n\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call><|eot_id|>"
                "<|start_header_id|>user<|end_header_id|>\n\n<tool_response>\ndone\n</tool_response><|eot_id|>"
                "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(find("mistral-v0.1")->apply_chat_template(msgs, true, options),
            "<s>[INST] " + prompt + "\n\nCall f. [/INST]<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n"
                                    "</tool_call></s>[INST] <tool_response>\ndone\n</tool_response> [/INST]");
  // Mistral v0.3 writes its own syntax, with the last 9 characters of a longer call id.
  msgs[1].tool_calls[0].id = msgs[2].tool_call_id = "call_abcDEF123";
  const std::string v03 = find("mistral-v0.3")->apply_chat_template(msgs, true, options);
  EXPECT_NE(v03.find(R"([TOOL_CALLS] [{"name": "f", "arguments": {"a": 1}, "id": "abcDEF123"}]</s>)"), std::string::npos)
      << v03;
  EXPECT_NE(v03.find(R"([TOOL_RESULTS] {"content": done, "call_id": "abcDEF123"}[/TOOL_RESULTS])"), std::string::npos)
      << v03;
  msgs[1].tool_calls[0].id = "short";
  EXPECT_NE(error_of([&] { find("mistral-v0.3")->apply_chat_template(msgs, true, options); }).find("9 characters"),
            std::string::npos);
  // Arguments that are not JSON are named.
  msgs[1].tool_calls[0].arguments = "{oops";
  EXPECT_NE(error_of([&] { find("llama3")->apply_chat_template(msgs, true, options); }).find("is not JSON"),
            std::string::npos);
}

}  // namespace
}  // namespace fdpp
