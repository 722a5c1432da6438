// trainmem/backend/cuda/kernels/reduction.cuh — column sums, sums over one axis, the sum of all elements, the sum of
// squares.
//
// The mirror of backend/cpu/kernels/reduction.hpp on the deterministic two-stage
// reductions of reduce.cuh: the summands and the final rounding are the CPU loop's,
// only the order of additions differs (a tree here), so results agree to rounding.
#pragma once

#include <cstdint>

#include "trainmem/backend/cuda/element_io.cuh"
#include "trainmem/backend/cuda/launch.cuh"
#include "trainmem/backend/cuda/reduce.cuh"
#include "trainmem/core/axis_view.hpp"
#include "trainmem/core/fingerprint.hpp"

namespace trainmem::cuda::kernels {

namespace device {
template <class Acc, class TOut>
struct StoreColumnSum {  // out[c] = beta out[c] + sum, as the CPU loop rounds it
  TOut* out;
  double beta;
  __device__ void operator()(std::int64_t c, Acc sum) const {
    const Acc prior = beta == 0.0 ? Acc(0) : static_cast<Acc>(beta) * load<Acc>(out, c);
    out[c] = narrow<TOut>(prior + sum);
  }
};

template <class Acc, class TOut>
struct StoreTotal {
  TOut* out;
  __device__ void operator()(Acc total) const { out[0] = narrow<TOut>(total); }
};
}  // namespace device

/// out[c] = beta out[c] + sum_r in[r, c].
template <class TIn, class TOut>
void sum_rows(const KernelContext& ctx, const TIn* in, TOut* out, std::int64_t rows, std::int64_t cols, double beta) {
  using Acc = AccumulatorFor<TIn, TOut>;
  reduce_columns<Acc>(ctx, rows, cols, device::WidenedElement<Acc, TIn>{in, cols},
                      device::StoreColumnSum<Acc, TOut>{out, beta});
}

namespace device {
template <class Acc, class TOut>
struct StoreSum {  // out[j] = sum
  TOut* out;
  __device__ void operator()(std::int64_t j, Acc sum) const { out[j] = narrow<TOut>(sum); }
};

/// Element (e, o * inner + i) of in seen as [outer, extent, inner]: the column sums over e
/// of this [extent, outer * inner] view are the sums over the axis.
template <class Acc, class T>
struct AxisElement {
  const T* in;
  std::int64_t extent, inner;
  __device__ Acc operator()(std::int64_t e, std::int64_t c) const {
    const std::int64_t o = c / inner, i = c % inner;
    return load<Acc>(in, (o * extent + e) * inner + i);
  }
};
}  // namespace device

/// out[o, i] = sum_e in[o, e, i] for in seen as `view`: a row reduction when the axis is
/// the last (inner 1), column sums otherwise.
template <class TIn, class TOut>
void sum_axis(const KernelContext& ctx, const TIn* in, TOut* out, const AxisView& view) {
  using Acc = AccumulatorFor<TIn, TOut>;
  if (view.inner == 1)
    reduce_rows<Acc>(ctx, view.outer, view.extent, device::WidenedElement<Acc, TIn>{in, view.extent},
                     device::StoreSum<Acc, TOut>{out});
  else
    reduce_columns<Acc>(ctx, view.extent, view.outer * view.inner,
                        device::AxisElement<Acc, TIn>{in, view.extent, view.inner}, device::StoreSum<Acc, TOut>{out});
}

template <class TIn, class TOut>
void sum_all(const KernelContext& ctx, const TIn* in, TOut* out, std::int64_t n) {
  using Acc = AccumulatorFor<TIn, TOut>;
  reduce_all<Acc>(ctx, n, device::WidenedElement<Acc, TIn>{in, 0}, device::StoreTotal<Acc, TOut>{out});
}

namespace device {
template <class Acc, class T>
struct SquaredElement {
  const T* in;
  __device__ Acc operator()(std::int64_t i) const {
    const Acc x = load<Acc>(in, i);
    return x * x;
  }
};

template <class Acc, class TAcc>
struct AddToAccumulator {
  TAcc* accumulator;
  __device__ void operator()(Acc total) const { accumulator[0] += static_cast<TAcc>(total); }
};
}  // namespace device

/// accumulator[0] += sum(x^2), summed in the accumulator's type TAcc (f32, or f64).
template <class T, class TAcc>
void sum_squares(const KernelContext& ctx, const T* x, std::int64_t n, TAcc* accumulator) {
  reduce_all<TAcc>(ctx, n, device::SquaredElement<TAcc, T>{x}, device::AddToAccumulator<TAcc, TAcc>{accumulator});
}

namespace device {
/// Word j of a buffer as core/fingerprint.hpp reads it (little-endian, the last
/// zero-padded), mixed with its index.
struct FingerprintWord {
  const unsigned char* bytes;
  std::uint64_t size;
  bool aligned;
  __device__ unsigned long long operator()(std::int64_t k) const {
    const auto j = static_cast<std::uint64_t>(k);
    const std::uint64_t first = j * 8;
    std::uint64_t word = 0;
    if (aligned && first + 8 <= size) {
      word = reinterpret_cast<const std::uint64_t*>(bytes)[j];
    } else {
      for (std::uint64_t b = 0; b < 8 && first + b < size; ++b)
        word |= static_cast<std::uint64_t>(bytes[first + b]) << (8 * b);
    }
    return ::trainmem::detail::fingerprint_term(word, j);
  }
};

struct StoreFingerprint {
  unsigned long long* out;
  __device__ void operator()(unsigned long long total) const { out[0] = total; }
};
/// On a mismatch with the stored fingerprint, claims `record` with `check` (the first claim stays).
struct CompareFingerprint {
  const unsigned long long* expected;
  unsigned long long* record;
  unsigned long long check;
  __device__ void operator()(unsigned long long total) const {
    if (total != expected[0]) atomicCAS(record, 0ull, check);
  }
};
}  // namespace device

/// core/fingerprint.hpp of `bytes` bytes at `data` (every word), into the device word `out`:
/// an integer sum, so the tree order of reduce_all gives the CPU loop's bits.
template <class Finish>
void reduce_fingerprint(const KernelContext& ctx, const void* data, std::uint64_t bytes, Finish finish) {
  const std::uint64_t words = (bytes + 7) / 8;
  const bool aligned = reinterpret_cast<std::uintptr_t>(data) % 8 == 0;
  reduce_all<unsigned long long>(ctx, static_cast<std::int64_t>(words),
                                 device::FingerprintWord{static_cast<const unsigned char*>(data), bytes, aligned},
                                 finish);
}
inline void fingerprint(const KernelContext& ctx, const void* data, std::uint64_t bytes, unsigned long long* out) {
  reduce_fingerprint(ctx, data, bytes, device::StoreFingerprint{out});
}
/// Compares the fingerprint of `bytes` bytes at `data` with the device word `expected`; a
/// mismatch claims `record` with `check` (fingerprint_checks.cuh raises it at the next host wait).
inline void check_fingerprint(const KernelContext& ctx, const void* data, std::uint64_t bytes,
                              const unsigned long long* expected, unsigned long long* record,
                              unsigned long long check) {
  reduce_fingerprint(ctx, data, bytes, device::CompareFingerprint{expected, record, check});
}

}  // namespace trainmem::cuda::kernels
