#include "io/hf_config.h"

#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "fdpp/error.h"

namespace fdpp {

namespace {

using nlohmann::json;

// A value as it appears in a message: short, one line.
std::string show(const json& v) {
  std::string s = v.dump(-1, ' ', true, json::error_handler_t::replace);
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

// Typed access to one JSON object with one-line errors naming the file and the field.
class Fields {
 public:
  Fields(const json& j, std::string origin, std::string prefix = "")
      : j_(j), origin_(std::move(origin)), prefix_(std::move(prefix)) {}

  bool has(const char* key) const { return j_.contains(key) && !j_.at(key).is_null(); }
  const json& at(const char* key) const {
    check(has(key), "{}: {}{} is missing", origin_, prefix_, key);
    return j_.at(key);
  }

  int64_t integer(const char* key) const {
    const json& v = at(key);
    if (v.is_number_integer()) return v.get<int64_t>();
    if (v.is_number_float()) {
      const double d = v.get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e15) return static_cast<int64_t>(d);
    }
    fail("{}: {}{} = {} is not an integer", origin_, prefix_, key, show(v));
  }
  // A size: required, in [1, 2^30].
  int positive(const char* key) const {
    const int64_t v = integer(key);
    check(v > 0, "{}: {}{} = {} must be positive", origin_, prefix_, key, v);
    check(v <= (int64_t{1} << 30), "{}: {}{} = {} is out of range", origin_, prefix_, key, v);
    return static_cast<int>(v);
  }
  int positive_or(const char* key, int fallback) const { return has(key) ? positive(key) : fallback; }

  double number(const char* key) const {
    const json& v = at(key);
    check(v.is_number(), "{}: {}{} = {} is not a number", origin_, prefix_, key, show(v));
    const double d = v.get<double>();
    check(std::isfinite(d), "{}: {}{} = {} is not finite", origin_, prefix_, key, show(v));
    return d;
  }
  double number_or(const char* key, double fallback) const { return has(key) ? number(key) : fallback; }

  bool boolean_or(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    const json& v = j_.at(key);
    check(v.is_boolean(), "{}: {}{} = {} is not true or false", origin_, prefix_, key, show(v));
    return v.get<bool>();
  }

  std::string string_or(const char* key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    const json& v = j_.at(key);
    check(v.is_string(), "{}: {}{} = {} is not a string", origin_, prefix_, key, show(v));
    return v.get<std::string>();
  }

  const std::string& origin() const { return origin_; }

 private:
  const json& j_;
  std::string origin_;
  std::string prefix_;
};

// eos_token_id / bos_token_id: an int, a list of ints, or null.
void collect_ids(const json& j, const char* key, const std::string& origin, std::vector<int32_t>& out) {
  if (!j.contains(key) || j.at(key).is_null()) return;
  const json& v = j.at(key);
  auto add = [&](const json& x) {
    check(x.is_number_integer() && x.get<int64_t>() >= 0 && x.get<int64_t>() <= INT32_MAX,
          "{}: {} holds {}, which is not a token id", origin, key, show(x));
    const auto id = static_cast<int32_t>(x.get<int64_t>());
    if (std::find(out.begin(), out.end(), id) == out.end()) out.push_back(id);
  };
  if (v.is_array()) {
    for (const json& x : v) add(x);
  } else {
    add(v);
  }
}

// The rotary embedding of Llama-style configs, from either shape of config.json.
void parse_rope(const json& j, const std::string& origin, RopeConfig& rope) {
  const Fields top(j, origin);
  std::string type = "default";
  const json* params = nullptr;
  std::string prefix;
  if (top.has("rope_parameters")) {  // transformers 5
    params = &j.at("rope_parameters");
    check(params->is_object(), "{}: rope_parameters = {} is not an object", origin, show(*params));
    prefix = "rope_parameters.";
    const Fields p(*params, origin, prefix);
    rope.theta = p.number_or("rope_theta", top.number_or("rope_theta", 10000.0));
  } else {
    rope.theta = top.number_or("rope_theta", 10000.0);
    if (top.has("rope_scaling")) {
      params = &j.at("rope_scaling");
      check(params->is_object(), "{}: rope_scaling = {} is not an object", origin, show(*params));
      prefix = "rope_scaling.";
    }
  }
  check(rope.theta > 0, "{}: rope_theta = {} must be positive", origin, rope.theta);
  if (params == nullptr) return;
  const Fields p(*params, origin, prefix);
  // "rope_type" (current) or "type" (older configs).
  type = p.string_or("rope_type", p.string_or("type", "default"));
  if (p.has("partial_rotary_factor")) {
    const double f = p.number("partial_rotary_factor");
    check(f == 1.0, "{}: {}partial_rotary_factor = {} is not supported for this architecture", origin, prefix, f);
  }
  if (type == "default") return;
  if (type == "linear") {
    rope.scaling = RopeScaling::Linear;
    rope.factor = p.number("factor");
  } else if (type == "llama3") {
    rope.scaling = RopeScaling::Llama3;
    rope.factor = p.number("factor");
    rope.low_freq_factor = p.number("low_freq_factor");
    rope.high_freq_factor = p.number("high_freq_factor");
    rope.original_max_positions = p.positive("original_max_position_embeddings");
    check(rope.high_freq_factor > rope.low_freq_factor,
          "{}: {}high_freq_factor = {} must exceed low_freq_factor = {}", origin, prefix, rope.high_freq_factor,
          rope.low_freq_factor);
    check(rope.low_freq_factor > 0, "{}: {}low_freq_factor = {} must be positive", origin, prefix,
          rope.low_freq_factor);
  } else {
    fail("{}: {}rope_type '{}' is not supported (supported: default, linear, llama3)", origin, prefix, type);
  }
  check(rope.factor >= 1, "{}: {}factor = {} must be >= 1", origin, prefix, rope.factor);
}

// hidden / heads when head_dim is not given; the heads must divide hidden then.
int derived_head_dim(const Fields& f, int hidden, int heads, const char* hidden_key, const char* heads_key) {
  if (f.has("head_dim")) return f.positive("head_dim");
  check(hidden % heads == 0, "{}: {} = {} is not a multiple of {} = {}", f.origin(), hidden_key, hidden, heads_key,
        heads);
  return hidden / heads;
}

void parse_llama(const json& j, const std::string& origin, bool mistral, ModelConfig& c) {
  const Fields f(j, origin);
  c.architecture = mistral ? "mistral" : "llama";
  c.hidden = f.positive("hidden_size");
  c.n_layers = f.positive("num_hidden_layers");
  c.n_heads = f.positive("num_attention_heads");
  c.n_kv_heads = f.positive_or("num_key_value_heads", c.n_heads);
  check(c.n_heads % c.n_kv_heads == 0, "{}: num_attention_heads = {} is not a multiple of num_key_value_heads = {}",
        origin, c.n_heads, c.n_kv_heads);
  c.head_dim = derived_head_dim(f, c.hidden, c.n_heads, "hidden_size", "num_attention_heads");
  c.ffn_hidden = f.positive("intermediate_size");
  c.vocab_size = f.positive("vocab_size");
  c.max_context = f.positive_or("max_position_embeddings", 2048);
  c.norm_eps = f.number_or("rms_norm_eps", 1e-6);
  const std::string act = f.string_or("hidden_act", "silu");
  check(act == "silu", "{}: hidden_act = '{}' is not supported (supported: silu)", origin, act);
  c.tied_embeddings = f.boolean_or("tie_word_embeddings", false);
  c.qkv_bias = c.out_bias = f.boolean_or("attention_bias", false);
  c.mlp_bias = f.boolean_or("mlp_bias", false);
  if (mistral && f.has("sliding_window")) {
    // Attention over a sliding window equals full attention while the context fits in the window;
    // fdpp has no windowed attention, so the context is capped there.
    c.max_context = std::min(c.max_context, f.positive("sliding_window"));
  }
  c.norm = NormType::RMSNorm;
  c.activation = Activation::SwiGLU;
  c.position = PositionEncoding::Rope;
  c.rope_style = RopeStyle::RotateHalf;
  parse_rope(j, origin, c.rope);
  c.rope.rotary_dim = c.head_dim;
}

void parse_opt(const json& j, const std::string& origin, ModelConfig& c) {
  const Fields f(j, origin);
  c.architecture = "opt";
  c.hidden = f.positive("hidden_size");
  c.n_layers = f.positive("num_hidden_layers");
  c.n_heads = f.positive("num_attention_heads");
  c.n_kv_heads = c.n_heads;
  check(c.hidden % c.n_heads == 0, "{}: hidden_size = {} is not a multiple of num_attention_heads = {}", origin,
        c.hidden, c.n_heads);
  c.head_dim = c.hidden / c.n_heads;
  c.ffn_hidden = f.positive("ffn_dim");
  c.vocab_size = f.positive("vocab_size");
  c.max_context = f.positive("max_position_embeddings");
  const std::string act = f.string_or("activation_function", "relu");
  check(act == "relu", "{}: activation_function = '{}' is not supported (supported: relu)", origin, act);
  check(f.boolean_or("layer_norm_elementwise_affine", true),
        "{}: layer_norm_elementwise_affine = false is not supported (LayerNorms without weight and bias)", origin);
  const int proj = f.positive_or("word_embed_proj_dim", c.hidden);
  c.embed_dim = proj == c.hidden ? 0 : proj;
  c.pre_norm = f.boolean_or("do_layer_norm_before", true);
  c.final_norm = c.pre_norm && !f.boolean_or("_remove_final_layer_norm", false);
  c.tied_embeddings = f.boolean_or("tie_word_embeddings", true);
  c.qkv_bias = c.out_bias = c.mlp_bias = f.boolean_or("enable_bias", true);
  c.norm = NormType::LayerNorm;
  c.norm_bias = true;
  c.norm_eps = 1e-5;  // torch.nn.LayerNorm's default; OPT's config has no field for it
  c.activation = Activation::ReLU;
  c.position = PositionEncoding::Learned;
  c.learned_position_offset = 2;  // OPTLearnedPositionalEmbedding.offset
}

// THUDM's ChatGLM2-6B (modeling_chatglm.py): the fields it reads, and a rejection for every
// setting whose code path fdpp does not implement.
void parse_chatglm(const json& j, const std::string& origin, ModelConfig& c) {
  const Fields f(j, origin);
  c.architecture = "chatglm";
  check(!f.has("position_encoding_2d") && !f.has("inner_hidden_size"),
        "{}: this is a ChatGLM-6B (first generation) config; only the ChatGLM2 layout is supported", origin);
  auto require = [&](const char* key, bool fallback, bool wanted, const char* why) {
    const bool v = f.boolean_or(key, fallback);
    check(v == wanted, "{}: {} = {} is not supported ({})", origin, key, v, why);
  };
  require("multi_query_attention", false, true, "fdpp implements ChatGLM2's grouped-query layout only");
  require("rmsnorm", true, true, "LayerNorm variant not implemented");
  require("apply_residual_connection_post_layernorm", false, false, "residual after the norm not implemented");
  require("post_layer_norm", true, true, "a final norm is expected");
  require("original_rope", true, true, "only the original rotary embedding is implemented");
  require("add_bias_linear", false, false, "biases on dense / MLP layers not implemented");
  if (f.has("rope_ratio")) {
    const double r = f.number("rope_ratio");
    check(r == 1.0, "{}: rope_ratio = {} is not supported (only 1)", origin, r);
  }
  check(!f.has("pre_seq_len"), "{}: pre_seq_len is set (P-tuning prefix), which is not supported", origin);
  if (f.has("quantization_bit")) {
    const int64_t q = f.integer("quantization_bit");
    check(q == 0, "{}: quantization_bit = {} is not supported (only unquantized checkpoints)", origin, q);
  }
  c.n_layers = f.positive("num_layers");
  c.hidden = f.positive("hidden_size");
  c.n_heads = f.positive("num_attention_heads");
  c.n_kv_heads = f.positive("multi_query_group_num");
  check(c.n_heads % c.n_kv_heads == 0, "{}: num_attention_heads = {} is not a multiple of multi_query_group_num = {}",
        origin, c.n_heads, c.n_kv_heads);
  if (f.has("kv_channels")) {
    c.head_dim = f.positive("kv_channels");
  } else {
    check(c.hidden % c.n_heads == 0, "{}: hidden_size = {} is not a multiple of num_attention_heads = {}", origin,
          c.hidden, c.n_heads);
    c.head_dim = c.hidden / c.n_heads;
  }
  check(c.head_dim % 4 == 0, "{}: kv_channels = {} must be a multiple of 4 (half of each head rotates, in pairs)",
        origin, c.head_dim);
  c.ffn_hidden = f.positive("ffn_hidden_size");
  c.vocab_size = f.positive("padded_vocab_size");
  c.max_context = f.positive("seq_length");
  c.norm_eps = f.number_or("layernorm_epsilon", 1e-5);
  c.qkv_bias = f.boolean_or("add_qkv_bias", false);
  c.tied_embeddings = false;  // transformer.output_layer is always its own matrix
  c.norm = NormType::RMSNorm;
  c.activation = Activation::SwiGLU;
  c.position = PositionEncoding::Rope;
  c.rope_style = RopeStyle::Interleaved;
  c.rope.theta = 10000.0;
  c.rope.rotary_dim = c.head_dim / 2;  // RotaryEmbedding(kv_channels // 2): the first half of each head
}

const char* kSupported = "LlamaForCausalLM, MistralForCausalLM, OPTForCausalLM, ChatGLMModel";

bool exists(const std::string& path, bool want_dir) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return false;
  return want_dir ? S_ISDIR(st.st_mode) : S_ISREG(st.st_mode);
}

}  // namespace

