// tests/backend/cpu/test_fp8_kernels.cpp — the CPU's FP8 kernels (HasFp8) against independent references.
//
// quantize_fp8: with scales that make x * scale exact in f32 (powers of two, and 3 or 0.75
// on bf16 values), each code must be the scalar conversion's (core/float8.hpp, checked
// exhaustively in tests/core/test_float8.cpp) of that product; amax is the test's own
// maximum of |x|, and inf or NaN anywhere (also in the last of several chunks) must show in
// it while the codes saturate. dequantize_fp8: every code times scale_inv, the exact
// double product rounded by the test's own round-to-nearest-even at the destination's
// precision. gemm_fp8: an F64 reference of the decoded FP8 values (alpha, both scale
// inverses, beta C in F64). The kernel sums in f32 and applies the f32 factor f = alpha
// a_scale_inv b_scale_inv: its error is at most (k + 4) 2^-24 |f| sum|a||b| (f32
// accumulation in any order, the factor's two roundings, its product) plus 3 2^-24
// |beta c| plus one rounding of C, 2^-p |ref|. Sums of small integers are exact in f32,
// so there C must equal the reference exactly. Both f32 GEMM paths (Eigen, oneDNN) run.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "error_matchers.hpp"
#include "trainmem/trainmem.hpp"

namespace fp8_kernels_test {
namespace tm = trainmem;
using B = tm::cpu::Backend;
using T = tm::Tensor<B>;
using tm::DType;

/// A tensor holding exactly these FP8 codes.
T from_codes(const std::vector<std::uint8_t>& codes, tm::Shape shape, DType dtype) {
  T t = T::empty(std::move(shape), dtype);
  if (!codes.empty()) t.backend().upload(t.data(), codes.data(), codes.size());
  return t;
}
std::vector<std::uint8_t> codes_of(const T& t) {
  std::vector<std::uint8_t> out(t.bytes());
  if (!out.empty()) t.backend().download(out.data(), t.data(), t.bytes());
  return out;
}
T scalar(float value) { return T::from_host(tm::Shape{1}, std::vector<float>{value}); }

/// The value of an FP8 code from the format's definition (finite codes only).
double decode(std::uint8_t code, DType dtype) {
  const bool e4m3 = dtype == DType::F8E4M3;
  const int mantissa_bits = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15;
  const int e = (code & 0x7f) >> mantissa_bits;
  const double m = (code & ((1 << mantissa_bits) - 1)) / static_cast<double>(1 << mantissa_bits);
  const double magnitude = e == 0 ? std::ldexp(m, 1 - bias) : std::ldexp(1.0 + m, e - bias);
  return (code & 0x80) ? -magnitude : magnitude;
}
bool finite_code(std::uint8_t code, DType dtype) {
  return dtype == DType::F8E4M3 ? (code & 0x7f) != 0x7f : (code & 0x7f) < 0x7c;
}

/// x rounded to nearest even with `mantissa_bits` stored bits, exponents down to min_exponent
/// (subnormal spacing below), to inf at or beyond `overflow` (the midpoint above max).
double round_to_format(double x, int mantissa_bits, int min_exponent, double overflow) {
  if (x == 0 || std::isnan(x)) return x;
  if (std::fabs(x) >= overflow) return std::copysign(std::numeric_limits<double>::infinity(), x);
  const int e = std::max(static_cast<int>(std::floor(std::log2(std::fabs(x)))), min_exponent);
  const double quantum = std::ldexp(1.0, e - mantissa_bits);
  return std::nearbyint(x / quantum) * quantum;  // the default rounding mode: to nearest even
}
double round_to(double x, DType dtype) {
  switch (dtype) {
    case DType::BF16: return round_to_format(x, 7, -126, std::ldexp(511.0, 119));
    case DType::F16: return round_to_format(x, 10, -14, 65520.0);
    default: return round_to_format(x, 23, -126, std::ldexp(double((1 << 25) - 1), 103));
  }
}
double unit_roundoff(DType dtype) {
  return dtype == DType::BF16 ? std::ldexp(1.0, -8) : dtype == DType::F16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -24);
}

