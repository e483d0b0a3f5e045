// LeanKV-style precision tiers from a press's scores (Zhang et al., "Unifying KV Cache
// Compression for Large Language Models with LeanKV", arXiv 2412.03131): the most important
// entries keep the cache's precision, the next ones a cheaper codec, the rest are evicted.
#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include "kvslim/kv_cache.h"

namespace kvslim {

void apply_precision_tiers(Segment& seg, const std::vector<float>& scores, int n_high, int n_low, KVCodec low_key,
                           KVCodec low_value, float protect) {
  const int n = static_cast<int>(seg.size());
  if (static_cast<int>(scores.size()) != n)
    throw Error(fmt::format("precision tiers: {} scores for a segment of {} entries", scores.size(), n));
  if (n_high < 0 || n_low < 0)
    throw Error(fmt::format("precision tiers: negative counts (high {}, low {})", n_high, n_low));
  int n_prot = 0;
  for (float s : scores) n_prot += s >= protect;
  n_high = std::clamp(std::max(n_high, n_prot), 0, n);
  n_low = std::clamp(n_low, 0, n - n_high);
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  // Highest score first; among equal scores the later entry (recency) first; NaN last.
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    const float sa = std::isnan(scores[a]) ? -INFINITY : scores[a];
    const float sb = std::isnan(scores[b]) ? -INFINITY : scores[b];
    return sa != sb ? sa > sb : a > b;
  });
  std::vector<uint8_t> tier(n, 2);  // 0 high, 1 low, 2 evicted
  for (int r = 0; r < n_high + n_low; ++r) tier[order[r]] = r < n_high ? 0 : 1;
  std::vector<int32_t> idx;
  std::vector<uint8_t> low;
  for (int i = 0; i < n; ++i)
    if (tier[i] < 2) {
      idx.push_back(i);
      low.push_back(tier[i]);
    }
  seg.retain_tiered(idx, low, low_key, low_value);
}

}  // namespace kvslim
