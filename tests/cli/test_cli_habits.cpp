// The CLI's habits (llama.cpp's where they overlap): text on stdout and everything else on stderr,
// --json FILE|-, --no-display-prompt, -ctk/-ctv, -n -1, -f -, --version, a message at the context
// limit, one default per flag, press flags that need --press, a progress line only on a terminal,
// llama.cpp's GPU flags accepted and ignored, -cnv's interactive chat, the ChatML fallback, bench's
// lists and output formats, and errors that name the flag.
#include <gtest/gtest.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <unistd.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/flag_names.h"
#include "cli/progress.h"
#include "support/files.h"
#include "support/shell.h"

namespace {

const std::string kModel = std::string(KVSLIM_SOURCE_DIR) + "/models/stories260K.gguf";
const std::string kPrompt = "Once upon a time";

struct Result {
  int rc = -1;
  std::string out, err;
};

/// Runs `kvslim ARGS` (already shell-quoted) with `stdin_text` on standard input.
Result run_cli(const std::string& args, const std::string& stdin_text = "") {
  const std::string out = temp_path("out"), err = temp_path("err"), in = temp_path("in");
  {
    std::ofstream f(in, std::ios::binary);
    f << stdin_text;
  }
  const std::string cmd =
      quote(KVSLIM_CLI) + " " + args + " >" + quote(out) + " 2>" + quote(err) + " <" + quote(in);
  const int st = std::system(cmd.c_str());
  Result r;
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

std::string gen(const std::string& rest) { return "generate -m " + quote(kModel) + " --temp 0 " + rest; }

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

// Library errors name parameters; the CLI shows the flag instead, only where the name stands alone.
TEST(CliHabits, LibraryParametersBecomeFlags) {
  using kvslim::cli::flags_in;
  EXPECT_EQ(flags_in("prompt of 9 tokens exceeds the context size n_ctx 8"),
            "prompt of 9 tokens exceeds the context size -c 8");
  EXPECT_EQ(flags_in("kivi_group 32 needs kivi_bits 2 or 4"), "--kivi-group 32 needs --kivi-bits 2 or 4");
  EXPECT_EQ(flags_in("unknown shape 'x' (SynthOptions::shape; known: a)"), "unknown shape 'x' (--shape; known: a)");
  EXPECT_EQ(flags_in("a wider cache type: cache_type_k f32"), "a wider cache type: --cache-type-k f32");
  EXPECT_EQ(flags_in("chat_template_file t.jinja: cannot open file"), "--chat-template-file t.jinja: cannot open file");
  // Not inside longer names, dotted keys or quoted JSON keys.
  EXPECT_EQ(flags_in("n_ctx_train 2048"), "n_ctx_train 2048");
  EXPECT_EQ(flags_in("no tokenizer.chat_template; choose one with chat_template: chatml"),
            "no tokenizer.chat_template; choose one with --chat-template: chatml");
  EXPECT_EQ(flags_in("settings differ: {\"kivi_bits\":0}"), "settings differ: {\"kivi_bits\":0}");
  EXPECT_EQ(flags_in("RunOptions::n_ctx"), "RunOptions::n_ctx");
  EXPECT_EQ(flags_in("n_ctx::x"), "n_ctx::x");
  EXPECT_EQ(flags_in("no parameter here"), "no parameter here");
}

TEST(CliHabits, StdoutHoldsTheTextAndStderrTheStatistics) {
  Result r = run_cli(gen("-p " + quote(kPrompt) + " -n 8"));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out.rfind(kPrompt, 0), 0u) << r.out;  // the prompt echo, then the continuation
  EXPECT_GT(r.out.size(), kPrompt.size() + 8);
  for (const char* stat : {"--- kvslim ---", "entries kept", "KV bytes", "decode"}) {
    EXPECT_FALSE(contains(r.out, stat)) << stat << " on stdout: " << r.out;
    EXPECT_TRUE(contains(r.err, stat)) << stat << " missing on stderr: " << r.err;
  }
}

TEST(CliHabits, NoDisplayPromptPrintsOnlyTheContinuation) {
  Result with = run_cli(gen("-p " + quote(kPrompt) + " -n 8"));
  Result without = run_cli(gen("-p " + quote(kPrompt) + " -n 8 --no-display-prompt"));
  ASSERT_EQ(with.rc, 0) << with.err;
  ASSERT_EQ(without.rc, 0) << without.err;
  EXPECT_EQ(kPrompt + without.out, with.out);  // greedy: the same continuation
}

TEST(CliHabits, JsonSummaryToStdoutOrFile) {
  Result text = run_cli(gen("-p " + quote(kPrompt) + " -n 8 --no-display-prompt"));
  ASSERT_EQ(text.rc, 0) << text.err;
  Result r = run_cli(gen("-p " + quote(kPrompt) + " -n 8 --json -"));
  ASSERT_EQ(r.rc, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);  // stdout holds only the JSON
  EXPECT_EQ(j["command"], "generate");
  EXPECT_EQ(j["text"].get<std::string>() + "\n", text.out);
  EXPECT_EQ(j["generated_tokens"], 8);
  EXPECT_EQ(j["tokens"].size(), 8u);
  EXPECT_EQ(j["finish_reason"], "length");
  EXPECT_EQ(j["context_tokens"], 5);  // BOS + "Once upon a time" (llama.cpp's ids in tests/data/reference)
  EXPECT_EQ(j["compression_ratio"], 0.0);
  EXPECT_EQ(j["memory_ratio"], 1.0);  // an f16 cache against a full f16 cache
  EXPECT_TRUE(contains(r.err, kPrompt));  // the text moved to stderr

  const std::string path = temp_path("gen.json");
  Result f = run_cli(gen("-p " + quote(kPrompt) + " -n 4 --press knorm --compression-ratio 0.5 --json " + quote(path)));
  ASSERT_EQ(f.rc, 0) << f.err;
  nlohmann::json jf = nlohmann::json::parse(slurp(path));
  // 5 context tokens per (layer, KV head) keep floor(5 * 0.5) = 2: 3 of 5 entries removed.
  EXPECT_DOUBLE_EQ(jf["compression_ratio"].get<double>(), 0.6);
  EXPECT_TRUE(contains(f.out, kPrompt));

  Result bad = run_cli(gen("-p hi -n 2 --json /nonexistent-dir/x.json"));
  EXPECT_EQ(bad.rc, 1);
  EXPECT_TRUE(contains(bad.err, "/nonexistent-dir/x.json")) << bad.err;
  EXPECT_TRUE(bad.out.empty()) << "failed before generating: " << bad.out;
}

TEST(CliHabits, LlamaCppCacheTypeShortFlags) {
  Result r = run_cli(gen("-p hi -n 2 -ctk q8_0 -ctv q4_0 --json -"));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["cache_type"], "k=q8_0 v=q4_0");
  Result bad = run_cli(gen("-p hi -n 2 -ctk q9_9"));
  EXPECT_EQ(bad.rc, 1);
  EXPECT_TRUE(contains(bad.err, "q9_9")) << bad.err;
}

