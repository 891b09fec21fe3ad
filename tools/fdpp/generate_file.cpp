#include "generate_file.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <optional>

#include "engine/prompt_file.h"
#include "engine/scheduler.h"

namespace fdpp::cli {

namespace {

// "[#####.....] 7/20 done, 112 tokens, 56.1 tokens/s" on stderr, redrawn in place; only when stderr
// is a terminal (a log file would fill with carriage returns).
class BatchProgress {
 public:
  explicit BatchProgress(size_t total) : total_(total), enabled_(::isatty(STDERR_FILENO) == 1) {}
  void update(size_t done, uint64_t tokens, double seconds) {
    if (!enabled_) return;
    constexpr int kWidth = 30;
    const int filled = total_ == 0 ? kWidth : static_cast<int>(done * kWidth / total_);
    fmt::print(stderr, "\r[{}{}] {}/{} done, {} tokens, {:.1f} tokens/s\033[K", std::string(filled, '#'),
               std::string(kWidth - filled, '.'), done, total_, tokens, seconds > 0 ? tokens / seconds : 0.0);
    std::fflush(stderr);
  }
  void finish() {
    if (enabled_) fmt::print(stderr, "\r\033[K");
  }

 private:
  size_t total_;
  bool enabled_;
};

std::string result_line(size_t index, const PromptEntry& e, uint64_t seed, const GenerationResult& r) {
  nlohmann::ordered_json j;
  j["index"] = index;
  j["line"] = e.line;
  if (!e.id_json.empty()) j["id"] = nlohmann::json::parse(e.id_json);
  j["text"] = r.text;
  j["token_ids"] = r.token_ids;
  j["finish_reason"] = r.finish_reason;
  if (!r.error.empty()) j["error"] = r.error;
  j["seed"] = seed;
  j["prompt_tokens"] = r.prompt.size();
  j["cached_tokens"] = r.cached_tokens;  // of prompt_tokens, from the prefix cache
  j["generated_tokens"] = r.token_ids.size();
  j["time_to_first_token"] = r.time_to_first_token;
  j["total_time"] = r.total_time;
  if (r.preemptions > 0) j["preemptions"] = r.preemptions;
  // Invalid UTF-8 (a model can emit it) is replaced rather than aborting the dump.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

}  // namespace

int run_generate_file(const GenerateArgs& a, const EngineArgs& e, bool quiet) {
  using Clock = std::chrono::steady_clock;
  // The whole file is read and checked before the model loads: a typo on line 17 costs nothing.
  const std::vector<PromptEntry> entries = read_prompt_file(a.file);
  const std::string source = a.file == "-" ? "<stdin>" : a.file;

  LoadReport report("loading " + model_label(e), quiet || a.json);
  OpenedModel m = open_model_with_progress(e, quiet || a.json);
  const std::string& path = m.path;
  check(m.tokenizer != nullptr,
        "{}: no tokenizer (tokenizer.json, tokenizer.model or vocab.json + merges.txt); --file needs one", path);
  const ModelConfig& c = m.config();
  const int ctx = e.max_model_len > 0 ? e.max_model_len : c.max_context;
  check(ctx <= c.max_context, "--ctx-size {} exceeds the model's context length {}", ctx, c.max_context);

  RequestSettings defaults;
  defaults.sampling = a.sampling;
  defaults.max_tokens = a.max_tokens;
  defaults.ignore_eos = a.ignore_eos;
  defaults.stop = a.stop;
  defaults.chat = a.chat;
  defaults.system = a.system;
  defaults.chat_options = a.chat_options;

  // Every request is built (tokenized, checked against the context) before any runs.
  std::vector<GenerationRequest> requests;
  std::vector<uint64_t> seeds;
  for (size_t i = 0; i < entries.size(); ++i) {
    RequestSettings base = defaults;
    // Request i gets seed + i (unless its line sets "seed"): sampled requests differ from one another
    // even when their prompts are equal, and each is reproducible from the printed seed alone.
    base.sampling.seed = a.sampling.seed + i;
    const RequestSettings s = entries[i].settings(base);
    requests.push_back(build_request(entries[i], s, *m.tokenizer, ctx, source));
    seeds.push_back(s.sampling.seed);
  }

  EngineLimits limits = e.engine_limits(m.device);
  limits.max_context = ctx;
  auto engine = m.make_engine(e, limits, report.progress());
  engine->warm_up();
  report.stats(m);  // ends the progress bar
  const SchedulerOptions so =
      e.scheduler_options(m.device, static_cast<int>(std::max<size_t>(entries.size(), SchedulerOptions{}.max_waiting)));
  Scheduler scheduler(*engine, *m.tokenizer, so);

  // Results are written in input order as soon as the ones before them are done (or, --unordered,
  // each as it finishes); the JSON lines carry "index" either way.
  std::vector<std::optional<GenerationResult>> results(entries.size());
  size_t next_to_write = 0, done = 0, failed = 0;
  uint64_t generated = 0, prompt_tokens = 0, cached_tokens = 0;
  BatchProgress progress(entries.size());
  const auto t0 = Clock::now();
  for (size_t i = 0; i < requests.size(); ++i) {
    GenerationCallbacks cb;
    cb.on_finish = [&, i](const GenerationResult& r) {
      ++done;
      generated += r.token_ids.size();
      prompt_tokens += r.prompt.size();
      cached_tokens += static_cast<uint64_t>(r.cached_tokens);
      if (r.finish_reason == "error") ++failed;
      if (a.unordered) {
        write_stdout(result_line(i, entries[i], seeds[i], r));
      } else {
        results[i] = r;
        for (; next_to_write < results.size() && results[next_to_write]; ++next_to_write) {
          write_stdout(result_line(next_to_write, entries[next_to_write], seeds[next_to_write], *results[next_to_write]));
          results[next_to_write].reset();  // written; the text is not needed again
        }
      }
      progress.update(done, generated, std::chrono::duration<double>(Clock::now() - t0).count());
    };
    try {
      scheduler.submit(std::move(requests[i]), std::move(cb));
    } catch (const Error& e) {
      fail("{}:{}: {}", source, entries[i].line, e.what());
    }
  }
  scheduler.run_until_idle();
  progress.finish();
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  const SchedulerStats st = scheduler.stats();
  fmt::print(stderr,
             "{} prompts: {} prompt tokens ({} from the prefix cache), {} generated tokens in {:.2f} s ({:.1f} generated "
             "tokens/s), {} steps, {} preemptions, at most {} of {} KV blocks held | seed {}\n",
             entries.size(), prompt_tokens, cached_tokens, generated, seconds, seconds > 0 ? generated / seconds : 0.0, st.steps,
             st.preemptions, st.kv_blocks_peak, scheduler.engine().kv().num_blocks(), a.sampling.seed);
  check(failed == 0, "{} of {} requests failed (see the \"error\" field of their lines)", failed, entries.size());
  return 0;
}

}  // namespace fdpp::cli
