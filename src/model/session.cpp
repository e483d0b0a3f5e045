// The llama-family forward pass over a per-(layer, KV head) cache.
#include "kvslim/session.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "kernels/attention.h"
#include "kernels/matmul.h"
#include "kernels/threads.h"
#include "model/numeric_guard.h"

namespace kvslim {

void Observation::clear() {
  queries.clear();
  window_positions.clear();
  hidden.clear();
  hidden_positions.clear();
  attention_mass.clear();
  tokens.clear();
  token_positions.clear();
  session = nullptr;
}

Session::Session(const Model& model, SessionOptions opt)
    : model_(model), opt_(opt),
      n_ctx_(opt.n_ctx > 0 ? opt.n_ctx : model.hparams().n_ctx_train),
      cache_(model.hparams().n_layer, model.hparams().n_head_kv, model.hparams().head_dim, opt.key_codec,
             opt.value_codec, opt.kv_quant) {
  if (opt.n_ctx < 0) throw Error(fmt::format("context size -c {} must be positive", opt.n_ctx));
  if (opt_.batch <= 0) opt_.batch = 256;
}

void Session::reset() {
  cache_.clear();
  next_pos_ = 0;
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

void rms_norm(const float* x, const float* w, float* y, int n, float eps) {
  double ss = 0;
  for (int i = 0; i < n; ++i) ss += double(x[i]) * x[i];
  float scale = 1.0f / std::sqrt(static_cast<float>(ss / n) + eps);
  for (int i = 0; i < n; ++i) y[i] = x[i] * scale * w[i];
}

/// cos/sin of every rotation angle for the given positions: [n][head_dim/2] each.
void rope_tables(const HParams& hp, const std::vector<float>& freq_factors, const int32_t* pos, int n,
                 std::vector<float>& cs, std::vector<float>& sn) {
  const int half = hp.head_dim / 2;
  cs.resize(static_cast<size_t>(n) * half);
  sn.resize(cs.size());
  for (int i = 0; i < half; ++i) {
    double inv_freq = std::pow(double(hp.rope_freq_base), -2.0 * i / hp.head_dim) * hp.rope_freq_scale;
    if (!freq_factors.empty()) inv_freq /= freq_factors[i];
    for (int t = 0; t < n; ++t) {
      double th = pos[t] * inv_freq;
      cs[t * half + i] = static_cast<float>(std::cos(th));
      sn[t * half + i] = static_cast<float>(std::sin(th));
    }
  }
}

void apply_rope(float* x, int n_heads, int hd, const float* cs, const float* sn, bool neox) {
  const int half = hd / 2;
  for (int h = 0; h < n_heads; ++h) {
    float* v = x + h * hd;
    for (int i = 0; i < half; ++i) {
      int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
      float x0 = v[a], x1 = v[b];
      v[a] = x0 * cs[i] - x1 * sn[i];
      v[b] = x0 * sn[i] + x1 * cs[i];
    }
  }
}

}  // namespace

std::vector<float> Session::forward(const std::vector<Token>& tokens, bool all_logits, const ObservationRequest* req,
                                    Observation* obs, int32_t record_from) {
  const HParams& hp = model_.hparams();
  if (tokens.empty()) throw Error("forward: no tokens to process");
  if (next_pos_ + static_cast<int64_t>(tokens.size()) > n_ctx_)
    throw Error(fmt::format("prompt of {} tokens at position {} exceeds the context size -c {}", tokens.size(),
                            next_pos_, n_ctx_));
  for (Token t : tokens)
    if (t < 0 || t >= hp.n_vocab) throw Error(fmt::format("token id {} is outside the vocabulary (0..{})", t, hp.n_vocab - 1));
  if (obs) obs->session = this;
  if (obs && req && req->tokens)
    for (size_t i = 0; i < tokens.size(); ++i) {
      obs->tokens.push_back(tokens[i]);
      obs->token_positions.push_back(next_pos_ + static_cast<int32_t>(i));
    }
  if (obs && req) {
    obs->queries.resize(hp.n_layer);
    obs->hidden.resize(hp.n_layer);
    if (req->attention_mass) obs->attention_mass.resize(hp.n_layer, std::vector<std::vector<float>>(hp.n_head_kv));
  }
  const size_t nv = hp.n_vocab;
  std::vector<float> logits(all_logits ? tokens.size() * nv : nv);
  for (size_t b = 0; b < tokens.size(); b += opt_.batch) {
    int n = static_cast<int>(std::min<size_t>(opt_.batch, tokens.size() - b));
    bool last = b + n == tokens.size();
    float* out = all_logits ? logits.data() + b * nv : (last ? logits.data() : nullptr);
    forward_batch(tokens.data() + b, n, all_logits, out, req, obs, record_from);
    if (opt_.on_batch_done) opt_.on_batch_done(next_pos_);
  }
  return logits;
}

void Session::forward_batch(const Token* tokens, int n, bool all_logits, float* logits, const ObservationRequest* req,
                            Observation* obs, int32_t record_from) {
  const HParams& hp = model_.hparams();
  const int d = hp.n_embd, hd = hp.head_dim, nh = hp.n_head, nkv = hp.n_head_kv, G = hp.n_group();
  const int dq = nh * hd, dkv = nkv * hd;
  const bool ex = opt_.exact;

  std::vector<int32_t> pos(n);
  for (int t = 0; t < n; ++t) pos[t] = next_pos_ + t;
  std::vector<float> cs, sn;
  rope_tables(hp, model_.rope_freqs(), pos.data(), n, cs, sn);

  std::vector<float> x(static_cast<size_t>(n) * d), xn(x.size());
  const WeightView& emb = model_.token_embd();
  for (int t = 0; t < n; ++t) dequantize_row(emb.type, emb.row(tokens[t]), x.data() + t * d, d);

  std::vector<float> q(static_cast<size_t>(n) * dq), k(static_cast<size_t>(n) * dkv), v(k.size()),
      att(static_cast<size_t>(n) * dq), tmp(x.size());
  std::vector<float> g(static_cast<size_t>(n) * hp.n_ff), u(g.size());

  // Which batch rows fall in the recorded range.
  int rec0 = n;
  if (obs && req)
    for (int t = 0; t < n; ++t)
      if (pos[t] >= record_from) {
        rec0 = t;
        break;
      }
  const int half = hd / 2;

  for (int l = 0; l < hp.n_layer; ++l) {
    const LayerWeights& L = model_.layer(l);
    if (obs && req && req->hidden_states && rec0 < n)
      obs->hidden[l].insert(obs->hidden[l].end(), x.begin() + static_cast<size_t>(rec0) * d, x.end());

    for (int t = 0; t < n; ++t) rms_norm(x.data() + t * d, L.attn_norm.data(), xn.data() + t * d, d, hp.rms_eps);
    if (req && req->on_attention_input) req->on_attention_input(l, xn.data(), n, d, pos.data());
    matmul_group({L.wq.get(), L.wk.get(), L.wv.get()}, xn.data(), n, {q.data(), k.data(), v.data()}, ex);
    if (!L.bq.empty())
      for (int t = 0; t < n; ++t) {
        for (int i = 0; i < dq; ++i) q[t * dq + i] += L.bq[i];
        for (int i = 0; i < dkv; ++i) {
          k[t * dkv + i] += L.bk[i];
          v[t * dkv + i] += L.bv[i];
        }
      }
    if (req && req->on_queries) req->on_queries(l, q.data(), n, nh, hd, pos.data());
    for (int t = 0; t < n; ++t) {
      apply_rope(q.data() + t * dq, nh, hd, cs.data() + t * half, sn.data() + t * half, hp.rope_neox);
      apply_rope(k.data() + t * dkv, nkv, hd, cs.data() + t * half, sn.data() + t * half, hp.rope_neox);
    }

    // Append this batch's entries, then attend: entry order is causal order.
    std::vector<size_t> n_old(nkv);
    for (int h = 0; h < nkv; ++h) {
      Segment& s = cache_.seg(l, h);
      n_old[h] = s.size();
      for (int t = 0; t < n; ++t) s.append(k.data() + t * dkv + h * hd, v.data() + t * dkv + h * hd, pos[t]);
    }
    if (obs && req && req->window > 0 && rec0 < n) {
      // queries[l] is [n_head][window][hd]; rebuilt with the newest `window` recorded rows.
      std::vector<float>& wq = obs->queries[l];
      int have = static_cast<int>(obs->window_positions.size());
      int add = n - rec0;
      int keep_old = std::min(have, std::max(0, req->window - add));
      int take = std::min(add, req->window);
      int nw = keep_old + take;
      std::vector<float> nq(static_cast<size_t>(nh) * nw * hd);
      for (int h = 0; h < nh; ++h) {
        for (int i = 0; i < keep_old; ++i)
          std::memcpy(&nq[(static_cast<size_t>(h) * nw + i) * hd], &wq[(static_cast<size_t>(h) * have + have - keep_old + i) * hd],
                      hd * sizeof(float));
        for (int i = 0; i < take; ++i)
          std::memcpy(&nq[(static_cast<size_t>(h) * nw + keep_old + i) * hd], &q[static_cast<size_t>(n - take + i) * dq + h * hd],
                      hd * sizeof(float));
      }
      wq.swap(nq);
      if (l == hp.n_layer - 1) {
        std::vector<int32_t> wp(obs->window_positions.end() - keep_old, obs->window_positions.end());
        for (int i = 0; i < take; ++i) wp.push_back(pos[n - take + i]);
        obs->window_positions.swap(wp);
      }
    }
    if (obs && req && req->attention_mass)
      for (int h = 0; h < nkv; ++h) obs->attention_mass[l][h].resize(cache_.seg(l, h).size(), 0.0f);

    // Decode-time selection (ClusterKV): per KV head, the old entries this batch attends to.
    std::vector<std::vector<int32_t>> subset;
    bool use_subset = false;
    if (req && req->selector) {
      subset.assign(nkv, {});
      use_subset = req->selector->select(l, q.data(), n, cache_, subset);
    }
    // One unit of work = one KV head x a tile of tokens; rows are (token, group head).
    const int tile = std::max(1, 64 / G);
    const int n_tiles = (n + tile - 1) / tile;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    const bool want_mass = obs && req && req->attention_mass;
    std::vector<std::vector<float>> mass_part;
    if (want_mass) mass_part.assign(static_cast<size_t>(nkv) * n_tiles, {});
    auto attend_units = [&](int64_t b, int64_t e) {
      std::vector<float> qr, orow;
      std::vector<int32_t> vis;
      for (int64_t w = b; w < e; ++w) {
        int h = static_cast<int>(w / n_tiles), t0 = static_cast<int>(w % n_tiles) * tile;
        int t1 = std::min(n, t0 + tile), rows = (t1 - t0) * G;
        const Segment& s = cache_.seg(l, h);
        qr.resize(static_cast<size_t>(rows) * hd);
        orow.resize(qr.size());
        vis.resize(rows);
        for (int t = t0; t < t1; ++t)
          for (int gi = 0; gi < G; ++gi) {
            int r = (t - t0) * G + gi;
            std::memcpy(&qr[static_cast<size_t>(r) * hd], &q[static_cast<size_t>(t) * dq + (h * G + gi) * hd], hd * sizeof(float));
            vis[r] = static_cast<int32_t>(n_old[h] + t + 1);
          }
        float* mass = nullptr;
        if (want_mass) {
          auto& mp = mass_part[w];
          mp.assign(s.size(), 0.0f);
          mass = mp.data();
        }
        if (use_subset && subset.size() == static_cast<size_t>(nh)) {
          // One subset per query head (ClusterKV's default): each row attends to its own.
          for (int r = 0; r < rows; ++r) {
            std::vector<int32_t> idx = subset[h * G + r % G];
            for (int t = 0; t < n; ++t) idx.push_back(static_cast<int32_t>(n_old[h] + t));
            attend_segment_subset(s, idx.data(), static_cast<int>(idx.size()), qr.data() + static_cast<size_t>(r) * hd,
                                  1, vis.data() + r, scale, orow.data() + static_cast<size_t>(r) * hd, hd);
          }
        } else if (use_subset) {
          // The selected old entries, then the batch's own entries (always attended, causally).
          std::vector<int32_t> idx = subset[h];
          for (int t = 0; t < n; ++t) idx.push_back(static_cast<int32_t>(n_old[h] + t));
          attend_segment_subset(s, idx.data(), static_cast<int>(idx.size()), qr.data(), rows, vis.data(), scale,
                                orow.data(), hd);
        } else {
          attend_segment(s, qr.data(), rows, vis.data(), scale, orow.data(), hd, mass);
        }
        for (int t = t0; t < t1; ++t)
          for (int gi = 0; gi < G; ++gi)
            std::memcpy(&att[static_cast<size_t>(t) * dq + (h * G + gi) * hd], &orow[static_cast<size_t>((t - t0) * G + gi) * hd],
                        hd * sizeof(float));
      }
    };
    // Multiply-adds of this layer's attention (scores and values over the cache): tiny models and
    // short contexts stay on the calling thread.
    const int64_t attn_macs = static_cast<int64_t>(n) * nh * hd * 2 * static_cast<int64_t>(cache_.seg(l, 0).size());
    parallel_for(static_cast<int64_t>(nkv) * n_tiles, attn_macs, attend_units);
    if (want_mass)  // summed in a fixed order so results do not depend on the thread count
      for (int h = 0; h < nkv; ++h)
        for (int ti = 0; ti < n_tiles; ++ti) {
          int t0 = ti * tile;
          if (t0 + 1 + static_cast<int>(n_old[h]) <= 0) continue;
          if (pos[t0] < record_from) continue;  // mass is accumulated over recorded queries only
          auto& dst = obs->attention_mass[l][h];
          const auto& src = mass_part[static_cast<size_t>(h) * n_tiles + ti];
          for (size_t j = 0; j < src.size(); ++j) dst[j] += src[j];
        }

    matmul(*L.wo, att.data(), n, tmp.data(), ex);
    for (size_t i = 0; i < x.size(); ++i) x[i] += tmp[i];

    for (int t = 0; t < n; ++t) rms_norm(x.data() + t * d, L.ffn_norm.data(), xn.data() + t * d, d, hp.rms_eps);
    matmul_group({L.w_gate.get(), L.w_up.get()}, xn.data(), n, {g.data(), u.data()}, ex);
    for (size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
    matmul(*L.w_down, g.data(), n, tmp.data(), ex);
    for (size_t i = 0; i < x.size(); ++i) x[i] += tmp[i];
    check_layer_finite(x.data(), x.size(), l, k.data(), v.data(), n, cache_, n_old);
  }
  if (obs && req && req->hidden_states)
    for (int t = rec0; t < n; ++t) obs->hidden_positions.push_back(pos[t]);

  next_pos_ += n;
  if (!logits) return;
  int first = all_logits ? 0 : n - 1;
  int rows = n - first;
  for (int t = first; t < n; ++t)
    rms_norm(x.data() + t * d, model_.output_norm().data(), xn.data() + (t - first) * d, d, hp.rms_eps);
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
      throw Error(fmt::format("token at position {} exceeds the context size -c {}", s.next_pos_, s.n_ctx_));
    if (tokens[i] < 0 || tokens[i] >= hp.n_vocab)
      throw Error(fmt::format("token id {} is outside the vocabulary (0..{})", tokens[i], hp.n_vocab - 1));
  }
  const int d = hp.n_embd, hd = hp.head_dim, nh = hp.n_head, nkv = hp.n_head_kv, G = hp.n_group();
  const int dq = nh * hd, dkv = nkv * hd, half = hd / 2;

  // Row i is session i's token at its own position.
  std::vector<int32_t> pos(n);
  for (int i = 0; i < n; ++i) pos[i] = sessions[i]->next_pos_;
  std::vector<float> cs, sn;
  rope_tables(hp, model.rope_freqs(), pos.data(), n, cs, sn);
  std::vector<float> x(static_cast<size_t>(n) * d), xn(x.size()), tmp(x.size());
  const WeightView& emb = model.token_embd();
  for (int i = 0; i < n; ++i) dequantize_row(emb.type, emb.row(tokens[i]), x.data() + static_cast<size_t>(i) * d, d);
  std::vector<float> q(static_cast<size_t>(n) * dq), k(static_cast<size_t>(n) * dkv), v(k.size()),
      att(static_cast<size_t>(n) * dq);
  std::vector<float> g(static_cast<size_t>(n) * hp.n_ff), u(g.size());
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));

  for (int l = 0; l < hp.n_layer; ++l) {
    const LayerWeights& L = model.layer(l);
    // Norm and Q/K/V for every row: one pass over wq, wk, wv.
    for (int i = 0; i < n; ++i) rms_norm(x.data() + i * d, L.attn_norm.data(), xn.data() + i * d, d, hp.rms_eps);
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
      apply_rope(q.data() + i * dq, nh, hd, cs.data() + i * half, sn.data() + i * half, hp.rope_neox);
      apply_rope(k.data() + i * dkv, nkv, hd, cs.data() + i * half, sn.data() + i * half, hp.rope_neox);
    }
    // Store each row's entry in its own cache, then attend over that cache only.
    int64_t macs = 0;
    for (int i = 0; i < n; ++i)
      for (int h = 0; h < nkv; ++h) {
        Segment& s = sessions[i]->cache_.seg(l, h);
        s.append(k.data() + i * dkv + h * hd, v.data() + i * dkv + h * hd, pos[i]);
        macs += static_cast<int64_t>(G) * hd * 2 * static_cast<int64_t>(s.size());
      }
    parallel_for(static_cast<int64_t>(n) * nkv, macs, [&](int64_t b, int64_t e) {
      std::vector<float> orow(static_cast<size_t>(G) * hd);
      std::vector<int32_t> vis(G);
      for (int64_t w = b; w < e; ++w) {
        const int i = static_cast<int>(w / nkv), h = static_cast<int>(w % nkv);
        const Segment& s = sessions[i]->cache_.seg(l, h);
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
    for (int i = 0; i < n; ++i) rms_norm(x.data() + i * d, L.ffn_norm.data(), xn.data() + i * d, d, hp.rms_eps);
    if (fp || ex) {
      matmul_rows(*L.w_gate, xn.data(), n, g.data(), ex);
      matmul_rows(*L.w_up, xn.data(), n, u.data(), ex);
    } else {
      matmul_group({L.w_gate.get(), L.w_up.get()}, xn.data(), n, {g.data(), u.data()}, ex);
    }
    for (size_t j = 0; j < g.size(); ++j) g[j] = g[j] / (1.0f + std::exp(-g[j])) * u[j];
    matmul_rows(*L.w_down, g.data(), n, tmp.data(), ex);
    for (size_t j = 0; j < x.size(); ++j) x[j] += tmp[j];
  }
  for (int i = 0; i < n; ++i) ++sessions[i]->next_pos_;
  for (int i = 0; i < n; ++i) rms_norm(x.data() + i * d, model.output_norm().data(), xn.data() + i * d, d, hp.rms_eps);
  std::vector<float> logits(static_cast<size_t>(n) * hp.n_vocab);
  matmul_rows(model.output(), xn.data(), n, logits.data(), ex);
  return logits;
}

}  // namespace kvslim
