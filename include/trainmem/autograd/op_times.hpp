// trainmem/autograd/op_times.hpp — where a step's time goes, op by op, forward and backward.
//
// While an OpTimes<B> is alive on a thread, every op that passes through the op entry
// (OpRecorder) on that thread is timed: its forward from the entry (input casts included)
// to its return, and its backward (the tape's call of its node). A backend with a device timer (HasDeviceTimer:
// the CUDA backend records events on its stream) is timed where it runs, with no host
// wait until table() reads the marks; a synchronous backend (the CPU) is timed by the
// host's steady clock. Only the outermost op is timed when ops call ops, so the rows add
// up to the time spent in ops; a checkpoint region's recompute runs inside a backward
// and is charged to the op whose saved tensor asked for it. Profiling costs two marks
// per op call (a CUDA event each on the GPU): for finding the ops that pay, not for the
// timed steps of a benchmark.
#pragma once

#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "trainmem/error.hpp"

namespace trainmem {

/// A backend that times work on its own clock: a mark now (in stream order), and the
/// milliseconds between two marks (waiting for the later one if it must).
template <class B>
concept HasDeviceTimer = requires(B& backend, const typename B::TimerMark& mark) {
  { backend.timer_mark() } -> std::same_as<typename B::TimerMark>;
  { backend.elapsed_ms(mark, mark) } -> std::convertible_to<double>;
};

/// One op's time in a profile, summed over its calls.
struct OpTimeRow {
  std::string op;
  std::int64_t forward_calls = 0, backward_calls = 0;
  double forward_ms = 0.0, backward_ms = 0.0;
  double total_ms() const { return forward_ms + backward_ms; }
};

/// \brief Times every op of this thread while alive (see the file comment); one at a time per thread.
template <class B>
class OpTimes {
 public:
  explicit OpTimes(B& backend) : backend_(&backend) {
    detail::check(active() == nullptr, "OpTimes: a profile is already active on this thread");
    active() = this;
  }
  ~OpTimes() {
    if (active() == this) active() = nullptr;
  }
  OpTimes(const OpTimes&) = delete;
  OpTimes& operator=(const OpTimes&) = delete;

  /// Stops timing (the marks taken so far stay readable through table()).
  void stop() {
    if (active() == this) active() = nullptr;
  }

  /// The rows, most time first. Reads the device marks (a wait for the backend's stream).
  std::vector<OpTimeRow> table() const {
    std::map<std::string, OpTimeRow> rows;
    for (const Span& s : spans_) {
      OpTimeRow& row = rows[std::string(s.op)];
      row.op = std::string(s.op);
      const double ms = elapsed(s);
      if (s.backward) row.backward_ms += ms, ++row.backward_calls;
      else row.forward_ms += ms, ++row.forward_calls;
    }
    std::vector<OpTimeRow> out;
    for (auto& [name, row] : rows) out.push_back(std::move(row));
    std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.total_ms() > b.total_ms(); });
    return out;
  }

  /// The profile active on this thread, if any (what the op entry asks).
  static OpTimes*& active() {
    static thread_local OpTimes* current = nullptr;
    return current;
  }

  /// \brief Times one op call's forward or backward, if it is the outermost one (RAII).
  ///
  /// Every op entry and every backward node makes one, so without an active profile it
  /// is a thread-local read and an untaken branch, and holds two words: the marking is
  /// out of line. (A span built in place per op cost op_overhead ~25 ns an op, 3%.)
  class Scope {
   public:
    Scope(std::string_view op, bool backward) {
      if (OpTimes* times = active(); times != nullptr) [[unlikely]]
        begin(*times, op, backward);
    }
    ~Scope() {
      if (times_ != nullptr) [[unlikely]]
        end();
    }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    static constexpr std::size_t kNested = static_cast<std::size_t>(-1);

    [[gnu::noinline]] void begin(OpTimes& times, std::string_view op, bool backward) {
      times_ = &times;
      if (times.depth_++ > 0) return;  // an op inside a timed op: its time is the outer one's
      span_ = times.spans_.size();
      times.spans_.push_back(Span{op, backward, times.mark(), {}});
    }
    [[gnu::noinline]] void end() {
      --times_->depth_;
      if (span_ != kNested) times_->spans_[span_].end = times_->mark();
    }

    OpTimes* times_ = nullptr;  // the profile this scope counts in, if one was active
    std::size_t span_ = kNested;
  };

 private:
  using Clock = std::chrono::steady_clock;
  struct HostMark {
    Clock::time_point at;
  };
  template <class Backend>
  struct MarkOf {
    using type = HostMark;
  };
  template <HasDeviceTimer Backend>
  struct MarkOf<Backend> {
    using type = typename Backend::TimerMark;
  };
  using Mark = typename MarkOf<B>::type;
  struct Span {
    std::string_view op;
    bool backward = false;
    Mark begin{}, end{};
  };

  Mark mark() {
    if constexpr (HasDeviceTimer<B>) return backend_->timer_mark();
    else return HostMark{Clock::now()};
  }
  double elapsed(const Span& s) const {
    if constexpr (HasDeviceTimer<B>) return backend_->elapsed_ms(s.begin, s.end);
    else return std::chrono::duration<double, std::milli>(s.end.at - s.begin.at).count();
  }

  B* backend_;
  int depth_ = 0;
  std::vector<Span> spans_;
};

}  // namespace trainmem
