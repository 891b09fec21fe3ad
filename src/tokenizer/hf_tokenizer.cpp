#include "tokenizer/hf_tokenizer.h"

#include <sentencepiece_processor.h>
#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>

#include "fdpp/error.h"
#include "io/json_file.h"
#include "tokenizer/internal.h"

namespace fdpp {

namespace {

using nlohmann::json;

constexpr std::string_view kSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's space

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  check(in.good(), "{}: cannot open", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A special token in tokenizer_config.json / special_tokens_map.json: "text" or {"content": ...}.
std::string token_string(const json* j, const char* key) {
  if (j == nullptr || !j->is_object() || !j->contains(key)) return {};
  const json& v = j->at(key);
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v.at("content").is_string()) return v.at("content").get<std::string>();
  return {};
}

std::optional<bool> bool_field(const json* j, const char* key) {
  if (j == nullptr || !j->is_object() || !j->contains(key) || !j->at(key).is_boolean()) return std::nullopt;
  return j->at(key).get<bool>();
}

// tokenizer_config.json's chat_template (a string, or a list of {name, template} where "default"
// is the one), else chat_template.jinja (transformers >= 4.43 writes it separately).
std::string chat_template(const std::string& dir, const json* config) {
  if (config != nullptr && config->is_object() && config->contains("chat_template")) {
    const json& t = config->at("chat_template");
    if (t.is_string()) return t.get<std::string>();
    if (t.is_array()) {
      for (const json& entry : t)
        if (entry.is_object() && entry.value("name", "") == "default" && entry.contains("template") &&
            entry.at("template").is_string())
          return entry.at("template").get<std::string>();
    }
  }
  const std::string jinja = dir + "/chat_template.jinja";
  if (file_exists(jinja)) return read_text_file(jinja);
  return {};
}

// ---- tokenizer.json (byte-level BPE) ----------------------------------------------------------

// Pre-tokenizer regexes as tokenizer.json spells them (the same as src/tokenizer/text.cpp's).
constexpr std::string_view kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

bool is_type(const json& j, const char* type) {
  return j.is_object() && j.contains("type") && j.at("type").is_string() && j.at("type").get<std::string>() == type;
}

// A ByteLevel pre-tokenizer step; use_regex says whether it splits with GPT-2's regex itself.
bool byte_level(const json& j, bool want_regex, const std::string& origin) {
  if (!is_type(j, "ByteLevel")) return false;
  check(!j.value("add_prefix_space", false), "{}: pre_tokenizer ByteLevel with add_prefix_space = true is not supported",
        origin);
  return j.value("use_regex", true) == want_regex;
}

// The name src/tokenizer/text.cpp's PreTokenizer knows for this pre_tokenizer.
std::string pre_tokenizer_name(const json& pre, const std::string& origin) {
  if (byte_level(pre, true, origin)) return "gpt2";
  if (is_type(pre, "Sequence") && pre.contains("pretokenizers") && pre.at("pretokenizers").is_array()) {
    const json& steps = pre.at("pretokenizers");
    if (steps.size() == 2 && is_type(steps[0], "Split") && byte_level(steps[1], false, origin)) {
      const json& split = steps[0];
      const json pattern = split.value("pattern", json::object());
      const std::string regex = pattern.is_object() ? pattern.value("Regex", "") : "";
      const std::string behavior = split.value("behavior", "");
      check(behavior == "Isolated" && !split.value("invert", false),
            "{}: pre_tokenizer Split with behavior '{}' is not supported (supported: Isolated)", origin, behavior);
      if (regex == kLlama3Regex) return "llama3";
      if (regex == kQwen2Regex) return "qwen2";
      fail("{}: pre_tokenizer Split regex {} is not supported (supported: Llama 3's and Qwen2's)", origin,
           json_show(json(regex)));
    }
    if (steps.size() == 2 && is_type(steps[0], "Digits") && steps[0].value("individual_digits", false) &&
        byte_level(steps[1], true, origin))
      return "smollm";
  }
  fail(
      "{}: pre_tokenizer {} is not supported (supported: ByteLevel; Split(Llama 3 / Qwen2 regex) + ByteLevel; "
      "Digits + ByteLevel)",
      origin, json_show(pre));
}

// The BOS a post_processor's TemplateProcessing puts before the sequence ("<|begin_of_text|> $A").
std::string template_bos(const json& post) {
  if (is_type(post, "Sequence") && post.contains("processors") && post.at("processors").is_array()) {
    for (const json& p : post.at("processors")) {
      const std::string b = template_bos(p);
      if (!b.empty()) return b;
    }
    return {};
  }
  if (!is_type(post, "TemplateProcessing") || !post.contains("single") || !post.at("single").is_array()) return {};
  const json& single = post.at("single");
  if (single.empty() || !single[0].is_object() || !single[0].contains("SpecialToken")) return {};
  const json& st = single[0].at("SpecialToken");
  return st.is_object() && st.contains("id") && st.at("id").is_string() ? st.at("id").get<std::string>() : "";
}

// Token table from id-keyed entries; ids never given are filled with unused placeholders that no
// text can produce.
void place_token(std::vector<std::string>& tokens, std::vector<int32_t>& types, int64_t id, const std::string& text,
                 TokenType type, const std::string& origin) {
  check(id >= 0 && id < (int64_t{1} << 24), "{}: token '{}' has id {}, out of range", origin, text, id);
  if (static_cast<size_t>(id) >= tokens.size()) {
    tokens.resize(id + 1);
    types.resize(id + 1, -1);
  }
  tokens[id] = text;
  types[id] = static_cast<int32_t>(type);
}

void fill_gaps(std::vector<std::string>& tokens, std::vector<int32_t>& types) {
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (types[i] >= 0) continue;
    tokens[i] = "<fdpp:unused:" + std::to_string(i) + ">";
    types[i] = static_cast<int32_t>(TokenType::kUnused);
  }
}

int32_t id_of(const VocabSpec& spec, const std::string& text) {
  if (text.empty()) return -1;
  for (size_t i = spec.tokens.size(); i-- > 0;)
    if (spec.tokens[i] == text) return static_cast<int32_t>(i);
  return -1;
}

// ---- end-of-generation ids from config.json / generation_config.json --------------------------

class ExtraEndTokens final : public Tokenizer {
 public:
  ExtraEndTokens(std::unique_ptr<Tokenizer> inner, std::vector<int32_t> ids)
      : inner_(std::move(inner)), ids_(std::move(ids)) {}
  std::vector<int32_t> encode(std::string_view text, bool add_bos, bool parse_special) const override {
    return inner_->encode(text, add_bos, parse_special);
  }
  std::string token_bytes(int32_t id) const override { return inner_->token_bytes(id); }
  std::string decode(std::span<const int32_t> ids, bool skip_special) const override {
    return inner_->decode(ids, skip_special);
  }
  void append_token_text(std::string& out, int32_t id, bool& at_start, bool skip_special) const override {
    inner_->append_token_text(out, id, at_start, skip_special);
  }
  int32_t vocab_size() const override { return inner_->vocab_size(); }
  int32_t bos_id() const override { return inner_->bos_id(); }
  int32_t eos_id() const override { return inner_->eos_id(); }
  bool add_bos_by_default() const override { return inner_->add_bos_by_default(); }
  bool is_end_of_generation(int32_t id) const override {
    return inner_->is_end_of_generation(id) || std::find(ids_.begin(), ids_.end(), id) != ids_.end();
  }
  bool is_special(int32_t id) const override { return inner_->is_special(id); }
  TokenType token_type(int32_t id) const override { return inner_->token_type(id); }
  const std::string& token_text(int32_t id) const override { return inner_->token_text(id); }
  int32_t token_id(std::string_view text) const override { return inner_->token_id(text); }
  std::string apply_chat_template(std::span<const ChatMessage> messages, bool add_generation_prompt,
                                  const ChatOptions& options = {}) const override {
    return inner_->apply_chat_template(messages, add_generation_prompt, options);
  }
  ToolCallFormat tool_call_format() const override { return inner_->tool_call_format(); }

