// RestoreKV's file (arXiv 2608.01247): the restore embeddings and the LoRA adapter of the restore
// pass, in GGUF (layout in press/restorekv.h). kvpress downloads them from a model hub
// (higokri/RestoreKV-<model>); kvslim reads a file made for the user's model.
#include "press/scorers/restorekv.h"

#include <fmt/format.h>

#include "kvslim/error.h"
#include "kvslim/gguf.h"

namespace kvslim {

namespace {

std::string factor_name(int layer, LoraTarget t, char ab) {
  return fmt::format("restorekv.{}.{}.lora_{}", layer, lora_target_name(t), ab);
}

}  // namespace

void RestoreKVWeights::check(const HParams& hp, const std::string& what) const {
  if (n_embd != hp.n_embd || n_layer != hp.n_layer)
    throw Error(fmt::format("{}: restore weights for n_embd {} and {} layers do not fit the model (n_embd {}, {} layers)",
                            what, n_embd, n_layer, hp.n_embd, hp.n_layer));
  if (n_tokens < 1) throw Error(fmt::format("{}: restorekv.n_tokens {} must be >= 1", what, n_tokens));
  if (embeddings.size() != static_cast<size_t>(n_tokens) * n_embd)
    throw Error(fmt::format("{}: {} embedding values for R {} x n_embd {}", what, embeddings.size(), n_tokens, n_embd));
  if (lora.layers.empty()) return;
  if (static_cast<int>(lora.layers.size()) != hp.n_layer || lora.rank < 1)
    throw Error(fmt::format("{}: LoRA adapter for {} layers of rank {}; the model has {} layers", what,
                            lora.layers.size(), lora.rank, hp.n_layer));
  for (int l = 0; l < hp.n_layer; ++l)
    for (int i = 0; i < kLoraTargets; ++i) {
      const LoraAdapter::Factors& f = lora.layers[l][i];
      if (!f.active()) continue;
      int in = 0, out = 0;
      lora_target_shape(hp, static_cast<LoraTarget>(i), in, out);
      if (f.a.size() != static_cast<size_t>(lora.rank) * in)
        throw Error(fmt::format("{}: tensor '{}' has {} values, expected in {} x rank {} for this model", what,
                                factor_name(l, static_cast<LoraTarget>(i), 'a'), f.a.size(), in, lora.rank));
      if (f.b.size() != static_cast<size_t>(out) * lora.rank)
        throw Error(fmt::format("{}: tensor '{}' has {} values, expected rank {} x out {} for this model", what,
                                factor_name(l, static_cast<LoraTarget>(i), 'b'), f.b.size(), lora.rank, out));
    }
}

void RestoreKVWeights::save(const std::string& path, const std::string& base_model) const {
  GGUFWriter w;
  w.set("general.architecture", GGUFValue::str("restorekv"));
  w.set("restorekv.base_model", GGUFValue::str(base_model));
  w.set("restorekv.n_embd", GGUFValue::u32(static_cast<uint32_t>(n_embd)));
  w.set("restorekv.n_layer", GGUFValue::u32(static_cast<uint32_t>(n_layer)));
  w.set("restorekv.n_tokens", GGUFValue::u32(static_cast<uint32_t>(n_tokens)));
  w.set("restorekv.lora_rank", GGUFValue::u32(static_cast<uint32_t>(lora.rank)));
  w.set("restorekv.lora_alpha", GGUFValue::f32(lora.alpha));
  w.add_tensor_f32("restorekv.embeddings", GGMLType::F32, {n_embd, n_tokens}, embeddings);
  for (size_t l = 0; l < lora.layers.size(); ++l)
    for (int i = 0; i < kLoraTargets; ++i) {
      const LoraAdapter::Factors& f = lora.layers[l][i];
      if (!f.active()) continue;
      const int64_t r = lora.rank, in = static_cast<int64_t>(f.a.size()) / r, out = static_cast<int64_t>(f.b.size()) / r;
      w.add_tensor_f32(factor_name(static_cast<int>(l), static_cast<LoraTarget>(i), 'a'), GGMLType::F32, {in, r}, f.a);
      w.add_tensor_f32(factor_name(static_cast<int>(l), static_cast<LoraTarget>(i), 'b'), GGMLType::F32, {r, out}, f.b);
    }
  w.write(path);
}

RestoreKVWeights RestoreKVWeights::load(const std::string& path) {
  auto f = GGUFFile::open(path);
  std::string arch;
  try {
    arch = f->get_string("general.architecture");
  } catch (const Error&) {
  }
  if (arch != "restorekv")
    throw Error(fmt::format("{}: not a RestoreKV file (general.architecture is not 'restorekv')", path));
  RestoreKVWeights w;
  w.n_embd = static_cast<int>(f->get_int("restorekv.n_embd"));
  w.n_layer = static_cast<int>(f->get_int("restorekv.n_layer"));
  w.n_tokens = static_cast<int>(f->get_int("restorekv.n_tokens"));
  const int rank = static_cast<int>(f->get_int("restorekv.lora_rank", 0));
  if (w.n_embd < 1 || w.n_layer < 1 || w.n_tokens < 1 || rank < 0)
    throw Error(fmt::format("{}: n_embd {}, n_layer {}, n_tokens {} must be >= 1 and lora_rank {} >= 0", path, w.n_embd,
                            w.n_layer, w.n_tokens, rank));
  auto get = [&](const std::string& name, size_t count, const std::string& expected) {
    const TensorInfo& t = f->tensor(name);  // missing: an error naming the file and the tensor
    if (t.nelements() != static_cast<int64_t>(count))
      throw Error(fmt::format("{}: tensor '{}' has {} values, expected {} = {}", path, name, t.nelements(), expected,
                              count));
    return f->tensor_f32(t);
  };
  w.embeddings = get("restorekv.embeddings", static_cast<size_t>(w.n_tokens) * w.n_embd,
                     fmt::format("R {} x n_embd {}", w.n_tokens, w.n_embd));
  if (rank == 0) return w;
  w.lora.rank = rank;
  w.lora.alpha = static_cast<float>(f->get_float("restorekv.lora_alpha"));
  w.lora.layers.resize(w.n_layer);
  for (int l = 0; l < w.n_layer; ++l)
    for (int i = 0; i < kLoraTargets; ++i) {
      const LoraTarget t = static_cast<LoraTarget>(i);
      const std::string na = factor_name(l, t, 'a'), nb = factor_name(l, t, 'b');
      const TensorInfo* ta = f->find_tensor(na);
      const TensorInfo* tb = f->find_tensor(nb);
      if (!ta && !tb) continue;  // the adapter leaves this projection unchanged
      if (!ta || !tb)
        throw Error(fmt::format("{}: missing tensor '{}' (LoRA factors come in pairs)", path, ta ? nb : na));
      // Widths come from the tensors' own shapes here; check() compares them with the model.
      if (ta->ne.size() != 2 || tb->ne.size() != 2 || ta->ne[1] != rank || tb->ne[0] != rank)
        throw Error(fmt::format("{}: tensors '{}' / '{}' must be [in, {}] and [{}, out] (rank {})", path, na, nb, rank,
                                rank, rank));
      LoraAdapter::Factors& fa = w.lora.layers[l][i];
      fa.a = f->tensor_f32(*ta);
      fa.b = f->tensor_f32(*tb);
    }
  return w;
}

}  // namespace kvslim
