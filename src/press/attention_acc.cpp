#include "press/attention_acc.h"

#include <algorithm>
#include <cmath>
#include <map>

namespace kvslim {

void AttentionAccumulator::observe(const KVCache& cache, const Observation& obs, int group) {
  const int L = cache.n_layer(), H = cache.n_head_kv();
  n_head_kv_ = H;
  segs_.resize(static_cast<size_t>(L) * H);
  for (int l = 0; l < L; ++l)
    for (int h = 0; h < H; ++h) {
      const Segment& s = cache.seg(l, h);
      const auto& pos = s.positions();
      std::vector<Entry>& old = segs_[static_cast<size_t>(l) * H + h];
      std::vector<Entry> now;
      now.reserve(pos.size());
      size_t k = 0;
      for (int32_t p : pos) {
        while (k < old.size() && old[k].pos < p) ++k;
        if (k < old.size() && old[k].pos == p)
          now.push_back(old[k++]);
        else
          now.push_back({p, 0.0, 0.0});
      }
      const bool have = obs.attention_mass.size() > static_cast<size_t>(l) &&
                        obs.attention_mass[l].size() > static_cast<size_t>(h) &&
                        obs.attention_mass[l][h].size() == pos.size() && !pos.empty();
      if (have) {
        const auto& m = obs.attention_mass[l][h];
        double total = 0;
        for (size_t j = 0; j < pos.size(); ++j) {
          now[j].mass += m[j];
          total += m[j];
        }
        const size_t q = std::min(pos.size(), static_cast<size_t>(std::llround(total / std::max(group, 1))));
        // Entry j is seen by the step's queries at positions >= its own: the newest q entries are
        // the queries, so count those at or after j.
        const size_t first_q = pos.size() - q;
        for (size_t j = 0; j < pos.size(); ++j) {
          size_t from = std::max(j, first_q);
          now[j].count += static_cast<double>(pos.size() - from);
        }
      }
      old.swap(now);
    }
}

void AttentionAccumulator::lookup(const Segment& seg, int layer, int kv_head, std::vector<double>& mass,
                                  std::vector<double>& count) const {
  const auto& pos = seg.positions();
  mass.assign(pos.size(), 0.0);
  count.assign(pos.size(), 0.0);
  const size_t i = static_cast<size_t>(layer) * n_head_kv_ + kv_head;
  if (i >= segs_.size()) return;
  const std::vector<Entry>& st = segs_[i];
  size_t k = 0;
  for (size_t j = 0; j < pos.size(); ++j) {
    while (k < st.size() && st[k].pos < pos[j]) ++k;
    if (k < st.size() && st[k].pos == pos[j]) {
      mass[j] = st[k].mass;
      count[j] = st[k].count;
    }
  }
}

void AttentionAccumulator::remap(int layer, int kv_head, const std::vector<int32_t>& old_pos,
                                 const std::vector<int32_t>& new_pos) {
  const size_t i = static_cast<size_t>(layer) * n_head_kv_ + kv_head;
  if (i >= segs_.size()) return;
  std::map<int32_t, int32_t> to;
  for (size_t j = 0; j < old_pos.size(); ++j) to[old_pos[j]] = new_pos[j];
  std::vector<Entry> now;
  for (Entry e : segs_[i]) {
    auto it = to.find(e.pos);
    if (it == to.end()) continue;  // evicted: its state goes with it
    e.pos = it->second;
    now.push_back(e);
  }
  std::sort(now.begin(), now.end(), [](const Entry& a, const Entry& b) { return a.pos < b.pos; });
  segs_[i].swap(now);
}

}  // namespace kvslim
