// Tokenizers built from a model's description: byte-level BPE (gpt2 style, with the pre-tokenizer
// the model names: llama3, smollm, qwen2, gpt2, ...) and SentencePiece-style vocabularies (llama/
// mistral GGUF "llama" model: score-ordered merges over UTF-8 pieces with byte fallback).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace fdpp {

namespace gguf {
class GgufFile;
}

// A function call an assistant message made (OpenAI's tool_calls[i]).
struct ToolCall {
  std::string id;         // "call_..." (Mistral's templates want 9 characters: the last 9 are used)
  std::string name;
  std::string arguments;  // JSON text (an object), as OpenAI sends it
};

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", "tool"
  std::string content;
  std::vector<ToolCall> tool_calls{};  // assistant: the calls it made
  std::string tool_call_id{};          // tool: the call this result answers
};

// Template variables beyond the conversation (transformers' apply_chat_template **kwargs, the
// server's chat_template_kwargs); templates that do not read one ignore it.
struct ChatOptions {
  // Qwen3's thinking switch: false writes an empty <think></think> block after the generation
  // prompt (the model answers without reasoning); unset or true leaves the model to think.
  std::optional<bool> enable_thinking;
  // Tool definitions, each OpenAI's {"type": "function", "function": {"name", "description",
  // "parameters"}} as JSON text in the client's key order (templates print them with tojson, which
  // keeps it). Empty: no tools (a template then writes no tool prompt).
  std::vector<std::string> tools{};
};

// How a model writes a tool call, which its chat template teaches it (tokenizer/tool_calls.h parses
// each): Hermes' <tool_call>{"name", "arguments"}</tool_call> (Qwen2.5/3, and fdpp's generic format
// for templates without tool syntax), Llama 3.1's JSON {"name", "parameters"} (after
// <|python_tag|> or alone), Mistral's [TOOL_CALLS] [{"name", "arguments"}, ...].
enum class ToolCallFormat { kHermes, kLlama3Json, kMistral };

// llama.cpp's token types (tokenizer.ggml.token_type; SentencePiece's ModelProto uses the same).
enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,      // <s>, <|im_start|>: matched in text only with parse_special, dropped by skip_special
  kUserDefined = 4,  // always matched whole in text (like sentencepiece and HF's non-special added tokens)
  kUnused = 5,
  kByte = 6,         // <0xNN> byte fallback
};

// Everything a tokenizer is built from: the tokenizer.ggml.* metadata of a GGUF file, as plain
// arrays, so that tests and other formats can build a Tokenizer without a GGUF file.
struct VocabSpec {
  std::string source = "vocabulary";  // names the origin in error messages (the GGUF path)
  std::string model;                  // "gpt2" (byte-level BPE) or "llama" (SentencePiece-style)
  std::string pre;                    // gpt2 pre-tokenizer: "smollm", "gpt2", "llama3", "qwen2", ...
  std::vector<std::string> tokens;
  std::vector<float> scores;           // "llama": merge priority; empty = all 0
  std::vector<int32_t> token_types;    // TokenType values; empty = all normal
  std::vector<std::string> merges;     // "gpt2": "left right", best first
  int32_t bos_id = -1, eos_id = -1, unk_id = -1, eot_id = -1, eom_id = -1;
  std::optional<bool> add_bos;         // unset: the model's default (llama.cpp's)
  std::optional<bool> add_space_prefix;  // "llama" only; unset: true
  std::string chat_template;

