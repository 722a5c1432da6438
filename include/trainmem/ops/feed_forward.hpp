// trainmem/ops/feed_forward.hpp — the transformer MLP, linear -> GELU -> linear, as one op
// that keeps what backward cannot cheaply make again and recomputes the rest.
//
// Written as three ops, the MLP keeps its input, the pre-activation z = x W1^T + b1
// (for GELU's backward) and the activation h = gelu(z) (for the second linear's weight
// gradient): with hidden = 4 dim, h alone is half of the MLP's bytes. h is one
// element-wise pass over z, which backward keeps anyway, so this op keeps x and z only
// and recomputes h when it needs it: the same kernels in the same order, so the values
// and gradients are bit for bit those of the three ops (up to kFeedForwardRowChunk rows;
// see below), in 5/9 of the kept bytes (dim + hidden instead of dim + 2 hidden per row).
// Backward makes h and GELU's gradient together, one tanh per element (map_pair, where
// the backend has it). z is saved ahead (OpRecorder::save_ahead): a region's recompute
// that needs nothing after z (z is the last thing a transformer block saves) ends after
// the first linear, without GELU and the second linear: a third of the matmul work of a
// block's forward.
//
// NOTE [Feed-forward backward in row chunks]
// Backward needs h, dh = dy W_down and dz = gelu'(z) dh: [rows, hidden] each, as big as
// the z the op keeps, and two of them live at once: at the MLP's backward that was the
// step's peak (in the shoot-out's GPT, 64 MiB above the live bytes at 116 sequences).
// Every row of h, dh, dz and dx depends on the same row of z and dy only, so above
// kFeedForwardRowChunk rows backward runs chunk by chunk: the three are chunk-sized, dx
// is written a block of rows at a time, and the weight and bias gradients (sums over
// rows) accumulate over the chunks in the accumulator dtype (f32 for 16-bit) and are
// rounded once at the end, as one product would round them. Only the order of the
// f32 sums over row chunks differs from the one-product form.
//
// Under amp::Fp8Autocast with both weights in the active Fp8Scaling, the op runs as the
// three ops linear -> gelu -> linear, so its GEMMs take FP8 operands like every other
// linear (ops/fp8_linear.hpp); the FP8 linears keep 1-byte inputs instead.
#pragma once

#include <algorithm>
#include <vector>

#include "trainmem/ops/activation.hpp"
#include "trainmem/ops/matmul.hpp"

