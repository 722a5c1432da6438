// trainmem/ops/fp8_linear.hpp — linear's three GEMMs on FP8 operands (under amp::Fp8Autocast).
//
// Forward   y  = (q(x) q(W)^T) * s_x^-1 s_W^-1 (+ b)    x, W in E4M3
// Backward  dx = (q(dy) q(W))   * s_dy^-1 s_W^-1         dy in E5M2
//           dW = (q(dy)^T q(x)) * s_dy^-1 s_x^-1
//           db = sum of the rows of dy (16-bit, as without FP8)
// Each q(t) = fp8(t * s_t) with the scale of t's role (autocast/fp8_scaling.hpp); every
// product of two FP8 values is exact in f32 and the sums are f32, so y, dx and dW are
// rounded once, to the autocast dtype. The op saves q(x) and q(W), one byte an element:
// the FP8 forward also halves what a linear keeps for backward. The scales the backward
// divides out are the forward's (captured with the generation), so a scale update between
// a forward and its backward cannot mismatch them.
#pragma once

#include <cstddef>
#include <memory>

#include "trainmem/autocast/fp8_autocast.hpp"
#include "trainmem/core/backend_contract.hpp"
#include "trainmem/core/gemm_args.hpp"
#include "trainmem/ops/op_helpers.hpp"

namespace trainmem::detail {

/// Whether linear(x, weight) runs its GEMMs in FP8 now: an active FP8 context holding
/// weight, under enabled autocast, with no f64 operand (which autocast never narrows).
template <class B>
bool fp8_runs(const Var<B>& x, const Var<B>& weight) {
  if constexpr (HasFp8<B>) {
    const amp::Fp8Context<B>& fp8 = amp::fp8_context<B>();
    return fp8.active() && amp::autocast_state().enabled && x.dtype() != DType::F64 && weight.dtype() != DType::F64 &&
           fp8.scaling->find_weight(weight.value()).has_value();
  } else {
    return false;
  }
}

/// linear(x, weight, bias) with its GEMMs in FP8; `w` is weight's index in the context's scaling.
template <class B>
requires HasFp8<B> Var<B> linear_fp8(OpRecorder<B>& rec, const amp::Fp8Context<B>& fp8, std::size_t w, const Var<B>& x,
                                     const Var<B>& weight, bool has_bias, const Shape& out_shape) {
  using amp::Fp8Role;
  amp::Fp8Scaling<B>* scaling = fp8.scaling;
  std::shared_ptr<const amp::Fp8Scales<B>> scales = fp8.scales;
  const bool record = rec.fp8_records_amax();
  const DType dtype = rec.compute_dtype();
  const std::size_t r_x = scaling->role_index(w, Fp8Role::Input), r_w = scaling->role_index(w, Fp8Role::Weight),
                    r_dy = scaling->role_index(w, Fp8Role::GradOutput);
  const std::int64_t rows = x.value().rows(), in = weight.shape()[1], out = weight.shape()[0];
  const Tensor<B> sinv_x = amp::Fp8Scaling<B>::slot(scales->scale_inv, r_x);
  const Tensor<B> sinv_w = amp::Fp8Scaling<B>::slot(scales->scale_inv, r_w);

  const Tensor<B> qx = scaling->quantize(x.value(), r_x, Fp8Role::Input, *scales, record);
  const Tensor<B> qw = scaling->quantized_weight(w, weight.value(), *scales, record);
  const Tensor<B> tb = has_bias ? rec.input(2) : Tensor<B>();
  const bool need_x = rec.needs_grad(0), need_w = rec.needs_grad(1), need_b = has_bias && rec.needs_grad(2);
  SavedTensor<B> saved_x = need_w ? rec.save(qx) : SavedTensor<B>();
  SavedTensor<B> saved_w = need_x ? rec.save(qw) : SavedTensor<B>();
  auto outputs = rec.compute([&] {
    Tensor<B> y = new_tensor(rec.backend(), out_shape, dtype);
    rec.backend().gemm_fp8(gemm_args(false, true, 1, rows, out, in), qx, qw, y, sinv_x, sinv_w);
    if (tb.defined()) rec.backend().map(math::Add{}, y, tb, y);
    return Outputs<B>{std::move(y)};
  });
  const Shape x_shape = x.shape();
  return rec.finish(outputs[0], [=, saved_x = std::move(saved_x), saved_w = std::move(saved_w)](const Grads<B>& g) {
    const Tensor<B>& dy = g[0];
    B& backend = dy.backend();
    Grads<B> grads(has_bias ? 3 : 2);
    if (need_x || need_w) {
      const Tensor<B> qdy = scaling->quantize(dy, r_dy, Fp8Role::GradOutput, *scales, true);
      const Tensor<B> sinv_dy = amp::Fp8Scaling<B>::slot(scales->scale_inv, r_dy);
      if (need_x) {
        Tensor<B> dx = new_tensor(backend, x_shape, dy.dtype());
        backend.gemm_fp8(gemm_args(false, false, 1, rows, in, out), qdy, saved_w.unpack(), dx, sinv_dy, sinv_w);
        grads[0] = dx;
      }
      if (need_w) {
        Tensor<B> dw = new_tensor(backend, Shape{out, in}, dy.dtype());
        backend.gemm_fp8(gemm_args(true, false, 1, out, in, rows), qdy, saved_x.unpack(), dw, sinv_dy, sinv_x);
        grads[1] = dw;
      }
    }
    if (need_b) {
      Tensor<B> db = new_tensor(backend, Shape{out}, dy.dtype());
      backend.sum_rows(dy, db);
      grads[2] = db;
    }
    return grads;
  });
}

}  // namespace trainmem::detail
