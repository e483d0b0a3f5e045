// Numeric guards: model metadata out of range is rejected naming the field; a NaN/inf in the
// forward pass is an error naming the layer (with the cache-type hint when the f16 cache
// overflows), never silent output or a NaN score; a header's block_count is checked against the
// tensor list before per-layer state is allocated.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <limits>
#include <sstream>
#include <string>

#include "kvslim/error.h"
#include "kvslim/eval_metrics.h"
#include "kvslim/gguf.h"
#include "kvslim/model.h"
#include "kvslim/quant.h"
#include "support/files.h"

using namespace kvslim;

namespace {

const std::string kModel = std::string(KVSLIM_SOURCE_DIR) + "/models/stories260K.gguf";

/// Rewrites stories260K: `edit` changes metadata; `scale` (if set) returns a factor per tensor
/// name (f32 tensors only).
void rewrite_model(const std::string& dst, const std::function<void(GGUFWriter&)>& edit,
                   const std::function<float(const std::string&)>& scale = nullptr) {
  auto f = GGUFFile::open(kModel);
  GGUFWriter w;
  for (const auto& [k, v] : f->metadata()) w.set(k, v);
  if (edit) edit(w);
  for (const TensorInfo& t : f->tensors()) {
    std::string bytes(static_cast<const char*>(t.data), t.nbytes);
    const float s = scale ? scale(t.name) : 1.0f;
    if (s != 1.0f) {
      EXPECT_EQ(t.type, GGMLType::F32) << t.name;
      float* p = reinterpret_cast<float*>(bytes.data());
      for (size_t i = 0; i < bytes.size() / sizeof(float); ++i) p[i] *= s;
    }
    w.add_tensor(t.name, t.type, t.ne, bytes);
  }
  w.write(dst);
}

struct Result {
  int rc = -1;
  std::string err;
};

Result run_cli(const std::string& args) {
  const std::string err = temp_path("stderr.txt");
  const std::string cmd = std::string("'") + KVSLIM_CLI + "' " + args + " >/dev/null 2>'" + err + "' </dev/null";
  const int st = std::system(cmd.c_str());
  Result r;
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  r.err = slurp(err);
  std::remove(err.c_str());
  return r;
}

void expect_load_error(const std::function<void(GGUFWriter&)>& edit, std::initializer_list<std::string> parts) {
  const std::string path = temp_path("meta.gguf");
  rewrite_model(path, edit);
  try {
    Model::load(path);
    ADD_FAILURE() << "loaded";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << msg << "' lacks '" << p << "'";
  }
  std::remove(path.c_str());
}

}  // namespace

TEST(NumericGuard, MetadataOutOfRangeIsRejectedNamingFieldAndValue) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const std::string eps = "llama.attention.layer_norm_rms_epsilon", base = "llama.rope.freq_base";
  for (float bad : {nan, -1.0f, 0.0f, inf})
    expect_load_error([&](GGUFWriter& w) { w.set(eps, GGUFValue::f32(bad)); }, {eps, "out of range"});
  expect_load_error([&](GGUFWriter& w) { w.set(eps, GGUFValue::f32(-1.0f)); }, {"= -1"});
  for (float bad : {nan, -10000.0f, 0.0f, inf})
    expect_load_error([&](GGUFWriter& w) { w.set(base, GGUFValue::f32(bad)); }, {base, "out of range"});
  expect_load_error([&](GGUFWriter& w) { w.set(base, GGUFValue::f32(0.0f)); }, {"= 0"});
  expect_load_error(
      [&](GGUFWriter& w) {
        w.set("llama.rope.scaling.type", GGUFValue::str("linear"));
        w.set("llama.rope.scaling.factor", GGUFValue::f32(nan));
      },
      {"llama.rope.scaling.factor", "nan"});
}

TEST(NumericGuard, ValidMetadataStillLoads) {  // the edits above are the only cause
  const std::string path = temp_path("ok.gguf");
  rewrite_model(path, [](GGUFWriter& w) { w.set("llama.rope.freq_base", GGUFValue::f32(500000.0f)); });
  EXPECT_NO_THROW(Model::load(path));
  std::remove(path.c_str());
}

TEST(NumericGuard, HugeBlockCountRejectedBeforeAllocating) {
  // 2^24 layers used to allocate gigabytes of per-layer state before the first missing tensor.
  expect_load_error([](GGUFWriter& w) { w.set("llama.block_count", GGUFValue::u32(1u << 24)); },
                    {"llama.block_count", "16777216", "tensors"});
  expect_load_error([](GGUFWriter& w) { w.set("llama.block_count", GGUFValue::u32(6)); },
                    {"llama.block_count = 6", "needs at least 54 tensors", "48"});
}

