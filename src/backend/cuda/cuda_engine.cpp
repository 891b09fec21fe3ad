#include "backend/cuda/cuda_engine.h"

#include "attention/unified_max.h"
#include "backend/cuda/collectives.h"
#include "backend/cuda/linear_tuning.h"
#include "backend/cuda/moe.h"
#include "backend/cuda/per_device.h"
#include "model/forward.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <string>

namespace fdpp::cuda {

namespace {
constexpr size_t kElem = 2;  // bytes of a 16-bit activation/weight
template <class T>
void upload(DeviceBuffer& dst, const std::vector<T>& src, cudaStream_t stream) {
  FDPP_CUDA_CHECK(cudaMemcpyAsync(dst.get(), src.data(), src.size() * sizeof(T), cudaMemcpyHostToDevice, stream));
}
// A buffer of at least `bytes` (reallocated when smaller: the stream is idle between steps).
void ensure_bytes(DeviceBuffer& b, size_t bytes) {
  if (b.bytes() < bytes) b = DeviceBuffer(bytes);
}
}  // namespace

std::string cuda_model_problem(const ModelConfig& c) {
  if (c.embedding_dim() > c.hidden || (c.embedding_dim() * 2) % 16 != 0)
    return fmt::format(
        "the CUDA backend runs embedding projections of at most the hidden size ({} > {}) in rows of 16 bytes",
        c.embedding_dim(), c.hidden);
  // Prefill attention runs 64, 96, 128 and 256 (decode attention 80 too).
  if (c.head_dim != 64 && c.head_dim != 96 && c.head_dim != 128 && c.head_dim != 256)
    return fmt::format("the CUDA backend supports head_dim 64, 96, 128 and 256, not {}", c.head_dim);
  // A layer's rope: the global one's rotary dims, and the local one's the same (one buffer size).
  if (c.has_local_rope && c.local_rope.rotary_dim != c.rope.rotary_dim)
    return fmt::format("the CUDA backend has no local rope of {} rotary dims beside a global one of {}",
                       c.local_rope.rotary_dim, c.rope.rotary_dim);
  return "";
}

std::string tensor_parallel_model_problem(const ModelConfig& c) {
  if (c.sandwich_norm || c.activation == Activation::GeGLU || c.attn_softcap > 0 || c.final_softcap > 0 ||
      c.embed_scale != 1.0 || c.has_local_rope)
    return "tensor parallelism runs no Gemma model yet (sandwich norms, GeGLU, soft-capping, local rope): run it on "
           "one GPU";
  for (int w : c.layer_windows)
    if (w > 0 && w < c.max_context)
      return fmt::format("tensor parallelism runs no sliding window yet (a window of {} in a context of {})", w,
                         c.max_context);
  return "";
}

namespace {
// The prefill tile configuration of an engine: the one asked for, else the warp-specialized
// warpgroup-MMA kernel with the TMA producer wherever it runs (sm_90a, head_dim 64 or 128, a 16-bit
// cache; decided once, since it asks the device; caches of blocks under 8 keys take its cp.async
// twin at launch): it leads the mma.sync configurations and wg128n128 on the prefill grid
// (docs/kernels/prefill_attention.md). -1 where neither: chosen per step by
// prefill_config_for_chunk.
int fixed_prefill_config(int configured, int head_dim, KvDType kv_dtype) {
  check(configured >= -1 && configured < prefill_attention_configs(),
        "prefill attention configuration {} out of range [-1, {})", configured, prefill_attention_configs());
  if (configured >= 0) return configured;
  const int wgmma = prefill_attention_config_index("wg128n128wst");
  return prefill_attention_config_runs(wgmma, head_dim, kv_dtype) ? wgmma : -1;
}

// Without a fixed configuration, by the step's longest chunk, measured on the H200 (2026-11-30 run
// b, fp16, head_dim 128, causal, 32/32 and 32/8 heads): at 1 x 1024 m128n64w8s3 is fastest (40.5
// us; m128n32w4 56.9 us), from 1 x 4096 up and at 8 x 2048 m128n32w4 is (497.7 vs 525.1 us at 4K,
// 1062.9 vs 1111.8 us at 8 x 2K, 285 vs 280 TFLOP/s at 32K).
int prefill_config_for_chunk(int max_chunk) {
  static const int small = prefill_attention_config_index("m128n64w8s3");
  static const int large = prefill_attention_config_index("m128n32w4");
  return max_chunk <= 1536 ? small : large;
}
}  // namespace

CudaEngine::CudaEngine(std::shared_ptr<const DeviceModel> model, const EngineOptions& options)
    : model_(std::move(model)), options_(options) {
  const ModelConfig& c = model_->config();
  if (const std::string problem = cuda_model_problem(c); !problem.empty()) fail("{}", problem);
  check(options.max_batch >= 1 && options.max_batch <= 1024, "max batch {} out of range [1, 1024]", options.max_batch);
  check(options.block_size >= 1 && (options.block_size & (options.block_size - 1)) == 0,
        "KV block size {} must be a power of two", options.block_size);
  const KvQuant& kvq = options.kv_quant;
  check(kvq.dtype == KvDType::Model || kvq.dtype == KvDType::Fp8E4M3, "unknown KV cache dtype {}",
        static_cast<int>(kvq.dtype));
  prefill_config_ = fixed_prefill_config(options.prefill_attention_config, c.head_dim, kvq.dtype);
  // A 16-bit cache passes the options as they are (the model's scales are an e4m3 cache's alone).
  layer_kv_quant_.assign(static_cast<size_t>(c.n_layers), kvq);
  if (kvq.dtype == KvDType::Fp8E4M3) {
    check(c.kv_cache_scales.empty() || c.kv_cache_scales.size() == static_cast<size_t>(c.n_layers),
          "--kv-cache-dtype fp8: {} layers of KV cache scales for a model of {} layers", c.kv_cache_scales.size(),
          c.n_layers);
    for (int layer = 0; layer < c.n_layers; ++layer) {
      KvQuant& q = layer_kv_quant_[static_cast<size_t>(layer)];
      if (!c.kv_cache_scales.empty()) {
        q.k_scale = c.kv_cache_scales[static_cast<size_t>(layer)].k;
        q.v_scale = c.kv_cache_scales[static_cast<size_t>(layer)].v;
      }
      check_kv_quant(q, c.head_dim, fmt::format("--kv-cache-dtype fp8 (layer {})", layer).c_str());
    }
  }
  kv_elem_bytes_ = kv_element_bytes(kvq.dtype);

  const int64_t H = c.hidden, Q = c.q_dim(), KV = c.kv_dim(), FF = c.ffn_hidden, V = c.vocab_size;
  const bool swiglu = c.activation == Activation::SwiGLU || c.activation == Activation::GeGLU;  // gated
  // Every linear layer goes through the dispatcher (heuristic dataflow: the tuned table for this
  // GPU, else the fallback rule; --linear forces one implementation).
  DispatchSelectOptions dispatch;
  dispatch.table_path = options.dispatch_table;
  dispatch.model_path = options.model_path;
  dispatch.mode = options.linear_mode;
  dispatch.gemv_max_m = options.gemv_max_m;
  linear_ = std::make_unique<LinearDispatcher>(model_->dtype(), dispatch);
  max_tokens_ = std::max(options.max_batch, options.max_prefill_tokens);
  const int64_t T = max_tokens_;
  // Workspaces for every shape of the model before any graph is captured.
  const EngineOptions::Shard& shard = options.shard;
  check(shard.ranks >= 1 && shard.rank >= 0 && shard.rank < shard.ranks, "tensor parallel rank {} of {}", shard.rank,
        shard.ranks);
  check(shard.ranks == 1 || (shard.comm != nullptr && shard.vocab_stride > 0), "tensor parallel rank without a group");
  // With a communicator the engine runs the collectives even alone (a group of one: the tensor-
  // parallel path on one GPU, as its tests run it where only one GPU is lent).
  const bool collectives = shard.comm != nullptr;
  vocab_rows_ = !collectives ? V : static_cast<int64_t>(model_->output_matrix_bytes() / kElem / c.embedding_dim());
  check(!collectives || (vocab_rows_ <= shard.vocab_stride && vocab_rows_ > 0),
        "tensor parallel rank {}: {} lm head rows, at most {} expected", shard.rank, vocab_rows_, shard.vocab_stride);
  std::vector<LinearShape> shapes = model_linear_shapes(c);
  for (LinearShape& s : shapes)
    if (s.name == "lm_head") s.n = static_cast<int>(vocab_rows_);
  linear_->reserve(max_tokens_, shapes, /*cublas_epilogues=*/false, nullptr);
  if (model_->fp8() || model_->int4() || model_->gguf()) {
    std::vector<LinearShape> layer_shapes;  // the lm head stays 16-bit
    for (const LinearShape& s : shapes)
      if (s.name != "lm_head") layer_shapes.push_back(s);
    if (model_->fp8()) linear_->reserve_fp8(max_tokens_, layer_shapes, nullptr);
    bool act_order = false;
    for (const DeviceLayer& L : model_->layers)
      for (const DeviceInt4* m : {&L.i_qkv, &L.i_o, &L.i_in, &L.i_down}) act_order = act_order || !m->perm.empty();
    if (model_->int4()) linear_->reserve_int4(max_tokens_, layer_shapes, act_order, nullptr);
    if (model_->gguf()) linear_->reserve_gguf(max_tokens_, layer_shapes, nullptr);
  }
  x_ = DeviceBuffer(T * H * sizeof(float));
  normed_ = DeviceBuffer(T * H * kElem);
  qkv_ = DeviceBuffer(T * (Q + 2 * KV) * kElem);
  attn_ = DeviceBuffer(T * Q * kElem);
  o_ = DeviceBuffer(T * H * kElem);
  ffn_in_ = DeviceBuffer(T * (swiglu ? 2 : 1) * FF * kElem);
  ffn_act_ = DeviceBuffer(swiglu ? T * FF * kElem : 0);
  if (c.has_moe()) {
    const MoeRoutingSizes ms = moe_routing_sizes(static_cast<int>(T), c.n_experts_used, c.n_experts);
    moe_logits_ = DeviceBuffer(T * c.n_experts * sizeof(float));
    moe_pick_expert_ = DeviceBuffer(ms.picks * sizeof(int32_t));
    moe_pick_weight_ = DeviceBuffer(ms.picks * sizeof(float));
    moe_pick_row_ = DeviceBuffer(ms.picks * sizeof(int32_t));
    moe_row_token_ = DeviceBuffer(ms.rows * sizeof(int32_t));
    moe_tile_expert_ = DeviceBuffer(ms.tiles * sizeof(int32_t));
    moe_block_tile_ = DeviceBuffer(ms.blocks * sizeof(int32_t));
    moe_arrivals_ = DeviceBuffer(sizeof(unsigned));
    FDPP_CUDA_CHECK(cudaMemset(moe_arrivals_.get(), 0, sizeof(unsigned)));
    moe_act_ = DeviceBuffer(ms.rows * c.expert_ffn_hidden * kElem);
    moe_down_ = DeviceBuffer(ms.rows * H * kElem);
  }
  // Logits rows: a decode step's batch, or a chunk of an all-positions prefill.
  const int logit_rows = std::max(options.max_batch, std::min(options.max_prefill_tokens, 256));
  logit_capacity_ = logit_rows;
  logits_ = DeviceBuffer(static_cast<size_t>(logit_rows) * V * sizeof(float));
  if (collectives) {
    shard_logits_ = DeviceBuffer(static_cast<size_t>(logit_rows) * shard.vocab_stride * sizeof(float));
    gathered_logits_ = DeviceBuffer(shard_logits_.bytes() * shard.ranks);
  }
  ids_ = DeviceBuffer(T * sizeof(int32_t));
  if (c.embedding_dim() != c.hidden) {
    // OPT's project_in: the projected rows are looked up again, by row index, to add the positions.
    std::vector<int32_t> iota(static_cast<size_t>(T));
    std::iota(iota.begin(), iota.end(), 0);
    row_index_ = DeviceBuffer(T * sizeof(int32_t));
    FDPP_CUDA_CHECK(cudaMemcpy(row_index_.get(), iota.data(), iota.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  }
  positions_ = DeviceBuffer(T * sizeof(int32_t));
  slots_ = DeviceBuffer(T * sizeof(int32_t));
  max_blocks_per_seq_ = (c.max_context + options.block_size - 1) / options.block_size;
  // A mixed step's block tables: one row per decode row, then one per prefill chunk.
  block_tables_ = DeviceBuffer(static_cast<size_t>(options.max_batch) * max_blocks_per_seq_ * sizeof(int32_t));
  context_lens_ = DeviceBuffer(options.max_batch * sizeof(int32_t));
  head_index_ = DeviceBuffer(logit_rows * sizeof(int32_t));
  chunk_meta_ = DeviceBuffer((2 * static_cast<size_t>(options.max_batch) + 1) * sizeof(int32_t));
  seeds_ = DeviceBuffer(logit_rows * sizeof(uint64_t));
  sample_ws_ = DeviceBuffer(sampling_workspace_bytes(logit_rows, static_cast<int>(V)));
  sample_ids_ = DeviceBuffer(logit_rows * sizeof(int32_t));
  history_lens_ = DeviceBuffer(logit_rows * sizeof(int32_t));
  offsets_ = DeviceBuffer(logit_rows * sizeof(uint64_t));
  // Structured output's token masks: per sampled row (at most one per row of the step) its mask
  // words, then the rows' head indices.
  token_masks_ = DeviceBuffer(static_cast<size_t>(options.max_batch) * ((V + 31) / 32 + 1) * sizeof(uint32_t));
  const size_t decode_in_ints = 4 * static_cast<size_t>(options.max_batch) +
                                static_cast<size_t>(options.max_batch) * max_blocks_per_seq_;
  decode_in_ = DeviceBuffer(decode_in_ints * sizeof(int32_t));
  multiprocessors_ = multiprocessors_of_current_device();
  size_t attn_ws = 0;  // the most any decode step's split plan needs
  // The split plan depends on the kernel options (warps per CTA): size the workspace under them.
  const KernelOptionsScope sizing_kernels(options.kernels);
  for (int b = 1; b <= options.max_batch; ++b) {
    const int splits = max_decode_splits(b, c.n_heads, c.n_kv_heads, c.head_dim, c.max_context, multiprocessors_);
    attn_ws = std::max(attn_ws, options.attention == AttentionMode::Async
                                    ? decode_attention_async_workspace_bytes(b, c.n_heads, c.n_kv_heads, c.head_dim,
                                                                             splits)
                                    : decode_attention_workspace_bytes(b, c.n_heads, c.head_dim, splits));
  }
  attn_ws_ = DeviceBuffer(attn_ws);
  // The async kernels' counters, for the largest batch, zeroed once (the kernels leave them so).
  attn_counter_ints_ = decode_attention_async_counters(options.max_batch, c.n_heads, c.n_kv_heads);
  attn_counters_ = DeviceBuffer(sizeof(int) * static_cast<size_t>(attn_counter_ints_));
  FDPP_CUDA_CHECK(cudaMemset(attn_counters_.get(), 0, attn_counters_.bytes()));
  fallback_rows_ = DeviceBuffer(2 * sizeof(unsigned long long));  // [decode, prefill]
  FDPP_CUDA_CHECK(cudaMemset(fallback_rows_.get(), 0, fallback_rows_.bytes()));
  check(options.unified_max_phi.empty() || static_cast<int>(options.unified_max_phi.size()) == c.n_layers,
        "unified max: {} phi values for a model of {} layers", options.unified_max_phi.size(), c.n_layers);
  for (int layer = 0; layer < c.n_layers; ++layer) {
    const float phi = options.unified_max_phi.empty() ? 0.f : options.unified_max_phi[layer];
    // The range holds for rows of up to the model's context length (attention/unified_max.cpp).
    const UnifiedMaxBounds bounds = derive_unified_max_bounds(phi, std::max(1, c.max_context));
    unified_max_.push_back({bounds.phi, bounds.a, bounds.b});
  }

  // The KV cache takes what is left (or exactly what was asked for), less a fixed headroom for what
  // is allocated later (graph instantiation, cuBLAS's lazily created handles). A fraction of free
  // memory would waste gigabytes on a 141 GB card (0.98 of 126 GiB leaves 2.5 GiB unused, and
  // `fdpp bench -b 64 -c 4000` on Llama-2-7B needs all but 0.3 GiB of it).
  constexpr double kHeadroomBytes = 512.0 * 1048576.0;
  block_bytes_ = static_cast<size_t>(options.block_size) * KV * kv_elem_bytes_;
  const size_t per_block_all_layers = block_bytes_ * 2 * c.n_layers;
  size_t free_b = 0, total_b = 0;
  FDPP_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  const double usable = std::max(0.0, static_cast<double>(free_b) - kHeadroomBytes);
  if (options.kv_cache_tokens > 0) {
    num_blocks_ = (options.kv_cache_tokens + options.block_size - 1) / options.block_size;
    const double need = static_cast<double>(num_blocks_) * per_block_all_layers;
    check(need <= usable,
          "a KV cache of {} tokens needs {:.2f} GiB; {:.2f} GiB of GPU memory are free after the weights and "
          "activations ({:.2f} GiB kept as headroom): ask for at most {} tokens",
          options.kv_cache_tokens, need / 1073741824.0, free_b / 1073741824.0, kHeadroomBytes / 1073741824.0,
          static_cast<int64_t>(usable / per_block_all_layers) * options.block_size);
  } else {
    num_blocks_ = static_cast<int64_t>(std::min(options.memory_fraction * static_cast<double>(free_b), usable)) /
                  per_block_all_layers;
    if (shard.ranks > 1 && shard.agree_kv_blocks) num_blocks_ = shard.agree_kv_blocks(num_blocks_);
    check(num_blocks_ >= max_blocks_per_seq_ / 8 + 1,
          "too little GPU memory for a KV cache: {:.2f} GiB free after the weights", free_b / 1073741824.0);
  }
  kv_ = DeviceBuffer(static_cast<size_t>(num_blocks_) * per_block_all_layers);
  EngineLimits limits;
  limits.max_context = c.max_context;
  limits.max_step_tokens = max_tokens_;
  limits.max_step_rows = options.max_batch;
  limits.kv_cache_tokens = num_blocks_ * options.block_size;
  limits.block_size = options.block_size;
  limits.max_logit_rows = logit_capacity_;
  init_engine(limits);
  // Last, so that no check above can throw after them (the destructor would not run).
  FDPP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  FDPP_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&decode_in_host_), decode_in_.bytes()));
  // A mixed step's inputs: ids, positions, slots [T], context lengths [max_batch], chunk metadata
  // [2 max_batch + 1], head rows [logit rows] and block tables [max_batch][max_blocks_per_seq].
  mixed_in_ints_ = 3 * static_cast<size_t>(T) + 3 * static_cast<size_t>(options.max_batch) + 2 +
                   static_cast<size_t>(logit_rows) +
                   static_cast<size_t>(options.max_batch) * static_cast<size_t>(max_blocks_per_seq_);
  for (int32_t*& p : mixed_in_host_)
    FDPP_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&p), mixed_in_ints_ * sizeof(int32_t)));
  FDPP_CUDA_CHECK(cudaEventCreateWithFlags(&inputs_copied_, cudaEventDisableTiming));
  FDPP_CUDA_CHECK(cudaEventRecord(inputs_copied_, stream_));
  for (cudaEvent_t& e : step_done_) FDPP_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
}

