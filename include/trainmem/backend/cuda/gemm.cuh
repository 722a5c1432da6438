// trainmem/backend/cuda/gemm.cuh — GEMM through cuBLASLt: Tensor Cores, FP32 accumulation.
//
// NOTE [Row-major through a column-major library]
// cuBLASLt is column-major. A row-major [r, c] matrix is the column-major [c, r] matrix
// of the same bytes, so row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T:
// we hand cuBLASLt B as its first operand and A as its second, with each operand's own
// transpose flag, and m and n swapped. No data moves.
//
// Precision roles: F16/BF16 operands multiply on Tensor Cores with CUBLAS_COMPUTE_32F
// (FP32 accumulation) and write C in C's dtype (16-bit or F32); F32 operands use
// CUBLAS_COMPUTE_32F, which is true FP32, unless the backend is told to allow TF32;
// F64 goes to cublasDgemm. Combinations cuBLASLt does not offer (F32 operands with a
// 16-bit C, F16 with BF16) run into an F32 buffer that is then cast.
//
// Each shape (with dtypes, transposes, strides, epilogue and pointer alignments) is
// planned once: descriptors, layouts and the heuristic's algorithm are cached per
// engine, so a training loop pays for planning on its first step only. The workspace
// (32 MiB, NVIDIA's advice for Hopper) is allocated once per engine from the tracked
// allocator and counted as MemCategory::Workspace; the F64 path's cuBLAS handle is
// pointed at the same workspace, so cuBLAS allocates nothing of its own.
//
// Epilogues: bias (added per output column, broadcast over rows and batch) and bias +
// GELU (cuBLASLt's GELU is the tanh approximation, math::GeluTanh) are fused where the
// heuristic offers an algorithm, and otherwise applied by one element-wise kernel.
// A batch stride of 0 (one matrix shared by the batch) folds the batch into m when the
// shared matrix is B, and otherwise runs the batch entry by entry. Operands that start
// off a 16-byte boundary (views into a larger tensor) are described to the heuristic
// as such; if it then offers nothing, they are copied to aligned scratch first.
//
// NOTE [FP8 GEMM]
// run_fp8 multiplies FP8 A and B (E4M3 x E4M3, E4M3 x E5M2, E5M2 x E4M3) with cuBLASLt's
// FP8 kernels (sm_89 and later): CUBLAS_COMPUTE_32F with FAST_ACCUM off (the Tensor Cores'
// partial sums are promoted to f32 registers as they go), the two scale inverses passed as
// device pointers (CUBLASLT_MATMUL_DESC_A_SCALE_POINTER / B_SCALE_POINTER: D = alpha
// scale_A scale_B op(A) op(B) + beta C, no host sync), C in f32, bf16 or f16. On sm_90
// those kernels take only "TN": column-major op(A) transposed, op(B) not, which in our
// row-major terms (NOTE above: cuBLASLt's A is our B) is A stored [m, k] and B stored
// [n, k] (a linear layer's x W^T). Other layouts are transposed into scratch first, one
// byte per element. A shape the heuristic refuses (a k or n that is not a multiple of
// 16, a GPU without FP8 Tensor Cores) takes the same arithmetic another way: A and B
// widened to bf16 (exact), a bf16 GEMM with f32 sums into scratch, and an epilogue that
// applies alpha a_scale_inv b_scale_inv read on the device (core/fp8_rules.hpp).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <map>

#include "trainmem/backend/cuda/kernels/elementwise.cuh"
#include "trainmem/backend/cuda/kernels/fp8.cuh"
#include "trainmem/core/gemm_args.hpp"

