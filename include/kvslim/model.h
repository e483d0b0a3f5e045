#pragma once
// Llama-family models (arch `llama`: Llama 2/3, Mistral, TinyLlama; arch `qwen2`) loaded from GGUF,
// with weights kept in their file type in the mapping.
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "kvslim/gguf.h"
#include "kvslim/tokenizer.h"

namespace kvslim {

struct WeightView;

/// How RoPE angles are stretched past the training context (llama.cpp's rope scaling types).
/// None keeps rope_freq_scale at 1; Linear divides positions by the factor; Yarn also blends
/// interpolation with extrapolation per dimension and scales the rotated q and k (see HParams).
enum class RopeScaling { None, Linear, Yarn };

/// Hyper-parameters read from `<arch>.*` metadata.
struct HParams {
  std::string arch;      ///< "llama" or "qwen2"
  int n_vocab = 0;
  int n_ctx_train = 0;   ///< tokens
  int n_embd = 0;
  int n_ff = 0;
  int n_layer = 0;
  int n_head = 0;        ///< query heads
  int n_head_kv = 0;     ///< KV heads (GQA: n_head / n_head_kv query heads share one)
  int head_dim = 0;
  float rms_eps = 1e-5f;
  float rope_freq_base = 10000.0f;
  float rope_freq_scale = 1.0f;  ///< 1 / context scaling factor (linear and YaRN)
  bool rope_neox = false;        ///< qwen2: rotate (i, i + d/2) pairs instead of (2i, 2i+1)
  RopeScaling rope_scaling = RopeScaling::Linear;  ///< `rope.scaling.type` (llama3 reads as linear)
  /// YaRN (arXiv 2309.00071) as ggml computes it, resolved at load (metadata, then overrides): pair
  /// i turns by base^(-2i/d) x (freq_scale (1 - m) + m) per position, m = ramp(i) x yarn_ext_factor,
  /// where ramp is 1 below the correction dimension of yarn_beta_fast rotations over
  /// yarn_orig_ctx tokens and 0 above that of yarn_beta_slow rotations. 0 = plain interpolation
  /// (the default except for rope.scaling.type = yarn, where it is 1).
  float yarn_ext_factor = 0.0f;
  /// Multiplies the rotated q and k (llama.cpp's attn_factor); when yarn_ext_factor != 0 they are
  /// also multiplied by 1 + 0.1 ln(1 / freq_scale) (YaRN's magnitude correction; 1 when freq_scale >= 1).
  float yarn_attn_factor = 1.0f;
  float yarn_beta_fast = 32.0f;  ///< rotations over yarn_orig_ctx above which a pair extrapolates
  float yarn_beta_slow = 1.0f;   ///< rotations below which a pair interpolates
  int yarn_orig_ctx = 0;         ///< tokens of the pre-extension context (`rope.scaling.original_context_length`, else n_ctx_train)
  int n_group() const { return n_head / n_head_kv; }
};

/// Weights of one transformer block. Norm weights are f32 copies (small); matrices are views.
struct LayerWeights {
  std::vector<float> attn_norm, ffn_norm;
  std::vector<float> bq, bk, bv;  ///< empty unless the model has q/k/v biases (qwen2)
  std::unique_ptr<WeightView> wq, wk, wv, wo, w_gate, w_up, w_down;
};

/// RoPE settings that replace the file's (llama.cpp's --rope-* and --yarn-* flags, same meanings);
/// an empty field keeps the file's value. Applied in llama.cpp's order: scaling None forces
/// freq_scale 1, and yarn_ext_factor < 0 means 1 for Yarn, else 0.
struct RopeOverrides {
  std::optional<RopeScaling> scaling;
  std::optional<float> freq_base;   ///< > 1
  std::optional<float> freq_scale;  ///< > 0 (1 / --rope-scale)
  std::optional<float> yarn_ext_factor, yarn_attn_factor, yarn_beta_fast, yarn_beta_slow;
  std::optional<int> yarn_orig_ctx;  ///< > 0 tokens
  bool any() const {
    return scaling || freq_base || freq_scale || yarn_ext_factor || yarn_attn_factor || yarn_beta_fast || yarn_beta_slow ||
           yarn_orig_ctx;
  }
};

/// How Model::load reads a file beyond its contents.
struct ModelLoadOptions {
  RopeOverrides rope;
};

/// A loaded model: hyper-parameters, tokenizer and weights (views into the mapped GGUF file).
class Model {
 public:
  /// Loads `path`. Throws kvslim::Error naming the file and the field for a missing/corrupt
  /// file, an unknown architecture, a missing tensor, a tensor of the wrong shape, or an
  /// unsupported tensor type. `opt.rope` replaces the file's RoPE settings before anything uses
  /// them; an out-of-range override throws kvslim::Error naming the setting and the value.
  static std::unique_ptr<Model> load(const std::string& path, const ModelLoadOptions& opt = {});
  ~Model();

  const HParams& hparams() const { return hp_; }
  const Tokenizer& tokenizer() const { return *tok_; }
  const GGUFFile& file() const { return *file_; }
  const LayerWeights& layer(int l) const { return layers_[l]; }
  const WeightView& token_embd() const { return *tok_embd_; }
  const WeightView& output() const { return *output_; }
  const std::vector<float>& output_norm() const { return output_norm_; }
  /// Per-dimension-pair RoPE frequency divisors (Llama 3.1 `rope_freqs`), empty when absent.
  const std::vector<float>& rope_freqs() const { return rope_freqs_; }
  /// Bytes of the weight tensors as stored.
  size_t weight_bytes() const { return weight_bytes_; }
  /// Name of the dominant weight type (e.g. "q8_0").
  std::string weight_type() const;
  /// XXH64 digest of every tensor's name, type, shape and bytes as stored in the file: part of a
  /// stored context's fingerprint. Computed on the first call (it reads every weight once, in
  /// parallel: a fraction of a second per GB once the file is in the page cache) and kept, so
  /// loading a model costs nothing extra. Thread-safe.
  uint64_t tensor_digest() const;
  /// XXH64 digest of the tokenizer's vocabulary: every token's stored string, BOS and EOS.
  uint64_t vocab_digest() const;

 private:
  Model() = default;
  HParams hp_;
  std::unique_ptr<GGUFFile> file_;
  std::unique_ptr<Tokenizer> tok_;
  std::vector<LayerWeights> layers_;
  std::unique_ptr<WeightView> tok_embd_, output_;
  std::vector<float> output_norm_;
  std::vector<float> rope_freqs_;
  size_t weight_bytes_ = 0;
  mutable std::once_flag digest_once_;
  mutable uint64_t tensor_digest_ = 0;
};

}  // namespace kvslim
