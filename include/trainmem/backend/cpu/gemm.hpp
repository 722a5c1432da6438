// trainmem/backend/cpu/gemm.hpp — GEMM on the CPU, FP32 accumulation for 16-bit storage.
//
// Two paths, chosen per call (NOTE [CPU GEMM path] below): oneDNN's matmul
// (onednn_gemm.hpp), which multiplies 16-bit operands directly, and Eigen's F32 (F64
// for f64) GEMM, which 16-bit operands reach widened to F32 ("widen"); they are never
// multiplied by Eigen's emulated half/bfloat16 GEMM (10-300x slower, and it accumulates
// in 16 bits). Both add an optional bias row to the FP32 result before its one rounding
// to C's storage dtype, and GELU after it where asked (gemm_epilogue.hpp).
//
// On the Eigen path the rows of C, batch entries stacked, are split evenly over the
// threads and each thread runs Eigen single-threaded on its own rows, so after B is
// ready no thread waits on another (Eigen's parallel GEMM spins on panels the other
// threads pack, which costs a scheduler slice whenever a core is busy with someone
// else). For 16-bit storage, B is widened to F32 once (all threads share the work) when
// the batch shares it, or by each thread for the entries it owns; each thread widens its
// rows of A kBlockRows at a time right before multiplying them, so the block is still
// in cache when Eigen packs it and the A workspace is threads x kBlockRows x k floats.
// A 16-bit C is computed in an F32 block (widened first when beta != 0) and narrowed.
// Workspaces come from the tracked allocator for the duration of one call.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <type_traits>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "trainmem/backend/cpu/allocator.hpp"
#include "trainmem/backend/cpu/convert.hpp"
#include "trainmem/backend/cpu/gemm_epilogue.hpp"
#include "trainmem/backend/cpu/kernels/parallel.hpp"
#include "trainmem/backend/cpu/onednn_gemm.hpp"
#include "trainmem/backend/cpu/workspace.hpp"
#include "trainmem/core/gemm_args.hpp"
#include "trainmem/error.hpp"

