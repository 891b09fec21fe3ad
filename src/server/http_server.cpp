#include "server/http_server.h"

#include <fmt/format.h>
#include <httplib.h>

#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <algorithm>
#include <cctype>
#include <deque>
#include <optional>
#include <string_view>
#include <utility>

#include "core/version.h"
#include "fdpp/error.h"
#include "io/json_file.h"  // json_show

namespace fdpp::server {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

// Wakes a response's HTTP thread. One per response, shared by the channels of its requests, so that
// a streamed batch waits on all of its prompts at once.
struct Signal {
  std::mutex mutex;
  std::condition_variable cv;
};

// What the engine thread hands a request's HTTP thread: text and token ids not yet sent (deltas
// arriving while the HTTP thread writes are merged into one chunk), and the result at the end.
// Guarded by signal->mutex.
struct Channel {
  explicit Channel(std::shared_ptr<Signal> s) : signal(std::move(s)) {}
  std::shared_ptr<Signal> signal;
  std::string text;
  std::vector<int32_t> tokens;
  std::vector<TokenLogprobs> logprobs;  // of `tokens`, when the request asked
  bool finished = false;
  GenerationResult result;
  Clock::time_point last_delta{};
  bool had_delta = false;
};

// Moves the engine thread's deltas and ends into the responses' channels on a thread of its own.
// Done on the engine thread, waking hundreds of streams (a futex call each), the metrics and the
// per-request log line kept the GPU waiting between steps at saturation (docs/PERFORMANCE.md,
// Throughput: GPU busy); now the engine thread only appends to a queue, and each response's
// thread is woken once per batch of items.
class Delivery {
 public:
  struct Item {
    std::shared_ptr<Channel> ch;
    std::string text;
    std::vector<int32_t> tokens;
    std::vector<TokenLogprobs> logprobs;
    Clock::time_point at;
    std::optional<GenerationResult> result;  // the request's end (queued after its last delta)
    std::string log_id;                      // the per-request log line's name; "" for none
  };

  explicit Delivery(Metrics& metrics) : metrics_(metrics), thread_([this] { run(); }) {}
  ~Delivery() {  // delivers what is queued, then stops
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }
  Delivery(const Delivery&) = delete;
  Delivery& operator=(const Delivery&) = delete;

  void push(Item item) {
    bool wake = false;
    {
      std::lock_guard lock(mutex_);
      wake = waiting_;
      waiting_ = false;  // one wake-up for the items queued until the thread looks again
      queue_.push_back(std::move(item));
    }
    if (wake) cv_.notify_one();
  }

 private:
  void run() {
    std::vector<Item> batch;
    std::unique_lock lock(mutex_);
    for (;;) {
      if (queue_.empty()) {
        if (stopping_) return;
        waiting_ = true;
        cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
        waiting_ = false;
        continue;
      }
      batch.swap(queue_);
      lock.unlock();
      apply(batch);
      batch.clear();
      lock.lock();
    }
  }

  void apply(std::vector<Item>& batch) {
    std::vector<Signal*> woken;
    for (Item& it : batch) {
      Channel& ch = *it.ch;
      if (it.result) {
        metrics_.observe_finished(*it.result);
        if (!it.log_id.empty()) fmt::print(stderr, "fdpp serve: {}\n", request_line(it.log_id, *it.result));
      }
      {
        std::lock_guard lock(ch.signal->mutex);
        if (it.result) {
          ch.result = std::move(*it.result);
          ch.finished = true;
        } else {
          ch.text.append(it.text);
          ch.tokens.insert(ch.tokens.end(), it.tokens.begin(), it.tokens.end());
          ch.logprobs.insert(ch.logprobs.end(), it.logprobs.begin(), it.logprobs.end());
          if (ch.had_delta)
            metrics_.observe_inter_token(std::chrono::duration<double>(it.at - ch.last_delta).count(),
                                         it.tokens.size());
          ch.last_delta = it.at;
          ch.had_delta = true;
        }
      }
      woken.push_back(ch.signal.get());
    }
    // The batch's channels keep their signals alive until it is cleared.
    std::sort(woken.begin(), woken.end());
    woken.erase(std::unique(woken.begin(), woken.end()), woken.end());
    for (Signal* s : woken) s->cv.notify_all();
  }

