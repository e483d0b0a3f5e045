// The request runner (kvslim/request.h): step-wise use, stop conditions, cancellation, rewinding,
// several requests over one model, and that every job's path through it leaves the same cache.
#include <gtest/gtest.h>

#include <thread>

#include "kvslim/eval.h"
#include "kvslim/generate.h"
#include "kvslim/request.h"
#include "support/press_util.h"

using namespace kvslim;
using press_test::bundled_model;
using press_test::same_cache;

namespace {

const char* kStory = "Once upon a time there was a little cat. The cat liked milk and naps in the sun. One day";

RequestOptions greedy(int n_predict) {
  RequestOptions o;
  o.n_predict = n_predict;
  o.sampling.temp = 0;
  o.session.key_codec = o.session.value_codec = KVCodec::F32;
  return o;
}

}  // namespace

TEST(Request, GreedyDecodeFeedsBackTheArgMaxOfEachStep) {
  // Independent re-computation with a bare Session: argmax, forward, argmax, ...
  const Model& m = bundled_model();
  Request req(m, make_press_impl("none", 0.0), greedy(12));
  req.set_prompt(kStory);
  req.run();
  Session s(m, greedy(0).session);
  std::vector<float> lg = s.forward(req.context_tokens());
  std::vector<Token> want;
  for (int i = 0; i < 12; ++i) {
    Token t = argmax(lg.data(), lg.size());
    want.push_back(t);
    if (m.tokenizer().is_eog(t)) break;
    lg = s.forward({t});
  }
  EXPECT_EQ(req.generated(), want);
  EXPECT_EQ(req.finish_reason(), m.tokenizer().is_eog(want.back()) ? FinishReason::EndOfGeneration : FinishReason::Length);
}

TEST(Request, StepwisePrefillTakesOneCallPerChunkPlusOneForTheQuestion) {
  const Model& m = bundled_model();
  RequestOptions o = greedy(4);
  o.chunk_size = 8;
  Request req(m, make_press_impl("snapkv:window=4", 0.5), o);
  req.set_prompt(kStory, " The cat");
  const size_t n = req.context_tokens().size();
  int calls = 1;
  while (!req.prefill_step()) ++calls;
  EXPECT_EQ(calls, static_cast<int>((n + 7) / 8) + 1);
  EXPECT_TRUE(req.prefilled());
  EXPECT_EQ(req.position(), static_cast<int32_t>(n + req.question_tokens().size()));
  // The same request in one run() gives the same tokens and cache.
  Request whole(m, make_press_impl("snapkv:window=4", 0.5), o);
  whole.set_prompt(kStory, " The cat");
  whole.run();
  req.run();
  EXPECT_EQ(req.generated(), whole.generated());
  EXPECT_TRUE(same_cache(req.cache(), whole.cache()));
}

TEST(Request, StopStringCutsTheTextAndFinishes) {
  const Model& m = bundled_model();
  Request free_run(m, make_press_impl("none", 0.0), greedy(24));
  free_run.set_prompt(kStory);
  free_run.run();
  const std::string full = free_run.text();
  ASSERT_GT(full.size(), 6u);
  // Stop at a piece of the text that starts after the first few bytes.
  const std::string stop = full.substr(full.size() / 2, 3);
  const size_t at = full.find(stop);
  RequestOptions o = greedy(24);
  o.stop = {stop};
  Request req(m, make_press_impl("none", 0.0), o);
  req.set_prompt(kStory);
  std::string streamed;
  req.run([&](const TokenEvent& e) {
    streamed += e.piece;
    return true;
  });
  EXPECT_EQ(req.text(), full.substr(0, at));
  EXPECT_EQ(streamed, req.text());
  EXPECT_EQ(req.finish_reason(), FinishReason::Stop);
}

TEST(Request, CallbackReturningFalseStopsAfterThatToken) {
  Request req(bundled_model(), make_press_impl("none", 0.0), greedy(20));
  req.set_prompt(kStory);
  int seen = 0;
  req.run([&](const TokenEvent& e) {
    EXPECT_EQ(e.index, seen);
    return ++seen < 3;
  });
  EXPECT_EQ(seen, 3);
  EXPECT_EQ(req.generated().size(), 3u);
  EXPECT_EQ(req.finish_reason(), FinishReason::Stop);
}

