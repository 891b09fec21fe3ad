// Private parts of the tokenizers: the vocabulary and special-token matching every model shares
// (TokenizerBase), UTF-8 helpers, GPT-2's byte<->unicode mapping, PCRE2-backed pre-tokenizers and
// the chat templates. Only src/tokenizer/*.cpp includes this.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace fdpp::tok {

// ---- UTF-8 ---------------------------------------------------------------------------------------

// Length of the well-formed UTF-8 sequence starting at s[0] (1..4), or 0 when s does not start with
// one. Unicode Table 3-7: no overlongs, no surrogates, nothing above U+10FFFF.
size_t utf8_valid_len(std::string_view s);

// For s starting with a possible sequence that runs off the end (e.g. "\xE4\xBD"): true when
// s is a proper prefix of some well-formed sequence, i.e. more bytes could complete it.
bool utf8_incomplete_prefix(std::string_view s);

// Length of the maximal subpart of an ill-formed sequence at s[0] (>= 1): the bytes one U+FFFD
// replaces under Unicode's "substitution of maximal subparts".
size_t utf8_maximal_subpart(std::string_view s);

void append_utf8(std::string& out, uint32_t cp);

// ---- GPT-2 byte-level alphabet -------------------------------------------------------------------

// GPT-2's bytes_to_unicode(): printable bytes map to themselves, the other 68 to U+0100 onwards,
// so every byte is one visible character ("Ġ" = space, "Ċ" = newline).
struct ByteLevelAlphabet {
  std::array<std::string, 256> byte_to_utf8;      // byte -> its character, UTF-8 encoded
  std::unordered_map<uint32_t, uint8_t> cp_to_byte;  // code point -> byte
  ByteLevelAlphabet();
  // The raw bytes a byte-level token spells; false if a character is outside the alphabet.
  bool decode(std::string_view token, std::string& out) const;
  std::string encode(std::string_view bytes) const;
};
const ByteLevelAlphabet& byte_level_alphabet();

// ---- Pre-tokenizer -------------------------------------------------------------------------------

// A compiled PCRE2 pattern (UTF + UCP, JIT when available). Invalid UTF-8 in the subject is
// allowed (PCRE2_MATCH_INVALID_UTF): such bytes never match and so end up in the gaps.
class Regex {
 public:
  explicit Regex(const std::string& pattern);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  // Splits text like HF's Split(behavior="isolated"): every match and every non-empty gap between
  // matches becomes a piece, in order. Pieces are appended to out as views into text.
  void split(std::string_view text, std::vector<std::string_view>& out) const;

 private:
  void* code_ = nullptr;  // pcre2_code_8*
  std::string pattern_;
};

// A sequence of isolated regex splits (HF Sequence[Split..., ByteLevel]), as llama.cpp's
// regex_exprs: each step splits every piece the previous step produced.
class PreTokenizer {
 public:
  // name is tokenizer.ggml.pre; throws fdpp::Error for a name we do not know.
  PreTokenizer(const std::string& name, const std::string& source);
  std::vector<std::string_view> split(std::string_view text) const;
  bool ignore_merges() const { return ignore_merges_; }
  bool add_bos_default() const { return add_bos_default_; }

 private:
  std::vector<std::unique_ptr<Regex>> steps_;
  bool ignore_merges_ = false;
  bool add_bos_default_ = false;
};

// ---- Chat templates ------------------------------------------------------------------------------

// Renders messages with the template a model's tokenizer.chat_template describes (recognized by its
// markers, rendered natively rather than by a Jinja engine). Throws fdpp::Error
// "chat template not supported: ..." for one it does not know.
std::string render_chat_template(const std::string& tmpl, std::span<const ChatMessage> messages,
                                 bool add_generation_prompt, const std::string& bos_text,
                                 const std::string& eos_text, const ChatOptions& options = {});
// The tool-call syntax the template teaches (Hermes for the templates without one of their own).
ToolCallFormat chat_tool_call_format(const std::string& tmpl);
// The conversation rewritten in the generic tool format (chat_template.cpp's header): the tools
// block in the system message (default_system when there is none; the first user message when
// system_ok is false), calls as <tool_call> text, results as user messages.
std::vector<ChatMessage> generic_tool_conversation(std::span<const ChatMessage> messages, const ChatOptions& options,
                                                   const std::string& default_system, bool system_ok);

// ---- Shared tokenizer base -----------------------------------------------------------------------

class TokenizerBase : public Tokenizer {
 public:
  explicit TokenizerBase(const VocabSpec& spec);

  std::vector<int32_t> encode(std::string_view text, bool add_bos, bool parse_special) const override;
  std::string token_bytes(int32_t id) const override;
  std::string decode(std::span<const int32_t> ids, bool skip_special) const override;
  void append_token_text(std::string& out, int32_t id, bool& at_start, bool skip_special) const override;
  int32_t vocab_size() const override { return static_cast<int32_t>(tokens_.size()); }
  int32_t bos_id() const override { return bos_id_; }
  int32_t eos_id() const override { return eos_id_; }
  bool add_bos_by_default() const override { return add_bos_; }
  bool is_end_of_generation(int32_t id) const override;
  bool is_special(int32_t id) const override;
  TokenType token_type(int32_t id) const override;
  const std::string& token_text(int32_t id) const override;
  int32_t token_id(std::string_view text) const override;
  std::string apply_chat_template(std::span<const ChatMessage> messages, bool add_generation_prompt,
                                  const ChatOptions& options = {}) const override;
  ToolCallFormat tool_call_format() const override { return chat_tool_call_format(chat_template_); }

 protected:
  // Encodes plain text (no special tokens in it). segment_start: the text starts the input or
  // follows a control token matched by parse_special (SentencePiece's space prefix goes there; it
  // is called with empty text when a segment starts with a user-defined token).
  virtual void encode_text(std::string_view text, bool segment_start, std::vector<int32_t>& out) const = 0;
  // The raw bytes of a token other than a control or unknown one.
  virtual std::string piece_bytes(int32_t id) const = 0;
  // Whether the first emitted token loses one leading space (SentencePiece with add_space_prefix).
  virtual bool strips_leading_space(int32_t id) const { (void)id; return false; }

  void check_id(int32_t id) const;

  std::string source_;
  std::vector<std::string> tokens_;
  std::vector<TokenType> types_;
  std::unordered_map<std::string_view, int32_t> token_to_id_;  // views into tokens_
  int32_t bos_id_ = -1, eos_id_ = -1, unk_id_ = -1;
  bool add_bos_ = false;
  std::vector<uint8_t> eog_;  // per id: ends generation
  std::string chat_template_;

 private:
  // Special tokens by first byte, longest first: the candidates for a match at a position.
  struct Special {
    std::string_view text;
    int32_t id;
    bool control;  // matched only with parse_special
  };
  std::array<std::vector<Special>, 256> specials_by_first_byte_;
};

std::unique_ptr<Tokenizer> make_bpe_tokenizer(const VocabSpec& spec);
std::unique_ptr<Tokenizer> make_spm_tokenizer(const VocabSpec& spec);

}  // namespace fdpp::tok
