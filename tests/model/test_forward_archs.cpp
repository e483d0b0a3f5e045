// The forward pass on architectures and options the bundled model does not exercise (qwen2's
// q/k/v biases and NEOX RoPE, Llama-3 rope_freqs, linear RoPE scaling, untied output, wider
// GQA groups), against tools/ref_forward.py: an independent float64 numpy re-computation.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>
#include <sstream>

#include <fmt/format.h>

#include "kvslim/gguf.h"
#include "kvslim/model.h"
#include "model/session.h"

using namespace kvslim;

namespace {

struct Shape {
  std::string arch;
  int n_embd, n_ff, n_layer, n_head, n_head_kv;
  bool tied, rope_freqs, linear_scaling;
  float rope_base;
};

/// A random-weight model with the bundled model's tokenizer (vocab 512).
std::string write_model(const Shape& s, const std::string& path) {
  auto tok_src = GGUFFile::open(std::string(KVSLIM_SOURCE_DIR) + "/models/stories260K.gguf");
  GGUFWriter w;
  w.set("general.architecture", GGUFValue::str(s.arch));
  const std::string a = s.arch + ".";
  w.set(a + "context_length", GGUFValue::u32(512));
  w.set(a + "embedding_length", GGUFValue::u32(s.n_embd));
  w.set(a + "feed_forward_length", GGUFValue::u32(s.n_ff));
  w.set(a + "block_count", GGUFValue::u32(s.n_layer));
  w.set(a + "attention.head_count", GGUFValue::u32(s.n_head));
  w.set(a + "attention.head_count_kv", GGUFValue::u32(s.n_head_kv));
  w.set(a + "attention.layer_norm_rms_epsilon", GGUFValue::f32(1e-6f));
  w.set(a + "rope.freq_base", GGUFValue::f32(s.rope_base));
  if (s.linear_scaling) {
    w.set(a + "rope.scaling.type", GGUFValue::str("linear"));
    w.set(a + "rope.scaling.factor", GGUFValue::f32(4.0f));
  }
  for (auto& [k, v] : tok_src->metadata())
    if (k.rfind("tokenizer.", 0) == 0) w.set(k, v);
  const int hd = s.n_embd / s.n_head, V = 512;
  std::mt19937 rng(1234);
  std::normal_distribution<float> nd(0.0f, 0.3f);
  auto rnd = [&](size_t n, float scale = 1.0f) {
    std::vector<float> v(n);
    for (float& x : v) x = nd(rng) * scale;
    return v;
  };
  auto ones_ish = [&](size_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = 1.0f + 0.1f * nd(rng);
    return v;
  };
  const int64_t d = s.n_embd, dkv = int64_t(s.n_head_kv) * hd;
  w.add_tensor_f32("token_embd.weight", GGMLType::F32, {d, V}, rnd(d * V));
  w.add_tensor_f32("output_norm.weight", GGMLType::F32, {d}, ones_ish(d));
  if (!s.tied) w.add_tensor_f32("output.weight", GGMLType::F32, {d, V}, rnd(d * V));
  if (s.rope_freqs) {
    std::vector<float> f(hd / 2);
    for (int i = 0; i < hd / 2; ++i) f[i] = i < hd / 8 ? 1.0f : (i < hd / 4 ? 2.5f : 8.0f);
    w.add_tensor_f32("rope_freqs.weight", GGMLType::F32, {hd / 2}, f);
  }
  for (int l = 0; l < s.n_layer; ++l) {
    std::string p = fmt::format("blk.{}.", l);
    w.add_tensor_f32(p + "attn_norm.weight", GGMLType::F32, {d}, ones_ish(d));
    w.add_tensor_f32(p + "ffn_norm.weight", GGMLType::F32, {d}, ones_ish(d));
    w.add_tensor_f32(p + "attn_q.weight", GGMLType::F32, {d, d}, rnd(d * d));
    w.add_tensor_f32(p + "attn_k.weight", GGMLType::F32, {d, dkv}, rnd(d * dkv));
    w.add_tensor_f32(p + "attn_v.weight", GGMLType::F32, {d, dkv}, rnd(d * dkv));
    w.add_tensor_f32(p + "attn_output.weight", GGMLType::F32, {d, d}, rnd(d * d, 0.5f));
    w.add_tensor_f32(p + "ffn_gate.weight", GGMLType::F32, {d, s.n_ff}, rnd(d * s.n_ff));
    w.add_tensor_f32(p + "ffn_up.weight", GGMLType::F32, {d, s.n_ff}, rnd(d * s.n_ff));
    w.add_tensor_f32(p + "ffn_down.weight", GGMLType::F32, {s.n_ff, d}, rnd(d * s.n_ff, 0.5f));
    if (s.arch == "qwen2") {
      w.add_tensor_f32(p + "attn_q.bias", GGMLType::F32, {d}, rnd(d));
      w.add_tensor_f32(p + "attn_k.bias", GGMLType::F32, {dkv}, rnd(dkv));
      w.add_tensor_f32(p + "attn_v.bias", GGMLType::F32, {dkv}, rnd(dkv));
    }
  }
  w.write(path);
  return path;
}

std::vector<std::vector<double>> reference(const std::string& model, const std::vector<Token>& toks) {
  std::string cmd = fmt::format("/usr/bin/python3 {}/tools/ref_forward.py {}", KVSLIM_SOURCE_DIR, model);
  for (Token t : toks) cmd += fmt::format(" {}", t);
  FILE* p = popen(cmd.c_str(), "r");
  std::vector<std::vector<double>> rows;
  if (!p) return rows;
  std::string out;
  char buf[65536];
  size_t k;
  while ((k = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, k);
  if (pclose(p) != 0) return {};
  std::istringstream ss(out);
  std::string line;
  while (std::getline(ss, line)) {
    std::istringstream ls(line);
    rows.emplace_back();
    double v;
    while (ls >> v) rows.back().push_back(v);
  }
  return rows;
}

class Archs : public ::testing::TestWithParam<Shape> {};

TEST_P(Archs, LogitsMatchFloat64Reference) {
  if (!std::filesystem::exists("/usr/bin/python3")) GTEST_SKIP() << "needs /usr/bin/python3 with numpy";
  const Shape& s = GetParam();
  std::string path = (std::filesystem::temp_directory_path() /
                      fmt::format("kvslim_arch_{}_{}_{}.gguf", s.arch, s.n_head_kv, ::getpid())).string();
  write_model(s, path);
  auto model = Model::load(path);
  std::vector<Token> toks = {1, 57, 300, 12, 499, 77, 8, 8, 130, 266, 401, 3, 90, 91, 92, 250, 17};
  auto want = reference(path, toks);
  ASSERT_EQ(want.size(), toks.size()) << "reference script failed (is python3-numpy installed?)";
  SessionOptions o;
  o.key_codec = o.value_codec = KVCodec::F32;
  o.exact = true;
  o.batch = 5;  // several batches: later tokens attend to cached entries
  Session sess(*model, o);
  std::vector<float> got = sess.forward(toks, true);
  double worst = 0, scale = 0;
  for (size_t t = 0; t < toks.size(); ++t)
    for (size_t i = 0; i < want[t].size(); ++i) {
      worst = std::max(worst, std::fabs(got[t * want[t].size() + i] - want[t][i]));
      scale = std::max(scale, std::fabs(want[t][i]));
    }
  EXPECT_LT(worst, 1e-4 * std::max(1.0, scale)) << "max |logit| " << scale;
  std::filesystem::remove(path);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, Archs,
    ::testing::Values(Shape{"llama", 64, 96, 2, 8, 2, false, true, false, 500000.0f},
                      Shape{"qwen2", 64, 96, 2, 4, 1, true, false, false, 1000000.0f},
                      Shape{"llama", 48, 64, 2, 3, 3, true, false, true, 10000.0f}),
    [](const ::testing::TestParamInfo<Shape>& i) {
      return fmt::format("{}_kv{}_{}", i.param.arch, i.param.n_head_kv,
                         i.param.rope_freqs ? "ropefreqs" : (i.param.linear_scaling ? "linear" : "plain"));
    });

}  // namespace
