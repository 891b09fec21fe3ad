// fdpp bench: prefill (pp) and decode (tg) speed of the CUDA backend in the manner of llama-bench,
// each with its % of the memory roofline: the bytes a step must read (weights + KV cache) over
// the read bandwidth (measured at start, and the 4.46 TB/s of DESIGN.md).
#include "bench.h"

#include "bench_cpu.h"
#include "engine_flags.h"
#include "subcommands.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <chrono>
#include <iostream>
#include <random>

#include "attention/calibration.h"
#include "runtime/backend_select.h"
#include "engine/linear_chooser.h"
#include "backend/cuda/bandwidth.h"
#include "backend/cuda/cuda_engine.h"
#include "backend/cuda/device_query.h"
#include "backend/cuda/tensor_parallel_engine.h"
#include "fdpp/error.h"
#include "model/hf_config.h"
#include "model/model_loader.h"

namespace fdpp {

namespace {

using Clock = std::chrono::steady_clock;
constexpr double kDesignReadBandwidth = 4.46e12;  // DESIGN.md: read-only streaming kernel on the H200

double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

std::vector<int32_t> random_ids(int n, int vocab, std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> d(0, vocab - 1);
  std::vector<int32_t> ids(n);
  for (auto& x : ids) x = d(rng);
  return ids;
}

}  // namespace

int run_bench(const BenchArgs& a) {
  std::string why;
  const auto gpus = cuda::list_gpus(&why);
  check(!gpus.empty(),
        "fdpp bench measures the CUDA backend: no usable GPU ({}); fdpp bench --device cpu measures the CPU backend",
        why);
  check(!a.batches.empty() && !a.contexts.empty(), "bench: give at least one batch size and context length");

  // The model: real weights, or random ones of a config's shapes.
  ModelConfig config;
  std::string model_name;
  PlannedModel loaded;  // streamed from the files to the GPU (no host copy of the weights)
  if (a.engine.load_format == "dummy") {
    config = parse_hf_config(read_json_file(a.engine.config), nullptr, a.engine.config, a.engine.config).config;
    model_name = a.engine.config;
  } else {
    loaded = plan_model(resolve_model_path(a.engine.model));
    config = loaded.config();
    model_name = loaded.description.path;
  }
  const cuda::DType dtype =
      gpu_dtype(a.engine.dtype, a.engine.load_format == "dummy" ? nullptr : &loaded.plan) == "bf16" ? cuda::DType::BF16
                                                                                                   : cuda::DType::F16;
  const int max_batch = *std::max_element(a.batches.begin(), a.batches.end());
  const int max_ctx = *std::max_element(a.contexts.begin(), a.contexts.end());
  const int max_prompt = a.prompts.empty() ? 0 : *std::max_element(a.prompts.begin(), a.prompts.end());
  // Decode tests run around the context: from ctx - steps / 2 - 3 (three warm-up steps) to
  // ctx + steps / 2, so the average context is ctx and the cache holds no more than it needs.
  const int half = a.steps / 2 + 3;
  for (int c : a.contexts)
    check(c >= half + 2 && c + a.steps / 2 + 1 <= config.max_context, "context {} out of range [{}, {}]", c, half + 2,
          config.max_context - a.steps / 2 - 1);
  check(a.mixed_chunk >= 0 && a.mixed_chunk <= config.max_context, "--mixed-chunk {} out of range [0, {}]",
        a.mixed_chunk, config.max_context);
  for (int p : a.prompts) check(p >= 1 && p <= config.max_context, "prompt length {} out of range [1, {}]", p, config.max_context);

  const double bandwidth = a.bandwidth > 0 ? a.bandwidth : cuda::measure_read_bandwidth();
  size_t free0 = 0, total = 0;
  FDPP_CUDA_CHECK(cudaMemGetInfo(&free0, &total));

  const int tp = a.engine.tensor_parallel;
  check(tp == 1 || static_cast<int>(gpus.size()) >= tp, "--tensor-parallel {}: this machine has {} GPU{}", tp,
        gpus.size(), gpus.size() == 1 ? "" : "s");
  std::shared_ptr<const cuda::DeviceModel> model;
  check(a.engine.quantization == "none" || tp == 1, "--quantization {} with --tensor-parallel {} is not supported yet",
        a.engine.quantization, tp);
  if (tp == 1) {
    // As the runtime loads it (backend_select.cpp): a GGUF's blocks stay unless quantized otherwise.
    cuda::DeviceModel m = a.engine.load_format == "dummy"
                              ? cuda::DeviceModel::dummy(config, dtype, 1234)
                              : cuda::DeviceModel::from_plan(config, loaded.plan, dtype, {}, nullptr,
                                                             a.engine.gpu_weights == "stored" &&
                                                                 !quantizes_at_load(a.engine.quantization));
    if (a.engine.quantization == "fp8" && !m.int4()) m.quantize_fp8();
    if (a.engine.quantization == "int4" && !m.fp8()) m.quantize_int4();
    model = std::make_shared<const cuda::DeviceModel>(std::move(m));
  }
  cuda::EngineOptions eo;
  eo.max_batch = max_batch;
  eo.max_prefill_tokens = std::max({2048, max_prompt, a.mixed_chunk + max_batch});
  // Exactly what the tests hold at once: max_batch sequences at ctx + steps / 2 (block-rounded,
  // +1 for the mixed test's chunk), or one prompt.
  const int64_t per_seq = (max_ctx + a.steps / 2 + 1 + 15) / 16 * 16;
  eo.kv_cache_tokens = std::max<int64_t>(int64_t{max_batch} * per_seq + (a.mixed_chunk + 15) / 16 * 16,
                                         max_prompt + 16);
  eo.cuda_graphs = a.engine.cuda_graphs;
  if (cuda_kv_cache_fp8(a.engine.kv_cache_dtype)) eo.kv_quant.dtype = cuda::KvDType::Fp8E4M3;
  eo.attention = a.engine.attention == "sync" ? cuda::AttentionMode::Sync : cuda::AttentionMode::Async;
  if (a.engine.load_format != "dummy" && (eo.attention == cuda::AttentionMode::Async || !a.engine.calibration.empty())) {
    RunnerOptions ro;  // the rule every front end follows (backend_select.h): named file, else looked up
    ro.model_path = loaded.description.path;
    ro.calibration = a.engine.calibration;
    eo.unified_max_phi = resolve_unified_max_phi(config, ro);
  } else if (!a.engine.calibration.empty()) {
    // Random weights have no model file to match; the phi still comes from the file named.
    for (const LayerCalibration& l : load_calibration("", a.engine.calibration).layers) eo.unified_max_phi.push_back(l.bounds.phi);
    check(static_cast<int>(eo.unified_max_phi.size()) == config.n_layers, "--calibration {}: {} layers, the model {}",
          a.engine.calibration, eo.unified_max_phi.size(), config.n_layers);
  }
  // Flags first, the environment where one is not given (environment_fallback.h).
  const DispatchSelectOptions linear_options = resolve_linear_flags(a.engine.linear, a.engine.dispatch_table);
  eo.linear_mode = linear_options.mode;
  eo.dispatch_table = linear_options.table_path;
  eo.gemv_max_m = linear_options.gemv_max_m;
  eo.kernels = resolve_kernel_options(a.engine.kernels);
  eo.prefill_attention_config = a.engine.prefill_attention_config_index();
  if (a.engine.load_format != "dummy") eo.model_path = loaded.description.path;
  // One GPU, or the model split over tp GPUs (rank 0's GPU is the one whose memory is reported;
  // every rank holds the same shapes).
  std::unique_ptr<cuda::CudaEngine> single;
  std::unique_ptr<cuda::TensorParallelEngine> split;
  if (tp == 1) {
    single = std::make_unique<cuda::CudaEngine>(model, eo);
  } else {
    cuda::ShardSource source;
    source.plan = a.engine.load_format == "dummy" ? nullptr : &loaded.plan;
    source.dtype = dtype;
    source.kv_tokens = eo.kv_cache_tokens;
    source.step_tokens = eo.max_prefill_tokens;
    split = std::make_unique<cuda::TensorParallelEngine>(config, tp, source, eo);
    model = std::shared_ptr<const cuda::DeviceModel>(std::shared_ptr<void>(), &split->model(0));
  }
  Engine& engine = tp == 1 ? static_cast<Engine&>(*single) : *split;
  cuda::CudaEngine& rank0 = tp == 1 ? *single : split->rank(0);
  if (split) split->randomize_kv_cache(99);
  else single->randomize_kv_cache(99);
  size_t free1 = 0;
  FDPP_CUDA_CHECK(cudaMemGetInfo(&free1, &total));

  // Bytes one decode step must read besides the KV cache: every weight except the embedding
  // table (only B rows of it are read) unless it doubles as the lm head.
  const uint64_t emb_bytes = model->tok_embeddings.bytes();
  const uint64_t streamed_weights =
      model->bytes() - model->pos_embeddings.bytes() - (config.tied_embeddings && tp == 1 ? 0 : emb_bytes);
  // Per GPU: a rank reads its shard of the weights and its KV heads (the roofline is per GPU).
  const ModelConfig& local = rank0.config();
  const double kv_bytes_per_token =
      2.0 * local.n_layers * local.kv_dim() * static_cast<double>(cuda::kv_element_bytes(eo.kv_quant.dtype));
  double matmul_params = static_cast<double>(streamed_weights) / 2 * tp;
  if (model && (model->fp8() || model->int4())) {
    // The layers' matrices hold one byte (FP8) or half a byte (4-bit) per weight, plus their scales.
    uint64_t packed_bytes = 0, scale_bytes = 0;
    for (const cuda::DeviceLayer& L : model->layers) {
      packed_bytes += L.w_qkv.bytes() + L.w_o.bytes() + L.w_in.bytes() + L.w_down.bytes();
      scale_bytes += L.s_qkv.bytes() + L.s_o.bytes() + L.s_in.bytes() + L.s_down.bytes();
      for (const cuda::DeviceInt4* m : {&L.i_qkv, &L.i_o, &L.i_in, &L.i_down})
        scale_bytes += m->zs.bytes() + m->perm.bytes();
    }
    matmul_params = static_cast<double>(streamed_weights - packed_bytes - scale_bytes) / 2 +
                    static_cast<double>(packed_bytes) * (model->int4() ? 2 : 1);
  }

  // Expert layers: a step reads only the experts its tokens chose. The roofline counts those: at n
  // tokens, E (1 - (1 - k/E)^n) distinct experts per layer in expectation (routing is uniform
  // enough over random weights); the products of a token run k of the E experts.
  uint64_t expert_bytes = 0;
  if (model)
    for (const cuda::DeviceLayer& L : model->layers)
      expert_bytes += L.experts_gate.bytes() + L.experts_up.bytes() + L.experts_down.bytes();
  const double expert_share = config.n_experts > 0 ? double(config.n_experts_used) / config.n_experts : 1.0;
  auto step_weights = [&](int tokens) {
    const double touched = 1.0 - std::pow(1.0 - expert_share, tokens);
    return static_cast<double>(streamed_weights - expert_bytes) + static_cast<double>(expert_bytes) * touched;
  };
  matmul_params -= static_cast<double>(expert_bytes) / 2 * (1.0 - expert_share);

  nlohmann::json results = nlohmann::json::array();
  std::mt19937 rng(7);
  SamplingParams greedy;
  greedy.temperature = 0;

  for (int p : a.prompts) {
    std::vector<double> secs;
    for (int r = -1; r < a.repetitions; ++r) {  // r = -1: warm-up
      const int seq = engine.create_sequence();
      const auto ids = random_ids(p, config.vocab_size, rng);
      Batch batch;
      StepRow row;
      row.seq = seq;
      row.tokens = ids;
      row.sample = true;
      row.sampling = greedy;
      batch.rows.push_back(row);
      const auto t0 = Clock::now();
      engine.step(batch);  // the whole prompt in one step (max_prefill_tokens >= p), first token sampled
      const double s = std::chrono::duration<double>(Clock::now() - t0).count();
      engine.release_sequence(seq);
      if (r >= 0) secs.push_back(s);
    }
    const double t = median(secs);
    const double flops = 2.0 * matmul_params * p +
                         2.0 * 2.0 * config.n_layers * config.q_dim() * (static_cast<double>(p) * (p + 1) / 2);
    results.push_back({{"test", fmt::format("pp{}", p)}, {"batch", 1}, {"n_tokens", p}, {"seconds", t},
                       {"tokens_per_second", p / t}, {"tflops", flops / t / 1e12},
                       {"roofline_measured", step_weights(p) / bandwidth / t},
                       {"roofline_design", step_weights(p) / kDesignReadBandwidth / t}});
  }

  // Decode steps of b sequences through Engine::step (the server's path: graph-replayed when every
  // row is a decode row). With a chunk, one more sequence prefills `chunk` fresh tokens in every
  // step (the mixed step a server runs while a prompt arrives); chunk == 0: pure decode. Returns
  // the median step time.
  auto decode_steps = [&](int b, int ctx, int chunk, uint64_t* rows_out, uint64_t* fallback_out) {
    std::vector<int> seqs;
    for (int i = 0; i < b; ++i) {
      seqs.push_back(engine.create_sequence());
      if (split) split->reserve_for_benchmark(seqs.back(), ctx - half);
      else single->reserve_for_benchmark(seqs.back(), ctx - half);
    }
    std::vector<int32_t> tokens = random_ids(b, config.vocab_size, rng);
    const std::vector<int32_t> chunk_ids = random_ids(std::max(chunk, 1), config.vocab_size, rng);
    std::vector<double> secs;
    const uint64_t rows0 = rank0.attention_rows(), fallback0 = rank0.attention_fallback_rows();
    for (int step = -3; step < a.steps; ++step) {
      Batch batch;
      for (int i = 0; i < b; ++i) {
        StepRow r;
        r.seq = seqs[i];
        r.tokens = std::span<const int32_t>(&tokens[i], 1);
        r.sample = true;
        r.sampling = greedy;
        r.sample_index = static_cast<uint64_t>(step + 3);
        batch.rows.push_back(r);
      }
      int chunk_seq = -1;
      if (chunk > 0) {
        chunk_seq = engine.create_sequence();
        StepRow r;
        r.seq = chunk_seq;
        r.tokens = chunk_ids;
        batch.rows.push_back(r);
      }
      const auto t0 = Clock::now();
      const StepOutput out = engine.step(batch);
      const double s = std::chrono::duration<double>(Clock::now() - t0).count();
      std::copy(out.tokens.begin(), out.tokens.begin() + b, tokens.begin());
      if (chunk_seq >= 0) engine.release_sequence(chunk_seq);
      if (step >= 0) secs.push_back(s);
    }
    if (rows_out) *rows_out = rank0.attention_rows() - rows0;
    if (fallback_out) *fallback_out = rank0.attention_fallback_rows() - fallback0;
    for (int s : seqs) engine.release_sequence(s);
    return median(secs);
  };

  for (int b : a.batches) {
    for (int ctx : a.contexts) {
      uint64_t rows = 0, fallback = 0;
      const double t = decode_steps(b, ctx, 0, &rows, &fallback);
      const double avg_ctx = ctx;
      const double bytes = step_weights(b) + b * avg_ctx * kv_bytes_per_token;
      // The collectives a decode step of b rows runs (2 all-reduces per layer, the logits'
      // all-gather), timed alone in a graph of the same calls.
      const double collective_ms = split ? split->time_collectives(b, 20) * 1e3 : 0.0;
      results.push_back({{"test", fmt::format("tg{}@{}", b, ctx)}, {"batch", b}, {"context", ctx},
                         {"collective_ms", collective_ms},
                         {"ms_per_step", t * 1e3}, {"tokens_per_second", b / t},
                         {"floor_ms_measured", bytes / bandwidth * 1e3},
                         {"roofline_measured", bytes / bandwidth / t},
                         {"roofline_design", bytes / kDesignReadBandwidth / t},
                         {"attention_rows", rows}, {"attention_fallback_rows", fallback}});
      if (a.mixed_chunk > 0 && b >= 2) {
        // Issue 11's mixed step: b - 1 sequences decoding while one prefills a chunk, against
        // the b - 1 decode step and the chunk alone (same run, same engine).
        const double decode_only = decode_steps(b - 1, ctx, 0, nullptr, nullptr);
        const double chunk_only = decode_steps(0, ctx, a.mixed_chunk, nullptr, nullptr);
        const double mixed = decode_steps(b - 1, ctx, a.mixed_chunk, nullptr, nullptr);
        results.push_back({{"test", fmt::format("mix{}+pp{}@{}", b - 1, a.mixed_chunk, ctx)},
                           {"batch", b - 1},
                           {"context", ctx},
                           {"ms_per_step", mixed * 1e3},
                           {"decode_only_ms", decode_only * 1e3},
                           {"chunk_only_ms", chunk_only * 1e3},
                           {"overhead_ms", (mixed - decode_only - chunk_only) * 1e3},
                           {"tokens_per_second", (b - 1 + a.mixed_chunk) / mixed},
                           {"roofline_measured", 0.0},
                           {"roofline_design", 0.0}});
      }
    }
  }

  const cuda::MemoryReport mem = rank0.memory();
  const std::string kv_dtype_name = eo.kv_quant.dtype == cuda::KvDType::Fp8E4M3 ? "fp8" : "auto";
  const double accounted = static_cast<double>(mem.weights + mem.kv_cache + mem.activations + mem.workspace);
  const double used = static_cast<double>(free0 - free1);
  nlohmann::json out{{"model", model_name},
                     {"gpu", gpus[0].name},
                     {"dtype", dtype == cuda::DType::BF16 ? "bf16" : "f16"},
                     {"quantization", a.engine.quantization},
                     {"kv_cache_dtype", kv_dtype_name},
                     {"params", matmul_params + static_cast<double>(config.tied_embeddings ? 0 : emb_bytes / 2)},
                     {"cuda_graphs", a.engine.cuda_graphs},
                     {"attention", a.engine.attention},
                     {"linear", linear_mode_name(rank0.linear_dispatcher().chooser().mode())},
                     {"pdl", eo.kernels.programmatic_launch},
                     {"decode_path", cuda::decode_path_name(eo.kernels.decode_path)},
                     {"decode_warps", eo.kernels.decode_warps},
                     {"async_combine", cuda::async_combine_name(eo.kernels.async_combine)},
                     {"kv_layout", eo.kernels.kv_head_major ? "head-major" : "token-major"},
                     {"tensor_parallel", tp},
                     {"read_bandwidth_measured", bandwidth},
                     {"read_bandwidth_design", kDesignReadBandwidth},
                     {"memory",
                      {{"weights", mem.weights},
                       {"kv_cache", mem.kv_cache},
                       {"kv_tokens", mem.kv_tokens},
                       {"activations", mem.activations},
                       {"workspace", mem.workspace},
                       {"accounted", accounted},
                       {"device_used_by_engine", used}}},
                     {"results", results}};
  if (a.json) {
    std::cout << out.dump(1) << "\n";
    return 0;
  }
  fmt::print("model: {} | GPU: {} | {} | CUDA graphs: {} | attention: {} | read bandwidth measured {:.2f} TB/s (design "
             "4.46)\n",
             model_name, gpus[0].name,
             fmt::format("{}{}", dtype == cuda::DType::BF16 ? "bf16" : "f16",
                         a.engine.quantization == "none" ? "" : " weights " + a.engine.quantization),
             a.engine.cuda_graphs ? "on" : "off", a.engine.attention, bandwidth / 1e12);
  fmt::print("memory: weights {:.2f} GiB + KV cache {:.2f} GiB ({} tokens{}) + activations {:.2f} GiB + workspace {:.2f} "
             "GiB = {:.2f} GiB; the engine took {:.2f} GiB of device memory ({:+.1f}%)\n\n",
             mem.weights / 1073741824.0, mem.kv_cache / 1073741824.0, mem.kv_tokens,
             eo.kv_quant.dtype == cuda::KvDType::Fp8E4M3 ? ", fp8 e4m3" : "", mem.activations / 1073741824.0,
             mem.workspace / 1073741824.0, accounted / 1073741824.0, used / 1073741824.0,
             100.0 * (used - accounted) / accounted);
  if (tp > 1)
    fmt::print("tensor parallel: {} GPUs; memory and the roofline are per GPU (each reads its shard); NCCL {}\n\n", tp,
               cuda::CommGroup::nccl_version());
  fmt::print("| test | batch | context | ms/step | tokens/s | TFLOP/s | % roofline (measured BW) | % roofline (4.46 TB/s) |{}\n",
             tp > 1 ? " collectives ms/step |" : "");
  fmt::print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |{}\n", tp > 1 ? " ---: |" : "");
  for (const auto& r : results) {
    if (r.contains("decode_only_ms")) {
      fmt::print("| {} | {} | {} | {:.3f} | {:.1f} | - | decode alone {:.3f} ms + chunk alone {:.3f} ms = {:.3f}; "
                 "mixing adds {:+.3f} ms | |\n",
                 r["test"].get<std::string>(), r["batch"].get<int>(), r["context"].get<int>(),
                 r["ms_per_step"].get<double>(), r["tokens_per_second"].get<double>(), r["decode_only_ms"].get<double>(),
                 r["chunk_only_ms"].get<double>(),
                 r["decode_only_ms"].get<double>() + r["chunk_only_ms"].get<double>(), r["overhead_ms"].get<double>());
      continue;
    }
    const bool pp = r.contains("n_tokens");
    const std::string coll =
        tp > 1 ? (pp ? std::string(" - |") : fmt::format(" {:.3f} |", r["collective_ms"].get<double>())) : "";
    fmt::print("| {} | {} | {} | {:.3f} | {:.1f} | {} | {:.1f} | {:.1f} |{}\n", r["test"].get<std::string>(),
               r["batch"].get<int>(), pp ? std::string("-") : std::to_string(r["context"].get<int>()),
               pp ? r["seconds"].get<double>() * 1e3 : r["ms_per_step"].get<double>(),
               r["tokens_per_second"].get<double>(), pp ? fmt::format("{:.1f}", r["tflops"].get<double>()) : "-",
               100 * r["roofline_measured"].get<double>(), 100 * r["roofline_design"].get<double>(), coll);
  }
  return 0;
}

}  // namespace fdpp

