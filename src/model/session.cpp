// The llama-family forward pass over a per-(layer, KV head) cache.
#include "kvslim/session.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>

#include <fmt/format.h>

#include "kernels/activation.h"
#include "kernels/attention.h"
#include "kernels/matmul.h"
#include "kernels/threads.h"
#include "model/input_override.h"
#include "model/layer_hook.h"
#include "model/lora.h"
#include "model/numeric_guard.h"
#include "model/rope.h"

namespace kvslim {

Session::Session(const Model& model, SessionOptions opt)
    : model_(model), opt_(opt),
      n_ctx_(opt.n_ctx > 0 ? opt.n_ctx : model.hparams().n_ctx_train),
      cache_(model.hparams().n_layer, model.hparams().n_head_kv, model.hparams().head_dim, opt.key_codec,
             opt.value_codec, opt.kv_quant) {
  if (opt.n_ctx < 0) throw Error(fmt::format("context size n_ctx {} must not be negative (0 = the model's)", opt.n_ctx));
  if (opt_.batch <= 0) opt_.batch = 256;
}

void Session::reset() {
  cache_.clear();
  next_pos_ = 0;
}

void Session::restore(KVCache cache, int32_t next_position) {
  const HParams& hp = model_.hparams();
  if (cache.n_layer() != hp.n_layer || cache.n_head_kv() != hp.n_head_kv || cache.head_dim() != hp.head_dim)
    throw Error(fmt::format("restore: a cache of {} layers x {} KV heads x head_dim {} does not fit the model's {} x {} x {}",
                            cache.n_layer(), cache.n_head_kv(), cache.head_dim(), hp.n_layer, hp.n_head_kv,
                            hp.head_dim));
  if (next_position < cache.next_position() || next_position > n_ctx_)
    throw Error(fmt::format("restore: next position {} is outside [{}, n_ctx {}]", next_position,
                            cache.next_position(), n_ctx_));
  cache_ = std::move(cache);
  next_pos_ = next_position;
}

void Session::rewind(int32_t position) {
  if (position < 0 || position > next_pos_)
    throw Error(fmt::format("rewind: position {} is outside [0, {}]", position, next_pos_));
  for (int l = 0; l < cache_.n_layer(); ++l)
    for (int h = 0; h < cache_.n_head_kv(); ++h) {
      Segment& s = cache_.seg(l, h);
      const auto& p = s.positions();
      // Positions may be out of order after re-rotation, so test every entry.
      std::vector<int32_t> keep;
      keep.reserve(p.size());
      for (size_t i = 0; i < p.size(); ++i)
        if (p[i] < position) keep.push_back(static_cast<int32_t>(i));
      if (keep.size() != p.size()) s.retain(keep);
    }
  next_pos_ = position;
}

namespace {

// The sum of squares in double, over 8 partial sums (one dependent chain of double adds was 1% of a
// prefill), added pairwise: a fixed order, so a row's result depends only on the row.
void rms_norm(const float* x, const float* w, float* y, int n, float eps) {
  double part[8] = {};
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) part[j] += double(x[i + j]) * x[i + j];
  for (int j = 0; i < n; ++i, ++j) part[j] += double(x[i]) * x[i];
  const double ss = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
  float scale = 1.0f / std::sqrt(static_cast<float>(ss / n) + eps);
  for (int i = 0; i < n; ++i) y[i] = x[i] * scale * w[i];
}

}  // namespace

