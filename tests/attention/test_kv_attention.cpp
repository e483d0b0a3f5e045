// Attention read block by block from every kind of segment (row codecs, KIVI groups + residual
// window, Hadamard-rotated keys, two precision tiers, subsets) against a float64 softmax over the
// segment's own decoded keys and values; and end to end, the bundled model's next-token
// distributions with each cache type against the f32 cache.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "attention/attention.h"
#include "attention/window_attention.h"
#include "kernels/quant_dot.h"
#include "kv/cache.h"
#include "press/wrappers/precision_tiers.h"
#include "kvslim/model.h"
#include "model/session.h"

using namespace kvslim;

namespace {

std::vector<float> sample(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = nd(rng);
  return x;
}

struct Config {
  const char* name;
  KVCodec k, v;
  KVQuantOptions q;
  bool tiers = false;
};

std::vector<Config> configs() {
  std::vector<Config> c;
  c.push_back({"f32", KVCodec::F32, KVCodec::F32, {}});
  c.push_back({"f16", KVCodec::F16, KVCodec::F16, {}});
  c.push_back({"bf16/q8_0", KVCodec::BF16, KVCodec::Q8_0, {}});
  c.push_back({"q8_0/q4_0", KVCodec::Q8_0, KVCodec::Q4_0, {}});
  c.push_back({"q4_0", KVCodec::Q4_0, KVCodec::Q4_0, {}});
  KVQuantOptions k2;
  k2.kivi_bits = 2;
  k2.kivi_group = 16;
  k2.kivi_residual = 24;
  c.push_back({"kivi2", KVCodec::F16, KVCodec::F16, k2});
  KVQuantOptions k4 = k2;
  k4.kivi_bits = 4;
  k4.kivi_group = 8;  // groups shorter than a key tile
  c.push_back({"kivi4", KVCodec::F32, KVCodec::BF16, k4});
  KVQuantOptions kh = k4;
  kh.hadamard = true;
  c.push_back({"kivi4+hadamard", KVCodec::F16, KVCodec::F16, kh});
  KVQuantOptions h;
  h.hadamard = true;
  c.push_back({"q4_0+hadamard", KVCodec::Q4_0, KVCodec::Q8_0, h});
  c.push_back({"tiers f16 | q8_0/q4_0", KVCodec::F16, KVCodec::F16, {}, true});
  return c;
}

// out[r] = sum_j softmax_j(scale * q_r . k_j) v_j over the visible (and selected) entries, in
// float64 from the segment's decoded keys and values.
void reference(const Segment& s, const float* q, int rows, const int32_t* vis, const std::vector<bool>& sel,
               float scale, std::vector<double>& out, std::vector<double>& probs) {
  const int hd = s.head_dim();
  const size_t n = s.size();
  std::vector<float> k(n * hd), v(n * hd);
  s.keys(0, n, k.data());
  s.values(0, n, v.data());
  out.assign(static_cast<size_t>(rows) * hd, 0.0);
  probs.assign(static_cast<size_t>(rows) * n, 0.0);
  for (int r = 0; r < rows; ++r) {
    std::vector<double> sc(n, -INFINITY);
    double mx = -INFINITY;
    for (size_t j = 0; j < n; ++j) {
      if (static_cast<int32_t>(j) >= vis[r] || !sel[j]) continue;
      double d = 0;
      for (int c = 0; c < hd; ++c) d += double(q[r * hd + c]) * k[j * hd + c];
      sc[j] = d * scale;
      mx = std::max(mx, sc[j]);
    }
    double sum = 0;
    for (size_t j = 0; j < n; ++j)
      if (sc[j] > -INFINITY) sum += std::exp(sc[j] - mx);
    for (size_t j = 0; j < n; ++j) {
      if (sc[j] == -INFINITY) continue;
      const double p = std::exp(sc[j] - mx) / sum;
      probs[r * n + j] = p;
      for (int c = 0; c < hd; ++c) out[r * hd + c] += p * v[j * hd + c];
    }
  }
}

// Tolerances of the integer products (src/attention/attention_int.h), which the AVX2 and AVX-VNNI
// levels use for q8_0 and q4_0 keys and values when head_dim % 16 == 0. Keys: the query row is rounded to
// int16, so a score moves by at most sqrt(hd) * |scale * q| * |k_j| / 65534 (Euclidean norms, which
// a Hadamard rotation keeps) =: B, and a probability by at most p (e^{2B} - 1). Values: the weights
// p_j * dv_j are rounded to int16 per row, value block and pair of tiles (at most 32 entries), so an
// output of block b moves by at most 32 * max|code| * max_j |p_j dv_j| / 65534 per pair, at most
// (32 / 65534) * sum_j p_j A_jb over all pairs, where A_jb = max |code| * |dv_j| is the largest
// decoded |value| of entry j in block b (q8_0: code 127; q4_0: code -8). The float rounding on top
// of either is far smaller; the bounds get 2% for it.
struct IntBounds {
  std::vector<double> prob_rel;  // [rows]: relative bound on each probability
  std::vector<double> out;       // [rows][hd]: bound on each output
};

IntBounds int_bounds(const Config& cfg, const Segment& s, const float* q, int rows, float scale,
                     const std::vector<double>& rp) {
  const int hd = s.head_dim();
  const size_t n = s.size();
  IntBounds b;
  b.prob_rel.assign(rows, 0.0);
  b.out.assign(static_cast<size_t>(rows) * hd, 0.0);
  auto is_int = [](KVCodec c) { return c == KVCodec::Q8_0 || c == KVCodec::Q4_0; };
  const bool tiers_int = cfg.tiers;  // the low tier holds q8_0 keys and q4_0 values
  const bool int_k = (is_int(cfg.k) || tiers_int) && cfg.q.kivi_bits == 0;
  const bool int_v = (is_int(cfg.v) || tiers_int) && cfg.q.kivi_bits == 0;
  const bool int_level = qdot::level() == qdot::Level::AVX2 || qdot::level() == qdot::Level::AVXVNNI;
  if (!int_level || hd % 16 != 0 || (!int_k && !int_v)) return b;
  std::vector<float> k(n * hd), v(n * hd);
  s.keys(0, n, k.data());
  s.values(0, n, v.data());
  const int qb = std::gcd(32, hd);
  for (int r = 0; r < rows; ++r) {
    double bound = 0;
    if (int_k) {
      double qn = 0, kmax = 0;
      for (int c = 0; c < hd; ++c) qn += double(scale) * q[r * hd + c] * double(scale) * q[r * hd + c];
      for (size_t j = 0; j < n; ++j) {
        double kn = 0;
        for (int c = 0; c < hd; ++c) kn += double(k[j * hd + c]) * k[j * hd + c];
        kmax = std::max(kmax, std::sqrt(kn));
      }
      bound = 1.02 * std::sqrt(double(hd)) * std::sqrt(qn) * kmax / 65534;
    }
    const double rel = std::expm1(2 * bound);
    b.prob_rel[r] = rel;
    for (int c = 0; c < hd; ++c) {
      double from_scores = 0, from_values = 0;
      for (size_t j = 0; j < n; ++j) {
        const double p = rp[r * n + j];
        if (p == 0) continue;
        from_scores += p * std::fabs(v[j * hd + c]);
        double a = 0;
        for (int cc = c / qb * qb; cc < (c / qb + 1) * qb; ++cc) a = std::max(a, double(std::fabs(v[j * hd + cc])));
        from_values += p * a;
      }
      b.out[r * hd + c] = rel * from_scores + (int_v ? 1.02 * 32 / 65534 * from_values : 0.0);
    }
  }
  return b;
}

Segment build(const Config& cfg, int hd, int n, uint32_t seed) {
  Segment s(hd, cfg.k, cfg.v, cfg.q);
  auto k = sample(static_cast<size_t>(n) * hd, seed), v = sample(static_cast<size_t>(n) * hd, seed + 1);
  for (int i = 0; i < n; ++i) k[i * hd + 1] *= 8.0f;  // an outlier channel
  for (int i = 0; i < n; ++i) s.append(&k[i * hd], &v[i * hd], i);
  if (cfg.tiers) {
    std::vector<float> score(n);
    for (int i = 0; i < n; ++i) score[i] = static_cast<float>((i * 53) % n);
    apply_precision_tiers(s, score, n / 3, n / 2, KVCodec::Q8_0, KVCodec::Q4_0);
    // Entries appended after the split go to the high tier, after every low-tier one.
    for (int i = 0; i < 20; ++i) s.append(&k[i * hd], &v[i * hd], n + i);
  }
  return s;
}

}  // namespace

