// Opening a model for every front end (the CLI, fdpp serve, the Python package): one path from
// EngineArgs to an engine, so that each streams the weights to the GPU the same way (a plan read
// from the files straight into device memory, never a host copy of the model) and loads the CPU's
// weights the same way (GGUF blocks in place, or fp32 for the reference).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "engine/engine.h"
#include "engine/runner.h"
#include "engine/scheduler.h"
#include "model/model_loader.h"
#include "model/weight_plan.h"
#include "runtime/engine_args.h"
#include "tokenizer/tokenizer.h"

namespace fdpp {

// The GPU load's progress: tensors, bytes as stored, seconds since the streaming began.
using StreamProgressFn = std::function<void(int tensors_done, int tensors_total, uint64_t bytes_done,
                                            uint64_t bytes_total, double seconds)>;

// A model opened for the device the args pick, before its engine exists.
struct OpenedModel {
  std::string path;  // the resolved model path (load_format dummy: the config file)
  Device device = Device::Cpu;
  ModelDescription description;
  DecoderWeights weights;  // CPU: the host weights the engine reads in place
  WeightPlan plan;         // CUDA: where each tensor lies in the files, streamed by the engine
  bool planned = false;
  bool dummy = false;  // random weights made on the GPU
  // Null for a bare HF checkpoint (no tokenizer files): token ids work, text does not.
  std::unique_ptr<Tokenizer> tokenizer;

  const ModelConfig& config() const { return description.config; }
  // The backend options of args for this model (the plan or dummy weights, the progress callback).
  RunnerOptions runner_options(const EngineArgs& args, const StreamProgressFn& progress = {}) const;
  // An engine of this model; on the GPU the weights stream now. limits as make_engine takes them.
  std::unique_ptr<Engine> make_engine(const EngineArgs& args, const EngineLimits& limits,
                                      const StreamProgressFn& progress = {}) const;
  // A one-sequence runner (fdpp logits) on an engine of its own.
  std::unique_ptr<Runner> make_runner(const EngineArgs& args, int max_context,
                                      const StreamProgressFn& progress = {}) const;
};

// Reads what the device needs before the engine: a GPU plan (the weights stay in the files), the
// CPU's weights (host_progress(fraction) as they are read), or nothing for load_format dummy.
OpenedModel open_model(const EngineArgs& args, const std::function<void(double)>& host_progress = {});

// A model with its engine and, when it has a tokenizer, the continuous-batching scheduler: what the
// server and the Python package run.
struct OpenedEngine {
  OpenedModel model;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<Scheduler> scheduler;  // null without a tokenizer
};

// open_model, then start_engine: the engine of args.engine_limits(device), warmed up
// (Engine::warm_up), and the scheduler of args with max_waiting as its queue bound.
std::unique_ptr<OpenedEngine> open_engine(const EngineArgs& args, int max_waiting,
                                          const StreamProgressFn& progress = {});
void start_engine(OpenedEngine& e, const EngineArgs& args, int max_waiting, const StreamProgressFn& progress = {});

// The tokenizer of a model without tokenizer files that must still run text requests (load_format
// dummy): <unk>, <s>, </s>, the 256 byte tokens, then "▁t<i>" up to vocab_size. Benchmarks send
// token ids with ignore_eos, so the text only has to be valid UTF-8 and cost what a real one does.
std::unique_ptr<Tokenizer> stand_in_tokenizer(int vocab_size);

}  // namespace fdpp
