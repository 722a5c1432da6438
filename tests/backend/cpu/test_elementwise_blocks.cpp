// tests/backend/cpu/test_elementwise_blocks.cpp — element-wise maps run in accumulator
// blocks with run-time dtypes (NOTE [Element-wise maps in blocks] in
// backend/cpu/kernels/elementwise.hpp); their results must be bitwise those of the
// element-by-element formula narrow<out>(op(widen(a), widen(b))) in the accumulator type
// (float, or double with an f64 operand), which the test computes with the scalar
// conversions of core/, for dtype mixes of both accumulators, every way b broadcasts,
// lengths that are not a multiple of the block, lengths that split over threads, and in place.
#include <bit>
#include <catch2/catch.hpp>
#include <cstdint>
#include <iterator>
#include <limits>
#include <type_traits>
#include <vector>

#include "test_data.hpp"
#include "trainmem/backend/cpu/kernels/elementwise.hpp"
#include "trainmem/core/math.hpp"

namespace {

namespace kernels = trainmem::cpu::kernels;
using trainmem::AxisView;
using trainmem::BFloat16;
using trainmem::Half;

template <class T>
std::vector<T> random_values(std::size_t n, std::uint64_t seed) {
  trainmem::testing::SplitMix64 rng(seed);
  std::vector<T> v(n);
  for (auto& x : v) x = trainmem::detail::narrow<T>(rng.uniform() * 8.0 - 4.0);
  return v;
}

template <class T>
std::uint64_t bits(T v) {
  if constexpr (std::is_same_v<T, float>) return std::bit_cast<std::uint32_t>(v);
  else if constexpr (std::is_same_v<T, double>) return std::bit_cast<std::uint64_t>(v);
  else return v.bits;
}

template <class Acc, class T>
Acc wide(T v) {
  return static_cast<Acc>(trainmem::detail::widen(v));
}

template <class T>
kernels::Operand operand(const std::vector<T>& v) {
  return {v.data(), trainmem::dtype_of<T>()};
}
template <class T>
kernels::Result result(std::vector<T>& v) {
  return {v.data(), trainmem::dtype_of<T>()};
}

/// Elements of `out` whose bits differ from `expected`.
template <class T>
int differing(const std::vector<T>& out, const std::vector<T>& expected) {
  int n = 0;
  for (std::size_t i = 0; i < out.size(); ++i) n += bits(out[i]) != bits(expected[i]);
  return n;
}

template <class TA, class TB, class TOut>
void check_binary(const AxisView& view) {
  using Acc = trainmem::AccumulatorFor<TA, TB, TOut>;
  const trainmem::math::GeluTanhBackward op;
  const std::int64_t n = view.numel(), nb = n / view.extent;
  const auto a = random_values<TA>(static_cast<std::size_t>(n), 1);
  const auto b = random_values<TB>(static_cast<std::size_t>(nb), 2);
  std::vector<TOut> out(static_cast<std::size_t>(n)), expected(out.size());
  for (std::int64_t o = 0; o < view.outer; ++o)
    for (std::int64_t e = 0; e < view.extent; ++e)
      for (std::int64_t i = 0; i < view.inner; ++i) {
        const std::int64_t k = (o * view.extent + e) * view.inner + i;
        expected[k] = trainmem::detail::narrow<TOut>(op(wide<Acc>(a[k]), wide<Acc>(b[o * view.inner + i])));
      }
  kernels::map_binary(op, operand(a), operand(b), result(out), view);
  CHECK(differing(out, expected) == 0);
}

}  // namespace

