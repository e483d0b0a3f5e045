// Cross-layer sharing of latent bases (src/press/latent_share.h), per request and calibrated, the
// calibration's per-segment choice of ranks and bits for a byte budget, and cross-layer sharing of
// entries (press cla, KVCache::share_layer: CLA, arXiv 2405.12981, after training).
#include <cstdio>
#include <filesystem>
#include <functional>
#include <limits>

#include <unistd.h>

#include <fmt/format.h>

#include "kvslim/gguf.h"
#include "model/layer_hook.h"
#include "press/scorers/cross_layer.h"
#include "press/scorers/latent.h"
#include "run/prefill.h"
#include "train/latent_calibrate.h"
#include "press/latent_share.h"
#include "support/press_util.h"

using namespace press_test;

namespace {

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / fmt::format("kvslim_share_{}_{}", ::getpid(), name)).string();
}

// Four symmetric rows (+-a, +-b): mean 0, variances a^2 and b^2 along the two axes, no covariance.
std::vector<float> cross_rows(float a, float b) { return {a, b, -a, b, a, -b, -a, -b}; }

TEST(LatentShare, IdenticalLayersShareAndOrthogonalOnesDoNot) {
  // Layers 0 and 1 hold the same rows in span(e0, e1); layer 2's rows lie in span(e2, e3).
  const int hd = 4;
  std::vector<float> a = {3, 1, 0, 0, -3, 1, 0, 0, 3, -1, 0, 0, -3, -1, 0, 0};
  std::vector<float> c = {0, 0, 0.5f, 0.25f, 0, 0, -0.5f, 0.25f, 0, 0, 0.5f, -0.25f, 0, 0, -0.5f, -0.25f};
  std::vector<LayerRows> L = {{a.data(), 4}, {a.data(), 4}, {c.data(), 4}};
  const LatentShare s = share_adjacent_layers(L, hd, {2, 2, 2}, 0.99, 1e-9);
  EXPECT_EQ(s.group, (std::vector<int>{0, 0, 2}));
  EXPECT_EQ(s.n_groups(), 2);
  EXPECT_EQ(s.basis[0], s.basis[1]);
  EXPECT_NE(s.basis[1], s.basis[2]);
  // Rank 2 keeps all the variance of each layer, own or shared.
  for (int l = 0; l < 3; ++l) {
    EXPECT_NEAR(s.kept_own[l], 1.0, 1e-9);
    EXPECT_NEAR(s.kept[l], 1.0, 1e-6);
  }
  // With layer 2 forced in (tolerance 1), the pooled rank-2 basis is span(e0, e1) (pooled
  // variances 6 and 2/3 against 1/12 and 1/48 along e2, e3): it keeps nothing of layer 2.
  const LatentShare all = share_adjacent_layers(L, hd, {2, 2, 2}, 0.99, 1.0);
  EXPECT_EQ(all.group, (std::vector<int>{0, 0, 0}));
  EXPECT_NEAR(all.kept[2], 0.0, 1e-6);
  EXPECT_NEAR(latent_kept_fraction(*all.basis[2], c.data(), 4), 0.0, 1e-6);
  // Off: every layer alone.
  EXPECT_EQ(share_adjacent_layers(L, hd, {2, 2, 2}, 0.99, -1.0).n_groups(), 3);
  // share_max caps a group.
  const LatentShare capped = share_adjacent_layers({L[0], L[1], L[1]}, hd, {2, 2, 2}, 0.99, 1e-9, 2);
  EXPECT_EQ(capped.group, (std::vector<int>{0, 0, 2}));
}

