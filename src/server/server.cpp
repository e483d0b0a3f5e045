#include "server/server.h"

#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <unistd.h>

#include <csignal>
#include <ctime>
#include <map>
#include <random>
#include <condition_variable>
#include <pthread.h>
#include <regex>
#include <system_error>
#include <set>

#include <fmt/format.h>
#include <httplib.h>

#include "server/connection_gate.h"
#include "server/context_cache.h"
#include "server/metrics.h"
#include "server/peer_socket.h"
#include "kvslim/press.h"
#include "tools/tools.h"

namespace kvslim::server {

using nlohmann::json;

// httplib's accept loop hands each accepted socket to process_and_close_socket() through its task
// queue; here the queue runs it at once on the accept thread and the override passes the socket to
// the gate, so no worker waits on a connection before its request is whole. Workers then run one
// request at a time through process_request().
class Server::Http : public httplib::Server {
 public:
  std::function<void(int)> on_accept;
  bool serve(httplib::Stream& strm, bool close_connection, bool& connection_closed) {
    return process_request(strm, close_connection, connection_closed, nullptr);
  }
  size_t keep_alive_max() const { return keep_alive_max_count_; }
  // Ends the accept loop (accept() fails on the shut socket and httplib closes it) without
  // stop(): stop() marks the server as shutting down, which ends every running stream.
  void stop_accepting() {
    const int fd = svr_sock_;
    if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
  }

 private:
  bool process_and_close_socket(int sock) override {
    on_accept(sock);
    return true;
  }
};

namespace {

class InlineQueue : public httplib::TaskQueue {
 public:
  void enqueue(std::function<void()> fn) override { fn(); }
  void shutdown() override {}
};

}  // namespace

struct Server::Impl {
  std::optional<ChatTemplate> chat;
  std::atomic<uint64_t> next_id{1};
  std::mt19937_64 seeds{std::random_device{}()};
  std::mutex seed_mu;
  int64_t created = static_cast<int64_t>(std::time(nullptr));
  std::atomic<int> listen_fd{-1};
  std::unique_ptr<httplib::ThreadPool> workers;
  std::unique_ptr<ConnectionGate> gate;
  std::atomic<int> in_workers{0};           // requests handed to a worker and not yet answered
  std::atomic<bool> run_done{false};        // run() has returned
  std::mutex fds_mu;
  std::set<int> worker_fds;                 // sockets a worker is answering on (cut at shutdown)
  std::mutex refused_mu;
  std::map<std::pair<int, std::string>, uint64_t> refused;  // (status, reason) -> requests
  std::atomic<bool> shut{false};
  std::unique_ptr<ContextCache> contexts;  // null: stored contexts are off
  std::vector<std::unique_ptr<ContextTier>> tiers;  // made with the options, handed to `contexts` with the model
  // A pool whose threads were never joined would end the process (std::thread's destructor).
  ~Impl() {
    if (workers) workers->shutdown();
  }
};

namespace {

/// The HTTP workers, with 1 MiB stacks: a worker parses, validates and tokenizes one request (no
/// recursion deeper than a few frames), and the default 8 MiB each would put 600 MiB of address
/// space behind the default 76 workers. The threads are tried first: httplib's pool, when a
/// thread cannot start half-way through its constructor, waits forever on those it started, so a
/// limit on the address space (ulimit -v) gets this error instead of a hang.
std::unique_ptr<httplib::ThreadPool> make_worker_pool(size_t n) {
  constexpr size_t kStack = 1u << 20;
  pthread_attr_t before, small;
  const bool have_default = pthread_getattr_default_np(&before) == 0;
  pthread_attr_init(&small);
  pthread_attr_setstacksize(&small, kStack);
  pthread_setattr_default_np(&small);
  auto restore = [&] {
    if (have_default) {
      pthread_setattr_default_np(&before);
      pthread_attr_destroy(&before);
    }
    pthread_attr_destroy(&small);
  };
  size_t started = 0;
  {
    std::mutex mu;
    std::condition_variable cv;
    bool go = false;
    std::vector<std::thread> probe;
    try {
      for (size_t i = 0; i < n; ++i)
        probe.emplace_back([&] {
          std::unique_lock<std::mutex> lk(mu);
          cv.wait(lk, [&] { return go; });
        });
    } catch (const std::system_error&) {
    }
    started = probe.size();
    {
      std::lock_guard<std::mutex> lk(mu);
      go = true;
    }
    cv.notify_all();
    for (auto& t : probe) t.join();
  }
  if (started < n) {
    restore();
    throw Error(fmt::format("cannot start {} HTTP worker threads ({} started: the process's address-space or thread "
                            "limit, ulimit -v / -u, is too low); lower --parallel or --queue (workers = parallel + "
                            "queue + 8)",
                            n, started));
  }
  auto pool = std::make_unique<httplib::ThreadPool>(n);
  restore();
  return pool;
}

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(dump(error_json(e)), "application/json");
}

int64_t now_s() { return static_cast<int64_t>(std::time(nullptr)); }

// Raises the soft open-file limit to the hard one (at most 65536); returns the soft limit.
size_t raise_open_file_limit() {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return 1024;
  const rlim_t want = rl.rlim_max == RLIM_INFINITY ? 65536 : std::min<rlim_t>(rl.rlim_max, 65536);
  if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want) {
    rlimit up = rl;
    up.rlim_cur = want;
    if (setrlimit(RLIMIT_NOFILE, &up) == 0) rl = up;
  }
  return rl.rlim_cur == RLIM_INFINITY ? 65536 : static_cast<size_t>(rl.rlim_cur);
}

