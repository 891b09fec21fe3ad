#include "model/hf_quantization.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <regex>

#include "fdpp/error.h"
#include "io/json_file.h"

namespace fdpp {

namespace {

using nlohmann::json;

constexpr const char* kSupported =
    "fdpp loads FP8 checkpoints (quant_method fp8, or compressed-tensors with float 8-bit weights and per-tensor or "
    "per-channel scales) and AWQ (gemm, 4-bit) and GPTQ (4- or 8-bit) checkpoints";

// A list of module names (or null): ignored_layers, modules_to_not_convert, ignore.
void read_names(const json& q, const char* key, const std::string& where, std::vector<std::string>& out) {
  const auto it = q.find(key);
  if (it == q.end() || it->is_null()) return;
  check(it->is_array(), "{}: quantization_config.{} = {} is not a list of module names", where, key, json_show(*it));
  for (const json& n : *it) {
    check(n.is_string(), "{}: quantization_config.{} holds {}, which is not a module name", where, key, json_show(n));
    out.push_back(n.get<std::string>());
  }
}

std::string string_field(const json& o, const char* key, const std::string& where, const std::string& path) {
  const auto it = o.find(key);
  if (it == o.end() || it->is_null()) return "";
  check(it->is_string(), "{}: {}.{} = {} is not a string", where, path, key, json_show(*it));
  return it->get<std::string>();
}

bool is_float_format(const std::string& f) { return f == "float-quantized" || f == "naive-quantized"; }

// One compressed-tensors quantization args object (weights or input_activations): "float 8-bit
// (strategy channel)", "int 4-bit (strategy group)".
std::string args_text(const json& a) {
  const std::string type = a.contains("type") && a["type"].is_string() ? a["type"].get<std::string>() : "?";
  const std::string bits = a.contains("num_bits") ? json_show(a["num_bits"]) : "?";
  const std::string strategy =
      a.contains("strategy") && a["strategy"].is_string() ? a["strategy"].get<std::string>() : "?";
  return fmt::format("{} {}-bit (strategy {})", type, bits, strategy);
}

bool is_float8(const json& a) {
  return a.is_object() && a.contains("type") && a["type"] == "float" && a.contains("num_bits") &&
         a["num_bits"].is_number_integer() && a["num_bits"].get<int64_t>() == 8;
}

void parse_fp8(const json& q, const std::string& where, HfQuantization& h) {
  if (const auto b = q.find("weight_block_size"); b != q.end() && !b->is_null())
    fail(
        "{}: quantization_config.weight_block_size = {} (block-wise FP8 scales) is not supported; fdpp loads FP8 "
        "weights with per-tensor or per-channel scales",
        where, json_show(*b));
  const std::string scheme = string_field(q, "activation_scheme", where, "quantization_config");
  check(scheme.empty() || scheme == "dynamic" || scheme == "static",
        "{}: quantization_config.activation_scheme '{}' is not dynamic or static", where, scheme);
  h.activations = scheme.empty() ? "dynamic" : scheme;
  read_names(q, "ignored_layers", where, h.ignore);
  read_names(q, "modules_to_not_convert", where, h.ignore);
}

void parse_compressed_tensors(const json& q, const std::string& where, HfQuantization& h) {
  h.format = string_field(q, "format", where, "quantization_config");
  check(h.format.empty() || is_float_format(h.format),
        "{}: quantization_config.format '{}' (compressed-tensors) is not supported; {}", where, h.format, kSupported);
  if (const auto s = q.find("sparsity_config"); s != q.end() && !s->is_null() && !s->empty()) {
    const std::string sf =
        s->is_object() ? string_field(*s, "format", where, "quantization_config.sparsity_config") : std::string();
    check(sf == "dense",
          "{}: quantization_config.sparsity_config (format '{}') is not supported; fdpp loads dense "
          "weights",
          where, sf);
  }
  const auto groups = q.find("config_groups");
  check(groups != q.end() && groups->is_object() && !groups->empty(),
        "{}: quantization_config (compressed-tensors) has no config_groups", where);
  for (const auto& [name, g] : groups->items()) {
    const std::string path = "quantization_config.config_groups." + name;
    check(g.is_object(), "{}: {} = {} is not an object", where, path, json_show(g));
    const std::string gf = string_field(g, "format", where, path);
    check(gf.empty() || is_float_format(gf), "{}: {}.format '{}' is not supported; {}", where, path, gf, kSupported);
    const auto w = g.find("weights");
    check(w != g.end() && w->is_object(), "{}: {} quantizes no weights (no weights object); {}", where, path,
          kSupported);
    check(is_float8(*w), "{}: {}.weights: {} weights are not supported; {}", where, path, args_text(*w), kSupported);
    const std::string strategy = string_field(*w, "strategy", where, path + ".weights");
    check(strategy == "tensor" || strategy == "channel",
          "{}: {}.weights: float 8-bit weights with strategy '{}' are not supported (fdpp loads strategy tensor or "
          "channel)",
          where, path, strategy);
    check(!w->value("dynamic", false), "{}: {}.weights.dynamic is true: the checkpoint stores no weight scales", where,
          path);
    h.weight_strategy = h.weight_strategy.empty() || h.weight_strategy == strategy ? strategy : "mixed";
    std::string acts = "none";
    if (const auto a = g.find("input_activations"); a != g.end() && !a->is_null()) {
      check(is_float8(*a), "{}: {}.input_activations: {} activations are not supported; {}", where, path, args_text(*a),
            kSupported);
      acts = a->value("dynamic", false) ? "dynamic" : "static";
    }
    h.activations = h.activations.empty() || h.activations == acts ? acts : "mixed";
  }
  // The KV cache's scales (model/hf_models.h: read_kv_cache_scales): one K and one V number per
  // layer, float 8-bit, as vLLM takes them (strategy attn_head's per-head scales are refused).
  if (const auto kv = q.find("kv_cache_scheme"); kv != q.end() && !kv->is_null()) {
    check(is_float8(*kv), "{}: quantization_config.kv_cache_scheme: {} KV cache quantization is not supported (fdpp "
          "takes float 8-bit K/V scales)", where, args_text(*kv));
    const std::string strategy = string_field(*kv, "strategy", where, "quantization_config.kv_cache_scheme");
    check(strategy == "tensor",
          "{}: quantization_config.kv_cache_scheme: strategy '{}' is not supported (fdpp reads one K and one V scale "
          "per layer: strategy tensor)",
          where, strategy);
  }
  read_names(q, "ignore", where, h.ignore);
}

int int_field(const json& q, const char* key, const std::string& where, int fallback) {
  const auto it = q.find(key);
  if (it == q.end() || it->is_null()) return fallback;
  check(it->is_number_integer(), "{}: quantization_config.{} = {} is not an integer", where, key, json_show(*it));
  return static_cast<int>(it->get<int64_t>());
}

bool bool_field(const json& q, const char* key, const std::string& where, bool fallback) {
  const auto it = q.find(key);
  if (it == q.end() || it->is_null()) return fallback;
  check(it->is_boolean(), "{}: quantization_config.{} = {} is not true or false", where, key, json_show(*it));
  return it->get<bool>();
}

void parse_group_size(const json& q, const std::string& where, HfQuantization& h) {
  h.group_size = int_field(q, "group_size", where, 128);
  check(h.group_size == -1 || (h.group_size > 0 && h.group_size % 8 == 0),
        "{}: quantization_config.group_size = {} is not supported (a positive multiple of 8, or -1)", where,
        h.group_size);
}

void parse_awq(const json& q, const std::string& where, HfQuantization& h) {
  h.bits = int_field(q, "bits", where, int_field(q, "w_bit", where, 4));
  check(h.bits == 4, "{}: quantization_config.bits = {}: fdpp loads 4-bit AWQ checkpoints", where, h.bits);
  const std::string version = string_field(q, "version", where, "quantization_config");
  check(version.empty() || version == "gemm" || version == "GEMM",
        "{}: quantization_config.version '{}' (AWQ) is not supported; fdpp loads AutoAWQ's gemm layout", where,
        version);
  check(bool_field(q, "zero_point", where, true),
        "{}: quantization_config.zero_point is false; fdpp loads AWQ checkpoints with zero points", where);
  if (q.contains("q_group_size") && !q.contains("group_size")) {
    json g = q;
    g["group_size"] = q["q_group_size"];
    parse_group_size(g, where, h);
  } else {
    parse_group_size(q, where, h);
  }
  read_names(q, "modules_to_not_convert", where, h.ignore);
}

void parse_gptq(const json& q, const std::string& where, HfQuantization& h) {
  h.bits = int_field(q, "bits", where, 4);
  check(h.bits == 4 || h.bits == 8, "{}: quantization_config.bits = {}: fdpp loads 4- and 8-bit GPTQ checkpoints",
        where, h.bits);
  parse_group_size(q, where, h);
  h.act_order = bool_field(q, "desc_act", where, false);
  const std::string format = string_field(q, "checkpoint_format", where, "quantization_config");
  check(format.empty() || format == "gptq" || format == "gptq_v2",
        "{}: quantization_config.checkpoint_format '{}' is not supported (gptq or gptq_v2)", where, format);
  h.zeros_minus_one = format != "gptq_v2";
  h.quantized_lm_head = bool_field(q, "lm_head", where, false);
  read_names(q, "modules_to_not_convert", where, h.ignore);
}

}  // namespace

HfQuantization parse_hf_quantization(const json& config, const std::string& origin) {
  HfQuantization h;
  const auto it = config.find("quantization_config");
  if (it == config.end() || it->is_null()) return h;
  const json& q = *it;
  check(q.is_object(), "{}: quantization_config = {} is not an object", origin, json_show(q));
  const std::string method = string_field(q, "quant_method", origin, "quantization_config");
  check(!method.empty(), "{}: quantization_config has no quant_method", origin);
  h.quant_method = method;
  if (method == "fp8") {
    parse_fp8(q, origin, h);
  } else if (method == "compressed-tensors") {
    parse_compressed_tensors(q, origin, h);
  } else if (method == "awq") {
    parse_awq(q, origin, h);
  } else if (method == "gptq") {
    parse_gptq(q, origin, h);
  } else {
    fail("{}: quantization_config.quant_method '{}' is not supported; {}", origin, method, kSupported);
  }
  h.packed_int = method == "awq" || method == "gptq";
  h.fp8 = !h.packed_int;
  // Every pattern is compiled once here, so that a bad one is an error at load, not at first use.
  for (const std::string& n : h.ignore) {
    if (!n.starts_with("re:")) continue;
    try {
      std::regex re(n.substr(3));
    } catch (const std::regex_error&) {
      fail("{}: quantization_config ignore pattern '{}' is not a valid regular expression", origin, n);
    }
  }
  return h;
}

std::string HfQuantization::describe() const {
  if (packed_int) {
    std::string s = fmt::format("{} ({}-bit, ", quant_method, bits);
    s += group_size > 0 ? fmt::format("group {}", group_size) : std::string("one group per matrix");
    if (act_order) s += ", act-order";
    if (quantized_lm_head) s += ", lm head quantized";
    return s + ")";
  }
  if (!fp8) return "";
  std::string s = "fp8 (" + (quant_method == "fp8" ? std::string("quant_method fp8") : quant_method);
  if (!format.empty()) s += " " + format;
  if (weight_strategy == "tensor")
    s += ", per-tensor weight scales";
  else if (weight_strategy == "channel")
    s += ", per-channel weight scales";
  else if (weight_strategy == "mixed")
    s += ", per-tensor and per-channel weight scales";
  // fdpp quantizes activations per token at run time (backend/cuda/fp8.h).
  if (activations == "static") s += ", static input scales unused";
  return s + ")";
}

bool HfQuantization::ignored(std::string_view module) const {
  for (const std::string& n : ignore) {
    if (!n.starts_with("re:")) {
      if (n == module) return true;
      continue;
    }
    // compressed-tensors matches "re:" patterns with Python's re.match: anchored at the start only.
    const std::regex re(n.substr(3));
    const std::string m(module);
    if (std::regex_search(m, re, std::regex_constants::match_continuous)) return true;
  }
  return false;
}

}  // namespace fdpp
