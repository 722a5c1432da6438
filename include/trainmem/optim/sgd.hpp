// trainmem/optim/sgd.hpp — stochastic gradient descent with momentum (PyTorch's rules).
#pragma once

#include "trainmem/core/math.hpp"
#include "trainmem/optim/optimizer.hpp"

namespace trainmem::optim {

struct SgdOptions {
  double lr = 0.01;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
};

/// \brief SGD: buf = momentum buf + (1 - dampening) g (buf = g on the first step); p -= lr buf.
template <class B>
class SGD : public Optimizer<B> {
 public:
  SGD(std::vector<Var<B>> params, SgdOptions options) : Optimizer<B>(std::move(params)), options_(options) {
    detail::check(options.lr >= 0 && options.momentum >= 0 && options.weight_decay >= 0,
                  "SGD: lr, momentum and weight_decay must be non-negative");
    detail::check(!options.nesterov || (options.momentum > 0 && options.dampening == 0),
                  "SGD: Nesterov momentum needs momentum > 0 and zero dampening");
  }
  SgdOptions& options() { return options_; }

 protected:
  void update(ParamGroupEntry<B>& e, const Tensor<B>& target, const Tensor<B>& grad, double grad_scale) override {
    const bool first = options_.momentum != 0.0 && !e.state1.defined();
    if (options_.momentum != 0.0) this->ensure_state(e.state1, target);
    this->apply(e, target, grad,
                math::SgdUpdate{options_.lr, options_.momentum, options_.dampening, options_.weight_decay, grad_scale,
                                options_.nesterov, first});
  }

 private:
  SgdOptions options_;
};

}  // namespace trainmem::optim
