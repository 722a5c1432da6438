// trainmem/backend/cuda/backend.cuh — the CUDA backend: cuBLASLt GEMM, CUDA kernels, a stream-ordered pool.
//
// cuda::Backend meets the Backend concept (core/backend_contract.hpp) with cpu::Backend's meaning
// for each method, so every op, the tape, checkpointing, amp and the optimizers run on it unchanged;
// it has the fused GEMM epilogue (HasGemmBias), the FP8 kernels (HasFp8) and offload (HasOffload, NOTE [Offload
// ordering] in offload.cuh), and asserts what the ops validated (NOTE [Ops validate, backends assert]).
//
// One backend is one device and one stream (stream.cuh). All work is queued on that stream in call
// order, so results are ordered without synchronising. The host waits only where the user asks for
// a value or a wait: download() (to_host), synchronize(), an upload from pinned memory, and the
// allocator's out-of-memory retry; host_syncs() counts them (NOTE [Checks without a host wait]). A
// fault inside a kernel surfaces as trainmem::Error at the next checked call. Memory is accounted
// per category in memory() as on the CPU (requested bytes); the pool, the cuBLASLt workspace and
// scratch buffers all come from the tracked allocator. A backend must outlive its tensors and
// HostCopies. Do not compile with --use_fast_math: it changes division, exp and the rounding that
// dropout masks and the comparison with the CPU rely on.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "trainmem/backend/cuda/allocator.cuh"
#include "trainmem/backend/cuda/copy_overflow_checks.cuh"
#include "trainmem/backend/cuda/cudnn_attention.cuh"
#include "trainmem/backend/cuda/error.cuh"
#include "trainmem/backend/cuda/fingerprint_checks.cuh"
#include "trainmem/backend/cuda/fused_update.cuh"
#include "trainmem/backend/cuda/gemm.cuh"
#include "trainmem/backend/cuda/index_checks.cuh"
#include "trainmem/backend/cuda/kernels/attention.cuh"
#include "trainmem/backend/cuda/kernels/dropout.cuh"
#include "trainmem/backend/cuda/kernels/elementwise.cuh"
#include "trainmem/backend/cuda/kernels/embedding.cuh"
#include "trainmem/backend/cuda/kernels/fp8.cuh"
#include "trainmem/backend/cuda/kernels/loss.cuh"
#include "trainmem/backend/cuda/kernels/norm.cuh"
#include "trainmem/backend/cuda/kernels/reduction.cuh"
#include "trainmem/backend/cuda/kernels/shape.cuh"
#include "trainmem/backend/cuda/kernels/softmax.cuh"
#include "trainmem/backend/cuda/offload.cuh"
#include "trainmem/backend/cuda/stream.cuh"
#include "trainmem/core/backend_contract.hpp"
#include "trainmem/core/fp8_rules.hpp"

namespace trainmem::cuda {

/// \brief CUDA backend: cuBLASLt for GEMM, CUDA kernels for the rest, one stream per instance.
class Backend : public FusedUpdate<Backend> {
 public:
  using TensorT = Tensor<Backend>;
  using HostCopy = cuda::HostCopy;
  using Fingerprint = runtime::DeviceFingerprint;
  static constexpr const char* kName = "cuda";

  /// Uses `device`, makes it current, and creates the stream, pool and cuBLASLt handle.
  explicit Backend(int device = 0)
      : device_(device),
        stream_(device),
        sm_count_(runtime::multiprocessor_count(device)),
        allocator_(stats_, device, stream_.get()),
        index_checks_(),
        fingerprint_checks_(),
        copy_overflow_checks_(),
        gemm_(context()),
        offload_(allocator_, stream_.get()) {
    // Out of memory, the allocator first waits for the offload copies and takes back the
    // sources of those done (NOTE [Offload ordering]): they hold device bytes only until then.
    allocator_.set_reclaim_hook([this] { offload_.synchronize(); });
  }
  ~Backend() {
    cudaSetDevice(device_);
    cudaStreamSynchronize(stream_.get());
    cudaGetLastError();
  }
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  /// The instance tensors use unless told otherwise: the device current at first use.
  static Backend& default_instance() {
    static Backend instance(runtime::current_device());
    return instance;
  }

