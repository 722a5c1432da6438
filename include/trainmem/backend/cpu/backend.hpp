// trainmem/backend/cpu/backend.hpp — the CPU backend: Eigen or oneDNN GEMM, OpenMP loops.
//
// A Backend is a compile-time policy: Tensor<Backend>, Tape<Backend>; what it must
// provide is the Backend concept (core/backend_contract.hpp), asserted below. It owns
// the tracked allocator (and so the MemoryStats; GEMM workspaces come from it too), and
// the kernels (backend/cpu/kernels/, one file per op family), each a method that turns
// run-time dtypes into C++ types once and asserts what the calling op validated (NOTE
// [Ops validate, backends assert]). `default_instance()` is what tensors use unless told
// otherwise; tests that count bytes make their own instance. Several threads may share
// one Backend (its allocator and MemoryStats lock; the kernels keep no state).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>

#include "trainmem/backend/cpu/allocator.hpp"
#include "trainmem/backend/cpu/fused_update.hpp"
#include "trainmem/backend/cpu/gemm.hpp"
#include "trainmem/backend/cpu/kernels/attention.hpp"
#include "trainmem/backend/cpu/kernels/dropout.hpp"
#include "trainmem/backend/cpu/kernels/elementwise.hpp"
#include "trainmem/backend/cpu/kernels/embedding.hpp"
#include "trainmem/backend/cpu/kernels/fingerprint.hpp"
#include "trainmem/backend/cpu/kernels/fp8.hpp"
#include "trainmem/backend/cpu/kernels/loss.hpp"
#include "trainmem/backend/cpu/kernels/loss_scale.hpp"
#include "trainmem/backend/cpu/kernels/norm.hpp"
#include "trainmem/backend/cpu/kernels/reduction.hpp"
#include "trainmem/backend/cpu/kernels/shape.hpp"
#include "trainmem/backend/cpu/kernels/softmax.hpp"
#include "trainmem/core/backend_contract.hpp"
#include "trainmem/core/fp8_rules.hpp"
#include "trainmem/core/tensor.hpp"

namespace trainmem::cpu {

/// \brief CPU backend: Eigen for GEMM, plain (OpenMP-parallel) loops for the rest.
class Backend : public FusedUpdate<Backend> {
 public:
  using TensorT = Tensor<Backend>;
  using Fingerprint = std::uint64_t;
  static constexpr const char* kName = "cpu";

  Backend() = default;
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  /// The instance tensors use unless told otherwise.
  static Backend& default_instance() {
    static Backend instance;
    return instance;
  }

  MemoryStats& memory() { return stats_; }
  Allocator& allocator() { return allocator_; }

  // --- storage --------------------------------------------------------------------
  void* allocate(std::size_t bytes, MemCategory category) { return allocator_.allocate(bytes, category); }
  void deallocate(void* ptr, std::size_t bytes, MemCategory category) { allocator_.deallocate(ptr, bytes, category); }
  // Zero bytes touch nothing (an empty std::vector's data() may be null, which memcpy may not see).
  void upload(void* dst, const void* src, std::size_t bytes) {
    if (bytes != 0) std::memcpy(dst, src, bytes);
  }
  void download(void* dst, const void* src, std::size_t bytes) {
    host_reads_.fetch_add(1, std::memory_order_relaxed);
    if (bytes != 0) std::memcpy(dst, src, bytes);
  }
  /// Downloads so far: each is a host read of backend memory, which on a GPU waits for the
  /// device (cuda::Backend::host_syncs() counts the waits), so a CPU test can prove that a
  /// step which must not wait makes none.
  std::uint64_t host_reads() const { return host_reads_.load(std::memory_order_relaxed); }
  void copy(void* dst, const void* src, std::size_t bytes) {
    if (bytes != 0) std::memmove(dst, src, bytes);
  }
  void fill_zero(void* dst, std::size_t bytes) {
    if (bytes != 0) std::memset(dst, 0, bytes);
  }
  /// `rows` runs of `width` bytes, run r from src + r src_pitch to dst + r dst_pitch (regions do not overlap).
  void copy_rows(void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch, std::size_t width,
                 std::size_t rows) {
    if (width == 0) return;
    auto* d = static_cast<std::byte*>(dst);
    const auto* s = static_cast<const std::byte*>(src);
    for (std::size_t r = 0; r < rows; ++r) std::memcpy(d + r * dst_pitch, s + r * src_pitch, width);
  }
  /// Work queued so far is finished (nothing to wait for on the CPU).
  void synchronize() {}

