// The rest of kvpress's catalogue: each press against its reference rule, with the
// expected values recomputed here in float64 from the reference's formulas (kvpress/presses/*.py),
// on the bundled model (5 layers, 8 query heads over 4 KV heads: GQA groups of 2, head_dim 8).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

#include <fmt/format.h>

#include <unistd.h>

#include <cstdio>

#include "kernels/matmul.h"
#include "kernels/threads.h"
#include "kvslim/request.h"
#include "press/scorers/duo_attention.h"
#include "train/duo_calibrate.h"
#include "press/ea_stats.h"
#include "train/query_stats.h"
#include "press/scorers/qfilter.h"
#include "train/qfilter_calibrate.h"
#include "kvslim/quant.h"
#include "press/recorders.h"
#include "support/press_util.h"

using namespace press_test;

namespace {

std::vector<int32_t> range(int32_t a, int32_t b) {  // [a, b)
  std::vector<int32_t> v;
  for (int32_t i = a; i < b; ++i) v.push_back(i);
  return v;
}

/// float64 CUR scores of one segment (kvpress CURPress, kv_product, local windows of w, sinks 1).
std::vector<double> cur_reference(const Segment& s, int w, int n_sink) {
  auto K = keys_of(s), V = values_of(s);
  const size_t n = K.size();
  std::vector<double> k2(n, 0), v2(n, 0);
  for (size_t i = 0; i < n; ++i)
    for (size_t c = 0; c < K[i].size(); ++c) {
      k2[i] += K[i][c] * K[i][c];
      v2[i] += V[i][c] * V[i][c];
    }
  for (auto* x : {&k2, &v2})
    for (size_t b = 0; b < n; b += w) {
      double sum = 0;
      for (size_t i = b; i < std::min(n, b + w); ++i) sum += (*x)[i];
      for (size_t i = b; i < std::min(n, b + w); ++i) (*x)[i] /= sum;
    }
  std::vector<double> sc(n);
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += (sc[i] = k2[i] * v2[i]);
  for (size_t i = 0; i < n; ++i) sc[i] = i < size_t(n_sink) ? 1.0 : sc[i] / sum;
  return sc;
}

/// Indices of the `keep` largest values (ties to the later index), increasing.
std::vector<int32_t> top_indices(const std::vector<double>& sc, size_t keep) {
  std::vector<int32_t> idx(sc.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return sc[a] != sc[b] ? sc[a] > sc[b] : a > b; });
  idx.resize(std::min(keep, idx.size()));
  std::sort(idx.begin(), idx.end());
  return idx;
}

}  // namespace

// CURPress: scores = normalised (local-window-normalised ||k||^2 x ||v||^2), sinks 1.0. Checked
// score by score (n = 37: two full windows of 16 and a last window of 5), then the selection.
TEST(PressCatalogue, CURScoresAreTheReferenceLeverageProduct) {
  const Model& m = bundled_model();
  KVCache cache = random_cache(m, 37, 11);
  Observation obs;
  auto p = scorer("cur", 0.5);
  Scores sc = p->score_all(cache, m, obs, Target{0.5, 37});
  for (int l = 0; l < cache.n_layer(); ++l)
    for (int h = 0; h < cache.n_head_kv(); ++h) {
      auto want = cur_reference(cache.seg(l, h), 16, 4);
      for (size_t i = 0; i < want.size(); ++i) {
        if (i < 4)
          EXPECT_GE(sc[l][h][i], kPreferred) << "sink " << i;
        else
          expect_close(sc[l][h][i], want[i], 1e-5, "cur l" + std::to_string(l) + " i" + std::to_string(i));
      }
    }
  // Selection on the model's own cache: int(100 x 0.5) = 50 per head, the sinks first.
  auto toks = story_tokens(100);
  auto none = make_press_impl("none", 0.0);
  auto full = prefill(*none, toks);
  auto q = make_press_impl("cur", 0.5);
  auto s = prefill(*q, toks);
  for (int l = 0; l < full->cache().n_layer(); ++l)
    for (int h = 0; h < full->cache().n_head_kv(); ++h)
      EXPECT_EQ(s->cache().seg(l, h).positions(), top_indices(cur_reference(full->cache().seg(l, h), 16, 4), 50))
          << "l" << l << " h" << h;
  // Budget below the sinks (r = 0.99 on 100: 1 entry): one sink, the later one on ties.
  auto r = make_press_impl("cur", 0.99);
  auto t = prefill(*r, toks);
  EXPECT_EQ(t->cache().seg(0, 0).positions(), std::vector<int32_t>{3});
  // kvpress's name and parameters.
  EXPECT_EQ(make_press_impl("CURPress:compression_ratio=0.25,num_sinks=2,leverage_type=key,local_window_size=8", 0)
                ->describe(),
            "cur:ratio=0.25,n_sink=2,leverage=key,local=1,window=8,random_projection=0,seed=42,protect=0");
  EXPECT_THROW(make_press_impl("cur:leverage=foo", 0.5), Error);
}