  Metrics& metrics_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<Item> queue_;
  bool waiting_ = false;
  bool stopping_ = false;
  std::thread thread_;  // last: started once the members above exist
};

namespace {

// Every route HttpServer::route registers, by method ("/v1/models/" stands for the ids under it):
// the error handler answers another method on one of them with 405.
constexpr std::pair<std::string_view, std::string_view> kRoutes[] = {
    {"GET", "/health"},       {"GET", "/version"},        {"GET", "/metrics"},
    {"GET", "/v1/models"},    {"GET", "/v1/models/"},     {"POST", "/tokenize"},
    {"POST", "/detokenize"},  {"POST", "/v1/completions"}, {"POST", "/v1/chat/completions"},
};

// log_id: the request's name in the per-request log line; "" for no line.
GenerationCallbacks callbacks_for(const std::shared_ptr<Channel>& ch, Delivery& delivery, std::string log_id) {
  GenerationCallbacks cb;
  cb.on_delta = [ch, &delivery](uint64_t, std::string_view text, std::span<const int32_t> tokens,
                                std::span<const TokenLogprobs> logprobs) {
    Delivery::Item item;
    item.ch = ch;
    item.text.assign(text);
    item.tokens.assign(tokens.begin(), tokens.end());
    item.logprobs.assign(logprobs.begin(), logprobs.end());
    item.at = Clock::now();
    delivery.push(std::move(item));
  };
  cb.on_finish = [ch, &delivery, log_id = std::move(log_id)](const GenerationResult& r) {
    Delivery::Item item;
    item.ch = ch;
    item.at = Clock::now();
    item.result = r;
    item.log_id = log_id;
    delivery.push(std::move(item));
  };
  return cb;
}

// Keep-alive comment of an idle stream (SSE ignores lines starting with ':'): it is also how a
// client that went away while its request waits in the queue is noticed (the write fails).
constexpr auto kStreamIdle = std::chrono::seconds(1);

}  // namespace

std::string origin_problem(const std::string& origin) {
  if (origin == "*") return "";
  const size_t sep = origin.find("://");
  if (sep == std::string::npos || sep == 0 || sep + 3 == origin.size())
    return fmt::format("'{}' is not an origin (scheme://host[:port], or *)", origin);
  for (size_t i = sep + 3; i < origin.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(origin[i]);
    if (c == '/' || c <= 0x20 || c >= 0x7f || c == ',')
      return fmt::format("'{}' is not an origin: scheme://host[:port] with no path or trailing slash", origin);
  }
  return "";
}

HttpServer::HttpServer(ServerOptions options)
    : options_(std::move(options)), http_(std::make_unique<httplib::Server>()),
      delivery_(std::make_unique<Delivery>(metrics_)) {
  std::random_device rd;
  seed_rng_.seed((static_cast<uint64_t>(rd()) << 32) ^ rd());
  serial_ = seed_rng_();
}

HttpServer::~HttpServer() { stop(); }

uint64_t HttpServer::next_seed() {
  std::lock_guard lock(seed_mutex_);
  return seed_rng_();
}

void HttpServer::reply_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  if (e.status == 503 || e.status == 429) res.set_header("Retry-After", std::to_string(options_.retry_after_seconds));
  res.set_content(dump(error_body(e)), "application/json");
}

bool HttpServer::add_cors_headers(const httplib::Request& req, httplib::Response& res) const {
  if (options_.allowed_origins.empty()) return false;
  const std::string origin = req.get_header_value("Origin");
  if (origin.empty()) return false;
  bool any = false, listed = false;
  for (const std::string& o : options_.allowed_origins) {
    any |= o == "*";
    listed |= o == origin;
  }
  if (!any && !listed) return false;
  // A listed origin is echoed, so caches must key the response by Origin.
  res.set_header("Access-Control-Allow-Origin", any ? "*" : origin);
  if (!any) res.set_header("Vary", "Origin");
  res.set_header("Access-Control-Expose-Headers", kIgnoredFieldsHeader);
  return true;
}

void HttpServer::report_ignored(const std::string& what, const std::vector<std::string>& fields, httplib::Response& res) {
  if (fields.empty()) return;
  const std::string names = join_fields(fields);
  fmt::print(stderr, "fdpp serve: warning: {}: ignored the unknown fields {}\n", what, names);
  res.set_header(kIgnoredFieldsHeader, names);
}