template <class F8>
std::uint8_t scalar_code(float x) {
  return F8(x).bits;
}
std::uint8_t scalar_code(float x, DType dtype) {
  return dtype == DType::F8E4M3 ? scalar_code<tm::Float8E4M3>(x) : scalar_code<tm::Float8E5M2>(x);
}

/// Forces an f32 GEMM path for one scope and restores the one before.
struct ForcedF32Path {
  explicit ForcedF32Path(tm::cpu::GemmPath path) { tm::cpu::force_gemm_path(path); }
  ~ForcedF32Path() { tm::cpu::force_gemm_path(before); }
  ForcedF32Path(const ForcedF32Path&) = delete;
  ForcedF32Path& operator=(const ForcedF32Path&) = delete;
  tm::cpu::GemmPath before = tm::cpu::forced_gemm_path();
};

/// Random finite codes whose magnitudes lie in [2^lo, 2^hi] (and some zeros / subnormals).
std::vector<std::uint8_t> random_codes(std::size_t n, DType dtype, std::mt19937& gen) {
  std::vector<std::uint8_t> out(n);
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& c : out) {
    do c = static_cast<std::uint8_t>(byte(gen));
    while (!finite_code(c, dtype) || std::fabs(decode(c, dtype)) > 64.0);
  }
  return out;
}

struct GemmCase {
  tm::GemmArgs args;
  DType a_dtype, b_dtype, c_dtype;
  float a_scale_inv, b_scale_inv;
};

/// Runs gemm_fp8 on random operands and checks every element of C against the F64 reference.
void check_gemm(const GemmCase& gc, std::mt19937& gen, bool integers = false) {
  const tm::GemmArgs& g = gc.args;
  const std::int64_t a_size = g.batch == 1 || g.stride_a > 0 ? (g.batch - 1) * g.stride_a + g.m * g.k : g.m * g.k;
  const std::int64_t b_size = g.batch == 1 || g.stride_b > 0 ? (g.batch - 1) * g.stride_b + g.k * g.n : g.k * g.n;
  const std::int64_t c_size = (g.batch - 1) * g.stride_c + g.m * g.n;
  std::vector<std::uint8_t> a_codes, b_codes;
  if (integers) {  // small integers: E4M3 holds 0..16 exactly, E5M2 0..8
    std::uniform_int_distribution<int> small(-8, 8);
    for (std::int64_t i = 0; i < a_size; ++i) a_codes.push_back(scalar_code(float(small(gen)), gc.a_dtype));
    for (std::int64_t i = 0; i < b_size; ++i) b_codes.push_back(scalar_code(float(small(gen)), gc.b_dtype));
  } else {
    a_codes = random_codes(static_cast<std::size_t>(a_size), gc.a_dtype, gen);
    b_codes = random_codes(static_cast<std::size_t>(b_size), gc.b_dtype, gen);
  }
  std::vector<double> c_before(static_cast<std::size_t>(c_size));
  std::uniform_real_distribution<double> uniform(-4.0, 4.0);
  for (double& v : c_before) v = integers ? std::round(uniform(gen)) : round_to(uniform(gen), gc.c_dtype);
  const T a = from_codes(a_codes, tm::Shape{a_size}, gc.a_dtype);
  const T b = from_codes(b_codes, tm::Shape{b_size}, gc.b_dtype);
  const T c = T::from_host(tm::Shape{c_size}, c_before, gc.c_dtype);
  B::default_instance().gemm_fp8(g, a, b, c, scalar(gc.a_scale_inv), scalar(gc.b_scale_inv));
  const std::vector<double> got = c.to_host<double>();

  const double u = std::ldexp(1.0, -24), u_c = unit_roundoff(gc.c_dtype);
  const double factor = g.alpha * gc.a_scale_inv * gc.b_scale_inv;
  std::int64_t bad = 0;
  for (std::int64_t e = 0; e < g.batch; ++e)
    for (std::int64_t i = 0; i < g.m; ++i)
      for (std::int64_t j = 0; j < g.n; ++j) {
        double sum = 0.0, magnitude = 0.0;
        for (std::int64_t p = 0; p < g.k; ++p) {
          const std::int64_t ai = e * g.stride_a + (g.trans_a ? p * g.m + i : i * g.k + p);
          const std::int64_t bi = e * g.stride_b + (g.trans_b ? j * g.k + p : p * g.n + j);
          const double prod = decode(a_codes[ai], gc.a_dtype) * decode(b_codes[bi], gc.b_dtype);
          sum += prod;
          magnitude += std::fabs(prod);
        }
        const std::size_t ci = static_cast<std::size_t>(e * g.stride_c + i * g.n + j);
        const double ref = factor * sum + g.beta * c_before[ci];
        const double tol = integers ? 0.0
                                    : u_c * std::fabs(ref) +
                                          1.01 * ((static_cast<double>(g.k) + 4) * u * std::fabs(factor) * magnitude +
                                                  3 * u * std::fabs(g.beta * c_before[ci]));
        const double err = std::fabs(got[ci] - ref);
        if (!(err <= tol) && bad++ < 5) {
          INFO("batch " << e << " C[" << i << ", " << j << "] = " << got[ci] << ", reference " << ref << ", error "
                        << err << " > bound " << tol);
          CHECK(false);
        }
      }
  CHECK(bad == 0);
}

}  // namespace fp8_kernels_test

