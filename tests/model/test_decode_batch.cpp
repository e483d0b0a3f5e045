// Continuous batching: Session::decode_batch (one pass over the weights for several sessions) and
// step_batch (the server's decode step) must give exactly what each session or request gives on
// its own: the same logits bit for bit, the same text, the same cache.
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>

#include "kernels/matmul.h"
#include "kvslim/gguf.h"
#include "kvslim/model.h"
#include "kvslim/request.h"
#include "model/session.h"
#include "model/layer_hook.h"
#include "press/authoring.h"
#include "support/files.h"

using namespace kvslim;

namespace {

const char* kModel = KVSLIM_SOURCE_DIR "/models/stories260K.gguf";

double steady_seconds_for_test() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The bundled model with every matrix whose rows are whole q8_0 blocks stored as q8_0: the
// quantized-weight kernels (the bundled file is f32, which takes another path).
std::string q8_copy() {
  static std::string path;
  if (!path.empty()) return path;
  auto f = GGUFFile::open(kModel);
  GGUFWriter w;
  for (const auto& [k, v] : f->metadata())
    if (k != "general.alignment") w.set(k, v);
  for (const TensorInfo& t : f->tensors()) {
    const bool q = t.ne.size() == 2 && t.ne[0] % 32 == 0;
    w.add_tensor_f32(t.name, q ? GGMLType::Q8_0 : GGMLType::F32, t.ne, f->tensor_f32(t));
  }
  path = ::testing::TempDir() + "kvslim_decode_batch_q8_" + std::to_string(::getpid()) + ".gguf";
  w.write(path);
  return path;
}

const std::vector<std::string> kPrompts = {"Once upon a time", "The little dog ran to the park and saw a big",
                                           "Lily"};

void check_decode_batch(const Model& model) {
  const Tokenizer& tok = model.tokenizer();
  const size_t nv = model.hparams().n_vocab;
  std::vector<std::unique_ptr<Session>> solo, batch;
  std::vector<std::vector<float>> logits;
  for (const auto& p : kPrompts) {
    std::vector<Token> ids = tok.encode(p, true, false);
    solo.push_back(std::make_unique<Session>(model, SessionOptions{}));
    batch.push_back(std::make_unique<Session>(model, SessionOptions{}));
    logits.push_back(solo.back()->forward(ids));
    batch.back()->forward(ids);
  }
  for (int step = 0; step < 6; ++step) {
    std::vector<Token> next;
    std::vector<Session*> ss;
    for (size_t i = 0; i < solo.size(); ++i) {
      next.push_back(argmax(logits[i].data(), nv));
      ss.push_back(batch[i].get());
    }
    std::vector<float> got = Session::decode_batch(ss, next);
    ASSERT_EQ(got.size(), nv * solo.size());
    for (size_t i = 0; i < solo.size(); ++i) {
      logits[i] = solo[i]->forward({next[i]});
      std::vector<float> row(got.begin() + i * nv, got.begin() + (i + 1) * nv);
      ASSERT_EQ(row, logits[i]) << "session " << i << " step " << step;
      EXPECT_EQ(batch[i]->next_position(), solo[i]->next_position());
      EXPECT_EQ(batch[i]->cache().bytes(), solo[i]->cache().bytes());
    }
  }
}

}  // namespace

TEST(DecodeBatch, BitIdenticalToOneByOneF32) {
  auto model = Model::load(kModel);
  check_decode_batch(*model);
}

TEST(DecodeBatch, BitIdenticalToOneByOneQ8) {
  auto model = Model::load(q8_copy());
  ASSERT_EQ(model->layer(0).wq->type, GGMLType::Q8_0);  // the attention matrices take the quantized kernels
  check_decode_batch(*model);
}