std::vector<float> Session::forward(const std::vector<Token>& tokens, bool all_logits, LayerHook* hook) {
  const HParams& hp = model_.hparams();
  if (tokens.empty()) throw Error("forward: no tokens to process");
  if (next_pos_ + static_cast<int64_t>(tokens.size()) > n_ctx_)
    throw Error(fmt::format("prompt of {} tokens at position {} exceeds the context size n_ctx {}", tokens.size(),
                            next_pos_, n_ctx_));
  for (Token t : tokens)
    if (t < 0 || t >= hp.n_vocab) throw Error(fmt::format("token id {} is outside the vocabulary (0..{})", t, hp.n_vocab - 1));
  if (hook) hook->begin(tokens.data(), static_cast<int>(tokens.size()), next_pos_);
  const size_t nv = hp.n_vocab;
  std::vector<float> logits(all_logits ? tokens.size() * nv : nv);
  for (size_t b = 0; b < tokens.size(); b += opt_.batch) {
    int n = static_cast<int>(std::min<size_t>(opt_.batch, tokens.size() - b));
    bool last = b + n == tokens.size();
    float* out = all_logits ? logits.data() + b * nv : (last ? logits.data() : nullptr);
    forward_batch(tokens.data() + b, n, all_logits, out, hook);
    if (opt_.on_batch_done) opt_.on_batch_done(next_pos_);
  }
  return logits;
}

namespace {

/// The forward pass's activations, kept by each thread between calls: a prefill batch's buffers
/// (tens of MiB at 512 tokens) are reused by the next batch and by decode instead of being mapped,
/// zeroed on first touch and unmapped again at every call (in this project's VMs each of those page
/// faults is a trap, about 1% of a long prefill; the unmapping after the last batch was most of the
/// first decode token's extra 30 ms). Sized for the largest batch the thread has run.
struct ForwardScratch {
  std::vector<float> x, xn, tmp, q, k, v, att, g, u;
  /// Sizes the buffers for n rows: x, xn, tmp [n][n_embd]; q, att [n][n_head * hd]; k, v [n][n_head_kv
  /// * hd]; g, u [n][n_ff]. Contents are left over from earlier calls: every step writes its rows.
  void size_for(const HParams& hp, int n) {
    const size_t rows = static_cast<size_t>(n);
    for (auto* b : {&x, &xn, &tmp}) b->resize(rows * hp.n_embd);
    for (auto* b : {&q, &att}) b->resize(rows * hp.n_head * hp.head_dim);
    for (auto* b : {&k, &v}) b->resize(rows * hp.n_head_kv * hp.head_dim);
    for (auto* b : {&g, &u}) b->resize(rows * hp.n_ff);
  }
};

/// The calling thread's ForwardScratch, or a fresh one while the thread's is in use (a hook that
/// runs a forward pass from inside another one); returned when the lease ends.
class ScratchLease {
 public:
  ScratchLease() : s_(busy() ? own_.emplace() : scratch()) { ++busy(); }
  ~ScratchLease() { --busy(); }
  ScratchLease(const ScratchLease&) = delete;
  ScratchLease& operator=(const ScratchLease&) = delete;
  ForwardScratch& operator*() { return s_; }

 private:
  static ForwardScratch& scratch() {
    static thread_local ForwardScratch s;
    return s;
  }
  static int& busy() {
    static thread_local int n = 0;
    return n;
  }
  std::optional<ForwardScratch> own_;
  ForwardScratch& s_;
};

/// y[t] = rms_norm(x[t]) * w for each of n rows of d values.
void norm_rows(const float* x, const std::vector<float>& w, float* y, int n, int d, float eps) {
  parallel_for(n, static_cast<int64_t>(n) * d * 2, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t)
      rms_norm(x + static_cast<size_t>(t) * d, w.data(), y + static_cast<size_t>(t) * d, d, eps);
  });
}

/// g <- silu(g) * u over n rows of n_ff values, rows split between the threads (an element costs
/// about as much as 8 multiply-adds: the exp's polynomial and a division).
void swiglu_rows(float* g, const float* u, int n, int n_ff, bool ex) {
  parallel_for(n, static_cast<int64_t>(n) * n_ff * 8, [&](int64_t b, int64_t e) {
    silu_mul(g + b * n_ff, u + b * n_ff, (e - b) * n_ff, ex);
  });
}

