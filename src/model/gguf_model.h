// GGUF files -> DecoderWeights, whatever the architecture: the architecture's file
// (model/arch/) names the tensors a config needs and the slot each fills (GgufTensorSpec); this
// loads them as fp32 or as stored views (the CPU fast path), or plans them for the GPU loader,
// from the same list, so the three cannot disagree on a mapping.
#pragma once

#include <memory>
#include <string>
#include <utility>
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
//
// A slot that is a row range of a fused tensor (Phi-3's attn_qkv and ffn_up, which llama.cpp keeps
// fused) names the whole tensor's shape in fused_shape and its first row in row_begin; shape is
// then the slot's. Several specs share the tensor, one per slot.
struct GgufTensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  WeightSlot slot = WeightSlot::TokEmbeddings;
  int layer = -1;
  int permute_heads = 0;
  bool required = true;
  std::vector<int64_t> fused_shape = {};  // empty: the tensor is the slot
  int64_t row_begin = 0;

  // The shape the file must hold.
  const std::vector<int64_t>& stored_shape() const { return fused_shape.empty() ? shape : fused_shape; }
};

// The specs of a fused [sum(rows), cols] tensor split by rows into slots of layer `layer`, in order.
std::vector<GgufTensorSpec> fused_gguf_rows(const std::string& name, int64_t cols, int layer,
                                            const std::vector<std::pair<WeightSlot, int64_t>>& slots);

// The tensor's shape as the file stores it (outermost first), checked against the spec's
// stored_shape(); null when an optional tensor is absent. what goes before the expected shape in
// the message ("expected", "but the metadata implies").
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
