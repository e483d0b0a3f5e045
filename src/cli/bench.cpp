// `kvslim bench`: prefill and decode speed, peak memory and KV bytes per press and context depth,
// printed as a table in the style of llama.cpp's llama-bench (and optionally as JSON).
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/cache_options.h"
#include "cli/commands.h"
#include "cli/context_size.h"
#include "cli/memory_estimate.h"
#include "cli/options.h"
#include "cli/progress.h"
#include "kvslim/press.h"
#include "kvslim/request.h"
#include "tools/tools.h"

namespace kvslim::cli {

namespace {

// The processor's name (the first "model name" of /proc/cpuinfo), for speed figures that name
// their machine; "unknown CPU" where the file or the field is missing.
std::string cpu_model_name() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) {
      const size_t c = line.find(':');
      if (c == std::string::npos) break;
      size_t b = line.find_first_not_of(" \t", c + 1);
      return b == std::string::npos ? "unknown CPU" : line.substr(b);
    }
  return "unknown CPU";
}

struct BenchArgs {
  std::string model;
  ModelLoadOptions load;  // --rope-* / --yarn-* over the file's RoPE settings
  std::vector<int> n_prompts{512};
  std::vector<int> depths{0};
  std::vector<int> n_gens{32};
  std::vector<int> parallel;  // --parallel: requests decoding at once (empty: the single-request tests)
  int threads = 0;
  int reps = 5;  // llama-bench's default
  int ctx = 0;   // -c: 0 = the positions the tests reach
  std::string output = "md";
  int batch = 512;
  int chunk_size = 0;
  std::vector<std::string> presses{"none"};
  double ratio = 0.5;
  std::string json;
  bool ratio_given = false, no_progress = false, floor = false;
  bool progress_lines = false, no_memory_check = false;
  uint64_t seed = 42;
  std::string cache_type_k = "f16", cache_type_v = "f16";
  KVQuantOptions kv_quant;
};

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// CPU time of the whole process so far (user + system, every thread), seconds.
double process_cpu_seconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6;
}

/// Peak resident set (VmHWM) in bytes, from /proc/self/status, else getrusage.
size_t peak_rss() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<size_t>(ru.ru_maxrss) * 1024;
}

/// Resets VmHWM to the current resident set (Linux >= 4.0), so each test reports its own peak.
/// Returns false where the kernel does not allow it; peaks are then cumulative.
bool reset_peak_rss() {
  std::ofstream f("/proc/self/clear_refs");
  if (!f) return false;
  f << "5";
  f.flush();
  return static_cast<bool>(f);
}

std::vector<Token> random_tokens(int n, int n_vocab, std::mt19937_64& rng) {
  std::uniform_int_distribution<int> d(0, n_vocab - 1);
  std::vector<Token> t(static_cast<size_t>(n));
  for (auto& v : t) v = d(rng);
  return t;
}

