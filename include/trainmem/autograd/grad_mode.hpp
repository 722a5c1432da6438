// trainmem/autograd/grad_mode.hpp — whether ops record themselves for backward.
//
// Thread-local, like every per-thread mode in trainmem (autocast too). With grad mode
// off, ops compute their outputs and save nothing: evaluation and the optimizer step
// run under NoGradGuard.
#pragma once

namespace trainmem {

namespace detail {
inline bool& grad_mode_flag() {
  thread_local bool enabled = true;
  return enabled;
}
}  // namespace detail

inline bool grad_enabled() { return detail::grad_mode_flag(); }

/// \brief RAII: sets grad mode for a scope, restores it on exit.
class GradModeGuard {
 public:
  explicit GradModeGuard(bool enabled) : previous_(detail::grad_mode_flag()) { detail::grad_mode_flag() = enabled; }
  ~GradModeGuard() { detail::grad_mode_flag() = previous_; }
  GradModeGuard(const GradModeGuard&) = delete;
  GradModeGuard& operator=(const GradModeGuard&) = delete;

 private:
  bool previous_;
};

/// \brief RAII: no op records itself for backward in this scope.
class NoGradGuard : public GradModeGuard {
 public:
  NoGradGuard() : GradModeGuard(false) {}
};

}  // namespace trainmem
