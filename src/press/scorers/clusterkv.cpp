// ClusterKV: decode-time attention over whole key clusters chosen per query, nothing evicted.
// Liu et al., "ClusterKV: Manipulating LLM KV Cache in Semantic Space for Recallable Compression",
// arXiv 2412.03213; reference: github.com/sjtu-zhao-lab/ClusterKV accuracy/cluster_attention.py and
// accuracy/patch.py (defaults: 16 sinks, 400 clusters, 20 k-means rounds, cosine distance, the
// first 2 layers dense, clusters ranked per query head (gqa_policy None), the selection cut at
// exactly budget - sinks entries ("truc")). `gqa=mean` is the authors' "qavg" option.
#include "press/scorers/clusterkv.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <cblas.h>
#include <fmt/format.h>

#include "kernels/threads.h"
#include "press/authoring.h"
#include "model/session.h"

namespace kvslim {

void kmeans_cosine(const float* x, int n, int d, int k, int iters, std::vector<int>& assign,
                   std::vector<float>& centroids) {
  assign.assign(std::max(n, 0), 0);
  centroids.clear();
  if (n <= 0 || d <= 0) return;
  k = std::clamp(k, 1, n);
  std::vector<float> u(static_cast<size_t>(n) * d);
  for (int i = 0; i < n; ++i) {
    double ss = 0;
    for (int c = 0; c < d; ++c) ss += double(x[static_cast<size_t>(i) * d + c]) * x[static_cast<size_t>(i) * d + c];
    const float inv = ss > 0 ? static_cast<float>(1.0 / std::sqrt(ss)) : 0.0f;
    for (int c = 0; c < d; ++c) u[static_cast<size_t>(i) * d + c] = x[static_cast<size_t>(i) * d + c] * inv;
  }
  std::vector<float> cen(static_cast<size_t>(k) * d), sim(static_cast<size_t>(n) * k);
  for (int j = 0; j < k; ++j) {
    const int s = static_cast<int>(static_cast<int64_t>(j) * n / k);
    std::copy(u.begin() + static_cast<size_t>(s) * d, u.begin() + static_cast<size_t>(s + 1) * d,
              cen.begin() + static_cast<size_t>(j) * d);
  }
  std::vector<int> prev(n, -1);
  std::vector<double> acc(static_cast<size_t>(k) * d);
  std::vector<int> count(k);
  std::vector<float> best(n);
  for (int it = 0; it < std::max(iters, 1); ++it) {
    BlasSlot slot;  // see kernels/threads.h
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, k, d, 1.0f, u.data(), d, cen.data(), d, 0.0f, sim.data(), k);
    for (int i = 0; i < n; ++i) {
      const float* row = sim.data() + static_cast<size_t>(i) * k;
      int a = static_cast<int>(std::max_element(row, row + k) - row);
      assign[i] = a;
      best[i] = row[a];
    }
    // Re-seed empty clusters with the worst-fitting vectors (each used once).
    std::fill(count.begin(), count.end(), 0);
    for (int a : assign) ++count[a];
    std::vector<int> order;
    for (int j = 0; j < k; ++j)
      if (count[j] == 0) {
        if (order.empty()) {
          order.resize(n);
          std::iota(order.begin(), order.end(), 0);
          std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return best[a] < best[b]; });
        }
        for (size_t p = 0; p < order.size(); ++p) {
          int i = order[p];
          if (i < 0 || count[assign[i]] <= 1) continue;
          --count[assign[i]];
          assign[i] = j;
          ++count[j];
          order[p] = -1;
          break;
        }
      }
    if (assign == prev) break;
    prev = assign;
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int i = 0; i < n; ++i)
      for (int c = 0; c < d; ++c) acc[static_cast<size_t>(assign[i]) * d + c] += u[static_cast<size_t>(i) * d + c];
    for (int j = 0; j < k; ++j) {
      double ss = 0;
      for (int c = 0; c < d; ++c) ss += acc[static_cast<size_t>(j) * d + c] * acc[static_cast<size_t>(j) * d + c];
      if (ss <= 0) continue;
      const double inv = 1.0 / std::sqrt(ss);
      for (int c = 0; c < d; ++c) cen[static_cast<size_t>(j) * d + c] = static_cast<float>(acc[static_cast<size_t>(j) * d + c] * inv);
    }
  }
  centroids.assign(static_cast<size_t>(k) * d, 0.0f);
  std::vector<double> mean(static_cast<size_t>(k) * d, 0.0);
  std::fill(count.begin(), count.end(), 0);
  for (int i = 0; i < n; ++i) {
    ++count[assign[i]];
    for (int c = 0; c < d; ++c) mean[static_cast<size_t>(assign[i]) * d + c] += x[static_cast<size_t>(i) * d + c];
  }
  for (int j = 0; j < k; ++j)
    for (int c = 0; c < d; ++c)
      centroids[static_cast<size_t>(j) * d + c] = count[j] ? static_cast<float>(mean[static_cast<size_t>(j) * d + c] / count[j]) : 0.0f;
}