TEST_CASE("quantize_fp8: codes are the scalar conversion of x * scale, amax of |x|", "[backend][cpu][fp8]") {
  using namespace fp8_kernels_test;
  B& be = B::default_instance();
  std::mt19937 gen(5201);
  std::normal_distribution<float> normal(0.0f, 30.0f);
  for (DType src_dtype : {DType::F32, DType::BF16, DType::F16})
    for (DType dst_dtype : {DType::F8E4M3, DType::F8E5M2})
      for (float scale : {1.0f, 0.25f, 64.0f, 3.0f, 0.75f}) {
        if (src_dtype == DType::F32 && (scale == 3.0f || scale == 0.75f))
          continue;  // x * scale exact only for 16-bit x
        std::vector<float> x(1000);
        for (float& v : x) v = normal(gen);
        x[3] = 0.0f;
        x[4] = -1e-6f;
        const T src = T::from_host(tm::Shape{10, 100}, x, src_dtype);
        const std::vector<float> stored = src.to_host();  // x as the source dtype holds it
        const T dst = T::empty(tm::Shape{10, 100}, dst_dtype);
        const T amax = scalar(5.0f);
        be.quantize_fp8(src, scalar(scale), dst, amax);
        const std::vector<std::uint8_t> codes = codes_of(dst);
        float expected_amax = 5.0f;
        std::int64_t bad = 0;
        for (std::size_t i = 0; i < stored.size(); ++i) {
          expected_amax = std::max(expected_amax, std::fabs(stored[i]));
          if (codes[i] != scalar_code(stored[i] * scale, dst_dtype) && bad++ < 3) {
            INFO(tm::name_of(src_dtype) << " -> " << tm::name_of(dst_dtype) << " scale " << scale << ": x " << stored[i]
                                        << " gave 0x" << std::hex << int(codes[i]));
            CHECK(false);
          }
        }
        CHECK(bad == 0);
        CHECK(amax.to_host()[0] == expected_amax);
      }
}

TEST_CASE("quantize_fp8: inf and NaN saturate or stay NaN, and show in amax", "[backend][cpu][fp8]") {
  using namespace fp8_kernels_test;
  B& be = B::default_instance();
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const std::int64_t n = 3 * (1 << 15) + 17;  // several chunks, threads when OpenMP has them
  for (DType dst_dtype : {DType::F8E4M3, DType::F8E5M2}) {
    const std::uint8_t max_code = dst_dtype == DType::F8E4M3 ? 0x7e : 0x7b;
    std::vector<float> x(static_cast<std::size_t>(n), 1.0f);
    x[n - 2] = -inf;
    const T with_inf = T::from_host(tm::Shape{n}, x);
    const T dst = T::empty(tm::Shape{n}, dst_dtype);
    const T amax = scalar(0.0f);
    be.quantize_fp8(with_inf, scalar(1.0f), dst, amax);
    CHECK(codes_of(dst)[static_cast<std::size_t>(n - 2)] == (0x80 | max_code));  // -inf saturates to -max
    CHECK(amax.to_host()[0] == inf);                                             // ... but amax says inf
    x[n - 1] = nan;
    be.quantize_fp8(T::from_host(tm::Shape{n}, x), scalar(1.0f), dst, amax);
    CHECK(std::isnan(amax.to_host()[0]));
    const std::uint8_t nan_code = codes_of(dst)[static_cast<std::size_t>(n - 1)];
    CHECK((dst_dtype == DType::F8E4M3 ? (nan_code & 0x7f) == 0x7f : (nan_code & 0x7f) > 0x7c));
    // A NaN amax stays NaN under finite data (max with NaN first).
    be.quantize_fp8(T::from_host(tm::Shape{3}, std::vector<float>{1, 2, 3}), scalar(1.0f),
                    T::empty(tm::Shape{3}, dst_dtype), amax);
    CHECK(std::isnan(amax.to_host()[0]));
    // An undefined amax records nothing; an overflowing scale saturates.
    const T small = T::empty(tm::Shape{2}, dst_dtype);
    be.quantize_fp8(T::from_host(tm::Shape{2}, std::vector<float>{1e30f, -1e30f}), scalar(1e10f), small, T());
    CHECK(codes_of(small) == std::vector<std::uint8_t>{max_code, static_cast<std::uint8_t>(0x80 | max_code)});
  }
}

