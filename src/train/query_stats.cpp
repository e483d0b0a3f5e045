// Expected Attention's query statistics computed on a model and a text (train/query_stats.h).
#include "train/query_stats.h"

#include <fmt/format.h>

#include "model/session.h"
#include "model/layer_hook.h"

namespace kvslim {

QueryStatsFile compute_query_stats(const Model& model, const std::vector<std::vector<Token>>& samples, int n_sink,
                                   const std::function<void(size_t, size_t)>& progress) {
  const HParams& hp = model.hparams();
  const int L = hp.n_layer, nh = hp.n_head, hd = hp.head_dim;
  std::vector<double> sum(static_cast<size_t>(L) * nh * hd, 0.0), outer(static_cast<size_t>(L) * nh * hd * hd, 0.0);
  std::vector<double> count(L, 0.0);
  for (size_t s = 0; s < samples.size(); ++s) {
    if (samples[s].empty()) continue;
    SessionOptions so;
    so.n_ctx = static_cast<int>(samples[s].size());
    so.key_codec = so.value_codec = KVCodec::F32;  // the model's own precision for the later layers' queries
    Session sess(model, so);
    // Every query before RoPE, as the forward pass computes it (the hook after Q/K/V).
    AfterQKV collect([&](const LayerStep& st) {
      const int l = st.layer, n = st.n, nheads = st.hp->n_head, d = st.hp->head_dim;
      const float* q = st.q;
      const int32_t* pos = st.positions;
      for (int t = 0; t < n; ++t) {
        if (pos[t] < n_sink) continue;
        count[l] += 1;
        for (int h = 0; h < nheads; ++h) {
          const float* x = q + (static_cast<size_t>(t) * nheads + h) * d;
          double* sm = sum.data() + (static_cast<size_t>(l) * nh + h) * hd;
          double* o = outer.data() + (static_cast<size_t>(l) * nh + h) * hd * hd;
          for (int a = 0; a < d; ++a) {
            sm[a] += x[a];
            for (int b = 0; b < d; ++b) o[static_cast<size_t>(a) * hd + b] += double(x[a]) * x[b];
          }
        }
      }
    });
    sess.forward(samples[s], false, &collect);
    if (progress) progress(s + 1, samples.size());
  }
  const double N = count[0];
  if (N < 2) throw Error(fmt::format("ea-stats: {} queries after the {} sinks; need at least 2 (longer text)", N, n_sink));
  QueryStatsFile f;
  f.n_layer = L;
  f.n_head = nh;
  f.head_dim = hd;
  f.n_sink = n_sink;
  f.samples = static_cast<int>(samples.size());
  f.tokens = N;
  f.mean.resize(sum.size());
  f.cov.resize(outer.size());
  for (size_t i = 0; i < static_cast<size_t>(L) * nh; ++i) {
    const double* sm = sum.data() + i * hd;
    for (int a = 0; a < hd; ++a) f.mean[i * hd + a] = static_cast<float>(sm[a] / N);
    for (int a = 0; a < hd; ++a)
      for (int b = 0; b < hd; ++b) {  // (sum q q^T - N mu mu^T) / (N - 1)
        const double o = outer[(i * hd + a) * hd + b];
        f.cov[(i * hd + a) * hd + b] = static_cast<float>((o - sm[a] * sm[b] / N) / (N - 1));
      }
  }
  return f;
}

}  // namespace kvslim