// The metrics label of a refused request: the field at fault for a 4xx (indices dropped, so
// "messages[3].content" counts as "messages[].content"), the code for a 5xx.
std::string refusal_reason(int status, const std::string& param, const std::string& code) {
  static const std::regex index(R"(\[[0-9]+\])");
  if (status < 500 && !param.empty()) return std::regex_replace(param, index, "[]");
  if (!code.empty()) return code;
  switch (status) {
    case 400: return "request";
    case 404: return "endpoint";
    case 413: return "body_too_large";
    default: return "other";
  }
}

}  // namespace

Server::Server(ServerOptions opt) : opt_(std::move(opt)), impl_(new Impl) {
  // A client that disconnects mid-stream must not kill the process with SIGPIPE.
  std::signal(SIGPIPE, SIG_IGN);
  if (opt_.model_name.empty()) opt_.model_name = "kvslim";
  make_press(opt_.press, opt_.compression_ratio);  // fails early, naming the press
  // Stored-context tiers fail early too (a directory that cannot be written, a malformed URL).
  try {
    if (!opt_.context_dir.empty()) impl_->tiers.push_back(make_dir_tier(opt_.context_dir));
  } catch (const Error& e) {
    throw Error(fmt::format("ServerOptions::context_dir: {}", e.what()));
  }
  try {
    if (!opt_.context_store.url.empty()) impl_->tiers.push_back(make_redis_tier(opt_.context_store));
  } catch (const Error& e) {
    throw Error(fmt::format("ServerOptions::context_store: {}", e.what()));
  }
  if (!(opt_.header_timeout_s > 0) || !(opt_.body_timeout_s > 0) || !(opt_.drain_timeout_s >= 0))
    throw Error(fmt::format("ServerOptions: header_timeout_s {}, body_timeout_s {} must be positive and "
                            "drain_timeout_s {} not negative",
                            opt_.header_timeout_s, opt_.body_timeout_s, opt_.drain_timeout_s));
  // Each held connection is a descriptor; the model, the listener and the workers need a few more.
  const size_t files = raise_open_file_limit();
  const size_t fit = files > 128 ? files - 128 : 16;
  if (opt_.max_connections > fit) {
    fmt::print(stderr, "kvslim serve: --max-connections {} lowered to {} (open-file limit {})\n", opt_.max_connections,
               fit, files);
    opt_.max_connections = fit;
  }
  http_ = std::make_unique<Http>();
  const int threads = opt_.http_threads > 0 ? opt_.http_threads : opt_.engine.parallel + opt_.engine.max_queue + 8;
  impl_->workers = make_worker_pool(static_cast<size_t>(threads));
  GateOptions g;
  g.header_timeout_s = opt_.header_timeout_s;
  g.body_timeout_s = opt_.body_timeout_s;
  g.max_body = opt_.max_body;
  g.max_connections = std::max<size_t>(1, opt_.max_connections);
  impl_->gate = std::make_unique<ConnectionGate>(
      g,
      [this](std::unique_ptr<Connection> c) {
        ++impl_->in_workers;
        auto held = std::make_shared<std::unique_ptr<Connection>>(std::move(c));
        impl_->workers->enqueue([this, held] {
          std::unique_ptr<Connection> c = std::move(*held);
          const int fd = c->fd;
          {
            std::lock_guard<std::mutex> lk(impl_->fds_mu);
            impl_->worker_fds.insert(fd);
          }
          // The request is whole in the buffer (the gate refuses chunked bodies); reads past it
          // would be the client's next request, which a worker never waits for.
          ConnectionStream strm(*c, opt_.body_timeout_s, 30.0);
          const bool last = draining_ || static_cast<size_t>(c->served + 1) >= http_->keep_alive_max();
          bool closed = false;
          const bool ok = http_->serve(strm, last, closed);
          ++c->served;
          {
            std::lock_guard<std::mutex> lk(impl_->fds_mu);
            impl_->worker_fds.erase(fd);
          }
          if (ok && !closed && !last && !draining_) {
            impl_->gate->give_back(std::move(c));
          } else {
            ::shutdown(fd, SHUT_WR);
            ::close(fd);
          }
          --impl_->in_workers;
        });
      },
      [this](int status, const std::string& reason) { count_refusal(status, reason); });
  http_->on_accept = [gate = impl_->gate.get()](int fd) { gate->add(fd); };
  http_->new_task_queue = [] { return new InlineQueue; };
  // httplib 0.11 listens with a backlog of 5 (fixed when Debian built it): a burst of clients
  // overflows it and some connections are reset. The listening socket is remembered here, where
  // httplib lets us set its options, and listened on again with the system's limit after bind().
  http_->set_socket_options([impl = impl_.get()](int fd) {
    int yes = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    impl->listen_fd = fd;
  });
  http_->set_payload_max_length(opt_.max_body);
  http_->set_keep_alive_max_count(100);
  http_->set_read_timeout(30, 0);
  http_->set_write_timeout(30, 0);
  routes();
}

