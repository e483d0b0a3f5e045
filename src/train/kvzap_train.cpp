// Training KVzap surrogates (arXiv 2601.07891): documents, KVzip+ targets, a ridge and an MLP fit
// per layer, held-out correlations, the achieved ratio and the surrogate's cost.
#include "run/prefill.h"
#include "train/kvzap_train.h"

#include <algorithm>
#include <cmath>
#include <random>

#include <fmt/format.h>

#include "kvslim/generate.h"
#include "model/session.h"
#include "util/clock.h"
#include "util/text_file.h"

namespace kvslim {

namespace {

/// Rows `rows` of a [n][width] matrix, in that order.
std::vector<float> gather_rows(const std::vector<float>& src, const std::vector<size_t>& rows, int width) {
  std::vector<float> out(rows.size() * width);
  for (size_t i = 0; i < rows.size(); ++i)
    std::copy(src.begin() + rows[i] * width, src.begin() + (rows[i] + 1) * width, out.begin() + i * width);
  return out;
}

/// An empty surrogate of the model's shape.
KVzapSurrogate shaped(const HParams& hp, KVzapSurrogate::Kind kind, int hidden) {
  KVzapSurrogate s;
  s.kind = kind;
  s.n_layer = hp.n_layer;
  s.input_dim = hp.n_embd;
  s.output_dim = hp.n_head_kv;
  if (kind == KVzapSurrogate::Kind::MLP) s.hidden_dim = hidden;
  return s;
}

double mean(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m += x / v.size();
  return m;
}

}  // namespace

std::vector<std::vector<Token>> kvzap_documents(const Tokenizer& tok, const std::vector<std::string>& texts,
                                                int doc_tokens, int max_docs) {
  if (doc_tokens < 1) throw Error(fmt::format("kvzap documents: doc_tokens {} must be >= 1", doc_tokens));
  std::vector<std::vector<Token>> docs;
  for (const std::string& text : texts) {
    std::vector<Token> all = tok.encode(text, false, false);
    for (size_t b = 0; b + 16 <= all.size() && static_cast<int>(docs.size()) < max_docs; b += doc_tokens) {
      const size_t e = std::min(all.size(), b + static_cast<size_t>(doc_tokens));
      std::vector<Token> doc;
      doc.reserve(e - b + 1);
      if (tok.add_bos_default() && tok.bos() >= 0) doc.push_back(tok.bos());
      doc.insert(doc.end(), all.begin() + b, all.begin() + e);
      docs.push_back(std::move(doc));
    }
  }
  return docs;
}

std::vector<std::vector<Token>> kvzap_documents_from_files(const Tokenizer& tok, const std::vector<std::string>& paths,
                                                           const std::string& what, int doc_tokens, int max_docs) {
  std::vector<std::string> texts;
  for (const std::string& p : paths) texts.push_back(read_text_file(p, what));
  return kvzap_documents(tok, texts, doc_tokens, max_docs);
}

double KVzapTrainResult::mean_pearson_linear() const { return mean(pearson_linear); }
double KVzapTrainResult::mean_pearson_mlp() const { return mean(pearson_mlp); }

KVzapTrainResult train_kvzap(const Model& model, const std::vector<std::vector<Token>>& docs,
                             const KVzapTrainOptions& opt, const std::function<void(size_t, size_t)>& progress,
                             const std::function<void(const KVzapTrainResult&, int)>& on_layer) {
  if (docs.size() < 2)
    throw Error(fmt::format("kvzap training: {} document(s) of >= 16 tokens; need at least 2", docs.size()));
  if (!(opt.test_fraction > 0 && opt.test_fraction < 1))
    throw Error(fmt::format("kvzap training: test_fraction {} must be in (0, 1)", opt.test_fraction));
  const HParams& hp = model.hparams();
  const int L = hp.n_layer, H = hp.n_head_kv, d = hp.n_embd;
  KVzapTrainResult res;
  res.test_documents = std::max<size_t>(1, static_cast<size_t>(opt.test_fraction * docs.size() + 0.5));
  res.train_documents = docs.size() - res.test_documents;
  const int first_test = static_cast<int>(res.train_documents);

  double t0 = steady_seconds();
  const KVzapData data = collect_kvzap_data(model, docs, opt.per_doc, opt.seed, opt.kvzip, progress);
  res.collect_seconds = steady_seconds() - t0;
  std::vector<size_t> train, test;
  for (size_t r = 0; r < data.rows(); ++r) (data.doc[r] < first_test ? train : test).push_back(r);
  if (train.empty() || test.empty()) throw Error("kvzap training: not enough rows for both a training and a test split");
  res.train_rows = train.size();
  res.test_rows = test.size();

  res.linear = shaped(hp, KVzapSurrogate::Kind::Linear, 0);
  res.mlp = shaped(hp, KVzapSurrogate::Kind::MLP, opt.mlp.hidden);
  res.pearson_linear.assign(L, 0.0);
  res.pearson_mlp.assign(L, 0.0);
  t0 = steady_seconds();
  for (int l = 0; l < L; ++l) {
    const std::vector<float> Xtr = gather_rows(data.X[l], train, d), Ytr = gather_rows(data.Y[l], train, H);
    const std::vector<float> Xte = gather_rows(data.X[l], test, d), Yte = gather_rows(data.Y[l], test, H);
    std::vector<float> w, b;
    ridge_fit(Xtr.data(), Ytr.data(), train.size(), d, H, opt.alpha, w, b);
    res.linear.w1.push_back(w);
    res.linear.b1.push_back(b);
    MLPTrainOptions mo = opt.mlp;
    mo.seed = opt.seed + l;
    std::vector<float> w1, b1, w2, b2;
    mlp_fit(Xtr.data(), Ytr.data(), train.size(), d, H, mo, w1, b1, w2, b2);
    res.mlp.w1.push_back(w1);
    res.mlp.b1.push_back(b1);
    res.mlp.w2.push_back(w2);
    res.mlp.b2.push_back(b2);
    std::vector<float> p(test.size() * H);
    res.linear.predict(l, Xte.data(), static_cast<int>(test.size()), p.data());
    res.pearson_linear[l] = pearson(p.data(), Yte.data(), p.size());
    res.mlp.predict(l, Xte.data(), static_cast<int>(test.size()), p.data());
    res.pearson_mlp[l] = pearson(p.data(), Yte.data(), p.size());
    if (on_layer) on_layer(res, l);
  }
  res.fit_seconds = steady_seconds() - t0;
  return res;
}

KeptEntries kept_entries(const Model& model, PressImpl& press, const std::vector<std::vector<Token>>& docs) {
  const HParams& hp = model.hparams();
  KeptEntries k;
  for (const std::vector<Token>& doc : docs) {
    SessionOptions so;
    so.n_ctx = static_cast<int>(doc.size());
    Session s(model, so);
    prefill_and_compress(s, press, doc, 0);
    k.kept += s.cache().entries();
    k.total += doc.size() * hp.n_layer * hp.n_head_kv;
  }
  return k;
}

SurrogateCost time_kvzap_surrogate(const Model& model, const KVzapSurrogate& sur, int n, int reps) {
  const HParams& hp = model.hparams();
  std::vector<Token> toks(n);
  for (int i = 0; i < n; ++i) toks[i] = (i * 7919 + 13) % hp.n_vocab;
  std::vector<float> x(static_cast<size_t>(n) * hp.n_embd), y(static_cast<size_t>(n) * hp.n_head_kv);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(std::sin(0.37 * i));
  SurrogateCost c{1e30, 1e30};
  for (int rep = 0; rep < reps; ++rep) {
    SessionOptions so;
    so.n_ctx = n;
    Session s(model, so);
    double t = steady_seconds();
    s.forward(toks);
    c.forward_seconds = std::min(c.forward_seconds, steady_seconds() - t);
    t = steady_seconds();
    for (int l = 0; l < hp.n_layer; ++l) sur.predict(l, x.data(), n, y.data());
    c.surrogate_seconds = std::min(c.surrogate_seconds, steady_seconds() - t);
  }
  return c;
}

KVzapSurrogate random_kvzap_surrogate(const HParams& hp, KVzapSurrogate::Kind kind, int hidden, uint64_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  auto rnd = [&](size_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = nd(rng);
    return v;
  };
  KVzapSurrogate s = shaped(hp, kind, hidden);
  const bool mlp = kind == KVzapSurrogate::Kind::MLP;
  const size_t in = mlp ? static_cast<size_t>(hidden) : static_cast<size_t>(hp.n_head_kv);
  for (int l = 0; l < hp.n_layer; ++l) {
    s.w1.push_back(rnd(in * hp.n_embd));
    s.b1.push_back(rnd(in));
    if (!mlp) continue;
    s.w2.push_back(rnd(static_cast<size_t>(hp.n_head_kv) * hidden));
    s.b2.push_back(rnd(hp.n_head_kv));
  }
  return s;
}

}  // namespace kvslim
