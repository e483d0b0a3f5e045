// Offline query statistics for Expected Attention (see ea_stats.h).
#include "press/ea_stats.h"

#include <fmt/format.h>

#include "kvslim/gguf.h"
#include "kvslim/session.h"
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

void QueryStatsFile::save(const std::string& path) const {
  GGUFWriter w;
  w.set("general.architecture", GGUFValue::str("ea_stats"));
  w.set("ea_stats.base_model", GGUFValue::str(base_model));
  w.set("ea_stats.n_layer", GGUFValue::u32(n_layer));
  w.set("ea_stats.n_head", GGUFValue::u32(n_head));
  w.set("ea_stats.head_dim", GGUFValue::u32(head_dim));
  w.set("ea_stats.n_sink", GGUFValue::u32(n_sink));
  w.set("ea_stats.samples", GGUFValue::u32(samples));
  w.set("ea_stats.tokens", GGUFValue::u64(static_cast<uint64_t>(tokens)));
  w.add_tensor_f32("ea_stats.mean", GGMLType::F32, {head_dim, n_head, n_layer}, mean);
  w.add_tensor_f32("ea_stats.cov", GGMLType::F32, {head_dim, head_dim, n_head, n_layer}, cov);
  w.write(path);
}

QueryStatsFile QueryStatsFile::load(const std::string& path) {
  auto f = GGUFFile::open(path);
  if (f->get_string("general.architecture") != "ea_stats")
    throw Error(fmt::format("{}: not an Expected Attention statistics file (write one with kvslim ea-stats)", path));
  QueryStatsFile q;
  q.base_model = f->get_string("ea_stats.base_model");
  q.n_layer = static_cast<int>(f->get_int("ea_stats.n_layer"));
  q.n_head = static_cast<int>(f->get_int("ea_stats.n_head"));
  q.head_dim = static_cast<int>(f->get_int("ea_stats.head_dim"));
  q.n_sink = static_cast<int>(f->get_int("ea_stats.n_sink"));
  q.samples = static_cast<int>(f->get_int("ea_stats.samples"));
  q.tokens = static_cast<double>(f->get_int("ea_stats.tokens"));
  if (q.n_layer < 1 || q.n_head < 1 || q.head_dim < 1)
    throw Error(fmt::format("{}: bad statistics shape ({} layers, {} heads, head_dim {})", path, q.n_layer, q.n_head,
                            q.head_dim));
  const int64_t m = int64_t(q.n_layer) * q.n_head * q.head_dim;
  const TensorInfo& a = f->tensor("ea_stats.mean");
  const TensorInfo& c = f->tensor("ea_stats.cov");
  if (a.nelements() != m || c.nelements() != m * q.head_dim)
    throw Error(fmt::format("{}: ea_stats.mean / ea_stats.cov have {} / {} values, expected {} / {}", path,
                            a.nelements(), c.nelements(), m, m * q.head_dim));
  q.mean = f->tensor_f32(a);
  q.cov = f->tensor_f32(c);
  return q;
}

void QueryStatsFile::check(const HParams& hp, const std::string& what) const {
  if (n_layer != hp.n_layer || n_head != hp.n_head || head_dim != hp.head_dim)
    throw Error(fmt::format("{}: statistics for {} layers x {} query heads x head_dim {} do not fit the model ({} x {} "
                            "x {})",
                            what, n_layer, n_head, head_dim, hp.n_layer, hp.n_head, hp.head_dim));
}

}  // namespace kvslim
