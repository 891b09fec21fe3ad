#include "backend/cuda/tensor_parallel_engine.h"

#include <algorithm>
#include <limits>

#include "fdpp/error.h"

namespace fdpp::cuda {

// ---- threads ---------------------------------------------------------------------------------

RankThreads::RankThreads(std::vector<int> devices) : devices_(std::move(devices)), errors_(devices_.size()) {
  for (int r = 1; r < size(); ++r) threads_.emplace_back([this, r] { worker(r); });
}

RankThreads::~RankThreads() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  start_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void RankThreads::worker(int rank) {
  const cudaError_t set = cudaSetDevice(devices_[rank]);
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int)>* task = nullptr;
    {
      std::unique_lock<std::mutex> lock(mu_);
      start_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      task = task_;
    }
    std::exception_ptr error;
    try {
      if (set != cudaSuccess) fail("GPU {}: cudaSetDevice: {}", devices_[rank], cudaGetErrorString(set));
      (*task)(rank);
    } catch (...) {
      error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      errors_[rank] = error;
      if (--pending_ == 0) finished_.notify_all();
    }
  }
}

void RankThreads::run(const std::function<void(int)>& fn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    task_ = &fn;
    pending_ = size() - 1;
    std::fill(errors_.begin(), errors_.end(), nullptr);
    ++generation_;
  }
  start_.notify_all();
  // Rank 0 on the calling thread, with its device current for the call only.
  int previous = 0;
  FDPP_CUDA_CHECK(cudaGetDevice(&previous));
  std::exception_ptr error;
  try {
    FDPP_CUDA_CHECK(cudaSetDevice(devices_[0]));
    fn(0);
  } catch (...) {
    error = std::current_exception();
  }
  cudaSetDevice(previous);
  std::unique_lock<std::mutex> lock(mu_);
  finished_.wait(lock, [&] { return pending_ == 0; });
  errors_[0] = error;
  for (const std::exception_ptr& e : errors_)
    if (e) std::rethrow_exception(e);
}