  // --- kernels ---------------------------------------------------------------------
  /// C = alpha op(A) op(B) + beta C. A and B share a dtype; f64 only with f64.
  /// Which path multiplies: NOTE [CPU GEMM path] (backend/cpu/gemm.hpp).
  void gemm(const GemmArgs& args, const TensorT& a, const TensorT& b, const TensorT& c) {
    expect_gemm_dtypes(a, b, c);
    visit_floating(a.dtype(), "gemm", [&]<class TA>() {
      visit_floating(c.dtype(), "gemm", [&]<class TC>() {
        if constexpr (std::is_same_v<TA, double> == std::is_same_v<TC, double>)
          kernels::gemm<TA, TC>(args, a.data_as<const TA>(), b.data_as<const TA>(), c.data_as<TC>(), allocator_);
      });
    });
  }
  /// C = act(alpha op(A) op(B) + beta C + bias) with bias [n] (any floating dtype) added to
  /// every row (and batch entry); act is GELU (tanh form, math::GeluTanh) when `gelu`, else
  /// the identity. Both in FP32, before C's one rounding, as cuda::Backend::gemm_bias.
  void gemm_bias(const GemmArgs& args, const TensorT& a, const TensorT& b, const TensorT& bias, const TensorT& c,
                 bool gelu) {
    expect_gemm_dtypes(a, b, c);
    detail::expects(bias.defined() && bias.numel() == args.n, "gemm_bias: bias of n = ", args.n, " elements");
    visit_floating(a.dtype(), "gemm_bias", [&]<class TA>() {
      visit_floating(c.dtype(), "gemm_bias", [&]<class TC>() {
        if constexpr (std::is_same_v<TA, double> == std::is_same_v<TC, double>) {
          using Acc = AccumulatorOf<TA>;
          visit_floating(bias.dtype(), "gemm_bias", [&]<class TBias>() {
            // The bias row in the accumulator's type: one small copy unless it already is.
            const kernels::Workspace<Acc> widened(allocator_, std::is_same_v<TBias, Acc> ? 0 : bias.numel());
            const Acc* row = widened.get();
            if constexpr (std::is_same_v<TBias, Acc>) {
              row = bias.data_as<const Acc>();
            } else {
              const TBias* from = bias.data_as<const TBias>();
              for (std::int64_t j = 0; j < args.n; ++j) widened.get()[j] = static_cast<Acc>(detail::widen(from[j]));
            }
            kernels::gemm<TA, TC>(args, a.data_as<const TA>(), b.data_as<const TA>(), c.data_as<TC>(), allocator_,
                                  kernels::Epilogue<Acc>{row, gelu});
          });
        }
      });
    });
  }

  /// Every element of out = value, rounded once to out's dtype.
  void fill(const TensorT& out, double value) {
    visit_floating(out.dtype(), "fill",
                   [&]<class T>() { kernels::fill(out.data_as<T>(), detail::narrow<T>(value), out.numel()); });
  }

  /// out = op(in), element-wise; in and out may differ in dtype (a cast is map(Identity)).
  template <class Op>
  void map(Op op, const TensorT& in, const TensorT& out) {
    expect_floating_map(in, out);
    kernels::map_unary(op, {in.data(), in.dtype()}, {out.data(), out.dtype()}, in.numel());
  }

  /// out = op(a, b); b lines up with a as broadcast_view says (core/axis_view.hpp).
  template <class Op>
  void map(Op op, const TensorT& a, const TensorT& b, const TensorT& out) {
    const std::optional<AxisView> view = broadcast_view(a.shape(), b.shape());
    detail::expects(view.has_value(), "map: b ", b.shape(), " does not broadcast to a ", a.shape());
    expect_floating_map(a, b, out);
    kernels::map_binary(op, {a.data(), a.dtype()}, {b.data(), b.dtype()}, {out.data(), out.dtype()}, *view);
  }

