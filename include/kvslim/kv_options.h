#pragma once
// How a request's KV cache stores its entries and how its session runs: the row codecs (llama.cpp's
// --cache-type names), KIVI codes and the key rotation, the context size and the prefill batch. The
// cache itself is internal; a request reports what it holds (RequestStats).
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace kvslim {

/// Row codec of keys or values. Q8_0 / Q4_0 use ggml's blocks of 32 values along head_dim (one
/// f16 scale per block; q4_0's codes are offset by 8); where head_dim is not a multiple of 32 the
/// block is gcd(32, head_dim) values (8 for a head_dim of 8), with the same rounding. Q2_1: 2-bit
/// asymmetric codes with an f16 step and minimum per block (LeanKV's K4V2 low tier; src/kv/codec_q2_1.cpp).
enum class KVCodec { F32, F16, BF16, Q8_0, Q4_0, Q2_1 };

/// Parses llama.cpp's --cache-type names: "f32", "f16", "bf16", "q8_0", "q4_0", and "q2_1". Other names
/// (including llama.cpp types this engine does not store, like q4_1) throw kvslim::Error naming
/// the value and listing the supported ones.
KVCodec parse_codec(const std::string& name);
const char* codec_name(KVCodec c);
/// True for q8_0, q4_0 and q2_1.
bool codec_is_quantized(KVCodec c);
/// Values per quantization block along head_dim: 1 for f32/f16/bf16, gcd(32, head_dim) otherwise.
int codec_block(KVCodec c, int head_dim);
/// Bytes one row of `head_dim` values takes in codec `c`, scales included.
size_t codec_row_bytes(KVCodec c, int head_dim);

/// Quantization options on top of the row codecs.
struct KVQuantOptions {
  int kivi_bits = 0;        ///< 0 = KIVI off; else 2 or 4 bits per key and value code
  int kivi_group = 32;      ///< G: tokens per key group, channels per value group
  int kivi_residual = 128;  ///< R: newest entries kept in the full-precision row codec
  bool hadamard = false;    ///< rotate keys (and, inside attention, queries) before storing
};

/// Checks a cache configuration independently of the model; throws kvslim::Error naming the
/// parameters (kivi_bits, cache_type_k, ...: the CLI maps them to its flags) for: KIVI bits other than 0/2/4, a group < 1, a residual < 0, KIVI with a
/// quantized row codec (its residual window must be f32, f16 or bf16).
void validate_cache_config(KVCodec key, KVCodec value, const KVQuantOptions& q);
/// The model-dependent part: head_dim must allow the KIVI groups (head_dim a multiple of
/// min(G, head_dim) and of 4). Throws kvslim::Error naming the values.
void validate_cache_config(KVCodec key, KVCodec value, const KVQuantOptions& q, int head_dim);
/// One-line summary, e.g. "k=q8_0 v=q4_0" or "kivi4 G=32 R=128 (residual k=f16 v=f16), hadamard".
std::string describe_cache_config(KVCodec key, KVCodec value, const KVQuantOptions& q);

/// Options of a session.
struct SessionOptions {
  int n_ctx = 0;                       ///< max positions; 0 = the model's training context
  KVCodec key_codec = KVCodec::F16;
  KVCodec value_codec = KVCodec::F16;
  KVQuantOptions kv_quant;             ///< KIVI and key rotation (above)
  bool exact = false;                  ///< f32 products everywhere (reference-logit tests)
  int batch = 256;                     ///< tokens per forward batch during prefill
  /// Called after every forward batch with next_position(): progress lines during a long prefill.
  std::function<void(int32_t next_position)> on_batch_done;
  /// The same, with the cache's bytes after the batch (KVCache::bytes): progress lines that show
  /// the memory the cache holds now.
  std::function<void(int32_t next_position, size_t kv_bytes)> on_batch_bytes;
};

}  // namespace kvslim
