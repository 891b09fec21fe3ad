// A model's weights on the GPU in 16-bit (fp16 or bf16), in the layout the CUDA decoder reads:
// q/k/v fused into one [Q + 2 KV, H] matrix and (SwiGLU) gate/up fused into one [2 FF, H] matrix,
// so each layer runs four GEMMs. Uploaded once from DecoderWeights, or filled with random values
// on the device for benchmarks (--load-format dummy), which needs no host copy of the weights.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/cuda/check.h"
#include "backend/cuda/kernels.h"
#include "model/decoder.h"

namespace fdpp::cuda {

struct DeviceLayer {
  DeviceBuffer attn_norm, attn_norm_bias;
  DeviceBuffer w_qkv, b_qkv;  // [Q + 2 KV, H], [Q + 2 KV]
  DeviceBuffer w_o, b_o;      // [H, Q]
  DeviceBuffer ffn_norm, ffn_norm_bias;
  DeviceBuffer w_in, b_in;    // SwiGLU: [2 FF, H] (gate rows, then up rows); ReLU: [FF, H]
  DeviceBuffer w_down, b_down;  // [H, FF]
};

class DeviceModel {
 public:
  DeviceModel(const ModelConfig& config, const DecoderWeights& weights, DType dtype);
  // Random weights (uniform, scaled like a trained model's: ~1/sqrt(fan_in); norms ~1).
  static DeviceModel dummy(const ModelConfig& config, DType dtype, uint64_t seed);

  const ModelConfig& config() const { return config_; }
  DType dtype() const { return dtype_; }
  uint64_t bytes() const { return bytes_; }

  DeviceBuffer tok_embeddings, pos_embeddings, project_in, project_out;
  std::vector<DeviceLayer> layers;
  DeviceBuffer final_norm, final_norm_bias;
  DeviceBuffer lm_head;  // empty when tied
  DeviceBuffer inv_freq;  // fp32 [rotary_dim / 2], RoPE models

  const void* output_matrix() const { return lm_head.empty() ? tok_embeddings.get() : lm_head.get(); }

 private:
  DeviceModel(const ModelConfig& config, DType dtype) : config_(config), dtype_(dtype) {}
  DeviceBuffer upload(const std::vector<const Tensor*>& parts);  // concatenated, converted
  DeviceBuffer random(int64_t n, float scale, float offset, uint64_t seed);
  void upload_inv_freq();

  ModelConfig config_;
  DType dtype_;
  uint64_t bytes_ = 0;
};

}  // namespace fdpp::cuda