/// q, k, v = xn W_q, xn W_k, xn W_v (+ the biases qwen2 has), one pass over the three matrices.
void project_qkv(const LayerWeights& L, const float* xn, int n, int dq, int dkv, float* q, float* k, float* v, bool ex) {
  matmul_group({L.wq.get(), L.wk.get(), L.wv.get()}, xn, n, {q, k, v}, ex);
  if (L.bq.empty()) return;
  for (int t = 0; t < n; ++t) {
    for (int i = 0; i < dq; ++i) q[t * dq + i] += L.bq[i];
    for (int i = 0; i < dkv; ++i) {
      k[t * dkv + i] += L.bk[i];
      v[t * dkv + i] += L.bv[i];
    }
  }
}

/// Rotates the n rows of q ([n][n_head][hd]) and k ([n][n_head_kv][hd]) by their positions' angles.
void rope_rows(const HParams& hp, const std::vector<float>& cs, const std::vector<float>& sn, int n, float* q, float* k) {
  const int hd = hp.head_dim, half = hd / 2, dq = hp.n_head * hd, dkv = hp.n_head_kv * hd;
  for (int t = 0; t < n; ++t) {
    rope::apply(q + static_cast<size_t>(t) * dq, hp.n_head, hd, cs.data() + t * half, sn.data() + t * half, hp.rope_neox);
    rope::apply(k + static_cast<size_t>(t) * dkv, hp.n_head_kv, hd, cs.data() + t * half, sn.data() + t * half,
               hp.rope_neox);
  }
}

/// Causal attention of the batch's n query rows over layer l's segments (the batch's own entries
/// follow n_old[h] older ones). subset (when non-null): the older entries each KV head (or query
/// head) reads, as LayerHook::before_attention chose them. mass (when non-null): [kv head][entry],
/// the probability every entry received summed over the batch's queries and the GQA group, added
/// in a fixed order so it does not depend on the thread count. out: [n][n_head][hd].
void attend(const KVCache& cache, int l, const HParams& hp, const float* q, int n, const std::vector<size_t>& n_old,
            const std::vector<std::vector<int32_t>>* subset, std::vector<std::vector<float>>* mass, float* out) {
  const int hd = hp.head_dim, nh = hp.n_head, nkv = hp.n_head_kv, G = hp.n_group(), dq = nh * hd;
  // One unit of work = one KV head x a tile of tokens; rows are (token, group head).
  const int tile = std::max(1, 64 / G);
  const int n_tiles = (n + tile - 1) / tile;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  std::vector<std::vector<float>> mass_part;
  if (mass) mass_part.assign(static_cast<size_t>(nkv) * n_tiles, {});
  auto attend_units = [&](int64_t b, int64_t e) {
    std::vector<float> qr, orow;
    std::vector<int32_t> vis;
    for (int64_t w = b; w < e; ++w) {
      int h = static_cast<int>(w / n_tiles), t0 = static_cast<int>(w % n_tiles) * tile;
      int t1 = std::min(n, t0 + tile), rows = (t1 - t0) * G;
      const Segment& s = cache.seg(l, h);
      qr.resize(static_cast<size_t>(rows) * hd);
      orow.resize(qr.size());
      vis.resize(rows);
      for (int t = t0; t < t1; ++t)
        for (int gi = 0; gi < G; ++gi) {
          int r = (t - t0) * G + gi;
          std::memcpy(&qr[static_cast<size_t>(r) * hd], &q[static_cast<size_t>(t) * dq + (h * G + gi) * hd], hd * sizeof(float));
          vis[r] = static_cast<int32_t>(n_old[h] + t + 1);
        }
      float* m = nullptr;
      if (mass) {
        auto& mp = mass_part[w];
        mp.assign(s.size(), 0.0f);
        m = mp.data();
      }
      if (subset && subset->size() == static_cast<size_t>(nh)) {
        // One subset per query head (ClusterKV's default): each row attends to its own.
        for (int r = 0; r < rows; ++r) {
          std::vector<int32_t> idx = (*subset)[h * G + r % G];
          for (int t = 0; t < n; ++t) idx.push_back(static_cast<int32_t>(n_old[h] + t));
          attend_segment_subset(s, idx.data(), static_cast<int>(idx.size()), qr.data() + static_cast<size_t>(r) * hd,
                                1, vis.data() + r, scale, orow.data() + static_cast<size_t>(r) * hd, hd);
        }
      } else if (subset) {
        // The selected old entries, then the batch's own entries (always attended, causally).
        std::vector<int32_t> idx = (*subset)[h];
        for (int t = 0; t < n; ++t) idx.push_back(static_cast<int32_t>(n_old[h] + t));
        attend_segment_subset(s, idx.data(), static_cast<int>(idx.size()), qr.data(), rows, vis.data(), scale,
                              orow.data(), hd);
      } else {
        attend_segment(s, qr.data(), rows, vis.data(), scale, orow.data(), hd, m);
      }
      for (int t = t0; t < t1; ++t)
        for (int gi = 0; gi < G; ++gi)
          std::memcpy(&out[static_cast<size_t>(t) * dq + (h * G + gi) * hd], &orow[static_cast<size_t>((t - t0) * G + gi) * hd],
                      hd * sizeof(float));
    }
  };
  // Multiply-adds of this layer's attention (scores and values over the cache): tiny models and
  // short contexts stay on the calling thread.
  const int64_t attn_macs = static_cast<int64_t>(n) * nh * hd * 2 * static_cast<int64_t>(cache.seg(l, 0).size());
  parallel_for(static_cast<int64_t>(nkv) * n_tiles, attn_macs, attend_units);
  if (!mass) return;
  mass->assign(nkv, {});
  for (int h = 0; h < nkv; ++h) {
    auto& dst = (*mass)[h];
    dst.assign(cache.seg(l, h).size(), 0.0f);
    for (int ti = 0; ti < n_tiles; ++ti) {
      const auto& src = mass_part[static_cast<size_t>(h) * n_tiles + ti];
      for (size_t j = 0; j < src.size(); ++j) dst[j] += src[j];
    }
  }
}

