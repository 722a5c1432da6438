// trainmem/nn/embedding.hpp — a learned lookup table, N(0, stddev) initialised.
//
// One parameter, "weight" [count, dim] (nn::Module). Built from positional arguments or
// from EmbeddingOptions: nn::Embedding<B> tokens({.count = vocab, .dim = 128, .stddev = 0.02}, init).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "trainmem/nn/init.hpp"
#include "trainmem/nn/module.hpp"
#include "trainmem/ops/embedding.hpp"

namespace trainmem::nn {

/// Embedding's settings by name; `count` and `dim` must be given.
struct EmbeddingOptions {
  std::int64_t count = 0;
  std::int64_t dim = 0;
  double stddev = 1.0;
  DType dtype = DType::F32;
  std::string name = "embedding";  // until a parent's register_module renames it
};

template <class B>
class Embedding : public Module<B> {
 public:
  using Options = EmbeddingOptions;
  Embedding(std::int64_t count, std::int64_t dim, Init& init, double stddev = 1.0, DType dtype = DType::F32,
            std::string name = "embedding")
      : Embedding(EmbeddingOptions{count, dim, stddev, dtype, std::move(name)}, init) {}
  Embedding(const EmbeddingOptions& options, Init& init) : Module<B>("Embedding", options.name) {
    const std::int64_t count = options.count, dim = options.dim;
    const double stddev = options.stddev;
    const DType dtype = options.dtype;
    const std::string& name = options.name;
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
