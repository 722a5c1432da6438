// trainmem/backend/cuda/backend.cuh — the CUDA backend: cuBLASLt GEMM, CUDA kernels, a stream-ordered pool.
//
// cuda::Backend has the methods of cpu::Backend with the same meaning, so every op,
// the tape, checkpointing, amp and the optimizers run on it unchanged; it adds the
// fused GEMM epilogue (gemm_bias), the loss scaler's device kernels (unscale_grads,
// update_scale, sum_squares, apply_update with a found-inf flag) and activation
// offload (offload/fetch, see NOTE [Offload ordering] in offload.cuh).
//
// One backend is one device and one stream. All work is queued on that stream in
// call order, so results are ordered without synchronising; every call makes the
// backend's device current first, so two backends on two GPUs can be used from one
// thread. The host waits only where the user asks for a value or a wait: download()
// (to_host), synchronize(), an upload from pinned memory (which the caller may reuse
// when it returns), and the allocator's out-of-memory retry; host_syncs() counts them
// (NOTE [Checks without a host wait]). Kernels launch
// asynchronously: a fault inside one surfaces as trainmem::Error at the next checked
// call. Memory is accounted per category in memory() exactly as on the CPU (requested
// bytes); the pool, the cuBLASLt workspace and scratch buffers all come from the
// tracked allocator. A backend must outlive its tensors and HostCopies.
//
// Do not compile with --use_fast_math: it changes division, exp and the rounding
// that dropout masks and the comparison with the CPU backend rely on.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include "trainmem/backend/cuda/allocator.cuh"
#include "trainmem/backend/cuda/amp_kernels.cuh"
#include "trainmem/backend/cuda/error.cuh"
#include "trainmem/backend/cuda/gemm.cuh"
#include "trainmem/backend/cuda/kernels.cuh"
#include "trainmem/backend/cuda/offload.cuh"
#include "trainmem/core/gemm_args.hpp"
#include "trainmem/core/loss_scale_rule.hpp"
#include "trainmem/core/rng.hpp"
#include "trainmem/core/stochastic_rounding.hpp"
#include "trainmem/core/tensor.hpp"

namespace trainmem::cuda {

/// Number of CUDA devices this process can use (0 where there is no driver or no GPU).
inline int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

namespace detail {
/// Makes `device` current unless it already is (a cudaGetDevice is cheaper than a cudaSetDevice).
inline void make_current(int device) {
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess || current != device) TRAINMEM_CUDA_CHECK(cudaSetDevice(device));
}

// NOTE [Checks without a host wait]
// Cross-entropy labels and embedding ids are checked by the kernels that read them: an
// index outside its range is recorded in a BadIndex (launch.cuh) in device memory and
// the kernel goes on (a zero loss term, a zero row). Whenever the backend waits for its
// stream anyway (download, synchronize), the records travel back with the wait (one
// more small copy queued before it) and a claimed record is raised as trainmem::Error
// naming the op, the index and the range, then cleared. So a step with a bad label
// fails at the user's next to_host() or synchronize(), never later and without a wait
// of its own; the CPU backend checks the same indices at the op.
/// \brief The device's BadIndex records and their pinned host mirror.
class IndexChecks {
 public:
  static constexpr std::size_t kBytes = sizeof(BadIndex) * static_cast<std::size_t>(IndexCheck::kCount);
  IndexChecks() {
    // A few control bytes, like the stream and the events: not tensor memory, so not in MemoryStats.
    TRAINMEM_CUDA_CHECK(cudaMalloc(&device_, kBytes));
    TRAINMEM_CUDA_CHECK(cudaMemset(device_, 0, kBytes));
    const cudaError_t status = cudaMallocHost(&host_, kBytes);
    if (status != cudaSuccess) {
      cudaFree(device_);
      throw_cuda_error(status, "cudaMallocHost(&host_, kBytes)", __FILE__, __LINE__);
    }
    std::memset(static_cast<void*>(host_), 0, kBytes);
  }
  ~IndexChecks() {
    cudaFreeHost(host_);
    cudaFree(device_);
  }
  IndexChecks(const IndexChecks&) = delete;
  IndexChecks& operator=(const IndexChecks&) = delete;

