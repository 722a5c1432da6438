// trainmem/backend/cpu/kernels/dropout.hpp — dropout from a counter-based stream, no mask stored.
//
// Element i keeps or drops by draw i of the (seed, offset) stream (core/rng.hpp), so
// the mask is a pure function of the stream: backward and a checkpoint's recompute
// draw it again, and the CUDA kernel draws the same one.
#pragma once

#include <cstdint>

#include "trainmem/backend/cpu/kernels/parallel.hpp"
#include "trainmem/core/dtype.hpp"
#include "trainmem/core/math.hpp"
#include "trainmem/core/rng.hpp"

namespace trainmem::cpu::kernels {

/// out = in * keep(i) / (1 - p); the same call is dropout's backward on the gradient.
template <class T>
void dropout(const T* in, T* out, std::int64_t n, float p, RngState rng) {
  const math::DropoutScale scale{p};
  parallel_for(n, n > kParallelGrain, [&](std::int64_t i) {
    const auto factor =
        static_cast<AccumulatorOf<T>>(scale(detail::random_uniform(rng, static_cast<std::uint64_t>(i))));
    out[i] = detail::narrow<T>(static_cast<AccumulatorOf<T>>(detail::widen(in[i])) * factor);
  });
}

}  // namespace trainmem::cpu::kernels
