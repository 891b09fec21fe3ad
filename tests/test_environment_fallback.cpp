// The front ends' environment fallback (runtime/environment_fallback.h): flags win over the FDPP_*
// variables, the variables over the defaults, bad values are one-line errors naming their origin;
// and the kernel options' thread scope (backend/cuda/kernel_options.h), which is plain C++ and so
// runs here: nested scopes restore, and threads never see each other's options.
#include <gtest/gtest.h>

#include <barrier>
#include <map>
#include <string>
#include <thread>

#include "backend/cuda/kernel_options.h"
#include "runtime/environment_fallback.h"
#include "engine/linear_chooser.h"
#include "test_util.h"

namespace fdpp {
namespace {

using cuda::DecodePath;
using cuda::KernelOptions;

// A fake environment: the lookup the functions take instead of std::getenv.
struct FakeEnv {
  std::map<std::string, std::string> vars;
  EnvironmentLookup lookup() const {
    return [this](const char* name) -> const char* {
      auto it = vars.find(name);
      return it == vars.end() ? nullptr : it->second.c_str();
    };
  }
};

TEST(EnvironmentFallback, KernelDefaultsWithoutFlagsOrVariables) {
  const FakeEnv env;
  const KernelOptions o = resolve_kernel_options({}, env.lookup());
  EXPECT_TRUE(o.programmatic_launch);
  EXPECT_FALSE(o.linear_programmatic_launch.has_value());
  EXPECT_TRUE(o.linear_programmatic());
  EXPECT_FALSE(o.split_k_programmatic_launch);
  EXPECT_TRUE(o.cublaslt_tune);
  EXPECT_EQ(o.decode_path, DecodePath::Auto);
}

TEST(EnvironmentFallback, KernelVariables) {
  FakeEnv env;
  env.vars = {{"FDPP_PDL", "0"},
              {"FDPP_FLAT_SPLIT_PDL", "1"},
              {"FDPP_CUBLASLT_TUNE", "off"},
              {"FDPP_DECODE_PATH", "core"}};
  KernelOptions o = resolve_kernel_options({}, env.lookup());
  EXPECT_FALSE(o.programmatic_launch);
  EXPECT_FALSE(o.linear_programmatic());  // as the rest
  EXPECT_TRUE(o.split_k_programmatic_launch);
  EXPECT_FALSE(o.cublaslt_tune);
  EXPECT_EQ(o.decode_path, DecodePath::Core);
  // The linear kernels apart from the rest, either way.
  env.vars["FDPP_LINEAR_PDL"] = "1";
  o = resolve_kernel_options({}, env.lookup());
  EXPECT_FALSE(o.programmatic_launch);
  EXPECT_TRUE(o.linear_programmatic());
  env.vars = {{"FDPP_LINEAR_PDL", "0"}, {"FDPP_DECODE_PATH", "mma"}};
  o = resolve_kernel_options({}, env.lookup());
  EXPECT_TRUE(o.programmatic_launch);
  EXPECT_FALSE(o.linear_programmatic());
  EXPECT_EQ(o.decode_path, DecodePath::Mma);
  // Set but empty counts as unset.
  env.vars = {{"FDPP_PDL", ""}, {"FDPP_DECODE_PATH", ""}};
  o = resolve_kernel_options({}, env.lookup());
  EXPECT_TRUE(o.programmatic_launch);
  EXPECT_EQ(o.decode_path, DecodePath::Auto);
}

TEST(EnvironmentFallback, FlagsWinOverVariables) {
  FakeEnv env;
  env.vars = {{"FDPP_PDL", "0"}, {"FDPP_DECODE_PATH", "core"}};
  KernelFlags flags;
  flags.pdl = "on";
  flags.decode_path = "mma";
  KernelOptions o = resolve_kernel_options(flags, env.lookup());
  EXPECT_TRUE(o.programmatic_launch);
  EXPECT_EQ(o.decode_path, DecodePath::Mma);
  flags.pdl = "off";
  flags.decode_path = "auto";  // auto given explicitly also wins over the variable
  o = resolve_kernel_options(flags, env.lookup());
  EXPECT_FALSE(o.programmatic_launch);
  EXPECT_EQ(o.decode_path, DecodePath::Auto);
  // A bad variable is not read when the flag is given.
  env.vars["FDPP_PDL"] = "maybe";
  EXPECT_NO_THROW(resolve_kernel_options(flags, env.lookup()));
}

TEST(EnvironmentFallback, BadValuesNameTheirOrigin) {
  FakeEnv env;
  env.vars = {{"FDPP_PDL", "yes"}};
  EXPECT_EQ(test::error_of([&] { resolve_kernel_options({}, env.lookup()); }),
            "FDPP_PDL 'yes' is not one of on, off (or 1, 0)");
  env.vars = {{"FDPP_DECODE_PATH", "tensor"}};
  EXPECT_EQ(test::error_of([&] { resolve_kernel_options({}, env.lookup()); }),
            "FDPP_DECODE_PATH 'tensor' is not one of auto, mma, core");
  env.vars = {{"FDPP_CUBLASLT_TUNE", "2"}};
  EXPECT_EQ(test::error_of([&] { resolve_kernel_options({}, env.lookup()); }),
            "FDPP_CUBLASLT_TUNE '2' is not one of on, off (or 1, 0)");
  KernelFlags flags;
  flags.pdl = "true";
  EXPECT_EQ(test::error_of([&] { resolve_kernel_options(flags, FakeEnv{}.lookup()); }),
            "--pdl 'true' is not one of on, off (or 1, 0)");
  EXPECT_EQ(test::error_of([] { parse_decode_path("gpu", "--decode-path"); }),
            "--decode-path 'gpu' is not one of auto, mma, core");
}

// Decode attention's measurement switches: warps per CTA and where async adds its splits.
TEST(EnvironmentFallback, DecodeWarpsAndAsyncCombine) {
  FakeEnv env;
  KernelOptions o = resolve_kernel_options({}, env.lookup());
  EXPECT_EQ(o.decode_warps, 0);
  EXPECT_EQ(o.async_combine, cuda::AsyncCombine::Auto);
  env.vars = {{"FDPP_DECODE_WARPS", "4"}, {"FDPP_ASYNC_COMBINE", "kernel"}};
  o = resolve_kernel_options({}, env.lookup());
  EXPECT_EQ(o.decode_warps, 4);
  EXPECT_EQ(o.async_combine, cuda::AsyncCombine::Kernel);
  KernelFlags flags;
  flags.decode_warps = "8";
  flags.async_combine = "launch";
  o = resolve_kernel_options(flags, env.lookup());
  EXPECT_EQ(o.decode_warps, 8);
  EXPECT_EQ(o.async_combine, cuda::AsyncCombine::Launch);
  EXPECT_STREQ(cuda::async_combine_name(o.async_combine), "launch");
  env.vars = {{"FDPP_DECODE_WARPS", "2"}};
  EXPECT_EQ(test::error_of([&] { resolve_kernel_options({}, env.lookup()); }),
            "FDPP_DECODE_WARPS '2' is not one of 0 (auto), 4, 8");
  EXPECT_EQ(test::error_of([] { parse_async_combine("both", "--async-combine"); }),
            "--async-combine 'both' is not one of auto, kernel, launch");
}

// The expert kernels of mixture-of-experts layers (a measurement switch, variable only).
TEST(EnvironmentFallback, MoePath) {
  FakeEnv env;
  EXPECT_EQ(resolve_kernel_options({}, env.lookup()).moe_path, cuda::MoePath::Auto);
  env.vars = {{"FDPP_MOE_PATH", "mma"}};
  EXPECT_EQ(resolve_kernel_options({}, env.lookup()).moe_path, cuda::MoePath::Mma);
  env.vars = {{"FDPP_MOE_PATH", "core"}};
  const KernelOptions o = resolve_kernel_options({}, env.lookup());
  EXPECT_EQ(o.moe_path, cuda::MoePath::Core);
  EXPECT_STREQ(cuda::moe_path_name(o.moe_path), "core");
  env.vars = {{"FDPP_MOE_PATH", "tensor"}};
  EXPECT_EQ(test::error_of([&] { resolve_kernel_options({}, env.lookup()); }),
            "FDPP_MOE_PATH 'tensor' is not one of auto, mma, core");
  // The folded norms (the same bits either way; a measurement switch, variable only).
  env.vars = {};
  EXPECT_TRUE(resolve_kernel_options({}, env.lookup()).fold_norms);
  env.vars = {{"FDPP_FOLD_NORMS", "0"}};
  EXPECT_FALSE(resolve_kernel_options({}, env.lookup()).fold_norms);
  env.vars = {{"FDPP_FOLD_NORMS", "sometimes"}};
  EXPECT_EQ(test::error_of([&] { resolve_kernel_options({}, env.lookup()); }),
            "FDPP_FOLD_NORMS 'sometimes' is not one of on, off (or 1, 0)");
}

// The KV cache layout (a measurement switch of bench-attention and, through the variable, of the
// engine's front ends): flag over variable over the default (head-major).
TEST(EnvironmentFallback, KvLayout) {
  FakeEnv env;
  EXPECT_TRUE(resolve_kernel_options({}, env.lookup()).kv_head_major);
  env.vars = {{"FDPP_KV_LAYOUT", "token-major"}};
  EXPECT_FALSE(resolve_kernel_options({}, env.lookup()).kv_head_major);
  KernelFlags flags;
  flags.kv_layout = "head-major";
  EXPECT_TRUE(resolve_kernel_options(flags, env.lookup()).kv_head_major);
  env.vars = {{"FDPP_KV_LAYOUT", "rows"}};
  EXPECT_EQ(test::error_of([&] { resolve_kernel_options({}, env.lookup()); }),
            "FDPP_KV_LAYOUT 'rows' is not one of head-major, token-major");
}

TEST(EnvironmentFallback, LinearOptions) {
  FakeEnv env;
  DispatchSelectOptions o;
  apply_linear_environment(o, env.lookup());  // nothing set: nothing changes
  EXPECT_EQ(o.mode, "");
  EXPECT_EQ(o.table_path, "");
  EXPECT_EQ(o.gemv_max_m, -1);

  env.vars = {{"FDPP_LINEAR", "cublas"}, {"FDPP_DISPATCH_TABLE", "/t.json"}, {"FDPP_GEMV_MAX_M", "8"}};
  apply_linear_environment(o, env.lookup());
  EXPECT_EQ(o.mode, "cublas");
  EXPECT_EQ(o.table_path, "/t.json");
  EXPECT_EQ(o.gemv_max_m, 8);

  // What the flags set stays.
  DispatchSelectOptions given;
  given.mode = "flat";
  given.table_path = "/given.json";
  given.gemv_max_m = 2;
  apply_linear_environment(given, env.lookup());
  EXPECT_EQ(given.mode, "flat");
  EXPECT_EQ(given.table_path, "/given.json");
  EXPECT_EQ(given.gemv_max_m, 2);

  // Bad values, named.
  env.vars = {{"FDPP_LINEAR", "gpu"}};
  DispatchSelectOptions bad;
  EXPECT_EQ(test::error_of([&] { apply_linear_environment(bad, env.lookup()); }),
            "FDPP_LINEAR='gpu' is not one of auto, gemv, flat, cublas");
  for (const char* v : {"12", "-1", "4x", "x"}) {
    env.vars = {{"FDPP_GEMV_MAX_M", v}};
    DispatchSelectOptions b;
    EXPECT_EQ(test::error_of([&] { apply_linear_environment(b, env.lookup()); }),
              std::string("FDPP_GEMV_MAX_M=") + v + " is not an integer in [0, 8]");
  }

  // The front ends' form: the flags given win, the variables fill the rest.
  env.vars = {{"FDPP_LINEAR", "cublas"}, {"FDPP_DISPATCH_TABLE", "/t.json"}, {"FDPP_GEMV_MAX_M", "4"}};
  const DispatchSelectOptions flags = resolve_linear_flags("gemv", "", env.lookup());
  EXPECT_EQ(flags.mode, "gemv");
  EXPECT_EQ(flags.table_path, "/t.json");
  EXPECT_EQ(flags.gemv_max_m, 4);
  const DispatchSelectOptions table = resolve_linear_flags("", "/flag.json", env.lookup());
  EXPECT_EQ(table.mode, "cublas");
  EXPECT_EQ(table.table_path, "/flag.json");
}

TEST(KernelOptionsScope, DefaultsNestingAndRestore) {
  EXPECT_TRUE(cuda::current_kernel_options().programmatic_launch);
  KernelOptions outer;
  outer.programmatic_launch = false;
  {
    const cuda::KernelOptionsScope a(outer);
    EXPECT_FALSE(cuda::current_kernel_options().programmatic_launch);
    KernelOptions inner;
    inner.decode_path = DecodePath::Core;
    {
      const cuda::KernelOptionsScope b(inner);
      EXPECT_TRUE(cuda::current_kernel_options().programmatic_launch);
      EXPECT_EQ(cuda::current_kernel_options().decode_path, DecodePath::Core);
    }
    EXPECT_FALSE(cuda::current_kernel_options().programmatic_launch);
    EXPECT_EQ(cuda::current_kernel_options().decode_path, DecodePath::Auto);
  }
  EXPECT_TRUE(cuda::current_kernel_options().programmatic_launch);
}

// Two engines on two threads (tensor parallelism: one per GPU) each hold a scope at the same time;
// each thread must read its own options throughout, and a third thread without a scope the defaults.
TEST(KernelOptionsScope, ThreadsDoNotShareOptions) {
  std::barrier sync(3);
  bool seen_a = false, seen_b = false, seen_default = false;
  auto run = [&](DecodePath path, bool* seen) {
    KernelOptions o;
    o.decode_path = path;
    o.programmatic_launch = path != DecodePath::Core;
    const cuda::KernelOptionsScope scope(o);
    sync.arrive_and_wait();  // every scope is open
    *seen = cuda::current_kernel_options().decode_path == path &&
            cuda::current_kernel_options().programmatic_launch == (path != DecodePath::Core);
    sync.arrive_and_wait();  // none is closed before every thread has looked
  };
  std::thread a(run, DecodePath::Mma, &seen_a);
  std::thread b(run, DecodePath::Core, &seen_b);
  std::thread c([&] {
    sync.arrive_and_wait();
    seen_default = cuda::current_kernel_options().decode_path == DecodePath::Auto &&
                   cuda::current_kernel_options().programmatic_launch;
    sync.arrive_and_wait();
  });
  a.join();
  b.join();
  c.join();
  EXPECT_TRUE(seen_a);
  EXPECT_TRUE(seen_b);
  EXPECT_TRUE(seen_default);
}

}  // namespace
}  // namespace fdpp
