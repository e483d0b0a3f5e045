// Cross-layer sharing of latent bases by measured subspace similarity (see latent_share.h).
#include "press/latent_share.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "kvslim/error.h"

namespace kvslim {

int LatentShare::n_groups() const {
  int n = 0;
  for (size_t l = 0; l < group.size(); ++l) n += group[l] == static_cast<int>(l);
  return n;
}

namespace {

double total_var(const Pca& p) {
  double t = 0;
  for (double v : p.var) t += v;
  return t;
}

// Fraction of the variance of the rows behind `own` (their PCA) that `b` keeps, from the
// covariance C = sum_i var_i a_i a_i^T and the mean offset d = mean_own - mean_b:
// err = tr C + |d|^2 - sum_j (p_j^T C p_j + (p_j . d)^2) for orthonormal rows p_j of b.
double kept_by(const Pca& own, const LatentBasis& b) {
  const int hd = own.head_dim, r = b.rank();
  const double total = total_var(own);
  std::vector<double> d(hd);
  double err = total;
  for (int k = 0; k < hd; ++k) {
    d[k] = own.mean[k] - (b.mean.empty() ? 0.0 : b.mean[k]);
    err += d[k] * d[k];
  }
  for (int j = 0; j < r; ++j) {
    const float* p = b.proj.data() + static_cast<size_t>(j) * hd;
    double pd = 0;
    for (int k = 0; k < hd; ++k) pd += p[k] * d[k];
    double pcp = 0;
    for (int i = 0; i < hd; ++i) {
      if (own.var[i] == 0.0) continue;
      const double* a = own.axes.data() + static_cast<size_t>(i) * hd;
      double ap = 0;
      for (int k = 0; k < hd; ++k) ap += a[k] * p[k];
      pcp += own.var[i] * ap * ap;
    }
    err -= pcp + pd * pd;
  }
  if (total <= 0.0) return 1.0;
  return 1.0 - std::max(err, 0.0) / total;
}

double kept_own(const Pca& p, int r) {
  const double total = total_var(p);
  if (total <= 0.0) return 1.0;
  double k = 0;
  for (int i = 0; i < r && i < p.head_dim; ++i) k += p.var[i];
  return k / total;
}

}  // namespace

LatentShare share_adjacent_layers(const std::vector<LayerRows>& layers, int hd, const std::vector<int>& ranks,
                                  double energy, double tol, int max_group, bool min_rank) {
  const int L = static_cast<int>(layers.size());
  if (static_cast<int>(ranks.size()) != L)
    throw Error(fmt::format("latent sharing: {} ranks for {} layers", ranks.size(), L));
  std::vector<Pca> own;
  std::vector<int> rk(L);
  LatentShare out;
  out.group.resize(L);
  out.basis.resize(L);
  out.kept_own.resize(L);
  out.kept.resize(L);
  for (int l = 0; l < L; ++l) {
    if (layers[l].n == 0) throw Error(fmt::format("latent sharing: layer {} has no rows", l));
    own.push_back(pca(layers[l].rows, layers[l].n, hd));
    rk[l] = ranks[l] > 0 ? std::min(ranks[l], hd) : own[l].rank_for_energy(energy);
    out.kept_own[l] = kept_own(own[l], rk[l]);
  }
  // Closes the group [g0, g1): its own basis when alone, else `pooled`.
  auto close = [&](int g0, int g1, const std::shared_ptr<const LatentBasis>& pooled) {
    for (int l = g0; l < g1; ++l) {
      out.group[l] = g0;
      out.basis[l] = g1 - g0 == 1 ? own[l].basis(rk[l]) : pooled;
      out.kept[l] = g1 - g0 == 1 ? out.kept_own[l] : kept_by(own[l], *pooled);
    }
  };
  int g0 = 0;
  std::shared_ptr<const LatentBasis> cur;  // pooled basis of [g0, l) when it has 2+ members
  std::vector<float> pool;
  for (int l = 1; l <= L; ++l) {
    bool joined = false;
    if (l < L && tol >= 0.0 && (max_group <= 0 || l - g0 < max_group)) {
      pool.clear();
      int r = rk[g0];
      for (int m = g0; m <= l; ++m) {
        pool.insert(pool.end(), layers[m].rows, layers[m].rows + layers[m].n * hd);
        r = min_rank ? std::min(r, rk[m]) : std::max(r, rk[m]);
      }
      auto cand = pca(pool.data(), pool.size() / hd, hd).basis(r);
      joined = true;
      for (int m = g0; m <= l && joined; ++m) joined = kept_by(own[m], *cand) >= out.kept_own[m] - tol;
      if (joined) cur = std::move(cand);
    }
    if (joined) continue;
    close(g0, l, cur);
    g0 = l;
    cur.reset();
  }
  return out;
}

double latent_kept_fraction(const LatentBasis& b, const float* rows, size_t n) {
  const int hd = b.head_dim, r = b.rank();
  if (n == 0) return 1.0;
  std::vector<double> mu(hd, 0.0);
  for (size_t j = 0; j < n; ++j)
    for (int k = 0; k < hd; ++k) mu[k] += rows[j * hd + k];
  for (double& m : mu) m /= static_cast<double>(n);
  std::vector<float> code(r), rec(hd);
  double total = 0, err = 0;
  for (size_t j = 0; j < n; ++j) {
    const float* x = rows + j * hd;
    b.encode(x, code.data());
    b.decode(code.data(), rec.data());
    for (int k = 0; k < hd; ++k) {
      total += (x[k] - mu[k]) * (x[k] - mu[k]);
      err += (double(x[k]) - rec[k]) * (double(x[k]) - rec[k]);
    }
  }
  return total > 0 ? 1.0 - err / total : 1.0;
}

}  // namespace kvslim
