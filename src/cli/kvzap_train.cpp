// `kvslim kvzap-train`: collects (attention input, log KVzip+ score) pairs from text files, fits the
// KVzap surrogates (ridge regression and a GELU MLP), reports held-out Pearson correlations per
// layer, saves one of them, and measures the achieved ratio and the surrogate's cost.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>
#include <cstdio>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "util/text_file.h"
#include "cli/commands.h"
#include "cli/options.h"
#include "kernels/threads.h"
#include "kvslim/generate.h"
#include "press/kvzap.h"

namespace kvslim::cli {

namespace {

struct TrainArgs {
  std::string model;
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
};

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

/// Seconds of a forward pass over `n` tokens and of the surrogate over the same tokens' attention
/// inputs in every layer (best of `reps`).
std::pair<double, double> time_surrogate(const Model& model, const KVzapSurrogate& sur, int n, int reps) {
  const HParams& hp = model.hparams();
  std::vector<Token> toks(n);
  for (int i = 0; i < n; ++i) toks[i] = (i * 7919 + 13) % hp.n_vocab;
  std::vector<float> x(static_cast<size_t>(n) * hp.n_embd), y(static_cast<size_t>(n) * hp.n_head_kv);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(std::sin(0.37 * i));
  double fwd = 1e30, cost = 1e30;
  for (int rep = 0; rep < reps; ++rep) {
    SessionOptions so;
    so.n_ctx = n;
    Session s(model, so);
    auto t = Clock::now();
    s.forward(toks);
    fwd = std::min(fwd, since(t));
    t = Clock::now();
    for (int l = 0; l < hp.n_layer; ++l) sur.predict(l, x.data(), n, y.data());
    cost = std::min(cost, since(t));
  }
  return {fwd, cost};
}

void print_cost(const char* kind, const Model& model, const KVzapSurrogate& sur, int n) {
  auto [fwd, cost] = time_surrogate(model, sur, n, 3);
  fmt::print("cost         {} surrogate on {} tokens x {} layers: {:.3f} ms vs forward pass {:.3f} ms ({:.2f}%)\n", kind,
             n, model.hparams().n_layer, 1e3 * cost, 1e3 * fwd, 100.0 * cost / fwd);
}

/// Random surrogates of the model's shape: only their cost is measured.
int bench_only(const TrainArgs& a, const Model& model) {
  const HParams& hp = model.hparams();
  std::mt19937 rng(a.seed);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  auto rnd = [&](size_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = nd(rng);
    return v;
  };
  KVzapSurrogate lin, mlp;
  lin.kind = KVzapSurrogate::Kind::Linear;
  mlp.kind = KVzapSurrogate::Kind::MLP;
  for (KVzapSurrogate* s : {&lin, &mlp}) {
    s->n_layer = hp.n_layer;
    s->input_dim = hp.n_embd;
    s->output_dim = hp.n_head_kv;
  }
  mlp.hidden_dim = a.mlp.hidden;
  for (int l = 0; l < hp.n_layer; ++l) {
    lin.w1.push_back(rnd(static_cast<size_t>(hp.n_head_kv) * hp.n_embd));
    lin.b1.push_back(rnd(hp.n_head_kv));
    mlp.w1.push_back(rnd(static_cast<size_t>(a.mlp.hidden) * hp.n_embd));
    mlp.b1.push_back(rnd(a.mlp.hidden));
    mlp.w2.push_back(rnd(static_cast<size_t>(hp.n_head_kv) * a.mlp.hidden));
    mlp.b2.push_back(rnd(hp.n_head_kv));
  }
  fmt::print("model        {} ({} layers, n_embd {}, {} KV heads, {})\n", a.model, hp.n_layer, hp.n_embd, hp.n_head_kv,
             model.weight_type());
  print_cost("linear", model, lin, a.bench_tokens);
  print_cost("mlp", model, mlp, a.bench_tokens);
  return 0;
}

/// Trains (or, with --bench-only, times), printing the report on stdout; fills `summary` for --json.
int train(const TrainArgs& a, nlohmann::ordered_json& summary) {
  if (a.bench_only) {
    apply_threads(a.threads);
    auto model = Model::load(a.model);
    return bench_only(a, *model);
  }
  if (a.corpus.empty()) throw Error("give at least one --corpus FILE");
  if (a.out.empty()) throw Error("give --out SURROGATE.gguf");
  if (a.type != "mlp" && a.type != "linear") throw Error(fmt::format("--type '{}' must be mlp or linear", a.type));
  if (!(a.test_fraction > 0 && a.test_fraction < 1))
    throw Error(fmt::format("--test-fraction {} must be in (0, 1)", a.test_fraction));
  apply_threads(a.threads);
  auto model = Model::load(a.model);
  const HParams& hp = model->hparams();
  const Tokenizer& tok = model->tokenizer();
  const int L = hp.n_layer, H = hp.n_head_kv, d = hp.n_embd;

  // Documents: consecutive windows of --doc-tokens tokens of each file, BOS first when wanted.
  std::vector<std::vector<Token>> docs;
  for (const std::string& path : a.corpus) {
    std::vector<Token> all = tok.encode(read_text_file(path, "--corpus"), false, false);
    for (size_t b = 0; b + 16 <= all.size() && static_cast<int>(docs.size()) < a.max_docs; b += a.doc_tokens) {
      const size_t e = std::min(all.size(), b + static_cast<size_t>(a.doc_tokens));
      std::vector<Token> doc;
      doc.reserve(e - b + 1);
      if (tok.add_bos_default() && tok.bos() >= 0) doc.push_back(tok.bos());
      for (size_t i = b; i < e; ++i) doc.push_back(all[i]);
      docs.push_back(std::move(doc));
    }
  }
  if (docs.size() < 2) throw Error(fmt::format("the corpus gives {} document(s) of >= 16 tokens; need at least 2", docs.size()));
  const size_t n_test_docs = std::max<size_t>(1, static_cast<size_t>(a.test_fraction * docs.size() + 0.5));
  const int first_test = static_cast<int>(docs.size() - n_test_docs);

  KVzipOptions kz;
  kz.chunk = a.kvzip_chunk;
  auto t0 = Clock::now();
  KVzapData data = collect_kvzap_data(*model, docs, a.per_doc, a.seed, kz, [](size_t i, size_t n) {
    fmt::print(stderr, "\rKVzip+ targets: document {}/{}", i, n);
    if (i == n) fmt::print(stderr, "\n");
  });
  const double collect_s = since(t0);
  std::vector<size_t> train, test;
  for (size_t r = 0; r < data.rows(); ++r) (data.doc[r] < first_test ? train : test).push_back(r);
  if (train.empty() || test.empty()) throw Error("not enough rows for both a training and a test split");

  auto gather = [&](const std::vector<float>& src, const std::vector<size_t>& rows, int width) {
    std::vector<float> out(rows.size() * width);
    for (size_t i = 0; i < rows.size(); ++i)
      std::copy(src.begin() + rows[i] * width, src.begin() + (rows[i] + 1) * width, out.begin() + i * width);
    return out;
  };
  KVzapSurrogate lin, mlp;
  lin.kind = KVzapSurrogate::Kind::Linear;
  mlp.kind = KVzapSurrogate::Kind::MLP;
  for (KVzapSurrogate* s : {&lin, &mlp}) {
    s->n_layer = L;
    s->input_dim = d;
    s->output_dim = H;
  }
  mlp.hidden_dim = a.mlp.hidden;
  fmt::print("model        {} ({} layers, n_embd {}, {} KV heads)\n", a.model, L, d, H);
  fmt::print("documents    {} ({} train, {} held out), {} tokens each at most; {} + {} rows ({:.1f} s)\n",
             docs.size(), first_test, n_test_docs, a.doc_tokens, train.size(), test.size(), collect_s);
  fmt::print("\n{:>5} {:>14} {:>14}   (held-out Pearson correlation of log KVzip+ scores)\n", "layer", "linear", "mlp");
  std::vector<double> r_lin(L), r_mlp(L);
  t0 = Clock::now();
  for (int l = 0; l < L; ++l) {
    std::vector<float> Xtr = gather(data.X[l], train, d), Ytr = gather(data.Y[l], train, H);
    std::vector<float> Xte = gather(data.X[l], test, d), Yte = gather(data.Y[l], test, H);
    std::vector<float> w, b;
    ridge_fit(Xtr.data(), Ytr.data(), train.size(), d, H, a.alpha, w, b);
    lin.w1.push_back(w);
    lin.b1.push_back(b);
    MLPTrainOptions mo = a.mlp;
    mo.seed = a.seed + l;
    std::vector<float> w1, b1, w2, b2;
    mlp_fit(Xtr.data(), Ytr.data(), train.size(), d, H, mo, w1, b1, w2, b2);
    mlp.w1.push_back(w1);
    mlp.b1.push_back(b1);
    mlp.w2.push_back(w2);
    mlp.b2.push_back(b2);
    std::vector<float> p(test.size() * H);
    lin.predict(l, Xte.data(), static_cast<int>(test.size()), p.data());
    r_lin[l] = pearson(p.data(), Yte.data(), p.size());
    mlp.predict(l, Xte.data(), static_cast<int>(test.size()), p.data());
    r_mlp[l] = pearson(p.data(), Yte.data(), p.size());
    fmt::print("{:>5} {:>14.3f} {:>14.3f}\n", l, r_lin[l], r_mlp[l]);
  }
  double ml = 0, mm = 0;
  for (int l = 0; l < L; ++l) ml += r_lin[l] / L, mm += r_mlp[l] / L;
  fmt::print("{:>5} {:>14.3f} {:>14.3f}   (fitting {:.1f} s)\n", "mean", ml, mm, since(t0));

  const KVzapSurrogate& chosen = a.type == "mlp" ? mlp : lin;
  chosen.save(a.out, a.model);
  fmt::print("\nsaved        {} ({} surrogate)\n", a.out, chosen.kind_name());

  // Achieved ratio on the held-out documents: prefill with the saved surrogate as a press.
  auto press = make_press(fmt::format("kvzap:surrogate={},threshold={},window={}", a.out, a.threshold, a.window), 0.0);
  size_t kept = 0, total = 0;
  for (int i = first_test; i < static_cast<int>(docs.size()); ++i) {
    SessionOptions so;
    so.n_ctx = static_cast<int>(docs[i].size());
    Session s(*model, so);
    press->reset();
    prefill_and_compress(s, *press, docs[i], 0);
    kept += s.cache().entries();
    total += docs[i].size() * L * H;
  }
  fmt::print("threshold    tau {} with a sliding window of {}: compression ratio {:.3f} on the held-out documents "
             "({} of {} entries kept)\n",
             a.threshold, a.window, 1.0 - double(kept) / total, kept, total);

  if (a.bench) print_cost(chosen.kind_name(), *model, chosen, static_cast<int>(docs.front().size()));
  summary = {{"command", "kvzap-train"},
             {"model", a.model},
             {"surrogate", a.out},
             {"type", chosen.kind_name()},
             {"documents", docs.size()},
             {"held_out_documents", n_test_docs},
             {"pearson_linear", r_lin},
             {"pearson_mlp", r_mlp},
             {"threshold", a.threshold},
             {"window", a.window},
             {"held_out_compression_ratio", 1.0 - double(kept) / total}};
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
  add_model_option(sub, a->model);
  sub->add_option("--corpus", a->corpus, "text files to learn from")->expected(1, -1);
  sub->add_option("-o,--out", a->out, "surrogate file to write (GGUF)");
  sub->add_option("--type", a->type, "surrogate to save: mlp or linear (both are fitted and reported)")
      ->capture_default_str();
  sub->add_option("--doc-tokens", a->doc_tokens, "tokens per training document")->capture_default_str()
      ->check(CLI::Range(16, 1 << 20));
  sub->add_option("--per-doc", a->per_doc, "tokens sampled per document")->capture_default_str()
      ->check(CLI::PositiveNumber);
  sub->add_option("--max-docs", a->max_docs, "documents at most")->capture_default_str()->check(CLI::Range(2, 1 << 20));
  sub->add_option("--test-fraction", a->test_fraction, "documents held out for the correlation")->capture_default_str()
      ->check(finite_range(1e-6, 1.0 - 1e-6));
  sub->add_option("--alpha", a->alpha, "ridge regularisation")->capture_default_str()->check(finite_range(0.0, 1e12));
  sub->add_option("--hidden", a->mlp.hidden, "MLP hidden units")->capture_default_str()->check(CLI::PositiveNumber);
  sub->add_option("--epochs", a->mlp.epochs, "MLP epochs")->capture_default_str()->check(CLI::PositiveNumber);
  sub->add_option("--lr", a->mlp.lr, "MLP AdamW learning rate")->capture_default_str()->check(finite_range(1e-12, 1.0));
  sub->add_option("--batch", a->mlp.batch, "MLP batch size")->capture_default_str()->check(CLI::PositiveNumber);
  sub->add_option("--kvzip-chunk", a->kvzip_chunk, "KVzip replay chunk, tokens")->capture_default_str()
      ->check(CLI::Range(16, 1 << 20));
  sub->add_option("--kvzap-threshold", a->threshold, "tau for the achieved-ratio check on held-out documents")
      ->capture_default_str()->check(finite_range(-1e6, 1e6));
  sub->add_option("--window", a->window, "sliding window for that check")->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  sub->add_flag("--bench,!--no-bench", a->bench, "time the surrogate against a forward pass")->capture_default_str();
  sub->add_flag("--bench-only", a->bench_only,
                "only time random surrogates of the model's shape (linear and MLP) against a forward pass");
  sub->add_option("--bench-tokens", a->bench_tokens, "tokens of the --bench-only forward pass")->capture_default_str()
      ->check(CLI::PositiveNumber);
  sub->add_option("-s,--seed", a->seed, "random seed (token sampling, MLP)")->capture_default_str();
  add_threads_option(sub, a->threads);
  add_json_option(sub, a->json);
  sub->callback([a, &action] { action = [a] { return run(*a); }; });
}

}  // namespace kvslim::cli
