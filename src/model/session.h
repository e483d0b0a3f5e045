#pragma once
// A session runs a model over tokens on its own KV cache: batched prefill and single-token decode.
#include <exception>
#include <functional>
#include <memory>
#include <vector>

#include "kvslim/kv_options.h"
#include "kvslim/model.h"
#include "kv/cache.h"

namespace kvslim {

/// Called by Session::forward at fixed points of every layer; declared in src/model/layer_hook.h
/// (for press authors and the request runner).
class LayerHook;
/// Input rows run instead of token ids; declared in src/model/input_override.h (RestoreKV's
/// restore pass).
class InputOverride;

/// The narrow interface through which a press runs the model on the cache it compresses (KVzip's
/// replay): run tokens after what is cached with a hook, read the cache, rewind. The request
/// runner's session implements it.
class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  virtual const Model& model() const = 0;
  virtual const KVCache& cache() const = 0;
  /// Position of the next token.
  virtual int32_t next_position() const = 0;
  /// Positions available in all (the context size).
  virtual int n_ctx() const = 0;
  /// Runs `tokens` at next_position().. (their entries are appended) with `hook` (may be nullptr);
  /// returns the last token's logits [n_vocab]. Throws kvslim::Error when the context is full.
  virtual std::vector<float> run(const std::vector<Token>& tokens, LayerHook* hook) = 0;
  /// The same with input rows instead of tokens' embeddings (input.n() positions; the hook sees
  /// token id 0 for each). Throws kvslim::Error as run, or when the rows' width is not n_embd.
  virtual std::vector<float> run_inputs(const InputOverride& input, LayerHook* hook) = 0;
  /// Drops every entry at position >= `position` and continues there.
  virtual void rewind(int32_t position) = 0;
};

/// Owns a KV cache and the position counter for one request. As a ModelRunner it is what a press
/// that runs the model again (KVzip's replay) is handed, never the Session itself.
class Session : public ModelRunner {
 public:
  /// Throws kvslim::Error when options are invalid for the model.
  Session(const Model& model, SessionOptions opt);

  /// Runs `tokens` at positions next_position().. appending their entries to the cache.
  /// Returns logits [n_vocab] of the last token, or, when `all_logits`, [tokens.size()][n_vocab].
  /// `hook` (optional) is called at the fixed points of every layer (see layer_hook.h).
  /// Throws kvslim::Error if the context size would be exceeded or a token id is out of range.
  std::vector<float> forward(const std::vector<Token>& tokens, bool all_logits = false, LayerHook* hook = nullptr);
  /// ModelRunner: forward(tokens, false, hook).
  std::vector<float> run(const std::vector<Token>& tokens, LayerHook* hook) override {
    return forward(tokens, false, hook);
  }
  /// forward() over input rows instead of tokens' embeddings (model/input_override.h): row i at
  /// position next_position() + i, with the rows' LoRA adapter on the seven projections of every
  /// layer for these rows only. Throws kvslim::Error for no rows, rows whose width is not n_embd,
  /// or as forward().
  std::vector<float> forward_inputs(const InputOverride& input, bool all_logits = false, LayerHook* hook = nullptr);
  /// ModelRunner: forward_inputs(input, false, hook).
  std::vector<float> run_inputs(const InputOverride& input, LayerHook* hook) override {
    return forward_inputs(input, false, hook);
  }

  /// One decode step for several sessions in one pass over the weights (continuous batching):
  /// tokens[i] runs at sessions[i]->next_position() on sessions[i]'s cache. Returns logits
  /// [sessions.size()][n_vocab], bit-identical to sessions[i]->forward({tokens[i]}): it is the same
  /// layer over a batch of one row per session, whose rows never mix (f32/f16/bf16 weights are
  /// multiplied three rows at a time, as forward does for fewer than four tokens). Calls no hook: a
  /// session whose press needs a decode-time observation or attention selection goes through
  /// forward(). Sessions must be distinct, over the same model and with the same `exact` option
  /// (else kvslim::Error). A row that fails (context full, bad token id, numeric overflow) fails
  /// alone: with `errors`, errors[i] holds row i's exception (null when it succeeded), its session
  /// is left as it was and its logits are zero, while the other rows finish as if it had not been
  /// in the batch; without `errors`, the first row's error is thrown after the pass.
  static std::vector<float> decode_batch(const std::vector<Session*>& sessions, const std::vector<Token>& tokens,
                                         std::vector<std::exception_ptr>* errors = nullptr);

  KVCache& cache() { return cache_; }
  const KVCache& cache() const override { return cache_; }
  const Model& model() const override { return model_; }
  int32_t next_position() const override { return next_pos_; }
  int n_ctx() const override { return n_ctx_; }
  /// Forgets everything: empty cache, position 0.
  void reset();
  /// Wall seconds this session's tokens have spent in the layers' attention step (the scores over
  /// the cache and the weighted sum of values); the rest of a forward pass is the projections, the
  /// feed-forward and the output. In a decode batch of several sessions, the batch's attention
  /// counts for each. Kept across reset(); take differences.
  double attention_seconds() const { return attention_seconds_; }
  /// Drops every entry at position >= `position` from every segment and continues at `position`
  /// (KVzip discards its replay this way). Throws kvslim::Error when `position` is negative or
  /// beyond next_position().
  void rewind(int32_t position) override;
  /// Continues from a cache built elsewhere (a stored context, kvslim/context.h): replaces the
  /// cache (its codecs included) and continues at `next_position`. Throws kvslim::Error when the
  /// cache's shape differs from the model's, or `next_position` is below the cache's
  /// next_position() or beyond n_ctx().
  void restore(KVCache cache, int32_t next_position);

 private:
  /// forward() and forward_inputs(): the tokens (or input rows) in batches of opt_.batch.
  std::vector<float> forward_batches(const std::vector<Token>& tokens, bool all_logits, LayerHook* hook,
                                     const InputOverride* input);
  /// One session's consecutive rows of a forward batch (session.cpp).
  struct Rows;
  /// The transformer layers over a batch of rows from one or more sessions (the only forward pass:
  /// a prefill batch is one Rows of many tokens, a decode step of many sessions many Rows of one).
  static void forward_rows(std::vector<Rows>& runs);
  /// Causal attention of every run's rows over its own session's segments of layer l.
  static void attend_runs(std::vector<Rows>& runs, int l, const HParams& hp, const float* q, float* out,
                          const std::vector<bool>& want_mass);
  const Model& model_;
  SessionOptions opt_;
  int n_ctx_;
  KVCache cache_;
  int32_t next_pos_ = 0;
  double attention_seconds_ = 0;
};

}  // namespace kvslim
