// trainmem/core/math.hpp — element-wise formulas, written once for CPU and GPU.
//
// Each functor works on the accumulator type (float, or double for f64 gradient
// checks). Backends apply them with their own loops or kernels; ops pick them. A
// backward functor takes (upstream gradient, saved value) and returns the input
// gradient, so "which tensor to save" is visible in its signature: relu and sigmoid
// save their output, gelu saves its input.
#pragma once

#include <cmath>

#include "trainmem/config.hpp"

namespace trainmem::math {

// Unqualified calls below pick float overloads for float and double for double.
using std::erf;
using std::exp;
using std::log;
using std::sqrt;
using std::tanh;

// --- unary forward -------------------------------------------------------------
struct Identity {
  template <class T> TRAINMEM_HOST_DEVICE T operator()(T x) const { return x; }
};
struct Scale {
  double alpha;
  template <class T> TRAINMEM_HOST_DEVICE T operator()(T x) const { return static_cast<T>(alpha) * x; }
};
struct Relu {
  template <class T> TRAINMEM_HOST_DEVICE T operator()(T x) const { return x > T(0) ? x : T(0); }
};
struct Sigmoid {
  template <class T> TRAINMEM_HOST_DEVICE T operator()(T x) const { return T(1) / (T(1) + exp(-x)); }
};
struct Tanh {
  template <class T> TRAINMEM_HOST_DEVICE T operator()(T x) const { return tanh(x); }
};
struct Exp {
  template <class T> TRAINMEM_HOST_DEVICE T operator()(T x) const { return exp(x); }
};
struct Log {
  template <class T> TRAINMEM_HOST_DEVICE T operator()(T x) const { return log(x); }
};

/// GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
struct GeluTanh {
  template <class T> TRAINMEM_HOST_DEVICE T operator()(T x) const {
    const T k = T(0.7978845608028654), c = T(0.044715);
    return T(0.5) * x * (T(1) + tanh(k * (x + c * x * x * x)));
  }
};
/// GELU, exact: x Phi(x) = 0.5 x (1 + erf(x / sqrt 2)).
struct GeluErf {
  template <class T> TRAINMEM_HOST_DEVICE T operator()(T x) const {
    return T(0.5) * x * (T(1) + erf(x * T(0.7071067811865476)));
  }
};

// --- unary backward: (dy, saved) -> dx ------------------------------------------
struct ReluBackward {  // saved: output y
  template <class T> TRAINMEM_HOST_DEVICE T operator()(T dy, T y) const { return y > T(0) ? dy : T(0); }
};
struct SigmoidBackward {  // saved: output y
  template <class T> TRAINMEM_HOST_DEVICE T operator()(T dy, T y) const { return dy * y * (T(1) - y); }
};
struct TanhBackward {  // saved: output y
  template <class T> TRAINMEM_HOST_DEVICE T operator()(T dy, T y) const { return dy * (T(1) - y * y); }
};
struct ExpBackward {  // saved: output y
  template <class T> TRAINMEM_HOST_DEVICE T operator()(T dy, T y) const { return dy * y; }
};
struct LogBackward {  // saved: input x
  template <class T> TRAINMEM_HOST_DEVICE T operator()(T dy, T x) const { return dy / x; }
};
struct GeluTanhBackward {  // saved: input x
  template <class T> TRAINMEM_HOST_DEVICE T operator()(T dy, T x) const {
    const T k = T(0.7978845608028654), c = T(0.044715);
    const T inner = k * (x + c * x * x * x);
    const T t = tanh(inner);
    const T dinner = k * (T(1) + T(3) * c * x * x);
    return dy * (T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * dinner);
  }
};
struct GeluErfBackward {  // saved: input x
  template <class T> TRAINMEM_HOST_DEVICE T operator()(T dy, T x) const {
    const T cdf = T(0.5) * (T(1) + erf(x * T(0.7071067811865476)));
    const T pdf = T(0.3989422804014327) * exp(T(-0.5) * x * x);
    return dy * (cdf + x * pdf);
  }
};

// --- binary ------------------------------------------------------------------------
struct Add {
  template <class T> TRAINMEM_HOST_DEVICE T operator()(T a, T b) const { return a + b; }
};
struct Sub {
  template <class T> TRAINMEM_HOST_DEVICE T operator()(T a, T b) const { return a - b; }
};
struct Mul {
  template <class T> TRAINMEM_HOST_DEVICE T operator()(T a, T b) const { return a * b; }
};
/// a + alpha * b: gradient accumulation and axpy.
struct AddScaled {
  double alpha;
  template <class T> TRAINMEM_HOST_DEVICE T operator()(T a, T b) const { return a + static_cast<T>(alpha) * b; }
};

// --- dropout: keep with probability 1-p, scale kept values by 1/(1-p) ----------------
/// The keep decision for element i is a pure function of the random stream, so backward
/// recomputes the mask instead of saving it.
struct DropoutScale {
  float p;
  TRAINMEM_HOST_DEVICE float operator()(float uniform) const { return uniform >= p ? 1.0f / (1.0f - p) : 0.0f; }
};

}  // namespace trainmem::math

namespace trainmem::math {

// --- optimizer updates: one element of (param, grad, state1, state2) ----------------
// `grad_scale` multiplies the gradient first (1/loss_scale when the step also unscales).

/// SGD with momentum, dampening, Nesterov and L2 weight decay (PyTorch's torch.optim.SGD).
struct SgdUpdate {
  double lr, momentum, dampening, weight_decay, grad_scale;
  bool nesterov, first_step;
  template <class T>
  TRAINMEM_HOST_DEVICE void operator()(T& p, T g, T& buffer, T& /*unused*/) const {
    g = g * static_cast<T>(grad_scale) + static_cast<T>(weight_decay) * p;
    if (momentum != 0.0) {
      buffer = first_step ? g : static_cast<T>(momentum) * buffer + static_cast<T>(1.0 - dampening) * g;
      g = nesterov ? g + static_cast<T>(momentum) * buffer : buffer;
    }
    p -= static_cast<T>(lr) * g;
  }
};

/// AdamW with decoupled weight decay (Loshchilov & Hutter; PyTorch's torch.optim.AdamW).
/// `bias1` and `bias2` are 1 - beta^t for the step t being taken.
struct AdamWUpdate {
  double lr, beta1, beta2, eps, weight_decay, grad_scale, bias1, bias2;
  template <class T>
  TRAINMEM_HOST_DEVICE void operator()(T& p, T g, T& m, T& v) const {
    g = g * static_cast<T>(grad_scale);
    p = p * static_cast<T>(1.0 - lr * weight_decay);
    m = static_cast<T>(beta1) * m + static_cast<T>(1.0 - beta1) * g;
    v = static_cast<T>(beta2) * v + static_cast<T>(1.0 - beta2) * g * g;
    const T m_hat = m / static_cast<T>(bias1);
    const T v_hat = v / static_cast<T>(bias2);
    p -= static_cast<T>(lr) * m_hat / (sqrt(v_hat) + static_cast<T>(eps));
  }
};

}  // namespace trainmem::math