  BadIndex* device() const { return device_; }
  /// Queues the copy of the records to the host; read them with raise() once the stream is waited for.
  void queue_read(cudaStream_t stream) {
    TRAINMEM_CUDA_CHECK(cudaMemcpyAsync(host_, device_, kBytes, cudaMemcpyDeviceToHost, stream));
  }
  /// Throws the first claimed record (after clearing all of them), if any.
  void raise(cudaStream_t stream) {
    for (int k = 0; k < static_cast<int>(IndexCheck::kCount); ++k) {
      if (host_[k].claimed == 0) continue;
      const BadIndex bad = host_[k];
      std::memset(static_cast<void*>(host_), 0, kBytes);
      TRAINMEM_CUDA_CHECK(cudaMemsetAsync(device_, 0, kBytes, stream));
      const bool label = k == static_cast<int>(IndexCheck::CrossEntropyLabel);
      throw Error(trainmem::detail::concat(label ? "cross_entropy: label " : "embedding: id ", bad.value,
                                           label ? " at row " : " at position ", bad.position, " is outside [0, ",
                                           bad.extent, ") (checked on the device, raised at the next host wait)"));
    }
  }

 private:
  BadIndex* device_ = nullptr;
  BadIndex* host_ = nullptr;
};

/// \brief An owned, non-blocking CUDA stream.
class StreamHandle {
 public:
  explicit StreamHandle(int device) {
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess) cudaGetLastError();
    trainmem::detail::check(status == cudaSuccess && count > 0, "cuda::Backend: no usable CUDA device (",
                            status != cudaSuccess ? cudaGetErrorString(status) : "none found", ")");
    trainmem::detail::check(device >= 0 && device < count, "cuda::Backend: device ", device, " does not exist (", count,
                            " found)");
    TRAINMEM_CUDA_CHECK(cudaSetDevice(device));
    TRAINMEM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  ~StreamHandle() {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  StreamHandle(const StreamHandle&) = delete;
  StreamHandle& operator=(const StreamHandle&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

inline int multiprocessor_count(int device) {
  int count = 0;
  TRAINMEM_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
  return count;
}
}  // namespace detail

/// \brief CUDA backend: cuBLASLt for GEMM, CUDA kernels for the rest, one stream per instance.
class Backend {
 public:
  using TensorT = Tensor<Backend>;
  using HostCopy = cuda::HostCopy;
  static constexpr const char* kName = "cuda";

  /// Uses `device`, makes it current, and creates the stream, pool and cuBLASLt handle.
  explicit Backend(int device = 0)
      : device_(device),
        stream_(device),
        sm_count_(detail::multiprocessor_count(device)),
        allocator_(stats_, device, stream_.get()),
        index_checks_(),
        gemm_(context()),
        offload_(allocator_, stream_.get()) {}
  ~Backend() {
    cudaSetDevice(device_);
    cudaStreamSynchronize(stream_.get());
    cudaGetLastError();
  }
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  /// The instance tensors use unless told otherwise: the device current at first use.
  static Backend& default_instance() {
    static Backend instance(current_device());
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

  // --- storage --------------------------------------------------------------------
  void* allocate(std::size_t bytes, MemCategory category) {
    detail::make_current(device_);
    return allocator_.allocate(bytes, category);
  }
  void deallocate(void* ptr, std::size_t bytes, MemCategory category) { allocator_.deallocate(ptr, bytes, category); }
  /// Host to device, queued; returns once the host buffer may be reused. From pageable
  /// memory the driver stages the bytes before it returns (the CUDA runtime's documented
  /// behaviour for pageable host-to-device cudaMemcpyAsync), so the host does not wait
  /// for the stream; from pinned memory the copy reads the buffer later, so this waits.
  void upload(void* dst, const void* src, std::size_t bytes) {
    if (bytes == 0) return;
    detail::make_current(device_);
    TRAINMEM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream()));
    if (is_pinned(src)) allocator_.synchronize(stream());
  }
  /// Host to device from pinned memory, queued: `src` must stay unchanged until the
  /// stream has run the copy (a later synchronize, or an event recorded after this call).
  void upload_async(void* dst, const void* src, std::size_t bytes) {
    if (bytes == 0) return;
    detail::make_current(device_);
    TRAINMEM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream()));
  }
  /// Device to host, after all queued work; returns once the bytes are there. Raises an
  /// index a kernel found out of range (NOTE [Checks without a host wait]).
  void download(void* dst, const void* src, std::size_t bytes) {
    if (bytes == 0) return;
    detail::make_current(device_);
    TRAINMEM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream()));
    index_checks_.queue_read(stream());
    allocator_.synchronize(stream());
    index_checks_.raise(stream());
  }
  /// Device to device, queued; overlapping ranges go through a scratch buffer (memmove semantics).
  void copy(void* dst, const void* src, std::size_t bytes) {
    if (bytes == 0 || dst == src) return;
    detail::make_current(device_);
    const auto* d = static_cast<const std::byte*>(dst);
    const auto* s = static_cast<const std::byte*>(src);
    if (d < s + bytes && s < d + bytes) {
      detail::ScratchBuffer staging(context(), bytes);
      TRAINMEM_CUDA_CHECK(cudaMemcpyAsync(staging.as<void>(), src, bytes, cudaMemcpyDeviceToDevice, stream()));
      TRAINMEM_CUDA_CHECK(cudaMemcpyAsync(dst, staging.as<const void>(), bytes, cudaMemcpyDeviceToDevice, stream()));
      return;
    }
    TRAINMEM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream()));
  }
  void fill_zero(void* dst, std::size_t bytes) {
    if (bytes == 0) return;
    detail::make_current(device_);
    TRAINMEM_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, stream()));
  }
  /// Work queued so far (kernels and offload copies) is finished; raises any error it hit,
  /// and any index a kernel found out of range (NOTE [Checks without a host wait]).
  void synchronize() {
    detail::make_current(device_);
    index_checks_.queue_read(stream());
    allocator_.synchronize(stream());
    offload_.synchronize();
    allocator_.check_deferred();
    index_checks_.raise(stream());
  }

  // --- kernels ---------------------------------------------------------------------
  /// C = alpha op(A) op(B) + beta C. A and B share a dtype; f64 only with f64.
  void gemm(const GemmArgs& args, const TensorT& a, const TensorT& b, const TensorT& c) {
    check_gemm_dtypes("gemm", a, b, c);
    detail::make_current(device_);
    gemm_.run(args, a.dtype(), a.data(), b.data(), c.dtype(), c.data());
  }
  /// C = act(alpha op(A) op(B) + beta C + bias) with bias [n] added to every row (and batch
  /// entry); act is GELU (tanh form, math::GeluTanh) when `gelu`, else the identity. Fused into
  /// the cuBLASLt epilogue where offered: the bias is added to the FP32 accumulator, and C
  /// is rounded once. linear() calls this when the backend has it.
  void gemm_bias(const GemmArgs& args, const TensorT& a, const TensorT& b, const TensorT& bias, const TensorT& c,
                 bool gelu) {
    check_gemm_dtypes("gemm_bias", a, b, c);
    trainmem::detail::check(bias.defined() && bias.numel() == args.n && is_floating(bias.dtype()),
                            "gemm_bias: bias must be a floating tensor of n = ", args.n, " elements, got ",
                            bias.defined() ? bias.shape().str() : std::string("undefined"));
    detail::make_current(device_);
    gemm_.run(args, a.dtype(), a.data(), b.data(), c.dtype(), c.data(),
              gelu ? GemmEpilogue::BiasGelu : GemmEpilogue::Bias, bias.dtype(), bias.data());
  }

  /// out = op(in), element-wise; in and out may differ in dtype (a cast is map(Identity)).
  template <class Op>
  void map(Op op, const TensorT& in, const TensorT& out) {
    require_floating("map", in, out);
    detail::map_unary(context(), op, in.dtype(), in.data(), out.dtype(), out.data(), in.numel());
  }

  /// out = op(a, b); b has a's shape, is one row of a's last extent, or a scalar.
  template <class Op>
  void map(Op op, const TensorT& a, const TensorT& b, const TensorT& out) {
    require_floating("map", a, b, out);
    detail::map_binary(context(), op, a.dtype(), a.data(), b.dtype(), b.data(), out.dtype(), out.data(), a.rows(),
                       a.cols(), b.numel());
  }

  /// out[c] = beta out[c] + sum over rows of in[r, c] (in viewed as [rows, out.numel()]).
  void sum_rows(const TensorT& in, const TensorT& out, double beta = 0.0) {
    const std::int64_t cols = out.numel();
    visit_floating(in.dtype(), "sum_rows", [&]<class TI>() {
      visit_floating(out.dtype(), "sum_rows", [&]<class TO>() {
        detail::sum_rows(context(), in.data_as<const TI>(), out.data_as<TO>(), cols == 0 ? 0 : in.numel() / cols, cols,
                         beta);
      });
    });
  }

  void sum_all(const TensorT& in, const TensorT& out) {
    visit_floating(in.dtype(), "sum_all", [&]<class TI>() {
      visit_floating(out.dtype(), "sum_all", [&]<class TO>() {
        detail::sum_all(context(), in.data_as<const TI>(), out.data_as<TO>(), in.numel());
      });
    });
  }

  void softmax(const TensorT& x, const TensorT& y, bool log_output) {
    visit_floating(x.dtype(), "softmax", [&]<class T>() {
      detail::softmax(context(), x.data_as<const T>(), y.data_as<T>(), x.rows(), x.cols(), log_output);
    });
  }
  void softmax_backward(const TensorT& dy, const TensorT& y, const TensorT& dx, bool log_output) {
    visit_floating(y.dtype(), "softmax_backward", [&]<class T>() {
      detail::softmax_backward(context(), dy.data_as<const T>(), y.data_as<const T>(), dx.data_as<T>(), y.rows(),
                               y.cols(), log_output);
    });
  }

  void layer_norm(const TensorT& x, const TensorT& gamma, const TensorT& beta, const TensorT& y, const TensorT& mean,
                  const TensorT& rstd, double eps) {
    visit_floating(x.dtype(), "layer_norm", [&]<class T>() {
      visit_floating(gamma.dtype(), "layer_norm", [&]<class TP>() {
        using Acc = AccumulatorOf<T>;
        detail::layer_norm(context(), x.data_as<const T>(), gamma.data_as<const TP>(), beta.data_as<const TP>(),
                           y.data_as<T>(), mean.data_as<Acc>(), rstd.data_as<Acc>(), x.rows(), x.cols(), eps);
      });
    });
  }
  void layer_norm_backward(const TensorT& dy, const TensorT& x, const TensorT& gamma, const TensorT& mean,
                           const TensorT& rstd, const TensorT& dx, const TensorT& dgamma, const TensorT& dbeta) {
    visit_floating(x.dtype(), "layer_norm_backward", [&]<class T>() {
      visit_floating(gamma.dtype(), "layer_norm_backward", [&]<class TP>() {
        using Acc = AccumulatorOf<T>;
        detail::layer_norm_backward(context(), dy.data_as<const T>(), x.data_as<const T>(), gamma.data_as<const TP>(),
                                    mean.data_as<const Acc>(), rstd.data_as<const Acc>(), dx.data_as<T>(),
                                    dgamma.data_as<TP>(), dbeta.data_as<TP>(), x.rows(), x.cols());
      });
    });
  }

  /// loss (scalar) and lse ([rows]) are in the accumulator dtype of the logits. Labels are
  /// checked on the device; an out-of-range label throws (this call synchronises once).
  void cross_entropy(const TensorT& logits, const TensorT& labels, const TensorT& loss, const TensorT& lse) {
    visit_floating(logits.dtype(), "cross_entropy", [&]<class T>() {
      using Acc = AccumulatorOf<T>;
      detail::cross_entropy(context(), logits.data_as<const T>(), labels.data_as<const std::int32_t>(),
                            loss.data_as<Acc>(), lse.data_as<Acc>(), logits.rows(), logits.cols());
    });
  }
  void cross_entropy_backward(const TensorT& dloss, const TensorT& logits, const TensorT& labels, const TensorT& lse,
                              const TensorT& dlogits) {
    visit_floating(logits.dtype(), "cross_entropy_backward", [&]<class T>() {
      using Acc = AccumulatorOf<T>;
      detail::cross_entropy_backward(context(), dloss.data_as<const Acc>(), logits.data_as<const T>(),
                                     labels.data_as<const std::int32_t>(), lse.data_as<const Acc>(),
                                     dlogits.data_as<T>(), logits.rows(), logits.cols());
    });
  }

  /// in viewed as [a, b, c, d] -> out [a, c, b, d] (transpose when d = 1, head split/merge).
  void swap_middle_axes(const TensorT& in, const TensorT& out, std::int64_t a, std::int64_t b, std::int64_t c,
                        std::int64_t d) {
    visit_floating(in.dtype(), "swap_middle_axes", [&]<class T>() {
      detail::swap_middle_axes(context(), in.data_as<const T>(), out.data_as<T>(), a, b, c, d);
    });
  }
  void causal_mask(const TensorT& in, const TensorT& out, double fill) {
    const std::int64_t t = in.cols();
    visit_floating(in.dtype(), "causal_mask", [&]<class T>() {
      detail::causal_mask(context(), in.data_as<const T>(), out.data_as<T>(), t == 0 ? 0 : in.numel() / (t * t), t,
                          fill);
    });
  }
  void dropout(const TensorT& in, const TensorT& out, float p, RngState rng) {
    visit_floating(in.dtype(), "dropout", [&]<class T>() {
      detail::dropout(context(), in.data_as<const T>(), out.data_as<T>(), in.numel(), p, rng);
    });
  }
  void embedding(const TensorT& weight, const TensorT& ids, const TensorT& out) {
    visit_floating(weight.dtype(), "embedding", [&]<class T>() {
      detail::embedding(context(), weight.data_as<const T>(), ids.data_as<const std::int32_t>(), out.data_as<T>(),
                        ids.numel(), weight.cols(), weight.rows());
    });
  }
  /// dweight += scatter-add of dout rows (the caller zeroes dweight first); deterministic.
  void embedding_backward(const TensorT& dout, const TensorT& ids, const TensorT& dweight) {
    visit_floating(dout.dtype(), "embedding_backward", [&]<class T>() {
      visit_floating(dweight.dtype(), "embedding_backward", [&]<class TW>() {
        detail::embedding_backward(context(), dout.data_as<const T>(), ids.data_as<const std::int32_t>(),
                                   dweight.data_as<TW>(), ids.numel(), dweight.cols(), dweight.rows());
      });
    });
  }

  /// One optimizer update pass: param (f32 or f64) and states updated in place, grad
  /// (any floating dtype) read, and an optional 16-bit model copy written from the result.
  /// state1, state2 and model_copy may be undefined.
  template <class Update>
  void apply_update(Update update, const TensorT& param, const TensorT& grad, const TensorT& state1,
                    const TensorT& state2, const TensorT& model_copy) {
    apply_update(update, param, grad, state1, state2, model_copy, TensorT());
  }
  /// As above, and: when found_inf (an f32 scalar) is defined and non-zero the pass changes
  /// nothing, decided by the kernel (no host synchronisation); `rounding` says how the
  /// 16-bit model copy is written (stochastic: bf16 only, element i with draw i).
  template <class Update>
  void apply_update(Update update, const TensorT& param, const TensorT& grad, const TensorT& state1,
                    const TensorT& state2, const TensorT& model_copy, const TensorT& found_inf,
                    const CopyRounding& rounding = {}) {
    trainmem::detail::check(param.dtype() == DType::F32 || param.dtype() == DType::F64,
                            "apply_update: the updated parameter must be f32 or f64 (use FP32 master weights for "
                            "16-bit models)");
    trainmem::detail::check(is_floating(grad.dtype()) && grad.numel() == param.numel(), "apply_update: grad ",
                            grad.shape(), " ", grad.dtype(), " does not match parameter ", param.shape());
    if (model_copy.defined()) {
      trainmem::detail::check(is_floating(model_copy.dtype()) && model_copy.numel() == param.numel(),
                              "apply_update: model copy ", model_copy.shape(), " does not match parameter ",
                              param.shape());
      trainmem::detail::check(rounding.mode == RoundingMode::NearestEven || model_copy.dtype() == DType::BF16,
                              "apply_update: stochastic rounding writes bf16 model copies, the copy is ",
                              model_copy.dtype());
    }
    const float* skip = found_inf.defined() ? scalar_f32("apply_update", "found_inf", found_inf) : nullptr;
    visit_floating(param.dtype(), "apply_update", [&]<class TP>() {
      if constexpr (std::is_same_v<TP, float> || std::is_same_v<TP, double>) {
        TP* s1 = state1.defined() ? state1.data_as<TP>() : nullptr;
        TP* s2 = state2.defined() ? state2.data_as<TP>() : nullptr;
        detail::apply_update(context(), update, param.data_as<TP>(), grad.data(), grad.dtype(), s1, s2,
                             model_copy.defined() ? model_copy.data() : nullptr,
                             model_copy.defined() ? model_copy.dtype() : DType::F32, param.numel(), skip, rounding);
      }
    });
  }

  // --- mixed precision: the loss scaler's device side ------------------------------
  /// grads *= 1/scale[0] in place (one multi-tensor launch per 48 tensors); sets found_inf[0]
  /// = 1 if any stored result is inf or NaN (an inf/NaN gradient, or one that overflows when
  /// unscaled), and never clears it. scale and found_inf are f32 scalars.
  void unscale_grads(std::span<const TensorT> grads, const TensorT& scale, const TensorT& found_inf) {
    const float* scale_ptr = scalar_f32("unscale_grads", "scale", scale);
    float* flag = scalar_f32("unscale_grads", "found_inf", found_inf);
    std::vector<detail::GradRef> refs;
    refs.reserve(grads.size());
    for (const TensorT& g : grads) {
      if (!g.defined()) continue;
      trainmem::detail::check(is_floating(g.dtype()), "unscale_grads: gradients must be floating, got ", g.dtype(), " ",
                              g.shape());
      refs.push_back({g.data(), g.numel(), g.dtype()});
    }
    detail::unscale_grads(context(), refs, scale_ptr, flag);
  }
  /// One step of the dynamic loss-scale rule (update_scale_state) in a one-thread kernel.
  void update_scale(const TensorT& scale, const TensorT& growth_tracker, const TensorT& hysteresis_left,
                    const TensorT& found_inf, const ScaleUpdateArgs& args) {
    float* scale_ptr = scalar_f32("update_scale", "scale", scale);
    const float* flag = scalar_f32("update_scale", "found_inf", found_inf);
    detail::update_scale(context(), scale_ptr, scalar_i32("update_scale", "growth_tracker", growth_tracker),
                         scalar_i32("update_scale", "hysteresis_left", hysteresis_left), flag, args);
  }
  /// accumulator[0] += sum(x^2), summed in the accumulator's dtype (an f32 scalar; f64 allowed).
  void sum_squares(const TensorT& x, const TensorT& accumulator) {
    trainmem::detail::check(accumulator.defined() && accumulator.numel() == 1 &&
                                (accumulator.dtype() == DType::F32 || accumulator.dtype() == DType::F64),
                            "sum_squares: accumulator must be an f32 or f64 scalar");
    visit_floating(x.dtype(), "sum_squares", [&]<class T>() {
      if (accumulator.dtype() == DType::F64)
        detail::sum_squares(context(), x.data_as<const T>(), x.numel(), accumulator.data_as<double>());
      else detail::sum_squares(context(), x.data_as<const T>(), x.numel(), accumulator.data_as<float>());
    });
  }

  // --- activation offload (NOTE [Offload ordering]) -----------------------------------
  /// Starts copying `tensor` to pinned host memory on the side stream; the caller may drop
  /// the tensor at once. The copy's bytes count as HostOffload until the HostCopy is gone.
  HostCopy offload(const TensorT& tensor) {
    trainmem::detail::check(tensor.defined(), "offload: tensor is undefined");
    detail::make_current(device_);
    return offload_.offload(tensor.data(), tensor.bytes(), tensor.shape(), tensor.dtype(), tensor.category(),
                            std::shared_ptr<const void>(tensor.storage()));
  }
  /// A new device tensor with the copy's values; main-stream work queued after this call sees them.
  TensorT fetch(HostCopy& copy) {
    trainmem::detail::check(copy.defined(), "fetch: the HostCopy is empty");
    detail::make_current(device_);
    TensorT tensor = TensorT::empty(copy.shape(), copy.dtype(), copy.category(), *this);
    offload_.fetch_into(copy, tensor.data());
    return tensor;
  }
  /// Offload copies and released buffers still waiting for the side stream.
  std::size_t offloads_pending() const { return offload_.pending(); }

 private:
  static int current_device() {
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess) {
      cudaGetLastError();
      device = 0;
    }
    return device;
  }
  /// What a launcher needs; makes the backend's device current, since every launch goes through here.
  detail::KernelContext context() {
    detail::make_current(device_);
    return {stream_.get(), sm_count_, &allocator_, index_checks_.device()};
  }
  static bool is_pinned(const void* host) {
    cudaPointerAttributes attributes{};
    if (cudaPointerGetAttributes(&attributes, host) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return attributes.type == cudaMemoryTypeHost;
  }

  static void check_gemm_dtypes(const char* op, const TensorT& a, const TensorT& b, const TensorT& c) {
    trainmem::detail::check(a.dtype() == b.dtype() && is_floating(a.dtype()) && is_floating(c.dtype()), op,
                            ": A and B must share a floating dtype, got ", a.dtype(), " and ", b.dtype(), " (C ",
                            c.dtype(), ")");
    trainmem::detail::check((a.dtype() == DType::F64) == (c.dtype() == DType::F64), op,
                            ": f64 multiplies only with f64, got A ", a.dtype(), " and C ", c.dtype());
  }
  template <class... Tensors>
  static void require_floating(const char* op, const Tensors&... tensors) {
    (trainmem::detail::check(is_floating(tensors.dtype()), op, ": expected a floating dtype, got ", tensors.dtype()),
     ...);
  }
  static float* scalar_f32(const char* op, const char* what, const TensorT& t) {
    trainmem::detail::check(t.defined() && t.dtype() == DType::F32 && t.numel() == 1, op, ": ", what,
                            " must be an f32 scalar, got ",
                            t.defined() ? t.shape().str() + " " + std::string(name_of(t.dtype())) : "undefined");
    return t.data_as<float>();
  }
  static std::int32_t* scalar_i32(const char* op, const char* what, const TensorT& t) {
    trainmem::detail::check(t.defined() && t.dtype() == DType::I32 && t.numel() == 1, op, ": ", what,
                            " must be an i32 scalar, got ",
                            t.defined() ? t.shape().str() + " " + std::string(name_of(t.dtype())) : "undefined");
    return t.data_as<std::int32_t>();
  }

  int device_;
  detail::StreamHandle stream_;
  int sm_count_;
  MemoryStats stats_;
  Allocator allocator_;
  detail::IndexChecks index_checks_;
  detail::GemmEngine gemm_;
  detail::OffloadEngine offload_;
};

}  // namespace trainmem::cuda
