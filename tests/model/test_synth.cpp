// Tests of src/model/synth.cpp (`kvslim synth`): llama.cpp's Q4_K_M type mix (expected types
// derived by hand from llama.cpp's rule), the Llama 3 RoPE factors against a float64
// re-computation of the HF formula, and small (2-layer) files of every shape that the engine
// loads and runs like any model.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "kernels/packed_weights.h"
#include "kernels/threads.h"
#include "kvslim/error.h"
#include "kvslim/gguf.h"
#include "kvslim/model.h"
#include "model/session.h"
#include "kvslim/synth.h"
#include "support/files.h"

using namespace kvslim;

namespace {

const std::string kVocab = std::string(KVSLIM_SOURCE_DIR) + "/models/stories260K.gguf";

// The pid keeps names apart when ctest runs tests as parallel processes.
GGMLType type_of(const std::string& ft, const std::string& name, int64_t ne0, int layer, int n_layer,
                 bool has_output) {
  return synth_tensor_type(synth_file_type(ft), name, ne0, layer, n_layer, has_output);
}

/// Serialized form of a metadata value, to compare values of any type.
std::string serialized(const GGUFValue& v) {
  GGUFWriter w;
  w.set("k", v);
  return w.bytes();
}

template <class Fn>
void expect_error(Fn&& fn, std::initializer_list<std::string> parts) {
  try {
    fn();
    ADD_FAILURE() << "no kvslim::Error raised";
  } catch (const Error& e) {
    for (const std::string& p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << "message '" << e.what() << "' lacks '" << p << "'";
  }
}

}  // namespace

// ---- the type mix --------------------------------------------------------------------------

// llama.cpp's use_more_bits(i, n): i < n/8 || i >= 7n/8 || (i - n/8) % 3 == 2, worked out by hand:
//   n = 22: n/8 = 2, 7n/8 = 19 -> 0, 1, 19, 20, 21 and 4, 7, 10, 13, 16
//   n = 16: n/8 = 2, 7n/8 = 14 -> 0, 1, 14, 15 and 4, 7, 10, 13
//   n = 24: n/8 = 3, 7n/8 = 21 -> 0, 1, 2, 21, 22, 23 and 5, 8, 11, 14, 17, 20
//   n = 2:  n/8 = 0, 7n/8 = 1  -> 1
TEST(SynthTypes, Q4KMGivesMoreBitsToTheLayersLlamaCppPicks) {
  const std::map<int, std::set<int>> more = {
      {22, {0, 1, 4, 7, 10, 13, 16, 19, 20, 21}},
      {16, {0, 1, 4, 7, 10, 13, 14, 15}},
      {24, {0, 1, 2, 5, 8, 11, 14, 17, 20, 21, 22, 23}},
      {2, {1}},
  };
  for (auto& [n, layers] : more) {
    for (int l = 0; l < n; ++l) {
      const GGMLType want = layers.count(l) ? GGMLType::Q6_K : GGMLType::Q4_K;
      const std::string p = "blk." + std::to_string(l) + ".";
      EXPECT_EQ(type_of("q4_k_m", p + "attn_v.weight", 2048, l, n, true), want) << n << " layers, layer " << l;
      EXPECT_EQ(type_of("q4_k_m", p + "ffn_down.weight", 5632, l, n, true), want) << n << " layers, layer " << l;
      for (const char* other : {"attn_q.weight", "attn_k.weight", "attn_output.weight", "ffn_gate.weight",
                                "ffn_up.weight"})
        EXPECT_EQ(type_of("q4_k_m", p + other, 2048, l, n, true), GGMLType::Q4_K) << other;
    }
  }
}

TEST(SynthTypes, OutputEmbeddingAndFallbacks) {
  // Untied (TinyLlama): output q6_K, token_embd stays at the base type.
  EXPECT_EQ(type_of("q4_k_m", "output.weight", 2048, -1, 22, true), GGMLType::Q6_K);
  EXPECT_EQ(type_of("q4_k_m", "token_embd.weight", 2048, -1, 22, true), GGMLType::Q4_K);
  EXPECT_EQ(type_of("q4_0", "output.weight", 2048, -1, 22, true), GGMLType::Q6_K);
  EXPECT_EQ(type_of("q4_0", "token_embd.weight", 2048, -1, 22, true), GGMLType::Q4_0);
  EXPECT_EQ(type_of("q8_0", "output.weight", 2048, -1, 22, true), GGMLType::Q8_0);
  // Tied (Llama 3.2): token_embd is quantized as the output.
  EXPECT_EQ(type_of("q4_k_m", "token_embd.weight", 2048, -1, 16, false), GGMLType::Q6_K);
  // Qwen2.5-0.5B rows of 896 do not fill a 256-element super-block: q4_K -> q5_0, q6_K -> q8_0,
  // and the tied embedding goes straight to q8_0; ffn_down rows (4864 = 19 * 256) stay K-quants.
  EXPECT_EQ(type_of("q4_k_m", "token_embd.weight", 896, -1, 24, false), GGMLType::Q8_0);
  EXPECT_EQ(type_of("q4_k_m", "blk.3.attn_q.weight", 896, 3, 24, false), GGMLType::Q5_0);
  EXPECT_EQ(type_of("q4_k_m", "blk.0.attn_v.weight", 896, 0, 24, false), GGMLType::Q8_0);
  EXPECT_EQ(type_of("q4_k_m", "blk.3.attn_v.weight", 896, 3, 24, false), GGMLType::Q5_0);
  EXPECT_EQ(type_of("q4_k_m", "blk.0.ffn_down.weight", 4864, 0, 24, false), GGMLType::Q6_K);
  EXPECT_EQ(type_of("q4_k_m", "blk.3.ffn_down.weight", 4864, 3, 24, false), GGMLType::Q4_K);
  EXPECT_EQ(type_of("q6_k", "blk.3.ffn_up.weight", 896, 3, 24, false), GGMLType::Q8_0);
  EXPECT_EQ(type_of("q4_0", "token_embd.weight", 896, -1, 24, false), GGMLType::Q8_0);
  // Unquantized file types: every weight in the base type.
  for (const char* ft : {"f32", "f16", "bf16"})
    for (const char* name : {"output.weight", "token_embd.weight", "blk.0.attn_v.weight", "blk.1.ffn_down.weight"})
      EXPECT_EQ(type_of(ft, name, 896, 0, 2, false), synth_file_type(ft).base) << ft << " " << name;
}

TEST(SynthTypes, FileTypeNumbersAreLlamaCpps) {
  // LLAMA_FTYPE values from llama.h.
  EXPECT_EQ(synth_file_type("f32").llama_ftype, 0u);
  EXPECT_EQ(synth_file_type("f16").llama_ftype, 1u);
  EXPECT_EQ(synth_file_type("q4_0").llama_ftype, 2u);
  EXPECT_EQ(synth_file_type("q8_0").llama_ftype, 7u);
  EXPECT_EQ(synth_file_type("Q4_K_M").llama_ftype, 15u);
  EXPECT_EQ(synth_file_type("q6_k").llama_ftype, 18u);
  EXPECT_EQ(synth_file_type("bf16").llama_ftype, 32u);
  expect_error([] { synth_file_type("q3_k_xl"); }, {"SynthOptions::type", "q3_k_xl", "q4_k_m"});
  expect_error([] { synth_shape("llama-70b"); }, {"SynthOptions::shape", "llama-70b", "tinyllama-1.1b"});
}

// ---- Llama 3 RoPE factors -----------------------------------------------------------------

TEST(SynthRope, Llama3FactorsMatchAFloat64Recomputation) {
  const int dim = 64;
  const double base = 500000, factor = 32, low = 1, high = 4, old_ctx = 8192;
  std::vector<float> got = llama3_rope_factors(dim, base, factor, low, high, old_ctx);
  ASSERT_EQ(got.size(), 32u);
  int n_medium = 0;
  for (int i = 0; i < dim / 2; ++i) {
    // HF transformers' _compute_llama3_parameters, in float64: the scaled inverse frequency,
    // then the factor is the ratio of original to scaled frequency.
    const double inv = 1.0 / std::pow(base, 2.0 * i / dim);
    const double wavelen = 2 * M_PI / inv;
    double scaled;
    if (wavelen < old_ctx / high) {
      scaled = inv;
    } else if (wavelen > old_ctx / low) {
      scaled = inv / factor;
    } else {
      const double smooth = (old_ctx / wavelen - low) / (high - low);
      scaled = (1 - smooth) * inv / factor + smooth * inv;
      ++n_medium;
    }
    EXPECT_NEAR(got[i], inv / scaled, 1e-5 * inv / scaled) << "pair " << i;
  }
  EXPECT_EQ(got.front(), 1.0f);
  EXPECT_EQ(got.back(), 32.0f);
  EXPECT_EQ(n_medium, 3);  // pairs 15, 16, 17 lie between the two wavelengths
}

// ---- whole files --------------------------------------------------------------------------

namespace {

struct FileCase {
  const char* shape;
  const char* type;
};

/// Writes a one-layer file of `shape` and `type` (stories260K's vocabulary) at temp_path(name).
SynthOptions one_layer_file(const char* shape, const char* type, const std::string& name) {
  SynthOptions opt;
  opt.shape = shape;
  opt.type = type;
  opt.vocab_from = kVocab;
  opt.output = temp_path(name);
  opt.layers = 1;
  synth_model(opt);
  return opt;
}

void expect_runs(const Model& m) {
  SessionOptions so;
  so.n_ctx = 32;
  Session s(m, so);
  std::vector<float> logits = s.forward({1, 20, 30, 40, 50});
  ASSERT_EQ(logits.size(), static_cast<size_t>(m.hparams().n_vocab));
  double sum = 0, sum2 = 0;
  for (float x : logits) {
    ASSERT_TRUE(std::isfinite(x));
    sum += x, sum2 += double(x) * x;
  }
  const double var = sum2 / logits.size() - (sum / logits.size()) * (sum / logits.size());
  EXPECT_GT(var, 1e-6);   // not constant
  EXPECT_LT(var, 1e4);    // not exploding
}

}  // namespace

class SynthFile : public ::testing::TestWithParam<FileCase> {};

TEST_P(SynthFile, TwoLayersLoadAndRun) {
  const FileCase c = GetParam();
  const SynthShape& sh = synth_shape(c.shape);
  SynthOptions opt;
  opt.shape = c.shape;
  opt.type = c.type;
  opt.vocab_from = kVocab;
  opt.output = temp_path(std::string(c.shape) + "_" + c.type + ".gguf");
  opt.layers = 2;
  SynthResult r = synth_model(opt);
  EXPECT_EQ(r.n_layer, 2);
  EXPECT_FALSE(std::filesystem::exists(opt.output + ".part"));

  auto m = Model::load(opt.output);
  const HParams& hp = m->hparams();
  EXPECT_EQ(hp.arch, sh.arch);
  EXPECT_EQ(hp.n_embd, sh.n_embd);
  EXPECT_EQ(hp.n_ff, sh.n_ff);
  EXPECT_EQ(hp.n_layer, 2);
  EXPECT_EQ(hp.n_head, sh.n_head);
  EXPECT_EQ(hp.n_head_kv, sh.n_head_kv);
  EXPECT_EQ(hp.head_dim, sh.head_dim);
  EXPECT_EQ(hp.n_ctx_train, sh.n_ctx_train);
  EXPECT_EQ(hp.rope_freq_base, sh.rope_freq_base);
  EXPECT_EQ(hp.rms_eps, sh.rms_eps);
  EXPECT_EQ(hp.n_vocab, 512);  // from the vocabulary file

  const GGUFFile& f = m->file();
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.get_string("general.architecture"), sh.arch);
  EXPECT_EQ(f.get_string("general.name"), sh.display_name);
  EXPECT_EQ(f.get_int("general.file_type"), int64_t(synth_file_type(c.type).llama_ftype));
  EXPECT_EQ(f.get_int("general.quantization_version"), 2);
  const std::string a = sh.arch + ".";
  for (const char* k : {"context_length", "embedding_length", "block_count", "feed_forward_length",
                        "attention.head_count", "attention.head_count_kv", "attention.key_length",
                        "attention.value_length", "rope.dimension_count"})
    EXPECT_EQ(f.find(a + k)->type, GGUFValueType::UINT32) << k;
  EXPECT_EQ(f.get_int(a + "rope.dimension_count"), sh.head_dim);
  EXPECT_EQ(f.find(a + "rope.freq_base")->type, GGUFValueType::FLOAT32);
  EXPECT_EQ(f.find(a + "attention.layer_norm_rms_epsilon")->type, GGUFValueType::FLOAT32);

