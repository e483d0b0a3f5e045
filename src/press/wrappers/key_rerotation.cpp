// KeyRerotation: after the inner press evicts, the kept keys of each segment are re-rotated to
// contiguous positions, as if the evicted tokens had never been there (kvpress's
// KeyRerotationPress; SinkCache, FINCH). Keys in the cache carry RoPE at their original position p;
// rotating by delta = p' - p moves them to p' (RoPE(p + delta) = R(delta) RoPE(p)), in the model's
// layout (llama pairs or neox halves) and frequencies (Llama 3 rope_freqs). kvpress places the k
// kept entries at 0..k-1 and continues the sequence at k; here they go to E-k..E-1, where E is the
// session's next position, so the session continues at its own counter. Attention depends only on
// position differences, so both give the same outputs. Keys of quantized codecs are decoded,
// rotated and re-encoded.
#include <fmt/format.h>

#include "press/authoring.h"
#include "model/rope.h"

namespace kvslim {
namespace {

class KeyRerotationPress : public PressImpl {
 public:
  explicit KeyRerotationPress(std::unique_ptr<PressImpl> inner) : inner_(std::move(inner)) {}
  std::string describe() const override { return fmt::format("key_rerotation({})", inner_->describe()); }
  ObservationNeeds needs() const override { return inner_->needs(); }
  ObservationNeeds decode_needs() const override { return inner_->decode_needs(); }
  void observe(const KVCache& c, const Model& m, const Observation& o) override { inner_->observe(c, m, o); }
  void apply(KVCache& cache, const Model& model, const Observation& obs, const Target& t) override {
    const int32_t end = cache_next_position(cache);
    inner_->apply(cache, model, obs, t);
    rerotate(cache, model, end);
  }
  void after_decode(KVCache& cache, const Model& model, const Observation& obs) override {
    const int32_t end = cache_next_position(cache);
    inner_->after_decode(cache, model, obs);
    rerotate(cache, model, end);
  }
  void reset() override { inner_->reset(); }
  bool evicts_in_decode() const override { return inner_->evicts_in_decode(); }
  bool selects_in_decode() const override { return inner_->selects_in_decode(); }
  double ratio() const override { return inner_->ratio(); }
  double key_channel_ratio() const override { return inner_->key_channel_ratio(); }
  void set_ratio(double r) override { inner_->set_ratio(r); }
  size_t kept_after(const Target& t) const override { return inner_->kept_after(t); }
  void remap_positions(int l, int h, const std::vector<int32_t>& o, const std::vector<int32_t>& n) override {
    inner_->remap_positions(l, h, o, n);
  }

 private:
  void rerotate(KVCache& cache, const Model& model, int32_t end) {
    const HParams& hp = model.hparams();
    const int hd = hp.head_dim;
    const auto inv_freq = rope::inv_freq(model);
    for (int l = 0; l < cache.n_layer(); ++l)
      for (int h = 0; h < cache.n_head_kv(); ++h) {
        Segment& s = cache.seg(l, h);
        const size_t k = s.size();
        std::vector<int32_t> old = s.positions(), now(k);
        size_t first = k;
        for (size_t i = 0; i < k; ++i) {
          now[i] = end - static_cast<int32_t>(k - i);
          if (now[i] != old[i] && first == k) first = i;
        }
        if (first == k) continue;  // already contiguous up to the newest token
        std::vector<float> keys((k - first) * hd);
        s.keys(first, k, keys.data());
        for (size_t i = first; i < k; ++i)
          rope::rotate(keys.data() + (i - first) * hd, hd, hp.rope_neox, inv_freq, double(now[i]) - old[i]);
        s.set_keys(first, k, keys.data());
        s.positions_mut() = now;
        inner_->remap_positions(l, h, old, now);
      }
  }
  std::unique_ptr<PressImpl> inner_;
};

PressRegistrar reg([] {
  PressInfo i;
  i.name = "key_rerotation";
  i.kvpress = {"KeyRerotationPress"};
  i.summary = "wrapper: after eviction, re-rotates kept keys to contiguous positions";
  i.source = "kvpress KeyRerotationPress; Xiao et al. 2023 (StreamingLLM) arXiv 2309.17453, FINCH arXiv 2408.00167";
  i.kind = PressKind::Wrapper;
  i.default_inner = "streaming_llm";
  i.make_wrapper = [](const PressParams&, std::unique_ptr<PressImpl> inner) -> std::unique_ptr<PressImpl> {
    return std::make_unique<KeyRerotationPress>(std::move(inner));
  };
  return i;
}());

}  // namespace
}  // namespace kvslim
