// RestoreKV's trainer (arXiv 2608.01247): self-distillation of the restore embeddings and the
// LoRA adapter, gradients through the restore pass and the continuation pass in float64.
#include "train/restorekv_train.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <memory>
#include <random>

#include <fmt/format.h>

#include "kernels/matmul.h"
#include "kvslim/error.h"
#include "kvslim/request.h"
#include "model/session.h"
#include "model/rope.h"
#include "press/authoring.h"
#include "train/grad_ops.h"

namespace kvslim {

namespace {

using Vec = std::vector<double>;

std::vector<double> dense_of(const WeightView& W) {
  std::vector<float> row(W.cols);
  Vec out(static_cast<size_t>(W.rows) * W.cols);
  for (int64_t r = 0; r < W.rows; ++r) {
    dequantize_row(W.type, W.row(r), row.data(), W.cols);
    std::copy(row.begin(), row.end(), out.begin() + r * W.cols);
  }
  return out;
}

/// Per (layer, KV head): rows of head_dim keys and values.
struct KV {
  std::vector<std::vector<std::vector<Vec>>> k, v;  // [layer][kv head][row] -> [hd]
};

}  // namespace

struct RestoreKVSample {
  int n = 0;                // context tokens
  std::vector<Token> cont;  // continuation tokens
  KV full, kept;            // the whole context's entries; those the press keeps
  Vec teacher;              // [T][V] probabilities
};

struct RestoreKVObjective::Impl {
  const Model& model;
  int R, rank;
  double scale;
  int d, hd, nh, nkv, G, ff, V, L;
  double eps;
  bool neox;
  Vec inv_freq;
  struct Layer {
    std::array<Vec, kLoraTargets> w;  // q k v o gate up down, [out][in]
    Vec an, fn;
  };
  std::vector<Layer> layers;
  Vec out, onorm;
  std::vector<std::array<size_t, kLoraTargets>> a_off, b_off;  // offsets of A and B in theta
  size_t n_params = 0;
  std::vector<RestoreKVSample> samples;

  Impl(const Model& m, int R_, int rank_, float alpha) : model(m), R(R_), rank(rank_), scale(alpha / rank_) {}

  void shape(LoraTarget t, int& in, int& o) const { lora_target_shape(model.hparams(), t, in, o); }

  /// Activations of one pass (per layer) for the backward.
  struct LayerAct {
    Vec x, xn, q, k, v, att, x1, xn2, g, u, h;
    std::array<Vec, kLoraTargets> la;    // A x per target [m][rank]
    std::vector<Vec> keys, vals;         // per KV head: prefix then own rows [P + m][hd]
    std::vector<int> P;                  // prefix rows per KV head
    std::vector<Vec> p;                  // per query head [m][P + m]
  };
  struct PassAct {
    std::vector<LayerAct> layers;
    Vec xout;
  };

  void lin_lora(const double* theta, int l, LoraTarget t, const Vec& x, int m, Vec& y, Vec* la) const {
    int in, o;
    shape(t, in, o);
    y.assign(static_cast<size_t>(m) * o, 0.0);
    grad::linear(x.data(), layers[l].w[static_cast<int>(t)].data(), m, in, o, y.data());
    if (!theta) return;
    const double* A = theta + a_off[l][static_cast<int>(t)];
    const double* B = theta + b_off[l][static_cast<int>(t)];
    la->assign(static_cast<size_t>(m) * rank, 0.0);
    grad::linear(x.data(), A, m, in, rank, la->data());
    Vec add(static_cast<size_t>(m) * o);
    grad::linear(la->data(), B, m, rank, o, add.data());
    for (size_t i = 0; i < y.size(); ++i) y[i] += scale * add[i];
  }

  void lin_lora_back(const double* theta, double* dtheta, int l, LoraTarget t, const Vec& x, const Vec* la,
                     const Vec& dy, int m, Vec& dx) const {
    int in, o;
    shape(t, in, o);
    grad::linear_backward(x.data(), layers[l].w[static_cast<int>(t)].data(), dy.data(), m, in, o, dx.data(), nullptr);
    if (!theta) return;
    const double* A = theta + a_off[l][static_cast<int>(t)];
    const double* B = theta + b_off[l][static_cast<int>(t)];
    Vec dys(dy.size()), da(static_cast<size_t>(m) * rank, 0.0);
    for (size_t i = 0; i < dy.size(); ++i) dys[i] = scale * dy[i];
    grad::linear_backward(la->data(), B, dys.data(), m, rank, o, da.data(), dtheta + b_off[l][static_cast<int>(t)]);
    grad::linear_backward(x.data(), A, da.data(), m, in, rank, dx.data(), dtheta + a_off[l][static_cast<int>(t)]);
  }

