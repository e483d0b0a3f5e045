// KVzap surrogate training as a library call (src/train/kvzap_train.h): documents cut by the rule,
// training on a tiny corpus, the errors it names.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "kvslim/error.h"
#include "kvslim/model.h"
#include "train/kvzap_train.h"

using namespace kvslim;

namespace {

const Model& model() {
  static std::unique_ptr<Model> m = Model::load(std::string(KVSLIM_SOURCE_DIR) + "/models/stories260K.gguf");
  return *m;
}

const char* kText =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the sunshine. One day, "
    "she saw a big, red ball in the park. She ran to it and kicked it very high. The ball flew over the trees.";

TEST(KVzapTrain, DocumentsAreConsecutiveWindowsWithBos) {
  const Tokenizer& tok = model().tokenizer();
  const std::vector<Token> all = tok.encode(kText, false, false);
  const int w = 20;
  ASSERT_GT(all.size(), 3u * w);
  // The rule, by hand: a window starts every w tokens while at least 16 tokens remain from its start.
  std::vector<std::vector<Token>> want;
  for (size_t b = 0; b + 16 <= all.size(); b += w) {
    std::vector<Token> d;
    if (tok.add_bos_default() && tok.bos() >= 0) d.push_back(tok.bos());
    for (size_t i = b; i < std::min(all.size(), b + w); ++i) d.push_back(all[i]);
    want.push_back(d);
  }
  EXPECT_EQ(kvzap_documents(tok, {kText}, w, 1000), want);
  // Two texts: each is cut on its own; max_docs stops in the second.
  const auto two = kvzap_documents(tok, {kText, kText}, w, static_cast<int>(want.size()) + 1);
  ASSERT_EQ(two.size(), want.size() + 1);
  EXPECT_EQ(two.back(), want.front());
  EXPECT_TRUE(kvzap_documents(tok, {"a b"}, w, 10).empty());  // fewer than 16 tokens
}

TEST(KVzapTrain, FitsBothSurrogatesAndReportsEachLayer) {
  const std::vector<std::vector<Token>> docs = kvzap_documents(model().tokenizer(), {kText, kText}, 24, 6);
  ASSERT_GE(docs.size(), 4u);
  KVzapTrainOptions o;
  o.per_doc = 8;
  o.test_fraction = 0.25;
  o.mlp.hidden = 8;
  o.mlp.epochs = 2;
  std::vector<int> layers;
  const KVzapTrainResult r = train_kvzap(model(), docs, o, nullptr, [&](const KVzapTrainResult& so_far, int l) {
    EXPECT_GT(so_far.train_rows, 0u);
    layers.push_back(l);
  });
  const HParams& hp = model().hparams();
  std::vector<int> all_layers(hp.n_layer);
  for (int l = 0; l < hp.n_layer; ++l) all_layers[l] = l;
  EXPECT_EQ(layers, all_layers);
  // round(0.25 * n) documents held out, at least 1; per_doc rows from each.
  const size_t n_test = std::max<size_t>(1, static_cast<size_t>(0.25 * docs.size() + 0.5));
  EXPECT_EQ(r.test_documents, n_test);
  EXPECT_EQ(r.train_documents, docs.size() - n_test);
  EXPECT_EQ(r.test_rows, n_test * o.per_doc);
  r.linear.check(hp, "linear");
  r.mlp.check(hp, "mlp");
  EXPECT_EQ(r.mlp.hidden_dim, 8);
  ASSERT_EQ(r.pearson_linear.size(), static_cast<size_t>(hp.n_layer));
  for (double p : r.pearson_mlp) EXPECT_TRUE(p >= -1.0 && p <= 1.0);
}

TEST(KVzapTrain, ErrorsNameTheParameterNotAFlag) {
  const std::vector<std::vector<Token>> docs = kvzap_documents(model().tokenizer(), {kText}, 24, 3);
  KVzapTrainOptions o;
  o.test_fraction = 1.0;
  try {
    train_kvzap(model(), docs, o);
    FAIL() << "test_fraction 1 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("test_fraction"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find("--"), std::string::npos) << e.what();
  }
  EXPECT_THROW(train_kvzap(model(), {docs.front()}, KVzapTrainOptions{}), Error);
}

TEST(KVzapTrain, RandomSurrogateHasTheModelsShape) {
  const HParams& hp = model().hparams();
  const KVzapSurrogate lin = random_kvzap_surrogate(hp, KVzapSurrogate::Kind::Linear, 0, 1);
  const KVzapSurrogate mlp = random_kvzap_surrogate(hp, KVzapSurrogate::Kind::MLP, 16, 1);
  lin.check(hp, "linear");
  mlp.check(hp, "mlp");
  ASSERT_EQ(mlp.w2.size(), static_cast<size_t>(hp.n_layer));
  EXPECT_EQ(mlp.w1[0].size(), static_cast<size_t>(16) * hp.n_embd);
  EXPECT_EQ(lin.w1[0].size(), static_cast<size_t>(hp.n_head_kv) * hp.n_embd);
}

}  // namespace