/// x += W x_in for the n rows (a residual branch's output projection), plus the adapter's update
/// of projection `t` of layer l when `lora` is given (RestoreKV's restore pass only).
void add_projection(const WeightView& W, const float* in, int n, float* tmp, std::vector<float>& x, bool ex,
                    const LoraAdapter* lora, int l, LoraTarget t) {
  matmul(W, in, n, tmp, ex);
  if (lora) lora->add(l, t, in, n, tmp);
  for (size_t i = 0; i < x.size(); ++i) x[i] += tmp[i];
}

}  // namespace

// One batch of n tokens through every layer, llama-style: each layer is norm, Q/K/V, RoPE, store,
// attend, output projection, then the SwiGLU feed-forward, each a residual branch. The hook (if
// any) sees the layer after Q/K/V, before attention and after attention.
void Session::forward_batch(const Token* tokens, int n, bool all_logits, float* logits, LayerHook* hook) {
  const HParams& hp = model_.hparams();
  const int d = hp.n_embd, hd = hp.head_dim, nkv = hp.n_head_kv;
  const int dq = hp.n_head * hd, dkv = nkv * hd;
  const bool ex = opt_.exact;

  // Positions and their rotation angles.
  std::vector<int32_t> pos(n);
  for (int t = 0; t < n; ++t) pos[t] = next_pos_ + t;
  std::vector<float> cs, sn;
  rope::tables(hp, model_.rope_freqs(), pos.data(), n, cs, sn);

  // Token embeddings: the residual stream x, [n][d]. An InputOverride hook (model/input_override.h:
  // RestoreKV's restore pass) gives the rows itself and may switch a LoRA adapter on.
  ScratchLease lease;
  ForwardScratch& S = *lease;
  S.size_for(hp, n);
  std::vector<float>&x = S.x, &xn = S.xn, &tmp = S.tmp, &q = S.q, &k = S.k, &v = S.v, &att = S.att, &g = S.g, &u = S.u;
  const InputOverride* over = hook ? dynamic_cast<const InputOverride*>(hook) : nullptr;
  const LoraAdapter* lora = over ? over->lora() : nullptr;
  const WeightView& emb = model_.token_embd();
  for (int t = 0; t < n; ++t) {
    if (over)
      std::memcpy(x.data() + static_cast<size_t>(t) * d, over->row(pos[t], d), static_cast<size_t>(d) * sizeof(float));
    else
      dequantize_row(emb.type, emb.row(tokens[t]), x.data() + t * d, d);
  }

  std::vector<size_t> n_old(nkv);
  std::vector<std::vector<int32_t>> subset;
  std::vector<std::vector<float>> mass;
  const bool want_mass = hook && hook->wants_attention_mass();

  for (int l = 0; l < hp.n_layer; ++l) {
    const LayerWeights& L = model_.layer(l);
    LayerStep step{l, n, tokens, pos.data(), &hp, x.data(), xn.data(), q.data(), &cache_, n_old.data()};

    // 1. Norm: the attention input.
    norm_rows(x.data(), L.attn_norm, xn.data(), n, d, hp.rms_eps);
    // 2. Q/K/V projections (queries before RoPE: what Expected Attention and KVzap read).
    project_qkv(L, xn.data(), n, dq, dkv, q.data(), k.data(), v.data(), ex);
    if (lora) {
      lora->add(l, LoraTarget::Q, xn.data(), n, q.data());
      lora->add(l, LoraTarget::K, xn.data(), n, k.data());
      lora->add(l, LoraTarget::V, xn.data(), n, v.data());
    }
    if (hook) hook->after_qkv(step);
    // 3. RoPE on queries and keys: entries are cached rotated.
    rope_rows(hp, cs, sn, n, q.data(), k.data());
    // 4. Store the batch's entries, then attend: entry order is causal order. A layer that shares
    // an earlier layer's entries (KVCache::share_layer, CLA) stores nothing: the source layer
    // stored this batch's entries already, and its keys and values are what this layer reads.
    const int src = cache_.source(l);
    if (hook && src != l)
      throw Error(fmt::format("layer {} reads layer {}'s entries (press cla): a press that observes the forward pass "
                              "(replay, decode-time selection or scoring) cannot run on it: a press that replays the context must come "
                              "before cla in the composition, and one that observes decoding (h2o, ...) cannot be "
                              "composed with cla",
                              l, src));
    for (int h = 0; h < nkv; ++h) {
      Segment& s = cache_.seg(src, h);
      if (src != l) {
        n_old[h] = s.size() - static_cast<size_t>(n);
        continue;
      }
      n_old[h] = s.size();
      for (int t = 0; t < n; ++t) s.append(k.data() + t * dkv + h * hd, v.data() + t * dkv + h * hd, pos[t]);
    }
    // 5. Attend: to every entry, or to the subset the hook chose (decode-time selection).
    bool use_subset = false;
    if (hook) {
      subset.assign(nkv, {});
      use_subset = hook->before_attention(step, subset);
    }
    attend(cache_, src, hp, q.data(), n, n_old, use_subset ? &subset : nullptr, want_mass ? &mass : nullptr, att.data());
    if (hook) hook->after_attention(step, want_mass ? &mass : nullptr);
    // 6. Output projection back into the residual stream.
    add_projection(*L.wo, att.data(), n, tmp.data(), x, ex, lora, l, LoraTarget::O);
    // 7. Feed-forward: SwiGLU, silu(xn W_gate) * (xn W_up), then W_down into the residual stream.
    norm_rows(x.data(), L.ffn_norm, xn.data(), n, d, hp.rms_eps);
    matmul_group({L.w_gate.get(), L.w_up.get()}, xn.data(), n, {g.data(), u.data()}, ex);
    if (lora) {
      lora->add(l, LoraTarget::Gate, xn.data(), n, g.data());
      lora->add(l, LoraTarget::Up, xn.data(), n, u.data());
    }
    swiglu_rows(g.data(), u.data(), n, hp.n_ff, ex);
    add_projection(*L.w_down, g.data(), n, tmp.data(), x, ex, lora, l, LoraTarget::Down);
    check_layer_finite(x.data(), x.size(), src, k.data(), v.data(), n, cache_, n_old);
  }
  next_pos_ += n;

  // Logits of the last token (or every token): final norm and the output matrix.
  if (!logits) return;
  int first = all_logits ? 0 : n - 1;
  int rows = n - first;
  norm_rows(x.data() + static_cast<size_t>(first) * d, model_.output_norm(), xn.data(), rows, d, hp.rms_eps);
  matmul(model_.output(), xn.data(), rows, logits, ex);
  check_logits_finite(logits, static_cast<size_t>(rows) * hp.n_vocab);
}

}  // namespace kvslim

