// ChunkPress: compresses the context in independent chunks of `chunk` entries, so every part of
// the context keeps the same share (a scorer left to itself may spend the budget on one region).
// Each chunk of each segment is scored by the inner scorer on the chunk's entries alone and keeps
// max(1, floor(len (1 - ratio))) of them (len = the chunk's entries; the last chunk may be
// shorter). With chunked prefill (--chunk-size) each prefill step compresses only the entries it
// added, in chunks starting at its first entry, so the result equals kvpress's whenever the prefill
// chunk is a multiple of `chunk`. As in kvpress the inner scorer sees only the chunk's keys and
// values; a scorer that reads the observation window (SnapKV, ...) scores every chunk with the
// context's window queries (kvpress recomputes the window from each chunk's last hidden states).
// Reference: kvpress/presses/chunk_press.py (ChunkPress), after FINCH (Corallo & Papotti, TACL
// 2024, doi 10.1162/tacl_a_00716).
#include <algorithm>

#include <fmt/format.h>

#include "press/sub_cache.h"

namespace kvslim {
namespace {

class ChunkPress : public SubsetScoringPress {
 public:
  ChunkPress(std::unique_ptr<ScorerPress> inner, int chunk) : SubsetScoringPress(std::move(inner)), chunk_(chunk) {}
  std::string describe() const override { return fmt::format("chunk({}):chunk={}", inner_->describe(), chunk_); }
  void reset() override {
    SubsetScoringPress::reset();
    done_ = 0;
  }
  void apply(KVCache& cache, const Model& model, const Observation& obs, const Target& target) override {
    const double r = target.ratio;
    const int L = cache.n_layer(), H = cache.n_head_kv();
    if (r <= 0) {
      done_ = cache_next_position(cache);
      return;
    }
    // Per segment: the first entry this step added, and the kept indices (older entries stay).
    std::vector<std::vector<int32_t>> first(L, std::vector<int32_t>(H));
    SegmentIndices keep(L, std::vector<std::vector<int32_t>>(H));
    int32_t n_chunks = 0;
    for (int l = 0; l < L; ++l)
      for (int h = 0; h < H; ++h) {
        const auto& pos = cache.seg(l, h).positions();
        const int32_t f = static_cast<int32_t>(std::lower_bound(pos.begin(), pos.end(), done_) - pos.begin());
        first[l][h] = f;
        for (int32_t i = 0; i < f; ++i) keep[l][h].push_back(i);
        n_chunks = std::max<int32_t>(n_chunks, (static_cast<int32_t>(pos.size()) - f + chunk_ - 1) / chunk_);
      }
    for (int32_t c = 0; c < n_chunks; ++c) {
      SegmentIndices idx(L, std::vector<std::vector<int32_t>>(H));
      size_t longest = 0;
      for (int l = 0; l < L; ++l)
        for (int h = 0; h < H; ++h) {
          const int32_t n = static_cast<int32_t>(cache.seg(l, h).size()), b = first[l][h] + c * chunk_;
          for (int32_t i = b; i < std::min(n, b + chunk_); ++i) idx[l][h].push_back(i);
          longest = std::max(longest, idx[l][h].size());
        }
      KVCache sub = sub_cache(cache, idx);
      Scores sc = inner_->score_all(sub, model, obs, Target{r, longest});
      for (int l = 0; l < L; ++l)
        for (int h = 0; h < H; ++h) {
          const auto& part = idx[l][h];
          if (part.empty()) continue;
          for (int32_t j : select_top(sc[l][h], uniform_keep(part.size(), r))) keep[l][h].push_back(part[j]);
        }
    }
    for (int l = 0; l < L; ++l)
      for (int h = 0; h < H; ++h)
        if (keep[l][h].size() < cache.seg(l, h).size()) cache.seg(l, h).retain(keep[l][h]);
    done_ = cache_next_position(cache);
  }

 private:
  int chunk_;
  int32_t done_ = 0;  // entries at positions below were compressed by an earlier step
};

PressRegistrar reg([] {
  PressInfo i;
  i.name = "chunk";
  i.kvpress = {"ChunkPress"};
  i.summary = "wrapper over a scorer: compresses independent chunks of the context, each to the same ratio";
  i.source = "kvpress/presses/chunk_press.py (ChunkPress), after FINCH (Corallo & Papotti 2024, TACL, doi "
             "10.1162/tacl_a_00716)";
  i.params = {{"chunk", "1024", "chunk_length", {.help = "entries per chunk, each compressed on its own"}}};
  i.kind = PressKind::Wrapper;
  i.default_inner = "snapkv";
  i.make_wrapper = [](const PressParams& p, std::unique_ptr<PressImpl> inner) -> std::unique_ptr<PressImpl> {
    const int c = param_int(p, "chunk", "chunk");
    if (c < 1) throw Error(fmt::format("press chunk: chunk={} must be >= 1", c));
    return std::make_unique<ChunkPress>(subset_scorer("chunk", std::move(inner)), c);
  };
  return i;
}());

}  // namespace
}  // namespace kvslim
