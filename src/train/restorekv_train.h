#pragma once
// Training RestoreKV's restore embeddings and LoRA adapter (arXiv 2608.01247) by
// self-distillation, as the paper and kvpress's RestoreKVPress describe it: the teacher is the
// model on the full cache, the student the model on the KVzip-compressed cache plus the restore
// entries (the R embeddings run once over the full cache with the adapter on); the loss is the
// KL divergence KL(teacher || student) of the next-token distributions of the continuation tokens
// that follow the context; only the embeddings and the adapter are trained (Adam). Gradients run
// through both passes of the transformer in float64 (train/grad_ops.h): meant for small models
// (stories260K, models/retrieval.gguf). Internal; `kvslim restorekv-train` is the command.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kvslim/model.h"
#include "press/scorers/restorekv.h"

namespace kvslim {

struct RestoreKVTrainOptions {
  int n_tokens = 8;          ///< R, the restore embeddings (kvpress: 8)
  int rank = 8;              ///< LoRA rank on q, k, v, o, gate, up, down (kvpress's test adapter: 8)
  float alpha = 16.0f;       ///< LoRA alpha (kvpress's test adapter: 16)
  double ratio = 0.5;        ///< compression ratio of the student's cache
  int context = 128;         ///< context tokens per sample (a BOS first)
  int continuation = 32;     ///< tokens after the context whose next-token distributions are matched
  int steps = 200;           ///< Adam steps, one sample each (cycling through the training samples)
  double lr = 5e-3;          ///< Adam learning rate (beta 0.9 / 0.999, eps 1e-8)
  double holdout = 0.25;     ///< share of the samples held out for the report (the last ones)
  uint32_t seed = 1;         ///< initialisation: embeddings = token rows drawn with it, A uniform, B = 0
};

/// What training measured: mean KL (nats per continuation token) of the student on held-out
/// samples, before (the initial weights: B = 0, so the adapter is off) and after training, and
/// on the training samples at the first and the last step.
struct RestoreKVTrainReport {
  int train_samples = 0, held_out_samples = 0;
  double held_out_kl_before = 0, held_out_kl_after = 0;
  double train_kl_first = 0, train_kl_last = 0;
};

/// Trains on `tokens` (the text, without BOS), cut into samples of `context` + `continuation`
/// tokens. `progress` (optional) gets (step, training KL of the step). Throws kvslim::Error when
/// the text holds fewer than 2 samples or an option is out of range.
RestoreKVWeights train_restorekv(const Model& model, const std::vector<Token>& tokens, const RestoreKVTrainOptions& opt,
                                 RestoreKVTrainReport* report,
                                 const std::function<void(int, double)>& progress = nullptr);

// ---- the objective, exposed for the gradient test ----

/// One sample prepared for the objective: the full cache of the context, what the compressed
/// cache keeps, the continuation and the teacher's distributions.
struct RestoreKVSample;

/// The student's loss (mean KL per continuation token) as a function of the trainable values,
/// flattened as [embeddings R x n_embd][for each layer, each of the 7 projections: A, B].
class RestoreKVObjective {
 public:
  /// Prepares `contexts[i]` (with BOS) followed by `continuations[i]`: teacher logits, the full
  /// cache and the entries the `restorekv` press keeps at `ratio` with R = n_tokens.
  RestoreKVObjective(const Model& model, int n_tokens, int rank, float alpha, double ratio,
                     const std::vector<std::vector<Token>>& contexts, const std::vector<std::vector<Token>>& continuations);
  ~RestoreKVObjective();
  RestoreKVObjective(const RestoreKVObjective&) = delete;
  RestoreKVObjective& operator=(const RestoreKVObjective&) = delete;
  size_t n_params() const;
  size_t n_samples() const;
  /// Loss of sample i at theta; adds d loss / d theta into grad when not nullptr.
  double loss(size_t sample, const std::vector<double>& theta, std::vector<double>* grad) const;
  /// theta as RestoreKVWeights (f32).
  RestoreKVWeights weights(const std::vector<double>& theta) const;
  /// The initial theta (see RestoreKVTrainOptions::seed).
  std::vector<double> initial(uint32_t seed) const;

 private:
  struct Impl;
  Impl* impl_;
};

}  // namespace kvslim
