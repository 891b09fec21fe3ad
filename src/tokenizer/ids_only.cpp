// Tokenizer::ids_only: the stand-in for a checkpoint without tokenizer files, so that generation
// by token ids runs (the ids are the output; the text is empty).
#include <algorithm>

#include "fdpp/error.h"
#include "tokenizer/tokenizer.h"

namespace fdpp {

namespace {

class IdsOnlyTokenizer final : public Tokenizer {
 public:
  IdsOnlyTokenizer(int32_t vocab, std::vector<int32_t> eos, int32_t bos) : vocab_(vocab), eos_(std::move(eos)), bos_(bos) {}

  std::vector<int32_t> encode(std::string_view, bool, bool) const override {
    fail("the model has no tokenizer (tokenizer.json, tokenizer.model or vocab.json + merges.txt): give --token-ids");
  }
  std::string token_bytes(int32_t) const override { return {}; }
  std::string decode(std::span<const int32_t>, bool) const override { return {}; }
  void append_token_text(std::string&, int32_t, bool&, bool) const override {}
  int32_t vocab_size() const override { return vocab_; }
  int32_t bos_id() const override { return bos_; }
  int32_t eos_id() const override { return eos_.empty() ? -1 : eos_.front(); }
  bool add_bos_by_default() const override { return false; }
  bool is_end_of_generation(int32_t id) const override { return std::find(eos_.begin(), eos_.end(), id) != eos_.end(); }
  bool is_special(int32_t id) const override { return id == bos_ || is_end_of_generation(id); }
  TokenType token_type(int32_t id) const override {
    return id < 0 || id >= vocab_ ? TokenType::kUndefined : is_special(id) ? TokenType::kControl : TokenType::kNormal;
  }
  const std::string& token_text(int32_t) const override { return empty_; }
  int32_t token_id(std::string_view) const override { return -1; }
  std::string apply_chat_template(std::span<const ChatMessage>, bool, const ChatOptions& = {}) const override {
    fail("the model has no tokenizer, so no chat template: give --token-ids");
  }

 private:
  int32_t vocab_;
  std::vector<int32_t> eos_;
  int32_t bos_;
  std::string empty_;
};

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::ids_only(int32_t vocab_size, std::vector<int32_t> eos_ids, int32_t bos_id) {
  return std::make_unique<IdsOnlyTokenizer>(vocab_size, std::move(eos_ids), bos_id);
}

}  // namespace fdpp
