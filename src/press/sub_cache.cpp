// Scoring part of a cache (see sub_cache.h).
#include "press/sub_cache.h"

#include <fmt/format.h>

namespace kvslim {

KVCache sub_cache(const KVCache& cache, const SegmentIndices& idx) {
  const int L = cache.n_layer(), H = cache.n_head_kv(), hd = cache.head_dim();
  KVCache out(L, H, hd, KVCodec::F32, KVCodec::F32);
  std::vector<float> k(hd), v(hd);
  for (int l = 0; l < L; ++l)
    for (int h = 0; h < H; ++h) {
      const Segment& s = cache.seg(l, h);
      for (int32_t i : idx[l][h]) {
        s.key(i, k.data());
        s.value(i, v.data());
        out.seg(l, h).append(k.data(), v.data(), s.positions()[i]);
      }
    }
  return out;
}

std::unique_ptr<ScorerPress> subset_scorer(const std::string& wrapper, std::unique_ptr<PressImpl> inner) {
  auto* sp = inner->scorer();
  if (!sp) throw Error(fmt::format("press {} needs a scorer press inside, got '{}'", wrapper, inner->describe()));
  if (sp->policy().describe() != "uniform")
    throw Error(fmt::format("press {}: '{}' has a budget policy ({}); {} scores parts of the cache with a plain "
                            "scorer (as kvpress's ScorerPress)",
                            wrapper, inner->describe(), sp->policy().describe(), wrapper));
  if (sp->needs().attention_mass)
    throw Error(fmt::format("press {}: '{}' scores from attention accumulated over the whole cache, which {} "
                            "cannot split (kvpress: not supported with attentions)",
                            wrapper, inner->describe(), wrapper));
  inner.release();
  return std::unique_ptr<ScorerPress>(sp);
}

}  // namespace kvslim
