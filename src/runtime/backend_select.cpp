#include "runtime/backend_select.h"

#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <set>
#include <utility>

#include "attention/calibration.h"
#include "backend/cpu/cpu_engine.h"
#include "backend/cpu/cpu_runner.h"
#include "backend/cpu/thread_pool.h"
#include "engine/engine_runner.h"
#include "runtime/engine_args.h"
#include "runtime/environment_fallback.h"
#include "engine/linear_chooser.h"
#include "fdpp/error.h"
#ifdef FDPP_HAVE_CUDA
#include "backend/cuda/cuda_engine.h"
#include "backend/cuda/tensor_parallel_engine.h"
#include "backend/cuda/device_query.h"
#endif

namespace fdpp {

Device parse_device(const std::string& name) {
  if (name == "auto") return Device::Auto;
  if (name == "cpu") return Device::Cpu;
  if (name == "cuda") return Device::Cuda;
  fail("--device '{}' is not one of auto, cpu, cuda", name);
}

std::string gpu_dtype(const std::string& requested, const WeightPlan* plan) {
  if (requested != "auto") return requested;
  if (plan == nullptr) return "f16";
  int64_t bf16 = 0, other_float = 0;
  for (const PlannedTensor& t : plan->tensors) {
    if (t.src.type == gguf::GgmlType::BF16) bf16 += t.numel();
    else if (t.src.type == gguf::GgmlType::F16 || t.src.type == gguf::GgmlType::F32) other_float += t.numel();
  }
  return bf16 > other_float ? "bf16" : "f16";
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

std::string device_description(Device d, int gpus) {
  if (d != Device::Cuda) return device_name(d);
#ifdef FDPP_HAVE_CUDA
  const std::vector<cuda::GpuInfo> list = cuda::list_gpus();
  if (!list.empty())
    return gpus > 1 ? fmt::format("cuda ({} x {})", gpus, list.front().name) : fmt::format("cuda ({})", list.front().name);
#endif
  return device_name(d);
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
    // OMP_NUM_THREADS is the user's explicit choice; keep it (for the CPU backend's pool too).
    // Otherwise one thread per physical core: hyperthreads share a core's FMA units and only add
    // contention to these loops.
    if (const char* env = std::getenv("OMP_NUM_THREADS"); env != nullptr && *env != '\0') {
      cpu::set_num_threads(std::atoi(env));  // 0 or garbage: the physical cores
      return;
    }
    threads = physical_cpu_cores();
  }
  // The pool runs every CPU loop of a forward pass (thread_pool.h); OpenMP only the dequantization
  // at load.
  cpu::set_num_threads(threads);
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

namespace {

// Checked on every device: --dtype garbage is an error on the CPU too, not silently ignored.
void check_dtype(const RunnerOptions& options) {
  check(options.dtype == "f16" || options.dtype == "bf16" || options.dtype == "auto",
        "--dtype '{}' is not one of auto, f16, bf16", options.dtype);
  check(options.quantization == "none" || quantizes_at_load(options.quantization) ||
            names_checkpoint_method(options.quantization),
        "--quantization '{}' is not one of none, fp8, int4, awq, gptq, gguf", options.quantization);
}

// --quantization fp8 and int4 are CUDA features of one GPU so far.
void check_quantization_device(const RunnerOptions& options, Device device) {
  if (!quantizes_at_load(options.quantization)) return;
  check(device == Device::Cuda,
        "--quantization {} runs on the CUDA backend (the CPU runs GGUF files in their stored blocks instead)",
        options.quantization);
  check(options.tensor_parallel == 1, "--quantization {} with --tensor-parallel {} is not supported yet",
        options.quantization, options.tensor_parallel);
}

// The CPU backend's share of the options: its threads, and a calibration file the user named, which
// must fit the model even though the CPU's exact attention does not use phi.
void prepare_cpu(const ModelConfig& config, const RunnerOptions& options) {
  if (!options.calibration.empty()) resolve_unified_max_phi(config, options);
  set_cpu_threads(options.threads);
}

}  // namespace

#ifdef FDPP_HAVE_CUDA
namespace {
constexpr uint64_t kDummySeed = 1234;  // fdpp bench --load-format dummy's

// What the GPU needs beyond the weights, before any of it is allocated: the KV cache of kv_tokens
// (K and V of every layer, kv_elem_bytes each: 2, or 1 with an fp8 cache) and an estimate of a step
// of step_tokens (activations of 16 bits, fp32 logits for every token) plus the 512 MiB the engine
// keeps as headroom.
cuda::GpuMemoryNeed memory_need(const ModelConfig& c, const WeightPlan& plan, int64_t kv_tokens, int64_t step_tokens,
                                size_t kv_elem_bytes, bool gguf_blocks) {
  cuda::GpuMemoryNeed need;
  need.weights = cuda::plan_device_bytes(plan, gguf_blocks);
  need.kv_tokens = kv_tokens;
  need.kv_cache = static_cast<uint64_t>(kv_tokens) * 2 * c.n_layers * static_cast<uint64_t>(c.kv_dim()) * kv_elem_bytes;
  uint64_t per_token = (4 * static_cast<uint64_t>(c.hidden) + c.q_dim() + 2 * c.kv_dim() + 3 * c.ffn_hidden) * 2 +
                      static_cast<uint64_t>(c.vocab_size) * 6;
  // Expert layers: router logits and each pick's rows (moe.h), padding aside.
  if (c.has_moe())
    per_token += static_cast<uint64_t>(c.n_experts) * 4 +
                 static_cast<uint64_t>(c.n_experts_used) * (12 + 2 * (c.expert_ffn_hidden + c.hidden));
  need.activations = static_cast<uint64_t>(step_tokens) * per_token + (uint64_t{512} << 20);
  // 4-bit layers above the flat GEMM's rows, and GGUF blocks above the block GEMV's: the largest
  // matrix dequantized to 16 bits (int4.h, gguf_blocks.h).
  const bool packed =
      std::any_of(plan.tensors.begin(), plan.tensors.end(), [](const PlannedTensor& t) { return t.packed(); }) ||
      (gguf_blocks && !gguf_gpu_block_tensors(plan).empty());
  if (packed) {
    const uint64_t H = c.hidden, gated = c.activation == Activation::SwiGLU || c.activation == Activation::GeGLU;
    need.activations += 2 * std::max({H * (c.q_dim() + 2 * c.kv_dim()), H * c.q_dim(), (1 + gated) * H * c.ffn_hidden});
  }
  return need;
}

std::shared_ptr<const cuda::DeviceModel> device_model(const ModelConfig& config, const DecoderWeights& weights,
                                                      const RunnerOptions& options, int64_t kv_tokens,
                                                      int64_t step_tokens) {
  const std::string chosen = gpu_dtype(options.dtype, options.dummy_weights ? nullptr : options.plan);
  check(chosen == "f16" || chosen == "bf16", "--dtype '{}' is not one of auto, f16, bf16", options.dtype);
  const cuda::DType dtype = chosen == "bf16" ? cuda::DType::BF16 : cuda::DType::F16;
  auto quantized = [&](cuda::DeviceModel m) {
    // A checkpoint stored in FP8 or 4 bits runs as stored (vLLM does the same).
    if (options.quantization == "fp8" && !m.int4()) m.quantize_fp8();
    if (options.quantization == "int4" && !m.fp8()) m.quantize_int4();
    return std::make_shared<const cuda::DeviceModel>(std::move(m));
  };
  if (options.dummy_weights) return quantized(cuda::DeviceModel::dummy(config, dtype, kDummySeed));
  if (options.plan == nullptr) return quantized(cuda::DeviceModel(config, weights, dtype));
  // fp8 quantizes after the 16-bit load, one matrix at a time: the 16-bit need is the peak.
  const cuda::KvDType kv_dtype = cuda_kv_cache_fp8(options.kv_cache_dtype) ? cuda::KvDType::Fp8E4M3 : cuda::KvDType::Model;
  // A GGUF file's layer matrices stay in their blocks unless asked otherwise or to be quantized.
  const bool gguf_blocks = options.gpu_weights == "stored" && !quantizes_at_load(options.quantization);
  cuda::check_gpu_memory(
      memory_need(config, *options.plan, kv_tokens, step_tokens, cuda::kv_element_bytes(kv_dtype), gguf_blocks));
  cuda::StreamOptions so;
  if (options.load_progress)
    so.progress = [&options](const cuda::StreamProgress& p) {
      options.load_progress(p.tensors_done, p.tensors_total, p.bytes_done, p.bytes_total, p.seconds);
    };
  return quantized(cuda::DeviceModel::from_plan(config, *options.plan, dtype, so, nullptr, gguf_blocks));
}

cuda::EngineOptions engine_options(const ModelConfig& config, const RunnerOptions& options) {
  cuda::EngineOptions eo;
  eo.kv_cache_tokens = options.kv_cache_tokens;
  eo.cuda_graphs = options.cuda_graphs;
  eo.memory_fraction = options.memory_fraction;
  check(options.attention == "async" || options.attention == "sync", "--attention '{}' is not one of async, sync",
        options.attention);
  eo.attention = options.attention == "sync" ? cuda::AttentionMode::Sync : cuda::AttentionMode::Async;
  if (options.attention == "async" || !options.calibration.empty())
    eo.unified_max_phi = resolve_unified_max_phi(config, options);
  eo.prefill_attention_config = options.prefill_attention_config;
  eo.linear_mode = options.linear;
  eo.model_path = options.model_path;
  eo.dispatch_table = options.dispatch_table;
  eo.gemv_max_m = options.gemv_max_m;
  eo.kernels = options.kernels;
  // The scales come with the model (ModelConfig::kv_cache_scales, 1 where the checkpoint has none).
  if (cuda_kv_cache_fp8(options.kv_cache_dtype)) eo.kv_quant.dtype = cuda::KvDType::Fp8E4M3;
  return eo;
}

std::unique_ptr<Engine> tensor_parallel_engine(const ModelConfig& config, const DecoderWeights& weights,
                                               const RunnerOptions& options, const EngineLimits& limits) {
  cuda::EngineOptions eo = engine_options(config, options);
  eo.max_batch = limits.max_step_rows;
  eo.max_prefill_tokens = limits.max_step_tokens;
  eo.block_size = limits.block_size;
  if (limits.kv_cache_tokens > 0) eo.kv_cache_tokens = limits.kv_cache_tokens;
  if (options.plan != nullptr)
    for (const PlannedTensor& t : options.plan->tensors)
      check(!t.fp8() && !t.packed(),
            "an {} checkpoint with --tensor-parallel {} is not supported yet (it runs on one GPU)",
            t.fp8() ? "FP8" : "AWQ/GPTQ", options.tensor_parallel);
  cuda::ShardSource source;
  // Weights already in host memory (tests, formats without a plan) are sharded through a plan of
  // the same tensors, so every path splits the same way.
  WeightPlan in_memory;
  if (options.plan == nullptr && !options.dummy_weights) in_memory = plan_from_weights(weights, config);
  source.plan = options.dummy_weights ? nullptr : options.plan != nullptr ? options.plan : &in_memory;
  source.dtype = gpu_dtype(options.dtype, source.plan) == "bf16" ? cuda::DType::BF16 : cuda::DType::F16;
  source.dummy_seed = kDummySeed;
  source.kv_tokens = eo.kv_cache_tokens > 0 ? eo.kv_cache_tokens : config.max_context / 8 + eo.block_size;
  source.step_tokens = eo.max_prefill_tokens;
  if (options.load_progress)
    source.stream.progress = [&options](const cuda::StreamProgress& p) {
      options.load_progress(p.tensors_done, p.tensors_total, p.bytes_done, p.bytes_total, p.seconds);
    };
  return std::make_unique<cuda::TensorParallelEngine>(config, options.tensor_parallel, source, eo);
}
}  // namespace
#endif

bool cuda_kv_cache_fp8(const std::string& kv_cache_dtype) {
  check(kv_cache_dtype == "auto" || kv_cache_dtype == "fp8",
        "--kv-cache-dtype {}: the CUDA backend's KV cache holds the model's 16-bit dtype (auto) or e4m3 (fp8); f32 "
        "and f16 are the CPU backend's choices",
        kv_cache_dtype);
  return kv_cache_dtype == "fp8";
}

namespace {
void check_kv_cache_dtype_cuda(const RunnerOptions& options) { cuda_kv_cache_fp8(options.kv_cache_dtype); }
// The CPU backend's caches are fp32 and f16 (CpuEngine); reached with --device auto on a machine
// without a GPU (an explicit --device cpu is refused earlier, by EngineArgs::check).
void check_kv_cache_dtype_cpu(const RunnerOptions& options) {
  check(options.kv_cache_dtype == "auto" || options.kv_cache_dtype == "f32" || options.kv_cache_dtype == "f16",
        "--kv-cache-dtype {} runs on the CUDA backend; the CPU backend's KV cache takes auto, f32 or f16",
        options.kv_cache_dtype);
}
}  // namespace

std::unique_ptr<Runner> make_runner(const ModelConfig& config, const DecoderWeights& weights, int max_context,
                                    const RunnerOptions& options) {
  check_dtype(options);
  const Device device = resolve_device(options.device);
  check_quantization_device(options, device);
  if (device == Device::Cpu) {
    check(options.tensor_parallel == 1,
          "tensor parallelism over {} GPUs needs the CUDA backend (the CPU backend runs a model whole)",
          options.tensor_parallel);
    check_kv_cache_dtype_cpu(options);
    prepare_cpu(config, options);
    return std::make_unique<CpuRunner>(config, weights, max_context, options.kv_cache_dtype == "f16");
  }
  check_kv_cache_dtype_cuda(options);
  // One sequence on an engine of its own: the runner's forward passes are its steps.
  EngineLimits limits;
  limits.max_context = max_context;
  limits.max_step_rows = 1;
  limits.max_step_tokens = std::min(2048, max_context);
  limits.kv_cache_tokens = options.kv_cache_tokens > 0 ? options.kv_cache_tokens : max_context;
  return std::make_unique<EngineRunner>(make_engine(config, weights, options, limits), max_context);
}

#ifdef FDPP_HAVE_CUDA
namespace {
ModelConfig cuda_attention_config(const ModelConfig& config);
std::unique_ptr<Engine> make_cuda_engine(const ModelConfig& config, const DecoderWeights& weights,
                                         const RunnerOptions& options, const EngineLimits& limits);
}  // namespace
#endif

std::unique_ptr<Engine> make_engine(const ModelConfig& config, const DecoderWeights& weights,
                                    const RunnerOptions& options, const EngineLimits& limits) {
  check_dtype(options);
  const Device device = resolve_device(options.device);
  check_quantization_device(options, device);
  if (device == Device::Cpu) {
    check(options.tensor_parallel == 1,
          "tensor parallelism over {} GPUs needs the CUDA backend (the CPU backend runs a model whole)",
          options.tensor_parallel);
    check(!options.dummy_weights, "--load-format dummy builds random weights on the GPU; it has no CPU form");
    check_kv_cache_dtype_cpu(options);
    prepare_cpu(config, options);
    return std::make_unique<CpuEngine>(config, weights, limits, options.kv_cache_dtype == "f16");
  }
  check_kv_cache_dtype_cuda(options);
#ifdef FDPP_HAVE_CUDA
  return make_cuda_engine(config, weights, options, limits);
#else
  fail("unreachable: CUDA engine requested in a CPU-only build");
#endif
}

#ifdef FDPP_HAVE_CUDA
namespace {
// Tensor parallelism runs no sliding window yet. A window at least as long as the context drops no
// key, so full attention is exact there: the GPUs run such a model with its context capped at the
// shortest window (README, supported models). One GPU runs the windows.
ModelConfig cuda_attention_config(const ModelConfig& config) {
  ModelConfig c = config;
  for (int w : config.layer_windows)
    if (w > 0 && w < c.max_context) c.max_context = w;
  c.layer_windows.clear();
  return c;
}

std::unique_ptr<Engine> make_cuda_engine(const ModelConfig& config, const DecoderWeights& weights,
                                         const RunnerOptions& options, const EngineLimits& limits) {
  // Refused before any weight is streamed to the GPU.
  if (const std::string problem = cuda::cuda_model_problem(config); !problem.empty()) fail("{}", problem);
  if (options.tensor_parallel > 1) {
    const ModelConfig capped = cuda_attention_config(config);
    if (const std::string problem = cuda::tensor_parallel_model_problem(capped); !problem.empty())
      fail("--tensor-parallel {}: {}", options.tensor_parallel, problem);
    return tensor_parallel_engine(capped, weights, options, limits);
  }
  // The CUDA engine's sequences may use the model's whole context (limits.max_context is the CPU's
  // cache bound); admission by KV blocks bounds what they hold together.
  cuda::EngineOptions eo = engine_options(config, options);
  eo.max_batch = limits.max_step_rows;
  eo.max_prefill_tokens = limits.max_step_tokens;
  eo.block_size = limits.block_size;
  if (limits.kv_cache_tokens > 0) eo.kv_cache_tokens = limits.kv_cache_tokens;
  // Without a size the engine takes what is free; it needs at least an eighth of one context.
  const int64_t kv_tokens = eo.kv_cache_tokens > 0 ? eo.kv_cache_tokens : config.max_context / 8 + eo.block_size;
  return std::make_unique<cuda::CudaEngine>(device_model(config, weights, options, kv_tokens, eo.max_prefill_tokens),
                                            eo);
}
}  // namespace
#endif

}  // namespace fdpp