namespace trainmem::cpu::kernels {

template <class T>
using RowMatrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using RowMap = Eigen::Map<RowMatrix<T>, Eigen::Unaligned, Eigen::OuterStride<>>;
template <class T>
using ConstRowMap = Eigen::Map<const RowMatrix<T>, Eigen::Unaligned, Eigen::OuterStride<>>;

/// Below this m + n + k Eigen multiplies coefficient by coefficient (its
/// EIGEN_GEMM_TO_COEFFBASED_THRESHOLD), building an evaluator and calling a reduction for
/// each entry of C: 60-100 ns for a 4x4 product, most of an op's host time. Below it
/// (at most 6x6x7 = 252 multiply-adds) tiny_gemm's loops take a fraction of that; both
/// the Eigen path's entry (no threads or workspace for F32/F64) and eigen_gemm (widened
/// 16-bit blocks) send such products there.
inline constexpr std::int64_t kTinyGemmSum = 20;

/// C = alpha op(A) op(B) + beta C by loops, for m + n + k < kTinyGemmSum. Each entry of
/// C is summed over p = 0..k-1 in order (as Eigen's coefficient-based product sums), four
/// entries of a row at a time in registers so their sums overlap in the pipeline.
template <class T>
void tiny_gemm(const T* a, std::int64_t lda, bool trans_a, const T* b, std::int64_t ldb, bool trans_b, T* c,
               std::int64_t ldc, std::int64_t m, std::int64_t n, std::int64_t k, T alpha, T beta) {
  // op(A)[i, p] and op(B)[p, j] as strides.
  const std::int64_t a_i = trans_a ? 1 : lda, a_p = trans_a ? lda : 1;
  const std::int64_t b_p = trans_b ? 1 : ldb, b_j = trans_b ? ldb : 1;
  const auto store = [&](T& out, T sum) { out = beta == T(0) ? alpha * sum : alpha * sum + beta * out; };
  for (std::int64_t i = 0; i < m; ++i) {
    const T* a_row = a + i * a_i;
    T* c_row = c + i * ldc;
    std::int64_t j = 0;
    for (; j + 4 <= n; j += 4) {
      T s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      for (std::int64_t p = 0; p < k; ++p) {
        const T a_ip = a_row[p * a_p];
        const T* b_pj = b + p * b_p + j * b_j;
        s0 += a_ip * b_pj[0];
        s1 += a_ip * b_pj[b_j];
        s2 += a_ip * b_pj[2 * b_j];
        s3 += a_ip * b_pj[3 * b_j];
      }
      store(c_row[j], s0);
      store(c_row[j + 1], s1);
      store(c_row[j + 2], s2);
      store(c_row[j + 3], s3);
    }
    for (; j < n; ++j) {
      T sum = 0;
      for (std::int64_t p = 0; p < k; ++p) sum += a_row[p * a_p] * b[p * b_p + j * b_j];
      store(c_row[j], sum);
    }
  }
}

/// C = alpha op(A) op(B) + beta C with Eigen, for plain float or double matrices.
template <class T>
void eigen_gemm(const T* a, std::int64_t lda, bool trans_a, const T* b, std::int64_t ldb, bool trans_b, T* c,
                std::int64_t ldc, std::int64_t m, std::int64_t n, std::int64_t k, T alpha, T beta) {
  if (m + n + k < kTinyGemmSum) {
    tiny_gemm(a, lda, trans_a, b, ldb, trans_b, c, ldc, m, n, k, alpha, beta);
    return;
  }
  const std::int64_t a_rows = trans_a ? k : m, a_cols = trans_a ? m : k;
  const std::int64_t b_rows = trans_b ? n : k, b_cols = trans_b ? k : n;
  ConstRowMap<T> A(a, a_rows, a_cols, Eigen::OuterStride<>(lda));
  ConstRowMap<T> B(b, b_rows, b_cols, Eigen::OuterStride<>(ldb));
  RowMap<T> C(c, m, n, Eigen::OuterStride<>(ldc));
  auto run = [&](const auto& opA, const auto& opB) {
    if (beta == T(0)) {
      if (alpha == T(1)) C.noalias() = opA * opB;
      else C.noalias() = alpha * opA * opB;
    } else {
      if (beta != T(1)) C *= beta;
      if (alpha == T(1)) C.noalias() += opA * opB;
      else C.noalias() += alpha * opA * opB;
    }
  };
  if (!trans_a && !trans_b) run(A, B);
  else if (trans_a && !trans_b) run(A.transpose(), B);
  else if (!trans_a && trans_b) run(A, B.transpose());
  else run(A.transpose(), B.transpose());
}

/// Widens a rows x cols block of a row-major matrix with leading dimension ld.
template <class T>
void widen_block(const T* src, std::int64_t ld, std::int64_t rows, std::int64_t cols, float* dst) {
  for (std::int64_t r = 0; r < rows; ++r) widen_to_float(src + r * ld, dst + r * cols, static_cast<std::size_t>(cols));
}

/// Rows of op(A) widened and multiplied per Eigen call when A or C needs converting.
inline constexpr std::int64_t kBlockRows = 256;
/// Above this depth k, 16-bit operands are widened kDepthChunk of k at a time (both A and
/// B), so the workspace stays a few MiB when k is a token count (weight gradients).
inline constexpr std::int64_t kMaxWidenedDepth = 2048;
inline constexpr std::int64_t kDepthChunk = 512;
/// Fewest rows of C, and multiply-adds, worth a thread of their own.
inline constexpr std::int64_t kMinRowsPerThread = 16;
inline constexpr double kMinMacsPerThread = 1 << 20;

/// Threads for a GEMM: Eigen's count (OpenMP's unless Eigen::setNbThreads changed it),
/// one inside a parallel region, and none that would get too little work.
inline int gemm_thread_count(std::int64_t rows, double macs) {
#if defined(_OPENMP)
  if (omp_in_parallel()) return 1;
  const double by_work = std::min(static_cast<double>(rows / kMinRowsPerThread), macs / kMinMacsPerThread);
  return static_cast<int>(std::max(1.0, std::min(static_cast<double>(Eigen::nbThreads()), by_work)));
#else
  static_cast<void>(rows);
  static_cast<void>(macs);
  return 1;
#endif
}

/// The Eigen path for storage types TA (A and B) and TC (C), accumulating in
/// AccumulatorOf<TA>: 16-bit operands widened, the epilogue applied in FP32, C rounded once.
template <class TA, class TC>
void eigen_path_gemm(const GemmArgs& g, const TA* a, const TA* b, TC* c, const Epilogue<AccumulatorOf<TA>>& epilogue,
                     Allocator& allocator) {
  using Acc = AccumulatorOf<TA>;
  static_assert(std::is_same_v<Acc, AccumulatorOf<TC>>, "f64 GEMM takes and gives f64 only");
  constexpr bool widen_ab = !std::is_same_v<TA, Acc>;
  constexpr bool widen_c = !std::is_same_v<TC, Acc>;
  if (g.batch <= 0 || g.m <= 0 || g.n <= 0) return;
  if constexpr (!widen_ab && !widen_c) {
    if (g.m + g.n + g.k < kTinyGemmSum) {  // a few hundred multiply-adds: no threads, no workspace
      const Acc alpha = static_cast<Acc>(g.alpha), beta = static_cast<Acc>(g.beta);
      for (std::int64_t e = 0; e < g.batch; ++e) {
        TC* C = c + e * g.stride_c;
        tiny_gemm<Acc>(a + e * g.stride_a, g.lda(), g.trans_a, b + e * g.stride_b, g.ldb(), g.trans_b, C, g.ldc(), g.m,
                       g.n, g.k, alpha, beta);
        apply_epilogue(epilogue, C, g.ldc(), g.m, g.n);
      }
      return;
    }
  }

  const std::int64_t stacked_rows = g.batch * g.m;
  const int threads = gemm_thread_count(stacked_rows, static_cast<double>(stacked_rows) * g.n * g.k);
  const std::int64_t b_rows = g.trans_b ? g.n : g.k, b_cols = g.trans_b ? g.k : g.n, b_size = b_rows * b_cols;
  const bool shared_b = g.stride_b == 0 || g.batch == 1;
  // With nothing to convert, each thread makes one Eigen call per batch entry it owns.
  const std::int64_t rows_per_thread = (stacked_rows + threads - 1) / threads;
  const std::int64_t block = widen_ab || widen_c ? std::min(kBlockRows, rows_per_thread) : stacked_rows;

  // Deep products widen A and B a depth chunk at a time, each thread its own B chunk.
  const bool deep = widen_ab && g.k > kMaxWidenedDepth;
  const std::int64_t depth = deep ? kDepthChunk : g.k;
  const std::int64_t b_slot_size = deep ? depth * g.n : b_size;
  // Workspaces come from the (single-threaded) allocator before any thread starts.
  const Workspace<float> a_workspace(allocator, widen_ab ? static_cast<std::size_t>(threads * block * depth) : 0);
  const Workspace<float> b_workspace(
      allocator, widen_ab ? static_cast<std::size_t>((shared_b && !deep ? 1 : threads) * b_slot_size) : 0);
  const Workspace<float> c_workspace(allocator, widen_c ? static_cast<std::size_t>(threads * block * g.n) : 0);
  float* a_work = a_workspace.get();
  float* b_work = b_workspace.get();
  float* c_work = c_workspace.get();
  const Acc alpha = static_cast<Acc>(g.alpha), beta = static_cast<Acc>(g.beta);

  // Rows [first, last) of entry e of C with op(A) and op(B) widened depth chunk by depth
  // chunk into the thread's slots, accumulating in F32 (c_slot, or C itself when F32).
  auto multiply_rows_deep = [&](std::int64_t e, std::int64_t first, std::int64_t last, float* a_slot, float* b_slot,
                                float* c_slot) {
    if constexpr (widen_ab) {  // 16-bit operands only: Acc is float
      const TA* A = a + e * g.stride_a;
      const TA* Bm = b + e * g.stride_b;
      TC* C = c + e * g.stride_c;
      for (std::int64_t row = first; row < last; row += block) {
        const std::int64_t rows = std::min(block, last - row);
        Acc* acc = c_slot;
        std::int64_t ldacc = g.n;
        if constexpr (widen_c) {
          if (g.beta != 0.0) widen_block(C + row * g.ldc(), g.ldc(), rows, g.n, c_slot);
        } else {
          acc = C + row * g.ldc();
          ldacc = g.ldc();
        }
        for (std::int64_t k0 = 0; k0 < g.k; k0 += depth) {
          const std::int64_t kc = std::min(depth, g.k - k0);
          if (g.trans_a) widen_block(A + k0 * g.lda() + row, g.lda(), kc, rows, a_slot);
          else widen_block(A + row * g.lda() + k0, g.lda(), rows, kc, a_slot);
          if (g.trans_b) widen_block(Bm + k0, g.ldb(), g.n, kc, b_slot);
          else widen_block(Bm + k0 * g.ldb(), g.ldb(), kc, g.n, b_slot);
          eigen_gemm<Acc>(a_slot, g.trans_a ? rows : kc, g.trans_a, b_slot, g.trans_b ? kc : g.n, g.trans_b, acc, ldacc,
                          rows, g.n, kc, alpha, k0 == 0 ? beta : Acc(1));
        }
        apply_epilogue(epilogue, acc, ldacc, rows, g.n);
        if constexpr (widen_c) {
          for (std::int64_t r = 0; r < rows; ++r)
            narrow_from_float(c_slot + r * g.n, C + (row + r) * g.ldc(), static_cast<std::size_t>(g.n));
        }
      }
    }
  };

  // Rows [first, last) of entry e of C, with entry e's op(B) given as (B, ldb).
  auto multiply_rows = [&](std::int64_t e, std::int64_t first, std::int64_t last, const Acc* B, std::int64_t ldb,
                           float* a_slot, float* c_slot) {
    const TA* A = a + e * g.stride_a;
    TC* C = c + e * g.stride_c;
    const std::int64_t pieces = (last - first + block - 1) / block;
    const std::int64_t piece = (last - first + pieces - 1) / pieces;  // balanced, <= block
    for (std::int64_t row = first; row < last; row += piece) {
      const std::int64_t rows = std::min(piece, last - row);
      // Rows [row, row + rows) of op(A): rows of A, or a column block of A when trans_a.
      const TA* A_rows = g.trans_a ? A + row : A + row * g.lda();
      const Acc* A_block;
      std::int64_t lda;
      if constexpr (widen_ab) {
        if (g.trans_a) widen_block(A_rows, g.lda(), g.k, rows, a_slot);
        else widen_block(A_rows, g.lda(), rows, g.k, a_slot);
        A_block = a_slot;
        lda = g.trans_a ? rows : g.k;
      } else {
        A_block = A_rows;
        lda = g.lda();
      }
      if constexpr (widen_c) {
        if (g.beta != 0.0) widen_block(C + row * g.ldc(), g.ldc(), rows, g.n, c_slot);
        eigen_gemm<Acc>(A_block, lda, g.trans_a, B, ldb, g.trans_b, c_slot, g.n, rows, g.n, g.k, alpha, beta);
        apply_epilogue(epilogue, c_slot, g.n, rows, g.n);
        for (std::int64_t r = 0; r < rows; ++r)
          narrow_from_float(c_slot + r * g.n, C + (row + r) * g.ldc(), static_cast<std::size_t>(g.n));
      } else {
        eigen_gemm<Acc>(A_block, lda, g.trans_a, B, ldb, g.trans_b, C + row * g.ldc(), g.ldc(), rows, g.n, g.k, alpha,
                        beta);
        apply_epilogue(epilogue, C + row * g.ldc(), g.ldc(), rows, g.n);
      }
    }
  };

  // One thread's rows; the inner `omp for` binds to the team when there is one. One
  // thread does not enter OpenMP at all (NOTE [Parallel and SIMD]).
  const auto run_share = [&](const int t) {
    if constexpr (widen_ab) {
      if (deep) {
        const std::int64_t begin = stacked_rows * t / threads, end = stacked_rows * (t + 1) / threads;
        for (std::int64_t row = begin; row < end;) {
          const std::int64_t e = row / g.m, first = row % g.m, last = std::min(g.m, first + (end - row));
          multiply_rows_deep(e, first, last, a_work + t * block * depth, b_work + t * b_slot_size,
                             widen_c ? c_work + t * block * g.n : nullptr);
          row += last - first;
        }
        return;
      }
      if (shared_b) {
#if defined(_OPENMP)
#pragma omp for schedule(static)
#endif
        for (std::int64_t r = 0; r < b_rows; ++r)
          widen_to_float(b + r * g.ldb(), b_work + r * b_cols, static_cast<std::size_t>(b_cols));
      }
    }
    float* a_slot = widen_ab ? a_work + t * block * depth : nullptr;
    float* b_slot = widen_ab && !shared_b ? b_work + t * b_size : b_work;
    float* c_slot = widen_c ? c_work + t * block * g.n : nullptr;
    std::int64_t widened_entry = -1;
    const std::int64_t begin = stacked_rows * t / threads, end = stacked_rows * (t + 1) / threads;
    for (std::int64_t row = begin; row < end;) {
      const std::int64_t e = row / g.m, first = row % g.m, last = std::min(g.m, first + (end - row));
      const Acc* B;
      std::int64_t ldb;
      if constexpr (widen_ab) {
        if (!shared_b && e != widened_entry) {
          widen_block(b + e * g.stride_b, g.ldb(), b_rows, b_cols, b_slot);
          widened_entry = e;
        }
        B = b_slot;
        ldb = b_cols;
      } else {
        B = b + e * g.stride_b;
        ldb = g.ldb();
      }
      multiply_rows(e, first, last, B, ldb, a_slot, c_slot);
      row += last - first;
    }
  };
  if (threads > 1) {
    Eigen::initParallel();
#if defined(_OPENMP)
#pragma omp parallel num_threads(threads)
#endif
    run_share(current_thread());
  } else {
    run_share(0);
  }
}

}  // namespace trainmem::cpu::kernels

