#include "grammar/grammar.h"

#include <algorithm>
#include <numeric>

#include "fdpp/error.h"
#include "tokenizer/tokenizer.h"

namespace fdpp::grammar {

// ---- Grammar -------------------------------------------------------------------------------------

int Grammar::add_rule() {
  rule_alts_.emplace_back();
  return static_cast<int>(rule_alts_.size()) - 1;
}

void Grammar::add_alternative(int rule, std::span<const Element> sequence) {
  check(rule >= 0 && rule < rule_count(), "grammar: rule {} does not exist", rule);
  // Counted repetitions expand into one rule per count ("maxLength": 2000 is 2,000 rules): bounded so
  // that a request cannot make the host build a grammar of gigabytes.
  constexpr size_t kMaxElements = size_t{1} << 21;
  check(elements_.size() + sequence.size() < kMaxElements,
        "the format is too large once expanded (over {} grammar elements; repetition counts such as maxLength "
        "expand into one rule per count)",
        kMaxElements);
  rule_alts_[rule].push_back(static_cast<int32_t>(elements_.size()));
  for (const Element& e : sequence) {
    check(e.kind != Element::kEnd, "grammar: an end marker inside an alternative");
    elements_.push_back(e);
  }
  elements_.push_back({Element::kEnd, 0});
}

void Grammar::set_root(int rule) {
  check(rule >= 0 && rule < rule_count(), "grammar: root rule {} does not exist", rule);
  const int n = rule_count();
  for (const Element& e : elements_)
    check(e.kind != Element::kRule || (e.value >= 0 && e.value < n), "grammar: rule {} does not exist", e.value);
  // Nullable rules (fixpoint), then the "starts with" graph over nullable prefixes: a cycle in it
  // is left recursion.
  std::vector<uint8_t> nullable(n, 0);
  auto alt_nullable = [&](int32_t p) {
    for (; elements_[p].kind != Element::kEnd; ++p)
      if (elements_[p].kind == Element::kBytes || !nullable[elements_[p].value]) return false;
    return true;
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (int r = 0; r < n; ++r)
      if (!nullable[r])
        for (int32_t a : rule_alts_[r])
          if (alt_nullable(a)) {
            nullable[r] = 1;
            changed = true;
            break;
          }
  }
  std::vector<std::vector<int>> starts(n);
  for (int r = 0; r < n; ++r)
    for (int32_t p : rule_alts_[r])
      for (; elements_[p].kind == Element::kRule; ++p) {
        starts[r].push_back(elements_[p].value);
        if (!nullable[elements_[p].value]) break;
      }
  std::vector<uint8_t> color(n, 0);  // 0 new, 1 on the path, 2 done
  std::vector<std::pair<int, size_t>> path;
  for (int s = 0; s < n; ++s) {
    if (color[s]) continue;
    path.push_back({s, 0});
    color[s] = 1;
    while (!path.empty()) {
      auto& [r, i] = path.back();
      if (i == starts[r].size()) {
        color[r] = 2;
        path.pop_back();
        continue;
      }
      const int t = starts[r][i++];
      check(color[t] != 1,
            "the grammar refers to itself before any text (rule {}: a schema such as {{\"$ref\": \"#\"}} inside "
            "itself), which cannot be generated",
            t);
      if (color[t] == 0) {
        color[t] = 1;
        path.push_back({t, 0});
      }
    }
  }
  root_ = rule;
  fingerprint_ = compute_fingerprint();
}

uint64_t Grammar::compute_fingerprint() const {
  uint64_t h = 0x9e3779b97f4a7c15ull;
  auto mix = [&h](uint64_t v) {  // splitmix64's finalizer over the running value
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
    h ^= h >> 31;
  };
  mix(static_cast<uint64_t>(root_));
  mix(elements_.size());
  for (const Element& e : elements_) mix((uint64_t{e.kind} << 32) | static_cast<uint32_t>(e.value));
  mix(rule_alts_.size());
  for (const auto& alts : rule_alts_) {
    mix(alts.size());
    for (int32_t a : alts) mix(static_cast<uint64_t>(a));
  }
  mix(sets_.size());
  for (const ByteSet& set : sets_)
    for (int w = 0; w < 4; ++w) mix(((set >> (64 * w)) & ByteSet(~uint64_t{0})).to_ullong());
  return h;
}

bool Grammar::same_as(const Grammar& other) const {
  return root_ == other.root_ && elements_ == other.elements_ && rule_alts_ == other.rule_alts_ &&
         sets_ == other.sets_;
}

Element Grammar::bytes(const ByteSet& set) {
  std::string key = set.to_string();
  auto [it, fresh] = set_index_.emplace(std::move(key), static_cast<int32_t>(sets_.size()));
  if (fresh) sets_.push_back(set);
  return {Element::kBytes, it->second};
}

Element Grammar::byte(uint8_t b) {
  ByteSet s;
  s.set(b);
  return bytes(s);
}

std::vector<Element> Grammar::literal_elements(std::string_view text) {
  std::vector<Element> out;
  out.reserve(text.size());
  for (char c : text) out.push_back(byte(static_cast<uint8_t>(c)));
  return out;
}

int Grammar::literal(std::string_view text) {
  const std::vector<Element> seq = literal_elements(text);
  return sequence(seq);
}

int Grammar::sequence(std::span<const Element> seq) {
  const int r = add_rule();
  add_alternative(r, seq);
  return r;
}

int Grammar::choice(const std::vector<std::vector<Element>>& alts) {
  const int r = add_rule();
  for (const auto& a : alts) add_alternative(r, a);
  return r;
}

int Grammar::repeat(std::span<const Element> body, int min, int max) {
  check(min >= 0 && (max < 0 || max >= min), "grammar: repetition {{{},{}}} is empty", min, max);
  std::vector<Element> seq;
  for (int i = 0; i < min; ++i) seq.insert(seq.end(), body.begin(), body.end());
  if (max < 0) {
    // tail ::= body tail | ε (right recursion: the matcher keeps the stack flat)
    const int tail = add_rule();
    std::vector<Element> loop(body.begin(), body.end());
    loop.push_back(ref(tail));
    add_alternative(tail, loop);
    add_alternative(tail, {});
    seq.push_back(ref(tail));
  } else if (max > min) {
    // opt_k ::= body opt_{k-1} | ε, nested max - min deep.
    int inner = -1;
    for (int k = 0; k < max - min; ++k) {
      const int r = add_rule();
      std::vector<Element> alt(body.begin(), body.end());
      if (inner >= 0) alt.push_back(ref(inner));
      add_alternative(r, alt);
      add_alternative(r, {});
      inner = r;
    }
    seq.push_back(ref(inner));
  }
  return sequence(seq);
}

std::string Grammar::to_string() const {
  auto show_set = [](const ByteSet& s) {
    std::string out = "[";
    for (int b = 0; b < 256; ++b) {
      if (!s.test(b)) continue;
      int e = b;
      while (e + 1 < 256 && s.test(e + 1)) ++e;
      auto one = [](int c) { return c >= 0x21 && c < 0x7f && c != ']' && c != '\\' && c != '-' ? std::string(1, char(c)) : fmt::format("\\x{:02x}", c); };
      out += one(b);
      if (e > b) out += "-" + one(e);
      b = e;
    }
    return out + "]";
  };
  std::string out;
  for (int r = 0; r < rule_count(); ++r) {
    out += fmt::format("r{}{} ::=", r, r == root_ ? "*" : "");
    for (size_t a = 0; a < rule_alts_[r].size(); ++a) {
      if (a) out += " |";
      for (int32_t p = rule_alts_[r][a]; elements_[p].kind != Element::kEnd; ++p)
        out += " " + (elements_[p].kind == Element::kRule ? fmt::format("r{}", elements_[p].value)
                                                            : show_set(sets_[elements_[p].value]));
      if (elements_[rule_alts_[r][a]].kind == Element::kEnd) out += " ()";
    }
    out += "\n";
  }
  return out;
}

// ---- TokenVocabulary -----------------------------------------------------------------------------

TokenVocabulary::TokenVocabulary(const Tokenizer& tokenizer, int32_t size) {
  check(size > 0, "grammar: the vocabulary is empty");
  bytes_.resize(size);
  is_end_.assign(size, 0);
  const int32_t n = std::min(size, tokenizer.vocab_size());
  for (int32_t id = 0; id < n; ++id) {
    if (tokenizer.is_end_of_generation(id)) {
      end_ids_.push_back(id);
      is_end_[id] = 1;
      continue;
    }
    // Control tokens (<|im_start|>, BOS) are never text of the answer; user-defined ones are.
    const TokenType t = tokenizer.token_type(id);
    if (t == TokenType::kControl || t == TokenType::kUnknown || t == TokenType::kUndefined) continue;
    bytes_[id] = tokenizer.token_bytes(id);
  }
  build_trie();
}

TokenVocabulary::TokenVocabulary(std::vector<std::string> token_bytes, std::vector<int32_t> end_ids)
    : bytes_(std::move(token_bytes)), end_ids_(std::move(end_ids)) {
  is_end_.assign(bytes_.size(), 0);
  for (int32_t id : end_ids_) {
    check(id >= 0 && id < size(), "grammar: end id {} outside the vocabulary of {}", id, size());
    is_end_[id] = 1;
    bytes_[id].clear();
  }
  build_trie();
}

void TokenVocabulary::build_trie() {
  std::vector<int32_t> ids;
  for (int32_t id = 0; id < size(); ++id)
    if (!bytes_[id].empty()) ids.push_back(id);
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return bytes_[a] < bytes_[b] || (bytes_[a] == bytes_[b] && a < b); });
  // Breadth-first over ranges of the sorted ids sharing a prefix: children of a node are contiguous.
  struct Pending {
    int32_t node, lo, hi;
    size_t depth;
  };
  nodes_.assign(1, Node{});
  std::vector<Pending> queue{{0, 0, static_cast<int32_t>(ids.size()), 0}};
  for (size_t qi = 0; qi < queue.size(); ++qi) {
    const Pending p = queue[qi];
    int32_t i = p.lo;
    nodes_[p.node].first_token = static_cast<int32_t>(tokens_.size());
    while (i < p.hi && bytes_[ids[i]].size() == p.depth) tokens_.push_back(ids[i++]);
    nodes_[p.node].token_count = static_cast<int32_t>(tokens_.size()) - nodes_[p.node].first_token;
    nodes_[p.node].first_child = static_cast<int32_t>(nodes_.size());
    while (i < p.hi) {
      const uint8_t b = static_cast<uint8_t>(bytes_[ids[i]][p.depth]);
      int32_t j = i;
      while (j < p.hi && static_cast<uint8_t>(bytes_[ids[j]][p.depth]) == b) ++j;
      Node child;
      child.byte = b;
      queue.push_back({static_cast<int32_t>(nodes_.size()), i, j, p.depth + 1});
      nodes_.push_back(child);
      i = j;
    }
    nodes_[p.node].child_count = static_cast<int32_t>(nodes_.size()) - nodes_[p.node].first_child;
  }
}

