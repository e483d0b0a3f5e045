// `kvslim context build|info`: compress a context once into a file that `kvslim generate --context`
// answers questions from without prefilling it again (kvslim/context.h).
#include <cstdio>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/cache_options.h"
#include "cli/commands.h"
#include "cli/context_size.h"
#include "cli/memory_estimate.h"
#include "cli/options.h"
#include "cli/progress.h"
#include "kvslim/press.h"
#include "kvslim/context.h"
#include "tools/tools.h"

namespace kvslim::cli {

namespace {

struct BuildArgs {
  std::string model, prompt, prompt_file, output;
  ModelLoadOptions load;  // --rope-* / --yarn-* over the file's RoPE settings
  bool prompt_given = false, file_given = false, ratio_given = false, chunk_given = false;
  std::string press = "none";
  double ratio = 0.0;
  int threads = 0, ctx = 0, chunk_size = 0;
  std::string cache_type_k = "f16", cache_type_v = "f16";
  KVQuantOptions kv_quant;
  bool no_progress = false;
  bool progress_lines = false, no_memory_check = false;
  std::string json;
};

std::string human(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB"};
  int u = 0;
  while (b >= 1024 && u < 3) b /= 1024, ++u;
  return fmt::format("{:.2f} {}", b, units[u]);
}

nlohmann::ordered_json info_json(const ContextInfo& i) {
  return {{"format_version", i.format_version},
          {"arch", i.arch},
          {"fingerprint", fmt::format("{:016x}", i.fingerprint)},
          {"vocab_digest", fmt::format("{:016x}", i.vocab_digest)},
          {"tensor_digest", fmt::format("{:016x}", i.tensor_digest)},
          {"press", i.press},
          {"cache_type", i.cache_type},
          {"chunk_size", i.chunk_size},
          {"context_tokens", i.context_tokens},
          {"entries_kept", i.entries_kept},
          {"entries_total", i.entries_total},
          {"compression_ratio", i.compression_ratio()},
          {"kv_bytes", i.kv_bytes},
          {"shared_bytes", i.shared_bytes},
          {"full_f16_bytes", i.full_f16_bytes},
          {"memory_ratio", i.memory_ratio()},
          {"file_bytes", i.file_bytes},
          {"peak_kv_bytes", i.peak_kv_bytes},
          {"prefill_seconds", i.prefill_seconds},
          {"press_seconds", i.press_seconds},
          {"press_report", i.press_report}};
}

void print_info(std::FILE* out, const ContextInfo& i) {
  fmt::print(out, "format version   {}\n", i.format_version);
  fmt::print(out, "model            {} ({} layers, {} KV heads, head_dim {}, vocabulary {})\n", i.arch, i.n_layer,
             i.n_head_kv, i.head_dim, i.n_vocab);
  fmt::print(out, "fingerprint      {:016x} (vocabulary {:016x}, tensor data {:016x})\n", i.fingerprint,
             i.vocab_digest, i.tensor_digest);
  fmt::print(out, "press            {}{}\n", i.press, i.chunk_size ? fmt::format(" (chunks of {} tokens)", i.chunk_size) : "");
  fmt::print(out, "KV cache type    {}\n", i.cache_type);
  fmt::print(out, "tokens           {}\n", i.context_tokens);
  fmt::print(out, "entries kept     {} / {} ({:.1f}% kept, compression ratio {:.3f})\n", i.entries_kept,
             i.entries_total, 100.0 * i.entries_kept / std::max<size_t>(1, i.entries_total), i.compression_ratio());
  fmt::print(out, "KV bytes         {} ({} B; full f16 cache {} B; memory ratio {:.4f})\n", human(i.kv_bytes), i.kv_bytes,
             i.full_f16_bytes, i.memory_ratio());
  if (i.shared_bytes) fmt::print(out, "shared bases     {} B (stored in the file)\n", i.shared_bytes);
  if (i.file_bytes)
    fmt::print(out, "file bytes       {} ({} B; {:.4f} of a full f16 cache)\n", human(i.file_bytes), i.file_bytes,
               double(i.file_bytes) / std::max<size_t>(1, i.full_f16_bytes));
  fmt::print(out, "build            prefill {:.3f} s, press {:.3f} s, peak {} B\n", i.prefill_seconds, i.press_seconds,
             i.peak_kv_bytes);
  if (!i.press_report.empty()) fmt::print(out, "press report     {}\n", i.press_report);
}

int run_build(const BuildArgs& a) {
  if (a.prompt_given && a.file_given) throw Error("give the context with either -p TEXT or -f FILE, not both");
  if (!a.prompt_given && !a.file_given) throw Error("no context: give it with -f FILE or -p TEXT");
  check_ratio(a.ratio, "--compression-ratio");
  if (a.press == "none" && (a.ratio_given || a.chunk_given))
    throw Error(fmt::format("{} needs a press: add --press NAME (see `kvslim presses`)",
                            a.ratio_given ? "--compression-ratio" : "--chunk-size"));
  bool ratio_used = false;
  // Checked before the model loads: the spec, the ratio's use, and whether the press can be stored.
  std::unique_ptr<Press> press = make_press(a.press, a.ratio, ratio_used);
  if (a.ratio_given) check_ratio_used(a.press, a.ratio, ratio_used, "--compression-ratio");
  const std::string why = press->storage_refusal();
  if (!why.empty()) throw Error(fmt::format("press {} cannot be stored as a context: {}", press->describe(), why));
  check_json_output(a.json);
  const std::string text = a.file_given ? read_text_file(a.prompt_file, "-f") : a.prompt;
  apply_threads(a.threads);
  const size_t available = available_memory();  // before the model takes its share
  auto model = Model::load(a.model, a.load);
  warn_context_size(*model, a.ctx);
  ContextOptions opt;
  opt.press = a.press;
  opt.ratio = a.ratio;
  opt.chunk_size = a.chunk_size;
  opt.session.n_ctx = a.ctx;
  opt.session.key_codec = parse_codec(a.cache_type_k);
  opt.session.value_codec = parse_codec(a.cache_type_v);
  opt.session.kv_quant = a.kv_quant;
  const Tokenizer& tok = model->tokenizer();
  const size_t total = tok.encode(text, tok.add_bos_default(), false).size();
  const size_t n_ctx = static_cast<size_t>(a.ctx > 0 ? a.ctx : model->hparams().n_ctx_train);
  report_memory(estimate_memory(*model, opt.session.key_codec, opt.session.value_codec, opt.session.kv_quant,
                                kv_entries(press.get(), total, 0, a.chunk_size, n_ctx), opt.session.batch),
                available, !a.no_memory_check);
  Progress progress(!a.no_progress, a.progress_lines);
  if (progress.active())
    opt.session.on_batch_bytes = [&progress, total](int32_t pos, size_t kv_bytes) {
      progress.prefill(static_cast<size_t>(pos), total, kv_bytes);
    };
  Context c = Context::build(*model, text, opt);
  progress.clear();
  c.save(a.output);
  const ContextInfo i = c.info();
  std::FILE* out = a.json == "-" ? stderr : stdout;
  fmt::print(out, "wrote {}\n", a.output);
  print_info(out, i);
  if (!a.json.empty()) {
    nlohmann::ordered_json j = info_json(i);
    j["command"] = "context build";
    j["path"] = a.output;
    write_json(a.json, j);
  }
  return 0;
}

}  // namespace

void add_context(CLI::App& app, Action& action) {
  auto* sub = app.add_subcommand("context",
                                 "stored compressed contexts: compress a document once (build), answer questions "
                                 "from the file with `kvslim generate --context FILE --question ...`");
  sub->require_subcommand(1);

  auto a = std::make_shared<BuildArgs>();
  auto* build = sub->add_subcommand(
      "build", "prefill a context, compress it with a press exactly as `generate -f DOC --question Q` does before "
               "the question, and write it to a file");
  add_model_option(build, a->model, a->load);
  auto* prompt_opt = build->add_option("-p,--prompt", a->prompt, "context text");
  auto* file_opt = build->add_option("-f,--file", a->prompt_file, "read the context from a file ('-' = standard input)");
  build->add_option("-o,--out", a->output, "the context file to write (written atomically)")->required();
  build->add_option("--press", a->press, "press spec: NAME[:key=value,...] (see `kvslim presses`: the presses that "
                                         "can be stored)")
      ->capture_default_str();
  auto* ratio_opt = build->add_option("--compression-ratio", a->ratio,
                                      "fraction of context entries the press removes, in [0, 1) (needs --press)")
                        ->capture_default_str();
  auto* chunk_opt = build->add_option("--chunk-size", a->chunk_size,
                                      "compress after every chunk of this many tokens (0 = once; needs --press)")
                        ->capture_default_str()
                        ->check(CLI::NonNegativeNumber);
  add_threads_option(build, a->threads);
  build->add_option("-c,--ctx-size", a->ctx, "context size in tokens (0 = the model's)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  add_cache_options(build, a->cache_type_k, a->cache_type_v, a->kv_quant);
  add_json_option(build, a->json);
  add_no_progress_flag(build, a->no_progress);
  add_progress_flag(build, a->progress_lines);
  add_memory_check_flag(build, a->no_memory_check);
  build->callback([a, &action, prompt_opt, file_opt, ratio_opt, chunk_opt] {
    a->prompt_given = prompt_opt->count() > 0;
    a->file_given = file_opt->count() > 0;
    a->ratio_given = ratio_opt->count() > 0;
    a->chunk_given = chunk_opt->count() > 0;
    action = [a] { return run_build(*a); };
  });

  auto path = std::make_shared<std::string>();
  auto json = std::make_shared<std::string>();
  auto* info = sub->add_subcommand("info", "check a context file (format, checksum, payload) and print what it holds");
  info->add_option("file", *path, "context file")->required();
  add_json_option(info, *json);
  info->callback([path, json, &action] {
    action = [path, json] {
      check_json_output(*json);
      const ContextInfo i = Context::inspect(*path);
      if (*json != "-") print_info(stdout, i);
      if (!json->empty()) {
        nlohmann::ordered_json j = info_json(i);
        j["command"] = "context info";
        j["path"] = *path;
        write_json(*json, j);
      }
      return 0;
    };
  });
}

}  // namespace kvslim::cli
