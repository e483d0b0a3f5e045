// Long-context hygiene: llama.cpp's RoPE flags (YaRN and linear scaling checked against float64
// re-computations from the formulas), the memory estimate printed before a run (checked against
// the cache's measured bytes and the peak RSS of a run), a 131072-token context on a model trained
// for it without the cache allocated up front, and progress lines in a log.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <regex>
#include <string>
#include <vector>

#include "cli/memory_estimate.h"
#include "cli/progress.h"
#include "kvslim/gguf.h"
#include "kvslim/model.h"
#include "kvslim/press.h"
#include "model/session.h"
#include "kvslim/synth.h"
#include "model/rope.h"
#include "support/files.h"
#include "support/shell.h"

using namespace kvslim;

namespace {

const std::string kModel = std::string(KVSLIM_SOURCE_DIR) + "/models/stories260K.gguf";

struct Result {
  int rc = -1;
  std::string out, err;
  long max_rss_kb = 0;  ///< the largest resident set of the children waited for so far
};

Result run_cli(const std::string& args, const std::string& env = "") {
  const std::string out = temp_path("lc_stdout.txt"), err = temp_path("lc_stderr.txt");
  const std::string cmd =
      env + " " + quote(KVSLIM_CLI) + " " + args + " >" + quote(out) + " 2>" + quote(err) + " </dev/null";
  const int st = std::system(cmd.c_str());
  Result r;
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  r.out = slurp(out);
  r.err = slurp(err);
  rusage ru{};
  getrusage(RUSAGE_CHILDREN, &ru);
  r.max_rss_kb = ru.ru_maxrss;
  return r;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

/// stories260K with metadata changed by `edit`.
void rewrite_model(const std::string& dst, const std::function<void(GGUFWriter&)>& edit) {
  auto f = GGUFFile::open(kModel);
  GGUFWriter w;
  for (const auto& [k, v] : f->metadata()) w.set(k, v);
  edit(w);
  for (const TensorInfo& t : f->tensors())
    w.add_tensor(t.name, t.type, t.ne, std::string(static_cast<const char*>(t.data), t.nbytes));
  w.write(dst);
}

HParams yarn_hparams() {
  HParams hp;
  hp.arch = "llama";
  hp.head_dim = 64;
  hp.n_ctx_train = 32768;
  hp.rope_freq_base = 10000.0f;
  hp.rope_scaling = RopeScaling::Yarn;
  hp.rope_freq_scale = 1.0f / 8.0f;
  hp.yarn_ext_factor = 1.0f;
  hp.yarn_attn_factor = 1.0f;
  hp.yarn_beta_fast = 32.0f;
  hp.yarn_beta_slow = 1.0f;
  hp.yarn_orig_ctx = 4096;
  return hp;
}

// YaRN (arXiv 2309.00071, section 3) recomputed in float64 from its definitions: pair d has
// wavelength lambda_d = 2 pi b^(2d/|D|); it makes r_d = L / lambda_d turns over the original
// context L. Pairs with r_d > beta keep their frequency (extrapolation), pairs with r_d < alpha
// are interpolated by the scale s; the correction dimensions where r_d equals beta (fast) and
// alpha (slow), rounded outwards, bound a ramp linear in d between them, as in the authors' code
// (find_correction_range, linear_ramp_mask) that llama.cpp follows. Magnitude: 0.1 ln s + 1.
struct YarnReference {
  double angle, magnitude;
};
YarnReference yarn_reference(int d, double position, double base, int dims, double L, double s, double alpha,
                             double beta) {
  const double theta = std::pow(base, -2.0 * d / dims);  // radians per position
  // r_d = L / (2 pi b^(2d/|D|)) = n  <=>  d = |D| ln(L / (2 pi n)) / (2 ln b)
  auto dim_of = [&](double n) { return dims * std::log(L / (2 * M_PI * n)) / (2 * std::log(base)); };
  const double low = std::max(0.0, std::floor(dim_of(beta))), high = std::min(dims - 1.0, std::ceil(dim_of(alpha)));
  double ramp = (d - low) / std::max(0.001, high - low);
  ramp = std::clamp(ramp, 0.0, 1.0);
  const double extrapolated = 1.0 - ramp;  // share of the original frequency
  const double freq = theta / s * (1.0 - extrapolated) + theta * extrapolated;
  return {position * freq, 0.1 * std::log(s) + 1.0};
}

}  // namespace

TEST(CliRope, YarnRotationMatchesTheFormulas) {
  const HParams hp = yarn_hparams();
  const std::vector<int32_t> pos = {0, 1, 17, 4095, 4096, 30000};
  std::vector<float> cs, sn;
  rope::tables(hp, {}, pos.data(), static_cast<int>(pos.size()), cs, sn);
  const int half = hp.head_dim / 2;
  int ramp_pairs = 0;
  for (size_t t = 0; t < pos.size(); ++t)
    for (int d = 0; d < half; ++d) {
      const YarnReference r = yarn_reference(d, pos[t], 10000.0, hp.head_dim, 4096, 8.0, 1.0, 32.0);
      EXPECT_NEAR(cs[t * half + d], std::cos(r.angle) * r.magnitude, 2e-6) << "pos " << pos[t] << " pair " << d;
      EXPECT_NEAR(sn[t * half + d], std::sin(r.angle) * r.magnitude, 2e-6) << "pos " << pos[t] << " pair " << d;
    }
  // The test covers all three regions: pure extrapolation, the ramp and pure interpolation.
  double low, high;
  rope::yarn_corr_dims(hp, low, high);
  for (int d = 0; d < half; ++d) ramp_pairs += d > low && d < high;
  EXPECT_GT(low, 0.0);
  EXPECT_LT(high, half - 1.0);
  EXPECT_GT(ramp_pairs, 3);
  // And the magnitude is not 1: 0.1 ln 8 + 1.
  EXPECT_NEAR(rope::magnitude(hp), 1.2079441541679836, 1e-12);
  // --yarn-attn-factor multiplies it.
  HParams twice = hp;
  twice.yarn_attn_factor = 2.0f;
  EXPECT_NEAR(rope::magnitude(twice), 2 * 1.2079441541679836, 1e-12);
}

TEST(CliRope, YarnWithoutExtrapolationIsLinearScaling) {
  HParams hp = yarn_hparams();
  hp.yarn_ext_factor = 0.0f;  // llama.cpp's --yarn-ext-factor 0: full interpolation, magnitude 1
  const std::vector<double> f = rope::inv_freq(hp, {});
  for (int d = 0; d < hp.head_dim / 2; ++d) EXPECT_DOUBLE_EQ(f[d], std::pow(10000.0, -2.0 * d / 64) / 8.0);
  EXPECT_EQ(rope::magnitude(hp), 1.0);
}

TEST(CliRope, LinearScalingDividesPositionsByTheFactor) {
  HParams plain;
  plain.head_dim = 64;
  plain.rope_freq_base = 500000.0f;
  HParams scaled = plain;
  scaled.rope_scaling = RopeScaling::Linear;
  scaled.rope_freq_scale = 0.25f;
  const std::vector<int32_t> p = {0, 4, 400, 131068}, q = {0, 1, 100, 32767};
  std::vector<float> cs, sn, cs0, sn0;
  rope::tables(scaled, {}, p.data(), 4, cs, sn);
  rope::tables(plain, {}, q.data(), 4, cs0, sn0);
  EXPECT_EQ(cs, cs0);
  EXPECT_EQ(sn, sn0);
}

TEST(CliRope, OverridesEqualTheSameMetadata) {
  const std::string meta = temp_path("yarn_meta.gguf");
  rewrite_model(meta, [](GGUFWriter& w) {
    w.set("llama.rope.scaling.type", GGUFValue::str("yarn"));
    w.set("llama.rope.scaling.factor", GGUFValue::f32(4.0f));
    w.set("llama.rope.scaling.original_context_length", GGUFValue::u32(256));
    w.set("llama.rope.scaling.yarn_beta_fast", GGUFValue::f32(2.0f));
  });
  ModelLoadOptions o;
  o.rope.scaling = RopeScaling::Yarn;
  o.rope.freq_scale = 0.25f;
  o.rope.yarn_orig_ctx = 256;
  o.rope.yarn_beta_fast = 2.0f;
  auto by_meta = Model::load(meta), by_flags = Model::load(kModel, o), plain = Model::load(kModel);
  EXPECT_EQ(by_meta->hparams().yarn_ext_factor, 1.0f);
  EXPECT_EQ(by_flags->hparams().yarn_ext_factor, 1.0f);
  EXPECT_EQ(by_flags->hparams().yarn_orig_ctx, 256);
  std::vector<Token> toks;
  for (int i = 0; i < 300; ++i) toks.push_back(static_cast<Token>(1 + (i * 37) % 500));
  auto logits = [&](const Model& m) {
    Session s(m, SessionOptions{});
    return s.forward(toks);
  };
  const std::vector<float> a = logits(*by_meta), b = logits(*by_flags), c = logits(*plain);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  // A flag overrides the file: --rope-scaling none on the YaRN file gives the plain model.
  ModelLoadOptions none;
  none.rope.scaling = RopeScaling::None;
  EXPECT_EQ(logits(*Model::load(meta, none)), c);
  // Without the beta the rotation differs: head_dim 8 over 256 tokens puts beta 2 at pair 1.3, beta 32 at 0.1.
  ModelLoadOptions o32 = o;
  o32.rope.yarn_beta_fast.reset();
  EXPECT_NE(logits(*Model::load(kModel, o32)), a);
  // Metadata out of range names the key.
  const std::string bad = temp_path("yarn_bad.gguf");
  rewrite_model(bad, [](GGUFWriter& w) { w.set("llama.rope.scaling.yarn_beta_slow", GGUFValue::f32(0.0f)); });
  try {
    Model::load(bad);
    ADD_FAILURE() << "loaded a zero yarn_beta_slow";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "llama.rope.scaling.yarn_beta_slow = 0")) << e.what();
  }
  std::remove(bad.c_str());
  std::remove(meta.c_str());
}

