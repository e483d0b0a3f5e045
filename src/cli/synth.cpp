// `kvslim synth`: write a random-weight GGUF with a real model's shape, for benchmarks.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/options.h"
#include "cli/progress.h"
#include "kvslim/synth.h"

namespace kvslim::cli {

namespace {

struct SynthArgs {
  SynthOptions opt;
  int threads = 0;
  bool quiet = false;
  std::string json;
};

int run(const SynthArgs& a) {
  check_json_output(a.json);
  apply_threads(a.threads);
  Progress progress(!a.quiet);
  SynthResult r = synth_model(a.opt, [&](size_t i, size_t n, const std::string& name, GGMLType t) {
    progress.update(i, n, fmt::format("{} {}", name, type_name(t)));
  });
  progress.clear();
  std::string mix;
  for (auto& [type, count] : r.tensors_per_type) mix += fmt::format("{}{} {}", mix.empty() ? "" : ", ", count, type);
  fmt::print(a.json == "-" ? stderr : stdout, "wrote {}: {} ({} layers, vocab {}, {}), {} tensors ({}), {:.1f} MiB in {:.1f} s\n", a.opt.output,
             a.opt.shape, r.n_layer, r.n_vocab, a.opt.type, r.n_tensors, mix, r.file_bytes / 1048576.0, r.seconds);
  if (!a.json.empty()) {
    nlohmann::ordered_json j = {{"command", "synth"},      {"output", a.opt.output},   {"shape", a.opt.shape},
                                {"type", a.opt.type},      {"n_layer", r.n_layer},     {"n_vocab", r.n_vocab},
                                {"n_tensors", r.n_tensors}, {"tensors_per_type", r.tensors_per_type},
                                {"file_bytes", r.file_bytes}, {"seconds", r.seconds}};
    write_json(a.json, j);
  }
  return 0;
}

}  // namespace

void add_synth(CLI::App& app, Action& action) {
  auto a = std::make_shared<SynthArgs>();
  std::string shapes, types;
  for (const SynthShape& s : synth_shapes()) shapes += (shapes.empty() ? "" : ", ") + s.name;
  for (const SynthFileType& t : synth_file_types()) types += (types.empty() ? "" : ", ") + t.name;
  auto* sub = app.add_subcommand("synth", "write a random-weight GGUF with a real model's shape (for benchmarks)");
  sub->add_option("--shape", a->opt.shape, "model shape: " + shapes)->required();
  sub->add_option("--type", a->opt.type, "weight type: " + types)->required();
  sub->add_option("--vocab-from", a->opt.vocab_from, "GGUF whose tokenizer metadata (and vocab size) is copied")
      ->required();
  sub->add_option("-o,--out,--output", a->opt.output, "GGUF file to write")->required();
  sub->add_option("-s,--seed", a->opt.seed, "random seed")->capture_default_str();
  sub->add_option("--layers", a->opt.layers, "blocks to write (0 = the shape's; fewer for small test files)")
      ->capture_default_str()->check(int_at_least(0));
  add_threads_option(sub, a->threads);
  sub->add_flag("-q,--quiet,--no-progress", a->quiet, "no progress line (none is drawn when stderr is not a terminal)");
  add_json_option(sub, a->json);
  sub->callback([a, &action] { action = [a] { return run(*a); }; });
}

}  // namespace kvslim::cli
