#pragma once
// Flags every subcommand shares, with one name, one meaning and one default across the CLI
// (llama.cpp's short forms and meanings where they overlap), and the stdout/stderr convention:
// generated text and results on stdout, everything else (statistics, warnings, progress) on stderr.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kvslim/model.h"
#include "kvslim/request.h"

namespace kvslim::cli {

/// "-m,--model FILE": required in every subcommand that runs a model (no default path).
CLI::Option* add_model_option(CLI::App* sub, std::string& model);

/// "-m,--model FILE" and the RoPE flags (add_rope_options) into `load`: for subcommands that run the model.
CLI::Option* add_model_option(CLI::App* sub, std::string& model, ModelLoadOptions& load);

/// llama.cpp's RoPE flags, with its meanings and defaults (0 or a negative value = the model's):
/// --rope-scaling {none,linear,yarn}, --rope-scale N (context scaling factor = 1 / freq scale),
/// --rope-freq-base N, --rope-freq-scale N, --yarn-orig-ctx N, --yarn-ext-factor N (-1: 1 for
/// yarn, else 0), --yarn-attn-factor N, --yarn-beta-slow N, --yarn-beta-fast N. A value out of
/// range is a CLI::ValidationError naming the flag and the value ("--rope-freq-base: -1 is not ...").
void add_rope_options(CLI::App* sub, RopeOverrides& rope);

/// "-t,--threads N": 0 (the default everywhere) = all cores.
CLI::Option* add_threads_option(CLI::App* sub, int& threads);
/// Sets the thread pool (and OpenBLAS) to `threads`, 0 meaning all cores; returns the count used.
int apply_threads(int threads);

/// How a chat template is chosen (generate and serve): a family by name, a template file, or the
/// model's; `jinja` renders a source template with the Jinja engine even when its family is known.
struct ChatTemplateArgs {
  std::string name;
  std::string file;
  bool jinja = false;
  /// Whether any of the flags was given (generate then applies a template without --chat).
  bool given() const { return !name.empty() || !file.empty() || jinja; }
};
/// "--chat-template NAME", "--chat-template-file FILE", "--jinja" (llama.cpp's names).
void add_chat_template_options(CLI::App* sub, ChatTemplateArgs& args);

/// A CLI11 check: the value is a finite number in [lo, hi]. CLI::Range, PositiveNumber and
/// NonNegativeNumber let "nan" (and "inf" for the latter two) through; this does not. The error
/// reads "--flag: value nan is not a finite number in [lo, hi]".
CLI::Validator finite_range(double lo, double hi);

/// A CLI11 check for integer flags: the value is a whole number in [lo, hi]. CLI::Range and
/// NonNegativeNumber say "Value abc not in range [0 - 1.79769e+308]" (every digit of the double
/// bound); this says "--flag: 'abc' is not an integer" or "--flag: -5 is not in [0, 1024]"
/// (or "... is below 1" when `hi` is the type's largest value).
CLI::Validator int_range(long long lo, long long hi);
/// int_range(lo, LLONG_MAX): "an integer >= lo".
CLI::Validator int_at_least(long long lo);

/// A byte size: a number with an optional unit, B (default), KiB/MiB/GiB (also K, M, G) or
/// KB/MB/GB (powers of 1000). Throws kvslim::Error naming `flag` and the value otherwise.
size_t parse_byte_size(const std::string& text, const std::string& flag);

/// Auto-budget flags (RequestOptions::auto_budget): "--target-kl NATS", "--kv-budget SIZE",
/// "--probe-tokens N". `budget_text` receives --kv-budget's text (parse it with parse_byte_size).
void add_auto_budget_options(CLI::App* sub, AutoBudget& opt, std::string& budget_text);

/// "--json FILE|-": a JSON summary of the run; "-" writes it to stdout, which then carries nothing else.
CLI::Option* add_json_option(CLI::App* sub, std::string& path);
/// Writes `j` (indented, newline-terminated) to `path`, or to stdout for "-". An unwritable file
/// -> kvslim::Error naming it.
void write_json(const std::string& path, const nlohmann::json& j);
/// The same as write_json above, keeping the keys in insertion order.
void write_json(const std::string& path, const nlohmann::ordered_json& j);
/// Fails early (kvslim::Error naming the file) when `path` cannot be written, so a long run does not
/// end in a write error. "" and "-" pass.
void check_json_output(const std::string& path);

/// While alive, everything written to stdout goes to stderr: the human-readable report of a
/// subcommand run with --json -, whose stdout must hold only the JSON. Inactive when `active` is false.
class StdoutToStderr {
 public:
  explicit StdoutToStderr(bool active);
  ~StdoutToStderr();
  StdoutToStderr(const StdoutToStderr&) = delete;
  StdoutToStderr& operator=(const StdoutToStderr&) = delete;

 private:
  int saved_ = -1;
};

/// "--no-progress": no progress line on stderr (there is none anyway when stderr is not a terminal).
CLI::Option* add_no_progress_flag(CLI::App* sub, bool& no_progress);

/// "--progress": progress lines on stderr even when it is not a terminal (whole lines, at most one a second).
CLI::Option* add_progress_flag(CLI::App* sub, bool& progress);

/// The command line with llama.cpp's multi-letter short flags (-ctk, -ctv, -cnv, -np, -sys), which CLI11 would
/// read as clusters of one-letter flags (-c tk), rewritten to their long names.
std::vector<std::string> rewrite_llama_short_flags(int argc, char** argv);

/// llama.cpp's flags that mean nothing on a CPU engine (-ngl, -fa, --mlock, --no-mmap, -sm, -mg, -ts,
/// --numa, -dev, -nkvo, -ot, ...; llama-bench's forms included): removed from `args` (from index 2,
/// the subcommand's arguments, up to a "--"), each with one "note:" line on `notes`, so that a command
/// line written for llama-cli or llama-bench runs. CLI11 would otherwise read "-fa" as "-f a" and
/// "-ngl 99" as "-n gl". A flag whose value is missing or not one llama.cpp accepts throws
/// CLI::ValidationError naming the flag and the value.
void drop_ignored_llama_flags(std::vector<std::string>& args, std::FILE* notes);
/// One line for --help listing the flags drop_ignored_llama_flags accepts.
std::string ignored_llama_flags_help();

}  // namespace kvslim::cli