  MemoryStats& memory() { return stats_; }
  Allocator& allocator() { return allocator_; }
  int device() const { return device_; }
  cudaStream_t stream() const { return stream_.get(); }
  cudaStream_t side_stream() const { return offload_.side_stream(); }
  int multiprocessor_count() const { return sm_count_; }

  /// F32 GEMMs on TF32 Tensor Cores (about 3e-4 relative error) when allowed; off by default.
  void set_allow_tf32(bool allow) { gemm_.set_allow_tf32(allow); }
  bool allow_tf32() const { return gemm_.allow_tf32(); }
  /// GEMM shapes planned so far (each is planned once).
  std::size_t gemm_plans_cached() const { return gemm_.plans_cached(); }
  /// Host waits for this backend's streams so far (NOTE [Checks without a host wait]);
  /// a steady-state training step adds none.
  std::uint64_t host_syncs() const { return allocator_.host_syncs(); }
  /// A CUDA event recorded on the stream now, and the milliseconds between two of them
  /// (waiting for the later one): the device timer OpTimes reads (HasDeviceTimer).
  using TimerMark = std::shared_ptr<CUevent_st>;
  TimerMark timer_mark() {
    runtime::make_current(device_);
    cudaEvent_t event = nullptr;
    TRAINMEM_CUDA_CHECK(cudaEventCreate(&event));
    TimerMark mark(event, [](cudaEvent_t e) { cudaEventDestroy(e); });
    TRAINMEM_CUDA_CHECK(cudaEventRecord(event, stream()));
    return mark;
  }
  double elapsed_ms(const TimerMark& begin, const TimerMark& end) {
    TRAINMEM_CUDA_CHECK(cudaEventSynchronize(end.get()));
    float ms = 0.0f;
    TRAINMEM_CUDA_CHECK(cudaEventElapsedTime(&ms, begin.get(), end.get()));
    return ms;
  }
  /// Which attention path each call took so far, and why cuDNN did not run where it did not.
  const AttentionPaths& attention_paths() const { return attention_paths_; }
  /// Whether 16-bit attention may take cuDNN (on by default; TRAINMEM_CUDNN=off turns it off
  /// for the process). Off, every call runs the own kernels: for comparing the two paths.
  void set_cudnn_attention(bool allowed) { use_cudnn_attention_ = allowed; }
  bool cudnn_attention() const { return use_cudnn_attention_; }

