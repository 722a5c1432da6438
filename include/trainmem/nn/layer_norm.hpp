// trainmem/nn/layer_norm.hpp — layer norm with learned gain (ones) and bias (zeros).
//
// Parameters "weight" (the gain) and "bias" (nn::Module).
#pragma once

#include <string>
#include <vector>

#include "trainmem/nn/init.hpp"
#include "trainmem/nn/module.hpp"
#include "trainmem/ops/norm.hpp"

namespace trainmem::nn {

template <class B>
class LayerNorm : public Module<B> {
 public:
  explicit LayerNorm(std::int64_t dim, double eps = 1e-5, DType dtype = DType::F32, std::string name = "layer_norm")
      : Module<B>("LayerNorm", name), eps_(eps) {
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
