// The `kvslim` binary on bad input: every case exits non-zero without a crash (exit code < 128,
// no signal) and prints one clear message naming the file, field or value at fault.
#include <gtest/gtest.h>
#include <unistd.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>

#include "kvslim/gguf.h"

using namespace kvslim;

namespace {

const std::string kModel = std::string(KVSLIM_SOURCE_DIR) + "/models/stories260K.gguf";

// The pid keeps names apart when ctest runs tests as parallel processes.
std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "kvslim_cli_" + std::to_string(::getpid()) + "_" + name;
}

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void spit(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

struct Result {
  int rc = -1;
  bool signaled = false;
  std::string out, err;
};

/// Runs the CLI with `args` (already shell-quoted) and collects exit status, stdout and stderr.
Result run_cli(const std::string& args) {
  const std::string out = temp_path("stdout.txt"), err = temp_path("stderr.txt");
  const std::string cmd = quote(KVSLIM_CLI) + " " + args + " >" + quote(out) + " 2>" + quote(err) + " </dev/null";
  const int st = std::system(cmd.c_str());
  Result r;
  r.signaled = WIFSIGNALED(st);
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

/// Expects a clean failure whose stderr holds every one of `parts`.
void expect_clean_failure(const std::string& args, std::initializer_list<std::string> parts) {
  SCOPED_TRACE("kvslim " + args);
  Result r = run_cli(args);
  EXPECT_FALSE(r.signaled);
  EXPECT_NE(r.rc, 0) << r.err;
  EXPECT_LT(r.rc, 128) << "crashed: " << r.err;  // the shell reports a signal as 128 + n
  for (const std::string& p : parts)
    EXPECT_NE(r.err.find(p), std::string::npos) << "stderr '" << r.err << "' lacks '" << p << "'";
}

std::string gen(const std::string& model, const std::string& rest) {
  return "generate -m " + quote(model) + " -n 2 --temp 0 " + rest;
}

/// Rewrites stories260K through GGUFWriter: `edit` may change the metadata; `skip` names a
/// tensor to leave out.
void rewrite_model(const std::string& dst, const std::function<void(GGUFWriter&)>& edit, const std::string& skip = "") {
  auto f = GGUFFile::open(kModel);
  GGUFWriter w;
  for (const auto& [k, v] : f->metadata()) w.set(k, v);
  if (edit) edit(w);
  for (const TensorInfo& t : f->tensors())
    if (t.name != skip)
      w.add_tensor(t.name, t.type, t.ne, std::string(static_cast<const char*>(t.data), t.nbytes));
  w.write(dst);
}

}  // namespace

TEST(CliErrors, GoodRunSucceeds) {  // the baseline the failures are measured against
  Result r = run_cli(gen(kModel, "-p 'Once upon a time'"));
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("Once upon a time"), std::string::npos);
}

TEST(CliErrors, MissingModelFile) {
  expect_clean_failure(gen("/nonexistent/dir/model.gguf", "-p hi"),
                       {"error:", "/nonexistent/dir/model.gguf", "cannot open"});
}

TEST(CliErrors, TruncatedModel) {
  const std::string path = temp_path("truncated.gguf");
  const std::string bytes = slurp(kModel);
  for (size_t cut : {size_t(10), size_t(100), size_t(5000), bytes.size() / 2, bytes.size() - 1}) {
    spit(path, bytes.substr(0, cut));
    expect_clean_failure(gen(path, "-p hi"), {"error:", path, "truncated"});
  }
  std::remove(path.c_str());
}

TEST(CliErrors, CorruptMagic) {
  const std::string path = temp_path("magic.gguf");
  std::string bytes = slurp(kModel);
  std::memcpy(&bytes[0], "GGML", 4);
  spit(path, bytes);
  expect_clean_failure(gen(path, "-p hi"), {"error:", path, "bad magic"});
  spit(path, "");
  expect_clean_failure(gen(path, "-p hi"), {"error:", path, "not a GGUF file"});
  std::remove(path.c_str());
}

TEST(CliErrors, UnknownArchitecture) {
  const std::string path = temp_path("arch.gguf");
  rewrite_model(path, [](GGUFWriter& w) { w.set("general.architecture", GGUFValue::str("foo")); });
  expect_clean_failure(gen(path, "-p hi"), {"error:", path, "general.architecture", "'foo'"});
  std::remove(path.c_str());
}

