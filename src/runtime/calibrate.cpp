#include "runtime/calibrate.h"

#include <algorithm>

#include "backend/cpu/cpu_runner.h"

namespace fdpp {

Calibration calibrate_on_cpu(const LoadedModel& model, const std::string& model_path,
                             const std::vector<std::string>& prompts, const CalibrationOptions& options) {
  return calibrate_model(model, model_path, prompts, options,
                         [&](const std::vector<std::vector<int32_t>>& ids, const AttentionObserver& observer) {
                           size_t longest = 1;
                           for (const auto& p : ids) longest = std::max(longest, p.size());
                           CpuRunner runner(model.config(), model.weights, static_cast<int>(longest));
                           runner.set_attention_observer(observer);
                           std::vector<float> logits(static_cast<size_t>(model.config().vocab_size));
                           for (const auto& p : ids) runner.forward(p, 0, /*all_positions=*/false, logits);
                         });
}

}  // namespace fdpp
