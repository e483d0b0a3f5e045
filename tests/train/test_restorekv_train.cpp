// RestoreKV's trainer (src/train/restorekv_train.h): the gradient of the self-distillation loss
// with respect to the restore embeddings and every LoRA factor, through the restore pass and the
// continuation pass of the bundled model, against central finite differences of the loss itself;
// gradient steps lower the loss; the trained weights are a file the press loads.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "kvslim/request.h"
#include "press/scorers/restorekv.h"
#include "support/files.h"
#include "support/press_util.h"
#include "train/restorekv_train.h"

using namespace kvslim;
using press_test::bundled_model;

namespace {

/// One sample: BOS + 15 story tokens of context, 4 continuation tokens.
RestoreKVObjective small_objective(const Model& m, int R, int rank) {
  std::vector<Token> t = m.tokenizer().encode(slurp(std::string(KVSLIM_SOURCE_DIR) + "/models/story.txt"), false, false);
  std::vector<Token> ctx = {m.tokenizer().bos()};
  ctx.insert(ctx.end(), t.begin(), t.begin() + 15);
  std::vector<Token> cont(t.begin() + 15, t.begin() + 19);
  return RestoreKVObjective(m, R, rank, 4.0f, 0.5, {ctx}, {cont});
}

}  // namespace

TEST(RestoreKVTrain, GradientMatchesFiniteDifferences) {
  const Model& m = bundled_model();
  const HParams& hp = m.hparams();
  RestoreKVObjective obj = small_objective(m, 2, 2);
  std::vector<double> th = obj.initial(3);
  // B away from zero, so that the gradients of A (zero while B is zero) are tested too.
  std::mt19937 rng(5);
  std::normal_distribution<double> nd(0.0, 0.05);
  const size_t n_emb = static_cast<size_t>(2) * hp.n_embd;
  for (size_t i = n_emb; i < th.size(); ++i)
    if (th[i] == 0.0) th[i] = nd(rng);
  std::vector<double> g(th.size(), 0.0);
  const double base = obj.loss(0, th, &g);
  EXPECT_GT(base, 0.0);
  EXPECT_EQ(obj.loss(0, th, nullptr), base);
  // Every embedding value, and 200 values spread over all A and B factors of all layers.
  std::vector<size_t> idx;
  for (size_t i = 0; i < n_emb; ++i) idx.push_back(i);
  std::uniform_int_distribution<size_t> pick(n_emb, th.size() - 1);
  for (int i = 0; i < 200; ++i) idx.push_back(pick(rng));
  const double h = 1e-5;
  double worst = 0;
  for (size_t i : idx) {
    const double keep = th[i];
    th[i] = keep + h;
    const double up = obj.loss(0, th, nullptr);
    th[i] = keep - h;
    const double down = obj.loss(0, th, nullptr);
    th[i] = keep;
    const double numeric = (up - down) / (2 * h);
    worst = std::max(worst, std::abs(g[i] - numeric));
    ASSERT_NEAR(g[i], numeric, 1e-7 + 1e-4 * std::abs(numeric)) << "parameter " << i;
  }
  std::printf("restorekv loss %.6g, worst gradient difference %.3g over %zu values\n", base, worst, idx.size());
}

// Plain gradient descent with a small step lowers the loss of the sample it runs on.
TEST(RestoreKVTrain, GradientStepsLowerTheLoss) {
  const Model& m = bundled_model();
  RestoreKVObjective obj = small_objective(m, 2, 2);
  std::vector<double> th = obj.initial(7), g(th.size());
  const double first = obj.loss(0, th, nullptr);
  double last = first;
  for (int s = 0; s < 10; ++s) {
    std::fill(g.begin(), g.end(), 0.0);
    obj.loss(0, th, &g);
    for (size_t i = 0; i < th.size(); ++i) th[i] -= 0.05 * g[i];
    const double now = obj.loss(0, th, nullptr);
    EXPECT_LT(now, last) << "step " << s;
    last = now;
  }
  EXPECT_LT(last, first);
}

// train_restorekv end to end on the story (a few steps): the report is filled, the weights are a
// file the press loads and runs with.
TEST(RestoreKVTrain, TrainsSavesAndThePressLoadsIt) {
  const Model& m = bundled_model();
  std::vector<Token> t = m.tokenizer().encode(slurp(std::string(KVSLIM_SOURCE_DIR) + "/models/story.txt"), false, false);
  RestoreKVTrainOptions o;
  o.context = 48;
  o.continuation = 8;
  o.rank = 2;
  o.n_tokens = 4;
  o.steps = 3;
  RestoreKVTrainReport r;
  RestoreKVWeights w = train_restorekv(m, t, o, &r);
  EXPECT_GE(r.train_samples, 1);
  EXPECT_GE(r.held_out_samples, 1);
  EXPECT_GT(r.held_out_kl_before, 0.0);
  EXPECT_GT(r.held_out_kl_after, 0.0);
  EXPECT_EQ(w.n_tokens, 4);
  EXPECT_EQ(w.lora.rank, 2);
  const std::string path = temp_path("restorekv_trained.gguf");
  w.save(path, "stories260K");
  RequestOptions ro;
  ro.n_predict = 2;
  ro.sampling.temp = 0;
  Request req(m, make_press_impl("restorekv:file=" + path, 0.5), ro);
  req.set_prompt(slurp(std::string(KVSLIM_SOURCE_DIR) + "/models/story.txt").substr(0, 300));
  req.run();
  EXPECT_GT(req.stats().entries_kept, 0u);
  std::remove(path.c_str());
  EXPECT_THROW(train_restorekv(m, std::vector<Token>(t.begin(), t.begin() + 50), o, nullptr), Error);
}
