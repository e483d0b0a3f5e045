// DuoAttention's gate training (Xiao et al., arXiv 2410.10819; repository
// github.com/mit-han-lab/duo-attention, duo_attn/train.py), linearised around the full model:
// each head's streaming deviation at the labelled tokens, carried to the final norm, gives one
// convex quadratic in the gates (see duo_calibrate.h), minimised exactly.
#include <algorithm>
#include <cmath>
#include <random>

#include <cblas.h>
#include <fmt/format.h>

#include "attention/attention.h"
#include "kernels/matmul.h"
#include "kernels/threads.h"
#include "kvslim/quant.h"
#include "model/session.h"
#include "model/layer_hook.h"
#include "train/duo_calibrate.h"
#include "press/recorders.h"

namespace kvslim {

DuoGateSample duo_gate_sample(const Model& model, const std::vector<Token>& tokens, int n_label, int sink,
                              int recent) {
  const HParams& hp = model.hparams();
  const int L = hp.n_layer, H = hp.n_head_kv, G = hp.n_group(), hd = hp.head_dim, d = hp.n_embd;
  const int n = static_cast<int>(tokens.size());
  if (n_label < 1 || n_label > n)
    throw Error(fmt::format("duo gates: {} labelled tokens of a {}-token sample", n_label, n));
  if (sink < 0 || recent < 1) throw Error(fmt::format("duo gates: sink {} >= 0 and recent {} >= 1 needed", sink, recent));
  SessionOptions so;
  so.n_ctx = n;
  so.key_codec = so.value_codec = KVCodec::F32;
  Session sess(model, so);
  // The residual stream entering the last layer at the labelled tokens.
  std::vector<float> xlast(static_cast<size_t>(n_label) * d);
  AfterQKV last([&](const LayerStep& st) {
    if (st.layer != L - 1) return;
    for (int t = 0; t < st.n; ++t) {
      const int i = st.positions[t] - (n - n_label);
      if (i >= 0 && i < n_label)
        std::copy(st.input + static_cast<size_t>(t) * d, st.input + static_cast<size_t>(t + 1) * d,
                  xlast.begin() + static_cast<size_t>(i) * d);
    }
  });
  ObservationNeeds needs;
  needs.window = n_label;
  needs.hooks.push_back(&last);
  Observation obs;
  run_observed(sess, tokens, needs, obs);
  if (obs.n_window() != n_label)
    throw Error(fmt::format("duo gates: {} window queries recorded, {} expected", obs.n_window(), n_label));
  std::vector<double> scale(n_label);  // 1 / rms(x_last(t))
  for (int t = 0; t < n_label; ++t) {
    double ms = 0;
    for (int c = 0; c < d; ++c) ms += double(xlast[static_cast<size_t>(t) * d + c]) * xlast[static_cast<size_t>(t) * d + c];
    scale[t] = 1.0 / std::sqrt(ms / d + hp.rms_eps);
  }
  const std::vector<float>& w_out = model.output_norm();
  if (static_cast<int>(w_out.size()) != d)
    throw Error(fmt::format("duo gates: output norm has {} weights, n_embd is {}", w_out.size(), d));

  DuoGateSample out;
  out.n_label = n_label;
  out.n_gates = L * H;
  out.n_embd = d;
  out.e.assign(static_cast<size_t>(n_label) * out.n_gates * d, 0.0);
  const float att_scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (int l = 0; l < L; ++l) {
    const WeightView& wo = *model.layer(l).wo;
    const int64_t cols = wo.cols;
    if (wo.rows != d || cols != static_cast<int64_t>(hp.n_head) * hd)
      throw Error(fmt::format("layer {}: attn_output is {} x {}, expected {} x {}", l, wo.rows, cols, d, hp.n_head * hd));
    std::vector<float> w(static_cast<size_t>(d) * cols);
    for (int64_t r = 0; r < d; ++r) dequantize_row(wo.type, wo.row(r), w.data() + r * cols, cols);
    parallel_for(static_cast<int64_t>(H) * n_label, [&](int64_t b, int64_t e) {
      std::vector<float> full(hd), stream(hd);
      std::vector<double> diff(hd), D(d);
      std::vector<int32_t> idx;
      for (int64_t job = b; job < e; ++job) {
        const int h = static_cast<int>(job / n_label), i = static_cast<int>(job % n_label);
        const Segment& seg = sess.cache().seg(l, h);
        // Nothing was evicted, so entry j holds position j; the query sees entries [0, v).
        const int32_t v = obs.window_positions[i] + 1;
        idx.clear();
        for (int32_t j = 0; j < std::min<int32_t>(sink, v); ++j) idx.push_back(j);
        for (int32_t j = std::max<int32_t>(sink, v - recent); j < v; ++j) idx.push_back(j);
        std::fill(D.begin(), D.end(), 0.0);
        for (int g = 0; g < G; ++g) {
          const int qh = h * G + g;
          const float* q = obs.queries[l].data() + (static_cast<size_t>(qh) * n_label + i) * hd;
          attend_segment(seg, q, 1, &v, att_scale, full.data(), hd);
          attend_segment_subset(seg, idx.data(), static_cast<int>(idx.size()), q, 1, &v, att_scale, stream.data(), hd);
          for (int a = 0; a < hd; ++a) diff[a] = double(full[a]) - stream[a];
          for (int c = 0; c < d; ++c) {
            const float* row = w.data() + static_cast<size_t>(c) * cols + static_cast<size_t>(qh) * hd;
            double s = 0;
            for (int a = 0; a < hd; ++a) s += double(row[a]) * diff[a];
            D[c] += s;
          }
        }
        double* dst = out.e.data() + (static_cast<size_t>(i) * out.n_gates + static_cast<size_t>(l) * H + h) * d;
        for (int c = 0; c < d; ++c) dst[c] = double(w_out[c]) * D[c] * scale[i];
      }
    });
  }
  return out;
}

void duo_add_gram(const DuoGateSample& s, std::vector<double>& gram) {
  const int K = s.n_gates, d = s.n_embd;
  if (gram.empty()) gram.assign(static_cast<size_t>(K) * K, 0.0);
  if (gram.size() != static_cast<size_t>(K) * K)
    throw Error(fmt::format("duo gates: gram of {} values for {} gates", gram.size(), K));
  // gram += E_t E_t^T / d for every labelled token t (E_t: K x d, row major).
  BlasSlot slot;  // see kernels/threads.h
  for (int t = 0; t < s.n_label; ++t)
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, K, K, d, 1.0 / d, s.e.data() + static_cast<size_t>(t) * K * d,
                d, s.e.data() + static_cast<size_t>(t) * K * d, d, 1.0, gram.data(), K);
}

