// trainmem/ops/linear_cross_entropy.hpp — the output layer and the loss as one op, in row
// chunks, so that the [rows, classes] logits are never kept and never whole.
//
// cross_entropy(linear(x, w, b), labels) keeps the logits for backward: with a language
// model's vocabulary they are the largest tensor of the step ([tokens, vocab]; 128k tokens
// of a 50k vocabulary are 12.8 GB in bf16), and backward makes their gradient whole too.
// This op keeps x, w, b and one f32 per row (the row's log-sum-exp) instead. Forward makes
// the logits a chunk of rows at a time and reduces each chunk to its rows' log-sum-exp and
// loss; backward makes each chunk's logits again from x and w, turns them into the chunk's
// logit gradient and multiplies that into dx, dw and db. What it holds beyond its inputs is
// one chunk's logits and their gradient. The price: the head's forward GEMM once more.
//
// NOTE [Linear cross-entropy in row chunks]
// Every row of the logits, their log-sum-exp and their gradient depends on that row of x
// and on w only, so per row this op does the unfused ops' arithmetic: the same GEMM (and
// bias, rounded once) into the compute dtype, the same loss and gradient kernels, the
// logit gradient scaled by dloss over the whole batch's rows (the kernels' mean_rows). The
// loss adds the chunks' sums each divided by the rows, and dw and db add the chunks'
// products in the accumulator dtype (f32 for 16-bit) and are rounded once at the end, as
// one product would round them: only the order of those sums over chunks differs. With one
// chunk the values and gradients are bit for bit the unfused ops'.
//
// The chunk's rows set the time: every chunk adds its product into the whole [classes, in]
// f32 weight gradient, so with few rows a chunk streams that sum through memory for little
// arithmetic. At 4096 rows of width 512 and a vocabulary of 32768 on a 2-core Zen 4 it took
// 1.43-1.48x the unfused pair's time in chunks of 128 rows, 1.32-1.34x in 256 and
// 1.29-1.30x in 512; at a vocabulary of 8192, 2048 rows were no faster than 512 (1.28x)
// and held 2.7x the step peak (benchmarks/loss_head). So 512 rows, whatever the
// vocabulary: the transient, a chunk of logits and their gradient, is at most 4 KiB a class.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "trainmem/ops/matmul.hpp"

