// Press benchmark: press overhead as a share of prefill time for every press, KV bytes at
// ratios 0.5 / 0.75 / 0.9 for uniform, AdaKV and ZigZagKV budgets, and peak KV bytes with and
// without chunked compression for a prompt eight times the budget. Prints Google Benchmark's
// table, then markdown tables (docs/PERFORMANCE.md shows them).
//
//   kvslim_bench [--model PATH]... [--tokens N] [--threads T] [--reps R] [benchmark flags]
// (run from the repository root; the default model is models/stories260K.gguf)
//
// This file holds the bench executable's main(); other bench/*.cpp files should only register
// benchmarks (BENCHMARK(...)), not define main.
#include <benchmark/benchmark.h>
#include <sys/resource.h>

#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "kvslim/generate.h"
#include "press/authoring.h"  // TimedPress wraps a press
#include "run/prefill.h"

using namespace kvslim;

// From src/kernels/threads.h (the bench target does not have src/ on its include path).
namespace kvslim {
void set_num_threads(int n);
}

namespace {

double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}
double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// Forwards to a press and times its observe + apply (wall and process CPU time).
class TimedPress : public PressImpl {
 public:
  explicit TimedPress(std::unique_ptr<PressImpl> p) : p_(std::move(p)) {}
  std::string describe() const override { return p_->describe(); }
  ObservationNeeds needs() const override { return p_->needs(); }
  ObservationNeeds decode_needs() const override { return p_->decode_needs(); }
  void observe(const KVCache& c, const Model& m, const Observation& o) override {
    Timer t(this);
    p_->observe(c, m, o);
  }
  void apply(KVCache& c, const Model& m, const Observation& o, const Target& t) override {
    Timer tm(this);
    p_->apply(c, m, o, t);
  }
  void reset() override { p_->reset(); }
  double ratio() const override { return p_->ratio(); }
  size_t kept_after(const Target& t) const override { return p_->kept_after(t); }
  double wall = 0, cpu = 0;

 private:
  struct Timer {
    TimedPress* p;
    double w0 = wall_seconds(), c0 = cpu_seconds();
    explicit Timer(TimedPress* p) : p(p) {}
    ~Timer() {
      p->wall += wall_seconds() - w0;
      p->cpu += cpu_seconds() - c0;
    }
  };
  std::unique_ptr<PressImpl> p_;
};

struct Options {
  std::vector<std::string> models;
  int tokens = 1024;
  int threads = 2;
  int reps = 1;
};
Options opt;

std::map<std::string, std::unique_ptr<Model>> models;
const Model& model(const std::string& path) {
  auto& m = models[path];
  if (!m) m = Model::load(path);
  return *m;
}

std::vector<Token> prompt_tokens(const Model& m, int n) {
  const std::string base =
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she "
      "saw a big red ball under a tree, and her friend Tom came to play. They laughed and ran until the sun went "
      "down, and then they went home to eat soup with their moms. ";
  std::string text;
  std::vector<Token> t;
  while ((t = m.tokenizer().encode(text, true, false)).size() < static_cast<size_t>(n)) text += base;
  t.resize(n);
  return t;
}

struct Run {
  double prefill_wall = 0, prefill_cpu = 0, press_wall = 0, press_cpu = 0;
  size_t kv_bytes = 0, peak = 0, full = 0;
};

Run run_once(const Model& m, const std::string& spec, double ratio, const std::vector<Token>& toks, int chunk) {
  TimedPress press(make_press_impl(spec, ratio));
  SessionOptions so;
  so.n_ctx = static_cast<int>(toks.size()) + 8;
  Session s(m, so);
  Run r;
  double w0 = wall_seconds(), c0 = cpu_seconds();
  prefill_and_compress(s, press, toks, chunk, &r.peak);
  r.prefill_wall = wall_seconds() - w0;
  r.prefill_cpu = cpu_seconds() - c0;
  r.press_wall = press.wall;
  r.press_cpu = press.cpu;
  r.kv_bytes = s.cache().bytes();
  r.full = s.cache().full_f16_bytes(toks.size());
  return r;
}

