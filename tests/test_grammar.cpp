// The structured-output grammar engine (src/grammar): compilers, the matcher's masks against a
// toy vocabulary and the default model's real one, and a fuzz test over random schemas: every
// value a schema accepts can be produced token by token through the masks, and every token
// stream the masks allow ends (when it ends) in JSON that an independent validator accepts.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <random>
#include <regex>

#include "fdpp/error.h"
#include "grammar/grammar.h"
#include "io/gguf.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace fdpp::grammar {
namespace {

using ojson = nlohmann::ordered_json;

// Every printable ASCII byte, a few control and UTF-8 bytes, and multi-byte tokens such as a BPE
// vocabulary has (structure, keywords, digits, words, an "é" whole and in halves). Last: the EOS.
std::shared_ptr<const TokenVocabulary> toy_vocab() {
  std::vector<std::string> t;
  for (int b = 0x20; b < 0x7f; ++b) t.push_back(std::string(1, static_cast<char>(b)));
  for (const char* s : {"\n", "\t", "\xc3", "\xa9", "\xc3\xa9", "\xe2\x82\xac", "{\"", "\":", "\": ", ", \"", "\",",
                        "\"}", "]}", "}]", " [", "  ", "\n  ", "true", "false", "null", "12", "0.", "e+", "\\n",
                        "\\u00", "\\\"", "ab", "abc", "name", "\"name\"", "-1", "2024", "-0", "cat", "dog", "s\"",
                        ",\n", "[]", "{}", "\"\"", "\"a", "1,", "x\"", "T1"})
    t.push_back(s);
  t.push_back("");  // the EOS
  const int32_t eos = static_cast<int32_t>(t.size()) - 1;
  return std::make_shared<TokenVocabulary>(std::move(t), std::vector<int32_t>{eos});
}

// Feeds text, choosing at each position a random token of the vocabulary that is a prefix of the
// rest; every chosen token must be in the mask. Returns false with a message when one is not.
::testing::AssertionResult produce(GrammarMatcher& m, const TokenVocabulary& v, const std::string& text,
                                   std::mt19937& rng) {
  size_t at = 0;
  while (at < text.size()) {
    std::vector<int32_t> fits;
    for (int32_t id = 0; id < v.size(); ++id) {
      const std::string& b = v.bytes(id);
      if (!b.empty() && text.compare(at, b.size(), b) == 0) fits.push_back(id);
    }
    if (fits.empty()) return ::testing::AssertionFailure() << "the toy vocabulary cannot spell byte " << at << " of " << text;
    const int32_t id = fits[std::uniform_int_distribution<size_t>(0, fits.size() - 1)(rng)];
    if (!m.is_allowed(id))
      return ::testing::AssertionFailure() << "token '" << v.bytes(id) << "' at byte " << at << " of " << text
                                           << " is not in the mask";
    if (!m.accept_token(id)) return ::testing::AssertionFailure() << "token in the mask refused at byte " << at;
    at += v.bytes(id).size();
  }
  if (!m.is_allowed(v.end_ids()[0])) return ::testing::AssertionFailure() << "EOS not allowed after " << text;
  return ::testing::AssertionSuccess();
}

bool matches(const std::shared_ptr<const Grammar>& g, const std::string& text) {
  GrammarMatcher m(g, toy_vocab());
  return m.accept_bytes(text) && m.accepting();
}

TEST(Grammar, ChoiceAndRegex) {
  const std::vector<std::string> choices{"yes", "no", "maybe"};
  const auto c = compile_choice(choices);
  EXPECT_TRUE(matches(c, "yes"));
  EXPECT_TRUE(matches(c, "maybe"));
  EXPECT_FALSE(matches(c, "ye"));
  EXPECT_FALSE(matches(c, "yess"));

  const auto r = compile_regex(R"(^[A-Z][a-z]{1,3}-\d+(\.\d{2})?$)");
  EXPECT_TRUE(matches(r, "Ab-12"));
  EXPECT_TRUE(matches(r, "Abcd-7.25"));
  EXPECT_FALSE(matches(r, "Abcde-7"));
  EXPECT_FALSE(matches(r, "ab-1"));
  EXPECT_FALSE(matches(r, "Ab-1.2"));
  EXPECT_TRUE(matches(compile_regex("(cat|dog)s?|[^a-z]"), "dogs"));
  EXPECT_TRUE(matches(compile_regex("(cat|dog)s?|[^a-z]"), "\xc3\xa9"));  // a negated class takes non-ASCII
  EXPECT_FALSE(matches(compile_regex("(cat|dog)s?|[^a-z]"), "q"));
}

TEST(Grammar, RegexRefusesWhatItCannotCompile) {
  for (const char* p : {"(a)\\1", "(?=a)b", "a\\b", "a++", "(?i)a", "a^b", "[z-a]", "(a", "x{3,2}"}) {
    try {
      compile_regex(p);
      ADD_FAILURE() << p << " compiled";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("not supported"), std::string::npos) << e.what();
    }
  }
}

