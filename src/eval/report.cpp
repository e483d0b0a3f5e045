// Records as JSON lines and CSV, summaries, and plots through gnuplot.
#include "eval/report.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <tuple>

#include <fmt/format.h>

#include "kvslim/error.h"

extern char** environ;

namespace kvslim {

namespace {

nlohmann::json cache_json(const CacheCheck& c) {
  return {{"context_tokens", c.context_tokens},
          {"requested_ratio", c.requested_ratio},
          {"entries_total", c.entries_total},
          {"entries_kept", c.entries_kept},
          {"compression_ratio", c.compression_ratio()},
          {"as_configured", c.as_configured},
          {"kept_per_layer", c.kept_per_layer},
          {"kv_bytes", c.kv_bytes},
          {"full_f16_bytes", c.full_f16_bytes},
          {"shared_bytes", c.shared_bytes},
          {"memory_ratio", c.memory_ratio()}};
}

nlohmann::json end_json(const EndCheck& e) {
  return {{"context_tokens", e.context_tokens},
          {"tokens", e.tokens},
          {"entries", e.entries},
          {"entries_total", e.entries_total},
          {"context_entries", e.context_entries},
          {"context_entries_total", e.context_entries_total},
          {"compression_ratio", e.compression_ratio()},
          {"kv_bytes", e.kv_bytes},
          {"full_f16_bytes", e.full_f16_bytes},
          {"memory_ratio", e.memory_ratio()}};
}

/// Reads field `k` of `j` as T, naming the record and the field when it is missing or mistyped.
template <class T>
T field(const nlohmann::json& j, const char* k, const std::string& what) {
  auto it = j.find(k);
  if (it == j.end()) throw Error(fmt::format("{}: field '{}' is missing", what, printable(k)));
  try {
    return it->get<T>();
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("{}: field '{}' has the wrong type ({})", what, printable(k), printable(e.what())));
  }
}

CacheCheck cache_from_json(const nlohmann::json& j, const std::string& what) {
  CacheCheck c;
  c.context_tokens = field<int>(j, "context_tokens", what);
  c.requested_ratio = field<double>(j, "requested_ratio", what);
  c.entries_total = field<size_t>(j, "entries_total", what);
  c.entries_kept = field<size_t>(j, "entries_kept", what);
  c.as_configured = field<bool>(j, "as_configured", what);
  c.kept_per_layer = field<std::vector<size_t>>(j, "kept_per_layer", what);
  c.kv_bytes = field<size_t>(j, "kv_bytes", what);
  c.full_f16_bytes = field<size_t>(j, "full_f16_bytes", what);
  if (j.contains("shared_bytes")) c.shared_bytes = field<size_t>(j, "shared_bytes", what);
  if (j.contains("needle_kept")) c.needle_kept = field<std::vector<double>>(j, "needle_kept", what);
  if (j.contains("needle_kept_per_layer"))
    c.needle_kept_per_layer = field<std::vector<std::vector<double>>>(j, "needle_kept_per_layer", what);
  return c;
}

EndCheck end_from_json(const nlohmann::json& j, const std::string& what) {
  const nlohmann::json e = field<nlohmann::json>(j, "end", what);
  const std::string w = what + " (end)";
  EndCheck c;
  c.context_tokens = field<int>(e, "context_tokens", w);
  c.tokens = field<int>(e, "tokens", w);
  c.entries = field<size_t>(e, "entries", w);
  c.entries_total = field<size_t>(e, "entries_total", w);
  c.context_entries = field<size_t>(e, "context_entries", w);
  c.context_entries_total = field<size_t>(e, "context_entries_total", w);
  c.kv_bytes = field<size_t>(e, "kv_bytes", w);
  c.full_f16_bytes = field<size_t>(e, "full_f16_bytes", w);
  return c;
}

std::string csv_quote(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

template <class T>
std::string joined(const std::vector<T>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += fmt::format("{}{}", i ? ";" : "", v[i]);
  return s;
}

std::string gp_quote(const std::string& s) {
  std::string q = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') q += '\\';
    q += c;
  }
  return q + "\"";
}

std::string terminal(const std::string& format, int w, int h) {
  if (format == "png") return fmt::format("set terminal pngcairo size {},{} noenhanced font \"sans,10\"\n", w, h);
  return fmt::format("set terminal svg size {},{} dynamic noenhanced font \"sans,12\"\n", w, h);
}

// Text layout estimates in canvas pixels. A character of the svg terminal's 12 px sans font is
// about 0.55 x 12 px wide on average; 0.6 x 12 leaves room for wide glyphs, and covers the png
// terminal's 10 pt font too. One line of text takes about 1.5 x 12 px.
constexpr double kCharPx = 0.6 * 12;
constexpr int kLinePx = 18;

/// `title` cut into lines of at most `width_px` (estimated): first at the ": " that separates
/// what a plot shows from where it comes from, then at ", ", then at spaces, then anywhere.
std::vector<std::string> wrap_title(const std::string& title, int width_px) {
  const size_t max = std::max<size_t>(16, static_cast<size_t>(width_px / kCharPx));
  std::vector<std::string> lines;
  std::string rest = title;
  bool first = true;
  while (rest.size() > max) {
    size_t cut = std::string::npos, skip = 0;
    const size_t colon = rest.find(": ");
    // Not after a short head ("NIAH:"), which would make a line of one word.
    if (first && colon != std::string::npos && colon >= 8 && colon + 1 <= max) {
      cut = colon + 1;
      skip = 1;
    } else {
      for (const char* sep : {", ", " "}) {
        const size_t at = rest.rfind(sep, max - std::strlen(sep) + 1);
        if (at != std::string::npos && at > 0) {
          cut = at + std::strlen(sep) - 1;
          skip = 1;
          break;
        }
      }
      if (cut == std::string::npos) cut = max;
    }
    lines.push_back(rest.substr(0, cut));
    rest = rest.substr(cut + skip);
    first = false;
  }
  lines.push_back(rest);
  return lines;
}

/// A gnuplot string of several lines (gnuplot's "\n" escape between them).
std::string gp_quote_lines(const std::vector<std::string>& lines) {
  std::string q;
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string one = gp_quote(lines[i]);
    q += i ? "\\n" + one.substr(1, one.size() - 2) : one.substr(0, one.size() - 1);
  }
  return q + "\"";
}

