// `kvslim lukv-curve`: computes a LU-KV budget curve (arXiv 2602.08585) on the user's model and
// text for a scorer, for `--press lukv(SCORER):curve=FILE` (kvpress downloads one curve, made by
// the LU-KV repository's scripts for Llama-3.1-8B). The work is the library's (src/press/policies/lukv.h).
#include <cstdio>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/options.h"
#include "cli/progress.h"
#include "cli/trainer_options.h"
#include "tools/tools.h"

namespace kvslim::cli {

namespace {

struct LUKVArgs : TrainerArgs {
  std::string scorer = "expected_attention:epsilon=0.02";
  int doc_tokens = 512;
  int max_docs = 32;
  double context_fraction = 0.75;
};

int run(const LUKVArgs& a) {
  check_json_output(a.json);
  apply_threads(a.threads);
  auto model = Model::load(a.model, a.load);
  const auto docs = kvzap_documents_from_files(model->tokenizer(), a.text, "-f", a.doc_tokens, a.max_docs);
  if (docs.empty()) throw Error("lukv-curve: no document of at least 16 tokens in the text");
  Progress progress(!a.no_progress);
  const LUKVCurve c = lukv_profile(*model, docs, a.scorer, a.context_fraction,
                                   [&](size_t i, size_t n) { progress.update(i, n, "lukv: documents"); });
  progress.clear();
  c.save(a.out, fmt::format("{} + {}", a.model, a.scorer));
  const HParams& hp = model->hparams();
  std::FILE* o = a.json == "-" ? stderr : stdout;
  fmt::print(o, "model       {} ({} layers x {} KV heads), scorer {}\n", a.model, hp.n_layer, hp.n_head_kv, a.scorer);
  fmt::print(o, "text        {} documents (context: first {} of each)\n", docs.size(), a.context_fraction);
  std::vector<std::vector<double>> at50(hp.n_layer, std::vector<double>(hp.n_head_kv));
  fmt::print(o, "prune ratio per KV head at ratio 0.5\n");
  for (int l = 0; l < hp.n_layer; ++l) {
    fmt::print(o, "layer {:>3}:", l);
    for (int h = 0; h < hp.n_head_kv; ++h) {
      at50[l][h] = c.at(49, l, h);
      fmt::print(o, " {:.2f}", at50[l][h]);
    }
    fmt::print(o, "\n");
  }
  fmt::print(o, "curve       {}\n", a.out);
  if (!a.json.empty())
    write_json(a.json, nlohmann::ordered_json{{"command", "lukv-curve"},
                                              {"model", a.model},
                                              {"scorer", a.scorer},
                                              {"curve", a.out},
                                              {"documents", docs.size()},
                                              {"prune_at_0.5", at50}});
  return 0;
}

}  // namespace

void add_lukv_curve(CLI::App& app, Action& action) {
  auto a = std::make_shared<LUKVArgs>();
  auto* sub = app.add_subcommand("lukv-curve", "compute a LU-KV budget curve (per-head prune ratios) from text files");
  add_trainer_io_options(sub, *a, "text files to profile on", "curve file to write (GGUF)");
  sub->add_option("--scorer", a->scorer, "scorer press whose ranking is profiled")->capture_default_str();
  sub->add_option("--doc-tokens", a->doc_tokens, "tokens per document")->capture_default_str()
      ->check(int_range(16, 1 << 20));
  sub->add_option("--max-docs", a->max_docs, "documents at most")->capture_default_str()->check(int_at_least(1));
  sub->add_option("--context-fraction", a->context_fraction,
                  "share of each document used as the context; the rest's attention is the utility")
      ->capture_default_str()->check(finite_range(0.01, 0.99));
  add_trainer_run_options(sub, *a);
  sub->callback([a, &action] { action = [a] { return run(*a); }; });
}

}  // namespace kvslim::cli
