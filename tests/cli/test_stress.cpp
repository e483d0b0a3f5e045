// Many short generations at 1..16 threads, run all at once (so the machine is oversubscribed)
// under a virtual-memory limit, each bounded by a timeout. Regression for two hangs: OpenBLAS's
// own thread pool nested under ours (its workers blocked allocating under `ulimit -v`), and
// threads spinning on a machine with fewer cores than threads.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

#include "support/files.h"
#include "support/sanitizer.h"

TEST(Stress, ConcurrentGenerationsAtOneToSixteenThreadsUnderMemoryLimitFinish) {
  const std::string dir = ::testing::TempDir() + "kvslim_stress_" + std::to_string(::getpid());
  const std::string model = std::string(KVSLIM_SOURCE_DIR) + "/models/stories260K.gguf";
  // Long enough (about 150 tokens) that prefill's products are split over the pool's threads.
  std::string prompt;
  for (int i = 0; i < 12; ++i) prompt += "Once upon a time there was a little girl named Lily. ";
  const std::string limit = kSanitized ? "" : "ulimit -v 524288; ";
  // 60 s is far above a normal run (well under a second each); a hang shows as exit code 124.
  std::string script = "for t in $(seq 1 16); do (" + limit + "timeout -k 5 60 '" +
                       KVSLIM_CLI + "' generate -m '" + model +
                       "' -p '" + prompt + "' -n 8 --temp 0 -t $t >\"" + dir + "/out_$t\" 2>\"" + dir +
                       "/err_$t\"; echo $? >\"" + dir + "/rc_$t\") & done; wait";
  ASSERT_EQ(std::system(("mkdir -p '" + dir + "'").c_str()), 0);
  std::ofstream(dir + "/run.sh") << script << "\n";
  ASSERT_EQ(std::system(("bash '" + dir + "/run.sh'").c_str()), 0);
  std::string first_out;
  for (int t = 1; t <= 16; ++t) {
    const std::string rc = slurp(dir + "/rc_" + std::to_string(t));
    EXPECT_EQ(rc, "0\n") << "-t " << t << " (124 = timed out): " << slurp(dir + "/err_" + std::to_string(t));
    // Greedy output must not depend on the thread count.
    std::string out = slurp(dir + "/out_" + std::to_string(t));
    out = out.substr(0, out.find("--- kvslim ---"));  // the text, without the speed report
    if (t == 1) first_out = out;
    EXPECT_EQ(out, first_out) << "-t " << t;
  }
  if (!HasFailure()) std::system(("rm -rf '" + dir + "'").c_str());
}