// Only layer 0's key projection scaled: the keys leave f16's range while the hidden states stay
// finite (attention saturates to one entry), so the guard on hidden states alone let a short
// prompt generate with exit 0 from a cache of inf keys. Each key is now checked as it is stored.
TEST(NumericGuard, KeyOverflowOnAShortPromptIsCaughtWhereTheKeyIsStored) {
  const std::string path = temp_path("big_keys.gguf");
  rewrite_model(path, nullptr, [](const std::string& name) { return name == "blk.0.attn_k.weight" ? 1e6f : 1.0f; });
  const std::string gen = "generate -m '" + path + "' -p 'Once upon a time' -n 4 --temp 0";
  Result r = run_cli(gen);
  EXPECT_NE(r.rc, 0) << r.err;
  EXPECT_LT(r.rc, 128) << r.err;
  for (const char* p : {"numeric overflow in layer 0", "key", "f16", "--cache-type-k", "f32"})
    EXPECT_NE(r.err.find(p), std::string::npos) << "'" << r.err << "' lacks '" << p << "'";
  Result ok = run_cli(gen + " --cache-type-k f32");
  EXPECT_EQ(ok.rc, 0) << ok.err;
  // Scaled by 2e4 the keys reach about 1.7e5: too large for f16 rows, but q8_0 and q4_0 store an f16
  // scale per block (amax / 127, max / -8), which holds keys up to 65504 x 127 and 65504 x 8.
  rewrite_model(path, nullptr, [](const std::string& name) { return name == "blk.0.attn_k.weight" ? 2e4f : 1.0f; });
  EXPECT_NE(run_cli(gen).rc, 0);
  for (const char* codec : {"q8_0", "q4_0"}) {
    Result q = run_cli(gen + " --cache-type-k " + codec);
    EXPECT_EQ(q.rc, 0) << codec << ": " << q.err;
  }
  std::remove(path.c_str());
}

// Q and K scaled by 1e5: keys reach about 1e5 and more, beyond f16's 65504, so the default f16
// key cache stores inf. Before the guard, generate printed nothing new and exited 0, and eval
// fidelity printed KL -nan with top-1 agreement 1.0000.
TEST(NumericGuard, F16KeyCacheOverflowIsAnErrorNamingLayerAndCacheType) {
  const std::string path = temp_path("overflow.gguf");
  rewrite_model(path, nullptr, [](const std::string& name) {
    return name.find("attn_q.weight") != std::string::npos || name.find("attn_k.weight") != std::string::npos
               ? 1e5f
               : 1.0f;
  });
  const std::string gen = "generate -m '" + path + "' -p 'Once upon a time' -n 4 --temp 0";
  Result r = run_cli(gen);
  EXPECT_NE(r.rc, 0);
  EXPECT_LT(r.rc, 128) << r.err;
  for (const char* p : {"numeric overflow in layer", "key", "f16", "--cache-type-k", "f32", "bf16"})
    EXPECT_NE(r.err.find(p), std::string::npos) << "'" << r.err << "' lacks '" << p << "'";
  // The hint works: an f32 or bf16 key cache holds such keys and the run succeeds.
  for (const char* t : {"f32", "bf16"}) {
    Result ok = run_cli(gen + " --cache-type-k " + t);
    EXPECT_EQ(ok.rc, 0) << t << ": " << ok.err;
  }
  Result fid = run_cli("eval fidelity -m '" + path + "' --press knorm --ratios 0.5");
  EXPECT_NE(fid.rc, 0) << fid.err;
  EXPECT_LT(fid.rc, 128) << fid.err;
  EXPECT_NE(fid.err.find("layer"), std::string::npos) << fid.err;
  EXPECT_EQ(fid.err.find("nan"), std::string::npos) << fid.err;
  std::remove(path.c_str());
}

TEST(NumericGuard, FidelityWithNaNLogitsIsAnError) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float good[3] = {1.0f, 2.0f, 3.0f}, bad[3] = {1.0f, nan, 3.0f};
  FidelityAccumulator a;
  EXPECT_THROW(a.add(good, bad, 3, 0), Error);
  EXPECT_THROW(a.add(bad, good, 3, 0), Error);
  EXPECT_EQ(a.tokens(), 0u);
  a.add(good, good, 3, 2);
  EXPECT_EQ(a.tokens(), 1u);
}
