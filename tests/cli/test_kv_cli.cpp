// `kvslim generate` cache flags: incompatible combinations are rejected while the arguments are
// parsed (before the model is read), with a message naming the flags; a quantized run reports
// bits per entry and the memory ratio against a full f16 cache.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

namespace {

// Runs the CLI, returns its exit status and combined output.
int run(const std::string& args, std::string& out) {
  const std::string cmd = std::string(KVSLIM_CLI) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return -1;
  char buf[4096];
  out.clear();
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

}  // namespace

TEST(KVCli, IncompatibleCacheOptionsRejectedAtParse) {
  // A model path that does not exist: a rejection must come before the model is opened.
  const std::string base = "generate -m /nonexistent/model.gguf -p hello ";
  const std::pair<std::string, std::string> bad[] = {
      {"--kivi-bits 3", "--kivi-bits 3"},
      {"--kivi-bits 2 --cache-type-k q8_0", "residual window in full precision"},
      {"--kivi-bits 4 --cache-type-v q4_0", "--cache-type-v"},
      {"--kivi-group 16", "--kivi-group needs --kivi-bits"},
      {"--kivi-residual 64", "--kivi-residual needs --kivi-bits"},
      {"--kivi-bits 2 --kivi-group 0", "--kivi-group 0"},
      {"--cache-type-k q4_1", "'q4_1'"},
      {"--cache-type-v int3", "unknown KV cache type 'int3'"},
  };
  for (const auto& [args, msg] : bad) {
    std::string out;
    const int rc = run(base + args, out);
    // Regression: argument errors exited with CLI11's codes (105) and without the "error:" line
    // every other failure prints.
    EXPECT_EQ(rc, 1) << args;
    EXPECT_EQ(out.rfind("error: ", 0), 0u) << args << " printed: " << out;
    EXPECT_NE(out.find(msg), std::string::npos) << args << " printed: " << out;
    EXPECT_EQ(out.find("nonexistent"), std::string::npos) << args << ": the model was opened: " << out;
  }
}

TEST(KVCli, GenerateReportsBitsAndMemoryRatio) {
  std::string out;
  const std::string model = std::string(KVSLIM_SOURCE_DIR) + "/models/stories260K.gguf";
  const int rc = run("generate -m " + model + " -p 'Once upon a time' -n 8 --temp 0 --cache-type-k q8_0 "
                     "--cache-type-v q4_0", out);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("k=q8_0 v=q4_0"), std::string::npos) << out;
  // head_dim 8: q8_0 keys take 8 + 2 bytes, q4_0 values 4 + 2, plus a 4-byte position:
  // 20 bytes = 160 bits per entry; (160 - 32) / 16 = 8 bits per key/value element.
  EXPECT_NE(out.find("160.0 bits per entry (8.00 bits per key/value element"), std::string::npos) << out;
  EXPECT_NE(out.find("memory ratio 0.556"), std::string::npos) << out;  // 20 / 36 bytes
  EXPECT_EQ(run("generate -m " + model + " -p 'Once upon a time' -n 4 --kivi-bits 2 --kivi-group 8 "
                "--kivi-residual 0 --kv-hadamard", out), 0) << out;
  EXPECT_NE(out.find("kivi2 G=8 R=0"), std::string::npos) << out;
}
