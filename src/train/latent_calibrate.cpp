// Calibration of latent bases: PCA of the keys and values a model writes over calibration text,
// with ranks fixed, chosen by kept variance, or allocated greedily to a byte budget.
#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "model/session.h"
#include "train/latent_calibrate.h"
#include "press/latent_share.h"

namespace kvslim {

size_t latent_row_bytes(int rank, int bits, LatentScales scales) {
  if (bits == 32) return static_cast<size_t>(rank) * 4;
  if (bits == 0) return static_cast<size_t>(rank) * 2;
  return (static_cast<size_t>(rank) * bits + 7) / 8 + (scales == LatentScales::Channel ? 1 : 2);
}

double latent_quant_error(int bits) {
  switch (bits) {
    case 2: return 0.1188;
    case 4: return 0.01154;
    case 8: return 0.0308 * 0.0308 / 12.0;
    default: return 0.0;
  }
}

namespace {

// Fraction of a PCA's variance its leading r axes keep.
double kept_frac(const Pca& p, int r) {
  double t = 0, k = 0;
  for (int i = 0; i < p.head_dim; ++i) (i < r ? k : t) += p.var[i];
  return k + t > 0 ? k / (k + t) : 1.0;
}

// Ranks and bits per segment side (sides[2u] keys, sides[2u+1] values) minimizing the summed
// predicted relative error D(r, b) = (1 - kept(r)) + latent_quant_error(b) * kept(r) under
// `budget` bytes per entry over all sides: each side takes argmin D + lambda * bytes(r, b), with
// lambda bisected (geometrically) to the smallest value whose total fits.
void allocate_auto_bits(const std::vector<const Pca*>& sides, double budget, std::vector<int>& rank,
                        std::vector<int>& bits) {
  const int n = static_cast<int>(sides.size());
  const int hd = sides.empty() ? 0 : sides[0]->head_dim;
  static const int kBits[] = {2, 4, 8};
  std::vector<std::vector<double>> kept(n);
  for (int s = 0; s < n; ++s)
    for (int r = 0; r <= hd; ++r) kept[s].push_back(kept_frac(*sides[s], r));
  std::vector<int> rk(n), bk(n);
  auto pick = [&](double lambda) {
    double total = 0;
    for (int s = 0; s < n; ++s) {
      double best = INFINITY;
      for (int r = 1; r <= hd; ++r)
        for (int b : kBits) {
          const double c = static_cast<double>(latent_row_bytes(r, b));
          const double v = (1.0 - kept[s][r]) + latent_quant_error(b) * kept[s][r] + lambda * c;
          if (v < best) best = v, rk[s] = r, bk[s] = b;
        }
      total += static_cast<double>(latent_row_bytes(rk[s], bk[s]));
    }
    return total;
  };
  double lo = 1e-9, hi = 1e3;
  if (pick(hi) > budget + 1e-9)
    throw Error(fmt::format("latent calibration: the byte budget ({:.1f} bytes per entry over all segments) is less "
                            "than rank 1 with 2-bit codes everywhere",
                            budget));
  if (pick(lo) <= budget + 1e-9) hi = lo;
  for (int it = 0; it < 100 && hi / lo > 1.0 + 1e-9; ++it) {
    const double mid = std::sqrt(lo * hi);
    (pick(mid) <= budget + 1e-9 ? hi : lo) = mid;
  }
  pick(hi);
  rank = rk;
  bits = bk;
}

void check_bits(int b, const char* param) {
  if (b != 0 && b != 2 && b != 4 && b != 8 && b != 32)
    throw Error(fmt::format("{} {} must be 0 (f16 codes), 2, 4, 8 or 32 (f32 codes)", param, b));
}

// Bytes one more coordinate costs (sub-byte codes counted fractionally while allocating).
double dim_cost(int bits) { return bits == 0 ? 2.0 : bits == 32 ? 4.0 : bits / 8.0; }

}  // namespace

LatentBases calibrate_latent(const Model& model, const std::vector<std::vector<Token>>& docs,
                             const LatentCalibration& opt, std::vector<std::string>* report) {
  check_bits(opt.k_bits, "LatentCalibration::k_bits");
  check_bits(opt.v_bits, "LatentCalibration::v_bits");
  const HParams& hp = model.hparams();
  const int L = hp.n_layer, H = hp.n_head_kv, hd = hp.head_dim, S = L * H;
  std::vector<std::vector<float>> keys(S), vals(S);
  size_t tokens = 0;
  for (const auto& doc : docs) {
    if (doc.empty()) continue;
    SessionOptions so;
    so.key_codec = so.value_codec = KVCodec::F32;
    so.n_ctx = static_cast<int>(doc.size());
    Session s(model, so);
    s.forward(doc);
    tokens += doc.size();
    for (int u = 0; u < S; ++u) {
      const Segment& seg = s.cache().seg(u / H, u % H);
      const size_t n = seg.size(), k0 = keys[u].size();
      keys[u].resize(k0 + n * hd);
      vals[u].resize(k0 + n * hd);
      seg.keys(0, n, keys[u].data() + k0);
      seg.values(0, n, vals[u].data() + k0);
    }
  }
  if (tokens == 0) throw Error("latent calibration: no calibration tokens");
  std::vector<Pca> pk, pv;
  for (int u = 0; u < S; ++u) {
    pk.push_back(pca(keys[u].data(), keys[u].size() / hd, hd));
    pv.push_back(pca(vals[u].data(), vals[u].size() / hd, hd));
  }
  std::vector<int> rk(S), rv(S), bk(S, opt.k_bits), bv(S, opt.v_bits);
  if (opt.memory_ratio > 0.0 && opt.auto_bits) {
    std::vector<const Pca*> sides;
    for (int u = 0; u < S; ++u) sides.push_back(&pk[u]), sides.push_back(&pv[u]);
    std::vector<int> r, b;
    allocate_auto_bits(sides, S * (opt.memory_ratio * (4.0 * hd + 4.0) - 4.0), r, b);
    for (int u = 0; u < S; ++u) rk[u] = r[2 * u], bk[u] = b[2 * u], rv[u] = r[2 * u + 1], bv[u] = b[2 * u + 1];
  } else if (opt.memory_ratio > 0.0) {
    // Budget in bytes per entry summed over segments, charged exactly (row_bytes of the ranks).
    const double entry_f16 = 4.0 * hd + 4.0;
    const double base = 4.0 + latent_row_bytes(1, opt.k_bits) + latent_row_bytes(1, opt.v_bits);
    double left = S * (opt.memory_ratio * entry_f16 - base);
    if (left < -1e-9)
      throw Error(fmt::format("LatentCalibration::memory_ratio {} leaves less than rank 1 for keys and values ({:.1f} bytes per entry "
                              "needed of {:.1f})",
                              opt.memory_ratio, base, entry_f16));
    struct Item {
      double gain, cost;
      int u, side;
    };
    std::vector<Item> items;
    for (int u = 0; u < S; ++u)
      for (int side = 0; side < 2; ++side) {
        const Pca& p = side ? pv[u] : pk[u];
        double total = 0;
        for (double v : p.var) total += v;
        for (int i = 1; i < hd; ++i)
          items.push_back({total > 0 ? p.var[i] / total : 0.0, dim_cost(side ? opt.v_bits : opt.k_bits), u, side});
      }
    // Best share of variance per byte first; within a side the axes come in order (variance
    // descends and the cost is the same), so a side's ranks grow as prefixes.
    std::stable_sort(items.begin(), items.end(),
                     [](const Item& a, const Item& b) { return a.gain / a.cost > b.gain / b.cost; });
    std::fill(rk.begin(), rk.end(), 1);
    std::fill(rv.begin(), rv.end(), 1);
    for (const Item& it : items) {
      int& r = (it.side ? rv : rk)[it.u];
      const int bits = it.side ? opt.v_bits : opt.k_bits;
      const double delta = static_cast<double>(latent_row_bytes(r + 1, bits)) - latent_row_bytes(r, bits);
      if (delta > left + 1e-9) continue;  // a later, cheaper step (sub-byte codes) may still fit
      left -= delta;
      ++r;
    }
  } else {
    for (int u = 0; u < S; ++u) {
      rk[u] = opt.k_rank > 0 ? std::min(opt.k_rank, hd) : pk[u].rank_for_energy(opt.energy);
      rv[u] = opt.v_rank > 0 ? std::min(opt.v_rank, hd) : pv[u].rank_for_energy(opt.energy);
    }
  }
  LatentBases out;
  out.n_layer = L;
  out.n_head_kv = H;
  out.head_dim = hd;
  out.key.resize(S);
  out.value.resize(S);
  std::vector<double> kk(S), kv(S);
  std::vector<int> gk(S), gv(S);
  for (int u = 0; u < S; ++u) {
    kk[u] = kept_frac(pk[u], rk[u]);
    kv[u] = kept_frac(pv[u], rv[u]);
    gk[u] = gv[u] = u / H;
  }
  if (opt.share >= 0.0) {
    // Per KV head and side: adjacent layers grouped by measured similarity (latent_share.h); in
    // a group every member uses the pooled basis (its rank the smallest of the members' under a
    // byte budget, else the largest).
    for (int h = 0; h < H; ++h)
      for (int side = 0; side < 2; ++side) {
        auto& rows = side ? vals : keys;
        std::vector<LayerRows> lr(L);
        std::vector<int> ranks(L);
        for (int l = 0; l < L; ++l) {
          lr[l] = {rows[l * H + h].data(), rows[l * H + h].size() / hd};
          ranks[l] = (side ? rv : rk)[l * H + h];
        }
        const LatentShare sh = share_adjacent_layers(lr, hd, ranks, opt.energy, opt.share, opt.share_max,
                                                     opt.memory_ratio > 0.0);
        for (int l = 0; l < L; ++l) {
          const int u = l * H + h;
          (side ? out.value : out.key)[u] = sh.basis[l];
          (side ? rv : rk)[u] = sh.basis[l]->rank();
          (side ? kv : kk)[u] = sh.kept[l];
          (side ? gv : gk)[u] = sh.group[l];
        }
      }
  } else {
    for (int u = 0; u < S; ++u) {
      out.key[u] = pk[u].basis(rk[u]);
      out.value[u] = pv[u].basis(rv[u]);
    }
  }
  size_t entry_bytes = 0;
  for (int u = 0; u < S; ++u) {
    out.key_bits.push_back(bk[u]);
    out.value_bits.push_back(bv[u]);
    entry_bytes += latent_row_bytes(rk[u], bk[u]) + latent_row_bytes(rv[u], bv[u]) + 4;
    if (report) {
      auto shared = [&](int g) { return g != u / H ? fmt::format(" (basis of layer {})", g) : std::string(); };
      report->push_back(fmt::format("layer {:2d} head {:2d}: key rank {:3d} {}-bit ({:.4f} of variance){}, value rank "
                                    "{:3d} {}-bit ({:.4f}){}",
                                    u / H, u % H, rk[u], bk[u], kk[u], shared(gk[u]), rv[u], bv[u], kv[u],
                                    shared(gv[u])));
    }
  }
  if (report) {
    size_t basis = 0;  // distinct bases (shared ones once)
    std::vector<const LatentBasis*> seen;
    for (int u = 0; u < S; ++u)
      for (const auto* b : {out.key[u].get(), out.value[u].get()})
        if (std::find(seen.begin(), seen.end(), b) == seen.end()) seen.push_back(b), basis += b->bytes();
    report->push_back(fmt::format("{} calibration tokens; predicted memory ratio {:.4f} per entry (codes and "
                                  "positions; bits 0 = f16 codes) plus {} bytes of bases ({} distinct), held once "
                                  "per process",
                                  tokens, double(entry_bytes) / (S * (4.0 * hd + 4.0)), basis, seen.size()));
  }
  return out;
}

}  // namespace kvslim
