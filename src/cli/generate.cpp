// `kvslim generate`: prefill, compress with a press, append the question, decode, and report
// what the press kept and the cache's memory.
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "cli/commands.h"
#include "kernels/threads.h"
#include "kvslim/generate.h"

namespace kvslim::cli {

namespace {

struct GenerateArgs {
  std::string model = "models/stories260K.gguf";
  std::string prompt, prompt_file, question;
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
  if (a.prompt.empty() == a.prompt_file.empty()) throw Error("give exactly one of -p TEXT or -f FILE");
  check_ratio(a.ratio, "--compression-ratio");
  std::unique_ptr<Press> press = make_press(a.press, a.ratio);
  set_num_threads(a.threads);
  auto model = Model::load(a.model);
  GenerateOptions opt;
  opt.context = a.prompt_file.empty() ? a.prompt : read_file(a.prompt_file);
  opt.question = a.question;
  opt.n_predict = a.n_predict;
  opt.sampling = {a.temp, a.top_k, a.top_p, a.seed};
  opt.chunk_size = a.chunk_size;
  opt.session.n_ctx = a.ctx;
  opt.session.key_codec = parse_codec(a.cache_type_k);
  opt.session.value_codec = parse_codec(a.cache_type_v);
  fmt::print("{}", opt.context);
  if (!opt.question.empty()) fmt::print("{}", opt.question);
  std::fflush(stdout);
  GenerateResult r = generate(*model, *press, opt, [](const std::string& s) {
    fmt::print("{}", s);
    std::fflush(stdout);
  });
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
  fmt::print("KV cache type    k={} v={}; peak during prefill {} B\n", a.cache_type_k, a.cache_type_v,
             st.peak_kv_bytes);
  fmt::print("prefill          {:.1f} tokens/s ({} tokens, {:.3f} s, press {:.3f} s)\n", st.prefill_tps(),
             st.context_tokens + st.question_tokens, st.prefill_seconds, st.press_seconds);
  fmt::print("decode           {:.1f} tokens/s ({} tokens)\n", st.decode_tps(), st.generated_tokens);
  return 0;
}

}  // namespace

void add_generate(CLI::App& app, Action& action) {
  auto a = std::make_shared<GenerateArgs>();
  auto* sub = app.add_subcommand("generate", "prefill a prompt, compress its KV cache with a press, and generate");
  sub->add_option("-m,--model", a->model, "GGUF model file")->capture_default_str();
  sub->add_option("-p,--prompt", a->prompt, "context text (compressed by the press)");
  sub->add_option("-f,--file", a->prompt_file, "read the context from a file");
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
  sub->add_option("--cache-type-k", a->cache_type_k, "KV cache key type (f32, f16)")->capture_default_str();
  sub->add_option("--cache-type-v", a->cache_type_v, "KV cache value type (f32, f16)")->capture_default_str();
  sub->callback([a, &action] { action = [a] { return run(*a); }; });
}

}  // namespace kvslim::cli
