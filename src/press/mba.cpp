#include "press/mba.h"

#include <algorithm>
#include <functional>

#include <fmt/format.h>

#include "kvslim/error.h"

namespace kvslim {

int minimum_budget(const float* p, size_t n, double mass) {
  if (!(mass > 0.0 && mass <= 1.0)) throw Error(fmt::format("MBA: attention mass {} is outside (0, 1]", mass));
  std::vector<double> v(p, p + n);
  double total = 0;
  for (double x : v) total += x;
  if (!(total > 0)) return 0;
  std::sort(v.begin(), v.end(), std::greater<double>());
  // A tolerance keeps a row whose top entries sum to exactly `mass` (up to rounding) at that count.
  const double need = mass * total * (1.0 - 1e-9);
  double acc = 0;
  size_t k = 0;
  while (k < n && acc < need) acc += v[k++];
  return static_cast<int>(k);
}

std::vector<int> query_head_mba(const LayerView& view, int rows, double mass) {
  const int G = view.hp().n_group();
  std::vector<int> mba(static_cast<size_t>(view.hp().n_head), 0);
  for (int h = 0; h < view.hp().n_head_kv; ++h) {
    const size_t n = view.seg(h).size();
    if (n == 0) continue;
    const std::vector<float>& p = view.window_mass(h, rows);
    for (int g = 0; g < G; ++g) mba[static_cast<size_t>(h) * G + g] = minimum_budget(p.data() + static_cast<size_t>(g) * n, n, mass);
  }
  return mba;
}

}  // namespace kvslim
