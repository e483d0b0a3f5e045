#pragma once
// The serving engine: N slots sharing one model's weights, a bounded FIFO queue, and a KV memory
// budget across requests. One engine thread does all model work (the kernels' thread pool serves
// one caller at a time); each loop it admits queued requests, runs one prefill chunk of one request
// (so running requests keep streaming while a long prompt is read), then one decode step for every
// decoding request.
//
// Budget: a request is admitted when the bytes it reserves fit beside those reserved by the running
// requests. Before its prefill a request reserves the bytes of its cache at the largest size it can
// reach (kept context + one chunk + question + max tokens, at its press's nominal ratio, measured on
// a scratch segment with its codecs); once its context is compressed the reservation becomes the
// cache's measured bytes plus room for the tokens it may still generate. Nothing is ever evicted
// from a running request's cache to make room.
//
// Stored contexts: a request answering from one reads the context's entries in place (shared,
// read-only: KVCache::share) and reserves only its own part (its tail, the question and the answer,
// anything it had to copy). The shared parts count once against the budget, however many requests
// read them and whether the memory tier still holds their context or not (a context evicted while
// requests read it stays in memory until the last of them ends): a request is admitted when its
// reservation, the running requests' and the distinct shared parts they and it read fit the budget;
// the memory tier is then emptied down to what is left (ContextCache::shrink_to).
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "kvslim/context.h"
#include "kvslim/request.h"
#include "kvslim/sampling.h"
#include "server/api.h"
#include "tools/tools.h"

namespace kvslim::server {

class ContextCache;

using Clock = std::chrono::steady_clock;

/// Engine settings (the `kvslim serve` flags).
struct EngineOptions {
  int parallel = 4;            ///< slots: requests prefilling or decoding at once
  size_t kv_budget = 0;        ///< bytes of KV cache over all running requests; 0 = no limit
  int max_queue = 64;          ///< requests waiting for a slot; one more gets 503
  int chunk_size = 256;        ///< prefill tokens per engine step (the press acts after each)
  bool batch_decode = true;    ///< one pass over the weights for all decoding requests (step_batch)
  SessionOptions session;      ///< n_ctx and the default cache codecs
};

/// One request: its input (set before submit, then read-only) and the channel its output comes
/// back on (guarded by `mu`; the engine appends, the HTTP thread reads and waits on `cv`).
struct Job {
  // Input.
  std::vector<Token> context, question;
  int max_tokens = -1;                 ///< -1: until end of generation or the context size
  SamplingParams sampling;
  std::vector<std::string> stop;
  std::unique_ptr<Press> press;
  SessionOptions session;
  Clock::time_point deadline = Clock::time_point::max();
  size_t reservation = 0;              ///< bytes reserved before prefill (set by Engine::estimate)
  // Stored contexts (server/context_cache.h); all empty: the request runs as it always did.
  /// The prompt's first cached->tokens() tokens come from this stored context: `context` holds them
  /// and `question` the rest, which alone is prefilled (appended uncompressed, as a question is).
  std::optional<Context> cached;
  /// Non-empty: the job leads the single flight of this id; once its context is compressed it is
  /// stored under the id and the question continues from the stored context.
  std::string store_id;
  /// Non-empty: when the reply ends, everything run (prompt and answer) is stored under this spec
  /// digest, so the conversation's next turn prefills only its new message.
  std::string conversation_spec;

  // Output.
  std::mutex mu;
  std::condition_variable cv;
  std::string text;                    ///< generated so far (cut before a stop string once found)
  bool done = false;
  std::string finish_reason;           ///< "stop" or "length"
  std::optional<ApiError> error;       ///< set instead of a finish reason when the request failed
  Usage usage;
  bool started = false;                ///< a slot took it (it left the queue)
  std::optional<Context> built;        ///< the context stored for store_id, once built

  /// Set by the HTTP side when the client went away: the engine drops the request at its next step.
  std::atomic<bool> cancelled{false};
};

/// Counters and gauges for /metrics.
struct EngineMetrics {
  uint64_t requests_finished = 0, requests_failed = 0, requests_cancelled = 0, requests_rejected = 0;
  uint64_t prompt_tokens = 0, generated_tokens = 0;
  uint64_t decode_steps = 0, decode_rows = 0;  ///< forward passes of the decode step, and tokens in them
  double prefill_seconds = 0, decode_seconds = 0;
  int active = 0, queued = 0, prefilling = 0;
  size_t kv_bytes_in_use = 0;      ///< measured bytes of every running request's cache (shared parts once)
  size_t kv_bytes_shared = 0;      ///< of which stored contexts' entries read in place, each part once
  size_t kv_bytes_full_f16 = 0;    ///< what those caches would take in full f16
  size_t kv_bytes_reserved = 0;
  size_t kv_budget = 0;
  int parallel = 0, last_batch = 0;
};

class Engine {
 public:
  /// Starts the engine thread. `model` must outlive the engine, and `contexts` (null: no stored
  /// contexts) too: jobs with store_id or conversation_spec store there, and its memory tier
  /// counts against the KV budget (emptied, least recently used first, before a request waits).
  Engine(const Model& model, EngineOptions opt, ContextCache* contexts = nullptr);
  /// Stops the engine thread; requests still queued or running end with an error.
  ~Engine();
  /// What the destructor does, without freeing the engine: the thread stops, queued and running
  /// requests end with 503 "shutting down", and submit() refuses from then on. Idempotent.
  void shutdown();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  /// Bytes `job` reserves before its prefill (see the header comment). Measured on scratch
  /// segments with the job's codecs; call from any thread.
  size_t estimate(const Job& job) const;
  /// Queues the job (job->reservation must be set). Throws ApiError 503 when the queue is full or
  /// when the job alone needs more than the whole budget (the message gives both numbers).
  void submit(const std::shared_ptr<Job>& job);
  /// Wakes the engine (after a job was cancelled).
  void notify();

  EngineMetrics metrics() const;
  const EngineOptions& options() const { return opt_; }

 private:
  struct Active;
  void loop();
  void admit_locked();
  bool can_admit_locked() const;
  void prefill_step(Active& a);
  void decode_step(std::vector<Active*>& rows);
  /// Ends the job when its Request finished (mapping the finish reason to OpenAI's).
  void end_if_finished(Active& a);
  void finish(Active& a, const std::string& reason, std::optional<ApiError> err = std::nullopt);
  /// Ends a job's single flight without a context (it failed, was cancelled or never ran).
  void abandon_flight(Job& j);
  /// Stores everything `a` ran as a context (multi-turn reuse); the request must not run again.
  void store_conversation(Active& a);
  size_t segment_bytes(const SessionOptions& s, size_t n) const;
  /// The distinct shared parts the running requests read, and those of `next`'s stored context.
  std::vector<SharedEntries> in_use_locked(const Job* next) const;
  size_t growth_bytes(const Active& a) const;

  const Model& model_;
  EngineOptions opt_;
  ContextCache* contexts_ = nullptr;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  std::vector<std::unique_ptr<Active>> active_;  // touched by the engine thread; size read under mu_
  size_t reserved_ = 0;                          // under mu_
  EngineMetrics m_;                              // under mu_
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace kvslim::server