Server::Server(const Model& model, ServerOptions opt) : Server(std::move(opt)) { set_model(model); }

void Server::set_model(const Model& model) {
  if (ready_) throw Error("Server::set_model: the server already has a model");
  if (!opt_.chat_template.empty() || !opt_.chat_template_file.empty()) {
    impl_->chat = ChatTemplate::choose(model.file(), opt_.chat_template, opt_.chat_template_file, opt_.jinja);
  } else {
    try {
      // A model without a template gets ChatML, as llama-server gives it, with a warning.
      std::string warning;
      impl_->chat = ChatTemplate::from_gguf_or_chatml(model.file(), opt_.jinja, warning);
      if (!warning.empty()) fmt::print(stderr, "warning: {}\n", warning);
    } catch (const Error& e) {
      // /v1/chat/completions answers with it (400): the template is chosen when the server starts.
      const std::string how =
          "restart the server with --chat-template NAME (llama2, llama3, chatml, qwen2 or mistral) or "
          "--chat-template-file FILE, or send a formatted prompt to /v1/completions";
      chat_template_error_ =
          model.file().has("tokenizer.chat_template")
              ? fmt::format("{}; {}", e.what(), how)
              : fmt::format("{}: the model has no tokenizer.chat_template; {}", model.file().path(), how);
    }
  }
  ContextCache::Options co;
  co.memory_bytes = opt_.context_cache_bytes;
  co.tiers = std::move(impl_->tiers);
  if (co.memory_bytes > 0 || !co.tiers.empty()) impl_->contexts = std::make_unique<ContextCache>(model, std::move(co));
  engine_ = std::make_unique<Engine>(model, opt_.engine, impl_->contexts.get());
  model_ = &model;
  ready_.store(true, std::memory_order_release);
}

Server::~Server() {
  stop();
  if (engine_) engine_->shutdown();  // queued and running requests end with 503
  {
    // Workers still writing to a client that does not read are cut off.
    std::lock_guard<std::mutex> lk(impl_->fds_mu);
    for (int fd : impl_->worker_fds) ::shutdown(fd, SHUT_RDWR);
  }
  impl_->workers->shutdown();
  impl_->workers.reset();
  impl_->gate.reset();
  engine_.reset();
}

int Server::bind() {
  int port = opt_.port == 0 ? http_->bind_to_any_port(opt_.host) : (http_->bind_to_port(opt_.host, opt_.port) ? opt_.port : -1);
  if (port <= 0) throw Error(fmt::format("cannot listen on {}:{} (address in use or not available)", opt_.host, opt_.port));
  if (impl_->listen_fd >= 0) ::listen(impl_->listen_fd, SOMAXCONN);
  return port;
}

void Server::run() {
  http_->listen_after_bind();
  impl_->run_done = true;
}