TEST(LatentShare, KeptFractionsByHandDecideSharing) {
  // Layer A: variances 9 (e0) and 1 (e1); layer B: 1 and 4. Rank 1 on its own keeps 9/10 of A
  // and 4/5 of B. Pooled: variances (9+1)/2 = 5 along e0 and (1+4)/2 = 2.5 along e1, so the
  // shared axis is e0: it keeps 9/10 of A and 1/5 of B, a loss of 0.6 for B.
  const std::vector<float> A = cross_rows(3, 1), B = cross_rows(1, 2);
  const std::vector<LayerRows> L = {{A.data(), 4}, {B.data(), 4}};
  const LatentShare no = share_adjacent_layers(L, 2, {1, 1}, 0.99, 0.59);
  EXPECT_EQ(no.n_groups(), 2);
  EXPECT_NEAR(no.kept_own[0], 0.9, 1e-12);
  EXPECT_NEAR(no.kept_own[1], 0.8, 1e-12);
  const LatentShare yes = share_adjacent_layers(L, 2, {1, 1}, 0.99, 0.61);
  EXPECT_EQ(yes.n_groups(), 1);
  EXPECT_NEAR(yes.kept[0], 0.9, 1e-6);
  EXPECT_NEAR(yes.kept[1], 0.2, 1e-6);
  // The covariance-form fractions agree with reconstructing the rows.
  EXPECT_NEAR(latent_kept_fraction(*yes.basis[1], B.data(), 4), 0.2, 1e-6);
  EXPECT_NEAR(latent_kept_fraction(*yes.basis[0], A.data(), 4), 0.9, 1e-6);
  // Means count: B shifted by (0, 10). Pooled mean (0, 5); pooled variance along e1 is
  // (1 + 4) / 2 + 5^2 = 27.5 > 5 along e0, so the shared axis is e1, which carries B's spread (4 of
  // 5: kept 0.8, its own) and both offsets, but none of A's e0 variance: A keeps 1/10 (own 9/10).
  std::vector<float> Bs = B;
  for (size_t i = 1; i < Bs.size(); i += 2) Bs[i] += 10;
  const LatentShare shifted = share_adjacent_layers({L[0], {Bs.data(), 4}}, 2, {1, 1}, 0.99, 1.0);
  EXPECT_NEAR(shifted.kept[1], 0.8, 1e-6);
  EXPECT_NEAR(shifted.kept[0], 0.1, 1e-6);
  EXPECT_NEAR(latent_kept_fraction(*shifted.basis[0], A.data(), 4), 0.1, 1e-6);
  EXPECT_NEAR(latent_kept_fraction(*shifted.basis[1], Bs.data(), 4), 0.8, 1e-6);
  EXPECT_THROW(share_adjacent_layers({L[0], {B.data(), 0}}, 2, {1, 1}, 0.99, 0.1), Error);
}

// stories260K rewritten so that layer 1 computes exactly layer 0's keys and values: layer 0
// writes nothing to the residual stream (attention output and FFN down projections zeroed) and
// layer 1 has layer 0's attention norm and Q/K/V weights.
const Model& twin_model() {
  static std::unique_ptr<Model> m = [] {
    const std::string src = std::string(KVSLIM_SOURCE_DIR) + "/models/stories260K.gguf";
    const std::string dst = temp_path("twin.gguf");
    auto f = GGUFFile::open(src);
    GGUFWriter w;
    for (const auto& [k, v] : f->metadata()) w.set(k, v);
    for (const TensorInfo& t : f->tensors()) {
      const TensorInfo* from = &t;
      for (const char* part : {"attn_norm", "attn_q", "attn_k", "attn_v"})
        if (t.name == fmt::format("blk.1.{}.weight", part)) from = &f->tensor(fmt::format("blk.0.{}.weight", part));
      std::string bytes(static_cast<const char*>(from->data), from->nbytes);
      if (t.name == "blk.0.attn_output.weight" || t.name == "blk.0.ffn_down.weight")
        std::fill(bytes.begin(), bytes.end(), '\0');  // zero in f32 and in f16
      w.add_tensor(t.name, from->type, from->ne, bytes);
    }
    w.write(dst);
    auto model = Model::load(dst);
    std::remove(dst.c_str());
    return model;
  }();
  return *m;
}

std::vector<Token> tokens(int n) {
  std::vector<Token> t;
  for (int i = 0; i < n; ++i) t.push_back(static_cast<Token>(10 + (i * 17) % 300));
  return t;
}