TEST(Request, CancelBeforePrefillRunsNothing) {
  Request req(bundled_model(), make_press_impl("none", 0.0), greedy(8));
  req.set_prompt(kStory);
  req.cancel();
  EXPECT_FALSE(req.step());
  EXPECT_EQ(req.finish_reason(), FinishReason::Cancelled);
  EXPECT_EQ(req.position(), 0);
  EXPECT_TRUE(req.generated().empty());
}

TEST(Request, CancelFromTheCallbackStopsAtTheNextStep) {
  Request req(bundled_model(), make_press_impl("none", 0.0), greedy(20));
  req.set_prompt(kStory);
  req.run([&](const TokenEvent& e) {
    if (e.index == 1) req.cancel();
    return true;
  });
  EXPECT_EQ(req.generated().size(), 2u);
  EXPECT_EQ(req.finish_reason(), FinishReason::Cancelled);
}

TEST(Request, UnlimitedGenerationStopsWhenTheContextIsFull) {
  RequestOptions o = greedy(-1);
  o.session.n_ctx = 40;
  Request req(bundled_model(), make_press_impl("none", 0.0), o);
  req.set_prompt(kStory);
  const int n = static_cast<int>(req.context_tokens().size());
  ASSERT_LT(n, 40);
  req.run();
  if (req.finish_reason() == FinishReason::ContextFull) {
    // Every position 0..39 holds a token, and the last sampled one is not run.
    EXPECT_EQ(req.position(), 40);
    EXPECT_EQ(static_cast<int>(req.generated().size()), 40 - n + 1);
  } else {
    EXPECT_EQ(req.finish_reason(), FinishReason::EndOfGeneration);
  }
}

// With ignore_eos a request decodes past the end-of-generation token that ends the same greedy run
// without it: the same tokens up to it, then n_predict tokens in all. (bench --parallel counted
// fewer rows per step once a request had sampled end-of-generation.) The retrieval model copies the
// token after the needle's value, and a lowercase word there is one it answers with end-of-generation
// (models/RETRIEVAL.md).
TEST(Request, IgnoreEosDecodesPastEndOfGeneration) {
  const auto model = Model::load(std::string(KVSLIM_SOURCE_DIR) + "/models/retrieval.gguf");
  const char* prompt = "The grass is green. The pass key is 12345 done. The sky is blue. What is the pass key? The pass key is";
  RequestOptions o = greedy(40);
  Request ends(*model, make_press_impl("none", 0.0), o);
  ends.set_prompt(prompt);
  ends.run();
  ASSERT_EQ(ends.finish_reason(), FinishReason::EndOfGeneration);
  const std::vector<Token> first = ends.generated();
  ASSERT_LT(first.size(), 40u);
  EXPECT_EQ(ends.text(), " 12345 ");  // the value, then the lone "▁" that "done" starts with
  o.ignore_eos = true;
  Request past(*model, make_press_impl("none", 0.0), o);
  past.set_prompt(prompt);
  past.run();
  EXPECT_EQ(past.finish_reason(), FinishReason::Length);
  ASSERT_EQ(past.generated().size(), 40u);
  EXPECT_TRUE(std::equal(first.begin(), first.end(), past.generated().begin()));
  EXPECT_TRUE(model->tokenizer().is_eog(past.generated()[first.size() - 1]));
  EXPECT_EQ(past.text().substr(0, ends.text().size()), ends.text());
}

// generate() takes every request option, stop strings included: the text ends before the first
// stop string that the same run without it generates.
TEST(Request, GenerateHonoursStopStrings) {
  auto press = make_press_impl("none", 0.0);
  GenerateOptions o;
  o.context = kStory;
  o.n_predict = 24;
  o.sampling.temp = 0.0f;
  const GenerateResult full = generate(bundled_model(), *press, o);
  ASSERT_GE(full.text.size(), 8u);
  const std::string stop = full.text.substr(full.text.size() / 2, 3);
  const size_t at = full.text.find(stop);
  ASSERT_GT(at, 0u);
  o.stop = {stop};
  const GenerateResult cut = generate(bundled_model(), *press, o);
  EXPECT_EQ(cut.text, full.text.substr(0, at));
  EXPECT_EQ(cut.finish, FinishReason::Stop);
}