TEST(Grammar, ExpansionIsBounded) {
  try {
    std::string schema = R"({"type": "object", "properties": {)";
    for (int i = 0; i < 1500; ++i) schema += fmt::format(R"({}"p{}": {{"type": "string", "maxLength": 2000}})", i ? "," : "", i);
    compile_json_schema(schema + "}}");
    ADD_FAILURE() << "compiled";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("too large"), std::string::npos) << e.what();
  }
}

TEST(Grammar, JsonSchemaRefusesUnsupportedKeywordsByName) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"type":"integer","minimum":0})", "\"minimum\""},
      {R"({"type":"object","properties":{"a":{"type":"string","format":"uri"}}})", "\"uri\""},
      {R"({"type":"object","patternProperties":{"a":{}}})", "\"patternProperties\""},
      {R"({"not":{"type":"string"}})", "\"not\""},
      {R"({"type":"array","items":[{"type":"string"}]})", "\"items\""},
      {R"({"$ref":"#/$defs/missing"})", "points at nothing"},
      {R"j({"type":"string","pattern":"(?=x)"})j", "lookaround"},
  };
  for (const auto& [schema, name] : cases) {
    try {
      compile_json_schema(schema);
      ADD_FAILURE() << schema << " compiled";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
  }
}

TEST(Grammar, JsonSchemaObject) {
  const auto g = compile_json_schema(R"({
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}},
    "required": ["name"], "additionalProperties": false})");
  EXPECT_TRUE(matches(g, R"({"name": "x", "age": 3})"));
  EXPECT_TRUE(matches(g, R"({"name":"x"})"));
  EXPECT_TRUE(matches(g, "{\n  \"name\": \"\\u00e9\",\n  \"tags\": [\"a\", \"b\"]\n}"));
  EXPECT_FALSE(matches(g, R"({"age": 3})"));                      // name is required
  EXPECT_FALSE(matches(g, R"({"name": "x", "other": 1})"));        // no additional properties
  EXPECT_FALSE(matches(g, R"({"name": "x", "tags": ["a","b","a"]})"));  // maxItems
  EXPECT_FALSE(matches(g, R"({"name": "x", "age": 3.5})"));
  EXPECT_FALSE(matches(g, R"({"name": "x"} )"));                  // nothing after the value
}

TEST(Grammar, JsonSchemaRecursiveRef) {
  const auto g = compile_json_schema(R"({"$defs": {"node": {"type": "object", "properties": {
      "v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
      "required": ["v", "kids"], "additionalProperties": false}}, "$ref": "#/$defs/node"})");
  EXPECT_TRUE(matches(g, R"({"v":1,"kids":[{"v":2,"kids":[]},{"v":3,"kids":[{"v":4,"kids":[]}]}]})"));
  EXPECT_FALSE(matches(g, R"({"v":1,"kids":[{"v":2}]})"));
}

TEST(Grammar, LeftRecursionIsRefusedAtCompileTime) {
  try {
    compile_json_schema(R"({"anyOf": [{"$ref": "#"}, {"type": "null"}]})");
    ADD_FAILURE() << "compiled";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("refers to itself"), std::string::npos) << e.what();
  }
}

