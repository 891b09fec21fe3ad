// From a path on disk to a runnable model: resolves the default model, recognizes the format (a
// GGUF file, or a Hugging Face model directory: config.json + safetensors / PyTorch .bin +
// tokenizer files), describes and validates the model without reading weights (fdpp info), and
// loads it. The architecture comes from the table in model/arch/architecture.h.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "fdpp/model_config.h"
#include "model/decoder.h"
#include "model/weight_plan.h"
#include "tokenizer/tokenizer.h"

namespace fdpp {

namespace gguf {
class GgufFile;
}

struct TensorDescription {
  std::string name;
  std::vector<int64_t> shape;
  std::string dtype;   // as stored: "Q4_1", "F32", ...
  uint64_t bytes = 0;  // as stored
};

struct ModelDescription {
  std::string path;
  std::string format;  // "gguf", or for an HF directory "safetensors" / "pytorch"
  ModelConfig config;
  std::vector<TensorDescription> tensors;  // the ones the model uses, validated
  uint64_t n_params = 0;
  uint64_t stored_bytes = 0;                // weights as stored in the file
  std::map<std::string, int> dtype_counts;  // stored dtype -> tensor count
  // A quantized HF checkpoint's format, one line (HfQuantization::describe: "fp8 (compressed-tensors
  // float-quantized, per-channel weight scales)"); empty otherwise.
  std::string quantization;
  // HF directories: config.json's / generation_config.json's ids (what a checkpoint without
  // tokenizer files still knows: Tokenizer::ids_only); -1 / empty when absent, and for GGUF.
  std::vector<int32_t> eos_token_ids;
  int32_t bos_token_id = -1;
};

// The default model: $FDPP_MODEL, else the file scripts/fetch-default-model.sh puts in the cache
// (${FDPP_CACHE:-${XDG_CACHE_HOME:-~/.cache}/fdpp}/models/SmolLM2-135M-Instruct.Q4_1.gguf).
std::string default_model_path();
// An empty path means the default model; a missing default gives an error saying how to fetch it.
std::string resolve_model_path(const std::string& path);

// Parses and validates the whole model description (metadata against tensor names, shapes and
// types, and everything against the file size) without reading weights.
ModelDescription describe_model(const std::string& path);

struct LoadedModel {
  ModelDescription description;
  DecoderWeights weights;
  // Null only for an HF directory without tokenizer files (a bare checkpoint): token ids work,
  // text does not.
  std::unique_ptr<Tokenizer> tokenizer;
  const ModelConfig& config() const { return description.config; }
};

struct LoadOptions {
  // F32 (default): every weight dequantized to fp32, as the reference path, calibration and the
  // CUDA upload need. Stored: a GGUF's weight matrices stay in the mapped file in their stored
  // format for the CPU fast path (HF directories load fp32 either way).
  WeightForm weights = WeightForm::F32;
  // With Stored: the types kept in place (the runtime passes the CPU backend's cpu::stored_supported);
  // required, since the model layer does not know which kernels a backend has.
  StoredTypeFilter stored_types;
  // With Stored: run on the loaded weights (the CPU backend repacks its matrices into its own
  // layouts). `mapped`: the views point into a read-only file mapping whose pages may be dropped.
  std::function<void(DecoderWeights& weights, bool mapped)> prepare_stored;
};

// Loads weights and the tokenizer. progress(fraction) is called as tensors are read.
LoadedModel load_model(const std::string& path, const ProgressFn& progress = {}, const LoadOptions& options = {});
// The tokenizer alone (fdpp tokenize): no weights are read. Throws when the model has none.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path);

// The GPU load's first half: the description, the tokenizer and a plan of where every weight lies
// in the files (model/weight_plan.h), reading no weight data; weights stays empty. The GPU loader
// streams the plan to the device (cuda::DeviceModel::from_plan).
struct PlannedModel {
  ModelDescription description;
  WeightPlan plan;
  std::unique_ptr<Tokenizer> tokenizer;  // null for an HF directory without tokenizer files
  const ModelConfig& config() const { return description.config; }
};
PlannedModel plan_model(const std::string& path);

struct HfConfig;
class WeightSource;
// The HF-directory steps on their own, over any WeightSource (tests pass an in-memory one):
// validates the tensors against config.json (names, shapes, dtypes) reading no weight data (only
// the KV cache scales, ModelConfig::kv_cache_scales), and loads the weights (no tokenizer).
ModelDescription describe_hf_model(const HfConfig& config, const WeightSource& source);
DecoderWeights load_hf_model_weights(const HfConfig& config, const WeightSource& source,
                                     const ProgressFn& progress = {});

}  // namespace fdpp