// ---- GrammarMatcher ------------------------------------------------------------------------------

namespace {
// Bounds that keep a pathological grammar from eating the host: expansion depth (nested nullable
// rules), and the memo tables, which are dropped and rebuilt when they grow past these.
constexpr int kMaxExpandDepth = 4096;
constexpr size_t kMaxStates = 8192;
constexpr size_t kMaxMasks = 512;
}  // namespace

GrammarAutomaton::GrammarAutomaton(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenVocabulary> vocab)
    : grammar_(std::move(grammar)), vocab_(std::move(vocab)) {
  check(grammar_ && grammar_->root() >= 0, "grammar: no root rule");
  check(vocab_ != nullptr, "grammar: no vocabulary");
  for (int32_t alt : grammar_->alternatives(grammar_->root())) expand(alt, -1, initial_stacks_, initial_accept_, 0);
  std::sort(initial_stacks_.begin(), initial_stacks_.end());
  initial_stacks_.erase(std::unique(initial_stacks_.begin(), initial_stacks_.end()), initial_stacks_.end());
  check(!initial_stacks_.empty() || initial_accept_, "grammar: the grammar matches no text at all");
  // The fewest bytes of each rule: a fixed point from "unbounded" (recursive rules converge).
  constexpr int64_t kUnbounded = int64_t{1} << 40;
  rule_min_bytes_.assign(static_cast<size_t>(grammar_->rule_count()), kUnbounded);
  for (bool changed = true; changed;) {
    changed = false;
    for (int rule = 0; rule < grammar_->rule_count(); ++rule) {
      int64_t best = kUnbounded;
      for (int32_t pos : grammar_->alternatives(rule)) {
        int64_t n = 0;
        for (; grammar_->at(pos).kind != Element::kEnd; ++pos) {
          const Element& e = grammar_->at(pos);
          n = std::min(kUnbounded, n + (e.kind == Element::kBytes ? 1 : rule_min_bytes_[e.value]));
        }
        best = std::min(best, n);
      }
      if (best < rule_min_bytes_[rule]) rule_min_bytes_[rule] = best, changed = true;
    }
  }
  for (int32_t id = 0; id < vocab_->size(); ++id)
    max_token_bytes_ = std::max<int64_t>(max_token_bytes_, static_cast<int64_t>(vocab_->bytes(id).size()));
}