// SimLayerKVPress: a layer is lazy when the last query's attention (every query head, causal
// softmax over all entries) on the first n_initial and last n_recent entries before it exceeds
// the threshold; a lazy layer keeps its first n_initial and last n_recent - n_last entries.
TEST(PressCatalogue, SimLayerKVKeepsInitialAndRecentInLazyLayers) {
  const Model& m = bundled_model();
  const HParams& hp = m.hparams();
  const int n = 40, n_last = 2, n_recent = 10, n_init = 4;
  KVCache cache = random_cache(m, n, 5);
  Observation obs = random_window(m, {38, 39}, 6);
  // float64 layer scores.
  std::vector<double> score(hp.n_layer, 0.0);
  for (int l = 0; l < hp.n_layer; ++l) {
    for (int qh = 0; qh < hp.n_head; ++qh)
      for (int i = 0; i < n_last; ++i) {
        auto p = softmax_row(window_query(obs, hp, l, qh, i), obs.window_positions[i], cache.seg(l, qh / hp.n_group()));
        const int m_ = n - n_last;
        for (int j = 0; j < n_init; ++j) score[l] += p[j];
        for (int j = m_ - n_recent; j < m_; ++j) score[l] += p[j];
      }
    score[l] /= hp.n_head * n_last;
  }
  std::vector<double> sorted = score;
  std::sort(sorted.begin(), sorted.end());
  const double thr = (sorted[2] + sorted[3]) / 2;  // layers above the median are lazy
  auto p = make_press_impl(fmt::format("SimLayerKVPress:lazy_threshold={},n_last=2,n_recent=10,n_initial=4", thr), 0);
  KVCache c = random_cache(m, n, 5);
  p->apply(c, m, obs, Target{0, size_t(n)});
  std::vector<int32_t> lazy_keep = range(0, 4), tail = range(32, 40);  // n_recent - n_last = 8
  lazy_keep.insert(lazy_keep.end(), tail.begin(), tail.end());
  int lazy = 0;
  for (int l = 0; l < hp.n_layer; ++l)
    for (int h = 0; h < hp.n_head_kv; ++h) {
      const bool want_lazy = score[l] > thr;
      lazy += want_lazy && h == 0;
      EXPECT_EQ(c.seg(l, h).positions(), want_lazy ? lazy_keep : range(0, n)) << "l" << l << " score " << score[l];
    }
  EXPECT_EQ(lazy, 2);
  EXPECT_NE(p->report().find("2 of 5 layers lazy"), std::string::npos) << p->report();
  // Default threshold 1: nothing happens; a segment no longer than n_initial + n_recent + n_last
  // (here 16) is left as is.
  auto d = make_press_impl("simlayerkv", 0);
  KVCache c2 = random_cache(m, n, 5);
  d->apply(c2, m, obs, Target{0, size_t(n)});
  EXPECT_EQ(c2.entries(), size_t(n) * hp.n_layer * hp.n_head_kv);
  auto z = make_press_impl("simlayerkv:lazy_threshold=0,n_last=2,n_recent=10,n_initial=4", 0);
  KVCache c3 = random_cache(m, 16, 5);
  Observation o3 = random_window(m, {14, 15}, 6);
  z->apply(c3, m, o3, Target{0, 16});
  EXPECT_EQ(c3.entries(), size_t(16) * hp.n_layer * hp.n_head_kv);
  // With lazy_threshold 0 every long layer is lazy (prefill through the model, 1-2 token
  // contexts stay whole).
  auto all = make_press_impl("simlayerkv:lazy_threshold=0,n_recent=20", 0);
  auto s = prefill(*all, story_tokens(100));
  EXPECT_EQ(s->cache().entries(), size_t(4 + 19) * hp.n_layer * hp.n_head_kv);
  for (size_t k : {1, 2}) EXPECT_EQ(prefill(*all, story_tokens(k))->cache().entries(), k * hp.n_layer * hp.n_head_kv);
  EXPECT_THROW(make_press_impl("simlayerkv:n_recent=1", 0), Error);
}

// CriticalAdaKVPress over KnormPress (scores -||k||), recomputed in float64: AdaKV's budgets
// (safeguard floor(alpha k) per head, then the layer's best), stage 1 floor(first_stage b_h) by
// the scores, stage 2 by (score + epsilon) x mean over the group of ||W_o^q v||_1.
TEST(PressCatalogue, CriticalAdaKVIsCriticalKVInsideAdaKVBudgets) {
  const Model& m = bundled_model();
  const HParams& hp = m.hparams();
  const int n = 30, H = hp.n_head_kv, G = hp.n_group(), hd = hp.head_dim;
  const double r = 0.6, first = 0.5, eps = 1e-4;  // alpha 0.2
  const int k = 12, n_safe = 2;  // int(30 x 0.4), int(12 x 0.2)
  // Random entries, keys scaled by head so that budgets really move between heads.
  auto make = [&] {
    KVCache src = random_cache(m, n, 21);
    KVCache out(hp.n_layer, H, hd, KVCodec::F32, KVCodec::F32);
    std::vector<float> kk(n * hd), vv(n * hd);
    for (int l = 0; l < hp.n_layer; ++l)
      for (int h = 0; h < H; ++h) {
        src.seg(l, h).keys(0, n, kk.data());
        src.seg(l, h).values(0, n, vv.data());
        for (int i = 0; i < n; ++i) {
          for (int d = 0; d < hd; ++d) kk[i * hd + d] *= 1.0f + 0.5f * h;
          out.seg(l, h).append(kk.data() + i * hd, vv.data() + i * hd, i);
        }
      }
    return out;
  };
  KVCache cache = make();
  // W_o as doubles: [n_embd][n_head * head_dim].
  auto wo_of = [&](int l) {
    const WeightView& w = *m.layer(l).wo;
    std::vector<std::vector<double>> W(w.rows, std::vector<double>(w.cols));
    std::vector<float> row(w.cols);
    for (int64_t i = 0; i < w.rows; ++i) {
      dequantize_row(w.type, w.row(i), row.data(), w.cols);
      for (int64_t c = 0; c < w.cols; ++c) W[i][c] = row[c];
    }
    return W;
  };
  KVCache c = make();
  auto p = make_press_impl("CriticalAdaKVPress(KnormPress)", r);
  Observation obs;
  p->apply(c, m, obs, Target{r, size_t(n)});
  for (int l = 0; l < hp.n_layer; ++l) {
    auto W = wo_of(l);
    std::vector<std::vector<double>> s(H);
    std::vector<std::vector<std::vector<double>>> K(H), V(H);
    for (int h = 0; h < H; ++h) {
      K[h] = keys_of(cache.seg(l, h));
      V[h] = values_of(cache.seg(l, h));
      for (int i = 0; i < n; ++i) {
        double ss = 0;
        for (double x : K[h][i]) ss += x * x;
        s[h].push_back(-std::sqrt(ss));
      }
    }
    // Budgets.
    std::vector<int> b(H, n_safe);
    std::vector<std::vector<char>> taken(H, std::vector<char>(n, 0));
    std::vector<std::tuple<double, int, int>> rest;  // (score, head, index)
    for (int h = 0; h < H; ++h) {
      for (int32_t i : top_indices(s[h], n_safe)) taken[h][i] = 1;
      for (int i = 0; i < n; ++i)
        if (!taken[h][i]) rest.emplace_back(s[h][i], h, i);
    }
    std::sort(rest.begin(), rest.end(), [](auto& a, auto& b) { return std::get<0>(a) > std::get<0>(b); });
    for (int i = 0; i < H * k - H * n_safe; ++i) ++b[std::get<1>(rest[i])];
    int sum_b = 0;
    for (int h = 0; h < H; ++h) sum_b += b[h];
    ASSERT_EQ(sum_b, H * k);
    for (int h = 0; h < H; ++h) {
      const int b1 = std::max(int(std::floor(first * b[h])), n_safe);
      std::vector<char> chosen(n, 0);
      for (int32_t i : top_indices(s[h], b1)) chosen[i] = 1;
      std::vector<double> w(n, -INFINITY);
      for (int i = 0; i < n; ++i) {
        if (chosen[i]) continue;
        double norm = 0;
        for (int g = 0; g < G; ++g) {
          const int q = h * G + g;
          for (size_t e = 0; e < W.size(); ++e) {
            double y = 0;
            for (int d = 0; d < hd; ++d) y += W[e][q * hd + d] * V[h][i][d];
            norm += std::fabs(y) / G;
          }
        }
        w[i] = (s[h][i] + eps) * norm;
      }
      for (int32_t i : top_indices(w, b[h] - b1)) chosen[i] = 1;
      std::vector<int32_t> want;
      for (int i = 0; i < n; ++i)
        if (chosen[i]) want.push_back(i);
      EXPECT_EQ(c.seg(l, h).positions(), want) << "l" << l << " h" << h << " budget " << b[h];
    }
  }
  EXPECT_THROW(make_press_impl("critical_adakv(adakv(knorm))", 0.5), Error);
  EXPECT_EQ(make_press_impl("CriticalAdaKVPress(KnormPress,alpha_safeguard=0.3,first_stage_ratio=0.25)", 0.5)->describe(),
            "critical_adakv(knorm:ratio=0.5):alpha=0.3,epsilon=0.0001,first_stage=0.25");
}

