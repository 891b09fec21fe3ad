// Tokenizers built from a model's description: byte-level BPE (gpt2 style, with the pre-tokenizer
// the model names: llama3, smollm, qwen2, gpt2, ...) and SentencePiece-style vocabularies (llama/
// mistral GGUF "llama" model: score-ordered merges over UTF-8 pieces with byte fallback).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace fdpp {

namespace gguf {
class GgufFile;
}

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Builds the tokenizer a GGUF file describes (tokenizer.ggml.* keys). Throws fdpp::Error naming
  // the file for a missing or inconsistent vocabulary or an unsupported tokenizer model.
  static std::unique_ptr<Tokenizer> from_gguf(const gguf::GgufFile& file);

  // Text -> ids. add_bos: prepend BOS (callers pass add_bos_by_default() unless told otherwise).
  // parse_special: text like "<|im_start|>" becomes the special token rather than plain text.
  virtual std::vector<int32_t> encode(std::string_view text, bool add_bos, bool parse_special) const = 0;

  // The bytes a token stands for (byte-level BPE mapped back to raw bytes, SentencePiece's U+2581
  // turned into a space, <0xNN> byte tokens into the byte). Special tokens give their text.
  virtual std::string token_bytes(int32_t id) const = 0;

  // ids -> text: concatenated token_bytes with the SentencePiece leading-space rule applied; bytes
  // that are not valid UTF-8 stay as they are (the streaming detokenizer handles incomplete ones).
  virtual std::string decode(std::span<const int32_t> ids, bool skip_special) const = 0;

  virtual int32_t vocab_size() const = 0;
  virtual int32_t bos_id() const = 0;  // -1 when the model has none
  virtual int32_t eos_id() const = 0;
  virtual bool add_bos_by_default() const = 0;
  // End of generation: EOS and end-of-turn tokens such as <|im_end|>, <|eot_id|>, </s>.
  virtual bool is_end_of_generation(int32_t id) const = 0;
  virtual bool is_special(int32_t id) const = 0;

  // Renders a conversation with the model's chat template. Supported: ChatML (<|im_start|>,
  // SmolLM2/Qwen), and whatever else the implementation adds; throws fdpp::Error otherwise.
  virtual std::string apply_chat_template(std::span<const ChatMessage> messages, bool add_generation_prompt) const = 0;
};

// Streaming detokenization: feed ids one at a time, get the text that is complete so far. Bytes of
// a UTF-8 sequence that is not yet complete are held back until the next token completes them
// (or flush() gives them out as they are).
class StreamingDetokenizer {
 public:
  explicit StreamingDetokenizer(const Tokenizer& tokenizer, bool skip_special = true)
      : tokenizer_(tokenizer), skip_special_(skip_special) {}
  std::string push(int32_t id);
  std::string flush();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_;
  bool first_ = true;
  std::string pending_;
};

}  // namespace fdpp