TEST(Grammar, MaskEndsOnlyWhereTheGrammarMayEnd) {
  const auto v = toy_vocab();
  const int32_t eos = v->end_ids()[0];
  GrammarMatcher m(compile_json_object(), v);
  EXPECT_FALSE(m.is_allowed(eos));
  EXPECT_FALSE(m.is_allowed(1));  // '!' cannot start an object
  ASSERT_TRUE(m.accept_bytes("{\"a\": [1, 2"));
  EXPECT_FALSE(m.is_allowed(eos));
  ASSERT_TRUE(m.accept_bytes("]}"));
  EXPECT_TRUE(m.accepting());
  EXPECT_FALSE(m.can_continue());
  const auto& mask = m.allowed_tokens();
  int allowed = 0;
  for (int32_t id = 0; id < v->size(); ++id) allowed += (mask[id >> 5] >> (id & 31)) & 1;
  EXPECT_EQ(allowed, 1);  // only the EOS
  EXPECT_TRUE(m.accept_token(eos));
  EXPECT_TRUE(m.finished());
}

TEST(Grammar, DeadEndWhenTheVocabularyCannotSpellIt) {
  // The toy vocabulary has no byte 0x01 token: a grammar that needs one has nowhere to go.
  auto g = std::make_shared<Grammar>();
  g->set_root(g->literal("a\x01"));
  GrammarMatcher m(g, toy_vocab());
  EXPECT_FALSE(m.dead_end());
  ASSERT_TRUE(m.accept_bytes("a"));
  EXPECT_TRUE(m.dead_end());
}

// ---- fuzz ----------------------------------------------------------------------------------------

