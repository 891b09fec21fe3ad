// Qwen2 and Qwen2.5: the Llama layout (llama.cpp's parsing and tensor names are reused) with
// biases on q, k and v and none on o or the MLP; rope_theta is set by the config (large in the
// released models); the small sizes tie the lm head to the embeddings.
//
// Hugging Face (Qwen2ForCausalLM, model_type qwen2): Llama's tensor names plus
// self_attn.{q,k,v}_proj.bias. Qwen2's modelling code always has those biases, so config.json
// has no attention_bias key.
//
// Sliding window: transformers applies sliding_window only when use_sliding_window is true, and
// then only on the layers that layer_types marks "sliding_attention" (without layer_types: the
// layers from max_window_layers on). Every released Qwen2.5 config has use_sliding_window false,
// so its sliding_window is ignored, as transformers ignores it. When it is on, those layers get
// ModelConfig::layer_windows (each token attends to the last sliding_window positions).
//
// GGUF (general.architecture qwen2): llama.cpp's Llama tensor names with attn_{q,k,v}.bias; its
// converter keeps Hugging Face's row order for q and k (llama.cpp runs Qwen2 with NeoX-style
// RoPE, which is rotate-half), so nothing is unpermuted.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <optional>

#include "fdpp/error.h"
#include "io/gguf.h"
#include "io/json_file.h"
#include "model/arch/architecture.h"

namespace fdpp {

namespace {

using nlohmann::json;

// Qwen2Config's defaults where config.json omits a key.
constexpr int kDefaultMaxPositions = 32768;
constexpr int kDefaultMaxWindowLayers = 28;

// Whether layer i attends over the window: layer_types when given, else from max_window_layers on.
std::vector<bool> sliding_layers(const json& j, const JsonFields& f, int n_layers) {
  std::vector<bool> out(static_cast<size_t>(n_layers), false);
  if (auto types = hf_sliding_layer_types(j, f.origin(), n_layers)) return *types;
  const double from = f.number_or("max_window_layers", kDefaultMaxWindowLayers);
  check(from >= 0 && from == static_cast<double>(static_cast<int64_t>(from)),
        "{}: max_window_layers = {} is not a layer count", f.origin(), from);
  for (int i = static_cast<int>(std::min<double>(from, n_layers)); i < n_layers; ++i) out[static_cast<size_t>(i)] = true;
  return out;
}

void parse_hf(const json& j, const std::string&, const std::string&, const std::string& origin, ModelConfig& c) {
  const JsonFields f(j, origin);
  parse_llama_layout_hf(j, origin, c);
  if (!f.has("max_position_embeddings")) c.max_context = kDefaultMaxPositions;
  c.architecture = "qwen2";
  c.qkv_bias = true;
  c.out_bias = false;
  c.mlp_bias = false;
  c.layer_windows = qwen_layer_windows(j, origin, c.n_layers, c.max_context);
}

ModelConfig config_from_gguf(const gguf::GgufFile& f) {
  const std::string a = f.get_string("general.architecture");
  check(a == "qwen2", "{}: unsupported architecture '{}' (supported: qwen2)", f.path(), a);
  return llama_layout_config_from_gguf(f);
}

}  // namespace

std::optional<std::vector<bool>> hf_sliding_layer_types(const nlohmann::json& j, const std::string& origin,
                                                        int n_layers) {
  if (!j.contains("layer_types") || j.at("layer_types").is_null()) return std::nullopt;
  const nlohmann::json& types = j.at("layer_types");
  check(types.is_array() && types.size() == static_cast<size_t>(n_layers),
        "{}: layer_types = {} is not a list of num_hidden_layers = {} names", origin, json_show(types), n_layers);
  std::vector<bool> out(static_cast<size_t>(n_layers));
  for (int i = 0; i < n_layers; ++i) {
    const nlohmann::json& t = types[static_cast<size_t>(i)];
    check(t.is_string() && (t == "full_attention" || t == "sliding_attention"),
          "{}: layer_types[{}] = {} is not supported (supported: full_attention, sliding_attention)", origin, i,
          json_show(t));
    out[static_cast<size_t>(i)] = t == "sliding_attention";
  }
  return out;
}

std::vector<int> qwen_layer_windows(const nlohmann::json& j, const std::string& origin, int n_layers, int max_context) {
  const JsonFields f(j, origin);
  if (!f.boolean_or("use_sliding_window", false) || !f.has("sliding_window"))
    return {};
  const int window = f.positive("sliding_window");
  // A window at least as long as the context never drops a key: full attention is exact.
  if (window >= max_context) return {};
  std::vector<int> windows(static_cast<size_t>(n_layers), 0);
  const std::vector<bool> sliding = sliding_layers(j, f, n_layers);
  bool any = false;
  for (int i = 0; i < n_layers; ++i)
    if (sliding[static_cast<size_t>(i)]) windows[static_cast<size_t>(i)] = window, any = true;
  if (!any) windows.clear();
  return windows;
}

const Architecture& qwen2_architecture() {
  static const Architecture kQwen2{
      .family = "qwen2",
      .config_names = {"qwen2"},
      .hf_names = {{"Qwen2ForCausalLM", "qwen2"}},
      .gguf_names = {"qwen2"},
      .parse_hf_config = parse_hf,
      .hf_tensor_specs = [](const ModelConfig& c, const WeightSource&) { return hf_llama_tensor_specs(c); },
      .gguf_config = config_from_gguf,
      .gguf_tensor_specs = [](const ModelConfig& c) { return llama_layout_gguf_tensor_specs(c, false); },
  };
  return kQwen2;
}

}  // namespace fdpp
