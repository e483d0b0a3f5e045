#include "cli/options.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "kvslim/threads.h"
#include "kvslim/error.h"

namespace kvslim::cli {

CLI::Option* add_model_option(CLI::App* sub, std::string& model) {
  return sub->add_option("-m,--model", model, "GGUF model file (e.g. models/stories260K.gguf)")->required();
}

CLI::Option* add_model_option(CLI::App* sub, std::string& model, ModelLoadOptions& load) {
  CLI::Option* o = add_model_option(sub, model);
  add_rope_options(sub, load.rope);
  return o;
}

namespace {

// A RoPE flag's value: a finite number; `model_value(v)` says it means "the model's" (llama.cpp's
// 0 or negative defaults); otherwise it must lie in (lo, hi].
CLI::Validator rope_value(double lo, double hi, const char* what, bool (*model_value)(double)) {
  return CLI::Validator(
      [=](std::string& s) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(s.c_str(), &end);
        const bool number = !s.empty() && *end == '\0' && std::isfinite(v);
        if (number && (model_value(v) || (v > lo && v <= hi))) return "";
        return fmt::format("{} is not {}", printable(s, 40), what);
      },
      "");
}

bool zero(double v) { return v == 0; }
bool negative(double v) { return v < 0; }
bool never(double) { return false; }

}  // namespace

void add_rope_options(CLI::App* sub, RopeOverrides& rope) {
  const std::string group = "RoPE (llama.cpp's flags; default: the model's metadata)";
  sub->add_option_function<std::string>(
         "--rope-scaling",
         [&rope](const std::string& v) {
           rope.scaling = v == "none" ? RopeScaling::None : v == "yarn" ? RopeScaling::Yarn : RopeScaling::Linear;
         },
         "RoPE frequency scaling method: none, linear or yarn (default: the model's rope.scaling.type, else linear)")
      ->type_name("{none,linear,yarn}")
      ->check(CLI::IsMember({"none", "linear", "yarn"}).description(""))
      ->group(group);
  auto* scale = sub->add_option_function<double>(
                       "--rope-scale", [&rope](double v) { rope.freq_scale = static_cast<float>(1.0 / v); },
                       "RoPE context scaling factor: expands the context by a factor of N (= 1 / --rope-freq-scale)")
                    ->type_name("N")
                    ->check(rope_value(1e-6, 1e6, "a finite factor in (0, 1e6]", never))
                    ->group(group);
  sub->add_option_function<double>(
         "--rope-freq-base",
         [&rope](double v) {
           if (v != 0) rope.freq_base = static_cast<float>(v);
         },
         "RoPE base frequency, used by NTK-aware scaling (0 = the model's rope.freq_base)")
      ->type_name("N")
                    ->check(rope_value(1.0, 3.4e38, "a finite base > 1 (0 = the model's)", zero))
      ->group(group);
  sub->add_option_function<double>(
         "--rope-freq-scale",
         [&rope](double v) {
           if (v != 0) rope.freq_scale = static_cast<float>(v);
         },
         "RoPE frequency scaling factor: expands the context by a factor of 1/N (0 = the model's)")
      ->type_name("N")
                    ->check(rope_value(1e-6, 1e6, "a finite scale in (0, 1e6] (0 = the model's)", zero))
      ->excludes(scale)
      ->group(group);
  sub->add_option_function<double>(
         "--yarn-orig-ctx",
         [&rope](double v) {
           if (v != 0) rope.yarn_orig_ctx = static_cast<int>(v);
         },
         "YaRN: original context size of the model in tokens (0 = rope.scaling.original_context_length, else the "
         "training context)")
      ->type_name("N")
      ->check(int_range(0, 1 << 24))
      ->group(group);
  sub->add_option_function<double>(
         "--yarn-ext-factor",
         [&rope](double v) {
           if (v >= 0) rope.yarn_ext_factor = static_cast<float>(v);
         },
         "YaRN: extrapolation mix factor (-1 = 1 with yarn scaling, else 0; 0.0 = full interpolation)")
      ->type_name("N")
                    ->check(rope_value(0.0, 1e3, "a finite factor in [0, 1e3] (negative = by the scaling type)",
                         [](double v) { return v <= 0; }))
      ->group(group);
  sub->add_option_function<double>(
         "--yarn-attn-factor",
         [&rope](double v) {
           if (v > 0) rope.yarn_attn_factor = static_cast<float>(v);
         },
         "YaRN: scale of the attention magnitude, multiplying rotated queries and keys (default 1; negative = the "
         "model's)")
      ->type_name("N")
                    ->check(rope_value(0.0, 1e3, "a finite factor in (0, 1e3] (negative = the model's)", negative))
      ->group(group);
  sub->add_option_function<double>(
         "--yarn-beta-slow",
         [&rope](double v) {
           if (v > 0) rope.yarn_beta_slow = static_cast<float>(v);
         },
         "YaRN: high correction dim or alpha (default 1; negative = the model's)")
      ->type_name("N")
                    ->check(rope_value(0.0, 1e6, "a finite beta in (0, 1e6] (negative = the model's)", negative))
      ->group(group);
  sub->add_option_function<double>(
         "--yarn-beta-fast",
         [&rope](double v) {
           if (v > 0) rope.yarn_beta_fast = static_cast<float>(v);
         },
         "YaRN: low correction dim or beta (default 32; negative = the model's)")
      ->type_name("N")
                    ->check(rope_value(0.0, 1e6, "a finite beta in (0, 1e6] (negative = the model's)", negative))
      ->group(group);
}