struct Fuzz {
  std::mt19937 rng;
  ojson defs = ojson::object();
  explicit Fuzz(uint32_t seed) : rng(seed) {}
  int pick(int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng); }
  bool coin(double p = 0.5) { return std::uniform_real_distribution<double>(0, 1)(rng) < p; }

  // Patterns with a generator of their sentences (the validator checks them with std::regex).
  struct Pattern {
    const char* regex;
    std::string (*make)(Fuzz&);
  };
  static const std::vector<Pattern>& patterns() {
    static const std::vector<Pattern> p = {
        {"^[a-z]{2,4}-[0-9]+$", [](Fuzz& f) {
           std::string s;
           for (int i = 0, n = 2 + f.pick(3); i < n; ++i) s += static_cast<char>('a' + f.pick(26));
           s += "-";
           for (int i = 0, n = 1 + f.pick(4); i < n; ++i) s += static_cast<char>('0' + f.pick(10));
           return s;
         }},
        {"^(cat|dog)s?$", [](Fuzz& f) { return std::string(f.coin() ? "cat" : "dog") + (f.coin() ? "s" : ""); }},
        {"^[^\"]{0,3}q$", [](Fuzz& f) {
           std::string s;
           static const char* pieces[] = {"a", "b", "\\", " ", "\xc3\xa9"};
           for (int i = 0, n = f.pick(4); i < n; ++i) s += pieces[f.pick(5)];
           return s + "q";
         }},
    };
    return p;
  }

  ojson scalar_value() {
    switch (pick(5)) {
      case 0: return pick(100) - 50;
      case 1: return std::string(1, static_cast<char>('a' + pick(3)));
      case 2: return coin();
      case 3: return nullptr;
      default: return 0.5 * (pick(9) - 4);
    }
  }

  ojson schema(int depth) {
    const int kinds = depth >= 3 ? 6 : 11;
    switch (pick(kinds)) {
      case 0: return {{"type", "integer"}};
      case 1: return {{"type", "number"}};
      case 2: return {{"type", "boolean"}};
      case 3: return {{"type", "null"}};
      case 4: {
        ojson s = {{"type", "string"}};
        if (coin(0.3)) {
          s["minLength"] = pick(3);
          s["maxLength"] = s["minLength"].get<int>() + pick(4);
        } else if (coin(0.3)) {
          s["pattern"] = patterns()[pick(static_cast<int>(patterns().size()))].regex;
        } else if (coin(0.2)) {
          s["format"] = coin() ? "date" : "uuid";
        }
        return s;
      }
      case 5: {
        ojson e = ojson::array();
        for (int i = 0, n = 1 + pick(3); i < n; ++i) e.push_back(scalar_value());
        return coin(0.3) ? ojson{{"const", e[0]}} : ojson{{"enum", e}};
      }
      case 6: {
        ojson s = {{"type", "array"}, {"items", schema(depth + 1)}};
        if (coin(0.4)) s["minItems"] = pick(2);
        if (coin(0.4)) s["maxItems"] = s.value("minItems", 0) + pick(3);
        return s;
      }
      case 7: case 8: {
        ojson props = ojson::object();
        ojson req = ojson::array();
        for (int i = 0, n = pick(4); i < n; ++i) {
          const std::string name = std::string("p") + std::to_string(i) + (coin(0.2) ? "\"q" : "");
          props[name] = schema(depth + 1);
          if (coin(0.6)) req.push_back(name);
        }
        ojson s = {{"type", "object"}, {"properties", props}, {"required", req}};
        const int ap = pick(3);
        if (ap == 0) s["additionalProperties"] = false;
        if (ap == 1) s["additionalProperties"] = schema(depth + 2);
        return s;
      }
      case 9: {
        ojson a = ojson::array();
        for (int i = 0, n = 2 + pick(2); i < n; ++i) a.push_back(schema(depth + 1));
        return {{coin() ? "anyOf" : "oneOf", a}};
      }
      default: {
        const std::string name = "d" + std::to_string(defs.size());
        defs[name] = true;  // reserve the name: the schema below may add definitions
        defs[name] = schema(depth + 1);
        return {{"$ref", "#/$defs/" + name}};
      }
    }
  }

  const ojson& resolve(const ojson& s) {
    if (s.contains("$ref")) return resolve(defs[s["$ref"].get<std::string>().substr(8)]);
    return s;
  }

  std::string random_string(int min, int max) {
    static const std::vector<std::string> pieces = {"a", "b", " ", "\"", "\\", "\n", "\xc3\xa9", "\xe2\x82\xac", "/"};
    std::string s;
    const int n = min + pick(max - min + 1);
    for (int i = 0; i < n; ++i) s += pieces[pick(static_cast<int>(pieces.size()))];
    return s;
  }

  // A value the schema accepts (in the grammar's terms: named properties in schema order).
  ojson instance(const ojson& s0, int depth = 0) {
    const ojson& s = resolve(s0);
    if (s.contains("anyOf") || s.contains("oneOf")) {
      const ojson& a = s.contains("anyOf") ? s["anyOf"] : s["oneOf"];
      return instance(a[pick(static_cast<int>(a.size()))], depth);
    }
    if (s.contains("const")) return s["const"];
    if (s.contains("enum")) return s["enum"][pick(static_cast<int>(s["enum"].size()))];
    const std::string t = s.value("type", "");
    if (t == "integer") return static_cast<int64_t>(pick(2001)) - 1000;
    if (t == "number") return coin() ? ojson(pick(100) - 50) : ojson(std::ldexp(pick(1 << 20) - (1 << 19), pick(80) - 40));
    if (t == "boolean") return coin();
    if (t == "null") return nullptr;
    if (t == "string") {
      if (s.contains("pattern")) {
        for (const auto& p : patterns())
          if (s["pattern"] == p.regex) return p.make(*this);
      }
      if (s.value("format", "") == "date")
        return fmt::format("{:04}-{:02}-{:02}", pick(10000), 1 + pick(12), 1 + pick(31));
      if (s.value("format", "") == "uuid") {
        std::string u;
        for (int n : {8, 4, 4, 4, 12}) {
          if (!u.empty()) u += "-";
          for (int i = 0; i < n; ++i) u += "0123456789abcdefABCDEF"[pick(22)];
        }
        return u;
      }
      const int min = s.value("minLength", 0), max = s.value("maxLength", min + 6);
      // Length in characters: each piece is one character.
      return random_string(min, max);
    }
    if (t == "array") {
      const int min = s.value("minItems", 0), max = std::min(s.value("maxItems", min + 3), min + 3);
      ojson a = ojson::array();
      for (int i = 0, n = min + pick(max - min + 1); i < n; ++i) a.push_back(instance(s["items"], depth + 1));
      return a;
    }
    ojson o = ojson::object();
    std::set<std::string> req;
    for (const auto& r : s["required"]) req.insert(r.get<std::string>());
    for (const auto& [k, v] : s["properties"].items())
      if (req.count(k) || coin()) o[k] = instance(v, depth + 1);
    if (s.contains("additionalProperties") && !s["additionalProperties"].is_boolean() && coin(0.5))
      o["extra"] = instance(s["additionalProperties"], depth + 1);
    return o;
  }

  std::string ws() {
    static const char* kinds[] = {"", "", "", " ", "\n  ", "\t"};
    return kinds[pick(6)];
  }
  // Serialized with random whitespace where JSON allows it and the grammar's bound keeps it.
  std::string write(const ojson& v) {
    if (v.is_object()) {
      std::string out = "{" + ws();
      bool first = true;
      for (const auto& [k, x] : v.items()) {
        if (!first) out += "," + ws();
        first = false;
        out += ojson(k).dump() + ws() + ":" + ws() + write(x) + ws();
      }
      return out + "}";
    }
    if (v.is_array()) {
      std::string out = "[" + ws();
      for (size_t i = 0; i < v.size(); ++i) out += (i ? "," + ws() : "") + write(v[i]) + ws();
      return out + "]";
    }
    return v.dump();
  }
};