TEST(CliHabits, NPredictMinusOneRunsToTheContextLimitAndSaysSo) {
  Result r = run_cli(gen("-p " + quote(kPrompt) + " -n -1 -c 24 --json -"));
  ASSERT_EQ(r.rc, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["n_predict"], -1);
  EXPECT_TRUE(j["finish_reason"] == "context_full" || j["finish_reason"] == "eog") << j.dump();
  if (j["finish_reason"] == "context_full") {
    EXPECT_TRUE(contains(r.err, "context limit")) << r.err;
    EXPECT_GE(j["context_tokens"].get<int>() + j["generated_tokens"].get<int>(), 24);
  }
  // -c 8 -n 24 used to stop after 4 tokens without a word.
  Result cut = run_cli(gen("-p " + quote(kPrompt) + " -n 24 -c 8"));
  ASSERT_EQ(cut.rc, 0) << cut.err;
  EXPECT_TRUE(contains(cut.err, "generation stopped at the context limit (-c 8)")) << cut.err;
  EXPECT_TRUE(contains(cut.err, "-n 24")) << cut.err;
  Result fits = run_cli(gen("-p " + quote(kPrompt) + " -n 4 -c 64"));
  ASSERT_EQ(fits.rc, 0) << fits.err;
  EXPECT_FALSE(contains(fits.err, "context limit")) << fits.err;
  Result bad = run_cli(gen("-p hi -n -2"));
  EXPECT_EQ(bad.rc, 1);
  EXPECT_TRUE(contains(bad.err, "-2")) << bad.err;
}

TEST(CliHabits, PromptFromStandardInput) {
  Result file = run_cli(gen("-f - -n 6"), kPrompt);
  Result text = run_cli(gen("-p " + quote(kPrompt) + " -n 6"));
  ASSERT_EQ(file.rc, 0) << file.err;
  EXPECT_EQ(file.out, text.out);
  Result missing = run_cli(gen("-f /nonexistent/prompt.txt -n 2"));
  EXPECT_EQ(missing.rc, 1);
  EXPECT_TRUE(contains(missing.err, "/nonexistent/prompt.txt")) << missing.err;
}

TEST(CliHabits, Version) {
  Result r = run_cli("--version");
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out.rfind("kvslim ", 0), 0u) << r.out;
  EXPECT_TRUE(r.out.size() > 8 && std::isdigit(static_cast<unsigned char>(r.out[7]))) << r.out;
  // OpenBLAS runs with no threads of its own (started before main with one): its threads hung
  // the process at exit under a memory limit. And it is the pthread build the binary was linked
  // with, whichever one the system's alternatives make libopenblas.so.0 (the single-threaded
  // build gives wrong products when called from several threads: test_blas_threads.cpp).
  EXPECT_TRUE(contains(r.out, "\nBLAS: OpenBLAS ")) << r.out;
  EXPECT_TRUE(contains(r.out, "(one thread: none of its own)")) << r.out;
  EXPECT_FALSE(contains(r.out, "SINGLE_THREADED")) << r.out;
}