TEST(Request, PromptLongerThanTheContextIsRefused) {
  RequestOptions o = greedy(4);
  o.session.n_ctx = 8;
  Request req(bundled_model(), make_press_impl("none", 0.0), o);
  EXPECT_THROW(req.set_prompt(kStory), Error);
  EXPECT_THROW(req.set_prompt(""), Error);
}

TEST(Request, RewindAndReplayGiveTheSameLogits) {
  Request req(bundled_model(), make_press_impl("none", 0.0), greedy(6));
  req.set_prompt(kStory);
  req.run();
  const int32_t p = static_cast<int32_t>(req.context_tokens().size());
  std::vector<Token> gen = req.generated();
  req.rewind(p);
  EXPECT_EQ(req.position(), p);
  EXPECT_FALSE(req.finished());
  std::vector<float> a = req.advance(gen[0]);
  req.rewind(p);
  std::vector<float> b = req.advance(gen[0]);
  EXPECT_EQ(a, b);
  EXPECT_THROW(req.rewind(-1), Error);
}

TEST(Request, ConcurrentRequestsOverOneModelMatchSequentialOnes) {
  const Model& m = bundled_model();
  const std::vector<std::string> specs = {"none", "snapkv:window=4", "knorm", "h2o"};
  std::vector<std::vector<Token>> seq;
  for (const auto& s : specs) {
    Request r(m, make_press_impl(s, 0.5), greedy(10));
    r.set_prompt(kStory);
    r.run();
    seq.push_back(r.generated());
  }
  std::vector<std::vector<Token>> par(specs.size());
  std::vector<std::thread> th;
  for (size_t i = 0; i < specs.size(); ++i)
    th.emplace_back([&, i] {
      Request r(m, make_press_impl(specs[i], 0.5), greedy(10));
      r.set_prompt(kStory);
      r.run();
      par[i] = r.generated();
    });
  for (auto& t : th) t.join();
  EXPECT_EQ(par, seq);
}

TEST(Request, StepBatchMatchesRunningEachRequestAlone) {
  const Model& m = bundled_model();
  std::vector<std::unique_ptr<Request>> alone, batch;
  for (const char* ctx : {kStory, "Tom had a red car. He drove it to the shop"}) {
    alone.push_back(std::make_unique<Request>(m, make_press_impl("knorm", 0.25), greedy(8)));
    alone.back()->set_prompt(ctx);
    alone.back()->run();
    batch.push_back(std::make_unique<Request>(m, make_press_impl("knorm", 0.25), greedy(8)));
    batch.back()->set_prompt(ctx);
  }
  std::vector<Request*> ptrs = {batch[0].get(), batch[1].get()};
  for (int i = 0; i < 20; ++i) step_batch(ptrs);
  for (size_t i = 0; i < alone.size(); ++i) {
    EXPECT_EQ(batch[i]->generated(), alone[i]->generated());
    EXPECT_TRUE(same_cache(batch[i]->cache(), alone[i]->cache()));
  }
}

TEST(Request, StatsAreMeasuredFromTheCache) {
  const Model& m = bundled_model();
  Request req(m, make_press_impl("knorm", 0.5), greedy(2));
  req.set_prompt(kStory, " The cat");
  req.prefill();
  const RequestStats& st = req.stats();
  const HParams& hp = m.hparams();
  const size_t n = req.context_tokens().size();
  EXPECT_EQ(st.entries_total, n * hp.n_layer * hp.n_head_kv);
  EXPECT_EQ(st.entries_kept, static_cast<size_t>(uniform_keep(n, 0.5)) * hp.n_layer * hp.n_head_kv);
  ASSERT_EQ(st.kept_per_layer.size(), static_cast<size_t>(hp.n_layer));
  // The question's entries are appended after the measurement.
  EXPECT_EQ(req.cache().entries(), st.entries_kept + req.question_tokens().size() * hp.n_layer * hp.n_head_kv);
}
