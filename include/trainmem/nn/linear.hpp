// trainmem/nn/linear.hpp — y = x W^T + b with PyTorch's default initialisation.
//
// Parameters "weight" and "bias" (nn::Module); `name` prefixes them until a parent
// module registers this one under its own path.
#pragma once

#include <cmath>
#include <string>

#include "trainmem/nn/init.hpp"
#include "trainmem/nn/module.hpp"
#include "trainmem/ops/matmul.hpp"

namespace trainmem::nn {

/// \brief Fully connected layer: weight [out, in], bias [out], both U(-1/sqrt(in), 1/sqrt(in)).
template <class B>
class Linear : public Module<B> {
 public:
  Linear(std::int64_t in, std::int64_t out, Init& init, bool bias = true, DType dtype = DType::F32,
         std::string name = "linear")
      : Module<B>("Linear", name) {
    detail::check(in > 0 && out > 0, "nn::Linear: extents must be positive, got in=", in, " out=", out);
    const double bound = 1.0 / std::sqrt(static_cast<double>(in));
    weight_ = this->register_parameter(
        "weight", init.parameter<B>(Shape{out, in}, init.uniform(out * in, -bound, bound), dtype, name + ".weight"));
    if (bias)
      bias_ = this->register_parameter(
          "bias", init.parameter<B>(Shape{out}, init.uniform(out, -bound, bound), dtype, name + ".bias"));
  }
  Var<B> operator()(const Var<B>& x) const { return linear(x, weight_, bias_); }
  const Var<B>& weight() const { return weight_; }
  const Var<B>& bias() const { return bias_; }

 private:
  Var<B> weight_, bias_;
};

}  // namespace trainmem::nn
