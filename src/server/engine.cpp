#include "server/engine.h"

#include <algorithm>

#include <fmt/format.h>

#include "server/context_cache.h"
#include "tools/tools.h"

namespace kvslim::server {

/// A request holding a slot: the runner's Request (session, press, sampler) and its reservation.
struct Engine::Active {
  std::shared_ptr<Job> job;
  std::unique_ptr<Request> req;
  bool decoding = false;        // the prompt is in; step_batch generates
  bool building = false;        // prefilling the context alone, to store it (Job::store_id)
  std::string press_name;       // the press as described before it ran (what the stored contexts' spec names)
  size_t reservation = 0;
  std::vector<SharedEntries> parts;  // shared parts of stored contexts its cache reads (under mu_)
};

namespace {

// Adds the parts of `from` not yet in `out` (by id).
void add_distinct(std::vector<SharedEntries>& out, const std::vector<SharedEntries>& from) {
  for (const SharedEntries& p : from)
    if (std::none_of(out.begin(), out.end(), [&](const SharedEntries& q) { return q.id == p.id; })) out.push_back(p);
}

size_t allocated(const std::vector<SharedEntries>& parts) {
  size_t n = 0;
  for (const SharedEntries& p : parts) n += p.allocated_bytes;
  return n;
}

size_t payload(const std::vector<SharedEntries>& parts) {
  size_t n = 0;
  for (const SharedEntries& p : parts) n += p.bytes;
  return n;
}

// What a request's cache holds alone: its entries minus those it reads from shared parts.
size_t own_bytes(const KVCache& c) { return c.bytes() - c.shared_kv_bytes(); }

}  // namespace

Engine::Engine(const Model& model, EngineOptions opt, ContextCache* contexts)
    : model_(model), opt_(std::move(opt)), contexts_(contexts) {
  if (opt_.parallel < 1) throw Error(fmt::format("EngineOptions::parallel {} must be at least 1", opt_.parallel));
  if (opt_.max_queue < 0) throw Error(fmt::format("EngineOptions::max_queue {} must not be negative", opt_.max_queue));
  if (opt_.chunk_size < 1) opt_.chunk_size = 256;
  m_.kv_budget = opt_.kv_budget;
  m_.parallel = opt_.parallel;
  thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() { shutdown(); }

void Engine::shutdown() {
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
    j.error = ApiError(503, "the server is shutting down", "", "server_error", "shutting_down");
    j.cv.notify_all();
  };
  for (auto& j : queue_) {
    abandon_flight(*j);
    fail(*j);
  }
  for (auto& a : active_) {
    abandon_flight(*a->job);
    fail(*a->job);
  }
}

void Engine::abandon_flight(Job& j) {
  if (j.store_id.empty() || !contexts_) return;
  contexts_->complete(j.store_id, std::nullopt);
  j.store_id.clear();
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
  if (job.cached) {
    // The stored context's cache as measured, plus the rest of the prompt and the answer uncompressed.
    const int n_ctx = job.session.n_ctx > 0 ? job.session.n_ctx : hp.n_ctx_train;
    const size_t n_prompt = job.context.size() + job.question.size();
    const size_t gen = job.max_tokens >= 0 ? static_cast<size_t>(job.max_tokens)
                                           : static_cast<size_t>(std::max<int64_t>(0, n_ctx - int64_t(n_prompt)));
    SessionOptions s = job.session;
    // The context's shared parts count apart (once, however many requests read them): here only
    // the tail each request copies.
    const size_t per_seg = std::max<size_t>(1, job.question.size() + gen);
    return own_bytes(job.cached->cache()) + static_cast<size_t>(hp.n_layer) * hp.n_head_kv * segment_bytes(s, per_seg);
  }
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
  const KVCache& c = a.req->cache();
  const size_t segs = static_cast<size_t>(c.n_layer()) * c.n_head_kv();
  const size_t per_seg = (c.entries() + segs - 1) / segs;
  const int n_ctx = a.req->session().n_ctx();
  size_t left = static_cast<size_t>(std::max(0, n_ctx - a.req->position()));
  if (a.job->max_tokens >= 0) left = std::min(left, static_cast<size_t>(a.job->max_tokens));
  if (left == 0) return 0;
  return segs * (segment_bytes(a.job->session, per_seg + left) - segment_bytes(a.job->session, per_seg));
}

void Engine::submit(const std::shared_ptr<Job>& job) {
  std::lock_guard<std::mutex> lk(mu_);
  if (stop_) throw ApiError(503, "the server is shutting down", "", "server_error", "shutting_down");
  const size_t need = job->reservation + (job->cached ? job->cached->cache().shared_allocated_bytes() : 0);
  if (opt_.kv_budget && need > opt_.kv_budget) {
    ++m_.requests_rejected;
    throw ApiError(503,
                   fmt::format("the request needs {} bytes of KV cache ({} prompt tokens, up to {} more) but the "
                               "server's whole KV budget is {} bytes; use fewer tokens, a cheaper cache type, or a "
                               "press (it lowers the peak only for prompts longer than the server's --chunk-size, "
                               "{} tokens: each chunk is held uncompressed until the press acts)",
                               need, job->context.size() + job->question.size(),
                               job->max_tokens < 0 ? std::string("context-size") : std::to_string(job->max_tokens),
                               opt_.kv_budget, opt_.chunk_size),
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

std::vector<SharedEntries> Engine::in_use_locked(const Job* next) const {
  std::vector<SharedEntries> out;
  for (const auto& a : active_) add_distinct(out, a->parts);
  if (next && next->cached) {
    std::vector<SharedEntries> p;
    next->cached->cache().shared_parts(p);
    add_distinct(out, p);
  }
  return out;
}

bool Engine::can_admit_locked() const {
  if (static_cast<int>(active_.size()) >= opt_.parallel) return false;
  if (queue_.empty()) return true;
  // Stored contexts in memory that no request reads are not counted here: admit_locked evicts them
  // to make room. The shared parts requests read cannot be freed: they count, once each.
  const Job& j = *queue_.front();
  return !opt_.kv_budget || reserved_ + j.reservation + allocated(in_use_locked(&j)) <= opt_.kv_budget;
}

void Engine::admit_locked() {
  while (!queue_.empty()) {
    std::shared_ptr<Job> j = queue_.front();
    if (j->cancelled || Clock::now() > j->deadline) {
      queue_.pop_front();
      abandon_flight(*j);
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
    if (opt_.kv_budget) {
      const std::vector<SharedEntries> in_use = in_use_locked(j.get());
      if (reserved_ + j->reservation + allocated(in_use) > opt_.kv_budget) break;
      // Stored contexts not in use give way to a request before it would wait.
      if (contexts_) contexts_->shrink_to(opt_.kv_budget - reserved_ - j->reservation, in_use);
    }
    queue_.pop_front();
    auto a = std::make_unique<Active>();
    a->job = j;
    a->reservation = j->reservation;
    if (j->cached) j->cached->cache().shared_parts(a->parts);
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

void Engine::store_conversation(Active& a) {
  Job& j = *a.job;
  if (!contexts_ || j.conversation_spec.empty() || !a.req || !a.req->prefilled() || a.building) return;
  if (a.req->logits().size() != static_cast<size_t>(model_.hparams().n_vocab) || a.req->position() <= 0) return;
  try {
    Context c = context::from_request(model_, *a.req, a.press_name, "", opt_.chunk_size, true);
    contexts_->put(ContextCache::key(j.conversation_spec, c.tokens(), c.tokens().size()), c);
  } catch (const std::exception& e) {
    // Reuse is an optimisation: a conversation that cannot be kept is answered all the same.
    fmt::print(stderr, "kvslim serve: conversation not stored: {}\n", e.what());
  }
}

void Engine::finish(Active& a, const std::string& reason, std::optional<ApiError> err) {
  Job& j = *a.job;
  abandon_flight(j);
  // Counted before the job is marked done: a client that reads /metrics right after its response
  // must see its request counted and its cache gone.
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (err) {
      ++m_.requests_failed;
    } else if (j.cancelled) {
      ++m_.requests_cancelled;
    } else {
      ++m_.requests_finished;
    }
    reserved_ -= a.reservation;
    a.reservation = 0;
    m_.kv_bytes_reserved = reserved_;
    if (a.req) {
      const size_t bytes = own_bytes(a.req->cache());
      const size_t full = a.req->cache().full_f16_bytes(static_cast<size_t>(a.req->position()));
      m_.kv_bytes_in_use -= std::min(m_.kv_bytes_in_use, bytes);
      m_.kv_bytes_full_f16 -= std::min(m_.kv_bytes_full_f16, full);
    }
    // Its shared parts stop counting unless another running request reads them too.
    a.parts.clear();
    const size_t shared = payload(in_use_locked(nullptr));
    m_.kv_bytes_in_use -= std::min(m_.kv_bytes_in_use, m_.kv_bytes_shared - std::min(m_.kv_bytes_shared, shared));
    m_.kv_bytes_shared = std::min(m_.kv_bytes_shared, shared);
  }
  {
    std::lock_guard<std::mutex> lk(j.mu);
    if (a.req) {
      const RequestStats& st = a.req->stats();
      j.usage.completion_tokens = st.generated_tokens;
      j.usage.kv_bytes_final = st.final_kv_bytes;
      j.usage.kv_bytes_shared = a.req->cache().shared_kv_bytes();
      j.usage.entries_now = st.entries_now;
      j.usage.entries_seen = st.entries_seen;
      if (!err) j.text = a.req->text();  // the final text, cut before a stop string
    }
    j.finish_reason = reason;
    j.error = err;
  }
  // Before the job is marked done: the client's next turn may arrive as soon as it is.
  if (!err && reason != "cancelled") store_conversation(a);
  {
    std::lock_guard<std::mutex> lk(j.mu);
    j.done = true;
  }
  j.cv.notify_all();
  a.req.reset();  // frees the cache now, not when the slot is reused
}

void Engine::prefill_step(Active& a) {
  Job& j = *a.job;
  const auto t0 = Clock::now();
  RequestOptions ro;
  ro.session = j.session;
  ro.chunk_size = opt_.chunk_size;
  ro.n_predict = j.max_tokens;
  ro.sampling = j.sampling;
  ro.stop = j.stop;
  auto stream_to_job = [&] {
    std::shared_ptr<Job> job = a.job;
    a.req->set_token_callback([job](const TokenEvent& ev) {
      {
        std::lock_guard<std::mutex> lk(job->mu);
        job->text += ev.piece;
        job->usage.completion_tokens = ev.index + 1;
      }
      job->cv.notify_all();
      return true;
    });
  };
  auto answer_from = [&](const Context& c, std::vector<Token> rest, int cached_tokens) {
    // Only `rest` is prefilled; the stored context's press already acted.
    RequestOptions rq = ro;
    rq.chunk_size = 0;
    a.req = c.request(model_, std::move(rest), rq);
    stream_to_job();
    std::lock_guard<std::mutex> lk(j.mu);
    j.usage.cached_tokens = cached_tokens;
  };
  if (!a.req) {
    if (j.cached) {
      a.press_name = j.cached->info().press;
      const int n = static_cast<int>(j.context.size());
      answer_from(*j.cached, j.question, n);
      if (contexts_) contexts_->count_saved(static_cast<size_t>(n));
    } else {
      a.press_name = j.press->describe();
      RequestOptions rc = ro;
      if (!j.store_id.empty()) {
        a.building = true;
        rc.n_predict = 0;
      }
      a.req = std::make_unique<Request>(model_, std::move(j.press), rc);
      if (a.building)
        a.req->set_prompt_tokens(j.context);
      else
        a.req->set_prompt_tokens(j.context, j.question);
      stream_to_job();
    }
    std::lock_guard<std::mutex> lk(j.mu);
    j.usage.press = a.press_name;
  }
  bool in = a.req->prefill_step();
  if (in && a.building && !a.req->finished()) {
    // The context is compressed: store it, wake the requests waiting for it, and go on from it.
    Context c = context::from_request(model_, *a.req, a.press_name, a.req->press().report(), opt_.chunk_size, true);
    contexts_->put(j.store_id, c);
    contexts_->complete(j.store_id, c);
    {
      std::lock_guard<std::mutex> lk(j.mu);
      j.built = c;
    }
    j.store_id.clear();
    a.building = false;
    answer_from(c, j.question, 0);
    in = a.req->prefill_step();
  }
  if (in) {
    const RequestStats& st = a.req->stats();
    {
      std::lock_guard<std::mutex> lk(j.mu);
      j.usage.prompt_tokens = st.context_tokens + st.question_tokens;
      j.usage.entries_kept = st.entries_kept;
      j.usage.entries_total = st.entries_total;
      j.usage.kv_bytes = st.kv_bytes;
      j.usage.full_f16_bytes = st.full_f16_bytes;
    }
    a.decoding = true;
    // From now on the request holds what its cache measures plus room to generate (the shared
    // parts it reads count apart, once).
    const size_t now = own_bytes(a.req->cache()) + growth_bytes(a);
    std::lock_guard<std::mutex> lk(mu_);
    reserved_ = reserved_ - a.reservation + now;
    a.reservation = now;
    a.parts.clear();
    a.req->cache().shared_parts(a.parts);
    m_.prompt_tokens += st.context_tokens + st.question_tokens - static_cast<size_t>(j.usage.cached_tokens);
  }
  std::lock_guard<std::mutex> lk(mu_);
  m_.prefill_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
}

void Engine::decode_step(std::vector<Active*>& rows) {
  if (rows.empty()) return;
  const auto t0 = Clock::now();
  std::vector<Request*> reqs;
  for (Active* a : rows) reqs.push_back(a->req.get());
  std::vector<std::exception_ptr> errors(reqs.size());
  if (opt_.batch_decode) {
    errors = step_batch(reqs);  // one pass over the weights for every request that allows it
  } else {
    for (size_t i = 0; i < reqs.size(); ++i) try {
        reqs[i]->step();
      } catch (...) {
        errors[i] = std::current_exception();
      }
  }
  // A request whose step failed ends with its error; the others of the batch go on.
  for (size_t i = 0; i < rows.size(); ++i) {
    if (!errors[i]) continue;
    try {
      std::rethrow_exception(errors[i]);
    } catch (const Error& e) {
      finish(*rows[i], "", ApiError(400, fmt::format("decode failed: {}", e.what())));
    } catch (const std::exception& e) {
      finish(*rows[i], "", ApiError(500, fmt::format("decode failed: {}", e.what()), "", "server_error"));
    }
  }
  size_t generated = 0;
  for (Active* a : rows)
    if (a->req && (!a->req->finished() || a->req->finish_reason() != FinishReason::Cancelled)) ++generated;
  std::lock_guard<std::mutex> lk(mu_);
  m_.decode_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
  m_.decode_steps += opt_.batch_decode ? 1 : rows.size();
  m_.decode_rows += rows.size();
  m_.generated_tokens += generated;
  m_.last_batch = static_cast<int>(rows.size());
}

void Engine::end_if_finished(Active& a) {
  if (!a.req || !a.req->finished()) return;
  switch (a.req->finish_reason()) {
    case FinishReason::Length:
    case FinishReason::ContextFull: finish(a, "length"); break;
    case FinishReason::Cancelled: finish(a, "cancelled"); break;
    default: finish(a, "stop"); break;
  }
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
        finish(*a, "", ApiError(503, "the request exceeded the server's time limit (ServerOptions::timeout_s)", "", "server_error",
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
          } catch (const ApiError& e) {
            finish(x, "", e);
          } catch (const Error& e) {
            // kvslim::Error is a clean refusal of what the request asked for (e.g. a press file made
            // for another model, found out when the press first runs): the client's to fix.
            finish(x, "", ApiError(400, fmt::format("prefill failed: {}", e.what())));
          } catch (const std::exception& e) {
            finish(x, "", ApiError(500, fmt::format("prefill failed: {}", e.what()), "", "server_error"));
          }
          break;
        }
      sweep();
      // One token for every request past its prompt.
      std::vector<Active*> rows;
      for (auto& a : active_)
        if (a->decoding) rows.push_back(a.get());
      try {
        decode_step(rows);
        for (Active* a : rows) end_if_finished(*a);
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
      if (!a->req) continue;
      // A copy on write (a press evicting at decode) leaves fewer parts shared: read them again.
      a->parts.clear();
      a->req->cache().shared_parts(a->parts);
      in_use += own_bytes(a->req->cache());
      full += a->req->cache().full_f16_bytes(static_cast<size_t>(a->req->position()));
      prefilling += a->decoding ? 0 : 1;
    }
    m_.kv_bytes_shared = payload(in_use_locked(nullptr));
    m_.kv_bytes_in_use = in_use + m_.kv_bytes_shared;
    m_.kv_bytes_full_f16 = full;
    m_.active = static_cast<int>(active_.size());
    m_.prefilling = prefilling;
    m_.kv_bytes_reserved = reserved_;
  }
}

}  // namespace kvslim::server
