// trainmem/core/backend_contract.hpp — what a Backend must provide, and what it may add.
//
// Everything above the backends (ops, tape, checkpointing, amp, optimizers) is written
// once over a backend type B and calls only what the Backend concept below lists:
// storage with byte accounting, the kernels, and the fused optimizer update with the
// loss scaler's device side. Capabilities a backend may lack are concepts of their
// own (HasGemmBias, HasMapPair, HasOffload, HasFp8), and callers test them with `if constexpr`.
// Each backend header static_asserts the concept, so a missing or misspelt method fails
// where the backend is defined, not deep inside an op.
//
// NOTE [Ops validate, backends assert]
// A user's mistake is reported once, by the public entry point that sees the user's
// arguments (an op, an optimizer, the loss scaler), with a message naming that entry
// point. Backend methods take what those entry points already checked, so they do not
// repeat the user-facing checks; they state their preconditions with detail::expects,
// which throws only on a library bug. What only a kernel can check stays in the
// kernel: data-dependent ranges (cross-entropy labels, embedding ids) and limits of
// one backend's implementation.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "trainmem/core/attention_sizes.hpp"
#include "trainmem/core/axis_view.hpp"
#include "trainmem/core/gemm_args.hpp"
#include "trainmem/core/loss_scale_rule.hpp"
#include "trainmem/core/math.hpp"
#include "trainmem/core/memory_stats.hpp"
#include "trainmem/core/rng.hpp"
#include "trainmem/core/stochastic_rounding.hpp"
#include "trainmem/core/tensor.hpp"
#include "trainmem/core/update_rules.hpp"
#include "trainmem/error.hpp"

