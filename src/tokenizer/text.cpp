// UTF-8 helpers, GPT-2's byte-level alphabet and the PCRE2 pre-tokenizers.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "fdpp/error.h"
#include "tokenizer/internal.h"

namespace fdpp::tok {

// ---- UTF-8 ---------------------------------------------------------------------------------------

namespace {

// Allowed range of the second byte after a lead byte (Unicode Table 3-7); {1, 0} when the byte
// cannot lead a multi-byte sequence.
struct LeadInfo {
  uint8_t len, lo, hi;
};

LeadInfo lead_info(uint8_t b) {
  if (b >= 0xC2 && b <= 0xDF) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) return {3, 0x80, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};  // no surrogates
  if (b == 0xF0) return {4, 0x90, 0xBF};  // no overlongs
  if (b >= 0xF1 && b <= 0xF3) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};  // nothing above U+10FFFF
  return {1, 1, 0};
}

// Number of leading bytes of s that agree with some well-formed sequence (at most its length).
size_t utf8_agreeing_prefix(std::string_view s, size_t* need) {
  const auto b = static_cast<uint8_t>(s[0]);
  if (b < 0x80) {
    *need = 1;
    return 1;
  }
  const LeadInfo li = lead_info(b);
  *need = li.len;
  if (li.len == 1) return 0;  // cannot start a sequence
  size_t k = 1;
  while (k < li.len && k < s.size()) {
    const auto c = static_cast<uint8_t>(s[k]);
    const bool ok = k == 1 ? (c >= li.lo && c <= li.hi) : (c >= 0x80 && c <= 0xBF);
    if (!ok) break;
    ++k;
  }
  return k;
}

}  // namespace

size_t utf8_valid_len(std::string_view s) {
  if (s.empty()) return 0;
  size_t need = 0;
  const size_t k = utf8_agreeing_prefix(s, &need);
  return k == need ? need : 0;
}

bool utf8_incomplete_prefix(std::string_view s) {
  if (s.empty()) return false;
  size_t need = 0;
  const size_t k = utf8_agreeing_prefix(s, &need);
  return k == s.size() && k < need;
}

size_t utf8_maximal_subpart(std::string_view s) {
  size_t need = 0;
  const size_t k = utf8_agreeing_prefix(s, &need);
  return k == 0 ? 1 : k;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// ---- GPT-2 byte-level alphabet -------------------------------------------------------------------

ByteLevelAlphabet::ByteLevelAlphabet() {
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    const uint32_t cp = printable ? b : next++;
    append_utf8(byte_to_utf8[b], cp);
    cp_to_byte[cp] = static_cast<uint8_t>(b);
  }
}

bool ByteLevelAlphabet::decode(std::string_view token, std::string& out) const {
  size_t i = 0;
  while (i < token.size()) {
    const size_t n = utf8_valid_len(token.substr(i));
    if (n == 0) return false;
    uint32_t cp = 0;
    const auto* p = reinterpret_cast<const uint8_t*>(token.data() + i);
    if (n == 1) cp = p[0];
    else if (n == 2) cp = ((p[0] & 0x1Fu) << 6) | (p[1] & 0x3Fu);
    else if (n == 3) cp = ((p[0] & 0x0Fu) << 12) | ((p[1] & 0x3Fu) << 6) | (p[2] & 0x3Fu);
    else cp = ((p[0] & 0x07u) << 18) | ((p[1] & 0x3Fu) << 12) | ((p[2] & 0x3Fu) << 6) | (p[3] & 0x3Fu);
    const auto it = cp_to_byte.find(cp);
    if (it == cp_to_byte.end()) return false;
    out += static_cast<char>(it->second);
    i += n;
  }
  return true;
}

std::string ByteLevelAlphabet::encode(std::string_view bytes) const {
  std::string out;
  for (const char c : bytes) out += byte_to_utf8[static_cast<uint8_t>(c)];
  return out;
}

const ByteLevelAlphabet& byte_level_alphabet() {
  static const ByteLevelAlphabet alphabet;
  return alphabet;
}

// ---- Regex ---------------------------------------------------------------------------------------

