// What every tokenizer shares: building from a GGUF / VocabSpec, special-token matching, decode,
// end-of-generation tokens and chat templates. The models themselves are in bpe.cpp and spm.cpp.
#include <algorithm>

#include "fdpp/error.h"
#include "io/gguf.h"
#include "tokenizer/internal.h"

namespace fdpp {

VocabSpec VocabSpec::from_gguf(const gguf::GgufFile& file) {
  VocabSpec spec;
  spec.source = file.path();
  spec.model = file.get_string("tokenizer.ggml.model");
  spec.pre = file.get_string("tokenizer.ggml.pre", "");
  spec.tokens = file.get_string_array("tokenizer.ggml.tokens");
  if (file.find("tokenizer.ggml.scores") != nullptr) {
    const auto scores = file.get_float_array("tokenizer.ggml.scores");
    spec.scores.assign(scores.begin(), scores.end());
  }
  if (file.find("tokenizer.ggml.token_type") != nullptr) {
    const auto types = file.get_int_array("tokenizer.ggml.token_type");
    spec.token_types.reserve(types.size());
    for (const int64_t t : types) {
      check(t >= 0 && t <= 6, "{}: tokenizer.ggml.token_type has value {} (expected 0..6)", spec.source, t);
      spec.token_types.push_back(static_cast<int32_t>(t));
    }
  }
  if (file.find("tokenizer.ggml.merges") != nullptr) spec.merges = file.get_string_array("tokenizer.ggml.merges");
  // Ids: a key that is present must fit in int32 (range against the vocabulary is checked later).
  auto id = [&](const char* key) -> int32_t {
    if (file.find(key) == nullptr) return -1;
    const uint64_t v = file.get_uint(key);
    check(v <= static_cast<uint64_t>(INT32_MAX), "{}: {} = {} is not a token id", spec.source, key, v);
    return static_cast<int32_t>(v);
  };
  spec.bos_id = id("tokenizer.ggml.bos_token_id");
  spec.eos_id = id("tokenizer.ggml.eos_token_id");
  spec.unk_id = id("tokenizer.ggml.unknown_token_id");
  spec.eot_id = id("tokenizer.ggml.eot_token_id");
  spec.eom_id = id("tokenizer.ggml.eom_token_id");
  if (file.find("tokenizer.ggml.add_bos_token") != nullptr) spec.add_bos = file.get_bool("tokenizer.ggml.add_bos_token", false);
  if (file.find("tokenizer.ggml.add_space_prefix") != nullptr)
    spec.add_space_prefix = file.get_bool("tokenizer.ggml.add_space_prefix", true);
  spec.chat_template = file.get_string("tokenizer.chat_template", "");
  return spec;
}

std::unique_ptr<Tokenizer> Tokenizer::from_gguf(const gguf::GgufFile& file) {
  return from_vocab(VocabSpec::from_gguf(file));
}

std::unique_ptr<Tokenizer> Tokenizer::from_vocab(const VocabSpec& spec) {
  if (spec.model == "gpt2") return tok::make_bpe_tokenizer(spec);
  if (spec.model == "llama") return tok::make_spm_tokenizer(spec);
  fail("{}: tokenizer model '{}' (tokenizer.ggml.model) not supported; supported: gpt2 (byte-level BPE), "
       "llama (SentencePiece-style)", spec.source, spec.model);
}

namespace tok {

TokenizerBase::TokenizerBase(const VocabSpec& spec) : source_(spec.source), tokens_(spec.tokens) {
  const size_t n = tokens_.size();
  check(n > 0, "{}: tokenizer.ggml.tokens is empty", source_);
  check(n <= static_cast<size_t>(INT32_MAX), "{}: {} tokens do not fit int32 ids", source_, n);
  check(spec.token_types.empty() || spec.token_types.size() == n,
        "{}: tokenizer.ggml.token_type has {} entries for {} tokens", source_, spec.token_types.size(), n);
  check(spec.scores.empty() || spec.scores.size() == n, "{}: tokenizer.ggml.scores has {} entries for {} tokens",
        source_, spec.scores.size(), n);
  types_.resize(n, TokenType::kNormal);
  for (size_t i = 0; i < spec.token_types.size(); ++i) {
    const int32_t t = spec.token_types[i];
    check(t >= 0 && t <= 6, "{}: token {} has type {} (expected 0..6)", source_, i, t);
    types_[i] = static_cast<TokenType>(t);
  }
  token_to_id_.reserve(n);
  // A spelling that occurs twice maps to its last id, as in llama.cpp and HF's vocab dict.
  for (size_t i = 0; i < n; ++i) token_to_id_[tokens_[i]] = static_cast<int32_t>(i);

  auto valid = [&](int32_t id, const char* what) -> int32_t {
    if (id < 0) return -1;
    check(static_cast<size_t>(id) < n, "{}: {} id {} is outside the vocabulary of {} tokens", source_, what, id, n);
    return id;
  };
  bos_id_ = valid(spec.bos_id, "tokenizer.ggml.bos_token_id");
  eos_id_ = valid(spec.eos_id, "tokenizer.ggml.eos_token_id");
  unk_id_ = valid(spec.unk_id, "tokenizer.ggml.unknown_token_id");
  const int32_t eot = valid(spec.eot_id, "tokenizer.ggml.eot_token_id");
  const int32_t eom = valid(spec.eom_id, "tokenizer.ggml.eom_token_id");
  chat_template_ = spec.chat_template;

  // End of generation: EOS, EOT/EOM from metadata, and the end-of-turn tokens models use by name.
  eog_.assign(n, 0);
  for (const int32_t id : {eos_id_, eot, eom})
    if (id >= 0) eog_[id] = 1;
  for (const char* name : {"<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<|endoftext|>", "<|end_of_text|>",
                           "</s>", "<end_of_turn>"}) {
    const int32_t id = token_id(name);
    if (id >= 0) eog_[id] = 1;
  }

  // Special tokens matched in text, longest first per first byte (leftmost-longest, as HF's
  // added-token matcher).
  for (size_t i = 0; i < n; ++i) {
    const TokenType t = types_[i];
    if ((t != TokenType::kControl && t != TokenType::kUserDefined) || tokens_[i].empty()) continue;
    if (token_to_id_[tokens_[i]] != static_cast<int32_t>(i)) continue;  // a duplicate spelling
    specials_by_first_byte_[static_cast<uint8_t>(tokens_[i][0])].push_back(
        {tokens_[i], static_cast<int32_t>(i), t == TokenType::kControl});
  }
  for (auto& list : specials_by_first_byte_)
    std::stable_sort(list.begin(), list.end(),
                     [](const Special& a, const Special& b) { return a.text.size() > b.text.size(); });
}

void TokenizerBase::check_id(int32_t id) const {
  check(id >= 0 && static_cast<size_t>(id) < tokens_.size(), "token id {} is outside the vocabulary of {} tokens",
        id, tokens_.size());
}

std::vector<int32_t> TokenizerBase::encode(std::string_view text, bool add_bos, bool parse_special) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 2);
  if (add_bos) {
    check(bos_id_ >= 0, "{}: BOS requested but the vocabulary has no BOS token", source_);
    out.push_back(bos_id_);
  }
  // Split at special tokens: CONTROL ones only with parse_special, USER_DEFINED ones always
  // (llama.cpp and sentencepiece match user-defined pieces whole in any text; HF matches its
  // non-special added tokens the same way). The text between control tokens is one segment, as if
  // each were encoded on its own: SentencePiece's space prefix goes at the start of each segment,
  // even when the segment starts with a user-defined token (sentencepiece: "[REF] x" is
  // "▁", "[REF]", "▁x").
  size_t start = 0, i = 0;
  bool segment_start = true;
  while (i < text.size()) {
    const auto& candidates = specials_by_first_byte_[static_cast<uint8_t>(text[i])];
    const Special* hit = nullptr;
    for (const Special& s : candidates) {
      if (s.control && !parse_special) continue;
      if (text.compare(i, s.text.size(), s.text) == 0) {
        hit = &s;
        break;
      }
    }
    if (hit == nullptr) {
      ++i;
      continue;
    }
    if (i > start || (segment_start && !hit->control)) encode_text(text.substr(start, i - start), segment_start, out);
    out.push_back(hit->id);
    segment_start = hit->control;
    i += hit->text.size();
    start = i;
  }
  if (start < text.size()) encode_text(text.substr(start), segment_start, out);
  return out;
}