TEST(DecodeBatch, AttentionTimeIsPartOfEachSessionsForwardTime) {
  // Session::attention_seconds: wall time inside the attention step, so never more than the
  // forward calls around it, growing with every call; a batch's attention counts for each session.
  auto model = Model::load(kModel);
  const std::vector<Token> ids = model->tokenizer().encode(kPrompts[1], true, false);
  Session a(*model, SessionOptions{}), b(*model, SessionOptions{});
  EXPECT_EQ(a.attention_seconds(), 0.0);
  const double t0 = steady_seconds_for_test();
  a.forward(ids);
  const double wall = steady_seconds_for_test() - t0;
  const double after_prefill = a.attention_seconds();
  EXPECT_GT(after_prefill, 0.0);
  EXPECT_LE(after_prefill, wall);
  b.forward(ids);
  const double b0 = b.attention_seconds();
  const double t1 = steady_seconds_for_test();
  Session::decode_batch({&a, &b}, {5, 6});
  const double batch_wall = steady_seconds_for_test() - t1;
  const double da = a.attention_seconds() - after_prefill, db = b.attention_seconds() - b0;
  EXPECT_GT(da, 0.0);
  EXPECT_NEAR(da, db, 1e-9);  // the same attention steps
  EXPECT_LE(da, batch_wall);
}

TEST(DecodeBatch, RefusesBadInput) {
  auto model = Model::load(kModel);
  Session a(*model, SessionOptions{});
  a.forward({1});
  EXPECT_THROW(Session::decode_batch({&a}, {1, 2}), Error);
  EXPECT_THROW(Session::decode_batch({&a}, {-1}), Error);
  SessionOptions tiny;
  tiny.n_ctx = 1;
  Session b(*model, tiny);
  b.forward({1});
  EXPECT_THROW(Session::decode_batch({&b}, {1}), Error);  // the context is full
}

namespace {

// The bundled model with layer 0's key projection scaled by `scale`: its keys leave f16's range
// (65504) while an f32 key cache holds them.
std::string big_keys_copy(float scale) {
  auto f = GGUFFile::open(kModel);
  GGUFWriter w;
  for (const auto& [k, v] : f->metadata())
    if (k != "general.alignment") w.set(k, v);
  for (const TensorInfo& t : f->tensors()) {
    std::vector<float> x = f->tensor_f32(t);
    if (t.name == "blk.0.attn_k.weight")
      for (float& e : x) e *= scale;
    w.add_tensor_f32(t.name, GGMLType::F32, t.ne, x);
  }
  const std::string path = temp_path("big_keys.gguf");
  w.write(path);
  return path;
}

std::string message(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  }
  return {};
}

}  // namespace

// One row of a batch whose key overflows its f16 cache fails alone: the error names the layer and
// the cache type, its session is left as it was, and the other rows get exactly what they get
// without it. Before, the batched path had no guard: the f16 cache stored inf and the row's
// logits were NaN with no error.
TEST(DecodeBatch, AFailingRowFailsAlone) {
  const std::string path = big_keys_copy(1e6f);
  auto model = Model::load(path);
  const size_t nv = model->hparams().n_vocab;
  SessionOptions wide;
  wide.key_codec = KVCodec::F32;
  Session f16(*model, SessionOptions{}), a(*model, wide), b(*model, wide), a1(*model, wide), b1(*model, wide);
  const std::vector<Token> ids = model->tokenizer().encode("Once upon a time", true, false);
  for (Session* s : {&a, &b, &a1, &b1}) s->forward(ids);
  std::vector<std::exception_ptr> errors;
  const std::vector<float> got = Session::decode_batch({&a, &f16, &b}, {5, 5, 9}, &errors);
  ASSERT_EQ(errors.size(), 3u);
  EXPECT_FALSE(errors[0]);
  EXPECT_FALSE(errors[2]);
  ASSERT_TRUE(errors[1]);
  const std::string msg = message(errors[1]);
  for (const char* part : {"numeric overflow in layer 0", "key", "f16", "cache_type_k", "f32"})
    EXPECT_NE(msg.find(part), std::string::npos) << "'" << msg << "' lacks '" << part << "'";
  EXPECT_EQ(f16.next_position(), 0);
  EXPECT_EQ(f16.cache().entries(), 0u);
  const std::vector<float> want_a = a1.forward({5}), want_b = b1.forward({9});
  EXPECT_EQ(std::vector<float>(got.begin(), got.begin() + nv), want_a);
  EXPECT_EQ(std::vector<float>(got.begin() + 2 * nv, got.end()), want_b);
  EXPECT_EQ(std::vector<float>(got.begin() + nv, got.begin() + 2 * nv), std::vector<float>(nv, 0.0f));
  EXPECT_EQ(a.cache().bytes(), a1.cache().bytes());
  // Without an error list the row's error is thrown.
  EXPECT_THROW(Session::decode_batch({&f16}, {5}), Error);
  // A prefill on a short prompt fails where the key is stored, before anything else.
  try {
    f16.forward(ids);
    ADD_FAILURE() << "a prefill into an f16 cache that cannot hold its keys succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layer 0"), std::string::npos) << e.what();
  }
  EXPECT_EQ(f16.next_position(), 0);
  EXPECT_EQ(f16.cache().entries(), 0u);
  // The same session twice in one batch is refused for its second row.
  errors.clear();
  Session::decode_batch({&a, &b, &a}, {5, 9, 5}, &errors);
  ASSERT_EQ(errors.size(), 3u);
  EXPECT_FALSE(errors[0]);
  EXPECT_FALSE(errors[1]);
  ASSERT_TRUE(errors[2]);
  EXPECT_NE(message(errors[2]).find("row 2 is the session of row 0"), std::string::npos) << message(errors[2]);
  std::remove(path.c_str());
}