namespace trainmem {

/// \brief Settings of linear_cross_entropy.
struct LinearCrossEntropyOptions {
  /// Rows per chunk; 0: kLinearCrossEntropyRowChunk (NOTE [Linear cross-entropy in row chunks]).
  std::int64_t chunk_rows = 0;
};

namespace detail {
inline constexpr OpInfo kLinearCrossEntropyOp{"linear_cross_entropy", OpKind::Matmul, AutocastCategory::LowerPrecision};

/// Rows per chunk unless the caller says otherwise (NOTE [Linear cross-entropy in row chunks]).
inline constexpr std::int64_t kLinearCrossEntropyRowChunk = 512;

/// Rows per chunk of a batch of `rows`.
inline std::int64_t linear_cross_entropy_chunk(std::int64_t rows, const LinearCrossEntropyOptions& options) {
  return std::min(options.chunk_rows > 0 ? options.chunk_rows : kLinearCrossEntropyRowChunk, rows);
}
}  // namespace detail

/// mean_i( logsumexp(l[i]) - l[i, labels[i]] ) for the logits l = x w^T + b, computed and
/// differentiated a chunk of rows at a time: x [..., in] (its rows are the batch), w
/// [classes, in], b [classes] or undefined, labels i32 [rows]. The loss is an f32 (f64 for
/// f64) scalar; under autocast the logits are made in the lower precision, as linear's.
/// A label outside [0, classes) is an Error naming its chunk and its row there (on CUDA,
/// as cross_entropy's, at the backend's next host wait, and with its row in the chunk only).
template <class B>
Var<B> linear_cross_entropy(const Var<B>& x, const Var<B>& weight, const Var<B>& bias, const Tensor<B>& labels,
                            LinearCrossEntropyOptions options = {}) {
  const auto& op = detail::kLinearCrossEntropyOp;
  detail::require_floating(op, x, "x");
  detail::require_floating(op, weight, "weight");
  detail::check(weight.shape().rank() == 2 && x.shape().rank() >= 1 && x.shape().back() == weight.shape()[1],
                "linear_cross_entropy: x ", x.shape(), " does not match weight ", weight.shape(), " (expected x [..., ",
                weight.shape().rank() == 2 ? weight.shape()[1] : -1, "] and weight [classes, in])");
  const std::int64_t rows = x.value().rows(), in = weight.shape()[1], classes = weight.shape()[0];
  detail::check(rows > 0, "linear_cross_entropy: x ", x.shape(),
                " is an empty batch (no rows); the mean over no rows is undefined");
  detail::check(classes > 0, "linear_cross_entropy: weight ", weight.shape(), " has no classes");
  const bool has_bias = bias.defined();
  if (has_bias)
    detail::check(bias.shape() == Shape{classes}, "linear_cross_entropy: bias ", bias.shape(), " should be [", classes,
                  "] for weight ", weight.shape());
  detail::check(labels.defined() && labels.dtype() == DType::I32 && labels.shape() == Shape{rows},
                "linear_cross_entropy: labels must be i32 [", rows, "] (a label per row of x ", x.shape(), "), got ",
                labels.defined() ? labels.shape().str() + " " + std::string(name_of(labels.dtype())) : "undefined");
  detail::check(options.chunk_rows >= 0, "linear_cross_entropy: chunk_rows must be >= 0 (0: automatic), got ",
                options.chunk_rows);
  const std::int64_t chunk = detail::linear_cross_entropy_chunk(rows, options);

  using Inputs = typename OpRecorder<B>::Inputs;
  OpRecorder<B> rec(op, has_bias ? Inputs{x, weight, bias} : Inputs{x, weight},
                    2.0 * static_cast<double>(rows) * static_cast<double>(in) * static_cast<double>(classes));
  const DType dtype = rec.compute_dtype(), acc = accumulator_dtype(dtype);
  const Tensor<B> tx = rec.input(0).reshape(Shape{rows, in}), tw = rec.input(1);
  const Tensor<B> tb = has_bias ? rec.input(2) : Tensor<B>();
  const bool need_x = rec.needs_grad(0), need_w = rec.needs_grad(1), need_b = has_bias && rec.needs_grad(2);
  // Backward makes the logits again, so it needs x, w and b whatever it differentiates.
  SavedTensor<B> saved_x = rec.save(rec.input(0)), saved_w = rec.save(tw);
  SavedTensor<B> saved_b = has_bias ? rec.save(tb) : SavedTensor<B>();
  SavedTensor<B> saved_labels = rec.save(labels);
  // The chunk's logits: x's rows [r0, r1) times w, plus b, in the compute dtype.
  const auto logits_of = [classes, dtype](const Tensor<B>& x2, const Tensor<B>& w, const Tensor<B>& b, std::int64_t r0,
                                          std::int64_t r1) {
    return detail::linear_forward(x2.slice(r0, r1), w, b, Shape{r1 - r0, classes}, dtype);
  };
  auto out = rec.compute([&] {
    B& backend = rec.backend();
    Tensor<B> loss = new_tensor(backend, Shape{}, acc);
    Tensor<B> lse = new_tensor(backend, Shape{rows}, acc);
    const std::int64_t chunks = (rows + chunk - 1) / chunk;
    Tensor<B> parts = chunks > 1 ? new_tensor(backend, Shape{chunks}, acc) : loss.reshape(Shape{1});
    for (std::int64_t c = 0, r0 = 0; r0 < rows; ++c, r0 += chunk) {
      const std::int64_t r1 = std::min(rows, r0 + chunk);
      const Tensor<B> logits = logits_of(tx, tw, tb, r0, r1);
      try {
        backend.cross_entropy(logits, labels.slice(r0, r1), parts.slice(c, c + 1).reshape(Shape{}), lse.slice(r0, r1),
                              rows);
      } catch (const Error& e) {
        throw Error(detail::concat("linear_cross_entropy: in the chunk of rows [", r0, ", ", r1,
                                   ") (its rows numbered from 0): ", e.what()));
      }
    }
    if (chunks > 1) backend.sum_all(parts, loss);
    return Outputs<B>{loss, lse};
  });
  SavedTensor<B> saved_lse = rec.save(out[1]);
  const Shape x_shape = x.shape();
  return rec.finish(out[0], [=](const Grads<B>& g) {
    Grads<B> grads(has_bias ? 3 : 2);
    const Tensor<B> x2 = saved_x.unpack().reshape(Shape{rows, in}), w = saved_w.unpack();
    const Tensor<B> b = has_bias ? saved_b.unpack() : Tensor<B>();
    const Tensor<B> all_labels = saved_labels.unpack(), lse = saved_lse.unpack();
    B& backend = w.backend();
    const Tensor<B> dloss = g[0].to(acc);
    Tensor<B> dx = need_x ? new_tensor(backend, Shape{rows, in}, dtype) : Tensor<B>();
    // Weight and bias gradients add over the chunks in the accumulator dtype, rounded once at the end.
    Tensor<B> dw = need_w ? new_tensor(backend, Shape{classes, in}, acc) : Tensor<B>();
    Tensor<B> db = need_b ? new_tensor(backend, Shape{classes}, acc) : Tensor<B>();
    for (std::int64_t r0 = 0; r0 < rows; r0 += chunk) {
      const std::int64_t r1 = std::min(rows, r0 + chunk), n = r1 - r0;
      const double beta = r0 == 0 ? 0.0 : 1.0;  // the first chunk writes the sums, the rest add to them
      Tensor<B> dlogits;
      {
        const Tensor<B> logits = logits_of(x2, w, b, r0, r1);
        dlogits = new_tensor(backend, logits.shape(), dtype);
        backend.cross_entropy_backward(dloss, logits, all_labels.slice(r0, r1), lse.slice(r0, r1), dlogits, rows);
      }
      if (need_x) detail::gemm(dlogits, false, w, false, dx.slice(r0, r1), 1, n, in, classes);
      if (need_w) {
        GemmArgs args = detail::gemm_args(true, false, 1, classes, in, n);
        args.beta = beta;
        backend.gemm(args, dlogits, x2.slice(r0, r1), dw);
      }
      if (need_b) backend.sum_rows(dlogits, db, beta);
    }
    if (need_x) grads[0] = dx.reshape(x_shape);
    if (need_w) grads[1] = dw.to(dtype);
    if (need_b) grads[2] = db.to(dtype);
    return grads;
  });
}

}  // namespace trainmem
