// Prometheus text exposition (format 0.0.4) of the server's state: the scheduler's gauges and
// counters (read from Scheduler::stats() at scrape time) and the server's own latency histograms,
// fed as requests finish. Thread-safe: HTTP threads and the engine thread observe, /metrics renders.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "engine/scheduler.h"

namespace fdpp::server {

// A cumulative histogram with fixed upper bounds (seconds), as Prometheus clients keep them.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double v);
  // name_bucket{le="..."}, name_sum, name_count lines.
  void render(std::string& out, const std::string& name, const std::string& help) const;
  uint64_t count() const { return count_; }

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative); the last one is +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

class Metrics {
 public:
  Metrics();
  // A request that ran: finish reason, prompt and output sizes, and its TTFT / TPOT / end-to-end.
  void observe_finished(const GenerationResult& result);
  // Time between two streamed deltas of one request, divided over the tokens of the later one
  // (a delta can carry several tokens when text was held back).
  void observe_inter_token(double seconds, size_t tokens);
  void count_http(int status);
  void count_rejected_queue_full();

  std::string render(const SchedulerStats& stats, bool ready) const;

 private:
  mutable std::mutex mutex_;
  Histogram ttft_, tpot_, itl_, e2e_;
  std::map<std::string, uint64_t> finished_;  // by finish_reason
  std::map<int, uint64_t> http_;              // by status code
  uint64_t request_prompt_tokens_ = 0;        // prompt tokens of finished requests (no recompute)
  uint64_t request_generated_tokens_ = 0;
  uint64_t queue_full_ = 0;
};

// The periodic throughput line (vLLM's "Avg prompt throughput ..."): prompt and generation tokens/s
// over the `seconds` between two snapshots of the scheduler, the running and waiting requests and
// the KV cache's use. "" when nothing ran and nothing waits (an idle server stays quiet).
std::string throughput_line(const SchedulerStats& before, const SchedulerStats& now, double seconds);
// The line of one finished request: its id, prompt and output tokens, finish reason and seconds.
std::string request_line(const std::string& id, const GenerationResult& result);

}  // namespace fdpp::server
