// tests/ops/softplus_op.hpp — the custom op of docs/writing-an-op.md, written with public API only.
//
// test_writing_an_op.cpp checks that the guide shows this code verbatim and that the op
// computes the right values and gradients, so the guide cannot drift from working code.
#pragma once

#include <cmath>
#include <vector>

#include "trainmem/trainmem.hpp"

namespace my_ops {

// The formulas, once for every backend: the accumulator type T is float (double for f64).
struct Softplus {
  template <class T>
  TRAINMEM_HOST_DEVICE T operator()(T x) const {
    return x > T(20) ? x : std::log1p(std::exp(x));  // log(1 + e^x), exact to rounding above 20
  }
};
struct SoftplusBackward {  // (upstream gradient, saved input) -> input gradient
  template <class T>
  TRAINMEM_HOST_DEVICE T operator()(T dy, T x) const {
    return dy / (T(1) + std::exp(-x));  // d softplus / dx = sigmoid(x)
  }
};

// Identity (what checkpoint policies see) and autocast category, declared once.
inline constexpr trainmem::OpInfo kSoftplusOp{"softplus", trainmem::OpKind::Elementwise,
                                              trainmem::AutocastCategory::Fp32};

/// softplus(x) = log(1 + exp(x)), element-wise; keeps its input for backward.
template <class B>
trainmem::Var<B> softplus(const trainmem::Var<B>& x) {
  using namespace trainmem;
  require(is_floating(x.dtype()), "softplus: x must be floating, got ", x.dtype(), " ", x.shape());
  OpRecorder<B> rec(kSoftplusOp, {x}, 4.0 * static_cast<double>(x.numel()));
  const DType dtype = rec.compute_dtype();  // f32 under autocast (the Fp32 category)
  Tensor<B> tx = rec.input(0);              // x cast to that dtype
  SavedTensor<B> saved_x = rec.save(tx);    // save inputs before compute, outputs after
  auto out = rec.compute([&] {
    Tensor<B> y = new_tensor(rec.backend(), tx.shape(), dtype);
    rec.backend().map(Softplus{}, tx, y);
    return Outputs<B>{y};
  });
  return rec.finish(out[0], [=](const Grads<B>& g) {
    const Tensor<B> xv = saved_x.unpack();  // under a checkpoint region this may recompute
    Tensor<B> dx = new_tensor(g[0].backend(), xv.shape(), g[0].dtype());
    g[0].backend().map(SoftplusBackward{}, g[0], xv, dx);
    return Grads<B>{dx};
  });
}

}  // namespace my_ops