 private:
  std::unique_ptr<Tokenizer> inner_;
  std::vector<int32_t> ids_;
};

std::unique_ptr<Tokenizer> with_end_tokens(std::unique_ptr<Tokenizer> t, const std::vector<int32_t>& ids) {
  std::vector<int32_t> extra;
  for (const int32_t id : ids)
    if (id >= 0 && id < t->vocab_size() && !t->is_end_of_generation(id)) extra.push_back(id);
  if (extra.empty()) return t;
  return std::make_unique<ExtraEndTokens>(std::move(t), std::move(extra));
}

// ---- SentencePiece (tokenizer.model) ----------------------------------------------------------

// The two NormalizerSpec flags sentencepiece's decoder consults, read from the serialized
// ModelProto (field 3 normalizer_spec: 3 add_dummy_prefix, 4 remove_extra_whitespaces; both
// default true). The public header does not expose the proto classes.
struct NormalizerFlags {
  bool add_dummy_prefix = true;
  bool remove_extra_whitespaces = true;
};

bool read_varint(std::string_view& s, uint64_t& v) {
  v = 0;
  for (int shift = 0; shift < 64 && !s.empty(); shift += 7) {
    const auto b = static_cast<uint8_t>(s.front());
    s.remove_prefix(1);
    v |= static_cast<uint64_t>(b & 0x7F) << shift;
    if ((b & 0x80) == 0) return true;
  }
  return false;
}

// Visits the fields of one message; fn(field, wire_type, varint, bytes) returns false to stop.
template <class Fn>
bool for_each_field(std::string_view s, Fn&& fn) {
  while (!s.empty()) {
    uint64_t key = 0, v = 0;
    if (!read_varint(s, key)) return false;
    const auto field = static_cast<uint32_t>(key >> 3);
    const auto wire = static_cast<uint32_t>(key & 7);
    std::string_view bytes;
    if (wire == 0) {
      if (!read_varint(s, v)) return false;
    } else if (wire == 1 || wire == 5) {
      const size_t n = wire == 1 ? 8 : 4;
      if (s.size() < n) return false;
      s.remove_prefix(n);
    } else if (wire == 2) {
      if (!read_varint(s, v) || v > s.size()) return false;
      bytes = s.substr(0, v);
      s.remove_prefix(v);
    } else {
      return false;
    }
    if (!fn(field, wire, v, bytes)) return true;
  }
  return true;
}

NormalizerFlags normalizer_flags(std::string_view proto, const std::string& origin) {
  NormalizerFlags f;
  const bool ok = for_each_field(proto, [&](uint32_t field, uint32_t wire, uint64_t, std::string_view bytes) {
    if (field == 3 && wire == 2) {
      for_each_field(bytes, [&](uint32_t nf, uint32_t nw, uint64_t v, std::string_view) {
        if (nw == 0 && nf == 3) f.add_dummy_prefix = v != 0;
        if (nw == 0 && nf == 4) f.remove_extra_whitespaces = v != 0;
        return true;
      });
    }
    return true;
  });
  check(ok, "{}: malformed SentencePiece model", origin);
  return f;
}

class SentencePieceTokenizer final : public tok::TokenizerBase {
 public:
  SentencePieceTokenizer(const VocabSpec& spec, std::unique_ptr<sentencepiece::SentencePieceProcessor> sp,
                         NormalizerFlags flags, std::vector<int32_t> prefix, bool chatglm, bool add_bos)
      : TokenizerBase(spec), sp_(std::move(sp)), flags_(flags), prefix_(std::move(prefix)), chatglm_(chatglm) {
    add_bos_ = add_bos;
    n_pieces_ = sp_->GetPieceSize();
  }