// Every SIMD level (each has its own register tiling: 8 or 2/4 rows, one or two key tiles and
// value chunks at a time, and its own copy of every codec's decoder, chosen by the same level), head dims that take the vector path whole (64), with a leftover
// 16-column chunk (80) and the scalar path (8), an even and an odd number of blocks (150 and 140
// entries: the last block then has no partner), and row counts with leftovers of every tiling.
TEST(KVAttention, BlockwiseMatchesFloat64Softmax) {
  const qdot::Level saved = qdot::level();
  const std::vector<qdot::Level> levels = qdot::supported_levels();
  for (qdot::Level lv : levels)
  for (int n_entries : {150, 140})
  for (int hd : {64, 80, 8, 128, 96}) {
    qdot::set_level(lv);
    SCOPED_TRACE(std::string("level ") + qdot::level_name(lv) + ", entries " + std::to_string(n_entries));
    for (const Config& cfg : configs()) {
      Segment s = build(cfg, hd, n_entries, 3);
      const size_t n = s.size();
      const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
      // A decode group (every entry visible) and prefill rows with causal prefixes.
      for (int rows : {8, 24, 13}) {
        auto q = sample(static_cast<size_t>(rows) * hd, 9 + rows);
        std::vector<int32_t> vis(rows);
        for (int r = 0; r < rows; ++r)
          vis[r] = rows == 8 ? static_cast<int32_t>(n) : static_cast<int32_t>(n) - 3 * (rows - r) + 1;
        std::vector<float> out(static_cast<size_t>(rows) * hd), probs(static_cast<size_t>(rows) * n), mass(n, 0.0f);
        attend_segment(s, q.data(), rows, vis.data(), scale, out.data(), hd, mass.data(), probs.data());
        std::vector<double> ro, rp;
        reference(s, q.data(), rows, vis.data(), std::vector<bool>(n, true), scale, ro, rp);
        IntBounds ib = int_bounds(cfg, s, q.data(), rows, scale, rp);
        for (size_t i = 0; i < out.size(); ++i)
          ASSERT_NEAR(out[i], ro[i], 2e-5 + ib.out[i]) << cfg.name << " hd " << hd << " rows " << rows << " at " << i;
        for (size_t i = 0; i < probs.size(); ++i)
          ASSERT_NEAR(probs[i], rp[i], 1e-6 + ib.prob_rel[i / n] * rp[i]) << cfg.name;
        for (size_t j = 0; j < n; ++j) {
          double m = 0;
          double tol = 1e-5;
          for (int r = 0; r < rows; ++r) m += rp[r * n + j], tol += ib.prob_rel[r] * rp[r * n + j];
          ASSERT_NEAR(mass[j], m, tol) << cfg.name << " entry " << j;
        }
        // Decode-time selection: a sparse subset, skipping whole blocks.
        std::vector<int32_t> idx;
        std::vector<bool> sel(n, false);
        for (size_t j = 0; j < n; ++j)
          if ((j / 16) % 3 != 1 && (j * 7) % 5 != 0) {
            idx.push_back(static_cast<int32_t>(j));
            sel[j] = true;
          }
        attend_segment_subset(s, idx.data(), static_cast<int>(idx.size()), q.data(), rows, vis.data(), scale,
                              out.data(), hd);
        reference(s, q.data(), rows, vis.data(), sel, scale, ro, rp);
        ib = int_bounds(cfg, s, q.data(), rows, scale, rp);
        for (size_t i = 0; i < out.size(); ++i)
          ASSERT_NEAR(out[i], ro[i], 2e-5 + ib.out[i]) << cfg.name << " subset, hd " << hd << " rows " << rows;
      }
      // Nothing visible: zeros.
      std::vector<float> q1 = sample(hd, 1), o1(hd, 7.0f);
      int32_t none = 0;
      attend_segment(s, q1.data(), 1, &none, scale, o1.data(), hd);
      for (float x : o1) EXPECT_EQ(x, 0.0f);
    }
  }
  qdot::set_level(saved);
}