  /// Rows x_in [m][d] at positions pos over `prefix` (per layer and KV head), adapter from theta
  /// when theta is not nullptr.
  void forward(const double* theta, const KV& prefix, const Vec& x_in, const std::vector<int>& pos, PassAct& a) const {
    const int m = static_cast<int>(pos.size()), dq = nh * hd, dkv = nkv * hd;
    a.layers.assign(L, {});
    Vec x = x_in;
    for (int l = 0; l < L; ++l) {
      LayerAct& s = a.layers[l];
      const Layer& W = layers[l];
      s.x = x;
      s.xn.assign(x.size(), 0.0);
      grad::rmsnorm(x.data(), W.an.data(), m, d, eps, s.xn.data());
      lin_lora(theta, l, LoraTarget::Q, s.xn, m, s.q, &s.la[0]);
      lin_lora(theta, l, LoraTarget::K, s.xn, m, s.k, &s.la[1]);
      lin_lora(theta, l, LoraTarget::V, s.xn, m, s.v, &s.la[2]);
      grad::rope(s.q.data(), pos.data(), inv_freq.data(), m, nh, hd, neox);
      grad::rope(s.k.data(), pos.data(), inv_freq.data(), m, nkv, hd, neox);
      s.keys.assign(nkv, {});
      s.vals.assign(nkv, {});
      s.P.assign(nkv, 0);
      for (int h = 0; h < nkv; ++h) {
        const auto& pk = prefix.k[l][h];
        const auto& pv = prefix.v[l][h];
        s.P[h] = static_cast<int>(pk.size());
        Vec& K = s.keys[h];
        Vec& Vv = s.vals[h];
        for (size_t j = 0; j < pk.size(); ++j) {
          K.insert(K.end(), pk[j].begin(), pk[j].end());
          Vv.insert(Vv.end(), pv[j].begin(), pv[j].end());
        }
        for (int t = 0; t < m; ++t) {
          K.insert(K.end(), s.k.begin() + t * dkv + h * hd, s.k.begin() + t * dkv + (h + 1) * hd);
          Vv.insert(Vv.end(), s.v.begin() + t * dkv + h * hd, s.v.begin() + t * dkv + (h + 1) * hd);
        }
      }
      s.att.assign(static_cast<size_t>(m) * dq, 0.0);
      s.p.assign(nh, {});
      Vec qr(static_cast<size_t>(m) * hd), orow(qr.size());
      for (int qh = 0; qh < nh; ++qh) {
        const int h = qh / G, P = s.P[h] + m;
        std::vector<int> vis(m);
        for (int t = 0; t < m; ++t) {
          vis[t] = s.P[h] + t + 1;
          std::copy(s.q.begin() + t * dq + qh * hd, s.q.begin() + t * dq + (qh + 1) * hd, qr.begin() + t * hd);
        }
        s.p[qh].assign(static_cast<size_t>(m) * P, 0.0);
        grad::attention(qr.data(), s.keys[h].data(), s.vals[h].data(), vis.data(), m, P, hd, orow.data(), s.p[qh].data());
        for (int t = 0; t < m; ++t) std::copy(orow.begin() + t * hd, orow.begin() + (t + 1) * hd, s.att.begin() + t * dq + qh * hd);
      }
      Vec o;
      lin_lora(theta, l, LoraTarget::O, s.att, m, o, &s.la[3]);
      s.x1 = x;
      for (size_t i = 0; i < o.size(); ++i) s.x1[i] += o[i];
      s.xn2.assign(x.size(), 0.0);
      grad::rmsnorm(s.x1.data(), W.fn.data(), m, d, eps, s.xn2.data());
      lin_lora(theta, l, LoraTarget::Gate, s.xn2, m, s.g, &s.la[4]);
      lin_lora(theta, l, LoraTarget::Up, s.xn2, m, s.u, &s.la[5]);
      s.h.assign(s.g.size(), 0.0);
      grad::swiglu(s.g.data(), s.u.data(), static_cast<int>(s.g.size()), s.h.data());
      Vec dn;
      lin_lora(theta, l, LoraTarget::Down, s.h, m, dn, &s.la[6]);
      x = s.x1;
      for (size_t i = 0; i < dn.size(); ++i) x[i] += dn[i];
    }
    a.xout = x;
  }

