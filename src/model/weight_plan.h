// A model's weights as a plan rather than as data: for every slot of DecoderWeights the model
// needs, where its bytes lie in the checkpoint (the file mapping, the byte offset in the file, the
// stored type) and what the architecture's mapping does to them on the way (a row range of a fused
// tensor, GGUF's q/k row permutation). The GPU loader (backend/cuda/weight_streamer) streams a plan
// straight from the files to the device and converts there, so a model is never materialized in
// host memory; the fp32 loaders (load_hf_decoder, load_llama_gguf) remain for the CPU backend.
//
// The model files make plans from the same tables they load from (hf_models.cpp: HfTensorSpec's
// parts; llama.cpp: the GGUF names), so a plan and the fp32 load cannot disagree on a mapping.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "io/gguf.h"
#include "model/decoder.h"
#include "model/hf_packed_int.h"

namespace fdpp {

// The slots of DecoderWeights (model-wide) and of LayerWeights (per layer).
enum class WeightSlot : uint8_t {
  TokEmbeddings, PosEmbeddings, ProjectIn, ProjectOut, FinalNorm, FinalNormBias, LmHead,
  // per layer, from here on
  AttnNorm, AttnNormBias, Wq, Wk, Wv, Bq, Bk, Bv, Wo, Bo, FfnNorm, FfnNormBias, WGate, WUp, WDown, BGate, BUp,
  BDown, QNorm, KNorm, AttnPostNorm, FfnPostNorm, Router, ExpertsGate, ExpertsUp, ExpertsDown,
};
inline constexpr int kWeightSlots = static_cast<int>(WeightSlot::ExpertsDown) + 1;
// The slots that stack one matrix per expert ([n_experts, rows, cols]).
inline bool is_expert_slot(WeightSlot s) { return s >= WeightSlot::ExpertsGate; }
inline bool is_layer_slot(WeightSlot s) { return s >= WeightSlot::AttnNorm; }
const char* slot_name(WeightSlot s);  // "wq", "tok_embeddings", ...

WeightSlot slot_of_address(const void* member, const void* object, bool layer);

// The slot a member of DecoderWeights / LayerWeights is (whatever the member's type: Tensor, or a
// Weight once the stored forms exist). Throws for a member that is not a slot.
template <class Member>
WeightSlot slot_of(Member DecoderWeights::*m) {
  static const DecoderWeights probe{};
  return slot_of_address(&(probe.*m), &probe, false);
}
template <class Member>
WeightSlot slot_of(Member LayerWeights::*m) {
  static const LayerWeights probe{};
  return slot_of_address(&(probe.*m), &probe, true);
}

// The slot's tensor in DecoderWeights (layer ignored for model-wide slots).
Tensor& slot_tensor(DecoderWeights& w, WeightSlot s, int layer);
const Tensor& slot_tensor(const DecoderWeights& w, WeightSlot s, int layer);

// Where a stored tensor (or a row range of one) lies. data points at its first byte inside the
// file's mapping (or an in-memory image); file/file_offset name the same bytes on disk when they
// are a plain file (the loader then reads them with pread, which avoids mapping the pages), else
// file is empty. A tensor that is not contiguous in its file (a strided PyTorch .bin view) has no
// data: read_f32 gives its elements.
struct StoredTensorRef {
  std::string name;  // the checkpoint's name, for messages
  gguf::GgmlType type = gguf::GgmlType::F32;
  const uint8_t* data = nullptr;
  uint64_t n_bytes = 0;
  std::string file;
  uint64_t file_offset = 0;
  std::function<void(std::span<float>)> read_f32;  // only when data is null
};

// AWQ / GPTQ checkpoints: a slot's rows as rows [row_begin, row_begin + slot rows) of a module
// stored as packed integers (model/hf_packed_int.h). The source is the plan's storage.
struct PackedIntPart {
  const WeightSource* source = nullptr;
  PackedIntTensors tensors;
  HfQuantization quantization;
  int64_t out = 0, in = 0, row_begin = 0;

