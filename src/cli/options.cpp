#include "cli/options.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "kernels/threads.h"
#include "kvslim/error.h"

namespace kvslim::cli {

CLI::Option* add_model_option(CLI::App* sub, std::string& model) {
  return sub->add_option("-m,--model", model, "GGUF model file (e.g. models/stories260K.gguf)")->required();
}

CLI::Option* add_threads_option(CLI::App* sub, int& threads) {
  return sub->add_option("-t,--threads", threads, "threads (0 = all cores)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1024));
}

int apply_threads(int threads) {
  const int n = threads > 0 ? threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  set_num_threads(n);
  return n;
}

void add_chat_template_options(CLI::App* sub, ChatTemplateArgs& args) {
  sub->add_option("--chat-template", args.name, "chat template family: llama2, llama3, chatml, qwen2, mistral "
                                                "(default: the model's tokenizer.chat_template)");
  sub->add_option("--chat-template-file", args.file, "read the chat template (Jinja source) from FILE")
      ->type_name("FILE");
  sub->add_flag("--jinja", args.jinja,
                "render the template with the Jinja engine (python3-jinja2) even when kvslim knows its family");
}

CLI::Validator finite_range(double lo, double hi) {
  const std::string range = fmt::format("[{}, {}]", lo, hi);
  return CLI::Validator(
      [lo, hi, range](std::string& s) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(s.c_str(), &end);
        if (s.empty() || *end != '\0' || !std::isfinite(v) || v < lo || v > hi)
          return fmt::format("value {} is not a finite number in {}", printable(s), range);
        return "";
      },
      "FINITE in " + range);
}

size_t parse_byte_size(const std::string& text, const std::string& flag) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  std::string unit(end ? end : "");
  while (!unit.empty() && unit.front() == ' ') unit.erase(unit.begin());
  static const std::pair<const char*, double> units[] = {
      {"", 1.0},           {"B", 1.0},           {"K", 1024.0},        {"KiB", 1024.0}, {"M", 1048576.0},
      {"MiB", 1048576.0},  {"G", 1073741824.0},  {"GiB", 1073741824.0}, {"KB", 1e3},     {"MB", 1e6},
      {"GB", 1e9}};
  double scale = 0;
  for (const auto& [name, s] : units)
    if (unit == name) scale = s;
  const double bytes = v * scale;
  if (text.empty() || end == text.c_str() || scale == 0 || !std::isfinite(bytes) || bytes < 1 || bytes > 1e18)
    throw Error(fmt::format("{} {}: not a byte size (a positive number with an optional unit B, KiB, MiB, GiB, "
                            "KB, MB, GB)",
                            flag, printable(text)));
  return static_cast<size_t>(bytes);
}

void add_auto_budget_options(CLI::App* sub, AutoBudget& opt, std::string& budget_text) {
  sub->add_option("--target-kl", opt.target_kl,
                  "auto-budget: the largest compression ratio whose KL(full || compressed) on probe tokens (the "
                  "question, or the context's last --probe-tokens) stays within NATS; replaces --compression-ratio. A "
                  "latent stage listing candidate bits (latent:...,k_bits=8/4,v_bits=8/4/2) also gets its bits "
                  "chosen: the pair and ratio with the fewest cache bytes within NATS")
      ->type_name("NATS")
      ->check(finite_range(0.0, 100.0));
  sub->add_option("--kv-budget", budget_text,
                  "auto-budget: the smallest compression ratio whose compressed cache fits SIZE (e.g. 3MiB, "
                  "500000); with --target-kl, the budget wins when both cannot hold")
      ->type_name("SIZE");
  sub->add_option("--probe-tokens", opt.probe_tokens,
                  "auto-budget: context tokens held out to measure the KL when there is no --question")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
}

CLI::Option* add_json_option(CLI::App* sub, std::string& path) {
  return sub->add_option("--json", path, "write a JSON summary to FILE, or to stdout with '-' (stdout then holds only the JSON)")
      ->type_name("FILE|-");
}

namespace {

void write_text(const std::string& path, const std::string& text) {
  if (path == "-") {
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
    return;
  }
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) throw Error(fmt::format("--json {}: cannot open for writing", path));
  f << text;
  f.close();
  if (!f) throw Error(fmt::format("--json {}: write failed", path));
}

}  // namespace

// Generated text cut mid-character (-n reached inside a multi-byte sequence) is not valid UTF-8:
// such bytes become U+FFFD rather than an exception after the whole run.
void write_json(const std::string& path, const nlohmann::json& j) {
  write_text(path, j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
}
void write_json(const std::string& path, const nlohmann::ordered_json& j) {
  write_text(path, j.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n");
}

void check_json_output(const std::string& path) {
  if (path.empty() || path == "-") return;
  std::ofstream f(path, std::ios::binary | std::ios::app);
  if (!f) throw Error(fmt::format("--json {}: cannot open for writing", path));
}

StdoutToStderr::StdoutToStderr(bool active) {
  if (!active) return;
  std::fflush(stdout);
  saved_ = dup(STDOUT_FILENO);
  if (saved_ >= 0) dup2(STDERR_FILENO, STDOUT_FILENO);
}

StdoutToStderr::~StdoutToStderr() {
  if (saved_ < 0) return;
  std::fflush(stdout);
  dup2(saved_, STDOUT_FILENO);
  close(saved_);
}

CLI::Option* add_no_progress_flag(CLI::App* sub, bool& no_progress) {
  return sub->add_flag("--no-progress", no_progress,
                       "no progress line on stderr (none is drawn when stderr is not a terminal)");
}

std::vector<std::string> rewrite_llama_short_flags(int argc, char** argv) {
  std::vector<std::string> out(argv, argv + argc);
  for (size_t i = 1; i < out.size(); ++i) {
    if (out[i] == "--") break;
    if (out[i] == "-ctk") out[i] = "--cache-type-k";
    else if (out[i] == "-ctv") out[i] = "--cache-type-v";
    else if (out[i] == "-cnv") out[i] = "--chat";
    else if (out[i] == "-np") out[i] = "--parallel";
  }
  return out;
}

}  // namespace kvslim::cli
