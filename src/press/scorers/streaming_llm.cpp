// StreamingLLM: keep the first n_sink entries (attention sinks) and the most recent ones.
// Xiao et al., "Efficient Streaming Language Models with Attention Sinks", arXiv 2309.17453; as
// kvpress's StreamingLLMPress (kvpress/presses/streaming_llm_press.py): the sinks are chosen first
// but count against the budget; `protect=1` (kvslim's option) never evicts them.
#include <fmt/format.h>

#include "press/authoring.h"

namespace kvslim {
namespace {

class StreamingLLMPress : public ScorerPress {
 public:
  StreamingLLMPress(double ratio, int n_sink, bool protect) : ScorerPress(ratio), n_sink_(n_sink), protect_(protect) {}
  std::string describe_scorer() const override {
    return fmt::format("streaming_llm:ratio={},n_sink={},protect={}", ratio_, n_sink_, protect_ ? 1 : 0);
  }
  void score(const LayerView& view, std::vector<std::vector<float>>& out) const override {
    for (int h = 0; h < view.hp().n_head_kv; ++h) {
      const auto& pos = view.seg(h).positions();
      out[h].resize(pos.size());
      // Sinks are the entries at the smallest positions; recency orders the rest.
      for (size_t i = 0; i < pos.size(); ++i)
        out[h][i] = i < static_cast<size_t>(n_sink_) ? keep_first_score(protect_) : static_cast<float>(pos[i]);
    }
  }

 private:
  int n_sink_;
  bool protect_;
};

PressRegistrar reg({"streaming_llm", "attention sinks + most recent entries",
                    "Xiao et al. 2023, Efficient Streaming Language Models with Attention Sinks, arXiv 2309.17453; "
                    "reference: kvpress/presses/streaming_llm_press.py (StreamingLLMPress)",
                    {{"ratio", "0"},
                     {"n_sink", "4", {}, {.help = "the first entries (attention sinks) always kept"}},
                     {"protect", "0", {}, kKvslimOnly}}, [](const PressParams& p) -> std::unique_ptr<PressImpl> {
                      int n_sink = param_int(p, "streaming_llm", "n_sink");
                      if (n_sink < 0) throw Error(fmt::format("press streaming_llm: n_sink={} must be >= 0", n_sink));
                      return std::make_unique<StreamingLLMPress>(param_double(p, "streaming_llm", "ratio"), n_sink,
                                                                 param_bool(p, "streaming_llm", "protect"));
                    }}, {"StreamingLLMPress"});

}  // namespace
}  // namespace kvslim
