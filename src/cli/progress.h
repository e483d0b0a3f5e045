#pragma once
// A progress line on stderr for steps that take more than about a second (prefill, bench tests,
// evaluation runs, calibration): drawn in place on a terminal, silent when stderr is not a terminal
// (logs and pipes stay clean) or with --no-progress. With --progress (`lines`) a stderr that is not
// a terminal gets whole lines instead, at most one a second, for logs of long prefills.
#include <cstdio>
#include <functional>
#include <string>

namespace kvslim::cli {

class Progress {
 public:
  /// `enabled`: false for --no-progress. Draws only when stderr is a terminal, or, with `lines`
  /// (--progress), writes lines when it is not.
  explicit Progress(bool enabled, bool lines = false);
  /// For tests: `tty` stands for isatty(stderr), `out` for stderr, `clock` returns seconds.
  Progress(bool enabled, bool tty, std::FILE* out, std::function<double()> clock, bool lines = false);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  /// Reports `done` of `total` units (total 0: unknown) and what runs now. Nothing is drawn in the
  /// first second, so short steps print nothing; afterwards the line is redrawn at most 10 times a
  /// second, with the elapsed time and an estimate of the time left.
  void update(size_t done, size_t total, const std::string& what);
  /// A prefill's progress: "prefill 4096/131072 tokens (3%), 512 tokens/s, 8s elapsed, 4m08s left,
  /// KV 64.0 MiB", with the rate over the time since this Progress was made and `kv_bytes` the
  /// cache's bytes now. Same pacing as update().
  void prefill(size_t done, size_t total, size_t kv_bytes);
  /// Erases the line, if one was drawn, so the next message starts on a clean line.
  void clear();
  /// Whether this progress can draw at all (enabled and a terminal).
  bool active() const { return on_; }

 private:
  /// Writes `line` (rewritten in place on a terminal, a whole line otherwise) if the pacing allows.
  void draw(const std::string& line, bool final);
  bool on_;
  bool lines_;  ///< whole lines (not a terminal, --progress)
  std::FILE* out_;
  std::function<double()> clock_;
  double t0_ = 0, last_ = -1;
  bool drawn_ = false;
};

}  // namespace kvslim::cli