TEST(CliHabits, PressFlagsNeedAPress) {
  for (const std::string& args : {gen("-p hi -n 2 --compression-ratio 0.5"), gen("-p hi -n 2 --chunk-size 4"),
                                  gen("-p hi -n 2 --press none --compression-ratio 0.5"),
                                  "bench -m " + quote(kModel) + " -p 8 -n 2 -r 1 --compression-ratio 0.5"}) {
    SCOPED_TRACE(args);
    Result r = run_cli(args);
    EXPECT_EQ(r.rc, 1);
    EXPECT_TRUE(contains(r.err, "--press")) << r.err;
  }
  Result ok = run_cli(gen("-p hi -n 2 --press knorm --compression-ratio 0.5"));
  EXPECT_EQ(ok.rc, 0) << ok.err;
}

TEST(CliHabits, OneDefaultPerFlagAcrossSubcommands) {
  // -m has no default anywhere (a relative default path silently ran the story model); -t means
  // all cores by default everywhere.
  for (const std::string sub :
       {"generate", "bench", "attention-stats", "duo-calibrate", "kvzap-train", "fastkvzip-train", "restorekv-train", "latent-calibrate", "eval fidelity",
        "eval niah"}) {
    SCOPED_TRACE(sub);
    Result help = run_cli(sub + " --help");
    ASSERT_EQ(help.rc, 0) << help.err;
    std::istringstream in(help.out);
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    bool saw_m = false, saw_t = false;
    for (size_t i = 0; i < lines.size(); ++i) {
      // CLI11 puts a long option's description on the next line.
      const std::string entry = lines[i] + (i + 1 < lines.size() ? lines[i + 1] : "");
      if (contains(lines[i], "-m,--model")) {
        saw_m = true;
        EXPECT_TRUE(contains(entry, "REQUIRED")) << entry;
      }
      if (contains(lines[i], "-t,--threads")) {
        saw_t = true;
        EXPECT_TRUE(contains(lines[i], "=0")) << entry;
        EXPECT_TRUE(contains(entry, "0 = all cores")) << entry;
      }
    }
    EXPECT_TRUE(saw_m) << help.out;
    EXPECT_TRUE(saw_t) << help.out;
  }
  Result r = run_cli("generate -p hi -n 2");
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(contains(r.err, "--model")) << r.err;
}

// The subcommands that learn a file from text take the text as -f/--file and write -o/--out
// (kvzap-train's --corpus and latent-calibrate's --text were the only other spellings; they stay
// accepted as aliases).
TEST(CliHabits, TrainersTakeTheirTextAsDashF) {
  for (const std::string sub : {"kvzap-train", "fastkvzip-train", "restorekv-train", "latent-calibrate",
                                "qfilter-calibrate", "lukv-curve", "ea-stats"}) {
    SCOPED_TRACE(sub);
    Result help = run_cli(sub + " --help");
    ASSERT_EQ(help.rc, 0) << help.err;
    EXPECT_TRUE(contains(help.out, "-f,--file")) << help.out;
    EXPECT_TRUE(contains(help.out, "-o,--out")) << help.out;
  }
  for (const std::string sub : {"kvzap-train -f", "kvzap-train --corpus", "latent-calibrate -f", "latent-calibrate --text"}) {
    SCOPED_TRACE(sub);
    Result r = run_cli(sub + " /nonexistent/text.txt -m " + quote(kModel) + " -o " + quote(temp_path("trainer_out.gguf")));
    EXPECT_EQ(r.rc, 1) << r.err;
    EXPECT_TRUE(contains(r.err, "/nonexistent/text.txt")) << r.err;
  }
  // synth writes its file with -o/--out too (--output, its only other spelling, stays).
  Result synth = run_cli("synth --help");
  EXPECT_TRUE(contains(synth.out, "-o,--out,--output")) << synth.out;
}

TEST(CliHabits, NoProgressLineWhenStderrIsNotATerminal) {
  Result r = run_cli("bench -m " + quote(kModel) + " -p 64 -n 4 -r 2");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_FALSE(contains(r.err, "\r")) << r.err;
  EXPECT_TRUE(contains(r.out, "| model")) << r.out;  // the table is the result: stdout
  // kvzap-train wrote "\rKVzip+ targets: document i/n" to stderr whether or not it was a terminal.
  Result k = run_cli("kvzap-train -m " + quote(kModel) + " -f " +
                     quote(std::string(KVSLIM_SOURCE_DIR) + "/models/story.txt") + " -o " +
                     quote(temp_path("kz.gguf")) + " --doc-tokens 64 --max-docs 2 --per-doc 16 --epochs 1 --no-bench");
  ASSERT_EQ(k.rc, 0) << k.err;
  EXPECT_FALSE(contains(k.err, "\r")) << k.err;
  EXPECT_FALSE(contains(k.err, "KVzip+ targets")) << k.err;
  EXPECT_TRUE(contains(k.out, "saved")) << k.out;
  EXPECT_EQ(run_cli("kvzap-train -m " + quote(kModel) + " --bench-only --bench-tokens 8 --no-progress").rc, 0);
}