namespace {

// Keeps every entry and refuses the decode step numbered `fail_at` (a press that needs no
// decode-time observation, so its request steps inside the batch).
class RefusingPress : public PressImpl {
 public:
  explicit RefusingPress(int fail_at) : fail_at_(fail_at) {}
  std::string describe() const override { return "refusing"; }
  void apply(KVCache&, const Model&, const Observation&, const Target&) override {}
  void after_decode(KVCache&, const Model&, const Observation&) override {
    if (++steps_ == fail_at_) throw Error("refused at this decode step");
  }

 private:
  int fail_at_, steps_ = 0;
};

}  // namespace

// The server's decode step: a request whose step throws ends with its error (step_batch returns
// it), the others of the batch finish with the text they have alone.
TEST(DecodeBatch, StepBatchReturnsEachRequestsError) {
  auto model = Model::load(kModel);
  RequestOptions o;
  o.n_predict = 12;
  auto alone = [&](const std::string& p) {
    Request r(*model, make_press_impl("none", 0.0), o);
    r.set_prompt(p);
    return r.run();
  };
  const std::string want_a = alone("Once upon a time"), want_b = alone("Lily went to the park");
  RefusingPress refusing(3);
  Request a(*model, make_press_impl("none", 0.0), o), bad(*model, refusing, o), b(*model, make_press_impl("none", 0.0), o);
  a.set_prompt("Once upon a time");
  bad.set_prompt("Tom had a red ball");
  b.set_prompt("Lily went to the park");
  int failed_at = -1;
  for (int step = 0; step < 40 && !(a.finished() && b.finished()); ++step) {
    std::vector<Request*> live;
    for (Request* r : {&a, &bad, &b})
      if (!r->finished() && !(r == &bad && failed_at >= 0)) live.push_back(r);
    const std::vector<std::exception_ptr> errors = step_batch(live);
    ASSERT_EQ(errors.size(), live.size());
    for (size_t i = 0; i < live.size(); ++i) {
      if (live[i] == &bad && errors[i]) {
        EXPECT_NE(message(errors[i]).find("refused at this decode step"), std::string::npos);
        failed_at = step;
      } else {
        EXPECT_FALSE(errors[i]) << "request " << i << " step " << step << ": " << message(errors[i]);
      }
    }
  }
  EXPECT_GE(failed_at, 0);
  EXPECT_EQ(a.text(), want_a);
  EXPECT_EQ(b.text(), want_b);
}