  /// out1, out2 = op(a, b) for a functor with two results (GELU's backward and value),
  /// over tensors of one shape; out1 may be a or b.
  template <class Op>
  void map_pair(Op op, const TensorT& a, const TensorT& b, const TensorT& out1, const TensorT& out2) {
    detail::expects(a.shape() == b.shape() && a.shape() == out1.shape() && a.shape() == out2.shape(), "map_pair: a ",
                    a.shape(), ", b ", b.shape(), ", out1 ", out1.shape(), " and out2 ", out2.shape(), " differ");
    expect_floating_map(a, b, out1, out2);
    kernels::map_binary_pair(op, {a.data(), a.dtype()}, {b.data(), b.dtype()}, {out1.data(), out1.dtype()},
                             {out2.data(), out2.dtype()}, a.numel());
  }

  /// out[c] = beta out[c] + sum over rows of in[r, c] (in viewed as [rows, out.numel()]).
  void sum_rows(const TensorT& in, const TensorT& out, double beta = 0.0) {
    const std::int64_t cols = out.numel();
    if (cols == 0) return;  // nothing to write (and no row count to divide out)
    visit_floating(in.dtype(), "sum_rows", [&]<class TI>() {
      visit_floating(out.dtype(), "sum_rows", [&]<class TO>() {
        kernels::sum_rows(in.data_as<const TI>(), out.data_as<TO>(), in.numel() / cols, cols, beta);
      });
    });
  }

  /// core/fingerprint.hpp of t's bytes.
  std::uint64_t fingerprint(const TensorT& t) { return kernels::fingerprint(t.data(), t.bytes()); }
  /// t's fingerprint against `expected`; a mismatch throws CheckpointError(message) here.
  void check_fingerprint(const TensorT& t, Fingerprint expected, const std::string& message) {
    detail::check<CheckpointError>(fingerprint(t) == expected, message);
  }

  /// out[o, i] = sum over e of in[o, e, i], for in seen as `view`.
  void sum_axis(const TensorT& in, const TensorT& out, const AxisView& view) {
    visit_floating(in.dtype(), "sum_axis", [&]<class TI>() {
      visit_floating(out.dtype(), "sum_axis",
                     [&]<class TO>() { kernels::sum_axis(in.data_as<const TI>(), out.data_as<TO>(), view); });
    });
  }

  void sum_all(const TensorT& in, const TensorT& out) {
    visit_floating(in.dtype(), "sum_all", [&]<class TI>() {
      visit_floating(out.dtype(), "sum_all",
                     [&]<class TO>() { kernels::sum_all(in.data_as<const TI>(), out.data_as<TO>(), in.numel()); });
    });
  }

  void softmax(const TensorT& x, const TensorT& y, bool log_output) {
    visit_floating(x.dtype(), "softmax", [&]<class T>() {
      kernels::softmax(x.data_as<const T>(), y.data_as<T>(), x.rows(), x.cols(), log_output);
    });
  }
  void softmax_backward(const TensorT& dy, const TensorT& y, const TensorT& dx, bool log_output) {
    visit_floating(y.dtype(), "softmax_backward", [&]<class T>() {
      kernels::softmax_backward(dy.data_as<const T>(), y.data_as<const T>(), dx.data_as<T>(), y.rows(), y.cols(),
                                log_output);
    });
  }

  void layer_norm(const TensorT& x, const TensorT& gamma, const TensorT& beta, const TensorT& y, const TensorT& mean,
                  const TensorT& rstd, double eps) {
    visit_floating(x.dtype(), "layer_norm", [&]<class T>() {
      visit_floating(gamma.dtype(), "layer_norm", [&]<class TP>() {
        using Acc = AccumulatorOf<T>;
        kernels::layer_norm(x.data_as<const T>(), gamma.data_as<const TP>(), beta.data_as<const TP>(), y.data_as<T>(),
                            mean.data_as<Acc>(), rstd.data_as<Acc>(), x.rows(), x.cols(), eps);
      });
    });
  }
  void layer_norm_backward(const TensorT& dy, const TensorT& x, const TensorT& gamma, const TensorT& mean,
                           const TensorT& rstd, const TensorT& dx, const TensorT& dgamma, const TensorT& dbeta) {
    visit_floating(x.dtype(), "layer_norm_backward", [&]<class T>() {
      visit_floating(gamma.dtype(), "layer_norm_backward", [&]<class TP>() {
        using Acc = AccumulatorOf<T>;
        kernels::layer_norm_backward(dy.data_as<const T>(), x.data_as<const T>(), gamma.data_as<const TP>(),
                                     mean.data_as<const Acc>(), rstd.data_as<const Acc>(), dx.data_as<T>(),
                                     dgamma.data_as<TP>(), dbeta.data_as<TP>(), x.rows(), x.cols(), allocator_);
      });
    });
  }