namespace {

// The ranks agree on one KV block count (the smallest any GPU has room for) while their engines
// are being built. A rank that fails before it arrives aborts the others' wait instead of hanging.
class MinBarrier {
 public:
  explicit MinBarrier(int n) : n_(n) {}
  int64_t arrive(int64_t value) {
    std::unique_lock<std::mutex> lock(mu_);
    min_ = std::min(min_, value);
    if (++arrived_ == n_) cv_.notify_all();
    cv_.wait(lock, [&] { return arrived_ == n_ || aborted_; });
    check(!aborted_, "tensor parallelism: another GPU failed while the engines were built");
    return min_;
  }
  void abort() {
    std::lock_guard<std::mutex> lock(mu_);
    aborted_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int n_, arrived_ = 0;
  int64_t min_ = std::numeric_limits<int64_t>::max();
  bool aborted_ = false;
};

}  // namespace

// ---- engine ----------------------------------------------------------------------------------

TensorParallelEngine::TensorParallelEngine(const ModelConfig& config, int ranks, const ShardSource& source,
                                           const EngineOptions& options)
    : config_(config), layout_(plan_tensor_parallel(config, ranks)) {
  if (const std::string problem = tensor_parallel_model_problem(config); !problem.empty()) fail("{}", problem);
  int count = 0;
  FDPP_CUDA_CHECK(cudaGetDeviceCount(&count));
  check(ranks <= count, "--tensor-parallel {}: this machine has {} GPU{}", ranks, count, count == 1 ? "" : "s");
  std::vector<int> devices(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) devices[static_cast<size_t>(r)] = r;
  threads_ = std::make_unique<RankThreads>(devices);
  comms_ = std::make_unique<CommGroup>(devices);
  models_.resize(static_cast<size_t>(ranks));
  engines_.resize(static_cast<size_t>(ranks));

  MinBarrier kv_blocks(ranks);
  threads_->run([&](int r) {
    try {
      const TensorParallelLayout& t = layout_;
      if (source.plan != nullptr) {
        const WeightPlan shard = shard_plan(*source.plan, config_, t, r);
        GpuMemoryNeed need;
        need.weights = plan_device_bytes(shard);
        need.kv_tokens = source.kv_tokens;
        // K and V of every local layer, 2 bytes an element (1 with an fp8 cache).
        need.kv_cache = static_cast<uint64_t>(source.kv_tokens) * 2 * kv_element_bytes(options.kv_quant.dtype) *
                        t.local.n_layers * t.local.kv_dim();
        need.activations = uint64_t{512} << 20;
        check_gpu_memory(need);
        StreamOptions so = source.stream;
        if (r != 0) so.progress = nullptr;  // one progress bar: rank 0's
        models_[r] = std::make_shared<const DeviceModel>(DeviceModel::from_plan(t.local, shard, source.dtype, so));
      } else {
        models_[r] = std::make_shared<const DeviceModel>(
            DeviceModel::dummy(t.local, source.dtype, source.dummy_seed + 7919 * r, r, t.vocab_rows(r)));
      }
      EngineOptions eo = options;
      eo.shard.rank = r;
      eo.shard.ranks = ranks;
      eo.shard.comm = comms_->comm(r);
      eo.shard.vocab_stride = t.vocab_per_rank;
      eo.shard.agree_kv_blocks = [&kv_blocks](int64_t n) { return kv_blocks.arrive(n); };
      engines_[r] = std::make_unique<CudaEngine>(models_[r], eo);
    } catch (...) {
      kv_blocks.abort();
      throw;
    }
  });
  // Our table mirrors rank 0's limits (every rank has the same, the KV blocks agreed above).
  init_engine(engines_[0]->limits());
}

TensorParallelEngine::~TensorParallelEngine() {
  // Each rank's engine and model are freed on its own thread (its device current), then NCCL.
  if (threads_ != nullptr) {
    try {
      threads_->run([&](int r) {
        engines_[r].reset();
        models_[r].reset();
      });
    } catch (...) {
    }
  }
  comms_.reset();
  threads_.reset();
}

int TensorParallelEngine::rank_sequence(int seq) {
  if (seq >= static_cast<int>(rank_seq_.size())) rank_seq_.resize(static_cast<size_t>(seq) + 1, -1);
  if (rank_seq_[seq] < 0) {
    std::vector<int> ids(engines_.size());
    for (size_t r = 0; r < engines_.size(); ++r) ids[r] = engines_[r]->create_sequence();  // host only
    check(std::all_of(ids.begin(), ids.end(), [&](int id) { return id == ids[0]; }),
          "internal: tensor-parallel ranks disagree on a sequence id");
    rank_seq_[seq] = ids[0];
  }
  return rank_seq_[seq];
}

void TensorParallelEngine::on_sequence_resized(int seq, int length) {
  if (seq >= static_cast<int>(rank_seq_.size()) || rank_seq_[seq] < 0) return;
  const int rs = rank_seq_[seq];
  if (!is_live(seq)) {
    for (auto& e : engines_) e->release_sequence(rs);
    rank_seq_[seq] = -1;
  } else {
    for (auto& e : engines_) e->truncate_sequence(rs, std::min(length, e->sequence_length(rs)));
  }
}

void TensorParallelEngine::on_prefix_mapped(int seq, std::span<const int32_t> tokens, int cached) {
  // Every rank's block table went through the same operations as ours, so each maps the same prefix.
  const int rs = rank_sequence(seq);
  for (auto& e : engines_)
    check(e->map_cached_prefix(rs, tokens) == cached, "internal: a tensor-parallel rank's prefix cache disagrees");
}

void TensorParallelEngine::run_step(std::span<const RowPlan> rows, int64_t /*total_tokens*/, StepOutput& out) {
  // The same batch on every rank, with the ranks' sequence ids; rank 0's output is the step's.
  Batch batch;
  batch.rows.reserve(rows.size());
  for (const RowPlan& p : rows) {
    StepRow r = *p.row;
    r.seq = rank_sequence(p.row->seq);
    batch.rows.push_back(r);
  }
  StepOutput first;
  threads_->run([&](int r) {
    StepOutput o = engines_[r]->step(batch);
    if (r == 0) first = std::move(o);
  });
  out.tokens = std::move(first.tokens);
  check(first.logits.size() == out.logits.size(), "internal: rank 0 returned {} logits, the step wants {}",
        first.logits.size(), out.logits.size());
  out.logits = std::move(first.logits);
  out.logprobs = std::move(first.logprobs);  // sized by rank 0's step exactly as this step sized it
}

void TensorParallelEngine::reserve_for_benchmark(int seq, int length) {
  const int rs = rank_sequence(seq);
  for (auto& e : engines_) e->reserve_for_benchmark(rs, length);  // host bookkeeping only
  check(reserve(seq, length), "KV cache full");
  advance_sequence(seq, length - sequence_length(seq));
}

void TensorParallelEngine::randomize_kv_cache(uint64_t seed) {
  threads_->run([&](int r) { engines_[r]->randomize_kv_cache(seed + static_cast<uint64_t>(r)); });
}

uint64_t TensorParallelEngine::attention_fallback_rows() const {
  uint64_t n = 0;
  threads_->run([&](int r) {
    if (r == 0) n = engines_[0]->attention_fallback_rows();
  });
  return n;
}

double TensorParallelEngine::time_collectives(int rows, int reps) {
  const ModelConfig& c = config_;
  const size_t act = static_cast<size_t>(rows) * c.hidden;
  const size_t logit = static_cast<size_t>(rows) * layout_.vocab_per_rank;
  const DType dtype = models_[0]->dtype();
  double seconds = 0;
  threads_->run([&](int r) {
    cudaStream_t st = nullptr;
    FDPP_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    DeviceBuffer a(act * 2), l(logit * sizeof(float)), g(logit * sizeof(float) * ranks());
    FDPP_CUDA_CHECK(cudaMemsetAsync(a.get(), 0, a.bytes(), st));
    void* comm = comms_->comm(r);
    auto step = [&] {
      for (int layer = 0; layer < c.n_layers; ++layer) {
        all_reduce_sum(a.get(), act, dtype, comm, st);
        all_reduce_sum(a.get(), act, dtype, comm, st);
      }
      all_gather_f32(l.as<float>(), g.as<float>(), logit, comm, st);
    };
    step();  // warm-up (NCCL sets up its channels on first use)
    FDPP_CUDA_CHECK(cudaStreamSynchronize(st));
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    FDPP_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    step();
    FDPP_CUDA_CHECK(cudaStreamEndCapture(st, &graph));
    FDPP_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    cudaEvent_t t0 = nullptr, t1 = nullptr;
    FDPP_CUDA_CHECK(cudaEventCreate(&t0));
    FDPP_CUDA_CHECK(cudaEventCreate(&t1));
    FDPP_CUDA_CHECK(cudaGraphLaunch(exec, st));
    FDPP_CUDA_CHECK(cudaEventRecord(t0, st));
    for (int i = 0; i < reps; ++i) FDPP_CUDA_CHECK(cudaGraphLaunch(exec, st));
    FDPP_CUDA_CHECK(cudaEventRecord(t1, st));
    FDPP_CUDA_CHECK(cudaEventSynchronize(t1));
    float ms = 0;
    FDPP_CUDA_CHECK(cudaEventElapsedTime(&ms, t0, t1));
    if (r == 0) seconds = ms / 1e3 / reps;
    cudaEventDestroy(t0);
    cudaEventDestroy(t1);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(st);
  });
  return seconds;
}

}  // namespace fdpp::cuda
