// Codec names, sizes, configuration checks, and dispatch of the per-codec tile and row functions.
#include <cstring>
#include <numeric>

#include <fmt/format.h>

#include "kv/codec.h"

namespace kvslim {

KVCodec parse_codec(const std::string& name) {
  if (name == "f32") return KVCodec::F32;
  if (name == "f16") return KVCodec::F16;
  if (name == "bf16") return KVCodec::BF16;
  if (name == "q8_0") return KVCodec::Q8_0;
  if (name == "q4_0") return KVCodec::Q4_0;
  if (name == "q2_1") return KVCodec::Q2_1;
  if (name == "q4_1" || name == "q5_0" || name == "q5_1" || name == "iq4_nl")
    throw Error(fmt::format("KV cache type '{}' is a llama.cpp type kvslim does not store (supported: f32, f16, "
                            "bf16, q8_0, q4_0, q2_1; for 2- or 4-bit caches see KIVI, kivi_bits)",
                            name));
  throw Error(fmt::format("unknown KV cache type '{}' (expected f32, f16, bf16, q8_0, q4_0 or q2_1)", name));
}

const char* codec_name(KVCodec c) {
  switch (c) {
    case KVCodec::F32: return "f32";
    case KVCodec::F16: return "f16";
    case KVCodec::BF16: return "bf16";
    case KVCodec::Q8_0: return "q8_0";
    case KVCodec::Q4_0: return "q4_0";
    case KVCodec::Q2_1: return "q2_1";
  }
  return "?";
}

bool codec_is_quantized(KVCodec c) { return c == KVCodec::Q8_0 || c == KVCodec::Q4_0 || c == KVCodec::Q2_1; }

int codec_block(KVCodec c, int head_dim) { return codec_is_quantized(c) ? std::gcd(32, head_dim) : 1; }

size_t codec_row_bytes(KVCodec c, int hd) {
  switch (c) {
    case KVCodec::F32: return hd * sizeof(float);
    case KVCodec::F16:
    case KVCodec::BF16: return hd * sizeof(uint16_t);
    case KVCodec::Q8_0: return hd / codec_block(c, hd) * 2 + hd;
    case KVCodec::Q4_0: return hd / codec_block(c, hd) * 2 + hd / 2;
    case KVCodec::Q2_1: return hd / codec_block(c, hd) * 4 + (hd + 3) / 4;
  }
  return 0;
}

void validate_cache_config(KVCodec key, KVCodec value, const KVQuantOptions& q) {
  if (q.kivi_bits != 0 && q.kivi_bits != 2 && q.kivi_bits != 4)
    throw Error(fmt::format("kivi_bits {} is not supported (expected 2 or 4; 0 = off)", q.kivi_bits));
  if (q.kivi_group < 1) throw Error(fmt::format("kivi_group {} must be >= 1", q.kivi_group));
  if (q.kivi_residual < 0) throw Error(fmt::format("kivi_residual {} must be >= 0", q.kivi_residual));
  if (q.kivi_bits != 0 && (codec_is_quantized(key) || codec_is_quantized(value)))
    throw Error(fmt::format("kivi_bits {} keeps its residual window in full precision: cache_type_k and "
                            "cache_type_v must be f32, f16 or bf16 with KIVI (got k={} v={})",
                            q.kivi_bits, codec_name(key), codec_name(value)));
}

void validate_cache_config(KVCodec key, KVCodec value, const KVQuantOptions& q, int hd) {
  validate_cache_config(key, value, q);
  if (hd < 2 || hd % 2) throw Error(fmt::format("KV cache: head_dim {} must be even", hd));
  if (q.kivi_bits) {
    const int gv = std::min(q.kivi_group, hd);
    if (hd % gv)
      throw Error(fmt::format("kivi_group {}: values are quantized per token over groups of {} channels, "
                              "which must divide head_dim {}",
                              q.kivi_group, gv, hd));
    if (hd % 4)
      throw Error(fmt::format("KIVI needs head_dim to be a multiple of 4 (got {})", hd));
  }
}

std::string describe_cache_config(KVCodec key, KVCodec value, const KVQuantOptions& q) {
  std::string s;
  if (q.kivi_bits)
    s = fmt::format("kivi{} G={} R={} (residual k={} v={})", q.kivi_bits, q.kivi_group, q.kivi_residual,
                    codec_name(key), codec_name(value));
  else
    s = fmt::format("k={} v={}", codec_name(key), codec_name(value));
  if (q.hadamard) s += ", hadamard-rotated keys";
  return s;
}

namespace kv {

void tile_put(KVCodec c, int hd, uint8_t* tile, int lane, const float* k) {
  switch (c) {
    case KVCodec::Q8_0: return q8_0_tile_put(hd, tile, lane, k);
    case KVCodec::Q4_0: return q4_0_tile_put(hd, tile, lane, k);
    case KVCodec::Q2_1: return q2_1_tile_put(hd, tile, lane, k);
    default: return float_tile_put(c, hd, tile, lane, k);
  }
}

void tile_get(KVCodec c, int hd, const uint8_t* tile, int lane, float* out) {
  switch (c) {
    case KVCodec::Q8_0: return q8_0_tile_get(hd, tile, lane, out);
    case KVCodec::Q4_0: return q4_0_tile_get(hd, tile, lane, out);
    case KVCodec::Q2_1: return q2_1_tile_get(hd, tile, lane, out);
    default: return float_tile_get(c, hd, tile, lane, out);
  }
}

void tile_decode(KVCodec c, int hd, const uint8_t* tile, float* kt) {
  switch (c) {
    case KVCodec::Q8_0: return q8_0_tile_decode(hd, tile, kt);
    case KVCodec::Q4_0: return q4_0_tile_decode(hd, tile, kt);
    case KVCodec::Q2_1: return q2_1_tile_decode(hd, tile, kt);
    default: return float_tile_decode(c, hd, tile, kt);
  }
}

void tile_move(KVCodec c, int hd, uint8_t* dtile, int dlane, const uint8_t* stile, int slane) {
  switch (c) {
    case KVCodec::Q8_0: return q8_0_tile_move(hd, dtile, dlane, stile, slane);
    case KVCodec::Q4_0: return q4_0_tile_move(hd, dtile, dlane, stile, slane);
    case KVCodec::Q2_1: return q2_1_tile_move(hd, dtile, dlane, stile, slane);
    default: {
      const size_t es = codec_row_bytes(c, hd) / hd;  // bytes per element
      for (int d = 0; d < hd; ++d)
        std::memcpy(dtile + (static_cast<size_t>(d) * kKVTile + dlane) * es,
                    stile + (static_cast<size_t>(d) * kKVTile + slane) * es, es);
    }
  }
}

void row_encode(KVCodec c, int hd, const float* x, uint8_t* dst) {
  switch (c) {
    case KVCodec::Q8_0: return q8_0_row_encode(hd, x, dst);
    case KVCodec::Q4_0: return q4_0_row_encode(hd, x, dst);
    case KVCodec::Q2_1: return q2_1_row_encode(hd, x, dst);
    default: return float_row_encode(c, hd, x, dst);
  }
}

void rows_decode(KVCodec c, int hd, const uint8_t* src, float* out, size_t n) {
  switch (c) {
    case KVCodec::Q8_0: return q8_0_rows_decode(hd, src, out, n);
    case KVCodec::Q4_0: return q4_0_rows_decode(hd, src, out, n);
    case KVCodec::Q2_1: return q2_1_rows_decode(hd, src, out, n);
    default: return float_rows_decode(c, src, out, n * hd);
  }
}

}  // namespace kv
}  // namespace kvslim
