// `kvslim serve`: the OpenAI-compatible server (see src/server/server.h). Flags follow
// llama-server's names where they overlap (--host, --port, -np/--parallel, -c, -n, --api-key,
// --chat-template, --alias, --timeout).
#include <csignal>
#include <filesystem>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <thread>

#include <fmt/format.h>

#include "cli/cache_options.h"
#include "cli/commands.h"
#include "cli/context_size.h"
#include "cli/memory_estimate.h"
#include "cli/options.h"
#include "server/server.h"
#include "kvslim/press.h"

namespace kvslim::cli {

namespace {

int g_signal_pipe[2] = {-1, -1};

void on_signal(int) {
  const char c = 1;
  [[maybe_unused]] ssize_t n = write(g_signal_pipe[1], &c, 1);
}

struct ServeArgs {
  std::string model;
  ModelLoadOptions load;  // --rope-* / --yarn-* over the file's RoPE settings
  std::string alias;
  server::ServerOptions opt;
  std::string kv_budget = "0";  // --kv-budget SIZE (as generate's), "0" = no limit
  std::string context_cache = "512MiB";  // --context-cache SIZE, "0" = none in memory
  int threads = 0;
  int ctx = 0;
  std::string cache_type_k = "f16", cache_type_v = "f16";
  KVQuantOptions kv_quant;
  float temp = 0.8f;
  int top_k = 40;
  float top_p = 0.95f;
  bool no_batch = false;
  ChatTemplateArgs chat_template;
  bool ratio_given = false;
  bool no_memory_check = false;
};

int run(ServeArgs& a) {
  check_ratio(a.opt.compression_ratio, "--compression-ratio");
  if (a.ratio_given) check_ratio_used(a.opt.press, a.opt.compression_ratio, "--compression-ratio");
  const size_t kv_budget = a.kv_budget == "0" ? 0 : parse_byte_size(a.kv_budget, "--kv-budget");
  apply_threads(a.threads);
  server::ServerOptions& o = a.opt;
  o.engine.kv_budget = kv_budget;
  o.context_cache_bytes = a.context_cache == "0" ? 0 : parse_byte_size(a.context_cache, "--context-cache");
  o.engine.batch_decode = !a.no_batch;
  o.engine.session.n_ctx = a.ctx;
  o.engine.session.key_codec = parse_codec(a.cache_type_k);
  o.engine.session.value_codec = parse_codec(a.cache_type_v);
  o.engine.session.kv_quant = a.kv_quant;
  o.sampling = {a.temp, a.top_k, a.top_p, 0};
  o.chat_template = a.chat_template.name;
  o.chat_template_file = a.chat_template.file;
  o.jinja = a.chat_template.jinja;
  o.model_name = a.alias.empty() ? std::filesystem::path(a.model).filename().string() : a.alias;
  const size_t available = available_memory();  // before the model takes its share

  // The listener starts before the model is loaded: a load balancer sees /health answer 503 until
  // the server can serve, instead of connections refused.
  std::unique_ptr<Model> model;  // declared first: it outlives the server
  server::Server srv(o);
  const int port = srv.bind();
  std::thread http([&] { srv.run(); });
  // SIGINT / SIGTERM: the handler only writes to a pipe (async-signal-safe) and a thread reading it
  // drains the server. A mask would not do: OpenBLAS starts its threads before main.
  if (pipe(g_signal_pipe) != 0) throw Error("cannot create the signal pipe");
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  std::atomic<bool> ready{false}, failed{false};
  std::thread waiter([&] {
    char c = 0;
    while (read(g_signal_pipe[0], &c, 1) < 0 && errno == EINTR) {
    }
    if (failed) return;
    if (!ready) {
      // A signal during the load: nothing to drain, and the load cannot be interrupted.
      fmt::print(stderr, "kvslim serve: stopped while loading the model\n");
      std::fflush(stderr);
      std::_Exit(0);
    }
    fmt::print(stderr, "kvslim serve: draining {} requests (at most {} s; /health answers 503)\n",
               srv.requests_in_flight(), o.drain_timeout_s);
    std::fflush(stderr);
    const int cut = srv.shutdown();
    if (cut > 0) fmt::print(stderr, "kvslim serve: {} requests still running at the drain timeout ended with 503\n", cut);
  });
  fmt::print(stderr, "kvslim serve: loading {}; listening at http://{}:{} (/health answers 503 until it is loaded)\n",
             a.model, o.host, port);
  std::fflush(stderr);
  try {
    // Tests of the start-up order stretch the load with this (milliseconds).
    if (const char* d = std::getenv("KVSLIM_TEST_LOAD_DELAY_MS"))
      std::this_thread::sleep_for(std::chrono::milliseconds(std::atoll(d)));
    model = Model::load(a.model, a.load);
    warn_context_size(*model, a.ctx);
    validate_cache_config(o.engine.session.key_codec, o.engine.session.value_codec, a.kv_quant,
                          model->hparams().head_dim);
    {
      // Every slot at its full context (as the press bounds it under chunked prefill), within --kv-budget.
      bool used = false;
      const std::unique_ptr<Press> press = make_press(o.press, o.compression_ratio, used);
      const size_t n_ctx = static_cast<size_t>(a.ctx > 0 ? a.ctx : model->hparams().n_ctx_train);
      // Refused only when one request at the full context cannot fit: slots fill as requests arrive.
      const size_t entries = kv_entries(press.get(), n_ctx, 0, o.engine.chunk_size, n_ctx);
      const KVCodec kc = o.engine.session.key_codec, vc = o.engine.session.value_codec;
      MemoryEstimate all = estimate_memory(*model, kc, vc, a.kv_quant, entries, o.engine.session.batch,
                                           static_cast<size_t>(o.engine.parallel));
      MemoryEstimate one = estimate_memory(*model, kc, vc, a.kv_quant, entries, o.engine.session.batch);
      if (o.engine.kv_budget) all.kv = std::min(all.kv, o.engine.kv_budget), one.kv = std::min(one.kv, o.engine.kv_budget);
      report_memory(all, one, available, !a.no_memory_check);
    }
    srv.set_model(*model);
    ready = true;
    fmt::print(stderr, "kvslim serve: {} on http://{}:{} ({} slots, KV budget {}, press {})\n", o.model_name, o.host,
               port, o.engine.parallel,
               o.engine.kv_budget ? fmt::format("{} bytes ({:.2f} MiB)", o.engine.kv_budget, o.engine.kv_budget / 1048576.0)
                                   : std::string("unlimited"), o.press);
    std::fflush(stderr);
    http.join();
    // run() returned: either a signal arrived (the waiter is draining) or listening failed.
    on_signal(0);  // wakes the waiter when run() returned for another reason
    waiter.join();
    fmt::print(stderr, "kvslim serve: stopped\n");
    std::fflush(stderr);
    return 0;
  } catch (...) {
    failed = true;
    srv.stop();
    on_signal(0);
    waiter.join();
    http.join();
    throw;
  }
}

}  // namespace

void add_serve(CLI::App& app, Action& action) {
  auto a = std::make_shared<ServeArgs>();
  server::ServerOptions& o = a->opt;
  auto* sub = app.add_subcommand("serve", "OpenAI-compatible HTTP server with per-request KV-cache compression");
  add_model_option(sub, a->model, a->load);
  sub->add_option("--alias", a->alias, "model name in /v1/models and responses (default: the file name)");
  sub->add_option("--host", o.host, "address to listen on")->capture_default_str();
  sub->add_option("--port", o.port, "port (0 = any free port, printed at start)")->capture_default_str()
      ->check(int_range(0, 65535));
  sub->add_option("--parallel", o.engine.parallel, "slots: requests processed at once (also -np, as llama-server)")->capture_default_str()
      ->check(int_range(1, 1024));
  sub->add_option("--queue", o.engine.max_queue, "requests that may wait for a slot; more get 503")
      ->capture_default_str()->check(int_range(0, 100000));
  sub->add_option("--kv-budget", a->kv_budget,
                  "KV cache bytes over all running requests, a SIZE as generate's --kv-budget (e.g. 512MiB, 2GiB; "
                  "a bare number is bytes; 0 = no limit); admission by measured bytes after compression")
      ->type_name("SIZE")
      ->capture_default_str();
  sub->add_option("--press", o.press, "default press spec (a request may name its own with \"press\")")
      ->capture_default_str();
  sub->add_option("--press-files-dir", o.press_files_dir,
                  "directory of press files (qfilter filters=, latent file=, ...) a request's \"press\" may name; "
                  "relative names are taken from it; without it requests name no press file")
      ->check(CLI::ExistingDirectory);
  auto* ratio_opt = sub->add_option("--compression-ratio", o.compression_ratio, "default compression ratio, in [0, 1)")
                        ->capture_default_str();
  sub->add_option("--chunk-size", o.engine.chunk_size,
                  "prefill chunk in tokens: the press acts after each, and running requests decode between chunks")
      ->capture_default_str()->check(int_range(1, 1 << 20));
  sub->add_option("-c,--ctx-size", a->ctx, "context size per request in tokens (0 = the model's)")
      ->capture_default_str()->check(int_at_least(0));
  sub->add_option("-n,--n-predict", o.n_predict, "default max_tokens (-1 = until end of generation or context)")
      ->capture_default_str()->check(int_range(-1, 1 << 30));
  add_threads_option(sub, a->threads);
  sub->add_option("--temp", a->temp, "default temperature; 0 = greedy")->capture_default_str()
      ->check(finite_range(0.0, 100.0));
  sub->add_option("--top-k", a->top_k, "default top-k (0 = off)")->capture_default_str()
      ->check(int_range(0, 1 << 30));
  sub->add_option("--top-p", a->top_p, "default top-p (1 = off)")->capture_default_str()
      ->check(finite_range(0.0, 1.0));
  sub->add_option("--api-key", o.api_key, "require \"Authorization: Bearer KEY\" on /v1/*");
  add_chat_template_options(sub, a->chat_template);
  sub->add_option("--timeout", o.timeout_s, "seconds a request may take from arrival to its last token")
      ->capture_default_str()->check(finite_range(1e-3, 1e9));
  sub->add_option("--max-body", o.max_body,
                  "request body limit in bytes; a larger Content-Length gets 413 at once, before the body is read")
      ->capture_default_str()->check(int_range(1, 1 << 30));
  sub->add_option("--header-timeout", o.header_timeout_s,
                  "seconds a request's header may take to arrive, from the connection's opening or the end of its "
                  "previous response (408 after it; an idle connection is closed); connections still sending hold "
                  "no HTTP worker")
      ->capture_default_str()->check(finite_range(1e-3, 3600));
  sub->add_option("--body-timeout", o.body_timeout_s, "seconds a request's body may take to arrive after its header (408 after it)")
      ->capture_default_str()->check(finite_range(1e-3, 3600));
  sub->add_option("--max-connections", o.max_connections,
                  "client connections held at once; one more closes the oldest still sending its header. The soft "
                  "open-file limit is raised to the hard one (at most 65536) and this is lowered to fit it")
      ->capture_default_str()->check(int_range(1, 1 << 20));
  sub->add_option("--drain-timeout", o.drain_timeout_s,
                  "on SIGTERM or SIGINT: stop accepting, answer /health with 503, and give running requests this "
                  "many seconds to finish (those left end with 503), then exit 0")
      ->capture_default_str()->check(finite_range(0, 1e6));
  sub->add_option("--max-prompt-tokens", o.max_prompt_tokens, "prompt limit in tokens (0 = the context size)")
      ->capture_default_str()->check(int_at_least(0));
  sub->add_flag("--no-batch", a->no_batch, "run each request's decode step on its own (for comparison)");
  sub->add_option("--context-cache", a->context_cache,
                  "memory for stored contexts (compressed prompts kept for reuse: the same context, multi-turn chat, "
                  "/v1/contexts), a SIZE as --kv-budget; least recently used first out, and emptied before a request "
                  "would wait for KV budget (0 = none kept in memory)")
      ->capture_default_str();
  sub->add_option("--context-dir", o.context_dir,
                  "directory of stored contexts shared by every replica on this machine (created when missing); "
                  "also where POST /v1/contexts/{id}/save and /v1/contexts/restore read and write files by name");
  sub->add_option("--context-store", o.context_store.url,
                  "Redis shared by every replica: redis://[:PASSWORD@]HOST:PORT[/DB]; a store down or slow is "
                  "logged and requests are answered as if uncached");
  sub->add_option("--context-prefix", o.context_store.prefix, "prefix of every Redis key the server uses")
      ->capture_default_str();
  sub->add_option("--context-ttl", o.context_store.ttl_s, "seconds a context stays in Redis after it is stored (0 = no expiry)")
      ->capture_default_str()->check(finite_range(0, 1e9));
  sub->add_option("--context-timeout", o.context_store.timeout_s, "Redis connect and command timeout, seconds")
      ->capture_default_str()->check(finite_range(0.001, 3600));
  add_cache_options(sub, a->cache_type_k, a->cache_type_v, a->kv_quant);
  add_memory_check_flag(sub, a->no_memory_check);
  sub->callback([a, &action, ratio_opt] {
    a->ratio_given = ratio_opt->count() > 0;
    action = [a] { return run(*a); };
  });
}

}  // namespace kvslim::cli
