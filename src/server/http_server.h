// The HTTP side of `fdpp serve` (cpp-httplib): routes, API-key check, request -> scheduler ->
// response / server-sent events, and the shutdown order. The wire format lives in api.h, the
// Prometheus text in metrics.h; the scheduler runs on its own engine thread (tools/fdpp/serve.cpp
// starts it), and every HTTP connection has a thread of the pool.
//
// Lifecycle: start() listens at once (GET /health answers 503 "loading" while the model loads);
// attach() hands over the loaded model's scheduler; drain() refuses new requests (503), lets the
// scheduler finish what it holds and waits for every response to be written; stop() closes.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "engine/scheduler.h"
#include "server/api.h"
#include "server/metrics.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace fdpp::server {

struct Channel;  // a request's deltas and end, from the engine thread to its HTTP thread (.cpp)
class Delivery;  // moves them into the channels on a thread of its own (.cpp)

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;           // 0: any free port (port() tells which)
  std::string api_key;       // non-empty: /v1/* need "Authorization: Bearer <key>"
  // HTTP worker threads. A streamed response holds its thread until it ends, so this bounds the
  // requests in flight (more connections wait in the pool's queue, unanswered until one ends).
  int http_threads = 64;
  int retry_after_seconds = 1;  // Retry-After of 503 answers (queue full, loading, draining)
  ApiLimits limits;
  // CORS: origins whose pages may call the server ("*": any); empty: no CORS headers at all, and
  // OPTIONS is not answered (a browser then refuses cross-origin calls, the safe default).
  std::vector<std::string> allowed_origins;
  bool log_requests = true;  // a line per finished request on stderr
  // While requests run, a throughput line on stderr this often (vLLM's periodic stats); 0: never.
  double stats_interval_seconds = 10;
};

// Why an --allowed-origins entry is not an origin ("" when it is): "*" or scheme://host[:port],
// nothing after it (a browser's Origin header has no path and no trailing slash).
std::string origin_problem(const std::string& origin);

class HttpServer {
 public:
  explicit HttpServer(ServerOptions options);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds host:port (throws fdpp::Error naming them) and serves on a thread of its own.
  // on_listen_exit is called on that thread if the listening loop ends before stop().
  void start(std::function<void()> on_listen_exit = {});
  int port() const { return port_; }
  // The model is loaded: requests go to `scheduler` from now on.
  void attach(Scheduler& scheduler, ModelInfo model, PromptCodec codec);
  bool ready() const { return ready_.load(); }
  // SIGTERM: new requests get 503, the scheduler finishes the running and queued requests
  // (Scheduler::stop(drain = true); its run() returns), and this returns once every response has
  // been written (or its client has gone). The caller joins the engine thread, then calls stop().
  void drain();
  // Closes the listening socket and joins the HTTP threads.
  void stop();

  Metrics& metrics() { return metrics_; }

 private:
  enum class Phase { Loading, Ready, Draining };
  void route();
  void handle_generate(Endpoint endpoint, const httplib::Request& req, httplib::Response& res);
  // Submits one request whose deltas and end go to `ch`. Throws ApiError: 503 for a full queue or
  // a draining server, 400 for a request the scheduler can never run (`what` names it in a batch).
  // log_id: the request's name in its log line ("" for none).
  uint64_t submit(GenerationRequest request, const std::shared_ptr<Channel>& ch, const std::string& what,
                  std::string log_id);
  // Submits a response's requests (one, or a /v1/completions batch), each with a channel of its own
  // on one shared signal; unseeded requests get a fresh seed each. A batch runs whole or not at all:
  // when one is refused, those before it are cancelled and its ApiError is thrown.
  // n: choices per prompt (request i answers prompt i / n, named so in an error).
  void submit_all(std::vector<GenerationRequest> requests, bool seed_given, int n, const std::string& log_id,
                  std::vector<std::shared_ptr<Channel>>& channels, std::vector<uint64_t>& ids);
  // A response not streamed: waits for every request, then one body with a choice per request.
  // The caller has counted the HTTP request in flight.
  void reply_whole(const std::vector<std::shared_ptr<Channel>>& channels, const ResponseContext& ctx,
                   httplib::Response& res);
  void reply_error(httplib::Response& res, const ApiError& e);
  // The CORS headers of a response to `req` (none when CORS is off or the origin is not allowed);
  // true when the request came from an allowed origin.
  bool add_cors_headers(const httplib::Request& req, httplib::Response& res) const;
  void report_ignored(const std::string& what, const std::vector<std::string>& fields, httplib::Response& res);
  void stats_loop();
  uint64_t next_seed();
  void in_flight_done();

  ServerOptions options_;
  std::unique_ptr<httplib::Server> http_;
  std::thread listen_thread_;
  std::thread stats_thread_;
  std::mutex stats_mutex_;
  std::condition_variable stats_cv_;
  int port_ = 0;
  std::atomic<bool> ready_{false};
  std::atomic<bool> draining_{false};
  std::atomic<bool> stopping_{false};

  Scheduler* scheduler_ = nullptr;  // set once by attach(), before ready_
  ModelInfo model_;
  PromptCodec codec_;
  Metrics metrics_;
  std::unique_ptr<Delivery> delivery_;  // after metrics_, which it uses

  std::atomic<uint64_t> serial_;
  std::mutex seed_mutex_;
  std::mt19937_64 seed_rng_;

  // Generation requests between arrival and their last byte written: drain() waits for zero.
  std::mutex in_flight_mutex_;
  std::condition_variable in_flight_cv_;
  int64_t in_flight_ = 0;
};

}  // namespace fdpp::server
