#pragma once
// A session runs a model over tokens on its own KV cache: batched prefill and single-token decode.
#include <functional>
#include <memory>
#include <vector>

#include "kvslim/kv_cache.h"
#include "kvslim/model.h"

namespace kvslim {

class Session;

/// Chooses, per layer, which cached entries a forward batch attends to, without evicting any
/// (decode-time selection, e.g. ClusterKV, arXiv 2412.03213).
class AttentionSelector {
 public:
  virtual ~AttentionSelector() = default;
  /// Called by Session::forward for each layer, after the batch's own entries are appended.
  /// `q` holds the batch's queries, [n][n_head][head_dim], RoPE applied. Return false to attend to
  /// every entry. Otherwise fill subset[h] (one list per KV head, resized by the caller to
  /// n_head_kv) with strictly increasing indices of entries that existed before the batch; the
  /// batch's own entries are always attended (causally), whatever the subset says. A selector may
  /// instead resize `subset` to n_head: one list per query head (query head q reads KV head
  /// q / group).
  virtual bool select(int layer, const float* q, int n, const KVCache& cache,
                      std::vector<std::vector<int32_t>>& subset) = 0;
};

/// What a press asked the forward pass to record while it prefills (see Press).
struct ObservationRequest {
  int window = 0;                  ///< record queries of the last `window` context tokens
  bool hidden_states = false;      ///< record each layer's input hidden state for every token
  bool attention_mass = false;     ///< accumulate, per entry, the attention it receives
  bool tokens = false;             ///< record every token of the call with its position (KVzip's replay)
  /// Called for every layer (in order) of every batch with the attention input of all the batch's
  /// tokens (the layer-input hidden state after the attention RMSNorm), [n][n_embd], and their
  /// positions, whatever `record_from` says: lets a press score entries as they are created
  /// (KVzap) without storing hidden states. May throw kvslim::Error (forward passes it on).
  std::function<void(int layer, const float* attn_input, int n, int n_embd, const int32_t* positions)>
      on_attention_input;
  /// Called for every layer of every batch with the batch's queries before RoPE (biases added),
  /// [n][n_head][head_dim], and their positions (Expected Attention's query statistics).
  std::function<void(int layer, const float* queries, int n, int n_head, int head_dim, const int32_t* positions)>
      on_queries;
  /// Decode-time attention subset (ClusterKV); nullptr = attend to every entry.
  AttentionSelector* selector = nullptr;
};

/// What the forward pass saw, for presses. Filled by Session::forward when asked.
struct Observation {
  /// [layer] -> [n_head][n_window][head_dim] query vectors (RoPE applied) of the observation window.
  std::vector<std::vector<float>> queries;
  std::vector<int32_t> window_positions;  ///< positions of the observation-window queries
  /// [layer] -> [n_tokens][n_embd] layer-input hidden states of the recorded tokens.
  std::vector<std::vector<float>> hidden;
  std::vector<int32_t> hidden_positions;
  /// [layer][kv head] -> per entry of the segment, the sum over queries and over the GQA group
  /// of the softmax probability the entry received (H2O's accumulated attention). Kept aligned
  /// with the segment by the press that uses it.
  std::vector<std::vector<std::vector<float>>> attention_mass;
  /// With ObservationRequest::tokens: every token of the forward call and its position.
  std::vector<Token> tokens;
  std::vector<int32_t> token_positions;
  /// The session that filled this observation, for presses that run the model again on the same
  /// cache (KVzip's replay). Set by Session::forward.
  Session* session = nullptr;
  int n_window() const { return static_cast<int>(window_positions.size()); }
  void clear();
};

/// Options of a session.
struct SessionOptions {
  int n_ctx = 0;                       ///< max positions; 0 = the model's training context
  KVCodec key_codec = KVCodec::F16;
  KVCodec value_codec = KVCodec::F16;
  KVQuantOptions kv_quant;             ///< KIVI and key rotation (see kv_cache.h)
  bool exact = false;                  ///< f32 products everywhere (reference-logit tests)
  int batch = 256;                     ///< tokens per forward batch during prefill
  /// Called after every forward batch with next_position(): progress lines during a long prefill.
  std::function<void(int32_t next_position)> on_batch_done;
};

/// Owns a KV cache and the position counter for one request.
class Session {
 public:
  /// Throws kvslim::Error when options are invalid for the model.
  Session(const Model& model, SessionOptions opt);

  /// Runs `tokens` at positions next_position().. appending their entries to the cache.
  /// Returns logits [n_vocab] of the last token, or, when `all_logits`, [tokens.size()][n_vocab].
  /// When `obs` and `req` are given, records what `req` asks for the positions in
  /// [record_from, +inf). Throws kvslim::Error if the context (-c) would be exceeded.
  std::vector<float> forward(const std::vector<Token>& tokens, bool all_logits = false,
                             const ObservationRequest* req = nullptr, Observation* obs = nullptr,
                             int32_t record_from = 0);

  /// One decode step for several sessions in one pass over the weights (continuous batching):
  /// tokens[i] runs at sessions[i]->next_position() on sessions[i]'s cache. Returns logits
  /// [sessions.size()][n_vocab], bit-identical to sessions[i]->forward({tokens[i]}) (f32/f16/bf16
  /// weights are multiplied three rows at a time, as forward does for fewer than four tokens).
  /// Records nothing and selects nothing: a session whose press needs a decode observation or an
  /// attention selector goes through forward(). Sessions must be distinct, over the same model and
  /// with the same `exact` option. Throws kvslim::Error like forward (context full, bad token id).
  static std::vector<float> decode_batch(const std::vector<Session*>& sessions, const std::vector<Token>& tokens);

  KVCache& cache() { return cache_; }
  const KVCache& cache() const { return cache_; }
  const Model& model() const { return model_; }
  int32_t next_position() const { return next_pos_; }
  int n_ctx() const { return n_ctx_; }
  /// Forgets everything: empty cache, position 0.
  void reset();
  /// Drops every entry at position >= `position` from every segment and continues at `position`
  /// (KVzip discards its replay this way). Throws kvslim::Error when `position` is negative or
  /// beyond next_position().
  void rewind(int32_t position);

 private:
  void forward_batch(const Token* tokens, int n, bool all_logits, float* logits, const ObservationRequest* req,
                     Observation* obs, int32_t record_from);
  const Model& model_;
  SessionOptions opt_;
  int n_ctx_;
  KVCache cache_;
  int32_t next_pos_ = 0;
};

}  // namespace kvslim
