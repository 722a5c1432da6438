// trainmem/nn/mlp.hpp — the transformer MLP block: Linear -> GELU -> Linear.
#pragma once

#include <string>
#include <vector>

#include "trainmem/nn/linear.hpp"
#include "trainmem/ops/activation.hpp"

namespace trainmem::nn {

template <class B>
class Mlp {
 public:
  Mlp(std::int64_t dim, std::int64_t hidden, Init& init, DType dtype = DType::F32, std::string name = "mlp")
      : up_(dim, hidden, init, true, dtype, name + ".up"), down_(hidden, dim, init, true, dtype, name + ".down") {}
  Var<B> operator()(const Var<B>& x) const { return down_(gelu(up_(x))); }
  std::vector<Var<B>> parameters() const {
    auto p = up_.parameters();
    for (auto& v : down_.parameters()) p.push_back(v);
    return p;
  }

 private:
  Linear<B> up_, down_;
};

}  // namespace trainmem::nn