  /// Backward of forward(): dxo = d loss / d output rows (may be all zero); dk_own / dv_own (when
  /// not nullptr): [layer] -> [m][n_head_kv x hd], gradients of the pass's own entries from later
  /// users. Adds into dtheta (adapter) and, when dprefix is not nullptr, into the prefix rows'
  /// gradients (same shape as the prefix). Returns d loss / d x_in.
  Vec backward(const double* theta, double* dtheta, const PassAct& a, const std::vector<int>& pos, Vec dx,
               const std::vector<Vec>* dk_own, const std::vector<Vec>* dv_own, KV* dprefix) const {
    const int m = static_cast<int>(pos.size()), dq = nh * hd, dkv = nkv * hd;
    for (int l = L - 1; l >= 0; --l) {
      const LayerAct& s = a.layers[l];
      const Layer& W = layers[l];
      const Vec* la = s.la.data();
      // Feed-forward branch.
      Vec dh(static_cast<size_t>(m) * ff, 0.0);
      lin_lora_back(theta, dtheta, l, LoraTarget::Down, s.h, &la[6], dx, m, dh);
      Vec dg(dh.size(), 0.0), du(dh.size(), 0.0);
      grad::swiglu_backward(s.g.data(), s.u.data(), dh.data(), static_cast<int>(dh.size()), dg.data(), du.data());
      Vec dxn2(static_cast<size_t>(m) * d, 0.0);
      lin_lora_back(theta, dtheta, l, LoraTarget::Gate, s.xn2, &la[4], dg, m, dxn2);
      lin_lora_back(theta, dtheta, l, LoraTarget::Up, s.xn2, &la[5], du, m, dxn2);
      Vec dx1 = dx;
      grad::rmsnorm_backward(s.x1.data(), W.fn.data(), dxn2.data(), m, d, eps, dx1.data());
      // Attention branch.
      Vec datt(static_cast<size_t>(m) * dq, 0.0);
      lin_lora_back(theta, dtheta, l, LoraTarget::O, s.att, &la[3], dx1, m, datt);
      Vec dq_all(static_cast<size_t>(m) * dq, 0.0);
      std::vector<Vec> dkeys(nkv), dvals(nkv);
      for (int h = 0; h < nkv; ++h) {
        dkeys[h].assign(s.keys[h].size(), 0.0);
        dvals[h].assign(s.vals[h].size(), 0.0);
      }
      Vec qr(static_cast<size_t>(m) * hd), dor(qr.size()), dqr(qr.size());
      for (int qh = 0; qh < nh; ++qh) {
        const int h = qh / G, P = s.P[h] + m;
        for (int t = 0; t < m; ++t) {
          std::copy(s.q.begin() + t * dq + qh * hd, s.q.begin() + t * dq + (qh + 1) * hd, qr.begin() + t * hd);
          std::copy(datt.begin() + t * dq + qh * hd, datt.begin() + t * dq + (qh + 1) * hd, dor.begin() + t * hd);
        }
        std::fill(dqr.begin(), dqr.end(), 0.0);
        grad::attention_backward(qr.data(), s.keys[h].data(), s.vals[h].data(), s.p[qh].data(), dor.data(), m, P, hd,
                                 dqr.data(), dkeys[h].data(), dvals[h].data());
        for (int t = 0; t < m; ++t)
          for (int e = 0; e < hd; ++e) dq_all[t * dq + qh * hd + e] += dqr[t * hd + e];
      }
      Vec dk(static_cast<size_t>(m) * dkv, 0.0), dv(dk.size(), 0.0);
      if (dk_own) dk = (*dk_own)[l];
      if (dv_own) dv = (*dv_own)[l];
      for (int h = 0; h < nkv; ++h) {
        const int P0 = s.P[h];
        for (int t = 0; t < m; ++t)
          for (int e = 0; e < hd; ++e) {
            dk[t * dkv + h * hd + e] += dkeys[h][(P0 + t) * hd + e];
            dv[t * dkv + h * hd + e] += dvals[h][(P0 + t) * hd + e];
          }
        if (dprefix)
          for (int j = 0; j < P0; ++j)
            for (int e = 0; e < hd; ++e) {
              dprefix->k[l][h][j][e] += dkeys[h][j * hd + e];
              dprefix->v[l][h][j][e] += dvals[h][j * hd + e];
            }
      }
      grad::rope_backward(dq_all.data(), pos.data(), inv_freq.data(), m, nh, hd, neox);
      grad::rope_backward(dk.data(), pos.data(), inv_freq.data(), m, nkv, hd, neox);
      Vec dxn(static_cast<size_t>(m) * d, 0.0);
      lin_lora_back(theta, dtheta, l, LoraTarget::Q, s.xn, &la[0], dq_all, m, dxn);
      lin_lora_back(theta, dtheta, l, LoraTarget::K, s.xn, &la[1], dk, m, dxn);
      lin_lora_back(theta, dtheta, l, LoraTarget::V, s.xn, &la[2], dv, m, dxn);
      dx = dx1;
      grad::rmsnorm_backward(s.x.data(), W.an.data(), dxn.data(), m, d, eps, dx.data());
    }
    return dx;
  }

