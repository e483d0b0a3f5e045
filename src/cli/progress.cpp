#include "cli/progress.h"

#include <unistd.h>

#include <chrono>

#include <fmt/format.h>

namespace kvslim::cli {

namespace {

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

constexpr double kQuietSeconds = 1.0;   // steps shorter than this print nothing
constexpr double kRedrawSeconds = 0.1;  // at most 10 redraws a second
constexpr double kLineSeconds = 1.0;    // whole lines (not a terminal) at most once a second
constexpr size_t kWidth = 100;          // the line is cut to fit an 80-120 column terminal

// "45s", "4m08s", "2h03m".
std::string duration(double s) {
  if (!(s >= 0) || s > 1e8) return "?";
  const long t = static_cast<long>(s + 0.5);
  if (t < 60) return fmt::format("{}s", t);
  if (t < 3600) return fmt::format("{}m{:02}s", t / 60, t % 60);
  return fmt::format("{}h{:02}m", t / 3600, t % 3600 / 60);
}

std::string bytes(size_t b) {
  if (b >= (size_t{1} << 30)) return fmt::format("{:.2f} GiB", double(b) / double(size_t{1} << 30));
  if (b >= (size_t{1} << 20)) return fmt::format("{:.1f} MiB", double(b) / double(size_t{1} << 20));
  return fmt::format("{:.1f} KiB", double(b) / 1024.0);
}

}  // namespace

Progress::Progress(bool enabled, bool lines)
    : Progress(enabled, isatty(STDERR_FILENO) != 0, stderr, steady_seconds, lines) {}

Progress::Progress(bool enabled, bool tty, std::FILE* out, std::function<double()> clock, bool lines)
    : on_(enabled && (tty || lines)), lines_(!tty), out_(out), clock_(std::move(clock)) {
  if (on_) t0_ = clock_();
}

Progress::~Progress() { clear(); }

void Progress::update(size_t done, size_t total, const std::string& what) {
  if (!on_) return;
  const double now = clock_() - t0_;
  std::string line;
  if (total) {
    const double frac = std::min(1.0, double(done) / double(total));
    const std::string eta = done ? fmt::format("{:.0f}s left", now / done * (total - std::min(done, total))) : "";
    line = fmt::format("{}/{} {:3.0f}% {:.0f}s {} {}", done, total, 100 * frac, now, eta, what);
  } else {
    line = fmt::format("{} {:.0f}s {}", done, now, what);
  }
  draw(line, total && done >= total);
}

void Progress::prefill(size_t done, size_t total, size_t kv_bytes) {
  if (!on_) return;
  const double now = clock_() - t0_;
  const double rate = now > 0 ? double(done) / now : 0.0;
  const size_t left = total > done ? total - done : 0;
  std::string line = fmt::format("prefill {}/{} tokens ({:.0f}%), {:.1f} tokens/s, {} elapsed, {} left, KV {}", done,
                                 total, total ? 100.0 * std::min(1.0, double(done) / double(total)) : 0.0, rate,
                                 duration(now), rate > 0 ? duration(double(left) / rate) : std::string("?"),
                                 bytes(kv_bytes));
  draw(line, total && done >= total);
}

void Progress::draw(const std::string& text, bool final) {
  const double now = clock_() - t0_;
  if (now < kQuietSeconds) return;
  if (drawn_ && now - last_ < (lines_ ? kLineSeconds : kRedrawSeconds) && !(final && !lines_)) return;
  last_ = now;
  std::string line = text;
  if (lines_) {
    fmt::print(out_, "{}\n", line);
    std::fflush(out_);
    drawn_ = true;
    return;
  }
  if (line.size() > kWidth) line.resize(kWidth);
  fmt::print(out_, "\r{:<{}}", line, kWidth);
  std::fflush(out_);
  drawn_ = true;
}

void Progress::clear() {
  if (!drawn_ || lines_) return;
  fmt::print(out_, "\r{:<{}}\r", "", kWidth);
  std::fflush(out_);
  drawn_ = false;
}

}  // namespace kvslim::cli
