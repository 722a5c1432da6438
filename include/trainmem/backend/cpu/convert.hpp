// trainmem/backend/cpu/convert.hpp — bulk widening and narrowing of 16-bit storage.
//
// The scalar Half/BFloat16 conversions are the reference; these loops give the same
// bits, 16 (AVX-512) or 8 (AVX2/F16C) at a time, and use the scalar functions for the
// tail. bfloat16 widening is a 16-bit shift; bfloat16 narrowing is the scalar
// round-to-nearest-even integer formula, lane-wise (not vcvtneps2bf16, which flushes
// subnormals). Half uses the F16C/AVX-512 conversions, which round to nearest even.
// The loops are written with intrinsics because GCC's -O2 cost model does not
// vectorise a loop whose trip count needs a scalar epilogue; which of them runs is the
// CPU's choice at run time (NOTE [Vector paths chosen at run time], simd.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "trainmem/backend/cpu/simd.hpp"
#include "trainmem/core/dtype.hpp"

namespace trainmem::cpu::kernels {

namespace convert_impl {

// Each vector form converts the longest prefix of whole vectors and returns its length.
#if defined(TRAINMEM_SIMD_DISPATCH)
TRAINMEM_SIMD_BEGIN
TRAINMEM_TARGET_AVX512 inline std::size_t widen_avx512(const BFloat16* src, float* dst, std::size_t n) {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    _mm512_storeu_si512(dst + i, _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  return i;
}
TRAINMEM_TARGET_AVX2 inline std::size_t widen_avx2(const BFloat16* src, float* dst, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  return i;
}
TRAINMEM_TARGET_AVX512 inline std::size_t widen_avx512(const Half* src, float* dst, std::size_t n) {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i))));
  return i;
}
TRAINMEM_TARGET_AVX2 inline std::size_t widen_avx2(const Half* src, float* dst, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  return i;
}

// bits = NaN ? (x >> 16) | 0x40 : (x + 0x7fff + ((x >> 16) & 1)) >> 16, as BFloat16::from_float.
TRAINMEM_TARGET_AVX512 inline std::size_t narrow_avx512(const float* src, BFloat16* dst, std::size_t n) {
  const __m512i one = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7fff), quiet = _mm512_set1_epi32(0x40);
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i x = _mm512_loadu_si512(src + i);
    const __m512i high = _mm512_srli_epi32(x, 16);
    const __m512i rounded =
        _mm512_srli_epi32(_mm512_add_epi32(x, _mm512_add_epi32(bias, _mm512_and_si512(high, one))), 16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(x, abs_mask), inf);
    const __m512i bits = _mm512_mask_blend_epi32(nan, rounded, _mm512_or_si512(high, quiet));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm512_cvtepi32_epi16(bits));
  }
  return i;
}
TRAINMEM_TARGET_AVX2 inline std::size_t narrow_avx2(const float* src, BFloat16* dst, std::size_t n) {
  const __m256i one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff), quiet = _mm256_set1_epi32(0x40);
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    const __m256i high = _mm256_srli_epi32(x, 16);
    const __m256i rounded =
        _mm256_srli_epi32(_mm256_add_epi32(x, _mm256_add_epi32(bias, _mm256_and_si256(high, one))), 16);
    // |x| and inf are non-negative as int32, so the signed compare is the unsigned one.
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, abs_mask), inf);
    const __m256i bits = _mm256_blendv_epi8(rounded, _mm256_or_si256(high, quiet), nan);
    // Every lane is <= 0xffff, so the saturating pack is exact; it packs per 128-bit half.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(bits, bits), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm256_castsi256_si128(packed));
  }
  return i;
}
TRAINMEM_TARGET_AVX512 inline std::size_t narrow_avx512(const float* src, Half* dst, std::size_t n) {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                        _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  return i;
}
TRAINMEM_TARGET_AVX2 inline std::size_t narrow_avx2(const float* src, Half* dst, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  return i;
}
TRAINMEM_SIMD_END
#endif

}  // namespace convert_impl

template <class T>
void widen_to_float(const T* src, float* dst, std::size_t n) {
  std::size_t i = 0;
  if constexpr (std::is_same_v<T, BFloat16> || std::is_same_v<T, Half>) {
#if defined(TRAINMEM_SIMD_DISPATCH)
    const SimdLevel level = simd_level();
    if (level >= SimdLevel::Avx512) i = convert_impl::widen_avx512(src, dst, n);
    if (level >= SimdLevel::Avx2) i += convert_impl::widen_avx2(src + i, dst + i, n - i);
#endif
    for (; i < n; ++i) dst[i] = T::to_float(src[i].bits);
  } else {
    for (; i < n; ++i) dst[i] = static_cast<float>(src[i]);
  }
}

template <class T>
void narrow_from_float(const float* src, T* dst, std::size_t n) {
  std::size_t i = 0;
  if constexpr (std::is_same_v<T, BFloat16> || std::is_same_v<T, Half>) {
#if defined(TRAINMEM_SIMD_DISPATCH)
    const SimdLevel level = simd_level();
    if (level >= SimdLevel::Avx512) i = convert_impl::narrow_avx512(src, dst, n);
    if (level >= SimdLevel::Avx2) i += convert_impl::narrow_avx2(src + i, dst + i, n - i);
#endif
    for (; i < n; ++i) dst[i].bits = T::from_float(src[i]);
  } else {
    for (; i < n; ++i) dst[i] = static_cast<T>(src[i]);
  }
}

}  // namespace trainmem::cpu::kernels