CudaEngine::~CudaEngine() {
  for (auto& [b, g] : graphs_) cudaGraphExecDestroy(g);
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);  // nothing in flight reads what is freed
  if (inputs_copied_ != nullptr) cudaEventDestroy(inputs_copied_);
  if (decode_in_host_ != nullptr) cudaFreeHost(decode_in_host_);
  for (int32_t* p : mixed_in_host_)
    if (p != nullptr) cudaFreeHost(p);
  for (void* p : step_out_host_)
    if (p != nullptr) cudaFreeHost(p);
  for (cudaEvent_t e : step_done_)
    if (e != nullptr) cudaEventDestroy(e);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

MemoryReport CudaEngine::memory() const {
  MemoryReport r;
  r.weights = model_->bytes();
  r.kv_cache = kv_.bytes();
  r.kv_tokens = num_blocks_ * options_.block_size;
  for (const DeviceBuffer* b : {&x_, &normed_, &qkv_, &attn_, &o_, &ffn_in_, &ffn_act_, &logits_, &shard_logits_,
                                &gathered_logits_, &ids_, &positions_,
                                &slots_, &block_tables_, &context_lens_, &head_index_, &chunk_meta_, &sample_ids_, &history_,
                                &history_lens_, &offsets_, &seeds_, &token_masks_, &attn_ws_, &decode_in_, &fallback_rows_,
                                &attn_counters_})
    r.activations += b->bytes();
  r.workspace = linear_->workspace_bytes() + sample_ws_.bytes();
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) r.device_used = total_b - free_b;
  return r;
}

