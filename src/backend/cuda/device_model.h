// A model's weights on the GPU in 16-bit (fp16 or bf16), in the layout the CUDA decoder reads:
// q/k/v fused into one [Q + 2 KV, H] matrix and (SwiGLU) gate/up fused into one [2 FF, H] matrix,
// so each layer runs four GEMMs. Uploaded once from DecoderWeights, or filled with random values
// on the device for benchmarks (--load-format dummy), which needs no host copy of the weights.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/cuda/check.h"
#include "backend/cuda/gguf_blocks.h"
#include "backend/cuda/int4.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/weight_convert.h"
#include "model/decoder.h"

namespace fdpp {
struct WeightPlan;
}

namespace fdpp::cuda {

// A 4-bit matrix's parts besides its q4 words, which the matrix's own buffer holds (int4.h).
struct DeviceInt4 {
  DeviceBuffer zs;
  DeviceBuffer perm;  // GPTQ act-order: int32 [K], the stored column of each column; empty otherwise
  int group_size = 0;
  int zs_stride = 0;

  bool empty() const { return zs.empty(); }
  Int4Matrix view() const {
    return {zs.as<uint32_t>(), perm.empty() ? nullptr : perm.as<int32_t>(), group_size, zs_stride};
  }
};

// One layer matrix in whichever form the model holds it: w with its fp8 row scales, its 4-bit groups
// or its GGUF segments (the ones that apply are non-empty).
struct LayerMatrix {
  const DeviceBuffer& w;
  const DeviceBuffer& scale;
  const DeviceInt4& int4;
  const GgufMatrix& gguf;
};

struct DeviceLayer {
  DeviceBuffer attn_norm, attn_norm_bias;
  DeviceBuffer w_qkv, b_qkv;  // [Q + 2 KV, H], [Q + 2 KV]
  DeviceBuffer w_o, b_o;      // [H, Q]
  DeviceBuffer q_norm, k_norm;  // [head_dim] each, qk_norm
  DeviceBuffer ffn_norm, ffn_norm_bias;
  DeviceBuffer w_in, b_in;    // SwiGLU, GeGLU: [2 FF, H] (gate rows, then up rows); ReLU: [FF, H]
  DeviceBuffer w_down, b_down;  // [H, FF]
  DeviceBuffer attn_post_norm, ffn_post_norm;  // [H] each, sandwich_norm (Gemma)
  // An expert layer (ModelConfig::is_moe_layer), in place of w_in / w_down: the router and the
  // experts' matrices stacked as moe.h reads them.
  DeviceBuffer router;                    // [E, H]
  DeviceBuffer experts_gate, experts_up;  // [E, FE, H]
  DeviceBuffer experts_down;              // [E, H, FE]
  // FP8 weights (DeviceModel::quantize_fp8): the four matrices above hold e4m3 bytes and these their
  // fp32 row scales (fp8.h); empty for 16-bit weights.
  DeviceBuffer s_qkv, s_o, s_in, s_down;
  // 4-bit weights (AWQ / GPTQ checkpoints, DeviceModel::quantize_int4): the four matrices hold q4
  // words and these the rest; empty otherwise.
  DeviceInt4 i_qkv, i_o, i_in, i_down;
  // GGUF blocks kept as stored (DeviceModel::from_plan with gguf_blocks): the four matrices hold the
  // blocks and these their segments, pointing into them; empty otherwise.
  GgufMatrix g_qkv, g_o, g_in, g_down;

