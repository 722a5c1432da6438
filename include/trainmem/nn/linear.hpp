// trainmem/nn/linear.hpp — y = x W^T + b with PyTorch's default initialisation.
//
// Parameters "weight" and "bias" (nn::Module); `name` prefixes them until a parent
// module registers this one under its own path, so a submodule needs no name of its own:
//   nn::Linear<B> fc({.in = 128, .out = 512, .bias = false}, init);
//   register_module("fc", fc);  // parameters "fc.weight", or "blocks.0.fc.weight" further up
#pragma once

#include <cmath>
#include <string>
#include <utility>

#include "trainmem/nn/init.hpp"
#include "trainmem/nn/module.hpp"
#include "trainmem/ops/matmul.hpp"

namespace trainmem::nn {

/// Linear's settings by name; `in` and `out` have no default and must be given.
struct LinearOptions {
  std::int64_t in = 0;
  std::int64_t out = 0;
  bool bias = true;
  DType dtype = DType::F32;
  std::string name = "linear";  // until a parent's register_module renames it
};

/// \brief Fully connected layer: weight [out, in], bias [out], both U(-1/sqrt(in), 1/sqrt(in)).
template <class B>
class Linear : public Module<B> {
 public:
  using Options = LinearOptions;
  Linear(const LinearOptions& options, Init& init) : Module<B>("Linear", options.name) {
    const std::int64_t in = options.in, out = options.out;
    const DType dtype = options.dtype;
    const std::string& name = options.name;
    detail::check(in > 0 && out > 0, "nn::Linear: extents must be positive, got in=", in, " out=", out);
    const double bound = 1.0 / std::sqrt(static_cast<double>(in));
    weight_ = this->register_parameter(
        "weight", init.parameter<B>(Shape{out, in}, init.uniform(out * in, -bound, bound), dtype, name + ".weight"));
    if (options.bias)
      bias_ = this->register_parameter(
          "bias", init.parameter<B>(Shape{out}, init.uniform(out, -bound, bound), dtype, name + ".bias"));
  }
  Linear(std::int64_t in, std::int64_t out, Init& init, bool bias = true, DType dtype = DType::F32,
         std::string name = "linear")
      : Linear(LinearOptions{in, out, bias, dtype, std::move(name)}, init) {}

  Var<B> operator()(const Var<B>& x) const { return linear(x, weight_, bias_); }
  const Var<B>& weight() const { return weight_; }
  const Var<B>& bias() const { return bias_; }

 private:
  Var<B> weight_, bias_;
};

}  // namespace trainmem::nn
