// Hugging Face model directories: config.json (+ generation_config.json) -> ModelConfig.
//
// The fields every architecture shares are read here (architectures / model_type, dtype, name,
// eos and bos ids); the architecture, found by "architectures"[0] (else "model_type") in the
// table of model/arch/architecture.h, reads the rest. Every defect is one line naming the file and
// field: "DIR/config.json: num_attention_heads is missing", "... = 0 must be positive",
// "unsupported architecture 'X' (supported: ...)".
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "fdpp/model_config.h"
#include "io/json_file.h"
#include "model/hf_quantization.h"

namespace fdpp {

struct HfConfig {
  std::string directory;
  std::string config_path;      // DIR/config.json (the origin in error messages)
  std::string hf_architecture;  // "LlamaForCausalLM", ... (architectures[0], or derived from model_type)
  std::string model_type;       // "llama", "mistral", "qwen2", "opt", "chatglm"
  std::string dtype;            // torch_dtype / dtype as written ("float16", ...); empty when absent
  ModelConfig config;           // config.architecture: "llama", "mistral", "qwen2", "opt" or "chatglm"
  // End-of-generation ids: config.json's eos_token_id, then generation_config.json's (an int or a
  // list in either), without repeats.
  std::vector<int32_t> eos_token_ids;
  int32_t bos_token_id = -1;  // config.json / generation_config.json; -1 when absent
  HfQuantization quantization;  // quantization_config (FP8 checkpoints); fp8 false when absent
};

// True when path is a directory holding config.json.
bool is_hf_directory(const std::string& path);

// Parses already-loaded JSON. generation may be null (no generation_config.json). origin names
// config.json in messages; directory is recorded as is.
HfConfig parse_hf_config(const nlohmann::json& config, const nlohmann::json* generation, const std::string& directory,
                         const std::string& origin);

// Reads DIR/config.json and, when present, DIR/generation_config.json.
HfConfig read_hf_config(const std::string& directory);

}  // namespace fdpp