/// The script's head: terminal of `w` x `h` pixels plus the lines the wrapped title adds, output,
/// title and axis labels.
std::string plot_head(const std::string& format, int w, int h, const std::string& out_path, const std::string& title,
                      const std::string& xlabel, const std::string& ylabel) {
  // gnuplot centres the title on the plotting area, which the axis labels and a colour box move
  // off the canvas's centre by up to about 30 px.
  const std::vector<std::string> lines = wrap_title(title, w - 100);
  std::string s = terminal(format, w, h + kLinePx * static_cast<int>(lines.size() - 1));
  s += fmt::format("set output {}\nset title {}\nset xlabel {}\nset ylabel {}\n", gp_quote(out_path),
                   gp_quote_lines(lines), gp_quote(xlabel), gp_quote(ylabel));
  return s;
}

/// Writes the script next to the plot and runs gnuplot on it.
bool run_gnuplot(const std::string& script, const std::string& out_path, std::string* why) {
  const std::string gp = find_gnuplot();
  if (gp.empty()) {
    if (why) *why = "gnuplot is not on PATH (Debian package gnuplot-nox); plots skipped";
    return false;
  }
  const std::string script_path = out_path + ".gp", log_path = out_path + ".gp.log";
  {
    std::ofstream f(script_path, std::ios::binary);
    if (!f) {
      if (why) *why = fmt::format("{}: cannot write the gnuplot script", script_path);
      return false;
    }
    f << script;
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  std::vector<char*> argv{const_cast<char*>(gp.c_str()), const_cast<char*>(script_path.c_str()), nullptr};
  pid_t pid;
  int rc = posix_spawn(&pid, gp.c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) {
    if (why) *why = fmt::format("cannot start {}: {}", gp, std::strerror(rc));
    return false;
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  std::ifstream lf(log_path);
  std::stringstream log;
  log << lf.rdbuf();
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    if (why) *why = fmt::format("gnuplot failed on {}: {}", script_path, log.str());
    return false;
  }
  std::remove(log_path.c_str());
  return true;
}

}  // namespace

