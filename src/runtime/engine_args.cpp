#include "runtime/engine_args.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>

#include "backend/cuda/prefill_plan.h"
#include "engine/linear_chooser.h"
#include "engine/scheduler.h"
#include "fdpp/error.h"

namespace fdpp {

namespace {

constexpr uint32_t kModelUsers = kGenerate | kLogits | kServe | kPython | kBench;
constexpr uint32_t kRunners = kGenerate | kLogits | kServe | kPython;  // a device of their choice
constexpr uint32_t kEngines = kGenerate | kServe | kPython;            // many sequences at once

std::string bool_text(bool b) { return b ? "true" : "false"; }

EngineOption text(std::string name, std::string flags, uint32_t users, std::string help,
                  std::string EngineArgs::*field, std::string env = "") {
  EngineOption o;
  o.name = std::move(name);
  o.flags = std::move(flags);
  o.env = std::move(env);
  o.front_ends = users;
  o.kind = OptionKind::Text;
  o.help = std::move(help);
  o.assign = [field](EngineArgs& a, const std::string& v) { a.*field = v; };
  o.value = [field](const EngineArgs& a) { return a.*field; };
  return o;
}

EngineOption choice(std::string name, std::string flags, uint32_t users, std::string help,
                    std::vector<std::string> choices, std::string EngineArgs::*field, std::string env = "") {
  EngineOption o = text(std::move(name), std::move(flags), users, std::move(help), field, std::move(env));
  o.kind = OptionKind::Choice;
  o.choices = std::move(choices);
  return o;
}

template <class Int>
EngineOption integer(std::string name, std::string flags, uint32_t users, std::string help, int64_t lo, int64_t hi,
                     Int EngineArgs::*field) {
  EngineOption o;
  o.name = std::move(name);
  o.flags = std::move(flags);
  o.front_ends = users;
  o.kind = OptionKind::Integer;
  o.lo = lo;
  o.hi = hi;
  o.help = std::move(help);
  o.assign = [field](EngineArgs& a, const std::string& v) { a.*field = static_cast<Int>(std::stoll(v)); };
  o.value = [field](const EngineArgs& a) { return std::to_string(a.*field); };
  return o;
}

std::string range_text(int64_t lo, int64_t hi) {
  auto side = [](int64_t v) {
    for (int p = 16; p < 63; ++p)
      if (v == (int64_t{1} << p)) return fmt::format("2^{}", p);
    return std::to_string(v);
  };
  return fmt::format("[{}, {}]", side(lo), side(hi));
}

std::vector<EngineOption> build_table() {
  std::vector<EngineOption> t;
  t.push_back(text("model", "-m,--model", kModelUsers,
                   "GGUF file or Hugging Face model directory (default: the default model)", &EngineArgs::model));
  t.push_back(choice("load_format", "--load-format", kGenerate | kServe | kPython | kBench,
                     "auto (read the model) or dummy (random weights of --config on the GPU, for measuring)",
                     {"auto", "dummy"}, &EngineArgs::load_format));
  t.push_back(text("config", "--config", kGenerate | kServe | kPython | kBench,
                   "config.json of the model shapes for --load-format dummy (see configs/)", &EngineArgs::config));
  t.push_back(choice("device", "--device", kRunners, "auto (CUDA when a GPU is present), cpu or cuda",
                     {"auto", "cpu", "cuda"}, &EngineArgs::device));
  {
    EngineOption o = choice("dtype", "--dtype", kModelUsers,
                            "CUDA weight and activation type: auto (bf16 for bf16 checkpoints, else f16), f16 or "
                            "bf16 (float16, half, bfloat16 too); the CPU computes in fp32",
                            {"auto", "f16", "bf16", "float16", "half", "bfloat16"}, &EngineArgs::dtype);
    o.assign = [](EngineArgs& a, const std::string& v) {
      a.dtype = v == "float16" || v == "half" ? "f16" : v == "bfloat16" ? "bf16" : v;
    };
    t.push_back(std::move(o));
  }
  {
    EngineOption o = choice("quantization", "--quantization", kModelUsers,
                            "none; fp8 (CUDA: the layers' weights in e4m3 with a scale per output row, quantized at "
                            "load; activations quantized per token where FP8 tensor cores run); int4 (CUDA: the "
                            "layers' weights in 4 bits, groups of 128 with a zero point, rounded to nearest at load); "
                            "or awq / gptq / gguf (also awq_marlin, gptq_marlin, as vLLM spells them): the checkpoint's own "
                            "method, checked against it. Embeddings and lm head stay 16-bit. AWQ, GPTQ and FP8 "
                            "checkpoints run as stored whatever this says",
                            {"none", "fp8", "int4", "awq", "gptq", "gguf", "awq_marlin", "gptq_marlin"},
                            &EngineArgs::quantization);
    o.assign = [](EngineArgs& a, const std::string& v) {
      a.quantization = v == "awq_marlin" ? "awq" : v == "gptq_marlin" ? "gptq" : v;
    };
    t.push_back(std::move(o));
  }
  t.push_back(integer("kv_cache_tokens", "--kv-cache-tokens", kRunners,
                      "KV cache size in tokens (0: sized by the engine: on the GPU what memory leaves)", 0,
                      int64_t{1} << 30, &EngineArgs::kv_cache_tokens));
  {
    EngineOption o = choice("kv_cache_dtype", "--kv-cache-dtype", kRunners | kBench,
                            "KV cache element type: auto (CPU: fp32, the reference; CUDA: the model's 16-bit "
                            "dtype), f32 or f16 (CPU: half the cache memory, as llama.cpp's default), or fp8 "
                            "(CUDA: e4m3 with the checkpoint's per-layer scales, else 1 as vLLM's uncalibrated fp8: "
                            "twice the tokens in the same memory; fp8_e4m3 too)",
                            {"auto", "f32", "f16", "fp8", "fp8_e4m3"}, &EngineArgs::kv_cache_dtype);
    o.refused = {{"fp8_e5m2", "fp8_e5m2 is not supported: the fp8 KV cache is e4m3 (fp8, fp8_e4m3)"}};
    o.assign = [](EngineArgs& a, const std::string& v) { a.kv_cache_dtype = v == "fp8_e4m3" ? "fp8" : v; };
    t.push_back(std::move(o));
  }
  t.push_back(integer("max_num_seqs", "--max-num-seqs", kEngines, "sequences running at once (rows of a step; 0: as many as the KV cache holds with room for their outputs, "
                      "at most 512 on the GPU and 64 on the CPU)",
                      0, 4096, &EngineArgs::max_num_seqs));
  t.push_back(integer("max_num_batched_tokens", "--max-batched-tokens,--max-num-batched-tokens", kEngines,
                      "tokens of one engine step, prefill chunks and decode rows together (0: on the GPU 8192, 2048 in serve; 2048 on the CPU)",
                      0, 1 << 20,
                      &EngineArgs::max_batched_tokens));
  t.push_back(integer("max_model_len", "-c,--ctx-size,--max-model-len", kEngines,
                      "context per sequence, prompt + output (0: the model's)", 0, 1 << 24,
                      &EngineArgs::max_model_len));
  {
    EngineOption o;
    o.name = "cuda_graphs";
    o.flags = "--no-cuda-graphs";
    o.front_ends = kModelUsers;
    o.kind = OptionKind::Switch;
    o.flag_value = false;
    o.help = "launch the decode steps eagerly instead of replaying CUDA graphs (for comparison)";
    o.assign = [](EngineArgs& a, const std::string& v) { a.cuda_graphs = v == "true"; };
    o.value = [](const EngineArgs& a) { return bool_text(a.cuda_graphs); };
    t.push_back(std::move(o));
  }
  {
    EngineOption o;
    o.name = "gpu_memory_utilization";
    o.flags = "--gpu-memory-utilization";
    o.front_ends = kServe | kPython;
    o.kind = OptionKind::Real;
    o.help = "CUDA: the share of the GPU memory left free by the weights that the KV cache takes when "
             "--kv-cache-tokens is not given (vLLM's name; vLLM counts the weights in); no effect on the CPU";
    o.assign = [](EngineArgs& a, const std::string& v) { a.gpu_memory_utilization = std::stod(v); };
    o.value = [](const EngineArgs& a) { return fmt::format("{}", a.gpu_memory_utilization); };
    t.push_back(std::move(o));
  }
  {
    // vLLM's spelling of --no-cuda-graphs: the same field, inverted.
    EngineOption o;
    o.name = "enforce_eager";
    o.flags = "--enforce-eager";
    o.front_ends = kServe | kPython;
    o.kind = OptionKind::Switch;
    o.flag_value = true;
    o.help = "vLLM's name for --no-cuda-graphs: launch the decode steps eagerly";
    o.assign = [](EngineArgs& a, const std::string& v) { a.cuda_graphs = v != "true"; };
    o.value = [](const EngineArgs& a) { return bool_text(!a.cuda_graphs); };
    t.push_back(std::move(o));
  }
  {
    // vLLM's keyword (async_scheduling); SGLang's --disable-overlap-schedule is a second spelling.
    EngineOption o;
    o.name = "async_scheduling";
    o.flags = "--no-async-scheduling,--disable-overlap-schedule";
    o.front_ends = kEngines;
    o.kind = OptionKind::Switch;
    o.flag_value = false;
    o.help = "schedule and launch each step after the previous one's tokens are back, instead of while "
             "it computes (the GPU's default; the results are the same, the host's work is then exposed)";
    o.assign = [](EngineArgs& a, const std::string& v) { a.overlap_steps = v == "true"; };
    o.value = [](const EngineArgs& a) { return bool_text(a.overlap_steps); };
    t.push_back(std::move(o));
  }
  {
    // vLLM's keyword; its CLI's --no-enable-prefix-caching is accepted as a second spelling.
    EngineOption o;
    o.name = "enable_prefix_caching";
    o.flags = "--no-prefix-cache,--no-enable-prefix-caching";
    o.front_ends = kEngines;
    o.kind = OptionKind::Switch;
    o.flag_value = false;
    o.help = "turn off automatic prefix caching (a prompt's beginning shared with an earlier request is "
             "otherwise taken from the KV cache instead of being computed again; the results are the same)";
    o.assign = [](EngineArgs& a, const std::string& v) { a.prefix_caching = v == "true"; };
    o.value = [](const EngineArgs& a) { return bool_text(a.prefix_caching); };
    t.push_back(std::move(o));
  }
  {
    EngineOption o;
    o.name = "free_window_blocks";
    o.flags = "--no-free-window-blocks";
    o.front_ends = kGenerate | kServe;
    o.kind = OptionKind::Switch;
    o.flag_value = false;
    o.help = "keep every position in the KV cache of a model whose every layer slides (its blocks behind "
             "the window are otherwise given back as sequences grow; the results are the same)";
    o.assign = [](EngineArgs& a, const std::string& v) { a.free_window_blocks = v == "true"; };
    o.value = [](const EngineArgs& a) { return bool_text(a.free_window_blocks); };
    t.push_back(std::move(o));
  }
  t.push_back(choice("attention", "--attention", kModelUsers,
                     "CUDA decode attention: async (unified max, FlashDecoding++) or sync (FlashDecoding)",
                     {"async", "sync"}, &EngineArgs::attention));
  {
    std::vector<std::string> configs{"auto"};
    for (const cuda::prefill::TileConfig& c : cuda::prefill::kConfigs) configs.emplace_back(c.name);
    t.push_back(choice("prefill_attention", "--prefill-attention", kModelUsers,
                       "CUDA prefill attention's tile configuration: auto (the engine's choice per GPU and chunk "
                       "length) or one by name (wg* need an sm_90a build and GPU; one that does not run at the "
                       "model's head dim gives way to the default)",
                       std::move(configs), &EngineArgs::prefill_attention));
  }
  t.push_back(choice("linear", "--linear", kModelUsers,
                     "CUDA linear layers: auto (the tuned dispatch table), gemv, flat or cublas", 
                     {"auto", "gemv", "flat", "cublas"}, &EngineArgs::linear, "FDPP_LINEAR"));
  t.push_back(text("dispatch_table", "--dispatch-table", kModelUsers,
                   "dispatch table file from fdpp tune (default: looked up beside the model, then configs/dispatch)",
                   &EngineArgs::dispatch_table, "FDPP_DISPATCH_TABLE"));
  {
    EngineOption o = choice("pdl", "--pdl", kModelUsers,
                            "CUDA: programmatic dependent launch of the decode step's kernels, on or off (default: on)",
                            {"on", "off"}, nullptr, "FDPP_PDL");
    o.assign = [](EngineArgs& a, const std::string& v) { a.kernels.pdl = v; };
    o.value = [](const EngineArgs& a) { return a.kernels.pdl; };
    t.push_back(std::move(o));
  }
  {
    EngineOption o = choice("decode_path", "--decode-path", kModelUsers,
                            "CUDA decode attention's loop: auto, mma (tensor cores) or core (CUDA cores; head dims "
                            "64, 128)",
                            {"auto", "mma", "core"}, nullptr, "FDPP_DECODE_PATH");
    o.assign = [](EngineArgs& a, const std::string& v) { a.kernels.decode_path = v; };
    o.value = [](const EngineArgs& a) { return a.kernels.decode_path; };
    t.push_back(std::move(o));
  }
  t.push_back(text("calibration", "--calibration", kModelUsers,
                   "unified-max calibration file from fdpp calibrate (default: <model>.fdpp-calib.json, else the "
                   "cache)",
                   &EngineArgs::calibration));
  t.push_back(integer("threads", "-t,--threads", kRunners,
                      "CPU backend threads (0: $OMP_NUM_THREADS, else the physical cores)", 0, 4096,
                      &EngineArgs::threads));
  t.push_back(choice("cpu_weights", "--cpu-weights", kRunners,
                     "CPU weights: stored (GGUF blocks used in place, the fast path) or f32 (dequantized, the "
                     "reference)",
                     {"stored", "f32"}, &EngineArgs::cpu_weights));
  t.push_back(choice("gpu_weights", "--gpu-weights", kModelUsers,
                     "GPU weights of a GGUF file: stored (its layer matrices in their Q4_0/Q4_1/Q8_0/Q4_K/Q5_K/Q6_K "
                     "blocks, a quarter to half the memory, faster decode of a few tokens) or dequantized (to "
                     "--dtype at load, faster prefill and large batches for now)",
                     {"stored", "dequantized"}, &EngineArgs::gpu_weights));
  {
    EngineOption o = integer("tensor_parallel", "--tensor-parallel,--tensor-parallel-size", kModelUsers,
                             "split the model over this many GPUs of the host (-tp; NCCL; 1: one GPU)", 1, 64,
                             &EngineArgs::tensor_parallel);
    o.python_aliases = {"tensor_parallel_size"};
    t.push_back(std::move(o));
  }
  t.push_back(integer("n_gpu_layers", "--n-gpu-layers,--gpu-layers", kRunners & ~kPython,
                      "llama.cpp's -ngl: accepted; every layer runs on the GPU when there is one, 0 means the CPU", -1,
                      1 << 20, &EngineArgs::n_gpu_layers));
  t.push_back(text("step_log", "--step-log", kGenerate | kServe | kPython,
                   "write one JSON line per scheduler step to this file: its rows, tokens and host and engine "
                   "times (bench/step_timeline.py summarizes it)",
                   &EngineArgs::step_log));
  return t;
}

}  // namespace

const std::vector<EngineOption>& engine_options() {
  static const std::vector<EngineOption> table = build_table();
  return table;
}

const EngineOption* find_engine_option(const std::string& name) {
  for (const EngineOption& o : engine_options()) {
    if (o.name == name) return &o;
    if (std::find(o.python_aliases.begin(), o.python_aliases.end(), name) != o.python_aliases.end()) return &o;
  }
  return nullptr;
}

std::string option_problem(const EngineOption& o, const std::string& value) {
  switch (o.kind) {
    case OptionKind::Text:
      return "";
    case OptionKind::Choice: {
      if (std::find(o.choices.begin(), o.choices.end(), value) != o.choices.end()) return "";
      for (const auto& [name, why] : o.refused)
        if (name == value) return why;
      std::string list;
      for (const std::string& c : o.choices) list += (list.empty() ? "" : ", ") + c;
      return fmt::format("'{}' is not one of {}", value, list);
    }
    case OptionKind::Integer: {
      int64_t v = 0;
      const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
      if (value.empty() || ec != std::errc() || end != value.data() + value.size())
        return fmt::format("'{}' is not an integer", value);
      if (v < o.lo || v > o.hi) return fmt::format("{} must be in {}", value, range_text(o.lo, o.hi));
      return "";
    }
    case OptionKind::Switch:
      return value == "true" || value == "false" ? "" : fmt::format("'{}' is not true or false", value);
    case OptionKind::Real: {
      double v = 0;
      const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
      if (value.empty() || ec != std::errc() || end != value.data() + value.size() || !std::isfinite(v))
        return fmt::format("'{}' is not a number", value);
      if (!(v > o.real_lo && v <= o.real_hi)) return fmt::format("{} must be in ({}, {}]", value, o.real_lo, o.real_hi);
      return "";
    }
  }
  return "";
}

void set_engine_option(EngineArgs& args, const EngineOption& option, const std::string& value,
                       const std::string& origin) {
  if (const std::string p = option_problem(option, value); !p.empty()) fail("{}: {}", origin, p);
  option.assign(args, value);
}

Device EngineArgs::requested_device() const {
  if (n_gpu_layers == 0 && device == "auto") return Device::Cpu;  // llama.cpp's -ngl 0: nothing on the GPU
  return parse_device(device);
}

void EngineArgs::check(bool python) const {
  auto name = [python](const char* keyword, const char* flag) { return python ? keyword : flag; };
  // "tensor_parallel=2" in Python, "--tensor-parallel 2" on the command line.
  auto given = [python](const char* keyword, const char* flag, auto value) {
    return python ? fmt::format("{}={}", keyword, value) : fmt::format("{} {}", flag, value);
  };
  fdpp::check(!(n_gpu_layers == 0 && device == "cuda"),
              "-ngl/--n-gpu-layers 0 asks for no GPU layers but --device cuda for the GPU; give one of them");
  fdpp::check(!(tensor_parallel > 1 && device == "cpu"), "{} splits a model over GPUs; it cannot be combined with {}",
              given("tensor_parallel", "--tensor-parallel", tensor_parallel), given("device", "--device", "cpu"));
  fdpp::check(!quantizes_at_load(quantization) || (device != "cpu" && n_gpu_layers != 0),
              "{} runs on the CUDA backend; it cannot be combined with {}",
              given("quantization", "--quantization", quantization),
              n_gpu_layers == 0 ? std::string("-ngl/--n-gpu-layers 0") : given("device", "--device", "cpu"));
  fdpp::check(kv_cache_dtype != "fp8" || (device != "cpu" && n_gpu_layers != 0),
              "{} (an e4m3 KV cache) runs on the CUDA backend; it cannot be combined with {} (the CPU's KV cache "
              "takes auto, f32 or f16)",
              given("kv_cache_dtype", "--kv-cache-dtype", kv_cache_dtype),
              n_gpu_layers == 0 ? std::string("-ngl/--n-gpu-layers 0") : given("device", "--device", "cpu"));
  fdpp::check(!quantizes_at_load(quantization) || tensor_parallel == 1, "{} with {} is not supported yet",
              given("quantization", "--quantization", quantization),
              given("tensor_parallel", "--tensor-parallel", tensor_parallel));
  fdpp::check(load_format != "dummy" || !config.empty(), "{} dummy needs {} FILE.json (see configs/)",
              name("load_format", "--load-format"), name("config", "--config"));
  fdpp::check(load_format != "dummy" || device != "cpu",
              "{} dummy builds random weights on the GPU; it has no CPU form", name("load_format", "--load-format"));
  fdpp::check(load_format != "dummy" || !names_checkpoint_method(quantization),
              "{} names a checkpoint's method, and {} dummy has no checkpoint (int4 quantizes random weights)",
              given("quantization", "--quantization", quantization), name("load_format", "--load-format"));
  if (max_num_seqs == 0 || max_batched_tokens == 0) return;  // the automatic one is chosen to fit
  if (const std::string p = step_size_problem(max_num_seqs, max_batched_tokens); !p.empty())
    fail("{} with {}: {}", given("max_num_seqs", "--max-num-seqs", max_num_seqs),
         given("max_num_batched_tokens", "--max-batched-tokens", max_batched_tokens), p);
}

RunnerOptions EngineArgs::runner_options(const std::string& model_path, const EnvironmentLookup& env) const {
  RunnerOptions o;
  o.device = requested_device();
  o.dtype = dtype;
  o.quantization = quantization;
  o.gpu_weights = gpu_weights;
  o.kv_cache_tokens = kv_cache_tokens;
  o.kv_cache_dtype = kv_cache_dtype;
  o.cuda_graphs = cuda_graphs;
  o.memory_fraction = gpu_memory_utilization;
  o.attention = attention;
  o.prefill_attention_config = prefill_attention_config_index();
  const DispatchSelectOptions lin = resolve_linear_flags(linear, dispatch_table, env);
  o.linear = lin.mode;
  o.dispatch_table = lin.table_path;
  o.gemv_max_m = lin.gemv_max_m;
  o.model_path = model_path;
  o.kernels = resolve_kernel_options(kernels, env);
  o.threads = threads;
  o.calibration = calibration;
  o.tensor_parallel = tensor_parallel;
  return o;
}

int EngineArgs::prefill_attention_config_index() const {
  for (int i = 0; i < cuda::prefill::kNumConfigs; ++i)
    if (prefill_attention == cuda::prefill::kConfigs[i].name) return i;
  return -1;
}

EngineArgs::StepSizes EngineArgs::step_sizes(Device d) const {
  const bool gpu = d == Device::Cuda;
  StepSizes s{max_num_seqs, max_batched_tokens};
  if (s.max_batched_tokens == 0) s.max_batched_tokens = std::max(gpu ? auto_gpu_step_tokens : 2048, s.max_num_seqs + 1);
  if (s.max_num_seqs == 0) s.max_num_seqs = std::min(gpu ? kAutoGpuSeqs : 64, std::max(1, s.max_batched_tokens - 1));
  return s;
}

EngineLimits EngineArgs::engine_limits(Device d) const {
  const StepSizes s = step_sizes(d);
  EngineLimits l;
  l.max_context = max_model_len;
  l.max_step_rows = s.max_num_seqs;
  l.max_step_tokens = s.max_batched_tokens;
  l.kv_cache_tokens = kv_cache_tokens;
  l.free_window_blocks = free_window_blocks;
  return l;
}

SchedulerOptions EngineArgs::scheduler_options(Device d, int max_waiting) const {
  const StepSizes s = step_sizes(d);
  SchedulerOptions o;
  o.max_num_seqs = s.max_num_seqs;
  // An automatic batch runs as many of the engine's rows as the KV cache holds with room for
  // their outputs (SchedulerOptions::reserve_growth).
  o.reserve_growth = max_num_seqs == 0;
  o.max_batched_tokens = s.max_batched_tokens;
  o.max_waiting = max_waiting;
  o.step_log = step_log;
  o.prefix_caching = prefix_caching;
  o.overlap_steps = overlap_steps;
  return o;
}

}  // namespace fdpp