namespace fdpp::cli {

Subcommand register_bench(CLI::App& app) {
  static BenchArgs b;
  static BenchCpuArgs bc;
  static std::string bench_device = "cuda";
  auto* bench = app.add_subcommand("bench", "prefill (pp) and decode (tg) speed on the GPU, llama-bench style");
  add_engine_flags(bench, b.engine, kBench);
  bench->add_option("-b,--batch", b.batches, "decode batch sizes, e.g. 1,8,32")->delimiter(',')->check(CLI::Range(1, 1024));
  bench->add_option("-c,--context", b.contexts, "decode context lengths, e.g. 1024,4096")->delimiter(',')->check(CLI::Range(2, 1 << 22));
  bench->add_option("-p,--prompt", b.prompts, "prefill lengths (0 entries: none; --device cpu: 0 for none)")->delimiter(',')->check(CLI::Range(0, 1 << 22));
  bench->add_option("-r,--repetitions", b.repetitions, "timed prefill runs per length")->capture_default_str()->check(CLI::Range(1, 1000));
  bench->add_option("--steps", b.steps, "timed decode steps per (batch, context)")->capture_default_str()->check(CLI::Range(1, 100000));
  bench->add_option("--bandwidth", b.bandwidth, "read bandwidth in bytes/s for the roofline (default: measure)");
  bench->add_flag("--json", b.json, "print JSON");
  bench->add_option("--mixed-chunk", b.mixed_chunk,
                    "mixed test: batch - 1 sequences decode while one prefills a chunk of this many tokens (0: off)")
      ->capture_default_str();
  bench->add_option("--device", bench_device, "cuda, or cpu (llama-bench's pp/tg table for the CPU backend)")
      ->capture_default_str()
      ->check(CLI::IsMember({"cuda", "cpu"}));
  add_bench_cpu_options(bench, bc);
  return {bench, [bench] {
            check_engine_flags(b.engine);
            if (bench_device != "cpu") return run_bench(b);
            bc.model = b.engine.model;
            bc.kv_cache_dtype = b.engine.kv_cache_dtype;  // the table's flag (the CPU refuses fp8)
            bc.repetitions = b.repetitions;
            bc.json = b.json;
            if (bench->count("-p") > 0) bc.prompts = b.prompts;
            return run_bench_cpu(bc);
          }};
}

}  // namespace fdpp::cli
