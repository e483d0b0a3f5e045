// Decoding wrapper: leaves prefill alone and, every `interval` generated tokens, compresses the
// cache with the inner press to `size` entries per (layer, KV head), or, with size=0, to the
// inner press's ratio of every token seen so far (context + generated). The inner press scores
// with the queries of the most recent decode steps as its observation window (the prefill's last
// window to start with). kvpress's DecodingPress (kvpress/presses/decoding_press.py): defaults
// compression_interval 512, target_size 2048.
#include <algorithm>

#include <fmt/format.h>

#include "press/authoring.h"
#include "press/decode_window.h"

namespace kvslim {
namespace {

class DecodingPress : public DecodeTimeWrapper<PressImpl> {
 public:
  DecodingPress(std::unique_ptr<PressImpl> inner, int interval, int size)
      : DecodeTimeWrapper(std::move(inner)), interval_(interval), size_(size) {}
  std::string describe() const override {
    return fmt::format("decoding({}):interval={},size={}", inner_->describe(), interval_, size_);
  }
  void after_decode(KVCache& cache, const Model& model, const Observation& obs) override {
    observe_step(cache, model, obs);
    if (++steps_ % interval_ != 0) return;
    const size_t n = static_cast<size_t>(cache_next_position(cache));
    Target t{inner_->ratio(), n};
    if (size_ > 0) {
      if (n <= static_cast<size_t>(size_)) return;
      t.ratio = 1.0 - static_cast<double>(size_) / static_cast<double>(n);
    }
    if (t.ratio <= 0) return;
    inner_->apply(cache, model, window_, t);
  }
  void reset() override {
    DecodeTimeWrapper::reset();
    steps_ = 0;
  }

 private:
  int interval_, size_;
  int steps_ = 0;
};

PressRegistrar reg([] {
  PressInfo i;
  i.name = "decoding";
  i.kvpress = {"DecodingPress"};
  i.summary = "wrapper: during decode, every `interval` tokens, compress to `size` entries per KV head "
              "(or, size=0, to the inner press's ratio of all tokens seen)";
  i.source = "kvpress DecodingPress (kvpress/presses/decoding_press.py)";
  i.params = {{"interval", "512", "compression_interval", {.help = "decode steps between two compressions"}},
              {"size", "2048", "target_size",
               {.help = "entries per KV head after each compression (0: the inner press's ratio of all tokens)"}}};
  i.kind = PressKind::Wrapper;
  i.default_inner = "knorm";
  // Older kvpress named interval and size compression_steps and token_buffer_size.
  i.python = {.inner = "base_press",
              .fields = {{.name = "compression_steps",
                          .type = ParamType::Int,
                          .default_value = "None",
                          .help = "older kvpress's name of compression_interval (wins when given)",
                          .alias = "interval"},
                         {.name = "token_buffer_size",
                          .type = ParamType::Int,
                          .default_value = "None",
                          .help = "older kvpress's name of target_size (wins when given)",
                          .alias = "size"}}};
  i.make_wrapper = [](const PressParams& p, std::unique_ptr<PressImpl> inner) -> std::unique_ptr<PressImpl> {
    int iv = param_int(p, "decoding", "interval"), sz = param_int(p, "decoding", "size");
    if (iv < 1) throw Error(fmt::format("press decoding: interval={} must be >= 1", iv));
    if (sz < 0) throw Error(fmt::format("press decoding: size={} must be >= 0", sz));
    // Presses that run the model again over the context (KVzip's replay) have nothing to replay
    // during decode: refused rather than silently never compressing.
    if (inner->needs().tokens)
      throw Error(fmt::format("press decoding: the inner press {} scores by replaying the context, which decode-time "
                              "compression cannot do; use it on the prefill (without decoding)",
                              inner->describe()));
    return std::make_unique<DecodingPress>(std::move(inner), iv, sz);
  };
  return i;
}());

}  // namespace
}  // namespace kvslim

namespace kvslim {
namespace {

// kvpress's CompressionRatioDecodingPress (kvpress/presses/compression_ratio_decoding_press.py):
// the decoding wrapper whose target is the inner press's ratio of every token seen so far,
// max(1, floor(seen (1 - ratio))) entries per KV head every `interval` steps: decoding(...):size=0.
PressRegistrar reg_ratio([] {
  PressInfo i;
  i.name = "compression_ratio_decoding";
  i.kvpress = {"CompressionRatioDecodingPress"};
  i.summary = "wrapper: during decode, every `interval` tokens, compress to the inner press's ratio of all tokens "
              "seen (decoding with size=0)";
  i.source = "kvpress CompressionRatioDecodingPress (kvpress/presses/compression_ratio_decoding_press.py)";
  // kvpress's target ratio is the wrapper's `ratio`, which every wrapper takes (it sets the inner press's).
  i.params = {{"interval", "512", "compression_interval", {.help = "decode steps between two compressions"}},
              {"ratio", "", "target_compression_ratio",
               {.help = "the fraction of all tokens seen removed at each compression", .default_value = "0.5"}}};
  i.kind = PressKind::Wrapper;
  i.default_inner = "knorm";
  i.python = {.inner = "base_press"};
  i.make_wrapper = [](const PressParams& p, std::unique_ptr<PressImpl> inner) -> std::unique_ptr<PressImpl> {
    const PressInfo* d = PressRegistry::instance().find("decoding");
    if (!d) throw Error("press compression_ratio_decoding: decoding is not registered");
    return d->make_wrapper({{"interval", p.at("interval")}, {"size", "0"}}, std::move(inner));
  };
  return i;
}());

}  // namespace
}  // namespace kvslim