void Server::stop() {
  if (!http_) return;
  // httplib's stop() does nothing until its accept loop has started, and the loop then runs for
  // ever: a model that fails to load at once was stopped before run() had begun, and the process
  // hung. Wait (boundedly) for the loop to start or for run() to have returned.
  const auto until = Clock::now() + std::chrono::seconds(5);
  while (!http_->is_running() && !impl_->run_done && Clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  http_->stop();
}

int Server::shutdown() {
  if (impl_->shut.exchange(true)) return 0;
  draining_ = true;
  http_->stop_accepting();
  impl_->gate->drain();
  const auto deadline = Clock::now() + std::chrono::microseconds(static_cast<int64_t>(opt_.drain_timeout_s * 1e6));
  // The gate counts partial requests on its next turn (at most a second away).
  while (!impl_->gate->drain_counted() && Clock::now() < deadline + std::chrono::seconds(2))
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  while (Clock::now() < deadline && (impl_->in_workers > 0 || impl_->gate->partial() > 0))
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const int cut = impl_->in_workers.load() + static_cast<int>(impl_->gate->partial());
  if (engine_) engine_->shutdown();
  // Workers answer their requests' 503 now; one writing to a client that does not read is cut.
  const auto grace = Clock::now() + std::chrono::seconds(2);
  while (impl_->in_workers > 0 && Clock::now() < grace) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  {
    std::lock_guard<std::mutex> lk(impl_->fds_mu);
    for (int fd : impl_->worker_fds) ::shutdown(fd, SHUT_RDWR);
  }
  return cut;
}

int Server::requests_in_flight() const { return impl_->in_workers.load(); }

void Server::count_refusal(int status, const std::string& reason) {
  std::lock_guard<std::mutex> lk(impl_->refused_mu);
  ++impl_->refused[{status, reason}];
}

void Server::routes() {
  httplib::Server& s = *http_;
  // Every request refused with an error is counted by status and field or cause (/metrics);
  // a request that fails after it was accepted is counted by the engine instead.
  auto refuse = [this](httplib::Response& res, const ApiError& e) {
    count_refusal(e.status, refusal_reason(e.status, e.param, e.code));
    send_error(res, e);
  };

  s.set_pre_routing_handler([this, refuse](const httplib::Request& req, httplib::Response& res) {
    if (req.path == "/health" || req.path == "/metrics") return httplib::Server::HandlerResponse::Unhandled;
    if (!ready_.load(std::memory_order_acquire)) {
      refuse(res, ApiError(503, "the model is still loading; /health answers 200 once it is loaded", "", "server_error",
                           "model_loading"));
      return httplib::Server::HandlerResponse::Handled;
    }
    if (opt_.api_key.empty()) return httplib::Server::HandlerResponse::Unhandled;
    std::string auth = req.get_header_value("Authorization");
    if (auth != "Bearer " + opt_.api_key) {
      refuse(res, ApiError(401, "invalid or missing API key (send \"Authorization: Bearer KEY\")", "",
                           "authentication_error", "invalid_api_key"));
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });

  // httplib answers unknown routes, malformed requests, ... itself with an empty body: give them
  // OpenAI's error shape. Refusals of ours are counted where they are sent (refuse()).
  s.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    count_refusal(res.status, refusal_reason(res.status, "", ""));
    std::string msg;
    if (res.status == 404)
      msg = fmt::format("no such endpoint: {} {}", req.method, req.path);
    else if (res.status == 413)
      msg = fmt::format("the request body is larger than the server's limit of {} bytes (ServerOptions::max_body)", opt_.max_body);
    else
      msg = fmt::format("HTTP {} for {} {}", res.status, req.method, req.path);
    res.set_content(dump(error_json(ApiError(res.status, msg))), "application/json");
  });
  s.set_exception_handler([refuse](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    refuse(res, ApiError(500, fmt::format("internal error: {}", what), "", "server_error", "internal_error"));
  });

  s.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    // A load balancer sends traffic only on 200: not before the model is loaded, nor once
    // shutdown() began.
    if (draining_ || !ready_.load(std::memory_order_acquire)) {
      res.status = 503;
      res.set_content(dump(json{{"status", draining_ ? "draining" : "loading"}}), "application/json");
      return;
    }
    EngineMetrics m = engine_->metrics();
    json j = {{"status", "ok"},
              {"slots_idle", m.parallel - m.active},
              {"slots_processing", m.active},
              {"requests_queued", m.queued}};
    res.set_content(dump(j), "application/json");
  });

  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    std::vector<Refusals> refused;
    {
      std::lock_guard<std::mutex> lk(impl_->refused_mu);
      for (const auto& [key, n] : impl_->refused) refused.push_back({key.first, key.second, n});
    }
    EngineMetrics m;
    if (ready_.load(std::memory_order_acquire)) m = engine_->metrics();
    std::optional<ContextCacheMetrics> cm;
    if (ready_.load(std::memory_order_acquire) && impl_->contexts) cm = impl_->contexts->metrics();
    res.set_content(prometheus_text(m, refused, cm ? &*cm : nullptr), "text/plain; version=0.0.4");
  });

  s.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    const HParams& hp = model_->hparams();
    const int n_ctx = opt_.engine.session.n_ctx > 0 ? opt_.engine.session.n_ctx : hp.n_ctx_train;
    json model = {{"id", opt_.model_name},
                  {"object", "model"},
                  {"created", impl_->created},
                  {"owned_by", "kvslim"},
                  {"meta",
                   {{"arch", hp.arch},
                    {"n_ctx", n_ctx},
                    {"n_ctx_train", hp.n_ctx_train},
                    {"n_layer", hp.n_layer},
                    {"n_head_kv", hp.n_head_kv},
                    {"weight_type", model_->weight_type()},
                    {"chat_template", impl_->chat ? impl_->chat->name() : std::string()}}}};
    res.set_content(dump(json{{"object", "list"}, {"data", json::array({model})}}), "application/json");
  });

  auto completion = [this, refuse](bool chat) {
    return [this, chat, refuse](const httplib::Request& req, httplib::Response& res) {
      try {
        serve_completion(req, res, chat);
      } catch (const ApiError& e) {
        refuse(res, e);
      }
    };
  };
  s.Post("/v1/completions", completion(false));
  s.Post("/v1/chat/completions", completion(true));
  s.Post("/completions", completion(false));
  s.Post("/chat/completions", completion(true));
  context_routes(refuse);
}

namespace {

json context_json(const std::string& id, const ContextInfo& i, const std::string& tier) {
  return json{{"id", id},
              {"object", "context"},
              {"tokens", i.context_tokens},
              {"kv_bytes", i.kv_bytes},
              {"full_f16_bytes", i.full_f16_bytes},
              {"memory_ratio", i.memory_ratio()},
              {"entries_kept", i.entries_kept},
              {"entries_total", i.entries_total},
              {"compression_ratio", i.compression_ratio()},
              {"press", i.press},
              {"cache_type", i.cache_type},
              {"chunk_size", i.chunk_size},
              {"tier", tier}};
}

/// A context's file name under --context-dir, as a request names it: one plain name, no path.
std::string context_file_name(const json& body) {
  if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object with \"filename\"", "");
  auto it = body.find("filename");
  if (it == body.end() || !it->is_string()) throw ApiError(400, "'filename' (a string) is required", "filename");
  const std::string name = it->get<std::string>();
  // Checked by hand: std::regex recurses per character, and a 1 MB name would take the stack.
  bool ok = !name.empty() && name.size() <= 128 && std::isalnum(static_cast<unsigned char>(name[0]));
  for (char c : name) ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-');
  if (!ok)
    throw ApiError(400,
                   fmt::format("'filename' '{}' must be a plain file name (letters, digits, '.', '_', '-'; no path)",
                               printable(name.substr(0, 200))),
                   "filename");
  return name;
}

}  // namespace

