// Records as JSON lines and CSV, summaries, and plots through gnuplot.
#include "kvslim/eval_report.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

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
          {"memory_ratio", c.memory_ratio()}};
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
  return j;
}

nlohmann::json to_json(const FidelityRecord& r) {
  const FidelityAccumulator& m = r.outcome.metrics;
  nlohmann::json j = {{"kind", "fidelity"},
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
                      {"seconds", r.outcome.seconds}};
  j.update(cache_json(r.outcome.cache));
  return j;
}

nlohmann::json to_json(const AttentionStats& s, int sample) {
  return {{"kind", "attention"}, {"sample", sample}, {"context_tokens", s.context_tokens}, {"window", s.window},
          {"tau", s.tau},        {"lmba", s.lmba},   {"mba", s.mba}};
}

std::string csv_header(const TaskRecord&) {
  return "task,press_spec,press,ratio,length,depth,measured_depth,sample,seed,context_tokens,question_tokens,"
         "generated_tokens,score,answer,answers,entries_kept,entries_total,compression_ratio,as_configured,"
         "kv_bytes,full_f16_bytes,memory_ratio,needle_kept,kept_per_layer,prefill_seconds,decode_seconds";
}

std::string csv_row(const TaskRecord& r) {
  const TaskOutcome& o = r.outcome;
  const CacheCheck& c = o.cache;
  return fmt::format("{},{},{},{},{},{},{:.4f},{},{},{},{},{},{},{},{},{},{},{:.6f},{},{},{},{:.6f},{},{},{:.4f},{:.4f}",
                     r.task, csv_quote(r.press_spec), csv_quote(r.press), r.ratio, r.length, r.depth,
                     r.measured_depth, r.sample, r.seed, c.context_tokens, o.question_tokens, o.generated_tokens,
                     o.score, csv_quote(o.answer), csv_quote(joined(r.answers)), c.entries_kept, c.entries_total,
                     c.compression_ratio(), c.as_configured ? 1 : 0, c.kv_bytes, c.full_f16_bytes, c.memory_ratio(),
                     joined(c.needle_kept), joined(c.kept_per_layer), o.prefill_seconds, o.decode_seconds);
}

std::string csv_header(const FidelityRecord&) {
  return "press_spec,press,ratio,sample,tokens,kl,kl_max,top1_agreement,ppl_full,ppl_compressed,context_tokens,"
         "entries_kept,entries_total,compression_ratio,as_configured,kv_bytes,full_f16_bytes,memory_ratio,"
         "kept_per_layer,seconds";
}

std::string csv_row(const FidelityRecord& r) {
  const FidelityAccumulator& m = r.outcome.metrics;
  const CacheCheck& c = r.outcome.cache;
  return fmt::format("{},{},{},{},{},{:.6g},{:.6g},{:.6f},{:.6f},{:.6f},{},{},{},{:.6f},{},{},{},{:.6f},{},{:.4f}",
                     csv_quote(r.press_spec), csv_quote(r.press), r.ratio, r.sample, m.tokens(), m.mean_kl(),
                     m.max_kl(), m.top1_agreement(), m.perplexity_full(), m.perplexity_compressed(), c.context_tokens,
                     c.entries_kept, c.entries_total, c.compression_ratio(), c.as_configured ? 1 : 0, c.kv_bytes,
                     c.full_f16_bytes, c.memory_ratio(), joined(c.kept_per_layer), r.outcome.seconds);
}

std::vector<TaskSummary> summarize(const std::vector<TaskRecord>& recs, bool by_ld) {
  std::vector<TaskSummary> out;
  std::map<std::tuple<std::string, std::string, double, int, double>, size_t> index;
  for (const auto& r : recs) {
    const int length = by_ld ? r.length : -1;
    const double depth = by_ld ? r.depth : -2.0;
    auto key = std::make_tuple(r.task, r.press_spec, r.ratio, length, depth);
    auto it = index.find(key);
    if (it == index.end()) {
      it = index.emplace(key, out.size()).first;
      TaskSummary s;
      s.task = r.task;
      s.press_spec = r.press_spec;
      s.ratio = r.ratio;
      s.length = length;
      s.depth = depth;
      out.push_back(s);
    }
    TaskSummary& s = out[it->second];
    const CacheCheck& c = r.outcome.cache;
    s.n += 1;
    s.score += r.outcome.score;
    s.compression_ratio += c.compression_ratio();
    s.memory_ratio += c.memory_ratio();
    s.needle_kept += c.min_needle_kept();
    s.not_as_configured += c.as_configured ? 0 : 1;
  }
  for (auto& s : out) {
    s.score /= s.n;
    s.compression_ratio /= s.n;
    s.memory_ratio /= s.n;
    s.needle_kept /= s.n;
  }
  return out;
}

std::vector<FidelitySummary> summarize(const std::vector<FidelityRecord>& recs) {
  std::vector<FidelitySummary> out;
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
    }
    FidelitySummary& s = out[it->second];
    s.samples += 1;
    s.metrics.merge(r.outcome.metrics);
    s.compression_ratio += r.outcome.cache.compression_ratio();
    s.memory_ratio += r.outcome.cache.memory_ratio();
    s.not_as_configured += r.outcome.cache.as_configured ? 0 : 1;
  }
  for (auto& s : out) {
    s.compression_ratio /= s.samples;
    s.memory_ratio /= s.samples;
  }
  return out;
}

std::string csv_header(const TaskSummary&) {
  return "task,press_spec,ratio,length,depth,samples,score,compression_ratio,memory_ratio,needle_kept,"
         "not_as_configured";
}

