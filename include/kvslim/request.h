#pragma once
// The request runner: the one path from a prompt to generated tokens. Every job (generate, eval,
// bench, attention-stats, the HTTP server, the Python binding) drives a Request, so a press
// behaves the same in every command: there is one prefill-and-compress loop and one decode step
// in the tree.
//
// A Request owns one Session (its KV cache and position counter) over a shared, read-only Model;
// several Requests may run at once on different threads over the same Model (one Press object per
// Request: presses keep per-request state).
//
// Life of a request:
//   set_prompt(context, question)   tokenize (BOS as the vocabulary wants) or set_prompt_tokens
//   prefill_step() ... -> true      one chunk of context per call, the press compresses after each;
//                                   then the question is appended (never compressed)
//   step() ... -> false             sample, stream, check the stop conditions, run the decode step
// run() does all of it. The step-wise form lets a server interleave many requests (continuous
// batching); step_batch() advances several requests by one token each.
#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kvslim/kv_options.h"
#include "kvslim/model.h"
#include "kvslim/press.h"
#include "kvslim/sampling.h"

namespace kvslim {

/// A request's KV cache and the session that runs the model over it: internal (src/kv/cache.h,
/// src/model/session.h). A library user reads what the cache holds from RequestStats.
class KVCache;
class Session;

/// Why a request stopped generating.
enum class FinishReason {
  None,             ///< still running (or not started)
  Length,           ///< generated n_predict tokens
  EndOfGeneration,  ///< the model sampled an end-of-generation token (not part of the text)
  ContextFull,      ///< the next token would not fit in the context size
  Stop,             ///< a stop string appeared, or the token callback asked to stop
  Cancelled,        ///< cancel() was called
};

/// "length", "eog", "context_full", "stop", "cancelled", "none".
const char* finish_reason_name(FinishReason r);

/// Auto-budget: the request chooses its press's compression ratio after prefill so that the
/// compressed cache fits a byte budget and/or stays within a fidelity target, measured on the
/// request's own text (no peer engine offers this).
///
/// How: the context is prefilled once and observed; the press then compresses copies of that cache
/// at trial ratios (bisection). Fidelity is measured on probe tokens: the question when there is
/// one, else the last `probe_tokens` context tokens (held out of compression, then appended
/// uncompressed like a question). Each trial runs the probe teacher-forced on the compressed cache
/// and takes the mean KL(full || compressed) of the next-token distributions over the probe
/// positions, in nats; the full cache's distributions come from the same probe run once on the
/// uncompressed cache. Trials rewind: only the chosen compression stays.
struct AutoBudget {
  double target_kl = 0;       ///< > 0: largest ratio whose probe KL is <= this (nats); 0: no fidelity target
  size_t kv_budget_bytes = 0; ///< > 0: smallest ratio whose cache bytes (RequestStats::kv_bytes) fit; 0: none
  int probe_tokens = 32;      ///< probe length when the request has no question (tokens)
  double max_ratio = 0.99;    ///< largest ratio tried
  double tolerance = 0.005;   ///< bisection stops when the bracket is this narrow (ratio units)
  bool active() const { return target_kl > 0 || kv_budget_bytes > 0; }
};

/// How a request runs. Everything here is per request.
struct RequestOptions {
  SessionOptions session;    ///< context size, cache codecs, prefill batch
  int chunk_size = 0;        ///< > 0: the press compresses after every chunk of this many context tokens; 0: once
  int n_predict = 64;        ///< tokens to generate; < 0: until end-of-generation or the context is full
  SamplingParams sampling;   ///< temp <= 0 is greedy (arg max, lowest id on ties)
  /// Generation stops as soon as the text contains one of these; the text is cut before it.
  std::vector<std::string> stop;
  /// Decode past end-of-generation tokens (llama.cpp's ignore_eos): the request ends at n_predict,
  /// a stop string or a full context. Benchmarks use it so that every request decodes n_predict
  /// tokens; the end-of-generation tokens stay in generated() but add no text.
  bool ignore_eos = false;
  /// Ratio chosen per request for a byte budget / fidelity target (off by default). Needs
  /// chunk_size 0 and a press with a compression ratio (see AutoBudget).
  AutoBudget auto_budget;
};

/// What auto-budget chose and measured (RequestStats::auto_budget).
struct AutoBudgetReport {
  bool used = false;
  double ratio = 0;          ///< the press ratio chosen
  double probe_kl = 0;       ///< mean KL(full || compressed) over the probe at that ratio (nats)
  int probe_tokens = 0;      ///< probe positions measured (0 without a fidelity target)
  bool probe_is_question = false;
  int trials = 0;            ///< compressions tried (the final one excluded)
  bool budget_met = true;    ///< kv bytes <= kv_budget_bytes (false: even max_ratio did not fit)
  bool target_met = true;    ///< probe_kl <= target_kl (false: the budget forced a larger ratio)
};

/// What a request measured. Cache figures are read from the cache, never computed from the request.
struct RequestStats {
  int context_tokens = 0;               ///< context tokens, BOS included
  int question_tokens = 0;
  int generated_tokens = 0;             ///< sampled tokens, end-of-generation included
  size_t entries_kept = 0;              ///< entries after compressing the context
  size_t entries_total = 0;             ///< context tokens x layers x KV heads
  std::vector<size_t> kept_per_layer;   ///< entries per layer after compressing the context
  size_t kv_bytes = 0;                  ///< cache bytes after compressing the context
  size_t full_f16_bytes = 0;            ///< bytes of a full f16 cache of the context
  size_t shared_bytes = 0;              ///< shared latent bases the cache uses (held once per process; not in kv_bytes)
  size_t peak_kv_bytes = 0;             ///< largest cache size seen during prefill (before each compression)
  size_t final_kv_bytes = 0;            ///< cache bytes at the end (or now)
  double prefill_seconds = 0;           ///< context + compression + question
  double press_seconds = 0;             ///< of which the press's compression
  double decode_seconds = 0;            ///< from the first sampled token to the last
  AutoBudgetReport auto_budget;         ///< what auto-budget chose (used == false when off)
  /// Fraction of context entries removed by the compression after prefill, measured: 1 -
  /// entries_kept / entries_total (what a prefill press was asked for; decode comes after).
  double compression_ratio() const { return entries_total ? 1.0 - double(entries_kept) / entries_total : 0.0; }
  // The whole request so far (context, question and every decoded token run; prefill and decode),
  // read from the cache by Request::stats():
  size_t entries_seen = 0;              ///< tokens run x layers x KV heads: what a full cache would hold
  size_t entries_now = 0;               ///< entries the cache holds
  size_t key_channels_now = 0;          ///< key channels stored over those entries (a latent key: its rank)
  int head_dim = 0;
  /// The compression ratio of the whole request: entries removed / entries seen, over prefill and
  /// decode (a press that evicts while decoding counts), measured from the cache. A press that
  /// prunes key channels (ThinK) removes no entries: see key_channel_ratio().
  double request_compression_ratio() const { return entries_seen ? 1.0 - double(entries_now) / entries_seen : 0.0; }
  /// Fraction of the key channels of the entries held that are not stored: 1 - key_channels_now /
  /// (entries_now x head_dim). ThinK's key_ratio; a latent key basis of rank r counts head_dim - r.
  double key_channel_ratio() const {
    return entries_now && head_dim ? 1.0 - double(key_channels_now) / (double(entries_now) * head_dim) : 0.0;
  }
  /// Cache bytes / full f16 cache bytes of the context.
  double memory_ratio() const { return full_f16_bytes ? double(kv_bytes) / full_f16_bytes : 0.0; }
  /// (context + question tokens) / prefill_seconds.
  double prefill_tps() const;
  /// Tokens per second after the first (which comes from the prefill's logits).
  double decode_tps() const;
};

/// One sampled token, as the streaming callback sees it.
struct TokenEvent {
  Token token = -1;
  /// Text released with this token: its piece, less any tail that may begin a stop string (held
  /// back until a later token decides), plus text held back before. The pieces of all events
  /// concatenate to text().
  std::string piece;
  int index = 0;       ///< 0 for the first generated token
};

/// Called for each sampled token, except an end-of-generation token that releases no text. Text
/// cut by a stop string is never passed on. Return false to stop (FinishReason::Stop).
using TokenCallback = std::function<bool(const TokenEvent&)>;

/// One request: prompt -> chunked prefill with compression -> question -> decode.
class Request {
 public:
  /// Runs with `press`, which must outlive the request and serve no other request meanwhile.
  /// Throws kvslim::Error when the options are invalid for the model.
  Request(const Model& model, Press& press, RequestOptions opt = {});
  /// Runs with a press it owns.
  Request(const Model& model, std::unique_ptr<Press> press, RequestOptions opt = {});
  ~Request();
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;