// Long-context prefill tiles: a tile of 8 tokens x a GQA group of 8 heads (64 rows, as
// the forward pass sends them) against 1,100 entries (69 blocks: pairs and a lone last block),
// with causal prefixes ending mid-block, inside the first block, and at the end; and a tile of
// rows whose prefixes start only after many blocks the first rows never see. Every codec the
// prefill may meet and every SIMD level, against the float64 softmax.
TEST(KVAttention, LongPrefillTilesMatchFloat64Softmax) {
  const qdot::Level saved = qdot::level();
  const std::vector<qdot::Level> levels = qdot::supported_levels();
  const int hd = 64, n_entries = 1100, rows = 64, G = 8;
  for (qdot::Level lv : levels) {
    qdot::set_level(lv);
    SCOPED_TRACE(std::string("level ") + qdot::level_name(lv));
    for (const Config& cfg : configs()) {
      Segment s = build(cfg, hd, n_entries, 11);
      const int32_t n = static_cast<int32_t>(s.size());
      const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
      auto q = sample(static_cast<size_t>(rows) * hd, 21);
      for (int32_t first : {n - 7, 523, 1, 3 * 16 + 5}) {
        std::vector<int32_t> vis(rows);
        for (int r = 0; r < rows; ++r) vis[r] = std::min(n, first + r / G);
        std::vector<float> out(static_cast<size_t>(rows) * hd);
        attend_segment(s, q.data(), rows, vis.data(), scale, out.data(), hd);
        std::vector<double> ro, rp;
        reference(s, q.data(), rows, vis.data(), std::vector<bool>(n, true), scale, ro, rp);
        const IntBounds ib = int_bounds(cfg, s, q.data(), rows, scale, rp);
        for (size_t i = 0; i < out.size(); ++i)
          ASSERT_NEAR(out[i], ro[i], 2e-5 + ib.out[i]) << cfg.name << " first " << first << " at " << i;
      }
    }
  }
  qdot::set_level(saved);
}