  // Every tokenizer.* key of the vocabulary file, unchanged.
  auto vocab = GGUFFile::open(kVocab);
  int n_tok_keys = 0;
  for (const auto& [k, v] : vocab->metadata()) {
    if (k.rfind("tokenizer.", 0) != 0) continue;
    ++n_tok_keys;
    ASSERT_TRUE(f.has(k)) << k;
    EXPECT_TRUE(serialized(*f.find(k)) == serialized(v)) << k;
  }
  EXPECT_GE(n_tok_keys, 3);

  // Tensors: names, shapes, types.
  const bool tied = sh.tied_embeddings;
  EXPECT_EQ(f.find_tensor("output.weight") != nullptr, !tied);
  EXPECT_EQ(f.find_tensor("rope_freqs.weight") != nullptr, sh.llama3_factor > 0);
  EXPECT_EQ(f.find_tensor("blk.0.attn_q.bias") != nullptr, sh.qkv_bias);
  EXPECT_EQ(f.find_tensor("blk.2.attn_q.weight"), nullptr);
  size_t want_tensors = 1 + 1 + (tied ? 0 : 1) + 2 * (9 + (sh.qkv_bias ? 3 : 0)) + (sh.llama3_factor > 0 ? 1 : 0);
  EXPECT_EQ(f.tensors().size(), want_tensors);
  for (const TensorInfo& t : f.tensors()) {
    if (t.ne.size() == 1) EXPECT_EQ(t.type, GGMLType::F32) << t.name;
    else EXPECT_EQ(t.type, synth_tensor_type(synth_file_type(c.type), t.name, t.ne[0],
                                             t.name.rfind("blk.1.", 0) == 0 ? 1 : 0, 2, !tied))
        << t.name;
  }
  EXPECT_EQ(f.tensor("blk.1.ffn_down.weight").ne, (std::vector<int64_t>{sh.n_ff, sh.n_embd}));
  EXPECT_EQ(f.tensor("blk.0.attn_k.weight").ne,
            (std::vector<int64_t>{sh.n_embd, int64_t(sh.n_head_kv) * sh.head_dim}));
  EXPECT_EQ(f.tensor("token_embd.weight").ne, (std::vector<int64_t>{sh.n_embd, 512}));
  for (float x : f.tensor_f32(f.tensor("blk.1.ffn_norm.weight"))) ASSERT_EQ(x, 1.0f);
  if (sh.llama3_factor > 0) {
    EXPECT_EQ(m->rope_freqs().size(), static_cast<size_t>(sh.head_dim / 2));
    EXPECT_EQ(m->rope_freqs().back(), sh.llama3_factor);
  }
  expect_runs(*m);
  std::remove(opt.output.c_str());
}