nlohmann::json to_json(const TaskRecord& r) {
  const TaskOutcome& o = r.outcome;
  nlohmann::json spans = nlohmann::json::array();
  for (const auto& [b, e] : r.needle_spans) spans.push_back({b, e});
  nlohmann::json j = {{"kind", "task"},
                      {"index", r.index},
                      {"task", r.task},
                      {"press", r.press},
                      {"press_spec", r.press_spec},
                      {"ratio", r.ratio},
                      {"length", r.length},
                      {"depth", r.depth},
                      {"measured_depth", r.measured_depth},
                      {"sample", r.sample},
                      {"seed", r.seed},
                      {"answers", r.answers},
                      {"answer", o.answer},
                      {"score", o.score},
                      {"question_tokens", o.question_tokens},
                      {"generated_tokens", o.generated_tokens},
                      {"needle_spans", spans},
                      {"needle_kept", o.cache.needle_kept},
                      {"needle_kept_per_layer", o.cache.needle_kept_per_layer},
                      {"prefill_seconds", o.prefill_seconds},
                      {"press_seconds", o.press_seconds},
                      {"decode_seconds", o.decode_seconds}};
  j.update(cache_json(o.cache));
  j["end"] = end_json(o.end);
  return j;
}

TaskRecord task_record_from_json(const nlohmann::json& j, const std::string& what) {
  TaskRecord r;
  r.index = field<size_t>(j, "index", what);
  r.task = field<std::string>(j, "task", what);
  r.press = field<std::string>(j, "press", what);
  r.press_spec = field<std::string>(j, "press_spec", what);
  r.ratio = field<double>(j, "ratio", what);
  r.length = field<int>(j, "length", what);
  r.depth = field<double>(j, "depth", what);
  r.measured_depth = field<double>(j, "measured_depth", what);
  r.sample = field<int>(j, "sample", what);
  r.seed = field<uint64_t>(j, "seed", what);
  r.answers = field<std::vector<std::string>>(j, "answers", what);
  for (const auto& sp : field<std::vector<std::vector<int>>>(j, "needle_spans", what)) {
    if (sp.size() != 2) throw Error(fmt::format("{}: field 'needle_spans' holds a span without 2 ends", what));
    r.needle_spans.emplace_back(sp[0], sp[1]);
  }
  TaskOutcome& o = r.outcome;
  o.answer = field<std::string>(j, "answer", what);
  o.score = field<double>(j, "score", what);
  o.question_tokens = field<int>(j, "question_tokens", what);
  o.generated_tokens = field<int>(j, "generated_tokens", what);
  o.prefill_seconds = field<double>(j, "prefill_seconds", what);
  o.press_seconds = field<double>(j, "press_seconds", what);
  o.decode_seconds = field<double>(j, "decode_seconds", what);
  o.cache = cache_from_json(j, what);
  o.end = end_from_json(j, what);
  return r;
}

nlohmann::json to_json(const FidelityRecord& r) {
  const FidelityAccumulator& m = r.outcome.metrics;
  nlohmann::json j = {{"kind", "fidelity"},
                      {"index", r.index},
                      {"press", r.press},
                      {"press_spec", r.press_spec},
                      {"ratio", r.ratio},
                      {"sample", r.sample},
                      {"tokens", m.tokens()},
                      {"kl", m.mean_kl()},
                      {"kl_max", m.max_kl()},
                      {"top1_agreement", m.top1_agreement()},
                      {"ppl_full", m.perplexity_full()},
                      {"ppl_compressed", m.perplexity_compressed()},
                      {"seconds", r.outcome.seconds},
                      // The accumulator's sums, so summaries of records read back are exact.
                      {"sums",
                       {{"top1_agreements", m.top1_agreements()},
                        {"kl", m.kl_sum()},
                        {"nll_full", m.nll_full_sum()},
                        {"nll_compressed", m.nll_compressed_sum()}}}};
  j.update(cache_json(r.outcome.cache));
  j["end"] = end_json(r.outcome.end);
  return j;
}