GrammarAutomaton::Cursor GrammarAutomaton::start() {
  std::lock_guard<std::mutex> lock(mutex_);
  Cursor c;
  c.stacks = initial_stacks_;
  c.accept = initial_accept_;
  c.generation = generation_;
  c.state = intern_state(c.stacks, c.accept);
  return c;
}

void GrammarAutomaton::locate(Cursor& c) {
  if (states_.size() > kMaxStates || masks_.size() > kMaxMasks) {
    // Start the memo over (stacks stay: their ids are what states hold). Other cursors find
    // their states again when they next come here.
    states_.clear();
    state_index_.clear();
    masks_.clear();
    mask_by_key_.clear();
    ++generation_;
  }
  if (c.generation != generation_ || c.state < 0) {
    c.state = intern_state(c.stacks, c.accept);
    c.generation = generation_;
  }
}

bool GrammarAutomaton::advance(Cursor& c, std::string_view bytes, bool commit) {
  std::lock_guard<std::mutex> lock(mutex_);
  locate(c);
  int32_t s = c.state;
  for (char b : bytes) {
    s = step(s, static_cast<uint8_t>(b));
    if (s < 0) return false;
  }
  if (commit && s != c.state) {  // the same state has the same stacks
    c.state = s;
    c.stacks = states_[s].stacks;
    c.accept = states_[s].accept;
  }
  return true;
}