  // Reads the tokenizer.ggml.* keys (and tokenizer.chat_template); throws fdpp::Error naming the
  // file for a missing or mistyped key.
  static VocabSpec from_gguf(const gguf::GgufFile& file);
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Builds the tokenizer a GGUF file describes (tokenizer.ggml.* keys). Throws fdpp::Error naming
  // the file for a missing or inconsistent vocabulary or an unsupported tokenizer model.
  static std::unique_ptr<Tokenizer> from_gguf(const gguf::GgufFile& file);
  // Builds a tokenizer from arrays; throws fdpp::Error naming spec.source for an inconsistent
  // vocabulary (array sizes, merges naming absent tokens, ids out of range) or an unsupported
  // model / pre-tokenizer.
  static std::unique_ptr<Tokenizer> from_vocab(const VocabSpec& spec);
  // For a checkpoint without tokenizer files: token ids only. encode and apply_chat_template throw
  // ("no tokenizer"); every token's text is empty; end of generation is any of eos_ids.
  static std::unique_ptr<Tokenizer> ids_only(int32_t vocab_size, std::vector<int32_t> eos_ids, int32_t bos_id);

  // Text -> ids. add_bos: prepend BOS (callers pass add_bos_by_default() unless told otherwise).
  // parse_special: text like "<|im_start|>" becomes the special token rather than plain text.
  virtual std::vector<int32_t> encode(std::string_view text, bool add_bos, bool parse_special) const = 0;

  // The bytes a token stands for (byte-level BPE mapped back to raw bytes, SentencePiece's U+2581
  // turned into a space, <0xNN> byte tokens into the byte). Special tokens give their text.
  virtual std::string token_bytes(int32_t id) const = 0;

  // ids -> text: concatenated token_bytes with the SentencePiece leading-space rule applied; bytes
  // that are not valid UTF-8 stay as they are (the streaming detokenizer handles incomplete ones).
  // Throws fdpp::Error for an id outside [0, vocab_size).
  virtual std::string decode(std::span<const int32_t> ids, bool skip_special) const = 0;

  // One step of decode(): appends the text of id to out. at_start is true while no token has been
  // emitted (tokens dropped by skip_special do not count) and is cleared here once one is; the
  // SentencePiece rule strips one leading space from that first emitted token when it is a piece
  // starting with U+2581 and add_space_prefix is on. decode() is this over all ids.
  virtual void append_token_text(std::string& out, int32_t id, bool& at_start, bool skip_special) const = 0;

  virtual int32_t vocab_size() const = 0;
  virtual int32_t bos_id() const = 0;  // -1 when the model has none
  virtual int32_t eos_id() const = 0;
  virtual bool add_bos_by_default() const = 0;
  // End of generation: EOS and end-of-turn tokens such as <|im_end|>, <|eot_id|>, </s>.
  virtual bool is_end_of_generation(int32_t id) const = 0;
  // CONTROL, USER_DEFINED and UNKNOWN tokens (those that are not plain text pieces).
  virtual bool is_special(int32_t id) const = 0;
  virtual TokenType token_type(int32_t id) const = 0;  // kUndefined for an id out of range
  // The token's text as the vocabulary spells it (byte-level "Ġhello", SentencePiece "▁hello").
  virtual const std::string& token_text(int32_t id) const = 0;
  // The id of a token by its vocabulary spelling; -1 when absent.
  virtual int32_t token_id(std::string_view text) const = 0;

  // Renders a conversation with the model's chat template. Supported: ChatML (<|im_start|>,
  // SmolLM2/Qwen), and whatever else the implementation adds; throws fdpp::Error otherwise.
  virtual std::string apply_chat_template(std::span<const ChatMessage> messages, bool add_generation_prompt,
                                          const ChatOptions& options = {}) const = 0;
  // The tool-call syntax apply_chat_template teaches the model when given tools.
  virtual ToolCallFormat tool_call_format() const { return ToolCallFormat::kHermes; }
};

// Streaming detokenization: feed ids one at a time, get the text that is complete so far. Bytes of
// a UTF-8 sequence that is not yet complete are held back until the next token completes them
// (or flush() gives them out as they are). Bytes that can never become valid UTF-8 (a stray
// continuation byte, C0/C1/F5..FF, a sequence cut short by a byte that cannot continue it) are
// given out as U+FFFD, one per maximal invalid subpart (Unicode's recommended practice), so push()
// output is always valid UTF-8. For ids whose bytes are valid UTF-8, the concatenation of all
// push() results and flush() equals tokenizer.decode(ids, skip_special).
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