TEST(DecodeBatch, StepBatchEqualsRunningAlone) {
  // Different presses (one with a decode-time observation, so it steps on its own), stop strings,
  // sampling and lengths, stepped together, against each request run alone.
  auto model = Model::load(kModel);
  struct Spec {
    std::string prompt, press;
    double ratio;
    float temp;
    int n;
    std::vector<std::string> stop;
  };
  const std::vector<Spec> specs = {
      {"Once upon a time, there was a little girl", "none", 0.0, 0.0f, 20, {}},
      {"Once upon a time, there was a little girl", "knorm", 0.5, 0.0f, 24, {}},
      {"The cat sat on the mat and", "snapkv", 0.3, 0.8f, 16, {}},
      {"Tom had a red ball", "h2o", 0.5, 0.0f, 12, {}},
      {"Lily went to the park", "none", 0.0, 0.0f, 30, {"."}},
  };
  auto make = [&](const Spec& s) {
    RequestOptions o;
    o.n_predict = s.n;
    o.sampling.temp = s.temp;
    o.sampling.seed = 7;
    o.stop = s.stop;
    o.chunk_size = 4;
    auto r = std::make_unique<Request>(*model, make_press_impl(s.press, s.ratio), o);
    r->set_prompt(s.prompt);
    return r;
  };
  std::vector<std::string> alone;
  std::vector<size_t> alone_bytes;
  for (const auto& s : specs) {
    auto r = make(s);
    alone.push_back(r->run());
    alone_bytes.push_back(r->cache().bytes());
  }
  std::vector<std::unique_ptr<Request>> reqs;
  std::vector<Request*> ptrs;
  for (const auto& s : specs) {
    reqs.push_back(make(s));
    ptrs.push_back(reqs.back().get());
  }
  // Prefill one chunk of one request at a time, as the server does, while the others decode.
  for (int guard = 0; guard < 1000; ++guard) {
    bool all_done = true;
    for (auto& r : reqs)
      if (!r->prefilled()) {
        r->prefill_step();
        break;
      }
    std::vector<Request*> decoding;
    for (Request* r : ptrs)
      if (r->prefilled() && !r->finished()) decoding.push_back(r);
    step_batch(decoding);
    for (Request* r : ptrs) all_done = all_done && r->finished();
    if (all_done) break;
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    EXPECT_TRUE(reqs[i]->finished());
    EXPECT_EQ(reqs[i]->text(), alone[i]) << "request " << i;
    EXPECT_EQ(reqs[i]->cache().bytes(), alone_bytes[i]) << "request " << i;
  }
}

// The forward pass keeps its activation buffers per thread between calls (model/session.cpp,
// ScratchLease). A hook that runs another forward pass on the same thread from inside a layer
// must not overwrite the outer pass's buffers: the outer logits stay those of a pass without it,
// for a prefill batch and for a decode step, and the scratch stays usable after it.
namespace {
struct NestedForwardHook : LayerHook {
  Session* inner = nullptr;
  std::vector<Token> ids;
  int calls = 0;
  void after_attention(const LayerStep& step, const std::vector<std::vector<float>>*) override {
    if (step.layer != 0) return;
    inner->reset();
    inner->forward(ids);  // a longer batch than the outer one: its buffers would be reallocated
    ++calls;
  }
};
}  // namespace

TEST(ForwardScratch, NestedForwardFromHookKeepsOuterResult) {
  for (const std::string& path : {std::string(kModel), q8_copy()}) {
    auto model = Model::load(path);
    const Tokenizer& tok = model->tokenizer();
    const std::vector<Token> prompt = tok.encode("Once upon a time", true, false);
    const std::vector<Token> other = tok.encode(kPrompts[1] + " " + kPrompts[1], true, false);
    ASSERT_GT(other.size(), prompt.size());
    Session plain(*model, SessionOptions{}), hooked(*model, SessionOptions{}), inner(*model, SessionOptions{});
    NestedForwardHook hook;
    hook.inner = &inner;
    hook.ids = other;
    const std::vector<float> want = plain.forward(prompt);
    EXPECT_EQ(hooked.forward(prompt, false, &hook), want) << path;
    const std::vector<float> want2 = plain.forward({5});
    EXPECT_EQ(hooked.forward({5}, false, &hook), want2) << path;
    EXPECT_EQ(hook.calls, 2);
    // And the inner pass itself computed what a pass of its own computes.
    Session fresh(*model, SessionOptions{});
    inner.reset();
    EXPECT_EQ(inner.forward(other), fresh.forward(other)) << path;
  }
}
