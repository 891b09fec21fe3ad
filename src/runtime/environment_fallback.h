// The FDPP_* variables that stand in for flags the front ends (the fdpp CLI, the Python package)
// were not given. The library reads none of them: an engine's switches are its options
// (cuda::EngineOptions::kernels, DispatchSelectOptions), so that two engines in one process (one
// per GPU under tensor parallelism, or a test beside a benchmark) can differ, and a front end
// reads the environment once, here, where a flag is missing. A flag always wins over a variable.
//
//   variable              flag                 option
//   FDPP_PDL=0|1          --pdl off|on         KernelOptions::programmatic_launch
//   FDPP_LINEAR_PDL=0|1   (none)               KernelOptions::linear_programmatic_launch
//   FDPP_FLAT_SPLIT_PDL   (none)               KernelOptions::split_k_programmatic_launch
//   FDPP_CUBLASLT_TUNE    (none)               KernelOptions::cublaslt_tune
//   FDPP_DECODE_PATH      --decode-path        KernelOptions::decode_path (auto|mma|core)
//   FDPP_DECODE_WARPS     --decode-warps       KernelOptions::decode_warps (0|4|8; bench-attention)
//   FDPP_ASYNC_COMBINE    --async-combine      KernelOptions::async_combine (auto|kernel|launch;
//                                              bench-attention)
//   FDPP_KV_LAYOUT        --kv-layout          KernelOptions::kv_head_major (head-major|token-major;
//                                              bench-attention)
//   FDPP_MOE_PATH         (none)               KernelOptions::moe_path (auto|mma|core)
//   FDPP_FOLD_NORMS       (none)               KernelOptions::fold_norms
//   FDPP_LINEAR           --linear             DispatchSelectOptions::mode
//   FDPP_DISPATCH_TABLE   --dispatch-table     DispatchSelectOptions::table_path
//   FDPP_GEMV_MAX_M       (none)               DispatchSelectOptions::gemv_max_m
// Switches take 0|1|off|on; a variable set to the empty string counts as unset. A value that is
// none of the allowed ones is an error naming the flag or the variable.
//
// Plain C++17 (no CUDA): the CPU-only build, its tests and the standalone kernel benchmarks (.cu)
// include it.
#pragma once

#include <functional>
#include <string>

#include "backend/cuda/kernel_options.h"

namespace fdpp {

struct DispatchSelectOptions;  // engine/linear_chooser.h

// name -> value or null, as std::getenv (tests pass their own).
using EnvironmentLookup = std::function<const char*(const char*)>;
const char* process_environment(const char* name);

// The kernel switches a front end has flags for ("": not given).
struct KernelFlags {
  std::string pdl;          // on|off
  std::string decode_path;  // auto|mma|core
  // Flags of bench-attention only (measurement switches); the variables reach every front end.
  std::string decode_warps;   // 0|4|8
  std::string async_combine;  // auto|kernel|launch
  std::string kv_layout;      // head-major|token-major
};

// flags where given, else the variables, else KernelOptions' defaults.
cuda::KernelOptions resolve_kernel_options(const KernelFlags& flags,
                                           const EnvironmentLookup& env = process_environment);

// Fills the fields of `o` that are not set (mode and table_path empty, gemv_max_m -1) from
// FDPP_LINEAR, FDPP_DISPATCH_TABLE and FDPP_GEMV_MAX_M.
void apply_linear_environment(DispatchSelectOptions& o, const EnvironmentLookup& env = process_environment);
// A front end's --linear and --dispatch-table ("": not given) with the variables filling the rest:
// what every front end passes on as the linear mode, dispatch table and gemv_max_m.
DispatchSelectOptions resolve_linear_flags(const std::string& mode, const std::string& table,
                                           const EnvironmentLookup& env = process_environment);

// The parsers behind both, for flags given as strings; `origin` names the flag or variable in
// errors ("--pdl", "FDPP_PDL").
bool parse_switch(const std::string& value, const std::string& origin);
cuda::DecodePath parse_decode_path(const std::string& value, const std::string& origin);
int parse_decode_warps(const std::string& value, const std::string& origin);
cuda::MoePath parse_moe_path(const std::string& value, const std::string& origin);
cuda::AsyncCombine parse_async_combine(const std::string& value, const std::string& origin);
// true for head-major, false for token-major.
bool parse_kv_head_major(const std::string& value, const std::string& origin);

}  // namespace fdpp
