// Every registered press, run on fixed inputs, against a recorded dump: the entries each (layer, KV
// head) keeps after a chunked prefill, the logits after the question, the greedy tokens and the
// entries kept at the end of decoding. The dump (tests/data/press_golden.txt) was written by this
// file from an earlier version of the engine, so a refactor that changes what any press keeps or
// what the model computes fails here, press by press. Presses that need a trained file are listed
// as refused.
//
// Rewrite the dump (a deliberate change of behaviour only):
//   KVSLIM_WRITE_PRESS_GOLDEN=tests/data/press_golden.txt build/kvslim_tests --gtest_filter='PressGolden.*'
//
// The AVX2 kernels run whatever the CPU has above them, so AVX-512 and AVX2 machines compute the
// same bits; the thread count does not change them.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/quant_dot.h"
#include "kvslim/error.h"
#include "kvslim/model.h"
#include "kvslim/press.h"
#include "kvslim/request.h"
#if __has_include("kv/cache.h")
#include "kv/cache.h"
#else
#include "kvslim/kv_cache.h"
#endif

namespace kvslim {
namespace {

/// FNV-1a over 32-bit words.
struct Fnv {
  uint64_t h = 1469598103934665603ull;
  void add(uint32_t w) {
    for (int i = 0; i < 4; ++i) {
      h ^= (w >> (8 * i)) & 0xffu;
      h *= 1099511628211ull;
    }
  }
};

std::string kept_digest(const KVCache& c) {
  Fnv f;
  size_t n = 0;
  for (int l = 0; l < c.n_layer(); ++l)
    for (int h = 0; h < c.n_head_kv(); ++h) {
      const std::vector<int32_t>& pos = c.seg(l, h).positions();
      f.add(0xffffffffu);
      for (int32_t p : pos) f.add(static_cast<uint32_t>(p));
      n += pos.size();
    }
  std::ostringstream s;
  s << n << ":" << std::hex << f.h;
  return s.str();
}

std::string logits_digest(const std::vector<float>& lg) {
  Fnv f;
  for (float x : lg) {
    uint32_t w;
    std::memcpy(&w, &x, 4);
    f.add(w);
  }
  std::ostringstream s;
  s << std::hex << f.h;
  return s.str();
}

/// One line per press: spec as described, entries kept after the prefill, the logits after the
/// question, the generated tokens, entries kept at the end. `spec` is the press's name, or the
/// name with the parameters it cannot run without; chunk_size 0 compresses the context at once.
std::string run_press(const Model& model, const std::string& name, const std::string& spec, int chunk_size,
                      const std::vector<Token>& ctx, const std::vector<Token>& question) {
  std::ostringstream line;
  line << name << " | chunk " << chunk_size;
  try {
    bool used = false;
    std::unique_ptr<Press> press = make_press(spec, 0.5, used);
    if (!used) press = make_press(spec, 0.0);
    line << " | " << press->describe();
    RequestOptions o;
    o.session.n_ctx = 512;
    o.chunk_size = chunk_size;
    o.n_predict = 8;
    o.sampling.temp = 0;
    Request req(model, std::move(press), o);
    req.set_prompt_tokens(ctx, question);
    req.prefill();
    line << " | prefill " << kept_digest(req.cache()) << " | logits " << logits_digest(req.logits());
    req.run();
    line << " | tokens";
    for (Token t : req.generated()) line << " " << t;
    line << " | end " << kept_digest(req.cache());
  } catch (const Error&) {
    line << " | refused";
  }
  return line.str();
}

TEST(PressGolden, EveryPressKeepsTheRecordedEntriesAndComputesTheRecordedLogits) {
  if (!qdot::cpu_has(qdot::Level::AVX2)) GTEST_SKIP() << "the dump was recorded with the AVX2 kernels";
  const qdot::Level saved = qdot::level();
  qdot::set_level(qdot::Level::AVX2);
  std::unique_ptr<Model> model = Model::load(std::string(KVSLIM_SOURCE_DIR) + "/models/stories260K.gguf");
  std::string text;
  for (int i = 0; i < 6; ++i)
    text += "Once upon a time there was a little girl named Lily. She loved to play in the park with her "
            "red ball. One day the ball rolled into the pond, and a kind frog swam out to bring it back. ";
  const std::vector<Token> ctx = model->tokenizer().encode(text, true, false);
  const std::vector<Token> question = model->tokenizer().encode(" What did the frog do?", false, false);
  ASSERT_GT(ctx.size(), 200u);

  // Presses that need a parameter to run at all, and those that read the whole context's hidden
  // states at once (no chunks); presses that need a file (trained weights, calibrations) are refused.
  std::string layer_ratios;
  for (int l = 0; l < model->hparams().n_layer; ++l) layer_ratios += (l ? "/" : "") + std::string(l % 2 ? "0.25" : "0.5");
  const std::map<std::string, std::string> specs = {{"threshold", "threshold(knorm):tau=-4"},
                                                    {"finch", "finch:window=8"},
                                                    {"per_layer", "per_layer:ratios=" + layer_ratios}};
  const std::set<std::string> whole = {"compactor", "leverage", "non_causal_attention"};
  std::map<std::string, std::string> got;
  for (const PressInfo* info : PressRegistry::instance().all()) {
    const std::string& n = info->name;
    if (n.rfind("test_", 0) == 0) continue;
    got[n] = run_press(*model, n, specs.count(n) ? specs.at(n) : n, whole.count(n) ? 0 : 64, ctx, question);
  }
  qdot::set_level(saved);

  if (const char* out = std::getenv("KVSLIM_WRITE_PRESS_GOLDEN")) {
    std::ofstream f(out);
    for (const auto& [name, line] : got) f << line << "\n";
    GTEST_SKIP() << "wrote " << out;
  }
  std::ifstream f(std::string(KVSLIM_SOURCE_DIR) + "/tests/data/press_golden.txt");
  ASSERT_TRUE(f) << "tests/data/press_golden.txt is missing";
  std::map<std::string, std::string> want;
  for (std::string line; std::getline(f, line);)
    if (!line.empty()) want[line.substr(0, line.find(' '))] = line;
  for (const auto& [name, line] : want) {
    auto it = got.find(name);
    if (it == got.end()) {
      ADD_FAILURE() << "press " << name << " of the dump is no longer registered";
      continue;
    }
    EXPECT_EQ(it->second, line) << "press " << name;
  }
  for (const auto& [name, line] : got)
    if (!want.count(name)) ADD_FAILURE() << "press " << name << " is not in the dump: " << line;
}

}  // namespace
}  // namespace kvslim