TEST(CliRope, FlagsChangeGenerateExactlyAsMetadataDoes) {
  const std::string meta = temp_path("yarn_meta_cli.gguf");
  rewrite_model(meta, [](GGUFWriter& w) {
    w.set("llama.rope.scaling.type", GGUFValue::str("yarn"));
    w.set("llama.rope.scaling.factor", GGUFValue::f32(4.0f));
    w.set("llama.rope.scaling.original_context_length", GGUFValue::u32(128));
    w.set("llama.rope.freq_base", GGUFValue::f32(20000.0f));
  });
  const std::string prompt = " -p \"$(printf 'Once upon a time there was a girl named Lily. %.0s' $(seq 20))\" -n 12 --temp 0 "
                             "--no-display-prompt ";
  const Result by_meta = run_cli("generate -m " + quote(meta) + prompt);
  const Result by_flags = run_cli("generate -m " + quote(kModel) + prompt +
                                  "--rope-scaling yarn --rope-scale 4 --yarn-orig-ctx 128 --rope-freq-base 20000");
  const Result plain = run_cli("generate -m " + quote(kModel) + prompt);
  ASSERT_EQ(by_meta.rc, 0) << by_meta.err;
  ASSERT_EQ(by_flags.rc, 0) << by_flags.err;
  ASSERT_EQ(plain.rc, 0) << plain.err;
  EXPECT_EQ(by_meta.out, by_flags.out);
  EXPECT_NE(by_meta.out, plain.out);
  std::remove(meta.c_str());
}