  double loss(const RestoreKVSample& S, const Vec& theta, Vec* grad_out) const {
    const int T = static_cast<int>(S.cont.size()), n = S.n;
    // Restore pass: the R embeddings at n .. n + R - 1 over the whole context, adapter on.
    Vec E(theta.begin(), theta.begin() + static_cast<size_t>(R) * d);
    std::vector<int> rpos(R);
    for (int t = 0; t < R; ++t) rpos[t] = n + t;
    PassAct ra;
    forward(theta.data(), S.full, E, rpos, ra);
    // The student's cache: the kept context entries, then the restore entries.
    KV pre = S.kept;
    const int dkv = nkv * hd;
    for (int l = 0; l < L; ++l)
      for (int h = 0; h < nkv; ++h)
        for (int t = 0; t < R; ++t) {
          pre.k[l][h].emplace_back(ra.layers[l].k.begin() + t * dkv + h * hd, ra.layers[l].k.begin() + t * dkv + (h + 1) * hd);
          pre.v[l][h].emplace_back(ra.layers[l].v.begin() + t * dkv + h * hd, ra.layers[l].v.begin() + t * dkv + (h + 1) * hd);
        }
    // Continuation at n + R .. (the question's positions after the restore entries).
    Vec xc(static_cast<size_t>(T) * d);
    for (int t = 0; t < T; ++t) std::copy(emb.begin() + static_cast<size_t>(S.cont[t]) * d, emb.begin() + static_cast<size_t>(S.cont[t] + 1) * d, xc.begin() + t * d);
    std::vector<int> cpos(T);
    for (int t = 0; t < T; ++t) cpos[t] = n + R + t;
    PassAct ca;
    forward(nullptr, pre, xc, cpos, ca);
    Vec xf(static_cast<size_t>(T) * d), z(static_cast<size_t>(T) * V);
    grad::rmsnorm(ca.xout.data(), onorm.data(), T, d, eps, xf.data());
    grad::linear(xf.data(), out.data(), T, d, V, z.data());
    Vec dz(z.size(), 0.0);
    double kl = 0;
    for (int t = 0; t < T; ++t)
      kl += grad::kl_softmax(S.teacher.data() + static_cast<size_t>(t) * V, z.data() + static_cast<size_t>(t) * V, V,
                             1.0 / T, grad_out ? dz.data() + static_cast<size_t>(t) * V : nullptr);
    kl /= T;
    if (!grad_out) return kl;
    Vec dxf(xf.size(), 0.0), dxo(xf.size(), 0.0);
    grad::linear_backward(xf.data(), out.data(), dz.data(), T, d, V, dxf.data(), nullptr);
    grad::rmsnorm_backward(ca.xout.data(), onorm.data(), dxf.data(), T, d, eps, dxo.data());
    KV dpre;
    dpre.k.assign(L, std::vector<std::vector<Vec>>(nkv));
    dpre.v = dpre.k;
    for (int l = 0; l < L; ++l)
      for (int h = 0; h < nkv; ++h) {
        dpre.k[l][h].assign(pre.k[l][h].size(), Vec(hd, 0.0));
        dpre.v[l][h].assign(pre.v[l][h].size(), Vec(hd, 0.0));
      }
    backward(nullptr, nullptr, ca, cpos, dxo, nullptr, nullptr, &dpre);
    // The restore entries' gradients (the last R prefix rows of every segment) flow into the
    // restore pass; its output hidden states are not used.
    std::vector<Vec> dk_own(L, Vec(static_cast<size_t>(R) * dkv, 0.0)), dv_own = dk_own;
    for (int l = 0; l < L; ++l)
      for (int h = 0; h < nkv; ++h) {
        const size_t P0 = S.kept.k[l][h].size();
        for (int t = 0; t < R; ++t)
          for (int e = 0; e < hd; ++e) {
            dk_own[l][t * dkv + h * hd + e] = dpre.k[l][h][P0 + t][e];
            dv_own[l][t * dkv + h * hd + e] = dpre.v[l][h][P0 + t][e];
          }
      }
    Vec dE = backward(theta.data(), grad_out->data(), ra, rpos, Vec(static_cast<size_t>(R) * d, 0.0), &dk_own, &dv_own,
                      nullptr);
    for (size_t i = 0; i < dE.size(); ++i) (*grad_out)[i] += dE[i];
    return kl;
  }

