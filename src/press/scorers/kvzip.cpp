// KVzip: scores from context reconstruction (replay), one global top-k over all layers and heads.
// Kim et al., "KVzip: Query-Agnostic KV Cache Compression with Context Reconstruction", arXiv 2505.23416.
#include "press/scorers/kvzip.h"
#include "press/position_scores.h"
#include "press/recorders.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <cblas.h>
#include <fmt/format.h>

#include "attention/attention.h"
#include "kernels/matmul.h"
#include "kernels/threads.h"
#include "attention/window_attention.h"

namespace kvslim {

std::vector<float> value_output_gram(const Model& model, int layer) {
  const HParams& hp = model.hparams();
  const WeightView& wo = *model.layer(layer).wo;
  const int hd = hp.head_dim, nh = hp.n_head;
  const int64_t cols = wo.cols, rows = wo.rows;
  if (cols != static_cast<int64_t>(nh) * hd)
    throw Error(fmt::format("layer {}: attn_output has {} columns, expected n_head x head_dim = {}", layer, cols, nh * hd));
  std::vector<float> w(static_cast<size_t>(rows) * cols);
  for (int64_t r = 0; r < rows; ++r) dequantize_row(wo.type, wo.row(r), w.data() + r * cols, cols);
  std::vector<float> m(static_cast<size_t>(nh) * hd * hd);
  BlasSlot slot;  // see kernels/threads.h
  for (int g = 0; g < nh; ++g)
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, hd, hd, static_cast<int>(rows), 1.0f, w.data() + g * hd,
                static_cast<int>(cols), w.data() + g * hd, static_cast<int>(cols), 0.0f,
                m.data() + static_cast<size_t>(g) * hd * hd, hd);
  return m;
}

float gram_norm(const float* M, const float* v, int hd) {
  double s = 0;
  for (int a = 0; a < hd; ++a) {
    double row = 0;
    for (int b = 0; b < hd; ++b) row += double(M[a * hd + b]) * v[b];
    s += row * v[a];
  }
  return static_cast<float>(std::sqrt(std::max(s, 0.0)));
}

void kvzip_score_segment(const Segment& seg, size_t n_sink, size_t ctx_begin, size_t ctx_end, size_t replay_begin,
                         const float* q, int G, int n_q, const int32_t* replay_visible, const float* inv_hnorm,
                         const float* wov, float* score) {
  const int hd = seg.head_dim();
  int32_t max_vis = 0;
  for (int r = 0; r < n_q; ++r) max_vis = std::max(max_vis, replay_visible[r]);
  if (n_sink > ctx_begin || ctx_begin > ctx_end || ctx_end > seg.size() || replay_begin + max_vis > seg.size())
    throw Error(fmt::format("kvzip: ranges sink {} chunk [{}, {}) replay [{}, {}) do not fit a segment of {} entries",
                            n_sink, ctx_begin, ctx_end, replay_begin, replay_begin + max_vis, seg.size()));
  const size_t nc = ctx_end - ctx_begin;
  if (nc == 0 || n_q == 0) return;
  // Keys the scoring softmax covers, gathered once: sinks, chunk, replay.
  const size_t m = n_sink + nc + static_cast<size_t>(max_vis);
  std::vector<float> k(m * hd);
  if (n_sink) seg.keys(0, n_sink, k.data());
  seg.keys(ctx_begin, ctx_end, k.data() + n_sink * hd);
  if (max_vis) seg.keys(replay_begin, replay_begin + max_vis, k.data() + (n_sink + nc) * hd);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  // Logits of a block of query rows at once (rows = g * n_q + r), then a softmax per row.
  const int block = 64, rows_all = G * n_q;
  std::vector<float> logit(static_cast<size_t>(block) * m);
  for (int b0 = 0; b0 < rows_all; b0 += block) {
    const int nb = std::min(block, rows_all - b0);
    BlasSlot slot;  // see kernels/threads.h
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nb, static_cast<int>(m), hd, scale, q + static_cast<size_t>(b0) * hd,
                hd, k.data(), hd, 0.0f, logit.data(), static_cast<int>(m));
    for (int i = 0; i < nb; ++i) {
      const int g = (b0 + i) / n_q, r = (b0 + i) % n_q;
      float* lg = logit.data() + static_cast<size_t>(i) * m;
      const size_t mr = n_sink + nc + static_cast<size_t>(replay_visible[r]);
      softmax_inplace(lg, mr);  // the window kernels' softmax (attention/window_attention.h)
      const float inv = inv_hnorm ? inv_hnorm[r] : 1.0f;
      const float* w = wov ? wov + static_cast<size_t>(g) * nc : nullptr;
      for (size_t j = 0; j < nc; ++j) {
        float p = lg[n_sink + j] * inv;
        if (w) p *= w[j];
        score[j] = std::max(score[j], p);
      }
    }
  }
}

