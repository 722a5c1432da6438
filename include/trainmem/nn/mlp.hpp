// trainmem/nn/mlp.hpp — the transformer MLP block: Linear -> GELU -> Linear.
//
// Submodules "up" [dim -> hidden] and "down" [hidden -> dim] (nn::Module). It runs as
// one feed_forward op (ops/feed_forward.hpp), which keeps the GELU's input and not its
// output: the same values and gradients as the three ops, in fewer kept bytes.
#pragma once

#include <string>
#include <vector>

#include "trainmem/nn/linear.hpp"
#include "trainmem/ops/feed_forward.hpp"

namespace trainmem::nn {

template <class B>
class Mlp : public Module<B> {
 public:
  Mlp(std::int64_t dim, std::int64_t hidden, Init& init, DType dtype = DType::F32, std::string name = "mlp")
      : Module<B>("Mlp", name),
        up_(dim, hidden, init, true, dtype, name + ".up"),
        down_(hidden, dim, init, true, dtype, name + ".down") {
    this->register_module("up", up_);
    this->register_module("down", down_);
  }
  Var<B> operator()(const Var<B>& x) const {
    return feed_forward(x, up_.weight(), up_.bias(), down_.weight(), down_.bias());
  }

 private:
  Linear<B> up_, down_;
};

}  // namespace trainmem::nn
