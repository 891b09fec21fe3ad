// Every option of an engine in one table, as llama.cpp's common/arg.cpp and vLLM's EngineArgs keep
// them: each option's CLI flags, its Python keyword, its environment fallback and the front ends
// that take it. The CLI registers its flags from the table (tools/fdpp/engine_flags.h), `fdpp serve`
// too, and the Python package passes its keywords through it (python/src/bindings.cpp), so a range,
// a choice or a message is written once.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/scheduler.h"
#include "runtime/backend_select.h"
#include "runtime/environment_fallback.h"

namespace fdpp {

// The front ends, as a bit set: which of them take an option.
enum FrontEnd : uint32_t {
  kGenerate = 1u << 0,  // fdpp generate (one prompt, or a prompts file with --file)
  kLogits = 1u << 1,    // fdpp logits
  kServe = 1u << 2,     // fdpp serve
  kPython = 1u << 3,    // fdpp.LLM(...)
  kBench = 1u << 4,     // fdpp bench (CUDA)
};

struct EngineArgs {
  std::string model;                 // "": the default model
  std::string load_format = "auto";  // auto: read `model`; dummy: random weights of `config` (CUDA)
  std::string config;                // config.json for load_format dummy
  std::string device = "auto";       // auto, cpu, cuda
  std::string dtype = "auto";        // CUDA weights: auto, f16, bf16
  std::string quantization = "none";  // none, fp8, int4 (CUDA, at load), awq, gptq, gguf (the checkpoint's)
  int64_t kv_cache_tokens = 0;       // 0: sized by the engine
  std::string kv_cache_dtype = "auto";  // RunnerOptions::kv_cache_dtype (fp8_e4m3 stored as fp8)
  int max_num_seqs = 0;              // sequences in one step; 0: auto (step_sizes)
  int max_batched_tokens = 0;        // tokens in one step; 0: auto (step_sizes)
  int max_model_len = 0;             // context per sequence; 0: the model's
  bool cuda_graphs = true;
  bool prefix_caching = true;        // automatic prefix caching (serve, Python, generate --file)
  bool overlap_steps = true;         // SchedulerOptions::overlap_steps (async_scheduling)
  bool free_window_blocks = true;    // give back KV blocks behind every layer's window (Engine)
  // CUDA: the share of the GPU memory left free by the weights that the KV cache takes when
  // kv_cache_tokens does not size it (vLLM's gpu_memory_utilization; vLLM counts the weights in).
  double gpu_memory_utilization = 0.90;
  std::string attention = "async";   // async (unified max) or sync
  std::string prefill_attention = "auto";  // CUDA prefill attention: auto or a tile configuration's name
  std::string linear;                // "": $FDPP_LINEAR, else auto
  std::string dispatch_table;        // "": $FDPP_DISPATCH_TABLE, else looked up
  KernelFlags kernels;               // --pdl, --decode-path ("": the variables, else defaults)
  std::string calibration;           // "": looked up beside the model, then in the cache
  int threads = 0;                   // CPU threads; 0: $OMP_NUM_THREADS, else the physical cores
  std::string cpu_weights = "stored";  // CPU: stored (GGUF blocks in place) or f32 (the reference)
  std::string gpu_weights = "stored";  // CUDA: stored (GGUF layer matrices in their blocks) or dequantized
  int tensor_parallel = 1;           // GPUs the model is split over
  int n_gpu_layers = -1;             // llama.cpp's -ngl; -1: not given, 0: the CPU
  std::string step_log;              // "": none; else a JSON line per scheduler step (bench/step_timeline.py)

