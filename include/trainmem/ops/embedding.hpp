// trainmem/ops/embedding.hpp — row lookup into a table.
//
// Keeps only the ids; backward scatters output-gradient rows into a zeroed table
// gradient (+= so repeated ids accumulate). Runs in the table's dtype.
#pragma once

#include "trainmem/detail/op_helpers.hpp"

namespace trainmem {

namespace detail {
inline constexpr OpInfo kEmbeddingOp{"embedding", OpKind::Embedding, AutocastCategory::Unchanged};
}

/// out[..., :] = weight[ids[...], :] for weight [V, D] and i32 ids of any shape.
template <class B>
Var<B> embedding(const Var<B>& weight, const Tensor<B>& ids) {
  const auto& op = detail::kEmbeddingOp;
  detail::require_floating(op, weight, "weight");
  detail::check(weight.shape().rank() == 2, "embedding: weight must be [V, D], got ", weight.shape());
  detail::check(ids.defined() && ids.dtype() == DType::I32, "embedding: ids must be an i32 tensor");
  {
    const auto host = ids.template to_host<double>();
    for (std::size_t i = 0; i < host.size(); ++i)
      detail::check(host[i] >= 0 && host[i] < static_cast<double>(weight.shape()[0]), "embedding: id ", host[i],
                    " at position ", i, " is outside [0, ", weight.shape()[0], ")");
  }
  auto dims = ids.shape().dims();
  dims.push_back(weight.shape()[1]);
  const Shape out_shape(dims);
  OpRecorder<B> rec(op, {weight}, 0.0);
  const DType dtype = rec.compute_dtype();
  Tensor<B> tw = rec.input(0);
  SavedTensor<B> saved_ids = rec.save(ids);
  auto out = rec.compute([&] {
    Tensor<B> y = new_tensor(rec.backend(), out_shape, dtype);
    rec.backend().embedding(tw, ids, y);
    return std::vector<Tensor<B>>{y};
  });
  const Shape w_shape = weight.shape();
  return rec.finish(out[0], [=](const Grads<B>& g) {
    Tensor<B> dw = Tensor<B>::zeros(w_shape, g[0].dtype(), MemCategory::Temporary, g[0].backend());
    g[0].backend().embedding_backward(g[0], saved_ids.unpack(), dw);
    return Grads<B>{dw};
  });
}

}  // namespace trainmem
