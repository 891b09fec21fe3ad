// The engine option table (runtime/engine_args.h) through every entrance that takes it: the CLI's
// flags of each front end (registered from the table as generate, logits, serve and bench do), the
// Python keywords (set_engine_option with the keyword as origin, what the binding calls), and the
// environment fallback. A bad value gets the same range and the same words everywhere.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "backend/cuda/prefill_plan.h"
#include "engine_flags.h"
#include "fdpp/error.h"
#include "runtime/engine_args.h"
#include "test_util.h"

namespace fdpp {
namespace {

// Parses `args` with the front end's flags; returns CLI11's message ("" when it parsed).
std::string cli_error(FrontEnd front_end, std::vector<std::string> args, EngineArgs* out = nullptr) {
  CLI::App app{"test"};
  EngineArgs engine;
  cli::add_engine_flags(&app, engine, front_end);
  std::reverse(args.begin(), args.end());
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    return e.what();
  }
  if (out != nullptr) *out = engine;
  return "";
}

// What the Python binding does with a keyword: the table's check with the keyword as origin.
std::string python_error(const std::string& keyword, const std::string& value) {
  const EngineOption* o = find_engine_option(keyword);
  if (o == nullptr) return "no option";
  EngineArgs a;
  return test::error_of([&] { set_engine_option(a, *o, value, keyword); });
}

// The part after "<name>: " of a message.
std::string problem_of(const std::string& message) {
  const size_t colon = message.find(": ");
  return colon == std::string::npos ? message : message.substr(colon + 2);
}

struct BadValue {
  std::string option;  // the table's name (the Python keyword)
  std::string value;
  std::string problem;  // the words every entrance must give
};

const std::vector<BadValue>& bad_values() {
  static const std::vector<BadValue> v{
      {"max_num_seqs", "4097", "4097 must be in [0, 4096]"},
      {"max_num_batched_tokens", "1048577", "1048577 must be in [0, 2^20]"},
      {"max_model_len", "-1", "-1 must be in [0, 2^24]"},
      {"kv_cache_tokens", "-5", "-5 must be in [0, 2^30]"},
      {"kv_cache_tokens", "1.5", "'1.5' is not an integer"},
      {"threads", "4097", "4097 must be in [0, 4096]"},
      {"tensor_parallel", "0", "0 must be in [1, 64]"},
      {"device", "tpu", "'tpu' is not one of auto, cpu, cuda"},
      {"dtype", "fp8", "'fp8' is not one of auto, f16, bf16, float16, half, bfloat16"},
      {"attention", "fast", "'fast' is not one of async, sync"},
      {"linear", "magic", "'magic' is not one of auto, gemv, flat, cublas"},
      {"cpu_weights", "q8", "'q8' is not one of stored, f32"},
      {"load_format", "gguf", "'gguf' is not one of auto, dummy"},
      {"pdl", "maybe", "'maybe' is not one of on, off"},
      {"gpu_memory_utilization", "0", "0 must be in (0, 1]"},
      {"gpu_memory_utilization", "1.5", "1.5 must be in (0, 1]"},
      {"gpu_memory_utilization", "most", "'most' is not a number"},
      {"gpu_memory_utilization", "nan", "'nan' is not a number"},
      {"decode_path", "simd", "'simd' is not one of auto, mma, core"},
      {"prefill_attention", "fa3",
       "'fa3' is not one of auto, m64n64, m128n64w8, m128n64w8s3, m128n32w4, wg128n128, wg128n128ws, "
       "wg128n128wst, wg128n128wst3v"},
      {"kv_cache_dtype", "int8", "'int8' is not one of auto, f32, f16, fp8, fp8_e4m3"},
      // vLLM's other fp8 is named in its refusal, not listed as unknown.
      {"kv_cache_dtype", "fp8_e5m2", "fp8_e5m2 is not supported: the fp8 KV cache is e4m3 (fp8, fp8_e4m3)"},
  };
  return v;
}

TEST(EngineArgs, TableNamesAreUniqueAndEveryOptionHasAFrontEnd) {
  std::set<std::string> names, flags;
  for (const EngineOption& o : engine_options()) {
    EXPECT_TRUE(names.insert(o.name).second) << o.name;
    for (const std::string& a : o.python_aliases) EXPECT_TRUE(names.insert(a).second) << a;
    EXPECT_NE(o.front_ends, 0u) << o.name;
    EXPECT_FALSE(o.help.empty()) << o.name;
    EXPECT_TRUE(o.assign && o.value) << o.name;
    if ((o.front_ends & ~kPython) != 0) EXPECT_FALSE(o.flags.empty()) << o.name << " has CLI users but no flag";
    // A default must pass its own check (else --help would show a value the option refuses).
    if (o.kind != OptionKind::Text && o.env.empty())
      EXPECT_EQ(option_problem(o, o.value(EngineArgs{})), "") << o.name;
  }
}

TEST(EngineArgs, BadValuesGetTheSameWordsAtEveryEntrance) {
  const std::vector<std::pair<FrontEnd, const char*>> clis{
      {kGenerate, "generate"}, {kLogits, "logits"}, {kServe, "serve"}, {kBench, "bench"}};
  int checked = 0;
  for (const BadValue& b : bad_values()) {
    const EngineOption* o = find_engine_option(b.option);
    ASSERT_NE(o, nullptr) << b.option;
    if (o->front_ends & kPython) {
      const std::string e = python_error(b.option, b.value);
      EXPECT_EQ(e, b.option + ": " + b.problem);
      ++checked;
    }
    const std::string flag = o->flags.substr(o->flags.rfind("--"));
    const std::string long_flag = o->flags.substr(o->flags.find("--"), o->flags.find(',', o->flags.find("--")) -
                                                                         o->flags.find("--"));
    for (const auto& [fe, name] : clis) {
      if ((o->front_ends & fe) == 0) {
        // An option a front end does not take is an unknown flag there, never silently accepted.
        EXPECT_NE(cli_error(fe, {long_flag, b.value}), "") << name << " " << long_flag;
        continue;
      }
      const std::string e = cli_error(fe, {long_flag, b.value});
      EXPECT_NE(e.find(b.problem), std::string::npos) << name << " " << long_flag << ": " << e;
      EXPECT_NE(e.find(long_flag.substr(0, 2) == "--" ? long_flag : flag), std::string::npos) << e;
      ++checked;
    }
  }
  EXPECT_GE(checked, 40);
}

TEST(EngineArgs, GoodValuesLandInTheArgs) {
  EngineArgs a;
  ASSERT_EQ(cli_error(kServe,
                      {"--max-num-seqs", "256", "--max-batched-tokens", "8192", "-c", "4096", "--dtype", "bfloat16",
                       "--no-cuda-graphs", "--kv-cache-tokens", "100000", "--linear", "flat", "--pdl", "off",
                       "--tensor-parallel-size", "2", "--calibration", "c.json", "-t", "3", "--cpu-weights", "f32"},
                      &a),
            "");
  EXPECT_EQ(a.max_num_seqs, 256);
  EXPECT_EQ(a.max_batched_tokens, 8192);
  EXPECT_EQ(a.max_model_len, 4096);
  EXPECT_EQ(a.dtype, "bf16");  // vLLM's spelling, normalized
  EXPECT_FALSE(a.cuda_graphs);
  EXPECT_EQ(a.kv_cache_tokens, 100000);
  EXPECT_EQ(a.linear, "flat");
  EXPECT_EQ(a.kernels.pdl, "off");
  EXPECT_EQ(a.tensor_parallel, 2);
  EXPECT_EQ(a.calibration, "c.json");
  EXPECT_EQ(a.threads, 3);
  EXPECT_EQ(a.cpu_weights, "f32");
  // A prefill configuration by name reaches the engine as its index in the tile table; auto as -1.
  EXPECT_EQ(a.runner_options("m").prefill_attention_config, -1);
  EngineArgs named;
  ASSERT_EQ(cli_error(kGenerate, {"--prefill-attention", "m128n32w4"}, &named), "");
  EXPECT_STREQ(cuda::prefill::kConfigs[named.runner_options("m").prefill_attention_config].name, "m128n32w4");
  // The Python keyword of the same option, and its alias.
  EngineArgs p;
  set_engine_option(p, *find_engine_option("tensor_parallel_size"), "4", "tensor_parallel_size");
  set_engine_option(p, *find_engine_option("cuda_graphs"), "false", "cuda_graphs");
  EXPECT_EQ(p.tensor_parallel, 4);
  EXPECT_FALSE(p.cuda_graphs);
}

TEST(EngineArgs, VllmSpellingsReachTheEngine) {
  EngineArgs a;
  ASSERT_EQ(cli_error(kServe, {"--gpu-memory-utilization", "0.5", "--enforce-eager"}, &a), "");
  EXPECT_EQ(a.gpu_memory_utilization, 0.5);
  EXPECT_FALSE(a.cuda_graphs);
  EXPECT_EQ(a.runner_options("").memory_fraction, 0.5);
  EXPECT_FALSE(a.runner_options("").cuda_graphs);
  // The default is the CUDA engine's own share, so that not giving it changes nothing.
  EXPECT_EQ(EngineArgs{}.runner_options("").memory_fraction, RunnerOptions{}.memory_fraction);
  EngineArgs b;
  set_engine_option(b, *find_engine_option("gpu_memory_utilization"), "1", "gpu_memory_utilization");
  EXPECT_EQ(b.gpu_memory_utilization, 1.0);
  // --gpu-weights reaches the runner (the GPU's GGUF blocks or their 16-bit conversion).
  EngineArgs g;
  EXPECT_EQ(g.runner_options("").gpu_weights, "stored");
  ASSERT_EQ(cli_error(kGenerate, {"--gpu-weights", "dequantized"}, &g), "");
  EXPECT_EQ(g.runner_options("").gpu_weights, "dequantized");
  EXPECT_NE(cli_error(kGenerate, {"--gpu-weights", "f16"}), "");
  // quantization="awq" / "gptq" / "gguf" (and the marlin spellings) name the checkpoint's method: they reach
  // the runner as the method, need no GPU, and a dummy model (no checkpoint) refuses them.
  for (const auto& [given, method] : {std::pair{"awq", "awq"}, std::pair{"awq_marlin", "awq"},
                                      std::pair{"gptq", "gptq"}, std::pair{"gptq_marlin", "gptq"},
                                      std::pair{"gguf", "gguf"}}) {
    EngineArgs q;
    ASSERT_EQ(cli_error(kGenerate, {"--quantization", given, "--device", "cpu"}, &q), "") << given;
    EXPECT_EQ(q.runner_options("").quantization, method);
    EXPECT_NO_THROW(q.check());
    q.device = "auto";
    q.load_format = "dummy";
    q.config = "configs/llama-2-7b.json";
    EXPECT_NE(test::error_of([&] { q.check(); }).find("names a checkpoint's method"), std::string::npos) << given;
  }
}

TEST(EngineArgs, CrossOptionRulesNameBothOptions) {
  EngineArgs a;
  a.device = "cpu";
  a.tensor_parallel = 2;
  EXPECT_NE(test::error_of([&] { a.check(); }).find("--tensor-parallel 2"), std::string::npos);
  EXPECT_NE(test::error_of([&] { a.check(true); }).find("tensor_parallel=2"), std::string::npos);
  EngineArgs d;
  d.load_format = "dummy";
  EXPECT_NE(test::error_of([&] { d.check(); }).find("--config"), std::string::npos);
  EngineArgs s;
  s.max_num_seqs = 512;
  s.max_batched_tokens = 256;
  EXPECT_NE(test::error_of([&] { s.check(); }).find("--max-num-seqs 512 with --max-batched-tokens 256: max-batched-tokens (256) must exceed"),
            std::string::npos);
  EngineArgs n;
  n.n_gpu_layers = 0;
  n.max_num_seqs = 0;  // automatic: never a conflict with a given max_batched_tokens
  n.max_batched_tokens = 1;
  EXPECT_NO_THROW(n.check());
  EXPECT_EQ(n.requested_device(), Device::Cpu);  // llama.cpp's -ngl 0
  n.device = "cuda";
  EXPECT_NE(test::error_of([&] { n.check(); }), "");
}

// --kv-cache-dtype fp8 (vLLM's kv_cache_dtype="fp8", alias fp8_e4m3): every front end with a device
// takes it, bench too (the same table); it reaches the runner options as "fp8"; the CPU refuses it
// naming the option, as a flag and as a keyword.
TEST(EngineArgs, KvCacheDtypeFp8IsTheGpusAndNamedWhereRefused) {
  for (const FrontEnd fe : {kGenerate, kLogits, kServe, kBench})
    for (const std::string spelling : {"fp8", "fp8_e4m3"}) {
      EngineArgs a;
      ASSERT_EQ(cli_error(fe, {"--kv-cache-dtype", spelling}, &a), "") << fe << " " << spelling;
      EXPECT_EQ(a.kv_cache_dtype, "fp8");
      EXPECT_EQ(a.runner_options("").kv_cache_dtype, "fp8");
      EXPECT_NO_THROW(a.check());  // device auto: the backend decides
    }
  EngineArgs p;
  set_engine_option(p, *find_engine_option("kv_cache_dtype"), "fp8_e4m3", "kv_cache_dtype");
  EXPECT_EQ(p.kv_cache_dtype, "fp8");
  p.device = "cpu";
  const std::string keyword = test::error_of([&] { p.check(true); });
  EXPECT_NE(keyword.find("kv_cache_dtype=fp8"), std::string::npos) << keyword;
  EXPECT_NE(keyword.find("runs on the CUDA backend"), std::string::npos) << keyword;
  EXPECT_NE(keyword.find("device=cpu"), std::string::npos) << keyword;
  const std::string flag = test::error_of([&] { p.check(); });
  EXPECT_NE(flag.find("--kv-cache-dtype fp8"), std::string::npos) << flag;
  EXPECT_NE(flag.find("--device cpu"), std::string::npos) << flag;
  EngineArgs ngl;
  ngl.kv_cache_dtype = "fp8";
  ngl.n_gpu_layers = 0;
  EXPECT_NE(test::error_of([&] { ngl.check(); }).find("-ngl/--n-gpu-layers 0"), std::string::npos);
  // The CUDA backend's reading: auto and fp8; the CPU's types are refused by name.
  EXPECT_FALSE(cuda_kv_cache_fp8("auto"));
  EXPECT_TRUE(cuda_kv_cache_fp8("fp8"));
  for (const char* cpu_only : {"f32", "f16"}) {
    const std::string e = test::error_of([&] { cuda_kv_cache_fp8(cpu_only); });
    EXPECT_NE(e.find(std::string("--kv-cache-dtype ") + cpu_only), std::string::npos) << e;
    EXPECT_NE(e.find("CPU backend's"), std::string::npos) << e;
  }
}

// Step sizes left automatic (0) are the backend's: large on the GPU, small on the CPU, and an automatic
// one always fits the one given (a step holds every running row and one prefill token).
TEST(EngineArgs, AutomaticStepSizesPerDeviceFitTheGivenOne) {
  EngineArgs a;
  EXPECT_EQ(a.step_sizes(Device::Cuda).max_num_seqs, 512);
  EXPECT_EQ(a.step_sizes(Device::Cuda).max_batched_tokens, 8192);
  EXPECT_EQ(a.step_sizes(Device::Cpu).max_num_seqs, 64);
  EXPECT_EQ(a.step_sizes(Device::Cpu).max_batched_tokens, 2048);
  const EngineLimits l = a.engine_limits(Device::Cuda);
  EXPECT_EQ(l.max_step_rows, 512);
  EXPECT_EQ(l.max_step_tokens, 8192);
  // fdpp serve's shorter automatic GPU step: the rows stay, the tokens shrink; a given value wins.
  EngineArgs served;
  served.auto_gpu_step_tokens = 2048;
  EXPECT_EQ(served.step_sizes(Device::Cuda).max_num_seqs, 512);
  EXPECT_EQ(served.step_sizes(Device::Cuda).max_batched_tokens, 2048);
  served.max_batched_tokens = 8192;
  EXPECT_EQ(served.step_sizes(Device::Cuda).max_batched_tokens, 8192);
  const SchedulerOptions so = a.scheduler_options(Device::Cpu, 7);
  EXPECT_EQ(so.max_num_seqs, 64);
  EXPECT_EQ(so.max_batched_tokens, 2048);
  EXPECT_EQ(so.max_waiting, 7);
  // An automatic batch takes the engine's rows and lets the KV cache decide, with room kept for
  // the outputs; a given value is a plain limit (vLLM's admission by the tokens so far).
  EXPECT_EQ(a.scheduler_options(Device::Cuda, 7).max_num_seqs, 512);
  EXPECT_TRUE(a.scheduler_options(Device::Cuda, 7).reserve_growth);
  EXPECT_TRUE(so.reserve_growth);
  EXPECT_EQ(a.scheduler_options(Device::Cuda, 7).max_batched_tokens, 8192);
  EngineArgs given;
  given.max_num_seqs = 100;
  EXPECT_EQ(given.scheduler_options(Device::Cuda, 7).max_num_seqs, 100);
  EXPECT_FALSE(given.scheduler_options(Device::Cuda, 7).reserve_growth);
  for (Device d : {Device::Cpu, Device::Cuda}) {
    for (int seqs : {0, 1, 100, 4096})
      for (int tokens : {0, 2, 50, 9000}) {
        if (seqs == 0 && tokens == 0) continue;
        EngineArgs g;
        g.max_num_seqs = seqs;
        g.max_batched_tokens = tokens;
        const EngineArgs::StepSizes s = g.step_sizes(d);
        if (seqs > 0) EXPECT_EQ(s.max_num_seqs, seqs);
        if (tokens > 0) EXPECT_EQ(s.max_batched_tokens, tokens);
        if (seqs == 0 || tokens == 0)
          EXPECT_EQ(step_size_problem(s.max_num_seqs, s.max_batched_tokens), "") << seqs << " " << tokens;
      }
  }
}

// The table's env column is the variable the front ends fall back to: setting it gives the options
// the flag gives.
TEST(EngineArgs, EnvironmentColumnMatchesTheFallback) {
  const std::map<std::string, std::string> values{
      {"linear", "gemv"}, {"dispatch_table", "/tmp/t.json"}, {"pdl", "off"}, {"decode_path", "core"}};
  int with_env = 0;
  for (const EngineOption& o : engine_options()) {
    if (o.env.empty()) continue;
    ++with_env;
    ASSERT_TRUE(values.count(o.name)) << o.name << " has an environment variable this test does not know";
    const std::string v = values.at(o.name);
    EngineArgs by_flag;
    set_engine_option(by_flag, o, v, o.flags);
    const std::string env_name = o.env;
    const EnvironmentLookup env = [&](const char* name) -> const char* {
      return env_name == name ? v.c_str() : nullptr;
    };
    const EnvironmentLookup none = [](const char*) -> const char* { return nullptr; };
    const RunnerOptions a = by_flag.runner_options("", none), b = EngineArgs{}.runner_options("", env);
    EXPECT_EQ(a.linear, b.linear) << o.name;
    EXPECT_EQ(a.dispatch_table, b.dispatch_table) << o.name;
    EXPECT_EQ(a.kernels.programmatic_launch, b.kernels.programmatic_launch) << o.name;
    EXPECT_EQ(a.kernels.decode_path, b.kernels.decode_path) << o.name;
    // And the flag wins over the variable.
    EngineArgs defaults_flag;
    std::string other = "/x";
    if (o.kind == OptionKind::Choice)
      for (const std::string& c : o.choices)
        if (c != v) other = c;
    set_engine_option(defaults_flag, o, other, o.flags);
    const RunnerOptions c = defaults_flag.runner_options("", env);
    EXPECT_TRUE(c.linear != b.linear || c.dispatch_table != b.dispatch_table ||
                c.kernels.programmatic_launch != b.kernels.programmatic_launch ||
                c.kernels.decode_path != b.kernels.decode_path)
        << o.name << ": the variable overrode the flag";
  }
  EXPECT_EQ(with_env, 4);
}

}  // namespace
}  // namespace fdpp