  /// y = x / sqrt(mean(x^2) + eps) * weight per row; rstd ([rows]) in the accumulator dtype of x.
  void rms_norm(const TensorT& x, const TensorT& weight, const TensorT& y, const TensorT& rstd, double eps) {
    visit_floating(x.dtype(), "rms_norm", [&]<class T>() {
      visit_floating(weight.dtype(), "rms_norm", [&]<class TP>() {
        kernels::rms_norm(x.data_as<const T>(), weight.data_as<const TP>(), y.data_as<T>(),
                          rstd.data_as<AccumulatorOf<T>>(), x.rows(), x.cols(), eps);
      });
    });
  }
  void rms_norm_backward(const TensorT& dy, const TensorT& x, const TensorT& weight, const TensorT& rstd,
                         const TensorT& dx, const TensorT& dweight) {
    visit_floating(x.dtype(), "rms_norm_backward", [&]<class T>() {
      visit_floating(weight.dtype(), "rms_norm_backward", [&]<class TP>() {
        kernels::rms_norm_backward(dy.data_as<const T>(), x.data_as<const T>(), weight.data_as<const TP>(),
                                   rstd.data_as<const AccumulatorOf<T>>(), dx.data_as<T>(), dweight.data_as<TP>(),
                                   x.rows(), x.cols(), allocator_);
      });
    });
  }

  /// loss (scalar) and lse ([rows]) are in the accumulator dtype of the logits.
  /// loss = the rows' cross-entropy summed and divided by `mean_rows` (logits.rows(), or a
  /// whole batch's rows when these logits are a chunk of it), lse = each row's log-sum-exp.
  void cross_entropy(const TensorT& logits, const TensorT& labels, const TensorT& loss, const TensorT& lse,
                     std::int64_t mean_rows) {
    visit_floating(logits.dtype(), "cross_entropy", [&]<class T>() {
      using Acc = AccumulatorOf<T>;
      const auto bad_row =
          kernels::cross_entropy(logits.data_as<const T>(), labels.data_as<const std::int32_t>(), loss.data_as<Acc>(),
                                 lse.data_as<Acc>(), logits.rows(), logits.cols(), mean_rows);
      detail::check(bad_row < 0, "cross_entropy: label ",
                    bad_row < 0 ? 0 : labels.data_as<const std::int32_t>()[bad_row], " at row ", bad_row,
                    " is outside [0, ", logits.cols(), ")");
    });
  }
  /// dlogits of that mean for dloss (a scalar); mean_rows as in cross_entropy.
  void cross_entropy_backward(const TensorT& dloss, const TensorT& logits, const TensorT& labels, const TensorT& lse,
                              const TensorT& dlogits, std::int64_t mean_rows) {
    visit_floating(logits.dtype(), "cross_entropy_backward", [&]<class T>() {
      using Acc = AccumulatorOf<T>;
      kernels::cross_entropy_backward(dloss.data_as<const Acc>()[0], logits.data_as<const T>(),
                                      labels.data_as<const std::int32_t>(), lse.data_as<const Acc>(),
                                      dlogits.data_as<T>(), logits.rows(), logits.cols(), mean_rows);
    });
  }

