// The latent press (per-request PCA or calibrated bases from a GGUF file) and latent calibration.
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <unistd.h>

#include <fmt/format.h>

#include "press/scorers/latent.h"
#include "run/prefill.h"
#include "train/latent_calibrate.h"
#include "support/press_util.h"

using namespace press_test;

namespace {

std::vector<Token> story_tokens(int n) {
  std::vector<Token> t;
  for (int i = 0; i < n; ++i) t.push_back(static_cast<Token>(10 + (i * 13) % 300));
  return t;
}

TEST(PressLatent, PerRequestPcaStoresCodesWithExactBytes) {
  const Model& model = bundled_model();
  const HParams& hp = model.hparams();
  Session s(model, SessionOptions{});
  auto press = make_press_impl("latent:k_rank=3,v_rank=5,k_bits=4,v_bits=8,scales=token", 0.0);
  press->reset();
  prefill_and_compress(s, *press, story_tokens(80), 0, nullptr, nullptr);
  const KVCache& c = s.cache();
  const size_t segs = static_cast<size_t>(hp.n_layer) * hp.n_head_kv;
  // Per entry: 3 four-bit key codes (2 bytes) + scale, 5 eight-bit value codes + scale, position.
  const size_t per_entry = (2 + 2) + (5 + 2) + 4;
  // Per segment: two dense bases (rank x head_dim matrix, mean, scales; f32).
  const size_t basis = ((3 * hp.head_dim + hp.head_dim + 3) + (5 * hp.head_dim + hp.head_dim + 5)) * 4;
  EXPECT_EQ(c.bytes(), segs * 80 * per_entry + segs * basis);
  for (float x : s.forward({5, 6})) ASSERT_TRUE(std::isfinite(x));
  EXPECT_EQ(c.bytes(), segs * 82 * per_entry + segs * basis);
  // Per-channel scales (the default): a widening byte per entry instead of the f16 scale, and a
  // (center, step) f32 pair per coordinate and segment.
  Session s2(model, SessionOptions{});
  auto pc = make_press_impl("latent:k_rank=3,v_rank=5,k_bits=4,v_bits=8", 0.0);
  prefill_and_compress(s2, *pc, story_tokens(80), 0, nullptr, nullptr);
  EXPECT_EQ(s2.cache().bytes(), segs * 80 * ((2 + 1) + (5 + 1) + 4) + segs * (basis + (3 + 5) * 2 * 4));
  EXPECT_THROW(make_press_impl("latent:scales=row", 0.0), Error);
  EXPECT_THROW(make_press_impl("latent:k_bits=3", 0.0), Error);
  EXPECT_THROW(make_press_impl("latent:energy=1.5", 0.0), Error);
  EXPECT_THROW(make_press_impl("latent:file=/nonexistent/bases.gguf", 0.0), Error);
}

TEST(PressLatent, FullRankCodesReproduceTheFullCacheLogits) {
  // Rank head_dim with f32 codes is an orthogonal change of basis: logits equal the f32 cache's.
  const Model& model = bundled_model();
  SessionOptions so;
  so.key_codec = so.value_codec = KVCodec::F32;
  Session full(model, so), lat(model, so);
  auto none = make_press_impl("none", 0.0);
  const int hd = model.hparams().head_dim;
  auto press = make_press_impl(fmt::format("latent:k_rank={},v_rank={},k_bits=32,v_bits=32", hd, hd), 0.0);
  auto toks = story_tokens(60);
  prefill_and_compress(full, *none, toks, 0, nullptr, nullptr);
  prefill_and_compress(lat, *press, toks, 0, nullptr, nullptr);
  auto a = full.forward({7, 8, 9}), b = lat.forward({7, 8, 9});
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-3f);
}

