// config.json's quantization_config: which published quantized formats an HF checkpoint may be in.
//
// fdpp loads FP8 checkpoints as vLLM's fp8 and compressed-tensors schemes write them: the linear
// layers' weights stored F8_E4M3 ("X.weight"), each with "X.weight_scale" (one fp32 per tensor,
// or one per output channel: [N] or [N, 1]), w = weight_scale * e4m3. Two configs say so:
//   quant_method "fp8" (vLLM/HF fine-grained FP8, AutoFP8, the "-FP8" models of neuralmagic and
//     RedHatAI): activation_scheme dynamic or static, ignored_layers / modules_to_not_convert;
//     weight_block_size (DeepSeek-style 128x128 blocks) is refused.
//   quant_method "compressed-tensors" whose config_groups all quantize weights as float 8-bit with
//     strategy "tensor" or "channel" (format float-quantized or naive-quantized), with an ignore
//     list; every other scheme (int4 pack-quantized, int8, group/block strategies, sparsity) is
//     refused with one line naming what was found.
// compressed-tensors' kv_cache_scheme must be float 8-bit with strategy tensor: one K and one V scale
// per layer, which --kv-cache-dtype fp8 uses (model/hf_models.h: read_kv_cache_scales reads them,
// whatever the config says, as vLLM does).
// Static activation scales ("X.input_scale") are not used: fdpp quantizes activations per token at
// run time where an FP8 tensor-core GEMM needs them (backend/cuda/fp8.h), as vLLM's dynamic scheme.
//
// And the weight-only integer checkpoints (model/hf_packed_int.h has their tensor layouts):
//   quant_method "awq" (AutoAWQ, version gemm): 4-bit, zero points, group_size, modules_to_not_convert;
//   quant_method "gptq" (AutoGPTQ / GPTQModel / optimum): 4- or 8-bit, group_size (-1: one group),
//     desc_act (act-order: g_idx), sym, checkpoint_format gptq (zeros stored minus one) or gptq_v2.
// Other versions and formats (AWQ gemv / marlin, GPTQ marlin, 2- and 3-bit) are refused with one line.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <string>
#include <string_view>
#include <vector>

namespace fdpp {

struct HfQuantization {
  bool fp8 = false;                 // an FP8 checkpoint
  bool packed_int = false;          // an AWQ or GPTQ checkpoint: the fields below say how it packs
  std::string quant_method;         // "fp8", "compressed-tensors", "awq" or "gptq" as written; "" without a config
  std::string format;               // compressed-tensors' format ("float-quantized", ...); "" for fp8
  std::string weight_strategy;      // "tensor" or "channel" (compressed-tensors); "" for fp8: the scale's shape says
  std::string activations;          // "dynamic", "static" or "none" (weight-only), as the config says
  std::vector<std::string> ignore;  // modules kept 16-bit: names ("lm_head") or "re:" patterns
  int bits = 0;                     // packed_int: 4 (AWQ), 4 or 8 (GPTQ)
  int group_size = 0;               // packed_int: input channels per scale; -1: one group per matrix
  bool act_order = false;           // GPTQ desc_act: groups follow g_idx, not the channel order
  bool zeros_minus_one = false;     // GPTQ checkpoint_format gptq: each stored zero is the zero - 1
  bool quantized_lm_head = false;   // GPTQ lm_head: true (GPTQModel can quantize the lm head too)

  // One line for fdpp info and the load line: "fp8 (compressed-tensors float-quantized, per-channel
  // weight scales)", "fp8 (quant_method fp8, static input scales unused)", "gptq (4-bit, group 128,
  // act-order)"; "" when not quantized.
  std::string describe() const;
  // Whether the module (a tensor name without ".weight") is in the ignore list.
  bool ignored(std::string_view module) const;
};

// Reads config["quantization_config"] (absent or null: not quantized). Throws fdpp::Error, one line
// naming origin and the field, for a method or scheme fdpp does not load.
HfQuantization parse_hf_quantization(const nlohmann::json& config, const std::string& origin);

}  // namespace fdpp