  // --- storage --------------------------------------------------------------------
  void* allocate(std::size_t bytes, MemCategory category) {
    runtime::make_current(device_);
    return allocator_.allocate(bytes, category);
  }
  void deallocate(void* ptr, std::size_t bytes, MemCategory category) { allocator_.deallocate(ptr, bytes, category); }
  /// Host to device, queued; returns once the host buffer may be reused. From pageable
  /// memory the driver stages the bytes before it returns (the CUDA runtime's documented
  /// behaviour for pageable host-to-device cudaMemcpyAsync), so the host does not wait
  /// for the stream; from pinned memory the copy reads the buffer later, so this waits.
  void upload(void* dst, const void* src, std::size_t bytes) {
    if (bytes == 0) return;
    runtime::make_current(device_);
    TRAINMEM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream()));
    if (runtime::is_pinned(src)) allocator_.synchronize(stream());
  }
  /// Host to device from pinned memory, queued: `src` must stay unchanged until the
  /// stream has run the copy (a later synchronize, or an event recorded after this call).
  void upload_async(void* dst, const void* src, std::size_t bytes) {
    if (bytes == 0) return;
    runtime::make_current(device_);
    TRAINMEM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream()));
  }
  /// Device to host, after all queued work; returns once the bytes are there. Raises an
  /// index a kernel found out of range (NOTE [Checks without a host wait]).
  void download(void* dst, const void* src, std::size_t bytes) {
    if (bytes == 0) return;
    runtime::make_current(device_);
    TRAINMEM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream()));
    index_checks_.queue_read(stream());
    fingerprint_checks_.queue_read(stream());
    copy_overflow_checks_.queue_read(stream());
    allocator_.synchronize(stream());
    index_checks_.raise(stream());
    fingerprint_checks_.raise(stream());
    copy_overflow_checks_.raise(stream());
  }
  /// Device to device, queued; overlapping ranges go through a scratch buffer (memmove semantics).
  void copy(void* dst, const void* src, std::size_t bytes) {
    if (bytes == 0 || dst == src) return;
    runtime::make_current(device_);
    const auto *d = static_cast<const std::byte*>(dst), *s = static_cast<const std::byte*>(src);
    if (d >= s + bytes || s >= d + bytes) {
      TRAINMEM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream()));
      return;
    }
    kernels::ScratchBuffer staging(context(), bytes);
    TRAINMEM_CUDA_CHECK(cudaMemcpyAsync(staging.as<void>(), src, bytes, cudaMemcpyDeviceToDevice, stream()));
    TRAINMEM_CUDA_CHECK(cudaMemcpyAsync(dst, staging.as<const void>(), bytes, cudaMemcpyDeviceToDevice, stream()));
  }
  void fill_zero(void* dst, std::size_t bytes) {
    if (bytes == 0) return;
    runtime::make_current(device_);
    TRAINMEM_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, stream()));
  }
  /// `rows` runs of `width` bytes, run r from src + r src_pitch to dst + r dst_pitch (regions
  /// do not overlap): one cudaMemcpy2DAsync on the stream.
  void copy_rows(void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch, std::size_t width,
                 std::size_t rows) {
    if (width == 0 || rows == 0) return;
    runtime::make_current(device_);
    TRAINMEM_CUDA_CHECK(
        cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, rows, cudaMemcpyDeviceToDevice, stream()));
  }
  /// Work queued so far (kernels and offload copies) is finished; raises any error it hit,
  /// and any index a kernel found out of range (NOTE [Checks without a host wait]).
  void synchronize() {
    runtime::make_current(device_);
    index_checks_.queue_read(stream());
    fingerprint_checks_.queue_read(stream());
    copy_overflow_checks_.queue_read(stream());
    allocator_.synchronize(stream());
    offload_.synchronize();
    allocator_.check_deferred();
    index_checks_.raise(stream());
    fingerprint_checks_.raise(stream());
    copy_overflow_checks_.raise(stream());
  }

  // --- kernels ---------------------------------------------------------------------
  /// C = alpha op(A) op(B) + beta C. A and B share a dtype; f64 only with f64.
  void gemm(const GemmArgs& args, const TensorT& a, const TensorT& b, const TensorT& c) {
    expect_gemm_dtypes(a, b, c);
    runtime::make_current(device_);
    gemm_.run(args, a.dtype(), a.data(), b.data(), c.dtype(), c.data());
  }
  /// C = act(alpha op(A) op(B) + beta C + bias) with bias [n] added to every row (and batch
  /// entry); act is GELU (tanh form, math::GeluTanh) when `gelu`, else the identity. Fused into
  /// the cuBLASLt epilogue where offered: the bias is added to the FP32 accumulator, and C
  /// is rounded once. linear() calls this when the backend has it.
  void gemm_bias(const GemmArgs& args, const TensorT& a, const TensorT& b, const TensorT& bias, const TensorT& c,
                 bool gelu) {
    expect_gemm_dtypes(a, b, c);
    detail::expects(bias.defined() && bias.numel() == args.n, "gemm_bias: bias of n = ", args.n, " elements");
    runtime::make_current(device_);
    gemm_.run(args, a.dtype(), a.data(), b.data(), c.dtype(), c.data(),
              gelu ? GemmEpilogue::BiasGelu : GemmEpilogue::Bias, bias.dtype(), bias.data());
  }

  /// Every element of out = value, rounded once to out's dtype.
  void fill(const TensorT& out, double value) { kernels::fill(context(), out.dtype(), out.data(), value, out.numel()); }

  /// out = op(in), element-wise; in and out may differ in dtype (a cast is map(Identity)).
  template <class Op>
  void map(Op op, const TensorT& in, const TensorT& out) {
    kernels::map_unary(context(), op, in.dtype(), in.data(), out.dtype(), out.data(), in.numel());
  }
  /// out = op(a, b); b lines up with a as broadcast_view says (core/axis_view.hpp).
  template <class Op>
  void map(Op op, const TensorT& a, const TensorT& b, const TensorT& out) {
    const std::optional<AxisView> view = broadcast_view(a.shape(), b.shape());
    detail::expects(view.has_value(), "map: b ", b.shape(), " does not broadcast to a ", a.shape());
    kernels::map_binary(context(), op, a.dtype(), a.data(), b.dtype(), b.data(), out.dtype(), out.data(), *view);
  }

  /// out[c] = beta out[c] + sum over rows of in[r, c] (in viewed as [rows, out.numel()]).
  void sum_rows(const TensorT& in, const TensorT& out, double beta = 0.0) {
    const std::int64_t cols = out.numel();
    visit_floating(in.dtype(), "sum_rows", [&]<class TI>() {
      visit_floating(out.dtype(), "sum_rows", [&]<class TO>() {
        kernels::sum_rows(context(), in.data_as<const TI>(), out.data_as<TO>(), cols == 0 ? 0 : in.numel() / cols, cols,
                          beta);
      });
    });
  }
  /// core/fingerprint.hpp of t's bytes, kept on the device (fingerprint_checks.cuh): one
  /// reduction, no host wait.
  Fingerprint fingerprint(const TensorT& t) {
    if (t.bytes() == 0) return {};
    Fingerprint stored = fingerprint_checks_.acquire();
    kernels::fingerprint(context(), t.data(), t.bytes(), stored.slot());
    return stored;
  }
  /// t's fingerprint against `expected` (same byte count), compared on the device: a
  /// mismatch is raised as CheckpointError(message) at the next host wait.
  void check_fingerprint(const TensorT& t, const Fingerprint& expected, std::string message) {
    if (expected.empty()) return;
    kernels::check_fingerprint(context(), t.data(), t.bytes(), expected.slot(), fingerprint_checks_.record(),
                               fingerprint_checks_.expect(std::move(message)));
  }
  /// Device fingerprints held by regions' records (tests).
  std::size_t fingerprints_held() const { return fingerprint_checks_.slots_in_use(); }

  /// out[o, i] = sum over e of in[o, e, i], for in seen as `view`.
  void sum_axis(const TensorT& in, const TensorT& out, const AxisView& view) {
    visit_floating(in.dtype(), "sum_axis", [&]<class TI>() {
      visit_floating(out.dtype(), "sum_axis", [&]<class TO>() {
        kernels::sum_axis(context(), in.data_as<const TI>(), out.data_as<TO>(), view);
      });
    });
  }
  void sum_all(const TensorT& in, const TensorT& out) {
    visit_floating(in.dtype(), "sum_all", [&]<class TI>() {
      visit_floating(out.dtype(), "sum_all", [&]<class TO>() {
        kernels::sum_all(context(), in.data_as<const TI>(), out.data_as<TO>(), in.numel());
      });
    });
  }
  void softmax(const TensorT& x, const TensorT& y, bool log_output) {
    visit_floating(x.dtype(), "softmax", [&]<class T>() {
      kernels::softmax(context(), x.data_as<const T>(), y.data_as<T>(), x.rows(), x.cols(), log_output);
    });
  }
  void softmax_backward(const TensorT& dy, const TensorT& y, const TensorT& dx, bool log_output) {
    visit_floating(y.dtype(), "softmax_backward", [&]<class T>() {
      kernels::softmax_backward(context(), dy.data_as<const T>(), y.data_as<const T>(), dx.data_as<T>(), y.rows(),
                                y.cols(), log_output);
    });
  }
  void layer_norm(const TensorT& x, const TensorT& gamma, const TensorT& beta, const TensorT& y, const TensorT& mean,
                  const TensorT& rstd, double eps) {
    kernels::layer_norm(context(), x, gamma, beta, y, mean, rstd, eps);
  }
  void layer_norm_backward(const TensorT& dy, const TensorT& x, const TensorT& gamma, const TensorT& mean,
                           const TensorT& rstd, const TensorT& dx, const TensorT& dgamma, const TensorT& dbeta) {
    kernels::layer_norm_backward(context(), dy, x, gamma, mean, rstd, dx, dgamma, dbeta);
  }
  void rms_norm(const TensorT& x, const TensorT& weight, const TensorT& y, const TensorT& rstd, double eps) {
    kernels::rms_norm(context(), x, weight, y, rstd, eps);
  }
  void rms_norm_backward(const TensorT& dy, const TensorT& x, const TensorT& weight, const TensorT& rstd,
                         const TensorT& dx, const TensorT& dweight) {
    kernels::rms_norm_backward(context(), dy, x, weight, rstd, dx, dweight);
  }

  /// loss (scalar) and lse ([rows]) are in the accumulator dtype of the logits. A label out
  /// of range is raised at the next host wait (NOTE [Checks without a host wait]).
  /// loss = the rows' cross-entropy summed and divided by `mean_rows` (logits.rows(), or a
  /// whole batch's rows when these logits are a chunk of it), lse = each row's log-sum-exp.
  void cross_entropy(const TensorT& logits, const TensorT& labels, const TensorT& loss, const TensorT& lse,
                     std::int64_t mean_rows) {
    visit_floating(logits.dtype(), "cross_entropy", [&]<class T>() {
      using Acc = AccumulatorOf<T>;
      kernels::cross_entropy(context(), logits.data_as<const T>(), labels.data_as<const std::int32_t>(),
                             loss.data_as<Acc>(), lse.data_as<Acc>(), logits.rows(), logits.cols(), mean_rows);
    });
  }
  /// dlogits of that mean for dloss (a scalar); mean_rows as in cross_entropy.
  void cross_entropy_backward(const TensorT& dloss, const TensorT& logits, const TensorT& labels, const TensorT& lse,
                              const TensorT& dlogits, std::int64_t mean_rows) {
    visit_floating(logits.dtype(), "cross_entropy_backward", [&]<class T>() {
      using Acc = AccumulatorOf<T>;
      kernels::cross_entropy_backward(context(), dloss.data_as<const Acc>(), logits.data_as<const T>(),
                                      labels.data_as<const std::int32_t>(), lse.data_as<const Acc>(),
                                      dlogits.data_as<T>(), logits.rows(), logits.cols(), mean_rows);
    });
  }

  /// in viewed as [a, b, c, d] -> out [a, c, b, d] (transpose when d = 1, head split/merge).
  void swap_middle_axes(const TensorT& in, const TensorT& out, std::int64_t a, std::int64_t b, std::int64_t c,
                        std::int64_t d) {
    visit_floating(in.dtype(), "swap_middle_axes", [&]<class T>() {
      kernels::swap_middle_axes(context(), in.data_as<const T>(), out.data_as<T>(), a, b, c, d);
    });
  }
  void causal_mask(const TensorT& in, const TensorT& out, double fill) {
    const std::int64_t t = in.cols();
    visit_floating(in.dtype(), "causal_mask", [&]<class T>() {
      kernels::causal_mask(context(), in.data_as<const T>(), out.data_as<T>(), t == 0 ? 0 : in.numel() / (t * t), t,
                           fill);
    });
  }
  /// Fused attention: cuDNN's SDPA on Tensor Cores for F16/BF16 where it was found and takes
  /// the shape (cudnn_attention.cuh), else kernels/attention.cuh; lse and delta in the
  /// accumulator dtype. attention_paths() counts which ran.
  void attention(const TensorT& q, const TensorT& k, const TensorT& v, const TensorT& out, const TensorT& lse,
                 const AttentionSizes& sizes) {
    if (use_cudnn_attention_ && is_16bit(q.dtype()) &&
        cudnn_attention_.forward(context(), q.dtype(), q.data(), k.data(), v.data(), out.data(), lse.data_as<float>(),
                                 sizes, attention_paths_))
      return;
    ++attention_paths_.kernel_forward;
    visit_floating(q.dtype(), "attention", [&]<class T>() {
      kernels::attention(context(), q.data_as<const T>(), k.data_as<const T>(), v.data_as<const T>(), out.data_as<T>(),
                         lse.data_as<AccumulatorOf<T>>(), sizes);
    });
  }
  void attention_backward(const TensorT& q, const TensorT& k, const TensorT& v, const TensorT& lse, const TensorT& dout,
                          const TensorT& dq, const TensorT& dk, const TensorT& dv, const TensorT& delta,
                          const AttentionSizes& sizes) {
    if (use_cudnn_attention_ && is_16bit(q.dtype()) &&
        cudnn_attention_.backward(context(), q.dtype(), q.data(), k.data(), v.data(), dout.data(), dq.data(), dk.data(),
                                  dv.data(), sizes, attention_paths_))
      return;
    ++attention_paths_.kernel_backward;
    visit_floating(q.dtype(), "attention_backward", [&]<class T>() {
      using Acc = AccumulatorOf<T>;
      kernels::attention_backward(context(), q.data_as<const T>(), k.data_as<const T>(), v.data_as<const T>(),
                                  lse.data_as<const Acc>(), dout.data_as<const T>(), dq.data_as<T>(), dk.data_as<T>(),
                                  dv.data_as<T>(), delta.data_as<Acc>(), sizes);
    });
  }
  void dropout(const TensorT& in, const TensorT& out, float p, RngState rng) {
    visit_floating(in.dtype(), "dropout", [&]<class T>() {
      kernels::dropout(context(), in.data_as<const T>(), out.data_as<T>(), in.numel(), p, rng);
    });
  }
  void embedding(const TensorT& weight, const TensorT& ids, const TensorT& out) {
    visit_floating(weight.dtype(), "embedding", [&]<class T>() {
      kernels::embedding(context(), weight.data_as<const T>(), ids.data_as<const std::int32_t>(), out.data_as<T>(),
                         ids.numel(), weight.cols(), weight.rows());
    });
  }
  /// dweight += scatter-add of dout rows (the caller zeroes dweight first); deterministic.
  void embedding_backward(const TensorT& dout, const TensorT& ids, const TensorT& dweight) {
    visit_floating(dout.dtype(), "embedding_backward", [&]<class T>() {
      visit_floating(dweight.dtype(), "embedding_backward", [&]<class TW>() {
        kernels::embedding_backward(context(), dout.data_as<const T>(), ids.data_as<const std::int32_t>(),
                                    dweight.data_as<TW>(), ids.numel(), dweight.cols(), dweight.rows());
      });
    });
  }

  /// accumulator[0] += sum(x^2), summed in the accumulator's dtype (an f32 scalar; f64 allowed).
  void sum_squares(const TensorT& x, const TensorT& accumulator) {
    detail::expects(accumulator.numel() == 1, "sum_squares: a scalar accumulator");
    visit_floating(x.dtype(), "sum_squares", [&]<class T>() {
      if (accumulator.dtype() == DType::F64)
        kernels::sum_squares(context(), x.data_as<const T>(), x.numel(), accumulator.data_as<double>());
      else kernels::sum_squares(context(), x.data_as<const T>(), x.numel(), accumulator.data_as<float>());
    });
  }

  // --- FP8 (HasFp8): kernels/fp8.cuh, NOTE [FP8 GEMM] in gemm.cuh -----------------------
  /// dst = fp8(src * scale[0]); amax[0] = max(amax[0], max|src|), NaN winning (amax may be
  /// undefined). Scale and amax stay on the device: no host sync.
  void quantize_fp8(const TensorT& src, const TensorT& scale, const TensorT& dst, const TensorT& amax) {
    detail::expects_quantize_fp8(src, scale, dst, amax);
    visit_fp8(dst.dtype(), "quantize_fp8", [&]<class F8>() {
      visit_floating(src.dtype(), "quantize_fp8", [&]<class TS>() {
        if constexpr (!std::is_same_v<TS, double>)
          kernels::quantize_fp8(context(), src.data_as<const TS>(), src.numel(), scale.data_as<const float>(),
                                dst.data_as<F8>(), amax.defined() ? amax.data_as<float>() : nullptr);
      });
    });
  }
  /// dst = float(src) * scale_inv[0], rounded once to dst's dtype.
  void dequantize_fp8(const TensorT& src, const TensorT& scale_inv, const TensorT& dst) {
    detail::expects_dequantize_fp8(src, scale_inv, dst);
    visit_fp8(src.dtype(), "dequantize_fp8", [&]<class F8>() {
      visit_floating(dst.dtype(), "dequantize_fp8", [&]<class TD>() {
        if constexpr (!std::is_same_v<TD, double>)
          kernels::dequantize_fp8(context(), src.data_as<const F8>(), src.numel(), scale_inv.data_as<const float>(),
                                  dst.data_as<TD>());
      });
    });
  }
  /// C = alpha (op(A) op(B)) a_scale_inv[0] b_scale_inv[0] + beta C with FP8 A and B on
  /// cuBLASLt's FP8 Tensor Core kernels, f32 accumulation, C rounded once.
  void gemm_fp8(const GemmArgs& args, const TensorT& a, const TensorT& b, const TensorT& c, const TensorT& a_scale_inv,
                const TensorT& b_scale_inv) {
    detail::expects_gemm_fp8(args, a, b, c, a_scale_inv, b_scale_inv);
    runtime::make_current(device_);
    gemm_.run_fp8(args, a.dtype(), a.data(), b.dtype(), b.data(), c.dtype(), c.data(),
                  a_scale_inv.data_as<const float>(), b_scale_inv.data_as<const float>());
  }

  // --- activation offload (NOTE [Offload ordering]) -----------------------------------
  /// Starts copying `tensor` to pinned host memory on the side stream; the caller may drop
  /// the tensor at once. The copy's bytes count as HostOffload until the HostCopy is gone.
  HostCopy offload(const TensorT& tensor) {
    detail::expects(tensor.defined(), "offload: a defined tensor");
    runtime::make_current(device_);
    return offload_.offload(tensor.data(), tensor.bytes(), tensor.shape(), tensor.dtype(), tensor.category(),
                            std::shared_ptr<const void>(tensor.storage()));
  }
  /// A new device tensor with the copy's values; main-stream work queued after this call sees them.
  TensorT fetch(HostCopy& copy) {
    detail::expects(copy.defined(), "fetch: a HostCopy that holds a tensor");
    runtime::make_current(device_);
    TensorT tensor = TensorT::empty(copy.shape(), copy.dtype(), copy.category(), *this);
    offload_.fetch_into(copy, tensor.data());
    return tensor;
  }
  /// The main stream waits for every copy out queued so far, and the offloaded tensors'
  /// device bytes go back to the pool now, in stream order (a checkpoint region calls this
  /// when its forward ends; without it they wait until the host next finds a copy done).
  void release_offloaded_sources() {
    runtime::make_current(device_);
    offload_.release_sources();
  }
  /// Offload copies and released buffers still waiting for the side stream.
  std::size_t offloads_pending() const { return offload_.pending(); }

 private:
  friend class FusedUpdate<Backend>;

  /// What a launcher needs; makes the backend's device current, since every launch goes through here.
  kernels::KernelContext context() {
    runtime::make_current(device_);
    return {stream_.get(), sm_count_, &allocator_, index_checks_.device()};
  }

  /// The ops give A and B their compute dtype, and f64 only meets f64.
  static void expect_gemm_dtypes(const TensorT& a, const TensorT& b, const TensorT& c) {
    detail::check_not_fp8(a.dtype(), "gemm (gemm_fp8 multiplies FP8)");
    detail::check_not_fp8(b.dtype(), "gemm (gemm_fp8 multiplies FP8)");
    detail::check_not_fp8(c.dtype(), "gemm (gemm_fp8 multiplies FP8)");
    detail::expects(a.dtype() == b.dtype() && is_floating(a.dtype()) && is_floating(c.dtype()) &&
                        (a.dtype() == DType::F64) == (c.dtype() == DType::F64),
                    "gemm: A and B of one floating dtype, f64 only with f64");
  }
  int device_;
  runtime::StreamHandle stream_;
  int sm_count_;
  MemoryStats stats_;
  Allocator allocator_;
  runtime::IndexChecks index_checks_;
  runtime::FingerprintChecks fingerprint_checks_;
  runtime::CopyOverflowChecks copy_overflow_checks_;
  kernels::GemmEngine gemm_;
  runtime::OffloadEngine offload_;
  CudnnAttention cudnn_attention_;  // cuDNN is opened at the first 16-bit attention call
  AttentionPaths attention_paths_;
  bool use_cudnn_attention_ = true;
};

static_assert(trainmem::Backend<Backend> && HasGemmBias<Backend> && HasOffload<Backend> && HasFp8<Backend>,
              "cuda::Backend must meet the backend contract (core/backend_contract.hpp)");

}  // namespace trainmem::cuda
