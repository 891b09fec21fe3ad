// Heuristic dataflow (FlashDecoding++ section 5, DESIGN.md idea 3), the CUDA-free half: which of
// the three linear-layer implementations runs y[M, N] = x[M, K] . W[N, K]^T for a given M and
// weight shape [N, K] on a given GPU and dtype.
//
//   Gemv    ImplA, CUDA-core GEMV            M <= LinearLimits::gemv_max_m (kGemvMaxM = 8)
//   Flat    ImplB, flat GEMM on tensor cores M <= LinearLimits::flat_max_m (kFlatGemmMaxM = 64)
//   Cublas  ImplC, cuBLASLt                  any M
//
// The decision comes from a dispatch table measured by `fdpp tune` on the GPU itself: per [N, K],
// the implementation for every M as a list of ranges "from M = a on, use X" (the curves can cross
// more than once, so two crossover points are not always enough; M1 and M2 are kept as the summary:
// M1 = the first M not run by GEMV, M2 = the M from which cuBLAS runs every larger M). Where no
// table covers a shape, fallback_choice() decides (rule and its reasons in dispatch_table.cpp).
//
// Table files (JSON, format "fdpp-linear-dispatch", see configs/dispatch/README.md) hold one table
// per (GPU name, SM count, dtype). LinearChooser::load looks, in this order, at:
//   1. an explicit path (option, or $FDPP_DISPATCH_TABLE): must exist and hold this GPU's table;
//   2. beside the model: <model file>.fdpp-dispatch.json (a Hugging Face directory:
//      <dir>/fdpp-dispatch.json), as calibration files are found;
//   3. the cache: ${FDPP_CACHE:-${XDG_CACHE_HOME:-~/.cache}/fdpp}/dispatch/<gpu>-<SMs>sm.fdpp-dispatch.json;
//   4. the tables shipped in the repository: configs/dispatch/*.json (found beside the executable,
//      one level up from it, or in the source tree).
// A shape is decided by the first source that has it. Files 2-4 without a table for this GPU are
// skipped (noted in the description); a malformed file is always an error naming the file.
//
// This header is plain C++ (no CUDA), so that the CPU test binary and CPU-only builds have it; the
// kernels are called by cuda::LinearDispatcher (backend/cuda/linear_dispatch.h).
#pragma once

#include <nlohmann/json.hpp>

#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "fdpp/model_config.h"

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
// Adds t to f: into the table of the same (gpu, SMs, dtype) when there is one (shapes of the same
// [n, k] replaced, others kept), else as a new table.
void merge_dispatch_table(DispatchFile& f, const DispatchTable& t);

// Ranges from measurements: at every measured M the chosen implementation is within `tolerance`
// (0.02 = 2%) of the fastest measured there, with as few ranges as that allows (greedy: from each
// M on, the acceptable implementation that stays acceptable longest; ties to the faster). Between
// two measured M the earlier choice continues, cut at its limit (then the next choice, or cuBLAS
// above the last measured M). Throws if some measured M has no time at all.
std::vector<DispatchRange> ranges_from_times(const ShapeTimes& t, double tolerance, const LinearLimits& limits = {});
// The two-crossover form: GEMV below m1, flat GEMM below m2, cuBLAS from m2 on (validated as above).
std::vector<DispatchRange> ranges_from_crossovers(int m1, int m2, const LinearLimits& limits = {},
                                                  const std::string& origin = "crossovers");

// The rule for shapes and GPUs without a table (reasons beside its definition).
LinearImpl fallback_choice(int M, const LinearLimits& limits = {});
constexpr int kFallbackGemvMaxM = 1;
constexpr int kFallbackFlatMaxM = 16;

// Forced modes (FDPP_LINEAR=gemv|flat|cublas|auto). A forced implementation beyond its M limit
// hands the call to the next one up (gemv -> flat -> cublas), so forcing never fails.
enum class LinearMode { Auto, Gemv, Flat, Cublas };
LinearMode parse_linear_mode(const std::string& value, const std::string& origin = "FDPP_LINEAR");
const char* linear_mode_name(LinearMode mode);
LinearImpl forced_choice(LinearImpl wanted, int M, const LinearLimits& limits = {});

// The linear layers a model runs on the CUDA backend, as DeviceModel fuses them:
//   qkv      [(H + 2 KVH) * D, hidden]
//   o        [hidden, H * D]
//   gate_up  [2 * FF, hidden] (SwiGLU; gate and up fused)   or  fc1 [FF, hidden] (ReLU)
//   down     [hidden, FF]                                   or  fc2 [hidden, FF]
//   lm_head  [vocab, hidden] (with include_lm_head)
struct LinearShape {
  std::string name;
  int n = 0, k = 0;
};
std::vector<LinearShape> model_linear_shapes(const ModelConfig& c, bool include_lm_head = true);
// The same list with repeated [n, k] merged (names joined by '+'), first occurrence order.
std::vector<LinearShape> unique_linear_shapes(std::span<const LinearShape> shapes);

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

// ---- the decision --------------------------------------------------------------------------------
struct DispatchSelectOptions {
  std::string table_path;  // explicit table file; empty: $FDPP_DISPATCH_TABLE, else the lookup
  std::string model_path;  // for the file beside the model; empty: none
  std::string mode;        // auto|gemv|flat|cublas; empty: $FDPP_LINEAR, else auto
  // GEMV for M <= this and never above (for measurements; -1: $FDPP_GEMV_MAX_M, else the table).
  // Only in auto mode.
  int gemv_max_m = -1;
  bool use_environment = true;  // false: ignore the FDPP_* variables (tests)
  bool search_shipped = true;   // look in configs/dispatch/
  bool search_cache = true;
};

class LinearChooser {
 public:
  LinearChooser() = default;  // auto mode, no tables: the fallback rule
  // Loads the tables for this GPU and dtype in lookup order.
  static LinearChooser load(const DispatchSelectOptions& options, const std::string& gpu, int sm_count,
                            const std::string& dtype, const LinearLimits& limits = {});

  // Tables added later are consulted after the ones before them.
  void add_table(const DispatchTable& table, const std::string& origin);
  void set_mode(LinearMode mode) { mode_ = mode; }
  LinearMode mode() const { return mode_; }
  void set_gemv_max_m(int m);  // -1: off
  const LinearLimits& limits() const { return limits_; }

  // M >= 1, N >= 1, K >= 1 (else an error).
  LinearImpl choose(int M, int N, int K) const;
  // The table entry that decides [N, K] and where it came from; null when the fallback rule does.
  const ShapeDispatch* find(int N, int K, std::string* origin = nullptr) const;
  // What choose(M, N, K) gives for every M >= 1, as ranges (mode, threshold and table applied).
  std::vector<DispatchRange> effective_ranges(int N, int K) const;

  // For fdpp info: the GPU/dtype, the mode, which files were used or skipped, then per shape its
  // M1, M2 and ranges (or "fallback rule"). One line per shape after a heading line.
  std::string describe(std::span<const LinearShape> shapes) const;
  nlohmann::ordered_json describe_json(std::span<const LinearShape> shapes) const;

 private:
  struct Source {
    std::string origin;  // "PATH (beside the model)"
    DispatchTable table;
  };
  std::vector<Source> sources_;
  std::vector<std::string> notes_;  // files looked at and skipped
  std::string key_;                 // "NVIDIA H200 (132 SMs) f16"
  std::string mode_origin_;         // "FDPP_LINEAR=cublas" when forced
  LinearMode mode_ = LinearMode::Auto;
  int gemv_max_m_ = -1;
  LinearLimits limits_;
};

}  // namespace fdpp
