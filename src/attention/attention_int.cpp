// Integer-product attention for q8_0 and q4_0 caches (attention_int.h): the query rounding, the
// expansion of a tile's codes into int16 pairs, and the choice of the products' level. The
// expansions run on every level from AVX2 up (integer shuffles, exact), the products in
// attention_int_{avx2,avxvnni}.cpp.
#include "attention/attention_int.h"

#include "kernels/intrinsics.h"

#include <cmath>
#include <cstring>
#include <type_traits>

#include "kernels/quant_dot.h"
#include "kv/store.h"

namespace kvslim::attn {

#define KV_LEVEL_DECLS                                                                 \
  void scores(const PairData& pd, const int16_t* Qs, const float* sq, int hd, float* ST); \
  void values(const PairData& pd, const float* ST, int rows, int hd, float* O);
namespace int_avx2 {
KV_LEVEL_DECLS
}
namespace int_avxvnni {
KV_LEVEL_DECLS
}
#undef KV_LEVEL_DECLS

bool int_codec(KVCodec c) { return c == KVCodec::Q8_0 || c == KVCodec::Q4_0; }

void quantize_queries(const float* Q, int rows, int rows8, int hd, int16_t* Qs, float* sq) {
  for (int r = 0; r < rows; ++r) {
    const float* q = Q + static_cast<size_t>(r) * hd;
    int16_t* o = Qs + static_cast<size_t>(r) * hd;
    float amax = 0;
    bool nan = false;  // fmax skips NaNs
    for (int d = 0; d < hd; ++d) {
      amax = std::fmax(amax, std::fabs(q[d]));
      nan = nan || std::isnan(q[d]);
    }
    const bool finite = !nan && std::isfinite(amax);
    if (!finite || amax == 0) {
      std::memset(o, 0, hd * sizeof(int16_t));
      sq[r] = finite ? 0.0f : NAN;
      continue;
    }
    // In double: for a subnormal amax, 32767 / amax overflows a float (and the cast of inf to
    // int16 is undefined), while |q[d] * inv| <= 32767 holds in double.
    const double inv = 32767.0 / amax;
    for (int d = 0; d < hd; ++d) o[d] = static_cast<int16_t>(std::nearbyint(q[d] * inv));
    sq[r] = amax / 32767.0f;
  }
  if (rows8 > rows) {
    std::memset(Qs + static_cast<size_t>(rows) * hd, 0, static_cast<size_t>(rows8 - rows) * hd * sizeof(int16_t));
    for (int r = rows; r < rows8; ++r) sq[r] = 0.0f;
  }
}

namespace {

#define KV_AVX2_FN __attribute__((target("avx2,fma,f16c")))

// 16 f16 scales -> f32.
KV_AVX2_FN inline void scales16(const uint8_t* h, float* out) {
  _mm256_storeu_ps(out, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h))));
  _mm256_storeu_ps(out + 8, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + 16))));
}

// Two rows of 16 int8 codes a, b -> int16 pairs (a[j], b[j]) for j < 8 at out, j >= 8 at out + 16.
KV_AVX2_FN inline void interleave16(__m128i a, __m128i b, int16_t* out) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(a, b)));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 16), _mm256_cvtepi8_epi16(_mm_unpackhi_epi8(a, b)));
}

KV_AVX2_FN inline float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

}  // namespace

KV_AVX2_FN void expand_keys(const KVStore& st, size_t b, int hd, int16_t* kp, float* dk) {
  const KVCodec c = st.key_codec();
  const int qb = codec_block(c, hd), nb = hd / qb;
  const uint8_t* tile = st.row_key_tile(b);
  for (int i = 0; i < nb; ++i) scales16(tile + i * 32, dk + i * 16);
  const uint8_t* codes = tile + nb * kKVTile * 2;
  // The codec is chosen once, outside the loop (Q4: std::true_type for q4_0).
  auto expand = [&](auto q4) __attribute__((always_inline)) {
    constexpr bool Q4 = decltype(q4)::value;
    for (int p = 0; p < hd / 2; ++p)
      interleave16(key_codes_i8<Q4>(codes, 2 * p), key_codes_i8<Q4>(codes, 2 * p + 1), kp + p * 32);
  };
  if (c == KVCodec::Q8_0) expand(std::false_type{});
  else expand(std::true_type{});
}

KV_AVX2_FN void expand_values(const KVStore& st, size_t b, size_t e, int hd, int e0, int16_t* vp, float* dv) {
  const KVCodec c = st.value_codec();
  const int qb = codec_block(c, hd), nb = hd / qb;
  const int n = static_cast<int>(e - b);
  const size_t bb = 2 + (c == KVCodec::Q8_0 ? qb : qb / 2);  // bytes per block
  const uint8_t* rows = st.row_values(b);
  const size_t stride = st.value_row_bytes();
  // The codec is chosen once, outside the loops (Q4: std::true_type for q4_0).
  auto expand = [&](auto q4) __attribute__((always_inline)) {
    constexpr bool Q4 = decltype(q4)::value;
    for (int j = 0; j < kKVTile; j += 2) {
      // Entries past the block's end read as zero codes with a zero scale.
      const uint8_t* ra = j < n ? rows + j * stride : nullptr;
      const uint8_t* rb = j + 1 < n ? rows + (j + 1) * stride : nullptr;
      int16_t* o = vp + static_cast<size_t>((e0 + j) / 2) * hd * 2;
      for (int bl = 0; bl < nb; ++bl) {
        const uint8_t* ba = ra ? ra + bl * bb : nullptr;
        const uint8_t* bbk = rb ? rb + bl * bb : nullptr;
        dv[bl * 32 + e0 + j] = ba ? f16_at(ba) : 0.0f;
        dv[bl * 32 + e0 + j + 1] = bbk ? f16_at(bbk) : 0.0f;
        for (int c0 = 0; c0 < qb; c0 += 16)
          interleave16(ba ? value_codes_i8<Q4>(ba, qb, c0) : _mm_setzero_si128(),
                       bbk ? value_codes_i8<Q4>(bbk, qb, c0) : _mm_setzero_si128(), o + (bl * qb + c0) * 2);
      }
    }
  };
  if (c == KVCodec::Q8_0) expand(std::false_type{});
  else expand(std::true_type{});
}

void scores_int(const PairData& pd, const int16_t* Qs, const float* sq, int hd, float* ST) {
  switch (qdot::level()) {
    case qdot::Level::AVXVNNI: return int_avxvnni::scores(pd, Qs, sq, hd, ST);
    default: return int_avx2::scores(pd, Qs, sq, hd, ST);
  }
}

void values_int(const PairData& pd, const float* ST, int rows, int hd, float* O) {
  switch (qdot::level()) {
    case qdot::Level::AVXVNNI: return int_avxvnni::values(pd, ST, rows, hd, O);
    default: return int_avx2::values(pd, ST, rows, hd, O);
  }
}

}  // namespace kvslim::attn