namespace {

/// Tokens that `text` adds after other text (so an SPM vocabulary's space prefix is not added).
std::vector<Token> continuation_tokens(const Tokenizer& tok, const std::string& text) {
  std::vector<Token> base = tok.encode("x", false, false), full = tok.encode("x" + text, false, false);
  if (full.size() > base.size() && std::equal(base.begin(), base.end(), full.begin()))
    return std::vector<Token>(full.begin() + base.size(), full.end());
  return tok.encode(text, false, false);
}

size_t lower_index(const Segment& s, int32_t pos) {
  return std::lower_bound(s.positions().begin(), s.positions().end(), pos) - s.positions().begin();
}

}  // namespace

namespace {

struct ReplayText {
  std::vector<Token> first_instr, later_instr, newline;
  ReplayText(const Tokenizer& tok)
      : first_instr(tok.encode("\n\nRepeat the previous context exactly.", false, false)),
        later_instr(tok.encode("\n\nRepeat the part of the previous context exactly, starting with", false, false)),
        newline(continuation_tokens(tok, "\n")) {}
  /// Replay tokens other than the chunk's own.
  int overhead(const KVzipOptions& opt) const {
    return static_cast<int>(std::max(first_instr.size(), later_instr.size() + opt.prev_tokens) + newline.size());
  }
};

}  // namespace

int kvzip_min_replay_positions(const Tokenizer& tok, const KVzipOptions& opt) {
  return ReplayText(tok).overhead(opt) + 16;
}

