// trainmem/ops/matmul.hpp — matmul, batched matmul and linear.
//
// All three are one GEMM call forward and two backward (dA = dC op(B)^T, dB =
// op(A)^T dC, with the transposes folded into the GEMM flags, never materialised).
// They are the LowerPrecision autocast category and the Matmul kind: selective
// checkpoint policies keep their outputs because they dominate recompute cost. Under
// amp::Fp8Autocast, linear with a registered weight runs its GEMMs in FP8
// (ops/fp8_linear.hpp); matmul and bmm stay in the 16-bit autocast dtype.
#pragma once

#include "trainmem/core/backend_contract.hpp"
#include "trainmem/core/gemm_args.hpp"
#include "trainmem/ops/fp8_linear.hpp"
#include "trainmem/ops/op_helpers.hpp"

namespace trainmem {

namespace detail {

inline constexpr OpInfo kMatmulOp{"matmul", OpKind::Matmul, AutocastCategory::LowerPrecision};
inline constexpr OpInfo kBmmOp{"bmm", OpKind::Matmul, AutocastCategory::LowerPrecision};
inline constexpr OpInfo kLinearOp{"linear", OpKind::Matmul, AutocastCategory::LowerPrecision};

/// c = op(a) op(b) for [batch] stacks of contiguous matrices.
template <class B>
void gemm(const Tensor<B>& a, bool trans_a, const Tensor<B>& b, bool trans_b, const Tensor<B>& c, std::int64_t batch,
          std::int64_t m, std::int64_t n, std::int64_t k) {
  a.backend().gemm(gemm_args(trans_a, trans_b, batch, m, n, k), a, b, c);
}

/// Shared forward/backward of C[batch] = op(A[batch]) op(B[batch]).
template <class B>
Var<B> matmul_impl(const OpInfo& info, const Var<B>& a, const Var<B>& b, bool trans_a, bool trans_b, std::int64_t batch,
                   std::int64_t m, std::int64_t n, std::int64_t k, Shape out_shape) {
  OpRecorder<B> rec(info, {a, b}, 2.0 * batch * m * n * k);
  const DType dtype = rec.compute_dtype();
  const Tensor<B>& ta = rec.input(0);
  const Tensor<B>& tb = rec.input(1);
  const bool need_a = rec.needs_grad(0), need_b = rec.needs_grad(1);
  SavedTensor<B> saved_a = need_b ? rec.save(ta) : SavedTensor<B>();
  SavedTensor<B> saved_b = need_a ? rec.save(tb) : SavedTensor<B>();
  auto out = rec.compute([&] {
    Tensor<B> c = new_tensor(rec.backend(), out_shape, dtype);
    gemm(ta, trans_a, tb, trans_b, c, batch, m, n, k);
    return Outputs<B>{std::move(c)};
  });
  const Shape shape_a = ta.shape(), shape_b = tb.shape();
  return rec.finish(out[0], [=, saved_a = std::move(saved_a), saved_b = std::move(saved_b)](const Grads<B>& g) {
    const Tensor<B>& dc = g[0];
    Grads<B> grads(2);
    if (need_a) {
      const Tensor<B> B_ = saved_b.unpack();
      Tensor<B> da = new_tensor(dc.backend(), shape_a, dc.dtype());
      if (!trans_a) gemm(dc, false, B_, !trans_b, da, batch, m, k, n);  // [m,n] x op(B)^T
      else gemm(B_, trans_b, dc, true, da, batch, k, m, n);             // op(B) [k,n] x dC^T
      grads[0] = da;
    }
    if (need_b) {
      const Tensor<B> A_ = saved_a.unpack();
      Tensor<B> db = new_tensor(dc.backend(), shape_b, dc.dtype());
      if (!trans_b) gemm(A_, !trans_a, dc, false, db, batch, k, n, m);  // op(A)^T [k,m] x dC
      else gemm(dc, true, A_, trans_a, db, batch, n, k, m);             // dC^T [n,m] x op(A)
      grads[1] = db;
    }
    return grads;
  });
}

}  // namespace detail

/// C = op(A) op(B) for 2-D A and B; op transposes when asked.
template <class B>
Var<B> matmul(const Var<B>& a, const Var<B>& b, bool trans_a = false, bool trans_b = false) {
  const auto& info = detail::kMatmulOp;
  detail::require_floating(info, a, "A");
  detail::require_floating(info, b, "B");
  detail::check(a.shape().rank() == 2 && b.shape().rank() == 2, "matmul: expects 2-D operands, got A ", a.shape(),
                " and B ", b.shape(), " (use bmm for batches)");
  const std::int64_t m = trans_a ? a.shape()[1] : a.shape()[0], ka = trans_a ? a.shape()[0] : a.shape()[1];
  const std::int64_t kb = trans_b ? b.shape()[1] : b.shape()[0], n = trans_b ? b.shape()[0] : b.shape()[1];
  detail::check(ka == kb, "matmul: inner dimensions differ: op(A) is [", m, ", ", ka, "] (A ", a.shape(),
                trans_a ? ", transposed" : "", "), op(B) is [", kb, ", ", n, "] (B ", b.shape(),
                trans_b ? ", transposed" : "", ")");
  return detail::matmul_impl(info, a, b, trans_a, trans_b, 1, m, n, ka, Shape{m, n});
}

/// C[i] = op(A[i]) op(B[i]) for 3-D A [batch, ., .] and B [batch, ., .].
template <class B>
Var<B> bmm(const Var<B>& a, const Var<B>& b, bool trans_a = false, bool trans_b = false) {
  const auto& info = detail::kBmmOp;
  detail::require_floating(info, a, "A");
  detail::require_floating(info, b, "B");
  detail::check(a.shape().rank() == 3 && b.shape().rank() == 3 && a.shape()[0] == b.shape()[0],
                "bmm: expects 3-D operands with equal batch, got A ", a.shape(), " and B ", b.shape());
  const std::int64_t batch = a.shape()[0];
  const std::int64_t m = trans_a ? a.shape()[2] : a.shape()[1], ka = trans_a ? a.shape()[1] : a.shape()[2];
  const std::int64_t kb = trans_b ? b.shape()[2] : b.shape()[1], n = trans_b ? b.shape()[1] : b.shape()[2];
  detail::check(ka == kb, "bmm: inner dimensions differ: op(A) is [", m, ", ", ka, "], op(B) is [", kb, ", ", n,
                "] (A ", a.shape(), ", B ", b.shape(), ")");
  return detail::matmul_impl(info, a, b, trans_a, trans_b, batch, m, n, ka, Shape{batch, m, n});
}

namespace detail {

/// y = x W^T + b over the rows of x (b may be undefined), in `dtype`: linear's forward.
template <class B>
Tensor<B> linear_forward(const Tensor<B>& x, const Tensor<B>& w, const Tensor<B>& b, const Shape& y_shape,
                         DType dtype) {
  B& backend = x.backend();
  const std::int64_t rows = x.rows(), in = w.shape()[1], out = w.shape()[0];
  Tensor<B> y = new_tensor(backend, y_shape, dtype);
  if constexpr (HasGemmBias<B>) {
    // The bias joins the FP32 accumulator, so y is rounded once, not twice.
    if (b.defined()) {
      backend.gemm_bias(gemm_args(false, true, 1, rows, out, in), x, w, b, y, false);
      return y;
    }
  }
  gemm(x, false, w, true, y, 1, rows, out, in);
  if (b.defined()) backend.map(math::Add{}, y, b, y);
  return y;
}

/// linear's backward from dy: grads[0] = dx (of shape x_shape, needs w), grads[1] = dW
/// (needs x), grads[2] = db, each only where asked.
template <class B>
void linear_backward(const Tensor<B>& dy, const Shape& x_shape, const Tensor<B>& w, const Tensor<B>& x, bool need_x,
                     bool need_w, bool need_b, Grads<B>& grads) {
  B& backend = dy.backend();
  const std::int64_t rows = dy.rows(), out = dy.cols(), in = x_shape.back();
  if (need_x) {
    Tensor<B> dx = new_tensor(backend, x_shape, dy.dtype());
    gemm(dy, false, w, false, dx, 1, rows, in, out);
    grads[0] = dx;
  }
  if (need_w) {
    Tensor<B> dw = new_tensor(backend, Shape{out, in}, dy.dtype());
    gemm(dy, true, x, false, dw, 1, out, in, rows);
    grads[1] = dw;
  }
  if (need_b) {
    Tensor<B> db = new_tensor(backend, Shape{out}, dy.dtype());
    backend.sum_rows(dy, db);
    grads[2] = db;
  }
}

}  // namespace detail

/// y = x W^T + b with x [..., in], W [out, in], b [out] (or undefined): PyTorch's layout.
template <class B>
Var<B> linear(const Var<B>& x, const Var<B>& weight, const Var<B>& bias = Var<B>()) {
  const auto& info = detail::kLinearOp;
  detail::require_floating(info, x, "x");
  detail::require_floating(info, weight, "weight");
  detail::check(weight.shape().rank() == 2 && x.shape().rank() >= 1 && x.shape().back() == weight.shape()[1],
                "linear: x ", x.shape(), " does not match weight ", weight.shape(), " (expected x [..., ",
                weight.shape().rank() == 2 ? weight.shape()[1] : -1, "])");
  const bool has_bias = bias.defined();
  if (has_bias)
    detail::check(bias.shape() == Shape{weight.shape()[0]}, "linear: bias ", bias.shape(), " should be [",
                  weight.shape()[0], "] for weight ", weight.shape());
  const std::int64_t rows = x.value().rows(), in = weight.shape()[1], out_features = weight.shape()[0];
  const Shape out_shape = x.shape().with_back(out_features);

  using Inputs = typename OpRecorder<B>::Inputs;
  OpRecorder<B> rec(info, has_bias ? Inputs{x, weight, bias} : Inputs{x, weight}, 2.0 * rows * in * out_features);
  if constexpr (HasFp8<B>) {
    if (const amp::Fp8Context<B>* fp8 = rec.fp8()) {
      if (const std::optional<std::size_t> w = fp8->scaling->find_weight(weight.value()))
        return detail::linear_fp8(rec, *fp8, *w, x, weight, has_bias, out_shape);
      detail::check(weight.tape() != nullptr || !weight.requires_grad(), "linear: weight '", weight.name(), "' ",
                    weight.shape(),
                    " is a parameter the active amp::Fp8Scaling does not hold (construct it from "
                    "every parameter of the model)");
    }
  }
  const DType dtype = rec.compute_dtype();
  const Tensor<B>& tx = rec.input(0);
  const Tensor<B>& tw = rec.input(1);
  const Tensor<B> tb = has_bias ? rec.input(2) : Tensor<B>();
  const bool need_x = rec.needs_grad(0), need_w = rec.needs_grad(1), need_b = has_bias && rec.needs_grad(2);
  SavedTensor<B> saved_x = need_w ? rec.save(tx) : SavedTensor<B>();
  SavedTensor<B> saved_w = need_x ? rec.save(tw) : SavedTensor<B>();
  auto out = rec.compute([&] { return Outputs<B>{detail::linear_forward(tx, tw, tb, out_shape, dtype)}; });
  const Shape x_shape = x.shape();
  return rec.finish(out[0], [=, saved_x = std::move(saved_x), saved_w = std::move(saved_w)](const Grads<B>& g) {
    Grads<B> grads(has_bias ? 3 : 2);
    detail::linear_backward(g[0], x_shape, need_x ? saved_w.unpack() : Tensor<B>(),
                            need_w ? saved_x.unpack() : Tensor<B>(), need_x, need_w, need_b, grads);
    return grads;
  });
}

}  // namespace trainmem
