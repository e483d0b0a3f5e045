// `kvslim duo-calibrate`: fits DuoAttention's gates (one per layer and KV head; the paper's
// objective, linearised: press/duo_attention.h) on synthetic passkey prompts, or scores the heads
// by the earlier deviation heuristic (--method deviation), and saves the labels used by
// `--press duo_attention:labels=FILE`.
#include <cstdio>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/options.h"
#include "cli/progress.h"
#include "tools/tools.h"

namespace kvslim::cli {

namespace {

struct DuoArgs {
  std::string model;
  ModelLoadOptions load;  // --rope-* / --yarn-* over the file's RoPE settings
  std::string out, json;
  DuoCalibration cal;
  double head_ratio = 0.5;
  int threads = 0;
  bool no_progress = false;
};

int run(const DuoArgs& a) {
  if (a.out.empty()) throw Error("give --out LABELS.gguf");
  if (!(a.head_ratio >= 0 && a.head_ratio <= 1)) throw Error(fmt::format("--head-ratio {} is outside [0, 1]", a.head_ratio));
  check_json_output(a.json);
  apply_threads(a.threads);
  auto model = Model::load(a.model, a.load);
  Progress progress(!a.no_progress);
  DuoLabels labels = duo_calibrate(*model, a.cal, [&](int i, int n) {
    progress.update(static_cast<size_t>(i), static_cast<size_t>(n), "calibrating: passkey prompts");
  });
  progress.clear();
  labels.base_model = a.model;
  labels.save(a.out);
  const HParams& hp = model->hparams();
  auto streaming = labels.streaming(a.head_ratio);
  // The table is the result (stdout); with --json - stdout holds only the JSON.
  std::FILE* o = a.json == "-" ? stderr : stdout;
  fmt::print(o, "model       {} ({} layers x {} KV heads)\n", a.model, hp.n_layer, hp.n_head_kv);
  if (labels.method == "gates") {
    fmt::print(o, "prompts     {} passkey prompts of about {} tokens; question and answer tokens labelled\n",
               a.cal.samples, a.cal.length);
    fmt::print(o, "streaming   sinks {} + recent {}; score = gate fitted with reg {} (1 = full attention)\n",
               labels.sink, labels.recent, labels.reg);
  } else {
    fmt::print(o, "prompts     {} passkey prompts of about {} tokens; {} last queries compared\n", a.cal.samples,
               a.cal.length, a.cal.window);
    fmt::print(o, "streaming   sinks {} + recent {}; score = relative change of the head's output (higher = retrieval)\n",
               labels.sink, labels.recent);
  }
  fmt::print(o, "head ratio  {} -> S = streaming head, R = retrieval head\n\n", a.head_ratio);
  for (int l = 0; l < hp.n_layer; ++l) {
    fmt::print(o, "layer {:>3}:", l);
    for (int h = 0; h < hp.n_head_kv; ++h)
      fmt::print(o, " {:.3f}{}", labels.score[l][h], streaming[l][h] ? 'S' : 'R');
    fmt::print(o, "\n");
  }
  fmt::print(o, "\nlabels      {}\n", a.out);
  if (!a.json.empty()) {
    nlohmann::ordered_json j = {{"command", "duo-calibrate"}, {"model", a.model},   {"labels", a.out},
                                {"method", labels.method},    {"reg", labels.reg},
                                {"samples", a.cal.samples},   {"length", a.cal.length}, {"sink", labels.sink},
                                {"recent", labels.recent},    {"head_ratio", a.head_ratio}, {"score", labels.score},
                                {"streaming", streaming}};
    write_json(a.json, j);
  }
  return 0;
}

}  // namespace

void add_duo_calibrate(CLI::App& app, Action& action) {
  auto a = std::make_shared<DuoArgs>();
  auto* sub = app.add_subcommand("duo-calibrate",
                                 "fit DuoAttention's retrieval/streaming gates on synthetic passkey prompts");
  add_model_option(sub, a->model, a->load);
  sub->add_option("-o,--out", a->out, "labels file to write (GGUF)")->required();
  sub->add_option("--samples", a->cal.samples, "passkey prompts")->capture_default_str()->check(int_at_least(1));
  sub->add_option("--length", a->cal.length, "prompt length, tokens")->capture_default_str()->check(int_at_least(1));
  sub->add_option("--sink", a->cal.sink, "sink entries of a streaming head")->capture_default_str()
      ->check(int_at_least(0));
  sub->add_option("--recent", a->cal.recent, "recent entries of a streaming head")->capture_default_str()
      ->check(int_at_least(1));
  sub->add_option("--method", a->cal.method,
                  "gates: the paper's objective (mixed vs full final hidden states on the question and answer, L1 "
                  "on the gates), linearised and solved exactly; deviation: relative change of each head's output")
      ->capture_default_str()->check(CLI::IsMember({"gates", "deviation"}));
  sub->add_option("--reg", a->cal.reg, "L1 weight on the mean gate (method gates; the paper's 0.05)")
      ->capture_default_str()->check(finite_range(0.0, 1e6));
  sub->add_option("--window", a->cal.window, "last queries of each prompt compared (method deviation)")
      ->capture_default_str()->check(int_at_least(1));
  sub->add_option("--head-ratio", a->head_ratio, "fraction of heads shown as streaming in the summary")
      ->capture_default_str()->check(finite_range(0.0, 1.0));
  sub->add_option("-s,--seed", a->cal.seed, "random seed (pass keys)")->capture_default_str();
  add_threads_option(sub, a->threads);
  add_json_option(sub, a->json);
  add_no_progress_flag(sub, a->no_progress);
  sub->callback([a, &action] { action = [a] { return run(*a); }; });
}

}  // namespace kvslim::cli