  UnpackedInt unpack(int64_t rows) const {
    return unpack_packed_int(*source, tensors, quantization, out, in, row_begin, rows);
  }
};

// One slot filled from one stored tensor (or row range of one).
struct PlannedTensor {
  WeightSlot slot;
  int layer = -1;               // -1 for model-wide slots
  std::vector<int64_t> shape;   // the slot's shape (row-major, outermost first)
  StoredTensorRef src;          // exactly numel(shape) elements of src.type, row after row
  // GGUF's attn_q / attn_k: the rows of each of permute_heads heads are stored in llama.cpp's
  // order (see llama.cpp); slot row h*hd + j*hd/2 + i is stored row h*hd + 2i + j. 0: no permutation.
  int permute_heads = 0;
  // A column slice (tensor parallelism splits o and down by their input): each stored row holds
  // stored_cols elements and the slot takes columns [col_offset, col_offset + cols()) of it, whole
  // blocks of src.type; src.data points at stored row 0, column 0 (src.n_bytes counts the slice
  // only). 0: the stored rows are the slot's rows.
  int64_t stored_cols = 0;
  int64_t col_offset = 0;
  // Added to every element once converted (Gemma's norms, stored as w for a (1 + w) scale).
  float add = 0.f;
  // FP8 checkpoints (model/hf_quantization.h): src holds e4m3 bytes (src.type is I8, which only
  // gives their size: one byte per element) and slot row r is fp8_scales[r] x e4m3. One scale per
  // row (a per-tensor scale repeated); empty for every other tensor.
  std::vector<float> fp8_scales;
  bool fp8() const { return !fp8_scales.empty(); }
  // AWQ / GPTQ checkpoints: the slot's integers and their groups; src then holds no bytes (its name
  // is the module's). Null for every other tensor.
  std::shared_ptr<const PackedIntPart> packed_int;
  bool packed() const { return packed_int != nullptr; }
  // An expert slot filled one expert at a time (Hugging Face stores each expert's matrix apart):
  // this tensor is expert `expert`'s [rows, cols] block of the stacked slot. -1: the whole slot
  // (a GGUF file stores the stack as one tensor).
  int expert = -1;

  int64_t numel() const { return Tensor::numel_of(shape); }
  int64_t rows() const { return shape.empty() ? 1 : shape[0]; }
  int64_t cols() const { return shape.size() < 2 ? 1 : numel() / shape[0]; }
  // For a column slice: bytes from one stored row to the next, and from a row's start to the slice.
  uint64_t stored_row_bytes() const { return bytes_of(stored_cols); }
  uint64_t col_byte_offset() const { return bytes_of(col_offset); }
  uint64_t bytes_of(int64_t elements) const {
    return static_cast<uint64_t>(elements) / gguf::block_elements(src.type) * gguf::block_bytes(src.type);
  }
};

struct WeightPlan {
  std::vector<PlannedTensor> tensors;
  std::shared_ptr<const void> storage;  // keeps the files mapped while the plan is used

  const PlannedTensor* find(WeightSlot s, int layer) const;  // the first, for an expert slot filled by parts
  uint64_t stored_bytes() const;
  int64_t elements() const;
};

// The layer matrices the backends fuse, each as its slots in fused order: q/k/v, o, gate/up (or
// up alone), down.
const std::vector<std::vector<WeightSlot>>& layer_matrix_slots();
// The parts of one fused layer matrix the plan has (present, not empty), in fused order.
std::vector<const PlannedTensor*> layer_matrix_parts(const WeightPlan& plan, std::span<const WeightSlot> slots,
                                                     int layer);

// The GGUF block types the CUDA backend multiplies as stored (backend/cuda/gguf_blocks.h).
bool gguf_gpu_block_type(gguf::GgmlType type);
// The tensors of a plan the GPU keeps in their GGUF blocks: every part of a layer matrix is one of
// those types, unsliced and unshifted, not an expert's, and the parts share a row length of whole
// blocks the kernels take. Embeddings, the lm head and the rest are converted to 16 bits. The GPU
// loader and fdpp info both ask this.
std::set<const PlannedTensor*> gguf_gpu_block_tensors(const WeightPlan& plan);

// Row n of a slot that permute_heads applies to comes from this stored row (identity when 0).
inline int64_t planned_source_row(int64_t n, int64_t rows, int permute_heads) {
  if (permute_heads <= 0) return n;
  const int64_t head_dim = rows / permute_heads, half = head_dim / 2;
  const int64_t h = n / head_dim, r = n % head_dim, j = r / half, i = r % half;
  return h * head_dim + 2 * i + j;
}

// A plan over weights already in host memory (fp32 tensors, read in place; they must outlive it):
// front ends that hold DecoderWeights shard them with the same code as a file plan.
WeightPlan plan_from_weights(const DecoderWeights& weights, const ModelConfig& config);

// Reads a plan into fp32 host tensors on the CPU (dequantizing and permuting as the GPU loader
// does; FP8 tensors as scale x e4m3 in fp32): tests compare it with the fp32 loaders, and it is the
// plan's reference semantics.
DecoderWeights materialize_plan(const WeightPlan& plan, const ModelConfig& config);

}  // namespace fdpp
