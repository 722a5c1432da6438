// trainmem/ops/power.hpp — sqrt, rsqrt and pow(x, exponent), element-wise.
//
// sqrt and rsqrt keep their output (each derivative is a function of y alone:
// 1 / 2y and -y^3 / 2), pow keeps its input (e x^(e-1) needs x). Autocast runs all
// three in f32, as it does exp and log: a 16-bit power loses most of its digits.
#pragma once

#include <cmath>

#include "trainmem/ops/activation.hpp"

namespace trainmem {

namespace detail {
inline constexpr OpInfo kSqrtOp{"sqrt", OpKind::Elementwise, AutocastCategory::Fp32};
inline constexpr OpInfo kRsqrtOp{"rsqrt", OpKind::Elementwise, AutocastCategory::Fp32};
inline constexpr OpInfo kPowOp{"pow", OpKind::Elementwise, AutocastCategory::Fp32};
}  // namespace detail

/// sqrt(x) element-wise.
template <class B>
Var<B> sqrt(const Var<B>& x) {
  return detail::activation<math::Sqrt, math::SqrtBackward, detail::Keep::Output>(detail::kSqrtOp, x);
}
/// 1 / sqrt(x) element-wise.
template <class B>
Var<B> rsqrt(const Var<B>& x) {
  return detail::activation<math::Rsqrt, math::RsqrtBackward, detail::Keep::Output>(detail::kRsqrtOp, x);
}
/// x^exponent element-wise; the exponent is a constant (no gradient flows to it).
template <class B>
Var<B> pow(const Var<B>& x, double exponent) {
  detail::check(std::isfinite(exponent), "pow: exponent must be finite, got ", exponent);
  return detail::activation<detail::Keep::Input>(detail::kPowOp, x, math::Pow{exponent}, math::PowBackward{exponent});
}

}  // namespace trainmem
