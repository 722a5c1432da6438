// examples/common/progress.hpp — one progress line per epoch.
//
// On a terminal the line is rewritten in place with '\r' as training goes; when
// stdout is a file or a pipe (CI logs, `| tee`), carriage returns would pile up into
// one unreadable line, so a few plain lines per epoch are printed instead.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace examples {

/// \brief Shows step, loss and throughput of the running epoch.
class ProgressLine {
 public:
  /// `plain_lines` is how many lines an epoch prints when stdout is not a terminal.
  explicit ProgressLine(int plain_lines = 4) : terminal_(::isatty(STDOUT_FILENO) == 1), plain_lines_(plain_lines) {}

  bool terminal() const { return terminal_; }

  void start_epoch(int epoch, int epochs, std::int64_t steps) {
    epoch_ = epoch;
    epochs_ = epochs;
    steps_ = steps;
    examples_ = 0;
    loss_sum_ = 0.0;
    loss_count_ = 0;
    last_width_ = 0;
    start_ = Clock::now();
  }

  /// After step `step` (1-based) of `examples` examples with this loss; `extra` is
  /// appended (the loss scale and skipped steps under FP16).
  void update(std::int64_t step, std::int64_t examples, double loss, const std::string& extra = {}) {
    examples_ += examples;
    loss_sum_ += loss;
    ++loss_count_;
    const bool last = step == steps_;
    if (terminal_) {
      const auto now = Clock::now();
      if (!last && now - last_draw_ < std::chrono::milliseconds(100)) return;  // keep the terminal calm
      last_draw_ = now;
      draw("\r", step, loss, extra, "");
    } else {
      const std::int64_t every = std::max<std::int64_t>(1, steps_ / std::max(1, plain_lines_));
      if (step % every == 0 || last) draw("", step, loss, extra, "\n");
    }
  }

  /// Ends the epoch's line; `summary` (e.g. test accuracy) is appended to it.
  void finish_epoch(const std::string& summary) {
    if (terminal_) {
      std::printf("  %s\n", summary.c_str());
    } else {
      std::printf("epoch %d/%d  %s\n", epoch_, epochs_, summary.c_str());
    }
    std::fflush(stdout);
  }

  double mean_loss() const { return loss_count_ ? loss_sum_ / static_cast<double>(loss_count_) : 0.0; }
  double examples_per_second() const {
    const double s = std::chrono::duration<double>(Clock::now() - start_).count();
    return s > 0 ? static_cast<double>(examples_) / s : 0.0;
  }

 private:
  using Clock = std::chrono::steady_clock;

  void draw(const char* prefix, std::int64_t step, double loss, const std::string& extra, const char* suffix) {
    char line[256];
    const int width =
        std::snprintf(line, sizeof line, "epoch %d/%d  step %lld/%lld  loss %.4f (mean %.4f)  %.0f ex/s%s%s", epoch_,
                      epochs_, static_cast<long long>(step), static_cast<long long>(steps_), loss, mean_loss(),
                      examples_per_second(), extra.empty() ? "" : "  ", extra.c_str());
    // On a terminal, pad over what a longer previous line left there.
    const int pad = terminal_ ? std::max(0, last_width_ - width) : 0;
    std::printf("%s%s%*s%s", prefix, line, pad, "", suffix);
    last_width_ = width;
    std::fflush(stdout);
  }

  bool terminal_;
  int plain_lines_;
  int epoch_ = 0, epochs_ = 0;
  std::int64_t steps_ = 0, examples_ = 0;
  double loss_sum_ = 0.0;
  std::int64_t loss_count_ = 0;
  int last_width_ = 0;
  Clock::time_point start_, last_draw_;
};

}  // namespace examples