TEST(LatentShare, PerRequestBasesOfIdenticalLayersAreSharedCountedOnceAndExact) {
  const Model& model = twin_model();
  const HParams& hp = model.hparams();
  const int H = hp.n_head_kv, hd = hp.head_dim, segs = hp.n_layer * H, n = 70;
  SessionOptions so;
  so.key_codec = so.value_codec = KVCodec::F32;
  // The construction: layer 1's keys and values equal layer 0's.
  Session full(model, so);
  auto none = make_press_impl("none", 0.0);
  prefill_and_compress(full, *none, tokens(n), 0, nullptr, nullptr);
  std::vector<float> k0(n * hd), k1(n * hd);
  full.cache().seg(0, 1).keys(0, n, k0.data());
  full.cache().seg(1, 1).keys(0, n, k1.data());
  ASSERT_EQ(k0, k1);

  Session own(model, so), shared(model, so);
  auto p_own = make_press_impl("latent:k_rank=3,v_rank=3,k_bits=32,v_bits=32", 0.0);
  auto p_sh = make_press_impl("latent:k_rank=3,v_rank=3,k_bits=32,v_bits=32,share=0.000001", 0.0);
  prefill_and_compress(own, *p_own, tokens(n), 0, nullptr, nullptr);
  prefill_and_compress(shared, *p_sh, tokens(n), 0, nullptr, nullptr);
  const KVCache& c = shared.cache();
  for (int h = 0; h < H; ++h) {
    EXPECT_EQ(&c.seg(0, h).latent_keys().basis(), &c.seg(1, h).latent_keys().basis()) << h;
    EXPECT_EQ(&c.seg(0, h).latent_values().basis(), &c.seg(1, h).latent_values().basis()) << h;
    for (int l = 2; l < hp.n_layer; ++l)
      EXPECT_NE(&c.seg(l - 1, h).latent_keys().basis(), &c.seg(l, h).latent_keys().basis()) << l << " " << h;
  }
  // Bytes by hand: f32 codes, rank 3 per side (12 bytes each) and a 4-byte position per entry;
  // a dense rank-3 basis is 3 x head_dim + head_dim (mean) + 3 (scales) f32 values. Own bases:
  // two per segment; shared: layers 0 and 1 hold one pair per KV head.
  const size_t rows = static_cast<size_t>(segs) * n * (12 + 12 + 4);
  const size_t basis = (3 * hd + hd + 3) * 4;
  EXPECT_EQ(own.cache().bytes(), rows + 2 * segs * basis);
  EXPECT_EQ(c.bytes(), rows + 2 * (segs - H) * basis);
  EXPECT_EQ(c.basis_bytes(), 2 * (segs - H) * basis);
  // Identical layers: the pooled basis is their own basis, so attention is the same.
  auto a = own.forward({7, 8, 9}), b = shared.forward({7, 8, 9});
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-3f) << i;
  // Decode entries are encoded in the shared bases too (the bases stay counted once).
  EXPECT_EQ(c.bytes(), static_cast<size_t>(segs) * (n + 3) * 28 + 2 * (segs - H) * basis);
  EXPECT_THROW(make_press_impl("latent:share=2", 0.0), Error);
  EXPECT_THROW(make_press_impl("latent:share=x", 0.0), Error);
  EXPECT_THROW(make_press_impl("latent:share=0.1,share_max=-1", 0.0), Error);
}

