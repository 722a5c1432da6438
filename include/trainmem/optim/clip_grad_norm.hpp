// trainmem/optim/clip_grad_norm.hpp — global gradient-norm clipping.
//
// The norm is over all gradients together, sqrt(sum of every element squared),
// accumulated in f64 by the backend (f32 overflows for finite gradients above ~1e19); if it exceeds max_norm every
// gradient is multiplied by max_norm / (norm + 1e-6) (torch.nn.utils.clip_grad_norm_'s rule). With a loss scaler the
// gradients must be unscaled first: scaler.unscale_(optimizer), then clip, then scaler.step(optimizer). The norm is
// read on the host to return it and to decide whether to scale (one device sync). A non-finite norm leaves the
// gradients as they are: the scaler's step skips such a step anyway.
#pragma once

#include <cmath>
#include <vector>

#include "trainmem/autograd/parameter_list.hpp"
#include "trainmem/autograd/var.hpp"
#include "trainmem/core/math.hpp"
#include "trainmem/optim/optimizer.hpp"

namespace trainmem::optim {

/// Clips the gradients of `params` (those that have one) to a global 2-norm of at most
/// `max_norm`; returns the norm before clipping.
template <class B>
double clip_grad_norm(const std::vector<Var<B>>& params, double max_norm) {
  detail::check(max_norm >= 0 && std::isfinite(max_norm), "clip_grad_norm: max_norm must be finite and >= 0, got ",
                max_norm);
  check_parameter_list(params, "clip_grad_norm");  // a tied parameter listed twice would be scaled twice
  std::vector<Tensor<B>> grads;
  for (const Var<B>& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  if (grads.empty()) return 0.0;
  B& backend = grads.front().backend();
  Tensor<B> sum_sq = Tensor<B>::zeros(Shape{}, DType::F64, MemCategory::Temporary, backend);
  for (const Tensor<B>& g : grads) backend.sum_squares(g, sum_sq);
  const double norm = std::sqrt(sum_sq.template to_host<double>()[0]);
  const double coefficient = max_norm / (norm + 1e-6);
  if (std::isfinite(norm) && coefficient < 1.0) {
    for (const Tensor<B>& g : grads) {
      backend.map(math::Scale{coefficient}, g, g);
      g.bump_version();
    }
  }
  return norm;
}

/// Clips the gradients of every parameter `optimizer` updates.
template <class B>
double clip_grad_norm(const Optimizer<B>& optimizer, double max_norm) {
  std::vector<Var<B>> params;
  for (const auto& e : optimizer.entries()) params.push_back(e.param);
  return clip_grad_norm(params, max_norm);
}

}  // namespace trainmem::optim
