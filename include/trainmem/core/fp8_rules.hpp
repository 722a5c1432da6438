// trainmem/core/fp8_rules.hpp — what the FP8 kernels compute per element, and what they take.
//
// The three FP8 kernels of a backend (HasFp8 in core/backend_contract.hpp) are written
// once here, element by element, as host/device functions, so the CPU emulation and the
// CUDA kernels give the same bits:
//   quantize    q = fp8(x * scale): the product formed exactly (in double: at most 24 x 24
//               significant bits) and rounded once, by NOTE [FP8 conversion rule]
//               (core/float8.hpp: to nearest even, saturating, NaN -> NaN);
//               amax = max(amax, |x|) over the unscaled values, a NaN anywhere winning,
//               so a tensor holding inf or NaN shows it in its amax even though its FP8
//               copy saturated;
//   dequantize  y = float(q) * scale_inv, formed exactly and rounded once to y's dtype;
//   gemm        C = (alpha * a_scale_inv * b_scale_inv) * sum_k a_ik b_kj (+ beta C): every
//               product of two FP8 values is exact in f32 (at most 4 x 4 significant bits),
//               the sum is an f32 accumulation, the factor is formed in f32 (in that order)
//               and applied to the f32 sum, and C is rounded once to its dtype.
// Scales and amaxes are one-element f32 tensors on the backend's device, so a GPU reads
// them without a host sync. The argument checks below are shared by both backends.
#pragma once

#include <cstdint>
#include <string>

#include "trainmem/core/backend_contract.hpp"
#include "trainmem/core/dtype.hpp"
#include "trainmem/core/float8.hpp"
#include "trainmem/core/gemm_args.hpp"
#include "trainmem/core/tensor.hpp"

