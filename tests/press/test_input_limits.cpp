// Bounds and checks on input before work: press specs limited in length and nesting,
// press specs that describe() writes read back to the same press (nested ones included), text
// files checked before they are read, and file content escaped before an error message echoes it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <string>

#include "kvslim/error.h"
#include "kvslim/eval_tasks.h"
#include "press/authoring.h"
#include "util/text_file.h"
#include "support/files.h"

using namespace kvslim;

namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Presses that cannot be built without a file (trained surrogate, head labels, query filters), as in
// test_press_registry_rules.cpp.
const std::set<std::string> kNeedsFile = {"kvzap", "duo_attention", "qfilter", "fastkvzip", "lukv", "restorekv"};
// Presses with a parameter that has no default: the value the test gives.
const std::map<std::string, std::string> kRequired = {
    {"threshold", "threshold:tau=-4"},
    {"finch", "finch:window=8"},
    {"per_layer", "per_layer:ratios=0.5/0.25/0.5/0.75/0.5"},
};

std::string spec_of(const PressInfo& info) {
  auto it = kRequired.find(info.name);
  return it != kRequired.end() ? it->second : info.name;
}

/// describe() of the press `spec` builds, parsed again, describes itself identically.
void expect_round_trip(const std::string& spec) {
  SCOPED_TRACE(spec);
  std::unique_ptr<PressImpl> p;
  ASSERT_NO_THROW(p = make_press_impl(spec, 0.5));
  const std::string d = p->describe();
  std::unique_ptr<PressImpl> q;
  ASSERT_NO_THROW(q = make_press_impl(d, 0.25)) << "describe() wrote '" << d << "', which does not parse: "
                                           << error_of([&] { make_press_impl(d, 0.25); });
  EXPECT_EQ(q->describe(), d);
}

}  // namespace

// Regression: a spec nested 9,000 levels deep overflowed the stack (SIGSEGV) and 8,000 levels cost
// 675 MB; both are now rejected before parsing, as is a spec past the length limit.
TEST(PressSpecLimits, DeepNestingAndLongSpecsAreRejectedBeforeParsing) {
  for (int depth : {17, 8000, 9000, 100000}) {
    std::string spec;
    for (int i = 0; i < depth; ++i) spec += "key_rerotation(";
    spec += "snapkv";
    spec += std::string(depth, ')');
    if (spec.size() > kMaxPressSpecLength) {
      EXPECT_NE(error_of([&] { make_press_impl(spec, 0.5); }).find("longer than the limit of 4096"), std::string::npos);
      continue;
    }
    const std::string e = error_of([&] { make_press_impl(spec, 0.5); });
    EXPECT_NE(e.find("17 nested parentheses, more than the limit of 16"), std::string::npos) << e;
  }
  // Unbalanced deep nesting is caught by the same count.
  EXPECT_NE(error_of([] { make_press_impl(std::string(4000, '('), 0.5); }).find("nested parentheses"), std::string::npos);
  // Within the limits, the parser still works at the limit depth (the error is about the press, not the depth).
  std::string ok;
  for (int i = 0; i < kMaxPressSpecDepth; ++i) ok += "key_rerotation(";
  ok += "snapkv" + std::string(kMaxPressSpecDepth, ')');
  EXPECT_EQ(error_of([&] { make_press_impl(ok, 0.5); }).find("nested parentheses"), std::string::npos);
  // A long composition of short terms is bounded by the length limit.
  std::string many = "knorm";
  while (many.size() <= kMaxPressSpecLength) many += "+knorm";
  EXPECT_NE(error_of([&] { make_press_impl(many, 0.5); }).find("longer than the limit"), std::string::npos);
}

// Regression: an inner parenthesised press's trailing parameters went to the outer press
// ("leankv: unknown parameter 'first_stage'" although both belong to criticalkv).
TEST(PressSpecRouting, TrailingParametersOfANestedPressStayWithIt) {
  auto p = make_press_impl("leankv(criticalkv(snapkv):epsilon=0.001,first_stage=0.4)", 0.5);
  const std::string d = p->describe();
  EXPECT_EQ(d.rfind("leankv(criticalkv(snapkv:", 0), 0u) << d;
  EXPECT_NE(d.find("):epsilon=0.001,first_stage=0.4):low="), std::string::npos) << d;
  // The first key that is not the inner press's goes to the outer press, and every later one.
  const std::string d2 = make_press_impl("leankv(criticalkv(snapkv):epsilon=0.001,low=0.25)", 0.5)->describe();
  EXPECT_NE(d2.find(":epsilon=0.001,first_stage="), std::string::npos) << d2;
  EXPECT_NE(d2.find("):low=0.25"), std::string::npos) << d2;
  // The last term of an inner composition takes its keys too.
  const std::string d3 = make_press_impl("key_rerotation(knorm+snapkv:window=8,kernel=3)", 0.5)->describe();
  EXPECT_NE(d3.find("snapkv:ratio=0.5,window=8,kernel=3"), std::string::npos) << d3;
  // Unchanged: a bare inner press gives following keys to the outer one.
  EXPECT_EQ(make_press_impl("threshold(knorm,window=64,tau=0)", 0.0)->describe(), "threshold(knorm:ratio=0):tau=0,window=64,decode=0");
}