namespace trainmem {

namespace detail {
inline constexpr OpInfo kFeedForwardOp{"feed_forward", OpKind::Matmul, AutocastCategory::LowerPrecision};

/// h = gelu(z), in the activation op's kernel.
template <class B>
Tensor<B> gelu_of(const Tensor<B>& z, GeluApproximation approximation) {
  return approximation == GeluApproximation::Tanh ? unary(math::GeluTanh{}, z, z.dtype())
                                                  : unary(math::GeluErf{}, z, z.dtype());
}

/// What backward makes past the second linear, from dy [n, out] and z [n, hidden]: h =
/// gelu(z) when the second linear's weight gradient needs it, and dz = gelu'(z) dh with
/// dh = dy W_down when a gradient reaches the first linear, dz in dh's storage (two
/// [n, hidden] tensors live, as in the three-op form). With both wanted, on a backend
/// with map_pair, h and dz come from one pass (tanh or erf once per element).
template <class B>
struct GeluBackward {
  Tensor<B> h, dz;
};
template <class B>
GeluBackward<B> gelu_backward_and_value(const Tensor<B>& dy, const Tensor<B>& z, const Tensor<B>& w_down, bool need_h,
                                        bool need_dz, GeluApproximation approximation) {
  B& backend = dy.backend();
  const std::int64_t n = dy.rows(), out = dy.cols(), hidden = z.cols();
  GeluBackward<B> r;
  if (need_dz) {
    r.dz = new_tensor(backend, Shape{n, hidden}, dy.dtype());
    gemm(dy, false, w_down, false, r.dz, 1, n, hidden, out);  // dh, made dz below
  }
  if constexpr (HasMapPair<B>) {
    if (need_h && need_dz) {
      r.h = new_tensor(backend, z.shape(), z.dtype());
      if (approximation == GeluApproximation::Tanh)
        backend.map_pair(math::GeluTanhBackwardAndValue{}, r.dz, z, r.dz, r.h);
      else backend.map_pair(math::GeluErfBackwardAndValue{}, r.dz, z, r.dz, r.h);
      return r;
    }
  }
  if (need_h) r.h = gelu_of(z, approximation);
  if (need_dz) {
    if (approximation == GeluApproximation::Tanh) backend.map(math::GeluTanhBackward{}, r.dz, z, r.dz);
    else backend.map(math::GeluErfBackward{}, r.dz, z, r.dz);
  }
  return r;
}

/// Rows per chunk of feed_forward's backward (NOTE [Feed-forward backward in row chunks]).
inline constexpr std::int64_t kFeedForwardRowChunk = 2048;

/// What feed_forward's backward needs and which gradients it makes.
template <class B>
struct FeedForwardBackward {
  Tensor<B> x, z, w_up, w_down;  // x [rows, dim], z [rows, hidden]; x and the weights only where needed
  std::int64_t dim;
  GeluApproximation approximation;
  bool need_x, need_w_up, need_b_up, need_w_down, need_b_down;
};

/// Backward over row chunks (rows > kFeedForwardRowChunk): grads {dx [rows, dim], dW_up,
/// db_up, dW_down, db_down}, each defined where asked.
template <class B>
std::vector<Tensor<B>> feed_forward_backward_chunked(const FeedForwardBackward<B>& f, const Tensor<B>& dy) {
  B& backend = dy.backend();
  const DType dtype = dy.dtype(), acc = accumulator_dtype(dtype);
  const std::int64_t rows = dy.rows(), out = dy.cols(), hidden = f.z.cols(), dim = f.dim;
  const bool need_dz = f.need_x || f.need_w_up || f.need_b_up;
  std::vector<Tensor<B>> g(5);
  if (f.need_x) g[0] = new_tensor(backend, Shape{rows, dim}, dtype);
  Tensor<B> dw_up = f.need_w_up ? new_tensor(backend, Shape{hidden, dim}, acc) : Tensor<B>();
  Tensor<B> db_up = f.need_b_up ? new_tensor(backend, Shape{hidden}, acc) : Tensor<B>();
  Tensor<B> dw_down = f.need_w_down ? new_tensor(backend, Shape{out, hidden}, acc) : Tensor<B>();
  if (f.need_b_down) {  // a plain sum over the rows of dy, which is whole anyway
    g[4] = new_tensor(backend, Shape{out}, dtype);
    backend.sum_rows(dy, g[4]);
  }
  for (std::int64_t r0 = 0; r0 < rows; r0 += kFeedForwardRowChunk) {
    const std::int64_t r1 = std::min(rows, r0 + kFeedForwardRowChunk), n = r1 - r0;
    const double beta = r0 == 0 ? 0.0 : 1.0;  // the first chunk writes the sums, the rest add to them
    const Tensor<B> dy_c = dy.slice(r0, r1), z_c = f.z.slice(r0, r1);
    GeluBackward<B> gelu = gelu_backward_and_value(dy_c, z_c, f.w_down, f.need_w_down, need_dz, f.approximation);
    if (f.need_w_down) {
      GemmArgs args = gemm_args(true, false, 1, out, hidden, n);
      args.beta = beta;
      backend.gemm(args, dy_c, gelu.h, dw_down);
      gelu.h = Tensor<B>();
    }
    if (!need_dz) continue;
    const Tensor<B>& dz_c = gelu.dz;
    if (f.need_x) gemm(dz_c, false, f.w_up, false, g[0].slice(r0, r1), 1, n, dim, hidden);
    if (f.need_w_up) {
      GemmArgs args = gemm_args(true, false, 1, hidden, dim, n);
      args.beta = beta;
      backend.gemm(args, dz_c, f.x.slice(r0, r1), dw_up);
    }
    if (f.need_b_up) backend.sum_rows(dz_c, db_up, beta);
  }
  if (f.need_w_up) g[1] = dw_up.to(dtype);
  if (f.need_b_up) g[2] = db_up.to(dtype);
  if (f.need_w_down) g[3] = dw_down.to(dtype);
  return g;
}
}  // namespace detail

/// linear(gelu(linear(x, w_up, b_up)), w_down, b_down) with x [..., dim], w_up [hidden, dim],
/// w_down [dim_out, hidden]; either bias may be undefined. Keeps x and the pre-activation.
template <class B>
Var<B> feed_forward(const Var<B>& x, const Var<B>& w_up, const Var<B>& b_up, const Var<B>& w_down, const Var<B>& b_down,
                    GeluApproximation approximation = GeluApproximation::Tanh) {
  const auto& op = detail::kFeedForwardOp;
  detail::require_floating(op, x, "x");
  detail::require_floating(op, w_up, "w_up");
  detail::require_floating(op, w_down, "w_down");
  detail::check(w_up.shape().rank() == 2 && w_down.shape().rank() == 2 && x.shape().rank() >= 1 &&
                    x.shape().back() == w_up.shape()[1] && w_down.shape()[1] == w_up.shape()[0],
                "feed_forward: x ", x.shape(), ", w_up ", w_up.shape(), " and w_down ", w_down.shape(),
                " do not chain (expected x [..., dim], w_up [hidden, dim], w_down [out, hidden])");
  const bool has_b_up = b_up.defined(), has_b_down = b_down.defined();
  if (has_b_up)
    detail::check(b_up.shape() == Shape{w_up.shape()[0]}, "feed_forward: b_up ", b_up.shape(), " should be [",
                  w_up.shape()[0], "]");
  if (has_b_down)
    detail::check(b_down.shape() == Shape{w_down.shape()[0]}, "feed_forward: b_down ", b_down.shape(), " should be [",
                  w_down.shape()[0], "]");
  if (detail::fp8_runs(x, w_up) && detail::fp8_runs(x, w_down))
    return linear(gelu(linear(x, w_up, b_up), approximation), w_down, b_down);
  const std::int64_t rows = x.value().rows(), dim = w_up.shape()[1], hidden = w_up.shape()[0];
  const std::int64_t out_features = w_down.shape()[0];
  auto dims = x.shape().dims();
  dims.back() = hidden;
  const Shape z_shape(dims);
  dims.back() = out_features;
  const Shape y_shape(dims);

  // Inputs in a fixed order; an absent bias is an undefined Var, which OpRecorder cannot take.
  std::vector<Var<B>> inputs{x, w_up, w_down};
  if (has_b_up) inputs.push_back(b_up);
  if (has_b_down) inputs.push_back(b_down);
  const std::size_t i_b_up = 3, i_b_down = has_b_up ? 4 : 3;
  OpRecorder<B> rec(
      op, inputs,
      2.0 * static_cast<double>(rows) * static_cast<double>(hidden) * static_cast<double>(dim + out_features));
  const DType dtype = rec.compute_dtype();
  const Tensor<B> tx = rec.input(0), tw_up = rec.input(1), tw_down = rec.input(2);
  const Tensor<B> tb_up = has_b_up ? rec.input(i_b_up) : Tensor<B>();
  const Tensor<B> tb_down = has_b_down ? rec.input(i_b_down) : Tensor<B>();
  const bool need_x = rec.needs_grad(0), need_w_up = rec.needs_grad(1), need_w_down = rec.needs_grad(2);
  const bool need_b_up = has_b_up && rec.needs_grad(i_b_up), need_b_down = has_b_down && rec.needs_grad(i_b_down);
  const bool need_dz = need_x || need_w_up || need_b_up;  // the gradient reaches the first linear
  SavedTensor<B> saved_x = need_w_up ? rec.save(tx) : SavedTensor<B>();
  SavedTensor<B> saved_w_up = need_x ? rec.save(tw_up) : SavedTensor<B>();
  SavedTensor<B> saved_w_down = need_dz ? rec.save(tw_down) : SavedTensor<B>();
  // Outputs: y, and z (kept for backward; a selective region keeps it with y, as a matmul output).
  auto out = rec.compute([&] {
    Tensor<B> z = detail::linear_forward(tx, tw_up, tb_up, z_shape, dtype);
    if (need_w_down || need_dz) rec.save_ahead(z);  // a recompute that needs only z ends here
    const Tensor<B> h = detail::gelu_of(z, approximation);
    return Outputs<B>{detail::linear_forward(h, tw_down, tb_down, y_shape, dtype), z};
  });
  SavedTensor<B> saved_z = (need_w_down || need_dz) ? rec.save(out[1]) : SavedTensor<B>();
  const Shape x_shape = x.shape();
  const std::size_t n_inputs = inputs.size();
  return rec.finish(out[0], [=](const Grads<B>& g) {
    Grads<B> grads(n_inputs);
    // z is saved where a gradient reaches W_down or the first linear; db_down alone needs only dy.
    const Tensor<B> z = (need_w_down || need_dz) ? saved_z.unpack() : Tensor<B>();
    if (rows > detail::kFeedForwardRowChunk && z.defined()) {
      const detail::FeedForwardBackward<B> f{need_w_up ? saved_x.unpack().reshape(Shape{rows, dim}) : Tensor<B>(),
                                             z.reshape(Shape{rows, hidden}),
                                             need_x ? saved_w_up.unpack() : Tensor<B>(),
                                             need_dz ? saved_w_down.unpack() : Tensor<B>(),
                                             dim,
                                             approximation,
                                             need_x,
                                             need_w_up,
                                             need_b_up,
                                             need_w_down,
                                             need_b_down};
      std::vector<Tensor<B>> g2 = detail::feed_forward_backward_chunked(f, g[0].reshape(Shape{rows, out_features}));
      if (need_x) grads[0] = g2[0].reshape(x_shape);
      grads[1] = g2[1];
      grads[2] = g2[3];
      if (has_b_up) grads[i_b_up] = g2[2];
      if (has_b_down) grads[i_b_down] = g2[4];
      return grads;
    }
    // h again, for the second linear's weight gradient; dz for the first linear's.
    const Tensor<B> dy = g[0].reshape(Shape{rows, out_features});
    detail::GeluBackward<B> gelu;
    if (z.defined())
      gelu = detail::gelu_backward_and_value(dy, z.reshape(Shape{rows, hidden}),
                                             need_dz ? saved_w_down.unpack() : Tensor<B>(), need_w_down, need_dz,
                                             approximation);
    Grads<B> down(3);  // -, dW_down, db_down
    detail::linear_backward(dy, Shape{rows, hidden}, Tensor<B>(), gelu.h, false, need_w_down, need_b_down, down);
    gelu.h = Tensor<B>();
    grads[2] = down[1];
    if (has_b_down) grads[i_b_down] = down[2];
    if (need_dz) {
      const Tensor<B>& dz = gelu.dz;
      Grads<B> up(3);  // dx, dW_up, db_up
      detail::linear_backward(dz, x_shape, need_x ? saved_w_up.unpack() : Tensor<B>(),
                              need_w_up ? saved_x.unpack() : Tensor<B>(), need_x, need_w_up, need_b_up, up);
      grads[0] = up[0];
      grads[1] = up[1];
      if (has_b_up) grads[i_b_up] = up[2];
    }
    return grads;
  });
}

}  // namespace trainmem