// Each query row's result depends on its own query and prefix only, not on the other rows of the
// call: at every SIMD level the kernels tile rows differently (AVX2 runs groups of at most 8 with
// the scores of a group transposed, and with at most 8 rows reads f16 keys and values straight
// from the cache instead of decoding blocks into buffers; the AVX-512 level, with at most 8 rows,
// reads q8_0 keys and values straight from the cache too), and every tiling must give the same
// bits: a call with 24, 13, 15 or 22 rows equals calls with its groups of 8 (and the rest: 5, 7
// or 6 rows, which the AVX2 prefill loops split into passes of 4 rows and 1, 3 or 2), and with
// single rows, output and probabilities alike.
TEST(KVAttention, RowsAreIndependentOfTheirGrouping) {
  const qdot::Level saved = qdot::level();
  const std::vector<qdot::Level> levels = qdot::supported_levels();
  for (qdot::Level lv : levels)
  for (int hd : {64, 80, 8, 128, 96}) {
    qdot::set_level(lv);
    SCOPED_TRACE(std::string("level ") + qdot::level_name(lv) + ", head_dim " + std::to_string(hd));
    for (const Config& cfg : configs()) {
      Segment s = build(cfg, hd, 150, 7);
      const int32_t n = static_cast<int32_t>(s.size());
      const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
      for (int rows : {24, 13, 15, 22})
      for (bool causal : {false, true}) {
        // Blocks are consumed in pairs in store order, and each store's walk stops at the call's
        // longest prefix: with two tiers (whose logical indices interleave) and causal rows, a
        // call's longest prefix decides which blocks share a softmax step, so there the grouping
        // may change the last bits (the float64 tests above bound it); one store pairs alike.
        if (causal && cfg.tiers) continue;
        auto q = sample(static_cast<size_t>(rows) * hd, 40 + rows);
        std::vector<int32_t> vis(rows);
        for (int r = 0; r < rows; ++r) vis[r] = causal ? n - 5 * (rows - r) + 1 : n;
        std::vector<float> out(static_cast<size_t>(rows) * hd), probs(static_cast<size_t>(rows) * n);
        attend_segment(s, q.data(), rows, vis.data(), scale, out.data(), hd, nullptr, probs.data());
        for (int size : {8, 1})
          for (int r0 = 0; r0 < rows; r0 += size) {
            const int k = std::min(size, rows - r0);
            std::vector<float> o(static_cast<size_t>(k) * hd), p(static_cast<size_t>(k) * n);
            attend_segment(s, q.data() + static_cast<size_t>(r0) * hd, k, vis.data() + r0, scale, o.data(), hd, nullptr,
                           p.data());
            for (size_t i = 0; i < o.size(); ++i)
              ASSERT_EQ(o[i], out[static_cast<size_t>(r0) * hd + i])
                  << cfg.name << " rows " << rows << " causal " << causal << " group of " << k << " at row " << r0;
            for (size_t i = 0; i < p.size(); ++i)
              ASSERT_EQ(p[i], probs[static_cast<size_t>(r0) * n + i]) << cfg.name << " rows " << rows;
          }
      }
    }
  }
  qdot::set_level(saved);
}

