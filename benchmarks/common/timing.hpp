// benchmarks/common/timing.hpp — wall-clock time of host code, on the steady clock.
//
// A benchmark starts a Stopwatch right before what it measures and reads it right
// after; the steady clock never jumps when the system time is set. GPU work is timed
// with CUDA events instead, since the host returns before the device finishes.
#pragma once

#include <chrono>

namespace benchmarks {

/// \brief Time since construction or the last restart().
class Stopwatch {
 public:
  Stopwatch() : start_(Clock::now()) {}
  void restart() { start_ = Clock::now(); }

  double seconds() const { return elapsed<std::ratio<1>>(); }
  double ms() const { return elapsed<std::milli>(); }
  double us() const { return elapsed<std::micro>(); }

 private:
  using Clock = std::chrono::steady_clock;
  template <class Unit>
  double elapsed() const {
    return std::chrono::duration<double, Unit>(Clock::now() - start_).count();
  }
  Clock::time_point start_;
};

}  // namespace benchmarks
