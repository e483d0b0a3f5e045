#include "cli/cache_options.h"

#include <fmt/format.h>

#include "cli/flag_names.h"

namespace kvslim::cli {

void add_cache_options(CLI::App* sub, std::string& cache_type_k, std::string& cache_type_v, KVQuantOptions& q) {
  sub->add_option("--cache-type-k", cache_type_k,
                  "KV cache key type (also -ctk, as llama.cpp): f32, f16, bf16, q8_0, q4_0 (llama.cpp's names), q2_1 (2-bit codes with an f16 "
                  "step and minimum per block of 32; with --kivi-bits, the type of the full-precision residual window)")
      ->capture_default_str();
  sub->add_option("--cache-type-v", cache_type_v, "KV cache value type (also -ctv; types as --cache-type-k)")->capture_default_str();
  sub->add_option("--kivi-bits", q.kivi_bits,
                  "KIVI (arXiv 2402.02750): 2 or 4 bits per code, keys per channel over G tokens, values per token "
                  "over G channels; 0 = off. The newest R entries stay f16, so contexts under about R + G tokens "
                  "take more memory than an f16 cache")
      ->capture_default_str();
  auto* group = sub->add_option("--kivi-group", q.kivi_group,
                                "KIVI group size G (tokens per key group, channels per value group)")
                    ->capture_default_str();
  auto* resid = sub->add_option("--kivi-residual", q.kivi_residual,
                                "KIVI residual window R: the newest R entries stay in full precision")
                    ->capture_default_str();
  sub->add_flag("--kv-hadamard", q.hadamard,
                "rotate keys (and, inside attention, queries) by a Hadamard transform before storing them, to spread "
                "outlier channels before quantization");
  // Checked once the subcommand's arguments are parsed, before any model is loaded.
  sub->parse_complete_callback([group, resid, &cache_type_k, &cache_type_v, &q] {
    try {
      // parse_codec's message lists the accepted types but not the flag: one may be right, the other not.
      const auto codec = [](const std::string& flag, const std::string& name) {
        try {
          return parse_codec(name);
        } catch (const Error& e) {
          throw Error(fmt::format("{} {}: {}", flag, printable(name, 40), e.what()));
        }
      };
      const KVCodec k = codec("--cache-type-k", cache_type_k), v = codec("--cache-type-v", cache_type_v);
      if (q.kivi_bits == 0 && (group->count() || resid->count()))
        throw Error(fmt::format("{} needs --kivi-bits 2 or 4", group->count() ? "--kivi-group" : "--kivi-residual"));
      validate_cache_config(k, v, q);
    } catch (const Error& e) {
      throw CLI::ValidationError(flags_in(e.what()));
    }
  });
}

}  // namespace kvslim::cli