TEST(LatentShare, CalibrationWritesSharedLayersAndPerSegmentBits) {
  const Model& model = twin_model();
  const HParams& hp = model.hparams();
  const int H = hp.n_head_kv, hd = hp.head_dim, S = hp.n_layer * H;
  LatentCalibration opt;
  opt.k_rank = opt.v_rank = 4;
  opt.k_bits = opt.v_bits = 8;
  opt.share = 1e-6;
  std::vector<std::string> report;
  LatentBases b = calibrate_latent(model, {tokens(120), tokens(60)}, opt, &report);
  for (int h = 0; h < H; ++h) {
    EXPECT_EQ(b.key[h], b.key[H + h]);
    EXPECT_EQ(b.value[h], b.value[H + h]);
    EXPECT_NE(b.key[H + h], b.key[2 * H + h]);
    EXPECT_NE(report[H + h].find("(basis of layer 0)"), std::string::npos) << report[H + h];
  }
  const std::string path = temp_path("bases.gguf");
  b.save(path, "twin");
  LatentBases r = LatentBases::load(path);
  auto f = GGUFFile::open(path);
  const std::vector<int32_t> src = f->get_int_array("latent.key_source");
  for (int u = 0; u < S; ++u) EXPECT_EQ(src[u], u / H == 1 ? u - H : u) << u;
  EXPECT_EQ(r.key[0], r.key[H]);
  // Shared memory counted once: (S - H) distinct key and value bases of rank 4.
  Session s(model, SessionOptions{});
  auto press = make_press_impl("latent:file=" + path, 0.0);
  prefill_and_compress(s, *press, tokens(30), 0, nullptr, nullptr);
  EXPECT_EQ(s.cache().shared_bytes(), 2 * static_cast<size_t>(S - H) * (4 * hd + hd + 4) * 4);
  std::remove(path.c_str());

  // Ranks and bits per segment side for a byte budget: the bits vary, the budget holds, and the
  // press applies each segment's bits.
  LatentCalibration ab;
  ab.memory_ratio = 0.3;
  ab.auto_bits = true;
  LatentBases m = calibrate_latent(model, {tokens(120)}, ab);
  size_t entry = 0;
  for (int u = 0; u < S; ++u) {
    entry += latent_row_bytes(m.key[u]->rank(), m.key_bits[u]) + latent_row_bytes(m.value[u]->rank(), m.value_bits[u]) + 4;
    EXPECT_TRUE(m.key_bits[u] == 2 || m.key_bits[u] == 4 || m.key_bits[u] == 8);
  }
  EXPECT_LE(entry / (S * (4.0 * hd + 4)), 0.3 + 1e-9);
  EXPECT_GT(entry / (S * (4.0 * hd + 4)), 0.2);
  m.save(path, "twin");
  Session s2(model, SessionOptions{});
  auto p2 = make_press_impl("latent:file=" + path, 0.0);
  prefill_and_compress(s2, *p2, tokens(30), 0, nullptr, nullptr);
  for (int u = 0; u < S; ++u) {
    EXPECT_EQ(s2.cache().seg(u / H, u % H).latent_keys().bits(), m.key_bits[u]);
    EXPECT_EQ(s2.cache().seg(u / H, u % H).latent_values().rank(), m.value[u]->rank());
  }
  std::remove(path.c_str());
  ab.memory_ratio = 0.05;  // less than rank 1 at 2 bits plus the position
  EXPECT_THROW(calibrate_latent(model, {tokens(20)}, ab), Error);
}


// Entries of one head_dim-2 f32 cache, written by hand.
void put(KVCache& c, int layer, float k0, float k1, float v0, float v1, int32_t pos) {
  const float k[2] = {k0, k1}, v[2] = {v0, v1};
  c.seg(layer, 0).append(k, v, pos);
}

TEST(CrossLayerEntries, DifferenceBySharedPositionsAndSourcesByHand) {
  KVCache c(3, 1, 2, KVCodec::F32, KVCodec::F32);
  put(c, 0, 1, 0, 0, 1, 0);
  put(c, 0, 0, 2, 1, 1, 1);
  put(c, 1, 0, 1, 1, 1, 1);  // position 1: key differs by (0, -1), value equal
  put(c, 1, 3, 3, 3, 3, 5);  // position 5: not in layer 0, ignored
  put(c, 2, 1, 1, 1, 1, 7);  // no position in common with layer 0
  // Keys: |(0,1) - (0,2)|^2 / |(0,1)|^2 = 1 / 1; values: 0 / 2. The larger: 1.
  EXPECT_DOUBLE_EQ(cross_layer_difference(c, 1, 0), 1.0);
  EXPECT_EQ(cross_layer_difference(c, 2, 0), std::numeric_limits<double>::infinity());
  // Layer 0 against layer 1 (position 1 only): keys 1 / 4, values 0 / 2.
  EXPECT_DOUBLE_EQ(cross_layer_difference(c, 0, 1), 0.25);

  const size_t entry = 2 * 2 * 4 + 4;  // f32 key and value of 2 values, 4-byte position
  EXPECT_EQ(c.bytes(), 5 * entry);
  EXPECT_FALSE(c.shares_layers());
  EXPECT_THROW(c.share_layer(0, 0), Error);
  EXPECT_THROW(c.share_layer(1, 1), Error);
  EXPECT_THROW(c.share_layer(1, 2), Error);
  EXPECT_THROW(c.share_layer(3, 0), Error);
  c.share_layer(1, 0);
  EXPECT_TRUE(c.shares_layers());
  EXPECT_EQ(c.source(0), 0);
  EXPECT_EQ(c.source(1), 0);
  EXPECT_EQ(c.source(2), 2);
  EXPECT_EQ(c.entries(1), 0u);
  EXPECT_EQ(c.bytes(), 3 * entry);  // layer 1's two entries freed
  c.share_layer(2, 1);              // layer 1 reads layer 0: so does layer 2
  EXPECT_EQ(c.source(2), 0);
  EXPECT_EQ(c.bytes(), 2 * entry);
  c.clear();
  EXPECT_FALSE(c.shares_layers());
  EXPECT_EQ(c.source(2), 2);
}

