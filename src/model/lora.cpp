// LoRA factors on the projections of a llama layer (arXiv 2106.09685): shapes, checks and the
// low-rank update the forward pass adds when an adapter is switched on.
#include "model/lora.h"

#include <fmt/format.h>

#include "kvslim/error.h"

namespace kvslim {

const char* lora_target_name(LoraTarget t) {
  static const char* names[kLoraTargets] = {"q", "k", "v", "o", "gate", "up", "down"};
  const int i = static_cast<int>(t);
  return i >= 0 && i < kLoraTargets ? names[i] : "?";
}

void lora_target_shape(const HParams& hp, LoraTarget t, int& in, int& out) {
  const int dq = hp.n_head * hp.head_dim, dkv = hp.n_head_kv * hp.head_dim;
  switch (t) {
    case LoraTarget::Q: in = hp.n_embd, out = dq; return;
    case LoraTarget::K:
    case LoraTarget::V: in = hp.n_embd, out = dkv; return;
    case LoraTarget::O: in = dq, out = hp.n_embd; return;
    case LoraTarget::Gate:
    case LoraTarget::Up: in = hp.n_embd, out = hp.n_ff; return;
    case LoraTarget::Down: in = hp.n_ff, out = hp.n_embd; return;
  }
  throw Error(fmt::format("LoRA: unknown projection {}", static_cast<int>(t)));
}

LoraAdapter LoraAdapter::zeros(const HParams& hp, int rank, float alpha, const std::vector<LoraTarget>& targets) {
  if (rank < 1) throw Error(fmt::format("LoRA: rank {} must be >= 1", rank));
  LoraAdapter a;
  a.rank = rank;
  a.alpha = alpha;
  a.layers.resize(hp.n_layer);
  for (auto& layer : a.layers)
    for (LoraTarget t : targets) {
      int in = 0, out = 0;
      lora_target_shape(hp, t, in, out);
      Factors& f = layer[static_cast<int>(t)];
      f.a.assign(static_cast<size_t>(rank) * in, 0.0f);
      f.b.assign(static_cast<size_t>(out) * rank, 0.0f);
    }
  return a;
}

void LoraAdapter::check(const HParams& hp, const std::string& what) const {
  if (layers.empty()) return;
  if (static_cast<int>(layers.size()) != hp.n_layer)
    throw Error(fmt::format("{}: LoRA adapter for {} layers, the model has {}", what, layers.size(), hp.n_layer));
  if (rank < 1) throw Error(fmt::format("{}: LoRA rank {} must be >= 1", what, rank));
  for (int l = 0; l < hp.n_layer; ++l)
    for (int i = 0; i < kLoraTargets; ++i) {
      const Factors& f = layers[l][i];
      if (!f.active() && f.b.empty()) continue;
      int in = 0, out = 0;
      lora_target_shape(hp, static_cast<LoraTarget>(i), in, out);
      const char* name = lora_target_name(static_cast<LoraTarget>(i));
      if (f.a.size() != static_cast<size_t>(rank) * in)
        throw Error(fmt::format("{}: LoRA factor '{}' of layer {} has {} values in A, expected {} x {}", what, name, l,
                                f.a.size(), rank, in));
      if (f.b.size() != static_cast<size_t>(out) * rank)
        throw Error(fmt::format("{}: LoRA factor '{}' of layer {} has {} values in B, expected {} x {}", what, name, l,
                                f.b.size(), out, rank));
    }
}

void LoraAdapter::add(int layer, LoraTarget t, const float* x, int n, float* y) const {
  if (layer < 0 || layer >= static_cast<int>(layers.size())) return;
  const Factors& f = layers[layer][static_cast<int>(t)];
  if (!f.active()) return;
  const int r = rank;
  const size_t in = f.a.size() / r, out = f.b.size() / r;
  const double s = scale();
  std::vector<double> ax(r);
  for (int row = 0; row < n; ++row) {
    const float* xr = x + static_cast<size_t>(row) * in;
    for (int k = 0; k < r; ++k) {
      const float* ak = f.a.data() + static_cast<size_t>(k) * in;
      double acc = 0;
      for (size_t c = 0; c < in; ++c) acc += static_cast<double>(ak[c]) * xr[c];
      ax[k] = acc * s;
    }
    float* yr = y + static_cast<size_t>(row) * out;
    for (size_t o = 0; o < out; ++o) {
      const float* bo = f.b.data() + o * r;
      double acc = 0;
      for (int k = 0; k < r; ++k) acc += static_cast<double>(bo[k]) * ax[k];
      yr[o] += static_cast<float>(acc);
    }
  }
}

}  // namespace kvslim
