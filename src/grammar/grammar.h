// Structured output: a context-free grammar over bytes, compiled from a JSON schema, a regular
// expression or a list of choices, and a matcher that advances it token by token and answers which
// tokens of the vocabulary may come next (a bitmask the sampler applies before it draws).
//
// The grammar is llama.cpp's GBNF model (rules of alternatives of sequences of byte sets and rule
// references), run as a pushdown automaton: a state is the set of parse stacks still alive, each a
// list of positions in the grammar whose top is a byte set. Three things make the mask cheap:
//  - stacks are hash-consed (a stack is (top position, parent stack id)), so a state is a sorted
//    list of small integers and equal states are equal lists;
//  - states are interned into a lazily built DFA: each state has its 256 byte transitions memoized,
//    so after the first few tokens advancing a state by a byte is one array lookup;
//  - the allowed-token mask walks a trie of the vocabulary's token bytes against that DFA (a shared
//    prefix is walked once, a dead prefix prunes its whole subtree), and the mask is cached per
//    state, so a state met again (inside a string, between array items) costs nothing;
//  - states that differ only beyond the longest token share one mask: a mask depends on the bytes
//    a state accepts up to that length, which its stacks' next elements (through their returns,
//    until they must consume more bytes than any token holds) determine. Each position of a long
//    counted repetition (a string's minLength of 2,000) is its own state, but they share a mask.
// XGrammar goes further (it splits tokens into context-independent ones precomputed per grammar
// position and context-dependent ones checked at run time); see docs/PERFORMANCE.md for what this
// simpler design costs per token.
#pragma once

#include <array>
#include <bitset>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace fdpp {
class Tokenizer;
}

namespace fdpp::grammar {

struct Element {
  enum Kind : uint8_t { kBytes, kRule, kEnd };
  Kind kind = kEnd;
  int32_t value = 0;  // kBytes: index of the byte set; kRule: the rule id
  bool operator==(const Element&) const = default;
};

using ByteSet = std::bitset<256>;

// The compiled grammar. Built once per request (or shared), read-only afterwards.
class Grammar {
 public:
  // Building. A rule is a list of alternatives; an alternative a sequence of elements (empty: the
  // empty string). Rules may refer to rules added later (recursion), but never left-recursively.
  int add_rule();
  void add_alternative(int rule, std::span<const Element> sequence);
  Element bytes(const ByteSet& set);
  Element byte(uint8_t b);
  static Element ref(int rule) { return {Element::kRule, rule}; }
  // Sets the start rule and checks the grammar: every referenced rule exists and none is
  // left-recursive (refers to itself before a byte), which the matcher could not expand.
  void set_root(int rule);

  // Shorthands that return a new rule.
  int literal(std::string_view text);                       // exactly these bytes
  int sequence(std::span<const Element> sequence);          // one alternative
  int choice(const std::vector<std::vector<Element>>& alts);
  int repeat(std::span<const Element> body, int min, int max);  // max < 0: unbounded
  // The bytes of text as elements (to splice into a sequence).
  std::vector<Element> literal_elements(std::string_view text);

  int root() const { return root_; }
  int rule_count() const { return static_cast<int>(rule_alts_.size()); }
  const Element& at(int32_t pos) const { return elements_[pos]; }
  const std::vector<int32_t>& alternatives(int rule) const { return rule_alts_[rule]; }
  const ByteSet& byte_set(int32_t i) const { return sets_[i]; }
  // A readable dump (tests, debugging): one line per rule.
  std::string to_string() const;
  // A hash of every rule, alternative and byte set, taken by set_root: with same_as, how
  // GrammarAutomata finds the automaton of a grammar compiled before without building a key.
  uint64_t fingerprint() const { return fingerprint_; }
  bool same_as(const Grammar& other) const;

 private:
  std::vector<Element> elements_;               // every alternative, each ending with kEnd
  std::vector<std::vector<int32_t>> rule_alts_; // rule -> the positions where its alternatives start
  std::vector<ByteSet> sets_;
  std::unordered_map<std::string, int32_t> set_index_;
  uint64_t compute_fingerprint() const;