// The schema's meaning, checked directly on a parsed value (independent of the grammar).
bool valid(Fuzz& f, const ojson& s0, const ojson& v, std::string& why) {
  const ojson& s = f.resolve(s0);
  auto no = [&](const std::string& w) {
    why = w + " at " + v.dump();
    return false;
  };
  if (s.contains("anyOf") || s.contains("oneOf")) {
    for (const auto& a : s.contains("anyOf") ? s["anyOf"] : s["oneOf"])
      if (std::string w; valid(f, a, v, w)) return true;
    return no("no alternative");
  }
  if (s.contains("const")) return v == s["const"] ? true : no("const");
  if (s.contains("enum")) {
    for (const auto& e : s["enum"])
      if (e == v) return true;
    return no("enum");
  }
  const std::string t = s.value("type", "");
  if (t == "integer") return v.is_number_integer() ? true : no("integer");
  if (t == "number") return v.is_number() ? true : no("number");
  if (t == "boolean") return v.is_boolean() ? true : no("boolean");
  if (t == "null") return v.is_null() ? true : no("null");
  if (t == "string") {
    if (!v.is_string()) return no("string");
    const std::string str = v.get<std::string>();
    size_t chars = 0;
    for (unsigned char c : str) chars += (c & 0xc0) != 0x80;
    if (s.contains("minLength") && chars < s["minLength"].get<size_t>()) return no("minLength");
    if (s.contains("maxLength") && chars > s["maxLength"].get<size_t>()) return no("maxLength");
    std::string pattern = s.value("pattern", "");
    if (s.value("format", "") == "date") pattern = "^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])$";
    if (s.value("format", "") == "uuid") pattern = "^[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}$";
    if (!pattern.empty()) {
      // std::regex works on bytes: "é" counts as two of [^"] (the grammar's UTF-8 is a character),
      // so this check is of the ASCII patterns' meaning only where the string is ASCII.
      const bool ascii = std::all_of(str.begin(), str.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; });
      if (ascii && !std::regex_search(str, std::regex(pattern))) return no("pattern " + pattern);
    }
    return true;
  }
  if (t == "array") {
    if (!v.is_array()) return no("array");
    if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) return no("minItems");
    if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) return no("maxItems");
    for (const auto& x : v)
      if (!valid(f, s["items"], x, why)) return false;
    return true;
  }
  if (!v.is_object()) return no("object");
  for (const auto& r : s["required"])
    if (!v.contains(r.get<std::string>())) return no("required " + r.dump());
  for (const auto& [k, x] : v.items()) {
    if (s["properties"].contains(k)) {
      if (!valid(f, s["properties"][k], x, why)) return false;
    } else if (s.contains("additionalProperties") && s["additionalProperties"].is_boolean()) {
      return no("additional property " + k);
    } else if (s.contains("additionalProperties")) {
      if (!valid(f, s["additionalProperties"], x, why)) return false;
    } else {
      return no("additional property " + k + " (absent additionalProperties with properties)");
    }
  }
  return true;
}