ClusterKVPress::ClusterKVPress(double ratio, int budget, int sink, int clusters, int iters, int full_layers,
                               bool per_query_head)
    : ratio_(ratio), budget_(budget), sink_(sink), clusters_(clusters), iters_(iters), full_layers_(full_layers),
      per_query_head_(per_query_head) {}

std::string ClusterKVPress::describe() const {
  return fmt::format("clusterkv:ratio={},budget={},sink={},clusters={},iters={},full_layers={},gqa={}", ratio_, budget_,
                     sink_, clusters_, iters_, full_layers_, per_query_head_ ? "head" : "mean");
}

void ClusterKVPress::set_ratio(double r) {
  check_ratio(r, "clusterkv");
  ratio_ = r;
}

ObservationNeeds ClusterKVPress::decode_needs() const {
  ObservationNeeds r;
  r.hooks.push_back(const_cast<ClusterKVPress*>(this));
  return r;
}

void ClusterKVPress::reset() {
  ctx_.clear();
  index_.clear();
  attended_ = available_ = 0;
}

std::string ClusterKVPress::report() const {
  if (!available_) return {};
  return fmt::format("clusterkv: attention work saved {:.1f}% ({} of {} entry reads over layers x KV heads x decode "
                     "steps; nothing evicted)",
                     100.0 * work_saved(), attended_, available_);
}

void ClusterKVPress::apply(KVCache& cache, const Model& model, const Observation& obs, const Target& target) {
  ctx_.assign(cache.n_layer(), std::vector<size_t>(cache.n_head_kv()));
  for (int l = 0; l < cache.n_layer(); ++l)
    for (int h = 0; h < cache.n_head_kv(); ++h) ctx_[l][h] = cache.seg(l, h).size();
  index_.assign(cache.n_layer(), {});
  group_ = model.hparams().n_group();
}

bool ClusterKVPress::select(int layer, const float* q, int n, const KVCache& cache,
                            std::vector<std::vector<int32_t>>& subset) {
  if (ctx_.empty() || layer >= static_cast<int>(ctx_.size())) return false;
  const int H = cache.n_head_kv(), hd = cache.head_dim();
  size_t avail = 0;
  for (int h = 0; h < H; ++h) avail += cache.seg(layer, h).size() - std::min<size_t>(n, cache.seg(layer, h).size());
  available_ += avail;
  // The authors cluster from layer 2 on; a model with no more layers than that still clusters its
  // last layer.
  const int dense = std::min(full_layers_, cache.n_layer() - 1);
  if (n != 1 || layer < dense || (budget_ <= 0 && ratio_ <= 0.0)) {
    attended_ += avail;
    return false;
  }
  // Budget per KV head: entries of the context it may attend to, sinks included; a context no
  // longer than the budget is attended in full (the reference's dense path).
  bool any = false;
  for (int h = 0; h < H; ++h) {
    const size_t m = std::min(ctx_[layer][h], cache.seg(layer, h).size() - 1);
    if (static_cast<size_t>(budget_for(m)) < m) any = true;
  }
  if (!any) {
    attended_ += avail;
    return false;
  }
  if (index_[layer].empty()) build(layer, cache);
  const int G = group_, rows = per_query_head_ ? H * G : H;
  subset.assign(rows, {});
  std::vector<float> qa(hd);
  double read = 0;
  for (int r = 0; r < rows; ++r) {
    const int h = per_query_head_ ? r / G : r;
    const Segment& s = cache.seg(layer, h);
    const size_t n_old = s.size() - 1;
    const size_t m = std::min(ctx_[layer][h], n_old);
    auto& out = subset[r];
    const size_t budget = static_cast<size_t>(budget_for(m));
    const Index& ix = index_[layer][h];
    if (budget >= m || ix.members.empty()) {
      for (size_t i = 0; i < n_old; ++i) out.push_back(static_cast<int32_t>(i));
      read += per_query_head_ ? double(out.size()) / G : out.size();
      continue;
    }
    // The query of this query head (the authors' default), or the GQA group's mean ("qavg").
    if (per_query_head_) {
      std::copy(q + static_cast<size_t>(r) * hd, q + static_cast<size_t>(r + 1) * hd, qa.begin());
    } else {
      std::fill(qa.begin(), qa.end(), 0.0f);
      for (int g = 0; g < G; ++g)
        for (int c = 0; c < hd; ++c) qa[c] += q[static_cast<size_t>(h * G + g) * hd + c] / G;
    }
    const int k = static_cast<int>(ix.members.size());
    std::vector<std::pair<float, int>> rank(k);
    for (int j = 0; j < k; ++j) {
      double dot = 0;
      for (int c = 0; c < hd; ++c) dot += double(qa[c]) * ix.centroids[static_cast<size_t>(j) * hd + c];
      rank[j] = {static_cast<float>(dot), j};
    }
    std::stable_sort(rank.begin(), rank.end(), [](auto a, auto b) { return a.first > b.first; });
    const size_t sinks = std::min<size_t>(sink_, m);
    const size_t room = budget > sinks ? budget - sinks : 0;
    for (size_t i = 0; i < sinks; ++i) out.push_back(static_cast<int32_t>(i));
    // Clusters in rank order, each cluster's entries in index order, cut at exactly `room`
    // entries (the reference truncates the last cluster it needs).
    size_t used = 0;
    for (int j = 0; j < k && used < room; ++j) {
      const auto& mem = ix.members[rank[j].second];
      const size_t take = std::min(mem.size(), room - used);
      out.insert(out.end(), mem.begin(), mem.begin() + take);
      used += take;
    }
    for (size_t i = m; i < n_old; ++i) out.push_back(static_cast<int32_t>(i));
    std::sort(out.begin(), out.end());
    read += per_query_head_ ? double(out.size()) / G : out.size();
  }
  attended_ += static_cast<size_t>(std::llround(read));
  return true;
}

