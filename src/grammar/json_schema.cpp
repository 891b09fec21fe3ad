// JSON schema -> grammar. The output is JSON as a model writes it: whitespace between tokens is
// allowed but bounded (kMaxWhitespace bytes per gap, so that a small model cannot pad forever),
// object properties come in the schema's order (as XGrammar and OpenAI's strict mode emit them),
// and every keyword that would constrain the value in a way the grammar does not enforce is refused
// by name rather than ignored.
#include <nlohmann/json.hpp>

#include <map>
#include <set>

#include "fdpp/error.h"
#include "grammar/grammar.h"

namespace fdpp::grammar {

namespace {

using ojson = nlohmann::ordered_json;
constexpr int kMaxWhitespace = 20;
constexpr int64_t kMaxBoundedRepeat = 2048;  // minLength/maxLength/minItems/maxItems beyond: refused

std::string show(const ojson& j) {
  std::string s = j.dump();
  return s.size() > 60 ? s.substr(0, 57) + "..." : s;
}

class JsonGrammar {
 public:
  explicit JsonGrammar(Grammar& g) : g_(g) {
    ByteSet w;
    for (char c : {' ', '\t', '\n', '\r'}) w.set(static_cast<uint8_t>(c));
    const Element we = g_.bytes(w);
    ws_ = g_.repeat(std::span<const Element>(&we, 1), 0, kMaxWhitespace);
    // A character of a JSON string: unescaped UTF-8 (no quote, backslash or control) or an escape.
    ByteSet ascii, cont, lead2, lead3, lead4, esc, hex;
    for (int b = 0x20; b < 0x80; ++b)
      if (b != '"' && b != '\\') ascii.set(b);
    for (int b = 0x80; b < 0xc0; ++b) cont.set(b);
    for (int b = 0xc2; b < 0xe0; ++b) lead2.set(b);
    for (int b = 0xe0; b < 0xf0; ++b) lead3.set(b);
    for (int b = 0xf0; b < 0xf5; ++b) lead4.set(b);
    for (char c : std::string_view("\"\\/bfnrt")) esc.set(static_cast<uint8_t>(c));
    for (char c : std::string_view("0123456789abcdefABCDEF")) hex.set(static_cast<uint8_t>(c));
    const Element C = g_.bytes(cont), H = g_.bytes(hex);
    char_ = g_.choice({{g_.bytes(ascii)},
                       {g_.bytes(lead2), C},
                       {g_.bytes(lead3), C, C},
                       {g_.bytes(lead4), C, C, C},
                       {g_.byte('\\'), g_.bytes(esc)},
                       {g_.byte('\\'), g_.byte('u'), H, H, H, H}});
    const Element ce = Grammar::ref(char_);
    chars_ = g_.repeat(std::span<const Element>(&ce, 1), 0, -1);
    string_ = g_.sequence(std::vector<Element>{g_.byte('"'), Grammar::ref(chars_), g_.byte('"')});
  }

  Element ws() const { return Grammar::ref(ws_); }
  int string_rule() const { return string_; }
  int char_rule() const { return char_; }

  int integer() {
    if (integer_ < 0) {
      ByteSet d, d19;
      for (char c = '0'; c <= '9'; ++c) d.set(static_cast<uint8_t>(c));
      for (char c = '1'; c <= '9'; ++c) d19.set(static_cast<uint8_t>(c));
      const Element D = g_.bytes(d);
      const int digits = g_.repeat(std::span<const Element>(&D, 1), 0, -1);
      const int minus = g_.repeat(std::vector<Element>{g_.byte('-')}, 0, 1);
      const int magnitude = g_.choice({{g_.byte('0')}, {g_.bytes(d19), Grammar::ref(digits)}});
      integer_ = g_.sequence(std::vector<Element>{Grammar::ref(minus), Grammar::ref(magnitude)});
    }
    return integer_;
  }

  int number() {
    if (number_ < 0) {
      ByteSet d, e, sign;
      for (char c = '0'; c <= '9'; ++c) d.set(static_cast<uint8_t>(c));
      e.set('e');
      e.set('E');
      sign.set('+');
      sign.set('-');
      const Element D = g_.bytes(d);
      const int digits1 = g_.repeat(std::span<const Element>(&D, 1), 1, -1);
      const int frac = g_.repeat(std::vector<Element>{g_.byte('.'), Grammar::ref(digits1)}, 0, 1);
      const int opt_sign = g_.repeat(std::vector<Element>{g_.bytes(sign)}, 0, 1);
      const int exp = g_.repeat(std::vector<Element>{g_.bytes(e), Grammar::ref(opt_sign), Grammar::ref(digits1)}, 0, 1);
      number_ = g_.sequence(std::vector<Element>{Grammar::ref(integer()), Grammar::ref(frac), Grammar::ref(exp)});
    }
    return number_;
  }