namespace {

/// float64 KeyDiff scores (-cos(k, mean of normalised keys)) of the key rows `K`.
std::vector<double> keydiff_reference(const std::vector<std::vector<double>>& K) {
  const size_t n = K.size(), hd = K[0].size();
  std::vector<double> anchor(hd, 0.0), norm(n);
  for (size_t i = 0; i < n; ++i) {
    double ss = 0;
    for (double x : K[i]) ss += x * x;
    norm[i] = std::sqrt(ss);
    for (size_t d = 0; d < hd; ++d) anchor[d] += K[i][d] / norm[i] / n;
  }
  double an = 0;
  for (double a : anchor) an += a * a;
  an = std::sqrt(an);
  std::vector<double> sc(n);
  for (size_t i = 0; i < n; ++i) {
    double dot = 0;
    for (size_t d = 0; d < hd; ++d) dot += K[i][d] * anchor[d];
    sc[i] = -dot / (norm[i] * an);
  }
  return sc;
}

}  // namespace

// ChunkPress(KeyDiffPress), chunk 16 over 40 entries: chunks of 16, 16 and 8, each scored on its
// own keys and keeping int(len x 0.5) = 8, 8, 4.
TEST(PressCatalogue, ChunkScoresEveryChunkOnItsOwn) {
  const Model& m = bundled_model();
  const int n = 40;
  KVCache c = random_cache(m, n, 31);
  auto p = make_press_impl("ChunkPress(KeyDiffPress,chunk_length=16)", 0.5);
  Observation obs;
  p->apply(c, m, obs, Target{0.5, size_t(n)});
  KVCache ref = random_cache(m, n, 31);
  for (int l = 0; l < c.n_layer(); ++l)
    for (int h = 0; h < c.n_head_kv(); ++h) {
      auto K = keys_of(ref.seg(l, h));
      std::vector<int32_t> want;
      for (int b = 0; b < n; b += 16) {
        std::vector<std::vector<double>> part(K.begin() + b, K.begin() + std::min(n, b + 16));
        for (int32_t j : top_indices(keydiff_reference(part), part.size() / 2)) want.push_back(b + j);
      }
      EXPECT_EQ(c.seg(l, h).positions(), want) << "l" << l << " h" << h;
    }
  // Chunked prefill (32 tokens a step, a multiple of 16) compresses each step's new entries only:
  // layer 0 (whose keys do not depend on earlier compression) keeps what one-shot keeps.
  auto toks = story_tokens(96);
  auto a = make_press_impl("chunk(knorm):chunk=16", 0.5), b = make_press_impl("chunk(knorm):chunk=16", 0.5);
  auto one = prefill(*a, toks), chunked = prefill(*b, toks, 32);
  for (int h = 0; h < one->cache().n_head_kv(); ++h) {
    EXPECT_EQ(one->cache().seg(0, h).size(), 48u);
    EXPECT_EQ(chunked->cache().seg(0, h).positions(), one->cache().seg(0, h).positions()) << "h" << h;
  }
  // A chunk shorter than 2 entries keeps 1; policies and accumulated attention are refused.
  KVCache tiny = random_cache(m, 17, 3);
  make_press_impl("chunk(knorm):chunk=16", 0.5)->apply(tiny, m, obs, Target{0.5, 17});
  EXPECT_EQ(tiny.seg(0, 0).size(), 9u);
  EXPECT_THROW(make_press_impl("chunk(adakv(snapkv))", 0.5), Error);
  EXPECT_THROW(make_press_impl("chunk(observed_attention)", 0.5), Error);
}

// BlockPress(KeyDiffPress), block 8 over 40 entries at 0.5: keep [0, 20), then score kept + each
// block of 8 (then 4) together and keep the best 20: KeyDiff's anchor moves with every block.
TEST(PressCatalogue, BlockKeepsTheBudgetWhileScanningBlocks) {
  const Model& m = bundled_model();
  const int n = 40, k = 20;
  KVCache c = random_cache(m, n, 41);
  auto p = make_press_impl("BlockPress(KeyDiffPress,block_size=8)", 0.5);
  Observation obs;
  p->apply(c, m, obs, Target{0.5, size_t(n)});
  KVCache ref = random_cache(m, n, 41);
  int differs = 0;
  for (int l = 0; l < c.n_layer(); ++l)
    for (int h = 0; h < c.n_head_kv(); ++h) {
      auto K = keys_of(ref.seg(l, h));
      std::vector<int32_t> kept = range(0, k);
      for (int b = k; b < n; b += 8) {
        std::vector<int32_t> cur = kept;
        for (int i = b; i < std::min(n, b + 8); ++i) cur.push_back(i);
        std::vector<std::vector<double>> rows;
        for (int32_t i : cur) rows.push_back(K[i]);
        std::vector<int32_t> next;
        for (int32_t j : top_indices(keydiff_reference(rows), k)) next.push_back(cur[j]);
        kept = next;
      }
      EXPECT_EQ(c.seg(l, h).positions(), kept) << "l" << l << " h" << h;
      differs += kept != top_indices(keydiff_reference(K), k);
    }
  EXPECT_GT(differs, 0) << "block-wise KeyDiff should differ from one-shot KeyDiff somewhere";
  for (size_t t : {1, 2}) {
    auto q = make_press_impl("block(keydiff)", 0.5);
    auto s = prefill(*q, story_tokens(t));
    EXPECT_EQ(s->cache().seg(0, 0).size(), 1u) << t;
  }
}

