// kvpress's names for kvslim's presses and parameters: a kvpress user can write
// `SnapKVPress:compression_ratio=0.5,window_size=32` or `AdaKVPress(SnapKVPress,alpha_safeguard=0.3)`.
// Class names follow kvpress/presses/*.py at its public snapshot; parameter names are the
// dataclass fields of those classes.
#include "press/kvpress_names.h"

#include <algorithm>
#include <map>

namespace kvslim {

namespace {

struct Entry {
  const char* kvpress;
  const char* ours;
  std::map<std::string, std::string> params;  // kvpress field -> our parameter
};

const std::vector<Entry>& table() {
  static const std::vector<Entry> t = {
      {"RandomPress", "random", {}},
      {"KnormPress", "knorm", {}},
      {"StreamingLLMPress", "streaming_llm", {}},
      {"SnapKVPress", "snapkv", {{"window_size", "window"}, {"kernel_size", "kernel"}}},
      {"TOVAPress", "tova", {}},
      {"ObservedAttentionPress", "observed_attention", {}},
      {"ExpectedAttentionPress", "expected_attention",
       {{"n_future_positions", "n_future"}, {"use_covariance", "covariance"}, {"use_vnorm", "vnorm"}}},
      {"ExpectedAttentionStatsPress", "expected_attention",
       {{"n_future_positions", "n_future"}, {"use_covariance", "covariance"}, {"use_vnorm", "vnorm"},
        {"stats_folder", "stats"}}},
      {"KeyDiffPress", "keydiff", {}},
      {"CriticalKVPress", "criticalkv", {{"first_stage_ratio", "first_stage"}}},
      {"AdaKVPress", "adakv", {{"alpha_safeguard", "alpha"}}},
      {"PyramidKVPress", "pyramidkv", {{"window_size", "window"}}},
      {"PerLayerCompressionPress", "per_layer", {{"compression_ratios", "ratios"}}},
      {"KeyRerotationPress", "key_rerotation", {}},
      {"DecodingPress", "decoding", {{"compression_interval", "interval"}, {"target_size", "size"}}},
      {"DMSPress", "threshold", {{"threshold", "tau"}, {"sliding_window_size", "window"}, {"decoding", "decode"}}},
      {"KVzipPress", "kvzip", {{"kvzip_plus_normalization", "plus"}}},
      {"KVzapPress", "kvzap", {}},
      {"FastKVzipPress", "fastkvzip", {}},
      {"RestoreKVPress", "restorekv", {{"kvzip_plus_normalization", "plus"}}},
      {"LUKVPress", "lukv", {}},
      {"DuoAttentionPress", "duo_attention", {{"head_compression_ratio", "head_ratio"}}},
      {"ChunkKVPress", "chunkkv", {{"chunk_length", "chunk"}}},
      {"LagKVPress", "lagkv", {{"lag_size", "lag"}}},
      {"CURPress", "cur",
       {{"num_sinks", "n_sink"},
        {"leverage_type", "leverage"},
        {"use_random_leverage", "random_projection"},
        {"use_local_approximation", "local"},
        {"local_window_size", "window"}}},
      {"SimLayerKVPress", "simlayerkv", {}},
      {"ChunkPress", "chunk", {{"chunk_length", "chunk"}}},
      {"BlockPress", "block", {{"block_size", "block"}}},
      {"QFilterPress", "qfilter", {}},
      {"MergingPress", "merging", {}},
      {"CompressionRatioDecodingPress", "compression_ratio_decoding",
       {{"compression_interval", "interval"}, {"target_compression_ratio", "ratio"}}},
      {"FinchPress", "finch", {{"window_size", "window"}, {"normalize_scores", "normalize"}, {"chunk_length", "chunk"}, {"rerotate_keys", "rerotate"}}},
      {"LeverageScorePress", "leverage", {{"sketch_dimension", "sketch"}}},
      {"NonCausalAttnPress", "non_causal_attention", {{"chunk_size", "chunk"}}},
      {"CompactorPress", "compactor",
       {{"sink_size_start", "sink_start"}, {"sink_size_end", "sink_end"}, {"chunk_size", "chunk"},
        {"sketch_dimension", "sketch"}}},
      {"CriticalAdaKVPress", "critical_adakv", {{"alpha_safeguard", "alpha"}, {"first_stage_ratio", "first_stage"}}},
      {"ThinKPress", "think", {{"key_channel_compression_ratio", "key_ratio"}, {"window_size", "window"}}},
      {"CapPress", "cap", {{"n_future_positions", "n_future"}}},
      {"KVComposePress", "kvcompose", {}},
      {"CAMPress", "cam", {{"compression_interval", "interval"}, {"target_size", "size"}}},
  };
  return t;
}

}  // namespace

std::string kvpress_class_to_press(const std::string& name) {
  for (const Entry& e : table())
    if (name == e.kvpress) return e.ours;
  return {};
}

std::string kvpress_class_of(const std::string& press) {
  for (const Entry& e : table())
    if (press == e.ours) return e.kvpress;
  return {};
}

std::string kvpress_param_to_ours(const std::string& press, const std::string& key) {
  if (key == "compression_ratio") return "ratio";
  for (const Entry& e : table())
    if (press == e.ours) {
      auto it = e.params.find(key);
      if (it != e.params.end()) return it->second;
    }
  return key;
}

std::vector<std::pair<std::string, std::string>> kvpress_params_of(const std::string& press) {
  std::vector<std::pair<std::string, std::string>> out;
  // Two kvpress classes can name one press (ExpectedAttentionPress, ExpectedAttentionStatsPress):
  // each alias once.
  for (const Entry& e : table())
    if (press == e.ours)
      for (const auto& [k, v] : e.params)
        if (std::find(out.begin(), out.end(), std::make_pair(k, v)) == out.end()) out.emplace_back(k, v);
  return out;
}

}  // namespace kvslim