  int root_ = -1;
  uint64_t fingerprint_ = 0;
};

// The vocabulary as the matcher sees it: each token's bytes (empty for those never allowed:
// control tokens, end-of-generation tokens, ids past the tokenizer's vocabulary) in a trie, and the
// end-of-generation ids, allowed only where the grammar may end.
class TokenVocabulary {
 public:
  // size: the model's vocabulary (the logits' length; may exceed the tokenizer's).
  TokenVocabulary(const Tokenizer& tokenizer, int32_t size);
  TokenVocabulary(std::vector<std::string> token_bytes, std::vector<int32_t> end_ids);

  int32_t size() const { return static_cast<int32_t>(bytes_.size()); }
  const std::string& bytes(int32_t id) const { return bytes_[id]; }
  const std::vector<int32_t>& end_ids() const { return end_ids_; }
  bool is_end(int32_t id) const { return id >= 0 && id < size() && is_end_[id]; }

  struct Node {
    int32_t first_child = 0, child_count = 0;  // children are nodes [first_child, first_child + count)
    int32_t first_token = 0, token_count = 0;  // tokens_[...]: ids whose bytes end at this node
    uint8_t byte = 0;                          // the edge from the parent
  };
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<int32_t>& tokens() const { return tokens_; }

 private:
  void build_trie();
  std::vector<std::string> bytes_;
  std::vector<int32_t> end_ids_;
  std::vector<uint8_t> is_end_;
  std::vector<Node> nodes_;
  std::vector<int32_t> tokens_;
};

// The automaton of one grammar over one vocabulary: the interned parse stacks, the lazily built
// DFA states with their byte transitions, and the token masks. Every matcher of the grammar shares
// it (a server's requests of one schema pay for a state's mask once), from any thread: each call
// locks it. Its memo tables are bounded; when they outgrow the bounds they start over (a new
// generation), and each matcher finds its state again from the stacks its Cursor keeps.
class GrammarAutomaton {
 public:
  GrammarAutomaton(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenVocabulary> vocab);
  const TokenVocabulary& vocab() const { return *vocab_; }

  using Mask = std::vector<uint32_t>;  // bit (id % 32) of word id / 32
  // A matcher's place: its state in a generation of the memo, and that state's stacks.
  struct Cursor {
    int32_t state = -1;
    uint64_t generation = 0;
    std::vector<int32_t> stacks;  // sorted stack ids (stack ids survive a new generation)
    bool accept = false;
  };
  Cursor start();
  // The cursor after bytes, or false (cursor unchanged) when the grammar does not allow them.
  bool advance(Cursor& cursor, std::string_view bytes, bool commit);
  std::shared_ptr<const Mask> mask(Cursor& cursor);
  uint64_t generation() const;     // how many times the memo started over (tests)
  uint64_t masks_computed() const;  // vocabulary walks so far, over every generation (tests)

 private:
  struct Stack {
    int32_t pos;     // the top: a position in the grammar's elements
    int32_t parent;  // the stack below, or -1
  };
  struct State {
    std::vector<int32_t> stacks;  // sorted stack ids, tops at byte sets
    bool accept = false;
    std::array<int32_t, 256> next;  // -2: not computed yet, -1: dead
    int32_t mask = -1;              // index into masks_, -1: not computed
  };
  // The rest run with mutex_ held.
  int32_t intern_stack(int32_t pos, int32_t parent);
  // Expands (pos, parent) until every stack's top is a byte set; adds them to out.
  void expand(int32_t pos, int32_t parent, std::vector<int32_t>& out, bool& accept, int depth);
  int32_t intern_state(std::vector<int32_t> stacks, bool accept);
  int32_t step(int32_t state, uint8_t b);
  void compute_mask(int32_t state);
  // The key of what a state accepts up to max_token_bytes_ bytes (its stacks' elements up to that
  // many bytes of minimum length, and whether it may end there): equal keys, equal masks.
  std::string mask_key(int32_t state);
  // An id of what `rule` accepts within `budget` bytes: rules of one shape that differ only beyond
  // the budget (the nested optionals of a maxLength) get the same id.
  int32_t rule_shape(int32_t rule, int64_t budget, int depth);
  // Starts the memo over when it outgrew its bounds, then brings the cursor into this generation.
  void locate(Cursor& cursor);

  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<const TokenVocabulary> vocab_;
  mutable std::mutex mutex_;
  std::vector<Stack> stacks_;
  std::unordered_map<uint64_t, int32_t> stack_index_;
  std::vector<State> states_;
  std::unordered_map<std::string, int32_t> state_index_;
  std::vector<std::shared_ptr<const Mask>> masks_;
  std::unordered_map<std::string, int32_t> mask_by_key_;  // mask_key -> index into masks_
  std::unordered_map<uint64_t, int32_t> rule_shape_memo_;  // (rule, budget) -> rule_shape
  std::unordered_map<std::string, int32_t> shape_ids_;     // a shape's elements -> its id
  std::vector<int64_t> rule_min_bytes_;                   // the fewest bytes each rule matches
  int64_t max_token_bytes_ = 0;
  uint64_t masks_computed_ = 0;
  uint64_t generation_ = 0;
  std::vector<int32_t> initial_stacks_;
  bool initial_accept_ = false;
};

// The automata of the grammars in use, by the grammar's rules: requests that compiled the same
// schema share one. Keeps the last `kept` grammars' automata after their requests end. Thread-safe.
class GrammarAutomata {
 public:
  explicit GrammarAutomata(std::shared_ptr<const TokenVocabulary> vocab, size_t kept = 8)
      : vocab_(std::move(vocab)), kept_(kept) {}
  std::shared_ptr<GrammarAutomaton> get(const std::shared_ptr<const Grammar>& grammar);