namespace {

int side(const std::vector<double>& A) {
  const int n = static_cast<int>(std::llround(std::sqrt(static_cast<double>(A.size()))));
  if (static_cast<size_t>(n) * n != A.size()) throw Error(fmt::format("duo gates: A has {} values, not n x n", A.size()));
  return n;
}

}  // namespace

double duo_gate_objective(const std::vector<double>& A, double c, const std::vector<double>& alpha) {
  const int n = side(A);
  if (static_cast<int>(alpha.size()) != n) throw Error(fmt::format("duo gates: {} gates for a {}-gate A", alpha.size(), n));
  double f = 0;
  for (int k = 0; k < n; ++k) {
    double row = 0;
    for (int j = 0; j < n; ++j) row += A[static_cast<size_t>(k) * n + j] * (1 - alpha[j]);
    f += (1 - alpha[k]) * row + c * alpha[k];
  }
  return f;
}

std::vector<double> duo_gate_gradient(const std::vector<double>& A, double c, const std::vector<double>& alpha) {
  const int n = side(A);
  if (static_cast<int>(alpha.size()) != n) throw Error(fmt::format("duo gates: {} gates for a {}-gate A", alpha.size(), n));
  std::vector<double> g(n);
  for (int k = 0; k < n; ++k) {
    double row = 0;
    for (int j = 0; j < n; ++j) row += A[static_cast<size_t>(k) * n + j] * (1 - alpha[j]);
    g[k] = c - 2 * row;
  }
  return g;
}

