#include "kvslim/request.h"

#include <algorithm>

#include <fmt/format.h>

#include "press/recorders.h"
#include "run/auto_budget.h"
#include "run/steps.h"
#include "util/clock.h"

namespace kvslim {

namespace run {

std::vector<float> prefill_chunk(Session& session, PressImpl& press, const Token* tokens, size_t n, size_t* peak_bytes,
                                 double* press_seconds, int32_t context_end) {
  Observation obs;
  std::vector<float> logits = run_observed(session, std::vector<Token>(tokens, tokens + n), press.needs(), obs);
  obs.context_end = context_end;
  if (peak_bytes) *peak_bytes = std::max(*peak_bytes, session.cache().bytes());
  const double t0 = steady_seconds();
  press.compress(session.cache(), session.model(), obs);
  if (press_seconds) *press_seconds += steady_seconds() - t0;
  return logits;
}

std::vector<float> decode_step(Session& session, PressImpl& press, Token token) {
  Observation obs;
  std::vector<float> logits = run_observed(session, {token}, press.decode_needs(), obs);
  press.after_decode(session.cache(), session.model(), obs);
  return logits;
}

}  // namespace run

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::None: return "none";
    case FinishReason::Length: return "length";
    case FinishReason::EndOfGeneration: return "eog";
    case FinishReason::ContextFull: return "context_full";
    case FinishReason::Stop: return "stop";
    case FinishReason::Cancelled: return "cancelled";
  }
  return "none";
}

double RequestStats::prefill_tps() const {
  return prefill_seconds > 0 ? (context_tokens + question_tokens) / prefill_seconds : 0.0;
}
double RequestStats::decode_tps() const {
  return decode_seconds > 0 && generated_tokens > 1 ? (generated_tokens - 1) / decode_seconds : 0.0;
}

// The static_casts hold because Press's only derived class is PressImpl (its constructor is private
// to it), so every Press a caller holds is a PressImpl.
Request::Request(const Model& model, Press& press, RequestOptions opt)
    : model_(model), press_(static_cast<PressImpl*>(&press)), opt_(std::move(opt)),
      session_(std::make_unique<Session>(model, opt_.session)),
      sampler_(std::make_unique<Sampler>(opt_.sampling)) {}

Request::Request(const Model& model, std::unique_ptr<Press> press, RequestOptions opt)
    : model_(model), owned_press_(std::move(press)), press_(static_cast<PressImpl*>(owned_press_.get())),
      opt_(std::move(opt)) {
  if (!press_) throw Error("request: no press given (use the \"none\" press for a full cache)");
  session_ = std::make_unique<Session>(model, opt_.session);
  sampler_ = std::make_unique<Sampler>(opt_.sampling);
}

Request::~Request() = default;

Press& Request::press() { return *press_; }
int32_t Request::position() const { return session_->next_position(); }
const KVCache& Request::cache() const { return session_->cache(); }
Session& Request::session() { return *session_; }
const Session& Request::session() const { return *session_; }

void Request::set_prompt(const std::string& context, const std::string& question) {
  const Tokenizer& tok = model_.tokenizer();
  std::vector<Token> ctx = tok.encode(context, tok.add_bos_default(), false);
  const size_t n_text = ctx.size() - ((!ctx.empty() && ctx[0] == tok.bos() && tok.add_bos_default()) ? 1 : 0);
  if (context.empty() || n_text == 0) throw Error("empty prompt: the context has no text");
  std::vector<Token> q;
  if (!question.empty()) q = tok.encode(question, false, false);
  set_prompt_tokens(std::move(ctx), std::move(q));
}

void Request::set_prompt_tokens(std::vector<Token> context, std::vector<Token> question) {
  if (context_done_ > 0 || prefilled_) throw Error("request: the prompt is set once, before prefill");
  if (context.empty()) throw Error("empty prompt: the context has no tokens");
  if (context.size() + question.size() > static_cast<size_t>(session_->n_ctx()))
    throw Error(fmt::format("prompt of {} tokens ({} context + {} question) exceeds the context size n_ctx {}",
                            context.size() + question.size(), context.size(), question.size(), session_->n_ctx()));
  context_ = std::move(context);
  question_ = std::move(question);
  prompt_set_ = true;
  stats_ = RequestStats{};
  stats_.context_tokens = static_cast<int>(context_.size());
  stats_.question_tokens = static_cast<int>(question_.size());
}

