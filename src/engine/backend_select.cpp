#include "engine/backend_select.h"

#include "backend/cpu/cpu_engine.h"
#include "backend/cpu/cpu_runner.h"
#include "fdpp/error.h"
#ifdef FDPP_HAVE_CUDA
#include "backend/cuda/cuda_runner.h"
#include "backend/cuda/device_query.h"
#endif

namespace fdpp {

Device parse_device(const std::string& name) {
  if (name == "auto") return Device::Auto;
  if (name == "cpu") return Device::Cpu;
  if (name == "cuda") return Device::Cuda;
  fail("--device '{}' is not one of auto, cpu, cuda", name);
}

const char* device_name(Device d) { return d == Device::Cuda ? "cuda" : d == Device::Cpu ? "cpu" : "auto"; }

Device resolve_device(Device requested) {
  if (requested == Device::Cpu) return Device::Cpu;
#ifdef FDPP_HAVE_CUDA
  std::string why;
  const bool gpu = !cuda::list_gpus(&why).empty();
  if (requested == Device::Cuda) check(gpu, "--device cuda: no usable GPU ({})", why);
  return gpu ? Device::Cuda : Device::Cpu;
#else
  check(requested != Device::Cuda, "--device cuda: this fdpp was built without CUDA");
  return Device::Cpu;
#endif
}

#ifdef FDPP_HAVE_CUDA
namespace {
std::shared_ptr<const cuda::DeviceModel> device_model(const ModelConfig& config, const DecoderWeights& weights,
                                                      const RunnerOptions& options) {
  cuda::DType dtype = cuda::DType::F16;
  if (options.dtype == "bf16") dtype = cuda::DType::BF16;
  else check(options.dtype == "f16" || options.dtype == "auto", "--dtype '{}' is not one of auto, f16, bf16", options.dtype);
  return std::make_shared<const cuda::DeviceModel>(config, weights, dtype);
}

cuda::EngineOptions engine_options(const RunnerOptions& options) {
  cuda::EngineOptions eo;
  eo.kv_cache_tokens = options.kv_cache_tokens;
  eo.cuda_graphs = options.cuda_graphs;
  check(options.attention == "async" || options.attention == "sync", "--attention '{}' is not one of async, sync",
        options.attention);
  eo.attention = options.attention == "sync" ? cuda::AttentionMode::Sync : cuda::AttentionMode::Async;
  eo.unified_max_phi = options.unified_max_phi;
  eo.linear_mode = options.linear;
  eo.model_path = options.model_path;
  eo.dispatch_table = options.dispatch_table;
  return eo;
}
}  // namespace
#endif

std::unique_ptr<Runner> make_runner(const ModelConfig& config, const DecoderWeights& weights, int max_context,
                                    const RunnerOptions& options) {
  const Device device = resolve_device(options.device);
  if (device == Device::Cpu) return std::make_unique<CpuRunner>(config, weights, max_context);
#ifdef FDPP_HAVE_CUDA
  return std::make_unique<cuda::CudaRunner>(device_model(config, weights, options), max_context,
                                            engine_options(options));
#else
  fail("unreachable: CUDA runner requested in a CPU-only build");
#endif
}

std::unique_ptr<Engine> make_engine(const ModelConfig& config, const DecoderWeights& weights,
                                    const RunnerOptions& options, const EngineLimits& limits) {
  const Device device = resolve_device(options.device);
  if (device == Device::Cpu) return std::make_unique<CpuEngine>(config, weights, limits);
#ifdef FDPP_HAVE_CUDA
  // The CUDA engine's sequences may use the model's whole context (limits.max_context is the CPU's
  // cache bound); admission by KV blocks bounds what they hold together.
  cuda::EngineOptions eo = engine_options(options);
  eo.max_batch = limits.max_step_rows;
  eo.max_prefill_tokens = limits.max_step_tokens;
  eo.block_size = limits.block_size;
  if (limits.kv_cache_tokens > 0) eo.kv_cache_tokens = limits.kv_cache_tokens;
  return std::make_unique<cuda::CudaEngine>(device_model(config, weights, options), eo);
#else
  fail("unreachable: CUDA engine requested in a CPU-only build");
#endif
}

}  // namespace fdpp
