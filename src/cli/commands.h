#pragma once
// Each `kvslim` subcommand registers its options on the CLI11 app and returns the action to run.
#include <CLI/CLI.hpp>
#include <functional>

namespace kvslim::cli {

using Action = std::function<int()>;

/// Registration functions, one per subcommand file.
void add_generate(CLI::App& app, Action& action);
void add_presses(CLI::App& app, Action& action);
void add_synth(CLI::App& app, Action& action);
void add_attention_stats(CLI::App& app, Action& action);
void add_duo_calibrate(CLI::App& app, Action& action);
void add_qfilter_calibrate(CLI::App& app, Action& action);
void add_fastkvzip_train(CLI::App& app, Action& action);
void add_restorekv_train(CLI::App& app, Action& action);
void add_lukv_curve(CLI::App& app, Action& action);
void add_ea_stats(CLI::App& app, Action& action);
void add_kvzap_train(CLI::App& app, Action& action);
void add_latent_calibrate(CLI::App& app, Action& action);
void add_eval(CLI::App& app, Action& action);
void add_bench(CLI::App& app, Action& action);
void add_serve(CLI::App& app, Action& action);
void add_context(CLI::App& app, Action& action);

}  // namespace kvslim::cli