// Q-Filters: the direction of each (layer, KV head) is the top right singular vector of the
// stacked post-RoPE queries of its GQA group, signed so the queries project positively; checked
// against float64 power iteration on C = sum q q^T recomputed here. The press scores <k, u>.
TEST(PressCatalogue, QFilterIsThePrincipalQueryDirection) {
  const Model& m = bundled_model();
  const HParams& hp = m.hparams();
  const int hd = hp.head_dim, G = hp.n_group();
  std::vector<std::vector<Token>> docs = {story_tokens(60), story_tokens(25)};
  QFilters f = qfilter_calibrate(m, docs);
  ASSERT_EQ(f.dir.size(), size_t(hp.n_layer) * hp.n_head_kv * hd);
  // Float64 C and sum of queries, from a fresh run of each document.
  std::vector<std::vector<double>> C(hp.n_layer * hp.n_head_kv, std::vector<double>(hd * hd, 0.0)),
      S(hp.n_layer * hp.n_head_kv, std::vector<double>(hd, 0.0));
  for (const auto& d : docs) {
    SessionOptions so;
    so.n_ctx = 256;
    Session s(m, so);
    ObservationNeeds needs;
    needs.window = static_cast<int>(d.size());
    Observation obs;
    run_observed(s, d, needs, obs);
    for (int l = 0; l < hp.n_layer; ++l)
      for (int qh = 0; qh < hp.n_head; ++qh)
        for (int i = 0; i < obs.n_window(); ++i) {
          auto q = window_query(obs, hp, l, qh, i);
          const int seg = l * hp.n_head_kv + qh / G;
          for (int a = 0; a < hd; ++a) {
            S[seg][a] += q[a];
            for (int b = 0; b < hd; ++b) C[seg][a * hd + b] += q[a] * q[b];
          }
        }
  }
  for (int seg = 0; seg < hp.n_layer * hp.n_head_kv; ++seg) {
    std::vector<double> v(hd, 1.0), w(hd);
    double lambda = 0;
    for (int it = 0; it < 3000; ++it) {
      double nn = 0;
      for (int a = 0; a < hd; ++a) {
        w[a] = 0;
        for (int b = 0; b < hd; ++b) w[a] += C[seg][a * hd + b] * v[b];
        nn += w[a] * w[a];
      }
      lambda = std::sqrt(nn);
      for (int a = 0; a < hd; ++a) v[a] = w[a] / lambda;
    }
    double dot = 0, sdot = 0, norm = 0, trace = 0;
    const float* u = f.dir.data() + size_t(seg) * hd;
    for (int a = 0; a < hd; ++a) {
      dot += v[a] * u[a];
      sdot += S[seg][a] * u[a];
      norm += double(u[a]) * u[a];
      trace += C[seg][a * hd + a];
    }
    EXPECT_NEAR(norm, 1.0, 1e-5) << seg;
    EXPECT_NEAR(std::fabs(dot), 1.0, 1e-4) << "segment " << seg;
    EXPECT_GE(sdot, 0.0) << "segment " << seg;
    expect_close(f.explained[seg], lambda / trace, 1e-4, "explained " + std::to_string(seg));
  }
  // Round trip and the press's scores on a random cache.
  const std::string path = ::testing::TempDir() + "qfilter_" + std::to_string(::getpid()) + ".gguf";
  f.base_model = "stories260K";
  f.save(path);
  QFilters g = QFilters::load(path);
  EXPECT_EQ(g.dir, f.dir);
  EXPECT_EQ(g.base_model, "stories260K");
  KVCache cache = random_cache(m, 20, 9);
  Observation none;
  auto p = scorer("QFilterPress:filters=" + path, 0.5);
  Scores sc = p->score_all(cache, m, none, Target{0.5, 20});
  for (int l = 0; l < hp.n_layer; ++l)
    for (int h = 0; h < hp.n_head_kv; ++h) {
      auto K = keys_of(cache.seg(l, h));
      for (int i = 0; i < 20; ++i) {
        double d = 0;
        for (int a = 0; a < hd; ++a) d += K[i][a] * f.at(l, h)[a];
        expect_close(sc[l][h][i], d, 1e-5, "qfilter score");
      }
    }
  auto qp = make_press_impl("qfilter:filters=" + path, 0.5);
  auto s = prefill(*qp, story_tokens(80));
  EXPECT_EQ(s->cache().entries(), size_t(40) * hp.n_layer * hp.n_head_kv);
  EXPECT_THROW(make_press_impl("qfilter", 0.5), Error);
  EXPECT_THROW(make_press_impl("qfilter:filters=/nonexistent.gguf", 0.5), Error);
  std::remove(path.c_str());
}

// Regression: a Q-filters file of another model's shape threw from a pool worker scoring the
// layers in parallel, which aborted the process (std::terminate) at 2 threads. It is a clean
// kvslim::Error naming the file and both shapes, thrown on the calling thread, at 1 and 2 threads.
TEST(PressCatalogue, QFilterFileOfAnotherModelIsACleanError) {
  const Model& m = bundled_model();
  const HParams& hp = m.hparams();
  QFilters f;
  f.n_layer = hp.n_layer + 1;  // one layer too many
  f.n_head_kv = hp.n_head_kv;
  f.head_dim = hp.head_dim;
  f.dir.assign(size_t(f.n_layer) * f.n_head_kv * f.head_dim, 0.0f);
  for (size_t i = 0; i < f.dir.size(); i += f.head_dim) f.dir[i] = 1.0f;
  f.explained.assign(size_t(f.n_layer) * f.n_head_kv, 0.5f);
  f.base_model = "other";
  const std::string path = ::testing::TempDir() + "qfilter_other_" + std::to_string(::getpid()) + ".gguf";
  f.save(path);
  const std::string shape = fmt::format("{} x {} x {}", hp.n_layer, hp.n_head_kv, hp.head_dim);
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    auto qp = make_press_impl("qfilter:filters=" + path, 0.5);
    try {
      prefill(*qp, story_tokens(40));
      ADD_FAILURE() << "no error at " << threads << " threads";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(path), std::string::npos) << msg;
      EXPECT_NE(msg.find("do not fit the model (" + shape + ")"), std::string::npos) << msg;
    }
  }
  set_num_threads(2);
  std::remove(path.c_str());
}