void HttpServer::stats_loop() {
  SchedulerStats before = scheduler_->stats();
  Clock::time_point then = Clock::now();
  const auto interval = std::chrono::duration<double>(options_.stats_interval_seconds);
  std::unique_lock lock(stats_mutex_);
  while (!stopping_.load()) {
    stats_cv_.wait_for(lock, interval, [this] { return stopping_.load(); });
    if (stopping_.load()) break;
    const SchedulerStats now = scheduler_->stats();
    const Clock::time_point t = Clock::now();
    const std::string line = throughput_line(before, now, std::chrono::duration<double>(t - then).count());
    if (!line.empty()) fmt::print(stderr, "fdpp serve: {}\n", line);
    before = now;
    then = t;
  }
}

void HttpServer::in_flight_done() {
  {
    std::lock_guard lock(in_flight_mutex_);
    --in_flight_;
  }
  in_flight_cv_.notify_all();
}

void HttpServer::start(std::function<void()> on_listen_exit) {
  route();
  const int threads = options_.http_threads;
  http_->new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  http_->set_payload_max_length(static_cast<size_t>(options_.limits.max_body_bytes));
  // Streamed tokens are small writes: with Nagle's algorithm a chunk waits until the client has
  // acknowledged the previous write, which a delayed ACK holds for up to 40 ms (the first token's
  // chunk after the response headers). Accepted connections inherit the option.
  http_->set_tcp_nodelay(true);
  // The listening socket, to raise its backlog below.
  int listen_socket = -1;
  http_->set_socket_options([&listen_socket](socket_t sock) {
    httplib::default_socket_options(sock);
    listen_socket = static_cast<int>(sock);
  });
  if (options_.port == 0) {
    port_ = http_->bind_to_any_port(options_.host);
    check(port_ > 0, "cannot listen on {} (any port)", options_.host);
  } else {
    check(http_->bind_to_port(options_.host, options_.port), "cannot listen on {}:{} (in use, or not an address of this machine?)",
          options_.host, options_.port);
    port_ = options_.port;
  }
  http_->set_socket_options(httplib::default_socket_options);
  // The packaged cpp-httplib listens with a backlog of 5: a burst of clients (a benchmark's 256
  // requests at once) overflowed it, and the refused connections retried a second later (the
  // 7B job served at rate inf had 100 requests running, then 108 more 1.1 s later). Listening
  // again on a listening socket only changes its backlog.
  if (listen_socket >= 0 && ::listen(listen_socket, SOMAXCONN) != 0)
    fmt::print(stderr, "fdpp serve: could not raise the listen backlog ({}); bursts of connections may wait\n",
               std::strerror(errno));
  listen_thread_ = std::thread([this, on_listen_exit = std::move(on_listen_exit)] {
    http_->listen_after_bind();
    if (!stopping_.load() && on_listen_exit) on_listen_exit();
  });
}

void HttpServer::attach(Scheduler& scheduler, ModelInfo model, PromptCodec codec) {
  scheduler_ = &scheduler;
  model_ = std::move(model);
  codec_ = std::move(codec);
  ready_.store(true);  // publishes the three above to the HTTP threads (seq_cst)
  if (options_.stats_interval_seconds > 0) stats_thread_ = std::thread([this] { stats_loop(); });
}

void HttpServer::drain() {
  draining_.store(true);
  if (scheduler_) scheduler_->stop(/*drain=*/true);
  std::unique_lock lock(in_flight_mutex_);
  in_flight_cv_.wait(lock, [this] { return in_flight_ == 0; });
}

void HttpServer::stop() {
  {
    std::lock_guard lock(stats_mutex_);  // the stats loop sees stopping_ between its waits
    if (stopping_.exchange(true)) return;
  }
  stats_cv_.notify_all();
  if (http_) http_->stop();
  if (listen_thread_.joinable()) listen_thread_.join();
  if (stats_thread_.joinable()) stats_thread_.join();
}

