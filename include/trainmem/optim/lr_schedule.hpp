// trainmem/optim/lr_schedule.hpp — learning rate as a function of the step.
//
// A schedule is a value: `lr(step)` is a pure function of the step index, so a resumed
// run asks the same schedule for the same step and gets the same rate, with nothing to
// save but the step. Three shapes cover what training loops use: constant, a linear
// warm-up to the peak, and warm-up followed by a cosine decay to a floor. The rate is
// applied by the loop (`optimizer.options().lr = schedule.lr(step)`), which keeps the
// optimizers free of any notion of time.
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>

#include "trainmem/error.hpp"

namespace trainmem::optim {

/// \brief Constant, linear warm-up, or linear warm-up then cosine decay.
///
/// Step s (0-based) of warm-up w gets peak·(s+1)/w, so the first step already moves
/// and step w−1 reaches the peak. After warm-up, cosine decays from the peak at step w
/// to `min_lr` at step `total_steps` and stays there.
class LrSchedule {
 public:
  static LrSchedule constant(double lr) { return LrSchedule(lr, 0, 0, lr, "constant"); }

  static LrSchedule linear_warmup(double peak, std::int64_t warmup_steps) {
    return LrSchedule(peak, warmup_steps, 0, peak, "linear_warmup");
  }

  static LrSchedule warmup_cosine(double peak, std::int64_t warmup_steps, std::int64_t total_steps,
                                  double min_lr = 0.0) {
    detail::check(total_steps > warmup_steps, "LrSchedule::warmup_cosine: total_steps (", total_steps,
                  ") must exceed warmup_steps (", warmup_steps, ")");
    return LrSchedule(peak, warmup_steps, total_steps, min_lr, "warmup_cosine");
  }

  /// The rate for 0-based step `step`.
  [[nodiscard]] double lr(std::int64_t step) const {
    detail::check(step >= 0, "LrSchedule::lr: step must be >= 0, got ", step);
    if (step < warmup_) return peak_ * static_cast<double>(step + 1) / static_cast<double>(warmup_);
    if (total_ == 0) return peak_;
    if (step >= total_) return min_lr_;
    const double progress = static_cast<double>(step - warmup_) / static_cast<double>(total_ - warmup_);
    return min_lr_ + (peak_ - min_lr_) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
  }

  [[nodiscard]] double peak() const { return peak_; }
  [[nodiscard]] std::int64_t warmup_steps() const { return warmup_; }
  [[nodiscard]] std::int64_t total_steps() const { return total_; }

 private:
  LrSchedule(double peak, std::int64_t warmup, std::int64_t total, double min_lr, const char* what)
      : peak_(peak), warmup_(warmup), total_(total), min_lr_(min_lr) {
    detail::check(std::isfinite(peak) && peak >= 0, "LrSchedule::", what, ": the rate must be finite and >= 0, got ",
                  peak);
    detail::check(warmup >= 0, "LrSchedule::", what, ": warmup_steps must be >= 0, got ", warmup);
    detail::check(std::isfinite(min_lr) && min_lr >= 0 && min_lr <= peak, "LrSchedule::", what,
                  ": min_lr must be in [0, peak], got ", min_lr);
  }

  double peak_;
  std::int64_t warmup_;
  std::int64_t total_;  // 0: no decay
  double min_lr_;
};

}  // namespace trainmem::optim