void Server::context_routes(const std::function<void(httplib::Response&, const ApiError&)>& refuse) {
  httplib::Server& s = *http_;
  auto contexts = [this]() -> ContextCache& {
    if (!impl_->contexts)
      throw ApiError(400, "stored contexts are off on this server (--context-cache 0 and no --context-dir or --context-store)");
    return *impl_->contexts;
  };
  auto handle = [refuse](auto fn) {
    return [refuse, fn](const httplib::Request& req, httplib::Response& res) {
      try {
        fn(req, res);
      } catch (const ApiError& e) {
        refuse(res, e);
      }
    };
  };

  s.Post("/v1/contexts", handle([this, contexts](const httplib::Request& req, httplib::Response& res) {
    ContextCache& cc = contexts();
    const json body = json::parse(req.body, nullptr, false);
    const bool chat = body.is_object() && body.contains("messages");
    CompletionRequest r = parse_completion_request(req.body, chat, model_->hparams().n_vocab);
    if (r.context_id) throw ApiError(400, "'context_id' names a stored context; POST /v1/contexts makes one", "context_id");
    if (!r.question.empty())
      throw ApiError(400,
                     "'question' is not part of a stored context: send it with each completion that uses the context",
                     "question");
    r.max_tokens = 0;
    std::shared_ptr<Job> job = make_job(r);
    const std::string why = job->press->storage_refusal();
    if (!why.empty())
      throw ApiError(400, fmt::format("press {} cannot be stored as a context: {}", job->press->describe(), why), "press");
    const std::string spec = cc.spec(
        job->press->describe(),
        describe_cache_config(job->session.key_codec, job->session.value_codec, job->session.kv_quant), opt_.engine.chunk_size);
    const std::string id = ContextCache::key(spec, job->context, job->context.size());
    std::optional<ContextCache::Found> f = cc.find(id);
    if (!f) {
      ContextCache::Flight fl = cc.join(id, job->deadline);
      f = fl.found;
      if (!f && !fl.leader)
        throw ApiError(503, "another request building this context failed or timed out; try again", "", "server_error",
                       "context_build_failed");
      if (!f) {
        job->store_id = id;
        submit(job);
        std::unique_lock<std::mutex> lk(job->mu);
        job->cv.wait(lk, [&] { return job->done; });
        if (job->error) throw *job->error;
        if (!job->built) throw ApiError(500, "the context was not built", "", "server_error");
        f = ContextCache::Found{id, *job->built, "built"};
      }
    }
    res.set_content(dump(context_json(id, f->context.info(), f->tier)), "application/json");
  }));

  s.Get("/v1/contexts", handle([contexts](const httplib::Request&, httplib::Response& res) {
    json data = json::array();
    for (const auto& [id, info] : contexts().list()) data.push_back(context_json(id, info, "memory"));
    res.set_content(dump(json{{"object", "list"}, {"data", data}}), "application/json");
  }));

  s.Post("/v1/contexts/restore", handle([this, contexts](const httplib::Request& req, httplib::Response& res) {
    ContextCache& cc = contexts();
    if (opt_.context_dir.empty()) throw ApiError(400, "restoring a context by name needs the server's --context-dir", "filename");
    const std::string name = context_file_name(json::parse(req.body, nullptr, false));
    const std::string path = opt_.context_dir + "/" + name;
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode))
      throw ApiError(404, fmt::format("no context file '{}' in the server's context directory", name), "filename",
                     "invalid_request_error", "context_not_found");
    std::optional<Context> c;
    try {
      c = Context::load(*model_, path);
    } catch (const Error& e) {
      throw ApiError(400, e.what(), "filename");
    }
    const ContextInfo info = c->info();
    const std::string id =
        ContextCache::key(cc.spec(info.press, info.cache_type, info.chunk_size), c->tokens(), c->tokens().size());
    cc.put(id, *c);
    res.set_content(dump(context_json(id, info, "file")), "application/json");
  }));

  const std::string id_re = "/v1/contexts/([0-9a-f]{16}-[0-9]{1,10}-[0-9a-f]{16})";
  s.Get(id_re, handle([contexts](const httplib::Request& req, httplib::Response& res) {
    const std::string id = req.matches[1];
    std::optional<ContextCache::Found> f = contexts().find(id);
    if (!f) throw ApiError(404, fmt::format("no stored context '{}'", id), "", "invalid_request_error", "context_not_found");
    res.set_content(dump(context_json(id, f->context.info(), f->tier)), "application/json");
  }));
  s.Delete(id_re, handle([contexts](const httplib::Request& req, httplib::Response& res) {
    const std::string id = req.matches[1];
    if (!contexts().erase(id))
      throw ApiError(404, fmt::format("no stored context '{}'", id), "", "invalid_request_error", "context_not_found");
    res.set_content(dump(json{{"id", id}, {"object", "context"}, {"deleted", true}}), "application/json");
  }));
  s.Post(id_re + "/save", handle([this, contexts](const httplib::Request& req, httplib::Response& res) {
    const std::string id = req.matches[1];
    if (opt_.context_dir.empty()) throw ApiError(400, "saving a context by name needs the server's --context-dir", "filename");
    const std::string name = context_file_name(json::parse(req.body, nullptr, false));
    std::optional<ContextCache::Found> f = contexts().find(id);
    if (!f) throw ApiError(404, fmt::format("no stored context '{}'", id), "", "invalid_request_error", "context_not_found");
    try {
      f->context.save(opt_.context_dir + "/" + name);
    } catch (const Error& e) {
      throw ApiError(500, e.what(), "", "server_error", "context_save_failed");
    }
    res.set_content(dump(json{{"id", id}, {"filename", name}, {"bytes", f->context.info().file_bytes}}),
                    "application/json");
  }));
}