// Median of v (the mean of the middle two for an even count); v is not empty.
double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct Result {
  std::string press;
  std::string test;  // "pp512", "tg32 @ d4096", "tg32 x4 @ d0"
  int n_prompt = 0, n_gen = 0, depth = 0;
  int n_parallel = 1;  // requests decoding at once (their tokens together make the t/s)
  std::vector<double> tps;  // one per repetition
  std::vector<double> token_ms;  // decode tests: every single-token step
  size_t kv_bytes = 0, peak_rss = 0;
  double press_seconds = 0;
  /// Prefill tests: wall seconds in the layers' attention step (Session::attention_seconds) and in
  /// the whole timed prefill, summed over repetitions.
  double attention_seconds = 0, prefill_wall_seconds = 0;
  /// Tokens per second of process CPU time (user + system, all threads), one per repetition: with
  /// -t 1 on a machine shared with other jobs, the rate the test would have on a core of its own.
  std::vector<double> cpu_tps;
  /// --floor: the memory's read rate (GB/s) in passes just before and just after the decode test,
  /// and the bytes a decode step reads at least (the file's weights, see decode_weight_bytes, plus
  /// the KV cache at the test's start).
  std::vector<double> read_gbps;
  size_t floor_bytes = 0;
  /// --floor: a read pass right after every decode token (GB/s), paired with token_ms: on a host
  /// whose read rate drifts within seconds (other tenants), each token is compared with the memory
  /// as it was at that moment rather than with passes seconds away.
  std::vector<double> token_read_gbps;
  /// --floor: the one-way hand-off between the pool's two first threads (ns, thread_handoff_ns)
  /// just before and just after the decode test: whether the threads shared a last-level cache.
  std::vector<double> handoff_ns;
  /// Paired shares of the floor: the median over tokens of (token's rate / the rate its read pass
  /// allows), and the sum of the floor times over the sum of the token times. 0 without --floor.
  double paired_median() const {
    if (!paired()) return 0;
    std::vector<double> v;
    for (size_t i = 0; i < token_ms.size(); ++i) v.push_back(floor_seconds(i) / (token_ms[i] / 1000.0));
    return median_of(std::move(v));
  }
  double paired_total() const {
    if (!paired()) return 0;
    double floor_s = 0, token_s = 0;
    for (size_t i = 0; i < token_ms.size(); ++i) {
      floor_s += floor_seconds(i);
      token_s += token_ms[i] / 1000.0;
    }
    return floor_s / token_s;
  }
  bool paired() const { return token_read_gbps.size() == token_ms.size() && !token_ms.empty() && floor_bytes > 0; }
  /// Seconds token i's bytes take at the rate of the read pass after it.
  double floor_seconds(size_t i) const { return static_cast<double>(floor_bytes) / (token_read_gbps[i] * 1e9); }
  /// Decode rate the read rate allows (median pass, the mean of the middle two for an even count):
  /// floor_bytes per token; 0 without --floor.
  double floor_tps() const {
    if (read_gbps.empty() || floor_bytes == 0) return 0;
    return median_of(read_gbps) * 1e9 / static_cast<double>(floor_bytes);
  }
  /// Median single-token decode rate (0 for prefill tests): robust to other load on the machine.
  double median_tps() const {
    if (token_ms.empty()) return 0;
    std::vector<double> v = token_ms;
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    return 1000.0 / v[v.size() / 2];
  }
  Result(std::string press_name, std::string test_name, int prompt, int gen, int at_depth)
      : press(std::move(press_name)), test(std::move(test_name)), n_prompt(prompt), n_gen(gen), depth(at_depth) {}
  double mean() const {
    double s = 0;
    for (double v : tps) s += v;
    return tps.empty() ? 0 : s / tps.size();
  }
  double stddev() const {
    if (tps.size() < 2) return 0;
    double m = mean(), s = 0;
    for (double v : tps) s += (v - m) * (v - m);
    return std::sqrt(s / (tps.size() - 1));
  }
};

std::string human_params(double n) {
  if (n >= 1e9) return fmt::format("{:.2f} B", n / 1e9);
  if (n >= 1e6) return fmt::format("{:.2f} M", n / 1e6);
  return fmt::format("{:.2f} K", n / 1e3);
}

std::string human_size(double b) {
  if (b >= 1024.0 * 1024 * 1024) return fmt::format("{:.2f} GiB", b / (1024.0 * 1024 * 1024));
  if (b >= 1024.0 * 1024) return fmt::format("{:.2f} MiB", b / (1024.0 * 1024));
  return fmt::format("{:.2f} KiB", b / 1024.0);
}

