#include <array>

#include "model/arch/architecture.h"

namespace fdpp {

std::span<const Architecture* const> architectures() {
  static const std::array<const Architecture*, 7> kAll = {&llama_architecture(), &qwen2_architecture(),
                                                          &qwen3_architecture(), &gemma_architecture(),
                                                          &phi3_architecture(), &opt_architecture(),
                                                          &chatglm_architecture()};
  return kAll;
}

const Architecture* find_hf_architecture(const std::string& hf_architecture) {
  for (const Architecture* a : architectures())
    for (const HfArchitectureName& n : a->hf_names)
      if (hf_architecture == n.architecture) return a;
  return nullptr;
}

const HfArchitectureName* find_hf_model_type(const std::string& model_type) {
  for (const Architecture* a : architectures())
    for (const HfArchitectureName& n : a->hf_names)
      if (n.model_type != nullptr && model_type == n.model_type) return &n;
  return nullptr;
}

const Architecture* find_gguf_architecture(const std::string& general_architecture) {
  for (const Architecture* a : architectures())
    for (const std::string& n : a->gguf_names)
      if (general_architecture == n) return a;
  return nullptr;
}

const Architecture* find_architecture(const std::string& config_architecture) {
  for (const Architecture* a : architectures())
    for (const std::string& n : a->config_names)
      if (config_architecture == n) return a;
  return nullptr;
}

std::string supported_hf_architectures() {
  std::string s;
  for (const Architecture* a : architectures())
    for (const HfArchitectureName& n : a->hf_names)
      if (n.model_type != nullptr) s += (s.empty() ? "" : ", ") + std::string(n.architecture);
  return s;
}

std::string supported_gguf_architectures() {
  std::string s;
  for (const Architecture* a : architectures())
    for (const std::string& n : a->gguf_names) s += (s.empty() ? "" : ", ") + n;
  return s;
}

}  // namespace fdpp
