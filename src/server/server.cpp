#include "server/server.h"

#include <sys/socket.h>

#include <csignal>
#include <ctime>
#include <random>

#include <fmt/format.h>
#include <httplib.h>

#include "server/metrics.h"
#include "server/peer_socket.h"
#include "press/param_file.h"
#include "press/ratio_use.h"
#include "tokenizer/chat_template.h"

namespace kvslim::server {

using nlohmann::json;

struct Server::Impl {
  std::optional<ChatTemplate> chat;
  std::atomic<uint64_t> next_id{1};
  std::mt19937_64 seeds{std::random_device{}()};
  std::mutex seed_mu;
  int64_t created = static_cast<int64_t>(std::time(nullptr));
  std::atomic<int> listen_fd{-1};
};

namespace {

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(dump(error_json(e)), "application/json");
}

int64_t now_s() { return static_cast<int64_t>(std::time(nullptr)); }

}  // namespace

Server::Server(const Model& model, ServerOptions opt) : model_(model), opt_(std::move(opt)), impl_(new Impl) {
  // A client that disconnects mid-stream must not kill the process with SIGPIPE.
  std::signal(SIGPIPE, SIG_IGN);
  if (opt_.model_name.empty()) opt_.model_name = "kvslim";
  make_press(opt_.press, opt_.compression_ratio);  // fails early, naming the press
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
  engine_ = std::make_unique<Engine>(model_, opt_.engine);
  http_ = std::make_unique<httplib::Server>();
  const int threads = opt_.http_threads > 0 ? opt_.http_threads : opt_.engine.parallel + opt_.engine.max_queue + 8;
  http_->new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  // httplib 0.11 listens with a backlog of 5 (fixed when Debian built it): a burst of clients
  // overflows it and some connections are reset. The listening socket is remembered here, where
  // httplib lets us set its options, and listened on again with the system's limit after bind().
  http_->set_socket_options([impl = impl_.get()](int fd) {
    int yes = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    impl->listen_fd = fd;
  });
  http_->set_payload_max_length(opt_.max_body);
  http_->set_read_timeout(30, 0);
  http_->set_write_timeout(30, 0);
  routes();
}

Server::~Server() {
  stop();
  engine_.reset();
}

int Server::bind() {
  int port = opt_.port == 0 ? http_->bind_to_any_port(opt_.host) : (http_->bind_to_port(opt_.host, opt_.port) ? opt_.port : -1);
  if (port <= 0) throw Error(fmt::format("cannot listen on {}:{} (address in use or not available)", opt_.host, opt_.port));
  if (impl_->listen_fd >= 0) ::listen(impl_->listen_fd, SOMAXCONN);
  return port;
}

void Server::run() { http_->listen_after_bind(); }

void Server::stop() {
  if (http_) http_->stop();
}

void Server::routes() {
  httplib::Server& s = *http_;

  s.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (opt_.api_key.empty() || req.path == "/health" || req.path == "/metrics") return httplib::Server::HandlerResponse::Unhandled;
    std::string auth = req.get_header_value("Authorization");
    if (auth != "Bearer " + opt_.api_key) {
      send_error(res, ApiError(401, "invalid or missing API key (send \"Authorization: Bearer KEY\")", "",
                               "authentication_error", "invalid_api_key"));
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });

  // httplib answers unknown routes, oversized bodies, ... itself with an empty body: give them
  // OpenAI's error shape.
  s.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    std::string msg;
    if (res.status == 404)
      msg = fmt::format("no such endpoint: {} {}", req.method, req.path);
    else if (res.status == 413)
      msg = fmt::format("the request body is larger than the server's limit of {} bytes (ServerOptions::max_body)", opt_.max_body);
    else
      msg = fmt::format("HTTP {} for {} {}", res.status, req.method, req.path);
    res.set_content(dump(error_json(ApiError(res.status, msg))), "application/json");
  });
  s.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    send_error(res, ApiError(500, fmt::format("internal error: {}", what), "", "server_error"));
  });

  s.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    EngineMetrics m = engine_->metrics();
    json j = {{"status", "ok"},
              {"slots_idle", m.parallel - m.active},
              {"slots_processing", m.active},
              {"requests_queued", m.queued}};
    res.set_content(dump(j), "application/json");
  });

  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(prometheus_text(engine_->metrics()), "text/plain; version=0.0.4");
  });

  s.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    const HParams& hp = model_.hparams();
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
                    {"weight_type", model_.weight_type()},
                    {"chat_template", impl_->chat ? impl_->chat->name() : std::string()}}}};
    res.set_content(dump(json{{"object", "list"}, {"data", json::array({model})}}), "application/json");
  });

  auto completion = [this](bool chat) {
    return [this, chat](const httplib::Request& req, httplib::Response& res) {
      try {
        serve_completion(req, res, chat);
      } catch (const ApiError& e) {
        send_error(res, e);
      }
    };
  };
  s.Post("/v1/completions", completion(false));
  s.Post("/v1/chat/completions", completion(true));
  s.Post("/completions", completion(false));
  s.Post("/chat/completions", completion(true));
}

void Server::serve_completion(const httplib::Request& http_req, httplib::Response& res, bool chat) {
  CompletionRequest r = parse_completion_request(http_req.body, chat);
  const Tokenizer& tok = model_.tokenizer();
  const HParams& hp = model_.hparams();
  auto job = std::make_shared<Job>();

  // Prompt -> tokens.
  const char* prompt_field = chat ? "messages" : "prompt";
  if (chat) {
    if (!impl_->chat) throw ApiError(400, chat_template_error_, "messages", "invalid_request_error", "no_chat_template");
    try {
      job->context = impl_->chat->tokenize(tok, r.messages);
    } catch (const Error& e) {
      throw ApiError(400, e.what(), "messages");
    }
  } else if (!r.prompt_tokens.empty()) {
    for (size_t i = 0; i < r.prompt_tokens.size(); ++i)
      if (r.prompt_tokens[i] < 0 || r.prompt_tokens[i] >= hp.n_vocab)
        throw ApiError(400, fmt::format("'prompt[{}]' is token {}, outside the vocabulary (0..{})", i, r.prompt_tokens[i],
                                        hp.n_vocab - 1),
                       "prompt");
    job->context = r.prompt_tokens;
  } else {
    job->context = tok.encode(r.prompt, tok.add_bos_default(), false);
  }
  if (!r.question.empty()) job->question = tok.encode(r.question, false, false);

  // Cache and press of this request (server defaults unless the request names its own).
  job->session = opt_.engine.session;
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
  job->reservation = engine_->estimate(*job);
  engine_->submit(job);  // 503 when full

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
    if (job->error) throw *job->error;
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