void HttpServer::route() {
  httplib::Server& s = *http_;

  // API key: only the OpenAI routes are protected (as vLLM does); /health and /metrics stay open
  // for probes and scrapers.
  // CORS first: a preflight carries no API key, and a browser can read an error (a 401 too) only
  // when its response has the CORS headers.
  s.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    const bool allowed = add_cors_headers(req, res);
    if (req.method == "OPTIONS" && !options_.allowed_origins.empty()) {
      if (!allowed && !req.get_header_value("Origin").empty()) {
        reply_error(res, ApiError(403, fmt::format("the origin {} is not allowed (--allowed-origins)",
                                                   json_show(req.get_header_value("Origin")))));
        return httplib::Server::HandlerResponse::Handled;
      }
      res.status = 204;
      res.set_header("Allow", "GET, POST, OPTIONS");
      res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
      // The headers the page asked for are allowed too when they are plain names (the openai JS
      // client adds its own x-stainless-* headers), so that its preflight does not fail on them.
      std::string headers = "Authorization, Content-Type";
      const std::string asked = req.get_header_value("Access-Control-Request-Headers");
      if (!asked.empty() && asked.size() <= 1024 &&
          std::all_of(asked.begin(), asked.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == ',' || c == ' '; }))
        headers += ", " + asked;
      res.set_header("Access-Control-Allow-Headers", headers);
      res.set_header("Access-Control-Max-Age", "600");
      return httplib::Server::HandlerResponse::Handled;
    }
    if (options_.api_key.empty() || !req.path.starts_with("/v1/")) return httplib::Server::HandlerResponse::Unhandled;
    const std::string auth = req.get_header_value("Authorization");
    const std::string want = "Bearer " + options_.api_key;
    // Compared in time independent of where the first difference is.
    bool same = auth.size() == want.size();
    unsigned diff = 0;
    for (size_t i = 0; same && i < want.size(); ++i) diff |= static_cast<unsigned char>(auth[i] ^ want[i]);
    if (same && diff == 0) return httplib::Server::HandlerResponse::Unhandled;
    reply_error(res, ApiError(401,
                              auth.empty() ? "missing API key: send the header 'Authorization: Bearer <key>'"
                                           : "incorrect API key",
                              "", "authentication_error", "invalid_api_key"));
    return httplib::Server::HandlerResponse::Handled;
  });

  // Errors httplib answers itself (unknown route, body over the limit, unparsable request line)
  // get the OpenAI error body; responses that already have one keep it.
  s.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    std::string msg;
    if (res.status == 404) {
      // A route of another method: 405 with the method it takes, as vLLM (FastAPI) answers.
      for (const auto& [method, path] : kRoutes) {
        const bool match = path.back() == '/' ? req.path.rfind(path, 0) == 0 && req.path.size() > path.size()
                                              : req.path == path;
        if (match && method != req.method) {
          res.status = 405;
          res.set_header("Allow", std::string(method));
          msg = fmt::format("{} {} is not allowed; {} takes {}", req.method, req.path, req.path, method);
          break;
        }
      }
    }
    switch (res.status) {
      case 405: break;
      case 404: msg = fmt::format("no route {} {}", req.method, req.path); break;
      case 413: msg = fmt::format("the request body exceeds the limit of {} bytes", options_.limits.max_body_bytes); break;
      case 400:
        // httplib rejects a request it cannot read before any route sees it.
        msg = req.method == "POST" && !req.has_header("Content-Length") && !req.has_header("Transfer-Encoding")
                  ? "the POST has no body: send the JSON request with a Content-Length header"
                  : "malformed HTTP request";
        break;
      default: msg = fmt::format("HTTP {}", res.status);
    }
    res.set_content(dump(error_body(ApiError(res.status, msg))), "application/json");
    return httplib::Server::HandlerResponse::Handled;
  }));
  s.set_exception_handler([this](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown exception";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    reply_error(res, ApiError(500, fmt::format("internal error: {}", what)));
  });
  s.set_logger([this](const httplib::Request&, const httplib::Response& res) { metrics_.count_http(res.status); });

  s.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    const char* status = draining_ ? "draining" : ready_ ? "ok" : "loading";
    res.status = ready_ && !draining_ ? 200 : 503;
    if (res.status == 503) res.set_header("Retry-After", std::to_string(options_.retry_after_seconds));
    res.set_content(dump(json{{"status", status}}), "application/json");
  });
  s.Get("/version", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(dump(json{{"version", kVersion}}), "application/json");
  });
  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    const SchedulerStats stats = ready_ ? scheduler_->stats() : SchedulerStats{};
    res.set_content(metrics_.render(stats, ready_), "text/plain; version=0.0.4; charset=utf-8");
  });
  s.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    if (!ready_) return reply_error(res, ApiError(503, "the model is loading"));
    res.set_content(dump(models_body(model_)), "application/json");
  });
  // OpenAI's retrieve: the one model under its id or an alias; another name is a 404 in OpenAI's
  // shape. Ids may hold slashes (--served-model-name org/name), so the pattern takes the rest.
  s.Get(R"(/v1/models/(.+))", [this](const httplib::Request& req, httplib::Response& res) {
    if (!ready_) return reply_error(res, ApiError(503, "the model is loading"));
    try {
      res.set_content(dump(model_body(model_, req.matches[1].str())), "application/json");
    } catch (const ApiError& e) {
      reply_error(res, e);
    }
  });
  // vLLM's /tokenize and /detokenize (outside /v1, as vLLM has them).
  for (const bool tokenize : {true, false}) {
    s.Post(tokenize ? "/tokenize" : "/detokenize", [this, tokenize](const httplib::Request& req, httplib::Response& res) {
      if (!ready_) return reply_error(res, ApiError(503, "the model is loading"));
      try {
        const json body = parse_json_body(req.body, options_.limits);
        std::vector<std::string> ignored;
        json out = tokenize ? tokenize_body(body, model_, codec_, options_.limits, ignored, req.body)
                            : detokenize_body(body, model_, codec_, ignored);
        report_ignored(tokenize ? "/tokenize" : "/detokenize", ignored, res);
        res.set_content(dump(out), "application/json");
      } catch (const ApiError& e) {
        reply_error(res, e);
      }
    });
  }
  s.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    handle_generate(Endpoint::Completions, req, res);
  });
  s.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    handle_generate(Endpoint::Chat, req, res);
  });
}