  /// in viewed as [a, b, c, d] -> out [a, c, b, d] (transpose when d = 1, head split/merge).
  void swap_middle_axes(const TensorT& in, const TensorT& out, std::int64_t a, std::int64_t b, std::int64_t c,
                        std::int64_t d) {
    visit_floating(in.dtype(), "swap_middle_axes",
                   [&]<class T>() { kernels::swap_middle_axes(in.data_as<const T>(), out.data_as<T>(), a, b, c, d); });
  }
  void causal_mask(const TensorT& in, const TensorT& out, double fill) {
    const std::int64_t t = in.cols();
    visit_floating(in.dtype(), "causal_mask", [&]<class T>() {
      kernels::causal_mask(in.data_as<const T>(), out.data_as<T>(), in.shape().leading(2), t, fill);
    });
  }
  /// Fused attention (kernels/attention.hpp); lse and delta in the accumulator dtype.
  void attention(const TensorT& q, const TensorT& k, const TensorT& v, const TensorT& out, const TensorT& lse,
                 const AttentionSizes& sizes) {
    visit_floating(q.dtype(), "attention", [&]<class T>() {
      kernels::attention(q.data_as<const T>(), k.data_as<const T>(), v.data_as<const T>(), out.data_as<T>(),
                         lse.data_as<AccumulatorOf<T>>(), sizes, allocator_);
    });
  }
  void attention_backward(const TensorT& q, const TensorT& k, const TensorT& v, const TensorT& lse, const TensorT& dout,
                          const TensorT& dq, const TensorT& dk, const TensorT& dv, const TensorT& delta,
                          const AttentionSizes& sizes) {
    visit_floating(q.dtype(), "attention_backward", [&]<class T>() {
      using Acc = AccumulatorOf<T>;
      kernels::attention_backward(q.data_as<const T>(), k.data_as<const T>(), v.data_as<const T>(),
                                  lse.data_as<const Acc>(), dout.data_as<const T>(), dq.data_as<T>(), dk.data_as<T>(),
                                  dv.data_as<T>(), delta.data_as<Acc>(), sizes, allocator_);
    });
  }
  void dropout(const TensorT& in, const TensorT& out, float p, RngState rng) {
    visit_floating(in.dtype(), "dropout",
                   [&]<class T>() { kernels::dropout(in.data_as<const T>(), out.data_as<T>(), in.numel(), p, rng); });
  }
  /// Checks each id against the table's rows as it copies (as cross_entropy checks labels).
  void embedding(const TensorT& weight, const TensorT& ids, const TensorT& out) {
    visit_floating(weight.dtype(), "embedding", [&]<class T>() {
      check_ids(ids,
                kernels::embedding(weight.data_as<const T>(), ids.data_as<const std::int32_t>(), out.data_as<T>(),
                                   ids.numel(), weight.cols(), weight.rows()),
                weight.rows(), "");
    });
  }
  /// dweight += scatter-add of dout rows (the caller zeroes dweight first); the ids are
  /// checked again before anything is added.
  void embedding_backward(const TensorT& dout, const TensorT& ids, const TensorT& dweight) {
    visit_floating(dout.dtype(), "embedding_backward", [&]<class T>() {
      visit_floating(dweight.dtype(), "embedding_backward", [&]<class TW>() {
        check_ids(ids,
                  kernels::embedding_backward(dout.data_as<const T>(), ids.data_as<const std::int32_t>(),
                                              dweight.data_as<TW>(), ids.numel(), dweight.cols(), dweight.rows()),
                  dweight.rows(), " backward");
      });
    });
  }

  /// accumulator[0] += sum(x^2), accumulated in the accumulator's dtype (f32 scalar; f64 allowed).
  void sum_squares(const TensorT& x, const TensorT& accumulator) {
    visit_floating(x.dtype(), "sum_squares", [&]<class T>() {
      if (accumulator.dtype() == DType::F64) {
        kernels::sum_squares(x.data_as<const T>(), accumulator.data_as<double>(), x.numel());
      } else {
        kernels::sum_squares(x.data_as<const T>(), accumulator.data_as<float>(), x.numel());
      }
    });
  }

