// AWQ and GPTQ weight-only integer checkpoints (model/hf_quantization.h says which load): where a
// linear module "X" of out x in weights keeps its integers, their unpacking (the GPU's loader repacks
// 4-bit matrices into backend/cuda/int4.h's layout from it) and their dequantization to fp32, the
// CPU's reference.
//
//   AWQ (AutoAWQ gemm):  X.qweight  I32 [in, out / 8]      eight 4-bit values per word, output
//                                                            channels 8j + {0, 2, 4, 6, 1, 3, 5, 7}
//                                                            in nibbles 0..7 of word j
//                        X.qzeros   I32 [groups, out / 8]  the zero points, packed the same way
//                        X.scales   F16 [groups, out]
//                        w[n][k] = (q - z) * scale, group g = k / group_size
//   GPTQ (v1 "gptq",     X.qweight  I32 [in * bits / 32, out]  32 / bits input channels per word,
//   v2 "gptq_v2"):                                             channel 32/bits * i + j in bits j*b..
//                        X.qzeros   I32 [groups, out * bits / 32]  output channels packed alike
//                        X.scales   F16 [groups, out]
//                        X.g_idx    I32 [in] (optional)    each input channel's group (act-order);
//                                                          absent: k / group_size
//                        w[n][k] = (q - z') * scale, z' = (z + 1) mod 2^bits in v1 (zeros stored
//                        minus one, as AutoGPTQ writes them), z in v2
// groups = ceil(in / group_size), or 1 for group_size -1.
#pragma once

#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/weight_source.h"
#include "model/hf_quantization.h"

namespace fdpp {

// A module's packed tensors (null where the layout has none: qzeros of symmetric GPTQ is always
// present, g_idx may be absent).
struct PackedIntTensors {
  std::string module;  // "model.layers.0.self_attn.q_proj"
  const SourceTensor* qweight = nullptr;
  const SourceTensor* qzeros = nullptr;
  const SourceTensor* scales = nullptr;
  const SourceTensor* g_idx = nullptr;
};

// Whether the source holds module's weights as packed integers (module.qweight).
bool has_packed_int(const WeightSource& source, const std::string& module);

// Finds and checks module's packed tensors for an [out, in] matrix, reading no data: their presence,
// dtypes and shapes against the config's bits and group size. Throws fdpp::Error, one line naming
// the tensor, for anything missing or inconsistent.
PackedIntTensors find_packed_int(const WeightSource& source, const std::string& module, int64_t out, int64_t in,
                                 const HfQuantization& q);

// Rows [row_begin, row_begin + rows) of a checked [out, in] packed matrix, unpacked:
//   w[n][k] = (q[n][k] - zero[n][group[k]]) * scale[n][group[k]]
// (n relative to row_begin), with group[k] from g_idx or k / group_size. Checks every group index
// and scale.
struct UnpackedInt {
  int64_t rows = 0, cols = 0, groups = 0;
  std::vector<uint8_t> q;      // [rows, cols], 0 .. 2^bits - 1
  std::vector<uint8_t> zero;   // [rows, groups]
  std::vector<float> scale;    // [rows, groups]
  std::vector<int32_t> group;  // [cols]

  // w [rows, cols] in fp32: one float32 product of exact small integers and the stored scale.
  void dequantize(float* w) const;
};
UnpackedInt unpack_packed_int(const WeightSource& source, const PackedIntTensors& t, const HfQuantization& q,
                              int64_t out, int64_t in, int64_t row_begin, int64_t rows);

// The [out, in] fp32 weights (dst's shape) of checked packed tensors: unpack_packed_int's formula, one
// float32 product of exact small integers and the stored scale.
void dequantize_packed_int(const WeightSource& source, const PackedIntTensors& t, const HfQuantization& q,
                           Tensor& dst);

}  // namespace fdpp
