// tests/backend/cuda/test_cuda_gemm.cu — cuda::Backend::gemm and gemm_bias against an FP64 loop.
//
// Every element is held to the componentwise bound of a dot product accumulated in
// FP32 (FP64 for f64) and stored in C's dtype:
//   |C - C64| <= (4 u_C + 2 k u_acc) (|alpha| |A||B| + |beta C0| + |bias|)
// with u the unit roundoff. TF32 (10 mantissa bits per product) breaks this bound for
// f32 by two orders of magnitude, so the f32 cases also prove TF32 is off by default.
// C starts as NaN when beta = 0, so an element the GEMM does not write fails.
#include <cmath>
#include <string>
#include <vector>

#include "cuda_test_support.cuh"

namespace {

namespace tmem = trainmem;
using namespace trainmem::cuda_testing;
using tmem::DType;
using tmem::Shape;

double unit_roundoff(DType dtype) {
  switch (dtype) {
    case DType::F64: return std::ldexp(1.0, -53);
    case DType::F32: return std::ldexp(1.0, -24);
    case DType::F16: return std::ldexp(1.0, -11);
    case DType::BF16: return std::ldexp(1.0, -8);
    default: return 0.0;
  }
}

double gelu_tanh(double x) { return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }

struct GemmCase {
  DType ab = DType::F32, c = DType::F32;
  bool trans_a = false, trans_b = false;
  std::int64_t batch = 1, m = 37, n = 45, k = 70;
  double alpha = 1.0, beta = 0.0;
  bool share_a = false, share_b = false;
  bool bias = false, gelu = false;
  DType bias_dtype = DType::F32;
  bool misaligned = false;        // operands start one odd-length row into their storage
  double product_roundoff = 0.0;  // 0: FP32 (FP64 for f64) accumulation

