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
constexpr size_t kWidth = 100;          // the line is cut to fit an 80-120 column terminal

}  // namespace

Progress::Progress(bool enabled) : Progress(enabled, isatty(STDERR_FILENO) != 0, stderr, steady_seconds) {}

Progress::Progress(bool enabled, bool tty, std::FILE* out, std::function<double()> clock)
    : on_(enabled && tty), out_(out), clock_(std::move(clock)) {
  if (on_) t0_ = clock_();
}

Progress::~Progress() { clear(); }

void Progress::update(size_t done, size_t total, const std::string& what) {
  if (!on_) return;
  const double now = clock_() - t0_;
  if (now < kQuietSeconds) return;
  if (drawn_ && now - last_ < kRedrawSeconds && !(total && done >= total)) return;
  last_ = now;
  std::string line;
  if (total) {
    const double frac = std::min(1.0, double(done) / double(total));
    const std::string eta = done ? fmt::format("{:.0f}s left", now / done * (total - std::min(done, total))) : "";
    line = fmt::format("{}/{} {:3.0f}% {:.0f}s {} {}", done, total, 100 * frac, now, eta, what);
  } else {
    line = fmt::format("{} {:.0f}s {}", done, now, what);
  }
  if (line.size() > kWidth) line.resize(kWidth);
  fmt::print(out_, "\r{:<{}}", line, kWidth);
  std::fflush(out_);
  drawn_ = true;
}

void Progress::clear() {
  if (!drawn_) return;
  fmt::print(out_, "\r{:<{}}\r", "", kWidth);
  std::fflush(out_);
  drawn_ = false;
}

}  // namespace kvslim::cli
