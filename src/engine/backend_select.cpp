#include "engine/backend_select.h"

#include <omp.h>

#include "backend/cpu/cpu_runner.h"
#include "backend/cpu/thread_pool.h"
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

std::unique_ptr<Runner> make_runner(const ModelConfig& config, const DecoderWeights& weights, int max_context,
                                    const RunnerOptions& options) {
  const Device device = resolve_device(options.device);
  if (device == Device::Cpu) {
    cpu::set_num_threads(options.cpu_threads);
    if (options.cpu_threads > 0) omp_set_num_threads(options.cpu_threads);
    return std::make_unique<CpuRunner>(config, weights, max_context);
  }
#ifdef FDPP_HAVE_CUDA
  cuda::DType dtype = cuda::DType::F16;
  if (options.dtype == "bf16") dtype = cuda::DType::BF16;
  else check(options.dtype == "f16" || options.dtype == "auto", "--dtype '{}' is not one of auto, f16, bf16", options.dtype);
  auto model = std::make_shared<const cuda::DeviceModel>(config, weights, dtype);
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
  return std::make_unique<cuda::CudaRunner>(std::move(model), max_context, eo);
#else
  fail("unreachable: CUDA runner requested in a CPU-only build");
#endif
}

}  // namespace fdpp