TEST(GrammarFuzz, RandomSchemasInstancesAndTokenStreams) {
  const auto vocab = toy_vocab();
  const int32_t eos = vocab->end_ids()[0];
  int finished_walks = 0;
  for (uint32_t seed = 1; seed <= 150; ++seed) {
    Fuzz f(seed);
    ojson s = f.schema(0);
    ojson full = s;
    if (!f.defs.empty()) full["$defs"] = f.defs;
    SCOPED_TRACE("seed " + std::to_string(seed) + " schema " + full.dump());
    std::shared_ptr<const Grammar> g;
    ASSERT_NO_THROW(g = compile_json_schema(full.dump()));
    // Every valid value can be produced token by token.
    for (int k = 0; k < 4; ++k) {
      const std::string text = f.ws() + f.write(f.instance(s));
      std::string why;
      ASSERT_TRUE(valid(f, s, ojson::parse(text), why)) << "the generator made an invalid value: " << why;
      GrammarMatcher m(g, vocab);
      ASSERT_TRUE(produce(m, *vocab, text, f.rng));
    }
    // Random token streams through the masks: a finished one is valid JSON for the schema; the mask
    // never offers a token that the matcher then refuses, nor an empty set.
    for (int k = 0; k < 6; ++k) {
      GrammarMatcher m(g, vocab);
      std::string text;
      for (int step = 0; step < 400; ++step) {
        const auto& mask = m.allowed_tokens();
        std::vector<int32_t> allowed, structural;
        for (int32_t id = 0; id < vocab->size(); ++id) {
          if (!((mask[id >> 5] >> (id & 31)) & 1)) continue;
          allowed.push_back(id);
          const std::string& b = vocab->bytes(id);
          if (!b.empty() && std::string_view("\"}],:-0123456789tfnTcd").find(b[0]) != std::string_view::npos)
            structural.push_back(id);
        }
        ASSERT_FALSE(allowed.empty()) << "an empty mask after " << text;
        int32_t id;
        if (m.is_allowed(eos) && f.coin(0.5)) id = eos;
        else if (!structural.empty() && f.coin(0.7)) id = structural[f.pick(static_cast<int>(structural.size()))];
        else id = allowed[f.pick(static_cast<int>(allowed.size()))];
        ASSERT_TRUE(m.accept_token(id)) << "token '" << vocab->bytes(id) << "' was in the mask after " << text;
        if (id == eos) break;
        text += vocab->bytes(id);
      }
      if (!m.finished()) continue;
      ++finished_walks;
      ojson v;
      try {
        v = ojson::parse(text);
      } catch (const nlohmann::json::out_of_range&) {
        continue;  // valid JSON whose number overflows a double ("0.04E8122"): nothing to validate
      } catch (const nlohmann::json::parse_error& e) {
        ADD_FAILURE() << "not JSON: " << text << ": " << e.what();
        continue;
      }
      std::string why;
      EXPECT_TRUE(valid(f, s, v, why)) << text << ": " << why;
    }
  }
  // The streams must mostly end, or the second half tests little.
  EXPECT_GT(finished_walks, 450);
}

TEST(GrammarFuzz, RandomRegexStreamsMatchStdRegex) {
  const auto vocab = toy_vocab();
  const int32_t eos = vocab->end_ids()[0];
  const std::vector<std::string> patterns = {"[a-c]+(,[a-c]+)*", "(true|false|null)", "-?[0-9]{1,3}(\\.[0-9]+)?",
                                             "(ab|a)(bc|c)?", "x?y*z{2}", "[^a-z]{2}\\d"};
  std::mt19937 rng(7);
  for (const std::string& p : patterns) {
    SCOPED_TRACE(p);
    const auto g = compile_regex(p);
    const std::regex re(p);
    int done = 0;
    for (int k = 0; k < 40; ++k) {
      GrammarMatcher m(g, vocab);
      std::string text;
      for (int step = 0; step < 60 && !m.finished(); ++step) {
        std::vector<int32_t> allowed;
        const auto& mask = m.allowed_tokens();
        for (int32_t id = 0; id < vocab->size(); ++id)
          if ((mask[id >> 5] >> (id & 31)) & 1) allowed.push_back(id);
        ASSERT_FALSE(allowed.empty());
        const int32_t id = m.is_allowed(eos) && rng() % 3 == 0 ? eos : allowed[rng() % allowed.size()];
        ASSERT_TRUE(m.accept_token(id));
        if (id != eos) text += vocab->bytes(id);
      }
      if (!m.finished()) continue;
      ++done;
      const bool ascii = std::all_of(text.begin(), text.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; });
      if (ascii) EXPECT_TRUE(std::regex_match(text, re)) << text;
    }
    EXPECT_GT(done, 20);
  }
}

