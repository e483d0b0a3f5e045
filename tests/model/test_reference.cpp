// The forward pass against llama.cpp's logits and greedy continuations for the bundled model
// (tests/data/reference/stories260K.ref.gguf, computed by llama.cpp with f32 weights and an f32 KV
// cache; provenance in tests/data/README.md).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "kvslim/gguf.h"
#include "kvslim/model.h"
#include "kvslim/sampling.h"
#include "model/session.h"
#include "kernels/threads.h"
#include <fmt/format.h>

using namespace kvslim;

namespace {

const std::string kModel = std::string(KVSLIM_SOURCE_DIR) + "/models/stories260K.gguf";
const std::string kRef = std::string(KVSLIM_SOURCE_DIR) + "/tests/data/reference/stories260K.ref.gguf";

std::vector<int32_t> i32_tensor(const GGUFFile& f, const std::string& name) {
  const TensorInfo& t = f.tensor(name);
  EXPECT_EQ(t.type, GGMLType::I32);
  std::vector<int32_t> v(t.nelements());
  std::memcpy(v.data(), t.data, v.size() * 4);
  return v;
}

SessionOptions exact_f32() {
  SessionOptions o;
  o.key_codec = KVCodec::F32;
  o.value_codec = KVCodec::F32;
  o.exact = true;
  o.n_ctx = 2048;
  return o;
}

class Reference : public ::testing::TestWithParam<int> {
 protected:
  static void SetUpTestSuite() {
    model_ = Model::load(kModel).release();
    ref_ = GGUFFile::open(kRef).release();
  }
  static void TearDownTestSuite() {
    delete model_;
    delete ref_;
  }
  static Model* model_;
  static GGUFFile* ref_;
};
Model* Reference::model_ = nullptr;
GGUFFile* Reference::ref_ = nullptr;

TEST_P(Reference, LogitsMatchLlamaCppAtEveryPosition) {
  const int p = GetParam();
  std::vector<int32_t> toks = i32_tensor(*ref_, fmt::format("ref.prompt.{}.tokens", p));
  const TensorInfo& lt = ref_->tensor(fmt::format("ref.prompt.{}.logits", p));
  const int nv = model_->hparams().n_vocab;
  ASSERT_EQ(lt.ne[0], nv);
  ASSERT_EQ(lt.ne[1], static_cast<int64_t>(toks.size()));
  const float* want = static_cast<const float*>(lt.data);
  // Batch sizes that split the prompt unevenly exercise the cache across forward calls.
  for (int batch : {512, 7}) {
    SessionOptions o = exact_f32();
    o.batch = batch;
    Session s(*model_, o);
    std::vector<float> got = s.forward(std::vector<Token>(toks.begin(), toks.end()), true);
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, double(std::fabs(got[i] - want[i])));
    EXPECT_LT(worst, 1e-4) << "prompt " << p << " batch " << batch;
  }
}

TEST_P(Reference, GreedyContinuationMatchesLlamaCpp) {
  const int p = GetParam();
  std::vector<int32_t> toks = i32_tensor(*ref_, fmt::format("ref.prompt.{}.tokens", p));
  std::vector<int32_t> want = i32_tensor(*ref_, fmt::format("ref.prompt.{}.greedy", p));
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    Session s(*model_, exact_f32());
    std::vector<float> logits = s.forward(std::vector<Token>(toks.begin(), toks.end()));
    std::vector<int32_t> got;
    for (size_t i = 0; i < want.size(); ++i) {
      Token t = argmax(logits.data(), logits.size());
      got.push_back(t);
      if (i + 1 < want.size()) logits = s.forward({t});
    }
    EXPECT_EQ(got, want) << "prompt " << p << " threads " << threads;
  }
}

INSTANTIATE_TEST_SUITE_P(Prompts, Reference, ::testing::Values(0, 1, 2, 3, 4));

}  // namespace