/// Best (lowest) of `reps` runs by CPU time: the machine is shared, so the least disturbed run is
/// the closest to the cost of the code.
Run best_of(const Model& m, const std::string& spec, double ratio, const std::vector<Token>& toks, int chunk) {
  Run best;
  for (int i = 0; i < opt.reps; ++i) {
    Run r = run_once(m, spec, ratio, toks, chunk);
    if (i == 0 || r.prefill_cpu < best.prefill_cpu) best = r;
  }
  return best;
}

std::string short_name(const std::string& path) {
  auto s = path.substr(path.find_last_of('/') + 1);
  return s.substr(0, s.rfind(".gguf"));
}

// Results for the markdown tables.
struct Overhead {
  std::string model, spec;
  Run run, base;
};
std::vector<Overhead> overheads;
std::map<std::string, std::map<std::string, std::map<double, size_t>>> bytes_at;  // model -> policy -> ratio
struct Peak {
  std::string model, spec;
  int tokens, chunk;
  size_t budget_bytes, peak_none, peak_chunked, final_bytes;
};
std::vector<Peak> peaks;

const std::vector<std::string> kSpecs = {
    "random",         "knorm",           "streaming_llm",     "snapkv",        "tova",
    "h2o",            "observed_attention", "expected_attention", "criticalkv(snapkv)", "keydiff",
    "pyramidkv(snapkv)", "adakv(snapkv)", "zigzagkv(snapkv)", "global(snapkv)", "threshold(knorm):tau=-6",
    "snapkv+knorm",   "key_rerotation(snapkv)"};

void register_all() {
  for (const std::string& path : opt.models) {
    const std::string mn = short_name(path);
    auto base = std::make_shared<Run>();
    benchmark::RegisterBenchmark(fmt::format("prefill/{}/none", mn).c_str(), [path, base](benchmark::State& st) {
      const Model& m = model(path);
      auto toks = prompt_tokens(m, opt.tokens);
      for (auto _ : st) {
        *base = best_of(m, "none", 0.0, toks, 0);
        st.SetIterationTime(base->prefill_wall);
      }
      st.counters["prefill_cpu_s"] = base->prefill_cpu;
      st.counters["tokens"] = opt.tokens;
    })->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond);
    for (const std::string& spec : kSpecs)
      benchmark::RegisterBenchmark(fmt::format("prefill/{}/{}", mn, spec).c_str(), [path, spec, base, mn](benchmark::State& st) {
        const Model& m = model(path);
        auto toks = prompt_tokens(m, opt.tokens);
        Run r;
        for (auto _ : st) {
          r = best_of(m, spec, 0.5, toks, 0);
          st.SetIterationTime(r.prefill_wall);
        }
        st.counters["press_cpu_s"] = r.press_cpu;
        st.counters["press_pct_cpu"] = 100.0 * r.press_cpu / std::max(1e-9, r.prefill_cpu - r.press_cpu);
        st.counters["press_pct_wall"] = 100.0 * r.press_wall / std::max(1e-9, r.prefill_wall - r.press_wall);
        overheads.push_back({mn, spec, r, *base});
      })->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond);
    for (const std::string pol : {"snapkv", "adakv(snapkv)", "zigzagkv(snapkv)", "pyramidkv(snapkv)"})
      for (double ratio : {0.5, 0.75, 0.9})
        benchmark::RegisterBenchmark(fmt::format("kv_bytes/{}/{}/{}", mn, pol, ratio).c_str(),
                                     [path, pol, ratio, mn](benchmark::State& st) {
                                       const Model& m = model(path);
                                       auto toks = prompt_tokens(m, opt.tokens);
                                       Run r;
                                       for (auto _ : st) r = run_once(m, pol, ratio, toks, 0);
                                       st.counters["kv_bytes"] = r.kv_bytes;
                                       st.counters["memory_ratio"] = double(r.kv_bytes) / r.full;
                                       bytes_at[mn][pol][ratio] = r.kv_bytes;
                                     })
            ->Iterations(1);
    // A prompt eight times the budget: ratio 0.875 keeps one eighth.
    for (const std::string spec : {"knorm", "snapkv", "h2o", "adakv(snapkv)"})
      benchmark::RegisterBenchmark(fmt::format("peak/{}/{}", mn, spec).c_str(), [path, spec, mn](benchmark::State& st) {
        const Model& m = model(path);
        auto toks = prompt_tokens(m, opt.tokens);
        const int chunk = opt.tokens / 16;
        Run whole, chunked;
        for (auto _ : st) {
          whole = run_once(m, spec, 0.875, toks, 0);
          chunked = run_once(m, spec, 0.875, toks, chunk);
        }
        st.counters["peak_bytes_unchunked"] = whole.peak;
        st.counters["peak_bytes_chunked"] = chunked.peak;
        st.counters["final_bytes"] = chunked.kv_bytes;
        peaks.push_back({mn, spec, opt.tokens, chunk, whole.kv_bytes, whole.peak, chunked.peak, chunked.kv_bytes});
      })->Iterations(1);
  }
}

