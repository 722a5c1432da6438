// tests/core/test_float8.cpp — the FP8 conversions (core/float8.hpp) against the OCP spec.
//
// The reference here shares no code with the header: each format is decoded from its
// definition in double (ldexp of the fields), and narrowing picks, by brute force over
// all 256 codes, the finite value nearest to the input, ties to the even code, then
// applies the saturating rule (NOTE [FP8 conversion rule]: |x| beyond max and ±inf give
// ±max, NaN gives NaN, the sign is kept, zero included). Inputs: every code's value,
// every f32 within 8 ulps of every midpoint between neighbouring values (ties at every
// binade, subnormals, the midpoint below the smallest subnormal, the saturation
// boundary), hand-picked boundary values, 2^20 random f32 bit patterns and 2^20 random
// f32 values across each format's range; double inputs next to midpoints (where rounding
// through f32 to nearest would round twice).
#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "trainmem/core/dtype.hpp"
#include "trainmem/core/float8.hpp"

using trainmem::Float8E4M3;
using trainmem::Float8E5M2;

// A named namespace: the core tests compile as one translation unit.
namespace fp8_conversion {

/// One format's definition, written from the OCP spec's tables.
struct Fp8Spec {
  int exponent_bits;
  int mantissa_bits;
  int bias;
  bool ieee_specials;  // E5M2: exponent all ones is inf (mantissa 0) or NaN
  double max;
};
constexpr Fp8Spec kE4M3{4, 3, 7, false, 448.0};
constexpr Fp8Spec kE5M2{5, 2, 15, true, 57344.0};

bool spec_is_nan(const Fp8Spec& f, unsigned code) {
  const unsigned e = (code >> f.mantissa_bits) & ((1u << f.exponent_bits) - 1u);
  const unsigned m = code & ((1u << f.mantissa_bits) - 1u);
  if (f.ieee_specials) return e == (1u << f.exponent_bits) - 1u && m != 0;
  return e == (1u << f.exponent_bits) - 1u && m == (1u << f.mantissa_bits) - 1u;
}
bool spec_is_inf(const Fp8Spec& f, unsigned code) {
  const unsigned e = (code >> f.mantissa_bits) & ((1u << f.exponent_bits) - 1u);
  const unsigned m = code & ((1u << f.mantissa_bits) - 1u);
  return f.ieee_specials && e == (1u << f.exponent_bits) - 1u && m == 0;
}
/// The value of `code` from the definition: (-1)^s 2^(e - bias) (1 + m / 2^M), or 2^(1 - bias) (m / 2^M).
double spec_decode(const Fp8Spec& f, unsigned code) {
  const double sign = (code & 0x80u) ? -1.0 : 1.0;
  if (spec_is_nan(f, code)) return std::numeric_limits<double>::quiet_NaN();
  if (spec_is_inf(f, code)) return sign * std::numeric_limits<double>::infinity();
  const int e = static_cast<int>((code >> f.mantissa_bits) & ((1u << f.exponent_bits) - 1u));
  const double m = static_cast<double>(code & ((1u << f.mantissa_bits) - 1u)) / (1 << f.mantissa_bits);
  if (e == 0) return sign * std::ldexp(m, 1 - f.bias);
  return sign * std::ldexp(1.0 + m, e - f.bias);
}

/// The finite non-negative codes in increasing order of value (0x00 up to max).
std::vector<unsigned> finite_positive_codes(const Fp8Spec& f) {
  std::vector<unsigned> codes;
  for (unsigned c = 0; c < 0x80; ++c)
    if (!spec_is_nan(f, c) && !spec_is_inf(f, c)) codes.push_back(c);
  return codes;
}

struct CodeValue {
  unsigned code;
  double value;
};
/// finite_positive_codes with their values, built once per format.
const std::vector<CodeValue>& value_table(const Fp8Spec& f) {
  static std::vector<CodeValue> tables[2];
  std::vector<CodeValue>& table = tables[f.ieee_specials ? 1 : 0];
  if (table.empty())
    for (unsigned c : finite_positive_codes(f)) table.push_back({c, spec_decode(f, c)});
  return table;
}

/// The reference narrowing: nearest finite value by brute force, ties to the even code;
/// then saturation; NaN -> a NaN (checked by the caller); the sign of x on the result.
/// (The distances are exact in double wherever two of them can be close.)
unsigned reference_encode(const Fp8Spec& f, double x) {
  const unsigned sign = std::signbit(x) ? 0x80u : 0u;
  const double a = std::fabs(x);
  const std::vector<CodeValue>& table = value_table(f);
  if (std::isinf(a) || a > f.max) return sign | table.back().code;
  unsigned best = 0;
  double best_distance = std::numeric_limits<double>::infinity();
  for (const auto& [c, value] : table) {
    const double d = std::fabs(value - a);
    if (d < best_distance || (d == best_distance && (c & 1u) == 0)) {
      best = c;
      best_distance = d;
    }
  }
  return sign | best;
}

template <class F>
unsigned encode(float x) {
  return F(x).bits;
}
template <class F>
double decode(unsigned code) {
  return static_cast<double>(static_cast<float>(F::from_bits(static_cast<std::uint8_t>(code))));
}

/// Checks `F(x)` against the reference for x and its negation; NaN inputs give a NaN code.
template <class F>
void check_narrowing(const Fp8Spec& f, float x, std::int64_t& mismatches) {
  for (float v : {x, -x}) {
    const unsigned got = encode<F>(v);
    const bool ok = std::isnan(v) ? spec_is_nan(f, got) : got == reference_encode(f, v);
    if (!ok && mismatches++ < 8) {
      INFO("input " << v << " (bits 0x" << std::hex << std::bit_cast<std::uint32_t>(v) << ") gave 0x" << got
                    << ", the reference 0x" << reference_encode(f, v));
      CHECK(ok);
    }
  }
}

/// Every f32 within `ulps` of each midpoint between neighbouring finite values, of the
/// midpoint between max and the next value the exponent would give (max + ulp/2), and
/// of each value itself.
std::vector<float> boundary_inputs(const Fp8Spec& f, int ulps) {
  const std::vector<unsigned> codes = finite_positive_codes(f);
  std::vector<double> centres;
  for (std::size_t i = 0; i < codes.size(); ++i) {
    const double v = spec_decode(f, codes[i]);
    centres.push_back(v);
    if (i + 1 < codes.size()) centres.push_back((v + spec_decode(f, codes[i + 1])) / 2);
  }
  const double top_ulp = std::ldexp(1.0, static_cast<int>(std::floor(std::log2(f.max))) - f.mantissa_bits);
  centres.push_back(f.max + top_ulp / 2);  // the saturation boundary under round to nearest
  centres.push_back(f.max + top_ulp);
  std::vector<float> inputs;
  for (double c : centres) {
    const auto centre = static_cast<float>(c);
    REQUIRE(static_cast<double>(centre) == c);  // every midpoint is an f32
    float up = centre, down = centre;
    inputs.push_back(centre);
    for (int k = 0; k < ulps; ++k) {
      up = std::nextafter(up, std::numeric_limits<float>::infinity());
      down = std::nextafter(down, 0.0f);
      inputs.push_back(up);
      inputs.push_back(down);
    }
  }
  return inputs;
}

template <class F>
void check_all(const Fp8Spec& f) {
  std::int64_t mismatches = 0;
  SECTION("every code widens to its defined value and narrows back to itself") {
    for (unsigned code = 0; code < 256; ++code) {
      const double expected = spec_decode(f, code);
      const double got = decode<F>(code);
      INFO("code 0x" << std::hex << code);
      if (std::isnan(expected)) {
        CHECK(std::isnan(got));
        CHECK(spec_is_nan(f, encode<F>(static_cast<float>(got))));
        continue;
      }
      CHECK(got == expected);
      CHECK(std::signbit(got) == ((code & 0x80u) != 0));  // -0 widens to -0
      if (spec_is_inf(f, code)) continue;                 // ±inf saturates: checked below
      CHECK(encode<F>(static_cast<float>(got)) == code);
    }
  }
  SECTION("every f32 near every midpoint, value and the saturation boundary") {
    for (float x : boundary_inputs(f, 8)) check_narrowing<F>(f, x, mismatches);
    CHECK(mismatches == 0);
  }
  SECTION("zeros, specials, tiny and huge values") {
    const double min_sub = std::ldexp(1.0, 1 - f.bias - f.mantissa_bits);
    for (double x : {0.0, min_sub / 2, min_sub / 4, min_sub * 0.75, min_sub * 1.5, min_sub * 2.5, f.max * 2, 1e30,
                     static_cast<double>(std::numeric_limits<float>::max()),
                     static_cast<double>(std::numeric_limits<float>::min()),
                     static_cast<double>(std::numeric_limits<float>::denorm_min()),
                     std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()})
      check_narrowing<F>(f, static_cast<float>(x), mismatches);
    CHECK(mismatches == 0);
  }
  SECTION("2^20 random f32 bit patterns and 2^20 random values across the range") {
    std::mt19937_64 gen(52);
    for (int i = 0; i < (1 << 20); ++i)
      check_narrowing<F>(f, std::bit_cast<float>(static_cast<std::uint32_t>(gen())), mismatches);
    std::uniform_real_distribution<double> log_magnitude(std::log2(f.max) - 40, std::log2(f.max) + 2);
    for (int i = 0; i < (1 << 20); ++i)
      check_narrowing<F>(f, static_cast<float>(std::exp2(log_magnitude(gen))), mismatches);
    CHECK(mismatches == 0);
  }
  SECTION("double inputs round once (no double rounding through f32)") {
    // A double just above or below a midpoint: rounding it to the nearest f32 first would
    // land on the midpoint and tie to even, the wrong way half the time.
    for (float m : boundary_inputs(f, 0)) {
      const double centre = m;
      for (double x : {std::nextafter(centre, 0.0), std::nextafter(centre, 1e300), centre}) {
        for (double v : {x, -x}) {
          const unsigned got = trainmem::detail::narrow<F>(v).bits;
          if (got != reference_encode(f, v) && mismatches++ < 8) {
            INFO("double input " << v << " gave 0x" << std::hex << got << ", the reference 0x"
                                 << reference_encode(f, v));
            CHECK(false);
          }
        }
      }
    }
    for (double v : {1e300, -1e300, std::numeric_limits<double>::infinity(), 1e-300})
      CHECK(trainmem::detail::narrow<F>(v).bits == reference_encode(f, v));
    CHECK(mismatches == 0);
  }
}

}  // namespace fp8_conversion

