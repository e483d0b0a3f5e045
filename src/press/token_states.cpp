// Queries and pre-RoPE keys from recorded hidden states (see token_states.h).
#include "press/token_states.h"

#include <cmath>
#include <unordered_map>

#include <fmt/format.h>

#include "kernels/matmul.h"
#include "model/rope.h"

namespace kvslim {

namespace {

/// RMSNorm of the hidden rows `rows` with the layer's attention norm, [rows][n_embd].
std::vector<float> normed(const LayerView& view, const std::vector<int>& rows) {
  const HParams& hp = view.hp();
  const int d = hp.n_embd;
  const std::vector<float>& x = view.obs().hidden[view.layer()];
  const std::vector<float>& w = view.model().layer(view.layer()).attn_norm;
  std::vector<float> out(rows.size() * static_cast<size_t>(d));
  for (size_t r = 0; r < rows.size(); ++r) {
    const float* xr = x.data() + static_cast<size_t>(rows[r]) * d;
    double ss = 0;
    for (int i = 0; i < d; ++i) ss += double(xr[i]) * xr[i];
    const float scale = static_cast<float>(1.0 / std::sqrt(ss / d + hp.rms_eps));
    for (int i = 0; i < d; ++i) out[r * d + i] = xr[i] * scale * w[i];
  }
  return out;
}

}  // namespace

std::vector<int> hidden_rows(const LayerView& view, int kv_head, const char* press) {
  const Observation& obs = view.obs();
  const auto& hp = obs.hidden_positions;
  std::unordered_map<int32_t, int> row;
  for (size_t i = 0; i < hp.size(); ++i) row[hp[i]] = static_cast<int>(i);
  const bool have = static_cast<size_t>(view.layer()) < obs.hidden.size();
  std::vector<int> out;
  for (int32_t p : view.seg(kv_head).positions()) {
    auto it = row.find(p);
    if (!have || it == row.end())
      throw Error(fmt::format("press {}: no hidden state recorded for the entry at position {} (it needs the whole "
                              "context in one prefill step, as kvpress: RequestOptions::chunk_size 0)",
                              press, p));
    out.push_back(it->second);
  }
  return out;
}

std::vector<float> queries_from_hidden(const LayerView& view, const std::vector<int>& rows) {
  const HParams& hp = view.hp();
  const LayerWeights& L = view.model().layer(view.layer());
  const int dq = hp.n_head * hp.head_dim;
  std::vector<float> xn = normed(view, rows), q(rows.size() * static_cast<size_t>(dq));
  if (!rows.empty()) matmul(*L.wq, xn.data(), static_cast<int64_t>(rows.size()), q.data());
  const std::vector<double> inv = rope::inv_freq(view.model());
  const auto& pos = view.obs().hidden_positions;
  const double mag = rope::magnitude(hp);
  for (size_t r = 0; r < rows.size(); ++r)
    for (int h = 0; h < hp.n_head; ++h) {
      float* x = q.data() + r * dq + static_cast<size_t>(h) * hp.head_dim;
      if (!L.bq.empty())
        for (int i = 0; i < hp.head_dim; ++i) x[i] += L.bq[h * hp.head_dim + i];
      rope::rotate(x, hp.head_dim, hp.rope_neox, inv, double(pos[rows[r]]));
      if (mag != 1.0)  // as the forward pass scales rotated queries (YaRN's magnitude)
        for (int i = 0; i < hp.head_dim; ++i) x[i] = static_cast<float>(x[i] * mag);
    }
  return q;
}

std::vector<float> prerope_keys_from_hidden(const LayerView& view, int kv_head, const std::vector<int>& rows) {
  const HParams& hp = view.hp();
  const LayerWeights& L = view.model().layer(view.layer());
  const int dkv = hp.n_head_kv * hp.head_dim, hd = hp.head_dim;
  std::vector<float> xn = normed(view, rows), k(rows.size() * static_cast<size_t>(dkv));
  if (!rows.empty()) matmul(*L.wk, xn.data(), static_cast<int64_t>(rows.size()), k.data());
  std::vector<float> out(rows.size() * static_cast<size_t>(hd));
  for (size_t r = 0; r < rows.size(); ++r)
    for (int i = 0; i < hd; ++i)
      out[r * hd + i] = k[r * dkv + kv_head * hd + i] + (L.bk.empty() ? 0.0f : L.bk[kv_head * hd + i]);
  return out;
}

void mean_std(const std::vector<std::vector<double>>& x, double& mean, double& std) {
  double s = 0;
  size_t n = 0;
  for (const auto& v : x)
    for (double a : v) s += a, ++n;
  mean = n ? s / n : 0.0;
  double ss = 0;
  for (const auto& v : x)
    for (double a : v) ss += (a - mean) * (a - mean);
  std = n > 1 ? std::sqrt(ss / (n - 1)) : NAN;
}

}  // namespace kvslim
