// trainmem/backend/cpu/kernels/embedding.hpp — table lookup by id, and its scatter-add backward.
//
// Ids are data, so only a kernel can range-check them: each loop returns the position
// of the first id outside [0, vocab) (or -1) and the backend raises it. Backward adds
// rows in id order of appearance, narrowing after each addition, which the CUDA kernel
// reproduces bit for bit.
#pragma once

#include <algorithm>
#include <cstdint>

#include "trainmem/core/dtype.hpp"

namespace trainmem::cpu::kernels {

/// The position of the first id outside [0, vocab), or -1 when every id is a row.
inline std::int64_t first_bad_id(const std::int32_t* ids, std::int64_t count, std::int64_t vocab) {
  for (std::int64_t i = 0; i < count; ++i)
    if (ids[i] < 0 || ids[i] >= vocab) return i;
  return -1;
}

/// out rows = weight rows by id; returns the position of the first id outside [0, vocab)
/// (out is then written up to it), or -1. The check rides on the copy loop: no extra pass.
template <class T>
std::int64_t embedding(const T* weight, const std::int32_t* ids, T* out, std::int64_t count, std::int64_t dim,
                       std::int64_t vocab) {
  for (std::int64_t i = 0; i < count; ++i) {
    if (ids[i] < 0 || ids[i] >= vocab) return i;
    std::copy_n(weight + ids[i] * dim, dim, out + i * dim);
  }
  return -1;
}

/// dweight (zeroed by the caller) += scatter of dout rows by id, accumulated in Acc; the
/// ids are checked first (a saved id may have been overwritten since the forward), so a
/// bad one leaves dweight untouched. Returns its position, or -1.
template <class T, class TW>
std::int64_t embedding_backward(const T* dout, const std::int32_t* ids, TW* dweight, std::int64_t count,
                                std::int64_t dim, std::int64_t vocab) {
  using Acc = AccumulatorFor<T, TW>;
  if (const std::int64_t bad = first_bad_id(ids, count, vocab); bad >= 0) return bad;
  for (std::int64_t i = 0; i < count; ++i)
    for (std::int64_t d = 0; d < dim; ++d) {
      TW& slot = dweight[ids[i] * dim + d];
      slot = detail::narrow<TW>(static_cast<Acc>(detail::widen(slot)) +
                                static_cast<Acc>(detail::widen(dout[i * dim + d])));
    }
  return -1;
}

}  // namespace trainmem::cpu::kernels