FidelityRecord fidelity_record_from_json(const nlohmann::json& j, const std::string& what) {
  FidelityRecord r;
  r.index = field<size_t>(j, "index", what);
  r.press = field<std::string>(j, "press", what);
  r.press_spec = field<std::string>(j, "press_spec", what);
  r.ratio = field<double>(j, "ratio", what);
  r.sample = field<int>(j, "sample", what);
  const nlohmann::json sums = field<nlohmann::json>(j, "sums", what);
  const std::string ws = what + " (sums)";
  r.outcome.metrics = FidelityAccumulator::from_sums(
      field<size_t>(j, "tokens", what), field<size_t>(sums, "top1_agreements", ws), field<double>(sums, "kl", ws),
      field<double>(j, "kl_max", what), field<double>(sums, "nll_full", ws), field<double>(sums, "nll_compressed", ws));
  r.outcome.seconds = field<double>(j, "seconds", what);
  r.outcome.cache = cache_from_json(j, what);
  r.outcome.end = end_from_json(j, what);
  return r;
}

AttentionStats attention_stats_from_json(const nlohmann::json& j, int* sample, const std::string& what) {
  AttentionStats s;
  if (sample) *sample = field<int>(j, "sample", what);
  s.context_tokens = field<int>(j, "context_tokens", what);
  s.window = field<int>(j, "window", what);
  s.tau = field<double>(j, "tau", what);
  s.lmba = field<std::vector<double>>(j, "lmba", what);
  s.mba = field<std::vector<std::vector<int>>>(j, "mba", what);
  return s;
}

nlohmann::json to_json(const AttentionStats& s, int sample) {
  return {{"kind", "attention"}, {"sample", sample}, {"context_tokens", s.context_tokens}, {"window", s.window},
          {"tau", s.tau},        {"lmba", s.lmba},   {"mba", s.mba}};
}

std::string csv_header(const TaskRecord&) {
  return "task,press_spec,press,ratio,length,depth,measured_depth,sample,seed,context_tokens,question_tokens,"
         "generated_tokens,score,answer,answers,entries_kept,entries_total,compression_ratio,as_configured,"
         "kv_bytes,full_f16_bytes,memory_ratio,needle_kept,kept_per_layer,end_tokens,end_compression_ratio,"
         "end_memory_ratio,prefill_seconds,decode_seconds";
}

std::string csv_row(const TaskRecord& r) {
  const TaskOutcome& o = r.outcome;
  const CacheCheck& c = o.cache;
  return fmt::format(
      "{},{},{},{},{},{},{:.4f},{},{},{},{},{},{},{},{},{},{},{:.6f},{},{},{},{:.6f},{},{},{},{:.6f},{:.6f},{:.4f},"
      "{:.4f}",
      r.task, csv_quote(r.press_spec), csv_quote(r.press), r.ratio, r.length, r.depth, r.measured_depth, r.sample,
      r.seed, c.context_tokens, o.question_tokens, o.generated_tokens, o.score, csv_quote(o.answer),
      csv_quote(joined(r.answers)), c.entries_kept, c.entries_total, c.compression_ratio(), c.as_configured ? 1 : 0,
      c.kv_bytes, c.full_f16_bytes, c.memory_ratio(), joined(c.needle_kept), joined(c.kept_per_layer), o.end.tokens,
      o.end.compression_ratio(), o.end.memory_ratio(), o.prefill_seconds, o.decode_seconds);
}

std::string csv_header(const FidelityRecord&) {
  return "press_spec,press,ratio,sample,tokens,kl,kl_max,top1_agreement,ppl_full,ppl_compressed,context_tokens,"
         "entries_kept,entries_total,compression_ratio,as_configured,kv_bytes,full_f16_bytes,memory_ratio,"
         "kept_per_layer,end_tokens,end_compression_ratio,end_memory_ratio,seconds";
}