void CudaEngine::ensure_capacity(int seq, int new_length) {
  check(new_length <= config().max_context, "sequence of {} tokens exceeds the model's context length {}", new_length,
        config().max_context);
  if (reserve(seq, new_length)) return;
  const int length = sequence_length(seq);
  const int64_t more = kv().blocks_for(new_length) - kv().blocks_for(length);
  const double per_token = 2.0 * config().n_layers * config().kv_dim() * static_cast<double>(kv_elem_bytes_);
  fail("KV cache full: {} more tokens need {} blocks ({:.1f} MiB), {} of {} blocks are free; the cache holds {} "
       "tokens ({:.2f} GiB): shorten the request or raise --kv-cache-tokens",
       new_length - length, more, more * options_.block_size * per_token / 1048576.0, kv().free_blocks(), num_blocks_,
       num_blocks_ * options_.block_size, kv_.bytes() / 1073741824.0);
}

void CudaEngine::linear(const void* x, const void* w, const void* bias, void* y, int M, int N, int K, bool fp32_out) {
  linear_->run(x, w, bias, y, M, N, K, model_->dtype(), fp32_out ? Epilogue::StoreF32 : Epilogue::Store, stream_);
}

void CudaEngine::layer_linear(const void* x, const LayerMatrix& w, const DeviceBuffer& bias, void* y, int M, int N,
                              int K, Epilogue epilogue) {
  if (!w.gguf.empty())
    linear_->run_gguf(x, w.gguf, bias.get(), y, M, N, K, model_->dtype(), epilogue, stream_);
  else if (!w.int4.empty())
    linear_->run_int4(x, w.w.as<uint32_t>(), w.int4.view(), bias.get(), y, M, N, K, model_->dtype(), epilogue,
                      stream_);
  else if (!w.scale.empty())
    linear_->run_fp8(x, w.w.as<uint8_t>(), w.scale.as<float>(), bias.get(), y, M, N, K, model_->dtype(), epilogue,
                     stream_);
  else
    linear_->run(x, w.w.get(), bias.get(), y, M, N, K, model_->dtype(), epilogue, stream_);
}

uint64_t CudaEngine::attention_fallback_rows() const {
  unsigned long long n[2] = {0, 0};
  FDPP_CUDA_CHECK(cudaStreamSynchronize(stream_));
  FDPP_CUDA_CHECK(cudaMemcpy(n, fallback_rows_.get(), sizeof(n), cudaMemcpyDeviceToHost));
  return n[0];
}

uint64_t CudaEngine::prefill_attention_fallback_rows() const {
  unsigned long long n[2] = {0, 0};
  FDPP_CUDA_CHECK(cudaStreamSynchronize(stream_));
  FDPP_CUDA_CHECK(cudaMemcpy(n, fallback_rows_.get(), sizeof(n), cudaMemcpyDeviceToHost));
  return n[1];
}

void CudaEngine::reduce_partial(void* y, int64_t elements) {
  if (options_.shard.comm != nullptr)
    all_reduce_sum(y, static_cast<size_t>(elements), model_->dtype(), options_.shard.comm, stream_);
}

void CudaEngine::lm_head(const void* x, int rows) {
  const ModelConfig& c = config();
  const EngineOptions::Shard& shard = options_.shard;
  if (shard.comm == nullptr) {
    linear(x, model_->output_matrix(), nullptr, logits_.get(), rows, c.vocab_size, c.embedding_dim(), true);
    return;
  }
  linear(x, model_->output_matrix(), nullptr, shard_logits_.get(), rows, static_cast<int>(vocab_rows_),
         c.embedding_dim(), true);
  const size_t count = static_cast<size_t>(rows) * shard.vocab_stride;
  all_gather_f32(shard_logits_.as<float>(), gathered_logits_.as<float>(), count, shard.comm, stream_);
  assemble_vocab_shards(gathered_logits_.as<float>(), rows, shard.ranks, shard.vocab_stride, c.vocab_size,
                        logits_.as<float>(), stream_);
}

void* CudaEngine::layer_k(int layer) const {
  return static_cast<char*>(kv_.get()) + static_cast<size_t>(layer) * 2 * num_blocks_ * block_bytes_;
}
void* CudaEngine::layer_v(int layer) const {
  return static_cast<char*>(layer_k(layer)) + static_cast<size_t>(num_blocks_) * block_bytes_;
}

// The op set of model/forward.h on the GPU, in 16-bit with fp32 accumulation and an fp32 residual
// stream (x_). The add of a block's output is fused into the next norm (residual_norm), q, k and v
// are one GEMM, SwiGLU runs in the gate/up GEMM's epilogue where the chosen kernel has one, and the
// row-parallel projections (o, down) end with the ranks' all-reduce. Buffers: the input is normed_,
// the delta o_; the head rows are gathered from every token (a mixed step's in.head_index) or are
// the last logit_rows tokens (a decode step).
struct CudaEngine::Forward {
  CudaEngine& e;
  const StepInputs& in;
  const int n, decode_rows;
  const std::span<const Chunk> chunks;
  const int logit_rows, attention_splits, attention_max_len;
  const ModelConfig& c;
  const DeviceModel& m;
  const DType dt;
  const cudaStream_t st;
  const int H, E, Q, KV, FF;
  const void* mlp_act = nullptr;  // where mlp_up_act left the activation
  const void* head = nullptr;     // the head rows, 16-bit

