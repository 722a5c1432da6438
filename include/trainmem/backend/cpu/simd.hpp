// trainmem/backend/cpu/simd.hpp — which vector instructions the CPU backend's hand-written
// loops use: the CPU decides when the program runs, not the flags it was compiled with.
//
// NOTE [Vector paths chosen at run time]
// A few loops are written with intrinsics because compilers do not vectorise them on
// their own: the bulk 16-bit conversions (convert.hpp) and AdamW's block of square roots
// (kernels/update.hpp). Each has an AVX-512 form, an AVX2 form and a portable form, and
// every form gives the portable form's bits. The vector forms are compiled with GCC/Clang
// target attributes, so a program built for baseline x86-64 (no -march) still runs the
// AVX-512 form on a CPU that has it, and one built with -march=native runs the form its
// CPU has at the moment it runs. simd_level() is the level in use: what the CPU reports
// (cpuid, with the operating system's consent to the wide registers), capped by
// TRAINMEM_CPU_SIMD=auto|avx512|avx2|scalar (read once) or by force_simd_level(), so a
// test runs every form a CPU has. Under nvcc (its front end cannot parse GCC's AVX-512
// FP16 intrinsic headers) and off x86, only the portable form exists.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "trainmem/error.hpp"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__)
#include <cpuid.h>
#include <immintrin.h>
#define TRAINMEM_SIMD_DISPATCH 1
#define TRAINMEM_TARGET_AVX512 __attribute__((target("avx512f")))
#define TRAINMEM_TARGET_AVX2 __attribute__((target("avx2,f16c")))
// GCC 12 reports its own AVX-512 intrinsics (`__m512 __Y = __Y;` in _mm512_undefined_ps)
// as maybe-uninitialized once they are inlined (GCC bug 105593); the vector forms stand
// between these two so that a user's -Wall stays quiet.
#if defined(__clang__)
#define TRAINMEM_SIMD_BEGIN
#define TRAINMEM_SIMD_END
#else
#define TRAINMEM_SIMD_BEGIN                                                                  \
  _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"") \
      _Pragma("GCC diagnostic ignored \"-Wuninitialized\"")
#define TRAINMEM_SIMD_END _Pragma("GCC diagnostic pop")
#endif
#endif

namespace trainmem::cpu {

/// \brief Vector instructions for the hand-written loops: none, AVX2 (with F16C), AVX-512.
enum class SimdLevel : std::uint8_t { Scalar = 0, Avx2 = 1, Avx512 = 2 };

inline const char* name_of(SimdLevel level) {
  switch (level) {
    case SimdLevel::Avx512: return "avx512";
    case SimdLevel::Avx2: return "avx2";
    case SimdLevel::Scalar: return "scalar";
  }
  return "?";
}

namespace kernels {

/// The highest level this CPU (and this build) can run.
inline SimdLevel detected_simd_level() {
#if defined(TRAINMEM_SIMD_DISPATCH)
  static const SimdLevel level = [] {
    __builtin_cpu_init();
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;  // F16C from cpuid: Clang's builtin does not name it
    const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
    const bool avx2 = __builtin_cpu_supports("avx2") && f16c;
    if (avx2 && __builtin_cpu_supports("avx512f")) return SimdLevel::Avx512;
    return avx2 ? SimdLevel::Avx2 : SimdLevel::Scalar;
  }();
  return level;
#else
  return SimdLevel::Scalar;
#endif
}

/// The cap a TRAINMEM_CPU_SIMD value names ("auto" or empty: none).
inline SimdLevel parse_simd_level(std::string_view v) {
  if (v == "auto" || v.empty() || v == "avx512") return SimdLevel::Avx512;
  if (v == "avx2") return SimdLevel::Avx2;
  if (v == "scalar") return SimdLevel::Scalar;
  throw Error(detail::concat("TRAINMEM_CPU_SIMD=", v, ": expected auto, avx512, avx2 or scalar"));
}

inline std::atomic<SimdLevel>& simd_cap() {
  static std::atomic<SimdLevel> cap{[] {
    const char* value = std::getenv("TRAINMEM_CPU_SIMD");
    return parse_simd_level(value ? value : "auto");
  }()};
  return cap;
}

}  // namespace kernels

/// Caps the level from now on (SimdLevel::Avx512: no cap beyond what the CPU has).
inline void force_simd_level(SimdLevel cap) { kernels::simd_cap().store(cap); }

/// The level the hand-written loops use now: the CPU's, capped (NOTE [Vector paths chosen at run time]).
inline SimdLevel simd_level() {
  return std::min(kernels::detected_simd_level(), kernels::simd_cap().load(std::memory_order_relaxed));
}

}  // namespace trainmem::cpu