  // --- FP8 (HasFp8): an exact emulation, backend/cpu/kernels/fp8.hpp ----------------------
  /// dst = fp8(src * scale[0]); amax[0] = max(amax[0], max|src|), NaN winning (amax may be undefined).
  void quantize_fp8(const TensorT& src, const TensorT& scale, const TensorT& dst, const TensorT& amax) {
    detail::expects_quantize_fp8(src, scale, dst, amax);
    visit_fp8(dst.dtype(), "quantize_fp8", [&]<class F8>() {
      visit_floating(src.dtype(), "quantize_fp8", [&]<class TS>() {
        if constexpr (!std::is_same_v<TS, double>) {
          const float seen = kernels::quantize_fp8(src.data_as<const TS>(), src.numel(),
                                                   scale.data_as<const float>()[0], dst.data_as<F8>());
          if (amax.defined()) amax.data_as<float>()[0] = fp8::amax_update(amax.data_as<float>()[0], seen);
        }
      });
    });
  }
  /// dst = float(src) * scale_inv[0], rounded once to dst's dtype.
  void dequantize_fp8(const TensorT& src, const TensorT& scale_inv, const TensorT& dst) {
    detail::expects_dequantize_fp8(src, scale_inv, dst);
    visit_fp8(src.dtype(), "dequantize_fp8", [&]<class F8>() {
      visit_floating(dst.dtype(), "dequantize_fp8", [&]<class TD>() {
        if constexpr (!std::is_same_v<TD, double>)
          kernels::dequantize_fp8(src.data_as<const F8>(), src.numel(), scale_inv.data_as<const float>()[0],
                                  dst.data_as<TD>());
      });
    });
  }
  /// C = alpha (op(A) op(B)) a_scale_inv[0] b_scale_inv[0] + beta C with FP8 A and B, the
  /// sums in f32, C rounded once.
  void gemm_fp8(const GemmArgs& args, const TensorT& a, const TensorT& b, const TensorT& c, const TensorT& a_scale_inv,
                const TensorT& b_scale_inv) {
    detail::expects_gemm_fp8(args, a, b, c, a_scale_inv, b_scale_inv);
    visit_fp8(a.dtype(), "gemm_fp8", [&]<class FA>() {
      visit_fp8(b.dtype(), "gemm_fp8", [&]<class FB>() {
        visit_floating(c.dtype(), "gemm_fp8", [&]<class TC>() {
          if constexpr (!std::is_same_v<TC, double>)
            kernels::gemm_fp8(args, a.data_as<const FA>(), b.data_as<const FB>(), c.data_as<TC>(),
                              a_scale_inv.data_as<const float>()[0], b_scale_inv.data_as<const float>()[0], allocator_);
        });
      });
    });
  }

 private:
  /// Element-wise maps take floating dtypes only (in any mix).
  template <class... Ts>
  static void expect_floating_map(const Ts&... tensors) {
    ((detail::check(is_floating(tensors.dtype()), "map: expected a floating dtype, got ", tensors.dtype()),
      detail::check_not_fp8(tensors.dtype(), "map")),
     ...);
  }
  /// The ops give A and B their compute dtype, and f64 only meets f64.
  static void expect_gemm_dtypes(const TensorT& a, const TensorT& b, const TensorT& c) {
    for (const TensorT* t : {&a, &b, &c}) detail::check_not_fp8(t->dtype(), "gemm (gemm_fp8 multiplies FP8)");
    detail::expects(a.dtype() == b.dtype() && (a.dtype() == DType::F64) == (c.dtype() == DType::F64),
                    "gemm: A and B of one floating dtype, f64 only with f64");
  }
  /// Throws for the id at `bad` (a kernel's answer; -1: none) naming it and the range.
  static void check_ids(const TensorT& ids, std::int64_t bad, std::int64_t vocab, const char* when) {
    detail::check(bad < 0, "embedding", when, ": id ", bad < 0 ? 0 : ids.data_as<const std::int32_t>()[bad],
                  " at position ", bad, " is outside [0, ", vocab, ")");
  }

  MemoryStats stats_;
  Allocator allocator_{stats_};
  std::atomic<std::uint64_t> host_reads_{0};
};

static_assert(trainmem::Backend<Backend> && HasGemmBias<Backend> && HasMapPair<Backend> && HasFp8<Backend>,
              "cpu::Backend must meet the backend contract (core/backend_contract.hpp)");

}  // namespace trainmem::cpu
