// The `kvslim` binary on bad input: every case exits non-zero without a crash (exit code < 128,
// no signal) and prints one clear message naming the file, field or value at fault.
#include <gtest/gtest.h>
#include <unistd.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "kvslim/gguf.h"
#include "support/files.h"
#include "support/shell.h"

using namespace kvslim;

namespace {

const std::string kModel = std::string(KVSLIM_SOURCE_DIR) + "/models/stories260K.gguf";

// The pid keeps names apart when ctest runs tests as parallel processes.
void spit(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
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

// Regression: a missing press file was reported as "cannot open model file", as if -m were wrong.
TEST(CliErrors, MissingPressFileNamesTheParameter) {
  for (const std::string spec : {"qfilter:filters", "expected_attention:stats", "fastkvzip:gates",
                                 "duo_attention:labels", "kvzap:surrogate"}) {
    const std::string press = spec.substr(0, spec.find(':'));
    const std::string key = spec.substr(spec.find(':') + 1);
    Result r = run_cli(gen(kModel, "-p hi --press " + spec + "=/nonexistent/f.gguf"));
    EXPECT_NE(r.rc, 0) << spec;
    EXPECT_NE(r.err.find("error: press " + press + ": " + key + "=/nonexistent/f.gguf: cannot open file: "),
              std::string::npos)
        << r.err;
    EXPECT_EQ(r.err.find("model file"), std::string::npos) << r.err;
  }
}

// Regression: a compression ratio the press does not use ran silently (think, simlayerkv,
// threshold keep by parameters of their own).
TEST(CliErrors, CompressionRatioThePressIgnoresIsRefused) {
  for (const std::string spec : {"think", "simlayerkv", "threshold:tau=-4", "adakv(snapkv):ratio=0.3"})
    expect_clean_failure(gen(kModel, "-p hi --press " + quote(spec) + " --compression-ratio 0.5"),
                         {"error: --compression-ratio 0.5: press '" + spec + "' does not keep its entries by a compression ratio"});
  Result r = run_cli(gen(kModel, "-p 'Once upon a time there was' --press 'snapkv+think' --compression-ratio 0.5"));
  EXPECT_EQ(r.rc, 0) << r.err;
}

// bench builds each press once (before the model loads) and reads from that build both whether
// --compression-ratio is used by some press of the table (else an error, as in generate) and
// whether its footer names the ratio.
TEST(CliErrors, BenchChecksTheRatioAgainstThePressesOfItsTable) {
  const std::string bench = "bench -m " + quote(kModel) + " -p 8 -n 0 -r 1 -t 1 --no-progress ";
  expect_clean_failure(bench + "--press think --compression-ratio 0.5",
                       {"error: --compression-ratio 0.5: press 'think' does not keep its entries by a compression ratio"});
  // The last press other than none is named.
  expect_clean_failure(bench + "--press none --press think --press simlayerkv --compression-ratio 0.25",
                       {"error: --compression-ratio 0.25: press 'simlayerkv' does not keep"});
  expect_clean_failure(bench + "--press none --compression-ratio 0.5", {"error: --compression-ratio 0.5 needs a press"});
  // A bad spec fails before the model is opened: the error names the press, not the file.
  Result bad = run_cli("bench -m /nonexistent/m.gguf --press no_such_press");
  EXPECT_NE(bad.rc, 0);
  EXPECT_NE(bad.err.find("unknown press 'no_such_press'"), std::string::npos) << bad.err;
  // One press of the table that takes the ratio is enough; the footer names it.
  Result mixed = run_cli(bench + "--press snapkv --press think --compression-ratio 0.25");
  ASSERT_EQ(mixed.rc, 0) << mixed.err;
  EXPECT_NE(mixed.out.find(", compression ratio 0.25"), std::string::npos) << mixed.out;
  EXPECT_NE(mixed.out.find("| think"), std::string::npos) << mixed.out;
  // Presses that take no ratio: the (default) ratio meant nothing and is not printed.
  Result free = run_cli(bench + "--press none --press think");
  ASSERT_EQ(free.rc, 0) << free.err;
  EXPECT_EQ(free.out.find("compression ratio"), std::string::npos) << free.out;
  Result snap = run_cli(bench + "--press snapkv");
  ASSERT_EQ(snap.rc, 0) << snap.err;
  EXPECT_NE(snap.out.find(", compression ratio 0.5"), std::string::npos) << snap.out;
}

// Regression: the human report showed only the cache right after compression; the cache a request
// ends with (decoded entries added) was only in --json. stories260K: 5 layers x 4 KV heads x (8 x
// 2 B keys + 8 x 2 B values + a 4-byte position) = 720 B per token in f16; 4 generated tokens of
// which 3 were run through the model.
TEST(CliReport, CacheAtTheEndIsShown) {
  const std::string prompt = "-p 'Once upon a time there was a little girl named Lily. She loved to play' -n 4 --temp 0 ";
  auto line = [](const std::string& err, const std::string& head) {
    const size_t p = err.find(head);
    return p == std::string::npos ? std::string() : err.substr(p, err.find('\n', p) - p);
  };
  Result none = run_cli("generate -m " + quote(kModel) + " " + prompt + "--press none");
  ASSERT_EQ(none.rc, 0) << none.err;
  const std::string end = line(none.err, "KV bytes at end");
  EXPECT_NE(end.find("after 4 decoded tokens"), std::string::npos) << end;
  EXPECT_NE(end.find("memory ratio 1.000)"), std::string::npos) << end;
  Result snap = run_cli("generate -m " + quote(kModel) + " " + prompt + "--press snapkv --compression-ratio 0.5");
  ASSERT_EQ(snap.rc, 0) << snap.err;
  const std::string after = line(snap.err, "KV bytes  "), at_end = line(snap.err, "KV bytes at end");
  const long compressed = std::stol(after.substr(after.find('(') + 1));
  const long final_bytes = std::stol(at_end.substr(at_end.find('(') + 1));
  EXPECT_EQ(final_bytes, compressed + 3 * 720) << after << "\n" << at_end;
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
  // An empty file is named as such (it used to read as an empty -p).
  expect_clean_failure(gen(kModel, "-f " + quote(path)), {"error:", "-f", path, "is empty"});
  std::remove(path.c_str());
}

// Regression: `-f DIR` said "empty prompt"; a directory, an empty file or one past the
// size limit is reported by flag and path before anything is read, by every command reading text.
TEST(CliErrors, TextInputsThatAreNotTextFiles) {
  const std::string dir = ::testing::TempDir();
  expect_clean_failure(gen(kModel, "-f " + quote(dir)), {"error:", "-f", dir, "is a directory"});
  expect_clean_failure("attention-stats -m " + quote(kModel) + " -f " + quote(dir), {"error:", "-f", "is a directory"});
  // eval fidelity --text DIR (or an empty file) scored model-sampled text instead.
  const std::string out = temp_path("fid_out");
  const std::string fid = "eval fidelity -m " + quote(kModel) + " --samples 1 --context-tokens 8 --continuation-tokens 4 "
                          "--no-plot --no-progress -o " + quote(out) + " --text ";
  expect_clean_failure(fid + quote(dir), {"error:", "--text", dir, "is a directory"});
  const std::string empty = temp_path("empty_text.txt");
  spit(empty, "");
  expect_clean_failure(fid + quote(empty), {"error:", "--text", empty, "is empty"});
  // A sparse file past the 256 MiB limit: rejected from its size, without reading it.
  const std::string big = temp_path("big.txt");
  { std::ofstream f(big, std::ios::binary); }
  ASSERT_EQ(::truncate(big.c_str(), (off_t{257} << 20)), 0);
  expect_clean_failure(gen(kModel, "-f " + quote(big)), {"error:", "-f", big, "269484032 bytes", "limit"});
  std::remove(big.c_str());
  std::remove(empty.c_str());
  std::filesystem::remove_all(out);
}

// Regression: the eval tables printed the ratio with 2 decimals, so
// --ratios 0.962,0.966 read "0.96" and "0.97"; they print the ratio as given. latent-calibrate
// --k-rank above head_dim (8 here) was cut to head_dim silently.
TEST(CliErrors, EvalTablePrintsTheRatioAsGivenAndCalibrationRanksAboveHeadDimFail) {
  const std::string out = temp_path("fid_ratio");
  Result r = run_cli("eval fidelity -m " + quote(kModel) + " --press knorm --ratios 0.625 --samples 1 --no-baseline "
                     "--context-tokens 16 --continuation-tokens 4 --no-plot --no-progress -o " + quote(out));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find(" 0.625 "), std::string::npos) << r.out;
  std::filesystem::remove_all(out);
  const std::string story = std::string(KVSLIM_SOURCE_DIR) + "/models/story.txt";
  const std::string bases = temp_path("rank9.gguf");
  expect_clean_failure("latent-calibrate -m " + quote(kModel) + " --text " + quote(story) + " -o " + quote(bases) +
                           " --k-rank 9",
                       {"error:", "--k-rank 9", "head_dim 8"});
  expect_clean_failure("latent-calibrate -m " + quote(kModel) + " --text " + quote(story) + " -o " + quote(bases) +
                           " --v-rank 12",
                       {"error:", "--v-rank 12", "head_dim 8"});
  std::remove(bases.c_str());
}

// Regression: these values were accepted (NaN temperature, top-p above 1, negative
// top-k, a NaN press parameter, a depth outside [0, 1], a learning rate of 1e30). Each is now
// rejected before the model loads, by flag (or parameter) and value.
TEST(CliErrors, NumericOptionsOutOfRange) {
  expect_clean_failure(gen(kModel, "-p hi --temp nan"), {"--temp", "nan"});
  expect_clean_failure(gen(kModel, "-p hi --temp inf"), {"--temp", "inf"});
  expect_clean_failure(gen(kModel, "-p hi --temp -1"), {"--temp", "-1"});
  expect_clean_failure(gen(kModel, "-p hi --top-p 2"), {"--top-p", "2"});
  expect_clean_failure(gen(kModel, "-p hi --top-p nan"), {"--top-p", "nan"});
  expect_clean_failure(gen(kModel, "-p hi --top-k -5"), {"--top-k", "-5"});
  expect_clean_failure(gen(kModel, "-p hi --press threshold:tau=nan"), {"error:", "threshold", "tau='nan'", "finite"});
  const std::string out = temp_path("niah_out");
  expect_clean_failure("eval niah -m " + quote(kModel) + " --depths -1 --lengths 64 -o " + quote(out),
                       {"--depths", "-1"});
  expect_clean_failure("eval niah -m " + quote(kModel) + " --depths 0.5,nan --lengths 64 -o " + quote(out),
                       {"--depths", "nan"});
  expect_clean_failure("eval niah -m " + quote(kModel) + " --lengths 0 -o " + quote(out), {"--lengths", "0"});
  expect_clean_failure("eval fidelity -m " + quote(kModel) + " --lmba-tau nan -o " + quote(out), {"--lmba-tau", "nan"});
  expect_clean_failure("kvzap-train -m " + quote(kModel) + " --lr 1e30 --corpus " + quote(kModel), {"--lr", "1e30"});
  expect_clean_failure("kvzap-train -m " + quote(kModel) + " --alpha inf --corpus " + quote(kModel), {"--alpha", "inf"});
  expect_clean_failure("fastkvzip-train -m " + quote(kModel) + " --lr inf -o x.gguf -f " + quote(kModel), {"--lr", "inf"});
  expect_clean_failure("fastkvzip-train -m " + quote(kModel) + " --steps 0 -o x.gguf -f " + quote(kModel), {"--steps", "0"});
  expect_clean_failure("attention-stats -m " + quote(kModel) + " -p hi --mass nan", {"--mass", "nan"});
  expect_clean_failure("serve -m " + quote(kModel) + " --temp nan", {"--temp", "nan"});
  expect_clean_failure("serve -m " + quote(kModel) + " --kv-budget nan", {"--kv-budget", "nan"});
  // serve's --kv-budget reads a SIZE as generate's does (a MiB count before).
  expect_clean_failure("serve -m " + quote(kModel) + " --kv-budget 12parsecs", {"--kv-budget", "12parsecs", "KiB"});
  expect_clean_failure("serve -m " + quote(kModel) + " --kv-budget -5MiB", {"--kv-budget", "-5MiB"});
  std::filesystem::remove_all(out);
}

// Regression: error messages printed control characters from the file raw (an escape
// sequence in general.architecture reached the terminal). They are escaped now.
TEST(CliErrors, ControlCharactersFromFilesAreEscaped) {
  const std::string path = temp_path("ctrl_arch.gguf");
  rewrite_model(path, [](GGUFWriter& w) { w.set("general.architecture", GGUFValue::str("ev\x1b[2Jil\n\x07")); });
  Result r = run_cli(gen(path, "-p hi"));
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("'ev\\x1b[2Jil\\n\\x07'"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find('\x1b'), std::string::npos) << "raw escape character in: " << r.err;
  EXPECT_EQ(r.err.find('\x07'), std::string::npos);
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

// Library errors name parameters (n_ctx, SynthOptions::layers, ...); the CLI shows the flag typed.
TEST(CliErrors, LibraryErrorsNameTheFlag) {
  const std::string story = std::string(KVSLIM_SOURCE_DIR) + "/models/story.txt";
  const std::string out = temp_path("flags.gguf");
  expect_clean_failure("synth --shape qwen2.5-0.5b --type q8_0 --layers 99 --vocab-from " + quote(kModel) + " -o " +
                           quote(out),
                       {"error:", "--layers 99", "out of range"});
  expect_clean_failure(gen(kModel, "-p hi --chat-template-file /nonexistent/t.jinja"),
                       {"error:", "--chat-template-file /nonexistent/t.jinja", "cannot open"});
  expect_clean_failure("eval niah -m " + quote(kModel) + " --lengths 64 --text-config /nonexistent/t.json -o " +
                           quote(temp_path("flags_eval")),
                       {"error:", "--text-config /nonexistent/t.json"});
  expect_clean_failure(gen(kModel, "-p 'Once upon a time there was a girl' -c 24 --press kvzip --compression-ratio 0.5"),
                       {"error:", "kvzip", "raise -c"});
  expect_clean_failure("latent-calibrate -m " + quote(kModel) + " --text " + quote(story) + " -o " + quote(out) +
                           " --k-bits 3",
                       {"error:", "--k-bits 3", "must be 0"});
  // Regression: the held-out KL options were silently ignored without --target-kl (rc 0, a file written).
  for (const std::string& flag : {std::string("--kl-per-segment"), "--kl-text " + quote(story), std::string("--kl-scales token")})
    expect_clean_failure("latent-calibrate -m " + quote(kModel) + " --text " + quote(story) + " -o " + quote(out) + " " +
                             flag,
                         {"error:", flag.substr(0, flag.find(' ')), "needs --target-kl"});
  expect_clean_failure("duo-calibrate -m " + quote(kModel) + " -o " + quote(out) + " --length 20",
                       {"error:", "raise --length"});
  Result r = run_cli(gen(kModel, "-c 8 -p 'Once upon a time there was a little girl named Lily'"));
  EXPECT_NE(r.err.find("context size -c 8"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("n_ctx"), std::string::npos) << r.err;
  std::remove(out.c_str());
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

TEST(CliAutoBudget, KvBudgetAndTargetKlAreReportedAndChecked) {
  const std::string ctx = "-f " + quote(std::string(KVSLIM_SOURCE_DIR) + "/models/story.txt");
  Result r = run_cli(gen(kModel, ctx + " --press knorm --kv-budget 20KiB --json -"));
  ASSERT_EQ(r.rc, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_LE(j["kv_bytes"].get<size_t>(), size_t(20) * 1024);
  EXPECT_EQ(j["auto_budget"]["kv_budget_bytes"].get<size_t>(), size_t(20) * 1024);
  EXPECT_TRUE(j["auto_budget"]["budget_met"].get<bool>());
  EXPECT_NEAR(j["compression_ratio"].get<double>(), j["auto_budget"]["ratio"].get<double>(), 0.01);
  EXPECT_NE(r.err.find("auto-budget"), std::string::npos);

  expect_clean_failure(gen(kModel, ctx + " --press knorm --kv-budget 12parsecs"), {"--kv-budget", "12parsecs"});
  expect_clean_failure(gen(kModel, ctx + " --press knorm --target-kl 0.01 --compression-ratio 0.5"),
                       {"--compression-ratio"});
  expect_clean_failure(gen(kModel, ctx + " --target-kl 0.01"), {"--press"});
  expect_clean_failure(gen(kModel, ctx + " --press knorm --target-kl nan"), {"--target-kl", "nan"});
}