  void gather_tokens() {
    gather_rows(m.tok_embeddings.get(), in.ids, n, E * static_cast<int>(kElem), e.normed_.get(), st);
  }
  void project_in() { e.linear(e.normed_.get(), m.project_in.get(), nullptr, e.o_.get(), n, H, E, false); }
  void embed(EmbedRows from, bool learned_positions) {
    // Projected rows are looked up again by row index, so that one kernel adds the positions.
    const bool tokens = from == EmbedRows::Tokens;
    embedding(tokens ? m.tok_embeddings.get() : e.o_.get(), learned_positions ? m.pos_embeddings.get() : nullptr,
              c.learned_position_offset, dt, tokens ? in.ids : e.row_index_.as<int32_t>(), in.positions, n, H,
              e.x_.as<float>(), st, static_cast<float>(c.embed_scale));
  }
  void stream_as_input() {
    convert_stored_type(0 /* F32 */, e.x_.get(), static_cast<int64_t>(n) * H, H, 0, e.normed_.get(), dt, st);
  }
  void add_norm(int layer, BlockNorm which, bool add_delta, bool write_back) {
    const DeviceLayer& L = m.layers[layer];
    const bool attention_norm = which == BlockNorm::Attention;
    residual_norm(e.x_.as<float>(), add_delta ? e.o_.get() : nullptr, nullptr,
                  attention_norm ? L.attn_norm.get() : L.ffn_norm.get(),
                  attention_norm ? L.attn_norm_bias.get() : L.ffn_norm_bias.get(), e.normed_.get(), n, H, c.norm_eps,
                  c.norm, write_back, dt, st);
  }
  void qkv(int layer) {
    const DeviceLayer& L = m.layers[layer];
    e.layer_linear(e.normed_.get(), L.qkv(), L.b_qkv, e.qkv_.get(), n, Q + 2 * KV, H,
                   Epilogue::Store);
  }
  // The q/k norms wait for the rotary kernel, which applies them (one launch fewer a layer); a
  // cache write without rotation runs them first.
  bool qk_norm_pending = false;
  void qk_norm(int layer) {
    if (current_kernel_options().fold_norms) {
      qk_norm_pending = true;
    } else {
      apply_qk_norm(layer);
    }
  }
  void apply_qk_norm(int layer) {
    const DeviceLayer& L = m.layers[layer];
    head_rms_norm(e.qkv_.get(), n, c.n_heads, c.n_kv_heads, c.head_dim, L.q_norm.get(), L.k_norm.get(), c.norm_eps,
                  dt, st);
  }
  void rope_and_write_cache(int layer) {
    // The layer's rope (Gemma 3: the local layers' own base), LongRope's attention factor on the
    // rotated dims of q and k.
    const RopeConfig& rope = c.rope_of(layer);
    const DeviceLayer& L = m.layers[layer];
    const HeadNorm head_norm = qk_norm_pending
                                   ? HeadNorm{L.q_norm.get(), L.k_norm.get(), static_cast<float>(c.norm_eps)}
                                   : HeadNorm{};
    qk_norm_pending = false;
    rope_qk_cache(e.qkv_.get(), in.positions, m.inv_freq_of(layer), rope.rotary_dim / 2, in.slots, n, c.n_heads,
                  c.n_kv_heads, c.head_dim, e.options_.block_size, c.rope_style, e.layer_k(layer), e.layer_v(layer),
                  dt, st, e.layer_kv_quant(layer), static_cast<float>(rope.attention_factor), head_norm);
  }
  void write_cache(int layer) {
    if (qk_norm_pending) apply_qk_norm(layer);
    qk_norm_pending = false;
    kv_cache_write(e.qkv_.get(), in.slots, n, c.n_heads, c.n_kv_heads, c.head_dim, e.options_.block_size,
                   e.layer_k(layer), e.layer_v(layer), dt, st, e.layer_kv_quant(layer));
  }
  void attention(int layer) {
    const float scale = static_cast<float>(c.attention_scale());
    const bool async = e.options_.attention == AttentionMode::Async;
    // Sliding window (a window as long as the context limits nothing: left off) and soft-capping.
    const int window = c.window(layer) > 0 && c.window(layer) < c.max_context ? c.window(layer) : 0;
    const float softcap = static_cast<float>(c.attn_softcap);
    if (decode_rows > 0) {
      if (async) {
        decode_attention_async({.qkv = e.qkv_.get(), .k_cache = e.layer_k(layer), .v_cache = e.layer_v(layer),
                                .block_tables = in.block_tables, .max_blocks_per_seq = e.max_blocks_per_seq_,
                                .context_lens = in.context_lens, .out = e.attn_.get(), .batch = decode_rows,
                                .n_heads = c.n_heads, .n_kv_heads = c.n_kv_heads, .head_dim = c.head_dim,
                                .block_size = e.options_.block_size, .scale = scale, .dtype = dt,
                                .splits = attention_splits, .max_context_len = attention_max_len,
                                .workspace = e.attn_ws_.get(), .workspace_bytes = e.attn_ws_.bytes(),
                                .range = e.unified_max_[layer], .counters = e.attn_counters_.as<int>(),
                                .counter_ints = e.attn_counter_ints_,
                                .fallback_rows = e.fallback_rows_.as<unsigned long long>(), .window = window,
                                .softcap = softcap, .kv_quant = e.layer_kv_quant(layer)},
                               st);
      } else {
        decode_attention({.qkv = e.qkv_.get(), .k_cache = e.layer_k(layer), .v_cache = e.layer_v(layer),
                          .block_tables = in.block_tables, .max_blocks_per_seq = e.max_blocks_per_seq_,
                          .context_lens = in.context_lens, .out = e.attn_.get(), .batch = decode_rows,
                          .n_heads = c.n_heads, .n_kv_heads = c.n_kv_heads, .head_dim = c.head_dim,
                          .block_size = e.options_.block_size, .scale = scale, .dtype = dt,
                          .splits = attention_splits, .max_context_len = attention_max_len,
                          .workspace = e.attn_ws_.get(), .workspace_bytes = e.attn_ws_.bytes(), .window = window,
                          .softcap = softcap, .kv_quant = e.layer_kv_quant(layer)},
                         st);
      }
    }
    if (!chunks.empty()) {
      if (layer == 0)
        for (const Chunk& ch : chunks) e.prefill_attention_rows_ += static_cast<uint64_t>(ch.n) * c.n_heads * c.n_layers;
      // Every chunk in one launch (tensor cores; the same unified max and guard as decode).
      int max_chunk = 0;
      for (const Chunk& ch : chunks) max_chunk = std::max(max_chunk, ch.n);
      prefill_attention_varlen(e.qkv_.get(), e.layer_k(layer), e.layer_v(layer), in.chunk_tables,
                               e.max_blocks_per_seq_, in.chunk_q_begin, in.chunk_starts,
                               static_cast<int>(chunks.size()), n, max_chunk, c.n_heads, c.n_kv_heads, c.head_dim,
                               e.options_.block_size, scale, async ? &e.unified_max_[layer] : nullptr,
                               e.fallback_rows_.as<unsigned long long>() + 1, e.attn_.get(), dt, st,
                               e.prefill_config_ >= 0 ? e.prefill_config_ : prefill_config_for_chunk(max_chunk),
                               window, softcap, e.layer_kv_quant(layer));
    }
  }
  void out_proj(int layer) {
    const DeviceLayer& L = m.layers[layer];
    e.layer_linear(e.attn_.get(), L.o(), L.b_o, e.o_.get(), n, H, Q, Epilogue::Store);
    e.reduce_partial(e.o_.get(), static_cast<int64_t>(n) * H);
  }
  // Gemma's sandwich norms: RMSNorm of the block's 16-bit output rows in place (fp32 sums), before
  // the next add_norm adds them to the stream.
  void post_norm(int layer, BlockNorm which) {
    const DeviceLayer& L = m.layers[layer];
    const DeviceBuffer& w = which == BlockNorm::Attention ? L.attn_post_norm : L.ffn_post_norm;
    head_rms_norm(e.o_.get(), n, 1, 0, H, w.get(), nullptr, c.norm_eps, dt, st);
  }
  void mlp_up_act(int layer, Activation activation) {
    const DeviceLayer& L = m.layers[layer];
    if (activation == Activation::SwiGLU &&
        (!L.s_in.empty() || !L.i_in.empty() || !L.g_in.empty() ||
         LinearDispatcher::fuses(e.linear_->choose(n, 2 * FF, H), Epilogue::SwiGLU))) {
      // Gate/up with SwiGLU in the GEMM's epilogue: one pass, no [n, 2 FF] intermediate (fp8 and
      // 4-bit: in their kernel's epilogue, or after cuBLASLt in the dispatcher's scratch).
      e.layer_linear(e.normed_.get(), L.in(), L.b_in, e.ffn_act_.get(), n, 2 * FF, H,
                     Epilogue::SwiGLU);
      mlp_act = e.ffn_act_.get();
    } else if (activation == Activation::SwiGLU) {
      e.linear(e.normed_.get(), L.w_in.get(), L.b_in.get(), e.ffn_in_.get(), n, 2 * FF, H, false);
      silu_mul(e.ffn_in_.get(), e.ffn_act_.get(), n, FF, dt, st);
      mlp_act = e.ffn_act_.get();
    } else if (activation == Activation::GeGLU) {
      // Gemma: the fused gate/up GEMM (FP8 too), then gelu_tanh(gate) * up (no GEMM epilogue has it).
      e.layer_linear(e.normed_.get(), L.in(), L.b_in, e.ffn_in_.get(), n, 2 * FF, H, Epilogue::Store);
      silu_mul(e.ffn_in_.get(), e.ffn_act_.get(), n, FF, dt, st, /*gelu=*/true);
      mlp_act = e.ffn_act_.get();
    } else {
      e.layer_linear(e.normed_.get(), L.in(), L.b_in, e.ffn_in_.get(), n, FF, H, Epilogue::Store);
      relu(e.ffn_in_.get(), n, FF, dt, st);
      mlp_act = e.ffn_in_.get();
    }
  }
  void mlp_down(int layer) {
    const DeviceLayer& L = m.layers[layer];
    e.layer_linear(mlp_act, L.down(), L.b_down, e.o_.get(), n, H, FF, Epilogue::Store);
    e.reduce_partial(e.o_.get(), static_cast<int64_t>(n) * H);
  }
  // The expert layer in six launches (moe.h; three for one token: the router product and the
  // routing are one), sized by this step's n: graph-capturable.
  void moe_mlp(int layer) {
    const DeviceLayer& L = m.layers[layer];
    const int NE = c.n_experts, K = c.n_experts_used, FE = c.expert_ffn_hidden;
    const MoeRouting r{e.moe_pick_expert_.as<int32_t>(), e.moe_pick_weight_.as<float>(), e.moe_pick_row_.as<int32_t>(),
                       e.moe_row_token_.as<int32_t>(), e.moe_tile_expert_.as<int32_t>(),
                       e.moe_block_tile_.as<int32_t>()};
    if (n == 1 && moe_route_one_fits(e.normed_.get(), L.router.get(), H)) {
      moe_route_one(e.normed_.get(), L.router.get(), e.moe_logits_.as<float>(), e.moe_arrivals_.as<unsigned>(), H, NE,
                    K, c.norm_topk_prob, r, dt, st);
    } else {
      e.linear(e.normed_.get(), L.router.get(), nullptr, e.moe_logits_.get(), n, NE, H, /*fp32_out=*/true);
      moe_route(e.moe_logits_.as<float>(), n, NE, K, c.norm_topk_prob, r, st);
      moe_align(n, K, NE, r, st);
    }
    moe_grouped_swiglu(e.normed_.get(), L.experts_gate.get(), L.experts_up.get(), e.moe_act_.get(), H, FE, NE, n, K,
                       r, dt, st);
    moe_down_combine(e.moe_act_.get(), L.experts_down.get(), e.moe_down_.get(), e.o_.get(), FE, H, NE, n, K, r, dt,
                     st);
    e.reduce_partial(e.o_.get(), static_cast<int64_t>(n) * H);
  }
  // A mixed step's head rows are scattered (a chunk's last token): the final norm runs over every
  // token, then those rows are gathered into o_ (free by now). A decode step's are the last
  // logit_rows tokens: only they are normed.
  void final_norm(bool add_delta) {
    const void* delta = add_delta ? e.o_.get() : nullptr;
    if (in.head_index != nullptr) {
      residual_norm(e.x_.as<float>(), delta, nullptr, m.final_norm.get(), m.final_norm_bias.get(), e.normed_.get(), n,
                    H, c.norm_eps, c.norm, false, dt, st);
      gather_head_rows();
    } else {
      const size_t skip = static_cast<size_t>(n - logit_rows);
      residual_norm(e.x_.as<float>() + skip * H, delta ? at(e.o_, skip * H * kElem) : nullptr, nullptr,
                    m.final_norm.get(), m.final_norm_bias.get(), e.normed_.get(), logit_rows, H, c.norm_eps, c.norm,
                    false, dt, st);
      head = e.normed_.get();
    }
  }
  // Without a final norm the head reads the stream's 16-bit copy the last write-back norm left in
  // normed_ (post-norm models); a pending delta would need an add kernel the backend lacks.
  void head_rows(bool add_delta) {
    check(!add_delta, "the CUDA backend runs a pre-norm model only with a final norm");
    if (in.head_index != nullptr) {
      gather_head_rows();
    } else {
      head = at(e.normed_, static_cast<size_t>(n - logit_rows) * H * kElem);
    }
  }
  void gather_head_rows() {
    gather_rows(e.normed_.get(), in.head_index, logit_rows, H * static_cast<int>(kElem), e.o_.get(), st);
    head = e.o_.get();
  }
  void project_out() {
    void* projected = head == e.o_.get() ? e.normed_.get() : e.o_.get();
    e.linear(head, m.project_out.get(), nullptr, projected, logit_rows, E, H, false);
    head = projected;
  }
  void lm_head() {
    e.lm_head(head, logit_rows);
    // Gemma 2's final-logit soft-capping, before the logits are returned or sampled from.
    if (c.final_softcap > 0)
      soft_cap(e.logits_.as<float>(), static_cast<int64_t>(logit_rows) * c.vocab_size, static_cast<float>(c.final_softcap),
               st);
  }

