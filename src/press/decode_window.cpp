// See press/decode_window.h.
#include "press/decode_window.h"

#include <algorithm>
#include <cstring>

namespace kvslim {

void append_decode_window(Observation& buf, const Observation& obs, const Model& model, int W) {
  const int add = obs.n_window();
  if (W <= 0 || add == 0) return;
  const HParams& hp = model.hparams();
  const int nh = hp.n_head, hd = hp.head_dim, have = buf.n_window();
  const int keep_old = std::min(have, std::max(0, W - add)), take = std::min(add, W), nw = keep_old + take;
  buf.queries.resize(hp.n_layer);
  for (int l = 0; l < hp.n_layer; ++l) {
    std::vector<float> q(static_cast<size_t>(nh) * nw * hd);
    const std::vector<float>& old = buf.queries[l];
    const std::vector<float>& neu = obs.queries[l];
    for (int h = 0; h < nh; ++h) {
      if (keep_old > 0)
        std::memcpy(&q[static_cast<size_t>(h) * nw * hd], &old[(static_cast<size_t>(h) * have + have - keep_old) * hd],
                    sizeof(float) * keep_old * hd);
      std::memcpy(&q[(static_cast<size_t>(h) * nw + keep_old) * hd], &neu[(static_cast<size_t>(h) * add + add - take) * hd],
                  sizeof(float) * take * hd);
    }
    buf.queries[l].swap(q);
  }
  std::vector<int32_t> wp(buf.window_positions.end() - keep_old, buf.window_positions.end());
  wp.insert(wp.end(), obs.window_positions.end() - take, obs.window_positions.end());
  buf.window_positions.swap(wp);
}

}  // namespace kvslim
