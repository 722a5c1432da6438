// trainmem/optim/adamw.hpp — Adam with decoupled weight decay (PyTorch's rules).
#pragma once

#include <cmath>

#include "trainmem/core/math.hpp"
#include "trainmem/optim/optimizer.hpp"

namespace trainmem::optim {

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
};

/// \brief AdamW: p *= 1 - lr wd; m, v moments; p -= lr m_hat / (sqrt(v_hat) + eps).
template <class B>
class AdamW : public Optimizer<B> {
 public:
  AdamW(std::vector<Var<B>> params, AdamWOptions options) : Optimizer<B>(std::move(params)), options_(options) {
    detail::check(options.lr >= 0 && options.eps > 0 && options.weight_decay >= 0, "AdamW: lr >= 0, eps > 0 and "
                  "weight_decay >= 0 are required");
    detail::check(options.beta1 >= 0 && options.beta1 < 1 && options.beta2 >= 0 && options.beta2 < 1,
                  "AdamW: betas must be in [0, 1), got ", options.beta1, ", ", options.beta2);
  }
  AdamWOptions& options() { return options_; }

 protected:
  void update(ParamGroupEntry<B>& e, const Tensor<B>& target, const Tensor<B>& grad, double grad_scale) override {
    this->ensure_state(e.state1, target);
    this->ensure_state(e.state2, target);
    const double t = static_cast<double>(e.steps);
    this->apply(e, target, grad,
                math::AdamWUpdate{options_.lr, options_.beta1, options_.beta2, options_.eps, options_.weight_decay,
                                  grad_scale, 1.0 - std::pow(options_.beta1, t), 1.0 - std::pow(options_.beta2, t)});
  }

 private:
  AdamWOptions options_;
};

}  // namespace trainmem::optim