  // Cross-option rules (a -ngl 0 with --device cuda, tensor parallelism on the CPU): throws
  // fdpp::Error naming both. `python` spells them as keywords.
  void check(bool python = false) const;
  // The device after -ngl 0 ("auto" with -ngl 0 is the CPU, as in llama.cpp).
  Device requested_device() const;
  // The backend options these args give; model_path is where calibration and dispatch tables are
  // looked up. The FDPP_* variables fill what no flag set (environment_fallback.h).
  RunnerOptions runner_options(const std::string& model_path,
                               const EnvironmentLookup& env = process_environment) const;
  // max_num_seqs and max_batched_tokens on `device`, the automatic ones (0) filled in: the GPU's
  // step is sized for throughput at load (up to kAutoGpuSeqs rows, 8192 tokens, as vLLM's and
  // LMDeploy's servers on large GPUs), the CPU's for latency (64 rows, 2048 tokens). An automatic
  // value fits the given one (a step holds every running row plus one prefill token). On the GPU
  // this is what the engine is sized for; the scheduler then runs as many as its cache holds
  // with room for their outputs (scheduler_options).
  struct StepSizes {
    int max_num_seqs = 0;
    int max_batched_tokens = 0;
  };
  static constexpr int kAutoGpuSeqs = 512;
  // The GPU's automatic step tokens: 8192 for throughput (generate -f, Python), 2048 in fdpp serve,
  // where a step's prefill chunks delay every stream's next token (docs/PERFORMANCE.md, Throughput
  // and FP8 weights: the chat workload served at rate inf with ITL p99 58.7 ms instead of 200 and
  // the same output tokens/s).
  int auto_gpu_step_tokens = 8192;
  StepSizes step_sizes(Device device) const;
  // prefill_attention as an index of cuda::prefill::kConfigs; -1 for auto (the choice checked it).
  int prefill_attention_config_index() const;
  // The limits of an engine that serves many sequences (serve, Python, generate --file) on `device`.
  EngineLimits engine_limits(Device device) const;
  // The scheduler over such an engine: an automatic batch takes up to the engine's rows, admitted
  // while the KV cache holds them and room for their outputs (SchedulerOptions::reserve_growth).
  SchedulerOptions scheduler_options(Device device, int max_waiting) const;
};

enum class OptionKind {
  Text,     // any string (a path)
  Choice,   // one of `choices`
  Integer,  // a whole number in [lo, hi]
  Switch,   // a boolean: the CLI flag takes no value and sets `flag_value`; Python takes a bool
  Real,     // a number in (real_lo, real_hi]: a fraction
};

struct EngineOption {
  std::string name;    // the Python keyword (vLLM's spelling where it has one)
  std::string flags;   // CLI spellings in CLI11's form, "-c,--ctx-size" ("": none)
  std::string env;     // environment variable that stands in for a flag not given ("": none)
  uint32_t front_ends = 0;
  OptionKind kind = OptionKind::Text;
  std::vector<std::string> choices;  // Choice: the accepted spellings
  // Choice: spellings refused with their own reason (one line) instead of "is not one of".
  std::vector<std::pair<std::string, std::string>> refused;
  int64_t lo = 0, hi = 0;            // Integer: the closed range
  double real_lo = 0, real_hi = 1;   // Real: the range, open below (a fraction of nothing is no option)
  bool flag_value = true;            // Switch: what the CLI flag sets
  std::string help;
  std::vector<std::string> python_aliases;  // other keywords Python accepts (tensor_parallel_size)
  // Stores a value that option_problem accepted ("true"/"false" for a Switch).
  std::function<void(EngineArgs&, const std::string&)> assign;
  // The value as text, for help and tests.
  std::function<std::string(const EngineArgs&)> value;
};

// --quantization values that quantize the weights at load (CUDA), and those that name the method a
// checkpoint was published in (vLLM's quantization="awq", "gguf"; open_model checks it against the model).
inline bool quantizes_at_load(const std::string& q) { return q == "fp8" || q == "int4"; }
inline bool names_checkpoint_method(const std::string& q) { return q == "awq" || q == "gptq" || q == "gguf"; }

// The table, in the order --help lists it.
const std::vector<EngineOption>& engine_options();
// The option of a name or Python alias; null when there is none.
const EngineOption* find_engine_option(const std::string& name);
// Why `value` is not acceptable for the option ("" when it is): "0 must be in [1, 4096]", "'x' is not
// one of auto, cpu, cuda", "'1.5' is not an integer". The same words at every front end; each
// prefixes its own name for the option (--max-num-seqs, max_num_seqs).
std::string option_problem(const EngineOption& option, const std::string& value);
// Checks and stores; throws fdpp::Error "<origin>: <problem>".
void set_engine_option(EngineArgs& args, const EngineOption& option, const std::string& value,
                       const std::string& origin);

}  // namespace fdpp