std::string csv_row(const FidelityRecord& r) {
  const FidelityAccumulator& m = r.outcome.metrics;
  const CacheCheck& c = r.outcome.cache;
  const EndCheck& e = r.outcome.end;
  return fmt::format(
      "{},{},{},{},{},{:.6g},{:.6g},{:.6f},{:.6f},{:.6f},{},{},{},{:.6f},{},{},{},{:.6f},{},{},{:.6f},{:.6f},{:.4f}",
      csv_quote(r.press_spec), csv_quote(r.press), r.ratio, r.sample, m.tokens(), m.mean_kl(), m.max_kl(),
      m.top1_agreement(), m.perplexity_full(), m.perplexity_compressed(), c.context_tokens, c.entries_kept,
      c.entries_total, c.compression_ratio(), c.as_configured ? 1 : 0, c.kv_bytes, c.full_f16_bytes, c.memory_ratio(),
      joined(c.kept_per_layer), e.tokens, e.compression_ratio(), e.memory_ratio(), r.outcome.seconds);
}

double student_t975(int df) {
  static const double table[30] = {12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
                                   2.201,  2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
                                   2.080,  2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042};
  if (df < 1) throw Error(fmt::format("Student's t quantile: {} degrees of freedom (need >= 1)", df));
  if (df <= 30) return table[df - 1];
  const double z = 1.959964;
  return z + (z * z * z + z) / (4.0 * df);
}

Interval wilson_interval(double p, int n) {
  if (n < 1) return {p, p};
  const double z = 1.959964, z2 = z * z, nn = n;
  const double denom = 1.0 + z2 / nn;
  const double centre = (p + z2 / (2 * nn)) / denom;
  const double half = z / denom * std::sqrt(std::max(0.0, p * (1 - p) / nn + z2 / (4 * nn * nn)));
  // At p = 0 (or 1) the bound is exactly 0 (1); rounding would leave 1e-17.
  return {p <= 0 ? 0.0 : std::max(0.0, centre - half), p >= 1 ? 1.0 : std::min(1.0, centre + half)};
}

Interval t_interval(const std::vector<double>& v, double centre) {
  if (v.size() < 2) return {std::nan(""), std::nan("")};
  double mean = 0;
  for (double x : v) mean += x;
  mean /= v.size();
  double ss = 0;
  for (double x : v) ss += (x - mean) * (x - mean);
  const double half = student_t975(static_cast<int>(v.size()) - 1) * std::sqrt(ss / (v.size() - 1) / v.size());
  return {centre - half, centre + half};
}

std::vector<TaskSummary> summarize(const std::vector<TaskRecord>& recs, bool by_ld) {
  std::vector<TaskSummary> out;
  std::map<std::tuple<std::string, std::string, double, int, double>, size_t> index;
  for (const auto& r : recs) {
    const int length = by_ld ? r.length : 0;
    const double depth = by_ld ? r.depth : 0.0;
    auto key = std::make_tuple(r.task, r.press_spec, r.ratio, length, depth);
    auto it = index.find(key);
    if (it == index.end()) {
      it = index.emplace(key, out.size()).first;
      TaskSummary s;
      s.task = r.task;
      s.press_spec = r.press_spec;
      s.ratio = r.ratio;
      s.all_lengths = s.all_depths = !by_ld;
      s.length = length;
      s.depth = depth;
      out.push_back(s);
    }
    TaskSummary& s = out[it->second];
    const CacheCheck& c = r.outcome.cache;
    s.n += 1;
    s.score += r.outcome.score;
    s.compression_ratio += r.outcome.end.compression_ratio();
    s.memory_ratio += r.outcome.end.memory_ratio();
    s.prefill_compression_ratio += c.compression_ratio();
    s.prefill_memory_ratio += c.memory_ratio();
    s.needle_kept += c.min_needle_kept();
    s.not_as_configured += c.as_configured ? 0 : 1;
  }
  for (auto& s : out) {
    s.score /= s.n;
    s.score_ci = wilson_interval(s.score, s.n);
    s.compression_ratio /= s.n;
    s.memory_ratio /= s.n;
    s.prefill_compression_ratio /= s.n;
    s.prefill_memory_ratio /= s.n;
    s.needle_kept /= s.n;
  }
  return out;
}