// q4_k_m on qwen2.5 covers the K-quants, the q5_0/q8_0 fallbacks and the tied embedding; q8_0
// and q4_0 keep the two 2048-wide shapes fast.
INSTANTIATE_TEST_SUITE_P(Shapes, SynthFile,
                         ::testing::Values(FileCase{"tinyllama-1.1b", "q8_0"}, FileCase{"llama-3.2-1b", "q4_0"},
                                           FileCase{"qwen2.5-0.5b", "q4_k_m"}),
                         [](const auto& info) {
                           std::string s = std::string(info.param.shape) + "_" + info.param.type;
                           for (char& ch : s)
                             if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return s;
                         });

TEST(SynthFileTypes, EveryTypeLoadsAndRuns) {
  for (const char* type : {"f32", "f16", "bf16", "q6_k"}) {
    SynthOptions opt;
    opt.shape = "qwen2.5-0.5b";
    opt.type = type;
    opt.vocab_from = kVocab;
    opt.output = temp_path(std::string("types_") + type + ".gguf");
    opt.layers = 1;
    synth_model(opt);
    auto m = Model::load(opt.output);
    EXPECT_EQ(m->file().get_int("general.file_type"), int64_t(synth_file_type(type).llama_ftype)) << type;
    const GGMLType base = synth_file_type(type).base;
    EXPECT_EQ(m->file().tensor("blk.0.ffn_down.weight").type, base) << type;  // 4864 columns: no fallback
    expect_runs(*m);
    std::remove(opt.output.c_str());
  }
}

