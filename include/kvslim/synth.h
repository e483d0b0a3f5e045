#pragma once
// Random-weight models with the exact shape of real ones (`kvslim synth`): benchmarks and tests
// at real scale without downloading weights. The files follow llama.cpp's GGUF conventions (key
// names, tensor names and shapes, LLAMA_FTYPE numbers, the Q4_K_M type mix), so llama.cpp and
// kvslim load them like converted models. The weights are noise: the text they produce is too.
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "kvslim/quant.h"

namespace kvslim {

/// Architecture facts of a real model, as its GGUF carries them.
struct SynthShape {
  std::string name;          ///< command-line name, e.g. "tinyllama-1.1b"
  std::string display_name;  ///< general.name
  std::string arch;          ///< "llama" or "qwen2"
  int n_ctx_train = 0;       ///< tokens
  int n_embd = 0, n_ff = 0, n_layer = 0, n_head = 0, n_head_kv = 0, head_dim = 0;
  float rope_freq_base = 10000.0f;
  float rms_eps = 1e-5f;
  bool tied_embeddings = false;  ///< no output.weight: the output projection reuses token_embd
  bool qkv_bias = false;         ///< attn_q/k/v biases (qwen2)
  /// Llama 3 RoPE scaling, stored as the `rope_freqs.weight` tensor; factor 0 = none.
  float llama3_factor = 0, llama3_low_freq_factor = 1, llama3_high_freq_factor = 4;
  int llama3_original_ctx = 8192;
};

/// The shapes `kvslim synth` knows: tinyllama-1.1b, llama-3.2-1b, qwen2.5-0.5b.
const std::vector<SynthShape>& synth_shapes();
/// Shape by name; unknown -> kvslim::Error listing the known names.
const SynthShape& synth_shape(const std::string& name);

/// A weight file type, named as llama.cpp's quantize tool names it (f32, f16, bf16, q8_0, q4_0,
/// q4_k_m, q6_k). `llama_ftype` is the value of general.file_type (llama.cpp's LLAMA_FTYPE);
/// `base` the type of most 2-D weights.
struct SynthFileType {
  std::string name;
  uint32_t llama_ftype = 0;
  GGMLType base = GGMLType::F32;
};
const std::vector<SynthFileType>& synth_file_types();
/// File type by name (case-insensitive); unknown -> kvslim::Error listing the known names.
const SynthFileType& synth_file_type(const std::string& name);

/// The type llama.cpp's quantizer (llama_tensor_get_type) gives the 2-D weight `name` with rows of
/// `ne0` elements in layer `layer` (-1 outside the blocks) of an `n_layer`-layer model:
/// output.weight (or token_embd.weight when `has_output` is false, i.e. tied) becomes q6_K
/// unless the base is q8_0; for q4_k_m, attn_v and ffn_down of the layers picked by llama.cpp's
/// use_more_bits rule (the first and last eighth, and every third in between) become q6_K; a row
/// length that is not a multiple of the chosen type's block falls back as llama.cpp does
/// (q4_K -> q5_0, q6_K -> q8_0). Unquantized file types give `base` for every weight.
GGMLType synth_tensor_type(const SynthFileType& ft, const std::string& name, int64_t ne0, int layer, int n_layer,
                           bool has_output);

/// Llama 3 RoPE frequency factors (head_dim/2 values; the rope_freqs tensor, a divisor per
/// dimension pair) computed as llama.cpp's converter does from the HF rope_scaling parameters:
/// 1 for wavelengths below original_ctx/high_freq_factor, `factor` above
/// original_ctx/low_freq_factor, a smooth blend in between (float32 arithmetic, like the
/// converter's torch code).
std::vector<float> llama3_rope_factors(int head_dim, float freq_base, float factor, float low_freq_factor,
                                       float high_freq_factor, int original_ctx);

struct SynthOptions {
  std::string shape;       ///< see synth_shapes()
  std::string type;        ///< see synth_file_types()
  std::string vocab_from;  ///< GGUF file whose tokenizer.* metadata is copied (vocab size from it)
  std::string output;      ///< path of the GGUF to write
  uint64_t seed = 42;
  int layers = 0;          ///< 0 = the shape's block count; fewer (>= 1) for small test files
};

struct SynthResult {
  size_t file_bytes = 0;
  size_t n_tensors = 0;
  int n_vocab = 0;
  int n_layer = 0;
  std::map<std::string, size_t> tensors_per_type;  ///< ggml type name -> count
  double seconds = 0;
};

/// Called before each tensor is generated: (index, count, name, type).
using SynthProgress = std::function<void(size_t, size_t, const std::string&, GGMLType)>;

/// Writes a random-weight GGUF for `opt`. Weights are approximately normal(0, 0.02) (an
/// Irwin-Hall sum of four uniforms), norm weights 1, biases normal(0, 0.02); each tensor row has
/// its own generator seeded from (seed, tensor name, row), so the file does not depend on the
/// thread count and a reduced --layers file shares its blocks with the full one. Rows are
/// generated and quantized in parallel (parallel_for) and the file is written tensor by tensor,
/// so memory stays near the largest tensor. The file is written to `output`.part and renamed at
/// the end. Throws kvslim::Error for an unknown shape or type, a bad layer count, a vocabulary
/// file without tokenizer.ggml.tokens, or an I/O failure.
SynthResult synth_model(const SynthOptions& opt, const SynthProgress& progress = nullptr);

}  // namespace kvslim