namespace {

/// A full f32 session over `toks` and what the forward recorded: every token's queries (RoPE
/// applied, the forward pass's own) and hidden states.
struct Recorded {
  std::unique_ptr<Session> s;
  Observation obs;
};
Recorded record_all(const std::vector<Token>& toks) {
  Recorded r;
  SessionOptions so;
  so.key_codec = so.value_codec = KVCodec::F32;
  so.n_ctx = 512;
  r.s = std::make_unique<Session>(bundled_model(), so);
  ObservationNeeds needs;
  needs.window = static_cast<int>(toks.size());
  needs.hidden_states = true;
  run_observed(*r.s, toks, needs, r.obs);
  return r;
}

/// float64 NonCausalAttnPress scores (before z) of entries [b, e) of every segment of layer l.
std::vector<std::vector<double>> noncausal_reference(const Recorded& r, int l, int b, int e, int C) {
  const HParams& hp = bundled_model().hparams();
  const int G = hp.n_group();
  std::vector<std::vector<double>> out(hp.n_head_kv);
  for (int h = 0; h < hp.n_head_kv; ++h) {
    const Segment& seg = r.s->cache().seg(l, h);
    auto K = keys_of(seg), V = values_of(seg);
    const int S = e - b;
    std::vector<double> A(S, 0.0);
    for (int g = 0; g < G; ++g) {
      const int qh = h * G + g;
      for (int c0 = 0; c0 < S; c0 += C) {
        const int c1 = std::min(S, c0 + C), pad = C - (c1 - c0);
        // real query rows
        for (int i = c0; i < c1; ++i) {
          auto q = window_query(r.obs, hp, l, qh, b + i);
          std::vector<double> z;
          for (int j = c0; j < c1; ++j) {
            double d = 0;
            for (size_t a = 0; a < q.size(); ++a) d += q[a] * K[b + j][a];
            z.push_back(d);
          }
          for (int p = 0; p < pad; ++p) z.push_back(-1e-9);
          double mx = *std::max_element(z.begin(), z.end()), sum = 0;
          for (double& x : z) sum += (x = std::exp(x - mx));
          for (int j = c0; j < c1; ++j) A[j] += z[j - c0] / sum / G;
        }
        // zero-padded query rows: logits 0 on real keys, -1e-9 on padded keys
        for (int p = 0; p < pad; ++p) {
          double sum = (c1 - c0) + pad * std::exp(-1e-9);
          for (int j = c0; j < c1; ++j) A[j] += 1.0 / sum / G;
        }
      }
    }
    std::vector<double> s(S);
    for (int i = 0; i < S; ++i) {
      double vn = 0;
      for (double x : V[b + i]) vn += x * x;
      s[i] = A[i] * std::sqrt(vn);
    }
    for (int i = 0; i < S; ++i) out[h].push_back(((i ? s[i - 1] : 0) + s[i] + (i + 1 < S ? s[i + 1] : 0)) / 3);
  }
  return out;
}

void zscore(std::vector<std::vector<double>>& x) {
  double s = 0, ss = 0;
  size_t n = 0;
  for (auto& v : x)
    for (double a : v) s += a, ++n;
  const double m = s / n;
  for (auto& v : x)
    for (double a : v) ss += (a - m) * (a - m);
  const double sd = std::max(std::sqrt(ss / (n - 1)), 1e-6);
  for (auto& v : x)
    for (double& a : v) a = (a - m) / sd;
}

/// float64 leverage (before z) of entries [b, e) of segment (l, h): pre-RoPE keys = the cache's
/// keys rotated back by their positions; the same seeded sketch; (X^T X + 1e-2 I)^{-1} by
/// Gauss-Jordan elimination.
std::vector<double> leverage_reference(const Recorded& r, int l, int h, int b, int e, int sketch, uint32_t seed) {
  const Model& m = bundled_model();
  const HParams& hp = m.hparams();
  const int d = hp.head_dim, S = e - b;
  const Segment& seg = r.s->cache().seg(l, h);
  auto K = keys_of(seg);
  for (int i = 0; i < S; ++i) {  // un-rotate (llama layout: pairs (2i, 2i+1))
    auto& k = K[b + i];
    for (int p = 0; p < d / 2; ++p) {
      const double th = -seg.positions()[b + i] * std::pow(double(hp.rope_freq_base), -2.0 * p / d);
      const double x0 = k[2 * p], x1 = k[2 * p + 1];
      k[2 * p] = x0 * std::cos(th) - x1 * std::sin(th);
      k[2 * p + 1] = x0 * std::sin(th) + x1 * std::cos(th);
    }
  }
  std::mt19937 rng(seed + 104729u * static_cast<uint32_t>(l * hp.n_head_kv + h));
  std::normal_distribution<double> nd(0.0, 1.0);
  std::vector<std::vector<double>> phi(d, std::vector<double>(sketch));
  for (auto& row : phi)
    for (double& x : row) x = nd(rng) / std::sqrt(double(sketch));
  std::vector<double> mean(d, 0);
  for (int i = 0; i < S; ++i)
    for (int c = 0; c < d; ++c) mean[c] += K[b + i][c] / S;
  std::vector<std::vector<double>> X(S, std::vector<double>(sketch, 0));
  for (int i = 0; i < S; ++i)
    for (int c = 0; c < d; ++c)
      for (int j = 0; j < sketch; ++j) X[i][j] += (K[b + i][c] - mean[c]) * phi[c][j];
  // [G | I] -> [I | G^-1]
  std::vector<std::vector<double>> M(sketch, std::vector<double>(2 * sketch, 0));
  for (int a = 0; a < sketch; ++a) {
    for (int c = 0; c < sketch; ++c)
      for (int i = 0; i < S; ++i) M[a][c] += X[i][a] * X[i][c];
    M[a][a] += 1e-2;
    M[a][sketch + a] = 1;
  }
  for (int c = 0; c < sketch; ++c) {
    int piv = c;
    for (int a = c; a < sketch; ++a)
      if (std::fabs(M[a][c]) > std::fabs(M[piv][c])) piv = a;
    std::swap(M[c], M[piv]);
    const double inv = 1.0 / M[c][c];
    for (double& x : M[c]) x *= inv;
    for (int a = 0; a < sketch; ++a)
      if (a != c) {
        const double f = M[a][c];
        for (int j = 0; j < 2 * sketch; ++j) M[a][j] -= f * M[c][j];
      }
  }
  std::vector<double> out(S);
  for (int i = 0; i < S; ++i) {
    double s = 0;
    for (int a = 0; a < sketch; ++a)
      for (int c = 0; c < sketch; ++c) s += X[i][a] * M[a][sketch + c] * X[i][c];
    out[i] = std::max(0.0, s);
  }
  return out;
}

}  // namespace

// NonCausalAttnPress: chunks of 16 over 40 tokens (the last one padded as kvpress pads it),
// queries from the forward pass itself, recomputed in float64.
TEST(PressCatalogue, NonCausalAttentionIsChunkedColumnSumsTimesValueNorm) {
  const Model& m = bundled_model();
  Recorded r = record_all(story_tokens(40));
  auto p = scorer("NonCausalAttnPress:chunk_size=16", 0.5);
  Scores sc = p->score_all(r.s->cache(), m, r.obs, Target{0.5, 40});
  for (int l = 0; l < m.hparams().n_layer; ++l) {
    auto want = noncausal_reference(r, l, 0, 40, 16);
    zscore(want);
    for (int h = 0; h < m.hparams().n_head_kv; ++h)
      for (int i = 0; i < 40; ++i)
        EXPECT_NEAR(sc[l][h][i], want[h][i], 2e-4) << "l" << l << " h" << h << " i" << i;
  }
  // Through the runner: int(40 x 0.5) = 20 per head.
  auto q = make_press_impl("non_causal_attention:chunk=16", 0.5);
  EXPECT_EQ(prefill(*q, story_tokens(40))->cache().entries(), size_t(20) * m.hparams().n_layer * m.hparams().n_head_kv);
  // Chunked prefill cannot give it the queries of earlier steps: a clear error.
  auto c = make_press_impl("non_causal_attention", 0.5);
  EXPECT_THROW(prefill(*c, story_tokens(40), 16), Error);
}