void Request::set_prompt_cached(std::vector<Token> context, KVCache cache, int32_t next_position,
                                std::vector<float> logits, const RequestStats& context_stats,
                                std::vector<Token> question) {
  if (logits.size() != static_cast<size_t>(model_.hparams().n_vocab))
    throw Error(fmt::format("request: {} context logits for a vocabulary of {}", logits.size(),
                            model_.hparams().n_vocab));
  set_prompt_tokens(std::move(context), std::move(question));
  session_->restore(std::move(cache), next_position);
  press_->reset();
  context_done_ = context_.size();
  logits_ = std::move(logits);
  const int n_question = stats_.question_tokens;
  stats_ = context_stats;
  stats_.context_tokens = static_cast<int>(context_.size());
  stats_.question_tokens = n_question;
  stats_.prefill_seconds = 0;
  stats_.generated_tokens = 0;
  stats_.decode_seconds = 0;
  if (question_.empty()) prefilled_ = true;
}

bool Request::prefill_step() {
  if (!prompt_set_) throw Error("request: no prompt set");
  if (prefilled_) return true;
  if (cancel_requested()) {
    finish(FinishReason::Cancelled);
    return true;
  }
  const double t0 = steady_seconds();
  if (context_done_ < context_.size()) {
    // A press object may serve several requests in turn: nothing of the previous one may leak.
    if (context_done_ == 0) press_->reset();
    if (opt_.auto_budget.active()) {
      if (opt_.chunk_size > 0)
        throw Error(fmt::format("auto-budget needs the context prefilled in one step (chunk size 0), not in chunks "
                                "of {} tokens",
                                opt_.chunk_size));
      logits_ = run::prefill_auto_budget(*session_, *press_, context_, question_, opt_.auto_budget,
                                         stats_.auto_budget, &stats_.peak_kv_bytes, &stats_.press_seconds);
      context_done_ = context_.size();
    } else {
      const size_t step = opt_.chunk_size > 0 ? static_cast<size_t>(opt_.chunk_size) : context_.size();
      const size_t n = std::min(step, context_.size() - context_done_);
      const auto end = static_cast<int32_t>(session_->next_position() + (context_.size() - context_done_));
      logits_ = run::prefill_chunk(*session_, *press_, context_.data() + context_done_, n, &stats_.peak_kv_bytes,
                                   &stats_.press_seconds, end);
      context_done_ += n;
    }
    if (context_done_ == context_.size()) {
      const KVCache& cache = session_->cache();
      stats_.entries_kept = cache.entries();
      stats_.entries_total = context_.size() * cache.n_layer() * cache.n_head_kv();
      stats_.kept_per_layer.clear();
      for (int l = 0; l < cache.n_layer(); ++l) stats_.kept_per_layer.push_back(cache.entries(l));
      stats_.kv_bytes = cache.bytes();
      stats_.full_f16_bytes = cache.full_f16_bytes(context_.size());
      stats_.shared_bytes = cache.shared_bytes();
    }
    stats_.prefill_seconds += steady_seconds() - t0;
    if (context_done_ < context_.size() || !question_.empty()) return false;
  } else {
    logits_ = session_->forward(question_);
    stats_.prefill_seconds += steady_seconds() - t0;
  }
  prefilled_ = true;
  return true;
}

void Request::prefill() {
  while (!prefill_step()) {
  }
}

Token Request::sample() {
  if (logits_.empty()) throw Error("request: no logits to sample from (prefill or advance first)");
  return sampler_->sample(logits_);
}

const std::vector<float>& Request::advance(Token token) {
  logits_ = run::decode_step(*session_, *press_, token);
  return logits_;
}

void Request::finish(FinishReason r) {
  if (finish_ != FinishReason::None) return;
  finish_ = r;
  if (decode_started_) stats_.decode_seconds = steady_seconds() - decode_t0_;
}

bool Request::step() {
  Token t = -1;
  if (!sample_step(&t)) return false;
  advance(t);
  return true;
}