std::string TokenizerBase::token_bytes(int32_t id) const {
  check_id(id);
  switch (types_[id]) {
    case TokenType::kControl:
    case TokenType::kUnknown:
      return tokens_[id];
    default:
      return piece_bytes(id);
  }
}

void TokenizerBase::append_token_text(std::string& out, int32_t id, bool& at_start, bool skip_special) const {
  check_id(id);
  if (skip_special && types_[id] == TokenType::kControl) return;
  if (at_start && strips_leading_space(id)) {
    const std::string bytes = token_bytes(id);
    out.append(bytes, bytes.empty() || bytes[0] != ' ' ? 0 : 1, std::string::npos);
  } else {
    out += token_bytes(id);
  }
  at_start = false;
}

std::string TokenizerBase::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string out;
  bool at_start = true;
  for (const int32_t id : ids) append_token_text(out, id, at_start, skip_special);
  return out;
}

bool TokenizerBase::is_end_of_generation(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < eog_.size() && eog_[id] != 0;
}

bool TokenizerBase::is_special(int32_t id) const {
  const TokenType t = token_type(id);
  return t == TokenType::kControl || t == TokenType::kUserDefined || t == TokenType::kUnknown;
}

TokenType TokenizerBase::token_type(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= types_.size()) return TokenType::kUndefined;
  return types_[id];
}

const std::string& TokenizerBase::token_text(int32_t id) const {
  check_id(id);
  return tokens_[id];
}

int32_t TokenizerBase::token_id(std::string_view text) const {
  const auto it = token_to_id_.find(text);
  return it == token_to_id_.end() ? -1 : it->second;
}

std::string TokenizerBase::apply_chat_template(std::span<const ChatMessage> messages, bool add_generation_prompt,
                                               const ChatOptions& options) const {
  return render_chat_template(chat_template_, messages, add_generation_prompt,
                              bos_id_ >= 0 ? tokens_[bos_id_] : std::string(),
                              eos_id_ >= 0 ? tokens_[eos_id_] : std::string(), options);
}

}  // namespace tok
}  // namespace fdpp
