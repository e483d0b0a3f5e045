// `kvslim attention-stats`: ZigZagKV's MBA per head and LMBA / LMBO per layer for a prompt, as a
// table and a gnuplot plot.
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/context_size.h"
#include "cli/options.h"
#include "kvslim/eval.h"
#include "tools/tools.h"

namespace kvslim::cli {

namespace {

struct StatsArgs {
  std::string model;
  ModelLoadOptions load;  // --rope-* / --yarn-* over the file's RoPE settings
  std::string prompt, prompt_file, plot, json;
  LayerBudgetOptions opt;
  int threads = 0;
  int ctx = 0;
};

std::string gp_quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

/// LMBA and LMBO per layer, as % of the prompt, drawn by gnuplot (script kept next to the plot).
bool plot_budgets(const AttentionStats& st, const std::vector<int>& lmbo, double similarity, const std::string& path,
                  const std::string& format, std::string* why) {
  const std::string gp = find_gnuplot();
  if (gp.empty()) {
    *why = "gnuplot is not on PATH (Debian package gnuplot-nox)";
    return false;
  }
  const int L = static_cast<int>(st.lmba.size());
  std::string s = format == "png" ? "set terminal pngcairo size 800,500 noenhanced font \"sans,10\"\n"
                                  : "set terminal svg size 800,500 dynamic noenhanced font \"sans,12\"\n";
  s += fmt::format("set output {}\n", gp_quote(path));
  s += fmt::format("set title {}\n",
                   gp_quote(fmt::format("ZigZagKV minimum budgets per layer ({} tokens, window {}, LMBA mass {}, LMBO "
                                        "cosine {})",
                                        st.context_tokens, st.window, st.tau, similarity)));
  s += "set xlabel \"layer\"\nset ylabel \"% of prompt tokens\"\nset key outside right\nset grid\n";
  s += fmt::format("set xrange [-0.5:{}]\nset xtics 1\nset yrange [0:*]\n", L - 0.5);
  s += "$d << EOD\n";
  for (int l = 0; l < L; ++l)
    s += fmt::format("{} {} {}\n", l, 100.0 * st.lmba[l] / st.context_tokens, 100.0 * lmbo[l] / st.context_tokens);
  s += "EOD\nplot $d using 1:2 with linespoints lw 2 pt 7 title \"LMBA\", $d using 1:3 with linespoints lw 2 dt 2 pt 5 "
       "title \"LMBO\"\n";
  const std::string script = path + ".gp";
  {
    std::ofstream f(script, std::ios::binary);
    if (!f) {
      *why = fmt::format("{}: cannot write the gnuplot script", script);
      return false;
    }
    f << s;
  }
  const std::string cmd = fmt::format("'{}' '{}' 2>&1", gp, script);
  if (std::system(cmd.c_str()) != 0) {
    *why = fmt::format("gnuplot failed on {}", script);
    return false;
  }
  return true;
}

int run(const StatsArgs& a) {
  if (a.prompt.empty() == a.prompt_file.empty()) throw Error("give exactly one of -p TEXT or -f FILE");
  std::string format;
  if (!a.plot.empty()) {
    auto dot = a.plot.rfind('.');
    format = dot == std::string::npos ? "" : a.plot.substr(dot + 1);
    check_plot_format(format);
  }
  check_json_output(a.json);
  std::string text = a.prompt_file.empty() ? a.prompt : read_text_file(a.prompt_file, "-f");
  apply_threads(a.threads);
  auto model = Model::load(a.model, a.load);
  const Tokenizer& tok = model->tokenizer();
  std::vector<Token> toks = tok.encode(text, tok.add_bos_default(), false);
  SessionOptions so;
  so.n_ctx = a.ctx;
  warn_context_size(*model, a.ctx);
  LayerBudgets lb = layer_budgets(*model, toks, a.opt, so);
  const AttentionStats& st = lb.attention;
  const int n_tok = st.context_tokens;
  const HParams& hp = model->hparams();
  // The table is the result (stdout); with --json - stdout holds only the JSON.
  std::FILE* out = a.json == "-" ? stderr : stdout;
  fmt::print(out, "model       {} ({} layers, {} query heads, {} KV heads)\n", a.model, hp.n_layer, hp.n_head, hp.n_head_kv);
  fmt::print(out, "prompt      {} tokens; observation window {} queries\n", n_tok, st.window);
  fmt::print(out, "MBA         fewest entries holding {:.0f}% of a head's window attention\n", 100 * st.tau);
  fmt::print(out, "LMBO        smallest per-KV-head budget keeping the layer's attention output at cosine >= {}\n\n",
             lb.similarity);
  fmt::print(out, "{:>5} {:>8} {:>7} {:>8} {:>7}  MBA per query head\n", "layer", "LMBA", "LMBA%", "LMBO", "LMBO%");
  for (int l = 0; l < hp.n_layer; ++l) {
    std::string heads;
    for (int v : st.mba[l]) heads += fmt::format("{} ", v);
    fmt::print(out, "{:>5} {:>8.1f} {:>6.1f}% {:>8} {:>6.1f}%  {}\n", l, st.lmba[l], 100.0 * st.lmba[l] / n_tok,
               lb.lmbo[l], 100.0 * lb.lmbo[l] / n_tok, heads);
  }
  if (!a.plot.empty()) {
    std::string why;
    if (!plot_budgets(st, lb.lmbo, lb.similarity, a.plot, format, &why)) throw Error(fmt::format("cannot draw {}: {}", a.plot, why));
    fmt::print(out, "\nplot        {} (gnuplot script {}.gp)\n", a.plot, a.plot);
  }
  if (!a.json.empty()) {
    nlohmann::ordered_json j = {{"command", "attention-stats"},
                                {"model", a.model},
                                {"context_tokens", n_tok},
                                {"window", st.window},
                                {"mass", st.tau},
                                {"similarity", lb.similarity},
                                {"lmba", st.lmba},
                                {"lmbo", lb.lmbo},
                                {"mba", st.mba}};
    if (!a.plot.empty()) j["plot"] = a.plot;
    write_json(a.json, j);
  }
  return 0;
}

}  // namespace

void add_attention_stats(CLI::App& app, Action& action) {
  auto a = std::make_shared<StatsArgs>();
  auto* sub = app.add_subcommand("attention-stats",
                                 "ZigZagKV's attention statistics of a prompt: MBA per head, LMBA and LMBO per layer");
  add_model_option(sub, a->model, a->load);
  sub->add_option("-p,--prompt", a->prompt, "prompt text");
  sub->add_option("-f,--file", a->prompt_file, "read the prompt from a file ('-' = standard input)");
  sub->add_option("--window", a->opt.window, "observation window: last prompt tokens whose queries are analysed")
      ->capture_default_str()->check(int_at_least(1));
  sub->add_option("--mass", a->opt.mass, "attention mass an MBA must hold")->capture_default_str()
      ->check(finite_range(1e-9, 1.0));
  sub->add_option("--similarity", a->opt.similarity, "cosine similarity an LMBO budget must reach")
      ->capture_default_str()->check(finite_range(-1.0, 1.0));
  sub->add_option("--plot", a->plot, "draw LMBA and LMBO per layer with gnuplot into this .png or .svg");
  add_threads_option(sub, a->threads);
  add_json_option(sub, a->json);
  sub->add_option("-c,--ctx-size", a->ctx, "context size in tokens (0 = the model's)")->capture_default_str()
      ->check(int_at_least(0));
  sub->callback([a, &action] { action = [a] { return run(*a); }; });
}

}  // namespace kvslim::cli