std::vector<FidelitySummary> summarize(const std::vector<FidelityRecord>& recs) {
  std::vector<FidelitySummary> out;
  std::vector<std::vector<double>> kl, top1, ppl;
  std::map<std::pair<std::string, double>, size_t> index;
  for (const auto& r : recs) {
    auto key = std::make_pair(r.press_spec, r.ratio);
    auto it = index.find(key);
    if (it == index.end()) {
      it = index.emplace(key, out.size()).first;
      FidelitySummary s;
      s.press_spec = r.press_spec;
      s.ratio = r.ratio;
      out.push_back(s);
      kl.emplace_back();
      top1.emplace_back();
      ppl.emplace_back();
    }
    FidelitySummary& s = out[it->second];
    const FidelityAccumulator& m = r.outcome.metrics;
    s.samples += 1;
    s.metrics.merge(m);
    kl[it->second].push_back(m.mean_kl());
    top1[it->second].push_back(m.top1_agreement());
    ppl[it->second].push_back(m.perplexity_compressed());
    s.compression_ratio += r.outcome.end.compression_ratio();
    s.memory_ratio += r.outcome.end.memory_ratio();
    s.prefill_compression_ratio += r.outcome.cache.compression_ratio();
    s.prefill_memory_ratio += r.outcome.cache.memory_ratio();
    s.not_as_configured += r.outcome.cache.as_configured ? 0 : 1;
  }
  for (size_t i = 0; i < out.size(); ++i) {
    auto& s = out[i];
    s.compression_ratio /= s.samples;
    s.memory_ratio /= s.samples;
    s.prefill_compression_ratio /= s.samples;
    s.prefill_memory_ratio /= s.samples;
    // A t interval knows nothing of the metric's range: KL >= 0, top-1 in [0, 1], perplexity >= 1.
    // A one-sample interval is undefined (NaN); std::max would turn it into the bound.
    auto cut = [](Interval i, double lo, double hi) {
      if (std::isnan(i.low)) return i;
      return Interval{std::max(lo, i.low), std::min(hi, i.high)};
    };
    const double inf = std::numeric_limits<double>::infinity();
    s.kl_ci = cut(t_interval(kl[i], s.metrics.mean_kl()), 0.0, inf);
    s.top1_ci = cut(t_interval(top1[i], s.metrics.top1_agreement()), 0.0, 1.0);
    s.ppl_ci = cut(t_interval(ppl[i], s.metrics.perplexity_compressed()), 1.0, inf);
  }
  return out;
}

std::string csv_header(const TaskSummary&) {
  return "task,press_spec,ratio,length,depth,samples,score,score_ci_low,score_ci_high,compression_ratio,"
         "memory_ratio,prefill_compression_ratio,prefill_memory_ratio,needle_kept,not_as_configured";
}

std::string csv_row(const TaskSummary& s) {
  const std::string length = s.all_lengths ? "all" : std::to_string(s.length);
  const std::string depth = s.all_depths ? "all" : s.depth < 0 ? "random" : fmt::format("{}", s.depth);
  return fmt::format("{},{},{},{},{},{},{:.4f},{:.4f},{:.4f},{:.4f},{:.4f},{:.4f},{:.4f},{:.4f},{}", s.task,
                     csv_quote(s.press_spec), s.ratio, length, depth, s.n, s.score, s.score_ci.low, s.score_ci.high,
                     s.compression_ratio, s.memory_ratio, s.prefill_compression_ratio, s.prefill_memory_ratio,
                     s.needle_kept, s.not_as_configured);
}

std::string csv_header(const FidelitySummary&) {
  return "press_spec,ratio,samples,tokens,kl,kl_ci_low,kl_ci_high,kl_max,top1_agreement,top1_ci_low,top1_ci_high,"
         "ppl_full,ppl_compressed,ppl_ci_low,ppl_ci_high,compression_ratio,memory_ratio,prefill_compression_ratio,"
         "prefill_memory_ratio,not_as_configured";
}

