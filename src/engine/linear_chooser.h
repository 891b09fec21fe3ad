// Heuristic dataflow at run time: which linear-layer implementation the engine runs for a shape,
// from the dispatch tables (engine/dispatch_table.h) found for this GPU, the rule where no table
// covers a shape, and the forced modes for comparisons. cuda::LinearDispatcher
// (backend/cuda/linear_dispatch.h) holds one LinearChooser and launches what it picks.
//
// LinearChooser::load looks, in this order, at:
//   1. an explicit path (DispatchSelectOptions::table_path): must exist and hold this GPU's table;
//   2. beside the model: <model file>.fdpp-dispatch.json (a Hugging Face directory:
//      <dir>/fdpp-dispatch.json), as calibration files are found;
//   3. the cache: ${FDPP_CACHE:-${XDG_CACHE_HOME:-~/.cache}/fdpp}/dispatch/<gpu>-<SMs>sm.fdpp-dispatch.json;
//   4. the tables shipped in the repository: configs/dispatch/*.json (found beside the executable,
//      one level up from it, or in the source tree).
// A shape is decided by the first source that has it. Files 2-4 without a table for this GPU are
// skipped (noted in the description); a malformed file is always an error naming the file. Where
// no table covers a shape, fallback_choice() decides (rule and its reasons in linear_chooser.cpp).
//
// Plain C++ (no CUDA), like dispatch_table.h.
#pragma once

#include <nlohmann/json.hpp>

#include <span>
#include <string>
#include <vector>

#include "engine/dispatch_table.h"
#include "fdpp/model_config.h"

namespace fdpp {

// The rule for shapes and GPUs without a table (reasons beside its definition).
LinearImpl fallback_choice(int M, const LinearLimits& limits = {});
constexpr int kFallbackGemvMaxM = 1;
constexpr int kFallbackFlatMaxM = 16;

// Forced modes (--linear gemv|flat|cublas|auto). A forced implementation beyond its M limit
// hands the call to the next one up (gemv -> flat -> cublas), so forcing never fails.
enum class LinearMode { Auto, Gemv, Flat, Cublas };
LinearMode parse_linear_mode(const std::string& value, const std::string& origin = "linear mode");
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

// What the chooser is told; the library reads no environment variable for it (the CLI's fallback
// to FDPP_LINEAR, FDPP_DISPATCH_TABLE and FDPP_GEMV_MAX_M: runtime/environment_fallback.h).
struct DispatchSelectOptions {
  std::string table_path;  // explicit table file; empty: the lookup
  std::string model_path;  // for the file beside the model; empty: none
  std::string mode;        // auto|gemv|flat|cublas; empty: auto
  // GEMV for M <= this and never above (for measurements; -1: the table). Only in auto mode.
  int gemv_max_m = -1;
  bool search_shipped = true;  // look in configs/dispatch/
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
  std::string mode_origin_;         // "linear mode cublas" when forced
  LinearMode mode_ = LinearMode::Auto;
  int gemv_max_m_ = -1;
  LinearLimits limits_;
};

}  // namespace fdpp
