// FINCH: prompt-guided compression. The last `window` context tokens are the prompt (kvpress finds
// them after a delimiter token; in kvslim the question is put at the end of the context and its
// token count given as `window`). Per KV head, each non-window entry's score is the softmax
// attention of the window queries (causal, every entry in the denominator), with row i of the
// window multiplied by (n - window + i) (kvpress's normalize_scores: the number of entries that
// row can see, less one), averaged over the window rows and the GQA group; the window entries are
// chosen first (kvpress pads them with the largest score + 1). floor(n (1 - ratio)) entries stay
// (at least 1), or, with `chunk=C`, max(1, floor(len (1 - ratio))) of every C consecutive entries.
// With rerotate=1 (default, as kvpress) the kept keys are re-rotated to contiguous positions
// (key_rerotation). Corallo & Papotti, "FINCH: Prompt-guided Key-Value Cache Compression for
// Large Language Models", TACL 2024 (doi 10.1162/tacl_a_00716); reference:
// kvpress/presses/finch_press.py (FinchPress).
#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "press/authoring.h"

namespace kvslim {
namespace {

/// Keeps max(1, floor(len (1 - ratio))) of every `chunk` consecutive entries (kvpress's Finch
/// chunk_length); chosen-first entries count in their chunk.
class FinchChunkBudget : public BudgetPolicy {
 public:
  explicit FinchChunkBudget(int chunk) : chunk_(chunk) {}
  std::string describe() const override { return fmt::format("finch_chunks:chunk={}", chunk_); }
  void prepare(Scores& scores, const KVCache& cache, const Target& target) const override {
    // Rewrites the scores so that the per-segment top-k is the per-chunk top-k: 1 kept, 0 not.
    for (auto& layer : scores)
      for (auto& sc : layer) {
        std::vector<float> out(sc.size(), 0.0f);
        for (size_t b = 0; b < sc.size(); b += chunk_) {
          const size_t e = std::min(sc.size(), b + chunk_);
          std::vector<float> part(sc.begin() + b, sc.begin() + e);
          for (int32_t j : select_top(part, uniform_keep(e - b, target.ratio))) out[b + j] = 1.0f;
        }
        sc = out;
      }
  }
  KeepCounts keep_counts(const BudgetInput& in) const override {
    KeepCounts keep(in.cache.n_layer(), std::vector<int>(in.cache.n_head_kv()));
    for (int l = 0; l < in.cache.n_layer(); ++l)
      for (int h = 0; h < in.cache.n_head_kv(); ++h)
        keep[l][h] = static_cast<int>(std::count(in.scores[l][h].begin(), in.scores[l][h].end(), 1.0f));
    return keep;
  }

 private:
  int chunk_;
};

class FinchPress : public ScorerPress {
 public:
  FinchPress(double ratio, int window, bool normalize, int chunk)
      : ScorerPress(ratio, chunk > 0 ? std::make_unique<FinchChunkBudget>(chunk) : nullptr), window_(window),
        normalize_(normalize), chunk_(chunk) {}
  std::string describe() const override { return describe_scorer(); }
  /// rerotate=0: this is the scorer alone; the re-rotation finch adds by default is the
  /// key_rerotation(...) around it, so the description parses back to the same press.
  std::string describe_scorer() const override {
    return fmt::format("finch:ratio={},window={},normalize={},chunk={},rerotate=0", ratio_, window_,
                       normalize_ ? 1 : 0, chunk_);
  }
  ObservationNeeds scorer_needs() const override {
    ObservationNeeds r;
    r.window = window_;
    return r;
  }
  void score(const LayerView& view, std::vector<std::vector<float>>& out) const override {
    const int G = view.hp().n_group(), nw = view.n_window();
    for (int h = 0; h < view.hp().n_head_kv; ++h) {
      const size_t n = view.seg(h).size();
      const int w = std::min<int>(window_, std::min<int>(nw, static_cast<int>(n)));
      out[h].assign(n, keep_first_score(false));
      if (n == 0 || w == 0) continue;
      const std::vector<float>& A = view.window_attention(h);  // [G][nw][n]
      const size_t m = n - w;
      for (size_t j = 0; j < m; ++j) {
        double s = 0;
        for (int g = 0; g < G; ++g)
          for (int i = 0; i < w; ++i) {
            const int row = nw - w + i;
            const double a = A[(static_cast<size_t>(g) * nw + row) * n + j];
            s += normalize_ ? a * double(m + i) : a;
          }
        out[h][j] = static_cast<float>(s / w / G);
      }
    }
  }

 private:
  int window_;
  bool normalize_;
  int chunk_;
};

PressRegistrar reg({"finch", "prompt-guided SnapKV: the question's attention, normalised per row, kept keys re-rotated",
                    "Corallo & Papotti 2024, FINCH: Prompt-guided Key-Value Cache Compression for Large Language "
                    "Models, TACL (doi 10.1162/tacl_a_00716); reference: kvpress/presses/finch_press.py (FinchPress)",
                    {{"ratio", "0"},
                     {"chunk", "0", "chunk_length",
                      {.help = "compress every chunk of this many entries on its own; 0: the whole context"}},
                     {"normalize", "1", "normalize_scores",
                      {.type = ParamType::Bool, .help = "weigh each query's attention by the entries it can see"}},
                     {"rerotate", "1", "rerotate_keys",
                      {.type = ParamType::Bool, .help = "re-rotate the kept keys to contiguous positions"}},
                     // kvpress finds the prompt after a delimiter token; kvslim is told its length.
                     {"window", "0", "window_size",
                      {.help = "the prompt's tokens at the end of the context (required, >= 1)"}}},
                    [](const PressParams& p) -> std::unique_ptr<PressImpl> {
                      const int w = param_int(p, "finch", "window"), c = param_int(p, "finch", "chunk");
                      if (w < 1)
                        throw Error(fmt::format("press finch needs window=N >= 1: the number of prompt (question) "
                                                "tokens at the end of the context (kvpress finds them after a "
                                                "delimiter token); got {}. A --question (\"question\") is appended "
                                                "after compression, where Finch cannot see it: put the question at "
                                                "the end of the context instead and give window=its token count",
                                                w));
                      if (c < 0) throw Error(fmt::format("press finch: chunk={} must be >= 0 (0: no chunks)", c));
                      std::unique_ptr<PressImpl> f = std::make_unique<FinchPress>(param_double(p, "finch", "ratio"), w,
                                                                              param_bool(p, "finch", "normalize"), c);
                      if (!param_bool(p, "finch", "rerotate")) return f;
                      const PressInfo* rr = PressRegistry::instance().find("key_rerotation");
                      if (!rr) throw Error("press finch: key_rerotation is not registered");
                      return rr->make_wrapper({}, std::move(f));
                    }}, {"FinchPress"});

}  // namespace
}  // namespace kvslim