TEST(CliRope, BadValuesNameTheFlagAndTheValue) {
  const std::string g = "generate -m " + quote(kModel) + " -p hi -n 1 ";
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"--rope-freq-base -1", {"--rope-freq-base", "-1"}},
      {"--rope-freq-base nan", {"--rope-freq-base", "nan"}},
      {"--rope-scale 0", {"--rope-scale", "0"}},
      {"--rope-freq-scale -2", {"--rope-freq-scale", "-2"}},
      {"--rope-scaling yaml", {"--rope-scaling", "yaml"}},
      {"--yarn-orig-ctx -5", {"--yarn-orig-ctx", "-5"}},
      {"--yarn-orig-ctx 12.5", {"--yarn-orig-ctx", "12.5"}},
      {"--yarn-ext-factor inf", {"--yarn-ext-factor", "inf"}},
      {"--yarn-attn-factor 0", {"--yarn-attn-factor", "0"}},
      {"--yarn-beta-fast 0", {"--yarn-beta-fast", "0"}},
      {"--yarn-beta-slow abc", {"--yarn-beta-slow", "abc"}},
      {"--rope-scale 4 --rope-freq-scale 0.25", {"--rope-freq-scale", "--rope-scale"}},
  };
  for (const auto& [flags, parts] : cases) {
    SCOPED_TRACE(flags);
    const Result r = run_cli(g + flags);
    EXPECT_NE(r.rc, 0) << r.err;
    EXPECT_LT(r.rc, 128) << r.err;
    for (const std::string& p : parts) EXPECT_TRUE(contains(r.err, p)) << r.err;
  }
  // Every command that loads a model takes them.
  for (const char* cmd :
       {"bench", "serve", "eval fidelity", "eval niah", "context build", "attention-stats", "ea-stats", "kvzap-train"}) {
    const Result r = run_cli(std::string(cmd) + " --help");
    EXPECT_TRUE(contains(r.out, "--yarn-beta-fast")) << cmd << ": " << r.out;
  }
  // 0 and -1 are llama.cpp's "the model's" values, accepted.
  const Result ok = run_cli(g + "--rope-freq-base 0 --rope-freq-scale 0 --yarn-ext-factor -1 --yarn-attn-factor -1");
  EXPECT_EQ(ok.rc, 0) << ok.err;
}