// describe() is a spec: for every registered press alone, and for every policy or wrapper around
// every other one that accepts it, make_press(describe()) describes itself the same way.
TEST(PressSpecRouting, DescribeRoundTripsForEveryRegisteredPressAndNesting) {
  std::vector<const PressInfo*> outers;
  size_t nested = 0;
  for (const PressInfo* info : PressRegistry::instance().all()) {
    if (kNeedsFile.count(info->name)) continue;
    expect_round_trip(spec_of(*info));
    if (info->kind != PressKind::Scorer) outers.push_back(info);
  }
  for (const PressInfo* outer : outers)
    for (const PressInfo* inner : outers) {
      if (outer == inner) continue;
      // The nested spec as a user writes it, with the outer press's required parameters after it.
      std::string in = spec_of(*inner), out_params;
      const std::string o = spec_of(*outer);
      if (o.find(':') != std::string::npos) out_params = o.substr(o.find(':'));
      const std::string spec = outer->name + "(" + in + ")" + out_params;
      if (!error_of([&] { make_press_impl(spec, 0.5); }).empty()) continue;  // e.g. a policy over a wrapper
      expect_round_trip(spec);
      ++nested;
    }
  EXPECT_GE(nested, 20u);
  expect_round_trip("leankv(criticalkv(snapkv:window=16):epsilon=0.001,first_stage=0.4):low=0.3");
  expect_round_trip("key_rerotation(adakv(snapkv:window=32):alpha=0.3+knorm)");
}

TEST(Printable, EscapesControlCharactersAndInvalidUtf8) {
  EXPECT_EQ(printable("llama"), "llama");
  EXPECT_EQ(printable("a\x1b[31mb\n\t\r\x7f"), "a\\x1b[31mb\\n\\t\\r\\x7f");
  EXPECT_EQ(printable(std::string("a\0b", 3)), "a\\x00b");
  EXPECT_EQ(printable("caf\xc3\xa9 \xe2\x96\x81 \xf0\x9f\x99\x82"), "caf\xc3\xa9 \xe2\x96\x81 \xf0\x9f\x99\x82");  // é ▁ 🙂
  EXPECT_EQ(printable("\xc2\x9b" "2J"), "\\xc2\\x9b2J");    // C1 CSI
  EXPECT_EQ(printable("\xc0\xaf"), "\\xc0\\xaf");            // overlong '/'
  EXPECT_EQ(printable("\xed\xa0\x80"), "\\xed\\xa0\\x80");   // surrogate
  EXPECT_EQ(printable("\xe2\x96"), "\\xe2\\x96");            // cut sequence
  EXPECT_EQ(printable(std::string(300, 'x'), 10), std::string(10, 'x') + "...(290 more bytes)");
}

TEST(TextFile, CheckedBeforeReading) {
  const std::string dir = ::testing::TempDir();
  EXPECT_NE(error_of([&] { read_text_file(dir, "-f"); }).find("-f " + dir + ": is a directory"), std::string::npos);
  EXPECT_NE(error_of([] { read_text_file("/nonexistent/x.txt", "--text"); }).find("--text /nonexistent/x.txt: cannot open"),
            std::string::npos);
  const std::string path = temp_path("text.txt");
  { std::ofstream(path, std::ios::binary) << ""; }
  EXPECT_NE(error_of([&] { read_text_file(path, "-f"); }).find("file is empty"), std::string::npos);
  { std::ofstream(path, std::ios::binary) << "0123456789"; }
  EXPECT_EQ(read_text_file(path, "-f", 10), "0123456789");
  EXPECT_NE(error_of([&] { read_text_file(path, "-f", 9); }).find("file of 10 bytes is larger than the limit of 9 bytes"),
            std::string::npos);
  std::remove(path.c_str());
}

// Regression (fuzz_task_text, crash-7c925a58): a number too large for a double made nlohmann throw
// out_of_range, which escaped as a non-kvslim exception (the reader caught parse_error only).
TEST(TaskTextJson, NumberOverflowIsAnError) {
  for (const char* text : {R"({"key_length": 1e999999})", R"({"keys": [668866688e88888.88]})", "[1e400]"}) {
    const std::string e = error_of([&] { TaskText::from_json_text(text, "cfg.json"); });
    EXPECT_NE(e.find("cfg.json: not valid JSON"), std::string::npos) << text << ": " << e;
  }
}
