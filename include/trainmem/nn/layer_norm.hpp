// trainmem/nn/layer_norm.hpp — layer norm with learned gain (ones) and bias (zeros).
#pragma once

#include <string>
#include <vector>

#include "trainmem/nn/init.hpp"
#include "trainmem/ops/norm.hpp"

namespace trainmem::nn {

template <class B>
class LayerNorm {
 public:
  explicit LayerNorm(std::int64_t dim, double eps = 1e-5, DType dtype = DType::F32, std::string name = "layer_norm")
      : eps_(eps) {
    detail::check(dim > 0, "nn::LayerNorm: dim must be positive, got ", dim);
    Init init;
    gamma_ = init.parameter<B>(Shape{dim}, std::vector<double>(static_cast<std::size_t>(dim), 1.0), dtype, name + ".weight");
    beta_ = init.parameter<B>(Shape{dim}, std::vector<double>(static_cast<std::size_t>(dim), 0.0), dtype, name + ".bias");
  }
  Var<B> operator()(const Var<B>& x) const { return layer_norm(x, gamma_, beta_, eps_); }
  std::vector<Var<B>> parameters() const { return {gamma_, beta_}; }

 private:
  Var<B> gamma_, beta_;
  double eps_;
};

}  // namespace trainmem::nn
