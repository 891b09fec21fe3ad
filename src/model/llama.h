// The Llama family (Llama 2/3, Mistral, SmolLM2) from GGUF files: RMSNorm, rotary embeddings
// (rotate-half), grouped-query attention, SwiGLU MLP, optionally tied embeddings. This file maps
// llama.cpp's tensor names (token_embd, blk.N.attn_q, ...) into DecoderWeights.
#pragma once

#include <memory>
#include <vector>

#include <memory>

#include "model/decoder.h"
#include "model/weight_plan.h"

namespace fdpp {

namespace gguf {
class GgufFile;
}

ModelConfig llama_config_from_gguf(const gguf::GgufFile& file);
std::vector<TensorSpec> llama_gguf_tensor_specs(const ModelConfig& config);
DecoderWeights load_llama_gguf(const gguf::GgufFile& file, const ModelConfig& config, const ProgressFn& progress);
// The same mapping as a plan for the GPU loader (tensors in their stored types, attn_q/attn_k with
// their row permutation to undo); the plan keeps the file mapped.
WeightPlan plan_llama_gguf(std::shared_ptr<const gguf::GgufFile> file, const ModelConfig& config);
// form Stored: matrices whose type the CPU fast path handles become views into the file's mapping,
// which the returned weights keep alive (DecoderWeights::storage); the rest is fp32 as above.
DecoderWeights load_llama_gguf(std::shared_ptr<const gguf::GgufFile> file, const ModelConfig& config,
                               const ProgressFn& progress, WeightForm form);

}  // namespace fdpp