int ClusterKVPress::budget_for(size_t m) const {
  return budget_ > 0 ? budget_ : uniform_keep(m, ratio_);
}

void ClusterKVPress::build(int layer, const KVCache& cache) {
  const int H = cache.n_head_kv(), hd = cache.head_dim();
  index_[layer].assign(H, {});
  parallel_for(H, [&](int64_t b, int64_t e) {
    for (int64_t h = b; h < e; ++h) {
      const Segment& s = cache.seg(layer, static_cast<int>(h));
      const size_t m = std::min(ctx_[layer][h], s.size());
      const size_t sinks = std::min<size_t>(sink_, m);
      const int n = static_cast<int>(m - sinks);
      if (n <= 0) continue;
      std::vector<float> keys(static_cast<size_t>(n) * hd);
      s.keys(sinks, m, keys.data());
      // The authors' 400 clusters (nlist), or fewer when there are fewer keys.
      const int k = std::min(clusters_, n);
      std::vector<int> assign;
      Index& ix = index_[layer][h];
      kmeans_cosine(keys.data(), n, hd, k, iters_, assign, ix.centroids);
      ix.members.assign(ix.centroids.size() / hd, {});
      for (int i = 0; i < n; ++i) ix.members[assign[i]].push_back(static_cast<int32_t>(sinks + i));
    }
  });
}

namespace {

PressRegistrar reg([] {
  PressInfo i;
  i.name = "clusterkv";
  i.summary = "decode-time attention over key clusters (cosine k-means) ranked by q.centroid per query head, cut at "
              "the budget, plus sinks and new entries; nothing evicted (budget=0: (1 - ratio) of the context)";
  i.source = "Liu et al. 2024, ClusterKV: Manipulating LLM KV Cache in Semantic Space for Recallable Compression, "
             "arXiv 2412.03213; reference: github.com/sjtu-zhao-lab/ClusterKV accuracy/cluster_attention.py";
  i.params = {{"ratio", "0", {},
               {.help = "the fraction of the context each query head does not attend to when budget is 0; 0 leaves "
                        "it to the run"}},
              {"budget", "0", {}, {.help = "entries each query head attends to; 0: (1 - ratio) of the context"}},
              {"sink", "16", {}, kKvslimOnly},
              {"clusters", "400", {}, kKvslimOnly},
              {"iters", "20", {}, kKvslimOnly},
              {"full_layers", "2", {}, kKvslimOnly},
              {"gqa", "head", {}, kKvslimOnly}};
  i.python = {.name = "ClusterKVPress", .base_press = true};
  i.make = [](const PressParams& p) -> std::unique_ptr<PressImpl> {
    const char* n = "clusterkv";
    int budget = param_int(p, n, "budget"), sink = param_int(p, n, "sink"), clusters = param_int(p, n, "clusters"),
        iters = param_int(p, n, "iters"), full = param_int(p, n, "full_layers");
    const std::string gqa = param_str(p, n, "gqa");
    if (gqa != "head" && gqa != "mean")
      throw Error(fmt::format("press clusterkv: gqa='{}' must be head (per query head) or mean (qavg)", gqa));
    if (clusters < 1) throw Error(fmt::format("press clusterkv: clusters={} must be >= 1", clusters));
    if (budget < 0 || sink < 0 || clusters < 0 || full < 0)
      throw Error(fmt::format("press clusterkv: budget={}, sink={}, clusters={}, full_layers={} must be >= 0", budget,
                              sink, clusters, full));
    if (iters < 1) throw Error(fmt::format("press clusterkv: iters={} must be >= 1", iters));
    return std::make_unique<ClusterKVPress>(param_double(p, n, "ratio"), budget, sink, clusters, iters, full,
                                            gqa == "head");
  };
  return i;
}());

}  // namespace
}  // namespace kvslim
