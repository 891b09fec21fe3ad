#include "engine/backend_select.h"

#include <omp.h>
#include <sched.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <utility>

#include "attention/calibration.h"
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

int physical_cpu_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return omp_get_num_procs();
  // A core is (package, core id); its hyperthreads share it. Any unreadable file: fall back.
  std::set<std::pair<int, int>> cores;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &set)) continue;
    const std::string dir = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
    std::ifstream pkg(dir + "physical_package_id"), core(dir + "core_id");
    int p = -1, c = -1;
    if (!(pkg >> p) || !(core >> c)) return CPU_COUNT(&set);
    cores.emplace(p, c);
  }
  return cores.empty() ? CPU_COUNT(&set) : static_cast<int>(cores.size());
}

void set_cpu_threads(int threads) {
  check(threads >= 0, "--threads {}: must be >= 0 (0: the physical cores)", threads);
  if (threads == 0) {
    // OMP_NUM_THREADS is the user's explicit choice; keep it. Otherwise one thread per physical
    // core: hyperthreads share a core's FMA units and only add contention to these loops.
    if (const char* env = std::getenv("OMP_NUM_THREADS"); env != nullptr && *env != '\0') return;
    threads = physical_cpu_cores();
  }
  omp_set_num_threads(threads);
}

std::vector<float> resolve_unified_max_phi(const ModelConfig& config, const RunnerOptions& options) {
  if (!options.unified_max_phi.empty()) return options.unified_max_phi;
  std::optional<Calibration> cal;
  if (!options.calibration.empty()) {
    cal = load_calibration(options.model_path, options.calibration);
  } else if (!options.model_path.empty()) {
    cal = load_calibration(options.model_path);
  }
  std::vector<float> phi;
  if (!cal) return phi;
  check(static_cast<int>(cal->layers.size()) == config.n_layers, "{}: calibration has {} layers, the model {}",
        cal->path, cal->layers.size(), config.n_layers);
  for (const LayerCalibration& l : cal->layers) phi.push_back(l.bounds.phi);
  return phi;
}

std::unique_ptr<Runner> make_runner(const ModelConfig& config, const DecoderWeights& weights, int max_context,
                                    const RunnerOptions& options) {
  const Device device = resolve_device(options.device);
  check(options.dtype == "f16" || options.dtype == "bf16" || options.dtype == "auto",
        "--dtype '{}' is not one of auto, f16, bf16", options.dtype);
  if (device == Device::Cpu) {
    // The CPU's attention is exact and needs no phi, but a calibration file the user named must
    // still be one that fits this model.
    if (!options.calibration.empty()) resolve_unified_max_phi(config, options);
    set_cpu_threads(options.threads);
    return std::make_unique<CpuRunner>(config, weights, max_context);
  }
#ifdef FDPP_HAVE_CUDA
  cuda::DType dtype = cuda::DType::F16;
  if (options.dtype == "bf16") dtype = cuda::DType::BF16;
  auto model = std::make_shared<const cuda::DeviceModel>(config, weights, dtype);
  cuda::EngineOptions eo;
  eo.kv_cache_tokens = options.kv_cache_tokens;
  eo.cuda_graphs = options.cuda_graphs;
  check(options.attention == "async" || options.attention == "sync", "--attention '{}' is not one of async, sync",
        options.attention);
  eo.attention = options.attention == "sync" ? cuda::AttentionMode::Sync : cuda::AttentionMode::Async;
  if (options.attention == "async" || !options.calibration.empty())
    eo.unified_max_phi = resolve_unified_max_phi(config, options);
  eo.linear_mode = options.linear;
  eo.model_path = options.model_path;
  eo.dispatch_table = options.dispatch_table;
  return std::make_unique<cuda::CudaRunner>(std::move(model), max_context, eo);
#else
  fail("unreachable: CUDA runner requested in a CPU-only build");
#endif
}

}  // namespace fdpp