// LeverageScorePress: x_i^T (X^T X + 1e-2 I)^{-1} x_i of the centred, sketched pre-RoPE keys,
// z-normalised over the layer (the bundled model's G is rank head_dim = 8 < sketch 48: the jitter
// is what makes it invertible, as in kvpress).
TEST(PressCatalogue, LeverageIsTheSketchedLeverageOfPreRoPEKeys) {
  const Model& m = bundled_model();
  const HParams& hp = m.hparams();
  Recorded r = record_all(story_tokens(30));
  auto p = scorer("LeverageScorePress:sketch_dimension=12", 0.5);
  Scores sc = p->score_all(r.s->cache(), m, r.obs, Target{0.5, 30});
  for (int l = 0; l < hp.n_layer; ++l) {
    std::vector<std::vector<double>> want;
    for (int h = 0; h < hp.n_head_kv; ++h) want.push_back(leverage_reference(r, l, h, 0, 30, 12, 42));
    zscore(want);
    for (int h = 0; h < hp.n_head_kv; ++h)
      for (int i = 0; i < 30; ++i) EXPECT_NEAR(sc[l][h][i], want[h][i], 2e-3) << "l" << l << " h" << h << " i" << i;
  }
}

// CompactorPress: 8 + 4 sinks set aside and padded with the layer's best score; the rest scored
// ratio x z(leverage) + z(non-causal attention) over the middle entries.
TEST(PressCatalogue, CompactorBlendsLeverageAndAttentionBetweenSinks) {
  const Model& m = bundled_model();
  const HParams& hp = m.hparams();
  const int n = 50, b = 8, e = 46;
  Recorded r = record_all(story_tokens(n));
  auto p = scorer("CompactorPress:chunk_size=16,sketch_dimension=12", 0.75);
  Scores sc = p->score_all(r.s->cache(), m, r.obs, Target{0.75, size_t(n)});
  for (int l = 0; l < hp.n_layer; ++l) {
    auto att = noncausal_reference(r, l, b, e, 16);
    std::vector<std::vector<double>> lev;
    for (int h = 0; h < hp.n_head_kv; ++h) lev.push_back(leverage_reference(r, l, h, b, e, 12, 42));
    zscore(att);
    zscore(lev);
    double top = -INFINITY;
    for (int h = 0; h < hp.n_head_kv; ++h)
      for (int i = 0; i < e - b; ++i) top = std::max(top, 0.75 * lev[h][i] + att[h][i]);
    for (int h = 0; h < hp.n_head_kv; ++h)
      for (int i = 0; i < n; ++i) {
        const double want = i < b || i >= e ? top : 0.75 * lev[h][i - b] + att[h][i - b];
        EXPECT_NEAR(sc[l][h][i], want, 3e-3) << "l" << l << " h" << h << " i" << i;
      }
  }
  EXPECT_EQ(make_press_impl("CompactorPress:blending=0.35", 0.5)->describe(),
            "compactor:ratio=0.5,sink_start=8,sink_end=4,chunk=256,sketch=48,blending=0.35,seed=42");
  // Contexts of 1-2 tokens and shorter than the sinks keep int(n (1 - r)), at least 1.
  for (size_t t : {1, 2, 10}) {
    auto q = make_press_impl("compactor", 0.5);
    EXPECT_EQ(prefill(*q, story_tokens(t))->cache().seg(0, 0).size(), std::max<size_t>(1, t / 2)) << t;
  }
}

// LeanKV's per-head dynamic sparsity: each head keeps the fewest best entries holding `mass` of
// its attention mass (SnapKV's scores, window chosen first and kept at full precision) and keeps
// the fewest holding `mass_high` at full precision; the counts differ from head to head.
TEST(PressCatalogue, LeanKVDynamicSparsityFollowsEachHeadsAttentionMass) {
  const Model& m = bundled_model();
  const HParams& hp = m.hparams();
  auto toks = story_tokens(200);
  // The scores SnapKV gives on the uncompressed cache (what the wrapper sees).
  Observation obs;
  {
    SessionOptions so;
    so.key_codec = so.value_codec = KVCodec::F32;
    so.n_ctx = 512;
    Session s(m, so);
    auto snap = scorer("snapkv", 0.5);
    run_observed(s, toks, snap->needs(), obs);
    Scores sc = snap->score_all(s.cache(), m, obs, Target{0.5, toks.size()});
    auto p = make_press_impl("leankv(snapkv):mass=0.9,mass_high=0.6", 0.5);
    p->apply(s.cache(), m, obs, Target{0.5, toks.size()});
    std::set<size_t> sizes;
    for (int l = 0; l < hp.n_layer; ++l)
      for (int h = 0; h < hp.n_head_kv; ++h) {
        std::vector<double> v;
        int first = 0;
        for (float x : sc[l][h]) {
          if (x >= kPreferred) ++first;
          else v.push_back(std::max(0.0, double(x)));
        }
        std::sort(v.rbegin(), v.rend());
        double total = 0;
        for (double x : v) total += x;
        auto fewest = [&](double f) {
          double c = 0;
          size_t i = 0;
          while (i < v.size() && c < f * total * (1 - 1e-12)) c += v[i++];
          return i;
        };
        const size_t keep = fewest(0.9), high = fewest(0.6);
        EXPECT_EQ(s.cache().seg(l, h).size(), first + keep) << "l" << l << " h" << h;
        EXPECT_EQ(s.cache().seg(l, h).low_tier_size(), keep - high) << "l" << l << " h" << h;
        sizes.insert(s.cache().seg(l, h).size());
      }
    EXPECT_GT(sizes.size(), 1u) << "every head kept the same count: not per-head";
  }
  EXPECT_THROW(make_press_impl("leankv(snapkv):mass=1.5", 0.5), Error);
}

