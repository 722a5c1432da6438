// trainmem/nn/layer_norm.hpp — layer norm with learned gain (ones) and bias (zeros).
//
// Parameters "weight" (the gain) and "bias" (nn::Module). Built from positional
// arguments or from LayerNormOptions: nn::LayerNorm<B> ln({.dim = 512, .eps = 1e-6}).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "trainmem/nn/init.hpp"
#include "trainmem/nn/module.hpp"
#include "trainmem/ops/norm.hpp"

namespace trainmem::nn {

/// LayerNorm's settings by name; `dim` must be given.
struct LayerNormOptions {
  std::int64_t dim = 0;
  double eps = 1e-5;
  DType dtype = DType::F32;
  std::string name = "layer_norm";  // until a parent's register_module renames it
};

template <class B>
class LayerNorm : public Module<B> {
 public:
  using Options = LayerNormOptions;
  explicit LayerNorm(std::int64_t dim, double eps = 1e-5, DType dtype = DType::F32, std::string name = "layer_norm")
      : LayerNorm(LayerNormOptions{dim, eps, dtype, std::move(name)}) {}
  explicit LayerNorm(const LayerNormOptions& options) : Module<B>("LayerNorm", options.name), eps_(options.eps) {
    const std::int64_t dim = options.dim;
    const double eps = options.eps;
    const DType dtype = options.dtype;
    const std::string& name = options.name;
    detail::check(dim > 0, "nn::LayerNorm: dim must be positive, got ", dim);
    detail::check(eps > 0.0, "nn::LayerNorm: eps must be positive, got ", eps);
    Init init;
    gamma_ = this->register_parameter(
        "weight", init.parameter<B>(Shape{dim}, std::vector<double>(static_cast<std::size_t>(dim), 1.0), dtype,
                                    name + ".weight"));
    beta_ = this->register_parameter(
        "bias",
        init.parameter<B>(Shape{dim}, std::vector<double>(static_cast<std::size_t>(dim), 0.0), dtype, name + ".bias"));
  }
  Var<B> operator()(const Var<B>& x) const { return layer_norm(x, gamma_, beta_, eps_); }

 private:
  Var<B> gamma_, beta_;
  double eps_;
};

}  // namespace trainmem::nn