namespace trainmem::cuda {

/// What a GEMM applies to alpha op(A) op(B) + beta C before storing it.
enum class GemmEpilogue : std::uint8_t { None, Bias, BiasGelu };

namespace kernels {

inline cudaDataType_t cuda_data_type(DType dtype) {
  switch (dtype) {
    case DType::F32: return CUDA_R_32F;
    case DType::F64: return CUDA_R_64F;
    case DType::F16: return CUDA_R_16F;
    case DType::BF16: return CUDA_R_16BF;
    case DType::I32: return CUDA_R_32I;
    case DType::F8E4M3: return CUDA_R_8F_E4M3;
    case DType::F8E5M2: return CUDA_R_8F_E5M2;
  }
  return CUDA_R_32F;
}

/// The largest power of two up to 256 that divides the address (cuBLASLt's alignment hint).
inline std::uint32_t pointer_alignment(const void* ptr) {
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  std::uint32_t alignment = 256;
  while (alignment > 1 && address % alignment != 0) alignment >>= 1;
  return alignment;
}

/// x + bias, then GELU (tanh form) when asked: the unfused epilogue.
struct AddBiasMaybeGelu {
  bool gelu;
  template <class T>
  TRAINMEM_HOST_DEVICE T operator()(T x, T bias) const {
    const T z = x + bias;
    return gelu ? math::GeluTanh{}(z) : z;
  }
};

/// \brief cuBLASLt (and, for F64, cuBLAS) on one stream, with cached plans and one workspace.
class GemmEngine {
 public:
  static constexpr std::size_t kWorkspaceBytes = std::size_t{32} << 20;

  explicit GemmEngine(const KernelContext& ctx) : ctx_(ctx) { TRAINMEM_CUBLAS_CHECK(cublasLtCreate(&lt_)); }
  ~GemmEngine() {
    for (auto& [key, plan] : plans_) destroy(plan);
    if (cublas_ != nullptr) cublasDestroy(cublas_);
    cublasLtDestroy(lt_);
    if (workspace_ != nullptr) ctx_.allocator->deallocate(workspace_, kWorkspaceBytes, MemCategory::Workspace);
  }
  GemmEngine(const GemmEngine&) = delete;
  GemmEngine& operator=(const GemmEngine&) = delete;

  /// F32 GEMMs may use TF32 Tensor Cores (10 mantissa bits per product) when allowed.
  void set_allow_tf32(bool allow) { allow_tf32_ = allow; }
  bool allow_tf32() const { return allow_tf32_; }
  std::size_t plans_cached() const { return plans_.size(); }