// Expected Attention with statistics from a file (kvpress's ExpectedAttentionStatsPress): the
// statistics are the mean and unbiased covariance of the pre-RoPE queries after the first n_sink
// tokens of each sample (recomputed here from the forward pass's own post-RoPE queries, rotated
// back); a file holding the context's own statistics reproduces the context-statistics press.
TEST(PressCatalogue, ExpectedAttentionStatsFileHoldsPreRoPEQueryMoments) {
  const Model& m = bundled_model();
  const HParams& hp = m.hparams();
  const int hd = hp.head_dim;
  std::vector<std::vector<Token>> samples = {story_tokens(50), story_tokens(30)};
  QueryStatsFile st = compute_query_stats(m, samples, 4);
  EXPECT_EQ(st.tokens, 46 + 26);
  std::vector<std::vector<std::vector<double>>> q(hp.n_layer * hp.n_head);  // pre-RoPE queries
  for (const auto& smp : samples) {
    Recorded r = record_all(smp);
    for (int l = 0; l < hp.n_layer; ++l)
      for (int qh = 0; qh < hp.n_head; ++qh)
        for (int i = 4; i < r.obs.n_window(); ++i) {
          auto x = window_query(r.obs, hp, l, qh, i);
          for (int p = 0; p < hd / 2; ++p) {
            const double th = -r.obs.window_positions[i] * std::pow(double(hp.rope_freq_base), -2.0 * p / hd);
            const double x0 = x[2 * p], x1 = x[2 * p + 1];
            x[2 * p] = x0 * std::cos(th) - x1 * std::sin(th);
            x[2 * p + 1] = x0 * std::sin(th) + x1 * std::cos(th);
          }
          q[l * hp.n_head + qh].push_back(x);
        }
  }
  for (int l = 0; l < hp.n_layer; ++l)
    for (int qh = 0; qh < hp.n_head; ++qh) {
      const auto& Q = q[l * hp.n_head + qh];
      const double N = Q.size();
      std::vector<double> mu(hd, 0);
      for (const auto& x : Q)
        for (int a = 0; a < hd; ++a) mu[a] += x[a] / N;
      for (int a = 0; a < hd; ++a) EXPECT_NEAR(st.mean_at(l, qh)[a], mu[a], 1e-4 + 1e-4 * std::fabs(mu[a]));
      for (int a = 0; a < hd; ++a)
        for (int b = 0; b < hd; ++b) {
          double c = 0;
          for (const auto& x : Q) c += (x[a] - mu[a]) * (x[b] - mu[b]) / (N - 1);
          EXPECT_NEAR(st.cov_at(l, qh)[a * hd + b], c, 2e-4 + 2e-4 * std::fabs(c)) << "l" << l << " q" << qh;
        }
    }
  // The context's own statistics in a file (population covariance, as the context press uses)
  // keep the same entries as the context press.
  auto ctx = story_tokens(120);
  QueryStatsFile own = compute_query_stats(m, {ctx}, 4);
  for (float& c : own.cov) c = static_cast<float>(c * (own.tokens - 1) / own.tokens);
  const std::string path = ::testing::TempDir() + "ea_stats_" + std::to_string(::getpid()) + ".gguf";
  own.save(path);
  EXPECT_EQ(QueryStatsFile::load(path).mean, own.mean);
  auto a = make_press_impl("expected_attention", 0.5);
  auto b = make_press_impl("ExpectedAttentionStatsPress:stats_folder=" + path, 0.5);
  EXPECT_NE(b->describe().find("stats=" + path), std::string::npos);
  auto sa = prefill(*a, ctx), sb = prefill(*b, ctx);
  int same = 0, segs = 0;
  for (int l = 0; l < hp.n_layer; ++l)
    for (int h = 0; h < hp.n_head_kv; ++h, ++segs) same += sa->cache().seg(l, h).positions() == sb->cache().seg(l, h).positions();
  EXPECT_EQ(same, segs);
  EXPECT_THROW(make_press_impl("expected_attention:stats=/nonexistent.gguf", 0.5), Error);
  std::remove(path.c_str());
}

// MergingPress(KnormPress): kept entries as knorm keeps them, every evicted value folded into the
// kept entry with the most cosine-similar key, weight max(sim, 0) |v_e| / (|v_e| + |v_t| + 1e-6);
// merged value (v_t + sum w v_e) / (1 + sum w); keys unchanged. Recomputed in float64.
TEST(PressCatalogue, MergingFoldsEvictedValuesIntoTheNearestKeptKey) {
  const Model& m = bundled_model();
  const HParams& hp = m.hparams();
  const int n = 24, hd = hp.head_dim, keep = 12;
  KVCache c = random_cache(m, n, 77), ref = random_cache(m, n, 77);
  Observation obs;
  make_press_impl("MergingPress(KnormPress)", 0.5)->apply(c, m, obs, Target{0.5, size_t(n)});
  for (int l = 0; l < hp.n_layer; ++l)
    for (int h = 0; h < hp.n_head_kv; ++h) {
      auto K = keys_of(ref.seg(l, h)), V = values_of(ref.seg(l, h));
      std::vector<double> s(n);
      for (int i = 0; i < n; ++i) {
        double ss = 0;
        for (double x : K[i]) ss += x * x;
        s[i] = -std::sqrt(ss);
      }
      std::vector<int32_t> kept = top_indices(s, keep);
      ASSERT_EQ(c.seg(l, h).positions(), kept);
      auto norm = [](const std::vector<double>& x) {
        double ss = 0;
        for (double a : x) ss += a * a;
        return std::sqrt(ss);
      };
      std::vector<std::vector<double>> acc(keep, std::vector<double>(hd, 0.0));
      std::vector<double> wsum(keep, 0.0);
      for (int j = 0; j < n; ++j) {
        if (std::find(kept.begin(), kept.end(), j) != kept.end()) continue;
        double best = -INFINITY;
        int t = 0;
        for (int k = 0; k < keep; ++k) {
          double d = 0;
          for (int a = 0; a < hd; ++a) d += K[j][a] * K[kept[k]][a];
          d /= norm(K[j]) * norm(K[kept[k]]);
          if (d > best) best = d, t = k;
        }
        const double w = std::max(best, 0.0) * norm(V[j]) / (norm(V[j]) + norm(V[kept[t]]) + 1e-6);
        for (int a = 0; a < hd; ++a) acc[t][a] += w * V[j][a];
        wsum[t] += w;
      }
      auto got = values_of(c.seg(l, h)), gotk = keys_of(c.seg(l, h));
      for (int k = 0; k < keep; ++k)
        for (int a = 0; a < hd; ++a) {
          const double want = wsum[k] > 0 ? (V[kept[k]][a] + acc[k][a]) / (1 + wsum[k]) : V[kept[k]][a];
          EXPECT_NEAR(got[k][a], want, 1e-5) << "l" << l << " h" << h << " k" << k;
          EXPECT_EQ(gotk[k][a], K[kept[k]][a]);
        }
    }
  // similarity_threshold 1: nothing merges, the cache is knorm's.
  KVCache d = random_cache(m, n, 77), e = random_cache(m, n, 77);
  make_press_impl("merging(knorm):similarity_threshold=1", 0.5)->apply(d, m, obs, Target{0.5, size_t(n)});
  make_press_impl("knorm", 0.5)->apply(e, m, obs, Target{0.5, size_t(n)});
  EXPECT_TRUE(same_cache(d, e));
}