  // Any JSON value (recursive).
  int value() {
    if (value_ >= 0) return value_;
    value_ = g_.add_rule();
    const int member = g_.sequence(std::vector<Element>{Grammar::ref(string_), ws(), g_.byte(':'), ws(), Grammar::ref(value_)});
    const int object = comma_list('{', member, '}', 0, -1);
    const int array = comma_list('[', value_, ']', 0, -1);
    for (int r : {object, array, string_, number(), g_.literal("true"), g_.literal("false"), g_.literal("null")})
      g_.add_alternative(value_, std::vector<Element>{Grammar::ref(r)});
    return value_;
  }

  int any_object() {
    value();
    const int member = g_.sequence(std::vector<Element>{Grammar::ref(string_), ws(), g_.byte(':'), ws(), Grammar::ref(value_)});
    return comma_list('{', member, '}', 0, -1);
  }

  // open ws (item ws ("," ws item ws){min-1..max-1})? close
  int comma_list(char open, int item, char close, int64_t min, int64_t max) {
    const std::vector<Element> more{g_.byte(','), ws(), Grammar::ref(item), ws()};
    std::vector<Element> seq{g_.byte(static_cast<uint8_t>(open)), ws()};
    if (max == 0) {
      seq.push_back(g_.byte(static_cast<uint8_t>(close)));
      return g_.sequence(seq);
    }
    const int rest = g_.repeat(more, static_cast<int>(std::max<int64_t>(min - 1, 0)),
                               max < 0 ? -1 : static_cast<int>(max - 1));
    const int items = g_.sequence(std::vector<Element>{Grammar::ref(item), ws(), Grammar::ref(rest)});
    const int body = min > 0 ? items : g_.choice({{Grammar::ref(items)}, {}});
    seq.push_back(Grammar::ref(body));
    seq.push_back(g_.byte(static_cast<uint8_t>(close)));
    return g_.sequence(seq);
  }

 private:
  Grammar& g_;
  int ws_ = -1, char_ = -1, chars_ = -1, string_ = -1, integer_ = -1, number_ = -1, value_ = -1;
};

class SchemaCompiler {
 public:
  SchemaCompiler(Grammar& g, const ojson& root) : g_(g), json_(g), root_(root) {}
  Element ws() const { return json_.ws(); }

  int compile(const ojson& s, const std::string& at) {
    if (s.is_boolean()) {
      if (s.get<bool>()) return json_.value();
      fail("the JSON schema at {} is false (nothing matches it)", at);
    }
    if (!s.is_object()) fail("the JSON schema at {} must be an object or a boolean, not {}", at, show(s));
    static const std::set<std::string> annotations = {
        "title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated", "readOnly",
        "writeOnly", "$defs", "definitions", "strict", "discriminator"};
    static const std::set<std::string> known = {
        "type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems", "enum", "const",
        "anyOf", "oneOf", "allOf", "$ref", "pattern", "minLength", "maxLength", "format", "nullable"};
    for (const auto& [k, v] : s.items())
      if (!annotations.count(k) && !known.count(k))
        fail("the JSON schema keyword \"{}\" (at {}) is not supported", k, at);

    if (const auto it = s.find("$ref"); it != s.end()) {
      for (const auto& [k, v] : s.items())
        if (k != "$ref" && !annotations.count(k))
          fail("the JSON schema keyword \"{}\" beside \"$ref\" (at {}) is not supported", k, at);
      return reference(*it, at);
    }
    if (const auto it = s.find("allOf"); it != s.end()) {
      if (!it->is_array() || it->size() != 1 || s.size() - count_annotations(s) != 1)
        fail("the JSON schema keyword \"allOf\" (at {}) is supported only as the one keyword with one schema", at);
      return compile((*it)[0], at + "/allOf/0");
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      const auto it = s.find(key);
      if (it == s.end()) continue;
      if (!it->is_array() || it->empty()) fail("\"{}\" (at {}) must be a non-empty array of schemas", key, at);
      for (const auto& [k, v] : s.items())
        if (k != key && !annotations.count(k))
          fail("the JSON schema keyword \"{}\" beside \"{}\" (at {}) is not supported", k, key, at);
      std::vector<std::vector<Element>> alts;
      for (size_t i = 0; i < it->size(); ++i)
        alts.push_back({Grammar::ref(compile((*it)[i], fmt::format("{}/{}/{}", at, key, i)))});
      return g_.choice(alts);
    }
    if (const auto it = s.find("const"); it != s.end()) return g_.literal(it->dump());
    if (const auto it = s.find("enum"); it != s.end()) {
      if (!it->is_array() || it->empty()) fail("\"enum\" (at {}) must be a non-empty array", at);
      std::vector<std::vector<Element>> alts;
      for (const auto& v : *it) alts.push_back(g_.literal_elements(v.dump()));
      return g_.choice(alts);
    }

    std::vector<std::string> types;
    if (const auto it = s.find("type"); it != s.end()) {
      if (it->is_string()) {
        types.push_back(it->get<std::string>());
      } else if (it->is_array() && !it->empty()) {
        for (const auto& t : *it) {
          if (!t.is_string()) fail("\"type\" (at {}) must be a string or an array of strings", at);
          types.push_back(t.get<std::string>());
        }
      } else {
        fail("\"type\" (at {}) must be a string or a non-empty array of strings", at);
      }
    } else if (s.contains("properties") || s.contains("additionalProperties") || s.contains("required")) {
      types = {"object"};
    } else if (s.contains("items") || s.contains("minItems") || s.contains("maxItems")) {
      types = {"array"};
    } else if (s.contains("pattern") || s.contains("minLength") || s.contains("maxLength") || s.contains("format")) {
      types = {"string"};
    } else {
      return json_.value();
    }
    if (s.value("nullable", false)) types.push_back("null");
    std::vector<std::vector<Element>> alts;
    for (const std::string& t : types) alts.push_back({Grammar::ref(typed(s, t, at))});
    return alts.size() == 1 ? alts[0][0].value : g_.choice(alts);
  }