std::shared_ptr<const GrammarAutomaton::Mask> GrammarAutomaton::mask(Cursor& c) {
  std::lock_guard<std::mutex> lock(mutex_);
  locate(c);
  if (states_[c.state].mask < 0) compute_mask(c.state);
  return masks_[states_[c.state].mask];
}

uint64_t GrammarAutomaton::masks_computed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return masks_computed_;
}

uint64_t GrammarAutomaton::generation() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return generation_;
}

int32_t GrammarAutomaton::intern_stack(int32_t pos, int32_t parent) {
  const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(pos)) << 32) | static_cast<uint32_t>(parent);
  auto [it, fresh] = stack_index_.emplace(key, static_cast<int32_t>(stacks_.size()));
  if (fresh) stacks_.push_back({pos, parent});
  return it->second;
}

void GrammarAutomaton::expand(int32_t pos, int32_t parent, std::vector<int32_t>& out, bool& accept, int depth) {
  check(depth < kMaxExpandDepth, "grammar: expansion deeper than {} rules (a left-recursive or runaway rule)",
        kMaxExpandDepth);
  for (;;) {
    const Element& e = grammar_->at(pos);
    if (e.kind == Element::kBytes) {
      out.push_back(intern_stack(pos, parent));
      return;
    }
    if (e.kind == Element::kEnd) {
      if (parent < 0) {
        accept = true;
        return;
      }
      // Return to the continuation saved below.
      pos = stacks_[parent].pos;
      parent = stacks_[parent].parent;
      continue;
    }
    // A rule: push the continuation (unless it is the end of this alternative: a tail call keeps
    // the stack flat for right recursion) and expand each alternative.
    const int32_t cont = grammar_->at(pos + 1).kind == Element::kEnd ? parent : intern_stack(pos + 1, parent);
    for (int32_t alt : grammar_->alternatives(e.value)) expand(alt, cont, out, accept, depth + 1);
    return;
  }
}

int32_t GrammarAutomaton::intern_state(std::vector<int32_t> stacks, bool accept) {
  std::sort(stacks.begin(), stacks.end());
  stacks.erase(std::unique(stacks.begin(), stacks.end()), stacks.end());
  if (stacks.empty() && !accept) return -1;
  std::string key(reinterpret_cast<const char*>(stacks.data()), stacks.size() * sizeof(int32_t));
  key.push_back(accept ? 1 : 0);
  auto [it, fresh] = state_index_.emplace(std::move(key), static_cast<int32_t>(states_.size()));
  if (fresh) {
    State s;
    s.stacks = std::move(stacks);
    s.accept = accept;
    s.next.fill(-2);
    states_.push_back(std::move(s));
  }
  return it->second;
}