TEST_CASE("dequantize_fp8: every code times scale_inv, rounded once", "[backend][cpu][fp8]") {
  using namespace fp8_kernels_test;
  B& be = B::default_instance();
  for (DType src_dtype : {DType::F8E4M3, DType::F8E5M2})
    for (DType dst_dtype : {DType::F32, DType::BF16, DType::F16})
      for (float scale_inv : {1.0f, 0.3f, 1.0f / 3.0f, 2.5e-3f}) {
        std::vector<std::uint8_t> codes;
        for (int c = 0; c < 256; ++c)
          if (finite_code(static_cast<std::uint8_t>(c), src_dtype)) codes.push_back(static_cast<std::uint8_t>(c));
        const auto count = static_cast<std::int64_t>(codes.size());
        const T dst = T::empty(tm::Shape{count}, dst_dtype);
        be.dequantize_fp8(from_codes(codes, tm::Shape{count}, src_dtype), scalar(scale_inv), dst);
        const std::vector<double> got = dst.to_host<double>();
        std::int64_t bad = 0;
        for (std::size_t i = 0; i < codes.size(); ++i) {
          const double expected = round_to(decode(codes[i], src_dtype) * double(scale_inv), dst_dtype);
          if (!(got[i] == expected) && bad++ < 3) {
            INFO(tm::name_of(src_dtype) << " code 0x" << std::hex << int(codes[i]) << std::dec << " * " << scale_inv
                                        << " -> " << tm::name_of(dst_dtype) << ": " << got[i] << ", expected "
                                        << expected);
            CHECK(false);
          }
        }
        CHECK(bad == 0);
      }
  // Non-finite codes widen to what they are: E5M2 inf stays inf, NaNs stay NaN.
  const T dst = T::empty(tm::Shape{3}, DType::F32);
  be.dequantize_fp8(from_codes({0x7c, 0xfc, 0x7e}, tm::Shape{3}, DType::F8E5M2), scalar(2.0f), dst);
  const std::vector<float> special = dst.to_host();
  CHECK(special[0] == std::numeric_limits<float>::infinity());
  CHECK(special[1] == -std::numeric_limits<float>::infinity());
  CHECK(std::isnan(special[2]));
}