 private:
  static size_t count_annotations(const ojson& s) {
    size_t n = 0;
    for (const auto& [k, v] : s.items())
      if (k == "title" || k == "description" || k == "$defs" || k == "definitions" || k == "$schema" || k == "$id" ||
          k == "$comment" || k == "default" || k == "examples")
        ++n;
    return n;
  }

  int reference(const ojson& ref, const std::string& at) {
    if (!ref.is_string()) fail("\"$ref\" (at {}) must be a string", at);
    const std::string r = ref.get<std::string>();
    if (auto it = refs_.find(r); it != refs_.end()) return it->second;
    if (r.empty() || r[0] != '#') fail("\"$ref\" {} (at {}): only references inside the schema (\"#/...\") are supported", show(ref), at);
    // A JSON pointer from the root.
    const ojson* target = &root_;
    if (r.size() > 1) {
      if (r[1] != '/') fail("\"$ref\" {} (at {}) is not a JSON pointer", show(ref), at);
      size_t i = 2;
      while (i <= r.size()) {
        size_t j = r.find('/', i);
        if (j == std::string::npos) j = r.size();
        std::string part = r.substr(i, j - i);
        for (size_t p; (p = part.find("~1")) != std::string::npos;) part.replace(p, 2, "/");
        for (size_t p; (p = part.find("~0")) != std::string::npos;) part.replace(p, 2, "~");
        if (!target->is_object() || !target->contains(part))
          fail("\"$ref\" {} (at {}) points at nothing in the schema", show(ref), at);
        target = &(*target)[part];
        i = j + 1;
      }
    }
    // The rule exists before its body compiles, so recursive schemas refer to themselves.
    const int rule = g_.add_rule();
    refs_[r] = rule;
    const int body = compile(*target, r);
    g_.add_alternative(rule, std::vector<Element>{Grammar::ref(body)});
    return rule;
  }

  static int64_t bound(const ojson& s, const char* key, const std::string& at, int64_t otherwise) {
    const auto it = s.find(key);
    if (it == s.end()) return otherwise;
    if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > kMaxBoundedRepeat)
      fail("\"{}\" {} (at {}) must be an integer in [0, {}]", key, show(*it), at, kMaxBoundedRepeat);
    return it->get<int64_t>();
  }

  void only(const ojson& s, const std::string& type, std::initializer_list<const char*> allowed, const std::string& at) {
    static const std::set<std::string> common = {"type", "title", "description", "default", "examples", "$schema", "$id",
                                                 "$comment", "deprecated", "readOnly", "writeOnly", "$defs",
                                                 "definitions", "strict", "nullable", "discriminator"};
    for (const auto& item : s.items()) {
      const std::string& k = item.key();  // a plain reference: older clang cannot capture a structured binding
      if (common.count(k)) continue;
      if (std::find_if(allowed.begin(), allowed.end(), [&](const char* a) { return k == a; }) != allowed.end()) continue;
      // Keywords of another type: meaningless for this one only when the schema allows one type.
      if (s.contains("type") && s["type"].is_array()) continue;
      fail("the JSON schema keyword \"{}\" (at {}) does not apply to type \"{}\"", k, at, type);
    }
  }