  static const char* at(const DeviceBuffer& b, size_t byte_offset) {
    return static_cast<const char*>(b.get()) + byte_offset;
  }
};

void CudaEngine::forward(const StepInputs& in, int n, int decode_rows, std::span<const Chunk> chunks, int logit_rows,
                         int attention_splits, int attention_max_len) {
  const ModelConfig& c = config();
  const DeviceModel& m = *model_;
  Forward f{*this, in, n, decode_rows, chunks, logit_rows, attention_splits, attention_max_len, c, m, m.dtype(), stream_,
            c.hidden, c.embedding_dim(), c.q_dim(), c.kv_dim(), c.ffn_hidden};
  run_decoder(c, f);
}

void CudaEngine::launch_decode(std::span<const int> seqs, std::span<const int32_t> tokens, bool drawn) {
  const int b = static_cast<int>(seqs.size());
  const int mb = options_.max_batch;
  // With graphs the step runs at the batch's bucket: rows past b are padding, so that a server whose
  // batch changes every step replays a few dozen graphs instead of capturing one per batch size.
  const int rows = options_.cuda_graphs ? decode_graph_rows(b, mb) : b;
  // The pinned inputs are rewritten below: the previous step's copy out of them must be done.
  FDPP_CUDA_CHECK(cudaEventSynchronize(inputs_copied_));
  int32_t* ids = decode_in_host_;
  int32_t* pos = ids + mb;
  int32_t* slots = pos + mb;
  int32_t* lens = slots + mb;
  int32_t* tables = lens + mb;
  int max_len = 0;
  for (int i = 0; i < b; ++i) {
    const Sequence& s = sequence(seqs[i]);
    ids[i] = tokens[i];
    pos[i] = s.length;
    slots[i] = s.blocks[pos[i] / options_.block_size] * options_.block_size + pos[i] % options_.block_size;
    lens[i] = s.length + 1;
    max_len = std::max(max_len, lens[i]);
    std::copy(s.blocks.begin(), s.blocks.end(), tables + static_cast<size_t>(i) * max_blocks_per_seq_);
  }
  // A padding row writes no cache (slot -1) and attends to the first token of row 0's blocks (written
  // before this step or by it), so that its values stay finite; its logits are never read.
  // Under window freeing row 0's first entry may have been given back (kFreed): a padding row's
  // key 0 is then read from the block row 0 writes this step instead.
  const int32_t pad_block = tables[0] >= 0 ? tables[0] : static_cast<int32_t>(slots[0] / options_.block_size);
  for (int i = b; i < rows; ++i) {
    ids[i] = 0;
    pos[i] = 0;
    slots[i] = -1;
    lens[i] = 1;
    std::copy(tables, tables + max_blocks_per_seq_, tables + static_cast<size_t>(i) * max_blocks_per_seq_);
    tables[static_cast<size_t>(i) * max_blocks_per_seq_] = pad_block;
  }
  const size_t bytes = (4 * static_cast<size_t>(mb) + static_cast<size_t>(rows) * max_blocks_per_seq_) * sizeof(int32_t);
  FDPP_CUDA_CHECK(cudaMemcpyAsync(decode_in_.get(), decode_in_host_, bytes, cudaMemcpyHostToDevice, stream_));
  FDPP_CUDA_CHECK(cudaEventRecord(inputs_copied_, stream_));
  if (drawn) resolve_drawn_tokens(decode_in_.as<int32_t>(), b, sample_ids_.as<int32_t>(), stream_);
  const int32_t* d = decode_in_.as<int32_t>();
  const StepInputs in{d, d + mb, d + 2 * mb, d + 4 * mb, d + 3 * mb, nullptr, nullptr, nullptr, nullptr};

  // The launches depend on the rows' length too (the loop, the async reduction's place): the key
  // holds them all.
  const DecodeAttentionLaunch attention = plan_decode_attention(rows, max_len);
  const int splits = attention.splits;
  const std::pair<int, DecodeAttentionLaunch> key{rows, attention};
  auto graph = graphs_.find(key);
  if (!options_.cuda_graphs) {
    forward(in, rows, rows, {}, rows, splits, max_len);
  } else if (graph != graphs_.end()) {
    FDPP_CUDA_CHECK(cudaGraphLaunch(graph->second, stream_));
  } else {
    // The eager run computes this step while the host captures and instantiates its graph (no
    // synchronization between them): a server meets a new (bucket, plan) key often enough that an
    // idle GPU during each capture would show in its busy time.
    forward(in, rows, rows, {}, rows, splits, max_len);
    cudaGraph_t g = nullptr;
    FDPP_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    try {
      forward(in, rows, rows, {}, rows, splits, max_len);
    } catch (...) {
      cudaStreamEndCapture(stream_, &g);
      if (g != nullptr) cudaGraphDestroy(g);
      throw;
    }
    FDPP_CUDA_CHECK(cudaStreamEndCapture(stream_, &g));
    cudaGraphExec_t exec = nullptr;
    FDPP_CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
    cudaGraphDestroy(g);
    graphs_[key] = exec;  // captured, not run: the eager run above already computed this step
    ++graphs_captured_;
  }
  count_attention_rows(b, attention);
}

DecodeAttentionLaunch CudaEngine::plan_decode_attention(int decode_rows, int max_len) const {
  const ModelConfig& c = config();
  const bool async = options_.attention == AttentionMode::Async;
  const int splits = plan_decode_splits(decode_rows, c.n_heads, c.n_kv_heads, c.head_dim, max_len, multiprocessors_);
  // The launch of the step's layers: where every layer runs the masked kernels (masked_attention),
  // theirs (decode_plan.h: describe_launch); else the plain layers'.
  // An e4m3 cache runs the tensor-core loop only, as the masked kernels do: the launch decode_attention
  // describes for it is the masked one's.
  return decode_attention_launch(decode_rows, c.n_heads, c.n_kv_heads, c.head_dim, splits, max_len, async,
                                 multiprocessors_, masked_attention() || options_.kv_quant.dtype == KvDType::Fp8E4M3);
}

bool CudaEngine::masked_attention() const {
  const ModelConfig& c = config();
  if (c.attn_softcap > 0) return true;
  for (int layer = 0; layer < c.n_layers; ++layer)
    if (c.window(layer) <= 0 || c.window(layer) >= c.max_context) return false;
  return c.n_layers > 0;
}