TEST(CliRope, StoredContextRefusesOtherRopeSettings) {
  const std::string ctx = temp_path("rope.ctx");
  const std::string build = "context build -m " + quote(kModel) + " -p 'Once upon a time there was a girl.' -o " + quote(ctx);
  ASSERT_EQ(run_cli(build + " --rope-scaling yarn --rope-scale 2").rc, 0);
  const std::string ask = "generate -m " + quote(kModel) + " --context " + quote(ctx) + " --question ' She' -n 2 --temp 0";
  const Result other = run_cli(ask);
  EXPECT_NE(other.rc, 0);
  EXPECT_TRUE(contains(other.err, "rope_freq_scale")) << other.err;
  // Same scale, YaRN's extrapolation off: still another rotation.
  const Result ext = run_cli(ask + " --rope-scaling yarn --rope-scale 2 --yarn-ext-factor 0");
  EXPECT_NE(ext.rc, 0);
  EXPECT_TRUE(contains(ext.err, "yarn_ext_factor")) << ext.err;
  const Result same = run_cli(ask + " --rope-scaling yarn --rope-scale 2");
  EXPECT_EQ(same.rc, 0) << same.err;
  std::remove(ctx.c_str());
}

// The KV figure is KVCache::bytes of a cache filled that far, at every codec family.
TEST(CliMemory, KvEstimateMatchesTheMeasuredCache) {
  auto model = Model::load(kModel);
  const HParams& hp = model->hparams();
  struct Case {
    KVCodec k, v;
    KVQuantOptions q;
  };
  KVQuantOptions kivi;
  kivi.kivi_bits = 4;
  kivi.kivi_group = 32;
  kivi.kivi_residual = 64;
  for (const Case& c : {Case{KVCodec::F16, KVCodec::F16, {}}, Case{KVCodec::Q8_0, KVCodec::Q4_0, {}},
                        Case{KVCodec::F32, KVCodec::BF16, {}}, Case{KVCodec::F16, KVCodec::F16, kivi}}) {
    for (int n : {40, 700}) {
      SessionOptions so;
      so.key_codec = c.k, so.value_codec = c.v, so.kv_quant = c.q;
      Session s(*model, so);
      std::vector<Token> toks;
      for (int i = 0; i < n; ++i) toks.push_back(static_cast<Token>(1 + (i * 13) % 500));
      s.forward(toks);
      const cli::MemoryEstimate e = cli::estimate_memory(*model, c.k, c.v, c.q, static_cast<size_t>(n), 256);
      const double measured = double(s.cache().bytes());
      SCOPED_TRACE(describe_cache_config(c.k, c.v, c.q) + " n=" + std::to_string(n));
      EXPECT_NEAR(double(e.kv), measured, 0.01 * measured);
      EXPECT_EQ(e.weights, model->weight_bytes());
    }
  }
  // The scratch: 3 rows of n_embd, 2 of the query width, 2 of the KV width, 2 of n_ff and the
  // RoPE tables per token, plus one row of logits, in floats (counted by hand for stories260K:
  // n_embd 64, 8 heads x 8, 4 KV heads x 8, n_ff 172, vocabulary 512).
  EXPECT_EQ(cli::scratch_bytes(hp, 10), size_t(4) * (10 * (3 * 64 + 2 * 64 + 2 * 32 + 2 * 172 + 8) + 512));
}

