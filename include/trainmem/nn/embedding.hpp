// trainmem/nn/embedding.hpp — a learned lookup table, N(0, stddev) initialised.
//
// One parameter, "weight" [count, dim] (nn::Module).
#pragma once

#include <string>
#include <vector>

#include "trainmem/nn/init.hpp"
#include "trainmem/nn/module.hpp"
#include "trainmem/ops/embedding.hpp"

namespace trainmem::nn {

template <class B>
class Embedding : public Module<B> {
 public:
  Embedding(std::int64_t count, std::int64_t dim, Init& init, double stddev = 1.0, DType dtype = DType::F32,
            std::string name = "embedding")
      : Module<B>("Embedding", name) {
    detail::check(count > 0 && dim > 0, "nn::Embedding: extents must be positive, got ", count, " x ", dim);
    table_ = this->register_parameter(
        "weight", init.parameter<B>(Shape{count, dim}, init.normal(count * dim, 0.0, stddev), dtype, name + ".weight"));
  }
  /// Looks up i32 ids (a Var from tape.input).
  Var<B> operator()(const Var<B>& ids) const { return embedding(table_, ids); }
  const Var<B>& weight() const { return table_; }

 private:
  Var<B> table_;
};

}  // namespace trainmem::nn