TEST(PressLatent, CalibratedBasesRoundTripThroughGgufAndMeetTheByteBudget) {
  const Model& model = bundled_model();
  const HParams& hp = model.hparams();
  LatentCalibration opt;
  opt.memory_ratio = 0.3;
  opt.k_bits = 4;
  opt.v_bits = 4;
  std::vector<std::string> report;
  LatentBases b = calibrate_latent(model, {story_tokens(100), story_tokens(50)}, opt, &report);
  ASSERT_EQ(b.key.size(), static_cast<size_t>(hp.n_layer * hp.n_head_kv));
  size_t entry = 0;
  for (size_t u = 0; u < b.key.size(); ++u)
    entry += latent_row_bytes(b.key[u]->rank(), 4) + latent_row_bytes(b.value[u]->rank(), 4) + 4;
  const double f16 = b.key.size() * (4.0 * hp.head_dim + 4);
  EXPECT_LE(entry / f16, 0.3 + 1e-9);
  EXPECT_GT(entry / f16, 0.2);  // the budget is spent, not left unused
  EXPECT_EQ(report.size(), b.key.size() + 1);
  const std::string path =
      (std::filesystem::temp_directory_path() / fmt::format("kvslim_latent_test_{}.gguf", ::getpid())).string();
  b.save(path, "stories260K");
  LatentBases r = LatentBases::load(path);
  ASSERT_EQ(r.key.size(), b.key.size());
  for (size_t u = 0; u < b.key.size(); ++u) {
    EXPECT_EQ(r.key[u]->proj, b.key[u]->proj);
    EXPECT_EQ(r.value[u]->mean, b.value[u]->mean);
    EXPECT_EQ(r.key_bits[u], 4);
  }
  Session s(model, SessionOptions{});
  auto press = make_press_impl("latent:file=" + path, 0.0);
  prefill_and_compress(s, *press, story_tokens(40), 0, nullptr, nullptr);
  EXPECT_EQ(s.cache().seg(1, 2).latent_keys().rank(), b.key[1 * hp.n_head_kv + 2]->rank());
  // Calibrated bases are loaded once per process and shared by every request: the cache counts
  // its codes (4-bit, per-channel: a widening byte per entry) and positions, the bases go to shared_bytes.
  size_t rows = 0, params = 0, basis = 0;
  for (size_t u = 0; u < b.key.size(); ++u) {
    rows += (b.key[u]->rank() * 4 + 7) / 8 + 1 + (b.value[u]->rank() * 4 + 7) / 8 + 1 + 4;
    params += (b.key[u]->rank() + b.value[u]->rank()) * 2 * 4;
    basis += b.key[u]->bytes() + b.value[u]->bytes();
  }
  EXPECT_EQ(s.cache().bytes(), 40 * rows + params);
  EXPECT_EQ(s.cache().shared_bytes(), basis);
  Session s3(model, SessionOptions{});
  auto press3 = make_press_impl("latent:file=" + path, 0.0);
  prefill_and_compress(s3, *press3, story_tokens(30), 0, nullptr, nullptr);
  EXPECT_EQ(&s3.cache().seg(2, 1).latent_values().basis(), &s.cache().seg(2, 1).latent_values().basis());
  opt.memory_ratio = 0.01;
  EXPECT_THROW(calibrate_latent(model, {story_tokens(20)}, opt), Error);
  // A file for another shape is refused when applied.
  LatentBases other = b;
  other.n_layer = 1;
  other.key.resize(hp.n_head_kv);
  other.value.resize(hp.n_head_kv);
  other.key_bits.resize(hp.n_head_kv);
  other.value_bits.resize(hp.n_head_kv);
  other.save(path, "x");
  auto bad = make_press_impl("latent:file=" + path, 0.0);
  Session s2(model, SessionOptions{});
  EXPECT_THROW(prefill_and_compress(s2, *bad, story_tokens(20), 0, nullptr, nullptr), Error);
  std::remove(path.c_str());
}

