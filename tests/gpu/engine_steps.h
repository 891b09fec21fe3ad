// The same steps through several engines (a CPU reference and GPU engines of one model): the
// comparison loop of the GPU tests of quantized weights.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <span>
#include <vector>

#include "backend/cuda/cuda_engine.h"
#include "engine/engine.h"
#include "model/weight_plan.h"
#include "runtime/backend_select.h"
#include "tiny_model.h"

namespace fdpp::test {

// The small steps these tests take (8 rows, 256 tokens), for the CPU engine and, as make_engine
// reads them, the GPU's; kv_cache_tokens 0: the engine's own size.
inline EngineLimits small_step_limits(const ModelConfig& c, int64_t kv_cache_tokens = 0) {
  EngineLimits l;
  l.max_context = c.max_context;
  l.max_step_rows = 8;
  l.max_step_tokens = 256;
  l.kv_cache_tokens = kv_cache_tokens;
  return l;
}
// The same for a CudaEngine built directly on a DeviceModel.
inline cuda::EngineOptions small_step_cuda_options() {
  cuda::EngineOptions eo;
  eo.max_batch = 8;
  eo.max_prefill_tokens = 256;
  eo.kv_cache_tokens = 2048;
  return eo;
}
// A checkpoint's GPU engine the runtime's way (open_engine's): its plan streamed by make_engine,
// without CUDA graphs, with --quantization `quantization` and --linear `linear`.
inline std::unique_ptr<Engine> plan_gpu_engine(const ModelConfig& c, const WeightPlan& plan, const EngineLimits& l,
                                               const std::string& quantization = "none",
                                               const std::string& linear = "") {
  RunnerOptions o;
  o.device = Device::Cuda;
  o.plan = &plan;
  o.cuda_graphs = false;
  o.quantization = quantization;
  o.linear = linear;
  return make_engine(c, DecoderWeights{}, o, l);
}

// Row r's logits in a step output of rows of `vocab` logits.
inline std::span<const float> row_logits(const StepOutput& out, int r, int vocab) {
  return {out.logits.data() + size_t(r) * vocab, size_t(vocab)};
}

// `rows` random texts of text_len ids, one sequence each in every engine, stepped alike: step st
// gives every row chunks[st] tokens (at step 0 plus the row's index, so that rows differ in
// length), all with logits; after each step, check(st, outputs) gets every engine's output in the
// engines' order (after a check that they hold the same number of logits).
inline void step_engines_alike(std::initializer_list<Engine*> engines, int vocab, int rows, int text_len,
                               const std::vector<int>& chunks,
                               const std::function<void(size_t, const std::vector<StepOutput>&)>& check) {
  std::vector<std::vector<int32_t>> text;
  for (int i = 0; i < rows; ++i) text.push_back(random_ids(text_len, vocab));
  std::vector<std::vector<int>> seqs;
  for (Engine* e : engines) {
    seqs.emplace_back();
    for (int i = 0; i < rows; ++i) seqs.back().push_back(e->create_sequence());
  }
  std::vector<int> len(size_t(rows), 0);
  for (size_t st = 0; st < chunks.size(); ++st) {
    std::vector<Batch> batches(engines.size());
    for (int i = 0; i < rows; ++i) {
      StepRow r;
      r.tokens = std::span<const int32_t>(text[size_t(i)].data() + len[size_t(i)], chunks[st] + i * (st == 0));
      r.logits = true;
      for (size_t e = 0; e < engines.size(); ++e) {
        r.seq = seqs[e][size_t(i)];
        batches[e].rows.push_back(r);
      }
      len[size_t(i)] += static_cast<int>(r.tokens.size());
    }
    std::vector<StepOutput> outs;
    size_t e = 0;
    for (Engine* engine : engines) outs.push_back(engine->step(batches[e++]));
    for (const StepOutput& o : outs) ASSERT_EQ(o.logits.size(), outs[0].logits.size());
    check(st, outs);
  }
}

}  // namespace fdpp::test
