#pragma once
// `kvslim serve`: an OpenAI-compatible HTTP server (cpp-httplib) over the Engine.
//   POST /v1/completions, POST /v1/chat/completions  (stream: server-sent events)
//   GET  /v1/models, GET /health, GET /metrics (Prometheus text)
// Every refused request gets a 4xx/5xx with OpenAI's error body naming the field; the server stays
// up. A streaming request whose client disconnects is cancelled at the engine's next step (the
// stream writes a keep-alive comment every second while it waits, so a closed socket is noticed
// even before the first token); a non-streaming one is cancelled when its socket shows the client
// closed it (checked every 200 ms, src/server/peer_socket.h). Both are bounded by --timeout.
#include <memory>
#include <string>

#include "kvslim/model.h"
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
  size_t max_body = 1 << 20;       ///< request body limit, bytes (413 beyond)
  int max_prompt_tokens = 0;       ///< prompt limit in tokens; 0: the context size
  double timeout_s = 600;          ///< per request, from arrival to the last token (503 beyond)
  std::string chat_template;       ///< family name; "" = chat_template_file, else the model's tokenizer.chat_template
  std::string chat_template_file;  ///< a Jinja template's file ("" = none)
  bool jinja = false;              ///< render a source template with the Jinja engine even when its family is known
  int http_threads = 0;            ///< 0: parallel + queue + 8 (each open request holds one)
};

class Server {
 public:
  /// `model` must outlive the server. Throws kvslim::Error for invalid options (unknown default
  /// press or chat template name).
  Server(const Model& model, ServerOptions opt);
  ~Server();
  /// Binds host:port; returns the port (useful with port 0). Throws kvslim::Error naming the
  /// address when it cannot bind.
  int bind();
  /// Serves until stop(). Call after bind().
  void run();
  /// Stops accepting and returns from run(); thread-safe.
  void stop();
  Engine& engine() { return *engine_; }

 private:
  void routes();
  void serve_completion(const httplib::Request& req, httplib::Response& res, bool chat);
  const Model& model_;
  ServerOptions opt_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<httplib::Server> http_;
  std::string chat_template_error_;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvslim::server