// A CSV field: quoted when it holds a comma, a quote or a line break (RFC 4180).
std::string csv_field(const std::string& v) {
  if (v.find_first_of(",\"\n\r") == std::string::npos) return v;
  std::string q = "\"";
  for (char c : v) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

// A JSON value as one CSV field: strings as they are, arrays as their items separated by spaces
// (as llama-bench writes samples_ns), null as an empty field.
std::string csv_value(const nlohmann::ordered_json& v) {
  if (v.is_string()) return csv_field(v.get<std::string>());
  if (v.is_null()) return "";
  if (v.is_array()) {
    std::string s;
    for (const auto& x : v) s += (s.empty() ? "" : " ") + x.dump();
    return csv_field(s);
  }
  return v.dump();
}

int run(BenchArgs a) {
  if (a.reps < 1) throw Error(fmt::format("bench: -r {} must be >= 1", a.reps));
  if (a.output != "md" && a.json == "-")
    throw Error(fmt::format("-o {} and --json - both write to stdout: write the JSON to a file (--json FILE)", a.output));
  // Each list once, in the order given (llama-bench runs a repeated value once too).
  for (std::vector<int>* v : {&a.n_prompts, &a.n_gens, &a.depths}) {
    std::vector<int> seen;
    for (int x : *v)
      if (std::find(seen.begin(), seen.end(), x) == seen.end()) seen.push_back(x);
    *v = seen;
  }
  const bool any_pp = std::any_of(a.n_prompts.begin(), a.n_prompts.end(), [](int p) { return p > 0; });
  const bool any_tg = std::any_of(a.n_gens.begin(), a.n_gens.end(), [](int n) { return n > 0; });
  if (!any_pp && !any_tg) throw Error("bench: -p and -n are all 0: no test to run");
  check_ratio(a.ratio, "--compression-ratio");
  if (a.ratio_given && std::all_of(a.presses.begin(), a.presses.end(), [](const std::string& p) { return p == "none"; }))
    throw Error(fmt::format("--compression-ratio {} needs a press: add --press NAME (see `kvslim presses`)", a.ratio));
  // Every spec built once, before the model loads (a bad spec fails first), with whether it keeps
  // its entries by the ratio.
  std::vector<std::unique_ptr<Press>> presses;
  std::set<std::string> ratio_users;  // descriptions of the presses that keep their entries by the ratio
  std::string last_press;   // the last spec other than none
  for (const std::string& spec : a.presses) {
    bool used = false;
    presses.push_back(make_press(spec, a.ratio, used));
    if (used) ratio_users.insert(presses.back()->describe());
    if (spec != "none") last_press = spec;
  }
  const bool ratio_used = !ratio_users.empty();  // by any press of the table (never by none)
  // One press that takes the ratio is enough (a table may set ratio-free presses beside it).
  if (a.ratio_given) check_ratio_used(last_press, a.ratio, ratio_used, "--compression-ratio");
  if (a.floor && !a.parallel.empty())
    throw Error("--floor times single-request decode tests, and --parallel runs batched ones: use one of them");
  if (!a.parallel.empty() && !any_tg)
    throw Error("--parallel sets the requests of the decode tests, and -n 0 runs none: set -n (--gen) above 0");
  if (a.floor && !any_tg)
    throw Error("--floor times the decode tests, and -n 0 runs none: set -n (--gen) above 0");
  check_json_output(a.json);  // an unwritable output fails before a long run, not after it
  a.threads = apply_threads(a.threads);
  // The table is the result (stdout); with --json - or -o csv|json|jsonl stdout holds only that and the
  // table's lines move to stderr.
  std::FILE* text_out = a.json == "-" || a.output != "md" ? stderr : stdout;
  Progress progress(!a.no_progress, a.progress_lines);
  const size_t available = available_memory();  // before the model takes its share
  auto model = Model::load(a.model, a.load);
  const HParams& hp = model->hparams();

  size_t n_params = 0, size_bytes = 0;
  for (const TensorInfo& t : model->file().tensors()) {
    n_params += static_cast<size_t>(t.nelements());
    size_bytes += t.nbytes;
  }
  const size_t weight_floor_bytes = decode_weight_bytes(model->file());
  // Far larger than any last-level cache; passes before and after each decode test.
  constexpr size_t kProbeBytes = size_t{256} << 20;
  constexpr int kProbePasses = 4;
  const std::string model_name = fmt::format("{} {} {}", hp.arch, human_params(double(n_params)), model->weight_type());

  int max_depth = 0, max_prompt = 0, max_gen = 0;
  for (int d : a.depths) max_depth = std::max(max_depth, d);
  for (int p : a.n_prompts) max_prompt = std::max(max_prompt, p);
  for (int n : a.n_gens) max_gen = std::max(max_gen, n);
  SessionOptions so;
  so.n_ctx = std::max(max_depth + max_prompt, max_depth + max_gen * a.reps + 1);
  if (a.ctx > 0) {
    if (a.ctx < so.n_ctx)
      throw Error(fmt::format("bench: -c {} is smaller than the {} positions the tests reach (depth {} plus the "
                              "prompt, or plus the decode repetitions)",
                              a.ctx, so.n_ctx, max_depth));
    so.n_ctx = a.ctx;
  }
  warn_context_size(*model, so.n_ctx);
  so.batch = a.batch;
  so.key_codec = parse_codec(a.cache_type_k);
  so.value_codec = parse_codec(a.cache_type_v);
  so.kv_quant = a.kv_quant;
  std::mt19937_64 rng(a.seed);
  {
    // The largest cache a test reaches: depth and prompt, or depth and the decode repetitions, as
    // the press (under chunked prefill) bounds it.
    // The decode tests' tokens come after the depth the press has compressed (a budget or chunked
    // ratio bounds it; counting the whole depth asked for a 4 GiB cache at 131,072 tokens under
    // snapkv:budget=2048, which holds 65 MiB).
    size_t entries = 0;
    const size_t n_ctx = static_cast<size_t>(so.n_ctx), depth = static_cast<size_t>(max_depth);
    for (const std::unique_ptr<Press>& press : presses) {
      entries = std::max(entries, kv_entries(press.get(), depth + static_cast<size_t>(max_prompt), 0, a.chunk_size, n_ctx));
      entries = std::max(entries, kv_entries(press.get(), depth, static_cast<size_t>(max_gen) * a.reps + 1, a.chunk_size, n_ctx));
      // --parallel: that many caches at once, each filled anew per repetition.
      for (int n_par : a.parallel)
        entries = std::max(entries, static_cast<size_t>(n_par) *
                                        kv_entries(press.get(), depth, static_cast<size_t>(max_gen) + 1, a.chunk_size, n_ctx));
    }
    report_memory(estimate_memory(*model, so.key_codec, so.value_codec, so.kv_quant, entries, so.batch), available,
                  !a.no_memory_check);
  }

  RequestOptions ro;
  ro.session = so;
  ro.chunk_size = a.chunk_size;
  {  // warm-up, untimed: page faults of the mapping (every weight is touched), the pool's threads
     // and their per-thread buffers, on both paths (a small prefill batch, then decode steps)
    Request w(*model, make_press("none", 0.0), ro);
    const int n_warm = std::clamp(so.n_ctx - 4, 1, 64);  // within the context however small
    w.set_prompt_tokens(random_tokens(n_warm, hp.n_vocab, rng));
    w.prefill();
    for (int i = 0; i < 4 && w.position() < so.n_ctx; ++i) w.advance(static_cast<Token>(i));
  }

  // --floor: one probe for the whole run (its pages stay resident, so its bytes are taken off
  // every RSS peak below).
  std::unique_ptr<ReadProbe> probe;
  if (a.floor) probe = std::make_unique<ReadProbe>(kProbeBytes);
  const size_t probe_rss = probe ? probe->bytes() : 0;
  auto rss_peak = [&] {
    const size_t p = peak_rss();
    return p - std::min(p, probe_rss);
  };

  std::vector<Result> results;
  const bool per_test_peak = reset_peak_rss();
  size_t n_tests = 0;  // one per row but the fill rows
  for (int p : a.n_prompts) n_tests += p > 0 ? a.depths.size() : 0;
  for (int n : a.n_gens) n_tests += n > 0 ? a.depths.size() * std::max<size_t>(1, a.parallel.size()) : 0;
  n_tests *= a.presses.size();
  std::string current;  // the test running now
  auto report = [&](const std::string& pname, const std::string& test) {
    current = fmt::format("{} {}", pname, test);
    progress.update(results.size(), n_tests, current);
  };
  // Within a test too (a 16K fill takes minutes): the line follows the position, on a terminal only.
  if (progress.active())
    ro.session.on_batch_done = [&](int32_t pos) {
      progress.update(results.size(), n_tests, fmt::format("{} at position {}", current, pos));
    };
  for (const std::unique_ptr<Press>& press : presses) {
    const std::string pname = press->describe();
    const size_t pi = static_cast<size_t>(&press - presses.data());
    for (int n_prompt : a.n_prompts) {
      if (n_prompt <= 0) continue;
      for (int depth : a.depths) {
        // As llama-bench: "pp512 @ d4096" prefills 512 tokens after 4096 already in the cache (here
        // the press has compressed those, untimed); the 512 go in as one batch after them.
        Result r(pname, depth > 0 ? fmt::format("pp{} @ d{}", n_prompt, depth) : fmt::format("pp{}", n_prompt),
                 n_prompt, 0, depth);
        report(pname, r.test);
        reset_peak_rss();
        for (int rep = 0; rep < a.reps; ++rep) {
          Request req(*model, *press, ro);
          std::vector<Token> prompt = random_tokens(n_prompt, hp.n_vocab, rng);
          if (depth > 0) {
            req.set_prompt_tokens(random_tokens(depth, hp.n_vocab, rng), std::move(prompt));
            while (!req.context_prefilled()) req.prefill_step();
          } else {
            req.set_prompt_tokens(std::move(prompt));
          }
          const double press_before = req.stats().press_seconds;
          const double a0 = req.session().attention_seconds();
          auto t0 = Clock::now();
          const double c0 = process_cpu_seconds();
          req.prefill();
          r.tps.push_back(n_prompt / since(t0));
          r.prefill_wall_seconds += since(t0);
          r.attention_seconds += req.session().attention_seconds() - a0;
          r.cpu_tps.push_back(n_prompt / std::max(1e-9, process_cpu_seconds() - c0));
          r.press_seconds += (req.stats().press_seconds - press_before) / a.reps;
          r.kv_bytes = req.cache().bytes();
        }
        r.peak_rss = rss_peak();
        results.push_back(r);
      }
    }
    // --parallel: N requests decode together, one pass over the weights per step (step_batch, as
    // `kvslim serve` batches them; llama-batched-bench's -npl). Each is filled to the depth first
    // (untimed), then every step of all of them is timed; t/s counts the tokens of all N.
    for (int n_par : a.parallel)
      for (int n_gen : a.n_gens) {
        if (n_gen <= 0) continue;
        for (int depth : a.depths) {
          Result r(pname, fmt::format("tg{} x{} @ d{}", n_gen, n_par, depth), 0, n_gen, depth);
          r.n_parallel = n_par;
          report(pname, r.test);
          reset_peak_rss();
          RequestOptions o = ro;
          o.n_predict = n_gen;
          o.sampling.temp = 0;  // greedy: every repetition decodes the same tokens
          o.ignore_eos = true;  // every request decodes n_gen tokens, so the batch keeps N rows
          for (int rep = 0; rep < a.reps; ++rep) {
            std::vector<std::unique_ptr<Request>> reqs;
            std::vector<Request*> batch;
            for (int i = 0; i < n_par; ++i) {
              bool used = false;
              reqs.push_back(std::make_unique<Request>(*model, make_press(a.presses[pi], a.ratio, used), o));
              reqs.back()->set_prompt_tokens(random_tokens(std::max(depth, 1), hp.n_vocab, rng));
              reqs.back()->prefill();
              batch.push_back(reqs.back().get());
            }
            r.kv_bytes = 0;
            for (const auto& q : reqs) r.kv_bytes += q->cache().bytes();
            const auto t0 = Clock::now();
            const double c0 = process_cpu_seconds();
            while (std::any_of(batch.begin(), batch.end(), [](const Request* q) { return !q->finished(); }))
              for (const std::exception_ptr& e : step_batch(batch))
                if (e) std::rethrow_exception(e);
            size_t tokens = 0;
            for (const Request* q : batch) tokens += q->generated().size();
            r.tps.push_back(tokens / since(t0));
            r.cpu_tps.push_back(tokens / std::max(1e-9, process_cpu_seconds() - c0));
          }
          r.peak_rss = rss_peak();
          results.push_back(r);
        }
      }
    for (size_t gi = 0; gi < a.n_gens.size() && a.parallel.empty(); ++gi) {
      const int n_gen = a.n_gens[gi];
      if (n_gen <= 0) continue;
      // The fill row once per depth (the first decode length), though every decode test fills anew.
      const bool first_gen = std::find_if(a.n_gens.begin(), a.n_gens.begin() + static_cast<std::ptrdiff_t>(gi),
                                          [](int n) { return n > 0; }) == a.n_gens.begin() + static_cast<std::ptrdiff_t>(gi);
      for (int depth : a.depths) {
        Result r(pname, fmt::format("tg{} @ d{}", n_gen, depth), 0, n_gen, depth);
        report(pname, r.test);
        reset_peak_rss();
        Request req(*model, *press, ro);
        if (depth > 0) {
          // The fill itself is a prefill of `depth` tokens (with compression after every chunk
          // when --chunk-size is set): reported as its own row, as it is the long-prompt cost.
          Result fill(pname, fmt::format("fill d{}", depth), depth, 0, depth);
          req.set_prompt_tokens(random_tokens(depth, hp.n_vocab, rng));
          const auto t0 = Clock::now();
          const double c0 = process_cpu_seconds();
          req.prefill();
          fill.tps.push_back(depth / since(t0));
          fill.prefill_wall_seconds = since(t0);
          fill.attention_seconds = req.session().attention_seconds();
          fill.cpu_tps.push_back(depth / std::max(1e-9, process_cpu_seconds() - c0));
          fill.press_seconds = req.stats().press_seconds;
          fill.kv_bytes = req.cache().bytes();
          fill.peak_rss = rss_peak();
          if (first_gen) results.push_back(fill);
          r.press_seconds = fill.press_seconds;
        } else {
          req.press_impl().reset();  // no prefill to reset it: decode starts from an empty cache
        }
        r.kv_bytes = req.cache().bytes();
        if (a.floor) {
          r.floor_bytes = weight_floor_bytes + r.kv_bytes;
          r.read_gbps = probe->passes(kProbePasses);
          r.handoff_ns.push_back(thread_handoff_ns());
        }
        // Repetitions continue the same context: depth drifts by n_gen per repetition. The
        // tokens are fed (not sampled) so every press decodes the same sequence.
        for (int rep = 0; rep < a.reps; ++rep) {
          std::vector<Token> toks = random_tokens(n_gen, hp.n_vocab, rng);
          auto t0 = Clock::now();
          const double c0 = process_cpu_seconds();
          double token_s = 0, token_cpu = 0;
          for (Token t : toks) {
            const double ct = probe ? process_cpu_seconds() : 0;
            auto t1 = Clock::now();
            req.advance(t);
            const double s1 = since(t1);
            r.token_ms.push_back(1000.0 * s1);
            token_s += s1;
            if (probe) {
              token_cpu += process_cpu_seconds() - ct;
              r.token_read_gbps.push_back(probe->pass());  // not timed as decode
            }
          }
          r.tps.push_back(n_gen / (probe ? token_s : since(t0)));
          r.cpu_tps.push_back(n_gen / std::max(1e-9, probe ? token_cpu : process_cpu_seconds() - c0));
        }
        r.peak_rss = rss_peak();
        if (a.floor) {
          for (double g : probe->passes(kProbePasses)) r.read_gbps.push_back(g);
          r.handoff_ns.push_back(thread_handoff_ns());
        }
        results.push_back(r);
      }
    }
  }

  progress.clear();
  // The table, llama-bench style.
  const std::string simd = qdot::level_name(qdot::level());
  const std::string prefetch = qdot::prefetch_name(qdot::prefetch());
  const std::string cpu = cpu_model_name();
  size_t pw = 5;  // the press column fits the longest press description (never cut)
  for (const Result& r : results) pw = std::max(pw, r.press.size());
  fmt::print(text_out, "| {:<24} | {:>10} | {:>10} | {:>6} | {:>7} | {:<{}} | {:>14} | {:>18} | {:>10} | {:>12} |\n", "model",
             "size", "params", "type", "threads", "press", pw, "test", "t/s", "KV MiB",
             per_test_peak ? "peak RSS MiB" : "max RSS MiB");
  fmt::print(text_out, "| {:-<24} | {:->10} | {:->10} | {:->6} | {:->7} | {:-<{}} | {:->14} | {:->18} | {:->10} | {:->12} |\n", "",
             "", "", "", "", "", pw, "", "", "", "");
  for (const Result& r : results)
    fmt::print(text_out, "| {:<24} | {:>10} | {:>10} | {:>6} | {:>7} | {:<{}} | {:>14} | {:>18} | {:>10.2f} | {:>12.1f} |\n",
               model_name, human_size(double(size_bytes)), human_params(double(n_params)), model->weight_type(),
               a.threads, r.press, pw, r.test, fmt::format("{:.2f} ± {:.2f}", r.mean(), r.stddev()),
               r.kv_bytes / (1024.0 * 1024.0), r.peak_rss / (1024.0 * 1024.0));
  std::string medians;
  for (const Result& r : results)
    if (!r.token_ms.empty()) medians += fmt::format("{}{} {}: {:.2f}", medians.empty() ? "" : ", ", r.press, r.test, r.median_tps());
  if (!medians.empty()) fmt::print(text_out, "\nmedian single-token decode t/s (robust to other load): {}\n", medians);
  std::string per_cpu;
  for (const Result& r : results) {
    double m = 0;
    for (double v : r.cpu_tps) m += v;
    if (!r.cpu_tps.empty())
      per_cpu += fmt::format("{}{} {}: {:.2f}", per_cpu.empty() ? "" : ", ", r.press, r.test, m / r.cpu_tps.size());
  }
  if (!per_cpu.empty())
    fmt::print(text_out, "tokens per process CPU second (the rate on cores of its own with -t 1): {}\n", per_cpu);
  std::string attention;
  for (const Result& r : results)
    if (r.prefill_wall_seconds > 0)
      attention += fmt::format("{}{} {}: {:.1f}%", attention.empty() ? "" : ", ", r.press, r.test,
                               100.0 * r.attention_seconds / r.prefill_wall_seconds);
  if (!attention.empty())
    fmt::print(text_out, "attention's share of prefill wall time (a press's replays included): {}\n", attention);
  // Bytes that fit in the last-level cache are not read from memory each token: no floor then.
  const size_t llc = a.floor ? last_level_cache_bytes() : 0;
  for (const Result& r : results) {
    if (r.read_gbps.empty()) continue;
    const auto [lo, hi] = std::minmax_element(r.read_gbps.begin(), r.read_gbps.end());
    const double floor = r.floor_tps();
    const bool cached = r.floor_bytes < 2 * (llc ? llc : size_t{32} << 20);
    fmt::print(text_out,
               "read floor {} {}: {:.2f} t/s mean, {:.2f} median token = {:.0f}% / {:.0f}% of {:.2f} t/s "
               "({:.1f} MB per token: weights {:.1f} + KV {:.1f}; at {:.1f} GB/s, the median of {} read passes "
               "around the test, {:.1f}-{:.1f}){}\n",
               r.press, r.test, r.mean(), r.median_tps(), 100 * r.mean() / floor, 100 * r.median_tps() / floor, floor,
               r.floor_bytes / 1e6, (r.floor_bytes - r.kv_bytes) / 1e6, r.kv_bytes / 1e6,
               floor * r.floor_bytes / 1e9, r.read_gbps.size(), *lo, *hi,
               cached ? "; these bytes fit in the CPU's caches, so the memory's read rate does not bound this decode"
                      : "");
    const auto [plo, phi] = std::minmax_element(r.token_read_gbps.begin(), r.token_read_gbps.end());
    fmt::print(text_out,
               "paired read floor {} {}: {:.0f}% median token / {:.0f}% total time of the rate that a read pass "
               "right after each token allows ({} pairs, reads {:.1f}-{:.1f} GB/s)\n",
               r.press, r.test, 100 * r.paired_median(), 100 * r.paired_total(), r.token_read_gbps.size(), *plo, *phi);
    if (r.handoff_ns.size() == 2 && r.handoff_ns[0] > 0 && r.handoff_ns[1] > 0)
      fmt::print(text_out,
                 "thread hand-off {} {}: {:.0f} / {:.0f} ns one way between the first two threads before / after the "
                 "test (tens of ns: cores sharing a last-level cache; hundreds: separate ones, where every hand-over "
                 "between parallel regions costs more)\n",
                 r.press, r.test, r.handoff_ns[0], r.handoff_ns[1]);
  }
  // The ratio only where a press of the table uses it (with --press none alone it meant nothing).
  fmt::print(text_out, "cpu {}, simd {} (detected {}), weight prefetch {} (default {}), prefill batch {}, KV cache {}{}{}\n",
             cpu, simd, qdot::level_name(qdot::detected_level()), prefetch, qdot::prefetch_name(qdot::default_prefetch()),
             a.batch,
             describe_cache_config(so.key_codec, so.value_codec, so.kv_quant),
             ratio_used ? fmt::format(", compression ratio {}", a.ratio) : std::string(),
             per_test_peak ? "" : " (RSS peaks are cumulative: /proc/self/clear_refs not writable)");

  if (!a.json.empty() || a.output != "md") {
    nlohmann::ordered_json out = nlohmann::ordered_json::array();
    for (const Result& r : results)
      out.push_back({{"model", a.model},
                     {"model_name", model_name},
                     {"model_type", model->weight_type()},
                     {"size_bytes", size_bytes},
                     {"n_params", n_params},
                     {"threads", a.threads},
                     {"cpu", cpu},
                     {"simd", simd},
                     {"weight_prefetch", prefetch},
                     {"batch", a.batch},
                     {"press", r.press},
                     // null on rows whose press does not take the ratio (none among them)
                     {"compression_ratio", ratio_users.count(r.press) ? nlohmann::ordered_json(a.ratio) : nlohmann::ordered_json()},
                     {"cache", describe_cache_config(so.key_codec, so.value_codec, so.kv_quant)},
                     {"test", r.test},
                     {"n_prompt", r.n_prompt},
                     {"n_gen", r.n_gen},
                     {"depth", r.depth},
                     {"n_parallel", r.n_parallel},
                     {"samples_ts", r.tps},
                     {"samples_cpu_ts", r.cpu_tps},
                     {"avg_ts", r.mean()},
                     {"stddev_ts", r.stddev()},
                     {"median_token_ts", r.median_tps()},
                     {"samples_token_ms", r.token_ms},
                     {"read_gbps", r.read_gbps},
                     {"floor_bytes_per_token", r.floor_bytes},
                     {"floor_ts", r.floor_tps()},
                     {"token_read_gbps", r.token_read_gbps},
                     {"handoff_ns", r.handoff_ns},
                     {"paired_floor_share_median", r.paired_median()},
                     {"paired_floor_share_total", r.paired_total()},
                     {"press_seconds", r.press_seconds},
                     // prefill tests: share of their wall time in the attention step; null elsewhere
                     {"attention_share", r.prefill_wall_seconds > 0
                                             ? nlohmann::ordered_json(r.attention_seconds / r.prefill_wall_seconds)
                                             : nlohmann::ordered_json()},
                     {"kv_bytes", r.kv_bytes},
                     {"peak_rss_bytes", r.peak_rss},
                     {"peak_rss_per_test", per_test_peak}});
    if (!a.json.empty()) write_json(a.json, out);
    if (a.output == "json") {
      write_json("-", out);
    } else if (a.output == "jsonl") {
      for (const auto& row : out)
        fmt::print(stdout, "{}\n", row.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace));
    } else if (a.output == "csv" && !out.empty()) {
      std::string header, line;
      for (const auto& [key, value] : out.front().items()) header += (header.empty() ? "" : ",") + key;
      fmt::print(stdout, "{}\n", header);
      for (const auto& row : out) {
        line.clear();
        for (const auto& [key, value] : row.items()) line += (line.empty() ? "" : ",") + csv_value(value);
        fmt::print(stdout, "{}\n", line);
      }
    }
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

void add_bench(CLI::App& app, Action& action) {
  auto a = std::make_shared<BenchArgs>();
  auto* sub = app.add_subcommand("bench", "measure prefill and decode speed, memory and KV bytes (llama-bench style)");
  add_model_option(sub, a->model, a->load);
  // Lists as llama-bench takes them: one test per value and depth (-p 64,128 -d 0,4096: four prefill tests).
  sub->add_option("-p,--n-prompt", a->n_prompts,
                  "prompt tokens of the prefill tests, comma-separated; each runs at every depth (0 = none)")
      ->delimiter(',')
      ->capture_default_str()
      ->check(int_range(0, 1 << 24));
  sub->add_option("-d,--depth", a->depths,
                  "context depths, comma-separated: tokens in the cache (compressed by the press) before each "
                  "prefill and decode test")
      ->delimiter(',')
      ->capture_default_str()
      ->check(int_range(0, 1 << 24));
  sub->add_option("-n,--n-gen,--gen", a->n_gens, "decoded tokens of the decode tests, comma-separated (0 = none)")
      ->delimiter(',')
      ->capture_default_str()
      ->check(int_range(0, 1 << 24));
  add_threads_option(sub, a->threads);
  sub->add_option("--parallel", a->parallel,
                  "decode tests with this many requests at once, comma-separated (as llama-batched-bench's -npl): "
                  "each filled to the depth, then decoded together, one pass over the weights a step as `kvslim "
                  "serve` batches them; t/s counts the tokens of all")
      ->delimiter(',')
      ->check(int_range(1, 256));
  sub->add_option("-r,--repetitions", a->reps, "repetitions of each test (llama-bench's default)")
      ->capture_default_str()
      ->check(int_range(1, 1 << 20));
  sub->add_option("-c,--ctx-size", a->ctx,
                  "context size in tokens (0 = the positions the tests reach: depth + prompt, or depth + the decode "
                  "repetitions); more leaves room for a press that runs the model after the context, such as "
                  "KVzip's replay")
      ->capture_default_str()
      ->check(int_range(0, 1 << 24));
  sub->add_option("-o,--output", a->output,
                  "stdout format: md (the table), csv, json or jsonl (one JSON row a line); other than md, the "
                  "table's lines go to stderr")
      ->capture_default_str()
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            if (v == "md" || v == "csv" || v == "json" || v == "jsonl") return "";
            return fmt::format("'{}' is not an output format (md, csv, json or jsonl)", printable(v, 40));
          },
          "md|csv|json|jsonl"));
  sub->add_option("-b,--batch", a->batch, "tokens per forward batch during prefill")->capture_default_str()
      ->check(int_range(1, 1 << 20));
  sub->add_option("--chunk-size", a->chunk_size, "compress after every chunk of this many tokens (0 = once)")
      ->capture_default_str()
      ->check(int_at_least(0));
  sub->add_option("--press", a->presses, "press spec, repeatable (see `kvslim presses`)")->capture_default_str();
  auto* ratio_opt = sub->add_option("--compression-ratio", a->ratio,
                                    "fraction of context entries each press removes, in [0, 1) (needs --press)")
                        ->capture_default_str();
  add_json_option(sub, a->json);
  add_no_progress_flag(sub, a->no_progress);
  add_progress_flag(sub, a->progress_lines);
  add_memory_check_flag(sub, a->no_memory_check);
  sub->add_option("-s,--seed", a->seed, "seed of the random token ids")->capture_default_str();
  add_cache_options(sub, a->cache_type_k, a->cache_type_v, a->kv_quant);
  sub->add_flag("--floor", a->floor,
                "time the memory's read rate around each decode test (256 MiB, 4 passes before and after, the "
                "same threads) and after every decode token (one pass, not counted as decode time), and print "
                "the decode rate as a share of the rate it allows when every byte a step needs is read once per "
                "token: the file's weight tensors (of the token embeddings one row, unless the output matrix "
                "reads the table) plus the KV cache (MB = 1e6 bytes); the paired line compares each token with "
                "the pass right after it");
  sub->callback([a, &action, ratio_opt] {
    a->ratio_given = ratio_opt->count() > 0;
    action = [a] { return run(*a); };
  });
}

}  // namespace kvslim::cli