std::string csv_row(const TaskSummary& s) {
  return fmt::format("{},{},{},{},{},{},{:.4f},{:.4f},{:.4f},{:.4f},{}", s.task, csv_quote(s.press_spec), s.ratio,
                     s.length, s.depth, s.n, s.score, s.compression_ratio, s.memory_ratio, s.needle_kept,
                     s.not_as_configured);
}

std::string csv_header(const FidelitySummary&) {
  return "press_spec,ratio,samples,tokens,kl,kl_max,top1_agreement,ppl_full,ppl_compressed,compression_ratio,"
         "memory_ratio,not_as_configured";
}

std::string csv_row(const FidelitySummary& s) {
  const FidelityAccumulator& m = s.metrics;
  return fmt::format("{},{},{},{},{:.6g},{:.6g},{:.4f},{:.4f},{:.4f},{:.4f},{:.4f},{}", csv_quote(s.press_spec),
                     s.ratio, s.samples, m.tokens(), m.mean_kl(), m.max_kl(), m.top1_agreement(), m.perplexity_full(),
                     m.perplexity_compressed(), s.compression_ratio, s.memory_ratio, s.not_as_configured);
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
    throw Error(fmt::format("plot format '{}' is not supported (svg or png)", format));
}

std::string file_safe(const std::string& s) {
  std::string r;
  for (char c : s) r += (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_') ? c : '_';
  return r;
}

bool plot_lines(const std::vector<PlotSeries>& series, const std::string& title, const std::string& xlabel,
                const std::string& ylabel, const std::string& out_path, const std::string& format, std::string* why,
                bool y_unit_range) {
  std::string s = terminal(format, 800, 500);
  s += fmt::format("set output {}\nset title {}\nset xlabel {}\nset ylabel {}\n", gp_quote(out_path), gp_quote(title),
                   gp_quote(xlabel), gp_quote(ylabel));
  s += "set key outside right\nset grid\nset xrange [-0.02:1]\n";
  if (y_unit_range) s += "set yrange [-0.02:1.02]\n";
  for (size_t i = 0; i < series.size(); ++i) {
    s += fmt::format("$s{} << EOD\n", i);
    for (const auto& [x, y] : series[i].points) s += fmt::format("{} {}\n", x, y);
    s += "EOD\n";
  }
  s += "plot ";
  for (size_t i = 0; i < series.size(); ++i)
    // Dash and point types vary too, so coinciding lines stay distinguishable.
    s += fmt::format("{}$s{} using 1:2 with linespoints lw 2 dt {} pt {} title {}", i ? ", " : "", i, i % 5 + 1,
                     (i % 7) + 4, gp_quote(series[i].name));
  s += "\n";
  if (series.empty()) s += "NaN notitle\n";
  return run_gnuplot(s, out_path, why);
}

bool plot_heatmap(const std::vector<std::vector<double>>& z, const std::vector<std::string>& rows,
                  const std::vector<std::string>& cols, const std::string& title, const std::string& xlabel,
                  const std::string& ylabel, const std::string& out_path, const std::string& format, std::string* why,
                  const std::string& cblabel) {
  std::string s = terminal(format, 700, 500);
  s += fmt::format("set output {}\nset title {}\nset xlabel {}\nset ylabel {}\n", gp_quote(out_path), gp_quote(title),
                   gp_quote(xlabel), gp_quote(ylabel));
  s += "set cbrange [0:1]\nset palette defined (0 '#b2182b', 0.5 '#fee08b', 1 '#1a9850')\n";
  s += fmt::format("set cblabel {}\n", gp_quote(cblabel));
  s += fmt::format("set xrange [-0.5:{}]\nset yrange [-0.5:{}]\n", cols.size() - 0.5, rows.size() - 0.5);
  std::string xt, yt;
  for (size_t c = 0; c < cols.size(); ++c) xt += fmt::format("{}{} {}", c ? ", " : "", gp_quote(cols[c]), c);
  for (size_t r = 0; r < rows.size(); ++r) yt += fmt::format("{}{} {}", r ? ", " : "", gp_quote(rows[r]), r);
  s += fmt::format("set xtics ({})\nset ytics ({})\n$grid << EOD\n", xt, yt);
  for (size_t r = 0; r < z.size(); ++r)
    for (size_t c = 0; c < z[r].size(); ++c) s += fmt::format("{} {} {}\n", c, r, z[r][c]);
  s += "EOD\nplot $grid using 1:2:3 with image notitle, $grid using 1:2:(sprintf(\"%.2f\",$3)) with labels notitle\n";
  return run_gnuplot(s, out_path, why);
}

bool plot_bars(const std::vector<double>& values, const std::string& title, const std::string& xlabel,
               const std::string& ylabel, const std::string& out_path, const std::string& format, std::string* why) {
  std::string s = terminal(format, 700, 450);
  s += fmt::format("set output {}\nset title {}\nset xlabel {}\nset ylabel {}\n", gp_quote(out_path), gp_quote(title),
                   gp_quote(xlabel), gp_quote(ylabel));
  s += "set style fill solid 0.7\nset boxwidth 0.7\nset grid ytics\nset yrange [0:*]\nset xtics 1\n$bars << EOD\n";
  for (size_t i = 0; i < values.size(); ++i) s += fmt::format("{} {}\n", i, values[i]);
  s += fmt::format("EOD\nset xrange [-0.6:{}]\nplot $bars using 1:2 with boxes notitle\n", values.size() - 0.4);
  return run_gnuplot(s, out_path, why);
}

}  // namespace kvslim
