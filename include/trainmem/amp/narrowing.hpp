// trainmem/amp/narrowing.hpp — a weight narrowed to 16 bits must stay finite.
//
// f16's largest finite value is 65504: a weight beyond it becomes inf in its 16-bit model
// copy, every forward overflows, and a loss scaler skips every step while it shrinks the
// scale to its minimum, so training stops without a word. The weights are narrowed once,
// when MasterWeights or a ZeroOptimizer takes the model, and checked there; the values an
// update writes later are checked by the update pass itself (core/copy_overflow.hpp).
// (bf16 has f32's range: only values within an ulp of f32's largest can overflow.)
#pragma once

#include <cmath>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "trainmem/core/tensor.hpp"
#include "trainmem/error.hpp"

namespace trainmem::amp {

/// Throws, naming `who` and the first parameter at fault, when a finite value of
/// `sources[i]` became inf or NaN in `narrowed[i]` (the same elements, 16-bit); `names[i]`
/// names them. One device sync when every copy is finite.
template <class B>
void check_narrowed_finite(const std::vector<Tensor<B>>& sources, const std::vector<Tensor<B>>& narrowed,
                           const std::vector<std::string>& names, std::string_view who) {
  if (sources.empty()) return;
  B& backend = sources.front().backend();
  const auto sum_of_squares = [&](const Tensor<B>& t) {  // in f64: inf or NaN when some element is
    const Tensor<B> sum = Tensor<B>::zeros(Shape{}, DType::F64, MemCategory::Temporary, backend);
    if (t.numel() > 0) backend.sum_squares(t, sum);
    return sum;
  };
  {
    const Tensor<B> all = Tensor<B>::zeros(Shape{}, DType::F64, MemCategory::Temporary, backend);
    for (const Tensor<B>& t : narrowed)
      if (t.numel() > 0) backend.sum_squares(t, all);
    if (std::isfinite(all.template to_host<double>()[0])) return;
  }
  for (std::size_t i = 0; i < sources.size(); ++i) {
    const double source = sum_of_squares(sources[i]).template to_host<double>()[0];
    const double copy = sum_of_squares(narrowed[i]).template to_host<double>()[0];
    detail::check(!std::isfinite(source) || std::isfinite(copy), who, ": '", names[i], "' holds values beyond ",
                  narrowed[i].dtype(), "'s largest finite one (",
                  narrowed[i].dtype() == DType::F16 ? "65504" : "~3.4e38", "), so its ", narrowed[i].dtype(),
                  " copy would be inf; scale them down or use bf16");
  }
}

}  // namespace trainmem::amp