namespace trainmem {
namespace fp8 {

/// max(running, |x|) where a NaN in either wins (plain max would drop it one way round).
TRAINMEM_HOST_DEVICE float amax_update(float running, float x) {
  const float magnitude = x < 0.0f ? -x : x;
  if (running != running) return running;
  if (magnitude != magnitude || magnitude > running) return magnitude;
  return running;
}

/// One element of quantize_fp8: F8(x * scale), rounded once.
template <class F8>
TRAINMEM_HOST_DEVICE F8 quantize(float x, float scale) {
  return detail::narrow<F8>(static_cast<double>(x) * static_cast<double>(scale));
}

/// One element of dequantize_fp8: float(q) * scale_inv, rounded once to T.
template <class T, class F8>
TRAINMEM_HOST_DEVICE T dequantize(F8 q, float scale_inv) {
  return detail::narrow<T>(static_cast<double>(static_cast<float>(q)) * static_cast<double>(scale_inv));
}

/// The f32 factor gemm_fp8 applies to each f32 sum: alpha * a_scale_inv * b_scale_inv.
TRAINMEM_HOST_DEVICE float gemm_factor(float alpha, float a_scale_inv, float b_scale_inv) {
  return alpha * a_scale_inv * b_scale_inv;
}

/// One element of C from its f32 sum: factor * sum + beta * c (beta 0: c is not read).
TRAINMEM_HOST_DEVICE float gemm_output(float sum, float factor, float beta, float c) {
  return beta == 0.0f ? factor * sum : factor * sum + beta * c;
}

/// The f32, f16 and bf16 dtypes FP8 converts from and to.
constexpr bool is_fp8_partner(DType dtype) { return dtype == DType::F32 || is_16bit(dtype); }

/// Elements a batched GEMM operand spans: entry `batch - 1` starts at (batch - 1) * stride.
inline std::int64_t operand_span(std::int64_t batch, std::int64_t stride, std::int64_t size) {
  return batch <= 0 ? 0 : (batch - 1) * stride + size;
}

}  // namespace fp8

/// Calls `fn.template operator()<F8>()` with F8 Float8E4M3 or Float8E5M2; other dtypes throw from `op`.
template <class Fn>
decltype(auto) visit_fp8(DType dtype, const char* op, Fn&& fn) {
  detail::check(is_fp8(dtype), op, ": expected an FP8 dtype (f8e4m3 or f8e5m2), got ", dtype);
  if (dtype == DType::F8E4M3) return fn.template operator()<Float8E4M3>();
  return fn.template operator()<Float8E5M2>();
}

namespace detail {

template <class B>
void expects_fp8_scalar(const Tensor<B>& t, const char* op, const char* what) {
  expects(t.defined() && t.dtype() == DType::F32 && t.numel() == 1, op, ": ", what,
          " must be a one-element f32 tensor, got ",
          t.defined() ? t.shape().str() + " " + std::string(name_of(t.dtype())) : std::string("undefined"));
}

/// quantize_fp8's preconditions: src f32/bf16/f16, dst FP8 of src's shape, scale [1] f32,
/// amax [1] f32 or undefined.
template <class B>
void expects_quantize_fp8(const Tensor<B>& src, const Tensor<B>& scale, const Tensor<B>& dst, const Tensor<B>& amax) {
  expects(src.defined() && dst.defined() && fp8::is_fp8_partner(src.dtype()) && is_fp8(dst.dtype()) &&
              src.shape() == dst.shape(),
          "quantize_fp8: src f32, bf16 or f16 and dst f8e4m3 or f8e5m2 of one shape, got src ",
          src.defined() ? src.shape().str() + " " + std::string(name_of(src.dtype())) : std::string("undefined"),
          ", dst ",
          dst.defined() ? dst.shape().str() + " " + std::string(name_of(dst.dtype())) : std::string("undefined"));
  expects_fp8_scalar(scale, "quantize_fp8", "scale");
  if (amax.defined()) expects_fp8_scalar(amax, "quantize_fp8", "amax");
}

/// dequantize_fp8's preconditions: src FP8, dst f32/bf16/f16 of src's shape, scale_inv [1] f32.
template <class B>
void expects_dequantize_fp8(const Tensor<B>& src, const Tensor<B>& scale_inv, const Tensor<B>& dst) {
  expects(src.defined() && dst.defined() && is_fp8(src.dtype()) && fp8::is_fp8_partner(dst.dtype()) &&
              src.shape() == dst.shape(),
          "dequantize_fp8: src f8e4m3 or f8e5m2 and dst f32, bf16 or f16 of one shape, got src ",
          src.defined() ? src.shape().str() + " " + std::string(name_of(src.dtype())) : std::string("undefined"),
          ", dst ",
          dst.defined() ? dst.shape().str() + " " + std::string(name_of(dst.dtype())) : std::string("undefined"));
  expects_fp8_scalar(scale_inv, "dequantize_fp8", "scale_inv");
}

/// gemm_fp8's preconditions: A and B FP8 (not both E5M2: no FP8 GEMM multiplies two E5M2
/// operands), C f32/bf16/f16, each holding the elements GemmArgs reaches, scales [1] f32.
template <class B>
void expects_gemm_fp8(const GemmArgs& g, const Tensor<B>& a, const Tensor<B>& b, const Tensor<B>& c,
                      const Tensor<B>& a_scale_inv, const Tensor<B>& b_scale_inv) {
  expects(a.defined() && b.defined() && c.defined() && is_fp8(a.dtype()) && is_fp8(b.dtype()) &&
              !(a.dtype() == DType::F8E5M2 && b.dtype() == DType::F8E5M2) && fp8::is_fp8_partner(c.dtype()),
          "gemm_fp8: A and B f8e4m3 x f8e4m3, f8e4m3 x f8e5m2 or f8e5m2 x f8e4m3, C f32, bf16 or f16; got ",
          a.defined() ? name_of(a.dtype()) : "undefined", " x ", b.defined() ? name_of(b.dtype()) : "undefined", " -> ",
          c.defined() ? name_of(c.dtype()) : "undefined");
  expects(g.batch >= 0 && g.m >= 0 && g.n >= 0 && g.k >= 0 && g.stride_a >= 0 && g.stride_b >= 0 && g.stride_c >= 0,
          "gemm_fp8: non-negative sizes and strides");
  expects(g.batch <= 1 || g.stride_c >= g.m * g.n, "gemm_fp8: batch entries of C ", g.m, " x ", g.n,
          " do not overlap, got stride_c ", g.stride_c);
  expects(a.numel() >= fp8::operand_span(g.batch, g.stride_a, g.m * g.k) &&
              b.numel() >= fp8::operand_span(g.batch, g.stride_b, g.k * g.n) &&
              c.numel() >= fp8::operand_span(g.batch, g.stride_c, g.m * g.n),
          "gemm_fp8: A ", a.shape(), ", B ", b.shape(), ", C ", c.shape(), " hold fewer elements than batch ", g.batch,
          " of m ", g.m, ", n ", g.n, ", k ", g.k, " with strides ", g.stride_a, ", ", g.stride_b, ", ", g.stride_c,
          " reach");
  expects_fp8_scalar(a_scale_inv, "gemm_fp8", "a_scale_inv");
  expects_fp8_scalar(b_scale_inv, "gemm_fp8", "b_scale_inv");
}

}  // namespace detail
}  // namespace trainmem