TEST_CASE("Float8E4M3: every code, every rounding boundary, saturation", "[core][fp8]") {
  fp8_conversion::check_all<Float8E4M3>(fp8_conversion::kE4M3);
}
TEST_CASE("Float8E5M2: every code, every rounding boundary, saturation", "[core][fp8]") {
  fp8_conversion::check_all<Float8E5M2>(fp8_conversion::kE5M2);
}

TEST_CASE("FP8 conversions: the spec's values worked out by hand", "[core][fp8]") {
  const float inf = std::numeric_limits<float>::infinity();
  // E4M3: S.EEEE.MMM, bias 7.
  CHECK(Float8E4M3(1.0f).bits == 0x38);
  CHECK(Float8E4M3(-2.0f).bits == 0xC0);
  CHECK(Float8E4M3(448.0f).bits == 0x7E);  // max: 1.110b * 2^8
  CHECK(Float8E4M3(464.0f).bits == 0x7E);  // max + ulp/2 ties to the even max
  CHECK(Float8E4M3(465.0f).bits == 0x7E);  // would round to 480 (the NaN code): saturates
  CHECK(Float8E4M3(1e6f).bits == 0x7E);
  CHECK(Float8E4M3(inf).bits == 0x7E);  // no inf in E4M3: saturates (__NV_SATFINITE)
  CHECK(Float8E4M3(-inf).bits == 0xFE);
  CHECK(Float8E4M3(std::ldexp(1.0f, -9)).bits == 0x01);   // smallest subnormal
  CHECK(Float8E4M3(std::ldexp(1.0f, -10)).bits == 0x00);  // half of it ties to even zero
  CHECK(Float8E4M3(std::nextafter(std::ldexp(1.0f, -10), 1.0f)).bits == 0x01);
  CHECK(Float8E4M3(-std::ldexp(1.0f, -11)).bits == 0x80);  // negative underflow keeps the sign
  CHECK(Float8E4M3(std::ldexp(3.0f, -10)).bits == 0x02);   // 1.5 * 2^-9 ties to even 2 * 2^-9
  CHECK(Float8E4M3(std::ldexp(15.0f, -10)).bits == 0x08);  // 7.5 * 2^-9 rounds up into the smallest normal
  CHECK(Float8E4M3(std::nanf("")).bits == 0x7F);
  CHECK(Float8E4M3(-std::nanf("")).bits == 0xFF);
  CHECK(static_cast<float>(Float8E4M3::from_bits(0x7E)) == Float8E4M3::max);
  // E5M2: S.EEEEE.MM, bias 15.
  CHECK(Float8E5M2(1.0f).bits == 0x3C);
  CHECK(Float8E5M2(57344.0f).bits == 0x7B);  // max: 1.11b * 2^15
  CHECK(Float8E5M2(61440.0f).bits == 0x7B);  // max + ulp/2 ties to inf's code: saturates
  CHECK(Float8E5M2(inf).bits == 0x7B);       // saturating mode: inf -> max (__NV_SATFINITE)
  CHECK(Float8E5M2(-inf).bits == 0xFB);
  CHECK(Float8E5M2(std::ldexp(1.0f, -16)).bits == 0x01);
  CHECK(Float8E5M2(std::ldexp(1.0f, -17)).bits == 0x00);
  CHECK(Float8E5M2(std::nanf("")).bits == 0x7E);
  CHECK(std::isinf(static_cast<float>(Float8E5M2::from_bits(0x7C))));
  CHECK(std::isnan(static_cast<float>(Float8E5M2::from_bits(0x7D))));
  CHECK(static_cast<float>(Float8E5M2::from_bits(0x7B)) == Float8E5M2::max);
}

TEST_CASE("FP8 dtypes: size, names, traits", "[core][fp8]") {
  using trainmem::DType;
  CHECK(trainmem::size_of(DType::F8E4M3) == 1);
  CHECK(trainmem::size_of(DType::F8E5M2) == 1);
  CHECK(trainmem::name_of(DType::F8E4M3) == "f8e4m3");
  CHECK(trainmem::name_of(DType::F8E5M2) == "f8e5m2");
  CHECK(trainmem::is_fp8(DType::F8E4M3));
  CHECK(trainmem::is_fp8(DType::F8E5M2));
  CHECK_FALSE(trainmem::is_fp8(DType::BF16));
  CHECK_FALSE(trainmem::is_16bit(DType::F8E4M3));
  CHECK(trainmem::dtype_of<Float8E4M3>() == DType::F8E4M3);
  CHECK(trainmem::widest(DType::F8E4M3, DType::BF16) == DType::BF16);
  CHECK(trainmem::widest(DType::F8E4M3, DType::F8E5M2) == DType::F16);
  CHECK(trainmem::accumulator_dtype(DType::F8E5M2) == DType::F32);
}