  std::vector<int32_t> encode(std::string_view text, bool add_bos, bool parse_special) const override {
    if (prefix_.empty()) return TokenizerBase::encode(text, add_bos, parse_special);
    // ChatGLM2: the prefix tokens instead of a BOS; no special-token text is parsed (THUDM's
    // tokenizer hands the whole text to sentencepiece and adds its specials by id).
    std::vector<int32_t> out;
    if (add_bos) out = prefix_;
    encode_text(text, true, out);
    return out;
  }

  std::string apply_chat_template(std::span<const ChatMessage> messages, bool add_generation_prompt,
                                  const ChatOptions& options = {}) const override {
    if (chatglm_) {
      if (std::any_of(messages.begin(), messages.end(), [](const ChatMessage& m) {
            return m.role == "tool" || !m.tool_calls.empty();
          }) || !options.tools.empty())
        return render_chatglm2_prompt(tok::generic_tool_conversation(messages, options, "", /*system_ok=*/false),
                                      add_generation_prompt);
      return render_chatglm2_prompt(messages, add_generation_prompt);
    }
    return TokenizerBase::apply_chat_template(messages, add_generation_prompt, options);
  }

 protected:
  void encode_text(std::string_view text, bool, std::vector<int32_t>& out) const override {
    if (text.empty()) return;
    std::vector<int> ids;
    const auto status = sp_->Encode(text, &ids);
    check(status.ok(), "{}: sentencepiece failed to encode: {}", source_, status.ToString());
    out.insert(out.end(), ids.begin(), ids.end());
  }

