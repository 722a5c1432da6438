// trainmem/nn/rms_norm.hpp — RMS norm (LLaMA's) with a learned gain, initialised to ones.
//
// One parameter, "weight" (nn::Module); no bias and no mean subtraction:
// y = x / sqrt(mean(x^2) + eps) * weight over the last dimension, as the rms_norm op
// (ops/norm.hpp), which keeps one reciprocal RMS per row for backward. Built from
// positional arguments or from RMSNormOptions: nn::RMSNorm<B> norm({.dim = 512}).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "trainmem/nn/init.hpp"
#include "trainmem/nn/module.hpp"
#include "trainmem/ops/norm.hpp"

namespace trainmem::nn {

/// RMSNorm's settings by name; `dim` must be given.
struct RMSNormOptions {
  std::int64_t dim = 0;
  double eps = 1e-6;
  DType dtype = DType::F32;
  std::string name = "rms_norm";  // until a parent's register_module renames it
};

template <class B>
class RMSNorm : public Module<B> {
 public:
  using Options = RMSNormOptions;
  explicit RMSNorm(std::int64_t dim, double eps = 1e-6, DType dtype = DType::F32, std::string name = "rms_norm")
      : RMSNorm(RMSNormOptions{dim, eps, dtype, std::move(name)}) {}
  explicit RMSNorm(const RMSNormOptions& options) : Module<B>("RMSNorm", options.name), eps_(options.eps) {
    detail::check(options.dim > 0, "nn::RMSNorm: dim must be positive, got ", options.dim);
    detail::check(options.eps > 0.0, "nn::RMSNorm: eps must be positive, got ", options.eps);
    Init init;
    weight_ = this->register_parameter(
        "weight", init.parameter<B>(Shape{options.dim}, std::vector<double>(static_cast<std::size_t>(options.dim), 1.0),
                                    options.dtype, options.name + ".weight"));
  }
  Var<B> operator()(const Var<B>& x) const { return rms_norm(x, weight_, eps_); }
  const Var<B>& weight() const { return weight_; }

 private:
  Var<B> weight_;
  double eps_;
};

}  // namespace trainmem::nn