Scores kvzip_replay_scores(ModelRunner& session, const std::vector<Token>& tokens, int32_t first_pos,
                           const KVzipOptions& opt, const std::vector<Token>& before) {
  const Model& model = session.model();
  const HParams& hp = model.hparams();
  const Tokenizer& tok = model.tokenizer();
  const int L = hp.n_layer, H = hp.n_head_kv, G = hp.n_group(), hd = hp.head_dim;
  const KVCache& cache = session.cache();
  const int32_t P = session.next_position();
  const int N = static_cast<int>(tokens.size());
  if (first_pos < 0 || first_pos + N > P)
    throw Error(fmt::format("kvzip: context positions [{}, {}) are not in the session (next position {})", first_pos,
                            first_pos + N, P));
  if (opt.chunk < 1 || opt.batch < 1 || opt.n_sink < 0 || opt.prev_tokens < 0)
    throw Error(fmt::format("kvzip: chunk {} and batch {} must be >= 1, n_sink {} and prev_tokens {} >= 0", opt.chunk,
                            opt.batch, opt.n_sink, opt.prev_tokens));
  Scores out(L, std::vector<std::vector<float>>(H));
  for (int l = 0; l < L; ++l)
    for (int h = 0; h < H; ++h) out[l][h].assign(cache.seg(l, h).size(), std::numeric_limits<float>::quiet_NaN());
  if (N == 0) return out;

  const ReplayText text(tok);
  const std::vector<Token>& first_instr = text.first_instr;
  const std::vector<Token>& later_instr = text.later_instr;
  const std::vector<Token>& newline = text.newline;
  auto replayable = [&](int i) { return !(i == 0 && tokens[0] == tok.bos()); };

  // The replay goes after the context; shorten chunks so that it fits in the context size.
  const int overhead = text.overhead(opt);
  const int room = session.n_ctx() - P - overhead;
  const int chunk = std::min(opt.chunk, room);
  if (chunk < 16)
    throw Error(fmt::format("kvzip: the replay needs at least {} positions after the {} already used, but the context "
                            "size n_ctx is {}; raise n_ctx",
                            overhead + 16, P, session.n_ctx()));

  std::vector<std::vector<float>> gram;
  if (opt.plus) {
    gram.resize(L);
    for (int l = 0; l < L; ++l) gram[l] = value_output_gram(model, l);
  }

  for (int c0 = 0; c0 < N; c0 += chunk) {
    const int c1 = std::min(N, c0 + chunk);
    // A chunk that follows context tokens (an earlier chunk, or `before`) quotes their tail.
    const bool later = c0 > 0 || !before.empty();
    std::vector<Token> replay = later ? later_instr : first_instr;
    if (c0 > 0) {
      for (int i = std::max(0, c0 - opt.prev_tokens); i < c0; ++i)
        if (replayable(i)) replay.push_back(tokens[i]);
    } else if (later) {
      const size_t n_before = std::min(before.size(), static_cast<size_t>(opt.prev_tokens));
      for (size_t i = before.size() - n_before; i < before.size(); ++i)
        if (before[i] != tok.bos()) replay.push_back(before[i]);
    }
    replay.insert(replay.end(), newline.begin(), newline.end());
    for (int i = c0; i < c1; ++i)
      if (replayable(i)) replay.push_back(tokens[i]);
    const int R = static_cast<int>(replay.size());

    // Chunk ranges per segment; the replay's entries will follow every existing entry.
    struct Range {
      size_t sink, begin, end, replay;
    };
    std::vector<Range> rg(static_cast<size_t>(L) * H);
    std::vector<std::vector<float>> wov(rg.size()), best(rg.size());
    parallel_for(static_cast<int64_t>(L) * H, [&](int64_t b, int64_t e) {
      for (int64_t w = b; w < e; ++w) {
        const int l = static_cast<int>(w / H), h = static_cast<int>(w % H);
        const Segment& s = cache.seg(l, h);
        Range r;
        r.begin = lower_index(s, first_pos + c0);
        r.end = lower_index(s, first_pos + c1);
        r.sink = std::min<size_t>(opt.n_sink, r.begin);
        r.replay = s.size();
        rg[w] = r;
        best[w].assign(r.end - r.begin, 0.0f);
        if (!opt.plus) continue;
        const size_t nc = r.end - r.begin;
        wov[w].resize(static_cast<size_t>(G) * nc);
        if (nc == 0) continue;
        // |W_o,g v|^2 = v^T M_g v for all chunk values at once: (V M_g) . V row by row.
        std::vector<float> vals(nc * hd), vm(nc * hd);
        s.values(r.begin, r.end, vals.data());
        for (int g = 0; g < G; ++g) {
          BlasSlot slot;  // see kernels/threads.h
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(nc), hd, hd, 1.0f, vals.data(), hd,
                      gram[l].data() + static_cast<size_t>(h * G + g) * hd * hd, hd, 0.0f, vm.data(), hd);
          for (size_t j = 0; j < nc; ++j) {
            double acc = 0;
            for (int c = 0; c < hd; ++c) acc += double(vm[j * hd + c]) * vals[j * hd + c];
            wov[w][g * nc + j] = static_cast<float>(std::sqrt(std::max(acc, 0.0)));
          }
        }
      }
    });

    for (int off = 0; off < R; off += opt.batch) {
      const int bl = std::min(opt.batch, R - off);
      const int32_t p0 = P + off;
      std::vector<std::vector<float>> inv_norm(L, std::vector<float>(bl, 1.0f));
      // The replay queries (the window recorder) and, for KVzip+, 1 / ||attention input|| per query.
      WindowQueryRecorder window(bl, p0);
      AfterQKV norms([&](const LayerStep& st) {
        const float* xn = st.attn_input;
        for (int t = 0; t < st.n; ++t) {
          int row = st.positions[t] - p0;
          if (row < 0 || row >= bl) continue;
          double ss = 0;
          for (int i = 0; i < hp.n_embd; ++i) ss += double(xn[static_cast<size_t>(t) * hp.n_embd + i]) * xn[static_cast<size_t>(t) * hp.n_embd + i];
          inv_norm[st.layer][row] = ss > 0 ? static_cast<float>(1.0 / std::sqrt(ss)) : 0.0f;
        }
      });
      HookList hooks;
      hooks.add(&window);
      if (opt.plus) hooks.add(&norms);
      session.run(std::vector<Token>(replay.begin() + off, replay.begin() + off + bl), &hooks);
      Observation obs;
      window.finish(obs);
      if (obs.n_window() != bl) throw Error("kvzip: the forward pass did not record the replay queries");
      std::vector<int32_t> vis(bl);
      for (int r = 0; r < bl; ++r) vis[r] = off + r + 1;
      parallel_for(static_cast<int64_t>(L) * H, [&](int64_t b, int64_t e) {
        for (int64_t w = b; w < e; ++w) {
          const int l = static_cast<int>(w / H), h = static_cast<int>(w % H);
          const Range& r = rg[w];
          const float* q = obs.queries[l].data() + static_cast<size_t>(h) * G * bl * hd;
          kvzip_score_segment(cache.seg(l, h), r.sink, r.begin, r.end, r.replay, q, G, bl, vis.data(),
                              opt.plus ? inv_norm[l].data() : nullptr, opt.plus ? wov[w].data() : nullptr,
                              best[w].data());
        }
      });
    }
    session.rewind(P);
    for (int64_t w = 0; w < static_cast<int64_t>(L) * H; ++w) {
      const Range& r = rg[w];
      auto& o = out[w / H][w % H];
      std::copy(best[w].begin(), best[w].end(), o.begin() + r.begin);
    }
  }
  return out;
}