CLI::Option* add_threads_option(CLI::App* sub, int& threads) {
  return sub->add_option("-t,--threads", threads, "threads (0 = all cores)")
      ->capture_default_str()
      ->check(int_range(0, 1024));
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

CLI::Validator int_range(long long lo, long long hi) {
  const std::string range = hi == LLONG_MAX ? fmt::format("an integer >= {}", lo) : fmt::format("[{}, {}]", lo, hi);
  return CLI::Validator(
      [lo, hi, range](std::string& s) -> std::string {
        errno = 0;
        char* end = nullptr;
        const long long v = std::strtoll(s.c_str(), &end, 10);
        if (s.empty() || *end != '\0' || end == s.c_str() || std::isspace(static_cast<unsigned char>(s[0])))
          return fmt::format("'{}' is not an integer", printable(s, 40));
        if (errno == ERANGE || v < lo || v > hi)
          return hi == LLONG_MAX ? fmt::format("{} is below {}", printable(s, 40), lo)
                                 : fmt::format("{} is not in {}", printable(s, 40), range);
        return "";
      },
      hi == LLONG_MAX ? fmt::format("INT>={}", lo) : fmt::format("INT in {}", range));
}

CLI::Validator int_at_least(long long lo) { return int_range(lo, LLONG_MAX); }

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
      ->check(int_range(1, 1 << 20));
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

CLI::Option* add_progress_flag(CLI::App* sub, bool& progress) {
  return sub->add_flag("--progress", progress,
                       "progress lines on stderr even when it is not a terminal (a log): tokens done, tokens/s, "
                       "elapsed, time left and KV bytes, at most one line a second");
}

std::vector<std::string> rewrite_llama_short_flags(int argc, char** argv) {
  std::vector<std::string> out(argv, argv + argc);
  for (size_t i = 1; i < out.size(); ++i) {
    if (out[i] == "--") break;
    if (out[i] == "-ctk") out[i] = "--cache-type-k";
    else if (out[i] == "-ctv") out[i] = "--cache-type-v";
    else if (out[i] == "-cnv") out[i] = "--chat";
    else if (out[i] == "-np") out[i] = "--parallel";
    else if (out[i] == "-sys") out[i] = "--system-prompt";
  }
  return out;
}

namespace {

bool one_of(const std::string& v, std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (v == n) return true;
  return false;
}

// Every comma-separated item of `v` passes `ok` (llama-bench takes lists: -ngl 0,99, -fa 0,1).
template <class F>
bool each_item(const std::string& v, F ok) {
  if (v.empty()) return false;
  size_t at = 0;
  while (true) {
    const size_t comma = v.find(',', at);
    if (!ok(v.substr(at, comma == std::string::npos ? std::string::npos : comma - at))) return false;
    if (comma == std::string::npos) return true;
    at = comma + 1;
  }
}

bool is_int(const std::string& v) {
  if (v.empty()) return false;
  for (size_t i = 0; i < v.size(); ++i)
    if (!std::isdigit(static_cast<unsigned char>(v[i])) && !(i == 0 && v[i] == '-' && v.size() > 1)) return false;
  return true;
}

enum class Takes { Nothing, Value, MaybeValue };

struct IgnoredFlag {
  std::vector<const char*> names;
  Takes takes;
  const char* values;               // what llama.cpp accepts, for the error message
  bool (*ok)(const std::string&);   // nullptr: any value that is not a flag
  const char* why;
};

const std::vector<IgnoredFlag>& ignored_flags() {
  static const std::vector<IgnoredFlag> flags = {
      {{"-ngl", "--gpu-layers", "--n-gpu-layers"}, Takes::Value, "a number of layers, auto or all",
       [](const std::string& v) { return each_item(v, [](const std::string& x) { return is_int(x) || one_of(x, {"auto", "all"}); }); },
       "kvslim runs on the CPU; no layers are offloaded"},
      {{"-ngld", "--gpu-layers-draft", "--n-gpu-layers-draft"}, Takes::Value, "a number of layers, auto or all",
       [](const std::string& v) { return is_int(v) || one_of(v, {"auto", "all"}); }, "kvslim runs on the CPU; no layers are offloaded"},
      {{"-fa", "--flash-attn"}, Takes::MaybeValue, "on, off, auto, 1 or 0",
       [](const std::string& v) {
         return each_item(v, [](const std::string& x) { return one_of(x, {"on", "off", "auto", "1", "0", "true", "false", "enabled", "disabled"}); });
       },
       "kvslim runs on the CPU; its attention kernel follows the CPU's instruction set"},
      {{"--mlock"}, Takes::Nothing, "", nullptr, "kvslim does not lock the model's pages in memory"},
      {{"--no-mmap"}, Takes::Nothing, "", nullptr, "kvslim always memory-maps the model file"},
      {{"-mmp", "--mmap"}, Takes::MaybeValue, "1 or 0",
       [](const std::string& v) { return each_item(v, [](const std::string& x) { return one_of(x, {"0", "1"}); }); },
       "kvslim always memory-maps the model file"},
      {{"-sm", "--split-mode"}, Takes::Value, "none, layer or row",
       [](const std::string& v) { return each_item(v, [](const std::string& x) { return one_of(x, {"none", "layer", "row"}); }); },
       "kvslim runs on the CPU; the model is not split across GPUs"},
      {{"-mg", "--main-gpu"}, Takes::Value, "a GPU index",
       [](const std::string& v) { return each_item(v, is_int); }, "kvslim runs on the CPU; there is no GPU to choose"},
      {{"-ts", "--tensor-split"}, Takes::Value, "proportions such as 3,1",
       [](const std::string& v) {
         return !v.empty() && v.find_first_not_of("0123456789.,/;") == std::string::npos;
       },
       "kvslim runs on the CPU; the model is not split across GPUs"},
      {{"--numa"}, Takes::Value, "distribute, isolate or numactl",
       [](const std::string& v) { return each_item(v, [](const std::string& x) { return one_of(x, {"distribute", "isolate", "numactl"}); }); },
       "kvslim does not place threads or memory by NUMA node"},
      {{"-dev", "--device"}, Takes::Value, "a device list", nullptr, "kvslim runs on the CPU, its only device"},
      {{"-nkvo", "--no-kv-offload"}, Takes::MaybeValue, "1 or 0",
       [](const std::string& v) { return each_item(v, [](const std::string& x) { return one_of(x, {"0", "1"}); }); },
       "kvslim runs on the CPU; the KV cache is in host memory"},
      {{"-kvo", "--kv-offload"}, Takes::Nothing, "", nullptr, "kvslim runs on the CPU; the KV cache is in host memory"},
      {{"--no-op-offload"}, Takes::MaybeValue, "1 or 0",
       [](const std::string& v) { return each_item(v, [](const std::string& x) { return one_of(x, {"0", "1"}); }); },
       "kvslim runs on the CPU; no operation is offloaded"},
      {{"-ot", "--override-tensor"}, Takes::Value, "PATTERN=BUFFER_TYPE,...", nullptr,
       "kvslim runs on the CPU; every tensor is in host memory"},
      {{"-cmoe", "--cpu-moe"}, Takes::Nothing, "", nullptr, "kvslim runs every expert on the CPU"},
      {{"-ncmoe", "--n-cpu-moe"}, Takes::Value, "a number of layers", [](const std::string& v) { return is_int(v); },
       "kvslim runs every expert on the CPU"},
      {{"--rpc"}, Takes::Value, "a server list", nullptr, "kvslim runs on the local CPU only"},
  };
  return flags;
}

}  // namespace

void drop_ignored_llama_flags(std::vector<std::string>& args, std::FILE* notes) {
  std::vector<std::string> out(args.begin(), args.begin() + std::min<size_t>(2, args.size()));
  for (size_t i = out.size(); i < args.size(); ++i) {
    if (args[i] == "--") {
      out.insert(out.end(), args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
      break;
    }
    // --name=value, as llama.cpp's long flags are also written
    std::string name = args[i], value;
    bool inline_value = false;
    if (name.rfind("--", 0) == 0 && name.find('=') != std::string::npos) {
      value = name.substr(name.find('=') + 1);
      name = name.substr(0, name.find('='));
      inline_value = true;
    }
    const IgnoredFlag* flag = nullptr;
    for (const IgnoredFlag& f : ignored_flags())
      for (const char* n : f.names)
        if (name == n) flag = &f;
    if (!flag) {
      out.push_back(args[i]);
      continue;
    }
    const bool next = i + 1 < args.size();
    const auto valid = [flag](const std::string& v) {
      return flag->ok ? flag->ok(v) : !v.empty() && v[0] != '-';
    };
    if (flag->takes == Takes::Nothing && inline_value)
      throw CLI::ValidationError(name, fmt::format("takes no value ('{}' given)", printable(value, 40)));
    if (!inline_value && flag->takes == Takes::Value) {
      if (!next) throw CLI::ValidationError(name, fmt::format("needs a value ({})", flag->values));
      value = args[++i];
      inline_value = true;
    } else if (!inline_value && flag->takes == Takes::MaybeValue && next && valid(args[i + 1])) {
      value = args[++i];
      inline_value = true;
    }
    if (inline_value && !valid(value))
      throw CLI::ValidationError(name, fmt::format("'{}' is not {}", printable(value, 40), flag->values));
    if (notes)
      fmt::print(notes, "note: {}{} ignored: {}\n", name,
                 inline_value ? " " + printable(value, 40) : std::string(), flag->why);
  }
  args = std::move(out);
}

std::string ignored_llama_flags_help() {
  std::string names;
  for (const IgnoredFlag& f : ignored_flags()) names += (names.empty() ? "" : ", ") + std::string(f.names[0]);
  return "llama.cpp's GPU and memory-placement flags (" + names +
         ", and their long names) are accepted and ignored, with a note on stderr.\n";
}

}  // namespace kvslim::cli
