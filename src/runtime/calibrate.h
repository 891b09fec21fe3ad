// Calibration of the unified max (attention/calibration.h) run on the CPU reference backend: the
// fp32 attention logits of real text, whatever backend will serve the model.
#pragma once

#include <string>
#include <vector>

#include "attention/calibration.h"

namespace fdpp {

// model: fp32 host weights (load_model's default form).
Calibration calibrate_on_cpu(const LoadedModel& model, const std::string& model_path,
                             const std::vector<std::string>& prompts, const CalibrationOptions& options = {});

}  // namespace fdpp
