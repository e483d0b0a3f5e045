// The CLI's habits (llama.cpp's where they overlap): text on stdout and everything else on stderr,
// --json FILE|-, --no-display-prompt, -ctk/-ctv, -n -1, -f -, --version, a message at the context
// limit, one default per flag, press flags that need --press, and a progress line only on a terminal.
#include <gtest/gtest.h>
#include <unistd.h>
#include <sys/wait.h>

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

namespace {

const std::string kModel = std::string(KVSLIM_SOURCE_DIR) + "/models/stories260K.gguf";
const std::string kPrompt = "Once upon a time";

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

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
                                  "bench -m " + quote(kModel) + " -p 8 -n 2 --compression-ratio 0.5"}) {
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
  }
  const std::string dir = temp_path("eval");
  Result e = run_cli("eval fidelity -m " + m + " --press knorm --ratios 0.5 --samples 1 --context-tokens 32 " +
                     "--continuation-tokens 8 --no-plot -o " + quote(dir) + " --json -");
  ASSERT_EQ(e.rc, 0) << e.err;
  nlohmann::json je = nlohmann::json::parse(e.out);
  EXPECT_EQ(je["command"], "eval fidelity");
  EXPECT_EQ(je["summary"], nlohmann::json::parse(slurp(dir + "/summary.json")));
  EXPECT_TRUE(contains(e.err, "KL(nats)")) << "the table moves to stderr: " << e.err;

  Result b = run_cli("bench -m " + m + " -p 8 -n 2 --json -");
  ASSERT_EQ(b.rc, 0) << b.err;
  nlohmann::json jb = nlohmann::json::parse(b.out);
  ASSERT_TRUE(jb.is_array());
  EXPECT_EQ(jb.size(), 2u);  // pp8 and tg2 @ d0
  EXPECT_TRUE(contains(b.err, "| model")) << "the table moves to stderr: " << b.err;
}