std::shared_ptr<Job> Server::make_job(const CompletionRequest& r) {
  const bool chat = r.chat;
  const Tokenizer& tok = model_->tokenizer();
  const HParams& hp = model_->hparams();
  auto job = std::make_shared<Job>();

  // Prompt -> tokens.
  if (chat) {
    if (!impl_->chat) throw ApiError(400, chat_template_error_, "messages", "invalid_request_error", "no_chat_template");
    try {
      job->context = impl_->chat->tokenize(tok, r.messages);
    } catch (const Error& e) {
      throw ApiError(400, e.what(), "messages");
    }
  } else if (!r.prompt_tokens.empty()) {
    job->context = r.prompt_tokens;  // each checked against the vocabulary by the parser
  } else if (!r.prompt.empty()) {
    // After a stored context the prompt continues it: no BOS.
    job->context = tok.encode(r.prompt, tok.add_bos_default() && !r.context_id, false);
  }
  if (r.context_id && chat && !job->context.empty() && job->context[0] == tok.bos()) job->context.erase(job->context.begin());
  if (!r.question.empty()) job->question = tok.encode(r.question, false, false);
  if (r.context_id) {
    // The context is the stored one; what the request sends continues it, uncompressed.
    if (!impl_->contexts)
      throw ApiError(400, "stored contexts are off on this server (--context-cache 0 and no --context-dir or --context-store)",
                     "context_id");
    for (const auto& [set, name] : {std::pair{bool(r.press), "press"}, std::pair{bool(r.compression_ratio), "compression_ratio"},
                                    std::pair{bool(r.cache_type_k), "cache_type_k"}, std::pair{bool(r.cache_type_v), "cache_type_v"}})
      if (set)
        throw ApiError(400,
                       fmt::format("'{}' does not apply with 'context_id': the stored context was compressed with its own "
                                   "press and cache types",
                                   name),
                       name);
    std::optional<ContextCache::Found> f = impl_->contexts->find(*r.context_id);
    if (!f)
      throw ApiError(404, fmt::format("no stored context '{}' (POST /v1/contexts makes one)", printable(*r.context_id)),
                     "context_id", "invalid_request_error", "context_not_found");
    std::vector<Token> rest = std::move(job->context);
    rest.insert(rest.end(), job->question.begin(), job->question.end());
    job->context = f->context.tokens();
    job->question = std::move(rest);
    job->cached = f->context;
  }

  // Cache and press of this request (server defaults unless the request names its own).
  job->session = opt_.engine.session;
  if (job->cached) return finish_job(r, job);
  try {
    if (r.cache_type_k) job->session.key_codec = parse_codec(*r.cache_type_k);
  } catch (const Error& e) {
    throw ApiError(400, fmt::format("'cache_type_k': {}", e.what()), "cache_type_k");
  }
  try {
    if (r.cache_type_v) job->session.value_codec = parse_codec(*r.cache_type_v);
  } catch (const Error& e) {
    throw ApiError(400, fmt::format("'cache_type_v': {}", e.what()), "cache_type_v");
  }
  try {
    validate_cache_config(job->session.key_codec, job->session.value_codec, job->session.kv_quant, hp.head_dim);
  } catch (const Error& e) {
    throw ApiError(400, e.what(), r.cache_type_k ? "cache_type_k" : "cache_type_v");
  }
  // A ratio with no press to apply it would be ignored (the CLI refuses --compression-ratio without --press).
  // An explicit "press": "none" with a ratio stays accepted (clients sweep presses with one ratio).
  if (r.compression_ratio && !r.press && opt_.press == "none")
    throw ApiError(400,
                   fmt::format("'compression_ratio' {} needs a press: add \"press\" (see `kvslim presses`); the server's "
                               "default press is none, so nothing would be removed",
                               *r.compression_ratio),
                   "compression_ratio");
  const std::string spec = r.press.value_or(opt_.press);
  const double ratio = r.compression_ratio.value_or(opt_.compression_ratio);
  bool ratio_used = false;
  try {
    // A request's own spec may name press files only under --press-files-dir; the operator's
    // default press (--press) is not confined.
    std::optional<PressFileConfinement> confine;
    if (r.press) confine.emplace(opt_.press_files_dir, "--press-files-dir");
    job->press = make_press(spec, ratio, ratio_used);
  } catch (const Error& e) {
    throw ApiError(400, fmt::format("'press': {}", e.what()), "press");
  }
  // "press": "none" with a ratio stays accepted (clients sweep presses with one ratio, none first).
  if (r.compression_ratio && *r.compression_ratio > 0.0 && !ratio_used && spec != "none")
    throw ApiError(400,
                   fmt::format("'compression_ratio' {}: press '{}' does not keep its entries by a compression ratio, "
                               "so it would be ignored; drop it, or set the press's own parameters in \"press\"",
                               *r.compression_ratio, printable(spec)),
                   "compression_ratio");

  return finish_job(r, job);
}