  /// C = epilogue(alpha op(A) op(B) + beta C) for row-major A, B (dtype `ab`) and C (`c_dtype`).
  void run(const GemmArgs& g, DType ab, const void* a, const void* b, DType c_dtype, void* c,
           GemmEpilogue epilogue = GemmEpilogue::None, DType bias_dtype = DType::F32, const void* bias = nullptr) {
    if (g.batch == 0 || g.m == 0 || g.n == 0) return;
    if (g.batch > 1 && (g.stride_a == 0 || g.stride_b == 0 || g.stride_c == 0)) {
      run_shared_batch(g, ab, a, b, c_dtype, c, epilogue, bias_dtype, bias);
      return;
    }
    if (g.k == 0) {  // no products: C = beta C, then the epilogue
      if (g.beta == 0.0) TRAINMEM_CUDA_CHECK(cudaMemsetAsync(c, 0, span_elements(g) * size_of(c_dtype), ctx_.stream));
      else map_unary(ctx_, math::Scale{g.beta}, c_dtype, c, c_dtype, c, span_elements(g));
      apply_epilogue(g, c_dtype, c, epilogue, bias_dtype, bias);
      return;
    }
    if (ab == DType::F64) {
      run_f64(g, static_cast<const double*>(a), static_cast<const double*>(b), static_cast<double*>(c));
      apply_epilogue(g, c_dtype, c, epilogue, bias_dtype, bias);
      return;
    }
    if (!lt_supports(ab, c_dtype)) {  // compute into F32, then cast
      const std::int64_t span = span_elements(g);
      ScratchBuffer wide(ctx_, static_cast<std::size_t>(span) * sizeof(float));
      map_unary(ctx_, math::Identity{}, c_dtype, c, DType::F32, wide.as<void>(), span);
      run(g, ab, a, b, DType::F32, wide.as<void>(), epilogue, bias_dtype, bias);
      map_unary(ctx_, math::Identity{}, DType::F32, wide.as<const void>(), c_dtype, c, span);
      return;
    }
    // cuBLASLt takes the bias in C's dtype, from a 16-byte aligned address (a bias that is a
    // view into a larger tensor may start anywhere): otherwise it is copied first.
    if (epilogue != GemmEpilogue::None && (bias_dtype != c_dtype || pointer_alignment(bias) < 16)) {
      ScratchBuffer cast_bias(ctx_, static_cast<std::size_t>(g.n) * size_of(c_dtype));
      map_unary(ctx_, math::Identity{}, bias_dtype, bias, c_dtype, cast_bias.as<void>(), g.n);
      run(g, ab, a, b, c_dtype, c, epilogue, c_dtype, cast_bias.as<const void>());
      return;
    }
    const Plan& plan = plan_for(g, ab, a, b, c_dtype, c, epilogue);
    if (!plan.found && std::min({pointer_alignment(a), pointer_alignment(b), pointer_alignment(c)}) < 16) {
      run_realigned(g, ab, a, b, c_dtype, c, epilogue, bias_dtype, bias);
      return;
    }
    if (!plan.found) {
      detail::check(epilogue != GemmEpilogue::None, "gemm: cuBLASLt offers no algorithm for ", ab, " x ", ab, " -> ",
                    c_dtype, " with m=", g.m, " n=", g.n, " k=", g.k, " batch=", g.batch, " trans_a=", g.trans_a,
                    " trans_b=", g.trans_b);
      run(g, ab, a, b, c_dtype, c);
      apply_epilogue(g, c_dtype, c, epilogue, bias_dtype, bias);
      return;
    }
    if (epilogue != GemmEpilogue::None)
      TRAINMEM_CUBLAS_CHECK(
          cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    const float alpha = static_cast<float>(g.alpha), beta = static_cast<float>(g.beta);
    // Operands swapped (NOTE above): cuBLASLt's A is our B, its B is our A.
    TRAINMEM_CUBLAS_CHECK(cublasLtMatmul(lt_, plan.desc, &alpha, b, plan.layout_a, a, plan.layout_b, &beta, c,
                                         plan.layout_c, c, plan.layout_c, &plan.algo, workspace(), kWorkspaceBytes,
                                         ctx_.stream));
  }

  /// C = alpha a_scale_inv[0] b_scale_inv[0] op(A) op(B) + beta C for row-major FP8 A and B
  /// (NOTE [FP8 GEMM]); the scale inverses are one-element f32 device buffers.
  void run_fp8(const GemmArgs& g, DType a_dtype, const void* a, DType b_dtype, const void* b, DType c_dtype, void* c,
               const float* a_scale_inv, const float* b_scale_inv) {
    if (g.batch == 0 || g.m == 0 || g.n == 0) return;
    if (g.k == 0) {  // sums of nothing: the epilogue on zeros, as the CPU emulation does
      ScratchBuffer sums(ctx_, static_cast<std::size_t>(g.batch * g.m * g.n) * sizeof(float));
      TRAINMEM_CUDA_CHECK(cudaMemsetAsync(sums.as<void>(), 0, sums.bytes(), ctx_.stream));
      gemm_fp8_epilogue(ctx_, sums.as<const float>(), g.batch, g.m * g.n, c_dtype, c, g.stride_c,
                        static_cast<float>(g.alpha), static_cast<float>(g.beta), a_scale_inv, b_scale_inv);
      return;
    }
    // The TN layout: A as [m, k] and B as [n, k], transposed into scratch when stored otherwise.
    GemmArgs tn = g;
    tn.trans_a = false;
    tn.trans_b = true;
    const std::int64_t a_entries = g.stride_a == 0 ? 1 : g.batch, b_entries = g.stride_b == 0 ? 1 : g.batch;
    ScratchBuffer a_t(ctx_, g.trans_a ? static_cast<std::size_t>(a_entries * g.m * g.k) : 0);
    ScratchBuffer b_t(ctx_, g.trans_b ? 0 : static_cast<std::size_t>(b_entries * g.k * g.n));
    if (g.trans_a) {  // [k, m] -> [m, k]
      transpose_bytes(ctx_, a, g.stride_a, a_t.as<void>(), g.m * g.k, g.k, g.m, a_entries);
      a = a_t.as<const void>();
      tn.stride_a = g.stride_a == 0 ? 0 : g.m * g.k;
    }
    if (!g.trans_b) {  // [k, n] -> [n, k]
      transpose_bytes(ctx_, b, g.stride_b, b_t.as<void>(), g.k * g.n, g.k, g.n, b_entries);
      b = b_t.as<const void>();
      tn.stride_b = g.stride_b == 0 ? 0 : g.k * g.n;
    }
    if (tn.batch > 1 && tn.stride_b == 0 && tn.stride_a == g.m * g.k && tn.stride_c == g.m * g.n) {
      tn.m = g.batch * g.m;  // a stack of A's with one B is one tall A: [batch * m, k] x B
      tn.batch = 1;
      tn.stride_a = tn.stride_b = tn.stride_c = 0;
    }
    if (tn.batch > 1 && (tn.stride_a == 0 || tn.stride_b == 0)) {  // a shared operand: entry by entry
      GemmArgs one = tn;
      one.batch = 1;
      one.stride_a = one.stride_b = one.stride_c = 0;
      for (std::int64_t p = 0; p < tn.batch; ++p)
        run_fp8_tn(one, a_dtype, static_cast<const std::uint8_t*>(a) + p * tn.stride_a, b_dtype,
                   static_cast<const std::uint8_t*>(b) + p * tn.stride_b, c_dtype,
                   static_cast<std::byte*>(c) + p * tn.stride_c * size_of(c_dtype), a_scale_inv, b_scale_inv);
      return;
    }
    run_fp8_tn(tn, a_dtype, a, b_dtype, b, c_dtype, c, a_scale_inv, b_scale_inv);
  }

 private:
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t layout_a = nullptr, layout_b = nullptr, layout_c = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool found = false;
  };
  using Key = std::array<std::int64_t, 16>;