void CudaEngine::count_attention_rows(int decode_rows, const DecodeAttentionLaunch& attention) {
  const ModelConfig& c = config();
  const uint64_t rows = static_cast<uint64_t>(decode_rows) * c.n_heads * c.n_layers;
  attention_rows_ += rows;
  if (attention.unified) attention_unified_rows_ += rows;
}

void CudaEngine::run_step(std::span<const RowPlan> rows, int64_t total_tokens, StepOutput& out) {
  const int slot = run_slot_;
  queue_step(rows, total_tokens, out, slot);
  FDPP_CUDA_CHECK(cudaEventRecord(step_done_[slot], stream_));
  run_slot_ ^= 1;
}

void CudaEngine::queue_step(std::span<const RowPlan> rows, int64_t total_tokens, StepOutput& out, int slot) {
  const KernelOptionsScope kernels(options_.kernels);
  PendingOutput& pending = pending_[slot];
  // A pending token (kPendingToken: the previous step draws it) goes to the device encoded with the
  // head row its sequence's sampling row had there; resolve_drawn_tokens reads it from sample_ids_.
  bool drawn = false;
  auto input_token = [&](const StepRow& r, size_t j) {
    if (r.tokens[j] != kPendingToken) return r.tokens[j];
    check(r.seq < static_cast<int>(draw_head_.size()) && draw_head_[static_cast<size_t>(r.seq)] >= 0,
          "internal: sequence {} continues with a token the previous step did not draw", r.seq);
    drawn = true;
    return encode_drawn_token(draw_head_[static_cast<size_t>(r.seq)]);
  };
  const ModelConfig& c = config();
  const int V = c.vocab_size;
  const int n_rows = static_cast<int>(rows.size());
  // Device order: the one-token rows first (decode attention), then the chunks (prefill attention).
  std::vector<int> order;
  for (int i = 0; i < n_rows; ++i)
    if (rows[i].row->tokens.size() == 1) order.push_back(i);
  const int decode_rows = static_cast<int>(order.size());
  for (int i = 0; i < n_rows; ++i)
    if (rows[i].row->tokens.size() != 1) order.push_back(i);
  // Head rows (logits computed) per row, in device order.
  std::vector<int> head_first(n_rows, -1);
  int head_rows = 0;
  for (int i : order) {
    const StepRow& r = *rows[i].row;
    if (r.all_logits || r.logits || r.sample || decode_rows == n_rows) {
      head_first[i] = head_rows;
      head_rows += r.all_logits ? static_cast<int>(r.tokens.size()) : 1;
    }
  }
  check(head_rows <= logit_capacity_, "step: {} rows of logits exceed the engine's {} (split all-logits rows)",
        head_rows, logit_capacity_);

  if (decode_rows == n_rows) {
    // Decode-only: the graph-replayed decode step; every row has its logits row, in order.
    std::vector<int> seqs(n_rows);
    std::vector<int32_t> tokens(n_rows);
    for (int i = 0; i < n_rows; ++i) {
      seqs[i] = rows[i].row->seq;
      tokens[i] = input_token(*rows[i].row, 0);
      head_first[i] = i;
    }
    launch_decode(seqs, tokens, drawn);
  } else {
    const int T = static_cast<int>(total_tokens);
    const int bs = options_.block_size;
    std::vector<int32_t> ids(T), pos(T), slots(T), lens(decode_rows), head(head_rows);
    std::vector<int32_t> tables(static_cast<size_t>(n_rows) * max_blocks_per_seq_, 0);
    std::vector<Chunk> chunks;
    int t = 0, max_len = 0;
    for (int k = 0; k < n_rows; ++k) {
      const RowPlan& rp = rows[order[k]];
      const StepRow& r = *rp.row;
      const int n = static_cast<int>(r.tokens.size());
      for (int j = 0; j < n; ++j) {
        ids[t + j] = input_token(r, static_cast<size_t>(j));
        pos[t + j] = rp.start + j;
        slots[t + j] = rp.sequence->blocks[pos[t + j] / bs] * bs + pos[t + j] % bs;
      }
      std::copy(rp.sequence->blocks.begin(), rp.sequence->blocks.end(),
                tables.begin() + static_cast<size_t>(k) * max_blocks_per_seq_);
      if (k < decode_rows) {
        lens[k] = rp.start + 1;
        max_len = std::max(max_len, lens[k]);
      } else {
        chunks.push_back(Chunk{t, n, rp.start, k - decode_rows});
      }
      if (head_first[order[k]] >= 0) {
        const int h = head_first[order[k]];
        if (r.all_logits) {
          for (int j = 0; j < n; ++j) head[h + j] = t + j;
        } else {
          head[h] = t + n - 1;
        }
      }
      t += n;
    }
    // The inputs go through this slot's pinned staging: copies from pageable memory may wait for
    // the step in flight, and this one is queued behind it.
    size_t staged = 0;
    auto stage = [&](DeviceBuffer& dst, const std::vector<int32_t>& src) {
      check(staged + src.size() <= mixed_in_ints_, "internal: a step's inputs exceed their staging");
      int32_t* at = mixed_in_host_[slot] + staged;
      std::copy(src.begin(), src.end(), at);
      staged += src.size();
      FDPP_CUDA_CHECK(cudaMemcpyAsync(dst.get(), at, src.size() * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
    };
    stage(ids_, ids);
    if (drawn) resolve_drawn_tokens(ids_.as<int32_t>(), T, sample_ids_.as<int32_t>(), stream_);
    stage(positions_, pos);
    stage(slots_, slots);
    stage(block_tables_, tables);
    if (decode_rows > 0) stage(context_lens_, lens);
    std::vector<int32_t> meta(2 * chunks.size() + 1);
    for (size_t k = 0; k < chunks.size(); ++k) {
      meta[k] = chunks[k].q_offset;
      meta[chunks.size() + 1 + k] = chunks[k].start;
    }
    if (!chunks.empty()) {
      meta[chunks.size()] = chunks.back().q_offset + chunks.back().n;
      stage(chunk_meta_, meta);
    }
    if (head_rows > 0) stage(head_index_, head);
    const int32_t* tab = block_tables_.as<int32_t>();
    const StepInputs in{ids_.as<int32_t>(), positions_.as<int32_t>(), slots_.as<int32_t>(), tab,
                        context_lens_.as<int32_t>(),
                        tab + static_cast<size_t>(decode_rows) * max_blocks_per_seq_, chunk_meta_.as<int32_t>(),
                        chunk_meta_.as<int32_t>() + chunks.size() + 1, head_index_.as<int32_t>()};
    const DecodeAttentionLaunch attention =
        decode_rows > 0 ? plan_decode_attention(decode_rows, max_len) : DecodeAttentionLaunch{};
    const int splits = attention.splits;
    if (head_rows > 0) {
      forward(in, T, decode_rows, chunks, head_rows, splits, max_len);
    } else {
      // No row wants logits (middle chunks only): the head runs on one row, never read.
      stage(head_index_, std::vector<int32_t>{T - 1});
      forward(in, T, decode_rows, chunks, 1, splits, max_len);
    }
    if (decode_rows > 0) count_attention_rows(decode_rows, attention);
  }

  if (options_.shard.rank != 0) {
    // Tensor parallelism: rank 0 returns the step's logits and tokens; the others only compute.
    pending.rows.clear();
    pending.lp_heads.clear();
    return;
  }
  // Logits to the host before sampling (the penalty edits them in place on the device).
  for (int i = 0; i < n_rows; ++i) {
    const StepRow& r = *rows[i].row;
    if (rows[i].logits_index < 0) continue;
    const size_t n = r.all_logits ? r.tokens.size() : 1;
    FDPP_CUDA_CHECK(cudaMemcpyAsync(out.logits.data() + static_cast<size_t>(rows[i].logits_index) * V,
                                    logits_.as<float>() + static_cast<size_t>(head_first[i]) * V,
                                    n * V * sizeof(float), cudaMemcpyDeviceToHost, stream_));
  }
  // Sampling: each row with its own parameters and stream key (seed, sample_index). Rows with the
  // same filters and adjacent head rows share one launch.
  std::vector<int> sampled;
  for (int i : order)
    if (rows[i].row->sample) sampled.push_back(i);
  if (!sampled.empty()) {
    std::vector<uint64_t> seeds(head_rows > 0 ? head_rows : n_rows, 0), offsets(seeds.size(), 0);
    for (int i : sampled) {
      const StepRow& r = *rows[i].row;
      const int h = head_first[i] + (r.all_logits ? static_cast<int>(r.tokens.size()) - 1 : 0);
      seeds[h] = r.sampling.seed;
      offsets[h] = r.sample_index;
    }
    // Greedy rows draw no random numbers: a step of greedy rows only (the benchmarks', a server's
    // temperature 0) uploads nothing, so each step spares two host-to-device copies.
    if (std::any_of(sampled.begin(), sampled.end(), [&](int i) { return rows[i].row->sampling.temperature > 0; })) {
      upload(seeds_, seeds, stream_);
      upload(offsets_, offsets, stream_);
    }
    auto same_filters = [](const SamplingParams& a, const SamplingParams& b) {
      return a.temperature == b.temperature && a.top_k == b.top_k && a.top_p == b.top_p && a.min_p == b.min_p &&
             a.repeat_penalty == b.repeat_penalty && a.repeat_last_n == b.repeat_last_n;
    };
    auto head_of = [&](int i) {
      const StepRow& r = *rows[i].row;
      return head_first[i] + (r.all_logits ? static_cast<int>(r.tokens.size()) - 1 : 0);
    };
    // logit_bias with the min_tokens mask, and the generated tokens of rows with presence or
    // frequency penalties: CSR lists by head row (cuda::LogitAdjust), uploaded only when present.
    const size_t H = seeds.size();
    std::vector<const StepRow*> by_head(H, nullptr);
    for (int i : sampled) by_head[head_of(i)] = rows[i].row;
    std::vector<int32_t> bias_off(H + 1, 0), bias_ids, gen_off(H + 1, 0), gen_ids, lp_rows;
    std::vector<float> bias_vals, presence(H, 0.f), frequency(H, 0.f);
    bool edits_in_place = false;  // some row's logits change before the draw
    int lp_k = 0;
    for (size_t h = 0; h < H; ++h) {
      bias_off[h] = static_cast<int32_t>(bias_ids.size());
      gen_off[h] = static_cast<int32_t>(gen_ids.size());
      const StepRow* r = by_head[h];
      if (r == nullptr) continue;
      const SamplingParams& p = r->sampling;
      for (const LogitBias& b : p.logit_bias) {
        bias_ids.push_back(b.id);
        bias_vals.push_back(b.bias);
      }
      if (r->sample_index < static_cast<uint64_t>(std::max(p.min_tokens, 0)))
        for (int32_t id : p.min_tokens_ids) {
          bias_ids.push_back(id);
          bias_vals.push_back(-INFINITY);
        }
      if (p.presence_penalty != 0.f || p.frequency_penalty != 0.f) {
        const size_t n = std::min(r->history.size(), static_cast<size_t>(r->sample_index));
        gen_ids.insert(gen_ids.end(), r->history.end() - static_cast<std::ptrdiff_t>(n), r->history.end());
        presence[h] = p.presence_penalty;
        frequency[h] = p.frequency_penalty;
      }
      edits_in_place |= p.repeat_penalty != 1.0f || !r->allowed_tokens.empty();
      if (p.logprobs >= 0) {
        lp_rows.push_back(static_cast<int32_t>(h));
        lp_k = std::max(lp_k, p.logprobs);
      }
    }
    bias_off[H] = static_cast<int32_t>(bias_ids.size());
    gen_off[H] = static_cast<int32_t>(gen_ids.size());
    edits_in_place |= !bias_ids.empty() || !gen_ids.empty();
    LogitAdjust adjust;
    if (!bias_ids.empty() || !gen_ids.empty()) {
      std::vector<int32_t> i32(bias_off);
      i32.insert(i32.end(), bias_ids.begin(), bias_ids.end());
      i32.insert(i32.end(), gen_off.begin(), gen_off.end());
      i32.insert(i32.end(), gen_ids.begin(), gen_ids.end());
      std::vector<float> f32(bias_vals);
      f32.insert(f32.end(), presence.begin(), presence.end());
      f32.insert(f32.end(), frequency.begin(), frequency.end());
      ensure_bytes(adjust_i32_, i32.size() * sizeof(int32_t));
      ensure_bytes(adjust_f32_, f32.size() * sizeof(float));
      upload(adjust_i32_, i32, stream_);
      upload(adjust_f32_, f32, stream_);
      const int32_t* di = adjust_i32_.as<int32_t>();
      const float* df = adjust_f32_.as<float>();
      if (!bias_ids.empty()) {
        adjust.bias_offsets = di;
        adjust.bias_ids = di + H + 1;
        adjust.bias_values = df;
      }
      if (!gen_ids.empty()) {
        adjust.generated_offsets = di + H + 1 + bias_ids.size();
        adjust.generated_ids = di + 2 * (H + 1) + bias_ids.size();
        adjust.presence = df + bias_vals.size();
        adjust.frequency = df + bias_vals.size() + H;
      }
    }
    // Log probabilities are of the raw logits: kept aside when the filters will edit them.
    const float* raw = logits_.as<float>();
    if (!lp_rows.empty() && edits_in_place) {
      ensure_bytes(raw_logits_, H * V * sizeof(float));
      FDPP_CUDA_CHECK(cudaMemcpyAsync(raw_logits_.get(), logits_.get(), H * V * sizeof(float), cudaMemcpyDeviceToDevice,
                                      stream_));
      raw = raw_logits_.as<float>();
    }
    // Structured output's masks after the raw logits are kept aside (logprobs are of the raw ones).
    apply_token_masks(rows, sampled, head_of);
    size_t k = 0;
    while (k < sampled.size()) {
      size_t e = k + 1;
      while (e < sampled.size() && head_of(sampled[e]) == head_of(sampled[e - 1]) + 1 &&
             same_filters(rows[sampled[e]].row->sampling, rows[sampled[k]].row->sampling))
        ++e;
      std::vector<std::span<const int32_t>> hist;
      for (size_t j = k; j < e; ++j) hist.push_back(rows[sampled[j]].row->history);
      sample_rows(head_of(sampled[k]), static_cast<int>(e - k), rows[sampled[k]].row->sampling, hist,
                  adjust.bias_offsets || adjust.generated_offsets ? &adjust : nullptr);
      k = e;
    }
    // The sampled tokens' log probabilities and the top k on the device; 2 + 2k floats a row back.
    // Both copies land in pinned memory, so that they stay asynchronous: finish_step waits.
    const int lp_stride = 2 + 2 * lp_k;
    const size_t lp_floats = lp_rows.size() * static_cast<size_t>(lp_stride);
    ensure_step_out_host(slot, seeds.size() * sizeof(int32_t) + lp_floats * sizeof(float));
    auto* ids_host = static_cast<int32_t*>(step_out_host_[slot]);
    float* lp_host = reinterpret_cast<float*>(ids_host + seeds.size());
    if (!lp_rows.empty()) {
      ensure_bytes(logprob_rows_, lp_rows.size() * sizeof(int32_t));
      ensure_bytes(logprob_out_, lp_floats * sizeof(float));
      upload(logprob_rows_, lp_rows, stream_);
      token_logprobs(raw, static_cast<int>(V), logprob_rows_.as<int32_t>(), static_cast<int>(lp_rows.size()),
                     sample_ids_.as<int32_t>(), std::min<int>(lp_k, static_cast<int>(V)), logprob_out_.as<float>(),
                     lp_stride, stream_);
      FDPP_CUDA_CHECK(cudaMemcpyAsync(lp_host, logprob_out_.get(), lp_floats * sizeof(float), cudaMemcpyDeviceToHost,
                                      stream_));
    }
    FDPP_CUDA_CHECK(cudaMemcpyAsync(ids_host, sample_ids_.get(), seeds.size() * sizeof(int32_t), cudaMemcpyDeviceToHost,
                                    stream_));
    // What finish_step needs once the copies are done: each sampled row's head row, and for the
    // logprob rows the rows they answer and how many top entries each asked for.
    pending.rows.clear();
    for (int i : sampled) pending.rows.push_back({i, head_of(i), rows[i].row->sampling.logprobs});
    for (int i : sampled) {
      const size_t seq = static_cast<size_t>(rows[i].row->seq);
      if (seq >= draw_head_.size()) draw_head_.resize(seq + 1, -1);
      draw_head_[seq] = head_of(i);
    }
    pending.lp_heads = std::move(lp_rows);
    pending.lp_stride = lp_stride;
    pending.lp_offset = seeds.size();
  } else {
    pending.rows.clear();
    pending.lp_heads.clear();
  }
}

void CudaEngine::finish_step(StepOutput& out) {
  // Steps end in the order they ran: this one's slot, and its event (a step queued behind it runs on).
  const int slot = finish_slot_;
  finish_slot_ ^= 1;
  FDPP_CUDA_CHECK(cudaEventSynchronize(step_done_[slot]));
  PendingOutput& pending = pending_[slot];
  if (pending.rows.empty()) return;
  const int V = config().vocab_size;
  const auto* ids = static_cast<const int32_t*>(step_out_host_[slot]);
  const float* lp_host = reinterpret_cast<const float*>(ids + pending.lp_offset);
  for (const PendingRow& p : pending.rows) out.tokens[p.row] = ids[p.head];
  if (!pending.lp_heads.empty()) {
    // Head row -> its place among the logprob rows (several batch rows may share one head).
    lp_slot_of_head_.assign(pending.lp_offset, -1);
    for (size_t j = 0; j < pending.lp_heads.size(); ++j) lp_slot_of_head_[pending.lp_heads[j]] = static_cast<int>(j);
    for (const PendingRow& p : pending.rows) {
      const int j = lp_slot_of_head_[p.head];
      if (j < 0) continue;
      const float* o = lp_host + static_cast<size_t>(j) * static_cast<size_t>(pending.lp_stride);
      TokenLogprobs& t = out.logprobs[p.row];
      t.logprob = o[0];
      t.rank = static_cast<int32_t>(o[1]);
      t.top.clear();
      for (int e = 0; e < std::min(p.top_k, V); ++e) t.top.push_back({static_cast<int32_t>(o[2 + 2 * e]), o[3 + 2 * e]});
    }
  }
  pending.rows.clear();
}

void CudaEngine::ensure_step_out_host(int slot, size_t bytes) {
  if (bytes <= step_out_host_bytes_[slot]) return;
  // Grown only when the slot's last step has ended (finish_step waited for it before this step ran).
  if (step_out_host_[slot] != nullptr) FDPP_CUDA_CHECK(cudaFreeHost(step_out_host_[slot]));
  step_out_host_[slot] = nullptr;
  step_out_host_bytes_[slot] = 0;
  const size_t grown = std::max<size_t>(bytes, 64 * 1024);
  FDPP_CUDA_CHECK(cudaMallocHost(&step_out_host_[slot], grown));
  step_out_host_bytes_[slot] = grown;
}

template <class HeadOf>
void CudaEngine::apply_token_masks(std::span<const RowPlan> rows, const std::vector<int>& sampled, const HeadOf& head_of) {
  // Structured output: one upload of every masked row's words and head row per step, then one launch
  // that sets the logits outside the masks to -inf before the draw. The masks themselves are
  // computed on the host (src/grammar).
  const int V = config().vocab_size;
  const size_t words = (static_cast<size_t>(V) + 31) / 32;
  std::vector<uint32_t> packed;
  std::vector<uint32_t> heads;
  for (int i : sampled) {
    const std::span<const uint32_t> m = rows[i].row->allowed_tokens;
    if (m.empty()) continue;
    packed.insert(packed.end(), m.begin(), m.begin() + static_cast<std::ptrdiff_t>(words));
    heads.push_back(static_cast<uint32_t>(head_of(i)));
  }
  if (heads.empty()) return;
  packed.insert(packed.end(), heads.begin(), heads.end());
  check(packed.size() * sizeof(uint32_t) <= token_masks_.bytes(), "internal: {} token masks exceed their buffer",
        heads.size());
  upload(token_masks_, packed, stream_);
  const uint32_t* masks = token_masks_.as<uint32_t>();
  cuda::apply_token_masks(logits_.as<float>(), V, masks, static_cast<int>(words),
                          reinterpret_cast<const int32_t*>(masks + heads.size() * words), static_cast<int>(heads.size()),
                          stream_);
}

void CudaEngine::sample_rows(int first, int rows, const SamplingParams& p,
                             std::span<const std::span<const int32_t>> history, const LogitAdjust* adjust) {
  const int V = config().vocab_size;
  const bool penalty = p.repeat_penalty != 1.0f;
  // Repetition penalty: each row's window of recent tokens, packed [rows, stride].
  std::vector<int32_t> lens(rows, 0), packed;
  if (penalty) {
    check(static_cast<int>(history.size()) >= rows, "sample: history for {} rows, need {}", history.size(), rows);
    size_t stride = 1;
    for (int r = 0; r < rows; ++r) {
      const size_t n = p.repeat_last_n < 0 ? history[r].size()
                                           : std::min(history[r].size(), static_cast<size_t>(p.repeat_last_n));
      lens[r] = static_cast<int32_t>(n);
      stride = std::max(stride, n);
    }
    history_stride_ = static_cast<int>(stride);
    packed.assign(static_cast<size_t>(rows) * stride, -1);
    for (int r = 0; r < rows; ++r)
      std::copy(history[r].end() - lens[r], history[r].end(), packed.begin() + static_cast<size_t>(r) * stride);
    if (history_.bytes() < packed.size() * sizeof(int32_t)) history_ = DeviceBuffer(packed.size() * sizeof(int32_t));
    upload(history_, packed, stream_);
    upload(history_lens_, lens, stream_);
  }
  float* logits = logits_.as<float>() + static_cast<size_t>(first) * V;
  const DeviceSamplingParams dp{p.temperature, p.top_k, p.top_p, p.min_p, p.repeat_penalty, p.seed};
  // The head-row lists, seen from row `first` (CSR offsets stay absolute).
  LogitAdjust row_adjust;
  auto adjust_rows = [](const LogitAdjust* a, int at, LogitAdjust* out) -> const LogitAdjust* {
    if (a == nullptr) return nullptr;
    *out = *a;
    if (out->bias_offsets) out->bias_offsets += at;
    if (out->generated_offsets) {
      out->generated_offsets += at;
      out->presence += at;
      out->frequency += at;
    }
    return out;
  };
  cuda::sample(logits, rows, V, penalty ? history_.as<int32_t>() : nullptr, penalty ? history_lens_.as<int32_t>() : nullptr,
               penalty ? history_stride_ : 0, dp, offsets_.as<uint64_t>() + first, sample_ids_.as<int32_t>() + first,
               sample_ws_.get(), sample_ws_.bytes(), stream_, seeds_.as<uint64_t>() + first,
               adjust_rows(adjust, first, &row_adjust));
}

void CudaEngine::warm_up() {
  // Tensor-parallel ranks run their layers in step with each other (collectives): left to the steps.
  if (options_.shard.comm != nullptr) return;
  const KernelOptionsScope kernels(options_.kernels);
  const ModelConfig& c = config();
  const DeviceLayer& L = model_->layers.at(0);
  const int H = c.hidden, Q = c.q_dim(), KV = c.kv_dim(), FF = c.ffn_hidden;
  const bool swiglu = c.activation == Activation::SwiGLU || c.activation == Activation::GeGLU;  // gated
  // Zeros in, so that no candidate's timing meets denormals or NaNs of uninitialized memory.
  for (DeviceBuffer* b : {&normed_, &attn_, &ffn_act_, &ffn_in_})
    if (b->bytes() > 0) FDPP_CUDA_CHECK(cudaMemsetAsync(b->get(), 0, b->bytes(), stream_));
  for (int m = 1; m <= max_tokens_; m = cuda::tuning_rows(m) + 1) {
    const int rows = std::min(cuda::tuning_rows(m), max_tokens_);
    // The forward's calls (Forward in this file) at `rows` rows, each where the dispatcher picks
    // cuBLASLt; the GEMV and flat GEMM need no timing.
    auto call = [&](const void* x, const LayerMatrix& w, const DeviceBuffer& bias, void* y, int n, int k) {
      const LinearImpl impl = !w.gguf.empty()   ? linear_->gguf_choice(rows, w.gguf)
                              : !w.int4.empty() ? linear_->int4_choice(rows)
                              : w.scale.empty() ? linear_->choose(rows, n, k)
                                                : linear_->fp8_choice(rows, n, k, Epilogue::Store, !bias.empty());
      if (impl == LinearImpl::Cublas) layer_linear(x, w, bias, y, rows, n, k, Epilogue::Store);
    };
    call(normed_.get(), L.qkv(), L.b_qkv, qkv_.get(), Q + 2 * KV, H);
    call(attn_.get(), L.o(), L.b_o, o_.get(), H, Q);
    if (c.is_moe_layer(0)) {
      // An expert layer: its router is the one cuBLAS product (the experts run moe.h's kernels).
      if (linear_->choose(rows, c.n_experts, H) == LinearImpl::Cublas)
        linear(normed_.get(), L.router.get(), nullptr, moe_logits_.get(), rows, c.n_experts, H, true);
    } else {
      call(normed_.get(), L.in(), L.b_in, ffn_in_.get(), swiglu ? 2 * FF : FF, H);
      call(swiglu ? ffn_act_.get() : ffn_in_.get(), L.down(), L.b_down, o_.get(), H, FF);
    }
    if (rows <= logit_capacity_ && c.embedding_dim() == H &&
        linear_->choose(rows, c.vocab_size, H) == LinearImpl::Cublas)
      lm_head(normed_.get(), rows);
  }
  FDPP_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaEngine::reserve_for_benchmark(int seq, int length) {
  ensure_capacity(seq, length);
  advance_sequence(seq, length - sequence_length(seq));
}

void CudaEngine::randomize_kv_cache(uint64_t seed) {
  const KernelOptionsScope kernels(options_.kernels);
  // Values in [-0.5, 0.5): finite in fp16 and bf16, so attention over them stays well-defined.
  if (options_.kv_quant.dtype == KvDType::Model) {
    fill_random(kv_.get(), static_cast<int64_t>(kv_.bytes() / kElem), model_->dtype(), 0.5f, 0.f, seed, stream_);
    FDPP_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return;
  }
  // e4m3 bytes: random 16-bit bytes would hold NaNs (0x7F, 0xFF). The same values go through the
  // cache writer instead, a step's worth of slots at a time (qkv_ and slots_ as scratch).
  const ModelConfig& c = config();
  const int64_t slots_total = num_blocks_ * options_.block_size;
  const int64_t row = static_cast<int64_t>(c.q_dim()) + 2 * c.kv_dim();
  std::vector<int32_t> slots(static_cast<size_t>(max_tokens_));
  uint64_t chunk_seed = seed;
  for (int layer = 0; layer < c.n_layers; ++layer)
    for (int64_t first = 0; first < slots_total; first += max_tokens_) {
      const int n = static_cast<int>(std::min<int64_t>(max_tokens_, slots_total - first));
      fill_random(qkv_.get(), n * row, model_->dtype(), 0.5f, 0.f, chunk_seed++, stream_);
      std::iota(slots.begin(), slots.begin() + n, static_cast<int32_t>(first));
      // Pageable source: the call returns once the bytes are staged, so `slots` may be refilled.
      FDPP_CUDA_CHECK(
          cudaMemcpyAsync(slots_.get(), slots.data(), n * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
      kv_cache_write(qkv_.get(), slots_.as<int32_t>(), n, c.n_heads, c.n_kv_heads, c.head_dim, options_.block_size,
                     layer_k(layer), layer_v(layer), model_->dtype(), stream_, layer_kv_quant(layer));
    }
  FDPP_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

}  // namespace fdpp::cuda
