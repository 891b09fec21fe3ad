// A regular expression -> grammar rules. The subset (README "Structured output"): literals and
// escapes, classes [..] and [^..], ., \d \w \s and their negations, groups (capturing, (?:..),
// named), |, * + ? {n} {n,} {n,m} (lazy forms too: the language is the same), ^ and $ at the ends.
// Backreferences, lookaround, \b, flags and possessive quantifiers are refused by name.
//
// No Debian package turns a regex into an automaton one can walk byte by byte against a vocabulary
// (RE2 and PCRE2 match strings; they do not expose their DFA), so this small parser is ours.
#include <algorithm>

#include "fdpp/error.h"
#include "grammar/grammar.h"

namespace fdpp::grammar {

namespace {

constexpr int kMaxRepeat = 2048;

struct CharClass {
  ByteSet ascii;             // bytes 0..127
  bool non_ascii = false;    // every non-ASCII character
  std::vector<std::string> chars;  // particular non-ASCII characters (UTF-8)
};

std::string utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xc0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    s += static_cast<char>(0xe0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    s += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    s += static_cast<char>(0xf0 | (cp >> 18));
    s += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    s += static_cast<char>(0x80 | (cp & 0x3f));
  }
  return s;
}

class RegexCompiler {
 public:
  RegexCompiler(Grammar& g, std::string_view p, bool json, std::string where)
      : g_(g), p_(p), json_(json), where_(std::move(where)) {}

  int compile() {
    if (!p_.empty() && p_[0] == '^') ++i_;
    std::vector<Element> seq = alternation();
    if (i_ < p_.size()) {
      if (p_[i_] == '$' && i_ + 1 == p_.size()) {
        ++i_;
      } else {
        error(p_[i_] == ')' ? "an unmatched ')'" : fmt::format("'{}' here", p_[i_]));
      }
    }
    return g_.sequence(seq);
  }

 private:
  [[noreturn]] void error(const std::string& what) const {
    fail("the regular expression {} (at {}): {} at offset {} is not supported", json_show(), where_, what, i_);
  }
  std::string json_show() const {
    std::string s(p_.substr(0, 60));
    return "\"" + s + (p_.size() > 60 ? "...\"" : "\"");
  }
  bool more() const { return i_ < p_.size(); }
  char peek() const { return p_[i_]; }

  std::vector<Element> alternation() {
    std::vector<std::vector<Element>> alts{concat()};
    while (more() && peek() == '|') {
      ++i_;
      alts.push_back(concat());
    }
    if (alts.size() == 1) return std::move(alts[0]);
    return {Grammar::ref(g_.choice(alts))};
  }

  std::vector<Element> concat() {
    std::vector<Element> seq;
    while (more() && peek() != '|' && peek() != ')') {
      if (peek() == '$' && i_ + 1 == p_.size()) break;
      std::vector<Element> a = atom();
      a = quantified(std::move(a));
      seq.insert(seq.end(), a.begin(), a.end());
    }
    return seq;
  }

  int number() {
    size_t start = i_;
    int64_t v = 0;
    while (more() && peek() >= '0' && peek() <= '9') {
      v = v * 10 + (peek() - '0');
      if (v > kMaxRepeat) error(fmt::format("a repetition count above {}", kMaxRepeat));
      ++i_;
    }
    if (i_ == start) return -1;
    return static_cast<int>(v);
  }

  std::vector<Element> quantified(std::vector<Element> a) {
    for (;;) {
      if (!more()) return a;
      int min, max;
      const char c = peek();
      if (c == '*') {
        min = 0, max = -1;
        ++i_;
      } else if (c == '+') {
        min = 1, max = -1;
        ++i_;
      } else if (c == '?') {
        min = 0, max = 1;
        ++i_;
      } else if (c == '{') {
        const size_t save = i_;
        ++i_;
        min = number();
        if (min < 0) {  // a literal '{' (as PCRE reads "a{x")
          i_ = save;
          return a;
        }
        max = min;
        if (more() && peek() == ',') {
          ++i_;
          max = number();
        }
        if (!more() || peek() != '}') error("an unterminated {n,m}");
        ++i_;
        if (max >= 0 && max < min) error(fmt::format("{{{},{}}} (max below min)", min, max));
      } else {
        return a;
      }
      if (more() && peek() == '?') ++i_;  // lazy: same language
      else if (more() && peek() == '+') error("a possessive quantifier");
      a = {Grammar::ref(g_.repeat(a, min, max))};
    }
  }

  uint32_t hex_digits(int n) {
    uint32_t v = 0;
    for (int k = 0; k < n; ++k) {
      if (!more() || !std::isxdigit(static_cast<unsigned char>(peek()))) error("a bad hexadecimal escape");
      const char c = peek();
      v = v * 16 + static_cast<uint32_t>(c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10);
      ++i_;
    }
    return v;
  }