 private:
  std::shared_ptr<const TokenVocabulary> vocab_;
  size_t kept_;
  std::mutex mutex_;
  struct Entry {
    std::shared_ptr<const Grammar> grammar;
    std::shared_ptr<GrammarAutomaton> automaton;
  };
  std::vector<Entry> recent_;  // most recent last
};

// One request's position in its grammar. Not thread-safe; one per request (its automaton is).
class GrammarMatcher {
 public:
  // A matcher with an automaton of its own.
  GrammarMatcher(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenVocabulary> vocab);
  // A matcher on a shared automaton (GrammarAutomata).
  explicit GrammarMatcher(std::shared_ptr<GrammarAutomaton> automaton);

  // The tokens allowed now: bit (id % 32) of word id / 32. End-of-generation ids are set only
  // where the grammar may end. Valid until the next accept_*.
  const std::vector<uint32_t>& allowed_tokens();
  bool is_allowed(int32_t id);
  // Advances by one token; false (state unchanged) when the grammar does not allow it. An
  // end-of-generation token is accepted where the grammar may end, and finishes the matcher.
  bool accept_token(int32_t id);
  // Advances by raw bytes (tests, and forcing text); false (state unchanged) when not allowed.
  bool accept_bytes(std::string_view bytes);
  // Whether accept_bytes would succeed, without advancing.
  bool can_accept_bytes(std::string_view bytes);

  // Back to the start of the grammar (the automaton keeps its memoized states and masks).
  void reset();

  bool accepting() const;     // the bytes so far are a complete sentence of the grammar
  bool can_continue() const;  // some byte may still follow
  bool finished() const { return finished_; }
  // No token of the vocabulary is allowed (not even an end): a dead end the request cannot leave.
  bool dead_end();

 private:
  std::shared_ptr<GrammarAutomaton> automaton_;
  GrammarAutomaton::Cursor cursor_;
  std::shared_ptr<const GrammarAutomaton::Mask> mask_;  // the current state's, once asked for
  bool finished_ = false;
};

// ---- compilers (json_schema.cpp, regex.cpp) -----------------------------------------------------
// Each throws fdpp::Error naming what it cannot compile ("the JSON schema keyword \"minimum\" (at
// #/properties/age) is not supported").

// A JSON schema (draft 2020-12 subset: README "Structured output" lists it).
std::shared_ptr<const Grammar> compile_json_schema(std::string_view schema_json);
// Any JSON object (response_format json_object), or any JSON value.
std::shared_ptr<const Grammar> compile_json_object();
std::shared_ptr<const Grammar> compile_json_value();
// A regular expression matched whole (guided_regex).
std::shared_ptr<const Grammar> compile_regex(std::string_view pattern);
// Exactly one of the strings (guided_choice).
std::shared_ptr<const Grammar> compile_choice(std::span<const std::string> choices);

// Used by the JSON schema compiler for "pattern": the regex's sentences as the body of a JSON
// string (quotes and backslashes escaped). Returns the rule.
int add_regex_rule(Grammar& g, std::string_view pattern, bool json_string_body, const std::string& where);

}  // namespace fdpp::grammar
