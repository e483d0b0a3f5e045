// The bundled retrieval model (models/retrieval.gguf, built by tools/retrieval_model/): it must
// answer passkey and key-value questions exactly with a full cache, and fail once the press has
// evicted the needle's entries. Prompts follow models/RETRIEVAL.md; the expected answer is the
// key the test itself hid in the haystack.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kvslim/generate.h"
#include "kvslim/model.h"
#include "press/authoring.h"
#include "kernels/threads.h"

using namespace kvslim;

namespace {

const std::string kModel = std::string(KVSLIM_SOURCE_DIR) + "/models/retrieval.gguf";
const char* const kFiller[] = {"The grass is green.", "The sky is blue.", "The sun is yellow.", "Here we go.",
                               "There and back again."};

const Model& model() {
  static std::unique_ptr<Model> m = [] {
    set_num_threads(2);
    return Model::load(kModel);
  }();
  return *m;
}

// Filler sentences making about `n_tokens` tokens, with `needle` inserted before sentence
// round(depth * n_sentences).
std::string haystack(int n_tokens, const std::string& needle, double depth) {
  const Tokenizer& tok = model().tokenizer();
  size_t per = 0;
  for (const char* s : kFiller) per += tok.encode(s, false, false).size();  // the space prefix stands for the separator
  const int n_sent = std::max(1, static_cast<int>(n_tokens * 5 / per));
  const int at = static_cast<int>(depth * n_sent + 0.5);
  std::string out;
  for (int i = 0; i <= n_sent; ++i) {
    if (i == at) out += (out.empty() ? "" : " ") + needle;
    if (i < n_sent) out += (out.empty() ? "" : " ") + std::string(kFiller[i % 5]);
  }
  return out;
}

std::string answer(const std::string& context, const std::string& question, const std::string& press_spec,
                   double ratio, int* context_tokens = nullptr) {
  std::unique_ptr<PressImpl> press = make_press_impl(press_spec, ratio);
  GenerateOptions opt;
  opt.context = context;
  opt.question = question;
  opt.n_predict = 8;
  opt.sampling.temp = 0.0f;
  GenerateResult r = generate(model(), *press, opt);
  if (context_tokens) *context_tokens = r.stats.context_tokens;
  return r.text;
}

std::string passkey_needle(const std::string& key) {
  return "The pass key is " + key + ". Remember it. " + key + " is the pass key.";
}
const std::string kPasskeyQuestion = " What is the pass key? The pass key is";

TEST(RetrievalModel, IsASmallGqaLlama) {
  const HParams& hp = model().hparams();
  EXPECT_EQ(hp.arch, "llama");
  EXPECT_LT(hp.n_head_kv, hp.n_head);
  EXPECT_GE(hp.n_ctx_train, 2048);
  EXPECT_EQ(model().tokenizer().model(), "llama");
}

// The vocabulary is designed so numbers split into a space-digit piece and single digits, and
// the template words are whole pieces (see models/RETRIEVAL.md).
TEST(RetrievalModel, TokenizesAsDocumented) {
  const Tokenizer& tok = model().tokenizer();
  std::vector<std::string> pieces;
  for (Token t : tok.encode("The pass key is 71432. key-Q7Z", false, false)) pieces.push_back(tok.token_text(t));
  const std::vector<std::string> want = {"\xE2\x96\x81The", "\xE2\x96\x81pass", "\xE2\x96\x81key", "\xE2\x96\x81is",
                                         "\xE2\x96\x81" "7", "1", "4", "3", "2", ".", "\xE2\x96\x81key", "-", "Q",
                                         "7", "Z"};
  EXPECT_EQ(pieces, want);
}

TEST(RetrievalModel, PasskeyFullCache) {
  struct Case {
    int tokens;
    double depth;
    const char* key;
  };
  const Case cases[] = {{256, 0.0, "71432"}, {512, 1.0, "90210"}, {1024, 0.3, "55813"}, {2048, 0.6, "28467"}};
  for (const Case& c : cases) {
    int n = 0;
    std::string got = answer(haystack(c.tokens, passkey_needle(c.key), c.depth), kPasskeyQuestion, "none", 0.0, &n);
    EXPECT_EQ(got.substr(0, 6), std::string(" ") + c.key) << c.tokens << " tokens, depth " << c.depth;
    EXPECT_GE(n, c.tokens * 9 / 10);
  }
}

TEST(RetrievalModel, KeyValueAmongDistractors) {
  // Four pairs spread over the haystack; the distractor keys share letters with the asked one.
  const std::string ctx = haystack(300, "The value of key-QXA is 1234567.", 0.2) + " " +
                          haystack(300, "The value of key-QXB is 7654321.", 0.5) + " " +
                          haystack(300, "The value of key-RXB is 5550123.", 0.7) + " " +
                          haystack(100, "The value of key-AXB is 9081726.", 1.0);
  EXPECT_EQ(answer(ctx, " What is the value of key-QXB? The value of key-QXB is", "none", 0.0).substr(0, 8),
            " 7654321");
  EXPECT_EQ(answer(ctx, " What is the value of key-QXA? The value of key-QXA is", "none", 0.0).substr(0, 8),
            " 1234567");
}

TEST(RetrievalModel, FailsWhenTheNeedleIsEvicted) {
  // StreamingLLM at ratio 0.9 keeps 4 sink entries and the last 10% of the context: a needle in
  // the middle is gone from every layer.
  const std::string ctx = haystack(1024, passkey_needle("48467"), 0.5);
  EXPECT_EQ(answer(ctx, kPasskeyQuestion, "none", 0.0).substr(0, 6), " 48467");
  std::string got = answer(ctx, kPasskeyQuestion, "streaming_llm", 0.9);
  EXPECT_EQ(got.find("48467"), std::string::npos) << got;
  // ... while a needle inside the kept recent window is still found.
  const std::string late = haystack(1024, passkey_needle("64150"), 0.97);
  EXPECT_EQ(answer(late, kPasskeyQuestion, "streaming_llm", 0.9).substr(0, 6), " 64150");
}

}  // namespace
