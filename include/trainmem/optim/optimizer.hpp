// trainmem/optim/optimizer.hpp — what SGD and AdamW share: parameters and their states.
//
// An optimizer updates parameters in place from their .grad, in f32 (or f64). Each
// update is one pass per tensor through the backend's apply_update, which also writes
// a 16-bit model copy when the parameter has one (mixed precision's master weights).
// A parameter without a gradient is skipped. Every write bumps the parameter's
// version, so cast caches recast and stale saved tensors are caught.
#pragma once

#include <vector>

#include "trainmem/autograd/var.hpp"
#include "trainmem/autograd/grad_mode.hpp"

namespace trainmem::optim {

/// \brief A parameter as an optimizer sees it: the tensor it updates and its gradient.
///
/// Without mixed precision the tensor updated is the parameter itself. With FP32
/// master weights, `master` is the f32 copy the optimizer updates and `param` the
/// 16-bit model copy it writes after each update.
template <class B>
struct ParamGroupEntry {
  Var<B> param;
  Tensor<B> master;  // undefined: update param.value() directly
  Tensor<B> state1, state2;
  std::int64_t steps = 0;  // updates this parameter has received
};

template <class B>
class Optimizer {
 public:
  explicit Optimizer(std::vector<Var<B>> params) {
    for (auto& p : params) {
      detail::check(p.defined() && p.requires_grad() && p.is_leaf(), "optimizer: '", p.defined() ? p.name() : "",
                    "' is not a parameter (a leaf that requires grad)");
      entries_.push_back({p, {}, {}, {}, 0});
    }
  }
  virtual ~Optimizer() = default;

  void zero_grad() {
    for (auto& e : entries_) e.param.zero_grad();
  }
  /// Gives parameter i an f32 master copy (mixed precision: amp::MasterWeights does this).
  void set_master(std::size_t i, Tensor<B> master) { entries_.at(i).master = std::move(master); }
  std::vector<ParamGroupEntry<B>>& entries() { return entries_; }
  const std::vector<ParamGroupEntry<B>>& entries() const { return entries_; }
  std::int64_t steps() const { return steps_; }

  /// One update of every parameter with a gradient; grads are multiplied by grad_scale first.
  void step(double grad_scale = 1.0) {
    NoGradGuard no_grad;
    ++steps_;
    for (auto& e : entries_) {
      const Tensor<B>& grad = e.param.grad();
      if (!grad.defined()) continue;
      const Tensor<B>& target = e.master.defined() ? e.master : e.param.value();
      detail::check(grad.shape() == target.shape(), "optimizer: grad of '", e.param.name(), "' is ", grad.shape(),
                    ", parameter is ", target.shape());
      ++e.steps;
      update(e, target, grad, grad_scale);
      target.bump_version();
      if (e.master.defined()) e.param.value().bump_version();
    }
  }

 protected:
  /// Allocates a zeroed optimizer state like `target` on first use.
  static void ensure_state(Tensor<B>& state, const Tensor<B>& target) {
    if (!state.defined())
      state = Tensor<B>::zeros(target.shape(), target.dtype(), MemCategory::OptimizerState, target.backend());
  }
  /// Runs `update` over one parameter, writing the model copy when there is a master.
  template <class Update>
  static void apply(const ParamGroupEntry<B>& e, const Tensor<B>& target, const Tensor<B>& grad, Update update) {
    target.backend().apply_update(update, target, grad, e.state1, e.state2,
                                  e.master.defined() ? e.param.value() : Tensor<B>());
  }
  virtual void update(ParamGroupEntry<B>& e, const Tensor<B>& target, const Tensor<B>& grad, double grad_scale) = 0;

  std::vector<ParamGroupEntry<B>> entries_;
  std::int64_t steps_ = 0;
};

}  // namespace trainmem::optim
