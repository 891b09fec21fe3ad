// GGUF files -> DecoderWeights, whatever the architecture: the architecture's file
// (model/arch/) names the tensors a config needs and the slot each fills (GgufTensorSpec); this
// loads them as fp32 or as stored views (the CPU fast path), or plans them for the GPU loader,
// from the same list, so the three cannot disagree on a mapping.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/decoder.h"
#include "model/weight_plan.h"

namespace fdpp {

namespace gguf {
class GgufFile;
}

// A tensor the model needs: its GGUF name, the shape the metadata implies (row-major, outer dim
// first), the slot it fills, and permute_heads as PlannedTensor's (llama.cpp's converter stores
// the rows of attn_q/attn_k in its RoPE's order; loading undoes it).
struct GgufTensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  WeightSlot slot = WeightSlot::TokEmbeddings;
  int layer = -1;
  int permute_heads = 0;
  bool required = true;
};

// The tensor's shape as the file stores it (outermost first), checked against the spec; null when
// an optional tensor is absent. what goes before the expected shape in the message ("expected",
// "but the metadata implies").
const gguf::TensorInfo* find_gguf_tensor(const gguf::GgufFile& file, const GgufTensorSpec& spec,
                                         const char* what = "expected");

// Every tensor fp32, except matrices whose type stored_types accepts: those become views into the
// file's mapping, which the returned weights keep alive (DecoderWeights::storage).
DecoderWeights load_gguf_weights(std::shared_ptr<const gguf::GgufFile> file, const ModelConfig& config,
                                 const std::vector<GgufTensorSpec>& specs, const ProgressFn& progress,
                                 const StoredTypeFilter& stored_types = {});
// The same mapping as a plan for the GPU loader (tensors in their stored types, with their row
// permutation to undo); the plan keeps the file mapped.
WeightPlan plan_gguf_weights(std::shared_ptr<const gguf::GgufFile> file, const std::vector<GgufTensorSpec>& specs);

}  // namespace fdpp
