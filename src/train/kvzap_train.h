#pragma once
// Training KVzap surrogates (Jegou et al., "KVzap: Fast, Adaptive, and Faithful KV Cache Pruning",
// arXiv 2601.07891): documents cut from text, (attention input, log KVzip+ score) pairs, a ridge
// and an MLP surrogate fitted per layer, held-out Pearson correlations, the ratio a threshold
// achieves and the surrogate's cost against a forward pass. `kvslim kvzap-train` parses flags,
// calls these and prints.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kvslim/model.h"
#include "kvslim/press.h"
#include "press/scorers/kvzap.h"

namespace kvslim {

/// Ridge regression with an intercept, closed form (centred normal equations solved by Cholesky in
/// float64): minimises |Y - X W^T - b|^2 + alpha |W|^2. X [n][d], Y [n][k] -> W [k][d], b [k].
/// Throws kvslim::Error when n == 0 or the system is not positive definite.
void ridge_fit(const float* X, const float* Y, size_t n, int d, int k, double alpha, std::vector<float>& W,
               std::vector<float>& b);

/// MLP training options (kvpress's KVzap recipe: AdamW, cosine schedule per epoch, gradient-norm
/// clipping at 1, MSE loss, batches of 512).
struct MLPTrainOptions {
  int hidden = 512;
  int epochs = 15;
  double lr = 5e-3;
  int batch = 512;
  double weight_decay = 0.01;
  double clip = 1.0;
  uint64_t seed = 42;
};
/// Trains a one-hidden-layer GELU MLP mapping X [n][d] to Y [n][k]. Outputs as in KVzapSurrogate.
void mlp_fit(const float* X, const float* Y, size_t n, int d, int k, const MLPTrainOptions& opt,
             std::vector<float>& W1, std::vector<float>& b1, std::vector<float>& W2, std::vector<float>& b2);

/// Pearson correlation of a and b (float64); 0 when either is constant or n < 2.
double pearson(const float* a, const float* b, size_t n);

/// (attention input, log KVzip+ target) pairs, per layer: X[l] [n][n_embd], Y[l] [n][n_head_kv];
/// doc[i] is the document row i came from (rows are aligned across layers).
struct KVzapData {
  std::vector<std::vector<float>> X, Y;
  std::vector<int> doc;
  size_t rows() const { return doc.size(); }
};

/// Collects training pairs: each document is prefilled (with BOS when the vocabulary wants it),
/// scored with KVzip's replay (KVzip+; sinks not special-cased), and up to `per_doc` of its tokens
/// are sampled (seeded). Targets are log(max(score, 1e-12)). `progress(i, n)` is called after each
/// document when given.
KVzapData collect_kvzap_data(const Model& model, const std::vector<std::vector<Token>>& docs, int per_doc,
                             uint64_t seed, const KVzipOptions& kvzip,
                             const std::function<void(size_t, size_t)>& progress = nullptr);

/// Training documents: consecutive windows of `doc_tokens` tokens of each text (tokenized without
/// BOS), each led by BOS when the vocabulary adds one; a window shorter than 16 tokens is dropped,
/// and at most `max_docs` documents are made, in text order.
std::vector<std::vector<Token>> kvzap_documents(const Tokenizer& tok, const std::vector<std::string>& texts,
                                                int doc_tokens, int max_docs);

/// kvzap_documents() of the text files at `paths`, each read by read_text_file(path, what) (its errors
/// name `what` and the file).
std::vector<std::vector<Token>> kvzap_documents_from_files(const Tokenizer& tok, const std::vector<std::string>& paths,
                                                           const std::string& what, int doc_tokens, int max_docs);

/// How train_kvzap fits.
struct KVzapTrainOptions {
  int per_doc = 128;           ///< tokens sampled per document (>= 1)
  double test_fraction = 0.1;  ///< in (0, 1): the last round(fraction * documents) (at least 1) are held out
  double alpha = 1.0;          ///< ridge regularisation (>= 0)
  MLPTrainOptions mlp;         ///< its seed is replaced by seed + layer
  KVzipOptions kvzip;          ///< the replay that makes the targets
  uint64_t seed = 42;          ///< token sampling and the MLPs
};

/// What train_kvzap fitted and measured.
struct KVzapTrainResult {
  KVzapSurrogate linear, mlp;
  std::vector<double> pearson_linear, pearson_mlp;  ///< [layer] held-out Pearson correlation of log scores
  size_t train_documents = 0, test_documents = 0;
  size_t train_rows = 0, test_rows = 0;
  double collect_seconds = 0, fit_seconds = 0;
  double mean_pearson_linear() const;
  double mean_pearson_mlp() const;
};

/// Collects KVzip+ targets on `docs` (collect_kvzap_data), holds out the last documents and fits a
/// ridge and an MLP surrogate per layer. `progress(i, n)` is called after each document's targets,
/// `on_layer(so_far, layer)` after each layer's fit, with the counts, the collection time and the
/// correlations up to that layer filled in (both optional). Throws
/// kvslim::Error for fewer than 2 documents, a test_fraction outside (0, 1), or too few rows for
/// both splits.
KVzapTrainResult train_kvzap(const Model& model, const std::vector<std::vector<Token>>& docs,
                             const KVzapTrainOptions& opt,
                             const std::function<void(size_t, size_t)>& progress = nullptr,
                             const std::function<void(const KVzapTrainResult&, int)>& on_layer = nullptr);

/// Entries a press keeps over documents, each prefilled on its own and compressed once.
struct KeptEntries {
  size_t kept = 0, total = 0;  ///< entries in the caches after compression; tokens x layers x KV heads
  double compression_ratio() const { return total ? 1.0 - double(kept) / total : 0.0; }
};
KeptEntries kept_entries(const Model& model, PressImpl& press, const std::vector<std::vector<Token>>& docs);

/// Best-of-`reps` seconds of a forward pass over `n` tokens and of the surrogate over as many
/// attention inputs in every layer.
struct SurrogateCost {
  double forward_seconds = 0, surrogate_seconds = 0;
  double percent() const { return forward_seconds > 0 ? 100.0 * surrogate_seconds / forward_seconds : 0.0; }
};
SurrogateCost time_kvzap_surrogate(const Model& model, const KVzapSurrogate& sur, int n, int reps = 3);

/// A surrogate of the model's shape with N(0, 0.02) weights (seeded): for timing only.
KVzapSurrogate random_kvzap_surrogate(const HParams& hp, KVzapSurrogate::Kind kind, int hidden, uint64_t seed);

}  // namespace kvslim