  std::string piece_bytes(int32_t id) const override {
    const std::string& piece = tokens_[id];
    if (id < n_pieces_ && sp_->IsByte(id)) {
      const int b = byte_value(piece);
      if (b >= 0) return std::string(1, static_cast<char>(b));
    }
    std::string out;
    out.reserve(piece.size());
    for (size_t i = 0; i < piece.size();) {
      if (piece.compare(i, kSpace.size(), kSpace) == 0) {
        out += ' ';
        i += kSpace.size();
      } else {
        out += piece[i++];
      }
    }
    return out;
  }

  // sentencepiece's decoder drops the space of the first piece when the normalizer adds a dummy
  // prefix or removes extra whitespace.
  bool strips_leading_space(int32_t id) const override {
    return (flags_.add_dummy_prefix || flags_.remove_extra_whitespaces) && id < n_pieces_ &&
           tokens_[id].compare(0, kSpace.size(), kSpace) == 0;
  }

 private:
  static int byte_value(const std::string& piece) {  // "<0xNN>"
    if (piece.size() != 6 || piece.compare(0, 3, "<0x") != 0 || piece[5] != '>') return -1;
    int v = 0;
    for (int i = 3; i < 5; ++i) {
      const char c = piece[i];
      v = v * 16 + (c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1000);
    }
    return v >= 0 ? v : -1;
  }

  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  NormalizerFlags flags_;
  std::vector<int32_t> prefix_;
  bool chatglm_;
  int n_pieces_ = 0;
};

std::unique_ptr<Tokenizer> load_sentencepiece(const std::string& dir, const json* config, const HfTokenizerHints& h) {
  const std::string path = dir + "/tokenizer.model";
  auto sp = std::make_unique<sentencepiece::SentencePieceProcessor>();
  const auto status = sp->Load(path);
  check(status.ok(), "{}: not a SentencePiece model ({})", path, status.ToString());
  const NormalizerFlags flags = normalizer_flags(sp->serialized_model_proto(), path);

  VocabSpec spec;
  spec.source = path;
  spec.model = "llama";
  const int n = sp->GetPieceSize();
  check(n > 0, "{}: SentencePiece model has no pieces", path);
  spec.tokens.reserve(n + 8);
  for (int i = 0; i < n; ++i) {
    spec.tokens.push_back(sp->IdToPiece(i));
    // User-defined pieces stay "normal" here: sentencepiece matches them itself inside each run
    // of text, which keeps its dummy-prefix rule exact.
    TokenType t = TokenType::kNormal;
    if (sp->IsControl(i)) t = TokenType::kControl;
    else if (sp->IsUnknown(i)) t = TokenType::kUnknown;
    else if (sp->IsByte(i)) t = TokenType::kByte;
    else if (sp->IsUnused(i)) t = TokenType::kUnused;
    spec.token_types.push_back(static_cast<int32_t>(t));
  }
  spec.bos_id = sp->bos_id();
  spec.eos_id = sp->eos_id();
  spec.unk_id = sp->unk_id();
  spec.chat_template = chat_template(dir, config);

  const std::string tokenizer_class = config != nullptr && config->is_object() ? config->value("tokenizer_class", "") : "";
  const bool chatglm = h.model_type == "chatglm" || tokenizer_class == "ChatGLMTokenizer";
  std::vector<int32_t> prefix;
  bool add_bos = bool_field(config, "add_bos_token").value_or(true);  // LlamaTokenizer's default
  if (chatglm) {
    // tokenization_chatglm.py (ChatGLM2): SPTokenizer appends these after the SentencePiece
    // vocabulary, and get_prefix_tokens() is [gMASK], sop.
    for (const char* name : {"[MASK]", "[gMASK]", "[sMASK]", "sop", "eop"}) {
      spec.tokens.push_back(name);
      spec.token_types.push_back(static_cast<int32_t>(TokenType::kControl));
    }
    prefix = {n + 1, n + 3};
    add_bos = true;
  } else if (config != nullptr && config->is_object() && config->contains("added_tokens_decoder") &&
             config->at("added_tokens_decoder").is_object()) {
    // Tokens added after the SentencePiece vocabulary (e.g. a <pad> at 32000); those inside it
    // are SentencePiece's own.
    std::map<int64_t, std::pair<std::string, bool>> added;
    for (const auto& [key, value] : config->at("added_tokens_decoder").items()) {
      int64_t id = -1;
      try {
        id = std::stoll(key);
      } catch (const std::exception&) {
        fail("{}/tokenizer_config.json: added_tokens_decoder key '{}' is not an id", dir, key);
      }
      if (id < n || !value.is_object() || !value.contains("content") || !value.at("content").is_string()) continue;
      added[id] = {value.at("content").get<std::string>(), value.value("special", true)};
    }
    std::vector<int32_t> types(spec.token_types);
    for (const auto& [id, entry] : added)
      place_token(spec.tokens, types, id, entry.first, entry.second ? TokenType::kControl : TokenType::kUserDefined,
                  dir + "/tokenizer_config.json");
    fill_gaps(spec.tokens, types);
    spec.token_types = types;
  }
  if (const std::string eos = token_string(config, "eos_token"); !eos.empty() && id_of(spec, eos) >= 0)
    spec.eos_id = id_of(spec, eos);
  if (const std::string bos = token_string(config, "bos_token"); !bos.empty() && id_of(spec, bos) >= 0)
    spec.bos_id = id_of(spec, bos);
  if (add_bos) check(spec.bos_id >= 0 || chatglm, "{}: add_bos_token is set but the model has no BOS token", path);
  return std::make_unique<SentencePieceTokenizer>(spec, std::move(sp), flags, std::move(prefix), chatglm, add_bos);
}

// ---- vocab.json + merges.txt (GPT-2 slow format) ----------------------------------------------

std::unique_ptr<Tokenizer> load_gpt2_files(const std::string& dir, const json* config, const HfTokenizerHints& h) {
  const std::string vocab_path = dir + "/vocab.json", merges_path = dir + "/merges.txt";
  const json vocab = read_json_file(vocab_path);
  check(vocab.is_object() && !vocab.empty(), "{}: expected an object of token -> id", vocab_path);
  VocabSpec spec;
  spec.source = vocab_path;
  spec.model = "gpt2";
  spec.pre = "gpt2";
  std::vector<int32_t> types;
  for (const auto& [text, id] : vocab.items()) {
    check(id.is_number_integer(), "{}: token '{}' has id {}, not an integer", vocab_path, text, json_show(id));
    place_token(spec.tokens, types, id.get<int64_t>(), text, TokenType::kNormal, vocab_path);
  }
  // added_tokens.json {text: id} and tokenizer_config.json's added_tokens_decoder.
  const std::string added_path = dir + "/added_tokens.json";
  if (file_exists(added_path)) {
    const json added = read_json_file(added_path);
    check(added.is_object(), "{}: expected an object of token -> id", added_path);
    for (const auto& [text, id] : added.items()) {
      check(id.is_number_integer(), "{}: token '{}' has id {}, not an integer", added_path, text, json_show(id));
      place_token(spec.tokens, types, id.get<int64_t>(), text, TokenType::kControl, added_path);
    }
  }
  if (config != nullptr && config->is_object() && config->contains("added_tokens_decoder") &&
      config->at("added_tokens_decoder").is_object()) {
    for (const auto& [key, value] : config->at("added_tokens_decoder").items()) {
      if (!value.is_object() || !value.contains("content") || !value.at("content").is_string()) continue;
      int64_t id = -1;
      try {
        id = std::stoll(key);
      } catch (const std::exception&) {
        fail("{}/tokenizer_config.json: added_tokens_decoder key '{}' is not an id", dir, key);
      }
      place_token(spec.tokens, types, id, value.at("content").get<std::string>(),
                  value.value("special", true) ? TokenType::kControl : TokenType::kUserDefined,
                  dir + "/tokenizer_config.json");
    }
  }
  fill_gaps(spec.tokens, types);
  // The named special tokens are control tokens (matched in text only with parse_special).
  json special_map;
  if (file_exists(dir + "/special_tokens_map.json")) special_map = read_json_file(dir + "/special_tokens_map.json");
  auto special = [&](const char* key) {
    std::string s = token_string(config, key);
    if (s.empty()) s = token_string(&special_map, key);
    return s;
  };
  for (const char* key : {"bos_token", "eos_token", "unk_token", "pad_token"}) {
    const int32_t id = id_of(spec, special(key));
    if (id >= 0) types[id] = static_cast<int32_t>(TokenType::kControl);
  }
  spec.token_types = types;
  spec.bos_id = id_of(spec, special("bos_token"));
  spec.eos_id = id_of(spec, special("eos_token"));
  spec.unk_id = id_of(spec, special("unk_token"));
  if (spec.bos_id < 0 && h.bos_token_id >= 0 && static_cast<size_t>(h.bos_token_id) < spec.tokens.size())
    spec.bos_id = h.bos_token_id;
  // OPT prepends its BOS (</s>, id 2) to every prompt; GPT2Tokenizer's add_bos_token says so
  // where the config has it.
  spec.add_bos = bool_field(config, "add_bos_token").value_or(h.model_type == "opt");
  if (*spec.add_bos) check(spec.bos_id >= 0, "{}: add_bos_token is set but there is no BOS token", vocab_path);

  std::istringstream merges(read_text_file(merges_path));
  std::string line;
  for (size_t n = 0; std::getline(merges, line); ++n) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (n == 0 && line.rfind("#version", 0) == 0)) continue;
    check(line.find(' ') != std::string::npos && line.find(' ') > 0, "{}: line {} '{}' is not 'left right'",
          merges_path, n + 1, line.substr(0, 40));
    spec.merges.push_back(line);
  }
  spec.chat_template = chat_template(dir, config);
  return Tokenizer::from_vocab(spec);
}

}  // namespace