TEST(SynthFileTypes, WeightsHaveTheIntendedDistribution) {
  const SynthOptions opt = one_layer_file("qwen2.5-0.5b", "f32", "dist.gguf");
  auto f = GGUFFile::open(opt.output);
  for (const char* name : {"token_embd.weight", "blk.0.ffn_up.weight", "blk.0.attn_k.bias"}) {
    std::vector<float> x = f->tensor_f32(f->tensor(name));
    double s = 0, s2 = 0;
    for (float v : x) s += v, s2 += double(v) * v;
    const double mean = s / x.size(), sd = std::sqrt(s2 / x.size() - mean * mean);
    EXPECT_NEAR(mean, 0.0, 5 * 0.02 / std::sqrt(double(x.size())) + 1e-6) << name;
    EXPECT_NEAR(sd, 0.02, 0.02 * 4 / std::sqrt(2.0 * x.size())) << name;  // 4 sigma of the estimate
  }
  std::remove(opt.output.c_str());
}

TEST(SynthFileTypes, SeededAndIndependentOfThreadsAndLayerCount) {
  SynthOptions opt;
  opt.shape = "qwen2.5-0.5b";
  opt.type = "q8_0";
  opt.vocab_from = kVocab;
  opt.layers = 1;
  const int threads = num_threads();
  set_num_threads(1);
  opt.output = temp_path("seed_a.gguf");
  synth_model(opt);
  set_num_threads(2);
  opt.output = temp_path("seed_b.gguf");
  synth_model(opt);
  opt.seed = 43;
  opt.output = temp_path("seed_c.gguf");
  synth_model(opt);
  opt.seed = 42;
  opt.layers = 2;
  opt.output = temp_path("seed_d.gguf");
  synth_model(opt);
  set_num_threads(threads);
  const std::string a = slurp(temp_path("seed_a.gguf")), b = slurp(temp_path("seed_b.gguf"));
  EXPECT_TRUE(a == b);
  auto fa = GGUFFile::open(temp_path("seed_a.gguf"));
  auto fc = GGUFFile::open(temp_path("seed_c.gguf"));
  auto fd = GGUFFile::open(temp_path("seed_d.gguf"));
  auto same = [](const GGUFFile& x, const GGUFFile& y, const std::string& n) {
    const TensorInfo &tx = x.tensor(n), &ty = y.tensor(n);
    return tx.nbytes == ty.nbytes && std::memcmp(tx.data, ty.data, tx.nbytes) == 0;
  };
  EXPECT_FALSE(same(*fa, *fc, "blk.0.ffn_up.weight"));
  EXPECT_TRUE(same(*fa, *fd, "blk.0.ffn_up.weight"));
  EXPECT_TRUE(same(*fa, *fd, "token_embd.weight"));
  for (const char* n : {"seed_a.gguf", "seed_b.gguf", "seed_c.gguf", "seed_d.gguf"}) std::remove(temp_path(n).c_str());
}

