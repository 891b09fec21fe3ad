// The architectures fdpp runs, one file each in this folder, and the table that finds them.
//
// An architecture's file owns everything that differs between architectures on the way from the
// files to DecoderWeights: its config.json fields (-> ModelConfig), its Hugging Face tensor names,
// and, where llama.cpp writes it, its GGUF metadata keys and tensor names. The mechanics they share
// live beside this folder: model/hf_config.cpp (config.json's common fields, the lookup here),
// model/hf_models.cpp (checking, loading and planning HF tensors), model/gguf_model.cpp (loading
// and planning GGUF tensors), model/model_loader.cpp (from a path to a model).
//
// Adding an architecture: a file here that fills an Architecture, and one line in registry.cpp.
//
//   file        HF architectures (model_type)                       GGUF general.architecture
//   llama.cpp   LlamaForCausalLM (llama), MistralForCausalLM        llama (Mixtral too), mistral
//               (mistral), MixtralForCausalLM (mixtral); SmolLM2
//               and other Llama-layout models
//   opt.cpp     OPTForCausalLM (opt)                                -
//   chatglm.cpp ChatGLMModel (chatglm), ChatGLMForConditionalGeneration -
//   qwen2.cpp   Qwen2ForCausalLM (qwen2): Qwen2, Qwen2.5              qwen2
//   qwen3.cpp   Qwen3ForCausalLM (qwen3): Qwen3 dense,                qwen3, qwen3moe
//               Qwen3MoeForCausalLM (qwen3_moe): Qwen3-MoE
//   gemma.cpp   Gemma2ForCausalLM (gemma2), Gemma3ForCausalLM        gemma2, gemma3
//               (gemma3_text): Gemma 2, Gemma 3 text
//   phi3.cpp    Phi3ForCausalLM (phi3): Phi-3, Phi-3.5, Phi-4          phi3
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <optional>
#include <span>
#include <string>
#include <vector>

#include "fdpp/model_config.h"
#include "model/gguf_model.h"
#include "model/hf_models.h"

namespace fdpp {

namespace gguf {
class GgufFile;
}

// One name config.json's "architectures"[0] may hold, and the model_type that implies it when
// "architectures" is absent (null: none does).
struct HfArchitectureName {
  const char* architecture;
  const char* model_type;
};

struct Architecture {
  const char* family;  // "llama", "opt", "chatglm": the file's name
  // ModelConfig::architecture values the parsers below write ("llama", "mistral").
  std::vector<std::string> config_names;
  std::vector<HfArchitectureName> hf_names;
  std::vector<std::string> gguf_names;  // general.architecture values; empty: no GGUF support