VocabSpec vocab_from_tokenizer_json(const json& j, const json* config, const std::string& origin) {
  check(j.is_object() && j.contains("model") && j.at("model").is_object(), "{}: no model object", origin);
  const json& model = j.at("model");
  const std::string type = model.value("type", "BPE");
  check(type == "BPE", "{}: tokenizer model '{}' is not supported (supported: BPE)", origin, type);
  const json null_json;
  const json& pre = j.contains("pre_tokenizer") ? j.at("pre_tokenizer") : null_json;
  const json& decoder = j.contains("decoder") ? j.at("decoder") : null_json;
  const bool byte_level_model = is_type(decoder, "ByteLevel") || is_type(pre, "ByteLevel") ||
                                (is_type(pre, "Sequence") && pre.dump().find("\"ByteLevel\"") != std::string::npos);
  check(byte_level_model && !model.value("byte_fallback", false),
        "{}: only byte-level BPE tokenizer.json files are supported (this one is not)", origin);
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const bool set = model.contains(key) && model.at(key).is_string() && !model.at(key).get<std::string>().empty();
    check(!set, "{}: model.{} is not supported", origin, key);
  }
  if (j.contains("normalizer") && !j.at("normalizer").is_null()) {
    // Qwen2's NFC normalizer is skipped, as llama.cpp does; others would change the text.
    check(is_type(j.at("normalizer"), "NFC"), "{}: normalizer {} is not supported", origin,
          json_show(j.at("normalizer")));
  }

  VocabSpec spec;
  spec.source = origin;
  spec.model = "gpt2";
  spec.pre = pre_tokenizer_name(pre, origin);
  const bool ignore_merges = model.value("ignore_merges", false);
  check(ignore_merges == (spec.pre == "llama3"),
        "{}: model.ignore_merges = {} with this pre-tokenizer is not supported (fdpp ignores merges exactly for "
        "Llama 3's)",
        origin, ignore_merges);

  std::vector<int32_t> types;
  check(model.contains("vocab") && model.at("vocab").is_object(), "{}: model.vocab is missing", origin);
  for (const auto& [text, id] : model.at("vocab").items()) {
    check(id.is_number_integer(), "{}: model.vocab['{}'] = {} is not an id", origin, text, json_show(id));
    place_token(spec.tokens, types, id.get<int64_t>(), text, TokenType::kNormal, origin);
  }
  if (j.contains("added_tokens") && j.at("added_tokens").is_array()) {
    for (const json& t : j.at("added_tokens")) {
      check(t.is_object() && t.contains("id") && t.at("id").is_number_integer() && t.contains("content") &&
                t.at("content").is_string(),
            "{}: added_tokens entry {} lacks id or content", origin, json_show(t));
      place_token(spec.tokens, types, t.at("id").get<int64_t>(), t.at("content").get<std::string>(),
                  t.value("special", false) ? TokenType::kControl : TokenType::kUserDefined, origin);
    }
  }
  fill_gaps(spec.tokens, types);
  spec.token_types = std::move(types);

  check(model.contains("merges") && model.at("merges").is_array(), "{}: model.merges is missing", origin);
  for (const json& m : model.at("merges")) {
    if (m.is_string()) {
      spec.merges.push_back(m.get<std::string>());
    } else {
      check(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(),
            "{}: model.merges entry {} is neither 'a b' nor [a, b]", origin, json_show(m));
      spec.merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
    }
  }

  const std::string bos = j.contains("post_processor") ? template_bos(j.at("post_processor")) : "";
  spec.add_bos = !bos.empty();
  spec.bos_id = id_of(spec, bos.empty() ? token_string(config, "bos_token") : bos);
  spec.eos_id = id_of(spec, token_string(config, "eos_token"));
  if (model.contains("unk_token") && model.at("unk_token").is_string())
    spec.unk_id = id_of(spec, model.at("unk_token").get<std::string>());
  return spec;
}

