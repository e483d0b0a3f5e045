// The llama-family forward pass over a per-(layer, KV head) cache.
#include "model/session.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>

#include <fmt/format.h>

#include "kernels/activation.h"
#include "kernels/rms_norm.h"
#include "attention/attention.h"
#include "kernels/matmul.h"
#include "kernels/threads.h"
#include "model/input_override.h"
#include "model/layer_hook.h"
#include "model/lora.h"
#include "model/numeric_guard.h"
#include "model/rope.h"
#include "util/clock.h"

namespace kvslim {

/// One session's share of a forward batch: n consecutive rows of the batch, at the session's next
/// positions.
struct Session::Rows {
  Session* session = nullptr;
  const Token* tokens = nullptr;  ///< [n]
  int n = 0;
  LayerHook* hook = nullptr;      ///< called for these rows only; nullptr in a decode batch
  const InputOverride* input = nullptr;  ///< the rows' inputs instead of the tokens' embeddings
  int input_first = 0;            ///< the input row of this run's first row
  bool all_logits = false;        ///< logits of every row, else of the last
  float* logits = nullptr;        ///< [n or 1][n_vocab], or nullptr for none
  // Filled by forward_rows:
  int first = 0;                  ///< the run's first row in the batch
  std::vector<size_t> n_old;      ///< [n_head_kv] entries each segment of the current layer had before
  std::vector<std::vector<int32_t>> subset;  ///< the hook's attention subset, when it chose one
  bool use_subset = false;
  std::vector<std::vector<float>> mass;      ///< [kv head][entry], when the hook wants it
  std::exception_ptr error;       ///< set when these rows failed: the session is then left as it was
};

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

std::vector<float> Session::forward(const std::vector<Token>& tokens, bool all_logits, LayerHook* hook) {
  return forward_batches(tokens, all_logits, hook, nullptr);
}

std::vector<float> Session::forward_inputs(const InputOverride& input, bool all_logits, LayerHook* hook) {
  if (input.n_embd() != model_.hparams().n_embd)
    throw Error(fmt::format("input override: rows of {} values, the model's n_embd is {}", input.n_embd(),
                            model_.hparams().n_embd));
  // Token ids the hook sees: placeholders, the inputs are the rows.
  return forward_batches(std::vector<Token>(input.n(), 0), all_logits, hook, &input);
}

std::vector<float> Session::forward_batches(const std::vector<Token>& tokens, bool all_logits, LayerHook* hook,
                                            const InputOverride* input) {
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
    std::vector<Rows> runs(1);
    Rows& r = runs[0];
    r.session = this;
    r.tokens = tokens.data() + b;
    r.n = n;
    r.hook = hook;
    r.input = input;
    r.input_first = static_cast<int>(b);
    r.all_logits = all_logits;
    r.logits = all_logits ? logits.data() + b * nv : (last ? logits.data() : nullptr);
    forward_rows(runs);
    if (r.error) std::rethrow_exception(r.error);
    if (opt_.on_batch_done) opt_.on_batch_done(next_pos_);
    if (opt_.on_batch_bytes) opt_.on_batch_bytes(next_pos_, cache_.bytes());
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

/// Rotates the n rows of q ([n][n_head][hd]) and k ([n][n_head_kv][hd]) by their positions' angles.
void rope_rows(const HParams& hp, const std::vector<float>& cs, const std::vector<float>& sn, int n, float* q, float* k) {
  const int hd = hp.head_dim, half = hd / 2, dq = hp.n_head * hd, dkv = hp.n_head_kv * hd;
  for (int t = 0; t < n; ++t) {
    rope::apply(q + static_cast<size_t>(t) * dq, hp.n_head, hd, cs.data() + t * half, sn.data() + t * half, hp.rope_neox);
    rope::apply(k + static_cast<size_t>(t) * dkv, hp.n_head_kv, hd, cs.data() + t * half, sn.data() + t * half,
               hp.rope_neox);
  }
}

}  // namespace


namespace {

bool float_weights(const WeightView& W) {
  return W.type == GGMLType::F32 || W.type == GGMLType::F16 || W.type == GGMLType::BF16;
}

// How rows are multiplied. A batch of one session's rows takes the fastest kernels for its row
// count. A batch of several sessions' rows must give each row what a batch of that row alone gives
// (a decode batch is bit-identical to stepping its sessions one by one): float weights take the per-
// row dot path below four rows and sgemm tiles above, which round differently, so they go three
// rows at a time (each weight row is still read once for the three: it stays in cache); quantized
// products round per row at any count. The exact path (tests) runs row by row.
struct Products {
  bool independent;
  bool ex;
  /// Y = X W for n rows.
  void one(const WeightView& W, const float* X, int n, float* Y) const {
    const int step = !independent ? n : ex ? 1 : float_weights(W) ? 3 : n;
    for (int b = 0; b < n; b += step) {
      const int m = std::min(step, n - b);
      matmul(W, X + static_cast<size_t>(b) * W.cols, m, Y + static_cast<size_t>(b) * W.rows, ex);
    }
  }
  /// Y_i = X W_i for n rows, one pass over the group's matrices where the rows allow it.
  void group(std::initializer_list<const WeightView*> Ws, const float* X, int n, std::initializer_list<float*> Ys) const {
    if (independent && (ex || float_weights(**Ws.begin()))) {
      auto y = Ys.begin();
      for (const WeightView* W : Ws) one(*W, X, n, *y++);
    } else {
      matmul_group(Ws, X, n, Ys, ex);
    }
  }
};

/// One unit of attention work: KV head h of run `run`, the run's rows [t0, t1).
struct AttendUnit {
  int run, h, t0, t1;
};

}  // namespace

// Causal attention of every run's rows over its own session's segments of layer l (a run's entries
// follow n_old[h] older ones): to every entry, or to the subset its hook chose. Units are (run, KV
// head, tile of rows), one parallel region for the whole batch; a run's attention mass is added over
// its tiles in a fixed order, so nothing depends on the thread count. q, out: [rows][n_head][hd].
void Session::attend_runs(std::vector<Rows>& runs, int l, const HParams& hp, const float* q, float* out,
                          const std::vector<bool>& want_mass) {
  const int hd = hp.head_dim, nh = hp.n_head, nkv = hp.n_head_kv, G = hp.n_group(), dq = nh * hd;
  // Rows are (token, group head).
  const int tile = std::max(1, 64 / G);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  std::vector<AttendUnit> units;
  std::vector<size_t> first_unit(runs.size());
  int64_t macs = 0;
  for (size_t ri = 0; ri < runs.size(); ++ri) {
    Rows& r = runs[ri];
    first_unit[ri] = units.size();
    if (r.error) continue;
    const KVCache& cache = r.session->cache();
    for (int h = 0; h < nkv; ++h)
      for (int t0 = 0; t0 < r.n; t0 += tile) units.push_back({static_cast<int>(ri), h, t0, std::min(r.n, t0 + tile)});
    macs += static_cast<int64_t>(r.n) * nh * hd * 2 * static_cast<int64_t>(cache.seg(cache.source(l), 0).size());
  }
  std::vector<std::vector<float>> mass_part(units.size());
  auto attend_units = [&](int64_t b, int64_t e) {
    std::vector<float> qr, orow;
    std::vector<int32_t> vis;
    for (int64_t w = b; w < e; ++w) {
      const AttendUnit& u = units[w];
      const Rows& r = runs[u.run];
      const KVCache& cache = r.session->cache();
      const Segment& s = cache.seg(cache.source(l), u.h);
      const float* rq = q + static_cast<size_t>(r.first) * dq;
      const int rows = (u.t1 - u.t0) * G;
      qr.resize(static_cast<size_t>(rows) * hd);
      orow.resize(qr.size());
      vis.resize(rows);
      for (int t = u.t0; t < u.t1; ++t)
        for (int gi = 0; gi < G; ++gi) {
          const int row = (t - u.t0) * G + gi;
          std::memcpy(&qr[static_cast<size_t>(row) * hd], &rq[static_cast<size_t>(t) * dq + (u.h * G + gi) * hd],
                      hd * sizeof(float));
          vis[row] = static_cast<int32_t>(r.n_old[u.h] + t + 1);
        }
      float* m = nullptr;
      if (want_mass[u.run]) {
        auto& mp = mass_part[w];
        mp.assign(s.size(), 0.0f);
        m = mp.data();
      }
      if (r.use_subset && r.subset.size() == static_cast<size_t>(nh)) {
        // One subset per query head (ClusterKV's default): each row attends to its own.
        for (int row = 0; row < rows; ++row) {
          std::vector<int32_t> idx = r.subset[u.h * G + row % G];
          for (int t = 0; t < r.n; ++t) idx.push_back(static_cast<int32_t>(r.n_old[u.h] + t));
          attend_segment_subset(s, idx.data(), static_cast<int>(idx.size()), qr.data() + static_cast<size_t>(row) * hd,
                                1, vis.data() + row, scale, orow.data() + static_cast<size_t>(row) * hd, hd);
        }
      } else if (r.use_subset) {
        // The selected old entries, then the run's own entries (always attended, causally).
        std::vector<int32_t> idx = r.subset[u.h];
        for (int t = 0; t < r.n; ++t) idx.push_back(static_cast<int32_t>(r.n_old[u.h] + t));
        attend_segment_subset(s, idx.data(), static_cast<int>(idx.size()), qr.data(), rows, vis.data(), scale,
                              orow.data(), hd);
      } else {
        attend_segment(s, qr.data(), rows, vis.data(), scale, orow.data(), hd, m);
      }
      float* ro = out + static_cast<size_t>(r.first) * dq;
      for (int t = u.t0; t < u.t1; ++t)
        for (int gi = 0; gi < G; ++gi)
          std::memcpy(&ro[static_cast<size_t>(t) * dq + (u.h * G + gi) * hd],
                      &orow[static_cast<size_t>((t - u.t0) * G + gi) * hd], hd * sizeof(float));
    }
  };
  // Tiny models and short contexts stay on the calling thread.
  parallel_for(static_cast<int64_t>(units.size()), macs, attend_units);
  for (size_t ri = 0; ri < runs.size(); ++ri) {
    Rows& r = runs[ri];
    if (r.error || !want_mass[ri]) continue;
    const KVCache& cache = r.session->cache();
    r.mass.assign(nkv, {});
    const size_t tiles = (static_cast<size_t>(r.n) + tile - 1) / tile;
    for (int h = 0; h < nkv; ++h) {
      auto& dst = r.mass[h];
      dst.assign(cache.seg(cache.source(l), h).size(), 0.0f);
      for (size_t ti = 0; ti < tiles; ++ti) {
        const auto& src = mass_part[first_unit[ri] + static_cast<size_t>(h) * tiles + ti];
        for (size_t j = 0; j < src.size(); ++j) dst[j] += src[j];
      }
    }
  }
}

// The transformer layers over a batch of rows, llama-style: each layer is norm, Q/K/V, RoPE, store,
// attend, output projection, then the SwiGLU feed-forward, each a residual branch. A run's hook (if
// any) sees its rows after Q/K/V, before attention and after attention. Runs fail alone: an error in
// one (a numeric overflow, a hook's refusal) marks it, its rows are zeroed and skipped from then on,
// and its session is rewound to where it was, while the other runs' rows, which never mix with its
// rows, finish unchanged.
void Session::forward_rows(std::vector<Rows>& runs) {
  const Model& model = runs[0].session->model_;
  const HParams& hp = model.hparams();
  const int d = hp.n_embd, hd = hp.head_dim, nkv = hp.n_head_kv;
  const int dq = hp.n_head * hd, dkv = nkv * hd;
  const bool ex = runs[0].session->opt_.exact;
  const Products mm{runs.size() > 1, ex};

  // Rows, their positions and rotation angles.
  int n = 0;
  std::vector<int32_t> start(runs.size());
  for (size_t ri = 0; ri < runs.size(); ++ri) {
    Rows& r = runs[ri];
    if (&r.session->model_ != &model || r.session->opt_.exact != ex)
      throw Error("forward: the batch's sessions differ in model or options");
    r.first = n;
    n += r.n;
    start[ri] = r.session->next_pos_;
  }
  std::vector<int32_t> pos(n);
  for (const Rows& r : runs)
    for (int t = 0; t < r.n; ++t) pos[r.first + t] = r.session->next_pos_ + t;
  std::vector<float> cs, sn;
  rope::tables(hp, model.rope_freqs(), pos.data(), n, cs, sn);

  ScratchLease lease;
  ForwardScratch& S = *lease;
  S.size_for(hp, n);
  std::vector<float>&x = S.x, &xn = S.xn, &tmp = S.tmp, &q = S.q, &k = S.k, &v = S.v, &att = S.att, &g = S.g, &u = S.u;

  // Token embeddings: the residual stream x, [n][d]. A run with input rows (model/input_override.h:
  // RestoreKV's restore pass) gives them itself and may switch a LoRA adapter on.
  std::vector<const LoraAdapter*> lora(runs.size(), nullptr);
  const WeightView& emb = model.token_embd();
  for (size_t ri = 0; ri < runs.size(); ++ri) {
    Rows& r = runs[ri];
    lora[ri] = r.input ? r.input->lora() : nullptr;
    r.n_old.assign(nkv, 0);
    for (int t = 0; t < r.n; ++t) {
      float* row = x.data() + static_cast<size_t>(r.first + t) * d;
      if (r.input)
        std::memcpy(row, r.input->row(r.input_first + t), static_cast<size_t>(d) * sizeof(float));
      else
        dequantize_row(emb.type, emb.row(r.tokens[t]), row, d);
    }
  }

  // Runs one run's part of a step; an error fails that run only.
  auto guarded = [](Rows& r, auto&& f) {
    if (r.error) return;
    try {
      f();
    } catch (...) {
      r.error = std::current_exception();
    }
  };
  // The run's slice of a [n][width] activation.
  auto at = [](std::vector<float>& a, const Rows& r, int width) { return a.data() + static_cast<size_t>(r.first) * width; };
  // A LoRA adapter's update of projection t on each run that has one.
  auto add_lora = [&](int l, LoraTarget t, std::vector<float>& in, int w_in, std::vector<float>& out, int w_out) {
    for (size_t ri = 0; ri < runs.size(); ++ri)
      if (lora[ri]) guarded(runs[ri], [&] { lora[ri]->add(l, t, at(in, runs[ri], w_in), runs[ri].n, at(out, runs[ri], w_out)); });
  };
  std::vector<bool> want_mass(runs.size());
  for (size_t ri = 0; ri < runs.size(); ++ri) want_mass[ri] = runs[ri].hook && runs[ri].hook->wants_attention_mass();

  for (int l = 0; l < hp.n_layer; ++l) {
    const LayerWeights& L = model.layer(l);
    auto step_of = [&](Rows& r) {
      return LayerStep{l,          r.n,          r.tokens,         pos.data() + r.first, &hp, at(x, r, d), at(xn, r, d),
                       at(q, r, dq), &r.session->cache_, r.n_old.data()};
    };

    // 1. Norm: the attention input.
    norm_rows(x.data(), L.attn_norm, xn.data(), n, d, hp.rms_eps);
    // 2. Q/K/V projections (queries before RoPE: what Expected Attention and KVzap read).
    mm.group({L.wq.get(), L.wk.get(), L.wv.get()}, xn.data(), n, {q.data(), k.data(), v.data()});
    if (!L.bq.empty())
      for (int t = 0; t < n; ++t) {
        for (int i = 0; i < dq; ++i) q[static_cast<size_t>(t) * dq + i] += L.bq[i];
        for (int i = 0; i < dkv; ++i) {
          k[static_cast<size_t>(t) * dkv + i] += L.bk[i];
          v[static_cast<size_t>(t) * dkv + i] += L.bv[i];
        }
      }
    add_lora(l, LoraTarget::Q, xn, d, q, dq);
    add_lora(l, LoraTarget::K, xn, d, k, dkv);
    add_lora(l, LoraTarget::V, xn, d, v, dkv);
    for (Rows& r : runs)
      if (r.hook) guarded(r, [&] { r.hook->after_qkv(step_of(r)); });
    // 3. RoPE on queries and keys: entries are cached rotated.
    rope_rows(hp, cs, sn, n, q.data(), k.data());
    // 4. Store each run's entries in its own cache, each checked against the codec it goes into.
    // Entry order is causal order. A layer that shares an earlier layer's entries
    // (KVCache::share_layer, CLA) stores nothing: the source layer stored them already, and its
    // keys and values are what this layer reads.
    for (Rows& r : runs)
      guarded(r, [&] {
        KVCache& cache = r.session->cache_;
        const int src = cache.source(l);
        if (r.hook && src != l)
          throw Error(fmt::format("layer {} reads layer {}'s entries (press cla): a press that observes the forward pass "
                                  "(replay, decode-time selection or scoring) cannot run on it: a press that replays the context must come "
                                  "before cla in the composition, and one that observes decoding (h2o, ...) cannot be "
                                  "composed with cla",
                                  l, src));
        for (int h = 0; h < nkv; ++h) {
          Segment& s = cache.seg(src, h);
          if (src != l) {
            r.n_old[h] = s.size() - static_cast<size_t>(r.n);
            continue;
          }
          r.n_old[h] = s.size();
          for (int t = 0; t < r.n; ++t) {
            const size_t row = static_cast<size_t>(r.first + t) * dkv + static_cast<size_t>(h) * hd;
            check_entry_fits(s, k.data() + row, v.data() + row, l);
          }
          for (int t = 0; t < r.n; ++t) {
            const size_t row = static_cast<size_t>(r.first + t) * dkv + static_cast<size_t>(h) * hd;
            s.append(k.data() + row, v.data() + row, pos[r.first + t]);
          }
        }
      });
    // 5. Attend: to every entry, or to the subset the run's hook chose (decode-time selection).
    for (Rows& r : runs) {
      r.use_subset = false;
      if (r.hook)
        guarded(r, [&] {
          r.subset.assign(nkv, {});
          r.use_subset = r.hook->before_attention(step_of(r), r.subset);
        });
    }
    const double t_attend = steady_seconds();
    attend_runs(runs, l, hp, q.data(), att.data(), want_mass);
    const double attend_s = steady_seconds() - t_attend;
    for (Rows& r : runs)
      if (!r.error) r.session->attention_seconds_ += attend_s;
    for (size_t ri = 0; ri < runs.size(); ++ri) {
      Rows& r = runs[ri];
      if (r.hook) guarded(r, [&] { r.hook->after_attention(step_of(r), want_mass[ri] ? &r.mass : nullptr); });
    }
    // A failed run's rows are zeroed so they carry nothing non-finite into the products below.
    for (Rows& r : runs)
      if (r.error) {
        std::fill_n(at(x, r, d), static_cast<size_t>(r.n) * d, 0.0f);
        std::fill_n(at(att, r, dq), static_cast<size_t>(r.n) * dq, 0.0f);
      }
    // 6. Output projection back into the residual stream.
    mm.one(*L.wo, att.data(), n, tmp.data());
    add_lora(l, LoraTarget::O, att, dq, tmp, d);
    for (size_t i = 0, e = static_cast<size_t>(n) * d; i < e; ++i) x[i] += tmp[i];
    // 7. Feed-forward: SwiGLU, silu(xn W_gate) * (xn W_up), then W_down into the residual stream.
    norm_rows(x.data(), L.ffn_norm, xn.data(), n, d, hp.rms_eps);
    mm.group({L.w_gate.get(), L.w_up.get()}, xn.data(), n, {g.data(), u.data()});
    add_lora(l, LoraTarget::Gate, xn, d, g, hp.n_ff);
    add_lora(l, LoraTarget::Up, xn, d, u, hp.n_ff);
    swiglu_rows(g.data(), u.data(), n, hp.n_ff, ex);
    mm.one(*L.w_down, g.data(), n, tmp.data());
    add_lora(l, LoraTarget::Down, g, hp.n_ff, tmp, d);
    for (size_t i = 0, e = static_cast<size_t>(n) * d; i < e; ++i) x[i] += tmp[i];
    // 8. The numeric guard: NaN or inf in a run's hidden states fails that run.
    for (Rows& r : runs)
      guarded(r, [&] {
        const KVCache& cache = r.session->cache_;
        check_layer_finite(at(x, r, d), static_cast<size_t>(r.n) * d, cache.source(l), at(k, r, dkv), at(v, r, dkv), r.n,
                           cache, r.n_old);
      });
    if (std::all_of(runs.begin(), runs.end(), [](const Rows& r) { return bool(r.error); })) break;
  }

  // Logits of each run's last row (or every row): final norm and the output matrix. One run writes
  // straight into its buffer; several share one product and are copied out.
  const size_t nv = hp.n_vocab;
  std::vector<int> first_out(runs.size(), -1);
  int n_out = 0;
  for (size_t ri = 0; ri < runs.size(); ++ri) {
    Rows& r = runs[ri];
    if (r.error || !r.logits) continue;
    const int from = r.all_logits ? 0 : r.n - 1, rows = r.n - from;
    first_out[ri] = n_out;
    norm_rows(at(x, r, d) + static_cast<size_t>(from) * d, model.output_norm(), xn.data() + static_cast<size_t>(n_out) * d,
              rows, d, hp.rms_eps);
    n_out += rows;
  }
  std::vector<float> shared;
  float* out = nullptr;
  if (n_out > 0) {
    if (runs.size() == 1) {
      out = runs[0].logits;
    } else {
      shared.resize(static_cast<size_t>(n_out) * nv);
      out = shared.data();
    }
    mm.one(model.output(), xn.data(), n_out, out);
  }
  for (size_t ri = 0; ri < runs.size(); ++ri) {
    Rows& r = runs[ri];
    if (first_out[ri] >= 0) {
      const size_t count = static_cast<size_t>(r.all_logits ? r.n : 1) * nv;
      const float* src = out + static_cast<size_t>(first_out[ri]) * nv;
      if (src != r.logits) std::copy(src, src + count, r.logits);
      guarded(r, [&] { check_logits_finite(r.logits, count); });
    }
    if (r.error)
      r.session->rewind(start[ri]);  // drops the entries its failed pass stored
    else
      r.session->next_pos_ += r.n;
  }
}

std::vector<float> Session::decode_batch(const std::vector<Session*>& sessions, const std::vector<Token>& tokens,
                                         std::vector<std::exception_ptr>* errors) {
  if (sessions.empty() || sessions.size() != tokens.size())
    throw Error(fmt::format("decode_batch: {} sessions for {} tokens", sessions.size(), tokens.size()));
  const Model& model = sessions[0]->model_;
  const HParams& hp = model.hparams();
  const size_t nv = hp.n_vocab;
  const int n = static_cast<int>(sessions.size());
  for (int i = 0; i < n; ++i)
    if (&sessions[i]->model_ != &model || sessions[i]->opt_.exact != sessions[0]->opt_.exact)
      throw Error("decode_batch: sessions differ in model or options");
  std::vector<float> logits(static_cast<size_t>(n) * nv, 0.0f);
  // Row i is session i's token at its own position; a row refused up front joins no run.
  std::vector<Rows> runs;
  std::vector<int> run_of(n, -1);
  std::vector<std::exception_ptr> failed(n);
  for (int i = 0; i < n; ++i) {
    Session& s = *sessions[i];
    try {
      if (s.next_pos_ + 1 > s.n_ctx_)
        throw Error(fmt::format("token at position {} exceeds the context size n_ctx {}", s.next_pos_, s.n_ctx_));
      if (tokens[i] < 0 || tokens[i] >= hp.n_vocab)
        throw Error(fmt::format("token id {} is outside the vocabulary (0..{})", tokens[i], hp.n_vocab - 1));
      // One row per session: a second row would be given the same position and stored twice.
      for (int j = 0; j < i; ++j)
        if (sessions[j] == sessions[i])
          throw Error(fmt::format("decode_batch: row {} is the session of row {} again (one row per session)", i, j));
    } catch (...) {
      failed[i] = std::current_exception();
      continue;
    }
    Rows r;
    r.session = &s;
    r.tokens = &tokens[i];
    r.n = 1;
    r.logits = logits.data() + static_cast<size_t>(i) * nv;
    run_of[i] = static_cast<int>(runs.size());
    runs.push_back(std::move(r));
  }
  if (!runs.empty()) forward_rows(runs);
  for (int i = 0; i < n; ++i)
    if (run_of[i] >= 0 && runs[run_of[i]].error) {
      failed[i] = runs[run_of[i]].error;
      std::fill_n(logits.data() + static_cast<size_t>(i) * nv, nv, 0.0f);
    }
  if (errors) {
    *errors = std::move(failed);
  } else {
    for (auto& e : failed)
      if (e) std::rethrow_exception(e);
  }
  return logits;
}

}  // namespace kvslim
