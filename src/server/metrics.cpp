#include "server/metrics.h"

#include <fmt/format.h>

#include <algorithm>

namespace fdpp::server {

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double v) {
  const size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();  // first bound >= v
  ++counts_[i];
  sum_ += v;
  ++count_;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& help) const {
  out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bounds_[i], cum);
  }
  cum += counts_.back();
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, cum, name, sum_, name, count_);
}

// Buckets: vLLM's, which span a CPU-served small model (tens of ms per token) to a GPU (ms).
Metrics::Metrics()
    : ttft_({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
             80.0}),
      tpot_({0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
             0.75, 1.0, 2.5}),
      itl_({0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
            0.75, 1.0, 2.5}),
      e2e_({0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0}) {}

void Metrics::observe_finished(const GenerationResult& r) {
  std::lock_guard lock(mutex_);
  ++finished_[r.finish_reason];
  request_prompt_tokens_ += r.prompt.size();
  request_generated_tokens_ += r.token_ids.size();
  if (!r.token_ids.empty()) ttft_.observe(r.time_to_first_token);
  if (r.token_ids.size() >= 2) tpot_.observe(r.time_per_output_token());
  e2e_.observe(r.total_time);
}

void Metrics::observe_inter_token(double seconds, size_t tokens) {
  if (tokens == 0) return;
  std::lock_guard lock(mutex_);
  const double each = seconds / static_cast<double>(tokens);
  for (size_t i = 0; i < tokens; ++i) itl_.observe(each);
}

void Metrics::count_http(int status) {
  std::lock_guard lock(mutex_);
  ++http_[status];
}

void Metrics::count_rejected_queue_full() {
  std::lock_guard lock(mutex_);
  ++queue_full_;
}

namespace {
void gauge(std::string& out, const char* name, const char* help, double v, const char* type = "gauge") {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n{} {}\n", name, help, name, type, name, v);
}
}  // namespace

std::string Metrics::render(const SchedulerStats& s, bool ready) const {
  std::string out;
  gauge(out, "fdpp_ready", "1 once the model is loaded and requests are served", ready ? 1 : 0);
  gauge(out, "fdpp_requests_running", "requests in the running batch", s.running);
  gauge(out, "fdpp_requests_waiting", "requests queued for admission", s.waiting);
  gauge(out, "fdpp_kv_blocks_used", "KV cache blocks held by sequences", static_cast<double>(s.kv_blocks_used));
  gauge(out, "fdpp_kv_blocks_free", "KV cache blocks free", static_cast<double>(s.kv_blocks_free));
  const double total = static_cast<double>(s.kv_blocks_used + s.kv_blocks_free);
  gauge(out, "fdpp_kv_cache_usage_ratio", "fraction of KV cache blocks in use",
        total > 0 ? static_cast<double>(s.kv_blocks_used) / total : 0.0);
  gauge(out, "fdpp_prompt_tokens_total", "prompt tokens prefilled (recomputation after preemption included)",
        static_cast<double>(s.prompt_tokens), "counter");
  gauge(out, "fdpp_generation_tokens_total", "tokens generated", static_cast<double>(s.generated_tokens), "counter");
  gauge(out, "fdpp_preemptions_total", "running requests preempted for KV cache (recomputed later)",
        static_cast<double>(s.preemptions), "counter");
  gauge(out, "fdpp_engine_steps_total", "engine steps run", static_cast<double>(s.steps), "counter");
  // Prefix caching, in tokens as vLLM's prefix_cache_queries / prefix_cache_hits.
  gauge(out, "fdpp_prefix_cache_queries_total", "prompt tokens looked up in the prefix cache at admission",
        static_cast<double>(s.prefix_cache_queries), "counter");
  gauge(out, "fdpp_prefix_cache_hits_total", "prompt tokens found in the prefix cache (cached tokens, not computed)",
        static_cast<double>(s.prefix_cache_hits), "counter");
  gauge(out, "fdpp_prefix_cache_hit_rate", "prefix cache hits / queries since the start",
        s.prefix_cache_queries > 0
            ? static_cast<double>(s.prefix_cache_hits) / static_cast<double>(s.prefix_cache_queries)
            : 0.0);
  gauge(out, "fdpp_prefix_cache_evictions_total", "cached KV blocks evicted to make room",
        static_cast<double>(s.prefix_cache_evictions), "counter");
  gauge(out, "fdpp_kv_blocks_cached", "KV cache blocks registered in the prefix cache (held or not)",
        static_cast<double>(s.kv_blocks_cached));

  std::lock_guard lock(mutex_);
  gauge(out, "fdpp_request_prompt_tokens_total", "prompt tokens of finished requests",
        static_cast<double>(request_prompt_tokens_), "counter");
  gauge(out, "fdpp_request_generation_tokens_total", "tokens generated by finished requests",
        static_cast<double>(request_generated_tokens_), "counter");
  gauge(out, "fdpp_requests_rejected_queue_full_total", "requests answered 503 because the queue was full",
        static_cast<double>(queue_full_), "counter");
  out += "# HELP fdpp_requests_finished_total requests finished, by finish reason\n"
         "# TYPE fdpp_requests_finished_total counter\n";
  for (const auto& [reason, n] : finished_)
    out += fmt::format("fdpp_requests_finished_total{{finish_reason=\"{}\"}} {}\n", reason, n);
  out += "# HELP fdpp_http_requests_total HTTP responses, by status code\n# TYPE fdpp_http_requests_total counter\n";
  for (const auto& [code, n] : http_) out += fmt::format("fdpp_http_requests_total{{code=\"{}\"}} {}\n", code, n);
  ttft_.render(out, "fdpp_time_to_first_token_seconds", "time from arrival to the first generated token");
  tpot_.render(out, "fdpp_time_per_output_token_seconds", "decode time per output token after the first, per request");
  itl_.render(out, "fdpp_inter_token_latency_seconds", "time between streamed tokens");
  e2e_.render(out, "fdpp_e2e_request_latency_seconds", "time from arrival to the last token");
  return out;
}

