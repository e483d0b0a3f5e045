// Code bits of calibrated latent bases chosen by measured KL (kvslim latent-calibrate --target-kl):
// the variance proxy of --auto-bits (Max's Gaussian quantization error) cannot see that a model's
// keys are far more sensitive than its values (the story model: 4-bit keys cost 0.2 nats, 4-bit
// values 0.002; docs/LATENT.md, "the composition space"), so every candidate is run and measured instead, as the
// fidelity harness (`kvslim eval fidelity`) measures a press.
#include <algorithm>
#include <cmath>
#include <memory>

#include <fmt/format.h>

#include "kvslim/sampling.h"
#include "model/session.h"
#include "train/latent_calibrate.h"

namespace kvslim {

LatentBitsChoice choose_latent_bits_by_kl(const Model& model, LatentBases& bases,
                                          const std::vector<std::vector<Token>>& probe_docs, double target_kl,
                                          LatentScales scales, double holdout, bool per_segment) {
  if (!(target_kl >= 0.0) || !std::isfinite(target_kl))
    throw Error(fmt::format("latent bits by KL: target KL {} must be a finite number >= 0 (nats)", target_kl));
  if (!(holdout > 0.0 && holdout < 1.0))
    throw Error(fmt::format("latent bits by KL: held-out fraction {} must be in (0, 1)", holdout));
  bases.check(model.hparams(), "latent bits by KL");
  const int L = bases.n_layer, H = bases.n_head_kv, S = L * H;
  const size_t n_vocab = static_cast<size_t>(model.hparams().n_vocab);

  // Per document: the full cache after the context, and the full cache's logits over the held-out
  // tokens (the reference of every trial).
  struct Probe {
    std::unique_ptr<Session> s;  // holds the context; each trial restores `full` and rewinds
    std::vector<Token> tail;
    KVCache full;
    int32_t base;
    std::vector<float> reference;
  };
  std::vector<Probe> probes;
  SessionOptions so;  // f16 cache, as a request's before the latent press converts it
  for (const auto& doc : probe_docs) {
    if (doc.size() < 2) continue;
    const size_t n_tail = std::min(doc.size() - 1, std::max<size_t>(1, static_cast<size_t>(holdout * doc.size())));
    so.n_ctx = static_cast<int>(doc.size());
    auto s = std::make_unique<Session>(model, so);
    s->forward(std::vector<Token>(doc.begin(), doc.end() - static_cast<std::ptrdiff_t>(n_tail)));
    Probe p{nullptr, std::vector<Token>(doc.end() - static_cast<std::ptrdiff_t>(n_tail), doc.end()), s->cache(),
            s->next_position(), {}};
    p.reference = s->forward(p.tail, true);
    p.s = std::move(s);
    probes.push_back(std::move(p));
  }
  if (probes.empty()) throw Error("latent bits by KL: no held-out document of at least 2 tokens");

  LatentBitsChoice out;
  std::vector<LatentBitsTrial> cand;
  for (int kb : {2, 4, 8, 0})
    for (int vb : {2, 4, 8, 0}) {
      LatentBitsTrial t;
      t.k_bits = kb;
      t.v_bits = vb;
      for (int u = 0; u < S; ++u)
        t.bytes_per_entry += static_cast<double>(latent_row_bytes(bases.key[u]->rank(), kb, scales) +
                                                 latent_row_bytes(bases.value[u]->rank(), vb, scales) + 4);
      cand.push_back(t);
    }
  // Fewest bytes first; at equal bytes more key bits first (f16 = 16).
  auto key_bits = [](int b) { return b == 0 ? 16 : b; };
  std::stable_sort(cand.begin(), cand.end(), [&](const LatentBitsTrial& a, const LatentBitsTrial& b) {
    if (a.bytes_per_entry != b.bytes_per_entry) return a.bytes_per_entry < b.bytes_per_entry;
    return key_bits(a.k_bits) > key_bits(b.k_bits);
  });

  // Mean KL over every held-out token with per-segment bits kb / vb.
  auto measure = [&](const std::vector<int>& kb, const std::vector<int>& vb) {
    double sum = 0;
    size_t count = 0;
    for (Probe& p : probes) {
      Session& s = *p.s;
      s.cache() = p.full;
      s.rewind(p.base);  // back to the end of the context
      for (int u = 0; u < S; ++u) {
        Segment& seg = s.cache().seg(u / H, u % H);
        if (seg.size() > 0) seg.to_latent(bases.key[u], kb[u], bases.value[u], vb[u], scales);
      }
      const std::vector<float> q = s.forward(p.tail, true);
      for (size_t i = 0; i < p.tail.size(); ++i)
        sum += kl_divergence_logits(p.reference.data() + i * n_vocab, q.data() + i * n_vocab, n_vocab);
      count += p.tail.size();
    }
    return sum / static_cast<double>(count);
  };
  for (LatentBitsTrial t : cand) {
    t.kl = measure(std::vector<int>(S, t.k_bits), std::vector<int>(S, t.v_bits));
    out.trials.push_back(t);
    if (t.kl <= target_kl) {
      out.chosen = static_cast<int>(out.trials.size()) - 1;
      out.target_met = true;
      break;
    }
  }
  if (out.chosen < 0) {
    out.chosen = 0;
    for (size_t i = 1; i < out.trials.size(); ++i)
      if (out.trials[i].kl < out.trials[out.chosen].kl) out.chosen = static_cast<int>(i);
  }
  const LatentBitsTrial& c = out.trials[out.chosen];
  bases.key_bits.assign(S, c.k_bits);
  bases.value_bits.assign(S, c.v_bits);
  out.bytes_per_entry = c.bytes_per_entry;
  out.kl = c.kl;
  if (!per_segment || !out.target_met) return out;
  // Greedy per segment side: the lowering with the least KL increase per byte saved that keeps
  // the KL within the target, until none does.
  auto lower = [](int b) { return b == 0 ? 8 : b == 8 ? 4 : b == 4 ? 2 : -1; };
  std::vector<int>& kb = bases.key_bits;
  std::vector<int>& vb = bases.value_bits;
  for (;;) {
    int best_u = -1, best_side = 0;
    double best_score = 0, best_kl = 0, best_saved = 0;
    for (int side = 0; side < 2; ++side)
      for (int u = 0; u < S; ++u) {
        std::vector<int>& bits = side ? vb : kb;
        const int old = bits[u], nb = lower(old);
        if (nb < 0) continue;
        const int rank = (side ? bases.value[u] : bases.key[u])->rank();
        const double saved = static_cast<double>(latent_row_bytes(rank, old, scales)) -
                             static_cast<double>(latent_row_bytes(rank, nb, scales));
        if (saved <= 0) continue;
        bits[u] = nb;
        const double kl = measure(kb, vb);
        bits[u] = old;
        if (kl > target_kl) continue;
        const double score = (kl - out.kl) / saved;
        if (best_u < 0 || score < best_score) best_u = u, best_side = side, best_score = score, best_kl = kl, best_saved = saved;
      }
    if (best_u < 0) break;
    (best_side ? vb : kb)[best_u] = lower((best_side ? vb : kb)[best_u]);
    out.kl = best_kl;
    out.bytes_per_entry -= best_saved;
    ++out.steps;
  }
  return out;
}

}  // namespace kvslim