void HttpServer::handle_generate(Endpoint endpoint, const httplib::Request& req, httplib::Response& res) {
  if (!ready_) return reply_error(res, ApiError(503, "the model is loading"));
  if (draining_) {
    res.set_header("Connection", "close");
    return reply_error(res, ApiError(503, "the server is shutting down"));
  }
  ParsedRequest p;
  try {
    p = parse_request(endpoint, parse_json_body(req.body, options_.limits), model_, codec_, options_.limits, req.body);
  } catch (const ApiError& e) {
    return reply_error(res, e);
  }
  ResponseContext ctx;
  ctx.endpoint = endpoint;
  ctx.id = response_id(endpoint, serial_.fetch_add(1));
  ctx.created = static_cast<int64_t>(std::time(nullptr));
  ctx.model = model_.id;
  ctx.return_token_ids = p.return_token_ids;
  ctx.n = p.n;
  ctx.logprobs = p.logprobs;
  ctx.prompt_logprobs = p.prompt_logprobs;
  ctx.echo_texts = p.echo_texts;
  ctx.token_bytes = codec_.token_bytes;
  ctx.tools = p.tools;
  if (p.tools.active()) ctx.tool_id_seed = next_seed();
  report_ignored(ctx.id, p.ignored_fields, res);

  {
    std::lock_guard lock(in_flight_mutex_);
    ++in_flight_;
  }
  std::vector<GenerationRequest> requests = p.batch.empty() ? std::vector{std::move(p.generation)} : std::move(p.batch);
  std::vector<std::shared_ptr<Channel>> channels;
  std::vector<uint64_t> ids;
  try {
    submit_all(std::move(requests), p.seed_given, p.n, ctx.id, channels, ids);
  } catch (const ApiError& e) {
    in_flight_done();
    return reply_error(res, e);
  }
  if (!p.stream) return reply_whole(channels, ctx, res);

  // Streamed: chunks of every prompt as they come (choice i for prompt i of a batch), each
  // prompt's last chunk when it finishes, then the usage (summed) and [DONE] once all have.
  struct StreamState {
    std::shared_ptr<Signal> signal;
    std::vector<std::shared_ptr<Channel>> channels;
    std::vector<uint64_t> ids;
    std::vector<bool> reported;  // the prompt's last chunk is written
    std::vector<size_t> text_offset;  // completions' logprobs: characters of each choice's text so far
    std::vector<ToolStream> tool_streams;  // chat with tools: per choice
    size_t n_reported = 0, prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
    ResponseContext ctx;
    bool include_usage = false;
    bool first = true;
    bool done = false;
  };
  auto st = std::make_shared<StreamState>();
  st->signal = channels[0]->signal;
  st->reported.assign(channels.size(), false);
  st->text_offset.assign(channels.size(), 0);
  st->channels = std::move(channels);
  st->ids = std::move(ids);
  st->ctx = ctx;
  st->include_usage = p.include_usage;
  if (ctx.tools.active())
    for (size_t i = 0; i < st->channels.size(); ++i)
      st->tool_streams.emplace_back(ctx.tools, tool_id_seed_for(ctx, static_cast<int>(i)));
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");  // proxies (nginx) must not buffer the events
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, st](size_t, httplib::DataSink& sink) -> bool {
        std::string out;
        // Chat sends the role at once, before the first token (as OpenAI and vLLM do); echo sends
        // each choice's prompt text first.
        if (st->first && st->ctx.endpoint == Endpoint::Chat) {
          // One per choice (n > 1), as vLLM sends them.
          for (size_t i = 0; i < (st->ctx.n > 1 ? st->channels.size() : 1); ++i)
            out += sse_event(stream_chunk(st->ctx, static_cast<int>(i), "", {}, "", true, st->include_usage));
          st->first = false;
        }
        if (st->first && !st->ctx.echo_texts.empty()) {
          const size_t n = static_cast<size_t>(std::max(st->ctx.n, 1));
          for (size_t i = 0; i < st->channels.size(); ++i) {
            const std::string& echo = st->ctx.echo_texts[std::min(i / n, st->ctx.echo_texts.size() - 1)];
            out += sse_event(stream_chunk(st->ctx, static_cast<int>(i), echo, {}, "", false, st->include_usage));
            for (unsigned char c : echo) st->text_offset[i] += (c & 0xC0) != 0x80;  // characters, as logprobs_json
          }
          st->first = false;
        }
        struct Piece {
          int index = 0;
          std::string text;
          std::vector<int32_t> tokens;
          std::vector<TokenLogprobs> logprobs;
          std::optional<GenerationResult> result;  // set when the prompt has just finished
        };
        std::vector<Piece> pieces;
        if (out.empty()) {
          std::unique_lock lock(st->signal->mutex);
          const auto has_news = [&](size_t i) {
            const Channel& c = *st->channels[i];
            return !c.text.empty() || !c.tokens.empty() || (c.finished && !st->reported[i]);
          };
          st->signal->cv.wait_for(lock, kStreamIdle, [&] {
            for (size_t i = 0; i < st->channels.size(); ++i)
              if (has_news(i)) return true;
            return false;
          });
          for (size_t i = 0; i < st->channels.size(); ++i) {
            if (!has_news(i)) continue;
            Channel& c = *st->channels[i];
            Piece& piece = pieces.emplace_back();
            piece.index = static_cast<int>(i);
            piece.text.swap(c.text);
            piece.tokens.swap(c.tokens);
            piece.logprobs.swap(c.logprobs);
            if (c.finished && !st->reported[i]) {
              piece.result = c.result;
              st->reported[i] = true;
            }
          }
        }
        bool failed = false;
        for (const Piece& piece : pieces) {
          ToolStream* tools = st->tool_streams.empty() ? nullptr : &st->tool_streams[piece.index];
          if (!piece.text.empty() || !piece.tokens.empty()) {
            if (tools) {
              // Text held back (a call may be starting) still sends its tokens' logprobs.
              const ToolStream::Delta d = tools->push(piece.text);
              if (!d.content.empty() || (st->ctx.logprobs >= 0 && !piece.logprobs.empty()) || st->ctx.return_token_ids)
                out += sse_event(stream_chunk(st->ctx, piece.index, d.content, piece.tokens, "", st->first,
                                              st->include_usage, piece.logprobs, &st->text_offset[piece.index]));
              if (!d.tool_calls.is_null())
                out += sse_event(tool_calls_chunk(st->ctx, piece.index, d.tool_calls, st->include_usage));
            } else {
              out += sse_event(stream_chunk(st->ctx, piece.index, piece.text, piece.tokens, "", st->first,
                                            st->include_usage, piece.logprobs, &st->text_offset[piece.index]));
            }
            st->first = false;
          }
          if (!piece.result) continue;
          const GenerationResult& r = *piece.result;
          if (r.finish_reason == "error" || r.finish_reason == "cancelled") {
            const std::string msg = r.finish_reason == "error" ? "generation failed: " + r.error : "the request was cancelled";
            out += sse_event(error_body(ApiError(r.finish_reason == "error" ? 500 : 503, msg)));
            failed = true;
            break;
          }
          std::string finish_reason = r.finish_reason;
          if (tools) {
            const ToolStream::Delta d = tools->finish();
            if (!d.content.empty())
              out += sse_event(stream_chunk(st->ctx, piece.index, d.content, {}, "", false, st->include_usage));
            if (!d.tool_calls.is_null())
              out += sse_event(tool_calls_chunk(st->ctx, piece.index, d.tool_calls, st->include_usage));
            finish_reason = tool_finish_reason(finish_reason, tools->called());
          }
          out += sse_event(stream_chunk(st->ctx, piece.index, "", {}, finish_reason, false, st->include_usage));
          // OpenAI counts a prompt once however many choices it has (its cached part with it).
          if (piece.index % std::max(st->ctx.n, 1) == 0) {
            st->prompt_tokens += r.prompt.size();
            st->cached_tokens += static_cast<size_t>(r.cached_tokens);
          }
          st->completion_tokens += r.token_ids.size();
          st->n_reported++;
        }
        const bool over = failed || st->n_reported == st->channels.size();
        if (over) {
          if (!failed && st->include_usage)
            out += sse_event(usage_chunk(st->ctx, st->prompt_tokens, st->completion_tokens, st->cached_tokens));
          out += sse_done();
        }
        if (out.empty()) out = ": keep-alive\n\n";
        if (!sink.write(out.data(), out.size())) return false;  // the releaser cancels
        if (over) {
          // A batch that failed ends here: the prompts still running are of no use to anyone.
          if (failed)
            for (uint64_t id : st->ids) scheduler_->cancel(id);
          st->done = true;
          sink.done();
        }
        return true;
      },
      // Called when the response is over, written or not: a stream that ended early (client gone,
      // write timeout) cancels its requests, so their KV blocks are free after the next step.
      [this, st](bool) {
        if (!st->done)
          for (uint64_t id : st->ids) scheduler_->cancel(id);
        in_flight_done();
      });
}