TEST(SynthErrors, BadOptionsNameTheField) {
  SynthOptions opt;
  opt.shape = "qwen2.5-0.5b";
  opt.type = "q8_0";
  opt.vocab_from = kVocab;
  opt.output = temp_path("bad.gguf");
  std::remove(opt.output.c_str());
  SynthOptions o = opt;
  o.layers = 25;
  expect_error([&] { synth_model(o); }, {"SynthOptions::layers 25", "qwen2.5-0.5b", "24"});
  o = opt;
  o.vocab_from = "/nonexistent/vocab.gguf";
  expect_error([&] { synth_model(o); }, {"/nonexistent/vocab.gguf"});
  o = opt;  // a GGUF without a vocabulary
  o.vocab_from = temp_path("novocab.gguf");
  GGUFWriter w;
  w.set("general.architecture", GGUFValue::str("llama"));
  w.write(o.vocab_from);
  expect_error([&] { synth_model(o); }, {o.vocab_from, "tokenizer.ggml.tokens"});
  std::remove(o.vocab_from.c_str());
  o = opt;
  o.output = "/nonexistent/dir/out.gguf";
  expect_error([&] { synth_model(o); }, {"/nonexistent/dir/out.gguf"});
  EXPECT_FALSE(std::filesystem::exists(opt.output));
}