int32_t GrammarAutomaton::step(int32_t state, uint8_t b) {
  int32_t cached = states_[state].next[b];
  if (cached != -2) return cached;
  std::vector<int32_t> out;
  bool accept = false;
  for (int32_t s : states_[state].stacks) {
    const Stack st = stacks_[s];
    if (!grammar_->byte_set(grammar_->at(st.pos).value).test(b)) continue;
    expand(st.pos + 1, st.parent, out, accept, 0);
  }
  const int32_t next = intern_state(std::move(out), accept);
  states_[state].next[b] = next;  // states_ may have grown: index again
  return next;
}

int32_t GrammarAutomaton::rule_shape(int32_t rule, int64_t budget, int depth) {
  if (budget < 0) return 0;  // out of every token's reach: what it holds does not matter
  // Deep nesting (or a recursion that consumes no byte) keeps the rule's own identity: exact.
  constexpr int kMaxShapeDepth = 64;
  const uint64_t memo_key = (static_cast<uint64_t>(static_cast<uint32_t>(rule)) << 32) | static_cast<uint32_t>(budget);
  if (const auto it = rule_shape_memo_.find(memo_key); it != rule_shape_memo_.end()) return it->second;
  std::string shape;
  auto put = [&shape](int32_t x) { shape.append(reinterpret_cast<const char*>(&x), sizeof(x)); };
  if (depth >= kMaxShapeDepth) {
    put(-1);
    put(rule);
  } else {
    for (int32_t pos : grammar_->alternatives(rule)) {
      int64_t need = 0;
      for (;; ++pos) {
        const Element& e = grammar_->at(pos);
        if (e.kind == Element::kEnd) {
          put(-2);
          break;
        }
        if (need > budget) {
          put(-3);  // the rest is out of reach
          break;
        }
        put(e.kind == Element::kBytes ? e.value : -4 - rule_shape(e.value, budget - need, depth + 1));
        need += e.kind == Element::kBytes ? 1 : rule_min_bytes_[e.value];
      }
    }
  }
  const auto [it, fresh] = shape_ids_.emplace(std::move(shape), static_cast<int32_t>(shape_ids_.size()) + 1);
  rule_shape_memo_.emplace(memo_key, it->second);
  return it->second;
}

std::string GrammarAutomaton::mask_key(int32_t state) {
  // Per stack: its elements (kind, value) from the top, through the continuations it returns to,
  // until they need more bytes than the longest token (no token reaches past them) or the grammar
  // ends. Equal element sequences accept equal byte strings up to that length. Sorted, so that
  // the order of the stack ids does not matter.
  std::vector<std::string> walks;
  walks.reserve(states_[state].stacks.size());
  for (int32_t s : states_[state].stacks) {
    std::string w;
    auto put = [&w](int32_t x) { w.append(reinterpret_cast<const char*>(&x), sizeof(x)); };
    int32_t pos = stacks_[s].pos, parent = stacks_[s].parent;
    int64_t need = 0;
    for (;;) {
      const Element& e = grammar_->at(pos);
      if (e.kind == Element::kEnd) {
        put(-1 - static_cast<int32_t>(parent < 0));  // -1: a return, -2: the grammar's end
        if (parent < 0) break;
        pos = stacks_[parent].pos;
        parent = stacks_[parent].parent;
        continue;
      }
      put(e.kind == Element::kBytes ? e.value : -3 - rule_shape(e.value, max_token_bytes_ - need, 0));
      need += e.kind == Element::kBytes ? 1 : rule_min_bytes_[e.value];
      if (need > max_token_bytes_) break;
      ++pos;
    }
    walks.push_back(std::move(w));
  }
  std::sort(walks.begin(), walks.end());
  std::string key;
  key.push_back(states_[state].accept ? 'a' : 'n');
  for (const std::string& w : walks) {
    const auto n = static_cast<uint32_t>(w.size());
    key.append(reinterpret_cast<const char*>(&n), sizeof(n));
    key.append(w);
  }
  return key;
}

