// `kvslim kvzap-train`: collects (attention input, log KVzip+ score) pairs from text files, fits the
// KVzap surrogates (ridge regression and a GELU MLP), reports held-out Pearson correlations per
// layer, saves one of them, and measures the achieved ratio and the surrogate's cost. The work is
// the library's (src/train/kvzap_train.h); this file parses flags, calls and prints.
#include <cstdio>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/options.h"
#include "cli/progress.h"
#include "tools/tools.h"

namespace kvslim::cli {

namespace {

struct TrainArgs {
  std::string model;
  ModelLoadOptions load;  // --rope-* / --yarn-* over the file's RoPE settings
  std::string json;
  std::vector<std::string> corpus;
  std::string out;
  std::string type = "mlp";
  int doc_tokens = 256;
  int per_doc = 128;
  int max_docs = 64;
  double test_fraction = 0.1;
  double alpha = 1.0;
  MLPTrainOptions mlp;
  int kvzip_chunk = 2048;
  double threshold = -4.0;
  int window = 128;
  bool bench = true;
  bool bench_only = false;
  int bench_tokens = 256;
  uint64_t seed = 42;
  int threads = 0;
  bool no_progress = false;
};

void print_cost(const char* kind, const Model& model, const KVzapSurrogate& sur, int n) {
  const SurrogateCost c = time_kvzap_surrogate(model, sur, n, 3);
  fmt::print("cost         {} surrogate on {} tokens x {} layers: {:.3f} ms vs forward pass {:.3f} ms ({:.2f}%)\n", kind,
             n, model.hparams().n_layer, 1e3 * c.surrogate_seconds, 1e3 * c.forward_seconds, c.percent());
}

/// Random surrogates of the model's shape: only their cost is measured.
int bench_only(const TrainArgs& a, const Model& model) {
  const HParams& hp = model.hparams();
  fmt::print("model        {} ({} layers, n_embd {}, {} KV heads, {})\n", a.model, hp.n_layer, hp.n_embd, hp.n_head_kv,
             model.weight_type());
  print_cost("linear", model, random_kvzap_surrogate(hp, KVzapSurrogate::Kind::Linear, 0, a.seed), a.bench_tokens);
  print_cost("mlp", model, random_kvzap_surrogate(hp, KVzapSurrogate::Kind::MLP, a.mlp.hidden, a.seed + 1),
             a.bench_tokens);
  return 0;
}

/// Trains (or, with --bench-only, times), printing the report on stdout; fills `summary` for --json.
int train(const TrainArgs& a, nlohmann::ordered_json& summary) {
  if (a.bench_only) {
    apply_threads(a.threads);
    auto model = Model::load(a.model, a.load);
    return bench_only(a, *model);
  }
  if (a.corpus.empty()) throw Error("give at least one text file: -f FILE (also --corpus)");
  if (a.out.empty()) throw Error("give --out SURROGATE.gguf");
  if (a.type != "mlp" && a.type != "linear") throw Error(fmt::format("--type '{}' must be mlp or linear", a.type));
  apply_threads(a.threads);
  auto model = Model::load(a.model, a.load);
  const HParams& hp = model->hparams();

  const std::vector<std::vector<Token>> docs =
      kvzap_documents_from_files(model->tokenizer(), a.corpus, "-f", a.doc_tokens, a.max_docs);
  KVzapTrainOptions to;
  to.per_doc = a.per_doc;
  to.test_fraction = a.test_fraction;
  to.alpha = a.alpha;
  to.mlp = a.mlp;
  to.kvzip.chunk = a.kvzip_chunk;
  to.seed = a.seed;
  fmt::print("model        {} ({} layers, n_embd {}, {} KV heads)\n", a.model, hp.n_layer, hp.n_embd, hp.n_head_kv);
  Progress progress(!a.no_progress);
  const KVzapTrainResult r = train_kvzap(
      *model, docs, to,
      [&](size_t i, size_t n) {
        progress.update(i, n, "kvzap: KVzip+ targets of the documents");
        if (i == n) progress.clear();
      },
      [&](const KVzapTrainResult& so_far, int l) {
        if (l == 0) {
          fmt::print("documents    {} ({} train, {} held out), {} tokens each at most; {} + {} rows ({:.1f} s)\n",
                     docs.size(), so_far.train_documents, so_far.test_documents, a.doc_tokens, so_far.train_rows,
                     so_far.test_rows, so_far.collect_seconds);
          fmt::print("\n{:>5} {:>14} {:>14}   (held-out Pearson correlation of log KVzip+ scores)\n", "layer",
                     "linear", "mlp");
        }
        fmt::print("{:>5} {:>14.3f} {:>14.3f}\n", l, so_far.pearson_linear[l], so_far.pearson_mlp[l]);
      });
  fmt::print("{:>5} {:>14.3f} {:>14.3f}   (fitting {:.1f} s)\n", "mean", r.mean_pearson_linear(),
             r.mean_pearson_mlp(), r.fit_seconds);

  const KVzapSurrogate& chosen = a.type == "mlp" ? r.mlp : r.linear;
  chosen.save(a.out, a.model);
  fmt::print("\nsaved        {} ({} surrogate)\n", a.out, chosen.kind_name());

  // Achieved ratio on the held-out documents: prefill with the saved surrogate as a press.
  auto press = make_press_impl(fmt::format("kvzap:surrogate={},threshold={},window={}", a.out, a.threshold, a.window), 0.0);
  const std::vector<std::vector<Token>> held_out(docs.begin() + r.train_documents, docs.end());
  const KeptEntries k = kept_entries(*model, *press, held_out);
  fmt::print("threshold    tau {} with a sliding window of {}: compression ratio {:.3f} on the held-out documents "
             "({} of {} entries kept)\n",
             a.threshold, a.window, k.compression_ratio(), k.kept, k.total);

  if (a.bench) print_cost(chosen.kind_name(), *model, chosen, static_cast<int>(docs.front().size()));
  summary = {{"command", "kvzap-train"},
             {"model", a.model},
             {"surrogate", a.out},
             {"type", chosen.kind_name()},
             {"documents", docs.size()},
             {"held_out_documents", r.test_documents},
             {"pearson_linear", r.pearson_linear},
             {"pearson_mlp", r.pearson_mlp},
             {"threshold", a.threshold},
             {"window", a.window},
             {"held_out_compression_ratio", k.compression_ratio()}};
  return 0;
}

int run(const TrainArgs& a) {
  check_json_output(a.json);
  nlohmann::ordered_json summary = {{"command", "kvzap-train"}, {"model", a.model}, {"bench_only", true}};
  int rc;
  {
    StdoutToStderr report_to_stderr(a.json == "-");  // stdout holds only the JSON then
    rc = train(a, summary);
  }
  if (!a.json.empty()) write_json(a.json, summary);
  return rc;
}

}  // namespace

void add_kvzap_train(CLI::App& app, Action& action) {
  auto a = std::make_shared<TrainArgs>();
  auto* sub = app.add_subcommand("kvzap-train",
                                 "train a KVzap surrogate of KVzip+ scores from text files (ridge and MLP) and save it");
  add_model_option(sub, a->model, a->load);
  sub->add_option("-f,--file,--corpus", a->corpus, "text files to learn from (-f as the other trainers)")->expected(1, -1);
  sub->add_option("-o,--out", a->out, "surrogate file to write (GGUF)");
  sub->add_option("--type", a->type, "surrogate to save: mlp or linear (both are fitted and reported)")
      ->capture_default_str();
  sub->add_option("--doc-tokens", a->doc_tokens, "tokens per training document")->capture_default_str()
      ->check(int_range(16, 1 << 20));
  sub->add_option("--per-doc", a->per_doc, "tokens sampled per document")->capture_default_str()
      ->check(int_at_least(1));
  sub->add_option("--max-docs", a->max_docs, "documents at most")->capture_default_str()->check(int_range(2, 1 << 20));
  sub->add_option("--test-fraction", a->test_fraction, "documents held out for the correlation")->capture_default_str()
      ->check(finite_range(1e-6, 1.0 - 1e-6));
  sub->add_option("--alpha", a->alpha, "ridge regularisation")->capture_default_str()->check(finite_range(0.0, 1e12));
  sub->add_option("--hidden", a->mlp.hidden, "MLP hidden units")->capture_default_str()->check(int_at_least(1));
  sub->add_option("--epochs", a->mlp.epochs, "MLP epochs")->capture_default_str()->check(int_at_least(1));
  sub->add_option("--lr", a->mlp.lr, "MLP AdamW learning rate")->capture_default_str()->check(finite_range(1e-12, 1.0));
  sub->add_option("--batch", a->mlp.batch, "MLP batch size")->capture_default_str()->check(int_at_least(1));
  sub->add_option("--kvzip-chunk", a->kvzip_chunk, "KVzip replay chunk, tokens")->capture_default_str()
      ->check(int_range(16, 1 << 20));
  sub->add_option("--kvzap-threshold", a->threshold, "tau for the achieved-ratio check on held-out documents")
      ->capture_default_str()->check(finite_range(-1e6, 1e6));
  sub->add_option("--window", a->window, "sliding window for that check")->capture_default_str()
      ->check(int_at_least(0));
  sub->add_flag("--bench,!--no-bench", a->bench, "time the surrogate against a forward pass")->capture_default_str();
  sub->add_flag("--bench-only", a->bench_only,
                "only time random surrogates of the model's shape (linear and MLP) against a forward pass");
  sub->add_option("--bench-tokens", a->bench_tokens, "tokens of the --bench-only forward pass")->capture_default_str()
      ->check(int_at_least(1));
  sub->add_option("-s,--seed", a->seed, "random seed (token sampling, MLP)")->capture_default_str();
  add_threads_option(sub, a->threads);
  add_json_option(sub, a->json);
  add_no_progress_flag(sub, a->no_progress);
  sub->callback([a, &action] { action = [a] { return run(*a); }; });
}

}  // namespace kvslim::cli
