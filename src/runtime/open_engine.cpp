#include "runtime/open_engine.h"

#include <fmt/format.h>

#include <filesystem>

#include "backend/cpu/quant_matmul.h"
#include "fdpp/error.h"
#include <nlohmann/json.hpp>

#include "io/json_file.h"
#include "model/hf_config.h"

namespace fdpp {

std::unique_ptr<Tokenizer> stand_in_tokenizer(int vocab_size) {
  check(vocab_size >= 300, "--load-format dummy: vocab_size {} is too small for the stand-in tokenizer", vocab_size);
  VocabSpec v;
  v.source = "dummy vocabulary";
  v.model = "llama";
  v.tokens.reserve(vocab_size);
  v.token_types.reserve(vocab_size);
  v.tokens = {"<unk>", "<s>", "</s>"};
  v.token_types = {static_cast<int32_t>(TokenType::kUnknown), static_cast<int32_t>(TokenType::kControl),
                   static_cast<int32_t>(TokenType::kControl)};
  for (int b = 0; b < 256; ++b) {
    v.tokens.push_back(fmt::format("<0x{:02X}>", b));
    v.token_types.push_back(static_cast<int32_t>(TokenType::kByte));
  }
  while (static_cast<int>(v.tokens.size()) < vocab_size) {
    v.tokens.push_back(fmt::format("\u2581t{}", v.tokens.size()));
    v.token_types.push_back(static_cast<int32_t>(TokenType::kNormal));
  }
  v.unk_id = 0;
  v.bos_id = 1;
  v.eos_id = 2;
  v.add_bos = false;
  return Tokenizer::from_vocab(v);
}

OpenedModel open_model(const EngineArgs& args, const std::function<void(double)>& host_progress) {
  args.check();
  OpenedModel m;
  if (args.load_format == "dummy") {
    m.device = resolve_device(Device::Cuda);  // a clear error without a GPU
    m.dummy = true;
    m.path = args.config;
    m.description.path = args.config;
    m.description.format = "dummy";
    m.description.config = parse_hf_config(read_json_file(args.config), nullptr, args.config, args.config).config;
    m.tokenizer = stand_in_tokenizer(m.config().vocab_size);
    return m;
  }
  m.path = resolve_model_path(args.model);
  m.device = resolve_device(args.requested_device());
  if (m.device == Device::Cuda) {
    PlannedModel p = plan_model(m.path);
    m.description = std::move(p.description);
    m.plan = std::move(p.plan);
    m.tokenizer = std::move(p.tokenizer);
    m.planned = true;
  } else {
    // On the CPU the GGUF weights stay in their stored format (the fast path) unless f32 is asked for.
    const LoadOptions lo = args.cpu_weights == "stored" ? cpu::stored_load_options() : LoadOptions{};
    LoadedModel l = load_model(m.path, host_progress, lo);
    m.description = std::move(l.description);
    m.weights = std::move(l.weights);
    m.tokenizer = std::move(l.tokenizer);
  }
  // vLLM's quantization="awq" / "gptq" / "gguf" names the checkpoint's method: a model of another
  // one is an error, as in vLLM, rather than a silent difference.
  if (names_checkpoint_method(args.quantization)) {
    const std::string& q = args.quantization;
    const bool gguf = m.description.format == "gguf";
    check(q == "gguf" ? gguf : m.description.quantization.starts_with(q), "--quantization {}: {} is not {} ({})", q,
          m.path, q == "awq" ? "an AWQ checkpoint" : q == "gptq" ? "a GPTQ checkpoint" : "a GGUF file",
          !m.description.quantization.empty() ? m.description.quantization
          : gguf                              ? std::string("a GGUF file")
                                              : fmt::format("a {} checkpoint without quantization_config",
                                                            m.description.format));
  }
  return m;
}

RunnerOptions OpenedModel::runner_options(const EngineArgs& args, const StreamProgressFn& progress) const {
  RunnerOptions o = args.runner_options(dummy ? std::string() : path);
  o.device = device;
  o.dummy_weights = dummy;
  if (planned) {
    o.plan = &plan;
    o.load_progress = progress;
  }
  return o;
}

std::unique_ptr<Engine> OpenedModel::make_engine(const EngineArgs& args, const EngineLimits& limits,
                                                 const StreamProgressFn& progress) const {
  const int ctx = limits.max_context;
  check(ctx <= config().max_context, "context size {} exceeds the model's context length {}", ctx,
        config().max_context);
  return fdpp::make_engine(config(), weights, runner_options(args, progress), limits);
}

std::unique_ptr<Runner> OpenedModel::make_runner(const EngineArgs& args, int max_context,
                                                 const StreamProgressFn& progress) const {
  return fdpp::make_runner(config(), weights, max_context, runner_options(args, progress));
}

void start_engine(OpenedEngine& e, const EngineArgs& args, int max_waiting, const StreamProgressFn& progress) {
  e.engine = e.model.make_engine(args, args.engine_limits(e.model.device), progress);
  e.engine->warm_up();
  if (e.model.tokenizer)
    e.scheduler =
        std::make_unique<Scheduler>(*e.engine, *e.model.tokenizer, args.scheduler_options(e.model.device, max_waiting));
}

std::unique_ptr<OpenedEngine> open_engine(const EngineArgs& args, int max_waiting, const StreamProgressFn& progress) {
  auto e = std::make_unique<OpenedEngine>();
  e->model = open_model(args);
  start_engine(*e, args, max_waiting, progress);
  return e;
}

}  // namespace fdpp