void GrammarAutomaton::compute_mask(int32_t state) {
  std::string key = mask_key(state);
  if (const auto it = mask_by_key_.find(key); it != mask_by_key_.end()) {
    states_[state].mask = it->second;
    return;
  }
  mask_by_key_.emplace(std::move(key), static_cast<int32_t>(masks_.size()));
  ++masks_computed_;
  const TokenVocabulary& v = *vocab_;
  auto mask = std::make_shared<Mask>((static_cast<size_t>(v.size()) + 31) / 32, 0u);
  const auto& nodes = v.nodes();
  const auto& tokens = v.tokens();
  // Depth-first over the trie, carrying the DFA state reached by each node's prefix.
  std::vector<std::pair<int32_t, int32_t>> todo{{0, state}};
  while (!todo.empty()) {
    const auto [node, st] = todo.back();
    todo.pop_back();
    const TokenVocabulary::Node& n = nodes[node];
    for (int32_t c = n.first_child; c < n.first_child + n.child_count; ++c) {
      const int32_t next = step(st, nodes[c].byte);
      if (next < 0) continue;
      const TokenVocabulary::Node& cn = nodes[c];
      for (int32_t t = cn.first_token; t < cn.first_token + cn.token_count; ++t)
        (*mask)[tokens[t] >> 5] |= 1u << (tokens[t] & 31);
      if (cn.child_count > 0) todo.emplace_back(c, next);
    }
  }
  if (states_[state].accept)
    for (int32_t id : v.end_ids()) (*mask)[id >> 5] |= 1u << (id & 31);
  states_[state].mask = static_cast<int32_t>(masks_.size());
  masks_.push_back(std::move(mask));
}

// ---- GrammarAutomata -----------------------------------------------------------------------------

std::shared_ptr<GrammarAutomaton> GrammarAutomata::get(const std::shared_ptr<const Grammar>& grammar) {
  check(grammar != nullptr, "grammar: none given");
  // Two requests that compiled the same schema have equal rules, alternatives and byte sets: the
  // fingerprint picks the candidate, the full comparison makes the match exact.
  std::lock_guard<std::mutex> lock(mutex_);
  for (size_t i = 0; i < recent_.size(); ++i)
    if (recent_[i].grammar == grammar ||
        (recent_[i].grammar->fingerprint() == grammar->fingerprint() && recent_[i].grammar->same_as(*grammar))) {
      auto found = std::move(recent_[i]);
      recent_.erase(recent_.begin() + static_cast<std::ptrdiff_t>(i));
      recent_.push_back(std::move(found));
      return recent_.back().automaton;
    }
  auto automaton = std::make_shared<GrammarAutomaton>(grammar, vocab_);
  if (kept_ == 0) return automaton;
  if (recent_.size() >= kept_) recent_.erase(recent_.begin());
  recent_.push_back({grammar, automaton});
  return automaton;
}

// ---- GrammarMatcher ------------------------------------------------------------------------------

GrammarMatcher::GrammarMatcher(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenVocabulary> vocab)
    : GrammarMatcher(std::make_shared<GrammarAutomaton>(std::move(grammar), std::move(vocab))) {}

GrammarMatcher::GrammarMatcher(std::shared_ptr<GrammarAutomaton> automaton) : automaton_(std::move(automaton)) {
  check(automaton_ != nullptr, "grammar: no automaton");
  cursor_ = automaton_->start();
}

void GrammarMatcher::reset() {
  finished_ = false;
  mask_.reset();
  cursor_ = automaton_->start();
}

const std::vector<uint32_t>& GrammarMatcher::allowed_tokens() {
  check(!finished_, "grammar: the matcher has finished");
  if (!mask_) mask_ = automaton_->mask(cursor_);
  return *mask_;
}

bool GrammarMatcher::is_allowed(int32_t id) {
  if (id < 0 || id >= automaton_->vocab().size()) return false;
  const std::vector<uint32_t>& m = allowed_tokens();
  return (m[id >> 5] >> (id & 31)) & 1u;
}

bool GrammarMatcher::dead_end() {
  if (finished_) return false;
  for (uint32_t w : allowed_tokens())
    if (w) return false;
  return true;
}

bool GrammarMatcher::accept_token(int32_t id) {
  const TokenVocabulary& v = automaton_->vocab();
  if (finished_ || id < 0 || id >= v.size()) return false;
  if (v.is_end(id)) {
    if (!cursor_.accept) return false;
    finished_ = true;
    mask_.reset();
    return true;
  }
  const std::string& b = v.bytes(id);
  if (b.empty()) return false;
  return accept_bytes(b);
}

bool GrammarMatcher::accept_bytes(std::string_view bytes) {
  if (finished_) return false;
  if (!automaton_->advance(cursor_, bytes, /*commit=*/true)) return false;
  mask_.reset();
  return true;
}

bool GrammarMatcher::can_accept_bytes(std::string_view bytes) {
  if (finished_) return false;
  return automaton_->advance(cursor_, bytes, /*commit=*/false);
}

bool GrammarMatcher::accepting() const { return !finished_ && cursor_.accept; }

bool GrammarMatcher::can_continue() const { return !finished_ && !cursor_.stacks.empty(); }

}  // namespace fdpp::grammar
