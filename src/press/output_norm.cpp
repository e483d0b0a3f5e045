// ||W_o^q v||_1 per entry (see output_norm.h).
#include "press/output_norm.h"

#include <cmath>

#include "kernels/matmul.h"
#include "kvslim/quant.h"

namespace kvslim {

std::vector<double> projected_value_l1(const LayerView& view, int h, const std::vector<int32_t>& idx) {
  const HParams& hp = view.hp();
  const int hd = hp.head_dim, G = hp.n_group();
  std::vector<double> out(idx.size(), 0.0);
  if (idx.empty()) return out;
  // W_o restricted to one query head's head_dim input columns is a view of its rows at a column
  // offset; where the weight type's blocks do not align with head_dim, an f32 copy is sliced.
  const WeightView& wo = *view.model().layer(view.layer()).wo;
  const int64_t n_embd = wo.rows, cols = wo.cols;
  const TypeTraits* tt = type_traits(wo.type);
  WeightView base = wo;
  std::vector<float> wf;
  if (!tt || hd % tt->block_size != 0) {
    wf.resize(static_cast<size_t>(n_embd) * cols);
    for (int64_t r = 0; r < n_embd; ++r) dequantize_row(wo.type, wo.row(r), wf.data() + r * cols, cols);
    base = WeightView{GGMLType::F32, wf.data(), cols, n_embd, static_cast<size_t>(cols) * sizeof(float), {}};
  }
  auto head_slice = [&](int q) {
    WeightView v = base;
    v.cols = hd;
    v.data = static_cast<const uint8_t*>(base.data) + row_bytes(base.type, static_cast<int64_t>(q) * hd);
    return v;
  };
  // One product per query head of the group with the engine's matmul, in blocks of entries.
  constexpr size_t kBlock = 256;
  std::vector<float> V(kBlock * hd), Y(kBlock * n_embd);
  for (size_t b0 = 0; b0 < idx.size(); b0 += kBlock) {
    const size_t nb = std::min(kBlock, idx.size() - b0);
    for (size_t i = 0; i < nb; ++i) view.seg(h).value(idx[b0 + i], V.data() + i * hd);
    for (int g = 0; g < G; ++g) {
      matmul(head_slice(h * G + g), V.data(), static_cast<int64_t>(nb), Y.data());
      for (size_t i = 0; i < nb; ++i) {
        double l1 = 0;
        const float* y = Y.data() + i * n_embd;
        for (int64_t r = 0; r < n_embd; ++r) l1 += std::fabs(y[r]);
        out[b0 + i] += l1 / G;
      }
    }
  }
  return out;
}

}  // namespace kvslim
