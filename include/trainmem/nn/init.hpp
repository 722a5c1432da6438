// trainmem/nn/init.hpp — seeded parameter initialisation.
//
// Values come from the counter-based generator, so a (seed, stream) pair gives the
// same weights on every machine and backend. Each module draws its tensors from its
// own stream so that adding a layer does not change the others' weights.
#pragma once

#include <cmath>
#include <cstdint>
#include <new>
#include <stdexcept>
#include <vector>

#include "trainmem/autograd/var.hpp"
#include "trainmem/core/rng.hpp"

namespace trainmem::nn {

/// \brief Draws initial values: uniform and normal streams keyed by (seed, stream id).
class Init {
 public:
  explicit Init(std::uint64_t seed = 0) : seed_(seed) {}

  std::vector<double> uniform(std::int64_t count, double low, double high) {
    const RngState state = next();
    std::vector<double> out = values(count, "uniform");
    for (std::int64_t i = 0; i < count; ++i)
      out[i] = low + (high - low) * detail::random_uniform(state, static_cast<std::uint64_t>(i));
    return out;
  }
  /// Box-Muller over pairs of uniforms.
  std::vector<double> normal(std::int64_t count, double mean, double stddev) {
    const RngState state = next();
    std::vector<double> out = values(count, "normal");
    for (std::int64_t i = 0; i < count; ++i) {
      const double u1 = 1.0 - detail::random_uniform(state, 2 * static_cast<std::uint64_t>(i));  // (0, 1]
      const double u2 = detail::random_uniform(state, 2 * static_cast<std::uint64_t>(i) + 1);
      out[i] = mean + stddev * std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
    }
    return out;
  }
  template <class B>
  Var<B> parameter(Shape shape, const std::vector<double>& values, DType dtype, std::string name) {
    return Var<B>::parameter(Tensor<B>::from_host(std::move(shape), values, dtype, MemCategory::Parameter),
                             std::move(name));
  }

 private:
  /// `count` host values; a count the host cannot hold is a trainmem::Error, not std::bad_alloc.
  static std::vector<double> values(std::int64_t count, const char* who) {
    detail::check(count >= 0, "nn::Init::", who, ": count must be >= 0, got ", count);
    try {
      return std::vector<double>(static_cast<std::size_t>(count));
    } catch (const std::bad_alloc&) {
      throw Error(detail::concat("nn::Init::", who, ": cannot allocate ", count, " initial values on the host"));
    } catch (const std::length_error&) {
      throw Error(detail::concat("nn::Init::", who, ": ", count, " initial values exceed what a vector holds"));
    }
  }
  /// A fresh stream per tensor: key = hash of (seed, stream id).
  RngState next() { return RngState{seed_ * 0x9E3779B97F4A7C15ull + stream_++, 0}; }
  std::uint64_t seed_;
  std::uint64_t stream_ = 0;
};

}  // namespace trainmem::nn