std::shared_ptr<Job> Server::finish_job(const CompletionRequest& r, std::shared_ptr<Job> job) {
  const HParams& hp = model_->hparams();
  const char* prompt_field = r.chat ? "messages" : "prompt";
  // Limits.
  const int n_ctx = job->session.n_ctx > 0 ? job->session.n_ctx : hp.n_ctx_train;
  const size_t n_prompt = job->context.size() + job->question.size();
  const size_t prompt_limit = opt_.max_prompt_tokens > 0 ? std::min<size_t>(opt_.max_prompt_tokens, n_ctx) : n_ctx;
  if (n_prompt > prompt_limit)
    throw ApiError(400,
                   fmt::format("the prompt is {} tokens; the server takes at most {} (context size {})", n_prompt,
                               prompt_limit, n_ctx),
                   prompt_field, "invalid_request_error", "context_length_exceeded");
  job->max_tokens = r.max_tokens >= 0 ? r.max_tokens : opt_.n_predict;
  if (job->max_tokens >= 0 && n_prompt + job->max_tokens > static_cast<size_t>(n_ctx))
    throw ApiError(400,
                   fmt::format("the context size is {} tokens, but the prompt ({}) plus max_tokens ({}) need {}", n_ctx,
                               n_prompt, job->max_tokens, n_prompt + job->max_tokens),
                   "max_tokens", "invalid_request_error", "context_length_exceeded");
  job->sampling = opt_.sampling;
  if (r.temperature) job->sampling.temp = *r.temperature;
  if (r.top_p) job->sampling.top_p = *r.top_p;
  if (r.top_k) job->sampling.top_k = *r.top_k;
  if (r.seed) {
    job->sampling.seed = *r.seed;
  } else {
    std::lock_guard<std::mutex> lk(impl_->seed_mu);
    job->sampling.seed = impl_->seeds();
  }
  job->stop = r.stop;
  job->deadline = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(opt_.timeout_s * 1000));
  return job;
}

void Server::attach_context(const CompletionRequest& r, Job& job) {
  ContextCache* cc = impl_->contexts.get();
  if (!cc || job.cached || !r.cache_prompt || !job.press->storage_refusal().empty()) return;
  const std::string press = job.press->describe();
  const std::string cache = describe_cache_config(job.session.key_codec, job.session.value_codec, job.session.kv_quant);
  const std::string spec = cc->spec(press, cache, opt_.engine.chunk_size);
  auto take = [&](const Context& c) {
    // The stored tokens are a prefix of the prompt: what follows them is appended uncompressed.
    std::vector<Token> full = std::move(job.context);
    full.insert(full.end(), job.question.begin(), job.question.end());
    const size_t n = c.tokens().size();
    job.question.assign(full.begin() + static_cast<std::ptrdiff_t>(n), full.end());
    job.context = c.tokens();
    job.cached = c;
  };
  if (r.chat) {
    // A conversation is continued where its last reply ended: the new turn is appended
    // uncompressed, as the turns after the first always are. Conversations are kept apart from
    // plain contexts, so a prompt that merely extends a stored context is not split there.
    job.conversation_spec = cc->spec(press + " (conversation)", cache, opt_.engine.chunk_size);
    std::vector<Token> full = job.context;
    full.insert(full.end(), job.question.begin(), job.question.end());
    if (std::optional<ContextCache::Found> f = cc->find_prefix(job.conversation_spec, full, full.size()))
      return take(f->context);
  }
  // Otherwise only the request's own context is reused, so the press compresses what it was asked
  // to: the answer is the uncached run's.
  const std::string id = ContextCache::key(spec, job.context, job.context.size());
  if (std::optional<ContextCache::Found> f = cc->find(id)) return take(f->context);
  ContextCache::Flight fl = cc->join(id, job.deadline);
  if (fl.found) return take(fl.found->context);
  if (fl.leader) job.store_id = id;
}

void Server::submit(const std::shared_ptr<Job>& job) {
  try {
    job->reservation = engine_->estimate(*job);
    engine_->submit(job);  // 503 when full
  } catch (...) {
    // Requests waiting for this job's context build it themselves.
    if (!job->store_id.empty()) impl_->contexts->complete(job->store_id, std::nullopt);
    throw;
  }
}