  Vec emb;  // token embedding table [V][d]
};

RestoreKVObjective::RestoreKVObjective(const Model& model, int n_tokens, int rank, float alpha, double ratio,
                                       const std::vector<std::vector<Token>>& contexts,
                                       const std::vector<std::vector<Token>>& continuations)
    : impl_(new Impl(model, n_tokens, rank, alpha)) {
  std::unique_ptr<Impl> guard(impl_);
  const HParams& hp = model.hparams();
  if (n_tokens < 1 || rank < 1) throw Error(fmt::format("restorekv-train: n_tokens {} and rank {} must be >= 1", n_tokens, rank));
  if (!model.layer(0).bq.empty())
    throw Error("restorekv-train: models with q/k/v biases (qwen2) are not supported by the float64 trainer");
  if (contexts.size() != continuations.size()) throw Error("restorekv-train: contexts and continuations differ in count");
  Impl& I = *impl_;
  I.d = hp.n_embd, I.hd = hp.head_dim, I.nh = hp.n_head, I.nkv = hp.n_head_kv, I.G = hp.n_group(), I.ff = hp.n_ff;
  I.V = hp.n_vocab, I.L = hp.n_layer, I.eps = hp.rms_eps, I.neox = hp.rope_neox;
  I.inv_freq = rope::inv_freq(model);
  I.layers.resize(I.L);
  for (int l = 0; l < I.L; ++l) {
    const LayerWeights& W = model.layer(l);
    const WeightView* views[kLoraTargets] = {W.wq.get(), W.wk.get(), W.wv.get(), W.wo.get(),
                                             W.w_gate.get(), W.w_up.get(), W.w_down.get()};
    for (int t = 0; t < kLoraTargets; ++t) I.layers[l].w[t] = dense_of(*views[t]);
    I.layers[l].an.assign(W.attn_norm.begin(), W.attn_norm.end());
    I.layers[l].fn.assign(W.ffn_norm.begin(), W.ffn_norm.end());
  }
  I.out = dense_of(model.output());
  I.onorm.assign(model.output_norm().begin(), model.output_norm().end());
  I.emb = dense_of(model.token_embd());
  // theta = [E][per layer, per target: A, B].
  size_t off = static_cast<size_t>(n_tokens) * I.d;
  I.a_off.resize(I.L);
  I.b_off.resize(I.L);
  for (int l = 0; l < I.L; ++l)
    for (int t = 0; t < kLoraTargets; ++t) {
      int in, o;
      I.shape(static_cast<LoraTarget>(t), in, o);
      I.a_off[l][t] = off;
      off += static_cast<size_t>(rank) * in;
      I.b_off[l][t] = off;
      off += static_cast<size_t>(o) * rank;
    }
  I.n_params = off;

  // The samples: teacher distributions and the full cache from a plain session; the kept entries
  // from the restorekv press itself (its KVzip selection does not depend on the restore weights).
  auto zero = std::make_shared<RestoreKVWeights>();
  zero->n_embd = I.d, zero->n_layer = I.L, zero->n_tokens = n_tokens;
  zero->embeddings.assign(static_cast<size_t>(n_tokens) * I.d, 0.0f);
  for (size_t i = 0; i < contexts.size(); ++i) {
    RestoreKVSample S;
    S.n = static_cast<int>(contexts[i].size());
    S.cont = continuations[i];
    if (S.n < 1 || S.cont.empty()) throw Error("restorekv-train: a sample needs context and continuation tokens");
    SessionOptions so;
    so.key_codec = so.value_codec = KVCodec::F32;
    Session s(model, so);
    s.forward(contexts[i]);
    auto grab = [&](const KVCache& c, int32_t below, KV& kv) {
      kv.k.assign(I.L, std::vector<std::vector<Vec>>(I.nkv));
      kv.v = kv.k;
      std::vector<float> kr(I.hd), vr(I.hd);
      for (int l = 0; l < I.L; ++l)
        for (int h = 0; h < I.nkv; ++h) {
          const Segment& g = c.seg(l, h);
          for (size_t j = 0; j < g.size(); ++j) {
            if (g.positions()[j] >= below) continue;
            g.keys(j, j + 1, kr.data());
            g.values(j, j + 1, vr.data());
            kv.k[l][h].emplace_back(kr.begin(), kr.end());
            kv.v[l][h].emplace_back(vr.begin(), vr.end());
          }
        }
    };
    grab(s.cache(), S.n, S.full);
    const std::vector<float> lg = s.forward(S.cont, true);
    S.teacher.resize(lg.size());
    for (size_t t = 0; t < S.cont.size(); ++t) {
      const float* r = lg.data() + t * I.V;
      double mx = *std::max_element(r, r + I.V), sum = 0;
      for (int j = 0; j < I.V; ++j) sum += (S.teacher[t * I.V + j] = std::exp(double(r[j]) - mx));
      for (int j = 0; j < I.V; ++j) S.teacher[t * I.V + j] /= sum;
    }
    RequestOptions ro;
    ro.session = so;
    ro.n_predict = 0;
    Request req(model, make_restorekv_press(ratio, zero, "(training)"), ro);
    req.set_prompt_tokens(contexts[i]);
    req.prefill();
    grab(req.cache(), S.n, S.kept);
    I.samples.push_back(std::move(S));
  }
  guard.release();
}

RestoreKVObjective::~RestoreKVObjective() { delete impl_; }
size_t RestoreKVObjective::n_params() const { return impl_->n_params; }
size_t RestoreKVObjective::n_samples() const { return impl_->samples.size(); }

double RestoreKVObjective::loss(size_t sample, const std::vector<double>& theta, std::vector<double>* grad) const {
  if (theta.size() != impl_->n_params || (grad && grad->size() != impl_->n_params))
    throw Error(fmt::format("restorekv-train: {} values for {} parameters", theta.size(), impl_->n_params));
  return impl_->loss(impl_->samples.at(sample), theta, grad);
}

RestoreKVWeights RestoreKVObjective::weights(const std::vector<double>& theta) const {
  const Impl& I = *impl_;
  RestoreKVWeights w;
  w.n_embd = I.d, w.n_layer = I.L, w.n_tokens = I.R;
  w.embeddings.assign(theta.begin(), theta.begin() + static_cast<size_t>(I.R) * I.d);
  std::vector<LoraTarget> all;
  for (int t = 0; t < kLoraTargets; ++t) all.push_back(static_cast<LoraTarget>(t));
  w.lora = LoraAdapter::zeros(I.model.hparams(), I.rank, static_cast<float>(I.scale * I.rank), all);
  for (int l = 0; l < I.L; ++l)
    for (int t = 0; t < kLoraTargets; ++t) {
      auto& f = w.lora.layers[l][t];
      std::copy(theta.begin() + I.a_off[l][t], theta.begin() + I.a_off[l][t] + f.a.size(), f.a.begin());
      std::copy(theta.begin() + I.b_off[l][t], theta.begin() + I.b_off[l][t] + f.b.size(), f.b.begin());
    }
  return w;
}

std::vector<double> RestoreKVObjective::initial(uint32_t seed) const {
  const Impl& I = *impl_;
  std::vector<double> th(I.n_params, 0.0);
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> tok(0, I.V - 1);
  for (int r = 0; r < I.R; ++r) {
    const int t = tok(rng);
    std::copy(I.emb.begin() + static_cast<size_t>(t) * I.d, I.emb.begin() + static_cast<size_t>(t + 1) * I.d,
              th.begin() + static_cast<size_t>(r) * I.d);
  }
  // PEFT's initialisation: A uniform in +-1/sqrt(in) (kaiming-uniform, a = sqrt(5)), B zero.
  for (int l = 0; l < I.L; ++l)
    for (int t = 0; t < kLoraTargets; ++t) {
      int in, o;
      I.shape(static_cast<LoraTarget>(t), in, o);
      std::uniform_real_distribution<double> u(-1.0 / std::sqrt(double(in)), 1.0 / std::sqrt(double(in)));
      for (size_t i = 0; i < static_cast<size_t>(I.rank) * in; ++i) th[I.a_off[l][t] + i] = u(rng);
    }
  return th;
}

RestoreKVWeights train_restorekv(const Model& model, const std::vector<Token>& tokens, const RestoreKVTrainOptions& opt,
                                 RestoreKVTrainReport* report, const std::function<void(int, double)>& progress) {
  if (opt.context < 2 || opt.continuation < 1 || opt.steps < 0 || !(opt.lr > 0) || !(opt.ratio > 0 && opt.ratio < 1) ||
      !(opt.holdout > 0 && opt.holdout < 1))
    throw Error(fmt::format("restorekv-train: context {} (>= 2), continuation {} (>= 1), steps {} (>= 0), lr {} (> 0), "
                            "ratio {} and holdout {} (in (0, 1)) out of range",
                            opt.context, opt.continuation, opt.steps, opt.lr, opt.ratio, opt.holdout));
  const Token bos = model.tokenizer().bos();
  const size_t span = static_cast<size_t>(opt.context - 1 + opt.continuation);
  std::vector<std::vector<Token>> ctx, cont;
  for (size_t s = 0; s + span <= tokens.size(); s += span) {
    std::vector<Token> c(tokens.begin() + s, tokens.begin() + s + opt.context - 1);
    if (bos >= 0) c.insert(c.begin(), bos);
    ctx.push_back(c);
    cont.emplace_back(tokens.begin() + s + opt.context - 1, tokens.begin() + s + span);
  }
  if (ctx.size() < 2)
    throw Error(fmt::format("restorekv-train: the text holds {} tokens, fewer than 2 samples of context {} + "
                            "continuation {}",
                            tokens.size(), opt.context, opt.continuation));
  const size_t held = std::max<size_t>(1, static_cast<size_t>(std::lround(opt.holdout * ctx.size())));
  const size_t train = ctx.size() - held;
  RestoreKVObjective obj(model, opt.n_tokens, opt.rank, opt.alpha, opt.ratio, ctx, cont);
  std::vector<double> th = obj.initial(opt.seed), m(th.size(), 0.0), v(th.size(), 0.0), g(th.size());
  auto held_out_kl = [&] {
    double s = 0;
    for (size_t i = train; i < ctx.size(); ++i) s += obj.loss(i, th, nullptr);
    return s / held;
  };
  RestoreKVTrainReport rep;
  rep.train_samples = static_cast<int>(train);
  rep.held_out_samples = static_cast<int>(held);
  rep.held_out_kl_before = held_out_kl();
  const double b1 = 0.9, b2 = 0.999, eps = 1e-8;
  for (int step = 1; step <= opt.steps; ++step) {
    std::fill(g.begin(), g.end(), 0.0);
    const double kl = obj.loss(static_cast<size_t>(step - 1) % train, th, &g);
    if (step == 1) rep.train_kl_first = kl;
    rep.train_kl_last = kl;
    for (size_t i = 0; i < th.size(); ++i) {
      m[i] = b1 * m[i] + (1 - b1) * g[i];
      v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
      const double mh = m[i] / (1 - std::pow(b1, step)), vh = v[i] / (1 - std::pow(b2, step));
      th[i] -= opt.lr * mh / (std::sqrt(vh) + eps);
    }
    if (progress) progress(step, kl);
  }
  rep.held_out_kl_after = held_out_kl();
  if (report) *report = rep;
  return obj.weights(th);
}

}  // namespace kvslim