TEST_CASE("16-bit element-wise maps give the element-by-element bits", "[backend][cpu][elementwise]") {
  const trainmem::math::GeluTanh gelu;
  // 1, under a block, several blocks with a tail, and enough to split over threads.
  const std::int64_t lengths[] = {1, 255, 4099, 70001};
  SECTION("unary, each dtype mix") {
    for (const std::int64_t n : lengths) {
      INFO("n = " << n);
      auto check = [&]<class TIn, class TOut>() {
        using Acc = trainmem::AccumulatorFor<TIn, TOut>;
        const auto in = random_values<TIn>(static_cast<std::size_t>(n), 3);
        std::vector<TOut> out(in.size()), expected(in.size());
        for (std::size_t i = 0; i < in.size(); ++i)
          expected[i] = trainmem::detail::narrow<TOut>(gelu(wide<Acc>(in[i])));
        kernels::map_unary(gelu, operand(in), result(out), n);
        CHECK(differing(out, expected) == 0);
      };
      check.operator()<Half, Half>();
      check.operator()<BFloat16, BFloat16>();
      check.operator()<Half, float>();
      check.operator()<float, Half>();
      check.operator()<BFloat16, Half>();
      check.operator()<float, float>();
      check.operator()<Half, double>();  // double accumulators
      check.operator()<double, BFloat16>();
      check.operator()<double, float>();
    }
  }
  SECTION("casts, each dtype pair, with NaN, infinities, subnormals and ties") {
    const trainmem::math::Identity identity;
    for (const std::int64_t n : lengths) {
      INFO("n = " << n);
      auto check = [&]<class TIn, class TOut>() {
        auto in = random_values<TIn>(static_cast<std::size_t>(n), 5);
        const double specials[] = {std::numeric_limits<double>::quiet_NaN(),
                                   std::numeric_limits<double>::infinity(),
                                   -std::numeric_limits<double>::infinity(),
                                   1e-40,
                                   -3e-39,
                                   1.00390625,
                                   65520.0,
                                   -0.0};
        for (std::size_t i = 0; i < std::size(specials) && i < in.size(); ++i)
          in[in.size() - 1 - i] = trainmem::detail::narrow<TIn>(specials[i]);
        std::vector<TOut> out(in.size()), expected(in.size());
        for (std::size_t i = 0; i < in.size(); ++i)
          expected[i] = trainmem::detail::narrow<TOut>(trainmem::detail::widen(in[i]));
        kernels::map_unary(identity, operand(in), result(out), n);
        CHECK(differing(out, expected) == 0);
      };
      check.operator()<float, BFloat16>();  // the converters' pairs
      check.operator()<BFloat16, float>();
      check.operator()<float, Half>();
      check.operator()<Half, float>();
      check.operator()<BFloat16, Half>();  // the block path's
      check.operator()<double, BFloat16>();
      check.operator()<float, double>();
    }
  }
  SECTION("two results: GELU's backward and value in one pass, each dtype mix, and over dy's storage") {
    for (const std::int64_t n : lengths) {
      INFO("n = " << n);
      auto check = [&]<class TD, class TX>(bool in_place, bool exact) {
        using Acc = trainmem::AccumulatorFor<TD, TX>;
        auto dy = random_values<TD>(static_cast<std::size_t>(n), 6);
        const auto x = random_values<TX>(static_cast<std::size_t>(n), 7);
        std::vector<TD> dx(dy.size()), want_dx(dy.size());
        std::vector<TX> y(x.size()), want_y(x.size());
        for (std::size_t i = 0; i < x.size(); ++i) {
          const Acc d = wide<Acc>(dy[i]), v = wide<Acc>(x[i]);
          want_dx[i] = trainmem::detail::narrow<TD>(exact ? trainmem::math::GeluErfBackward{}(d, v)
                                                          : trainmem::math::GeluTanhBackward{}(d, v));
          want_y[i] = trainmem::detail::narrow<TX>(exact ? trainmem::math::GeluErf{}(v) : gelu(v));
        }
        std::vector<TD>& dx_out = in_place ? dy : dx;
        if (exact)
          kernels::map_binary_pair(trainmem::math::GeluErfBackwardAndValue{}, operand(dy), operand(x), result(dx_out),
                                   result(y), n);
        else
          kernels::map_binary_pair(trainmem::math::GeluTanhBackwardAndValue{}, operand(dy), operand(x), result(dx_out),
                                   result(y), n);
        CHECK(differing(dx_out, want_dx) == 0);
        CHECK(differing(y, want_y) == 0);
      };
      for (const bool in_place : {false, true})
        for (const bool exact : {false, true}) {
          INFO("in place " << in_place << ", erf " << exact);
          check.operator()<BFloat16, BFloat16>(in_place, exact);
          check.operator()<float, float>(in_place, exact);
          check.operator()<Half, Half>(in_place, exact);
          check.operator()<double, double>(in_place, exact);
          check.operator()<float, BFloat16>(in_place, exact);
        }
    }
  }
  SECTION("unary in place") {
    for (const std::int64_t n : lengths) {
      INFO("n = " << n);
      auto x = random_values<Half>(static_cast<std::size_t>(n), 4);
      std::vector<Half> expected(x.size());
      for (std::size_t i = 0; i < x.size(); ++i) expected[i] = Half(gelu(wide<float>(x[i])));
      kernels::map_unary(gelu, operand(x), result(x), n);
      CHECK(differing(x, expected) == 0);
    }
  }
  SECTION("binary: same shape, scalar, rows, columns") {
    for (const std::int64_t n : lengths) {
      // AxisView{outer, extent, inner}: a is [outer, extent, inner], b is [outer, inner].
      const std::int64_t cols = 37, rows = (n + cols - 1) / cols;
      for (const AxisView view :
           {AxisView{1, 1, n}, AxisView{1, n, 1}, AxisView{2, rows, cols}, AxisView{rows, cols, 1}}) {
        INFO("view " << view.outer << " x " << view.extent << " x " << view.inner);
        check_binary<Half, Half, Half>(view);
        check_binary<BFloat16, BFloat16, BFloat16>(view);
        check_binary<Half, float, Half>(view);
        check_binary<float, Half, float>(view);
        check_binary<BFloat16, float, Half>(view);
        check_binary<float, float, float>(view);
        check_binary<double, Half, Half>(view);  // double accumulators
        check_binary<BFloat16, double, float>(view);
        check_binary<float, BFloat16, double>(view);
      }
    }
  }
}
