// trainmem/backend/cpu/gemm.hpp — GEMM on the CPU, FP32 accumulation for 16-bit storage.
//
// F32 and F64 go straight to Eigen. F16/BF16 operands are never multiplied by Eigen's
// emulated half/bfloat16 GEMM (10-300x slower): B is widened once into an FP32
// workspace, A is widened one block of rows at a time (the block stays in cache while
// Eigen packs it), Eigen's FP32 GEMM multiplies, and a 16-bit C is narrowed block by
// block. Workspaces are grow-only buffers from the tracked allocator, so a training
// loop pays for them once and MemoryStats shows them as workspace.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "trainmem/backend/cpu/allocator.hpp"
#include "trainmem/backend/cpu/convert.hpp"
#include "trainmem/core/gemm_args.hpp"

namespace trainmem::cpu::detail {

/// \brief A grow-only float buffer from the tracked allocator.
class WorkspaceBuffer {
 public:
  explicit WorkspaceBuffer(Allocator& allocator) : allocator_(&allocator) {}
  ~WorkspaceBuffer() { allocator_->deallocate(data_, capacity_ * sizeof(float), MemCategory::Workspace); }
  WorkspaceBuffer(const WorkspaceBuffer&) = delete;
  WorkspaceBuffer& operator=(const WorkspaceBuffer&) = delete;

  float* get(std::size_t count) {
    if (count > capacity_) {
      allocator_->deallocate(data_, capacity_ * sizeof(float), MemCategory::Workspace);
      data_ = static_cast<float*>(allocator_->allocate(count * sizeof(float), MemCategory::Workspace));
      capacity_ = count;
    }
    return data_;
  }

 private:
  Allocator* allocator_;
  float* data_ = nullptr;
  std::size_t capacity_ = 0;
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

/// GEMM for storage types TA (A and B) and TC (C). Accumulates in AccumulatorOf<TA>.
template <class TA, class TC>
void gemm(const GemmArgs& g, const TA* a, const TA* b, TC* c, WorkspaceBuffer& wa, WorkspaceBuffer& wb,
          WorkspaceBuffer& wc) {
  using Acc = AccumulatorOf<TA>;
  constexpr bool direct = std::is_same_v<TA, Acc> && std::is_same_v<TC, Acc>;
  for (std::int64_t batch = 0; batch < g.batch; ++batch) {
    const TA* A = a + batch * g.stride_a;
    const TA* B = b + batch * g.stride_b;
    TC* C = c + batch * g.stride_c;
    if constexpr (direct) {
      eigen_gemm<Acc>(A, g.lda(), g.trans_a, B, g.ldb(), g.trans_b, C, g.ldc(), g.m, g.n, g.k,
                      static_cast<Acc>(g.alpha), static_cast<Acc>(g.beta));
    } else {
      static_assert(std::is_same_v<Acc, float>, "mixed-storage GEMM accumulates in float");
      // Widen B whole (reused by every row block), keeping its layout.
      const std::int64_t b_rows = g.trans_b ? g.n : g.k, b_cols = g.trans_b ? g.k : g.n;
      const float* Bw;
      if constexpr (std::is_same_v<TA, float>) {
        Bw = B;
      } else {
        float* buffer = wb.get(static_cast<std::size_t>(b_rows * b_cols));
        widen_block(B, g.ldb(), b_rows, b_cols, buffer);
        Bw = buffer;
      }
      const std::int64_t block = std::max<std::int64_t>(64, std::min<std::int64_t>(g.m, 256));
      for (std::int64_t row = 0; row < g.m; row += block) {
        const std::int64_t rows = std::min(block, g.m - row);
        // Rows [row, row+rows) of op(A): contiguous rows of A, or a column block of A^T.
        const float* Aw;
        std::int64_t lda_w;
        if constexpr (std::is_same_v<TA, float>) {
          Aw = g.trans_a ? A + row : A + row * g.lda();
          lda_w = g.lda();
        } else {
          const std::int64_t a_rows = g.trans_a ? g.k : rows, a_cols = g.trans_a ? rows : g.k;
          float* buffer = wa.get(static_cast<std::size_t>(a_rows * a_cols));
          widen_block(g.trans_a ? A + row : A + row * g.lda(), g.lda(), a_rows, a_cols, buffer);
          Aw = buffer;
          lda_w = a_cols;
        }
        if constexpr (std::is_same_v<TC, float>) {
          eigen_gemm<float>(Aw, lda_w, g.trans_a, Bw, b_cols, g.trans_b, C + row * g.ldc(), g.ldc(), rows, g.n, g.k,
                            static_cast<float>(g.alpha), static_cast<float>(g.beta));
        } else {
          float* Cw = wc.get(static_cast<std::size_t>(rows * g.n));
          if (g.beta != 0.0) widen_block(C + row * g.ldc(), g.ldc(), rows, g.n, Cw);
          eigen_gemm<float>(Aw, lda_w, g.trans_a, Bw, b_cols, g.trans_b, Cw, g.n, rows, g.n, g.k,
                            static_cast<float>(g.alpha), static_cast<float>(g.beta));
          for (std::int64_t r = 0; r < rows; ++r)
            narrow_from_float(Cw + r * g.n, C + (row + r) * g.ldc(), static_cast<std::size_t>(g.n));
        }
      }
    }
  }
}

}  // namespace trainmem::cpu::detail