void Server::serve_completion(const httplib::Request& http_req, httplib::Response& res, bool chat) {
  CompletionRequest r = parse_completion_request(http_req.body, chat, model_->hparams().n_vocab);
  std::shared_ptr<Job> job = make_job(r);
  attach_context(r, *job);
  submit(job);

  const std::string id = fmt::format("{}-{}", chat ? "chatcmpl" : "cmpl", impl_->next_id++);
  const int64_t created = now_s();
  const std::string model_name = opt_.model_name;

  if (!r.stream) {
    // Nothing reaches the client before the response, so its going away is noticed on the socket,
    // looked up once the request has run for a second (most finish sooner; the lookup is a scan).
    int fd = -1;
    bool looked_up = false;
    const auto start = Clock::now();
    std::unique_lock<std::mutex> lk(job->mu);
    while (!job->cv.wait_for(lk, std::chrono::milliseconds(200), [&] { return job->done; })) {
      if (!looked_up && Clock::now() - start >= std::chrono::seconds(1)) {
        looked_up = true;
        fd = find_connection_fd(http_req.local_addr, http_req.local_port, http_req.remote_addr, http_req.remote_port);
      }
      if (!job->cancelled && peer_closed(fd)) {
        job->cancelled = true;
        engine_->notify();
      }
    }
    if (job->error) {
      send_error(res, *job->error);  // a failure after acceptance: counted by the engine
      return;
    }
    json choice = {{"index", 0}, {"finish_reason", job->finish_reason}};
    if (chat)
      choice["message"] = {{"role", "assistant"}, {"content", job->text}};
    else
      choice["text"] = job->text, choice["logprobs"] = nullptr;
    json out = {{"id", id},
                {"object", chat ? "chat.completion" : "text_completion"},
                {"created", created},
                {"model", model_name},
                {"choices", json::array({choice})},
                {"usage", usage_json(job->usage)}};
    res.set_content(dump(out), "application/json");
    return;
  }

  // Server-sent events: one chunk per piece of text that can be sent (never half a stop string
  // or half a UTF-8 character), a last chunk with the finish reason, optionally one with usage,
  // then [DONE].
  struct StreamState {
    size_t sent = 0;
    bool role_sent = false;
    Clock::time_point last_write = Clock::now();
  };
  auto st = std::make_shared<StreamState>();
  const bool include_usage = r.include_usage;
  Engine* engine = engine_.get();
  auto chunk = [=](const json& delta_or_text, const json& finish) {
    json choice = {{"index", 0}, {"finish_reason", finish}};
    if (chat)
      choice["delta"] = delta_or_text;
    else
      choice["text"] = delta_or_text, choice["logprobs"] = nullptr;
    return json{{"id", id},
                {"object", chat ? "chat.completion.chunk" : "text_completion"},
                {"created", created},
                {"model", model_name},
                {"choices", json::array({choice})}};
  };
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");  // nginx: pass events on at once
  res.set_chunked_content_provider(
      "text/event-stream",
      [job, st, chunk, chat, include_usage, engine, id, created, model_name](size_t, httplib::DataSink& sink) {
        auto write = [&](const std::string& s) {
          if (!sink.write(s.data(), s.size())) {
            job->cancelled = true;
            engine->notify();
            return false;
          }
          st->last_write = Clock::now();
          return true;
        };
        auto event = [&](const json& j) { return write("data: " + dump(j) + "\n\n"); };
        std::unique_lock<std::mutex> lk(job->mu);
        job->cv.wait_for(lk, std::chrono::milliseconds(250), [&] { return job->done || job->text.size() > st->sent; });
        const bool done = job->done;
        const std::string text = job->text;
        const std::optional<ApiError> error = job->error;
        const std::string finish = job->finish_reason;
        const Usage usage = job->usage;
        const std::vector<std::string> stops = job->stop;
        lk.unlock();
        if (chat && !st->role_sent && !error) {
          if (!event(chunk(json{{"role", "assistant"}, {"content", ""}}, nullptr))) return false;
          st->role_sent = true;
        }
        const size_t upto = done ? text.size() : find_stop(text, stops).safe;
        if (upto > st->sent) {
          std::string piece = text.substr(st->sent, upto - st->sent);
          st->sent = upto;
          if (!event(chunk(chat ? json{{"content", piece}} : json(piece), nullptr))) return false;
        }
        if (!done) {
          // An SSE comment now and then: a closed connection fails this write, cancelling the job.
          if (Clock::now() - st->last_write > std::chrono::seconds(1) && !write(": keep-alive\n\n")) return false;
          return true;
        }
        if (error) {
          if (!event(error_json(*error))) return false;
        } else {
          if (!event(chunk(chat ? json::object() : json(""), finish))) return false;
          if (include_usage) {
            json u = {{"id", id},
                      {"object", chat ? "chat.completion.chunk" : "text_completion"},
                      {"created", created},
                      {"model", model_name},
                      {"choices", json::array()},
                      {"usage", usage_json(usage)}};
            if (!event(u)) return false;
          }
        }
        if (!write("data: [DONE]\n\n")) return false;
        sink.done();
        return true;
      },
      [job, engine](bool) {
        // Connection closed or aborted before the end: the engine drops the request.
        bool done;
        {
          std::lock_guard<std::mutex> lk(job->mu);
          done = job->done;
        }
        if (!done) {
          job->cancelled = true;
          engine->notify();
        }
      });
}

}  // namespace kvslim::server
