#pragma once
// A progress line on stderr for steps that take more than about a second (prefill, bench tests,
// evaluation runs, calibration): drawn in place on a terminal, silent when stderr is not a terminal
// (logs and pipes stay clean) or with --no-progress.
#include <cstdio>
#include <functional>
#include <string>

namespace kvslim::cli {

class Progress {
 public:
  /// `enabled`: false for --no-progress. Draws only when stderr is a terminal.
  explicit Progress(bool enabled);
  /// For tests: `tty` stands for isatty(stderr), `out` for stderr, `clock` returns seconds.
  Progress(bool enabled, bool tty, std::FILE* out, std::function<double()> clock);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  /// Reports `done` of `total` units (total 0: unknown) and what runs now. Nothing is drawn in the
  /// first second, so short steps print nothing; afterwards the line is redrawn at most 10 times a
  /// second, with the elapsed time and an estimate of the time left.
  void update(size_t done, size_t total, const std::string& what);
  /// Erases the line, if one was drawn, so the next message starts on a clean line.
  void clear();
  /// Whether this progress can draw at all (enabled and a terminal).
  bool active() const { return on_; }

 private:
  bool on_;
  std::FILE* out_;
  std::function<double()> clock_;
  double t0_ = 0, last_ = -1;
  bool drawn_ = false;
};

}  // namespace kvslim::cli
