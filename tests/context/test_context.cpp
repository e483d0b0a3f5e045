// Stored compressed contexts (kvslim/context.h): a context built, saved and loaded answers a question
// with bit-identical logits and tokens to the uncached run with the same split (generate's path:
// compress the context, append the question); every KV codec and one press of each family round-trips;
// presses with decode state are refused; a file of another model, another version, truncated or
// corrupted is a clean kvslim::Error.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>

#include "context/file.h"
#include "kv/store.h"
#include "kvslim/context.h"
#include "kvslim/gguf.h"
#include "support/files.h"
#include "support/shell.h"
#include "support/press_util.h"
#include "util/hash64.h"

using namespace kvslim;
using press_test::bundled_model;
using press_test::same_cache;

namespace {

const char* kDoc =
    "Once upon a time there was a little cat named Tom. Tom liked milk and naps in the sun. One day Tom found a "
    "red ball in the garden. He played with the ball all day long. His friend the dog came to play too. They ran "
    "and jumped until the sun went down. Then Tom went home and slept.";
const char* kQuestion = " What did Tom find? Tom found";

struct Cfg {
  Cfg(std::string n, KVCodec key = KVCodec::F16, KVCodec value = KVCodec::F16) : name(std::move(n)), k(key), v(value) {}
  std::string name;
  KVCodec k, v;
  KVQuantOptions q;
};

RequestOptions options(const Cfg& c, int n_predict, int chunk = 0) {
  RequestOptions o;
  o.n_predict = n_predict;
  o.sampling.temp = 0;
  o.chunk_size = chunk;
  o.session.key_codec = c.k;
  o.session.value_codec = c.v;
  o.session.kv_quant = c.q;
  return o;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

/// The reference (one Request over context + question, as `generate -f DOC --question Q`) against a
/// context built, saved to a file, loaded and asked the same question.
using CacheCheck = std::function<bool(const KVCache&)>;

/// The layout a press is meant to leave (so a round trip really covers it).
const CacheCheck kAny = [](const KVCache&) { return true; };
bool any_segment(const KVCache& c, const std::function<bool(const Segment&)>& f) {
  for (int l = 0; l < c.n_layer(); ++l)
    for (int h = 0; h < c.n_head_kv(); ++h)
      if (f(c.seg(l, h))) return true;
  return false;
}
const CacheCheck kLatent = [](const KVCache& c) { return any_segment(c, [](const Segment& s) { return s.latent(); }); };
const CacheCheck kTiers = [](const KVCache& c) {
  return any_segment(c, [](const Segment& s) { return s.low_tier_size() > 0; });
};
const CacheCheck kShared = [](const KVCache& c) { return c.shares_layers(); };
const CacheCheck kKiviGroupsAndWindow = [](const KVCache& c) {
  // Over every store: a request's cache reads the groups from the context's shared part.
  return any_segment(c, [](const Segment& s) {
    size_t groups = 0, rows = 0;
    for (int i = 0; i < s.n_stores(); ++i) {
      groups += s.store(i).group_entries();
      rows += s.store(i).row_entries();
    }
    return groups > 0 && rows > 0;
  });
};
const CacheCheck kMovedPositions = [](const KVCache& c) {
  // Re-rotation leaves positions contiguous up to the context's end, not the original ones.
  return any_segment(c, [](const Segment& s) { return !s.positions().empty() && s.positions()[0] != 0; });
};

void expect_round_trip(const Model& m, const std::string& spec, double ratio, const Cfg& c, int chunk = 0,
                       const char* doc = kDoc, const CacheCheck& layout = kAny) {
  SCOPED_TRACE(spec + " / " + c.name + (chunk ? " / chunks of " + std::to_string(chunk) : ""));
  const Tokenizer& tok = m.tokenizer();
  const std::vector<Token> question = tok.encode(kQuestion, false, false);
  const int n = 12;

  Request ref(m, make_press_impl(spec, ratio), options(c, n, chunk));
  ref.set_prompt(doc, kQuestion);
  ref.prefill();
  const std::vector<float> ref_first = ref.logits();
  ref.run();

  ContextOptions co;
  co.press = spec;
  co.ratio = ratio;
  co.chunk_size = chunk;
  co.session = options(c, 0).session;
  const Context built = Context::build(m, std::string(doc), co);
  const std::string path = temp_path("round_trip.kvc");
  built.save(path);
  const Context loaded = Context::load(m, path);
  std::remove(path.c_str());
  {
    std::unique_ptr<Request> probe = loaded.request(m, {}, options(c, 0));
    EXPECT_TRUE(layout(probe->cache())) << "the press did not leave the layout this case covers";
  }
  EXPECT_EQ(loaded.tokens(), ref.context_tokens());
  EXPECT_EQ(loaded.text(), doc);
  const ContextInfo info = loaded.info();
  EXPECT_EQ(info.entries_kept, ref.stats().entries_kept);
  EXPECT_EQ(info.kv_bytes, ref.stats().kv_bytes);
  EXPECT_GT(info.file_bytes, info.kv_bytes / 2);

  for (const Context* ctx : {&built, &loaded}) {
    std::unique_ptr<Request> req = ctx->request(m, question, options(c, n));
    req->prefill();
    EXPECT_TRUE(same_bits(req->logits(), ref_first)) << "logits after the question differ";
    req->run();
    EXPECT_EQ(req->generated(), ref.generated());
    EXPECT_TRUE(same_bits(req->logits(), ref.logits())) << "logits after the last decode step differ";
    EXPECT_TRUE(same_cache(req->cache(), ref.cache()));
    EXPECT_EQ(req->cache().bytes(), ref.cache().bytes());
    EXPECT_EQ(req->stats().entries_kept, ref.stats().entries_kept);
  }
}

std::string read_bytes(const std::string& path) { return slurp(path); }

/// A small stored context (snapkv over q8_0 keys and KIVI-free f16 values) as file bytes.
std::string small_file() {
  ContextOptions co;
  co.press = "snapkv:window=4";
  co.ratio = 0.5;
  co.session.key_codec = KVCodec::Q8_0;
  const std::string path = temp_path("small.kvc");
  Context::build(bundled_model(), std::string("Once upon a time there was a cat. It liked milk."), co).save(path);
  std::string bytes = read_bytes(path);
  std::remove(path.c_str());
  return bytes;
}

ContextInfo inspect_bytes(const std::string& b) {
  return context::inspect_image(reinterpret_cast<const uint8_t*>(b.data()), b.size(), "test image");
}

}  // namespace

TEST(Hash64, MatchesTheReferenceXXH64) {
  // Values from the reference implementation (libxxhash 0.8.1, XXH64(data, len, seed)).
  EXPECT_EQ(hash64("", 0), 0xef46db3751d8e999ull);
  EXPECT_EQ(hash64("a", 1), 0xd24ec4f1a98c6e5bull);
  EXPECT_EQ(hash64("abc", 3), 0x44bc2cf5ad770999ull);
  const std::string s = "Nobody inspects the spammish repetition";
  EXPECT_EQ(hash64(s.data(), s.size()), 0xfbcea83c8a378bf1ull);
  std::string big;
  for (int r = 0; r < 3; ++r)
    for (int i = 0; i < 256; ++i) big += static_cast<char>(i);
  big += "xyz";
  EXPECT_EQ(hash64(big.data(), big.size(), 0x9E3779B97F4A7C15ull), 0x179ca0201a65d20eull);
  std::string hundred;
  for (int i = 0; i < 100; ++i) hundred += static_cast<char>(i);
  EXPECT_EQ(hash64(hundred.data(), hundred.size(), 7), 0x80653e7e9b887cddull);
  // Streaming in uneven pieces gives the one-shot digest.
  for (size_t piece : {1u, 5u, 31u, 32u, 33u, 100u}) {
    Hash64 h(0x9E3779B97F4A7C15ull);
    for (size_t at = 0; at < big.size(); at += piece) h.update(big.data() + at, std::min(piece, big.size() - at));
    EXPECT_EQ(h.digest(), 0x179ca0201a65d20eull) << piece;
  }
}

TEST(StoredContext, EveryCodecRoundTripsBitIdentically) {
  const Model& m = bundled_model();
  std::vector<Cfg> cfgs = {{"f32", KVCodec::F32, KVCodec::F32}, {"f16", KVCodec::F16, KVCodec::F16},
                           {"bf16", KVCodec::BF16, KVCodec::BF16}, {"q8_0", KVCodec::Q8_0, KVCodec::Q8_0},
                           {"q4_0", KVCodec::Q4_0, KVCodec::Q4_0}, {"q8_0/q4_0", KVCodec::Q8_0, KVCodec::Q4_0}};
  for (int bits : {2, 4}) {
    Cfg c{"kivi" + std::to_string(bits)};
    c.q.kivi_bits = bits;
    c.q.kivi_group = 8;
    c.q.kivi_residual = 8;  // groups form, a residual window stays, and appending continues both
    cfgs.push_back(c);
  }
  Cfg had{"q8_0 + hadamard", KVCodec::Q8_0, KVCodec::Q8_0};
  had.q.hadamard = true;
  cfgs.push_back(had);
  for (const Cfg& c : cfgs) expect_round_trip(m, "snapkv:window=4", 0.5, c);
}

TEST(StoredContext, EachPressFamilyRoundTripsBitIdentically) {
  const Model& m = bundled_model();
  const Cfg f16{"f16"};
  Cfg q8{"q8_0", KVCodec::Q8_0, KVCodec::Q8_0};
  Cfg kivi{"kivi4"};
  kivi.q.kivi_bits = 4;
  kivi.q.kivi_group = 8;
  kivi.q.kivi_residual = 8;
  expect_round_trip(m, "adakv(snapkv:window=4)", 0.5, f16);           // scorer with a budget policy
  expect_round_trip(m, "adakv(snapkv:window=4)", 0.5, kivi, 0, kDoc, kKiviGroupsAndWindow);  // ... over KIVI groups
  expect_round_trip(m, "kvzip", 0.5, f16);                             // context reconstruction (replay)
  expect_round_trip(m, "snapkv:window=4+knorm", 0.4, q8);             // a composition over a quantized cache
  expect_round_trip(m, "leankv(snapkv:window=4)", 0.3, f16, 0, kDoc, kTiers);  // precision tiers (two stores)
  expect_round_trip(m, "latent:k_rank=4,v_rank=4,k_bits=4,v_bits=8", 0.0, f16, 0, kDoc, kLatent);  // codes, PCA bases
  expect_round_trip(m, "think:key_ratio=0.5", 0.0, f16, 0, kDoc, kLatent);  // channel-selection bases
  expect_round_trip(m, "cla:layers=1/3", 0.0, f16, 0, kDoc, kShared);        // cross-layer sharing
  expect_round_trip(m, "key_rerotation(streaming_llm)", 0.5, f16, 0, kDoc, kMovedPositions);  // positions moved
  expect_round_trip(m, "snapkv:window=4", 0.5, q8, /*chunk=*/16);     // chunked prefill
}

TEST(StoredContext, RetrievalModelRoundTrips) {
  static const std::unique_ptr<Model> m = Model::load(std::string(KVSLIM_SOURCE_DIR) + "/models/retrieval.gguf");
  const std::string doc = slurp(std::string(KVSLIM_SOURCE_DIR) + "/models/passkey.txt").substr(0, 1500);
  Cfg q8{"q8_0", KVCodec::Q8_0, KVCodec::Q8_0};
  expect_round_trip(*m, "adakv(snapkv)", 0.8, q8, 0, doc.c_str());
}

TEST(StoredContext, PressesWithDecodeStateAreRefused) {
  const Model& m = bundled_model();
  for (const std::string spec : {"h2o", "decoding(knorm)", "threshold(knorm,tau=-4,decode=1)", "clusterkv"}) {
    SCOPED_TRACE(spec);
    ContextOptions co;
    co.press = spec;
    co.ratio = 0.5;
    try {
      Context::build(m, std::string(kDoc), co);
      ADD_FAILURE() << "built";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("cannot be stored as a context"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("decode"), std::string::npos) << e.what();
    }
  }
  // The same scorer without decode-time eviction is storable.
  EXPECT_EQ(make_press_impl("threshold(knorm,tau=-4)", 0.0)->storage_refusal(), "");
}

TEST(StoredContext, AnotherModelIsRefusedNamingWhatDiffers) {
  const Model& m = bundled_model();
  const std::string path = temp_path("model_check.kvc");
  ContextOptions co;
  co.press = "snapkv";
  co.ratio = 0.5;
  Context::build(m, std::string(kDoc), co).save(path);
  // The same file with one weight changed: same shape, same vocabulary, other weights.
  const std::string model_path = temp_path("stories_rewritten.gguf");
  {
    auto f = GGUFFile::open(std::string(KVSLIM_SOURCE_DIR) + "/models/stories260K.gguf");
    GGUFWriter w;
    for (const auto& [k, v] : f->metadata()) w.set(k, v);
    for (const TensorInfo& t : f->tensors()) {
      std::string data(static_cast<const char*>(t.data), t.nbytes);
      if (t.name == "output_norm.weight") data[1] ^= 0x01;
      w.add_tensor(t.name, t.type, t.ne, data);
    }
    w.write(model_path);
  }
  auto other = Model::load(model_path);
  try {
    Context::load(*other, path);
    ADD_FAILURE() << "loaded for other weights";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor data digest"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  auto retrieval = Model::load(std::string(KVSLIM_SOURCE_DIR) + "/models/retrieval.gguf");
  try {
    Context::load(*retrieval, path);
    ADD_FAILURE() << "loaded for another model";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("another model"), std::string::npos) << e.what();
  }
  // A context held in memory checks the model it is asked with too.
  const Context c = Context::load(m, path);
  EXPECT_THROW(c.request(*other, {}), Error);
  std::remove(path.c_str());
  std::remove(model_path.c_str());
}

TEST(StoredContext, OtherVersionAndNotAContextFileAreNamed) {
  const std::string good = small_file();
  const std::string payload = good.substr(context::kHeaderBytes);
  try {
    inspect_bytes(context::file_image(payload, kContextFormatVersion + 1));
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("format version " + std::to_string(kContextFormatVersion + 1)),
              std::string::npos)
        << e.what();
  }
  try {
    inspect_bytes("GGUF and other bytes that are not a context, long enough for a header");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a kvslim context file"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(inspect_bytes(good));
  EXPECT_NO_THROW(inspect_bytes(context::file_image(payload)));
}

TEST(StoredContext, TruncationWalkGivesCleanErrors) {
  const std::string good = small_file();
  ASSERT_LT(good.size(), 200000u);
  // Every prefix of the file: the envelope catches it.
  for (size_t n = 0; n < good.size(); ++n) {
    try {
      inspect_bytes(good.substr(0, n));
      ADD_FAILURE() << "prefix of " << n << " bytes accepted";
    } catch (const Error& e) {
      const std::string w = e.what();
      EXPECT_TRUE(w.find("truncated") != std::string::npos || w.find("not a kvslim context") != std::string::npos)
          << n << ": " << w;
    }
  }
  // Every prefix of the payload behind a valid envelope: the payload reader catches it.
  const std::string payload = good.substr(context::kHeaderBytes);
  for (size_t n = 0; n < payload.size(); ++n) {
    try {
      inspect_bytes(context::file_image(payload.substr(0, n)));
      ADD_FAILURE() << "payload prefix of " << n << " bytes accepted";
    } catch (const Error&) {
    }
  }
  // A truncated file on disk, through the public reader.
  const std::string path = temp_path("truncated.kvc");
  {
    std::ofstream f(path, std::ios::binary);
    f.write(good.data(), static_cast<std::streamsize>(good.size() / 2));
  }
  try {
    Context::inspect(path);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
  }
  std::remove(path.c_str());
}

TEST(StoredContext, ByteFlipsGiveCleanErrors) {
  const std::string good = small_file();
  // In the file: the checksum (or the header check) catches every flip.
  for (size_t i = 0; i < good.size(); i += 7) {
    std::string b = good;
    b[i] ^= 0x5A;
    try {
      inspect_bytes(b);
      ADD_FAILURE() << "flip at " << i << " accepted";
    } catch (const Error& e) {
      if (i >= context::kHeaderBytes) {
        EXPECT_NE(std::string(e.what()).find("corrupted"), std::string::npos) << e.what();
      }
    }
  }
  // In the payload behind a recomputed checksum: a flip is either rejected cleanly or parses (a
  // changed code or logit); nothing reads out of bounds (sanitizer builds run this).
  const std::string payload = good.substr(context::kHeaderBytes);
  int rejected = 0;
  for (size_t i = 0; i < payload.size(); i += 3) {
    for (uint8_t mask : {uint8_t{0x01}, uint8_t{0x80}, uint8_t{0xFF}}) {
      std::string p = payload;
      p[i] = static_cast<char>(p[i] ^ mask);
      try {
        inspect_bytes(context::file_image(p));
      } catch (const Error&) {
        ++rejected;
      }
    }
  }
  EXPECT_GT(rejected, 0);
}

TEST(StoredContext, SaveIsAtomicAndNamesThePathOnFailure) {
  const std::string good = small_file();
  const std::string dir = temp_path("ctxdir");
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/doc.kvc";
  {
    std::ofstream f(path, std::ios::binary);
    f << "previous";
  }
  ContextOptions co;
  const Context c = Context::build(bundled_model(), std::string("Once upon a time"), co);
  c.save(path);
  EXPECT_NO_THROW(Context::inspect(path));
  EXPECT_EQ(c.info().file_bytes, std::filesystem::file_size(path));
  // Only the file itself is left (no temporary).
  size_t files = 0;
  for (auto& e : std::filesystem::directory_iterator(dir)) files += e.is_regular_file();
  EXPECT_EQ(files, 1u);
  try {
    c.save(dir + "/missing/doc.kvc");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(dir + "/missing/doc.kvc"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
  EXPECT_THROW(Context::inspect(dir + "/none.kvc"), Error);
}

TEST(StoredContext, EmptyQuestionContinuesFromTheStoredLogits) {
  const Model& m = bundled_model();
  const Cfg f16{"f16"};
  Request ref(m, make_press_impl("snapkv:window=4", 0.5), options(f16, 8));
  ref.set_prompt(kDoc);
  ref.run();
  ContextOptions co;
  co.press = "snapkv:window=4";
  co.ratio = 0.5;
  const Context c = Context::build(m, std::string(kDoc), co);
  auto req = c.request(m, {}, options(f16, 8));
  req->run();
  EXPECT_EQ(req->generated(), ref.generated());
  EXPECT_TRUE(same_bits(req->logits(), ref.logits()));
}

// ---- the CLI: `kvslim context build|info` and `generate --context` ----

namespace {

struct CliResult {
  int rc = -1;
  std::string out, err;
};

CliResult cli(const std::string& args) {
  const std::string out = temp_path("ctx_stdout.txt"), err = temp_path("ctx_stderr.txt");
  const std::string cmd = quote(KVSLIM_CLI) + " " + args + " >" + quote(out) + " 2>" + quote(err) + " </dev/null";
  const int st = std::system(cmd.c_str());
  CliResult r;
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

const std::string kSrc = KVSLIM_SOURCE_DIR;

/// `generate -f DOC --question Q` with press and cache flags against `context build` with the same
/// flags then `generate --context`: the same standard output (prompt echo and generated text).
void expect_same_cli_output(const std::string& model, const std::string& doc, const std::string& question,
                            const std::string& flags) {
  SCOPED_TRACE(model + " " + flags);
  const std::string kvc = temp_path("cli.kvc");
  const std::string common = "-m " + quote(model) + " -n 24 --temp 0 --no-progress";
  CliResult ref = cli("generate " + common + " -f " + quote(doc) + " --question " + quote(question) + " " + flags);
  ASSERT_EQ(ref.rc, 0) << ref.err;
  CliResult b = cli("context build -m " + quote(model) + " -f " + quote(doc) + " " + flags + " -o " + quote(kvc));
  ASSERT_EQ(b.rc, 0) << b.err;
  EXPECT_NE(b.out.find("memory ratio"), std::string::npos) << b.out;
  CliResult g = cli("generate " + common + " --context " + quote(kvc) + " --question " + quote(question));
  ASSERT_EQ(g.rc, 0) << g.err;
  EXPECT_EQ(g.out, ref.out);
  EXPECT_NE(g.err.find("stored context"), std::string::npos) << g.err;
  CliResult i = cli("context info " + quote(kvc));
  ASSERT_EQ(i.rc, 0) << i.err;
  for (const char* field : {"tokens", "press", "entries kept", "file bytes", "memory ratio", "fingerprint"})
    EXPECT_NE(i.out.find(field), std::string::npos) << field << " missing from:\n" << i.out;
  std::remove(kvc.c_str());
}

}  // namespace

TEST(StoredContextCli, GenerateFromAContextPrintsWhatGenerateFromTheDocumentPrints) {
  const std::string story = kSrc + "/models/story.txt", stories = kSrc + "/models/stories260K.gguf";
  expect_same_cli_output(stories, story, " Then the little girl",
                         "--press 'adakv(snapkv)' --compression-ratio 0.6 --cache-type-k q8_0 --cache-type-v q8_0");
  expect_same_cli_output(stories, story, " Then the little girl",
                         "--press kvzip --compression-ratio 0.5 --kivi-bits 2 --kivi-group 16 --kivi-residual 32");
  expect_same_cli_output(stories, story, " Then",
                         "--press snapkv --compression-ratio 0.5 --chunk-size 64 --cache-type-k q4_0");
  // The retrieval model: the passkey is answered from the stored context.
  const std::string doc = temp_path("passkey_doc.txt");
  {
    std::ofstream f(doc, std::ios::binary);
    f << slurp(kSrc + "/models/passkey.txt").substr(0, 3000);
  }
  expect_same_cli_output(kSrc + "/models/retrieval.gguf", doc, " The pass key is",
                         "--press 'adakv(snapkv)' --compression-ratio 0.9 --cache-type-k q8_0 --cache-type-v q8_0");
  std::remove(doc.c_str());
}

TEST(StoredContextCli, BadUsesAreCleanErrors) {
  const std::string stories = quote(kSrc + "/models/stories260K.gguf");
  const std::string kvc = temp_path("bad.kvc");
  CliResult r = cli("context build -m " + stories + " -p 'Once upon a time' --press h2o --compression-ratio 0.5 -o " +
                    quote(kvc));
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("cannot be stored as a context"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(kvc));
  ASSERT_EQ(cli("context build -m " + stories + " -p 'Once upon a time' -o " + quote(kvc)).rc, 0);
  r = cli("generate -m " + stories + " --context " + quote(kvc) + " --press snapkv");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("drop --press"), std::string::npos) << r.err;
  r = cli("generate -m " + stories + " --context " + quote(kvc) + " --cache-type-k q8_0");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("cache type"), std::string::npos) << r.err;
  r = cli("generate -m " + stories + " --context " + quote(kvc) + " -p hello");
  EXPECT_EQ(r.rc, 1);
  r = cli("generate -m " + quote(kSrc + "/models/retrieval.gguf") + " --context " + quote(kvc) + " --question hi");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("another model"), std::string::npos) << r.err;
  r = cli("context info " + quote(kSrc + "/models/stories260K.gguf"));
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("not a kvslim context file"), std::string::npos) << r.err;
  std::remove(kvc.c_str());
  r = cli("presses");
  EXPECT_NE(r.out.find("stored context: no:"), std::string::npos);
  EXPECT_NE(r.out.find("stored context: yes"), std::string::npos);
}

TEST(StoredContext, RestoringAMismatchedCacheIsRefused) {
  const Model& m = bundled_model();
  const HParams& hp = m.hparams();
  Session s(m, SessionOptions{});
  EXPECT_THROW(s.restore(KVCache(hp.n_layer + 1, hp.n_head_kv, hp.head_dim), 0), Error);
  KVCache c(hp.n_layer, hp.n_head_kv, hp.head_dim);
  std::vector<float> k(hp.head_dim, 0.5f), v(hp.head_dim, 0.25f);
  c.seg(0, 0).append(k.data(), v.data(), 9);
  EXPECT_THROW(s.restore(c, 5), Error);           // before the cache's last position
  EXPECT_THROW(s.restore(c, 1 << 30), Error);     // beyond the context size
  s.restore(c, 10);
  EXPECT_EQ(s.next_position(), 10);
  EXPECT_EQ(s.cache().entries(), 1u);
  Request r(m, make_press_impl("none", 0.0));
  RequestStats st;
  EXPECT_THROW(r.set_prompt_cached({1, 2}, c, 10, std::vector<float>(3), st), Error);  // logits of another vocabulary
}
