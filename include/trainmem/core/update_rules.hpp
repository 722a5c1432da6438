// trainmem/core/update_rules.hpp — the optimizer update rules, one element at a time, written once for CPU and GPU.
//
// SGD's and AdamW's formulas over (param, grad, first and second optimizer state), and
// DivideGrad, which divides the gradient by a device scalar (the loss scale) first. The
// optimizers in optim/ pick them; each backend's apply_update runs them with its own loop
// or kernel, so the CPU tests check the same formulas the CUDA kernels run.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "trainmem/config.hpp"
#include "trainmem/core/math.hpp"

namespace trainmem::math {

// --- optimizer updates: one element of (param, grad, first and second optimizer state) ----
// `grad_scale` multiplies the gradient first (1/loss_scale when the step also unscales).

// NOTE [Update flags fixed for the loop]
// SGD's flags (momentum or not, Nesterov, first step) are run-time values, the same for
// every element. A loop that branches on them does not vectorise under GCC -O2, which
// does not unswitch loops: SGD ran at 1.2 ns per element on one core. So the formula is
// written once with the flags as template parameters (SgdUpdate::Fixed), and
// `visit_fixed(f)` calls f with the variant for this update's flags: a backend's loop
// over a tensor asks once, then runs a loop with no branch in it. operator() is the
// same dispatch per element, for loops that take any update functor.

/// SGD with momentum, dampening, Nesterov and L2 weight decay (PyTorch's torch.optim.SGD).
struct SgdUpdate {
  double lr, momentum, dampening, weight_decay, grad_scale;
  bool nesterov, first_step;

  template <bool kMomentum, bool kNesterov, bool kFirst>
  struct Fixed;
  /// f(Fixed<...>{*this}) for this update's flags (NOTE [Update flags fixed for the loop]).
  template <class F>
  TRAINMEM_HOST_DEVICE void visit_fixed(F&& f) const;
  template <class T>
  TRAINMEM_HOST_DEVICE void operator()(T& p, T g, T& buffer, T& unused) const {
    visit_fixed([&](const auto& fixed) { fixed(p, g, buffer, unused); });
  }
};

/// SgdUpdate with its flags as compile-time constants.
template <bool kMomentum, bool kNesterov, bool kFirst>
struct SgdUpdate::Fixed {
  SgdUpdate u;
  template <class T>
  TRAINMEM_HOST_DEVICE void operator()(T& p, T g, T& buffer, T& /*unused*/) const {
    g = g * static_cast<T>(u.grad_scale) + static_cast<T>(u.weight_decay) * p;
    if constexpr (kMomentum) {
      if constexpr (kFirst) buffer = g;
      else buffer = static_cast<T>(u.momentum) * buffer + static_cast<T>(1.0 - u.dampening) * g;
      if constexpr (kNesterov) g = g + static_cast<T>(u.momentum) * buffer;
      else g = buffer;
    }
    p -= static_cast<T>(u.lr) * g;
  }
};

template <class F>
TRAINMEM_HOST_DEVICE void SgdUpdate::visit_fixed(F&& f) const {
  if (momentum == 0.0) f(Fixed<false, false, false>{*this});
  else if (nesterov && first_step) f(Fixed<true, true, true>{*this});
  else if (nesterov) f(Fixed<true, true, false>{*this});
  else if (first_step) f(Fixed<true, false, true>{*this});
  else f(Fixed<true, false, false>{*this});
}

// NOTE [Square roots a block at a time]
// AdamW takes a square root per element. Under GCC's default -fmath-errno, sqrt may set
// errno, so a loop that calls it is not vectorised ("control flow in loop"): the pass ran
// at 3.5 ns per element on one core. The rule is therefore written in two halves around
// the root: moments() updates p's decay and the moments and returns v_hat, finish() takes
// sqrt(v_hat). operator() is the two with sqrt between; a backend's loop may instead run
// moments() over a block, take the block's roots in one vector pass (IEEE square roots,
// so the same bits), then finish().

/// AdamW with decoupled weight decay (Loshchilov & Hutter; PyTorch's torch.optim.AdamW).
/// `bias1` and `bias2` are 1 - beta^t for the step t being taken.
struct AdamWUpdate {
  double lr, beta1, beta2, eps, weight_decay, grad_scale, bias1, bias2;
  /// The first half: p decayed, the moments updated; returns v_hat.
  template <class T>
  TRAINMEM_HOST_DEVICE T moments(T& p, T g, T& m, T& v) const {
    g = g * static_cast<T>(grad_scale);
    p = p * static_cast<T>(1.0 - lr * weight_decay);
    m = static_cast<T>(beta1) * m + static_cast<T>(1.0 - beta1) * g;
    v = static_cast<T>(beta2) * v + static_cast<T>(1.0 - beta2) * g * g;
    return v / static_cast<T>(bias2);
  }
  /// The second half, from the updated m and root = sqrt(v_hat).
  template <class T>
  TRAINMEM_HOST_DEVICE void finish(T& p, T m, T root) const {
    const T m_hat = m / static_cast<T>(bias1);
    p -= static_cast<T>(lr) * m_hat / (root + static_cast<T>(eps));
  }
  template <class T>
  TRAINMEM_HOST_DEVICE void operator()(T& p, T g, T& m, T& v) const {
    const T v_hat = moments(p, g, m, v);
    finish(p, m, sqrt(v_hat));
  }
};

}  // namespace trainmem::math

namespace trainmem::detail {

/// An update whose gradient is first divided by a device scalar (the loss scale).
template <class Update>
struct DivideGrad {
  Update update;
  const float* divisor;

  /// U (an update with its run-time choices fixed) with the divisor read. It has the
  /// halves of a rule written around a square root where U has them (NOTE [Square roots
  /// a block at a time] in core/update_rules.hpp), so the pass vectorises under a loss scale too.
  template <class U>
  struct Fixed {
    U update;
    float divisor;
    template <class T>
    TRAINMEM_HOST_DEVICE void operator()(T& p, T g, T& first_moment, T& second_moment) const {
      update(p, g / static_cast<T>(divisor), first_moment, second_moment);
    }
    template <class T>
    requires requires(const U& u, T& x) { u.moments(x, x, x, x); }
    TRAINMEM_HOST_DEVICE T moments(T& p, T g, T& first_moment, T& second_moment) const {
      return update.moments(p, g / static_cast<T>(divisor), first_moment, second_moment);
    }
    template <class T>
    requires requires(const U& u, T& x) { u.finish(x, x, x); }
    TRAINMEM_HOST_DEVICE void finish(T& p, T first_moment, T root) const { update.finish(p, first_moment, root); }
  };

  /// f(Fixed<...>) with the divisor read once and the update's own choices fixed, for a
  /// loop over a tensor on the host (NOTE [Update flags fixed for the loop] in core/update_rules.hpp).
  template <class F>
  void visit_fixed(F&& f) const {
    const float d = *divisor;
    if constexpr (requires { update.visit_fixed([](const auto&) {}); })
      update.visit_fixed([&](const auto& u) { f(Fixed<std::decay_t<decltype(u)>>{u, d}); });
    else f(Fixed<Update>{update, d});
  }

  template <class T>
  TRAINMEM_HOST_DEVICE void operator()(T& p, T g, T& first_moment, T& second_moment) const {
    update(p, g / static_cast<T>(*divisor), first_moment, second_moment);
  }
};

}  // namespace trainmem::detail
