// tests/support/amp_reference.hpp — references the amp and autocast tests check the library against.
//
// Written from the definitions, not from the library: rounding to a given number of
// significant bits (what a 16-bit float stores), and raw bytes for bitwise comparisons.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "trainmem/trainmem.hpp"

namespace trainmem::testing {

/// `v` rounded to `bits` significant bits, ties to even (normal range): bf16 keeps 8
/// significant bits, f16 keeps 11.
inline double round_to_significant_bits(double v, int bits) {
  if (v == 0 || !std::isfinite(v)) return v;
  int exponent = 0;
  std::frexp(v, &exponent);  // |v| in [2^(exponent-1), 2^exponent)
  const double quantum = std::ldexp(1.0, exponent - bits);
  const double lower = std::floor(v / quantum), rest = v / quantum - lower;
  const double units = rest > 0.5 ? lower + 1 : rest < 0.5 ? lower : (std::fmod(lower, 2.0) == 0 ? lower : lower + 1);
  return units * quantum;
}

/// The bytes of a tensor (empty for an undefined one).
template <class B>
std::vector<unsigned char> bytes_of(const Tensor<B>& t) {
  std::vector<unsigned char> out(t.defined() ? t.bytes() : 0);
  if (t.defined()) t.backend().download(out.data(), t.data(), t.bytes());
  return out;
}

}  // namespace trainmem::testing
