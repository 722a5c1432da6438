// trainmem/backend/cuda/kernels/elementwise.cuh — out = op(in) and out = op(a, b) on the device.
//
// The mirror of backend/cpu/kernels/elementwise.hpp, with the same functors: grid-stride
// loops that move 16 bytes per access when the pointers allow. When all operands share
// a dtype there is one kernel per dtype; mixed dtypes go to one run-time-dtype kernel
// per accumulator type instead of a kernel for every combination.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "trainmem/backend/cuda/element_io.cuh"
#include "trainmem/backend/cuda/launch.cuh"
#include "trainmem/core/axis_view.hpp"
#include "trainmem/core/math.hpp"

namespace trainmem::cuda::kernels {

inline bool any_f64(std::initializer_list<DType> dtypes) {
  for (DType d : dtypes)
    if (d == DType::F64) return true;
  return false;
}

/// How b of a binary map lines up with a (an AxisView of a, core/axis_view.hpp): same
/// shape, a scalar, rows of a bias (outer 1), or the general [outer, extent, inner] case.
enum class Broadcast : int { Full, Row, Scalar, Axis };

/// Where element i of a finds its b: b is [outer, inner] against a's [outer, extent, inner].
struct BroadcastIndex {
  Broadcast mode;
  std::int64_t extent, inner;
  __host__ __device__ std::int64_t operator()(std::int64_t i) const {
    switch (mode) {
      case Broadcast::Full: return i;
      case Broadcast::Scalar: return 0;
      case Broadcast::Row: return i % inner;
      default: return (i / (extent * inner)) * inner + i % inner;
    }
  }
};

inline BroadcastIndex broadcast_index(const AxisView& view) {
  const Broadcast mode = view.extent == 1                     ? Broadcast::Full
                         : view.outer == 1 && view.inner == 1 ? Broadcast::Scalar
                         : view.outer == 1                    ? Broadcast::Row
                                                              : Broadcast::Axis;
  return {mode, view.extent, view.inner};
}

namespace device {
template <class T>
__global__ void fill_kernel(T* out, T value, std::int64_t n) {
  for (std::int64_t i = global_thread(); i < n; i += grid_stride()) out[i] = value;
}

template <class Op, class TIn, class TOut>
__global__ void map_unary_kernel(Op op, const TIn* in, TOut* out, std::int64_t n, bool packed) {
  using Acc = AccumulatorFor<TIn, TOut>;
  constexpr int kPack = pack_width<TIn, TOut>();
  std::int64_t scalar_from = 0;
  if (packed) {
    const std::int64_t packs = n / kPack;
    const auto* in_packs = reinterpret_cast<const Pack<TIn, kPack>*>(in);
    auto* out_packs = reinterpret_cast<Pack<TOut, kPack>*>(out);
    for (std::int64_t p = global_thread(); p < packs; p += grid_stride()) {
      const Pack<TIn, kPack> x = in_packs[p];
      Pack<TOut, kPack> y;
#pragma unroll
      for (int j = 0; j < kPack; ++j) y.v[j] = narrow<TOut>(op(static_cast<Acc>(widen(x.v[j]))));
      out_packs[p] = y;
    }
    scalar_from = packs * kPack;
  }
  for (std::int64_t i = scalar_from + global_thread(); i < n; i += grid_stride())
    out[i] = narrow<TOut>(op(load<Acc>(in, i)));
}

template <class Op, class Acc>
__global__ void map_unary_any_kernel(Op op, const void* in, DType in_dtype, void* out, DType out_dtype,
                                     std::int64_t n) {
  for (std::int64_t i = global_thread(); i < n; i += grid_stride())
    store_as<Acc>(out, out_dtype, i, op(load_as<Acc>(in, in_dtype, i)));
}

template <class Op, class T>
__global__ void map_binary_kernel(Op op, const T* a, const T* b, T* out, std::int64_t n, BroadcastIndex index,
                                  bool packed) {
  using Acc = AccumulatorOf<T>;
  constexpr int kPack = pack_width<T>();
  std::int64_t scalar_from = 0;
  if (packed) {  // the launcher guarantees alignment, no Axis mode, and inner % kPack == 0 for Row
    using P = Pack<T, kPack>;
    const std::int64_t packs = n / kPack;
    const auto* a_packs = reinterpret_cast<const P*>(a);
    const auto* b_packs = reinterpret_cast<const P*>(b);
    auto* out_packs = reinterpret_cast<P*>(out);
    for (std::int64_t p = global_thread(); p < packs; p += grid_stride()) {
      const P x = a_packs[p];
      P y;
      if (index.mode == Broadcast::Full) {
        y = b_packs[p];
      } else if (index.mode == Broadcast::Row) {
        y = b_packs[(p * kPack % index.inner) / kPack];
      } else {
#pragma unroll
        for (int j = 0; j < kPack; ++j) y.v[j] = b[0];
      }
      P z;
#pragma unroll
      for (int j = 0; j < kPack; ++j)
        z.v[j] = narrow<T>(op(static_cast<Acc>(widen(x.v[j])), static_cast<Acc>(widen(y.v[j]))));
      out_packs[p] = z;
    }
    scalar_from = packs * kPack;
  }
  for (std::int64_t i = scalar_from + global_thread(); i < n; i += grid_stride())
    out[i] = narrow<T>(op(load<Acc>(a, i), load<Acc>(b, index(i))));
}

template <class Op, class Acc>
__global__ void map_binary_any_kernel(Op op, const void* a, DType a_dtype, const void* b, DType b_dtype, void* out,
                                      DType out_dtype, std::int64_t n, BroadcastIndex index) {
  for (std::int64_t i = global_thread(); i < n; i += grid_stride())
    store_as<Acc>(out, out_dtype, i, op(load_as<Acc>(a, a_dtype, i), load_as<Acc>(b, b_dtype, index(i))));
}
}  // namespace device

/// out[i] = value for all n elements, rounded once (on the host) to `dtype`.
inline void fill(const KernelContext& ctx, DType dtype, void* out, double value, std::int64_t n) {
  if (n == 0) return;
  visit_floating(dtype, "fill", [&]<class T>() {
    device::fill_kernel<<<blocks_for(ctx, n), kThreads, 0, ctx.stream>>>(static_cast<T*>(out),
                                                                         ::trainmem::detail::narrow<T>(value), n);
    TRAINMEM_CUDA_CHECK_LAUNCH("fill_kernel");
  });
}

/// out = op(in) element-wise; a cast is map(Identity). Casts get a kernel per dtype pair.
template <class Op>
void map_unary(const KernelContext& ctx, Op op, DType in_dtype, const void* in, DType out_dtype, void* out,
               std::int64_t n) {
  // The mixed-dtype kernels read dtypes at run time; FP8 is refused here, before any launch.
  ::trainmem::detail::check_not_fp8(in_dtype, "map");
  ::trainmem::detail::check_not_fp8(out_dtype, "map");
  if (n == 0) return;
  constexpr bool kCast = std::is_same_v<Op, math::Identity>;
  if (kCast || in_dtype == out_dtype) {
    visit_floating(in_dtype, "map", [&]<class TI>() {
      visit_floating(out_dtype, "map", [&]<class TO>() {
        if constexpr (kCast || std::is_same_v<TI, TO>) {
          constexpr int kPack = pack_width<TI, TO>();
          const bool packed = pack_aligned<TI, kPack>(in) && pack_aligned<TO, kPack>(out);
          device::map_unary_kernel<<<blocks_for(ctx, n, kPack), kThreads, 0, ctx.stream>>>(
              op, static_cast<const TI*>(in), static_cast<TO*>(out), n, packed);
          TRAINMEM_CUDA_CHECK_LAUNCH("map_unary_kernel");
        }
      });
    });
    return;
  }
  if (any_f64({in_dtype, out_dtype}))
    device::map_unary_any_kernel<Op, double>
        <<<blocks_for(ctx, n), kThreads, 0, ctx.stream>>>(op, in, in_dtype, out, out_dtype, n);
  else
    device::map_unary_any_kernel<Op, float>
        <<<blocks_for(ctx, n), kThreads, 0, ctx.stream>>>(op, in, in_dtype, out, out_dtype, n);
  TRAINMEM_CUDA_CHECK_LAUNCH("map_unary_any_kernel");
}

/// out = op(a, b) for a seen as `view` and b as its reduced partner [outer, inner].
template <class Op>
void map_binary(const KernelContext& ctx, Op op, DType a_dtype, const void* a, DType b_dtype, const void* b,
                DType out_dtype, void* out, const AxisView& view) {
  ::trainmem::detail::check_not_fp8(a_dtype, "map");
  ::trainmem::detail::check_not_fp8(b_dtype, "map");
  ::trainmem::detail::check_not_fp8(out_dtype, "map");
  const std::int64_t n = view.numel();
  if (n == 0) return;
  const BroadcastIndex index = broadcast_index(view);
  const Broadcast mode = index.mode;
  if (a_dtype == b_dtype && a_dtype == out_dtype) {
    visit_floating(a_dtype, "map", [&]<class T>() {
      constexpr int kPack = pack_width<T>();
      const bool packed = mode != Broadcast::Axis && pack_aligned<T, kPack>(a) && pack_aligned<T, kPack>(out) &&
                          (mode == Broadcast::Scalar || pack_aligned<T, kPack>(b)) &&
                          (mode != Broadcast::Row || view.inner % kPack == 0);
      device::map_binary_kernel<<<blocks_for(ctx, n, kPack), kThreads, 0, ctx.stream>>>(
          op, static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(out), n, index, packed);
      TRAINMEM_CUDA_CHECK_LAUNCH("map_binary_kernel");
    });
    return;
  }
  if (any_f64({a_dtype, b_dtype, out_dtype}))
    device::map_binary_any_kernel<Op, double>
        <<<blocks_for(ctx, n), kThreads, 0, ctx.stream>>>(op, a, a_dtype, b, b_dtype, out, out_dtype, n, index);
  else
    device::map_binary_any_kernel<Op, float>
        <<<blocks_for(ctx, n), kThreads, 0, ctx.stream>>>(op, a, a_dtype, b, b_dtype, out, out_dtype, n, index);
  TRAINMEM_CUDA_CHECK_LAUNCH("map_binary_any_kernel");
}

}  // namespace trainmem::cuda::kernels