  // After a backslash: a class escape (\d ...) into cls, or a literal code point.
  bool escape(CharClass& cls, uint32_t& cp) {
    if (!more()) error("a trailing backslash");
    const char c = p_[i_++];
    auto range = [&](char a, char b) {
      for (int x = a; x <= b; ++x) cls.ascii.set(x);
    };
    CharClass pos;
    bool negate = false;
    switch (c) {
      case 'd': case 'D': negate = c == 'D'; cls = {}; range('0', '9'); break;
      case 'w': case 'W': negate = c == 'W'; cls = {}; range('a', 'z'); range('A', 'Z'); range('0', '9'); cls.ascii.set('_'); break;
      case 's': case 'S': negate = c == 'S'; cls = {}; for (char x : std::string_view(" \t\n\r\f\v")) cls.ascii.set(static_cast<uint8_t>(x)); break;
      case 'n': cp = '\n'; return false;
      case 't': cp = '\t'; return false;
      case 'r': cp = '\r'; return false;
      case 'f': cp = '\f'; return false;
      case 'v': cp = '\v'; return false;
      case 'x': cp = hex_digits(2); return false;
      case 'u': cp = hex_digits(4); return false;
      default:
        if (std::isalnum(static_cast<unsigned char>(c))) {
          --i_;
          error(fmt::format("the escape \\{}", c));
        }
        cp = static_cast<uint8_t>(c);
        return false;
    }
    if (negate) {
      for (int x = 0; x < 128; ++x) cls.ascii.flip(x);
      cls.non_ascii = true;
    }
    return true;
  }

  // One UTF-8 character of the pattern as a code point (bytes >= 0x80 kept whole).
  uint32_t next_char(std::string& bytes) {
    const uint8_t b = static_cast<uint8_t>(p_[i_]);
    const size_t n = b < 0x80 ? 1 : b >= 0xf0 ? 4 : b >= 0xe0 ? 3 : 2;
    if (i_ + n > p_.size()) error("a truncated UTF-8 character");
    bytes = std::string(p_.substr(i_, n));
    i_ += n;
    return b < 0x80 ? b : 0x80;  // only whether it is ASCII matters to the callers
  }

  std::vector<Element> atom() {
    const char c = peek();
    if (c == '(') {
      ++i_;
      if (more() && peek() == '?') {
        ++i_;
        if (more() && peek() == ':') {
          ++i_;
        } else if (more() && (peek() == 'P' || peek() == '<') && !(peek() == '<' && i_ + 1 < p_.size() && (p_[i_ + 1] == '=' || p_[i_ + 1] == '!'))) {
          if (peek() == 'P') ++i_;
          if (!more() || peek() != '<') error("a group of this kind");
          while (more() && peek() != '>') ++i_;
          if (!more()) error("an unterminated group name");
          ++i_;
        } else {
          error(more() && (peek() == '=' || peek() == '!' || peek() == '<') ? "lookaround" : "a group flag");
        }
      }
      std::vector<Element> inner = alternation();
      if (!more() || peek() != ')') error("an unterminated group");
      ++i_;
      if (inner.empty()) return {Grammar::ref(g_.choice({{}}))};
      return inner;
    }
    if (c == '[') return class_elements(bracket());
    if (c == '.') {
      ++i_;
      CharClass any;
      for (int x = 0; x < 128; ++x)
        if (x != '\n') any.ascii.set(x);
      any.non_ascii = true;
      return class_elements(any);
    }
    if (c == '^' || c == '$') error(fmt::format("the anchor '{}' inside the pattern", c));
    if (c == '*' || c == '+' || c == '?') error(fmt::format("'{}' with nothing to repeat", c));
    if (c == '\\') {
      ++i_;
      CharClass cls;
      uint32_t cp = 0;
      if (escape(cls, cp)) return class_elements(cls);
      return literal(utf8(cp));
    }
    std::string bytes;
    next_char(bytes);
    return literal(bytes);
  }

