// A program built against an installed kvslim (tests/install/test_install.py): it loads a model,
// builds a press by name from the registry (filled by the library's static initializers, which a
// link that drops objects loses), generates, and catches a kvslim::Error thrown inside the library.
// Prints one line that the test compares across the ways of linking.
#include <cstdio>
#include <cstring>
#include <string>

#include "kvslim/error.h"
#include "kvslim/generate.h"
#include "kvslim/model.h"
#include "kvslim/press.h"
#include "kvslim/version.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s MODEL.gguf EXPECTED_VERSION\n", argv[0]);
    return 2;
  }
  if (std::strcmp(kvslim::kVersion, argv[2]) != 0) {
    std::fprintf(stderr, "kvslim::kVersion is '%s', expected '%s'\n", kvslim::kVersion, argv[2]);
    return 1;
  }
  try {
    kvslim::make_press("no_such_press", 0.5);
    std::fprintf(stderr, "make_press accepted an unknown press\n");
    return 1;
  } catch (const kvslim::Error&) {
  }
  auto model = kvslim::Model::load(argv[1]);
  auto press = kvslim::make_press("snapkv", 0.5);
  kvslim::GenerateOptions opt;
  opt.context = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. "
                "One day, she saw a big red ball under a tree. She ran to the ball and kicked it very high.";
  opt.question = " Then";
  opt.n_predict = 8;
  opt.sampling.temp = 0.0f;
  kvslim::GenerateResult r = kvslim::generate(*model, *press, opt);
  std::printf("kept %zu of %zu entries: %s\n", r.stats.entries_kept, r.stats.entries_total, r.text.c_str());
  return r.stats.entries_total > 0 && !r.text.empty() ? 0 : 1;
}