  int typed(const ojson& s, const std::string& type, const std::string& at) {
    if (type == "null") return g_.literal("null");
    if (type == "boolean") return g_.choice({g_.literal_elements("true"), g_.literal_elements("false")});
    if (type == "integer") {
      only(s, type, {}, at);
      return json_.integer();
    }
    if (type == "number") {
      only(s, type, {}, at);
      return json_.number();
    }
    if (type == "string") return string(s, at);
    if (type == "array") return array(s, at);
    if (type == "object") return object(s, at);
    fail("\"type\" \"{}\" (at {}) is not a JSON schema type", type, at);
  }

  int string(const ojson& s, const std::string& at) {
    only(s, "string", {"pattern", "minLength", "maxLength", "format"}, at);
    const bool has_len = s.contains("minLength") || s.contains("maxLength");
    std::string pattern;
    std::string where = at + "/pattern";
    if (const auto it = s.find("format"); it != s.end()) {
      static const std::map<std::string, std::string> formats = {
          {"date", R"([0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01]))"},
          {"time", R"(([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]+)?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9]))"},
          {"date-time",
           R"([0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]+)?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9]))"},
          {"uuid", "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"},
          {"email", R"([a-zA-Z0-9._%+-]+@[a-zA-Z0-9-]+(\.[a-zA-Z0-9-]+)*\.[a-zA-Z]{2,})"}};
      const auto f = it->is_string() ? formats.find(it->get<std::string>()) : formats.end();
      if (f == formats.end())
        fail("the JSON schema \"format\" {} (at {}) is not supported (supported: date, time, date-time, uuid, email)",
             show(*it), at);
      pattern = f->second;
      where = at + "/format";
    }
    if (const auto it = s.find("pattern"); it != s.end()) {
      if (!pattern.empty()) fail("\"pattern\" beside \"format\" (at {}) is not supported", at);
      if (!it->is_string()) fail("\"pattern\" (at {}) must be a string", at);
      pattern = it->get<std::string>();
    }
    if (!pattern.empty()) {
      if (has_len) fail("\"minLength\"/\"maxLength\" beside \"pattern\" or \"format\" (at {}) are not supported", at);
      const int body = add_regex_rule(g_, pattern, /*json_string_body=*/true, where);
      return g_.sequence(std::vector<Element>{g_.byte('"'), Grammar::ref(body), g_.byte('"')});
    }
    if (!has_len) return json_.string_rule();
    const int64_t min = bound(s, "minLength", at, 0), max = bound(s, "maxLength", at, -1);
    if (max >= 0 && max < min) fail("\"maxLength\" {} < \"minLength\" {} (at {})", max, min, at);
    const Element c = Grammar::ref(json_.char_rule());
    const int body = g_.repeat(std::span<const Element>(&c, 1), static_cast<int>(min), static_cast<int>(max));
    return g_.sequence(std::vector<Element>{g_.byte('"'), Grammar::ref(body), g_.byte('"')});
  }

  int array(const ojson& s, const std::string& at) {
    only(s, "array", {"items", "minItems", "maxItems"}, at);
    const int64_t min = bound(s, "minItems", at, 0), max = bound(s, "maxItems", at, -1);
    if (max >= 0 && max < min) fail("\"maxItems\" {} < \"minItems\" {} (at {})", max, min, at);
    int item;
    if (const auto it = s.find("items"); it != s.end()) {
      if (it->is_array()) fail("\"items\" as an array (tuple validation, at {}) is not supported", at);
      item = compile(*it, at + "/items");
    } else {
      item = json_.value();
    }
    return json_.comma_list('[', item, ']', min, max);
  }

