// From a path on disk to a runnable model: resolves the default model, recognizes the format (a
// GGUF file, or a Hugging Face model directory: config.json + safetensors / PyTorch .bin +
// tokenizer files), describes and validates the model without reading weights (fdpp info), and
// loads it.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "fdpp/model_config.h"
#include "model/decoder.h"
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

// Loads weights (dequantized to fp32) and the tokenizer. progress(fraction) is called as tensors
// are read.
LoadedModel load_model(const std::string& path, const ProgressFn& progress = {});
// The tokenizer alone (fdpp tokenize): no weights are read. Throws when the model has none.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path);

struct HfConfig;
class WeightSource;
// The HF-directory steps on their own, over any WeightSource (tests pass an in-memory one):
// validates the tensors against config.json (names, shapes, dtypes) without reading data, and
// loads the weights (no tokenizer).
ModelDescription describe_hf_model(const HfConfig& config, const WeightSource& source);
DecoderWeights load_hf_model_weights(const HfConfig& config, const WeightSource& source,
                                     const ProgressFn& progress = {});

}  // namespace fdpp
