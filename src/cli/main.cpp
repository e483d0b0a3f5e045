// kvslim: command-line entry point. Library errors become one line on stderr and exit code 1.
#include <cstdio>
#include <functional>
#include <new>
#include <string>
#include <system_error>
#include <vector>

#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/flag_names.h"
#include "cli/options.h"
#include "kvslim/error.h"
#include "kvslim/threads.h"

namespace {

// "" without an address-space limit; else the limit, which is the usual reason for running out.
std::string memory_limit_note() {
  const size_t lim = kvslim::address_space_limit();
  return lim ? fmt::format(" (address-space limit {} MiB, ulimit -v {})", lim >> 20, lim >> 10) : "";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kvslim: long-context LLM inference with KV-cache compression"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::function<std::string()>([] {
    std::string blas;
    try {
      blas = kvslim::blas_description();
    } catch (const std::exception& e) {  // OpenBLAS is loaded here, and may not fit a memory limit
      blas = e.what();
    }
    return "kvslim " KVSLIM_VERSION "\nBLAS: " + blas;
  }));
  kvslim::cli::Action action;
  kvslim::cli::add_generate(app, action);
  kvslim::cli::add_presses(app, action);
  kvslim::cli::add_synth(app, action);
  kvslim::cli::add_attention_stats(app, action);
  kvslim::cli::add_duo_calibrate(app, action);
  kvslim::cli::add_qfilter_calibrate(app, action);
  kvslim::cli::add_fastkvzip_train(app, action);
  kvslim::cli::add_restorekv_train(app, action);
  kvslim::cli::add_lukv_curve(app, action);
  kvslim::cli::add_ea_stats(app, action);
  kvslim::cli::add_kvzap_train(app, action);
  kvslim::cli::add_latent_calibrate(app, action);
  kvslim::cli::add_eval(app, action);
  kvslim::cli::add_bench(app, action);
  kvslim::cli::add_serve(app, action);
  kvslim::cli::add_context(app, action);
  // Subcommands that run a model take llama.cpp's GPU flags (and ignore them), as a command line
  // written for llama-cli or llama-bench runs unchanged.
  const auto runs_model = [](CLI::App* sub) {
    if (sub->get_option_no_throw("--model")) return true;
    for (const CLI::App* s : sub->get_subcommands([](CLI::App*) { return true; }))
      if (s->get_option_no_throw("--model")) return true;
    return false;
  };
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    if (!runs_model(sub)) continue;
    sub->footer(kvslim::cli::ignored_llama_flags_help());
    for (CLI::App* s : sub->get_subcommands([](CLI::App*) { return true; }))
      if (s->get_option_no_throw("--model")) s->footer(kvslim::cli::ignored_llama_flags_help());
  }
  try {
    // llama.cpp's -ctk/-ctv would otherwise reach CLI11 as "-c tk".
    std::vector<std::string> args = kvslim::cli::rewrite_llama_short_flags(argc, argv);
    // CLI11 reports a misspelt command as "A subcommand is required": name it and the commands.
    if (args.size() > 1 && !args[1].empty() && args[1][0] != '-') {
      std::string known;
      bool found = false;
      for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
        known += (known.empty() ? "" : ", ") + sub->get_name();
        found = found || sub->get_name() == args[1];
      }
      if (!found) {
        fmt::print(stderr, "error: unknown command '{}' (commands: {})\nRun with --help for more information.\n",
                   kvslim::printable(args[1], 60), known);
        return 1;
      }
    }
    if (args.size() > 1 && !args[1].empty() && args[1][0] != '-' && runs_model(app.get_subcommand(args[1]))) kvslim::cli::drop_ignored_llama_flags(args, stderr);
    std::vector<char*> ptrs;
    for (std::string& s : args) ptrs.push_back(s.data());
    app.parse(static_cast<int>(ptrs.size()), ptrs.data());
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0 as CLI11 prints them; a bad argument is an error like any other
    // (one "error:" line, exit 1) rather than CLI11's own format and exit codes (105, 106, ...).
    if (e.get_exit_code() == 0) return app.exit(e);
    std::string what = e.what();
    // CLI11's "Could not convert: --seed = abc" for a flag without a check of its own.
    const std::string prefix = "Could not convert: ";
    const size_t eq = what.find(" = ");
    if (dynamic_cast<const CLI::ConversionError*>(&e) && what.rfind(prefix, 0) == 0 && eq != std::string::npos)
      what = fmt::format("{}: '{}' is not a valid number", what.substr(prefix.size(), eq - prefix.size()),
                         kvslim::printable(what.substr(eq + 3), 60));
    fmt::print(stderr, "error: {}\nRun with --help for more information.\n", what);
    return 1;
  }
  try {
    return action ? action() : 0;
  } catch (const kvslim::Error& e) {
    // Library errors name parameters (n_ctx, kivi_bits); the user typed flags (-c, --kivi-bits).
    fmt::print(stderr, "error: {}\n", kvslim::cli::flags_in(e.what()));
    return 1;
  } catch (const std::bad_alloc&) {
    fmt::print(stderr, "error: out of memory{}\n", memory_limit_note());
    return 1;
  } catch (const std::system_error& e) {
    // A thread that cannot start (its stack does not fit under the limit) says EAGAIN.
    const bool memory = e.code() == std::errc::resource_unavailable_try_again || e.code() == std::errc::not_enough_memory;
    fmt::print(stderr, "error: {}{}\n", e.what(), memory ? memory_limit_note() : "");
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
}