  LayerMatrix qkv() const { return {w_qkv, s_qkv, i_qkv, g_qkv}; }
  LayerMatrix o() const { return {w_o, s_o, i_o, g_o}; }
  LayerMatrix in() const { return {w_in, s_in, i_in, g_in}; }
  LayerMatrix down() const { return {w_down, s_down, i_down, g_down}; }
};

// What a model needs on the GPU besides what is already there, for the check before anything is
// allocated (check_gpu_memory).
struct GpuMemoryNeed {
  uint64_t weights = 0;
  uint64_t kv_cache = 0;
  int64_t kv_tokens = 0;
  uint64_t activations = 0;  // an estimate: activations, logits, workspaces, headroom
};
// Throws one line ("the model needs 13.48 GiB of weights + 2.00 GiB of KV cache (4096 tokens) +
// 0.80 GiB of activations = 16.28 GiB, but the GPU has 10.00 GiB free of 80.00 GiB") when the sum
// exceeds the free memory of the current device.
void check_gpu_memory(const GpuMemoryNeed& need);
// Bytes of the device weights a plan fills (16-bit elements; FP8 ones a byte each plus fp32 row
// scales; 4-bit ones half a byte plus their zs words and act-order permutation; with gguf_blocks,
// the layer matrices from_plan keeps in their GGUF blocks as stored).
uint64_t plan_device_bytes(const WeightPlan& plan, bool gguf_blocks = false);

class DeviceModel {
 public:
  // From fp32 host tensors (tests, tiny models): converted on the host, then uploaded.
  DeviceModel(const ModelConfig& config, const DecoderWeights& weights, DType dtype);
  // Streamed from the checkpoint files through a pinned staging ring and converted on the GPU
  // (weight_streamer.h): the model is never held in host memory. The same layout and, for every
  // stored type, the same bits as the constructor above given the fp32 weights of the same files.
  // An FP8 checkpoint's layer matrices (PlannedTensor::fp8) arrive as their e4m3 bytes with fp32
  // row scales, as quantize_fp8 leaves them (fp8() is then true); a matrix the checkpoint keeps
  // 16-bit (its ignore list) stays 16-bit. An AWQ / GPTQ checkpoint's 4-bit matrices
  // (PlannedTensor::packed_int) are unpacked on the host one matrix at a time and repacked into
  // int4.h's layout (int4() is then true); 8-bit GPTQ is refused.
  // gguf_blocks: a layer matrix whose parts are all GGUF blocks the GPU computes on (gguf_blocks.h:
  // Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K) stays in them, as stored (gguf() is then true); the others,
  // the embeddings and the lm head are converted to dtype.
  static DeviceModel from_plan(const ModelConfig& config, const WeightPlan& plan, DType dtype,
                               const StreamOptions& options = {}, StreamStats* stats = nullptr,
                               bool gguf_blocks = false);
  // Random weights (uniform, scaled like a trained model's: ~1/sqrt(fan_in); norms ~1). For a
  // tensor-parallel rank (model/tensor_parallel.h) config has the rank's shapes, lm_head_rows > 0
  // is its vocabulary slice (an lm head of that many rows, tied or not), and ranks > 0 hold no
  // biases of the o and down projections (rank 0 adds them after the all-reduce).
  static DeviceModel dummy(const ModelConfig& config, DType dtype, uint64_t seed, int rank = 0,
                           int64_t lm_head_rows = 0);

  // --quantization fp8: each layer's four matrices to e4m3 with per-row scales (fp8.h), in place,
  // one matrix at a time (the 16-bit one is freed as its replacement is made). The embeddings,
  // norms, biases and the lm head stay 16-bit, as vLLM keeps them. A model already FP8 (an FP8
  // checkpoint) is kept as it is, as vLLM runs such a checkpoint whatever --quantization says.
  void quantize_fp8();
  bool fp8() const { return fp8_; }
  // --quantization int4: each layer's four matrices to 4 bits, groups of 128 with zero points
  // (int4.h's quantize_int4), in place, one matrix at a time. The rest stays 16-bit. A model
  // already 4-bit (an AWQ / GPTQ checkpoint) is kept as it is.
  void quantize_int4();
  bool int4() const { return int4_; }
  // Some layer matrices are GGUF blocks (from_plan's gguf_blocks).
  bool gguf() const { return gguf_; }

  const ModelConfig& config() const { return config_; }
  DType dtype() const { return dtype_; }
  uint64_t bytes() const { return bytes_; }

  DeviceBuffer tok_embeddings, pos_embeddings, project_in, project_out;
  std::vector<DeviceLayer> layers;
  DeviceBuffer final_norm, final_norm_bias;
  DeviceBuffer lm_head;  // empty when tied
  DeviceBuffer inv_freq;  // fp32 [rotary_dim / 2], RoPE models
  DeviceBuffer local_inv_freq;  // fp32, the sliding-window layers' (has_local_rope: Gemma 3)
  const float* inv_freq_of(int layer) const {
    return config_.has_local_rope && config_.window(layer) > 0 ? local_inv_freq.as<float>() : inv_freq.as<float>();
  }

  const void* output_matrix() const { return lm_head.empty() ? tok_embeddings.get() : lm_head.get(); }
  uint64_t output_matrix_bytes() const { return lm_head.empty() ? tok_embeddings.bytes() : lm_head.bytes(); }

 private:
  DeviceModel(const ModelConfig& config, DType dtype) : config_(config), dtype_(dtype) {}
  DeviceBuffer upload(const std::vector<const Tensor*>& parts);  // concatenated, converted
  DeviceBuffer random(int64_t n, float scale, float offset, uint64_t seed);
  void upload_inv_freq();

  ModelConfig config_;
  DType dtype_;
  uint64_t bytes_ = 0;
  bool fp8_ = false;
  bool int4_ = false;
  bool gguf_ = false;
};

}  // namespace fdpp::cuda
