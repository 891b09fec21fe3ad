// Which backend runs a model: CUDA when a GPU is present (and fdpp was built with CUDA), else the
// CPU; `--device cpu|cuda` forces one.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/kernel_options.h"
#include "engine/engine.h"
#include "engine/runner.h"
#include "model/decoder.h"
#include "model/weight_plan.h"

namespace fdpp {

enum class Device { Auto, Cpu, Cuda };
Device parse_device(const std::string& name);  // "auto", "cpu", "cuda"; throws on others
// Auto becomes Cuda when a usable GPU exists, else Cpu. Cuda without one throws with the reason.
Device resolve_device(Device requested);
const char* device_name(Device d);
// The GPU's 16-bit type for --dtype `requested`: "f16" or "bf16" as asked; "auto" takes bf16 when
// the plan stores most of its floating-point weights as bf16 (an f16 copy of a bf16 checkpoint can
// overflow), else f16 (also without a plan).
std::string gpu_dtype(const std::string& requested, const WeightPlan* plan);
// For a log line: "cpu", or "cuda (NAME)" with the first GPU's name ("cuda (2 x NAME)" for gpus > 1).
std::string device_description(Device d, int gpus = 1);

struct RunnerOptions {
  Device device = Device::Auto;
  std::string dtype = "auto";  // CUDA weights: "f16", "bf16", "auto" (bf16 for bf16 checkpoints, else f16)
  // "none" (the weights in `dtype`), "fp8" or "int4" (CUDA: the layers' matrices quantized at load:
  // cuda/fp8.h, cuda/int4.h), or "awq" / "gptq" / "gguf" (the checkpoint's own method, checked by
  // open_model).
  std::string quantization = "none";
  // CUDA: "stored" keeps a GGUF file's layer matrices in their blocks (cuda/gguf_blocks.h), as
  // `quantization` allows; "dequantized" converts them to `dtype` like every other tensor.
  std::string gpu_weights = "stored";
  int64_t kv_cache_tokens = 0;
  // The KV cache's element type: "auto" (CPU: fp32, the reference; CUDA: the model's 16-bit dtype),
  // "f32" or "f16" (the CPU backend's; half the memory), or "fp8" (the CUDA backend's: e4m3 with
  // the checkpoint's per-layer scales, else 1; half the 16-bit cache's bytes).
  std::string kv_cache_dtype = "auto";
  bool cuda_graphs = true;
  // CUDA: the share of the free memory after the weights that a KV cache sized by the engine
  // (kv_cache_tokens 0) takes (EngineOptions::memory_fraction).
  double memory_fraction = 0.90;
  // CUDA decode attention: "async" (unified max, FlashDecoding++) or "sync" (FlashDecoding).
  std::string attention = "async";
  // CUDA prefill attention's tile configuration (prefill_plan.h kConfigs index; -1: the engine's
  // choice, EngineOptions::prefill_attention_config).
  int prefill_attention_config = -1;
  // Per-layer unified max phi from the model's calibration file (empty: phi = 0, see EngineOptions).
  std::vector<float> unified_max_phi;
  // CUDA linear layers: "" or auto, gemv, flat, cublas; the model's path (a dispatch table beside
  // it is used), an explicit table file, GEMV for exactly M <= gemv_max_m (-1: the table). The
  // front ends fill them from their flags, else the environment (EngineArgs::runner_options).
  std::string linear;
  std::string model_path;
  std::string dispatch_table;
  int gemv_max_m = -1;
  // CUDA kernels' launch switches (PDL, cuBLASLt tuning, the decode-attention loop).
  cuda::KernelOptions kernels;
  // CUDA: stream the weights from this plan (model/model_loader.h plan_model) straight from the files
  // to the GPU instead of uploading `weights` (then empty); checked against free GPU memory before
  // anything is allocated. load_progress reports the streaming (tensors, bytes as stored, seconds).
  const WeightPlan* plan = nullptr;
  // CUDA: random weights of the config's shapes made on the GPU (--load-format dummy), for
  // measuring without a checkpoint; the seed is fdpp bench's, so both measure the same numbers.
  bool dummy_weights = false;
  std::function<void(int tensors_done, int tensors_total, uint64_t bytes_done, uint64_t bytes_total,
                     double seconds)>
      load_progress;
  // CPU backend threads (-t/--threads); 0: $OMP_NUM_THREADS when set, else the physical cores of
  // this process's CPU set.
  int threads = 0;
  // Unified-max calibration file (fdpp calibrate --out, -/--calibration); "": looked up beside the
  // model, then in the cache. Read when unified_max_phi is empty. A file named here must exist, parse
  // and match the model (checked on every device, so that a wrong file is never silently ignored).
  std::string calibration;
  // CUDA: split the model over this many GPUs of the host (-tp; model/tensor_parallel.h).
  int tensor_parallel = 1;
};

// Sets the CPU backend's thread count by the rule of RunnerOptions::threads (make_runner and
// make_engine call it for the CPU): the CPU backend's thread pool (cpu::set_num_threads) and OpenMP.
void set_cpu_threads(int threads);
// Physical cores among the CPUs this process may run on (sysfs topology; the logical CPU count
// when that cannot be read).
int physical_cpu_cores();
// The per-layer unified max phi for options: options.unified_max_phi when set, else from the
// calibration file (named or looked up); empty when there is none.
std::vector<float> resolve_unified_max_phi(const ModelConfig& config, const RunnerOptions& options);

// The CUDA backend's reading of --kv-cache-dtype: true for fp8 (an e4m3 cache), false for auto (the
// model's 16-bit dtype); f32, f16 (the CPU backend's) and anything else throw one line.
bool cuda_kv_cache_fp8(const std::string& kv_cache_dtype);

// The weights must outlive the runner (the CPU backend reads them in place; the CUDA backend
// copies them to the device and no longer needs them after this returns).
std::unique_ptr<Runner> make_runner(const ModelConfig& config, const DecoderWeights& weights, int max_context,
                                    const RunnerOptions& options);

// The batched engine (many sequences, mixed prefill/decode steps) on the chosen backend. limits:
// max_context 0 means the model's; kv_cache_tokens 0 sizes the cache (CUDA: from free memory,
// CPU: max_step_rows sequences of max_context tokens, at most 4 GiB of fp32 cache).
std::unique_ptr<Engine> make_engine(const ModelConfig& config, const DecoderWeights& weights,
                                    const RunnerOptions& options, const EngineLimits& limits);

}  // namespace fdpp