namespace trainmem::cpu {

// NOTE [CPU GEMM path]
// oneDNN multiplies 16-bit operands itself; whether that beats widening them for Eigen
// depends on the CPU's core, so the rule names the core. BF16 operands go to oneDNN where
// it has AMX (BF16 5-7x its F32, Xeon, 512^3 and 1024^3 on 2 threads) or where the CPU
// is an AMD with AVX512-BF16 (Zen 4: 1.9-2.0x oneDNN's F32, 2.7x widening); on an Intel
// core with AVX512-BF16 but no AMX oneDNN's BF16 measured ~0.63x F32, slower than
// widening, so there they are widened (onednn_bf16_wins()). F16 operands go to oneDNN only
// with AMX (oneDNN 2.6 has no F16 kernel on AVX512 cores). F32 operands go to oneDNN when
// m, n and k are all at least onednn_f32_min_dim(): 512 on Intel cores without AMX, the
// shape class where its F32 kernel measured 1.1-1.3x Eigen's, and 64 on an AMD core with
// AVX-512 (1.24-1.51x from 64^3 up) and on an Intel Xeon with AMX (1.09-1.94x from 64^3
// up; docs/mixed-precision.md); smaller and thinner products stay with Eigen. F64 always
// goes to Eigen. oneDNN's reference (non-JIT) kernels never count as a kernel. The rule
// is one of ISA, vendor and shape, not a run-time timing probe: a probe on a shared
// machine measures the neighbours, and the path must not change between two runs on one
// machine (the paths round differently). TRAINMEM_CPU_GEMM=eigen (or widen) | onednn |
// auto forces a path for every dtype (read once; force_gemm_path() changes it), so tests
// and benchmarks exercise each path on any CPU; a forced oneDNN falls back to Eigen where
// oneDNN has no kernel.

/// \brief Which CPU GEMM path to take: the measured rule, or one path forced.
enum class GemmPath { Auto, Eigen, OneDnn };

namespace kernels {

inline GemmPath gemm_path_from_environment() {
  const char* value = std::getenv("TRAINMEM_CPU_GEMM");
  const std::string_view v = value ? value : "auto";
  if (v == "auto" || v.empty()) return GemmPath::Auto;
  if (v == "eigen" || v == "widen") return GemmPath::Eigen;
  if (v == "onednn") return GemmPath::OneDnn;
  throw Error(detail::concat("TRAINMEM_CPU_GEMM=", v, ": expected auto, eigen, widen or onednn"));
}

inline std::atomic<GemmPath>& forced_gemm_path() {
  static std::atomic<GemmPath> path{gemm_path_from_environment()};
  return path;
}

}  // namespace kernels

/// Forces a CPU GEMM path for every dtype from now on (GemmPath::Auto: the measured rule).
inline void force_gemm_path(GemmPath path) { kernels::forced_gemm_path().store(path); }
/// The path forced by force_gemm_path() or TRAINMEM_CPU_GEMM (GemmPath::Auto if none).
inline GemmPath forced_gemm_path() { return kernels::forced_gemm_path().load(); }

namespace kernels {

/// The path a GEMM with these storage types takes (never Auto).
template <class TA, class TC>
GemmPath gemm_path(const GemmArgs& g, const Epilogue<AccumulatorOf<TA>>& epilogue = {}) {
  if constexpr (std::is_same_v<TA, double>) {
    return GemmPath::Eigen;
  } else {
    switch (forced_gemm_path()) {
      case GemmPath::Eigen: return GemmPath::Eigen;
      case GemmPath::OneDnn: return onednn_can_gemm<TA, TC>(g, epilogue) ? GemmPath::OneDnn : GemmPath::Eigen;
      default: break;
    }
    bool onednn_wins = false;
    if constexpr (std::is_same_v<TA, float>) onednn_wins = std::min({g.m, g.n, g.k}) >= onednn_f32_min_dim();
    else if constexpr (std::is_same_v<TA, BFloat16>) onednn_wins = onednn_bf16_wins();
    else onednn_wins = onednn_has_amx();  // F16: only AMX was measured faster than widening
    return onednn_wins && onednn_can_gemm<TA, TC>(g, epilogue) ? GemmPath::OneDnn : GemmPath::Eigen;
  }
}

/// "onednn", "eigen" (F32/F64 operands to Eigen) or "widen" (16-bit operands widened for Eigen).
template <class TA, class TC>
const char* gemm_path_name(const GemmArgs& g, const Epilogue<AccumulatorOf<TA>>& epilogue = {}) {
  if (gemm_path<TA, TC>(g, epilogue) == GemmPath::OneDnn) return "onednn";
  return std::is_same_v<TA, float> || std::is_same_v<TA, double> ? "eigen" : "widen";
}

/// C = act(alpha op(A) op(B) + beta C + bias) (gemm_epilogue.hpp) for storage types TA (A
/// and B) and TC (C), accumulating in AccumulatorOf<TA>; C is rounded once, at the end.
template <class TA, class TC>
void gemm(const GemmArgs& g, const TA* a, const TA* b, TC* c, Allocator& allocator,
          const Epilogue<AccumulatorOf<TA>>& epilogue = {}) {
  if (g.batch <= 0 || g.m <= 0 || g.n <= 0) return;
  if (gemm_path<TA, TC>(g, epilogue) == GemmPath::OneDnn && onednn_gemm<TA, TC>(g, a, b, c, epilogue, allocator))
    return;
  eigen_path_gemm<TA, TC>(g, a, b, c, epilogue, allocator);
}

}  // namespace kernels
}  // namespace trainmem::cpu