TEST(CliMemory, PressBoundsTheCacheOnlyUnderChunkedPrefill) {
  const auto half = make_press_impl("snapkv", 0.5), budget = make_press_impl("snapkv:budget=1000", 0.0);
  EXPECT_EQ(cli::kv_entries(half.get(), 10000, 0, 0, 0), 10000u);      // compressed once, after the full prefill
  EXPECT_EQ(cli::kv_entries(half.get(), 10000, 0, 512, 0), 5512u);     // half of it plus one chunk
  EXPECT_EQ(cli::kv_entries(budget.get(), 10000, 0, 512, 0), 1512u);   // the budget plus one chunk
  EXPECT_EQ(cli::kv_entries(budget.get(), 10000, 2000, 512, 0), 3000u);  // then the question and decode
  EXPECT_EQ(cli::kv_entries(nullptr, 10000, 64, 512, 8192), 8192u);    // never past -c
}

// The printed total against the peak resident memory of a run: a one-layer model of Llama 3.2 1B's
// width, where weights and scratch are most of the memory. The process's own memory (binary,
// libraries, thread stacks: `kvslim --version`) is taken off; the weights are repacked one matrix
// at a time (KVSLIM_THREAD_MAJOR=0) so the file's pages are dropped as they are replaced. Within
// 20% + 8 MiB.
TEST(CliMemory, EstimateIsCloseToThePeakRss) {
  const std::string path = temp_path("l1b_mem.gguf");
  SynthOptions so;
  so.shape = "llama-3.2-1b", so.type = "q8_0", so.vocab_from = kModel, so.output = path, so.layers = 1;
  synth_model(so);
  const Result base = run_cli("--version");
  ASSERT_EQ(base.rc, 0);
  const Result r = run_cli("generate -m " + quote(path) +
                               " -p \"$(printf 'Once upon a time there was a girl named Lily. %.0s' $(seq 60))\" -n 4 "
                               "--temp 0 --cache-type-k f32 --cache-type-v f32",
                           "KVSLIM_THREAD_MAJOR=0");
  ASSERT_EQ(r.rc, 0) << r.err;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.err, m, std::regex(R"(memory: weights .* = ([0-9.]+) (GiB|MiB|KiB); available)")))
      << r.err;
  const double unit = m[2] == "GiB" ? 1024.0 * 1024 : m[2] == "MiB" ? 1024.0 : 1.0;
  const double estimate_kb = std::stod(m[1]) * unit;
  const double used_kb = double(r.max_rss_kb - base.max_rss_kb);
  EXPECT_NEAR(used_kb, estimate_kb, 0.2 * estimate_kb + 8192) << r.err;
  // The line names the cache's figures.
  EXPECT_TRUE(contains(r.err, "(f32, ")) << r.err;
  EXPECT_TRUE(contains(r.err, "1 layers x 8 KV heads")) << r.err;
  std::remove(path.c_str());
}

