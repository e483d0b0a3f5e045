// Q-Filters: computing the directions on a model and a text (see press/qfilter.h).
#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "kvslim/gguf.h"
#include "model/session.h"
#include "train/qfilter_calibrate.h"
#include "press/recorders.h"

extern "C" void dsyevd_(const char* jobz, const char* uplo, const int* n, double* a, const int* lda, double* w,
                        double* work, const int* lwork, int* iwork, const int* liwork, int* info);

namespace kvslim {

namespace {

/// Top eigenvector of the symmetric a [n][n] (float64, LAPACK), its eigenvalue and the trace.
std::vector<double> top_eigenvector(std::vector<double> a, int n, double& top, double& trace) {
  trace = 0;
  for (int i = 0; i < n; ++i) trace += a[static_cast<size_t>(i) * n + i];
  std::vector<double> w(n);
  int info = 0, lwork = -1, liwork = -1, iwq = 0;
  double wq = 0;
  const char jobz = 'V', uplo = 'L';
  dsyevd_(&jobz, &uplo, &n, a.data(), &n, w.data(), &wq, &lwork, &iwq, &liwork, &info);
  lwork = static_cast<int>(wq);
  liwork = iwq;
  std::vector<double> work(std::max(1, lwork));
  std::vector<int> iwork(std::max(1, liwork));
  dsyevd_(&jobz, &uplo, &n, a.data(), &n, w.data(), work.data(), &lwork, iwork.data(), &liwork, &info);
  if (info != 0) throw Error(fmt::format("qfilter-calibrate: LAPACK dsyevd failed (info {})", info));
  top = w[n - 1];  // ascending
  return std::vector<double>(a.begin() + static_cast<size_t>(n - 1) * n, a.begin() + static_cast<size_t>(n) * n);
}

}  // namespace

QFilters qfilter_calibrate(const Model& model, const std::vector<std::vector<Token>>& docs,
                           const std::function<void(size_t, size_t)>& progress) {
  const HParams& hp = model.hparams();
  const int L = hp.n_layer, H = hp.n_head_kv, G = hp.n_group(), hd = hp.head_dim;
  const size_t segs = static_cast<size_t>(L) * H;
  std::vector<std::vector<double>> C(segs, std::vector<double>(static_cast<size_t>(hd) * hd, 0.0));
  std::vector<std::vector<double>> S(segs, std::vector<double>(hd, 0.0));
  size_t tokens = 0;
  for (size_t d = 0; d < docs.size(); ++d) {
    const auto& doc = docs[d];
    if (doc.empty()) continue;
    SessionOptions so;
    so.n_ctx = static_cast<int>(doc.size());
    Session s(model, so);
    ObservationNeeds needs;
    needs.window = static_cast<int>(doc.size());
    Observation obs;
    run_observed(s, doc, needs, obs);
    const int w = obs.n_window();
    tokens += static_cast<size_t>(w);
    for (int l = 0; l < L; ++l)
      for (int h = 0; h < H; ++h) {
        std::vector<double>& c = C[static_cast<size_t>(l) * H + h];
        std::vector<double>& sum = S[static_cast<size_t>(l) * H + h];
        for (int g = 0; g < G; ++g) {
          const float* q = obs.queries[l].data() + static_cast<size_t>(h * G + g) * w * hd;
          for (int i = 0; i < w; ++i) {
            const float* x = q + static_cast<size_t>(i) * hd;
            for (int a = 0; a < hd; ++a) {
              sum[a] += x[a];
              double* row = c.data() + static_cast<size_t>(a) * hd;
              for (int b = 0; b < hd; ++b) row[b] += double(x[a]) * x[b];
            }
          }
        }
      }
    if (progress) progress(d + 1, docs.size());
  }
  if (tokens == 0) throw Error("qfilter-calibrate: no tokens to compute the filters from");
  QFilters f;
  f.n_layer = L;
  f.n_head_kv = H;
  f.head_dim = hd;
  f.dir.resize(segs * hd);
  f.explained.resize(segs);
  for (size_t i = 0; i < segs; ++i) {
    double top = 0, trace = 0;
    std::vector<double> u = top_eigenvector(C[i], hd, top, trace);
    double dot = 0;
    for (int a = 0; a < hd; ++a) dot += u[a] * S[i][a];
    const double sign = dot < 0 ? -1.0 : 1.0;
    for (int a = 0; a < hd; ++a) f.dir[i * hd + a] = static_cast<float>(sign * u[a]);
    f.explained[i] = static_cast<float>(trace > 0 ? top / trace : 0.0);
  }
  return f;
}

}  // namespace kvslim