// Matchers of one schema share an automaton (GrammarAutomata): two requests that each compiled the
// schema get the same one, their masks equal those of matchers with automata of their own, and a
// matcher keeps its place when another one's walk makes the shared memo start over.
TEST(Grammar, MatchersOfOneSchemaShareTheirAutomaton) {
  const auto vocab = toy_vocab();
  GrammarAutomata automata(vocab, 2);
  // A note of 690 random letters, spelled out by the pattern: nearly every position has a mask of
  // its own (positions of a plain maxLength would share theirs), more than the memo keeps.
  std::mt19937 letter_rng(3);
  std::string note;
  for (int i = 0; i < 690; ++i) note += static_cast<char>('a' + letter_rng() % 26);
  const std::string schema = R"({"type":"object","properties":{"note":{"type":"string","pattern":")" + note +
                             R"("}},"required":["note"],"additionalProperties":false})";
  const auto first = automata.get(compile_json_schema(schema));
  EXPECT_EQ(automata.get(compile_json_schema(schema)), first);
  EXPECT_NE(automata.get(compile_json_object()), first);
  // Grammars that differ in one byte set (same rules otherwise) get automata of their own.
  const auto letters = compile_regex("[a-z]+"), fewer = compile_regex("[a-y]+");
  EXPECT_FALSE(letters->same_as(*fewer));
  EXPECT_NE(letters->fingerprint(), fewer->fingerprint());
  EXPECT_TRUE(letters->same_as(*compile_regex("[a-z]+")));
  EXPECT_EQ(letters->fingerprint(), compile_regex("[a-z]+")->fingerprint());
  // Two more grammars push the schema's automaton out of a cache that keeps 2.
  (void)automata.get(compile_json_value());
  (void)automata.get(compile_regex("[a-z]+"));
  const auto again = automata.get(compile_json_schema(schema));
  EXPECT_NE(again, first);

  const std::string text = "{\"note\": \"" + note + "\"}";
  GrammarMatcher waiting(again), walker(again), alone(compile_json_schema(schema), vocab);
  ASSERT_TRUE(waiting.accept_bytes("{\"note\": \"" + note.substr(0, 2)));
  ASSERT_TRUE(alone.accept_bytes("{\"note\": \"" + note.substr(0, 2)));
  // The walker asks for a mask at every character: more masks than the memo keeps, so it starts over.
  std::mt19937 rng(7);
  EXPECT_TRUE(produce(walker, *vocab, text, rng));
  EXPECT_GT(again->generation(), 0u) << "the shared memo never started over";
  // The waiting matcher's masks still equal those of the matcher with an automaton of its own.
  for (const std::string& more : {note.substr(2, 1), note.substr(3) + "\"", std::string("}")}) {
    EXPECT_EQ(waiting.allowed_tokens(), alone.allowed_tokens()) << more;
    ASSERT_TRUE(waiting.accept_bytes(more));
    ASSERT_TRUE(alone.accept_bytes(more));
  }
  EXPECT_TRUE(waiting.accepting());
  EXPECT_TRUE(waiting.is_allowed(vocab->end_ids()[0]));
}