std::vector<double> duo_solve_gates(const std::vector<double>& A, double c, int* sweeps) {
  const int n = side(A);
  std::vector<double> beta(n, 0.0);  // alpha = 1
  int it = 0;
  for (; it < 100000; ++it) {
    double moved = 0;
    for (int k = 0; k < n; ++k) {
      const double* row = A.data() + static_cast<size_t>(k) * n;
      double s = 0;
      for (int j = 0; j < n; ++j)
        if (j != k) s += row[j] * beta[j];
      // f in beta_k alone: A_kk beta_k^2 + (2 s - c) beta_k + const.
      double b;
      if (row[k] > 0)
        b = std::clamp((c - 2 * s) / (2 * row[k]), 0.0, 1.0);
      else
        b = 2 * s - c < 0 ? 1.0 : (2 * s - c > 0 ? 0.0 : beta[k]);
      moved = std::max(moved, std::fabs(b - beta[k]));
      beta[k] = b;
    }
    if (moved < 1e-13) break;
  }
  if (sweeps) *sweeps = it + 1;
  std::vector<double> alpha(n);
  for (int k = 0; k < n; ++k) alpha[k] = 1 - beta[k];
  return alpha;
}

DuoLabels duo_train_gates(const Model& model, const DuoCalibration& cal, const std::function<void(int, int)>& progress) {
  const HParams& hp = model.hparams();
  if (cal.samples < 1 || cal.sink < 0 || cal.recent < 1 || !(cal.reg >= 0) || !std::isfinite(cal.reg))
    throw Error(fmt::format("duo gate training: samples {} >= 1, sink {} >= 0, recent {} >= 1 and reg {} >= 0 needed",
                            cal.samples, cal.sink, cal.recent, cal.reg));
  const Tokenizer& tok = model.tokenizer();
  std::mt19937_64 rng(cal.seed);
  std::vector<double> gram;
  int64_t labelled = 0;
  for (int s = 0; s < cal.samples; ++s) {
    const double depth = (s + 0.5) / cal.samples;
    const int key = std::uniform_int_distribution<int>(10000, 99999)(rng);
    const std::string answer = fmt::format(" {}.", key);
    std::vector<Token> toks =
        tok.encode(duo_passkey_prompt(model, cal.length, depth, key) + answer, tok.add_bos_default(), false);
    const int n = static_cast<int>(toks.size());
    // The question and the answer are labelled (the repository's labels: every token after the context).
    const int n_label = std::min<int>(n, static_cast<int>(tok.encode(duo_passkey_question() + answer, false, false).size()));
    if (n <= cal.sink + cal.recent + n_label)
      throw Error(fmt::format("duo gate training: samples of {} tokens are not longer than sink {} + recent {} + the "
                              "{} labelled tokens; raise --length",
                              n, cal.sink, cal.recent, n_label));
    if (n > hp.n_ctx_train)
      throw Error(fmt::format("duo gate training: samples of {} tokens exceed the model's context of {}; lower --length",
                              n, hp.n_ctx_train));
    DuoGateSample smp = duo_gate_sample(model, toks, n_label, cal.sink, cal.recent);
    duo_add_gram(smp, gram);
    labelled += n_label;
    if (progress) progress(s + 1, cal.samples);
  }
  for (double& x : gram) x /= static_cast<double>(labelled);
  const int K = hp.n_layer * hp.n_head_kv;
  const std::vector<double> alpha = duo_solve_gates(gram, cal.reg / K);
  DuoLabels out;
  out.method = "gates";
  out.reg = cal.reg;
  out.sink = cal.sink;
  out.recent = cal.recent;
  out.score.assign(hp.n_layer, std::vector<float>(hp.n_head_kv));
  out.cost.assign(hp.n_layer, std::vector<float>(hp.n_head_kv));
  for (int l = 0; l < hp.n_layer; ++l)
    for (int h = 0; h < hp.n_head_kv; ++h) {
      const size_t k = static_cast<size_t>(l) * hp.n_head_kv + h;
      out.score[l][h] = static_cast<float>(alpha[k]);
      out.cost[l][h] = static_cast<float>(gram[k * K + k]);
    }
  return out;
}

}  // namespace kvslim