uint64_t HttpServer::submit(GenerationRequest request, const std::shared_ptr<Channel>& ch, const std::string& what,
                            std::string log_id) {
  try {
    return scheduler_->submit(std::move(request), callbacks_for(ch, *delivery_, std::move(log_id)));
  } catch (const QueueFullError& e) {
    metrics_.count_rejected_queue_full();
    throw ApiError(503, fmt::format("the server is busy: {}", e.what()), "", "server_busy_error", "queue_full");
  } catch (const fdpp::Error& e) {
    // After stop() the scheduler refuses everything; otherwise this is a request it can never run.
    if (draining_) throw ApiError(503, "the server is shutting down");
    throw ApiError(400, what.empty() ? std::string(e.what()) : fmt::format("{}: {}", what, e.what()));
  }
}

void HttpServer::submit_all(std::vector<GenerationRequest> requests, bool seed_given, int n, const std::string& log_id,
                            std::vector<std::shared_ptr<Channel>>& channels, std::vector<uint64_t>& ids) {
  const auto signal = std::make_shared<Signal>();
  const bool batch = requests.size() > static_cast<size_t>(std::max(n, 1));  // several prompts
  for (size_t i = 0; i < requests.size(); ++i) {
    if (!seed_given) requests[i].sampling.seed = next_seed();  // OpenAI: unseeded requests differ
    channels.push_back(std::make_shared<Channel>(signal));
    try {
      ids.push_back(submit(std::move(requests[i]), channels.back(),
                           batch ? fmt::format("prompt[{}]", i / static_cast<size_t>(std::max(n, 1))) : "",
                           !options_.log_requests            ? ""
                           : requests.size() > 1 ? fmt::format("{}[{}]", log_id, i)
                                                 : log_id));
    } catch (const ApiError&) {
      for (uint64_t id : ids) scheduler_->cancel(id);  // a batch runs whole or not at all
      throw;
    }
  }
}

void HttpServer::reply_whole(const std::vector<std::shared_ptr<Channel>>& channels, const ResponseContext& ctx,
                             httplib::Response& res) {
  std::vector<GenerationResult> results;
  for (const auto& ch : channels) {
    std::unique_lock lock(ch->signal->mutex);
    ch->signal->cv.wait(lock, [&] { return ch->finished; });
    results.push_back(std::move(ch->result));
  }
  in_flight_done();
  for (const GenerationResult& r : results) {
    if (r.finish_reason == "error")
      return reply_error(res, ApiError(500, fmt::format("generation failed: {}", r.error)));
    if (r.finish_reason == "cancelled") return reply_error(res, ApiError(503, "the request was cancelled"));
  }
  res.set_content(dump(completion_body(ctx, results)), "application/json");
}

}  // namespace fdpp::server
