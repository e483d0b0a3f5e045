// Random-weight GGUF models with real models' shapes. Shapes and conventions follow the
// models' HF configs and llama.cpp's converter (convert_hf_to_gguf.py) and quantizer
// (llama-quant.cpp: llama_tensor_get_type), read as references; the code is our own.
#include "kvslim/synth.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include <fmt/format.h>

#include "kernels/threads.h"
#include "kvslim/error.h"
#include "kvslim/gguf.h"

namespace kvslim {

const std::vector<SynthShape>& synth_shapes() {
  static const std::vector<SynthShape> shapes = [] {
    std::vector<SynthShape> v;
    SynthShape s;
    s.name = "tinyllama-1.1b";
    s.display_name = "TinyLlama 1.1B (kvslim synth: random weights)";
    s.arch = "llama";
    s.n_ctx_train = 2048, s.n_embd = 2048, s.n_ff = 5632, s.n_layer = 22, s.n_head = 32, s.n_head_kv = 4;
    s.head_dim = 64, s.rope_freq_base = 10000.0f, s.rms_eps = 1e-5f;
    v.push_back(s);

    s = SynthShape();
    s.name = "llama-3.2-1b";
    s.display_name = "Llama 3.2 1B (kvslim synth: random weights)";
    s.arch = "llama";
    s.n_ctx_train = 131072, s.n_embd = 2048, s.n_ff = 8192, s.n_layer = 16, s.n_head = 32, s.n_head_kv = 8;
    s.head_dim = 64, s.rope_freq_base = 500000.0f, s.rms_eps = 1e-5f;
    s.tied_embeddings = true;
    s.llama3_factor = 32, s.llama3_low_freq_factor = 1, s.llama3_high_freq_factor = 4, s.llama3_original_ctx = 8192;
    v.push_back(s);

    s = SynthShape();
    s.name = "qwen2.5-0.5b";
    s.display_name = "Qwen2.5 0.5B (kvslim synth: random weights)";
    s.arch = "qwen2";
    s.n_ctx_train = 32768, s.n_embd = 896, s.n_ff = 4864, s.n_layer = 24, s.n_head = 14, s.n_head_kv = 2;
    s.head_dim = 64, s.rope_freq_base = 1000000.0f, s.rms_eps = 1e-6f;
    s.tied_embeddings = true, s.qkv_bias = true;
    v.push_back(s);
    return v;
  }();
  return shapes;
}

const SynthShape& synth_shape(const std::string& name) {
  std::string known;
  for (const SynthShape& s : synth_shapes()) {
    if (s.name == name) return s;
    known += (known.empty() ? "" : ", ") + s.name;
  }
  throw Error(fmt::format("unknown shape '{}' (SynthOptions::shape; known: {})", name, known));
}

const std::vector<SynthFileType>& synth_file_types() {
  // general.file_type values are llama.cpp's LLAMA_FTYPE enumeration.
  static const std::vector<SynthFileType> types = {
      {"f32", 0, GGMLType::F32},   {"f16", 1, GGMLType::F16},    {"bf16", 32, GGMLType::BF16},
      {"q8_0", 7, GGMLType::Q8_0}, {"q4_0", 2, GGMLType::Q4_0},  {"q4_k_m", 15, GGMLType::Q4_K},
      {"q6_k", 18, GGMLType::Q6_K},
  };
  return types;
}

const SynthFileType& synth_file_type(const std::string& name) {
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  std::string known;
  for (const SynthFileType& t : synth_file_types()) {
    if (t.name == lower) return t;
    known += (known.empty() ? "" : ", ") + t.name;
  }
  throw Error(fmt::format("unknown weight type '{}' (SynthOptions::type; known: {})", name, known));
}

namespace {

bool is_quantized(GGMLType t) { return t != GGMLType::F32 && t != GGMLType::F16 && t != GGMLType::BF16; }

int64_t block_size(GGMLType t) { return type_traits(t)->block_size; }

bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

// llama.cpp's choice of layers that get more bits in the K-quant mixes.
bool use_more_bits(int i_layer, int n_layers) {
  return i_layer < n_layers / 8 || i_layer >= 7 * n_layers / 8 || (i_layer - n_layers / 8) % 3 == 2;
}

}  // namespace

GGMLType synth_tensor_type(const SynthFileType& ft, const std::string& name, int64_t ne0, int layer, int n_layer,
                           bool has_output) {
  GGMLType t = ft.base;
  if (!is_quantized(t)) return t;  // llama.cpp applies its mix rules only to quantized file types
  const bool q4_k_m = ft.llama_ftype == 15;
  if (name == "output.weight" || (!has_output && name == "token_embd.weight")) {
    if (ne0 % block_size(t) != 0) t = GGMLType::Q8_0;
    else if (t != GGMLType::Q8_0) t = GGMLType::Q6_K;
  } else if (contains(name, "attn_v.weight")) {
    if (q4_k_m && use_more_bits(layer, n_layer)) t = GGMLType::Q6_K;
  } else if (contains(name, "ffn_down")) {
    if (q4_k_m && use_more_bits(layer, n_layer)) t = GGMLType::Q6_K;
  }
  if (ne0 % block_size(t) != 0) {  // llama.cpp's fallback for rows that do not fill a super-block
    switch (t) {
      case GGMLType::Q4_K: t = GGMLType::Q5_0; break;
      case GGMLType::Q5_K: t = GGMLType::Q5_1; break;
      case GGMLType::Q6_K: t = GGMLType::Q8_0; break;
      default: break;
    }
    if (ne0 % block_size(t) != 0) t = GGMLType::F16;
  }
  return t;
}

std::vector<float> llama3_rope_factors(int head_dim, float freq_base, float factor, float low_freq_factor,
                                       float high_freq_factor, int original_ctx) {
  // float32 throughout, in the converter's order of operations, so the tensor matches its bytes.
  const float two_pi = static_cast<float>(2.0 * M_PI);
  const float old_ctx = static_cast<float>(original_ctx);
  const float low_freq_wavelen = static_cast<float>(double(original_ctx) / low_freq_factor);
  const float high_freq_wavelen = static_cast<float>(double(original_ctx) / high_freq_factor);
  std::vector<float> out;
  for (int i = 0; i < head_dim; i += 2) {
    const float freq = 1.0f / std::pow(freq_base, static_cast<float>(i) / static_cast<float>(head_dim));
    const float wavelen = two_pi / freq;
    if (wavelen < high_freq_wavelen) {
      out.push_back(1.0f);
    } else if (wavelen > low_freq_wavelen) {
      out.push_back(factor);
    } else {
      const float smooth = (old_ctx / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
      out.push_back(1.0f / ((1.0f - smooth) / factor + smooth));
    }
  }
  return out;
}

namespace {

uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// Approximately normal(0, sigma): the sum of four 16-bit uniforms (Irwin-Hall, variance 4/12 of
// the unit range) is cheap next to quantization and bounded, which keeps activations tame.
void fill_normalish(float* x, int64_t n, uint64_t seed, float sigma) {
  const float scale = sigma * std::sqrt(3.0f) / 65536.0f;
  uint64_t s = seed;
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t r = splitmix64(s);
    const int64_t sum = int64_t(r & 0xFFFF) + int64_t((r >> 16) & 0xFFFF) + int64_t((r >> 32) & 0xFFFF) +
                        int64_t(r >> 48) - 2 * 65535;
    x[i] = scale * static_cast<float>(sum);
  }
}

enum class Fill { Normal, Ones, Given };

struct Planned {
  std::string name;
  std::vector<int64_t> ne;
  GGMLType type;
  Fill fill;
  std::vector<float> given;  // Fill::Given
};

}  // namespace

SynthResult synth_model(const SynthOptions& opt, const SynthProgress& progress) {
  const auto t0 = std::chrono::steady_clock::now();
  const SynthShape& sh = synth_shape(opt.shape);
  const SynthFileType& ft = synth_file_type(opt.type);
  if (opt.layers < 0 || opt.layers > sh.n_layer)
    throw Error(fmt::format("SynthOptions::layers {} is out of range for {} (1 to {}, or 0 for all)", opt.layers, sh.name,
                            sh.n_layer));
  if (opt.output.empty()) throw Error("no output file (SynthOptions::output)");
  const int n_layer = opt.layers > 0 ? opt.layers : sh.n_layer;

  auto vocab = GGUFFile::open(opt.vocab_from);
  const GGUFValue* tokens = vocab->find("tokenizer.ggml.tokens");
  if (!tokens || tokens->type != GGUFValueType::ARRAY || tokens->elem_type != GGUFValueType::STRING ||
      tokens->strings.empty())
    throw Error(fmt::format("{}: the vocabulary file (SynthOptions::vocab_from) has no tokenizer.ggml.tokens string array", opt.vocab_from));
  const int64_t n_vocab = static_cast<int64_t>(tokens->strings.size());

  const std::string a = sh.arch + ".";
  GGUFWriter w;
  w.set("general.architecture", GGUFValue::str(sh.arch));
  w.set("general.type", GGUFValue::str("model"));
  w.set("general.name", GGUFValue::str(sh.display_name));
  w.set("general.description",
        GGUFValue::str(fmt::format("random weights with the shape of {} (kvslim synth, seed {}); not a trained "
                                   "model",
                                   sh.name, opt.seed)));
  w.set(a + "context_length", GGUFValue::u32(sh.n_ctx_train));
  w.set(a + "embedding_length", GGUFValue::u32(sh.n_embd));
  w.set(a + "block_count", GGUFValue::u32(n_layer));
  w.set(a + "feed_forward_length", GGUFValue::u32(sh.n_ff));
  w.set(a + "attention.head_count", GGUFValue::u32(sh.n_head));
  w.set(a + "attention.head_count_kv", GGUFValue::u32(sh.n_head_kv));
  w.set(a + "rope.freq_base", GGUFValue::f32(sh.rope_freq_base));
  w.set(a + "attention.layer_norm_rms_epsilon", GGUFValue::f32(sh.rms_eps));
  w.set(a + "attention.key_length", GGUFValue::u32(sh.head_dim));
  w.set(a + "attention.value_length", GGUFValue::u32(sh.head_dim));
  w.set(a + "rope.dimension_count", GGUFValue::u32(sh.head_dim));
  w.set(a + "vocab_size", GGUFValue::u32(static_cast<uint32_t>(n_vocab)));
  w.set("general.file_type", GGUFValue::u32(ft.llama_ftype));
  w.set("general.quantization_version", GGUFValue::u32(2));
  w.set("general.alignment", GGUFValue::u32(32));
  for (const auto& [key, value] : vocab->metadata())
    if (key.rfind("tokenizer.", 0) == 0) w.set(key, value);

  // The tensor plan, in the converter's order (extra tensors first, then the model's).
  const bool has_output = !sh.tied_embeddings;
  const int64_t d = sh.n_embd, dq = int64_t(sh.n_head) * sh.head_dim, dkv = int64_t(sh.n_head_kv) * sh.head_dim;
  std::vector<Planned> plan;
  auto weight = [&](const std::string& name, int64_t ne0, int64_t ne1, int layer) {
    plan.push_back({name, {ne0, ne1}, synth_tensor_type(ft, name, ne0, layer, n_layer, has_output), Fill::Normal, {}});
  };
  auto vec = [&](const std::string& name, int64_t n, Fill fill) {
    plan.push_back({name, {n}, GGMLType::F32, fill, {}});
  };
  if (sh.llama3_factor > 0) {
    vec("rope_freqs.weight", sh.head_dim / 2, Fill::Given);
    plan.back().given = llama3_rope_factors(sh.head_dim, sh.rope_freq_base, sh.llama3_factor,
                                            sh.llama3_low_freq_factor, sh.llama3_high_freq_factor,
                                            sh.llama3_original_ctx);
  }
  weight("token_embd.weight", d, n_vocab, -1);
  for (int l = 0; l < n_layer; ++l) {
    const std::string p = fmt::format("blk.{}.", l);
    vec(p + "attn_norm.weight", d, Fill::Ones);
    weight(p + "attn_q.weight", d, dq, l);
    if (sh.qkv_bias) vec(p + "attn_q.bias", dq, Fill::Normal);
    weight(p + "attn_k.weight", d, dkv, l);
    if (sh.qkv_bias) vec(p + "attn_k.bias", dkv, Fill::Normal);
    weight(p + "attn_v.weight", d, dkv, l);
    if (sh.qkv_bias) vec(p + "attn_v.bias", dkv, Fill::Normal);
    weight(p + "attn_output.weight", dq, d, l);
    vec(p + "ffn_norm.weight", d, Fill::Ones);
    weight(p + "ffn_gate.weight", d, sh.n_ff, l);
    weight(p + "ffn_up.weight", d, sh.n_ff, l);
    weight(p + "ffn_down.weight", sh.n_ff, d, l);
  }
  vec("output_norm.weight", d, Fill::Ones);
  if (has_output) weight("output.weight", d, n_vocab, -1);

  SynthResult res;
  res.n_tensors = plan.size();
  res.n_vocab = static_cast<int>(n_vocab);
  res.n_layer = n_layer;
  for (const Planned& t : plan) {
    w.add_tensor_deferred(t.name, t.type, t.ne);
    ++res.tensors_per_type[type_name(t.type)];
  }

  const float sigma = 0.02f;
  const std::string part = opt.output + ".part";
  try {
    w.write_streaming(part, [&](size_t i, std::string& out) {
      const Planned& t = plan[i];
      if (progress) progress(i, plan.size(), t.name, t.type);
      const int64_t cols = t.ne[0];
      const int64_t rows = t.ne.size() > 1 ? t.ne[1] : 1;
      const size_t rb = row_bytes(t.type, cols);
      out.resize(rb * static_cast<size_t>(rows));
      const uint64_t tensor_seed = opt.seed ^ fnv1a(t.name);
      parallel_for(rows, [&](int64_t r0, int64_t r1) {
        std::vector<float> row(static_cast<size_t>(cols));
        for (int64_t r = r0; r < r1; ++r) {
          switch (t.fill) {
            case Fill::Ones: std::fill(row.begin(), row.end(), 1.0f); break;
            case Fill::Given: std::copy(t.given.begin(), t.given.end(), row.begin()); break;
            case Fill::Normal: {
              uint64_t s = tensor_seed + static_cast<uint64_t>(r);
              fill_normalish(row.data(), cols, splitmix64(s), sigma);
              break;
            }
          }
          quantize_row(t.type, row.data(), out.data() + static_cast<size_t>(r) * rb, cols);
        }
      });
    });
    std::filesystem::rename(part, opt.output);
  } catch (const std::filesystem::filesystem_error& e) {
    std::remove(part.c_str());
    throw Error(fmt::format("{}: cannot write: {}", opt.output, e.what()));
  } catch (...) {
    std::remove(part.c_str());
    throw;
  }
  res.file_bytes = std::filesystem::file_size(opt.output);
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

}  // namespace kvslim
