// Calibration of latent bases: PCA of the keys and values a model writes over calibration text,
// with ranks fixed, chosen by kept variance, or allocated greedily to a byte budget.
#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "kvslim/session.h"
#include "press/latent.h"

namespace kvslim {

size_t latent_row_bytes(int rank, int bits, LatentScales scales) {
  if (bits == 32) return static_cast<size_t>(rank) * 4;
  if (bits == 0) return static_cast<size_t>(rank) * 2;
  return (static_cast<size_t>(rank) * bits + 7) / 8 + (scales == LatentScales::Channel ? 1 : 2);
}

namespace {

void check_bits(int b, const char* flag) {
  if (b != 0 && b != 2 && b != 4 && b != 8 && b != 32)
    throw Error(fmt::format("{} {} must be 0 (f16 codes), 2, 4, 8 or 32 (f32 codes)", flag, b));
}

// Bytes one more coordinate costs (sub-byte codes counted fractionally while allocating).
double dim_cost(int bits) { return bits == 0 ? 2.0 : bits == 32 ? 4.0 : bits / 8.0; }

}  // namespace

LatentBases calibrate_latent(const Model& model, const std::vector<std::vector<Token>>& docs,
                             const LatentCalibration& opt, std::vector<std::string>* report) {
  check_bits(opt.k_bits, "--k-bits");
  check_bits(opt.v_bits, "--v-bits");
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
  std::vector<int> rk(S), rv(S);
  if (opt.memory_ratio > 0.0) {
    // Budget in bytes per entry summed over segments, charged exactly (row_bytes of the ranks).
    const double entry_f16 = 4.0 * hd + 4.0;
    const double base = 4.0 + latent_row_bytes(1, opt.k_bits) + latent_row_bytes(1, opt.v_bits);
    double left = S * (opt.memory_ratio * entry_f16 - base);
    if (left < -1e-9)
      throw Error(fmt::format("--memory-ratio {} leaves less than rank 1 for keys and values ({:.1f} bytes per entry "
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
  size_t entry_bytes = 0;
  for (int u = 0; u < S; ++u) {
    out.key.push_back(pk[u].basis(rk[u]));
    out.value.push_back(pv[u].basis(rv[u]));
    out.key_bits.push_back(opt.k_bits);
    out.value_bits.push_back(opt.v_bits);
    entry_bytes += latent_row_bytes(rk[u], opt.k_bits) + latent_row_bytes(rv[u], opt.v_bits) + 4;
    if (report) {
      auto kept = [](const Pca& p, int r) {
        double t = 0, k = 0;
        for (int i = 0; i < p.head_dim; ++i) (i < r ? k : t) += p.var[i];
        return k + t > 0 ? k / (k + t) : 1.0;
      };
      report->push_back(fmt::format("layer {:2d} head {:2d}: key rank {:3d} ({:.4f} of variance), value rank {:3d} "
                                    "({:.4f})",
                                    u / H, u % H, rk[u], kept(pk[u], rk[u]), rv[u], kept(pv[u], rv[u])));
    }
  }
  if (report) {
    size_t basis = 0;
    for (int u = 0; u < S; ++u) basis += out.key[u]->bytes() + out.value[u]->bytes();
    report->push_back(fmt::format("{} calibration tokens; predicted memory ratio {:.4f} per entry (codes {}-bit keys, "
                                  "{}-bit values, positions; 0 = f16 codes) plus {} bytes of bases per cache",
                                  tokens, double(entry_bytes) / (S * (4.0 * hd + 4.0)), opt.k_bits, opt.v_bits,
                                  basis));
  }
  return out;
}

}  // namespace kvslim
