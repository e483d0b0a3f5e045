#pragma once
// `kvslim serve`: an OpenAI-compatible HTTP server (cpp-httplib) over the Engine.
//   POST /v1/completions, POST /v1/chat/completions  (stream: server-sent events)
//   GET  /v1/models, GET /health, GET /metrics (Prometheus text)
// Every refused request gets a 4xx/5xx with OpenAI's error body naming the field; the server stays
// up. A streaming request whose client disconnects is cancelled at the engine's next step (the
// stream writes a keep-alive comment every second while it waits, so a closed socket is noticed
// even before the first token); a non-streaming one is cancelled when its socket shows the client
// closed it (checked every 200 ms, src/server/peer_socket.h). Both are bounded by --timeout.
//
// Connections: a gate thread holds idle connections and requests still being sent, with short
// header and body deadlines (src/server/connection_gate.h); the HTTP worker threads only see
// whole requests, so slow or half-sent requests cannot take them all.
//
// Life cycle, as a load balancer expects: the listener starts before the model is loaded and
// /health answers 503 {"status": "loading"} until set_model(); shutdown() stops accepting,
// answers /health with 503 {"status": "draining"}, lets running requests finish for a bounded
// time, then ends the rest with 503.
#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "kvslim/model.h"
#include "server/context_tier.h"
#include "server/engine.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}

namespace kvslim::server {

/// Server settings (`kvslim serve` flags; names follow llama-server's where they overlap).
struct ServerOptions {
  EngineOptions engine;
  std::string host = "127.0.0.1";
  int port = 8080;                 ///< 0: any free port (bind() returns it)
  std::string api_key;             ///< non-empty: /v1/* need "Authorization: Bearer KEY"
  std::string model_name;          ///< id in /v1/models and responses
  std::string press = "none";      ///< default press spec for requests that name none
  /// Press files (qfilter filters=, latent file=, ...) a request's "press" may name must lie in
  /// this directory (relative paths are taken from it); "" = requests may name none.
  std::string press_files_dir;
  double compression_ratio = 0.0;  ///< default ratio (fills the press's unset ratios)
  SamplingParams sampling;         ///< default temperature / top-k / top-p
  int n_predict = -1;              ///< default max_tokens (-1: until end of generation or context)
  size_t max_body = 1 << 20;       ///< request body limit, bytes (413 from the Content-Length, before the body is read)
  double header_timeout_s = 5;     ///< a request's header must arrive within this of the connection's opening or previous response
  double body_timeout_s = 30;      ///< a request's body must arrive within this of its header
  size_t max_connections = 4096;   ///< connections held at once (lowered to fit the open-file limit)
  double drain_timeout_s = 20;     ///< shutdown(): how long running requests may take to finish
  int max_prompt_tokens = 0;       ///< prompt limit in tokens; 0: the context size
  double timeout_s = 600;          ///< per request, from arrival to the last token (503 beyond)
  std::string chat_template;       ///< family name; "" = chat_template_file, else the model's tokenizer.chat_template
  std::string chat_template_file;  ///< a Jinja template's file ("" = none)
  bool jinja = false;              ///< render a source template with the Jinja engine even when its family is known
  int http_threads = 0;            ///< 0: parallel + queue + 8 (each open request holds one)
  // Stored contexts (server/context_cache.h).
  size_t context_cache_bytes = 512u << 20;  ///< memory tier's limit (--context-cache); 0 = none in memory
  std::string context_dir;                 ///< --context-dir: directory tier, and where contexts are saved by name
  RedisTierOptions context_store;          ///< --context-store: Redis tier (url "" = none)
};

class Server {
 public:
  /// A server with no model yet: after bind() and run() it answers /health and /v1/* with 503
  /// ("loading") until set_model(). Throws kvslim::Error for invalid options (unknown default
  /// press). Raises the process's soft open-file limit to its hard limit (at most 65536) so that
  /// max_connections fit, and lowers max_connections when the limit is lower.
  explicit Server(ServerOptions opt);
  /// Server(opt) then set_model(model).
  Server(const Model& model, ServerOptions opt);
  ~Server();
  /// Loads what needs the model (chat template, engine) and starts serving requests. `model`
  /// must outlive the server. Throws kvslim::Error for an unknown chat template name.
  void set_model(const Model& model);
  /// Binds host:port; returns the port (useful with port 0). Throws kvslim::Error naming the
  /// address when it cannot bind.
  int bind();
  /// Serves until stop() or shutdown(). Call after bind().
  void run();
  /// Stops accepting and returns from run(); thread-safe. Running requests are not waited for.
  void stop();
  /// Stops accepting (run() returns), then waits up to `drain_timeout_s` for the requests
  /// already received to finish; those still running after it end with 503. Returns the
  /// number of requests cut off that way. Thread-safe; call once.
  int shutdown();
  /// Requests received and not yet answered (in a worker or waiting for one); thread-safe.
  int requests_in_flight() const;
  Engine& engine() { return *engine_; }

 private:
  class Http;
  void routes();
  void serve_completion(const httplib::Request& req, httplib::Response& res, bool chat);
  /// A job from a parsed request: prompt tokens, cache codecs, press, limits, sampling, deadline.
  /// Throws ApiError naming the field at fault.
  std::shared_ptr<Job> make_job(const CompletionRequest& r);
  /// make_job's second half: limits, sampling, deadline.
  std::shared_ptr<Job> finish_job(const CompletionRequest& r, std::shared_ptr<Job> job);
  /// Reserves the job's KV bytes and queues it (ApiError 503 when full); on failure ends the
  /// single flight the job leads.
  void submit(const std::shared_ptr<Job>& job);
  /// Stored-context lookup for an accepted job: its context stored, its conversation continued, or
  /// leading the build of its context.
  void attach_context(const CompletionRequest& r, Job& job);
  /// POST/GET/DELETE /v1/contexts..., save and restore by name.
  void context_routes(const std::function<void(httplib::Response&, const ApiError&)>& refuse);
  void count_refusal(int status, const std::string& reason);
  const Model* model_ = nullptr;
  ServerOptions opt_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<Http> http_;
  std::string chat_template_error_;
  std::atomic<bool> ready_{false}, draining_{false};
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvslim::server