// The positions of a long counted repetition are states of their own, but their masks are one:
// walking a string of minLength (or maxLength) 1,500 computes a few masks, not one per position,
// and every shared mask holds exactly the tokens the grammar allows there, checked token by token.
TEST(Grammar, StatesThatDifferBeyondTheLongestTokenShareAMask) {
  const auto vocab = toy_vocab();
  for (const char* bound : {"minLength", "maxLength"}) {
    SCOPED_TRACE(bound);
    const auto automaton = std::make_shared<GrammarAutomaton>(
        compile_json_schema(fmt::format(R"({{"type":"object","properties":{{"text":{{"type":"string","{}":1500}}}},
            "required":["text"],"additionalProperties":false}})", bound)),
        vocab);
    GrammarMatcher walker(automaton);
    const std::string text = "{\"text\": \"" + std::string(1490, 'a') + "\\u00e9" + std::string(9, 'b') + "\"}";
    size_t at = 0;
    while (at < text.size()) {
      const std::vector<uint32_t> mask = walker.allowed_tokens();
      for (int32_t id = 0; id < vocab->size(); ++id) {
        const std::string& b = vocab->bytes(id);
        const bool allowed = (mask[id >> 5] >> (id & 31)) & 1u;
        const bool expected = vocab->is_end(id) ? walker.accepting() : !b.empty() && walker.can_accept_bytes(b);
        ASSERT_EQ(allowed, expected) << "token '" << b << "' at byte " << at;
      }
      // The longest piece of the text that is one token.
      int32_t pick = -1;
      for (int32_t id = 0; id < vocab->size(); ++id) {
        const std::string& b = vocab->bytes(id);
        if (!b.empty() && text.compare(at, b.size(), b) == 0 && (pick < 0 || b.size() > vocab->bytes(pick).size()))
          pick = id;
      }
      ASSERT_GE(pick, 0);
      ASSERT_TRUE(walker.accept_token(pick)) << at;
      at += vocab->bytes(pick).size();
    }
    EXPECT_TRUE(walker.accepting());
    // One walk of the vocabulary per distinct mask: the structure around the string and the
    // positions where its bound comes within a token's reach (before: one per position).
    EXPECT_LT(automaton->masks_computed(), 40u);
    // The bound itself still holds.
    GrammarMatcher edge(automaton);
    ASSERT_TRUE(edge.accept_bytes("{\"text\": \"" + std::string(1499, 'a')));
    EXPECT_EQ(edge.can_accept_bytes("\""), std::string_view(bound) == "maxLength");
    EXPECT_TRUE(edge.can_accept_bytes("a\""));
    EXPECT_EQ(edge.can_accept_bytes("aa"), std::string_view(bound) == "minLength");
  }
}

// The default model's real vocabulary (SmolLM2's byte-level BPE): the masks of a schema's states
// hold exactly the tokens whose bytes the grammar allows, checked token by token.
TEST(Grammar, DefaultModelVocabulary) {
  const std::string path = test::default_model_or_empty();
  if (path.empty()) GTEST_SKIP() << "the default model is not fetched";
  auto file = gguf::GgufFile::open(path);
  const auto tok = Tokenizer::from_gguf(file);
  const auto vocab = std::make_shared<TokenVocabulary>(*tok, tok->vocab_size());
  const auto g = compile_json_schema(R"({"type":"object","properties":{"city":{"type":"string"},
      "days":{"type":"integer"}},"required":["city","days"],"additionalProperties":false})");
  GrammarMatcher m(g, vocab);
  const std::string answer = "{\"city\": \"Paris\", \"days\": 12}";
  const std::vector<int32_t> ids = tok->encode(answer, false, false);
  ASSERT_FALSE(ids.empty());
  for (size_t k = 0; k <= ids.size(); ++k) {
    const auto& mask = m.allowed_tokens();
    // Check every token of the vocabulary against a fresh byte-level walk of the same prefix.
    GrammarMatcher ref(g, vocab);
    ASSERT_TRUE(ref.accept_bytes(tok->decode(std::span<const int32_t>(ids.data(), k), false)));
    int allowed = 0;
    for (int32_t id = 0; id < vocab->size(); ++id) {
      const bool bit = (mask[id >> 5] >> (id & 31)) & 1;
      allowed += bit;
      bool expect;
      if (vocab->is_end(id)) {
        expect = ref.accepting();
      } else if (vocab->bytes(id).empty()) {
        expect = false;
      } else {
        expect = ref.can_accept_bytes(vocab->bytes(id));
      }
      if (bit != expect) {
        ADD_FAILURE() << "after " << k << " tokens: token " << id << " '" << vocab->bytes(id) << "' mask " << bit;
        return;
      }
    }
    EXPECT_GT(allowed, 0);
    if (k == ids.size()) {
      EXPECT_TRUE(m.is_allowed(tok->eos_id()) || m.accepting());
      break;
    }
    ASSERT_TRUE(m.is_allowed(ids[k])) << "the model's own tokenization, token " << k;
    ASSERT_TRUE(m.accept_token(ids[k]));
  }
  EXPECT_TRUE(m.accepting());
  EXPECT_FALSE(m.can_continue());
}

}  // namespace
}  // namespace fdpp::grammar
