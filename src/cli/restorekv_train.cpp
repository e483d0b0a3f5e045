// `kvslim restorekv-train`: fits RestoreKV's restore embeddings and LoRA adapter (arXiv
// 2608.01247) to the user's model by self-distillation on a text and saves them for
// `--press restorekv:file=FILE` (kvpress downloads the authors' adapters for two 8B models).
// The work is the library's (src/train/restorekv_train.h); this file parses flags, calls and prints.
#include <cstdio>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/options.h"
#include "cli/progress.h"
#include "cli/trainer_options.h"
#include "tools/tools.h"

namespace kvslim::cli {

namespace {

struct RestoreKVArgs : TrainerArgs {
  RestoreKVTrainOptions opt;
};

int run(RestoreKVArgs a) {
  check_json_output(a.json);
  apply_threads(a.threads);
  auto model = Model::load(a.model, a.load);
  const std::vector<Token> tokens = model->tokenizer().encode(read_text_file(a.text.front(), "-f"), false, false);
  Progress progress(!a.no_progress);
  RestoreKVTrainReport r;
  const double t0 = steady_seconds();
  RestoreKVWeights w = train_restorekv(*model, tokens, a.opt, &r, [&](int s, double) {
    progress.update(static_cast<size_t>(s), static_cast<size_t>(a.opt.steps), "restorekv: Adam steps");
  });
  progress.clear();
  const double secs = steady_seconds() - t0;
  w.save(a.out, a.model);
  std::FILE* o = a.json == "-" ? stderr : stdout;
  fmt::print(o, "model       {}\n", a.model);
  fmt::print(o, "data        {} tokens: {} training and {} held-out samples of {} context + {} continuation tokens\n",
             tokens.size(), r.train_samples, r.held_out_samples, a.opt.context, a.opt.continuation);
  fmt::print(o, "student     compressed at ratio {} (+ {} restore tokens, LoRA rank {} alpha {}); {} Adam steps, lr {}\n",
             a.opt.ratio, a.opt.n_tokens, a.opt.rank, a.opt.alpha, a.opt.steps, a.opt.lr);
  fmt::print(o, "held out    KL(full || student) per continuation token {:.5f} -> {:.5f} nats\n", r.held_out_kl_before,
             r.held_out_kl_after);
  fmt::print(o, "training    KL first step {:.5f}, last step {:.5f}; {:.1f} s\n", r.train_kl_first, r.train_kl_last, secs);
  fmt::print(o, "file        {}\n", a.out);
  if (!a.json.empty())
    write_json(a.json, nlohmann::ordered_json{{"command", "restorekv-train"},
                                              {"model", a.model},
                                              {"file", a.out},
                                              {"train_samples", r.train_samples},
                                              {"held_out_samples", r.held_out_samples},
                                              {"held_out_kl_before", r.held_out_kl_before},
                                              {"held_out_kl_after", r.held_out_kl_after},
                                              {"train_kl_first", r.train_kl_first},
                                              {"train_kl_last", r.train_kl_last},
                                              {"seconds", secs}});
  return 0;
}

}  // namespace

void add_restorekv_train(CLI::App& app, Action& action) {
  auto a = std::make_shared<RestoreKVArgs>();
  auto* sub = app.add_subcommand("restorekv-train",
                                 "fit RestoreKV's restore embeddings and LoRA adapter by self-distillation and save them");
  add_trainer_io_options(sub, *a, "text file to learn from", "RestoreKV file to write (GGUF)")->expected(1);
  sub->add_option("--tokens", a->opt.n_tokens, "restore tokens R")->capture_default_str()->check(int_range(1, 1024));
  sub->add_option("--rank", a->opt.rank, "LoRA rank")->capture_default_str()->check(int_range(1, 1024));
  sub->add_option("--alpha", a->opt.alpha, "LoRA alpha")->capture_default_str()->check(finite_range(1e-6, 1e6));
  sub->add_option("--ratio", a->opt.ratio, "compression ratio of the student")->capture_default_str()
      ->check(finite_range(1e-6, 0.999999));
  sub->add_option("--context", a->opt.context, "context tokens per sample")->capture_default_str()
      ->check(int_range(2, 1 << 20));
  sub->add_option("--continuation", a->opt.continuation, "continuation tokens per sample (matched distributions)")
      ->capture_default_str()->check(int_range(1, 1 << 20));
  sub->add_option("--steps", a->opt.steps, "Adam steps (one sample each)")->capture_default_str()
      ->check(int_range(0, 1 << 30));
  sub->add_option("--lr", a->opt.lr, "Adam learning rate")->capture_default_str()->check(finite_range(1e-12, 100.0));
  sub->add_option("--holdout", a->opt.holdout, "share of samples held out")->capture_default_str()
      ->check(finite_range(1e-6, 0.999999));
  sub->add_option("-s,--seed", a->opt.seed, "random seed (initialisation)")->capture_default_str();
  add_trainer_run_options(sub, *a);
  sub->callback([a, &action] { action = [a] { return run(*a); }; });
}

}  // namespace kvslim::cli