// The progress line itself, with a terminal and a clock stood in for.
TEST(Progress, SilentForTheFirstSecondThenRedrawnInPlace) {
  double now = 0;
  char* buf = nullptr;
  size_t len = 0;
  std::FILE* out = open_memstream(&buf, &len);
  {
    kvslim::cli::Progress p(true, true, out, [&] { return now; });
    now = 0.5;
    p.update(1, 10, "first");
    std::fflush(out);
    EXPECT_EQ(len, 0u) << "drawn within the first second";
    now = 1.5;
    p.update(3, 10, "prefill");
    std::fflush(out);
    std::string s(buf, len);
    EXPECT_EQ(s.rfind("\r3/10", 0), 0u) << s;
    EXPECT_TRUE(contains(s, "prefill")) << s;
    EXPECT_TRUE(contains(s, "30%")) << s;
    now = 1.55;  // redrawn at most 10 times a second
    p.update(4, 10, "x");
    std::fflush(out);
    EXPECT_EQ(std::string(buf, len), s);
    p.clear();
    std::fflush(out);
    std::string cleared(buf + s.size(), len - s.size());
    EXPECT_EQ(cleared.front(), '\r');
    EXPECT_EQ(cleared.back(), '\r');
    EXPECT_EQ(cleared.find_first_not_of(" \r"), std::string::npos) << cleared;
  }
  std::fclose(out);
  std::free(buf);
}

TEST(Progress, NothingWithoutATerminalOrWhenDisabled) {
  for (auto [enabled, tty] : {std::pair{true, false}, std::pair{false, true}}) {
    double now = 0;
    char* buf = nullptr;
    size_t len = 0;
    std::FILE* out = open_memstream(&buf, &len);
    {
      kvslim::cli::Progress p(enabled, tty, out, [&] { return now; });
      now = 5;
      p.update(1, 2, "x");
      now = 10;
      p.update(2, 2, "y");
    }
    std::fflush(out);
    EXPECT_EQ(len, 0u);
    std::fclose(out);
    std::free(buf);
  }
}

// docs/PRESSES.md's parameter table is the registry's, as `kvslim presses --markdown` prints it: a
// press's registration changes the table, and the docs cannot drift from it.
TEST(CliHabits, PressesDocsTableIsWhatTheRegistryPrints) {
  Result r = run_cli("presses --markdown");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "| `snapkv` | scorer | SnapKVPress | `ratio=0`, `window=64` (window_size)")) << r.out;
  const std::string doc = slurp(std::string(KVSLIM_SOURCE_DIR) + "/docs/PRESSES.md");
  const std::string begin = "<!-- kvslim presses --markdown -->\n", end = "<!-- end kvslim presses --markdown -->";
  const size_t b = doc.find(begin), e = doc.find(end);
  ASSERT_NE(b, std::string::npos);
  ASSERT_NE(e, std::string::npos);
  EXPECT_EQ(doc.substr(b + begin.size(), e - b - begin.size()), r.out)
      << "docs/PRESSES.md's table differs from the registry: replace it with `kvslim presses --markdown`";
  Result both = run_cli("presses --markdown --json -");
  EXPECT_NE(both.rc, 0);
  EXPECT_TRUE(contains(both.err, "--markdown and --json")) << both.err;
}