std::string csv_row(const FidelitySummary& s) {
  const FidelityAccumulator& m = s.metrics;
  return fmt::format(
      "{},{},{},{},{:.6g},{:.6g},{:.6g},{:.6g},{:.4f},{:.4f},{:.4f},{:.4f},{:.4f},{:.4f},{:.4f},{:.4f},{:.4f},{:.4f},"
      "{:.4f},{}",
      csv_quote(s.press_spec), s.ratio, s.samples, m.tokens(), m.mean_kl(), s.kl_ci.low, s.kl_ci.high, m.max_kl(),
      m.top1_agreement(), s.top1_ci.low, s.top1_ci.high, m.perplexity_full(), m.perplexity_compressed(),
      s.ppl_ci.low, s.ppl_ci.high, s.compression_ratio, s.memory_ratio, s.prefill_compression_ratio,
      s.prefill_memory_ratio, s.not_as_configured);
}

std::string find_gnuplot() {
  const char* path = std::getenv("PATH");
  std::string p = path ? path : "/usr/bin:/bin";
  size_t i = 0;
  while (i <= p.size()) {
    size_t j = p.find(':', i);
    if (j == std::string::npos) j = p.size();
    std::string dir = p.substr(i, j - i);
    if (dir.empty()) dir = ".";
    std::string cand = dir + "/gnuplot";
    if (access(cand.c_str(), X_OK) == 0) return cand;
    i = j + 1;
  }
  return "";
}

void check_plot_format(const std::string& format) {
  if (format != "svg" && format != "png")
    throw Error(fmt::format("plot format '{}' is not supported (svg or png)", printable(format)));
}

