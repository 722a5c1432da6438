// trainmem/ops/activation.hpp — relu, gelu (tanh and erf), silu, sigmoid, tanh, exp, log;
// swiglu.
//
// One template covers them all: forward applies a math functor, backward applies its
// backward functor to (dy, saved), where saved is the output for relu, sigmoid, tanh
// and exp and the input for gelu, silu and log. What to save is part of each op's
// declaration, in one table below. swiglu(gate, up) = silu(gate) * up is two of these
// ops, so it keeps three tensors of gate's size for backward: gate (silu's input), and
// silu(gate) and up (the product's operands).
//
// A NaN input gives a NaN output in each of them, as in PyTorch (relu(NaN) = NaN, not 0),
// so a diverged forward shows in the loss; relu's gradient at a NaN output is 0
// (PyTorch's grad * (result > 0)).
#pragma once

#include "trainmem/ops/elementwise.hpp"
#include "trainmem/ops/op_helpers.hpp"

namespace trainmem {

enum class GeluApproximation { Tanh, Erf };

namespace detail {

inline constexpr OpInfo kReluOp{"relu", OpKind::Elementwise, AutocastCategory::Unchanged};
inline constexpr OpInfo kGeluTanhOp{"gelu_tanh", OpKind::Elementwise, AutocastCategory::Unchanged};
inline constexpr OpInfo kGeluErfOp{"gelu_erf", OpKind::Elementwise, AutocastCategory::Unchanged};
inline constexpr OpInfo kSiluOp{"silu", OpKind::Elementwise, AutocastCategory::Unchanged};
inline constexpr OpInfo kSigmoidOp{"sigmoid", OpKind::Elementwise, AutocastCategory::Unchanged};
inline constexpr OpInfo kTanhOp{"tanh", OpKind::Elementwise, AutocastCategory::Unchanged};
inline constexpr OpInfo kExpOp{"exp", OpKind::Elementwise, AutocastCategory::Fp32};
inline constexpr OpInfo kLogOp{"log", OpKind::Elementwise, AutocastCategory::Fp32};

enum class Keep { Input, Output };

/// y = forward(x), dx = backward(dy, saved); the functors may carry a parameter (pow's exponent).
template <Keep keep, class Forward, class Backward, class B>
Var<B> activation(const OpInfo& op, const Var<B>& x, Forward forward, Backward backward) {
  require_floating(op, x, "x");
  OpRecorder<B> rec(op, {x}, 8.0 * static_cast<double>(x.numel()));
  const DType dtype = rec.compute_dtype();
  Tensor<B> tx = rec.input(0);
  // Inputs are saved before computing, outputs after (see NOTE [Save order] in op_recorder.hpp).
  SavedTensor<B> saved = keep == Keep::Input ? rec.save(tx) : SavedTensor<B>();
  auto out = rec.compute([&] { return Outputs<B>{unary(forward, tx, dtype)}; });
  if (keep == Keep::Output) saved = rec.save(out[0]);
  return rec.finish(out[0],
                    [=](const Grads<B>& g) { return Grads<B>{binary(backward, g[0], saved.unpack(), g[0].dtype())}; });
}
template <class Forward, class Backward, Keep keep, class B>
Var<B> activation(const OpInfo& op, const Var<B>& x) {
  return activation<keep>(op, x, Forward{}, Backward{});
}

}  // namespace detail

template <class B>
Var<B> relu(const Var<B>& x) {
  return detail::activation<math::Relu, math::ReluBackward, detail::Keep::Output>(detail::kReluOp, x);
}
template <class B>
Var<B> gelu(const Var<B>& x, GeluApproximation approximation = GeluApproximation::Tanh) {
  if (approximation == GeluApproximation::Tanh)
    return detail::activation<math::GeluTanh, math::GeluTanhBackward, detail::Keep::Input>(detail::kGeluTanhOp, x);
  return detail::activation<math::GeluErf, math::GeluErfBackward, detail::Keep::Input>(detail::kGeluErfOp, x);
}
/// SiLU (swish): x sigmoid(x). Saves its input; NaN propagates.
template <class B>
Var<B> silu(const Var<B>& x) {
  return detail::activation<math::Silu, math::SiluBackward, detail::Keep::Input>(detail::kSiluOp, x);
}
/// SwiGLU's gated product silu(gate) * up (LLaMA's MLP middle); gate and up of one shape
/// (or up broadcasting as mul allows). Keeps gate, silu(gate) and up for backward.
template <class B>
Var<B> swiglu(const Var<B>& gate, const Var<B>& up) {
  return mul(silu(gate), up);
}
template <class B>
Var<B> sigmoid(const Var<B>& x) {
  return detail::activation<math::Sigmoid, math::SigmoidBackward, detail::Keep::Output>(detail::kSigmoidOp, x);
}
template <class B>
Var<B> tanh(const Var<B>& x) {
  return detail::activation<math::Tanh, math::TanhBackward, detail::Keep::Output>(detail::kTanhOp, x);
}
template <class B>
Var<B> exp(const Var<B>& x) {
  return detail::activation<math::Exp, math::ExpBackward, detail::Keep::Output>(detail::kExpOp, x);
}
template <class B>
Var<B> log(const Var<B>& x) {
  return detail::activation<math::Log, math::LogBackward, detail::Keep::Input>(detail::kLogOp, x);
}

}  // namespace trainmem