Regex::Regex(const std::string& pattern) : pattern_(pattern) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error, &offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    fail("pre-tokenizer regex does not compile at offset {}: {} ({})", offset,
         reinterpret_cast<const char*>(message), pattern);
  }
  // JIT is several times faster than the interpreter; without it (a PCRE2 built without JIT)
  // matching still works, so a failure here is not an error.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  code_ = code;
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

void Regex::split(std::string_view text, std::vector<std::string_view>& out) const {
  if (text.empty()) return;
  auto* code = static_cast<pcre2_code*>(code_);
  // One match-data block per thread and pattern size is plenty: ovector pairs for the whole match.
  thread_local struct MatchData {
    pcre2_match_data* md = pcre2_match_data_create(4, nullptr);
    ~MatchData() { pcre2_match_data_free(md); }
  } data;
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0, last = 0;
  while (pos < text.size()) {
    const int rc = pcre2_match(code, subject, text.size(), pos, 0, data.md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof(message));
      fail("pre-tokenizer regex match failed: {} ({})", reinterpret_cast<const char*>(message), pattern_);
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(data.md);
    const size_t start = ov[0], end = ov[1];
    if (start > last) out.push_back(text.substr(last, start - last));
    if (end > start) {
      out.push_back(text.substr(start, end - start));
      pos = last = end;
    } else {
      // None of our patterns matches empty, but never loop on one: step over a character.
      const size_t n = utf8_valid_len(text.substr(start));
      pos = start + (n == 0 ? 1 : n);
    }
  }
  if (last < text.size()) out.push_back(text.substr(last));
}

// ---- Pre-tokenizers ------------------------------------------------------------------------------

namespace {

// GPT-2's pattern as HF's ByteLevel(use_regex=true) has it (with the final \s+ that GPT-2's
// original lacks, so that trailing whitespace is kept).
constexpr const char* kGpt2 =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// Llama 3's tokenizer.json pattern (also transformers' GGUF converter's for "llama-bpe").
constexpr const char* kLlama3 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Qwen2's: Llama 3's with single digits.
constexpr const char* kQwen2 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// HF's Digits(individual_digits=true): every numeric character alone (Rust's char::is_numeric is
// the N* general categories, which is \p{N}).
constexpr const char* kDigit = R"(\p{N})";

}  // namespace

PreTokenizer::PreTokenizer(const std::string& name, const std::string& source) {
  std::vector<const char*> patterns;
  // Names as llama.cpp's llama-vocab.cpp groups them (tokenizer.ggml.pre).
  if (name == "smollm" || name == "starcoder" || name == "refact" || name == "command-r" ||
      name == "codeshell" || name == "exaone" || name == "minerva") {
    // SmolLM2's tokenizer.json: Sequence[Digits(individual_digits), ByteLevel(use_regex)].
    patterns = {kDigit, kGpt2};
  } else if (name.empty() || name == "default" || name == "gpt2" || name == "gpt-2" || name == "mpt" ||
             name == "olmo" || name == "jais") {
    patterns = {kGpt2};
  } else if (name == "llama3" || name == "llama-v3" || name == "llama-bpe" || name == "falcon3" ||
             name == "dbrx" || name == "smaug-bpe") {
    patterns = {kLlama3};
    ignore_merges_ = true;  // Llama 3's tokenizer.json: "ignore_merges": true
    add_bos_default_ = true;
  } else if (name == "qwen2" || name == "deepseek-r1-qwen" || name == "stablelm2" || name == "megrez") {
    patterns = {kQwen2};
  } else {
    fail("{}: pre-tokenizer '{}' (tokenizer.ggml.pre) not supported; supported: smollm, gpt2, llama3, "
         "qwen2 and their aliases", source, name);
  }
  for (const char* p : patterns) steps_.push_back(std::make_unique<Regex>(p));
}

std::vector<std::string_view> PreTokenizer::split(std::string_view text) const {
  std::vector<std::string_view> pieces{text}, next;
  for (const auto& step : steps_) {
    next.clear();
    for (const auto piece : pieces) step->split(piece, next);
    pieces.swap(next);
  }
  return pieces;
}

}  // namespace fdpp::tok