  CharClass bracket() {
    ++i_;  // '['
    bool negate = false;
    if (more() && peek() == '^') {
      negate = true;
      ++i_;
    }
    CharClass cls;
    bool first = true;
    while (more() && (peek() != ']' || first)) {
      first = false;
      uint32_t lo;
      std::string lo_bytes;
      if (peek() == '\\') {
        ++i_;
        CharClass sub;
        if (escape(sub, lo)) {
          cls.ascii |= sub.ascii;
          cls.non_ascii |= sub.non_ascii;
          continue;
        }
        lo_bytes = utf8(lo);
      } else if (peek() == '[' && i_ + 1 < p_.size() && p_[i_ + 1] == ':') {
        error("a POSIX class [:name:]");
      } else {
        next_char(lo_bytes);
        lo = lo_bytes.size() == 1 ? static_cast<uint8_t>(lo_bytes[0]) : 0x80;
      }
      if (more() && peek() == '-' && i_ + 1 < p_.size() && p_[i_ + 1] != ']') {
        ++i_;
        uint32_t hi;
        std::string hi_bytes;
        if (peek() == '\\') {
          ++i_;
          CharClass sub;
          if (escape(sub, hi)) error("a class escape as a range end");
          hi_bytes = utf8(hi);
        } else {
          next_char(hi_bytes);
          hi = hi_bytes.size() == 1 ? static_cast<uint8_t>(hi_bytes[0]) : 0x80;
        }
        if (lo_bytes.size() > 1 || hi_bytes.size() > 1 || lo >= 0x80 || hi >= 0x80) error("a range of non-ASCII characters");
        if (hi < lo) error("a reversed range");
        for (uint32_t x = lo; x <= hi; ++x) cls.ascii.set(x);
        continue;
      }
      if (lo_bytes.size() > 1 || lo >= 0x80)
        cls.chars.push_back(lo_bytes);
      else
        cls.ascii.set(lo);
    }
    if (!more()) error("an unterminated [class]");
    ++i_;  // ']'
    if (negate) {
      if (!cls.chars.empty()) error("a negated class listing non-ASCII characters");
      for (int x = 0; x < 128; ++x) cls.ascii.flip(x);
      cls.non_ascii = !cls.non_ascii;
    }
    return cls;
  }

  // Bytes as a JSON string body writes them: '"' and '\' escaped, control characters as escapes.
  std::vector<Element> literal(const std::string& bytes) {
    if (!json_) return g_.literal_elements(bytes);
    std::string out;
    for (char ch : bytes) {
      const uint8_t b = static_cast<uint8_t>(ch);
      if (ch == '"') out += "\\\"";
      else if (ch == '\\') out += "\\\\";
      else if (ch == '\n') out += "\\n";
      else if (ch == '\t') out += "\\t";
      else if (ch == '\r') out += "\\r";
      else if (b < 0x20) out += fmt::format("\\u{:04x}", b);
      else out += ch;
    }
    return g_.literal_elements(out);
  }

  int multibyte() {
    if (multibyte_ < 0) {
      ByteSet cont, l2, l3, l4;
      for (int b = 0x80; b < 0xc0; ++b) cont.set(b);
      for (int b = 0xc2; b < 0xe0; ++b) l2.set(b);
      for (int b = 0xe0; b < 0xf0; ++b) l3.set(b);
      for (int b = 0xf0; b < 0xf5; ++b) l4.set(b);
      const Element C = g_.bytes(cont);
      multibyte_ = g_.choice({{g_.bytes(l2), C}, {g_.bytes(l3), C, C}, {g_.bytes(l4), C, C, C}});
    }
    return multibyte_;
  }

  std::vector<Element> class_elements(const CharClass& cls) {
    std::vector<std::vector<Element>> alts;
    ByteSet plain = cls.ascii;
    if (json_) {
      for (int b = 0; b < 0x20; ++b) plain.reset(b);
      plain.reset('"');
      plain.reset('\\');
      for (char special : std::string_view("\"\\\n\t\r"))
        if (cls.ascii.test(static_cast<uint8_t>(special))) alts.push_back(literal(std::string(1, special)));
    }
    if (plain.any()) alts.insert(alts.begin(), {g_.bytes(plain)});
    if (cls.non_ascii) alts.push_back({Grammar::ref(multibyte())});
    for (const std::string& c : cls.chars) alts.push_back(g_.literal_elements(c));
    if (alts.empty()) error("a class that matches no character");
    if (alts.size() == 1 && alts[0].size() == 1) return alts[0];
    return {Grammar::ref(g_.choice(alts))};
  }

  Grammar& g_;
  std::string_view p_;
  bool json_;
  std::string where_;
  size_t i_ = 0;
  int multibyte_ = -1;
};

}  // namespace

int add_regex_rule(Grammar& g, std::string_view pattern, bool json_string_body, const std::string& where) {
  return RegexCompiler(g, pattern, json_string_body, where).compile();
}

std::shared_ptr<const Grammar> compile_regex(std::string_view pattern) {
  auto g = std::make_shared<Grammar>();
  g->set_root(add_regex_rule(*g, pattern, /*json_string_body=*/false, "guided_regex"));
  return g;
}

}  // namespace fdpp::grammar