namespace {

}  // namespace

KVzipPress::KVzipPress(double ratio, KVzipOptions opt, std::unique_ptr<BudgetPolicy> policy)
    : ScorerPress(ratio, policy ? std::move(policy) : PressRegistry::instance().find("global")->make_policy({})),
      opt_(opt) {}

std::string KVzipPress::describe_scorer() const {
  return fmt::format("kvzip:ratio={},chunk={},n_sink={},plus={}", ratio_, opt_.chunk, opt_.n_sink, opt_.plus ? 1 : 0);
}

// The global policy is KVzip's own: the spec stays "kvzip:..." (with the budget, when there is one)
// so that it parses back.
std::string KVzipPress::describe() const {
  return policy().describe() == "global" ? describe_with_budget() : ScorerPress::describe();
}

ObservationNeeds KVzipPress::scorer_needs() const {
  ObservationNeeds r;
  r.tokens = true;
  return r;
}

void KVzipPress::reset() {
  ScorerPress::reset();
  stored_.clear();
  tail_.clear();
  tail_end_ = -1;
}

void KVzipPress::observe(const KVCache& cache, const Model& model, const Observation& obs) {
  // Ratio 0 without a budget leaves the cache bit-identical: no replay.
  if ((ratio_ <= 0.0 && policy().budget() == 0) || obs.tokens.empty()) return;
  if (!obs.runner || &obs.runner->cache() != &cache)
    throw Error("press kvzip: needs the request runner that owns the cache (it replays the context)");
  // The replay of the context's last chunk runs after the context: refuse at the first chunk a
  // context that leaves no room for it, not after the whole prefill.
  if (obs.context_end >= 0) {
    const int need = kvzip_min_replay_positions(model.tokenizer(), opt_);
    if (static_cast<int64_t>(obs.context_end) + need > obs.runner->n_ctx())
      throw Error(fmt::format("press kvzip: the replay of the context needs {} positions after its last token, but "
                              "the context ends at position {} and the context size n_ctx is {}; raise n_ctx (-c) "
                              "to at least {} or shorten the context",
                              need, obs.context_end, obs.runner->n_ctx(), obs.context_end + need));
  }
  const int L = cache.n_layer(), H = cache.n_head_kv();
  // A chunk of a chunked prefill continues the previous one: its replay quotes that chunk's tail, as
  // KVzip's own later chunks do.
  const int32_t first = obs.token_positions.front();
  const std::vector<Token> none;
  Scores fresh = kvzip_replay_scores(*obs.runner, obs.tokens, first, opt_, first == tail_end_ ? tail_ : none);
  const size_t keep = std::min(obs.tokens.size(), static_cast<size_t>(opt_.prev_tokens));
  tail_.assign(obs.tokens.end() - static_cast<std::ptrdiff_t>(keep), obs.tokens.end());
  tail_end_ = obs.token_positions.back() + 1;
  stored_.shape(L, H);
  for (int l = 0; l < L; ++l)
    for (int h = 0; h < H; ++h) {
      const Segment& s = cache.seg(l, h);
      for (size_t i = 0; i < s.size(); ++i)
        if (!std::isnan(fresh[l][h][i])) stored_.set(l, h, s.positions()[i], fresh[l][h][i]);
    }
}