std::string file_safe(const std::string& s) {
  std::string r;
  for (char c : s) r += (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_') ? c : '_';
  return r;
}

bool plot_lines(const LinePlot& p, const std::string& out_path, const std::string& format, std::string* why) {
  std::string s;
  s += "set grid\n";
  // From 0 to 5% past the largest x, so no point sits on the border (gnuplot's autoscale stops at
  // the data when no tic lies beyond it).
  double max_x = 0;
  for (const auto& se : p.series)
    for (const auto& pt : se.points) max_x = std::max(max_x, pt.x);
  s += p.x_unit_range ? "set xrange [-0.02:1.02]\n"
       : max_x > 0    ? fmt::format("set xrange [0:{}]\n", max_x * 1.05)
                      : "set xrange [0:*]\n";
  if (p.y_unit_range) s += "set yrange [-0.02:1.02]\n";
  if (p.log_y) s += "set logscale y\nset format y \"%g\"\n";
  // On a log axis a non-positive value (a KL of exactly 0) has no place; its bar is cut at the
  // smallest positive value drawn, divided by 10.
  double floor_y = 0;
  if (p.log_y) {
    double m = 0;
    for (const auto& se : p.series)
      for (const auto& pt : se.points)
        if (pt.y > 0 && (m == 0 || pt.y < m)) m = pt.y;
    floor_y = m > 0 ? m / 10 : 1e-12;
  }
  std::vector<size_t> drawn;
  for (size_t i = 0; i < p.series.size(); ++i) {
    std::string rows;
    for (const auto& pt : p.series[i].points) {
      if (p.log_y && !(pt.y > 0)) continue;
      const double lo = p.log_y ? std::max(pt.low, floor_y) : pt.low;
      rows += fmt::format("{} {} {} {}\n", pt.x, pt.y, lo, pt.high);
    }
    if (rows.empty()) continue;
    s += fmt::format("$s{} << EOD\n{}EOD\n", i, rows);
    drawn.push_back(i);
  }
  // The key goes below the plot, in as many columns of the longest entry as the width holds; the
  // canvas grows by its rows so the plotting area keeps its size whatever the entries' lengths.
  std::vector<std::string> keys;
  for (size_t i : drawn) keys.push_back(p.series[i].name);
  const bool baseline = p.has_baseline && (!p.log_y || p.baseline > 0);
  if (baseline) keys.push_back(p.baseline_label);
  const int width = 860;
  size_t longest = 0;
  for (const auto& k : keys) longest = std::max(longest, k.size());
  // A column: the line sample (samplen 3, about 4 characters), the text, a gap of 4 characters.
  const int col_px = static_cast<int>((longest + 8) * kCharPx);
  const int cols = std::clamp((width - 40) / std::max(col_px, 1), 1, std::max<int>(1, static_cast<int>(keys.size())));
  const int rows = keys.empty() ? 0 : (static_cast<int>(keys.size()) + cols - 1) / cols;
  s = plot_head(format, width, 500 + kLinePx * rows, out_path, p.title, p.xlabel, p.ylabel) + s;
  s += fmt::format("set key outside below center horizontal reverse Left samplen 3 height 1 maxcols {}\n", cols);
  std::string plot;
  for (size_t k = 0; k < drawn.size(); ++k) {
    const size_t i = drawn[k];
    // Dash and point types vary too, so coinciding lines stay distinguishable.
    plot += fmt::format("{}$s{} using 1:2:3:4 with yerrorlines lw 2 dt {} pt {} title {}", plot.empty() ? "" : ", ", i,
                        i % 5 + 1, (i % 7) + 4, gp_quote(p.series[i].name));
  }
  if (baseline)
    plot += fmt::format("{}{} with lines lw 2 dt 2 lc rgb \"black\" title {}", plot.empty() ? "" : ", ", p.baseline,
                        gp_quote(p.baseline_label));
  s += plot.empty() ? "plot NaN notitle\n" : "plot " + plot + "\n";
  return run_gnuplot(s, out_path, why);
}

bool plot_heatmap(const std::vector<std::vector<double>>& z, const std::vector<std::string>& rows,
                  const std::vector<std::string>& cols, const std::string& title, const std::string& xlabel,
                  const std::string& ylabel, const std::string& out_path, const std::string& format, std::string* why,
                  const std::string& cblabel) {
  std::string s = plot_head(format, 700, 500, out_path, title, xlabel, ylabel);
  s += "set cbrange [0:1]\nset palette defined (0 '#b2182b', 0.5 '#fee08b', 1 '#1a9850')\n";
  s += fmt::format("set cblabel {}\n", gp_quote(cblabel));
  s += fmt::format("set xrange [-0.5:{}]\nset yrange [-0.5:{}]\n", cols.size() - 0.5, rows.size() - 0.5);
  std::string xt, yt;
  for (size_t c = 0; c < cols.size(); ++c) xt += fmt::format("{}{} {}", c ? ", " : "", gp_quote(cols[c]), c);
  for (size_t r = 0; r < rows.size(); ++r) yt += fmt::format("{}{} {}", r ? ", " : "", gp_quote(rows[r]), r);
  s += fmt::format("set xtics ({})\nset ytics ({})\n$grid << EOD\n", xt, yt);
  for (size_t r = 0; r < z.size(); ++r)
    for (size_t c = 0; c < z[r].size(); ++c) s += fmt::format("{} {} {}\n", c, r, z[r][c]);
  // One filled box per cell (half-widths 0.5): gnuplot's `with image` draws nothing for a grid
  // of one row or one column ("Image grid must be at least 4 points"), e.g. a single length.
  s += "EOD\nplot $grid using 1:2:(0.5):(0.5):3 with boxxyerror fs solid 1.0 noborder fc palette notitle, "
       "$grid using 1:2:(sprintf(\"%.2f\",$3)) with labels notitle\n";
  return run_gnuplot(s, out_path, why);
}

bool plot_bars(const std::vector<double>& values, const std::string& title, const std::string& xlabel,
               const std::string& ylabel, const std::string& out_path, const std::string& format, std::string* why) {
  std::string s = plot_head(format, 700, 450, out_path, title, xlabel, ylabel);
  s += "set style fill solid 0.7\nset boxwidth 0.7\nset grid ytics\nset yrange [0:*]\nset xtics 1\n$bars << EOD\n";
  for (size_t i = 0; i < values.size(); ++i) s += fmt::format("{} {}\n", i, values[i]);
  s += fmt::format("EOD\nset xrange [-0.6:{}]\nplot $bars using 1:2 with boxes notitle\n", values.size() - 0.4);
  return run_gnuplot(s, out_path, why);
}

}  // namespace kvslim
