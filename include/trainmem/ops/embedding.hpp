// trainmem/ops/embedding.hpp — row lookup into a table.
//
// Keeps only the ids; backward scatters output-gradient rows into a zeroed table
// gradient (+= so repeated ids accumulate). Runs in the table's dtype. The ids come in
// as an i32 Var (tape.input(ids)): the table is usually a parameter on no tape, and
// the ids are what puts the lookup on one. The backend's kernels range-check the ids
// as they read them, in forward and again in backward (a write through data() does not
// bump a version, and an id out of range there would scatter outside the table): the
// CPU throws at once, CUDA at the next host wait, and no op downloads the ids.
#pragma once

#include "trainmem/ops/op_helpers.hpp"

namespace trainmem {

namespace detail {
inline constexpr OpInfo kEmbeddingOp{"embedding", OpKind::Embedding, AutocastCategory::Unchanged};
}  // namespace detail

/// out[..., :] = weight[ids[...], :] for weight [V, D] and i32 ids of any shape.
template <class B>
Var<B> embedding(const Var<B>& weight, const Var<B>& id_var) {
  const auto& op = detail::kEmbeddingOp;
  detail::require_floating(op, weight, "weight");
  detail::check(weight.shape().rank() == 2, "embedding: weight must be [V, D], got ", weight.shape());
  detail::check(id_var.dtype() == DType::I32, "embedding: ids must be i32, got ", id_var.dtype(), " ", id_var.shape());
  const Tensor<B>& ids = id_var.value();
  auto dims = ids.shape().dims();
  dims.push_back(weight.shape()[1]);
  const Shape out_shape(dims);
  OpRecorder<B> rec(op, {weight, id_var}, 0.0);
  const DType dtype = rec.compute_dtype();
  Tensor<B> tw = rec.input(0);
  SavedTensor<B> saved_ids = rec.save(ids);
  auto out = rec.compute([&] {
    Tensor<B> y = new_tensor(rec.backend(), out_shape, dtype);
    rec.backend().embedding(tw, ids, y);
    return Outputs<B>{y};
  });
  const Shape w_shape = weight.shape();
  return rec.finish(out[0], [=](const Grads<B>& g) {
    const Tensor<B> ids_now = saved_ids.unpack();
    Tensor<B> dw = Tensor<B>::zeros(w_shape, g[0].dtype(), MemCategory::Temporary, g[0].backend());
    g[0].backend().embedding_backward(g[0], ids_now, dw);
    return Grads<B>{dw, Tensor<B>()};
  });
}

}  // namespace trainmem