std::string render_chatglm2_prompt(std::span<const ChatMessage> messages, bool add_generation_prompt) {
  std::string out;
  int round = 0;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    const bool user_turn = i % 2 == 0;
    check(m.role == (user_turn ? "user" : "assistant"),
          "chat template (ChatGLM2): roles must alternate user/assistant/user/... (no system role), got '{}' at "
          "message {}",
          m.role, i);
    if (user_turn) {
      out += "[Round " + std::to_string(++round) + "]\n\n问：" + m.content + "\n\n答：";
    } else {
      out += m.content + "\n\n";
    }
  }
  (void)add_generation_prompt;  // the format ends every user turn with the answer prefix "答："
  return out;
}

std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& dir, const HfTokenizerHints& hints) {
  json config_json;
  const json* config = nullptr;
  if (file_exists(dir + "/tokenizer_config.json")) {
    config_json = read_json_file(dir + "/tokenizer_config.json");
    config = &config_json;
  }
  std::unique_ptr<Tokenizer> t;
  const std::string tj_path = dir + "/tokenizer.json";
  bool tokenizer_json_is_byte_level = false;
  json tj;
  if (file_exists(tj_path)) {
    tj = read_json_file(tj_path);
    const std::string dump_decoder = tj.contains("decoder") ? tj.at("decoder").dump() : "";
    const std::string dump_pre = tj.contains("pre_tokenizer") ? tj.at("pre_tokenizer").dump() : "";
    tokenizer_json_is_byte_level = dump_decoder.find("\"ByteLevel\"") != std::string::npos ||
                                   dump_pre.find("\"ByteLevel\"") != std::string::npos;
  }
  if (tokenizer_json_is_byte_level) {
    VocabSpec spec = vocab_from_tokenizer_json(tj, config, tj_path);
    spec.chat_template = chat_template(dir, config);
    if (spec.bos_id < 0 && hints.bos_token_id >= 0 && static_cast<size_t>(hints.bos_token_id) < spec.tokens.size())
      spec.bos_id = hints.bos_token_id;
    if (spec.eos_id < 0 && !hints.eos_token_ids.empty() &&
        static_cast<size_t>(hints.eos_token_ids[0]) < spec.tokens.size())
      spec.eos_id = hints.eos_token_ids[0];
    t = Tokenizer::from_vocab(spec);
  } else if (file_exists(dir + "/tokenizer.model")) {
    t = load_sentencepiece(dir, config, hints);
  } else if (file_exists(dir + "/vocab.json") && file_exists(dir + "/merges.txt")) {
    t = load_gpt2_files(dir, config, hints);
  } else if (file_exists(tj_path)) {
    fail("{}: only byte-level BPE tokenizer.json files are supported, and there is no tokenizer.model", tj_path);
  } else {
    return nullptr;
  }
  return with_end_tokens(std::move(t), hints.eos_token_ids);
}

}  // namespace fdpp
