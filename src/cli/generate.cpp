// `kvslim generate`: prefill, compress with a press, append the question, decode, and report
// what the press kept and the cache's memory.
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "cli/cache_options.h"
#include "cli/commands.h"
#include "cli/context_size.h"
#include "kernels/threads.h"
#include "kvslim/generate.h"

namespace kvslim::cli {

namespace {

struct GenerateArgs {
  std::string model = "models/stories260K.gguf";
  std::string prompt, prompt_file, question;
  bool prompt_given = false, file_given = false;  // -p "" is an empty prompt, not a missing one
  int n_predict = 64;
  std::string press = "none";
  double ratio = 0.0;
  float temp = 0.8f;
  int top_k = 40;
  float top_p = 0.95f;
  uint64_t seed = 42;
  int threads = 2;
  int ctx = 0;
  int chunk_size = 0;
  std::string cache_type_k = "f16", cache_type_v = "f16";
  KVQuantOptions kv_quant;
};

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(fmt::format("{}: cannot open prompt file", path));
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB"};
  int u = 0;
  while (b >= 1024 && u < 3) b /= 1024, ++u;
  return fmt::format("{:.2f} {}", b, units[u]);
}

int run(const GenerateArgs& a) {
  if (a.prompt_given && a.file_given) throw Error("give the context with either -p TEXT or -f FILE, not both");
  if (!a.prompt_given && !a.file_given) throw Error("no prompt: give the context with -p TEXT or -f FILE");
  check_ratio(a.ratio, "--compression-ratio");
  std::unique_ptr<Press> press = make_press(a.press, a.ratio);
  set_num_threads(a.threads);
  auto model = Model::load(a.model);
  GenerateOptions opt;
  opt.context = a.file_given ? read_file(a.prompt_file) : a.prompt;
  opt.question = a.question;
  opt.n_predict = a.n_predict;
  opt.sampling = {a.temp, a.top_k, a.top_p, a.seed};
  opt.chunk_size = a.chunk_size;
  opt.session.n_ctx = a.ctx;
  warn_context_size(*model, a.ctx);
  opt.session.key_codec = parse_codec(a.cache_type_k);
  opt.session.value_codec = parse_codec(a.cache_type_v);
  opt.session.kv_quant = a.kv_quant;
  // The prompt is echoed only once generation starts, so a rejected prompt prints just the error.
  bool echoed = false;
  auto echo_prompt = [&] {
    if (echoed) return;
    echoed = true;
    fmt::print("{}{}", opt.context, opt.question);
  };
  GenerateResult r = generate(*model, *press, opt, [&](const std::string& s) {
    echo_prompt();
    fmt::print("{}", s);
    std::fflush(stdout);
  });
  echo_prompt();
  const GenerateStats& st = r.stats;
  const HParams& hp = model->hparams();
  fmt::print("\n\n--- kvslim ---\n");
  fmt::print("model            {} ({}, {} layers, {} query heads, {} KV heads, head_dim {}, {})\n", a.model, hp.arch,
             hp.n_layer, hp.n_head, hp.n_head_kv, hp.head_dim, model->weight_type());
  fmt::print("press            {}\n", press->describe());
  fmt::print("prompt tokens    {} context + {} question\n", st.context_tokens, st.question_tokens);
  fmt::print("entries kept     {} / {} ({:.1f}% kept, compression ratio {:.3f})\n", st.entries_kept, st.entries_total,
             100.0 * st.entries_kept / std::max<size_t>(1, st.entries_total), st.compression_ratio());
  std::string per_layer;
  for (size_t l = 0; l < st.kept_per_layer.size(); ++l)
    per_layer += fmt::format("{}{}", l ? " " : "", st.kept_per_layer[l]);
  fmt::print("kept per layer   {} (of {} each)\n", per_layer, st.context_tokens * hp.n_head_kv);
  fmt::print("KV bytes         {} ({} B; full f16 cache {} B; memory ratio {:.3f})\n", human_bytes(st.kv_bytes),
             st.kv_bytes, st.full_f16_bytes, st.memory_ratio());
  fmt::print("KV cache type    {}; peak during prefill {} B\n",
             describe_cache_config(opt.session.key_codec, opt.session.value_codec, a.kv_quant), st.peak_kv_bytes);
  if (st.entries_kept) {
    // Everything the cache holds per entry (key, value, scales, zero points, position, bookkeeping),
    // and per stored key or value element without the 4-byte position.
    const double per_entry = 8.0 * st.kv_bytes / st.entries_kept;
    const double per_value = (per_entry - 32.0) / (2.0 * hp.head_dim);
    fmt::print("KV bits          {:.1f} bits per entry ({:.2f} bits per key/value element; full f16 cache: {} and 16)\n",
               per_entry, per_value, 2 * 16 * hp.head_dim + 32);
  }
  fmt::print("prefill          {:.1f} tokens/s ({} tokens, {:.3f} s, press {:.3f} s)\n", st.prefill_tps(),
             st.context_tokens + st.question_tokens, st.prefill_seconds, st.press_seconds);
  fmt::print("decode           {:.1f} tokens/s ({} tokens)\n", st.decode_tps(), st.generated_tokens);
  if (std::string r = press->report(); !r.empty()) fmt::print("press report     {}\n", r);
  return 0;
}

}  // namespace

void add_generate(CLI::App& app, Action& action) {
  auto a = std::make_shared<GenerateArgs>();
  auto* sub = app.add_subcommand("generate", "prefill a prompt, compress its KV cache with a press, and generate");
  sub->add_option("-m,--model", a->model, "GGUF model file")->capture_default_str();
  auto* prompt_opt = sub->add_option("-p,--prompt", a->prompt, "context text (compressed by the press)");
  auto* file_opt = sub->add_option("-f,--file", a->prompt_file, "read the context from a file");
  sub->add_option("--question", a->question, "text appended after compression, never compressed");
  sub->add_option("-n,--n-predict", a->n_predict, "tokens to generate")->capture_default_str()->check(CLI::NonNegativeNumber);
  sub->add_option("--press", a->press, "press spec: NAME[:key=value,...] (see `kvslim presses`)")->capture_default_str();
  sub->add_option("--compression-ratio", a->ratio, "fraction of context entries to remove, in [0, 1)")
      ->capture_default_str();
  sub->add_option("--temp", a->temp, "temperature; 0 = greedy")->capture_default_str();
  sub->add_option("--top-k", a->top_k, "top-k sampling (0 = off)")->capture_default_str();
  sub->add_option("--top-p", a->top_p, "top-p sampling (1 = off)")->capture_default_str();
  sub->add_option("-s,--seed", a->seed, "random seed")->capture_default_str();
  sub->add_option("-t,--threads", a->threads, "threads")->capture_default_str()->check(CLI::Range(1, 256));
  sub->add_option("-c,--ctx-size", a->ctx, "context size in tokens (0 = the model's)")->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--chunk-size", a->chunk_size, "compress after every chunk of this many prompt tokens (0 = once)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  add_cache_options(sub, a->cache_type_k, a->cache_type_v, a->kv_quant);
  sub->callback([a, &action, prompt_opt, file_opt] {
    a->prompt_given = prompt_opt->count() > 0;
    a->file_given = file_opt->count() > 0;
    action = [a] { return run(*a); };
  });
}

}  // namespace kvslim::cli
