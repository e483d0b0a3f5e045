// `kvslim synth`: write a random-weight GGUF with a real model's shape, for benchmarks.
#include <thread>

#include <fmt/format.h>

#include "cli/commands.h"
#include "kernels/threads.h"
#include "kvslim/synth.h"

namespace kvslim::cli {

namespace {

struct SynthArgs {
  SynthOptions opt;
  int threads = 0;
  bool quiet = false;
};

int run(const SynthArgs& a) {
  set_num_threads(a.threads > 0 ? a.threads : std::max(1u, std::thread::hardware_concurrency()));
  SynthResult r = synth_model(a.opt, [&](size_t i, size_t n, const std::string& name, GGMLType t) {
    if (!a.quiet) fmt::print(stderr, "[{:4}/{:4}] {:<28} {}\n", i + 1, n, name, type_name(t));
  });
  std::string mix;
  for (auto& [type, count] : r.tensors_per_type) mix += fmt::format("{}{} {}", mix.empty() ? "" : ", ", count, type);
  fmt::print("wrote {}: {} ({} layers, vocab {}, {}), {} tensors ({}), {:.1f} MiB in {:.1f} s\n", a.opt.output,
             a.opt.shape, r.n_layer, r.n_vocab, a.opt.type, r.n_tensors, mix, r.file_bytes / 1048576.0, r.seconds);
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
  sub->add_option("-o,--output", a->opt.output, "GGUF file to write")->required();
  sub->add_option("-s,--seed", a->opt.seed, "random seed")->capture_default_str();
  sub->add_option("--layers", a->opt.layers, "blocks to write (0 = the shape's; fewer for small test files)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  sub->add_option("-t,--threads", a->threads, "threads (0 = all cores)")->capture_default_str()
      ->check(CLI::Range(0, 1024));
  sub->add_flag("-q,--quiet", a->quiet, "no per-tensor progress");
  sub->callback([a, &action] { action = [a] { return run(*a); }; });
}

}  // namespace kvslim::cli
