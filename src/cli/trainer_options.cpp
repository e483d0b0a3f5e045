// The flags shared by the subcommands that learn a file from text files (trainer_options.h).
#include "cli/trainer_options.h"

#include "cli/options.h"

namespace kvslim::cli {

CLI::Option* add_trainer_io_options(CLI::App* sub, TrainerArgs& a, const std::string& text_help,
                                    const std::string& out_help) {
  add_model_option(sub, a.model, a.load);
  CLI::Option* text = sub->add_option("-f,--file", a.text, text_help)->required()->expected(1, -1);
  sub->add_option("-o,--out", a.out, out_help)->required();
  return text;
}

void add_trainer_run_options(CLI::App* sub, TrainerArgs& a) {
  add_threads_option(sub, a.threads);
  add_json_option(sub, a.json);
  add_no_progress_flag(sub, a.no_progress);
}

}  // namespace kvslim::cli