namespace trainmem {

/// Tracked storage: allocation by category, host/device copies, and a wait for queued work.
template <class B>
concept BackendStorage = requires(B& b, void* dst, const void* src, std::size_t bytes, MemCategory category) {
  { B::default_instance() } -> std::same_as<B&>;
  { b.memory() } -> std::same_as<MemoryStats&>;
  { b.allocate(bytes, category) } -> std::same_as<void*>;
  b.deallocate(dst, bytes, category);
  b.upload(dst, src, bytes);
  b.download(dst, src, bytes);
  b.copy(dst, src, bytes);
  b.fill_zero(dst, bytes);
  b.copy_rows(dst, bytes, src, bytes, bytes, bytes);
  b.synchronize();
};

/// The kernels the ops call, each on tensors of run-time dtype.
template <class B>
concept BackendKernels = requires(B& b, const Tensor<B>& t, const GemmArgs& args, double x, float p, bool flag,
                                  RngState rng, std::int64_t n, const AttentionSizes& attention, const AxisView& view,
                                  const typename B::Fingerprint& fingerprint, const std::string& message) {
  b.gemm(args, t, t, t);
  b.fill(t, x);
  b.map(math::Identity{}, t, t);
  b.map(math::Add{}, t, t, t);
  b.sum_rows(t, t, x);
  b.sum_axis(t, t, view);
  b.sum_all(t, t);
  b.sum_squares(t, t);
  { b.fingerprint(t) } -> std::same_as<typename B::Fingerprint>;
  b.check_fingerprint(t, fingerprint, message);
  b.softmax(t, t, flag);
  b.softmax_backward(t, t, t, flag);
  b.layer_norm(t, t, t, t, t, t, x);
  b.layer_norm_backward(t, t, t, t, t, t, t, t);
  b.rms_norm(t, t, t, t, x);
  b.rms_norm_backward(t, t, t, t, t, t);
  b.cross_entropy(t, t, t, t, n);  // n: the rows the mean is over (more than the logits' for a chunk)
  b.cross_entropy_backward(t, t, t, t, t, n);
  b.swap_middle_axes(t, t, n, n, n, n);
  b.causal_mask(t, t, x);
  b.attention(t, t, t, t, t, attention);
  b.attention_backward(t, t, t, t, t, t, t, t, t, attention);
  b.dropout(t, t, p, rng);
  b.embedding(t, t, t);
  b.embedding_backward(t, t, t);
};

/// The optimizer's one pass per tensor (which a found-inf flag can cancel on the device,
/// and which reports a model copy it made overflow under the parameter's name: NOTE
/// [Model copies that overflow] in core/copy_overflow.hpp) and the loss scaler's unscale
/// and scale update.
template <class B>
concept BackendFusedUpdate = requires(B& b, const Tensor<B>& t, std::span<const Tensor<B>> grads,
                                      const ScaleUpdateArgs& scale_args, const CopyRounding& rounding,
                                      std::string_view name) {
  b.apply_update(math::SgdUpdate{}, t, t, t, t, t);
  b.apply_update(math::AdamWUpdate{}, t, t, t, t, t, t, rounding);
  b.apply_update(math::AdamWUpdate{}, t, t, t, t, t, t, rounding, name);
  b.unscale_grads(grads, t, t);
  b.update_scale(t, t, t, t, scale_args);
};

/// \brief What every backend provides: storage, kernels, and the fused update.
template <class B>
concept Backend = BackendStorage<B> && BackendKernels<B> && BackendFusedUpdate<B>;

/// A backend with a GEMM whose epilogue adds a bias in FP32 before C is rounded (both
/// backends have one: cuBLASLt's epilogue, oneDNN's or the Eigen path's); linear() uses
/// it, and on a backend without one adds the bias after the GEMM.
template <class B>
concept HasGemmBias = requires(B& backend, const GemmArgs& args, const Tensor<B>& t) {
  backend.gemm_bias(args, t, t, t, t, false);
};

/// A backend with two-result element-wise maps (feed_forward's backward makes GELU's value
/// and gradient in one pass with it, and in two passes without).
template <class B>
concept HasMapPair = requires(B& backend, const Tensor<B>& t) {
  backend.map_pair(math::GeluTanhBackwardAndValue{}, t, t, t, t);
};

/// A backend that can move a tensor to host memory and back off its main stream
/// (checkpoint policies that offload use it; elsewhere they keep the tensor), and that
/// can hand the device bytes of every tensor offloaded so far back in stream order.
template <class B>
concept HasOffload = requires(B& backend, const Tensor<B>& t, typename B::HostCopy& copy) {
  { backend.offload(t) } -> std::same_as<typename B::HostCopy>;
  { backend.fetch(copy) } -> std::same_as<Tensor<B>>;
  backend.release_offloaded_sources();
};

/// A backend with the FP8 kernels (core/fp8_rules.hpp says what each computes, element by
/// element; both backends have them: an exact emulation on the CPU, cuBLASLt's FP8 GEMM
/// on the GPU). FP8 tensors are storage: no other kernel takes them. Scales and amaxes are
/// one-element f32 tensors on the backend's device.
template <class B>
concept HasFp8 = requires(B& b, const Tensor<B>& t, const GemmArgs& args) {
  // dst(f8) = fp8(src * scale[0]); amax[0] = max(amax[0], max|src|), NaN and inf showing.
  // src: f32, bf16 or f16. amax may be an undefined Tensor (nothing recorded).
  b.quantize_fp8(t /*src*/, t /*scale*/, t /*dst*/, t /*amax*/);
  // dst = float(src) * scale_inv[0], rounded once to dst's dtype (f32, bf16 or f16).
  b.dequantize_fp8(t /*src*/, t /*scale_inv*/, t /*dst*/);
  // C = alpha * (op(A) op(B)) * a_scale_inv[0] * b_scale_inv[0] (+ beta C), A and B FP8
  // (E4M3 x E4M3, E4M3 x E5M2, E5M2 x E4M3), products exact, f32 accumulation, C in
  // f32, bf16 or f16 rounded once. The same GemmArgs as gemm().
  b.gemm_fp8(args, t /*A*/, t /*B*/, t /*C*/, t /*a_scale_inv*/, t /*b_scale_inv*/);
};

namespace detail {
/// A backend method's precondition, which the calling entry point has already checked
/// for the user (NOTE [Ops validate, backends assert]): failing it is a library bug.
template <class... Parts>
void expects(bool ok, Parts&&... parts) {
  if (!ok) throw Error(concat("internal error: ", std::forward<Parts>(parts)..., " (a backend precondition)"));
}
}  // namespace detail

}  // namespace trainmem