class AnyHook : public LayerHook {};

// In the twin model layer 1 computes layer 0's keys and values bit for bit, so layer 1 reading
// layer 0's entries (CLA) leaves every logit unchanged, while layer 1's segments are freed.
TEST(CrossLayerEntries, IdenticalLayersShareEntriesExactlyAndFreeTheirBytes) {
  const Model& model = twin_model();
  const HParams& hp = model.hparams();
  const int L = hp.n_layer, H = hp.n_head_kv, hd = hp.head_dim, n = 70;
  Session own(model, SessionOptions{}), shared(model, SessionOptions{}), batched(model, SessionOptions{});
  auto none = make_press_impl("none", 0.0);
  auto cla = make_press_impl("cla:tol=0", 0.0);  // shares exactly the layers whose entries are equal
  prefill_and_compress(own, *none, tokens(n), 0, nullptr, nullptr);
  prefill_and_compress(shared, *cla, tokens(n), 0, nullptr, nullptr);
  auto cla1 = make_press_impl("cla:n=1", 0.0);  // the one layer closest to its predecessor: layer 1
  prefill_and_compress(batched, *cla1, tokens(n), 0, nullptr, nullptr);
  const KVCache& c = shared.cache();
  for (const KVCache* k : {&c, static_cast<const KVCache*>(&batched.cache())}) {
    EXPECT_EQ(k->source(1), 0);
    for (int l = 2; l < L; ++l) EXPECT_EQ(k->source(l), l) << l;
    EXPECT_EQ(k->entries(1), 0u);
  }
  // Bytes by hand: an f16 entry is a key and a value of head_dim 2-byte values plus a 4-byte
  // position; layer 1 holds none.
  const size_t entry = 2 * hd * 2 + 4;
  EXPECT_EQ(own.cache().bytes(), static_cast<size_t>(L) * H * n * entry);
  EXPECT_EQ(c.bytes(), static_cast<size_t>(L - 1) * H * n * entry);
  EXPECT_EQ(c.full_f16_bytes(n), own.cache().bytes());
  for (Token t : {7, 8, 9}) {
    const std::vector<float> a = own.forward({t}), b = shared.forward({t});
    const std::vector<float> d = Session::decode_batch({&batched}, {t});
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(a[i], b[i]) << "token " << t << " logit " << i;
      ASSERT_EQ(a[i], d[i]) << "token " << t << " logit " << i << " (decode_batch)";
    }
  }
  // Decode entries are stored once, in layer 0.
  EXPECT_EQ(c.bytes(), static_cast<size_t>(L - 1) * H * (n + 3) * entry);
  EXPECT_EQ(c.entries(1), 0u);
  EXPECT_EQ(c.entries(0), static_cast<size_t>(H) * (n + 3));
  // A press that observes the forward pass cannot run on shared layers.
  AnyHook hook;
  EXPECT_THROW(shared.forward({7}, false, &hook), Error);
  // Parameters.
  EXPECT_EQ(make_press_impl("cla:layers=3/1", 0.0)->describe(), "cla:layers=1/3");
  EXPECT_THROW(make_press_impl("cla:layers=0", 0.0), Error);
  EXPECT_THROW(make_press_impl("cla:layers=1/x", 0.0), Error);
  EXPECT_THROW(make_press_impl("cla:layers=1,n=1", 0.0), Error);
  EXPECT_THROW(make_press_impl("cla:n=-1", 0.0), Error);
  EXPECT_THROW(make_press_impl("cla:tol=-1", 0.0), Error);
  Session bad(model, SessionOptions{});
  auto p9 = make_press_impl("cla:layers=9", 0.0);
  EXPECT_THROW(prefill_and_compress(bad, *p9, tokens(8), 0, nullptr, nullptr), Error);
}

}  // namespace
