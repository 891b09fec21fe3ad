// Hugging Face checkpoints -> DecoderWeights. Each architecture's file (model/arch/) lists the
// checkpoint's tensor names as HfTensorSpecs; this part, shared by all, checks a WeightSource
// against them without reading data (fdpp info), loads them and plans them for the GPU loader.
//
// HF Llama checkpoints already rotate halves (no row permutation, unlike GGUF). Fused tensors
// (ChatGLM2's query_key_value and dense_h_to_4h) are split by rows on load.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "io/weight_source.h"
#include "model/decoder.h"
#include "model/hf_quantization.h"
#include "model/weight_plan.h"

namespace fdpp {

// A row range of a checkpoint tensor that fills one slot (a whole tensor: row_begin 0, all rows).
struct HfSlotPart {
  WeightSlot slot;
  int layer = -1;
  int64_t row_begin = 0;
  std::vector<int64_t> shape;  // the slot's
  float add = 0.f;             // added to every element once read (Gemma's (1 + w) norms)
  int expert = -1;             // an expert slot's block (PlannedTensor::expert); -1: the whole slot
};

// One tensor of a checkpoint: its name there, the shape config.json implies, and where it goes:
// assign puts the fp32 tensor into DecoderWeights (the CPU load), parts says the same as slots and
// row ranges (the GPU load's plan, plan_hf_weights). The two must agree; tests check that they do.
struct HfTensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  std::function<void(DecoderWeights&, Tensor&&)> assign;
  std::vector<HfSlotPart> parts;
};

// The tensors an HF checkpoint of config.architecture ("llama", "mistral", "qwen2", "opt",
// "chatglm") must hold, from that architecture's file. The source is consulted only where names vary between
// checkpoints (OPT's "model.decoder." / "decoder." / "model." prefixes).
std::vector<HfTensorSpec> hf_tensor_specs(const ModelConfig& config, const WeightSource& source);

// Checks that every spec's tensor is present with the expected shape and a readable dtype (F32,
// F16, BF16), and that the checkpoint holds nothing that contradicts config.json (a bias the
// config does not call for, layers beyond num_hidden_layers). Throws fdpp::Error naming the
// directory, the tensor and config.json. Reads no tensor data.
// FP8 checkpoints (quantization.fp8, model/hf_quantization.h): a projection (q/k/v/o, gate/up/down)
// may be F8_E4M3, with "X.weight_scale" of a readable dtype and shape [] or [1] (per tensor) or [N]
// or [N, 1] (per output channel, N its rows); every other tensor stays 16-bit or fp32.
// AWQ / GPTQ checkpoints (quantization.packed_int): a matrix "X.weight" may instead be stored as
// X.qweight, X.qzeros, X.scales (and GPTQ's X.g_idx) in the layout of model/hf_packed_int.h; a bias
// beside it that the config does not call for is accepted when it is all zeros (AutoGPTQ writes
// one for every module).
void check_hf_tensors(const WeightSource& source, const std::vector<HfTensorSpec>& specs, const ModelConfig& config,
                      const std::string& config_path, const HfQuantization& quantization = {});

// Reads every spec's tensor as fp32 into DecoderWeights (call check_hf_tensors first); an F8_E4M3
// weight is dequantized, weight_scale x e4m3 value in fp32 (one rounding), and so is a packed
// integer one, (q - zero) x scale.
DecoderWeights load_hf_decoder(const WeightSource& source, const ModelConfig& config,
                               const std::vector<HfTensorSpec>& specs, const ProgressFn& progress = {},
                               const HfQuantization& quantization = {});

// The same mapping as a plan for the GPU loader: where each slot's bytes lie in the checkpoint (call
// check_hf_tensors first). A tensor the source cannot give in place (a strided .bin view) is read
// through read_f32 instead. An F8_E4M3 weight's parts keep their e4m3 bytes in place and carry its
// scales per row (PlannedTensor::fp8_scales; the scales are read here, a few floats per matrix). An
// AWQ / GPTQ matrix's parts point at its packed tensors (PlannedTensor::packed_int), read when the
// loader unpacks them.
WeightPlan plan_hf_weights(const WeightSource& source, const std::vector<HfTensorSpec>& specs,
                           const HfQuantization& quantization = {});

// An F8_E4M3 weight's scale, one per row: its "X.weight_scale" read (a per-tensor scale repeated
// over the rows). Throws for a missing or ill-shaped scale, or one that is not finite.
std::vector<float> fp8_row_scales(const WeightSource& source, const SourceTensor& weight);

// The FP8 KV cache scales a checkpoint publishes, one K and one V scale per layer (empty when it
// publishes none), found by name as vLLM finds them (maybe_remap_kv_scale_name, the quantization
// configs' get_cache_scale): "<attention>.k_scale" / ".v_scale" (compressed-tensors, quant_method
// fp8), "<attention>.k_proj.output_scale" / ".v_proj.output_scale" (compressed-tensors
// kv_cache_scheme, older), "<attention>.k_proj.k_scale" / ".v_proj.v_scale" (ModelOpt), or one
// "<attention>.kv_scale" for both (older AutoFP8), where <attention> is inside "layers.N.". Each is
// one F32/F16/BF16 number ([] or [1]). Throws one line naming the tensor for a layer left without
// its scale while others have theirs, two tensors giving the same scale, or a scale that is not
// positive and finite.
std::vector<KvCacheScales> read_kv_cache_scales(const WeightSource& source, const ModelConfig& config);

// Splits a [sum(rows), cols] tensor by rows into parts (for fused projections).
std::vector<Tensor> split_rows(const Tensor& t, const std::vector<int64_t>& rows);

// Specs whose tensor goes straight into one member of DecoderWeights / of layer i.
// (Member is Tensor or Weight: a Weight is assigned its fp32 form.)
template <class Member>
HfTensorSpec hf_spec(std::string name, std::vector<int64_t> shape, Member DecoderWeights::*member) {
  std::vector<HfSlotPart> parts{{slot_of(member), -1, 0, shape}};
  return {std::move(name), std::move(shape), [member](DecoderWeights& w, Tensor&& t) { w.*member = std::move(t); },
          std::move(parts)};
}
template <class Member>
HfTensorSpec hf_layer_spec(std::string name, std::vector<int64_t> shape, int layer, Member LayerWeights::*member) {
  std::vector<HfSlotPart> parts{{slot_of(member), layer, 0, shape}};
  return {std::move(name), std::move(shape),
          [layer, member](DecoderWeights& w, Tensor&& t) { w.layers.at(layer).*member = std::move(t); },
          std::move(parts)};
}

// A spec for expert `expert` of n_experts, whose [rows, cols] matrix is that expert's block of the
// stacked member of layer i (LayerWeights::experts_gate, experts_up, experts_down).
HfTensorSpec hf_expert_spec(std::string name, std::vector<int64_t> shape, int layer, int expert, int n_experts,
                            Weight LayerWeights::*member);

}  // namespace fdpp