namespace fdpp {
namespace {

// --dtype auto on the GPU: bf16 for a checkpoint stored mostly in bf16 (an f16 copy of it can
// overflow), f16 for f16/f32 ones and without a plan; an explicit dtype is kept.
TEST(GpuDtype, AutoFollowsTheStoredWeights) {
  auto tensor = [](gguf::GgmlType type, int64_t rows) {
    PlannedTensor t;
    t.shape = {rows, 64};
    t.src.type = type;
    return t;
  };
  WeightPlan bf16_plan;
  bf16_plan.tensors = {tensor(gguf::GgmlType::BF16, 64), tensor(gguf::GgmlType::F32, 1)};
  WeightPlan f16_plan;
  f16_plan.tensors = {tensor(gguf::GgmlType::F16, 64), tensor(gguf::GgmlType::BF16, 1)};
  EXPECT_EQ(gpu_dtype("auto", &bf16_plan), "bf16");
  EXPECT_EQ(gpu_dtype("auto", &f16_plan), "f16");
  EXPECT_EQ(gpu_dtype("auto", nullptr), "f16");
  EXPECT_EQ(gpu_dtype("f16", &bf16_plan), "f16");
  EXPECT_EQ(gpu_dtype("bf16", &f16_plan), "bf16");
}

}  // namespace
}  // namespace fdpp