TEST(CliHabits, EverySubcommandWritesAJsonSummary) {
  const std::string m = quote(kModel);
  const std::string duo = temp_path("duo.gguf"), synth = temp_path("synth.gguf"), fkz = temp_path("fkz.gguf");
  const std::pair<std::string, std::string> runs[] = {
      {"presses", "presses --json -"},
      {"attention-stats", "attention-stats -m " + m + " -p 'Once upon a time there was a girl' --window 4 --json -"},
      {"duo-calibrate",
       "duo-calibrate -m " + m + " -o " + quote(duo) + " --samples 1 --length 64 --sink 4 --recent 8 --window 8 --json -"},
      {"kvzap-train", "kvzap-train -m " + m + " --bench-only --bench-tokens 16 --json -"},
      {"fastkvzip-train", "fastkvzip-train -m " + m + " -f " + quote(std::string(KVSLIM_SOURCE_DIR) + "/models/story.txt") +
                              " -o " + quote(fkz) + " --steps 3 --batch 16 --doc-tokens 64 --max-docs 2 --no-progress --json -"},
      {"restorekv-train", "restorekv-train -m " + m + " -f " + quote(std::string(KVSLIM_SOURCE_DIR) + "/models/story.txt") +
                              " -o " + quote(fkz + ".rkv") + " --context 48 --continuation 8 --rank 2 --tokens 2 --steps 2"
                              " --no-progress --json -"},
      {"lukv-curve", "lukv-curve -m " + m + " -f " + quote(std::string(KVSLIM_SOURCE_DIR) + "/models/story.txt") +
                         " -o " + quote(fkz + ".lukv") + " --scorer knorm --doc-tokens 64 --max-docs 2 --no-progress --json -"},
      {"synth", "synth --shape qwen2.5-0.5b --type q4_0 --vocab-from " + m + " --layers 1 -o " + quote(synth) +
                    " --json -"},
  };
  for (const auto& [name, args] : runs) {
    SCOPED_TRACE(args);
    Result r = run_cli(args);
    ASSERT_EQ(r.rc, 0) << r.err;
    nlohmann::json j = nlohmann::json::parse(r.out);  // stdout holds only the JSON
    EXPECT_EQ(j["command"], name);
    if (name != "presses") continue;
    // kvpress's names of a press, as kvpress's SnapKVPress spells its fields.
    bool snapkv = false;
    for (const auto& p : j["presses"])
      if (p["name"] == "snapkv") {
        snapkv = true;
        EXPECT_EQ(p["kvpress"], nlohmann::json::array({"SnapKVPress"}));
        EXPECT_EQ(p["kvpress_params"], nlohmann::json({{"window_size", "window"}, {"kernel_size", "kernel"}}));
      }
    EXPECT_TRUE(snapkv);
  }
  const std::string dir = temp_path("eval");
  Result e = run_cli("eval fidelity -m " + m + " --press knorm --ratios 0.5 --samples 1 --context-tokens 32 " +
                     "--continuation-tokens 8 --no-plot -o " + quote(dir) + " --json -");
  ASSERT_EQ(e.rc, 0) << e.err;
  nlohmann::json je = nlohmann::json::parse(e.out);
  EXPECT_EQ(je["command"], "eval fidelity");
  EXPECT_EQ(je["summary"], nlohmann::json::parse(slurp(dir + "/summary.json")));
  EXPECT_TRUE(contains(e.err, "KL(nats)")) << "the table moves to stderr: " << e.err;

  Result b = run_cli("bench -m " + m + " -p 8 -n 2 -r 1 --json -");
  ASSERT_EQ(b.rc, 0) << b.err;
  nlohmann::json jb = nlohmann::json::parse(b.out);
  ASSERT_TRUE(jb.is_array());
  EXPECT_EQ(jb.size(), 2u);  // pp8 and tg2 @ d0
  // Attention's share of the prefill's wall time: a fraction on the prefill row, null on decode.
  ASSERT_TRUE(jb[0]["attention_share"].is_number()) << jb[0];
  EXPECT_GT(jb[0]["attention_share"].get<double>(), 0.0);
  EXPECT_LT(jb[0]["attention_share"].get<double>(), 1.0);
  EXPECT_TRUE(jb[1]["attention_share"].is_null()) << jb[1];
  EXPECT_TRUE(contains(b.err, "attention's share of prefill wall time")) << b.err;
  EXPECT_TRUE(contains(b.err, "| model")) << "the table moves to stderr: " << b.err;
}

