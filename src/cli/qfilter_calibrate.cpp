// `kvslim qfilter-calibrate`: computes Q-Filters (arXiv 2503.02812) on the user's model from text
// files and saves them for `--press qfilter:filters=FILE` (kvpress loads them from the hub).
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

struct QFilterArgs : TrainerArgs {
  int doc_tokens = 2048;
  int max_docs = 64;
};

int run(const QFilterArgs& a) {
  if (a.text.empty()) throw Error("give -f TEXT (one or more text files)");
  check_json_output(a.json);
  apply_threads(a.threads);
  auto model = Model::load(a.model, a.load);
  const Tokenizer& tok = model->tokenizer();
  // Each file is cut into documents of --doc-tokens tokens (BOS first when the vocabulary wants it).
  std::vector<std::vector<Token>> docs;
  for (const std::string& path : a.text) {
    std::vector<Token> all = tok.encode(read_text_file(path, "-f"), false, false);
    for (size_t b = 0; b < all.size() && static_cast<int>(docs.size()) < a.max_docs; b += a.doc_tokens) {
      std::vector<Token> d(all.begin() + b, all.begin() + std::min(all.size(), b + a.doc_tokens));
      if (tok.add_bos_default() && tok.bos() >= 0) d.insert(d.begin(), tok.bos());
      docs.push_back(std::move(d));
    }
  }
  Progress progress(!a.no_progress);
  QFilters f = qfilter_calibrate(*model, docs, [&](size_t i, size_t n) { progress.update(i, n, "Q-filters: documents"); });
  progress.clear();
  f.base_model = a.model;
  f.save(a.out);
  size_t tokens = 0;
  for (const auto& d : docs) tokens += d.size();
  const HParams& hp = model->hparams();
  std::FILE* o = a.json == "-" ? stderr : stdout;
  fmt::print(o, "model       {} ({} layers x {} KV heads, head_dim {})\n", a.model, hp.n_layer, hp.n_head_kv,
             hp.head_dim);
  fmt::print(o, "text        {} documents, {} tokens\n", docs.size(), tokens);
  fmt::print(o, "explained   share of the queries' squared norm along each filter (sigma_1^2 / sum sigma_i^2)\n");
  std::vector<std::vector<double>> ex(hp.n_layer, std::vector<double>(hp.n_head_kv));
  for (int l = 0; l < hp.n_layer; ++l) {
    fmt::print(o, "layer {:>3}:", l);
    for (int h = 0; h < hp.n_head_kv; ++h) {
      ex[l][h] = f.explained[static_cast<size_t>(l) * hp.n_head_kv + h];
      fmt::print(o, " {:.3f}", ex[l][h]);
    }
    fmt::print(o, "\n");
  }
  fmt::print(o, "filters     {}\n", a.out);
  if (!a.json.empty())
    write_json(a.json, nlohmann::ordered_json{{"command", "qfilter-calibrate"},
                                              {"model", a.model},
                                              {"filters", a.out},
                                              {"documents", docs.size()},
                                              {"tokens", tokens},
                                              {"explained", ex}});
  return 0;
}

}  // namespace

void add_qfilter_calibrate(CLI::App& app, Action& action) {
  auto a = std::make_shared<QFilterArgs>();
  auto* sub = app.add_subcommand("qfilter-calibrate",
                                 "compute Q-Filters (the queries' principal direction per KV head) from text files");
  add_trainer_io_options(sub, *a, "text files to compute the filters from", "filters file to write (GGUF)");
  sub->add_option("--doc-tokens", a->doc_tokens, "tokens per document")->capture_default_str()
      ->check(int_range(1, 1 << 20));
  sub->add_option("--max-docs", a->max_docs, "documents at most")->capture_default_str()->check(int_at_least(1));
  add_trainer_run_options(sub, *a);
  sub->callback([a, &action] { action = [a] { return run(*a); }; });
}

}  // namespace kvslim::cli