// DuoAttention end to end on models/retrieval.gguf (layer 1's KV head is the induction head that
// retrieves, layer 0's previous-token heads read the last 5 entries; models/RETRIEVAL.md): with
// the calibrated labels (half the heads streaming: 128 sinks + 256 recent) the pass key 1,000+
// tokens back is still answered; with the labels swapped (the retrieval head made streaming) it
// is not.
TEST(PressCatalogue, DuoAttentionWithCalibratedLabelsStillRetrieves) {
  auto m = Model::load(std::string(KVSLIM_SOURCE_DIR) + "/models/retrieval.gguf");
  DuoCalibration cal;
  cal.samples = 2;
  DuoLabels labels = duo_calibrate(*m, cal);
  DuoLabels swapped = labels;
  std::swap(swapped.score[0][0], swapped.score[1][0]);
  const std::string dir = ::testing::TempDir() + "duo_" + std::to_string(::getpid());
  labels.save(dir + "_ok.gguf");
  swapped.save(dir + "_swapped.gguf");
  const std::string prompt = duo_passkey_prompt(*m, 1500, 0.2, 71432);
  auto answer = [&](const std::string& spec) {
    auto p = make_press_impl(spec, 0.0);
    RequestOptions o;
    o.n_predict = 6;  // " 7 1 4 3 2": five tokens
    o.sampling.temp = 0;
    Request r(*m, *p, o);
    r.set_prompt(prompt);
    r.run();
    size_t kept = r.cache().entries();
    return std::make_pair(m->tokenizer().decode(r.generated()), kept);
  };
  auto [full, n_full] = answer("none");
  auto [ok, n_ok] = answer("duo_attention:labels=" + dir + "_ok.gguf,head_ratio=0.5");
  auto [bad, n_bad] = answer("duo_attention:labels=" + dir + "_swapped.gguf,head_ratio=0.5");
  EXPECT_NE(full.find("71432"), std::string::npos) << full;
  EXPECT_NE(ok.find("71432"), std::string::npos) << ok;
  EXPECT_EQ(bad.find("71432"), std::string::npos) << bad;
  EXPECT_LT(n_ok, n_full);
  EXPECT_EQ(n_ok, n_bad);  // the same number of entries, kept in the other layer
  std::remove((dir + "_ok.gguf").c_str());
  std::remove((dir + "_swapped.gguf").c_str());
}

// FinchPress: window = the last 8 entries (the prompt); each earlier entry scores the window's
// causal softmax attention with row i scaled by (n - 8 + i), averaged over rows and the GQA
// group; the window is chosen first; int(40 x 0.5) = 20 stay. Recomputed in float64.
TEST(PressCatalogue, FinchScoresTheNormalisedPromptAttention) {
  const Model& m = bundled_model();
  const HParams& hp = m.hparams();
  const int n = 40, w = 8, G = hp.n_group();
  std::vector<int32_t> wpos = range(n - w, n);
  Observation obs = random_window(m, wpos, 19);
  KVCache c = random_cache(m, n, 18), ref = random_cache(m, n, 18);
  make_press_impl("FinchPress:window_size=8,rerotate_keys=False", 0.5)->apply(c, m, obs, Target{0.5, size_t(n)});
  KVCache d = random_cache(m, n, 18);
  make_press_impl("finch:window=8,rerotate=0,chunk=16", 0.5)->apply(d, m, obs, Target{0.5, size_t(n)});
  for (int l = 0; l < hp.n_layer; ++l)
    for (int h = 0; h < hp.n_head_kv; ++h) {
      std::vector<double> s(n, 1e9);  // window: chosen first
      for (int j = 0; j < n - w; ++j) s[j] = 0;
      for (int g = 0; g < G; ++g)
        for (int i = 0; i < w; ++i) {
          auto p = softmax_row(window_query(obs, hp, l, h * G + g, i), wpos[i], ref.seg(l, h));
          for (int j = 0; j < n - w; ++j) s[j] += p[j] * (n - w + i) / w / G;
        }
      EXPECT_EQ(c.seg(l, h).positions(), top_indices(s, 20)) << "l" << l << " h" << h;
      // chunk=16: 8 of [0, 16), 8 of [16, 32) and 4 of the window [32, 40) (equal scores: the newest)
      std::vector<int32_t> want;
      for (int b = 0; b < n; b += 16) {
        std::vector<double> part(s.begin() + b, s.begin() + std::min(n, b + 16));
        for (int32_t j : top_indices(part, part.size() / 2)) want.push_back(b + j);
      }
      EXPECT_EQ(d.seg(l, h).positions(), want) << "chunks l" << l << " h" << h;
    }
  // Regression: the description lacked rerotate=0, so it parsed back to a doubly wrapped press.
  EXPECT_EQ(make_press_impl("finch:window=8", 0.5)->describe(),
            "key_rerotation(finch:ratio=0.5,window=8,normalize=1,chunk=0,rerotate=0)");
  EXPECT_EQ(make_press_impl(make_press_impl("finch:window=8", 0.5)->describe(), 0.5)->describe(),
            make_press_impl("finch:window=8", 0.5)->describe());
  EXPECT_THROW(make_press_impl("finch", 0.5), Error);
  // Through the model with rerotation: int(100 x 0.5) per head, positions contiguous at the end.
  auto p = make_press_impl("finch:window=16", 0.5);
  auto sess = prefill(*p, story_tokens(100));
  EXPECT_EQ(sess->cache().seg(2, 1).positions(), range(50, 100));
}

// kvpress's CompressionRatioDecodingPress is the decoding wrapper with size=0 (the inner press's
// ratio of every token seen); PrefillDecodingPress is a composition (PREFILL + decoding(...)).
TEST(PressCatalogue, CompressionRatioDecodingIsDecodingToTheRatioOfTokensSeen) {
  EXPECT_EQ(make_press_impl("CompressionRatioDecodingPress(KnormPress,compression_interval=8,target_compression_ratio=0.25)", 0)
                ->describe(),
            "decoding(knorm:ratio=0.25):interval=8,size=0");
  EXPECT_EQ(make_press_impl("compression_ratio_decoding(snapkv)", 0.5)->describe(),
            make_press_impl("decoding(snapkv):size=0", 0.5)->describe());
}