  int object(const ojson& s, const std::string& at) {
    only(s, "object", {"properties", "required", "additionalProperties"}, at);
    const ojson empty = ojson::object();
    const auto pit = s.find("properties");
    const ojson& props = pit == s.end() ? empty : *pit;
    if (!props.is_object()) fail("\"properties\" (at {}) must be an object", at);
    std::set<std::string> required;
    if (const auto it = s.find("required"); it != s.end()) {
      if (!it->is_array()) fail("\"required\" (at {}) must be an array of names", at);
      for (const auto& n : *it) {
        if (!n.is_string()) fail("\"required\" (at {}) must be an array of names", at);
        if (!props.contains(n.get<std::string>()))
          fail("the required property {} (at {}) has no schema in \"properties\" (not supported)", n.dump(), at);
        required.insert(n.get<std::string>());
      }
    }
    // Extra properties: absent additionalProperties allows them only for an object without
    // "properties" (a schema that names its properties means those, as OpenAI's strict mode does).
    int extra_value = -1;
    if (const auto it = s.find("additionalProperties"); it != s.end()) {
      if (!(it->is_boolean() && !it->get<bool>())) extra_value = compile(*it, at + "/additionalProperties");
    } else if (pit == s.end()) {
      extra_value = json_.value();
    }

    // Properties in schema order, each required or optional. first_i / next_i: the rest of the
    // object from property i on, with no property written yet / after one (a comma first).
    struct Prop {
      int kv;
      bool required;
    };
    std::vector<Prop> list;
    for (const auto& [name, schema] : props.items()) {
      const int v = compile(schema, at + "/properties/" + name);
      std::vector<Element> kv = g_.literal_elements(ojson(name).dump());
      kv.push_back(json_.ws());
      kv.push_back(g_.byte(':'));
      kv.push_back(json_.ws());
      kv.push_back(Grammar::ref(v));
      kv.push_back(json_.ws());
      list.push_back({g_.sequence(kv), required.count(name) > 0});
    }
    int next_tail, first_tail;  // after the named properties
    if (extra_value >= 0) {
      const int member = g_.sequence(std::vector<Element>{Grammar::ref(json_.string_rule()), json_.ws(), g_.byte(':'),
                                                          json_.ws(), Grammar::ref(extra_value), json_.ws()});
      next_tail = g_.repeat(std::vector<Element>{g_.byte(','), json_.ws(), Grammar::ref(member)}, 0, -1);
      first_tail = g_.choice({{Grammar::ref(member), Grammar::ref(next_tail)}, {}});
    } else {
      next_tail = g_.choice({{}});
      first_tail = next_tail;
    }
    int next = next_tail, first = first_tail;
    for (size_t i = list.size(); i-- > 0;) {
      const Prop& p = list[i];
      std::vector<std::vector<Element>> n{{g_.byte(','), json_.ws(), Grammar::ref(p.kv), Grammar::ref(next)}};
      std::vector<std::vector<Element>> f{{Grammar::ref(p.kv), Grammar::ref(next)}};
      if (!p.required) {
        n.push_back({Grammar::ref(next)});
        f.push_back({Grammar::ref(first)});
      }
      const int ni = g_.choice(n), fi = g_.choice(f);
      next = ni;
      first = fi;
    }
    return g_.sequence(std::vector<Element>{g_.byte('{'), json_.ws(), Grammar::ref(first), g_.byte('}')});
  }

  Grammar& g_;
  JsonGrammar json_;
  const ojson& root_;
  std::map<std::string, int> refs_;
};

}  // namespace

std::shared_ptr<const Grammar> compile_json_schema(std::string_view schema_json) {
  ojson schema;
  try {
    schema = ojson::parse(schema_json);
  } catch (const nlohmann::json::exception& e) {
    fail("the JSON schema is not valid JSON: {}", e.what());
  }
  auto g = std::make_shared<Grammar>();
  SchemaCompiler c(*g, schema);
  const int value = c.compile(schema, "#");
  // Leading whitespace only: after the value the answer ends (trailing spaces would let a small
  // model pad instead of stopping).
  g->set_root(g->sequence(std::vector<Element>{c.ws(), Grammar::ref(value)}));
  return g;
}

std::shared_ptr<const Grammar> compile_json_object() {
  auto g = std::make_shared<Grammar>();
  JsonGrammar j(*g);
  g->set_root(g->sequence(std::vector<Element>{j.ws(), Grammar::ref(j.any_object())}));
  return g;
}

std::shared_ptr<const Grammar> compile_json_value() {
  auto g = std::make_shared<Grammar>();
  JsonGrammar j(*g);
  g->set_root(g->sequence(std::vector<Element>{j.ws(), Grammar::ref(j.value())}));
  return g;
}

std::shared_ptr<const Grammar> compile_choice(std::span<const std::string> choices) {
  check(!choices.empty(), "the list of choices is empty");
  auto g = std::make_shared<Grammar>();
  std::vector<std::vector<Element>> alts;
  for (const std::string& c : choices) {
    check(!c.empty(), "a choice is the empty string (the answer would be empty)");
    alts.push_back(g->literal_elements(c));
  }
  g->set_root(g->choice(alts));
  return g;
}

}  // namespace fdpp::grammar
