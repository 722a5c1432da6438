// trainmem/backend/cpu/gemm.hpp — GEMM on the CPU, FP32 accumulation for 16-bit storage.
//
// Every dtype ends in Eigen's F32 (F64 for f64) GEMM; 16-bit operands are never
// multiplied by Eigen's emulated half/bfloat16 GEMM (10-300x slower, and it accumulates
// in 16 bits). The rows of C, batch entries stacked, are split evenly over the threads
// and each thread runs Eigen single-threaded on its own rows, so after B is ready no
// thread waits on another (Eigen's parallel GEMM spins on panels the other threads
// pack, which costs a scheduler slice whenever a core is busy with someone else).
// For 16-bit storage, B is widened to F32 once (all threads share the work) when the
// batch shares it, or by each thread for the entries it owns; each thread widens its
// rows of A kBlockRows at a time right before multiplying them, so the block is still
// in cache when Eigen packs it and the A workspace is threads x kBlockRows x k floats.
// A 16-bit C is computed in an F32 block (widened first when beta != 0) and narrowed.
// Workspaces come from the tracked allocator for the duration of one call: MemoryStats
// shows them as workspace while a GEMM runs and not after, and the allocator's per-size
// cache hands the same blocks back to the next GEMM of a training loop.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cstdint>
#include <type_traits>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "trainmem/backend/cpu/allocator.hpp"
#include "trainmem/backend/cpu/convert.hpp"
#include "trainmem/core/gemm_args.hpp"

namespace trainmem::cpu::detail {

/// \brief A float buffer from the tracked allocator for one GEMM call (empty for count 0).
class Workspace {
 public:
  Workspace(Allocator& allocator, std::size_t count)
      : allocator_(allocator),
        bytes_(count * sizeof(float)),
        data_(count ? static_cast<float*>(allocator.allocate(bytes_, MemCategory::Workspace)) : nullptr) {}
  ~Workspace() { allocator_.deallocate(data_, bytes_, MemCategory::Workspace); }
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  float* get() const { return data_; }

 private:
  Allocator& allocator_;
  std::size_t bytes_;
  float* data_;
};

template <class T>
using RowMatrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using RowMap = Eigen::Map<RowMatrix<T>, Eigen::Unaligned, Eigen::OuterStride<>>;
template <class T>
using ConstRowMap = Eigen::Map<const RowMatrix<T>, Eigen::Unaligned, Eigen::OuterStride<>>;

/// C = alpha op(A) op(B) + beta C with Eigen, for plain float or double matrices.
template <class T>
void eigen_gemm(const T* a, std::int64_t lda, bool trans_a, const T* b, std::int64_t ldb, bool trans_b, T* c,
                std::int64_t ldc, std::int64_t m, std::int64_t n, std::int64_t k, T alpha, T beta) {
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

inline int gemm_thread_id() {
#if defined(_OPENMP)
  return omp_get_thread_num();
#else
  return 0;
#endif
}

/// GEMM for storage types TA (A and B) and TC (C), accumulating in AccumulatorOf<TA>.
template <class TA, class TC>
void gemm(const GemmArgs& g, const TA* a, const TA* b, TC* c, Allocator& allocator) {
  using Acc = AccumulatorOf<TA>;
  static_assert(std::is_same_v<Acc, AccumulatorOf<TC>>, "f64 GEMM takes and gives f64 only");
  constexpr bool widen_ab = !std::is_same_v<TA, Acc>;
  constexpr bool widen_c = !std::is_same_v<TC, Acc>;
  if (g.batch <= 0 || g.m <= 0 || g.n <= 0) return;

  const std::int64_t stacked_rows = g.batch * g.m;
  const int threads = gemm_thread_count(stacked_rows, static_cast<double>(stacked_rows) * g.n * g.k);
  const std::int64_t b_rows = g.trans_b ? g.n : g.k, b_cols = g.trans_b ? g.k : g.n, b_size = b_rows * b_cols;
  const bool shared_b = g.stride_b == 0 || g.batch == 1;
  // With nothing to convert, each thread makes one Eigen call per batch entry it owns.
  const std::int64_t rows_per_thread = (stacked_rows + threads - 1) / threads;
  const std::int64_t block = widen_ab || widen_c ? std::min(kBlockRows, rows_per_thread) : stacked_rows;

  // Workspaces come from the (single-threaded) allocator before any thread starts.
  const Workspace a_workspace(allocator, widen_ab ? static_cast<std::size_t>(threads * block * g.k) : 0);
  const Workspace b_workspace(allocator, widen_ab ? static_cast<std::size_t>((shared_b ? 1 : threads) * b_size) : 0);
  const Workspace c_workspace(allocator, widen_c ? static_cast<std::size_t>(threads * block * g.n) : 0);
  float* a_work = a_workspace.get();
  float* b_work = b_workspace.get();
  float* c_work = c_workspace.get();
  const Acc alpha = static_cast<Acc>(g.alpha), beta = static_cast<Acc>(g.beta);

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
        for (std::int64_t r = 0; r < rows; ++r)
          narrow_from_float(c_slot + r * g.n, C + (row + r) * g.ldc(), static_cast<std::size_t>(g.n));
      } else {
        eigen_gemm<Acc>(A_block, lda, g.trans_a, B, ldb, g.trans_b, C + row * g.ldc(), g.ldc(), rows, g.n, g.k,
                        alpha, beta);
      }
    }
  };

  if (threads > 1) Eigen::initParallel();
#if defined(_OPENMP)
#pragma omp parallel num_threads(threads) if (threads > 1)
#endif
  {
    const int t = gemm_thread_id();
    if constexpr (widen_ab) {
      if (shared_b) {
#if defined(_OPENMP)
#pragma omp for schedule(static)
#endif
        for (std::int64_t r = 0; r < b_rows; ++r)
          widen_to_float(b + r * g.ldb(), b_work + r * b_cols, static_cast<std::size_t>(b_cols));
      }
    }
    float* a_slot = widen_ab ? a_work + t * block * g.k : nullptr;
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
  }
}

}  // namespace trainmem::cpu::detail