TEST(KVAttention, HadamardRotationPreservesAttention) {
  const int hd = 96;  // not a power of two: three Hadamard blocks of 32
  Config plain{"f32", KVCodec::F32, KVCodec::F32, {}};
  Config rot = plain;
  rot.q.hadamard = true;
  Segment a = build(plain, hd, 70, 5), b = build(rot, hd, 70, 5);
  auto q = sample(8 * hd, 6);
  std::vector<int32_t> vis(8, 70);
  std::vector<float> oa(8 * hd), ob(8 * hd);
  attend_segment(a, q.data(), 8, vis.data(), 0.1f, oa.data(), hd);
  attend_segment(b, q.data(), 8, vis.data(), 0.1f, ob.data(), hd);
  for (size_t i = 0; i < oa.size(); ++i) ASSERT_NEAR(oa[i], ob[i], 1e-5);
}

namespace {

// Mean KL(f32 cache || cache under test) and top-1 agreement of the next-token distributions over
// a teacher-forced text on the bundled model.
void fidelity(SessionOptions o, double& kl, double& top1) {
  static const auto model = Model::load(std::string(KVSLIM_SOURCE_DIR) + "/models/stories260K.gguf");
  const std::string text =
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she "
      "saw a big, red ball. She wanted to play with it, so she asked her mom if she could have it. Her mom said yes "
      "and Lily was very happy. She played with the ball all day long and had lots of fun.";
  std::vector<Token> toks = model->tokenizer().encode(text, true, false);
  SessionOptions ref = o;
  ref.key_codec = ref.value_codec = KVCodec::F32;
  ref.kv_quant = {};
  Session a(*model, ref), b(*model, o);
  const auto la = a.forward(toks, true), lb = b.forward(toks, true);
  const int nv = model->hparams().n_vocab, n = static_cast<int>(toks.size());
  kl = top1 = 0;
  for (int t = 0; t < n; ++t) {
    const float* x = &la[static_cast<size_t>(t) * nv];
    const float* y = &lb[static_cast<size_t>(t) * nv];
    double mx = -INFINITY, my = -INFINITY, sx = 0, sy = 0;
    int ax = 0, ay = 0;
    for (int i = 0; i < nv; ++i) {
      if (x[i] > mx) mx = x[i], ax = i;
      if (y[i] > my) my = y[i], ay = i;
    }
    for (int i = 0; i < nv; ++i) sx += std::exp(x[i] - mx), sy += std::exp(y[i] - my);
    double d = 0;
    for (int i = 0; i < nv; ++i) {
      const double lp = x[i] - mx - std::log(sx), lq = y[i] - my - std::log(sy);
      d += std::exp(lp) * (lp - lq);
    }
    kl += d / n;
    top1 += (ax == ay) / double(n);
  }
}

}  // namespace

