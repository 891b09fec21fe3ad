// Byte-level BPE (tokenizer.ggml.model "gpt2"): GPT-2 / Llama 3 / Qwen2 / SmolLM2 vocabularies.
//
// Text -> pieces by the model's pre-tokenizer regexes -> each piece's bytes become the tokens of
// single bytes (GPT-2's byte-to-unicode alphabet spells them) -> merges applied lowest rank first,
// leftmost first among equal ranks, over a linked list of symbols with a binary heap of candidate
// pairs (HF tokenizers' Word::merge_all). A byte without a token of its own is dropped before
// merging, as HF's BPE does with no unk token (SmolLM2's vocabulary lacks 21 of the 256 bytes,
// e.g. 0x04 and 0xF5..0xFF). Results per piece are cached.
#include <mutex>
#include <queue>

#include "fdpp/error.h"
#include "tokenizer/internal.h"

namespace fdpp::tok {
namespace {

class BpeTokenizer final : public TokenizerBase {
 public:
  explicit BpeTokenizer(const VocabSpec& spec) : TokenizerBase(spec), pre_(spec.pre, spec.source) {
    add_bos_ = spec.add_bos.value_or(pre_.add_bos_default());
    const ByteLevelAlphabet& alphabet = byte_level_alphabet();
    const size_t n = tokens_.size();

    bytes_.resize(n);
    for (size_t i = 0; i < n; ++i) {
      const TokenType t = types_[i];
      if (t == TokenType::kControl || t == TokenType::kUserDefined || t == TokenType::kUnknown) {
        bytes_[i] = tokens_[i];  // spelled as raw text, not in the byte alphabet
        continue;
      }
      // A spelling outside the byte alphabet (not produced by any GPT-2-style converter) decodes
      // to itself.
      if (!alphabet.decode(tokens_[i], bytes_[i])) bytes_[i] = tokens_[i];
    }
    for (size_t i = 0; i < n; ++i) {
      const TokenType t = types_[i];
      if (t == TokenType::kNormal || t == TokenType::kUndefined) bytes_to_id_.emplace(bytes_[i], static_cast<int32_t>(i));
    }
    byte_id_.fill(-1);
    for (int b = 0; b < 256; ++b) byte_id_[b] = token_id(alphabet.byte_to_utf8[b]);

    check(!spec.merges.empty(), "{}: byte-level BPE vocabulary has no tokenizer.ggml.merges", source_);
    check(spec.merges.size() < static_cast<size_t>(INT32_MAX), "{}: too many merges", source_);
    merges_.reserve(spec.merges.size());
    std::string joined;
    for (size_t r = 0; r < spec.merges.size(); ++r) {
      const std::string& m = spec.merges[r];
      const size_t sp = m.find(' ', 1);
      check(sp != std::string::npos, "{}: tokenizer.ggml.merges[{}] = '{}' is not 'left right'", source_, r, m);
      const std::string_view left(m.data(), sp), right(m.data() + sp + 1, m.size() - sp - 1);
      joined.assign(left).append(right);
      const int32_t l = token_id(left), rt = token_id(right), merged = token_id(joined);
      check(l >= 0 && rt >= 0 && merged >= 0, "{}: tokenizer.ggml.merges[{}] = '{}' names a token not in the vocabulary",
            source_, r, m);
      // The first (best) rank of a repeated pair wins, as in llama.cpp.
      merges_.emplace(pair_key(l, rt), Merge{static_cast<int32_t>(r), merged});
    }
  }

 protected:
  void encode_text(std::string_view text, bool, std::vector<int32_t>& out) const override {
    for (const std::string_view piece : pre_.split(text)) encode_piece(piece, out);
  }

  std::string piece_bytes(int32_t id) const override { return bytes_[id]; }

 private:
  struct Merge {
    int32_t rank;
    int32_t id;
  };
  static uint64_t pair_key(int32_t l, int32_t r) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(l)) << 32) | static_cast<uint32_t>(r);
  }
  const Merge* find_merge(int32_t l, int32_t r) const {
    const auto it = merges_.find(pair_key(l, r));
    return it == merges_.end() ? nullptr : &it->second;
  }

  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
    if (pre_.ignore_merges()) {
      // Llama 3: a piece that is a token is that token, whatever the merges would make of it.
      const auto it = bytes_to_id_.find(std::string(piece));
      if (it != bytes_to_id_.end()) {
        out.push_back(it->second);
        return;
      }
    }
    const bool cacheable = piece.size() <= kMaxCachedPiece;
    if (cacheable) {
      std::lock_guard<std::mutex> lock(cache_mutex_);
      const auto it = cache_.find(std::string(piece));
      if (it != cache_.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        return;
      }
    }
    const size_t before = out.size();
    merge_bytes(piece, out);
    if (cacheable) {
      std::lock_guard<std::mutex> lock(cache_mutex_);
      if (cache_.size() >= kMaxCacheEntries) cache_.clear();
      cache_.emplace(std::string(piece), std::vector<int32_t>(out.begin() + before, out.end()));
    }
  }

  void merge_bytes(std::string_view piece, std::vector<int32_t>& out) const {
    struct Symbol {
      int32_t id, prev, next;
    };
    struct Candidate {
      int32_t rank, pos;
      bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    std::vector<Symbol> sym;
    sym.reserve(piece.size());
    for (const char c : piece) {
      const int32_t id = byte_id_[static_cast<uint8_t>(c)];
      if (id < 0) continue;  // no token for this byte: dropped (HF BPE without unk)
      const auto k = static_cast<int32_t>(sym.size());
      sym.push_back({id, k - 1, -1});
      if (k > 0) sym[k - 1].next = k;
    }
    if (sym.size() > 1) {
      std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
      auto push = [&](int32_t pos) {
        if (pos < 0 || sym[pos].next < 0) return;
        if (const Merge* m = find_merge(sym[pos].id, sym[sym[pos].next].id)) heap.push({m->rank, pos});
      };
      for (int32_t i = 0; i + 1 < static_cast<int32_t>(sym.size()); ++i) push(i);
      while (!heap.empty()) {
        const Candidate c = heap.top();
        heap.pop();
        Symbol& s = sym[c.pos];
        if (s.id < 0 || s.next < 0) continue;
        const Merge* m = find_merge(s.id, sym[s.next].id);
        if (m == nullptr || m->rank != c.rank) continue;  // stale: a neighbour has changed
        Symbol& right = sym[s.next];
        s.id = m->id;
        s.next = right.next;
        if (right.next >= 0) sym[right.next].prev = c.pos;
        right.id = -1;
        push(s.prev);
        push(c.pos);
      }
    }
    for (const Symbol& s : sym)
      if (s.id >= 0) out.push_back(s.id);
  }

  // Pieces are words (a few bytes); long ones are rare and not worth keeping.
  static constexpr size_t kMaxCachedPiece = 64;
  static constexpr size_t kMaxCacheEntries = 1 << 16;

  PreTokenizer pre_;
  std::vector<std::string> bytes_;  // per id: the raw bytes of a normal token
  std::unordered_map<std::string, int32_t> bytes_to_id_;
  std::array<int32_t, 256> byte_id_{};
  std::unordered_map<uint64_t, Merge> merges_;
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

}  // namespace

std::unique_ptr<Tokenizer> make_bpe_tokenizer(const VocabSpec& spec) { return std::make_unique<BpeTokenizer>(spec); }

}  // namespace fdpp::tok
