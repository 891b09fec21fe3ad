// SentencePiece-style BPE from a GGUF vocabulary (tokenizer.ggml.model "llama": Llama 1/2,
// Mistral, ...), following sentencepiece's bpe_model.cc for an "identity" normalizer:
//
//   text -> " " prefixed (add_space_prefix, at the start of each segment) -> spaces become U+2581
//   -> one symbol per UTF-8 character -> repeatedly merge the adjacent pair whose concatenation is
//   a piece (normal, user-defined or unused) with the highest score, leftmost first among equal
//   scores -> a symbol that is an unused piece is split back into the two it was merged from ->
//   a symbol that is no piece becomes its bytes' <0xNN> tokens (byte fallback) or, without byte
//   tokens, the unknown token (consecutive unknowns as one, as sentencepiece does).
//
// Invalid UTF-8 bytes in the input are one-byte symbols and so end up as byte tokens.
#include <functional>
#include <queue>

#include "fdpp/error.h"
#include "tokenizer/internal.h"

namespace fdpp::tok {
namespace {

constexpr std::string_view kSpace = "\xE2\x96\x81";  // U+2581 LOWER ONE EIGHTH BLOCK

class SpmTokenizer final : public TokenizerBase {
 public:
  explicit SpmTokenizer(const VocabSpec& spec) : TokenizerBase(spec) {
    add_bos_ = spec.add_bos.value_or(true);  // llama.cpp's default for SentencePiece vocabularies
    add_space_prefix_ = spec.add_space_prefix.value_or(true);
    const size_t n = tokens_.size();
    scores_.assign(n, 0.0f);
    if (!spec.scores.empty()) scores_ = spec.scores;
    byte_id_.fill(-1);
    for (size_t i = 0; i < n; ++i) {
      const TokenType t = types_[i];
      const auto id = static_cast<int32_t>(i);
      if (t == TokenType::kNormal || t == TokenType::kUserDefined || t == TokenType::kUnused ||
          t == TokenType::kUndefined) {
        pieces_[tokens_[i]] = id;
      } else if (t == TokenType::kByte) {
        const int b = parse_byte_token(tokens_[i]);
        check(b >= 0, "{}: byte token {} is spelled '{}', expected <0xNN>", source_, i, tokens_[i]);
        if (byte_id_[b] < 0) byte_id_[b] = id;
      }
    }
    if (unk_id_ < 0) {
      const int32_t unk = token_id("<unk>");
      if (unk >= 0) unk_id_ = unk;
    }
  }