  std::string describe() const {
    return tmem::detail::concat(name_of(ab), "->", name_of(c), " ", trans_a ? "T" : "N", trans_b ? "T" : "N",
                                " batch=", batch, " m=", m, " n=", n, " k=", k, " alpha=", alpha, " beta=", beta,
                                share_a ? " shared A" : "", share_b ? " shared B" : "", bias ? " bias " : "",
                                bias ? name_of(bias_dtype) : "", gelu ? " gelu" : "", misaligned ? " misaligned" : "");
  }
};

/// A tensor of `shape` holding `values`; misaligned: a view one row into a [rows + 1, cols] tensor.
tmem::Tensor<Gpu> upload(Gpu& gpu, Shape shape, const std::vector<double>& values, DType dtype, bool misaligned) {
  if (!misaligned) return tmem::Tensor<Gpu>::from_host(shape, values, dtype, tmem::MemCategory::Temporary, gpu);
  const std::int64_t cols = shape.back(), rows = shape.numel() / cols;
  std::vector<double> padded(static_cast<std::size_t>(cols), 0.0);
  padded.insert(padded.end(), values.begin(), values.end());
  auto whole = tmem::Tensor<Gpu>::from_host(Shape{rows + 1, cols}, padded, dtype, tmem::MemCategory::Temporary, gpu);
  return whole.slice(1, rows + 1).reshape(shape);
}

struct GemmErrors {
  double worst_over_bound;  // <= 1 passes
  double relative_l2;       // ||C - C64|| / ||C64||
};

/// Runs one GEMM on the GPU and measures its error against the FP64 loop.
GemmErrors gemm_errors(Gpu& gpu, Inputs& random, const GemmCase& g) {
  const std::int64_t batch_a = g.share_a ? 1 : g.batch, batch_b = g.share_b ? 1 : g.batch;
  const std::int64_t a_rows = g.trans_a ? g.k : g.m, a_cols = g.trans_a ? g.m : g.k;
  const std::int64_t b_rows = g.trans_b ? g.n : g.k, b_cols = g.trans_b ? g.k : g.n;
  const auto a = rounded_to(random.uniform(batch_a * a_rows * a_cols), g.ab);
  const auto b = rounded_to(random.uniform(batch_b * b_rows * b_cols), g.ab);
  std::vector<double> c0(static_cast<std::size_t>(g.batch * g.m * g.n), NAN);
  if (g.beta != 0.0) c0 = rounded_to(random.uniform(g.batch * g.m * g.n), g.c);
  const auto bias = rounded_to(random.uniform(g.n), g.bias_dtype);

  auto ta = upload(gpu, Shape{batch_a * a_rows, a_cols}, a, g.ab, g.misaligned && a_cols % 2 == 1);
  auto tb = upload(gpu, Shape{batch_b * b_rows, b_cols}, b, g.ab, g.misaligned && b_cols % 2 == 1);
  auto tc = upload(gpu, Shape{g.batch * g.m, g.n}, c0, g.c, g.misaligned && g.n % 2 == 1);
  tmem::GemmArgs args;
  args.batch = g.batch;
  args.m = g.m;
  args.n = g.n;
  args.k = g.k;
  args.trans_a = g.trans_a;
  args.trans_b = g.trans_b;
  args.stride_a = g.share_a ? 0 : g.m * g.k;
  args.stride_b = g.share_b ? 0 : g.k * g.n;
  args.stride_c = g.m * g.n;
  args.alpha = g.alpha;
  args.beta = g.beta;
  if (g.bias) {
    auto tbias = tmem::Tensor<Gpu>::from_host(Shape{g.n}, bias, g.bias_dtype, tmem::MemCategory::Temporary, gpu);
    gpu.gemm_bias(args, ta, tb, tbias, tc, g.gelu);
  } else {
    gpu.gemm(args, ta, tb, tc);
  }
  const auto c = tc.to_host<double>();

  const double u_acc = g.product_roundoff > 0 ? g.product_roundoff
                                              : (g.ab == DType::F64 ? unit_roundoff(DType::F64) : std::ldexp(1.0, -24));
  const double bound = 4.0 * unit_roundoff(g.c) + 2.0 * static_cast<double>(g.k) * u_acc;
  double worst = 0.0;
  std::vector<double> reference(c.size());
  for (std::int64_t p = 0; p < g.batch; ++p)
    for (std::int64_t i = 0; i < g.m; ++i)
      for (std::int64_t j = 0; j < g.n; ++j) {
        double dot = 0.0, scale = 0.0;
        for (std::int64_t l = 0; l < g.k; ++l) {
          const std::int64_t pa = g.share_a ? 0 : p, pb = g.share_b ? 0 : p;
          const double av = a[pa * g.m * g.k + (g.trans_a ? l * g.m + i : i * g.k + l)];
          const double bv = b[pb * g.k * g.n + (g.trans_b ? j * g.k + l : l * g.n + j)];
          dot += av * bv;
          scale += std::fabs(av * bv);
        }
        const std::int64_t at = (p * g.m + i) * g.n + j;
        double ref = g.alpha * dot + (g.beta != 0.0 ? g.beta * c0[at] : 0.0);
        scale = std::fabs(g.alpha) * scale + (g.beta != 0.0 ? std::fabs(g.beta * c0[at]) : 0.0);
        double allowed = 0.0;
        if (g.bias) {
          ref += bias[j];
          scale += std::fabs(bias[j]);
          if (g.gelu) {
            // cuBLASLt may evaluate the epilogue's tanh with the hardware approximation (2^-11).
            allowed = std::ldexp(1.0, -10) * std::fabs(ref);
            ref = gelu_tanh(ref);
          }
        }
        reference[at] = ref;
        if (std::isnan(c[at])) return {INFINITY, INFINITY};
        worst = std::max(worst, std::fabs(c[at] - ref) / (bound * scale + allowed + 1e-300));
      }
  return {worst, relative_error(c, reference)};
}

void check_case(Gpu& gpu, Inputs& random, const GemmCase& g) {
  INFO(g.describe() << ", seed " << random.seed());
  poison_pool(gpu);
  const GemmErrors errors = gemm_errors(gpu, random, g);
  CHECK(errors.worst_over_bound <= 1.0);
  // METHOD.md's measure too; TF32 (when allowed) and a hardware-tanh GELU get 1e-3.
  const double l2_tolerance = g.product_roundoff > 0 || g.gelu ? std::max(1e-3, tolerance(g.c)) : tolerance(g.c);
  CHECK(errors.relative_l2 <= l2_tolerance);
}

}  // namespace

TEST_CASE("cuda gemm: every dtype, transpose, batch and beta", "[cuda][gemm]") {
  TRAINMEM_REQUIRE_CUDA_DEVICE();
  Gpu& gpu = Gpu::default_instance();
  Inputs random;
  INFO("seed " << random.seed());
  for (DType dtype : {DType::F32, DType::F16, DType::BF16, DType::F64})
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (std::int64_t batch : {1, 3})
          for (double beta : {0.0, 0.5}) {
            GemmCase g;
            g.ab = g.c = dtype;
            g.trans_a = ta;
            g.trans_b = tb;
            g.batch = batch;
            g.beta = beta;
            g.alpha = beta == 0.0 ? 1.0 : -0.75;
            check_case(gpu, random, g);
          }
}

