#include "model/numeric_guard.h"

#include <cfloat>
#include <cmath>

#include <fmt/format.h>

#include "kvslim/error.h"

namespace kvslim {

bool all_finite(const float* x, size_t n) {
  // A branch-free reduction the compiler vectorizes; NaN fails the comparison.
  bool ok = true;
  for (size_t i = 0; i < n; ++i) ok &= std::fabs(x[i]) <= FLT_MAX;
  return ok;
}

namespace {

// Largest |value| among x[0, n) (finite ones).
float max_abs(const float* x, size_t n) {
  float m = 0;
  for (size_t i = 0; i < n; ++i)
    if (std::isfinite(x[i])) m = std::max(m, std::fabs(x[i]));
  return m;
}

}  // namespace

void check_layer_finite(const float* x, size_t n, int layer, const float* k, const float* v, int n_tokens,
                        const KVCache& cache, const std::vector<size_t>& n_old) {
  if (all_finite(x, n)) return;
  const int nkv = cache.n_head_kv();
  const Segment& s0 = cache.seg(layer, 0);
  const int hd = s0.head_dim();
  const size_t nkvals = static_cast<size_t>(n_tokens) * nkv * hd;
  if (!all_finite(k, nkvals) || !all_finite(v, nkvals))
    throw Error(fmt::format("numeric overflow in layer {}: the keys or values of this batch are not finite "
                            "(the model's weights or its input overflow float32)",
                            layer));
  std::vector<float> row(hd);
  for (int h = 0; h < nkv; ++h) {
    const Segment& s = cache.seg(layer, h);
    for (size_t i = n_old[h]; i < s.size(); ++i) {
      s.key(i, row.data());
      const bool key_bad = !all_finite(row.data(), hd);
      s.value(i, row.data());
      if (key_bad || !all_finite(row.data(), hd)) {
        const char* what = key_bad ? "key" : "value";
        const KVCodec c = key_bad ? s.key_codec() : s.value_codec();
        const float big = max_abs(key_bad ? k : v, nkvals);
        throw Error(fmt::format("numeric overflow in layer {}: a {} (largest |{}| in the batch {:g}) does not fit "
                                "the {} cache; use a wider cache type: {} f32 (or bf16)",
                                layer, what, what, big, codec_name(c),
                                key_bad ? "cache_type_k" : "cache_type_v"));
      }
    }
  }
  throw Error(fmt::format("numeric overflow in layer {}: the hidden states hold NaN or inf", layer));
}

void check_entry_fits(const Segment& s, const float* k, const float* v, int layer) {
  float big = 0;
  const char* what = s.check_fit(k, v, &big);
  if (!what) return;
  const bool key = what[0] == 'k';
  if (!(big <= FLT_MAX))
    throw Error(fmt::format("numeric overflow in layer {}: a {} of this batch is not finite (the model's weights or "
                            "its input overflow float32)",
                            layer, what));
  const KVCodec c = key ? s.key_codec() : s.value_codec();
  throw Error(fmt::format("numeric overflow in layer {}: a {} (largest |{}| {:g}) does not fit the {}{} cache; use a "
                          "wider cache type: {} f32 (or bf16)",
                          layer, what, what, big, codec_name(c), s.quant().kivi_bits ? " KIVI" : "",
                          key ? "cache_type_k" : "cache_type_v"));
}

void check_logits_finite(const float* logits, size_t n) {
  if (!all_finite(logits, n))
    throw Error("numeric overflow in the output layer: the logits hold NaN or inf");
}

}  // namespace kvslim
