// fdpp info: what a model is and what it needs, validated without reading its weights.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "subcommands.h"
#include <iostream>
#include <optional>

#include "attention/calibration.h"
#include "attention/unified_max.h"
#include "model/model_loader.h"
#ifdef FDPP_HAVE_CUDA
#include "tune.h"
#endif

namespace fdpp::cli {

namespace {

int run_info(const std::string& model, bool json) {
  const std::string path = resolve_model_path(model);
  const ModelDescription d = describe_model(path);
  const ModelConfig& c = d.config;
  // Memory the CPU backend needs: weights dequantized to fp32, plus the fp32 KV cache at the
  // model's full context length.
  const double weight_bytes = 4.0 * static_cast<double>(d.n_params);
  const double kv_bytes = 2.0 * 4.0 * c.n_layers * static_cast<double>(c.kv_dim()) * c.max_context;
  const std::optional<Calibration> cal = load_calibration(path);
  if (cal)
    check(static_cast<int>(cal->layers.size()) == c.n_layers, "{}: calibration has {} layers, the model {}",
          cal->path, cal->layers.size(), c.n_layers);
  // The linear-layer dispatch the CUDA backend would use for this model (engine/dispatch_table.h).
  nlohmann::json dispatch_json = {{"available", false}, {"reason", "not compiled in (CPU-only build)"}};
  std::string dispatch = "not compiled in (CPU-only build: the CUDA linear layers are not built)";
#ifdef FDPP_HAVE_CUDA
  dispatch = describe_dispatch_for_model(path, c, &dispatch_json);
#endif
  std::string dtypes;
  for (const auto& [t, n] : d.dtype_counts) dtypes += fmt::format("{}{} x{}", dtypes.empty() ? "" : ", ", t, n);
  if (json) {
    nlohmann::json j{{"path", d.path},
                     {"format", d.format},
                     {"architecture", c.architecture},
                     {"name", c.name},
                     {"n_layers", c.n_layers},
                     {"hidden_size", c.hidden},
                     {"n_heads", c.n_heads},
                     {"n_kv_heads", c.n_kv_heads},
                     {"head_dim", c.head_dim},
                     {"ffn_hidden_size", c.ffn_hidden},
                     {"vocab_size", c.vocab_size},
                     {"context_length", c.max_context},
                     {"rope_theta", c.rope.theta},
                     {"norm_eps", c.norm_eps},
                     {"tied_embeddings", c.tied_embeddings},
                     {"n_params", d.n_params},
                     {"stored_bytes", d.stored_bytes},
                     {"dtypes", d.dtype_counts},
                     {"cpu_weight_bytes", weight_bytes},
                     {"cpu_kv_cache_bytes", kv_bytes}};
    if (cal) {
      j["calibration"] = {{"path", cal->path},
                          {"phi_min", cal->phi_min()},
                          {"phi_max", cal->phi_max()},
                          {"fallback_rate", cal->fallback_rate()}};
    } else {
      j["calibration"] = nullptr;
    }
    j["dispatch"] = dispatch_json;
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  fmt::print("model:        {}\n", d.path);
  fmt::print("format:       {}\n", d.format);
  fmt::print("architecture: {}{}\n", c.architecture, c.name.empty() ? "" : " (" + c.name + ")");
  fmt::print("layers:       {}\n", c.n_layers);
  fmt::print("hidden:       {}   ffn: {}   vocab: {}   context: {}\n", c.hidden, c.ffn_hidden, c.vocab_size,
             c.max_context);
  fmt::print("attention:    {} heads, {} kv heads, head dim {}, rope theta {}{}\n", c.n_heads, c.n_kv_heads,
             c.head_dim, c.rope.theta, c.rope.freq_factors.empty() ? "" : " (with frequency factors)");
  fmt::print("embeddings:   {}\n", c.tied_embeddings ? "tied (lm head = token embeddings)" : "separate lm head");
  fmt::print("dtypes:       {}\n", dtypes);
  fmt::print("parameters:   {} ({:.1f} M)\n", d.n_params, d.n_params / 1e6);
  fmt::print("stored:       {}\n", human_bytes(static_cast<double>(d.stored_bytes)));
  fmt::print("memory (cpu): {} weights (fp32) + {} KV cache at {} tokens = {}\n", human_bytes(weight_bytes),
             human_bytes(kv_bytes), c.max_context, human_bytes(weight_bytes + kv_bytes));
  if (cal) {
    fmt::print("calibration:  {} (phi range [{:.2f}, {:.2f}], a = {:.2f}, b = {:.2f}, fallback {:.3f}% of rows)\n",
               cal->path, cal->phi_min(), cal->phi_max(), cal->layers[0].bounds.a, cal->layers[0].bounds.b,
               100.0 * cal->fallback_rate());
  } else {
    const UnifiedMaxBounds b = default_unified_max_bounds(c.max_context);
    fmt::print("calibration:  none (conservative default phi = 0 with guard, a = {:.2f}, b = {:.2f}; run fdpp calibrate)\n",
               b.a, b.b);
  }
  for (size_t pos = 0, line = 0; pos <= dispatch.size(); ++line) {
    const size_t nl = std::min(dispatch.find('\n', pos), dispatch.size());
    fmt::print("{:<14}{}\n", line == 0 ? "dispatch:" : "", dispatch.substr(pos, nl - pos));
    pos = nl + 1;
  }
  return 0;
}

}  // namespace

Subcommand register_info(CLI::App& app) {
  static std::string i_model;
  static bool i_json = false;
  auto* info = app.add_subcommand("info", "describe and validate a model without loading its weights");
  info->add_option("-m,--model", i_model, "GGUF file or HF model directory (default: the default model)");
  info->add_flag("--json", i_json, "print JSON");
  return {info, [] { return run_info(i_model, i_json); }};
}

}  // namespace fdpp::cli
