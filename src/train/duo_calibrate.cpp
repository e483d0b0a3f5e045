// DuoAttention's calibration of retrieval and streaming heads on passkey prompts (method
// "deviation" here; "gates" in duo_gates.cpp). Xiao et al., arXiv 2410.10819.
#include "train/duo_calibrate.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>

#include <fmt/format.h>

#include "attention/attention.h"
#include "kernels/threads.h"
#include "press/authoring.h"
#include "press/scorers/kvzip.h"
#include "model/session.h"
#include "press/recorders.h"

namespace kvslim {

const char* duo_passkey_question() { return "What is the pass key? The pass key is"; }

std::string duo_passkey_prompt(const Model& model, int approx_tokens, double depth, int key) {
  const Tokenizer& tok = model.tokenizer();
  const std::string filler = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. ";
  const std::string needle = fmt::format("The pass key is {}. Remember it. {} is the pass key. ", key, key);
  const std::string question = duo_passkey_question();
  const double per_unit = std::max<size_t>(1, tok.encode(filler, false, false).size());
  const double fixed = tok.encode(needle + question, false, false).size();
  const int units = std::max(1, static_cast<int>(std::lround((approx_tokens - fixed) / per_unit)));
  const int at = std::clamp(static_cast<int>(std::floor(depth * units)), 0, units);
  std::string s;
  for (int i = 0; i < units; ++i) {
    if (i == at) s += needle;
    s += filler;
  }
  if (at == units) s += needle;
  return s + question;
}

namespace {

DuoLabels duo_deviation(const Model& model, const DuoCalibration& cal, const std::function<void(int, int)>& progress) {
  const HParams& hp = model.hparams();
  const int L = hp.n_layer, H = hp.n_head_kv, G = hp.n_group(), hd = hp.head_dim;
  if (cal.samples < 1 || cal.sink < 0 || cal.recent < 1 || cal.window < 1)
    throw Error(fmt::format("duo calibration: samples {} >= 1, sink {} >= 0, recent {} >= 1 and window {} >= 1 needed",
                            cal.samples, cal.sink, cal.recent, cal.window));
  std::vector<std::vector<float>> gram(L);
  for (int l = 0; l < L; ++l) gram[l] = value_output_gram(model, l);
  std::vector<double> dev(static_cast<size_t>(L) * hp.n_head, 0.0), ref(dev.size(), 0.0);
  std::mt19937_64 rng(cal.seed);
  const Tokenizer& tok = model.tokenizer();
  for (int s = 0; s < cal.samples; ++s) {
    const double depth = (s + 0.5) / cal.samples;
    const int key = std::uniform_int_distribution<int>(10000, 99999)(rng);
    std::vector<Token> toks = tok.encode(duo_passkey_prompt(model, cal.length, depth, key), tok.add_bos_default(), false);
    const int n = static_cast<int>(toks.size());
    if (n <= cal.sink + cal.recent + cal.window)
      throw Error(fmt::format("duo calibration: prompts of {} tokens are not longer than sink {} + recent {} + window "
                              "{}; raise DuoCalibration::length",
                              n, cal.sink, cal.recent, cal.window));
    SessionOptions so;
    so.n_ctx = n;
    Session sess(model, so);
    ObservationNeeds needs;
    needs.window = cal.window;
    Observation obs;
    run_observed(sess, toks, needs, obs);
    const int W = obs.n_window();
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    parallel_for(static_cast<int64_t>(L) * H, [&](int64_t b, int64_t e) {
      std::vector<float> full(static_cast<size_t>(W) * hd), stream(hd), diff(hd);
      std::vector<int32_t> vis(W), idx;
      for (int64_t w = b; w < e; ++w) {
        const int l = static_cast<int>(w / H), h = static_cast<int>(w % H);
        const Segment& seg = sess.cache().seg(l, h);
        // Nothing was evicted, so entry j holds position j.
        for (int i = 0; i < W; ++i) vis[i] = obs.window_positions[i] + 1;
        for (int g = 0; g < G; ++g) {
          const int qh = h * G + g;
          const float* q = obs.queries[l].data() + static_cast<size_t>(qh) * W * hd;
          const float* M = gram[l].data() + static_cast<size_t>(qh) * hd * hd;
          attend_segment(seg, q, W, vis.data(), scale, full.data(), hd);
          for (int i = 0; i < W; ++i) {
            idx.clear();
            const int32_t v = vis[i];
            for (int32_t j = 0; j < std::min<int32_t>(cal.sink, v); ++j) idx.push_back(j);
            for (int32_t j = std::max<int32_t>(cal.sink, v - cal.recent); j < v; ++j) idx.push_back(j);
            attend_segment_subset(seg, idx.data(), static_cast<int>(idx.size()), q + static_cast<size_t>(i) * hd, 1,
                                  &vis[i], scale, stream.data(), hd);
            for (int c = 0; c < hd; ++c) diff[c] = full[static_cast<size_t>(i) * hd + c] - stream[c];
            dev[static_cast<size_t>(l) * hp.n_head + qh] += gram_norm(M, diff.data(), hd);
            ref[static_cast<size_t>(l) * hp.n_head + qh] += gram_norm(M, full.data() + static_cast<size_t>(i) * hd, hd);
          }
        }
      }
    });
    if (progress) progress(s + 1, cal.samples);
  }
  DuoLabels out;
  out.method = "deviation";
  out.sink = cal.sink;
  out.recent = cal.recent;
  out.score.assign(L, std::vector<float>(H, 0.0f));
  for (int l = 0; l < L; ++l)
    for (int h = 0; h < H; ++h)
      for (int g = 0; g < G; ++g) {
        const size_t i = static_cast<size_t>(l) * hp.n_head + h * G + g;
        const float r = ref[i] > 0 ? static_cast<float>(dev[i] / ref[i]) : 0.0f;
        out.score[l][h] = std::max(out.score[l][h], r);
      }
  return out;
}

}  // namespace

DuoLabels duo_calibrate(const Model& model, const DuoCalibration& cal, const std::function<void(int, int)>& progress) {
  if (cal.method == "gates") return duo_train_gates(model, cal, progress);
  if (cal.method == "deviation") return duo_deviation(model, cal, progress);
  throw Error(fmt::format("duo calibration: method '{}' is neither 'gates' nor 'deviation'", cal.method));
}

namespace {

// The press's labels when it is given no file: the defaults, shortened to what the model can hold.
DuoLabels default_labels(const Model& model) {
  DuoCalibration cal;
  cal.samples = 4;
  cal.length = std::min(cal.length, std::max(1, model.hparams().n_ctx_train - 8));
  // A model whose context cannot hold the paper's 128 sinks + 256 recent entries (and the
  // compared window) streams with the same proportions scaled to it.
  if (cal.sink + cal.recent + cal.window + 64 > cal.length) {
    cal.sink = std::max(1, cal.length / 8);
    cal.recent = std::max(1, cal.length / 4);
  }
  return duo_calibrate(model, cal);
}

const bool set_at_start = (set_duo_auto_calibration(&default_labels), true);

}  // namespace

}  // namespace kvslim