void KVzipPress::score(const LayerView& view, std::vector<std::vector<float>>& out) const {
  const int l = view.layer();
  for (int h = 0; h < view.hp().n_head_kv; ++h) {
    const Segment& s = view.seg(h);
    out[h].resize(s.size());
    for (size_t i = 0; i < s.size(); ++i) {
      // Sinks are kept; entries no replay scored (e.g. a question) are never evicted.
      const double* v = i >= static_cast<size_t>(opt_.n_sink) ? stored_.find(l, h, s.positions()[i]) : nullptr;
      out[h][i] = v ? static_cast<float>(*v) : kProtected;
    }
  }
}

void KVzipPress::apply(KVCache& cache, const Model& model, const Observation& obs, const Target& target) {
  ScorerPress::apply(cache, model, obs, target);
  stored_.prune(cache);  // later chunks compete with the kept entries
}

void KVzipPress::remap_positions(int layer, int kv_head, const std::vector<int32_t>& old_pos,
                                 const std::vector<int32_t>& new_pos) {
  stored_.remap(layer, kv_head, old_pos, new_pos);
}

namespace {

PressRegistrar reg([] {
  PressInfo i;
  i.name = "kvzip";
  i.kvpress = {"KVzipPress"};
  i.summary = "context-reconstruction (replay) scores (plus=1: KVzip+ normalisation); default policy global (one "
              "top-k over all layers and heads)";
  i.source = "Kim et al. 2025, KVzip: Query-Agnostic KV Cache Compression with Context Reconstruction, arXiv "
             "2505.23416 (KVzip+: arXiv 2601.07891); reference: kvpress/presses/kvzip_press.py (KVzipPress, "
             "kvzip_plus_normalization=False by default)";
  i.params = {{"ratio", "0"},
              {"chunk", "2048", {}, kKvslimOnly},
              {"n_sink", "4", {}, {.help = "the first entries of every segment, never evicted"}},
              // KVzipPress's fields are compression_ratio, layerwise and n_sink: KVzip+ is kvzip:plus=1.
              {"plus", "0", "kvzip_plus_normalization", kKvslimOnly}};
  // kvpress's KVzipPress is no ScorerPress; its layerwise is kvslim's uniform policy.
  i.python = {.base_press = true,
              .fields = {{.name = "layerwise",
                          .after = "ratio",
                          .help = "the same ratio in every layer (kvslim's uniform policy) instead of one top-k over "
                                  "all layers and heads",
                          .policy = "uniform"}}};
  i.make = [](const PressParams& p) -> std::unique_ptr<PressImpl> {
    KVzipOptions o;
    o.chunk = param_int(p, "kvzip", "chunk");
    o.n_sink = param_int(p, "kvzip", "n_sink");
    int plus = param_int(p, "kvzip", "plus");
    if (o.chunk < 16) throw Error(fmt::format("press kvzip: chunk={} must be >= 16", o.chunk));
    if (o.n_sink < 0) throw Error(fmt::format("press kvzip: n_sink={} must be >= 0", o.n_sink));
    if (plus != 0 && plus != 1) throw Error(fmt::format("press kvzip: plus={} must be 0 or 1", plus));
    o.plus = plus == 1;
    return std::make_unique<KVzipPress>(param_double(p, "kvzip", "ratio"), o);
  };
  return i;
}());

}  // namespace
}  // namespace kvslim
