// `kvslim ea-stats`: computes Expected Attention's query statistics (arXiv 2510.00636) on the
// user's model from text files, for `--press expected_attention:stats=FILE` (kvpress's
// ExpectedAttentionStatsPress downloads them). As kvpress's collect_queries: each sample is the
// first --chars characters of a text piece, the first --n-sink tokens of each are left out.
#include <cstdio>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/options.h"
#include "cli/progress.h"
#include "cli/trainer_options.h"
#include "tools/tools.h"

namespace kvslim::cli {

namespace {

struct EAStatsArgs : TrainerArgs {
  int chars = 1000;
  int samples = 100;
  int n_sink = 4;
};

int run(const EAStatsArgs& a) {
  check_json_output(a.json);
  apply_threads(a.threads);
  auto model = Model::load(a.model, a.load);
  const Tokenizer& tok = model->tokenizer();
  // Samples: consecutive pieces of --chars characters of each file (kvpress: the first
  // sample_seq_len characters of each dataset row).
  std::vector<std::vector<Token>> samples;
  for (const std::string& path : a.text) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw Error(fmt::format("{}: cannot open text file", path));
    std::stringstream ss;
    ss << f.rdbuf();
    const std::string t = ss.str();
    for (size_t b = 0; b < t.size() && static_cast<int>(samples.size()) < a.samples; b += a.chars)
      samples.push_back(tok.encode(t.substr(b, a.chars), tok.add_bos_default(), false));
  }
  Progress progress(!a.no_progress);
  QueryStatsFile st = compute_query_stats(*model, samples, a.n_sink, [&](size_t i, size_t n) {
    progress.update(i, n, "ea-stats: samples");
  });
  progress.clear();
  st.base_model = a.model;
  st.save(a.out);
  std::FILE* o = a.json == "-" ? stderr : stdout;
  const HParams& hp = model->hparams();
  fmt::print(o, "model       {} ({} layers x {} query heads, head_dim {})\n", a.model, hp.n_layer, hp.n_head,
             hp.head_dim);
  fmt::print(o, "text        {} samples of up to {} characters, {} queries per head after {} sinks\n",
             samples.size(), a.chars, st.tokens, a.n_sink);
  fmt::print(o, "statistics  {}\n", a.out);
  if (!a.json.empty())
    write_json(a.json, nlohmann::ordered_json{{"command", "ea-stats"},
                                              {"model", a.model},
                                              {"statistics", a.out},
                                              {"samples", samples.size()},
                                              {"queries", st.tokens},
                                              {"n_sink", a.n_sink}});
  return 0;
}

}  // namespace

void add_ea_stats(CLI::App& app, Action& action) {
  auto a = std::make_shared<EAStatsArgs>();
  auto* sub = app.add_subcommand("ea-stats",
                                 "compute Expected Attention's query statistics (mean, covariance) from text files");
  add_trainer_io_options(sub, *a, "text files to compute the statistics from", "statistics file to write (GGUF)");
  sub->add_option("--chars", a->chars, "characters per sample (kvpress: sample_seq_len)")->capture_default_str()
      ->check(int_at_least(1));
  sub->add_option("--samples", a->samples, "samples at most (kvpress: num_samples)")->capture_default_str()
      ->check(int_at_least(1));
  sub->add_option("--n-sink", a->n_sink, "first tokens of each sample left out")->capture_default_str()
      ->check(int_at_least(0));
  add_trainer_run_options(sub, *a);
  sub->callback([a, &action] { action = [a] { return run(*a); }; });
}

}  // namespace kvslim::cli