TEST_CASE("cuda gemm: Tensor Core shapes, long K, misaligned operands", "[cuda][gemm]") {
  TRAINMEM_REQUIRE_CUDA_DEVICE();
  Gpu& gpu = Gpu::default_instance();
  Inputs random;
  INFO("seed " << random.seed());
  for (DType dtype : {DType::F32, DType::F16, DType::BF16}) {
    GemmCase g;
    g.ab = g.c = dtype;
    g.m = 128;
    g.n = 192;
    g.k = 256;
    check_case(gpu, random, g);
    g.m = 64;
    g.n = 48;
    g.k = 8192;  // accumulation error grows with k only as FP32 allows
    check_case(gpu, random, g);
    g.m = 33;
    g.n = 17;
    g.k = 25;
    g.misaligned = true;  // 2- or 4-byte aligned pointers: the alignment hints must say so
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        g.trans_a = ta;
        g.trans_b = tb;
        check_case(gpu, random, g);
      }
  }
}

TEST_CASE("cuda gemm: mixed output dtypes, natively and through an F32 buffer", "[cuda][gemm]") {
  TRAINMEM_REQUIRE_CUDA_DEVICE();
  Gpu& gpu = Gpu::default_instance();
  Inputs random;
  INFO("seed " << random.seed());
  const std::pair<DType, DType> pairs[] = {{DType::F16, DType::F32},  {DType::BF16, DType::F32},
                                           {DType::F32, DType::BF16}, {DType::F32, DType::F16},
                                           {DType::F16, DType::BF16}, {DType::BF16, DType::F16}};
  for (auto [ab, c] : pairs)
    for (double beta : {0.0, 1.0})
      for (std::int64_t batch : {1, 2}) {
        GemmCase g;
        g.ab = ab;
        g.c = c;
        g.beta = beta;
        g.batch = batch;
        g.trans_b = true;
        check_case(gpu, random, g);
      }
}

TEST_CASE("cuda gemm: a matrix shared by the batch (stride 0)", "[cuda][gemm]") {
  TRAINMEM_REQUIRE_CUDA_DEVICE();
  Gpu& gpu = Gpu::default_instance();
  Inputs random;
  INFO("seed " << random.seed());
  for (DType dtype : {DType::F32, DType::BF16, DType::F64})
    for (bool ta : {false, true}) {
      GemmCase g;
      g.ab = g.c = dtype;
      g.batch = 4;
      g.trans_a = ta;
      g.share_b = true;  // folds into one tall GEMM when A is not transposed
      check_case(gpu, random, g);
      g.share_b = false;
      g.share_a = true;  // runs entry by entry
      check_case(gpu, random, g);
    }
}

TEST_CASE("cuda gemm_bias: fused bias and bias + GELU epilogues", "[cuda][gemm]") {
  TRAINMEM_REQUIRE_CUDA_DEVICE();
  Gpu& gpu = Gpu::default_instance();
  Inputs random;
  INFO("seed " << random.seed());
  for (DType dtype : {DType::F32, DType::F16, DType::BF16, DType::F64})
    for (bool gelu : {false, true})
      for (std::int64_t batch : {1, 2}) {
        GemmCase g;
        g.ab = g.c = g.bias_dtype = dtype;
        g.bias = true;
        g.gelu = gelu;
        g.batch = batch;
        g.trans_b = true;  // the linear layer's layout: x W^T
        g.m = 96;
        g.n = 64;
        g.k = 128;
        check_case(gpu, random, g);
      }
  GemmCase cast_bias;  // a bias in another dtype than C is cast first
  cast_bias.ab = cast_bias.c = DType::BF16;
  cast_bias.bias = cast_bias.gelu = true;
  cast_bias.bias_dtype = DType::F32;
  check_case(gpu, random, cast_bias);
}

TEST_CASE("cuda gemm: TF32 only when allowed, plans and workspace made once", "[cuda][gemm]") {
  TRAINMEM_REQUIRE_CUDA_DEVICE();
  Gpu gpu;  // its own instance: fresh counters
  Inputs random;
  INFO("seed " << random.seed());
  CHECK(gpu.memory().live(tmem::MemCategory::Workspace) == 0);
  GemmCase g;
  g.m = 128;
  g.n = 128;
  g.k = 512;
  check_case(gpu, random, g);  // f32 within the FP32 bound: not TF32
  CHECK(gpu.memory().live(tmem::MemCategory::Workspace) == static_cast<std::int64_t>(32 << 20));
  const std::size_t plans = gpu.gemm_plans_cached();
  check_case(gpu, random, g);
  CHECK(gpu.gemm_plans_cached() == plans);

  gpu.set_allow_tf32(true);
  g.product_roundoff = std::ldexp(1.0, -11);  // TF32 keeps 10 mantissa bits of each operand
  check_case(gpu, random, g);
  gpu.set_allow_tf32(false);
  CHECK(gpu.memory().live(tmem::MemCategory::Workspace) == static_cast<std::int64_t>(32 << 20));
}