namespace {

struct PtyResult {
  int rc = -1;
  std::string out;  // stdout and stderr as the terminal showed them, "\r" removed
  bool timed_out = false;
};

/// Runs `kvslim ARGS` on a pseudo-terminal (stdin, stdout and stderr), as a user at a terminal
/// would: each time a new "> " prompt appears, the next of `inputs` is typed. Killed after
/// `timeout_s` seconds, so a chat that never ends fails the test instead of hanging it.
PtyResult run_on_pty(const std::vector<std::string>& args, const std::vector<std::string>& inputs,
                     double timeout_s = 60) {
  PtyResult r;
  int master = -1;
  const pid_t pid = forkpty(&master, nullptr, nullptr, nullptr);
  if (pid < 0) return r;
  if (pid == 0) {
    std::vector<char*> argv{const_cast<char*>(KVSLIM_CLI)};
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(KVSLIM_CLI, argv.data());
    _exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  size_t sent = 0;
  while (true) {
    pollfd p{master, POLLIN, 0};
    if (poll(&p, 1, 100) > 0) {
      char buf[4096];
      const ssize_t n = read(master, buf, sizeof buf);
      if (n <= 0) break;  // EIO once the child has exited
      for (ssize_t i = 0; i < n; ++i)
        if (buf[i] != '\r') r.out += buf[i];
    }
    size_t prompts = 0;
    for (size_t at = r.out.find("\n> "); at != std::string::npos; at = r.out.find("\n> ", at + 1)) ++prompts;
    if (sent < inputs.size() && prompts > sent) {
      const std::string& in = inputs[sent++];
      if (write(master, in.data(), in.size()) != static_cast<ssize_t>(in.size())) break;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      r.timed_out = true;
      break;
    }
  }
  int st = 0;
  waitpid(pid, &st, 0);
  close(master);
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return r;
}

}  // namespace

// llama.cpp's GPU and memory-placement flags mean nothing on the CPU: accepted, each with a note on
// stderr, and never read as another flag. Regressions: "-fa" read as "-f a" (the context from file
// "a") and "-ngl 99" as "-n gl" ("--n-predict: Value gl not in range").
TEST(CliHabits, LlamaCppGpuFlagsAreAcceptedWithANote) {
  Result plain = run_cli(gen("-p " + quote(kPrompt) + " -n 6"));
  ASSERT_EQ(plain.rc, 0) << plain.err;
  Result fa = run_cli(gen("-p " + quote(kPrompt) + " -n 6 -fa"));
  ASSERT_EQ(fa.rc, 0) << fa.err;
  EXPECT_EQ(fa.out, plain.out);  // the same run: nothing was misparsed
  EXPECT_TRUE(contains(fa.err, "note: -fa ignored: kvslim runs on the CPU")) << fa.err;
  Result ngl = run_cli(gen("-ngl 99 -p " + quote(kPrompt) + " -n 6"));
  ASSERT_EQ(ngl.rc, 0) << ngl.err;
  EXPECT_EQ(ngl.out, plain.out);
  EXPECT_TRUE(contains(ngl.err, "note: -ngl 99 ignored")) << ngl.err;
  // Every form at once: values taken (-fa on, -sm none), flags without one (--mlock), --name=value.
  Result all = run_cli(gen("-p " + quote(kPrompt) + " -fa on -ngl 0 --n-gpu-layers 99 --mlock --no-mmap -sm none -mg 0 "
                           "-ts 3,1 --numa distribute -dev none -nkvo --flash-attn=off --gpu-layers=all -n 6"));
  ASSERT_EQ(all.rc, 0) << all.err;
  EXPECT_EQ(all.out, plain.out);
  size_t notes = 0;
  for (size_t at = all.err.find("note: "); at != std::string::npos; at = all.err.find("note: ", at + 1)) ++notes;
  EXPECT_EQ(notes, 13u) << all.err;  // one line per flag
  // -fa followed by another flag takes no value; followed by a value llama.cpp knows, takes it.
  Result fa_then_n = run_cli(gen("-p " + quote(kPrompt) + " -fa -n 6"));
  ASSERT_EQ(fa_then_n.rc, 0) << fa_then_n.err;
  EXPECT_EQ(fa_then_n.out, plain.out);
  // Values llama.cpp refuses are refused here too, naming the flag and the value.
  for (const auto& [args, parts] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"-p hi -ngl gl", {"-ngl", "'gl'", "number of layers"}},
           {"-p hi -sm diagonal", {"-sm", "'diagonal'", "none, layer or row"}},
           {"-p hi --numa everywhere", {"--numa", "'everywhere'"}},
           {"-p hi -ngl", {"-ngl", "needs a value"}},
           {"-p hi --mlock=1", {"--mlock", "takes no value"}}}) {
    SCOPED_TRACE(args);
    Result r = run_cli(gen(args));
    EXPECT_EQ(r.rc, 1);
    for (const std::string& part : parts) EXPECT_TRUE(contains(r.err, part)) << r.err;
    EXPECT_FALSE(contains(r.err, "--n-predict")) << r.err;
  }
  // Every subcommand that runs a model: a misparse would complain about -n/-f, not the model file
  // (attention-stats and kvzap-train first ask for their text).
  for (const std::string sub : {"bench", "serve", "eval fidelity", "eval ruler", "attention-stats", "kvzap-train"}) {
    SCOPED_TRACE(sub);
    Result r = run_cli(sub + " -m /nonexistent/m.gguf -ngl 99 -fa 1");
    EXPECT_EQ(r.rc, 1);
    EXPECT_TRUE(contains(r.err, "note: -ngl 99 ignored")) << r.err;
    EXPECT_TRUE(contains(r.err, "note: -fa 1 ignored")) << r.err;
    EXPECT_TRUE(contains(r.err, "/nonexistent/m.gguf") || contains(r.err, "-p TEXT or -f FILE") ||
                contains(r.err, "-f FILE (also --corpus)"))
        << r.err;
    Result help = run_cli(sub + " --help");
    EXPECT_TRUE(contains(help.out, "-ngl")) << help.out;
  }
  // llama-bench's lists: -fa 0,1 and -ngl 0,99.
  Result b = run_cli("bench -m " + quote(kModel) + " -p 8 -n 2 -r 1 -fa 0,1 -ngl 0,99 -o json");
  ASSERT_EQ(b.rc, 0) << b.err;
  EXPECT_EQ(nlohmann::json::parse(b.out).size(), 2u);
  // A subcommand that runs no model does not take them.
  EXPECT_EQ(run_cli("presses -ngl 99").rc, 1);
}

// serve starts listening before it loads the model. A model that fails to load at once used to stop
// the listener before its accept loop had started, and httplib's stop() does nothing then: the
// process hung listening (seen as this file's flag test timing out under load). Each run must end
// with the load error, promptly.
TEST(CliHabits, ServeWhoseModelFailsToLoadExits) {
  for (int i = 0; i < 20; ++i) {
    const std::string err = temp_path("serve_err");
    const std::string cmd = "timeout -s KILL 30 " + quote(KVSLIM_CLI) + " serve -m /nonexistent/m.gguf --port 0 2>" +
                            quote(err) + " </dev/null >/dev/null";
    const int st = std::system(cmd.c_str());
    ASSERT_TRUE(WIFEXITED(st)) << "run " << i;
    ASSERT_EQ(WEXITSTATUS(st), 1) << "run " << i << " (137: killed after hanging)\n" << slurp(err);
    EXPECT_TRUE(contains(slurp(err), "/nonexistent/m.gguf")) << slurp(err);
  }
}

