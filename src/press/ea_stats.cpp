// Offline query statistics for Expected Attention (see ea_stats.h).
#include "press/ea_stats.h"

#include <fmt/format.h>

#include "kvslim/gguf.h"

namespace kvslim {

void QueryStatsFile::save(const std::string& path) const {
  GGUFWriter w;
  w.set("general.architecture", GGUFValue::str("ea_stats"));
  w.set("ea_stats.base_model", GGUFValue::str(base_model));
  w.set("ea_stats.n_layer", GGUFValue::u32(n_layer));
  w.set("ea_stats.n_head", GGUFValue::u32(n_head));
  w.set("ea_stats.head_dim", GGUFValue::u32(head_dim));
  w.set("ea_stats.n_sink", GGUFValue::u32(n_sink));
  w.set("ea_stats.samples", GGUFValue::u32(samples));
  w.set("ea_stats.tokens", GGUFValue::u64(static_cast<uint64_t>(tokens)));
  w.add_tensor_f32("ea_stats.mean", GGMLType::F32, {head_dim, n_head, n_layer}, mean);
  w.add_tensor_f32("ea_stats.cov", GGMLType::F32, {head_dim, head_dim, n_head, n_layer}, cov);
  w.write(path);
}

QueryStatsFile QueryStatsFile::load(const std::string& path) {
  auto f = GGUFFile::open(path);
  if (f->get_string("general.architecture") != "ea_stats")
    throw Error(fmt::format("{}: not an Expected Attention statistics file (write one with kvslim ea-stats)", path));
  QueryStatsFile q;
  q.base_model = f->get_string("ea_stats.base_model");
  q.n_layer = static_cast<int>(f->get_int("ea_stats.n_layer"));
  q.n_head = static_cast<int>(f->get_int("ea_stats.n_head"));
  q.head_dim = static_cast<int>(f->get_int("ea_stats.head_dim"));
  q.n_sink = static_cast<int>(f->get_int("ea_stats.n_sink"));
  q.samples = static_cast<int>(f->get_int("ea_stats.samples"));
  q.tokens = static_cast<double>(f->get_int("ea_stats.tokens"));
  if (q.n_layer < 1 || q.n_head < 1 || q.head_dim < 1)
    throw Error(fmt::format("{}: bad statistics shape ({} layers, {} heads, head_dim {})", path, q.n_layer, q.n_head,
                            q.head_dim));
  const int64_t m = int64_t(q.n_layer) * q.n_head * q.head_dim;
  const TensorInfo& a = f->tensor("ea_stats.mean");
  const TensorInfo& c = f->tensor("ea_stats.cov");
  if (a.nelements() != m || c.nelements() != m * q.head_dim)
    throw Error(fmt::format("{}: ea_stats.mean / ea_stats.cov have {} / {} values, expected {} / {}", path,
                            a.nelements(), c.nelements(), m, m * q.head_dim));
  q.mean = f->tensor_f32(a);
  q.cov = f->tensor_f32(c);
  return q;
}

void QueryStatsFile::check(const HParams& hp, const std::string& what) const {
  if (n_layer != hp.n_layer || n_head != hp.n_head || head_dim != hp.head_dim)
    throw Error(fmt::format("{}: statistics for {} layers x {} query heads x head_dim {} do not fit the model ({} x {} "
                            "x {})",
                            what, n_layer, n_head, head_dim, hp.n_layer, hp.n_head, hp.head_dim));
}

}  // namespace kvslim
