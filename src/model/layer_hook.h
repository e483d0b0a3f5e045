#pragma once
// The one hook from the forward pass to presses (internal: press authors and the runner use it;
// src/model/session.h declares the narrow ModelRunner through which a press runs the model).
//
// Session::forward calls a LayerHook at three fixed points of every layer of every batch:
//   after_qkv          the attention input (RMSNorm applied) and the queries before RoPE
//   before_attention   queries with RoPE, the batch's entries already stored: may choose the
//                      subset of older entries the batch attends to (decode-time selection)
//   after_attention    the attention mass every entry received, when the hook asked for it
// What presses need (observation-window queries, attention mass, hidden states, the tokens to
// replay) is recorded by small hook classes in src/press/recorders.h; presses with their own
// per-layer work (Expected Attention's query statistics, KVzap's surrogate, ClusterKV's selection)
// implement the hook themselves. A press never holds the session: one that must run the model
// again (KVzip's replay) goes through ModelRunner (src/model/session.h).
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "kv/cache.h"
#include "kvslim/model.h"
#include "model/session.h"

namespace kvslim {

/// One layer of one forward batch, as a hook sees it. Pointers are valid during the call only.
struct LayerStep {
  int layer = 0;
  int n = 0;                          ///< tokens in the batch
  const Token* tokens = nullptr;      ///< [n]
  const int32_t* positions = nullptr; ///< [n] sequence positions of the batch's tokens
  const HParams* hp = nullptr;
  const float* input = nullptr;       ///< [n][n_embd] layer input (residual stream, before the norm)
  const float* attn_input = nullptr;  ///< [n][n_embd] after the attention RMSNorm
  /// [n][n_head][head_dim] queries: before RoPE (biases added) in after_qkv, RoPE applied from
  /// before_attention on.
  const float* q = nullptr;
  /// The cache; from before_attention on it holds the batch's entries, appended after n_old[h]
  /// older entries of KV head h.
  const KVCache* cache = nullptr;
  const size_t* n_old = nullptr;      ///< [n_head_kv], from before_attention on
};

/// Called by Session::forward at fixed points of each layer (see the top of this header). Every
/// method may throw kvslim::Error; the forward pass passes it on.
class LayerHook {
 public:
  virtual ~LayerHook() = default;
  /// Once per forward call, before the first batch: every token of the call and the position of
  /// the first.
  virtual void begin(const Token* tokens, int n, int32_t first_position) {}
  /// After the attention norm and the Q/K/V projections (step.q is before RoPE).
  virtual void after_qkv(const LayerStep& step) {}
  /// After RoPE and storing the batch's entries, before attention. Return false to attend to every
  /// entry. Otherwise fill subset (resized by the caller to n_head_kv) with strictly increasing
  /// indices of entries older than the batch, one list per KV head, or resize it to n_head for one
  /// list per query head (query head q reads KV head q / group); the batch's own entries are always
  /// attended, causally.
  virtual bool before_attention(const LayerStep& step, std::vector<std::vector<int32_t>>& subset) { return false; }
  /// Whether after_attention wants the attention mass of every entry.
  virtual bool wants_attention_mass() const { return false; }
  /// After attention. `mass` (when wants_attention_mass(), else nullptr): [kv head][entry] the sum
  /// over the batch's queries and the GQA group of the softmax probability each entry received.
  virtual void after_attention(const LayerStep& step, const std::vector<std::vector<float>>* mass) {}
};

/// Several hooks called in order at each point. before_attention: the first hook that selects
/// decides the subset (the spec parser refuses two decode-time selectors in one press).
class HookList : public LayerHook {
 public:
  HookList() = default;
  explicit HookList(std::vector<LayerHook*> hooks) : hooks_(std::move(hooks)) {}
  void add(LayerHook* h) {
    if (h) hooks_.push_back(h);
  }
  bool empty() const { return hooks_.empty(); }
  void begin(const Token* tokens, int n, int32_t first) override {
    for (LayerHook* h : hooks_) h->begin(tokens, n, first);
  }
  void after_qkv(const LayerStep& s) override {
    for (LayerHook* h : hooks_) h->after_qkv(s);
  }
  bool before_attention(const LayerStep& s, std::vector<std::vector<int32_t>>& subset) override {
    bool chosen = false;
    for (LayerHook* h : hooks_) {
      if (chosen) {
        std::vector<std::vector<int32_t>> ignored(subset.size());
        h->before_attention(s, ignored);  // recorders still see the step
      } else {
        chosen = h->before_attention(s, subset);
      }
    }
    return chosen;
  }
  bool wants_attention_mass() const override {
    for (LayerHook* h : hooks_)
      if (h->wants_attention_mass()) return true;
    return false;
  }
  void after_attention(const LayerStep& s, const std::vector<std::vector<float>>* mass) override {
    for (LayerHook* h : hooks_) h->after_attention(s, h->wants_attention_mass() ? mass : nullptr);
  }

 private:
  std::vector<LayerHook*> hooks_;
};

/// A hook that calls a function after Q/K/V of every layer (e.g. to collect attention inputs).
class AfterQKV : public LayerHook {
 public:
  explicit AfterQKV(std::function<void(const LayerStep&)> f) : f_(std::move(f)) {}
  void after_qkv(const LayerStep& step) override { f_(step); }

 private:
  std::function<void(const LayerStep&)> f_;
};

}  // namespace kvslim