bool is_hf_directory(const std::string& path) { return exists(path, true) && exists(path + "/config.json", false); }

json read_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  check(in.good(), "{}: cannot open", path);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  check(text.size() <= (size_t{64} << 20), "{}: {} bytes is too large for a JSON config", path, text.size());
  try {
    return json::parse(text);
  } catch (const json::parse_error& e) {
    std::string what = e.what();
    std::replace(what.begin(), what.end(), '\n', ' ');
    fail("{}: not valid JSON ({})", path, what);
  }
}

HfConfig parse_hf_config(const json& j, const json* generation, const std::string& directory,
                         const std::string& origin) {
  check(j.is_object(), "{}: expected a JSON object, got {}", origin, show(j));
  const Fields f(j, origin);
  HfConfig h;
  h.directory = directory;
  h.config_path = origin;
  h.model_type = f.string_or("model_type", "");
  if (f.has("architectures")) {
    const json& a = j.at("architectures");
    check(a.is_array() && !a.empty() && a[0].is_string(), "{}: architectures = {} is not a list of names", origin,
          show(a));
    h.hf_architecture = a[0].get<std::string>();
  } else if (h.model_type == "llama") {
    h.hf_architecture = "LlamaForCausalLM";
  } else if (h.model_type == "mistral") {
    h.hf_architecture = "MistralForCausalLM";
  } else if (h.model_type == "opt") {
    h.hf_architecture = "OPTForCausalLM";
  } else if (h.model_type == "chatglm") {
    h.hf_architecture = "ChatGLMModel";
  } else {
    fail("{}: neither architectures nor a known model_type ('{}') says what the model is (supported: {})", origin,
         h.model_type, kSupported);
  }
  const std::string& a = h.hf_architecture;
  ModelConfig& c = h.config;
  if (a == "LlamaForCausalLM" || a == "MistralForCausalLM") {
    parse_llama(j, origin, a == "MistralForCausalLM", c);
  } else if (a == "OPTForCausalLM") {
    parse_opt(j, origin, c);
  } else if (a == "ChatGLMModel" || a == "ChatGLMForConditionalGeneration") {
    check(h.model_type.empty() || h.model_type == "chatglm", "{}: architecture {} with model_type '{}' is not supported",
          origin, a, h.model_type);
    parse_chatglm(j, origin, c);
  } else {
    fail("{}: unsupported architecture '{}' (supported: {})", origin, a, kSupported);
  }
  h.dtype = f.string_or("dtype", f.string_or("torch_dtype", ""));
  c.name = f.string_or("_name_or_path", "");
  if (c.name.empty()) {
    std::string d = directory;
    while (d.size() > 1 && d.back() == '/') d.pop_back();
    const size_t slash = d.rfind('/');
    c.name = slash == std::string::npos ? d : d.substr(slash + 1);
  }

  collect_ids(j, "eos_token_id", origin, h.eos_token_ids);
  std::vector<int32_t> bos;
  collect_ids(j, "bos_token_id", origin, bos);
  if (generation != nullptr) {
    const std::string gen_origin = directory + "/generation_config.json";
    check(generation->is_object(), "{}: expected a JSON object", gen_origin);
    collect_ids(*generation, "eos_token_id", gen_origin, h.eos_token_ids);
    if (bos.empty()) collect_ids(*generation, "bos_token_id", gen_origin, bos);
  }
  if (!bos.empty()) h.bos_token_id = bos[0];

  validate(c, origin);
  return h;
}

HfConfig read_hf_config(const std::string& directory) {
  const std::string path = directory + "/config.json";
  check(exists(path, false), "{}: no config.json (not a Hugging Face model directory)", directory);
  const json config = read_json_file(path);
  const std::string gen_path = directory + "/generation_config.json";
  if (exists(gen_path, false)) {
    const json generation = read_json_file(gen_path);
    return parse_hf_config(config, &generation, directory, path);
  }
  return parse_hf_config(config, nullptr, directory, path);
}

}  // namespace fdpp