void print_tables() {
  fmt::print("\n### Press overhead (ratio 0.5, {} prompt tokens, {} threads, best of {} by CPU time)\n\n", opt.tokens,
             opt.threads, opt.reps);
  fmt::print("| model | press | prefill wall s | press wall s | press % of prefill (wall) | press % of prefill (CPU) |"
             " prefill CPU vs none |\n|---|---|---|---|---|---|---|\n");
  for (const auto& o : overheads) {
    const Run& r = o.run;
    fmt::print("| {} | `{}` | {:.2f} | {:.3f} | {:.2f} | {:.2f} | {:+.1f}% |\n", o.model, o.spec, r.prefill_wall,
               r.press_wall, 100.0 * r.press_wall / std::max(1e-9, r.prefill_wall - r.press_wall),
               100.0 * r.press_cpu / std::max(1e-9, r.prefill_cpu - r.press_cpu),
               100.0 * (r.prefill_cpu - o.base.prefill_cpu) / std::max(1e-9, o.base.prefill_cpu));
  }
  fmt::print("\n### KV bytes after compression ({} prompt tokens; f16 cache)\n\n", opt.tokens);
  fmt::print("| model | budget policy | r = 0.5 | r = 0.75 | r = 0.9 |\n|---|---|---|---|---|\n");
  for (const auto& [mn, pols] : bytes_at)
    for (const auto& [pol, by] : pols) {
      fmt::print("| {} | `{}` |", mn, pol);
      for (double r : {0.5, 0.75, 0.9}) fmt::print(" {} |", by.count(r) ? by.at(r) : 0);
      fmt::print("\n");
    }
  fmt::print("\n### Peak KV bytes, prompt = 8 x budget (ratio 0.875)\n\n");
  fmt::print("| model | press | tokens | chunk | peak, one prefill | peak, chunked | after compression |\n"
             "|---|---|---|---|---|---|---|\n");
  for (const auto& p : peaks)
    fmt::print("| {} | `{}` | {} | {} | {} | {} | {} |\n", p.model, p.spec, p.tokens, p.chunk, p.peak_none,
               p.peak_chunked, p.final_bytes);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<char*> rest = {argv[0]};
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        fmt::print(stderr, "{} needs a value\n", a);
        std::exit(1);
      }
      return argv[++i];
    };
    if (a == "--model")
      opt.models.push_back(next());
    else if (a == "--tokens")
      opt.tokens = std::stoi(next());
    else if (a == "--threads")
      opt.threads = std::stoi(next());
    else if (a == "--reps")
      opt.reps = std::stoi(next());
    else
      rest.push_back(argv[i]);
  }
  if (opt.models.empty()) opt.models.push_back("models/stories260K.gguf");
  set_num_threads(opt.threads);
  int n = static_cast<int>(rest.size());
  benchmark::Initialize(&n, rest.data());
  try {
    register_all();
    benchmark::RunSpecifiedBenchmarks();
    print_tables();
  } catch (const Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
  benchmark::Shutdown();
  return 0;
}