// Regression: with file=, a single k_bits / v_bits was silently
// dropped (the file's bits were used), and k_rank / energy / share were ignored. Bits given in the
// spec now replace the file's on their side; the per-request bases' parameters are errors.
TEST(PressLatent, FileBitsGivenInTheSpecReplaceTheFilesAndPerRequestParametersAreErrors) {
  const Model& model = bundled_model();
  const HParams& hp = model.hparams();
  LatentCalibration opt;
  opt.k_rank = opt.v_rank = hp.head_dim;
  opt.k_bits = 8;
  opt.v_bits = 4;
  LatentBases b = calibrate_latent(model, {story_tokens(100)}, opt, nullptr);
  const std::string path =
      (std::filesystem::temp_directory_path() / fmt::format("kvslim_latent_bits_{}.gguf", ::getpid())).string();
  b.save(path, "stories260K");
  const size_t segs = static_cast<size_t>(hp.n_layer) * hp.n_head_kv, r = hp.head_dim, n = 40;
  // Bytes by hand, per-channel scales: per entry ceil(r * bits / 8) codes + 1 widening byte per
  // side + a 4-byte position; per segment side r (center, step) f32 pairs.
  auto bytes = [&](size_t kb, size_t vb) {
    return segs * n * (((r * kb + 7) / 8 + 1) + ((r * vb + 7) / 8 + 1) + 4) + segs * 2 * r * 2 * 4;
  };
  struct Case {
    std::string extra;
    int kb, vb;
  };
  for (const Case& c : {Case{"", 8, 4}, Case{",k_bits=2", 2, 4}, Case{",v_bits=8", 8, 8},
                        Case{",k_bits=4,v_bits=2", 4, 2}}) {
    Session s(model, SessionOptions{});
    auto press = make_press_impl("latent:file=" + path + c.extra, 0.0);
    prefill_and_compress(s, *press, story_tokens(static_cast<int>(n)), 0, nullptr, nullptr);
    EXPECT_EQ(s.cache().seg(3, 1).latent_keys().bits(), c.kb) << c.extra;
    EXPECT_EQ(s.cache().seg(3, 1).latent_values().bits(), c.vb) << c.extra;
    EXPECT_EQ(s.cache().bytes(), bytes(c.kb, c.vb)) << c.extra;
    if (!c.extra.empty()) {
      EXPECT_NE(press->describe().find(c.extra.substr(1)), std::string::npos) << press->describe();
    }
  }
  for (const char* bad : {",k_rank=4", ",v_rank=8", ",energy=0.9", ",share=0.1", ",share_max=2"})
    EXPECT_THROW(make_press_impl("latent:file=" + path + bad, 0.0), Error) << bad;
  std::remove(path.c_str());
}

// Regression: think and latent both convert segments to latent codes once; the second stage of
// think+latent silently did nothing (memory ratio of think alone).
TEST(PressLatent, TwoLatentStagesInOneCompositionAreAnError) {
  for (const char* spec : {"think+latent:k_rank=8,v_rank=8,k_bits=8,v_bits=8", "latent+think", "latent+latent",
                           "kvzip+think+latent"})
    EXPECT_THROW(make_press_impl(spec, 0.5), Error) << spec;
  EXPECT_NO_THROW(make_press_impl("kvzip+latent:k_rank=8,v_rank=8,k_bits=8,v_bits=8", 0.5));
  EXPECT_NO_THROW(make_press_impl("kvzip+think", 0.5));
  // Candidates without the auto-budget: the message names the side that lists them, only.
  try {
    auto p = make_press_impl("latent:k_bits=8/4", 0.0);
    Session s(bundled_model(), SessionOptions{});
    prefill_and_compress(s, *p, story_tokens(20), 0, nullptr, nullptr);
    ADD_FAILURE() << "candidates without the auto-budget were accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("k_bits=8/4"), std::string::npos) << m;
    EXPECT_EQ(m.find("v_bits"), std::string::npos) << m;
  }
}

// Regression: latent:k_rank=9 on head_dim 8 ran rank 8 while the press named 9 (memory
// ratio 1.04 with f16 codes); cla:n=9 on 5 layers shared all 4 possible layers silently.
TEST(PressLatent, RanksAboveHeadDimAndClaCountsAboveTheLayersAreErrors) {
  const Model& model = bundled_model();
  const HParams& hp = model.hparams();
  for (const std::string& spec : {fmt::format("latent:k_rank={},v_rank=2", hp.head_dim + 1),
                                 fmt::format("latent:k_rank=2,v_rank={}", hp.head_dim + 4),
                                 fmt::format("latent:k_rank={}/2,v_rank=2,k_bits=8/4,per_layer=1", hp.head_dim + 1)}) {
    Session s(model, SessionOptions{});
    auto p = make_press_impl(spec, 0.0);
    EXPECT_THROW(prefill_and_compress(s, *p, story_tokens(20), 0, nullptr, nullptr), Error) << spec;
  }
  {
    Session s(model, SessionOptions{});
    auto p = make_press_impl(fmt::format("cla:n={}", hp.n_layer), 0.0);
    EXPECT_THROW(prefill_and_compress(s, *p, story_tokens(20), 0, nullptr, nullptr), Error);
  }
  // n = layers - 1: every layer reads layer 0's entries, so the cache holds layer 0's f16 entries
  // only: per entry and KV head 2 x head_dim f16 numbers and a 4-byte position.
  Session s(model, SessionOptions{});
  auto p = make_press_impl(fmt::format("cla:n={}", hp.n_layer - 1), 0.0);
  prefill_and_compress(s, *p, story_tokens(20), 0, nullptr, nullptr);
  EXPECT_EQ(s.cache().bytes(), static_cast<size_t>(hp.n_head_kv) * 20 * (2 * hp.head_dim * 2 + 4));
}

}  // namespace