  /// run_fp8 once A is [m, k] and B is [n, k] (strides nonzero when batch > 1).
  void run_fp8_tn(const GemmArgs& g, DType a_dtype, const void* a, DType b_dtype, const void* b, DType c_dtype, void* c,
                  const float* a_scale_inv, const float* b_scale_inv) {
    const Plan& plan = fp8_plan_for(g, a_dtype, a, b_dtype, b, c_dtype, c);
    if (!plan.found) {
      run_fp8_widened(g, a_dtype, a, b_dtype, b, c_dtype, c, a_scale_inv, b_scale_inv);
      return;
    }
    // Operands swapped (NOTE [Row-major through a column-major library]): cuBLASLt's A is our B.
    TRAINMEM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &b_scale_inv,
                                                         sizeof(b_scale_inv)));
    TRAINMEM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &a_scale_inv,
                                                         sizeof(a_scale_inv)));
    const float alpha = static_cast<float>(g.alpha), beta = static_cast<float>(g.beta);
    TRAINMEM_CUBLAS_CHECK(cublasLtMatmul(lt_, plan.desc, &alpha, b, plan.layout_a, a, plan.layout_b, &beta, c,
                                         plan.layout_c, c, plan.layout_c, &plan.algo, workspace(), kWorkspaceBytes,
                                         ctx_.stream));
  }

  /// The FP8 GEMM's arithmetic where cuBLASLt has no FP8 kernel for the shape (NOTE [FP8 GEMM]).
  void run_fp8_widened(const GemmArgs& g, DType a_dtype, const void* a, DType b_dtype, const void* b, DType c_dtype,
                       void* c, const float* a_scale_inv, const float* b_scale_inv) {
    const std::int64_t a_span = fp8::operand_span(g.batch, g.stride_a, g.m * g.k);
    const std::int64_t b_span = fp8::operand_span(g.batch, g.stride_b, g.k * g.n);
    ScratchBuffer a16(ctx_, static_cast<std::size_t>(a_span) * sizeof(BFloat16));
    ScratchBuffer b16(ctx_, static_cast<std::size_t>(b_span) * sizeof(BFloat16));
    ScratchBuffer sums(ctx_, static_cast<std::size_t>(g.batch * g.m * g.n) * sizeof(float));
    widen_fp8(ctx_, a_dtype, a, a_span, a16.as<BFloat16>());
    widen_fp8(ctx_, b_dtype, b, b_span, b16.as<BFloat16>());
    GemmArgs f32 = g;
    f32.alpha = 1.0;
    f32.beta = 0.0;
    f32.stride_c = g.m * g.n;
    run(f32, DType::BF16, a16.as<const void>(), b16.as<const void>(), DType::F32, sums.as<void>());
    gemm_fp8_epilogue(ctx_, sums.as<const float>(), g.batch, g.m * g.n, c_dtype, c, g.stride_c,
                      static_cast<float>(g.alpha), static_cast<float>(g.beta), a_scale_inv, b_scale_inv);
  }

  const Plan& fp8_plan_for(const GemmArgs& g, DType a_dtype, const void* a, DType b_dtype, const void* b, DType c_dtype,
                           const void* c) {
    const std::uint32_t align_a = pointer_alignment(b), align_b = pointer_alignment(a), align_c = pointer_alignment(c);
    // Operand dtypes above every DType code, so FP8 plans never meet the others in the cache.
    const std::int64_t operands = 1000 + 10 * static_cast<std::int64_t>(a_dtype) + static_cast<std::int64_t>(b_dtype);
    const Key key{operands,
                  static_cast<std::int64_t>(c_dtype),
                  0,
                  1,
                  g.m,
                  g.n,
                  g.k,
                  g.batch,
                  g.batch > 1 ? g.stride_a : 0,
                  g.batch > 1 ? g.stride_b : 0,
                  g.batch > 1 ? g.stride_c : 0,
                  0,
                  align_a,
                  align_b,
                  align_c,
                  0};
    if (auto it = plans_.find(key); it != plans_.end()) return it->second;
    Plan plan;
    try {
      TRAINMEM_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
      const cublasOperation_t op_a = CUBLAS_OP_T, op_b = CUBLAS_OP_N;  // TN (NOTE [FP8 GEMM])
      TRAINMEM_CUBLAS_CHECK(
          cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
      TRAINMEM_CUBLAS_CHECK(
          cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
      const std::int8_t fast_accumulation = 0;
      TRAINMEM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM,
                                                           &fast_accumulation, sizeof(fast_accumulation)));
      make_layout(plan.layout_a, b_dtype, g.k, g.n, g.batch, g.stride_b);  // our B [n, k]: column-major k x n
      make_layout(plan.layout_b, a_dtype, g.k, g.m, g.batch, g.stride_a);  // our A [m, k]: column-major k x m
      make_layout(plan.layout_c, c_dtype, g.n, g.m, g.batch, g.stride_c);
      // cuBLASLt's FP8 kernels want 16-byte leading dimensions and pointers; others go widened.
      const bool eligible = g.k % 16 == 0 && (g.n * static_cast<std::int64_t>(size_of(c_dtype))) % 16 == 0 &&
                            std::min({align_a, align_b, align_c}) >= 16 &&
                            (g.batch == 1 || (g.stride_a % 16 == 0 && g.stride_b % 16 == 0 &&
                                              (g.stride_c * static_cast<std::int64_t>(size_of(c_dtype))) % 16 == 0));
      if (eligible) choose_algorithm(plan, align_a, align_b, align_c);
    } catch (...) {
      destroy(plan);
      throw;
    }
    return plans_.emplace(key, plan).first->second;
  }

  static bool lt_supports(DType ab, DType c) {
    if (ab == DType::F32) return c == DType::F32;
    if (ab == DType::F16) return c == DType::F16 || c == DType::F32;
    if (ab == DType::BF16) return c == DType::BF16 || c == DType::F32;
    return false;
  }
  /// Elements from the first to the last element of C over the batch.
  static std::int64_t span_elements(const GemmArgs& g) { return (g.batch - 1) * g.stride_c + g.m * g.n; }

  void* workspace() {
    if (workspace_ == nullptr) workspace_ = ctx_.allocator->allocate(kWorkspaceBytes, MemCategory::Workspace);
    return workspace_;
  }

  void run_shared_batch(const GemmArgs& g, DType ab, const void* a, const void* b, DType c_dtype, void* c,
                        GemmEpilogue epilogue, DType bias_dtype, const void* bias) {
    if (g.stride_b == 0 && g.stride_a == g.m * g.k && g.stride_c == g.m * g.n && !g.trans_a) {
      // A stack of row-major A's is one tall A: [batch * m, k] x B.
      GemmArgs folded = g;
      folded.m = g.batch * g.m;
      folded.batch = 1;
      folded.stride_a = folded.stride_b = folded.stride_c = 0;
      run(folded, ab, a, b, c_dtype, c, epilogue, bias_dtype, bias);
      return;
    }
    GemmArgs one = g;
    one.batch = 1;
    one.stride_a = one.stride_b = one.stride_c = 0;
    const std::size_t ab_size = size_of(ab), c_size = size_of(c_dtype);
    for (std::int64_t p = 0; p < g.batch; ++p)
      run(one, ab, static_cast<const std::byte*>(a) + p * g.stride_a * ab_size,
          static_cast<const std::byte*>(b) + p * g.stride_b * ab_size, c_dtype,
          static_cast<std::byte*>(c) + p * g.stride_c * c_size, epilogue, bias_dtype, bias);
  }

  /// Copies operands that start off a 16-byte boundary (views into a larger tensor) to
  /// fresh pool memory, for shapes whose cuBLASLt kernels all need aligned pointers.
  void run_realigned(const GemmArgs& g, DType ab, const void* a, const void* b, DType c_dtype, void* c,
                     GemmEpilogue epilogue, DType bias_dtype, const void* bias) {
    const std::int64_t a_span = (g.batch - 1) * g.stride_a + g.m * g.k;
    const std::int64_t b_span = (g.batch - 1) * g.stride_b + g.k * g.n;
    const std::int64_t c_span = span_elements(g);
    const std::size_t a_bytes = a_span * size_of(ab), b_bytes = b_span * size_of(ab),
                      c_bytes = c_span * size_of(c_dtype);
    ScratchBuffer a_copy(ctx_, a_bytes), b_copy(ctx_, b_bytes), c_copy(ctx_, c_bytes);
    TRAINMEM_CUDA_CHECK(cudaMemcpyAsync(a_copy.as<void>(), a, a_bytes, cudaMemcpyDeviceToDevice, ctx_.stream));
    TRAINMEM_CUDA_CHECK(cudaMemcpyAsync(b_copy.as<void>(), b, b_bytes, cudaMemcpyDeviceToDevice, ctx_.stream));
    TRAINMEM_CUDA_CHECK(cudaMemcpyAsync(c_copy.as<void>(), c, c_bytes, cudaMemcpyDeviceToDevice, ctx_.stream));
    run(g, ab, a_copy.as<const void>(), b_copy.as<const void>(), c_dtype, c_copy.as<void>(), epilogue, bias_dtype,
        bias);
    TRAINMEM_CUDA_CHECK(cudaMemcpyAsync(c, c_copy.as<const void>(), c_bytes, cudaMemcpyDeviceToDevice, ctx_.stream));
  }

  void apply_epilogue(const GemmArgs& g, DType c_dtype, void* c, GemmEpilogue epilogue, DType bias_dtype,
                      const void* bias) {
    if (epilogue == GemmEpilogue::None) return;
    const AddBiasMaybeGelu op{epilogue == GemmEpilogue::BiasGelu};
    for (std::int64_t p = 0; p < g.batch; ++p) {
      void* cp = static_cast<std::byte*>(c) + p * g.stride_c * size_of(c_dtype);
      map_binary(ctx_, op, c_dtype, cp, bias_dtype, bias, c_dtype, cp, AxisView{1, g.m, g.n});
    }
  }

  void run_f64(const GemmArgs& g, const double* a, const double* b, double* c) {
    if (cublas_ == nullptr) {
      TRAINMEM_CUBLAS_CHECK(cublasCreate(&cublas_));
      TRAINMEM_CUBLAS_CHECK(cublasSetStream(cublas_, ctx_.stream));
      TRAINMEM_CUBLAS_CHECK(cublasSetWorkspace(cublas_, workspace(), kWorkspaceBytes));
    }
    detail::check(g.m < (std::int64_t{1} << 31) && g.n < (std::int64_t{1} << 31) && g.k < (std::int64_t{1} << 31) &&
                      g.batch < (std::int64_t{1} << 31),
                  "gemm: f64 extents must be below 2^31, got m=", g.m, " n=", g.n, " k=", g.k);
    const auto op_a = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // operands swapped (NOTE above)
    const auto op_b = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const int m = static_cast<int>(g.n), n = static_cast<int>(g.m), k = static_cast<int>(g.k);
    const int lda = static_cast<int>(g.ldb()), ldb = static_cast<int>(g.lda()), ldc = static_cast<int>(g.ldc());
    const double alpha = g.alpha, beta = g.beta;
    if (g.batch == 1)
      TRAINMEM_CUBLAS_CHECK(cublasDgemm(cublas_, op_a, op_b, m, n, k, &alpha, b, lda, a, ldb, &beta, c, ldc));
    else
      TRAINMEM_CUBLAS_CHECK(cublasDgemmStridedBatched(cublas_, op_a, op_b, m, n, k, &alpha, b, lda, g.stride_b, a, ldb,
                                                      g.stride_a, &beta, c, ldc, g.stride_c,
                                                      static_cast<int>(g.batch)));
  }

  const Plan& plan_for(const GemmArgs& g, DType ab, const void* a, const void* b, DType c_dtype, const void* c,
                       GemmEpilogue epilogue) {
    const std::uint32_t align_a = pointer_alignment(b), align_b = pointer_alignment(a), align_c = pointer_alignment(c);
    const Key key{static_cast<std::int64_t>(ab),
                  static_cast<std::int64_t>(c_dtype),
                  g.trans_a,
                  g.trans_b,
                  g.m,
                  g.n,
                  g.k,
                  g.batch,
                  g.batch > 1 ? g.stride_a : 0,
                  g.batch > 1 ? g.stride_b : 0,
                  g.batch > 1 ? g.stride_c : 0,
                  static_cast<std::int64_t>(epilogue),
                  align_a,
                  align_b,
                  align_c,
                  ab == DType::F32 && allow_tf32_};
    if (auto it = plans_.find(key); it != plans_.end()) return it->second;
    Plan plan;
    try {
      make_plan(plan, g, ab, c_dtype, epilogue, align_a, align_b, align_c);
    } catch (...) {
      destroy(plan);
      throw;
    }
    return plans_.emplace(key, plan).first->second;
  }

  void make_plan(Plan& plan, const GemmArgs& g, DType ab, DType c_dtype, GemmEpilogue epilogue, std::uint32_t align_a,
                 std::uint32_t align_b, std::uint32_t align_c) {
    const cublasComputeType_t compute =
        ab == DType::F32 && allow_tf32_ ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    TRAINMEM_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan.desc, compute, CUDA_R_32F));
    const cublasOperation_t op_a = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // operands swapped (NOTE above)
    const cublasOperation_t op_b = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    TRAINMEM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
    TRAINMEM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
    if (epilogue != GemmEpilogue::None) {
      const cublasLtEpilogue_t lt_epilogue =
          epilogue == GemmEpilogue::BiasGelu ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_BIAS;
      TRAINMEM_CUBLAS_CHECK(
          cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &lt_epilogue, sizeof(lt_epilogue)));
      const cudaDataType_t bias_type = cuda_data_type(c_dtype);
      TRAINMEM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                                           sizeof(bias_type)));
    }
    // Column-major views of the row-major operands: cuBLASLt's A is our B, its B our A.
    const std::int64_t a_rows = g.trans_b ? g.k : g.n, a_cols = g.trans_b ? g.n : g.k;
    const std::int64_t b_rows = g.trans_a ? g.m : g.k, b_cols = g.trans_a ? g.k : g.m;
    make_layout(plan.layout_a, ab, a_rows, a_cols, g.batch, g.stride_b);
    make_layout(plan.layout_b, ab, b_rows, b_cols, g.batch, g.stride_a);
    make_layout(plan.layout_c, c_dtype, g.n, g.m, g.batch, g.stride_c);
    choose_algorithm(plan, align_a, align_b, align_c);
  }

  /// The heuristic's first algorithm for the plan's descriptor and layouts (plan.found: one was offered).
  void choose_algorithm(Plan& plan, std::uint32_t align_a, std::uint32_t align_b, std::uint32_t align_c) {
    cublasLtMatmulPreference_t preference = nullptr;
    TRAINMEM_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
    cublasLtMatmulHeuristicResult_t result{};
    int returned = 0;
    cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
    try {
      const std::uint64_t workspace_bytes = kWorkspaceBytes;
      TRAINMEM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                                 &workspace_bytes, sizeof(workspace_bytes)));
      TRAINMEM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                                 &align_a, sizeof(align_a)));
      TRAINMEM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                                 &align_b, sizeof(align_b)));
      TRAINMEM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                                 &align_c, sizeof(align_c)));
      TRAINMEM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                                 &align_c, sizeof(align_c)));
      status = cublasLtMatmulAlgoGetHeuristic(lt_, plan.desc, plan.layout_a, plan.layout_b, plan.layout_c,
                                              plan.layout_c, preference, 1, &result, &returned);
    } catch (...) {
      cublasLtMatmulPreferenceDestroy(preference);
      throw;
    }
    cublasLtMatmulPreferenceDestroy(preference);
    if (status != CUBLAS_STATUS_NOT_SUPPORTED) TRAINMEM_CUBLAS_CHECK(status);
    plan.found = status == CUBLAS_STATUS_SUCCESS && returned > 0;
    if (plan.found) plan.algo = result.algo;
  }

  static void make_layout(cublasLtMatrixLayout_t& layout, DType dtype, std::int64_t rows, std::int64_t cols,
                          std::int64_t batch, std::int64_t stride) {
    TRAINMEM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout, cuda_data_type(dtype), static_cast<std::uint64_t>(rows),
                                                     static_cast<std::uint64_t>(cols), rows));
    if (batch > 1) {
      const auto count = static_cast<std::int32_t>(batch);
      TRAINMEM_CUBLAS_CHECK(
          cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
      TRAINMEM_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                             &stride, sizeof(stride)));
    }
  }

  static void destroy(Plan& plan) noexcept {
    if (plan.layout_a != nullptr) cublasLtMatrixLayoutDestroy(plan.layout_a);
    if (plan.layout_b != nullptr) cublasLtMatrixLayoutDestroy(plan.layout_b);
    if (plan.layout_c != nullptr) cublasLtMatrixLayoutDestroy(plan.layout_c);
    if (plan.desc != nullptr) cublasLtMatmulDescDestroy(plan.desc);
    plan = Plan{};
  }

  KernelContext ctx_;
  cublasLtHandle_t lt_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  void* workspace_ = nullptr;
  bool allow_tf32_ = false;
  std::map<Key, Plan> plans_;
};

}  // namespace kernels
}  // namespace trainmem::cuda