  // --- prompt -------------------------------------------------------------------------------
  /// Tokenizes `context` (with BOS when the vocabulary adds one) and `question` (no BOS).
  /// Throws kvslim::Error when the context has no text or the prompt exceeds the context size.
  void set_prompt(const std::string& context, const std::string& question = {});
  /// The same with tokens already made. Throws kvslim::Error for an empty context or a prompt
  /// longer than the context size. Must be called before the first prefill_step().
  void set_prompt_tokens(std::vector<Token> context, std::vector<Token> question = {});
  /// The context already prefilled and compressed elsewhere (a stored context, kvslim/context.h):
  /// `cache` holds its entries, the next token runs at `next_position`, `logits` [n_vocab] are the
  /// last context token's, and `context_stats` carries the context's figures (entries, bytes, peak,
  /// press time; its prefill time is not this request's: prefill_seconds counts the question only).
  /// Only the question is prefilled; the press is reset and sees the question and the decode steps.
  /// Throws kvslim::Error like set_prompt_tokens, and for a cache that does not fit the model or
  /// logits that are not n_vocab values.
  void set_prompt_cached(std::vector<Token> context, KVCache cache, int32_t next_position, std::vector<float> logits,
                         const RequestStats& context_stats, std::vector<Token> question = {});

  // --- step-wise ----------------------------------------------------------------------------
  /// Runs the next chunk of context and lets the press compress (resetting the press before the
  /// first chunk), or, once the context is in, appends the question. Returns true when the whole
  /// prompt is in: logits() then holds the next-token distribution and stats() the cache figures.
  bool prefill_step();
  /// prefill_step() until the prompt is in.
  void prefill();
  bool prefilled() const { return prefilled_; }
  /// Whether the whole context is in and compressed (the question may still be pending): the
  /// moment to inspect what the press kept.
  bool context_prefilled() const { return prompt_set_ && context_done_ == context_.size(); }