TEST(CliMemory, RefusesARunThatDoesNotFit) {
  // Under a 512 MiB address-space limit a 1048576-token f32 cache of stories260K (5 layers x 4 KV heads
  // x 8 dims, 68 bytes an entry: 1.33 GiB) does not fit. (A timeout ends the run should it start.)
  const std::string limit = "ulimit -v 524288; timeout 60";
  const Result r = run_cli("generate -m " + quote(kModel) +
                               " -p hi -n -1 -c 1048576 --cache-type-k f32 --cache-type-v f32",
                           limit);
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_TRUE(contains(r.err, "KV cache 1.33 GiB (f32, 1048576 tokens, 5 layers x 4 KV heads)")) << r.err;
  EXPECT_TRUE(contains(r.err, "available")) << r.err;
  EXPECT_TRUE(contains(r.err, "(-c)")) << r.err;
  EXPECT_TRUE(contains(r.err, "budget=")) << r.err;
  EXPECT_TRUE(contains(r.err, "--no-memory-check")) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;  // refused before anything ran
  // A press that keeps a budget during chunked prefill bounds the cache: 64 + one chunk of 64 entries.
  const Result bounded = run_cli("generate -m " + quote(kModel) + " -f " +
                                     quote(std::string(KVSLIM_SOURCE_DIR) + "/models/story.txt") +
                                     " -n 2 --temp 0 --press snapkv:budget=64 --chunk-size 64 -c 1048576",
                                 limit);
  EXPECT_EQ(bounded.rc, 0) << bounded.err;
  EXPECT_TRUE(contains(bounded.err, "(f16, 128 tokens,")) << bounded.err;
  // bench (under the same limit: a 16-million-token fill, 20 GiB in f32) and serve (without one: 4 slots
  // of 10^9 tokens, 5 TiB) refuse too.
  for (const auto& [cmd, env] :
       {std::pair{std::string("bench -m ") + quote(kModel) + " -p 8 -n 0 -r 1 -d 16000000", limit},
        std::pair{std::string("serve -m ") + quote(kModel) + " --port 0 -c 1000000000", std::string("timeout 60")}}) {
    const Result big = run_cli(cmd + " --cache-type-k f32 --cache-type-v f32", env);
    EXPECT_EQ(big.rc, 1) << cmd << ": " << big.err;
    EXPECT_TRUE(contains(big.err, "memory: weights")) << big.err;
    EXPECT_TRUE(contains(big.err, "--no-memory-check")) << big.err;
  }
  // Fewer tokens fit.
  const Result ok = run_cli("generate -m " + quote(kModel) + " -p hi -n 4 -c 1048576", limit);
  EXPECT_EQ(ok.rc, 0) << ok.err;
  EXPECT_TRUE(contains(ok.err, "memory: weights")) << ok.err;
}

// bench's estimate counts the decode tests' cache as the press leaves it: the depth compressed to the
// budget (64 entries, and one chunk of 64 while prefilling), then 2 decoded tokens and the first
// sampled one (regression: it counted the whole depth, 2,051 tokens, whatever the press).
TEST(CliMemory, BenchEstimateHonoursTheBudget) {
  const Result r = run_cli("bench -m " + quote(kModel) +
                           " -p 0 -n 2 -r 1 -d 2048 --press snapkv:budget=64 --chunk-size 64 --no-progress");
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "(f16, 128 tokens,")) << r.err;
  const Result full = run_cli("bench -m " + quote(kModel) + " -p 0 -n 2 -r 1 -d 2048 --no-progress");
  EXPECT_EQ(full.rc, 0) << full.err;
  EXPECT_TRUE(contains(full.err, "(f16, 2051 tokens,")) << full.err;
}