TEST_CASE("gemm_fp8: F64 reference of the decoded values, f32 accumulation bound", "[backend][cpu][fp8]") {
  using namespace fp8_kernels_test;
  std::mt19937 gen(5202);
  std::vector<tm::cpu::GemmPath> paths{tm::cpu::GemmPath::Eigen};
  if (tm::cpu::kernels::kHaveOneDnn) paths.push_back(tm::cpu::GemmPath::OneDnn);
  for (tm::cpu::GemmPath path : paths) {
    const ForcedF32Path forced(path);
    for (bool trans_a : {false, true})
      for (bool trans_b : {false, true}) {
        INFO("path " << (path == tm::cpu::GemmPath::Eigen ? "eigen" : "onednn") << " trans_a " << trans_a << " trans_b "
                     << trans_b);
        tm::GemmArgs g{.m = 37, .n = 29, .k = 300, .trans_a = trans_a, .trans_b = trans_b, .alpha = 1.0};
        check_gemm({g, DType::F8E4M3, DType::F8E4M3, DType::F32, 0.125f, 3.0f}, gen);
        check_gemm({g, DType::F8E4M3, DType::F8E5M2, DType::BF16, 0.3f, 1.0f}, gen);
        check_gemm({g, DType::F8E5M2, DType::F8E4M3, DType::F16, 1.0f / 64, 0.7f}, gen);
        // Batched, B shared (stride 0) or not, alpha and beta, gaps between entries.
        tm::GemmArgs batched{.batch = 3,
                             .m = 20,
                             .n = 24,
                             .k = 48,
                             .trans_a = trans_a,
                             .trans_b = trans_b,
                             .stride_a = 20 * 48 + 5,
                             .stride_b = 0,
                             .stride_c = 20 * 24 + 3,
                             .alpha = -0.5,
                             .beta = 0.75};
        check_gemm({batched, DType::F8E4M3, DType::F8E4M3, DType::BF16, 2.0f, 0.01f}, gen);
        batched.stride_b = 48 * 24;
        check_gemm({batched, DType::F8E5M2, DType::F8E4M3, DType::F32, 0.5f, 0.5f}, gen);
        // Sums of small integers are exact in f32: C equals the reference exactly.
        tm::GemmArgs exact{.m = 16, .n = 16, .k = 256, .trans_a = trans_a, .trans_b = trans_b, .beta = 1.0};
        check_gemm({exact, DType::F8E4M3, DType::F8E5M2, DType::F32, 0.25f, 4.0f}, gen, true);
      }
  }
}

TEST_CASE("gemm_fp8: k = 0 gives beta C, and refused operands name the op", "[backend][cpu][fp8]") {
  using namespace fp8_kernels_test;
  B& be = B::default_instance();
  const T a = T::zeros(tm::Shape{4, 0}, DType::F8E4M3), b = T::zeros(tm::Shape{0, 3}, DType::F8E4M3);
  const T c = T::from_host(tm::Shape{4, 3}, std::vector<float>(12, 2.0f));
  be.gemm_fp8(tm::GemmArgs{.m = 4, .n = 3, .k = 0, .beta = 0.5}, a, b, c, scalar(1.0f), scalar(1.0f));
  CHECK(c.to_host() == std::vector<float>(12, 1.0f));
  const T e5 = T::zeros(tm::Shape{2, 2}, DType::F8E5M2);
  const T c2 = T::zeros(tm::Shape{2, 2}, DType::F32);
  const tm::GemmArgs g{.m = 2, .n = 2, .k = 2};
  CHECK_THROWS_MATCHES(be.gemm_fp8(g, e5, e5, c2, scalar(1.0f), scalar(1.0f)), tm::Error,
                       tm::testing::ErrorContains("gemm_fp8: A and B f8e4m3 x f8e4m3"));
  CHECK_THROWS_MATCHES(be.gemm_fp8(g, e5, T::zeros(tm::Shape{2, 2}, DType::F8E4M3),
                                   T::zeros(tm::Shape{2, 2}, DType::F64), scalar(1.0f), scalar(1.0f)),
                       tm::Error, tm::testing::ErrorContains("C f32, bf16 or f16"));
  CHECK_THROWS_MATCHES(be.gemm_fp8(tm::GemmArgs{.m = 3, .n = 2, .k = 2}, T::zeros(tm::Shape{2, 2}, DType::F8E4M3),
                                   T::zeros(tm::Shape{2, 2}, DType::F8E4M3), c2, scalar(1.0f), scalar(1.0f)),
                       tm::Error, tm::testing::ErrorContains("hold fewer elements"));
  CHECK_THROWS_MATCHES(
      be.quantize_fp8(c2, T::zeros(tm::Shape{2}, DType::F32), T::empty(tm::Shape{2, 2}, DType::F8E4M3), T()), tm::Error,
      tm::testing::ErrorContains("quantize_fp8: scale must be a one-element f32 tensor"));
  CHECK_THROWS_MATCHES(be.dequantize_fp8(c2, scalar(1.0f), T::empty(tm::Shape{2, 2}, DType::F32)), tm::Error,
                       tm::testing::ErrorContains("dequantize_fp8: src f8e4m3 or f8e5m2"));
}