TEST(KVAttention, BundledModelFidelityOrdersWithPrecision) {
  // A 94-token story with R = 16 and G = 16 so that most entries are KIVI-quantized. Fewer bits
  // must cost more fidelity; f16 and q8_0 must be nearly lossless.
  struct Case {
    KVCodec k, v;
    int bits;
  };
  const Case cases[] = {{KVCodec::F16, KVCodec::F16, 0}, {KVCodec::Q8_0, KVCodec::Q8_0, 0},
                        {KVCodec::Q4_0, KVCodec::Q4_0, 0}, {KVCodec::F16, KVCodec::F16, 4},
                        {KVCodec::F16, KVCodec::F16, 2}};
  double kl[5], top1[5];
  for (int i = 0; i < 5; ++i) {
    SessionOptions o;
    o.key_codec = cases[i].k;
    o.value_codec = cases[i].v;
    o.kv_quant.kivi_bits = cases[i].bits;
    o.kv_quant.kivi_group = 16;
    o.kv_quant.kivi_residual = 16;
    o.n_ctx = 512;
    fidelity(o, kl[i], top1[i]);
    EXPECT_GE(kl[i], 0.0);
  }
  EXPECT_LT(kl[0], 1e-4);  // f16
  EXPECT_GT(top1[0], 0.98);
  EXPECT_LT(kl[1], 1e-2);  // q8_0
  EXPECT_GT(top1[1], 0.9);
  EXPECT_LT(kl[0], kl[1]);
  EXPECT_LT(kl[1], kl[2]);  // q8_0 < q4_0
  EXPECT_LT(kl[3], kl[4]);  // kivi4 < kivi2
  EXPECT_LT(kl[4], 2.0);    // 2 bits still far from noise (KL of unrelated distributions is several nats)
}

// The integer products of q8_0 and q4_0 caches (src/attention/attention_int.h) are exact integer
// sums with the same f32 steps at the AVX2 level (vpmaddwd + vpaddd) and the AVX-VNNI level
// (vpdpwssd): the two levels give the same bits, for decode groups and causal prefill rows, and
// for a partial last tile (150 entries) and a lone last block (140).
TEST(KVAttention, IntegerProductsAgreeBetweenAvx2AndAvxVnni) {
  if (!qdot::cpu_has(qdot::Level::AVXVNNI)) GTEST_SKIP() << "this CPU has no AVX-VNNI";
  const qdot::Level saved = qdot::level();
  for (int n_entries : {150, 140})
  for (int hd : {64, 80, 128}) {
    for (const Config& cfg : configs()) {
      if (cfg.k != KVCodec::Q8_0 && cfg.k != KVCodec::Q4_0 && cfg.v != KVCodec::Q8_0 && cfg.v != KVCodec::Q4_0)
        continue;
      Segment s = build(cfg, hd, n_entries, 5);
      const int32_t n = static_cast<int32_t>(s.size());
      const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
      for (int rows : {8, 21}) {
        auto q = sample(static_cast<size_t>(rows) * hd, 70 + rows);
        std::vector<int32_t> vis(rows);
        for (int r = 0; r < rows; ++r) vis[r] = rows == 8 ? n : n - 4 * (rows - r) + 1;
        std::vector<float> out[2];
        for (int k = 0; k < 2; ++k) {
          qdot::set_level(k ? qdot::Level::AVXVNNI : qdot::Level::AVX2);
          out[k].resize(static_cast<size_t>(rows) * hd);
          attend_segment(s, q.data(), rows, vis.data(), scale, out[k].data(), hd);
        }
        for (size_t i = 0; i < out[0].size(); ++i)
          ASSERT_EQ(out[0][i], out[1][i]) << cfg.name << " hd " << hd << " rows " << rows << " entries " << n_entries;
      }
    }
  }
  qdot::set_level(saved);
}

// A query row whose largest value is subnormal: the integer path's scale (32767 / max) overflowed
// a float, and the cast of the resulting infinity to int16 was undefined (UBSan: float-cast-overflow).
// The scores are then all about 0, so every level must give the uniform average of the decoded
// values (a hand-derived case, checked against float64).
TEST(KVAttention, SubnormalQueryRowsAverageTheValues) {
  const qdot::Level saved = qdot::level();
  const int hd = 64, n = 40;
  for (qdot::Level lv : qdot::supported_levels()) {
    qdot::set_level(lv);
    for (KVCodec c : {KVCodec::Q8_0, KVCodec::Q4_0, KVCodec::F16}) {
      Config cfg{"subnormal", c, c, {}};
      Segment s = build(cfg, hd, n, 13);
      std::vector<float> q(8 * hd, 1e-39f), out(8 * hd);
      for (int i = 0; i < 8 * hd; i += 3) q[i] = -1e-39f;
      std::vector<int32_t> vis(8, n);
      attend_segment(s, q.data(), 8, vis.data(), 0.125f, out.data(), hd);
      std::vector<float> v(static_cast<size_t>(n) * hd);
      s.values(0, n, v.data());
      for (int r = 0; r < 8; ++r)
        for (int d = 0; d < hd; ++d) {
          double mean = 0;
          for (int j = 0; j < n; ++j) mean += v[j * hd + d];
          ASSERT_NEAR(out[r * hd + d], mean / n, 1e-5) << qdot::level_name(lv) << " row " << r << " channel " << d;
        }
    }
  }
  qdot::set_level(saved);
}