namespace kvslim {

namespace {

// Float weights take the per-row dot path below four tokens and sgemm tiles above, which round
// differently; three rows at a time keep a batched step bit-identical to a single decode step
// while each weight row is still read once for the three (it stays in cache between them). The
// exact path (tests) runs row by row.
void matmul_rows(const WeightView& W, const float* X, int n, float* Y, bool ex) {
  const bool fp = W.type == GGMLType::F32 || W.type == GGMLType::F16 || W.type == GGMLType::BF16;
  const int step = ex ? 1 : fp ? 3 : n;
  for (int b = 0; b < n; b += step) {
    const int m = std::min(step, n - b);
    matmul(W, X + static_cast<size_t>(b) * W.cols, m, Y + static_cast<size_t>(b) * W.rows, ex);
  }
}

}  // namespace

std::vector<float> Session::decode_batch(const std::vector<Session*>& sessions, const std::vector<Token>& tokens) {
  if (sessions.empty() || sessions.size() != tokens.size())
    throw Error(fmt::format("decode_batch: {} sessions for {} tokens", sessions.size(), tokens.size()));
  const Model& model = sessions[0]->model_;
  const HParams& hp = model.hparams();
  const bool ex = sessions[0]->opt_.exact;
  const int n = static_cast<int>(sessions.size());
  for (int i = 0; i < n; ++i) {
    Session& s = *sessions[i];
    if (&s.model_ != &model || s.opt_.exact != ex) throw Error("decode_batch: sessions differ in model or options");
    if (s.next_pos_ + 1 > s.n_ctx_)
      throw Error(fmt::format("token at position {} exceeds the context size n_ctx {}", s.next_pos_, s.n_ctx_));
    if (tokens[i] < 0 || tokens[i] >= hp.n_vocab)
      throw Error(fmt::format("token id {} is outside the vocabulary (0..{})", tokens[i], hp.n_vocab - 1));
  }
  const int d = hp.n_embd, hd = hp.head_dim, nh = hp.n_head, nkv = hp.n_head_kv, G = hp.n_group();
  const int dq = nh * hd, dkv = nkv * hd, half = hd / 2;

  // Row i is session i's token at its own position.
  std::vector<int32_t> pos(n);
  for (int i = 0; i < n; ++i) pos[i] = sessions[i]->next_pos_;
  std::vector<float> cs, sn;
  rope::tables(hp, model.rope_freqs(), pos.data(), n, cs, sn);
  ScratchLease lease;
  ForwardScratch& S = *lease;
  S.size_for(hp, n);
  std::vector<float>&x = S.x, &xn = S.xn, &tmp = S.tmp, &q = S.q, &k = S.k, &v = S.v, &att = S.att, &g = S.g, &u = S.u;
  const WeightView& emb = model.token_embd();
  for (int i = 0; i < n; ++i) dequantize_row(emb.type, emb.row(tokens[i]), x.data() + static_cast<size_t>(i) * d, d);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));

  for (int l = 0; l < hp.n_layer; ++l) {
    const LayerWeights& L = model.layer(l);
    // Norm and Q/K/V for every row: one pass over wq, wk, wv.
    norm_rows(x.data(), L.attn_norm, xn.data(), n, d, hp.rms_eps);
    const bool fp = L.wq->type == GGMLType::F32 || L.wq->type == GGMLType::F16 || L.wq->type == GGMLType::BF16;
    if (fp || ex) {
      matmul_rows(*L.wq, xn.data(), n, q.data(), ex);
      matmul_rows(*L.wk, xn.data(), n, k.data(), ex);
      matmul_rows(*L.wv, xn.data(), n, v.data(), ex);
    } else {
      matmul_group({L.wq.get(), L.wk.get(), L.wv.get()}, xn.data(), n, {q.data(), k.data(), v.data()}, ex);
    }
    if (!L.bq.empty())
      for (int i = 0; i < n; ++i) {
        for (int j = 0; j < dq; ++j) q[i * dq + j] += L.bq[j];
        for (int j = 0; j < dkv; ++j) {
          k[i * dkv + j] += L.bk[j];
          v[i * dkv + j] += L.bv[j];
        }
      }
    for (int i = 0; i < n; ++i) {
      rope::apply(q.data() + i * dq, nh, hd, cs.data() + i * half, sn.data() + i * half, hp.rope_neox);
      rope::apply(k.data() + i * dkv, nkv, hd, cs.data() + i * half, sn.data() + i * half, hp.rope_neox);
    }
    // Store each row's entry in its own cache, then attend over that cache only; a layer sharing
    // an earlier layer's entries (KVCache::share_layer) stores nothing and reads its source's.
    int64_t macs = 0;
    for (int i = 0; i < n; ++i)
      for (int h = 0; h < nkv; ++h) {
        const int src = sessions[i]->cache_.source(l);
        Segment& s = sessions[i]->cache_.seg(src, h);
        if (src == l) s.append(k.data() + i * dkv + h * hd, v.data() + i * dkv + h * hd, pos[i]);
        macs += static_cast<int64_t>(G) * hd * 2 * static_cast<int64_t>(s.size());
      }
    parallel_for(static_cast<int64_t>(n) * nkv, macs, [&](int64_t b, int64_t e) {
      std::vector<float> orow(static_cast<size_t>(G) * hd);
      std::vector<int32_t> vis(G);
      for (int64_t w = b; w < e; ++w) {
        const int i = static_cast<int>(w / nkv), h = static_cast<int>(w % nkv);
        const Segment& s = sessions[i]->cache_.seg(sessions[i]->cache_.source(l), h);
        for (int gi = 0; gi < G; ++gi) vis[gi] = static_cast<int32_t>(s.size());
        // The group's query rows are contiguous in q: heads h*G .. h*G+G-1 of row i.
        attend_segment(s, q.data() + static_cast<size_t>(i) * dq + static_cast<size_t>(h) * G * hd, G, vis.data(), scale,
                       orow.data(), hd, nullptr);
        std::memcpy(att.data() + static_cast<size_t>(i) * dq + static_cast<size_t>(h) * G * hd, orow.data(),
                    orow.size() * sizeof(float));
      }
    });
    matmul_rows(*L.wo, att.data(), n, tmp.data(), ex);
    for (size_t j = 0; j < x.size(); ++j) x[j] += tmp[j];
    // Feed-forward for every row: one pass over the gate, up and down matrices.
    norm_rows(x.data(), L.ffn_norm, xn.data(), n, d, hp.rms_eps);
    if (fp || ex) {
      matmul_rows(*L.w_gate, xn.data(), n, g.data(), ex);
      matmul_rows(*L.w_up, xn.data(), n, u.data(), ex);
    } else {
      matmul_group({L.w_gate.get(), L.w_up.get()}, xn.data(), n, {g.data(), u.data()}, ex);
    }
    swiglu_rows(g.data(), u.data(), n, hp.n_ff, ex);
    matmul_rows(*L.w_down, g.data(), n, tmp.data(), ex);
    for (size_t j = 0; j < x.size(); ++j) x[j] += tmp[j];
  }
  for (int i = 0; i < n; ++i) ++sessions[i]->next_pos_;
  norm_rows(x.data(), model.output_norm(), xn.data(), n, d, hp.rms_eps);
  std::vector<float> logits(static_cast<size_t>(n) * hp.n_vocab);
  matmul_rows(model.output(), xn.data(), n, logits.data(), ex);
  return logits;
}

}  // namespace kvslim
