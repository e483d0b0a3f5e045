// Recorders of what presses read, as LayerHook classes (see recorders.h).
#include "press/recorders.h"

#include <algorithm>
#include <cstring>

namespace kvslim {

bool WindowQueryRecorder::before_attention(const LayerStep& s, std::vector<std::vector<int32_t>>&) {
  if (window_ <= 0) return false;
  const HParams& hp = *s.hp;
  n_head_ = hp.n_head;
  head_dim_ = hp.head_dim;
  const size_t row = static_cast<size_t>(n_head_) * head_dim_;
  if (rows_.size() < static_cast<size_t>(hp.n_layer)) rows_.resize(hp.n_layer);
  // Rows of this batch at recorded positions; the newest `window` rows are kept.
  int t0 = 0;
  while (t0 < s.n && s.positions[t0] < from_) ++t0;
  t0 = std::max(t0, s.n - window_);
  if (t0 >= s.n) return false;
  std::vector<float>& r = rows_[s.layer];
  r.insert(r.end(), s.q + static_cast<size_t>(t0) * row, s.q + static_cast<size_t>(s.n) * row);
  const size_t have = r.size() / row;
  if (have > static_cast<size_t>(window_)) r.erase(r.begin(), r.begin() + (have - window_) * row);
  if (s.layer == hp.n_layer - 1) {
    positions_.insert(positions_.end(), s.positions + t0, s.positions + s.n);
    if (positions_.size() > static_cast<size_t>(window_))
      positions_.erase(positions_.begin(), positions_.end() - window_);
  }
  return false;
}

void WindowQueryRecorder::finish(Observation& obs) {
  // [row][n_head][hd] -> [n_head][row][hd]
  const int nw = static_cast<int>(positions_.size()), hd = head_dim_;
  obs.window_positions = std::move(positions_);
  obs.queries.assign(rows_.size(), {});
  for (size_t l = 0; l < rows_.size(); ++l) {
    std::vector<float>& q = obs.queries[l];
    q.resize(static_cast<size_t>(n_head_) * nw * hd);
    for (int h = 0; h < n_head_; ++h)
      for (int i = 0; i < nw; ++i)
        std::memcpy(&q[(static_cast<size_t>(h) * nw + i) * hd], &rows_[l][(static_cast<size_t>(i) * n_head_ + h) * hd],
                    hd * sizeof(float));
  }
  rows_.clear();
}

void AttentionMassRecorder::after_attention(const LayerStep& s, const std::vector<std::vector<float>>* mass) {
  if (!mass) return;
  const HParams& hp = *s.hp;
  if (mass_.size() < static_cast<size_t>(hp.n_layer)) mass_.resize(hp.n_layer);
  auto& m = mass_[s.layer];
  m.resize(mass->size());
  for (size_t h = 0; h < mass->size(); ++h) {
    // Entries appended by this batch start at 0; earlier batches' sums stay aligned (the cache
    // only grows during a step).
    const auto& src = (*mass)[h];
    m[h].resize(src.size(), 0.0f);
    for (size_t j = 0; j < src.size(); ++j) m[h][j] += src[j];
  }
}

void HiddenStateRecorder::after_qkv(const LayerStep& s) {
  const HParams& hp = *s.hp;
  if (hidden_.size() < static_cast<size_t>(hp.n_layer)) hidden_.resize(hp.n_layer);
  hidden_[s.layer].insert(hidden_[s.layer].end(), s.input, s.input + static_cast<size_t>(s.n) * hp.n_embd);
  if (s.layer == 0) positions_.insert(positions_.end(), s.positions, s.positions + s.n);
}

void HiddenStateRecorder::finish(Observation& obs) {
  obs.hidden = std::move(hidden_);
  obs.hidden_positions = std::move(positions_);
}

void TokenRecorder::begin(const Token* tokens, int n, int32_t first) {
  for (int i = 0; i < n; ++i) {
    tokens_.push_back(tokens[i]);
    positions_.push_back(first + i);
  }
}

void TokenRecorder::finish(Observation& obs) {
  obs.tokens = std::move(tokens_);
  obs.token_positions = std::move(positions_);
}

Observer::Observer(const ObservationNeeds& needs, int32_t window_from) {
  if (needs.window > 0) hooks_.add((window_ = std::make_unique<WindowQueryRecorder>(needs.window, window_from)).get());
  if (needs.attention_mass) hooks_.add((mass_ = std::make_unique<AttentionMassRecorder>()).get());
  if (needs.hidden_states) hooks_.add((hidden_ = std::make_unique<HiddenStateRecorder>()).get());
  if (needs.tokens) hooks_.add((tokens_ = std::make_unique<TokenRecorder>()).get());
  for (LayerHook* h : needs.hooks) hooks_.add(h);
}

Observation Observer::observation() {
  Observation obs;
  if (window_) window_->finish(obs);
  if (mass_) mass_->finish(obs);
  if (hidden_) hidden_->finish(obs);
  if (tokens_) tokens_->finish(obs);
  return obs;
}

std::vector<float> run_observed(ModelRunner& runner, const std::vector<Token>& tokens, const ObservationNeeds& needs,
                                Observation& obs) {
  const int32_t first = runner.next_position();
  std::vector<float> logits;
  if (!needs.any()) {
    logits = runner.run(tokens, nullptr);
    obs = Observation{};
  } else {
    Observer o(needs, first + static_cast<int32_t>(tokens.size()) - std::max(needs.window, 0));
    logits = runner.run(tokens, &o);
    obs = o.observation();
  }
  obs.runner = &runner;
  return logits;
}

}  // namespace kvslim
