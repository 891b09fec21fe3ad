#include "runtime/environment_fallback.h"

#include <charconv>
#include <cstdlib>

#include "engine/linear_chooser.h"
#include "fdpp/error.h"

namespace fdpp {

const char* process_environment(const char* name) { return std::getenv(name); }

namespace {

// The variable's value, "" when unset or empty.
std::string variable(const EnvironmentLookup& env, const char* name) {
  const char* v = env(name);
  return v != nullptr ? std::string(v) : std::string();
}

}  // namespace

bool parse_switch(const std::string& value, const std::string& origin) {
  if (value == "1" || value == "on") return true;
  if (value == "0" || value == "off") return false;
  fail("{} '{}' is not one of on, off (or 1, 0)", origin, value);
}

cuda::DecodePath parse_decode_path(const std::string& value, const std::string& origin) {
  if (value == "auto") return cuda::DecodePath::Auto;
  if (value == "mma") return cuda::DecodePath::Mma;
  if (value == "core") return cuda::DecodePath::Core;
  fail("{} '{}' is not one of auto, mma, core", origin, value);
}

cuda::MoePath parse_moe_path(const std::string& value, const std::string& origin) {
  if (value == "auto") return cuda::MoePath::Auto;
  if (value == "mma") return cuda::MoePath::Mma;
  if (value == "core") return cuda::MoePath::Core;
  fail("{} '{}' is not one of auto, mma, core", origin, value);
}

int parse_decode_warps(const std::string& value, const std::string& origin) {
  if (value == "0") return 0;
  if (value == "4") return 4;
  if (value == "8") return 8;
  fail("{} '{}' is not one of 0 (auto), 4, 8", origin, value);
}

cuda::AsyncCombine parse_async_combine(const std::string& value, const std::string& origin) {
  if (value == "auto") return cuda::AsyncCombine::Auto;
  if (value == "kernel") return cuda::AsyncCombine::Kernel;
  if (value == "launch") return cuda::AsyncCombine::Launch;
  fail("{} '{}' is not one of auto, kernel, launch", origin, value);
}

bool parse_kv_head_major(const std::string& value, const std::string& origin) {
  if (value == "head-major") return true;
  if (value == "token-major") return false;
  fail("{} '{}' is not one of head-major, token-major", origin, value);
}

cuda::KernelOptions resolve_kernel_options(const KernelFlags& flags, const EnvironmentLookup& env) {
  cuda::KernelOptions o;
  if (!flags.pdl.empty()) o.programmatic_launch = parse_switch(flags.pdl, "--pdl");
  else if (const std::string e = variable(env, "FDPP_PDL"); !e.empty()) o.programmatic_launch = parse_switch(e, "FDPP_PDL");
  if (const std::string e = variable(env, "FDPP_LINEAR_PDL"); !e.empty())
    o.linear_programmatic_launch = parse_switch(e, "FDPP_LINEAR_PDL");
  if (const std::string e = variable(env, "FDPP_FLAT_SPLIT_PDL"); !e.empty())
    o.split_k_programmatic_launch = parse_switch(e, "FDPP_FLAT_SPLIT_PDL");
  if (const std::string e = variable(env, "FDPP_CUBLASLT_TUNE"); !e.empty())
    o.cublaslt_tune = parse_switch(e, "FDPP_CUBLASLT_TUNE");
  if (!flags.decode_path.empty()) o.decode_path = parse_decode_path(flags.decode_path, "--decode-path");
  else if (const std::string e = variable(env, "FDPP_DECODE_PATH"); !e.empty())
    o.decode_path = parse_decode_path(e, "FDPP_DECODE_PATH");
  if (!flags.decode_warps.empty()) o.decode_warps = parse_decode_warps(flags.decode_warps, "--decode-warps");
  else if (const std::string e = variable(env, "FDPP_DECODE_WARPS"); !e.empty())
    o.decode_warps = parse_decode_warps(e, "FDPP_DECODE_WARPS");
  if (!flags.async_combine.empty())
    o.async_combine = parse_async_combine(flags.async_combine, "--async-combine");
  else if (const std::string e = variable(env, "FDPP_ASYNC_COMBINE"); !e.empty())
    o.async_combine = parse_async_combine(e, "FDPP_ASYNC_COMBINE");
  if (!flags.kv_layout.empty())
    o.kv_head_major = parse_kv_head_major(flags.kv_layout, "--kv-layout");
  else if (const std::string e = variable(env, "FDPP_KV_LAYOUT"); !e.empty())
    o.kv_head_major = parse_kv_head_major(e, "FDPP_KV_LAYOUT");
  if (const std::string e = variable(env, "FDPP_MOE_PATH"); !e.empty()) o.moe_path = parse_moe_path(e, "FDPP_MOE_PATH");
  if (const std::string e = variable(env, "FDPP_FOLD_NORMS"); !e.empty())
    o.fold_norms = parse_switch(e, "FDPP_FOLD_NORMS");
  return o;
}

DispatchSelectOptions resolve_linear_flags(const std::string& mode, const std::string& table,
                                           const EnvironmentLookup& env) {
  DispatchSelectOptions o;
  o.mode = mode;
  o.table_path = table;
  apply_linear_environment(o, env);
  return o;
}

void apply_linear_environment(DispatchSelectOptions& o, const EnvironmentLookup& env) {
  if (o.mode.empty()) {
    o.mode = variable(env, "FDPP_LINEAR");
    if (!o.mode.empty()) parse_linear_mode(o.mode, "FDPP_LINEAR");  // a bad value names the variable
  }
  if (o.table_path.empty()) o.table_path = variable(env, "FDPP_DISPATCH_TABLE");
  if (o.gemv_max_m < 0) {
    if (const std::string e = variable(env, "FDPP_GEMV_MAX_M"); !e.empty()) {
      const int most = LinearLimits{}.gemv_max_m;
      int v = -1;
      const char* end = e.data() + e.size();
      auto [p, ec] = std::from_chars(e.data(), end, v);
      check(ec == std::errc() && p == end && v >= 0 && v <= most, "FDPP_GEMV_MAX_M={} is not an integer in [0, {}]",
            e, most);
      o.gemv_max_m = v;
    }
  }
}

}  // namespace fdpp
