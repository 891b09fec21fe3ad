// fdpp info: what a model is and what it needs, validated without reading its weights.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "subcommands.h"
#include <algorithm>
#include <set>
#include <cmath>
#include <iostream>
#include <optional>

#include <filesystem>

#include "attention/calibration.h"
#include "attention/unified_max.h"
#include "backend/cpu/quant_matmul.h"
#include "io/gguf.h"
#include "io/json_file.h"
#include "model/model_loader.h"
#include "runtime/backend_select.h"
#include "tokenizer/tokenizer.h"
#ifdef FDPP_HAVE_CUDA
#include "tune.h"
#endif

namespace fdpp::cli {

namespace {

struct InfoArgs {
  std::string model;
  bool json = false;
  std::string device = "auto";
  std::string dtype = "auto";
  std::string cpu_weights = "stored";
  std::string gpu_weights = "stored";
};

// The weights as the chosen backend will hold them: per stored dtype, what it becomes.
struct RunsAs {
  std::string device;   // "cpu" or "cuda"
  std::string summary;  // one line
  nlohmann::json tensors = nlohmann::json::array();
};

// Whether the CPU keeps a stored dtype in place: GGUF blocks it has kernels for, with
// --cpu-weights stored (F32 is fp32 either way).
bool cpu_in_place(const ModelDescription& d, const InfoArgs& a, const std::string& stored) {
  if (d.format != "gguf" || a.cpu_weights != "stored" || stored == "F32") return false;
  for (uint32_t t = 0; t < 64; ++t) {
    const auto type = static_cast<gguf::GgmlType>(t);
    if (gguf::is_known(type) && gguf::type_name(type) == stored) return cpu::stored_supported(type);
  }
  return false;
}

// The names of the GGUF tensors the GPU keeps in their stored blocks, by the GPU loader's own rule
// (model/weight_plan.h gguf_gpu_block_tensors) over the file's plan, which reads no weight data.
std::set<std::string> gpu_block_tensors(const std::string& path, const ModelDescription& d) {
  if (d.format != "gguf") return {};
  std::set<std::string> names;
  try {
    const PlannedModel m = plan_model(path);
    for (const PlannedTensor* t : gguf_gpu_block_tensors(m.plan)) names.insert(t->src.name);
  } catch (const Error&) {
    // A file the GPU loader cannot plan is refused when run, with that error; here no tensor stays in blocks.
  }
  return names;
}

RunsAs weights_as_run(const ModelDescription& d, const InfoArgs& a, const std::set<std::string>& gpu_blocks) {
  RunsAs r;
  r.device = a.device != "auto" ? a.device : resolve_device(Device::Auto) == Device::Cuda ? "cuda" : "cpu";
  // gpu_dtype's rule (runtime/backend_select.h) over tensor counts: auto takes bf16 for a checkpoint
  // stored mostly in bf16.
  int64_t bf16 = 0, other_float = 0;
  for (const auto& [stored, n] : d.dtype_counts) {
    if (stored == "BF16") bf16 += n;
    else if (stored == "F16" || stored == "F32") other_float += n;
  }
  const std::string gpu = a.dtype != "auto" ? a.dtype : bf16 > other_float ? "bf16" : "f16";
  const std::set<std::string> blocks = r.device == "cuda" ? gpu_blocks : std::set<std::string>{};
  std::string parts;
  for (const auto& [stored, n] : d.dtype_counts) {
    std::string as;
    int in_blocks = 0;
    for (const TensorDescription& t : d.tensors) in_blocks += t.dtype == stored && blocks.count(t.name) > 0;
    if (stored == "F8_E4M3") {
      // An FP8 checkpoint's projections: e4m3 bytes as stored on the GPU, dequantized on the CPU.
      as = r.device == "cuda" ? "fp8 (e4m3, fp32 row scales)" : "f32 (dequantized)";
    } else if (stored.starts_with("AWQ") || stored.starts_with("GPTQ")) {
      // Packed integer matrices: dequantized on the CPU; 4-bit ones stay 4-bit on the GPU
      // (backend/cuda/int4.h), which refuses 8-bit ones.
      as = r.device != "cuda"       ? "f32 (dequantized)"
           : stored.ends_with("4") ? fmt::format("int4 ({} group scales and zeros)", gpu)
                                   : "not loaded on the GPU (8-bit: run it with --device cpu)";
    } else if (in_blocks > 0) {
      // GGUF blocks the GPU multiplies: the layer matrices stay in them; embeddings, the lm head
      // and expert stacks are converted like the rest.
      as = in_blocks == n ? fmt::format("{} in place", stored)
                          : fmt::format("{} in place x{}, {} x{}", stored, in_blocks, gpu, n - in_blocks);
    } else if (r.device == "cuda") {
      // The GPU holds the other weights as 16-bit floats, converted while streaming (--dtype).
      as = gpu;
    } else {
      // The rest, and every HF checkpoint, becomes fp32.
      as = cpu_in_place(d, a, stored) ? stored + " in place" : "f32";
    }
    r.tensors.push_back({{"stored", stored}, {"tensors", n}, {"runs_as", as}});
    parts += fmt::format("{}{} x{} -> {}", parts.empty() ? "" : ", ", stored, n, as);
  }
  bool any_in_place = false;
  for (const auto& [stored, n] : d.dtype_counts) any_in_place = any_in_place || cpu_in_place(d, a, stored);
  std::string compute = "; computes in " + gpu;
  if (r.device == "cpu")
    compute = any_in_place ? fmt::format("; in-place matmuls take 8-bit activations ({}), the rest fp32",
                                         cpu::isa_name(cpu::best_isa()))
                           : "; computes in fp32";
  r.summary = fmt::format("{}: {}{}", r.device, parts, compute);
  return r;
}

// The chat template's kind, from what it renders (the markers of each format fdpp renders), and
// where it was read from.
struct TemplateInfo {
  std::string name;    // "ChatML", "Llama 3.1+", ...; "" when none renders
  std::string source;  // "GGUF tokenizer.chat_template", "tokenizer_config.json", "chat_template.jinja"
  std::string problem;
};

TemplateInfo chat_template_info(const ModelDescription& d, const Tokenizer& tok) {
  TemplateInfo t;
  namespace fs = std::filesystem;
  if (d.format == "gguf") {
    t.source = "GGUF tokenizer.chat_template";
  } else {
    const fs::path dir(d.path);
    bool in_config = false;
    if (fs::exists(dir / "tokenizer_config.json")) {
      try {
        in_config = read_json_file((dir / "tokenizer_config.json").string()).contains("chat_template");
      } catch (const Error&) {
      }
    }
    t.source = in_config                                 ? "tokenizer_config.json"
               : fs::exists(dir / "chat_template.jinja") ? "chat_template.jinja"
                                                         : "";
  }
  std::string text;
  try {
    text = tok.apply_chat_template(std::vector<ChatMessage>{{"user", "U"}}, true);
  } catch (const Error& e) {
    t.problem = e.what();
    return t;
  }
  if (text.find("<|im_start|>") != std::string::npos)
    t.name = "ChatML";
  else if (text.find("<|start_header_id|>") != std::string::npos)
    t.name = text.find("Cutting Knowledge Date") != std::string::npos ? "Llama 3.1+" : "Llama 3";
  else if (text.find("[INST]") != std::string::npos) {
    std::string with_system;
    try {
      with_system = tok.apply_chat_template(std::vector<ChatMessage>{{"system", "S"}, {"user", "U"}}, true);
    } catch (const Error&) {
    }
    t.name = with_system.find("<<SYS>>") != std::string::npos ? "Llama 2" : "Mistral";
  } else {
    t.name = "other";
  }
  return t;
}

// The tokens that end generation, with their text: "<|im_end|> (2)".
std::vector<std::pair<int32_t, std::string>> end_tokens(const Tokenizer& tok) {
  std::vector<std::pair<int32_t, std::string>> out;
  for (int32_t id = 0; id < tok.vocab_size(); ++id)
    if (tok.is_end_of_generation(id)) out.emplace_back(id, tok.token_text(id));
  return out;
}

int run_info(const InfoArgs& a) {
  const std::string& model = a.model;
  const bool json = a.json;
  const std::string path = resolve_model_path(model);
  const ModelDescription d = describe_model(path);
  const ModelConfig& c = d.config;
  // Memory the CPU backend needs: the weights as it holds them (GGUF blocks in place, the rest
  // fp32), plus the fp32 KV cache at the model's full context length.
  double weight_bytes = 0;
  for (const TensorDescription& t : d.tensors) {
    double elements = 1;
    for (int64_t n : t.shape) elements *= static_cast<double>(n);
    weight_bytes += cpu_in_place(d, a, t.dtype) ? static_cast<double>(t.bytes) : 4.0 * elements;
  }
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
  const std::set<std::string> gpu_blocks =
      a.gpu_weights == "stored" ? gpu_block_tensors(path, d) : std::set<std::string>{};
  const RunsAs runs = weights_as_run(d, a, gpu_blocks);
  // The GPU's weight memory: GGUF blocks it keeps, FP8 bytes and 4-bit packs about as stored, the
  // rest 16-bit.
  double cuda_weight_bytes = 0;
  for (const TensorDescription& t : d.tensors) {
    double elements = 1;
    for (int64_t n : t.shape) elements *= static_cast<double>(n);
    cuda_weight_bytes += gpu_blocks.count(t.name) > 0 || t.dtype.starts_with("AWQ") || t.dtype.starts_with("GPTQ")
                             ? static_cast<double>(t.bytes)
                         : t.dtype == "F8_E4M3" ? elements
                                                : 2.0 * elements;
  }
  std::unique_ptr<Tokenizer> tok;
  std::string tokenizer_problem;
  try {
    tok = load_tokenizer(path);
  } catch (const Error& e) {
    tokenizer_problem = e.what();
  }
  TemplateInfo tmpl;
  std::vector<std::pair<int32_t, std::string>> eos;
  if (tok) {
    tmpl = chat_template_info(d, *tok);
    eos = end_tokens(*tok);
  } else {
    for (int32_t id : d.eos_token_ids) eos.emplace_back(id, "");
  }
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
                     {"quantization",
                      d.quantization.empty() ? nlohmann::json(nullptr) : nlohmann::json(d.quantization)},
                     {"cpu_weight_bytes", weight_bytes},
                     {"cuda_weight_bytes", cuda_weight_bytes},
                     {"cpu_kv_cache_bytes", kv_bytes}};
    if (c.n_experts > 0) {
      nlohmann::json layers = nlohmann::json::array();
      for (int i = 0; i < c.n_layers; ++i)
        if (c.is_moe_layer(i)) layers.push_back(i);
      j["experts"] = {{"count", c.n_experts},
                      {"used_per_token", c.n_experts_used},
                      {"ffn_hidden_size", c.expert_ffn_hidden},
                      {"norm_topk_prob", c.norm_topk_prob},
                      {"layers", layers}};
    } else {
      j["experts"] = nullptr;
    }
    if (!c.kv_cache_scales.empty()) {
      nlohmann::json scales = nlohmann::json::array();
      for (const KvCacheScales& s : c.kv_cache_scales) scales.push_back({{"k", s.k}, {"v", s.v}});
      j["kv_cache_scales"] = scales;
    } else {
      j["kv_cache_scales"] = nullptr;
    }
    if (cal) {
      j["calibration"] = {{"path", cal->path},
                          {"phi_min", cal->phi_min()},
                          {"phi_max", cal->phi_max()},
                          {"fallback_rate", cal->fallback_rate()}};
    } else {
      j["calibration"] = nullptr;
    }
    j["dispatch"] = dispatch_json;
    j["runs_as"] = {{"device", runs.device}, {"weights", runs.tensors}};
    j["chat_template"] =
        tmpl.name.empty() ? nlohmann::json(nullptr) : nlohmann::json{{"name", tmpl.name}, {"source", tmpl.source}};
    nlohmann::json e = nlohmann::json::array();
    for (const auto& [id, text] : eos) e.push_back({{"id", id}, {"text", text}});
    j["eos_tokens"] = e;
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
  if (c.n_experts > 0) {
    int moe_layers = 0;
    for (int i = 0; i < c.n_layers; ++i) moe_layers += c.is_moe_layer(i) ? 1 : 0;
    fmt::print("experts:      {} of width {}, {} per token{}, in {} of {} layers\n", c.n_experts, c.expert_ffn_hidden,
               c.n_experts_used, c.norm_topk_prob ? " (weights renormalized)" : "", moe_layers, c.n_layers);
  }
  fmt::print("embeddings:   {}\n", c.tied_embeddings ? "tied (lm head = token embeddings)" : "separate lm head");
  fmt::print("dtypes:       {}\n", dtypes);
  if (!d.quantization.empty()) fmt::print("quantized:    {}\n", d.quantization);
  if (!c.kv_cache_scales.empty()) {
    // Used by --kv-cache-dtype fp8 only; a 16-bit cache ignores them.
    float lo = INFINITY, hi = 0.f;
    for (const KvCacheScales& s : c.kv_cache_scales) lo = std::min({lo, s.k, s.v}), hi = std::max({hi, s.k, s.v});
    fmt::print("kv scales:    per layer (from the checkpoint), in [{:.4g}, {:.4g}], for --kv-cache-dtype fp8\n", lo, hi);
  }
  fmt::print("parameters:   {} ({:.1f} M)\n", d.n_params, d.n_params / 1e6);
  fmt::print("stored:       {}\n", human_bytes(static_cast<double>(d.stored_bytes)));
  fmt::print("runs as:      {}\n", runs.summary);
  if (!tmpl.name.empty())
    fmt::print("chat:         {} template ({})\n", tmpl.name, tmpl.source);
  else
    fmt::print("chat:         no template fdpp renders ({})\n", tok ? tmpl.problem : tokenizer_problem);
  std::string eos_text;
  for (const auto& [id, text] : eos)
    eos_text += fmt::format("{}{}{}", eos_text.empty() ? "" : ", ", text.empty() ? "" : text + " ",
                            text.empty() ? std::to_string(id) : "(" + std::to_string(id) + ")");
  fmt::print("end tokens:   {}\n", eos_text.empty() ? "none" : eos_text);
  fmt::print("memory (cpu): {} weights (as run) + {} KV cache at {} tokens = {}\n", human_bytes(weight_bytes),
             human_bytes(kv_bytes), c.max_context, human_bytes(weight_bytes + kv_bytes));
  if (runs.device == "cuda") fmt::print("memory (gpu): {} weights (as run)\n", human_bytes(cuda_weight_bytes));
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
  static InfoArgs a;
  auto* info = app.add_subcommand("info",
                                  "describe and validate a model without loading its weights: what it is, "
                                  "how its weights run, its chat template and end tokens");
  info->add_option("-m,--model", a.model, "GGUF file or HF model directory (default: the default model)");
  info->add_option("--device", a.device, "the device to describe the weights on: auto (a GPU when present), cpu, cuda")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  info->add_option("--dtype", a.dtype, "the GPU's weight type as fdpp generate --dtype takes it: auto, f16, bf16")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "f16", "bf16"}));
  info->add_option("--cpu-weights", a.cpu_weights, "the CPU's weights as --cpu-weights takes them: stored, f32")
      ->capture_default_str()
      ->check(CLI::IsMember({"stored", "f32"}));
  info->add_option("--gpu-weights", a.gpu_weights, "the GPU's weights as --gpu-weights takes them: stored, dequantized")
      ->capture_default_str()
      ->check(CLI::IsMember({"stored", "dequantized"}));
  info->add_flag("--json", a.json, "print JSON");
  return {info, [] { return run_info(a); }};
}

}  // namespace fdpp::cli
