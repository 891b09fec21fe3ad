// Calibration of the unified max phi (issue 5, DESIGN.md section 1): runs text through the CPU
// runner, records per layer and head the distribution of the scaled attention logits
// x = q.k / sqrt(head_dim), chooses phi per layer (rule in calibration.cpp, choose_phi), and writes
// a JSON file that is found again automatically:
//   beside the model: <model file>.fdpp-calib.json (a Hugging Face directory: <dir>/fdpp-calib.json)
//   when that is not writable: ${FDPP_CACHE:-${XDG_CACHE_HOME:-~/.cache}/fdpp}/calib/<name>-<fingerprint>.fdpp-calib.json
// A calibration names the model file by a fingerprint (size and a hash of its first and last MiB),
// so one written for another file is refused rather than silently used.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "attention/attention_observer.h"
#include "attention/unified_max.h"
#include "model/model_loader.h"

namespace fdpp {

// Quantiles of a distribution, keyed "min", "p0.1", "p1", "p50", "p99", "p99.9", "max".
using Quantiles = std::map<std::string, float>;

struct HeadCalibration {
  float phi = 0.f;    // the layer's rule applied to this head alone (for a per-head phi later)
  Quantiles row_max;  // per-row max logits of this head
  Quantiles logits;   // every logit of this head (from the histogram; min and max exact)
  float logit_min = 0.f, logit_max = 0.f;
};

struct LayerCalibration {
  UnifiedMaxBounds bounds;     // phi, a, b
  int64_t rows = 0;            // query rows (token x head) measured
  double fallback_rate = 0.0;  // fraction of those rows whose max - phi is outside [a, b]
  Quantiles row_max;           // per-row max logits, all heads
  Quantiles logits;            // every logit of every row (from a 1/8-wide histogram)
  std::vector<HeadCalibration> heads;
};

struct Calibration {
  std::string path;  // the file it was read from or written to
  std::string model_path, model_name, model_fingerprint;
  uint64_t model_size = 0;
  int64_t max_context = 0;  // the bounds [a, b] hold for rows of up to this many keys
  double percentile = 0.0;
  int64_t prompts = 0, tokens = 0;
  std::vector<LayerCalibration> layers;

  double fallback_rate() const;  // over all layers' rows
  float phi_min() const;
  float phi_max() const;
};

struct CalibrationOptions {
  double percentile = 99.0;        // phi = this percentile of the layer's row maxima (then clamped)
  int max_tokens_per_prompt = 0;   // 0: up to the model's context
};

// The built-in English text set (10 varied paragraphs, > 2000 tokens with a Llama-style tokenizer).
const std::vector<std::string>& builtin_calibration_prompts();

// One prompt per blank-line-separated paragraph of a text file.
std::vector<std::string> read_calibration_prompts(const std::string& path);

// Size and a hash of the first and last MiB (a directory: its files' names and sizes and
// config.json), as 16 hex digits.
std::string model_fingerprint(const std::string& model_path, uint64_t* size = nullptr);

// Runs every prompt (token ids) through the model once from position 0, calling the observer for
// each layer's attention. The runtime runs them on the CPU reference backend (runtime/calibrate.h).
using ObservedRun =
    std::function<void(const std::vector<std::vector<int32_t>>& prompts, const AttentionObserver& observer)>;

// Runs the prompts through `run` and measures everything. model_path is recorded (and
// fingerprinted).
Calibration calibrate_model(const LoadedModel& model, const std::string& model_path,
                            const std::vector<std::string>& prompts, const CalibrationOptions& options,
                            const ObservedRun& run);

std::string calibration_path_beside(const std::string& model_path);
std::string calibration_path_in_cache(const std::string& model_path);
// Beside the model when that can be written, else in the cache.
std::string default_calibration_output(const std::string& model_path);

// Writes atomically (a temporary file renamed); sets c.path.
void write_calibration(Calibration& c, const std::string& path);
// Reads and validates; any problem is a one-line fdpp::Error naming the file.
Calibration read_calibration(const std::string& path);
// The calibration of a model: beside it, else in the cache; none when neither exists. A file that
// exists but is malformed, or was made for another model file, is an error naming the file.
std::optional<Calibration> load_calibration(const std::string& model_path);
// A calibration file named explicitly (--calibration FILE): it must exist and match the model
// file (by fingerprint) when model_path is given; errors name the file.
Calibration load_calibration(const std::string& model_path, const std::string& file);

}  // namespace fdpp
