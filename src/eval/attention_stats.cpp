// ZigZagKV's MBA / LMBA / LMBO of a prompt. Zhong et al., arXiv 2412.09036.
#include "eval/attention_stats.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include <fmt/format.h>

#include "attention/attention.h"
#include "kernels/matmul.h"
#include "press/authoring.h"
#include "kvslim/request.h"
#include "press/recording_press.h"

namespace kvslim {

LayerBudgets layer_budgets(const Model& model, const std::vector<Token>& tokens, const LayerBudgetOptions& opt,
                           const SessionOptions& session) {
  if (tokens.empty()) throw Error("attention-stats: empty prompt");
  if (static_cast<size_t>(opt.window) > tokens.size())
    throw Error(fmt::format("attention-stats: window {} is longer than the {} prompt tokens", opt.window, tokens.size()));
  if (opt.window < 1) throw Error(fmt::format("attention-stats: window {} must be >= 1", opt.window));
  if (!(opt.mass > 0 && opt.mass <= 1)) throw Error(fmt::format("attention-stats: mass {} is outside (0, 1]", opt.mass));
  if (!(opt.similarity > -1 && opt.similarity <= 1))
    throw Error(fmt::format("attention-stats: similarity {} is outside (-1, 1]", opt.similarity));
  const HParams& hp = model.hparams();
  const int L = hp.n_layer, H = hp.n_head_kv, G = hp.n_group(), hd = hp.head_dim, nh = hp.n_head;
  ObservationNeeds rec;
  rec.window = opt.window;
  auto recorder = std::make_unique<RecordingPress>(rec);
  const RecordingPress& recorded = *recorder;
  RequestOptions ro;
  ro.session = session;
  Request sess(model, std::move(recorder), ro);
  const int n = static_cast<int>(tokens.size());
  sess.set_prompt_tokens(tokens);
  sess.prefill();
  const Observation& obs = recorded.observation();
  const int W = obs.n_window();

  LayerBudgets out;
  AttentionStats& st = out.attention;
  st.context_tokens = n;
  st.window = W;
  st.tau = opt.mass;
  st.mba.assign(L, std::vector<int>(nh, 0));
  st.lmba.assign(L, 0.0);
  out.similarity = opt.similarity;
  out.lmbo.assign(L, 0);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (int l = 0; l < L; ++l) {
    LayerView view(model, sess.cache(), obs, l);
    std::vector<std::vector<float>> kv_score(H);
    std::vector<std::vector<int32_t>> vis(H, std::vector<int32_t>(W));
    for (int h = 0; h < H; ++h) {
      const Segment& s = view.seg(h);
      const size_t m = s.size();
      const std::vector<float>& p = view.window_attention(h);
      kv_score[h].assign(m, 0.0f);
      for (int g = 0; g < G; ++g) {
        std::vector<float> sum(m, 0.0f);
        for (int i = 0; i < W; ++i) {
          const float* row = p.data() + (static_cast<size_t>(g) * W + i) * m;
          for (size_t j = 0; j < m; ++j) sum[j] += row[j];
        }
        st.mba[l][h * G + g] = minimum_budget(sum.data(), m, opt.mass);
        for (size_t j = 0; j < m; ++j) kv_score[h][j] += sum[j];
      }
      for (int i = 0; i < W; ++i)
        vis[h][i] = static_cast<int32_t>(std::upper_bound(s.positions().begin(), s.positions().end(),
                                                          obs.window_positions[i]) - s.positions().begin());
    }
    double sum_mba = 0;
    for (int v : st.mba[l]) sum_mba += v;
    st.lmba[l] = sum_mba / nh;

    // The layer's attention output through W_o, with every KV head restricted to `keep[h]`.
    const WeightView& wo = *model.layer(l).wo;
    auto layer_out = [&](const std::vector<std::vector<int32_t>>* keep, std::vector<float>& res) {
      std::vector<float> att(static_cast<size_t>(W) * nh * hd);
      for (int h = 0; h < H; ++h) {
        const Segment& s = view.seg(h);
        for (int g = 0; g < G; ++g) {
          const int qh = h * G + g;
          const float* q = view.window_queries(qh);
          if (!keep) {
            attend_segment(s, q, W, vis[h].data(), scale, att.data() + static_cast<size_t>(qh) * hd, nh * hd);
          } else {
            const auto& k = (*keep)[h];
            attend_segment_subset(s, k.data(), static_cast<int>(k.size()), q, W, vis[h].data(), scale,
                                  att.data() + static_cast<size_t>(qh) * hd, nh * hd);
          }
        }
      }
      res.resize(static_cast<size_t>(W) * hp.n_embd);
      matmul(wo, att.data(), W, res.data(), session.exact);
    };
    std::vector<float> full;
    layer_out(nullptr, full);
    auto similarity = [&](int B) {
      std::vector<std::vector<int32_t>> keep(H);
      for (int h = 0; h < H; ++h) keep[h] = select_top(kv_score[h], B);
      std::vector<float> part;
      layer_out(&keep, part);
      double acc = 0;
      for (int i = 0; i < W; ++i) {
        double ab = 0, aa = 0, bb = 0;
        for (int c = 0; c < hp.n_embd; ++c) {
          const double a = full[static_cast<size_t>(i) * hp.n_embd + c], b = part[static_cast<size_t>(i) * hp.n_embd + c];
          ab += a * b;
          aa += a * a;
          bb += b * b;
        }
        acc += aa > 0 && bb > 0 ? ab / std::sqrt(aa * bb) : (aa == bb ? 1.0 : 0.0);
      }
      return acc / W;
    };
    int lo = 1, hi = 0;
    for (int h = 0; h < H; ++h) hi = std::max(hi, static_cast<int>(view.seg(h).size()));
    while (lo < hi) {
      const int mid = lo + (hi - lo) / 2;
      if (similarity(mid) >= opt.similarity) hi = mid;
      else lo = mid + 1;
    }
    out.lmbo[l] = hi;
  }
  return out;
}

}  // namespace kvslim
