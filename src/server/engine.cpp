#include "server/engine.h"

#include <algorithm>

#include <fmt/format.h>

namespace kvslim::server {

namespace {
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
}  // namespace

/// A request holding a slot: its session (cache), sampler and progress.
struct Engine::Active {
  std::shared_ptr<Job> job;
  std::unique_ptr<Session> session;
  std::unique_ptr<Sampler> sampler;
  size_t prefilled = 0;         // context tokens run so far
  bool decoding = false;        // context and question done; `next` waits for its forward pass
  Token next = -1;              // the token sampled last, to be run by the next decode step
  std::vector<float> logits;
  int generated = 0;
  size_t reservation = 0;
  size_t peak_bytes = 0;
};

Engine::Engine(const Model& model, EngineOptions opt) : model_(model), opt_(std::move(opt)) {
  if (opt_.parallel < 1) throw Error(fmt::format("--parallel {} must be at least 1", opt_.parallel));
  if (opt_.max_queue < 0) throw Error(fmt::format("--queue {} must not be negative", opt_.max_queue));
  if (opt_.chunk_size < 1) opt_.chunk_size = 256;
  m_.kv_budget = opt_.kv_budget;
  m_.parallel = opt_.parallel;
  thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  auto fail = [](Job& j) {
    std::lock_guard<std::mutex> lk(j.mu);
    if (j.done) return;
    j.done = true;
    j.error = ApiError(503, "the server is shutting down", "", "server_error");
    j.cv.notify_all();
  };
  for (auto& j : queue_) fail(*j);
  for (auto& a : active_) fail(*a->job);
}

size_t Engine::segment_bytes(const SessionOptions& s, size_t n) const {
  // Bytes are measured, not modelled: a scratch segment with the request's codecs holds n entries.
  const HParams& hp = model_.hparams();
  Segment seg(hp.head_dim, s.key_codec, s.value_codec, s.kv_quant);
  std::vector<float> row(hp.head_dim, 0.0f);
  for (size_t i = 0; i < n; ++i) seg.append(row.data(), row.data(), static_cast<int32_t>(i));
  return seg.bytes();
}

size_t Engine::estimate(const Job& job) const {
  const HParams& hp = model_.hparams();
  const size_t n_ctx_tokens = job.context.size();
  const double r = job.press ? std::clamp(job.press->ratio(), 0.0, 1.0) : 0.0;
  size_t kept = n_ctx_tokens - static_cast<size_t>(static_cast<double>(n_ctx_tokens) * r);
  // During chunked prefill the cache holds what the press kept so far plus one uncompressed chunk.
  kept = std::min(n_ctx_tokens, kept + static_cast<size_t>(opt_.chunk_size));
  const int n_ctx = job.session.n_ctx > 0 ? job.session.n_ctx : hp.n_ctx_train;
  size_t gen = job.max_tokens >= 0 ? static_cast<size_t>(job.max_tokens)
                                   : static_cast<size_t>(std::max<int64_t>(0, n_ctx - int64_t(n_ctx_tokens + job.question.size())));
  size_t n = std::max<size_t>(1, kept + job.question.size() + gen);
  return static_cast<size_t>(hp.n_layer) * hp.n_head_kv * segment_bytes(job.session, n);
}

size_t Engine::growth_bytes(const Active& a) const {
  const KVCache& c = a.session->cache();
  const size_t segs = static_cast<size_t>(c.n_layer()) * c.n_head_kv();
  const size_t per_seg = (c.entries() + segs - 1) / segs;
  size_t left = a.job->max_tokens >= 0 ? static_cast<size_t>(std::max(0, a.job->max_tokens - a.generated))
                                       : static_cast<size_t>(std::max(0, a.session->n_ctx() - a.session->next_position()));
  left = std::min(left, static_cast<size_t>(std::max(0, a.session->n_ctx() - a.session->next_position())));
  if (left == 0) return 0;
  return segs * (segment_bytes(a.job->session, per_seg + left) - segment_bytes(a.job->session, per_seg));
}

void Engine::submit(const std::shared_ptr<Job>& job) {
  std::lock_guard<std::mutex> lk(mu_);
  if (opt_.kv_budget && job->reservation > opt_.kv_budget) {
    ++m_.requests_rejected;
    throw ApiError(503,
                   fmt::format("the request needs {} bytes of KV cache ({} prompt tokens, up to {} more) but the "
                               "server's whole KV budget is {} bytes; use a press, a cheaper cache type or fewer tokens",
                               job->reservation, job->context.size() + job->question.size(),
                               job->max_tokens < 0 ? std::string("context-size") : std::to_string(job->max_tokens),
                               opt_.kv_budget),
                   "", "server_error", "kv_budget_exceeded");
  }
  if (static_cast<int>(queue_.size()) >= opt_.max_queue && !(queue_.empty() && can_admit_locked())) {
    ++m_.requests_rejected;
    throw ApiError(503, fmt::format("the server is busy: {} requests running and {} waiting (the queue's limit)",
                                    active_.size(), queue_.size()),
                   "", "server_error", "queue_full");
  }
  queue_.push_back(job);
  m_.queued = static_cast<int>(queue_.size());
  cv_.notify_all();
}

void Engine::notify() { cv_.notify_all(); }

EngineMetrics Engine::metrics() const {
  std::lock_guard<std::mutex> lk(mu_);
  return m_;
}

bool Engine::can_admit_locked() const {
  if (static_cast<int>(active_.size()) >= opt_.parallel) return false;
  if (queue_.empty()) return true;
  const Job& j = *queue_.front();
  return !opt_.kv_budget || reserved_ + j.reservation <= opt_.kv_budget;
}

void Engine::admit_locked() {
  while (!queue_.empty()) {
    std::shared_ptr<Job> j = queue_.front();
    if (j->cancelled || Clock::now() > j->deadline) {
      queue_.pop_front();
      std::lock_guard<std::mutex> jl(j->mu);
      j->done = true;
      if (j->cancelled) {
        ++m_.requests_cancelled;
      } else {
        ++m_.requests_failed;
        j->error = ApiError(503, "the request timed out while waiting for a slot", "", "server_error", "timeout");
      }
      j->cv.notify_all();
      continue;
    }
    // First in, first out: a large request at the head is not overtaken by smaller ones.
    if (static_cast<int>(active_.size()) >= opt_.parallel) break;
    if (opt_.kv_budget && reserved_ + j->reservation > opt_.kv_budget) break;
    queue_.pop_front();
    auto a = std::make_unique<Active>();
    a->job = j;
    a->reservation = j->reservation;
    reserved_ += a->reservation;
    {
      std::lock_guard<std::mutex> jl(j->mu);
      j->started = true;
    }
    active_.push_back(std::move(a));
  }
  m_.queued = static_cast<int>(queue_.size());
  m_.active = static_cast<int>(active_.size());
  m_.kv_bytes_reserved = reserved_;
}

void Engine::finish(Active& a, const std::string& reason, std::optional<ApiError> err) {
  Job& j = *a.job;
  {
    std::lock_guard<std::mutex> lk(j.mu);
    j.usage.completion_tokens = a.generated;
    if (a.session) j.usage.kv_bytes_final = a.session->cache().bytes();
    j.finish_reason = reason;
    j.error = std::move(err);
    j.done = true;
  }
  j.cv.notify_all();
  std::lock_guard<std::mutex> lk(mu_);
  if (j.error) {
    ++m_.requests_failed;
  } else if (j.cancelled) {
    ++m_.requests_cancelled;
  } else {
    ++m_.requests_finished;
  }
  reserved_ -= a.reservation;
  a.reservation = 0;
  a.session.reset();  // frees the cache now, not when the slot is reused
}

bool Engine::take_token(Active& a) {
  Job& j = *a.job;
  const Tokenizer& tok = model_.tokenizer();
  if (j.max_tokens >= 0 && a.generated >= j.max_tokens) {
    finish(a, "length");
    return false;
  }
  Token t = a.sampler->sample(a.logits);
  ++a.generated;
  {
    std::lock_guard<std::mutex> lk(mu_);
    ++m_.generated_tokens;
  }
  if (tok.is_eog(t)) {
    finish(a, "stop");
    return false;
  }
  bool stopped = false;
  {
    std::lock_guard<std::mutex> lk(j.mu);
    j.text += tok.piece(t);
    if (!j.stop.empty()) {
      StopMatch m = find_stop(j.text, j.stop);
      if (m.stopped) {
        j.text.resize(m.cut);
        stopped = true;
      }
    }
    j.usage.completion_tokens = a.generated;
  }
  j.cv.notify_all();
  if (stopped) {
    finish(a, "stop");
    return false;
  }
  if ((j.max_tokens >= 0 && a.generated >= j.max_tokens) || a.session->next_position() >= a.session->n_ctx()) {
    finish(a, "length");
    return false;
  }
  a.next = t;
  return true;
}

void Engine::prefill_step(Active& a) {
  Job& j = *a.job;
  const auto t0 = Clock::now();
  if (!a.session) {
    a.session = std::make_unique<Session>(model_, j.session);
    a.sampler = std::make_unique<Sampler>(j.sampling);
    j.press->reset();  // a press object serves exactly one request, but be explicit
  }
  Session& s = *a.session;
  Press& press = *j.press;
  const ObservationRequest req = press.request();
  const size_t e = std::min(j.context.size(), a.prefilled + static_cast<size_t>(opt_.chunk_size));
  std::vector<Token> chunk(j.context.begin() + a.prefilled, j.context.begin() + e);
  Observation obs;
  const int32_t first = s.next_position();
  int32_t record_from = first + static_cast<int32_t>(chunk.size()) - std::max(req.window, 0);
  if (req.hidden_states || req.attention_mass || req.tokens) record_from = first;
  a.logits = s.forward(chunk, false, &req, &obs, std::max(record_from, first));
  a.peak_bytes = std::max(a.peak_bytes, s.cache().bytes());
  press.compress(s.cache(), model_, obs);
  a.prefilled = e;
  if (a.prefilled == j.context.size()) {
    const KVCache& c = s.cache();
    {
      std::lock_guard<std::mutex> lk(j.mu);
      j.usage.prompt_tokens = static_cast<int>(j.context.size() + j.question.size());
      j.usage.entries_kept = c.entries();
      j.usage.entries_total = j.context.size() * c.n_layer() * c.n_head_kv();
      j.usage.kv_bytes = c.bytes();
      j.usage.full_f16_bytes = c.full_f16_bytes(j.context.size());
      j.usage.press = press.describe();
    }
    if (!j.question.empty()) a.logits = s.forward(j.question);
    a.decoding = true;
    // From now on the request holds what its cache measures plus room to generate.
    const size_t now = c.bytes() + growth_bytes(a);
    std::lock_guard<std::mutex> lk(mu_);
    reserved_ = reserved_ - a.reservation + now;
    a.reservation = now;
    m_.prompt_tokens += j.context.size() + j.question.size();
  }
  std::lock_guard<std::mutex> lk(mu_);
  m_.prefill_seconds += seconds_since(t0);
}

void Engine::decode_step(std::vector<Active*>& rows) {
  if (rows.empty()) return;
  const auto t0 = Clock::now();
  // TODO(batching): one pass over the weights for every row.
  for (Active* a : rows) {
    Press& press = *a->job->press;
    const ObservationRequest dreq = press.decode_request();
    const bool want = dreq.window > 0 || dreq.attention_mass || dreq.hidden_states || dreq.tokens ||
                      dreq.on_attention_input || dreq.selector;
    Observation dobs;
    a->logits = a->session->forward({a->next}, false, want ? &dreq : nullptr, want ? &dobs : nullptr,
                                    a->session->next_position());
    press.after_decode(a->session->cache(), model_, dobs);
  }
  std::lock_guard<std::mutex> lk(mu_);
  m_.decode_seconds += seconds_since(t0);
  m_.decode_steps += rows.size();
  m_.decode_rows += rows.size();
  m_.last_batch = 1;
}

void Engine::loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !active_.empty() || (!queue_.empty() && can_admit_locked()); });
      if (stop_) return;
      admit_locked();
    }
    // Requests whose client left or whose time ran out end here.
    for (auto& a : active_) {
      if (a->job->cancelled) {
        finish(*a, "cancelled");
      } else if (Clock::now() > a->job->deadline) {
        finish(*a, "", ApiError(503, "the request exceeded the server's time limit (--timeout)", "", "server_error",
                                "timeout"));
      }
    }
    auto ended = [](const std::unique_ptr<Active>& a) {
      std::lock_guard<std::mutex> lk(a->job->mu);
      return a->job->done;
    };
    auto sweep = [&] {
      active_.erase(std::remove_if(active_.begin(), active_.end(), ended), active_.end());
    };
    sweep();
    try {
      // One prefill chunk of the oldest request still reading its prompt.
      for (auto& a : active_)
        if (!a->decoding) {
          Active& x = *a;
          try {
            prefill_step(x);
            if (x.decoding) take_token(x);
          } catch (const std::exception& e) {
            finish(x, "", ApiError(500, fmt::format("prefill failed: {}", e.what()), "", "server_error"));
          }
          break;
        }
      sweep();
      std::vector<Active*> rows;
      for (auto& a : active_)
        if (a->decoding && a->next >= 0) rows.push_back(a.get());
      try {
        decode_step(rows);
        for (Active* a : rows) take_token(*a);
      } catch (const std::exception& e) {
        for (Active* a : rows)
          if (!a->job->done) finish(*a, "", ApiError(500, fmt::format("decode failed: {}", e.what()), "", "server_error"));
      }
      sweep();
    } catch (const std::exception& e) {
      for (auto& a : active_) finish(*a, "", ApiError(500, e.what(), "", "server_error"));
      sweep();
    }
    std::lock_guard<std::mutex> lk(mu_);
    size_t in_use = 0, full = 0;
    int prefilling = 0;
    for (auto& a : active_) {
      if (!a->session) continue;
      in_use += a->session->cache().bytes();
      full += a->session->cache().full_f16_bytes(static_cast<size_t>(a->session->next_position()));
      prefilling += a->decoding ? 0 : 1;
    }
    m_.kv_bytes_in_use = in_use;
    m_.kv_bytes_full_f16 = full;
    m_.active = static_cast<int>(active_.size());
    m_.prefilling = prefilling;
    m_.kv_bytes_reserved = reserved_;
  }
}

}  // namespace kvslim::server