  /// Chooses the next token from logits() with the request's sampler; does not advance.
  Token sample();
  /// The decode step: runs `token` at position() (decode-time attention selection, the hidden-state
  /// callback and the press's decode-time eviction included) and returns the next-token logits.
  /// Teacher forcing (fidelity) and benchmarks call it directly; generation goes through step().
  /// Throws kvslim::Error when the context is full.
  const std::vector<float>& advance(Token token);
  /// One generated token: sample, stop conditions, stream to the token callback, then advance()
  /// unless finished. Prefills first when needed. Returns false once the request has finished.
  bool step();
  /// Prefills when needed and steps until finished; `on_token` (optional) streams each token.
  /// Returns the generated text.
  const std::string& run(const TokenCallback& on_token = nullptr);
  /// Streaming callback used by step() (and set by run()).
  void set_token_callback(TokenCallback cb) { on_token_ = std::move(cb); }

  /// Asks the request to stop at its next chunk or token boundary; safe from any thread.
  void cancel() { cancel_.store(true, std::memory_order_relaxed); }
  bool cancel_requested() const { return cancel_.load(std::memory_order_relaxed); }
  /// Drops every cache entry at position >= `position`, continues there and clears the finished
  /// state (logits() is empty until the next advance()). Throws kvslim::Error when `position` is
  /// negative or beyond position().
  void rewind(int32_t position);

  // --- state --------------------------------------------------------------------------------
  bool finished() const { return finish_ != FinishReason::None; }
  FinishReason finish_reason() const { return finish_; }
  /// Next-token logits [n_vocab] after the last prefill_step()/advance().
  const std::vector<float>& logits() const { return logits_; }
  const std::vector<Token>& context_tokens() const { return context_; }
  const std::vector<Token>& question_tokens() const { return question_; }
  /// Sampled tokens, end-of-generation included.
  const std::vector<Token>& generated() const { return generated_; }
  /// Generated text (stop string and what follows excluded).
  const std::string& text() const { return text_; }
  /// Figures so far; cache figures are final once prefilled.
  const RequestStats& stats() const;
  /// Position of the next token.
  int32_t position() const;
  const Model& model() const { return model_; }
  Press& press();
  /// The press as the runner drives it (internal: src/press/authoring.h).
  PressImpl& press_impl() { return *press_; }
  const KVCache& cache() const;
  Session& session();
  const Session& session() const;
  const RequestOptions& options() const { return opt_; }

 private:
  void finish(FinishReason r);
  /// step() up to, not including, advance(): returns true with the token to run next, false once
  /// finished.
  bool sample_step(Token* next);
  friend std::vector<std::exception_ptr> step_batch(const std::vector<Request*>& requests);
  const Model& model_;
  std::unique_ptr<Press> owned_press_;
  PressImpl* press_;  // every Press is a PressImpl (Press's constructor is private to it)
  RequestOptions opt_;
  std::unique_ptr<Session> session_;
  std::unique_ptr<Sampler> sampler_;
  std::vector<Token> context_, question_, generated_;
  std::vector<float> logits_;
  std::string text_;
  size_t context_done_ = 0;
  size_t streamed_ = 0;  // bytes of text_ handed to the token callback
  bool prompt_set_ = false, prefilled_ = false, decode_started_ = false;
  FinishReason finish_ = FinishReason::None;
  TokenCallback on_token_;
  std::atomic<bool> cancel_{false};
  mutable RequestStats stats_;
  double decode_t0_ = 0;  // steady-clock seconds when the first token was sampled
};

/// Advances every unfinished request in `requests` by one step() (each with its own callback).
/// Requests must be distinct and share one model. The decode steps of all requests whose press
/// needs no decode-time observation or attention selection run in one pass over the weights
/// (Session::decode_batch: continuous batching, bit-identical to stepping them one by one); the
/// others step on their own. A request whose step fails (a numeric overflow in its cache, its
/// press's refusal) fails alone: the result's entry i holds request i's exception (null when it
/// stepped or had finished; a failed decode pass leaves its cache as before the step), and the
/// other requests' tokens are those they get without it.
std::vector<std::exception_ptr> step_batch(const std::vector<Request*>& requests);

}  // namespace kvslim