// KVzip replays each chunk at the positions after it, which bench's context (depth + decode tests)
// does not leave; -c gives the room, and a -c below what the tests reach names both figures.
TEST(CliLongContext, BenchContextSizeLeavesRoomForTheReplay) {
  const std::string base = "bench -m " + quote(kModel) + " -p 0 -n 2 -r 1 -d 256 --press kvzip:budget=32 --chunk-size 64 --no-progress";
  const Result tight = run_cli(base);
  EXPECT_NE(tight.rc, 0);
  EXPECT_TRUE(contains(tight.err, "raise -c")) << tight.err;
  const Result roomy = run_cli(base + " -c 512");
  EXPECT_EQ(roomy.rc, 0) << roomy.err;
  const Result small = run_cli(base + " -c 100");
  EXPECT_NE(small.rc, 0);
  EXPECT_TRUE(contains(small.err, "-c 100")) << small.err;
  EXPECT_TRUE(contains(small.err, "259")) << small.err;
}

// Llama 3.2 1B's shape is trained for 131072 tokens: -c 131072 runs without a warning and without
// the cache allocated up front (a full f16 cache of one layer would be 256 MiB); -c above it warns
// naming both figures, as llama.cpp does.
TEST(CliLongContext, TrainedContextOf131072) {
  const std::string path = temp_path("l1b_ctx.gguf");
  SynthOptions so;
  so.shape = "llama-3.2-1b", so.type = "q4_0", so.vocab_from = kModel, so.output = path, so.layers = 1;
  synth_model(so);
  ASSERT_EQ(Model::load(path)->hparams().n_ctx_train, 131072);
  const Result base = run_cli("--version");
  const Result r = run_cli("generate -m " + quote(path) + " -p 'Once upon a time' -n 4 --temp 0 -c 131072");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_FALSE(contains(r.err, "warning")) << r.err;
  EXPECT_LT(r.max_rss_kb - base.max_rss_kb, 200 * 1024) << r.err;
  const Result over = run_cli("generate -m " + quote(path) + " -p 'Once upon a time' -n 4 --temp 0 -c 262144");
  ASSERT_EQ(over.rc, 0) << over.err;
  EXPECT_TRUE(contains(over.err, "262144")) << over.err;
  EXPECT_TRUE(contains(over.err, "131072")) << over.err;
  EXPECT_TRUE(contains(over.err, "warning")) << over.err;
  std::remove(path.c_str());
}

// --progress on a stderr that is not a terminal: whole lines, at most one a second, with the rate,
// the time left and the cache's bytes.
TEST(Progress, LinesInALogAtMostOneASecond) {
  double now = 0;
  char* buf = nullptr;
  size_t len = 0;
  std::FILE* out = open_memstream(&buf, &len);
  {
    cli::Progress p(true, false, out, [&] { return now; }, true);
    ASSERT_TRUE(p.active());
    now = 0.5;
    p.prefill(512, 8192, 1 << 20);
    std::fflush(out);
    EXPECT_EQ(len, 0u);
    now = 2.0;
    p.prefill(2048, 8192, 4 << 20);
    now = 2.5;
    p.prefill(2560, 8192, 5 << 20);  // within the second: not written
    now = 4.0;
    p.prefill(4096, 8192, 8 << 20);
    p.clear();  // lines are not erased
  }
  std::fflush(out);
  const std::string s(buf, len);
  EXPECT_EQ(s, "prefill 2048/8192 tokens (25%), 1024.0 tokens/s, 2s elapsed, 6s left, KV 4.0 MiB\n"
               "prefill 4096/8192 tokens (50%), 1024.0 tokens/s, 4s elapsed, 4s left, KV 8.0 MiB\n");
  std::fclose(out);
  std::free(buf);
  // Without --progress a log gets nothing.
  cli::Progress quiet(true, false, stderr, [] { return 0.0; }, false);
  EXPECT_FALSE(quiet.active());
}
