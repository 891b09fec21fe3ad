// Tensor parallelism on the GPUs of one host (Megatron style, model/tensor_parallel.h): one
// CudaEngine per GPU, each on its shard of the model and driven by its own thread, kept in lockstep.
// Every step runs on all ranks at once; inside it each rank all-reduces after the o and down
// projections and all-gathers the logits over NCCL (collectives.h), and the collectives are
// captured in each rank's CUDA graph with the rest of the decode step. Rank 0 returns the logits
// and samples.
//
// The sequence table and KV admission are Engine's, here as on one GPU; each rank keeps the same
// table (same calls in the same order, so the same block ids), created on first use.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "backend/cuda/collectives.h"
#include "backend/cuda/cuda_engine.h"
#include "backend/cuda/device_model.h"
#include "model/tensor_parallel.h"
#include "model/weight_plan.h"

namespace fdpp::cuda {

// Where each rank's weights come from: its slices of a plan (streamed from the files), or random.
struct ShardSource {
  const WeightPlan* plan = nullptr;  // null: random weights (--load-format dummy)
  uint64_t dummy_seed = 1234;
  DType dtype = DType::F16;
  StreamOptions stream;              // rank 0 reports progress through stream.progress
  // Checked on each GPU before its shard is allocated: the KV cache and step the engine will hold.
  int64_t kv_tokens = 0, step_tokens = 0;
};

// One thread per rank (rank 0 is the caller's), each with its device current.
class RankThreads {
 public:
  explicit RankThreads(std::vector<int> devices);
  ~RankThreads();
  RankThreads(const RankThreads&) = delete;
  RankThreads& operator=(const RankThreads&) = delete;
  int size() const { return static_cast<int>(devices_.size()); }
  // Runs fn(rank) on every rank at once and waits for all of them; rethrows the lowest rank's error.
  void run(const std::function<void(int)>& fn);

 private:
  void worker(int rank);
  std::vector<int> devices_;
  std::mutex mu_;
  std::condition_variable start_, finished_;
  const std::function<void(int)>* task_ = nullptr;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  std::vector<std::exception_ptr> errors_;
  std::vector<std::thread> threads_;
};

class TensorParallelEngine final : public Engine {
 public:
  // Loads each rank's shard onto GPU rank (devices 0..ranks-1) and builds its engine. options.shard
  // is filled here. Throws one line for a model that does not split (plan_tensor_parallel), too
  // few GPUs, a missing NCCL, or a shard that does not fit its GPU.
  TensorParallelEngine(const ModelConfig& config, int ranks, const ShardSource& source, const EngineOptions& options);
  ~TensorParallelEngine() override;

  const ModelConfig& config() const override { return config_; }
  int ranks() const { return layout_.ranks; }
  const TensorParallelLayout& layout() const { return layout_; }
  CudaEngine& rank(int r) { return *engines_.at(static_cast<size_t>(r)); }
  const DeviceModel& model(int r) const { return *models_.at(static_cast<size_t>(r)); }

  // As CudaEngine's, on every rank (benchmarks).
  void reserve_for_benchmark(int seq, int length);
  void randomize_kv_cache(uint64_t seed);
  uint64_t attention_rows() const { return engines_[0]->attention_rows(); }
  uint64_t attention_fallback_rows() const;
  // Seconds per decode step of `rows` rows spent in collectives, timed alone: a CUDA graph of the
  // step's calls (two all-reduces of [rows, hidden] per layer, the all-gather of the logits) on
  // every rank, replayed `reps` times; rank 0's time.
  double time_collectives(int rows, int reps);

 private:
  void run_step(std::span<const RowPlan> rows, int64_t total_tokens, StepOutput& out) override;
  void on_sequence_resized(int seq, int length) override;
  void on_prefix_mapped(int seq, std::span<const int32_t> tokens, int cached) override;
  int rank_sequence(int seq);  // the ranks' sequence for one of ours, created on first use

  ModelConfig config_;
  TensorParallelLayout layout_;
  std::unique_ptr<RankThreads> threads_;
  std::unique_ptr<CommGroup> comms_;
  std::vector<std::shared_ptr<const DeviceModel>> models_;
  std::vector<std::unique_ptr<CudaEngine>> engines_;
  std::vector<int> rank_seq_;  // ours -> the ranks' (-1: none yet)
};

}  // namespace fdpp::cuda