// A model whose matrices the loader packs (TinyLlama's 2,048-wide rows, 1 layer of q4_K_M: q4_K and
// q6_K, a q6_K output) gives the same logits, bit for bit, packed thread-major for 1, 2 and 3
// threads (qdot::pack_thread_major: one part per thread, decode products on static shares) as
// packed one matrix after the other (KVSLIM_THREAD_MAJOR=0, 1 thread): a prefill of 5 tokens, then
// 3 greedy decode steps.
TEST(SynthFileRuns, ThreadMajorPackingKeepsTheLogits) {
  if (!qdot::packing_enabled()) GTEST_SKIP() << "weights are packed at SIMD levels only";
  const int threads0 = num_threads();
  const SynthOptions opt = one_layer_file("tinyllama-1.1b", "q4_k_m", "tinyllama_q4_k_m_1layer.gguf");
  auto run = [&](size_t parts) {
    auto m = Model::load(opt.output);
    EXPECT_EQ(m->output().packed->parts.size(), parts);
    EXPECT_EQ(m->layer(0).w_down->packed->parts.size(), parts);
    SessionOptions so;
    so.n_ctx = 32;
    Session s(*m, so);
    std::vector<float> all = s.forward({1, 20, 30, 40, 50});
    for (int step = 0; step < 3; ++step) {
      const auto best = std::max_element(all.end() - m->hparams().n_vocab, all.end()) - (all.end() - m->hparams().n_vocab);
      const std::vector<float> next = s.forward({static_cast<Token>(best)});
      all.insert(all.end(), next.begin(), next.end());
    }
    return all;
  };
  setenv("KVSLIM_THREAD_MAJOR", "0", 1);
  set_num_threads(1);
  const std::vector<float> ref = run(0);
  unsetenv("KVSLIM_THREAD_MAJOR");
  for (int th : {1, 2, 3}) {
    set_num_threads(th);
    const std::vector<float> got = run(static_cast<size_t>(th));
    ASSERT_EQ(got.size(), ref.size());
    EXPECT_EQ(std::memcmp(got.data(), ref.data(), ref.size() * sizeof(float)), 0) << th << " threads";
  }
  set_num_threads(threads0);
  std::filesystem::remove(opt.output);
}

