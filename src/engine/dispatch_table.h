// Heuristic dataflow (FlashDecoding++ section 5, DESIGN.md idea 3), the table format: which of
// the three linear-layer implementations runs y[M, N] = x[M, K] . W[N, K]^T for a given M and
// weight shape [N, K] on a given GPU and dtype, as `fdpp tune` measured it and files hold it.
//
//   Gemv    ImplA, CUDA-core GEMV            M <= LinearLimits::gemv_max_m (kGemvMaxM = 8)
//   Flat    ImplB, flat GEMM on tensor cores M <= LinearLimits::flat_max_m (kFlatGemmMaxM = 64)
//   Cublas  ImplC, cuBLASLt                  any M
//
// Per [N, K], a table gives the implementation for every M as a list of ranges "from M = a on, use
// X" (the curves can cross more than once, so two crossover points are not always enough; M1 and
// M2 are kept as the summary: M1 = the first M not run by GEMV, M2 = the M from which cuBLAS runs
// every larger M). Table files (JSON, format "fdpp-linear-dispatch", see
// configs/dispatch/README.md) hold one table per (GPU name, SM count, dtype); this header reads,
// validates and writes them and says where they live. What the engine asks at run time is in
// engine/linear_chooser.h (the lookup order, the fallback rule, forced modes); what only fdpp tune
// needs (ranges from measurements, merging into a file) is in tools/fdpp/tune_table.h.
//
// Plain C++ (no CUDA), so that the CPU test binary and CPU-only builds have it.
#pragma once

#include <nlohmann/json.hpp>

#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fdpp {

enum class LinearImpl { Gemv = 0, Flat = 1, Cublas = 2 };
constexpr int kLinearImpls = 3;
constexpr LinearImpl kAllLinearImpls[kLinearImpls] = {LinearImpl::Gemv, LinearImpl::Flat, LinearImpl::Cublas};
const char* linear_impl_name(LinearImpl impl);  // "gemv", "flat", "cublas"
std::optional<LinearImpl> parse_linear_impl(std::string_view name);

// The largest M each implementation takes. The defaults are the kernels' limits (kGemvMaxM in
// backend/cuda/kernels.h, kFlatGemmMaxM in backend/cuda/flat_gemm.h; linear_dispatch.cpp
// static_asserts that they agree); they are parameters so that this file needs no CUDA header.
struct LinearLimits {
  int gemv_max_m = 8;
  int flat_max_m = 64;
  int max_m(LinearImpl impl) const;  // cuBLAS: no limit (INT_MAX)
};

// The largest M (and N, K) a table may name: far beyond any batch, small enough that no arithmetic
// on it overflows.
constexpr int kDispatchMaxM = 1 << 20;
constexpr int kDispatchMaxDim = 1 << 24;

// From M = from_m on (until the next range's from_m), run impl.
struct DispatchRange {
  int from_m = 1;
  LinearImpl impl = LinearImpl::Cublas;
  bool operator==(const DispatchRange&) const = default;
};

// What fdpp tune measured for one shape: microseconds per call at each M, NaN where an
// implementation was not measured (M beyond its limit, or it rejected the shape).
struct ShapeTimes {
  std::vector<int> m;
  std::vector<double> us[kLinearImpls];  // us[int(impl)][i] is the time at m[i]
  bool empty() const { return m.empty(); }
  double at(LinearImpl impl, size_t i) const { return us[static_cast<int>(impl)][i]; }
};

struct ShapeDispatch {
  std::string name;  // "qkv", "o", "gate_up", ... (informational; [n, k] is the key)
  int n = 0, k = 0;
  std::vector<DispatchRange> ranges;  // from_m strictly increasing, the first 1, the last cuBLAS
  ShapeTimes measured;                // optional

  LinearImpl choose(int M) const;
  int m1() const;  // the first M not run by GEMV (1: GEMV never)
  int m2() const;  // cuBLAS runs every M >= m2 (the last range's from_m)
  // "1 gemv | 2-24 flat | 25+ cublas"
  std::string ranges_string() const;
};

struct DispatchTable {
  std::string gpu;  // cudaDeviceProp::name, e.g. "NVIDIA H200"
  int sm_count = 0;
  std::string dtype;  // "f16" or "bf16"
  std::string created_by;  // the command that measured it (informational)
  double tolerance = 0;    // the rule's tolerance when built by ranges_from_times (informational)
  std::vector<ShapeDispatch> shapes;

  const ShapeDispatch* find(int n, int k) const;
  std::string key() const;  // "NVIDIA H200 (132 SMs) f16"
};

struct DispatchFile {
  std::string path;  // read from / written to
  std::vector<DispatchTable> tables;
  const DispatchTable* find(const std::string& gpu, int sm_count, const std::string& dtype) const;
};

// Parses and validates (every defect is one line naming origin, table and shape): format and
// version, gpu non-empty, sm_count in [1, 100000], dtype f16|bf16, n and k in [1, kDispatchMaxDim],
// no shape twice in a table, no table twice in a file, ranges as in ShapeDispatch (or, instead of
// "ranges", "m1" and "m2" with 1 <= m1 <= gemv_max_m + 1, m1 <= m2 <= flat_max_m + 1; when both are
// given they must agree), no range of an implementation beyond its limit, measurements finite and
// positive (or null) with one entry per M.
DispatchFile parse_dispatch_json(const nlohmann::json& j, const std::string& origin, const LinearLimits& limits = {});
DispatchFile read_dispatch_file(const std::string& path, const LinearLimits& limits = {});
nlohmann::ordered_json dispatch_file_json(const DispatchFile& f, bool with_measurements = true);
// Atomically (a temporary file renamed), creating the directory; sets f.path.
void write_dispatch_file(DispatchFile& f, const std::string& path);
// Checks ranges against the limits (the first from 1, strictly increasing, each implementation
// within its M limit, the last cuBLAS, the only one without a limit); errors name where.
void validate_dispatch_ranges(const std::vector<DispatchRange>& ranges, const LinearLimits& limits,
                              const std::string& where);
// Adjacent ranges of the same implementation joined.
std::vector<DispatchRange> merge_adjacent_ranges(std::vector<DispatchRange> ranges);
// The two-crossover form: GEMV below m1, flat GEMM below m2, cuBLAS from m2 on (validated as above).
std::vector<DispatchRange> ranges_from_crossovers(int m1, int m2, const LinearLimits& limits = {},
                                                  const std::string& origin = "crossovers");

// ---- where tables live ---------------------------------------------------------------------------
std::string dispatch_path_beside(const std::string& model_path);
std::string dispatch_cache_dir();  // ${FDPP_CACHE:-${XDG_CACHE_HOME:-~/.cache}/fdpp}/dispatch
std::string dispatch_path_in_cache(const std::string& gpu, int sm_count);
std::string gpu_slug(const std::string& gpu);  // "NVIDIA H200" -> "nvidia-h200"
// The repository's configs/ directory (beside the executable, one level up, or the source tree
// compiled in); empty when none exists.
std::string repo_configs_dir();
// configs/<name>.json of a preset ("llama-2-7b"); a path to a .json file is taken as is. Unknown
// names: an error listing the presets there are.
std::string preset_config_path(const std::string& name);

}  // namespace fdpp