// Decode groups (at most 8 rows) over KIVI groups where a pair of key tiles shares one group (G 32,
// the default, and 64) and where it does not (16): the x86 levels read the codes in place and decode
// them in registers (pair_group16 at AVX-512, pair_group at AVX2 and AVX-VNNI), while more rows (a
// prefill call) decode each block into f32 tiles first. Both must give the same bits for the same
// row, and match the float64 softmax; also after retain has shrunk the groups (blocks that end
// inside a tile), with 2 and 4 bits, and up to the largest head_dim the in-place kernels take.
TEST(KVAttention, KiviInPlaceDecodeMatchesDecodedTiles) {
  const qdot::Level saved = qdot::level();
  for (qdot::Level lv : qdot::supported_levels())
  for (int bits : {4, 2})
  for (int G : {32, 64, 16})
  for (int hd : {64, 128, 96, 256, 272}) {  // 272: past kKiviMaxHeadDim, so decoded into buffers
    if (hd % std::min(G, hd)) continue;
    qdot::set_level(lv);
    SCOPED_TRACE(std::string("level ") + qdot::level_name(lv) + ", bits " + std::to_string(bits) + ", G " +
                 std::to_string(G) + ", head_dim " + std::to_string(hd));
    KVQuantOptions o;
    o.kivi_bits = bits;
    o.kivi_group = G;
    o.kivi_residual = 40;
    Config cfg{"kivi", KVCodec::F16, KVCodec::F16, o};
    for (bool shrink : {false, true}) {
      Segment s = build(cfg, hd, 333, 5);
      if (shrink) {
        std::vector<int32_t> keep;
        for (int32_t j = 0; j < static_cast<int32_t>(s.size()); ++j)
          if (j % 7 != 3 && j % 11 != 5) keep.push_back(j);
        s.retain(keep);
      }
      const int32_t n = static_cast<int32_t>(s.size());
      const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
      auto q = sample(static_cast<size_t>(16) * hd, 77);
      std::vector<int32_t> vis(16, n);
      std::vector<float> out8(static_cast<size_t>(8) * hd), out16(static_cast<size_t>(16) * hd);
      attend_segment(s, q.data(), 8, vis.data(), scale, out8.data(), hd);
      attend_segment(s, q.data(), 16, vis.data(), scale, out16.data(), hd);
      for (size_t i = 0; i < out8.size(); ++i) ASSERT_EQ(out8[i], out16[i]) << "shrink " << shrink << " at " << i;
      std::vector<double> ro, rp;
      reference(s, q.data(), 8, vis.data(), std::vector<bool>(n, true), scale, ro, rp);
      for (size_t i = 0; i < out8.size(); ++i) ASSERT_NEAR(out8[i], ro[i], 2e-5) << "shrink " << shrink << " at " << i;
    }
  }
  qdot::set_level(saved);
}

// A -inf logit gets (almost) no weight and leaves the others' softmax as it is. exp2's floor was
// built as y - y - 126, which is NaN where y is -inf, so -inf went through unclamped: the row came
// out NaN, and the -inf padding of every tail shorter than 16 overflowed an int (found by UBSan).
TEST(KVAttention, SoftmaxGivesMinusInfinityNoWeight) {
  for (size_t n : {size_t{3}, size_t{20}}) {
    SCOPED_TRACE("n " + std::to_string(n));
    std::vector<float> x(n);
    for (size_t i = 0; i < n; ++i) x[i] = 0.25f * static_cast<float>(i);
    x[1] = -INFINITY;
    double z = 0;
    for (size_t i = 0; i < n; ++i)
      if (i != 1) z += std::exp(double(x[i]));
    std::vector<float> p = x;
    softmax_inplace(p.data(), n);
    EXPECT_LT(p[1], 1e-37f);
    EXPECT_GE(p[1], 0.0f);
    for (size_t i = 0; i < n; ++i) {
      if (i == 1) continue;
      EXPECT_NEAR(p[i], std::exp(double(x[i])) / z, 1e-5 * std::exp(double(x[i])) / z) << i;
    }
  }
}