// Bad stored-context flags of serve end it at start, naming the flag and the value (before the model
// loads and before anything listens).
TEST(CliHabits, ServeRefusesBadStoredContextFlags) {
  const std::string m = " serve -m " + quote(kModel) + " --port 0 ";
  for (const auto& [flag, value, part] : {std::tuple<std::string, std::string, std::string>{"--context-dir", "/proc/nope", "/proc/nope"},
                                          {"--context-store", "http://x", "redis://"},
                                          {"--context-store", "redis://host:99999", "99999"},
                                          {"--context-cache", "lots", "lots"}}) {
    Result r = run_cli(m + flag + " " + quote(value));
    EXPECT_EQ(r.rc, 1) << flag << " " << value;
    EXPECT_TRUE(contains(r.err, "error: " + flag)) << r.err;
    EXPECT_TRUE(contains(r.err, part)) << r.err;
  }
}

// `-cnv` without -p/-f is llama-cli's conversation mode: user turns from stdin, answers on stdout,
// ended by /exit or the end of input. On a terminal through a pseudo-terminal, bounded in time.
TEST(CliHabits, InteractiveChatOnATerminal) {
  // The reference answer: the one-shot chat of the same user message (Request::run vs generate()).
  Result ref = run_cli(gen("--chat -p " + quote(kPrompt) + " -n 8 --no-display-prompt"));
  ASSERT_EQ(ref.rc, 0) << ref.err;
  ASSERT_GT(ref.out.size(), 1u);
  const std::string answer = ref.out.substr(0, ref.out.size() - 1);  // less generate's final newline
  PtyResult r = run_on_pty({"generate", "-m", kModel, "--temp", "0", "-n", "8", "-cnv"},
                           {kPrompt + "\n", "and then\n", "/exit\n"});
  ASSERT_FALSE(r.timed_out) << r.out;
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "> " + kPrompt + "\n" + answer + "\n")) << r.out;
  EXPECT_TRUE(contains(r.out, "no tokenizer.chat_template; using ChatML")) << r.out;
  EXPECT_TRUE(contains(r.out, "chat ended after 2 turns")) << r.out;
  // The end of input (Ctrl-D at the start of a line) ends it too.
  PtyResult eof = run_on_pty({"generate", "-m", kModel, "--temp", "0", "-n", "4", "-cnv"}, {kPrompt + "\n", "\x04"});
  ASSERT_FALSE(eof.timed_out) << eof.out;
  EXPECT_EQ(eof.rc, 0) << eof.out;
  EXPECT_TRUE(contains(eof.out, "chat ended after 1 turn\n")) << eof.out;
  // Not a terminal: the same loop over piped lines.
  Result piped = run_cli(gen("-n 8 -cnv"), kPrompt + "\n/exit\n");
  ASSERT_EQ(piped.rc, 0) << piped.err;
  EXPECT_TRUE(contains(piped.out, "> " + answer + "\n")) << piped.out;
  EXPECT_TRUE(contains(piped.err, "chat ended after 1 turn")) << piped.err;
  // A summary has nothing to hold in a chat: refused before the model loads.
  Result json = run_cli(gen("-cnv --json -"), "hi\n");
  EXPECT_EQ(json.rc, 1);
  EXPECT_TRUE(contains(json.err, "--json")) << json.err;
}

// A model without a chat template gets ChatML with one warning (llama-server's fallback): the
// same tokens as --chat-template chatml. stories260K has no template.
TEST(CliHabits, ChatWithoutATemplateFallsBackToChatML) {
  Result fallback = run_cli(gen("--chat -p " + quote(kPrompt) + " -n 6 --json -"));
  ASSERT_EQ(fallback.rc, 0) << fallback.err;
  EXPECT_TRUE(contains(fallback.err, "warning: " + kModel + ": the model has no tokenizer.chat_template; using ChatML"))
      << fallback.err;
  EXPECT_TRUE(contains(fallback.err, "--chat-template")) << fallback.err;  // the flag, not the parameter name
  Result chatml = run_cli(gen("--chat-template chatml -p " + quote(kPrompt) + " -n 6 --json -"));
  ASSERT_EQ(chatml.rc, 0) << chatml.err;
  EXPECT_FALSE(contains(chatml.err, "warning:")) << chatml.err;
  const nlohmann::json a = nlohmann::json::parse(fallback.out), b = nlohmann::json::parse(chatml.out);
  EXPECT_EQ(a["context_tokens"], b["context_tokens"]);
  EXPECT_EQ(a["tokens"], b["tokens"]);
  // "<|im_start|>user\n" + prompt + "<|im_end|>\n<|im_start|>assistant\n" is far more than the
  // 5 tokens of the bare prompt (BOS + 4 words).
  EXPECT_GT(a["context_tokens"].get<int>(), 5);
  // -sys: a system message first.
  Result sys = run_cli(gen("-sys 'Be brief.' -p " + quote(kPrompt) + " -n 2 --json -"));
  ASSERT_EQ(sys.rc, 0) << sys.err;
  EXPECT_GT(nlohmann::json::parse(sys.out)["context_tokens"].get<int>(), a["context_tokens"].get<int>());
}