  // config.json (a JSON object) -> the architecture's fields of c; hf_architecture is one of
  // hf_names, model_type as written (may be empty). Every defect is one line naming origin.
  void (*parse_hf_config)(const nlohmann::json& config, const std::string& hf_architecture,
                          const std::string& model_type, const std::string& origin, ModelConfig& c);
  // The tensors an HF checkpoint of config must hold (the source is consulted only where names vary
  // between checkpoints).
  std::vector<HfTensorSpec> (*hf_tensor_specs)(const ModelConfig& config, const WeightSource& source);
  // GGUF metadata -> ModelConfig (validated); null without GGUF support.
  ModelConfig (*gguf_config)(const gguf::GgufFile& file);
  // The tensors a GGUF file of config must hold; null without GGUF support.
  std::vector<GgufTensorSpec> (*gguf_tensor_specs)(const ModelConfig& config);
};

// Every architecture, in the order messages list them.
std::span<const Architecture* const> architectures();

// Lookups; null when no architecture matches.
const Architecture* find_hf_architecture(const std::string& hf_architecture);
const HfArchitectureName* find_hf_model_type(const std::string& model_type);
const Architecture* find_gguf_architecture(const std::string& general_architecture);
const Architecture* find_architecture(const std::string& config_architecture);  // ModelConfig::architecture

// "LlamaForCausalLM, MistralForCausalLM, ..." (the names a model_type implies) and "llama, mistral"
// (GGUF), for messages.
std::string supported_hf_architectures();
std::string supported_gguf_architectures();

// The files' tables.
const Architecture& llama_architecture();
const Architecture& opt_architecture();
const Architecture& chatglm_architecture();
const Architecture& qwen2_architecture();
const Architecture& qwen3_architecture();
const Architecture& gemma_architecture();
const Architecture& phi3_architecture();

// What each file offers on its own (tests call these directly).
// The Llama layout's tensors; an expert layer (ModelConfig::is_moe_layer) gets no MLP here: its
// architecture adds the experts (append_hf_expert_specs).
std::vector<HfTensorSpec> hf_llama_tensor_specs(const ModelConfig& config);
// Hugging Face's per-expert names of an expert layer: model.layers.i.<block>.gate.weight (the
// router) and model.layers.i.<block>.experts.E.<gate|up|down>.weight.
struct HfExpertNames {
  const char* block;  // "block_sparse_moe" (Mixtral), "mlp" (Qwen3-MoE)
  const char* gate;
  const char* up;
  const char* down;
};
void append_hf_expert_specs(std::vector<HfTensorSpec>& specs, const ModelConfig& config, int layer,
                            const HfExpertNames& names);
// Layer i's model.layers.i.self_attn.{q,k,v,o}_proj weights, with the q/k/v biases (qkv_bias) and
// the o bias (out_bias) where the config has them: the Llama layout's, which Gemma shares.
void append_hf_attention_specs(std::vector<HfTensorSpec>& specs, const ModelConfig& config, int layer);
ModelConfig llama_config_from_gguf(const gguf::GgufFile& file);
std::vector<GgufTensorSpec> llama_gguf_tensor_specs(const ModelConfig& config);
DecoderWeights load_llama_gguf(const gguf::GgufFile& file, const ModelConfig& config, const ProgressFn& progress);
WeightPlan plan_llama_gguf(std::shared_ptr<const gguf::GgufFile> file, const ModelConfig& config);
// config.json's rotary embedding (rope_theta, rope_scaling or transformers 5's rope_parameters:
// default, linear, llama3) -> rope (rotary_dim is left to the caller).
void parse_hf_rope(const nlohmann::json& config, const std::string& origin, RopeConfig& rope);
// The Llama layout that other architectures (qwen2.cpp) share, from llama.cpp.
// config.json's fields of the Llama layout (sizes, norm, activation, rope, tying) -> c; the
// caller sets the architecture's name, its biases and anything it adds.
void parse_llama_layout_hf(const nlohmann::json& config, const std::string& origin, ModelConfig& c);
// GGUF metadata under general.architecture's prefix ("llama.", "qwen2.", ...) -> ModelConfig; the
// caller has checked general.architecture.
ModelConfig llama_layout_config_from_gguf(const gguf::GgufFile& file);
// llama.cpp's tensor names; permuted_qk: the converter reordered attn_q/attn_k's rows for its
// adjacent-pair RoPE (Llama, Mistral), which loading undoes; models it converts for NeoX-style
// RoPE (Qwen2) keep Hugging Face's order.
std::vector<GgufTensorSpec> llama_layout_gguf_tensor_specs(const ModelConfig& config, bool permuted_qk);
// Qwen2/Qwen3's sliding window (use_sliding_window, sliding_window, max_window_layers or
// layer_types) -> ModelConfig::layer_windows; empty when no layer's window is shorter than
// max_context.
// config.json's layer_types (transformers' "full_attention" / "sliding_attention" per layer) ->
// whether each layer is a sliding one; nullopt when the key is absent (the caller's own rule).
std::optional<std::vector<bool>> hf_sliding_layer_types(const nlohmann::json& config, const std::string& origin,
                                                        int n_layers);
std::vector<int> qwen_layer_windows(const nlohmann::json& config, const std::string& origin, int n_layers,
                                    int max_context);
std::vector<HfTensorSpec> opt_tensor_specs(const ModelConfig& config, const WeightSource& source);
std::vector<HfTensorSpec> chatglm_tensor_specs(const ModelConfig& config);

}  // namespace fdpp
