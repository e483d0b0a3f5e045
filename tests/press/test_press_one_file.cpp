// A scorer press is stated once, in its own file: its registration declares its parameters with
// their defaults and kvpress's names, and that alone makes it reachable by its name, by its kvpress
// class name with kvpress's field names, under the generic per-head budget, and through
// `kvslim presses` and the Python module (both read the registry). The press below lives only in
// this test, as a new press would live only in its file under src/press/; its name starts with
// test_ so that checks comparing the registry with the CLI's list skip it.
#include <gtest/gtest.h>

#include <algorithm>

#include <fmt/format.h>

#include "press/authoring.h"
#include "support/press_util.h"

using namespace kvslim;

namespace {

// Keeps the first `sink` entries and then the newest: scores are the positions.
class NewestFirstPress : public ScorerPress {
 public:
  NewestFirstPress(double ratio, int sink) : ScorerPress(ratio), sink_(sink) {}
  std::string describe_scorer() const override { return fmt::format("test_newest_first:ratio={},sink={}", ratio_, sink_); }
  void score(const LayerView& view, std::vector<std::vector<float>>& out) const override {
    for (int h = 0; h < view.hp().n_head_kv; ++h) {
      const Segment& s = view.seg(h);
      out[h].resize(s.size());
      for (size_t j = 0; j < s.size(); ++j)
        out[h][j] = static_cast<int>(j) < sink_ ? kProtected : static_cast<float>(s.positions()[j]);
    }
  }

 private:
  int sink_;
};

PressRegistrar reg({"test_newest_first", "test press: sinks, then the newest entries", "none (a test of the registry)",
                    {{"ratio", "0"}, {"sink", "2", "num_sink_tokens"}},
                    [](const PressParams& p) -> std::unique_ptr<PressImpl> {
                      return std::make_unique<NewestFirstPress>(param_double(p, "test_newest_first", "ratio"),
                                                                param_int(p, "test_newest_first", "sink"));
                    }},
                   {"TestNewestFirstPress"});

TEST(PressOneFile, ARegisteredPressIsReachableByEveryNameAndTheBudget) {
  EXPECT_EQ(make_press_impl("test_newest_first", 0.25)->describe(), "test_newest_first:ratio=0.25,sink=2");
  EXPECT_EQ(make_press_impl("TestNewestFirstPress:compression_ratio=0.5,num_sink_tokens=3", 0.0)->describe(),
            "test_newest_first:ratio=0.5,sink=3");
  EXPECT_EQ(make_press_impl("adakv(TestNewestFirstPress)", 0.5)->describe(), make_press_impl("adakv(test_newest_first)", 0.5)->describe());

  // Under the generic budget each KV head keeps the sinks and the newest entries, hand-derived.
  const Model& model = press_test::bundled_model();
  KVCache cache = press_test::random_cache(model, 40, 3);
  auto press = make_press_impl("test_newest_first:budget=10", 0.0);
  Observation obs;
  press->compress(cache, model, obs);
  std::vector<int32_t> want = {0, 1};
  for (int32_t p = 32; p < 40; ++p) want.push_back(p);
  for (int l = 0; l < cache.n_layer(); ++l)
    for (int h = 0; h < cache.n_head_kv(); ++h) EXPECT_EQ(cache.seg(l, h).positions(), want) << l << "," << h;

  const PressInfo* info = PressRegistry::instance().find("test_newest_first");
  ASSERT_NE(info, nullptr);
  EXPECT_EQ(info->kvpress, std::vector<std::string>{"TestNewestFirstPress"});
  try {
    make_press_impl("TestNewestFirstPress:n_sink=3", 0.5);
    ADD_FAILURE() << "an undeclared kvpress field was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown parameter 'n_sink'"), std::string::npos) << e.what();
  }
}

}  // namespace