TEST(CliErrors, UnknownTensorType) {
  const std::string path = temp_path("ttype.gguf");
  std::string bytes = slurp(kModel);
  // The tensor info of token_embd.weight: name, n_dims, ne[n_dims], type.
  const std::string name = "token_embd.weight";
  std::string pat(8, '\0');
  const uint64_t len = name.size();
  std::memcpy(&pat[0], &len, 8);
  pat += name;
  size_t at = bytes.find(pat);
  ASSERT_NE(at, std::string::npos);
  at += pat.size();
  uint32_t nd;
  std::memcpy(&nd, &bytes[at], 4);
  const uint32_t bad = 99;
  std::memcpy(&bytes[at + 4 + 8 * nd], &bad, 4);
  spit(path, bytes);
  expect_clean_failure(gen(path, "-p hi"), {"error:", path, "token_embd.weight", "unknown tensor type 99"});
  std::remove(path.c_str());
}

TEST(CliErrors, MissingTensor) {
  const std::string path = temp_path("missing.gguf");
  rewrite_model(path, nullptr, "blk.0.ffn_up.weight");
  expect_clean_failure(gen(path, "-p hi"), {"error:", path, "missing tensor", "blk.0.ffn_up.weight"});
  std::remove(path.c_str());
}

TEST(CliErrors, PromptLongerThanContext) {
  const std::string args = gen(kModel, "-c 8 -p 'Once upon a time there was a little girl named Lily who loved the park'");
  expect_clean_failure(args, {"error:", "exceeds the context size", "-c 8"});
  // Regression: the rejected prompt used to be echoed to stdout before the error.
  Result r = run_cli(args);
  EXPECT_EQ(r.out.find("little girl"), std::string::npos) << r.out;
}

TEST(CliErrors, CompressionRatioOutOfRange) {
  expect_clean_failure(gen(kModel, "-p hi --press knorm --compression-ratio 1.0"),
                       {"error:", "--compression-ratio", "1", "[0, 1)"});
  expect_clean_failure(gen(kModel, "-p hi --press knorm --compression-ratio -0.1"),
                       {"error:", "--compression-ratio", "-0.1"});
}

TEST(CliErrors, UnknownPress) {
  expect_clean_failure(gen(kModel, "-p hi --press nosuchpress"), {"error:", "unknown press", "nosuchpress"});
}

TEST(CliErrors, EmptyPrompt) {
  expect_clean_failure(gen(kModel, "-p ''"), {"error:", "empty prompt"});
  const std::string path = temp_path("empty.txt");
  spit(path, "");
  expect_clean_failure(gen(kModel, "-f " + quote(path)), {"error:", "empty prompt"});
  std::remove(path.c_str());
}

TEST(CliErrors, PromptAndFileBothOrNeither) {
  const std::string path = temp_path("prompt.txt");
  spit(path, "Once upon a time");
  expect_clean_failure(gen(kModel, "-p hi -f " + quote(path)), {"error:", "-p", "-f", "not both"});
  expect_clean_failure(gen(kModel, ""), {"error:", "no prompt", "-p", "-f"});
  expect_clean_failure(gen(kModel, "-f /nonexistent/prompt.txt"), {"error:", "/nonexistent/prompt.txt"});
  Result ok = run_cli(gen(kModel, "-f " + quote(path)));  // the file alone is fine
  EXPECT_EQ(ok.rc, 0) << ok.err;
  std::remove(path.c_str());
}

TEST(CliErrors, SynthBadOptions) {
  const std::string out = temp_path("synth.gguf");
  expect_clean_failure("synth --shape nosuchshape --type q8_0 --vocab-from " + quote(kModel) + " -o " + quote(out),
                       {"error:", "--shape", "nosuchshape"});
  expect_clean_failure("synth --shape qwen2.5-0.5b --type q3_k_xl --vocab-from " + quote(kModel) + " -o " + quote(out),
                       {"error:", "--type", "q3_k_xl"});
  expect_clean_failure("synth --shape qwen2.5-0.5b --type q8_0 --vocab-from /nonexistent/v.gguf -o " + quote(out),
                       {"error:", "/nonexistent/v.gguf"});
  expect_clean_failure("synth --shape qwen2.5-0.5b --type q8_0 -o " + quote(out), {"--vocab-from"});
}

// Regression: a context size above the model's training context was accepted silently. It still
// runs (RoPE positions past training are valid), with a warning naming both sizes; a context
// within the training length gives none.
TEST(CliErrors, ContextAboveTrainingWarns) {
  Result r = run_cli(gen(kModel, "-p 'Once upon a time' -c 5000"));
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("warning: the context of 5000 tokens exceeds the model's training context of 2048"),
            std::string::npos)
      << r.err;
  Result ok = run_cli(gen(kModel, "-p 'Once upon a time' -c 256"));
  EXPECT_EQ(ok.rc, 0) << ok.err;
  EXPECT_EQ(ok.err.find("warning"), std::string::npos) << ok.err;
}