// --json -: stdout is exactly the JSON document, the generated text inside it, whatever else the
// run prints (notes, warnings, the prompt echo).
TEST(CliHabits, JsonOnStdoutHoldsOnlyTheDocument) {
  Result r = run_cli(gen("--chat -fa -ngl 99 -p " + quote(kPrompt) + " -n 6 --json -"));
  ASSERT_EQ(r.rc, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);  // throws on anything else on stdout
  EXPECT_FALSE(j["text"].get<std::string>().empty());
  EXPECT_EQ(r.out.back(), '\n');
  EXPECT_EQ(r.out.front(), '{');
}

// bench takes llama-bench's lists (one row per combination), -o md|csv|json|jsonl and -r 5 by default.
TEST(CliHabits, BenchTakesListsAndOutputFormats) {
  const std::string b = "bench -m " + quote(kModel) + " --no-progress -t 1 ";
  Result jl = run_cli(b + "-p 8,16 -n 2,3 -d 0,8 -r 1 -o jsonl");
  ASSERT_EQ(jl.rc, 0) << jl.err;
  std::istringstream lines(jl.out);
  std::vector<std::string> tests;
  for (std::string line; std::getline(lines, line);) tests.push_back(nlohmann::json::parse(line)["test"]);
  const std::vector<std::string> expected = {"pp8", "pp8 @ d8", "pp16", "pp16 @ d8", "tg2 @ d0",
                                             "fill d8", "tg2 @ d8", "tg3 @ d0", "tg3 @ d8"};
  EXPECT_EQ(tests, expected);
  EXPECT_TRUE(contains(jl.err, "| model")) << "the table moves to stderr: " << jl.err;
  Result csv = run_cli(b + "-p 8 -n 2 -r 1 -o csv");
  ASSERT_EQ(csv.rc, 0) << csv.err;
  std::istringstream csv_lines(csv.out);
  std::vector<std::string> rows;
  for (std::string line; std::getline(csv_lines, line);) rows.push_back(line);
  ASSERT_EQ(rows.size(), 3u) << csv.out;  // header, pp8, tg2 @ d0
  EXPECT_EQ(rows[0].rfind("model,model_name,", 0), 0u) << rows[0];
  EXPECT_TRUE(contains(rows[1], ",pp8,")) << rows[1];
  // -r defaults to 5, as llama-bench's.
  Result five = run_cli(b + "-p 4 -n 0 -o json");
  ASSERT_EQ(five.rc, 0) << five.err;
  EXPECT_EQ(nlohmann::json::parse(five.out)[0]["samples_ts"].size(), 5u);
  Result md = run_cli(b + "-p 4 -n 0 -r 1 -o md");
  EXPECT_TRUE(contains(md.out, "| model")) << md.out;
  for (const auto& [args, parts] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"-o xml", {"--output", "'xml'", "md, csv, json or jsonl"}},
           {"-p 8,x", {"--n-prompt", "'x' is not an integer"}},
           {"-o csv --json -", {"-o csv", "--json -"}},
           {"-r 0", {"--repetitions", "0 is not in [1,"}}}) {
    SCOPED_TRACE(args);
    Result r = run_cli(b + args);
    EXPECT_EQ(r.rc, 1);
    for (const std::string& part : parts) EXPECT_TRUE(contains(r.err, part)) << r.err;
  }
}

// Errors name the flag and the value, with readable bounds. Regressions: "--cache-type-k bogus"
// did not name the flag; "-n abc" said "Value abc not in range"; "-c -5" printed a 309-digit bound;
// an unknown RULER task was reported without its flag after the model had loaded.
TEST(CliHabits, ErrorsNameTheFlagAndReadableBounds) {
  for (const auto& [args, parts] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {gen("-p hi --cache-type-k bogus"), {"--cache-type-k bogus", "f16", "q8_0"}},
           {gen("-p hi -ctv bogus"), {"--cache-type-v bogus", "f16"}},
           {gen("-p hi -n abc"), {"--n-predict: 'abc' is not an integer"}},
           {gen("-p hi -n 1.5"), {"--n-predict: '1.5' is not an integer"}},
           {gen("-p hi -c -5"), {"--ctx-size: -5 is below 0"}},
           {gen("-p hi -t 5000"), {"--threads: 5000 is not in [0, 1024]"}},
           {gen("-p hi -s abc"), {"--seed: 'abc' is not a valid number"}},
           {"eval ruler -m /nonexistent/m.gguf --tasks niah_single,bogus",
            {"--tasks", "unknown task 'bogus'", "niah_single", "cwe"}}}) {
    SCOPED_TRACE(args);
    Result r = run_cli(args);
    EXPECT_EQ(r.rc, 1);
    for (const std::string& part : parts) EXPECT_TRUE(contains(r.err, part)) << r.err;
    EXPECT_LT(r.err.size(), 400u) << r.err;  // no 300-digit bound
    EXPECT_FALSE(contains(r.err, "179769")) << r.err;
  }
}
