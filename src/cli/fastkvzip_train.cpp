// `kvslim fastkvzip-train`: trains Fast KVzip's gates (arXiv 2601.17668) on the user's model from
// text files (targets: KVzip scores from the context replay) and saves them for
// `--press fastkvzip:gates=FILE` (kvpress downloads gates trained by the authors for a few models).
// The work is the library's (src/train/fastkvzip_train.h); this file parses flags, calls and prints.
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

struct FastKVzipArgs : TrainerArgs {
  int doc_tokens = 256;
  int max_docs = 64;
  FastKVzipTrainOptions opt;
  int kvzip_chunk = 2048;
  bool plus = false;
};

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0.0 : s / v.size();
}

int run(FastKVzipArgs a) {
  check_json_output(a.json);
  apply_threads(a.threads);
  auto model = Model::load(a.model, a.load);
  // Documents of --doc-tokens tokens (BOS first when the vocabulary wants it), as kvzap-train cuts them.
  const auto docs = kvzap_documents_from_files(model->tokenizer(), a.text, "-f", a.doc_tokens, a.max_docs);
  if (docs.empty()) throw Error("fastkvzip-train: no document of at least 16 tokens in the text");
  a.opt.kvzip.chunk = a.kvzip_chunk;
  a.opt.kvzip.plus = a.plus;
  Progress progress(!a.no_progress);
  const FastKVzipData data = collect_fastkvzip_data(*model, docs, a.opt.kvzip, [&](size_t i, size_t n) {
    progress.update(i, n, "fastkvzip: KVzip scores of the documents");
  });
  progress.clear();
  FastKVzipTrainResult r = train_fastkvzip(*model, data, a.opt, [&](int s, int n) {
    progress.update(static_cast<size_t>(s), static_cast<size_t>(n), "fastkvzip: SGD steps");
  });
  progress.clear();
  r.gates.save(a.out, a.model);
  const HParams& hp = model->hparams();
  std::FILE* o = a.json == "-" ? stderr : stdout;
  fmt::print(o, "model       {} ({} layers x {} KV heads, n_embd {})\n", a.model, hp.n_layer, hp.n_head_kv, hp.n_embd);
  fmt::print(o, "data        {} documents, {} tokens ({} train, {} held out: every {}th), targets {} scores\n",
             docs.size(), data.rows, r.train_rows, r.test_rows, a.opt.test_every, a.plus ? "KVzip+" : "KVzip");
  fmt::print(o, "gates       dim {}, {} sinks, {} query vectors per KV head; {} SGD steps of {} tokens, lr {}\n",
             r.gates.dim, r.gates.n_sink, r.gates.n_group, a.opt.steps, a.opt.batch, a.opt.lr);
  fmt::print(o, "held out    binary cross-entropy (sum over KV heads) and accuracy at 0.05 per layer\n");
  for (int l = 0; l < hp.n_layer; ++l)
    fmt::print(o, "layer {:>3}: loss {:.4f} -> {:.4f}, accuracy {:.3f}\n", l, r.test_loss_init[l], r.test_loss[l],
               r.test_accuracy[l]);
  fmt::print(o, "mean        loss {:.4f} -> {:.4f}, accuracy {:.3f}; {:.1f} s\n", mean(r.test_loss_init),
             mean(r.test_loss), mean(r.test_accuracy), r.seconds);
  fmt::print(o, "gates       {}\n", a.out);
  if (!a.json.empty())
    write_json(a.json, nlohmann::ordered_json{{"command", "fastkvzip-train"},
                                              {"model", a.model},
                                              {"gates", a.out},
                                              {"documents", docs.size()},
                                              {"tokens", data.rows},
                                              {"train_rows", r.train_rows},
                                              {"test_rows", r.test_rows},
                                              {"steps", a.opt.steps},
                                              {"test_loss_init", r.test_loss_init},
                                              {"test_loss", r.test_loss},
                                              {"test_accuracy", r.test_accuracy},
                                              {"seconds", r.seconds}});
  return 0;
}

}  // namespace

void add_fastkvzip_train(CLI::App& app, Action& action) {
  auto a = std::make_shared<FastKVzipArgs>();
  auto* sub = app.add_subcommand("fastkvzip-train",
                                 "train Fast KVzip's gates (predicted KVzip scores) from text files and save them");
  add_trainer_io_options(sub, *a, "text files to learn from", "gates file to write (GGUF)");
  sub->add_option("--doc-tokens", a->doc_tokens, "tokens per training document")->capture_default_str()
      ->check(int_range(16, 1 << 20));
  sub->add_option("--max-docs", a->max_docs, "documents at most")->capture_default_str()->check(int_at_least(1));
  sub->add_option("--steps", a->opt.steps, "SGD steps")->capture_default_str()->check(int_at_least(1));
  sub->add_option("--batch", a->opt.batch, "tokens per step")->capture_default_str()->check(int_at_least(1));
  sub->add_option("--lr", a->opt.lr, "peak learning rate")->capture_default_str()->check(finite_range(1e-12, 100.0));
  sub->add_option("--dim", a->opt.dim, "gate width")->capture_default_str()->check(int_range(1, 4096));
  sub->add_option("--sinks", a->opt.n_sink, "learned sink keys per KV head (0: a sigmoid gate)")->capture_default_str()
      ->check(int_range(0, 4096));
  sub->add_option("--groups", a->opt.n_group, "query vectors per KV head (0: the model's GQA group)")
      ->capture_default_str()->check(int_range(0, 4096));
  sub->add_option("--kvzip-chunk", a->kvzip_chunk, "KVzip replay chunk, tokens")->capture_default_str()
      ->check(int_range(16, 1 << 20));
  sub->add_flag("--plus", a->plus, "train on KVzip+ scores (default: plain KVzip, as the authors)");
  sub->add_option("-s,--seed", a->opt.seed, "random seed (initialisation, shuffling)")->capture_default_str();
  add_trainer_run_options(sub, *a);
  sub->callback([a, &action] { action = [a] { return run(*a); }; });
}

}  // namespace kvslim::cli