 protected:
  void encode_text(std::string_view raw, bool segment_start, std::vector<int32_t>& out) const override {
    std::string text;
    text.reserve(raw.size() + raw.size() / 2 + 3);
    if (add_space_prefix_ && segment_start) text += kSpace;
    for (const char c : raw) {
      if (c == ' ') text += kSpace;
      else text += c;
    }
    if (text.empty()) return;

    struct Symbol {
      uint32_t start, len;
      int32_t prev, next;
    };
    std::vector<Symbol> sym;
    sym.reserve(text.size());
    for (size_t i = 0; i < text.size();) {
      size_t len = utf8_valid_len(std::string_view(text).substr(i));
      if (len == 0) len = 1;
      const auto k = static_cast<int32_t>(sym.size());
      sym.push_back({static_cast<uint32_t>(i), static_cast<uint32_t>(len), k - 1, -1});
      if (k > 0) sym[k - 1].next = k;
      i += len;
    }

    struct Candidate {
      float score;
      int32_t left, right;
      uint32_t len;
      bool operator<(const Candidate& o) const {  // max-heap: highest score, then leftmost
        return score != o.score ? score < o.score : left > o.left;
      }
    };
    std::priority_queue<Candidate> heap;
    // Unused pieces made by a merge: (start, len) -> length of the left part, to split them back.
    std::unordered_map<uint64_t, uint32_t> rev_merge;
    auto piece_at = [&](uint32_t start, uint32_t len) { return std::string_view(text).substr(start, len); };
    auto push = [&](int32_t l, int32_t r) {
      if (l < 0 || r < 0) return;
      const uint32_t len = sym[l].len + sym[r].len;
      const auto it = pieces_.find(piece_at(sym[l].start, len));
      if (it == pieces_.end()) return;
      heap.push({scores_[it->second], l, r, len});
      if (types_[it->second] == TokenType::kUnused)
        rev_merge[(static_cast<uint64_t>(sym[l].start) << 32) | len] = sym[l].len;
    };
    for (int32_t i = 0; i + 1 < static_cast<int32_t>(sym.size()); ++i) push(i, i + 1);
    while (!heap.empty()) {
      const Candidate c = heap.top();
      heap.pop();
      Symbol& l = sym[c.left];
      Symbol& r = sym[c.right];
      if (l.len == 0 || r.len == 0 || l.next != c.right || l.len + r.len != c.len) continue;  // stale
      l.len += r.len;
      r.len = 0;
      l.next = r.next;
      if (r.next >= 0) sym[r.next].prev = c.left;
      push(l.prev, c.left);
      push(c.left, l.next);
    }

    bool prev_unk = false;
    std::function<void(uint32_t, uint32_t)> emit = [&](uint32_t start, uint32_t len) {
      const auto it = pieces_.find(piece_at(start, len));
      if (it != pieces_.end()) {
        if (types_[it->second] == TokenType::kUnused) {
          const auto rv = rev_merge.find((static_cast<uint64_t>(start) << 32) | len);
          if (rv != rev_merge.end()) {
            emit(start, rv->second);
            emit(start + rv->second, len - rv->second);
            return;
          }
        }
        out.push_back(it->second);
        prev_unk = false;
        return;
      }
      // Not a piece: its bytes, or the unknown token.
      bool all_bytes = true;
      for (uint32_t i = 0; i < len; ++i) all_bytes = all_bytes && byte_id_[static_cast<uint8_t>(text[start + i])] >= 0;
      if (all_bytes) {
        for (uint32_t i = 0; i < len; ++i) out.push_back(byte_id_[static_cast<uint8_t>(text[start + i])]);
        prev_unk = false;
        return;
      }
      check(unk_id_ >= 0, "{}: text has a character the vocabulary cannot spell and there is no unknown token",
            source_);
      if (!prev_unk) out.push_back(unk_id_);
      prev_unk = true;
    };
    for (int32_t i = 0; i >= 0; i = sym[i].next) emit(sym[i].start, sym[i].len);
  }

  std::string piece_bytes(int32_t id) const override {
    const std::string& t = tokens_[id];
    if (types_[id] == TokenType::kByte) return std::string(1, static_cast<char>(parse_byte_token(t)));
    std::string out;
    out.reserve(t.size());
    for (size_t i = 0; i < t.size();) {
      if (t.compare(i, kSpace.size(), kSpace) == 0) {
        out += ' ';
        i += kSpace.size();
      } else {
        out += t[i++];
      }
    }
    return out;
  }

  bool strips_leading_space(int32_t id) const override {
    const TokenType t = types_[id];
    return add_space_prefix_ && t != TokenType::kByte && t != TokenType::kControl && t != TokenType::kUnknown &&
           std::string_view(tokens_[id]).starts_with(kSpace);
  }

 private:
  // "<0x0A>" -> 10; -1 for anything else.
  static int parse_byte_token(std::string_view t) {
    if (t.size() != 6 || !t.starts_with("<0x") || t[5] != '>') return -1;
    auto hex = [](char c) -> int {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'A' && c <= 'F') return c - 'A' + 10;
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      return -1;
    };
    const int hi = hex(t[3]), lo = hex(t[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
  }

  bool add_space_prefix_ = true;
  std::vector<float> scores_;
  std::unordered_map<std::string_view, int32_t> pieces_;  // mergeable pieces, views into tokens_
  std::array<int32_t, 256> byte_id_{};
};

}  // namespace

std::unique_ptr<Tokenizer> make_spm_tokenizer(const VocabSpec& spec) { return std::make_unique<SpmTokenizer>(spec); }

}  // namespace fdpp::tok