namespace {
// ", prefix cache hit rate: 87.5%" over the interval, as vLLM's line has it; "" when nothing was looked up.
std::string prefix_hit_text(const SchedulerStats& before, const SchedulerStats& now) {
  const uint64_t queries = now.prefix_cache_queries - before.prefix_cache_queries;
  if (queries == 0) return "";
  const uint64_t hits = now.prefix_cache_hits - before.prefix_cache_hits;
  return fmt::format(", prefix cache hit rate: {:.1f}%", 100.0 * static_cast<double>(hits) / static_cast<double>(queries));
}
}  // namespace

std::string throughput_line(const SchedulerStats& before, const SchedulerStats& now, double seconds) {
  const uint64_t prompt = now.prompt_tokens - before.prompt_tokens;
  const uint64_t generated = now.generated_tokens - before.generated_tokens;
  if (prompt == 0 && generated == 0 && now.running == 0 && now.waiting == 0) return "";
  const double s = seconds > 0 ? seconds : 1;
  const int64_t blocks = now.kv_blocks_used + now.kv_blocks_free;
  const double kv = blocks > 0 ? 100.0 * static_cast<double>(now.kv_blocks_used) / static_cast<double>(blocks) : 0;
  return fmt::format(
      "prompt throughput: {:.1f} tokens/s, generation throughput: {:.1f} tokens/s, running: {} reqs, waiting: {} "
      "reqs, KV cache usage: {:.1f}%{}",
      static_cast<double>(prompt) / s, static_cast<double>(generated) / s, now.running, now.waiting, kv,
      prefix_hit_text(before, now));
}

std::string request_line(const std::string& id, const GenerationResult& r) {
  return fmt::format("request {}: prompt {} tokens, output {} tokens, finish {}, {:.3f} s", id, r.prompt.size(),
                     r.token_ids.size(), r.finish_reason.empty() ? "-" : r.finish_reason, r.total_time);
}

}  // namespace fdpp::server