bool Request::sample_step(Token* next) {
  if (finished()) return false;
  if (!prefilled_) {
    prefill();
    if (finished()) return false;
  }
  if (cancel_requested()) {
    finish(FinishReason::Cancelled);
    return false;
  }
  if (opt_.n_predict >= 0 && static_cast<int>(generated_.size()) >= opt_.n_predict) {
    finish(FinishReason::Length);
    return false;
  }
  const Token t = sample();
  if (!decode_started_) {  // decode speed excludes the first token: it comes from the prefill
    decode_started_ = true;
    decode_t0_ = steady_seconds();
  }
  generated_.push_back(t);
  stats_.generated_tokens = static_cast<int>(generated_.size());
  const Tokenizer& tok = model_.tokenizer();
  const bool eog = tok.is_eog(t);
  const size_t old = text_.size();
  if (!eog) text_ += tok.piece(t);
  // A stop string may straddle pieces: search the tail the new piece can complete.
  size_t cut = std::string::npos;
  for (const std::string& s : opt_.stop) {
    if (s.empty()) continue;
    const size_t from = old >= s.size() ? old - s.size() + 1 : 0;
    const size_t at = text_.find(s, from);
    if (at != std::string::npos) cut = std::min(cut, at);
  }
  FinishReason done = FinishReason::None;
  if (eog && !opt_.ignore_eos)
    done = FinishReason::EndOfGeneration;
  else if (cut != std::string::npos)
    done = FinishReason::Stop;
  else if (opt_.n_predict >= 0 && static_cast<int>(generated_.size()) >= opt_.n_predict)
    done = FinishReason::Length;
  else if (session_->next_position() >= session_->n_ctx())
    done = FinishReason::ContextFull;
  if (cut != std::string::npos) text_.resize(cut);
  // Text that may be the start of a stop string is held back until the next piece decides it.
  size_t release_end = text_.size();
  if (done == FinishReason::None)
    for (const std::string& s : opt_.stop)
      for (size_t len = std::min(s.size() - (s.empty() ? 0 : 1), text_.size() - streamed_); len > 0; --len)
        if (text_.compare(text_.size() - len, len, s, 0, len) == 0) {
          release_end = std::min(release_end, text_.size() - len);
          break;
        }
  std::string piece = text_.substr(std::min(streamed_, release_end), release_end > streamed_ ? release_end - streamed_ : 0);
  streamed_ = std::max(streamed_, release_end);
  if (on_token_ && (!eog || !piece.empty())) {
    TokenEvent ev{t, std::move(piece), static_cast<int>(generated_.size()) - 1};
    if (!on_token_(ev) && done == FinishReason::None) done = FinishReason::Stop;
  }
  if (done != FinishReason::None) {
    finish(done);
    return false;
  }
  *next = t;
  return true;
}

const std::string& Request::run(const TokenCallback& on_token) {
  if (on_token) on_token_ = on_token;
  while (step()) {
  }
  return text_;
}

void Request::rewind(int32_t position) {
  session_->rewind(position);
  logits_.clear();
  finish_ = FinishReason::None;
}

const RequestStats& Request::stats() const {
  const KVCache& cache = session_->cache();
  stats_.final_kv_bytes = cache.bytes();
  // Every token run (next_position() counts them; a rewind takes its tokens back) gave each
  // (layer, KV head) one entry; what is missing now was removed.
  stats_.entries_seen = static_cast<size_t>(std::max(0, position())) * cache.n_layer() * cache.n_head_kv();
  stats_.entries_now = cache.entries();
  stats_.head_dim = cache.head_dim();
  stats_.key_channels_now = 0;
  for (int l = 0; l < cache.n_layer(); ++l)
    for (int h = 0; h < cache.n_head_kv(); ++h) {
      const Segment& seg = cache.seg(l, h);
      stats_.key_channels_now += seg.size() * static_cast<size_t>(seg.latent() ? seg.latent_keys().rank() : seg.head_dim());
    }
  if (decode_started_ && finish_ == FinishReason::None) stats_.decode_seconds = steady_seconds() - decode_t0_;
  return stats_;
}

std::vector<std::exception_ptr> step_batch(const std::vector<Request*>& requests) {
  std::vector<std::exception_ptr> errors(requests.size());
  std::vector<Session*> sessions;
  std::vector<Token> tokens;
  std::vector<size_t> batched;
  for (size_t i = 0; i < requests.size(); ++i) {
    Request* r = requests[i];
    try {
      Token t = -1;
      if (!r || !r->sample_step(&t)) continue;
      if (r->press_->decode_needs().any()) {
        r->advance(t);
      } else {
        sessions.push_back(r->session_.get());
        tokens.push_back(t);
        batched.push_back(i);
      }
    } catch (...) {
      errors[i] = std::current_exception();
    }
  }
  if (batched.empty()) return errors;
  std::vector<std::exception_ptr> failed;
  const std::vector<float> logits = Session::decode_batch(sessions, tokens, &failed);
  const size_t nv = static_cast<size_t>(requests[batched[0]]->model_.hparams().n_vocab);
  for (size_t j = 0; j < batched.size(); ++j) {
    Request& r = *requests[batched[j]];
    if (failed[j]) {
      errors[batched[j]] = failed[j];
      continue;
    }
    try {
      r.logits_.assign(logits.begin() + j * nv, logits.begin() + (j + 1) * nv);
      // As run::decode_step with nothing recorded: a decoding press may still evict here.
      Observation obs;
      obs.runner = r.session_.get();
      r.press_->after_decode(r.session_->cache(), r.model_, obs);
    } catch (...) {
      errors[batched[j]] = std::current_exception();
    }
  }
  return errors;
}

}  // namespace kvslim
