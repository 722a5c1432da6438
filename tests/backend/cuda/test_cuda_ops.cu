// tests/backend/cuda/test_cuda_ops.cu — every op, forward and backward, on cuda::Backend against an FP64 reference.
//
// Each case builds the same graph through the public ops on both backends: the
// reference is cpu::Backend in F64 on inputs (and the upstream gradient) already
// rounded to the dtype under test; the candidate is cuda::Backend in that dtype. The
// output and every input gradient must agree within the dtype's relative-error budget
// (tolerance() in cuda_test_support.cuh). F64 on the GPU checks the formulas to 1e-12.
// The transformer block is compared GPU against CPU in the same dtype (both round
// their weights the same way), which is what a user switching backends sees.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "cuda_test_support.cuh"

namespace {

namespace tmem = trainmem;
using namespace trainmem::cuda_testing;
using tmem::DType;
using tmem::Shape;

struct InputSpec {
  Shape shape;
  std::vector<double> values;
  bool requires_grad = true;
};

/// Upstream gradient: uniform in [-1, 1) at position i of a per-case stream.
std::vector<double> upstream(std::uint64_t salt, std::int64_t n, DType dtype) {
  std::vector<double> out(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i)
    out[i] = 2.0 * tmem::detail::random_uniform(tmem::RngState{salt, 0}, static_cast<std::uint64_t>(i)) - 1.0;
  return rounded_to(out, dtype);
}

double norm_of(const std::vector<double>& v) {
  double s = 0.0;
  for (double x : v) s += x * x;
  return std::sqrt(s);
}

/// One result of a graph: its values and the dtype they were stored in.
struct Result {
  std::vector<double> values;
  DType dtype;
};

/// Runs build(tape, vars) on `backend` with the inputs in `dtype`; returns the output and
/// the gradient of every input that requires one (upstream gradient from `salt`, or its
/// magnitudes when `magnitudes`).
template <class B, class Build>
std::vector<Result> run_graph(B& backend, DType dtype, const std::vector<InputSpec>& inputs, DType seed_dtype,
                              std::uint64_t salt, Build& build, bool magnitudes = false) {
  tmem::Tape<B> tape(backend);
  std::vector<tmem::Var<B>> vars;
  for (const auto& in : inputs)
    vars.push_back(
        tape.input(tmem::Tensor<B>::from_host(in.shape, in.values, dtype, tmem::MemCategory::Temporary, backend),
                   in.requires_grad));
  tmem::Var<B> out = build(tape, vars);
  std::vector<Result> results{{out.value().template to_host<double>(), out.dtype()}};
  auto seed_values = upstream(salt, out.numel(), seed_dtype);
  if (magnitudes)
    for (double& v : seed_values) v = std::fabs(v);
  tape.backward(
      out, tmem::Tensor<B>::from_host(out.shape(), seed_values, out.dtype(), tmem::MemCategory::Temporary, backend));
  for (const auto& v : vars)
    if (v.requires_grad()) results.push_back({v.grad().template to_host<double>(), v.grad().dtype()});
  return results;
}

/// Compares the op on the GPU in each dtype against the CPU in F64, rounded to the dtype
/// each GPU result is stored in: the error measured is the kernel's, beyond the one
/// rounding no kernel can avoid. (Without that rounding an f16 gradient of mean over
/// 23,100 elements, |g| / 23,100 < 2^-14, is an f16 subnormal whose spacing 2^-24 alone
/// made relative errors of 0.012 for small upstream g: the first GPU run, seed
/// 12490704393105786246.)
///
/// The error is relative to the reference, or with ErrorScale::Magnitudes (sums of
/// products: add, sub, mul, div by a positive b, whose broadcast gradients sum over rows)
/// relative to the same graph on the magnitudes of the inputs and the upstream gradient.
/// That is the bound floating-point summation gives, |fl(Σt) − Σt| ≤ γ Σ|t|; a sum that
/// cancels cannot meet a bound relative to itself (the gradient of a scalar divisor, 335
/// bf16 terms of both signs, measured 0.034 for one seed in the second GPU run).
enum class ErrorScale { Reference, Magnitudes };
const std::vector<DType> kAllDTypes{DType::F64, DType::F32, DType::BF16, DType::F16};
template <class Build>
void check_op(const std::string& name, const std::vector<InputSpec>& inputs, Build build,
              std::vector<DType> dtypes = kAllDTypes, double tolerance_scale = 1.0,
              ErrorScale scale = ErrorScale::Reference) {
  Inputs random;
  INFO("seed " << random.seed());
  const std::uint64_t salt = random.seed();
  INFO("op " << name << ", seed " << salt);
  for (DType dtype : dtypes) {
    INFO("dtype " << dtype_name(dtype));
    std::vector<InputSpec> rounded = inputs;
    for (auto& in : rounded)
      if (in.requires_grad) in.values = rounded_to(in.values, dtype);
    poison_pool(Gpu::default_instance());
    const auto reference = run_graph(Cpu::default_instance(), DType::F64, rounded, dtype, salt, build);
    const auto candidate = run_graph(Gpu::default_instance(), dtype, rounded, dtype, salt, build);
    REQUIRE(candidate.size() == reference.size());
    std::vector<Result> magnitude;
    if (scale == ErrorScale::Magnitudes) {
      std::vector<InputSpec> absolute = rounded;
      for (auto& in : absolute)
        for (double& v : in.values) v = std::fabs(v);
      magnitude = run_graph(Cpu::default_instance(), DType::F64, absolute, dtype, salt, build, true);
    }
    for (std::size_t i = 0; i < reference.size(); ++i) {
      INFO((i == 0 ? std::string("output") : "gradient of input " + std::to_string(i - 1)));
      const auto expected = rounded_to(reference[i].values, candidate[i].dtype);
      double error = relative_error(candidate[i].values, expected);
      if (scale == ErrorScale::Magnitudes && std::isfinite(error)) {
        const double norm = norm_of(expected);  // relative_error divided by it, unless it is 0
        error = (norm == 0.0 ? error : error * norm) / std::max(norm_of(magnitude[i].values), norm);
      }
      CHECK(error <= tolerance(dtype) * tolerance_scale);
    }
  }
}

InputSpec input(Inputs& random, Shape shape, double low = -1.0, double high = 1.0) {
  const auto n = shape.numel();
  return {std::move(shape), random.uniform(n, low, high), true};
}

}  // namespace

TEST_CASE("cuda ops: add, sub and mul with full, row, column and scalar broadcast", "[cuda][ops]") {
  TRAINMEM_REQUIRE_CUDA_DEVICE();
  Inputs random;
  INFO("seed " << random.seed());
  for (Shape b_shape : {Shape{5, 67}, Shape{67}, Shape{5, 1}, Shape{1}}) {
    const std::vector<InputSpec> in{input(random, Shape{5, 67}), input(random, b_shape)};
    check_op(
        "add " + b_shape.str(), in, [](auto&, auto& v) { return tmem::add(v[0], v[1]); }, kAllDTypes, 1.0,
        ErrorScale::Magnitudes);
    check_op(
        "sub " + b_shape.str(), in, [](auto&, auto& v) { return tmem::sub(v[0], v[1]); }, kAllDTypes, 1.0,
        ErrorScale::Magnitudes);
    check_op(
        "mul " + b_shape.str(), in, [](auto&, auto& v) { return tmem::mul(v[0], v[1]); }, kAllDTypes, 1.0,
        ErrorScale::Magnitudes);
  }
  // b with the middle axis collapsed: the general [outer, extent, inner] index.
  const std::vector<InputSpec> middle{input(random, Shape{3, 7, 40}), input(random, Shape{3, 1, 40})};
  check_op(
      "mul middle axis", middle, [](auto&, auto& v) { return tmem::mul(v[0], v[1]); }, kAllDTypes, 1.0,
      ErrorScale::Magnitudes);
  // A row length that is a multiple of every pack width takes the vectorised path.
  const std::vector<InputSpec> packed{input(random, Shape{33, 64}), input(random, Shape{64})};
  check_op(
      "add packed row", packed, [](auto&, auto& v) { return tmem::add(v[0], v[1]); }, kAllDTypes, 1.0,
      ErrorScale::Magnitudes);
  check_op("scale", {input(random, Shape{1001})}, [](auto&, auto& v) { return tmem::scale(v[0], -0.37); });
}

TEST_CASE("cuda ops: activations", "[cuda][ops]") {
  TRAINMEM_REQUIRE_CUDA_DEVICE();
  Inputs random;
  INFO("seed " << random.seed());
  const std::vector<InputSpec> x{input(random, Shape{7, 129}, -3.0, 3.0)};
  check_op("relu", x, [](auto&, auto& v) { return tmem::relu(v[0]); });
  check_op("gelu_tanh", x, [](auto&, auto& v) { return tmem::gelu(v[0], tmem::GeluApproximation::Tanh); });
  check_op("gelu_erf", x, [](auto&, auto& v) { return tmem::gelu(v[0], tmem::GeluApproximation::Erf); });
  check_op("sigmoid", x, [](auto&, auto& v) { return tmem::sigmoid(v[0]); });
  check_op("silu", x, [](auto&, auto& v) { return tmem::silu(v[0]); });
  check_op("swiglu", {x[0], input(random, Shape{7, 129}, -2.0, 2.0)},
           [](auto&, auto& v) { return tmem::swiglu(v[0], v[1]); });
  check_op("tanh", x, [](auto&, auto& v) { return tmem::tanh(v[0]); });
  check_op("exp", x, [](auto&, auto& v) { return tmem::exp(v[0]); });
  check_op("log", {input(random, Shape{7, 129}, 0.1, 3.0)}, [](auto&, auto& v) { return tmem::log(v[0]); });
  const std::vector<InputSpec> positive{input(random, Shape{7, 129}, 0.1, 3.0)};
  check_op("sqrt", positive, [](auto&, auto& v) { return tmem::sqrt(v[0]); });
  check_op("rsqrt", positive, [](auto&, auto& v) { return tmem::rsqrt(v[0]); });
  check_op("pow 1.5", positive, [](auto&, auto& v) { return tmem::pow(v[0], 1.5); });
  check_op("pow -2", positive, [](auto&, auto& v) { return tmem::pow(v[0], -2.0); });
  check_op("pow 3 of a signed x", x, [](auto&, auto& v) { return tmem::pow(v[0], 3.0); });
  check_op("cast to f32 and back", x,
           [](auto&, auto& v) { return tmem::cast(tmem::cast(v[0], DType::F32), v[0].dtype()); });
  check_op("cast to bf16", x, [](auto&, auto& v) { return tmem::cast(v[0], DType::BF16); });
}

TEST_CASE("cuda ops: div with full, row, column and scalar broadcast", "[cuda][ops]") {
  TRAINMEM_REQUIRE_CUDA_DEVICE();
  Inputs random;
  INFO("seed " << random.seed());
  for (Shape b_shape : {Shape{5, 67}, Shape{67}, Shape{5, 1}, Shape{1}}) {
    const std::vector<InputSpec> in{input(random, Shape{5, 67}), input(random, b_shape, 0.5, 2.0)};
    check_op(
        "div " + b_shape.str(), in, [](auto&, auto& v) { return tmem::div(v[0], v[1]); }, kAllDTypes, 1.0,
        ErrorScale::Magnitudes);
  }
}

TEST_CASE("cuda ops: sum and mean over each axis, keepdim or not", "[cuda][ops]") {
  TRAINMEM_REQUIRE_CUDA_DEVICE();
  Inputs random;
  INFO("seed " << random.seed());
  // The last axis is a row reduction (one block per row, a long row included); the others
  // are column sums over an [extent, outer * inner] view.
  for (Shape shape : {Shape{4, 6, 33}, Shape{3, 2000}}) {
    const std::vector<InputSpec> x{input(random, shape)};
    for (int axis = 0; axis < static_cast<int>(shape.rank()); ++axis)
      for (bool keepdim : {false, true}) {
        const std::string what = shape.str() + " axis " + std::to_string(axis) + (keepdim ? " keepdim" : "");
        check_op("sum " + what, x, [=](auto&, auto& v) { return tmem::sum(v[0], axis, keepdim); });
        check_op("mean " + what, x, [=](auto&, auto& v) { return tmem::mean(v[0], axis, keepdim); });
      }
  }
  // RMSNorm composed from the ops a custom layer uses: x * rsqrt(mean(x^2, -1, keepdim) + eps).
  const InputSpec eps{Shape{}, {1e-6}, false};
  check_op("composed rms norm", {input(random, Shape{5, 96}), eps}, [](auto&, auto& v) {
    return tmem::mul(v[0], tmem::rsqrt(tmem::add(tmem::mean(tmem::mul(v[0], v[0]), -1, true), v[1])));
  });
}

TEST_CASE("cuda ops: matmul, bmm and linear, all transposes", "[cuda][ops][gemm]") {
  TRAINMEM_REQUIRE_CUDA_DEVICE();
  Inputs random;
  INFO("seed " << random.seed());
  const std::int64_t m = 19, n = 24, k = 40, batch = 3;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const std::string flags = std::string(ta ? "T" : "N") + (tb ? "T" : "N");
      check_op("matmul " + flags,
               {input(random, ta ? Shape{k, m} : Shape{m, k}), input(random, tb ? Shape{n, k} : Shape{k, n})},
               [ta, tb](auto&, auto& v) { return tmem::matmul(v[0], v[1], ta, tb); });
      check_op("bmm " + flags,
               {input(random, ta ? Shape{batch, k, m} : Shape{batch, m, k}),
                input(random, tb ? Shape{batch, n, k} : Shape{batch, k, n})},
               [ta, tb](auto&, auto& v) { return tmem::bmm(v[0], v[1], ta, tb); });
    }
  check_op("linear", {input(random, Shape{2, 9, k}), input(random, Shape{n, k}), input(random, Shape{n})},
           [](auto&, auto& v) { return tmem::linear(v[0], v[1], v[2]); });
  check_op("linear without bias", {input(random, Shape{9, k}), input(random, Shape{n, k})},
           [](auto&, auto& v) { return tmem::linear(v[0], v[1]); });
}

TEST_CASE("cuda ops: softmax and log_softmax, short and long rows", "[cuda][ops]") {
  TRAINMEM_REQUIRE_CUDA_DEVICE();
  Inputs random;
  INFO("seed " << random.seed());
  for (std::int64_t cols : {7, 37, 1000, 3000}) {
    const std::vector<InputSpec> x{input(random, Shape{6, cols}, -4.0, 4.0)};
    check_op("softmax cols=" + std::to_string(cols), x, [](auto&, auto& v) { return tmem::softmax(v[0]); });
    check_op("log_softmax cols=" + std::to_string(cols), x, [](auto&, auto& v) { return tmem::log_softmax(v[0]); });
  }
}

TEST_CASE("cuda ops: layer_norm forward and backward", "[cuda][ops]") {
  TRAINMEM_REQUIRE_CUDA_DEVICE();
  Inputs random;
  INFO("seed " << random.seed());
  for (std::int64_t d : {5, 96, 1030}) {
    check_op("layer_norm d=" + std::to_string(d),
             {input(random, Shape{3, 11, d}, -2.0, 3.0), input(random, Shape{d}, 0.5, 1.5), input(random, Shape{d})},
             [](auto&, auto& v) { return tmem::layer_norm(v[0], v[1], v[2], 1e-5); });
  }
}

TEST_CASE("cuda ops: rms_norm forward and backward", "[cuda][ops]") {
  TRAINMEM_REQUIRE_CUDA_DEVICE();
  Inputs random;
  INFO("seed " << random.seed());
  for (std::int64_t d : {5, 96, 1030}) {
    check_op("rms_norm d=" + std::to_string(d),
             {input(random, Shape{3, 11, d}, -2.0, 3.0), input(random, Shape{d}, 0.5, 1.5)},
             [](auto&, auto& v) { return tmem::rms_norm(v[0], v[1], 1e-6); });
  }
}

TEST_CASE("cuda ops: cross_entropy forward, backward and label check", "[cuda][ops]") {
  TRAINMEM_REQUIRE_CUDA_DEVICE();
  Inputs random;
  INFO("seed " << random.seed());
  const std::int64_t rows = 23, classes = 517;
  const auto labels = random.integers(rows, 0, classes - 1);
  check_op("cross_entropy", {input(random, Shape{rows, classes}, -3.0, 3.0)}, [&labels](auto& tape, auto& v) {
    using B = std::remove_reference_t<decltype(tape.backend())>;
    auto t = tmem::Tensor<B>::from_host(Shape{rows}, labels, DType::I32, tmem::MemCategory::Temporary, tape.backend());
    return tmem::cross_entropy(v[0], t);
  });

  auto& gpu = Gpu::default_instance();
  tmem::Tape<Gpu> tape(gpu);
  auto logits = tape.input(tmem::Tensor<Gpu>::from_host(Shape{3, 5}, random.uniform(15), DType::F32), true);
  auto bad = tmem::Tensor<Gpu>::from_host(Shape{3}, std::vector<double>{1, 7, 2}, DType::I32);
  // Checked on the device: raised by the next host wait, here the loss's to_host().
  REQUIRE_THROWS_WITH(tmem::cross_entropy(logits, bad).value().to_host<double>(),
                      Catch::Contains("label 7 at row 1 is outside [0, 5)"));
  // The backend is usable after the error.
  auto good = tmem::Tensor<Gpu>::from_host(Shape{3}, std::vector<double>{1, 4, 0}, DType::I32);
  CHECK(std::isfinite(tmem::cross_entropy(logits, good).value().to_host<double>()[0]));
}

TEST_CASE("cuda ops: linear_cross_entropy in chunks, against the CPU in F64", "[cuda][ops][gemm]") {
  TRAINMEM_REQUIRE_CUDA_DEVICE();
  Inputs random;
  INFO("seed " << random.seed());
  const std::int64_t rows = 23, in = 40, classes = 517;
  const auto labels = random.integers(rows, 0, classes - 1);
  for (const std::int64_t chunk_rows : {0, 5}) {  // one chunk; four of 5 rows and one of 3
    // A GEMM into the dtype, then the loss: the bound of linear's and cross_entropy's error together.
    check_op(
        "linear_cross_entropy chunk_rows=" + std::to_string(chunk_rows),
        {input(random, Shape{rows, in}), input(random, Shape{classes, in}), input(random, Shape{classes})},
        [&labels, chunk_rows](auto& tape, auto& v) {
          using B = std::remove_reference_t<decltype(tape.backend())>;
          auto t =
              tmem::Tensor<B>::from_host(Shape{rows}, labels, DType::I32, tmem::MemCategory::Temporary, tape.backend());
          return tmem::linear_cross_entropy(v[0], v[1], v[2], t, {.chunk_rows = chunk_rows});
        },
        kAllDTypes, 2.0);
  }
}

TEST_CASE("cuda ops: transpose, head split and merge, causal mask", "[cuda][ops]") {
  TRAINMEM_REQUIRE_CUDA_DEVICE();
  Inputs random;
  INFO("seed " << random.seed());
  check_op("transpose", {input(random, Shape{3, 17, 29})}, [](auto&, auto& v) { return tmem::transpose(v[0]); });
  check_op("split_heads", {input(random, Shape{2, 13, 4 * 24})},
           [](auto&, auto& v) { return tmem::split_heads(v[0], 4); });
  check_op("merge_heads", {input(random, Shape{8, 13, 24})}, [](auto&, auto& v) { return tmem::merge_heads(v[0], 4); });
  // The mask's -inf must survive into softmax as zero probability.
  check_op("causal_mask then softmax", {input(random, Shape{5, 19, 19})},
           [](auto&, auto& v) { return tmem::softmax(tmem::causal_mask(v[0])); });
}

TEST_CASE("cuda ops: fused attention, causal and not, square and tq < tk", "[cuda][ops][attention]") {
  TRAINMEM_REQUIRE_CUDA_DEVICE();
  // The own kernels (kernels/attention.cuh) in every dtype; the cuDNN path has its own case.
  Gpu& gpu = Gpu::default_instance();
  const bool cudnn = gpu.cudnn_attention();
  gpu.set_cudnn_attention(false);
  struct Restore {
    Gpu& gpu;
    bool cudnn;
    ~Restore() { gpu.set_cudnn_attention(cudnn); }
  } restore{gpu, cudnn};
  Inputs random;
  INFO("seed " << random.seed());
  for (bool causal : {true, false})
    check_op(std::string("attention, causal ") + (causal ? "yes" : "no"),
             {input(random, Shape{6, 37, 24}), input(random, Shape{6, 37, 24}), input(random, Shape{6, 37, 24})},
             [causal](auto&, auto& v) { return tmem::scaled_dot_product_attention(v[0], v[1], v[2], causal); });
  check_op("attention, causal, 5 queries on 40 keys",
           {input(random, Shape{3, 5, 16}), input(random, Shape{3, 40, 16}), input(random, Shape{3, 40, 16})},
           [](auto&, auto& v) { return tmem::scaled_dot_product_attention(v[0], v[1], v[2], true); });
  // Several tiles of queries and keys (64 per tile, 32 in f64), the last ones partial:
  // the online softmax across key tiles and the causal walks' first and last tiles.
  for (bool causal : {true, false})
    check_op(std::string("attention over tiles, causal ") + (causal ? "yes" : "no"),
             {input(random, Shape{2, 150, 64}), input(random, Shape{2, 150, 64}), input(random, Shape{2, 150, 64})},
             [causal](auto&, auto& v) { return tmem::scaled_dot_product_attention(v[0], v[1], v[2], causal); });
  check_op("attention over tiles, causal, 70 queries on 200 keys",
           {input(random, Shape{2, 70, 40}), input(random, Shape{2, 200, 40}), input(random, Shape{2, 200, 40})},
           [](auto&, auto& v) { return tmem::scaled_dot_product_attention(v[0], v[1], v[2], true); });
}

// With the cuDNN frontend built in (trainmem::cudnn) and libcudnn on the loader's path,
// 16-bit attention runs cuDNN's fused SDPA; gpu-check sets TRAINMEM_REQUIRE_CUDNN=1 so a
// machine where it does not load fails here instead of quietly timing the own kernels.
// Tensor Cores multiply the probabilities (and, backward, dS) rounded to the 16-bit dtype,
// as FlashAttention-2 does, so the error is bounded relative to the same graph on the
// inputs' magnitudes (the bound of a rounded sum of products), not to an output that
// cancels over hundreds of keys.
TEST_CASE("cuda ops: 16-bit attention at head dims 64 and 128 on the fast path, against the CPU in F64",
          "[cuda][ops][attention][cudnn]") {
  TRAINMEM_REQUIRE_CUDA_DEVICE();
  Gpu& gpu = Gpu::default_instance();
  const tmem::cuda::AttentionPaths before = gpu.attention_paths();
  Inputs random;
  INFO("seed " << random.seed());
  for (std::int64_t d : {64, 128})
    for (bool causal : {true, false}) {
      const Shape shape{4, 200, d};
      check_op(
          "attention d=" + std::to_string(d) + (causal ? ", causal" : ""),
          {input(random, shape), input(random, shape), input(random, shape)},
          [causal](auto&, auto& v) { return tmem::scaled_dot_product_attention(v[0], v[1], v[2], causal); },
          {DType::BF16, DType::F16}, 1.0, ErrorScale::Magnitudes);
    }
  check_op(
      "attention d=64, causal, 96 queries on 256 keys",
      {input(random, Shape{3, 96, 64}), input(random, Shape{3, 256, 64}), input(random, Shape{3, 256, 64})},
      [](auto&, auto& v) { return tmem::scaled_dot_product_attention(v[0], v[1], v[2], true); },
      {DType::BF16, DType::F16}, 1.0, ErrorScale::Magnitudes);
  const tmem::cuda::AttentionPaths& after = gpu.attention_paths();
  INFO("attention paths: " << after.cudnn_status);
  const bool required = std::getenv("TRAINMEM_REQUIRE_CUDNN") != nullptr;
  if (after.cudnn_forward == before.cudnn_forward && !required) {
    WARN("cuDNN did not run (" << after.cudnn_status << "): the own kernels were checked");
    return;
  }
  CHECK(after.cudnn_forward - before.cudnn_forward == 10);  // 5 shapes x 2 dtypes
  CHECK(after.cudnn_backward - before.cudnn_backward == 10);
}

TEST_CASE("cuda ops: 16-bit attention gives the same bits on every run", "[cuda][ops][attention][cudnn]") {
  TRAINMEM_REQUIRE_CUDA_DEVICE();
  Gpu& gpu = Gpu::default_instance();
  Inputs random;
  INFO("seed " << random.seed() << "; attention paths: " << gpu.attention_paths().cudnn_status);
  const Shape shape{8, 512, 64};
  std::vector<std::vector<double>> qkv{random.uniform(shape.numel()), random.uniform(shape.numel()),
                                       random.uniform(shape.numel())};
  const auto dout = random.uniform(shape.numel());
  for (DType dtype : {DType::BF16, DType::F16}) {
    INFO("dtype " << dtype_name(dtype));
    auto run = [&] {
      tmem::Tape<Gpu> tape(gpu);
      std::vector<tmem::Var<Gpu>> v;
      for (const auto& values : qkv) v.push_back(tape.input(tmem::Tensor<Gpu>::from_host(shape, values, dtype), true));
      auto out = tmem::scaled_dot_product_attention(v[0], v[1], v[2], true);
      tape.backward(out, tmem::Tensor<Gpu>::from_host(shape, dout, dtype));
      std::vector<std::vector<double>> bits{out.value().to_host<double>()};
      for (auto& x : v) bits.push_back(x.grad().to_host<double>());
      return bits;
    };
    const auto first = run(), second = run();
    for (std::size_t i = 0; i < first.size(); ++i) {
      INFO((i == 0 ? std::string("output") : "gradient " + std::to_string(i - 1)));
      CHECK(first[i] == second[i]);  // 16-bit values widened exactly: equal doubles are equal bits
    }
  }
}

TEST_CASE("cuda ops: sum, mean and embedding", "[cuda][ops]") {
  TRAINMEM_REQUIRE_CUDA_DEVICE();
  Inputs random;
  INFO("seed " << random.seed());
  check_op("sum", {input(random, Shape{300, 77})}, [](auto&, auto& v) { return tmem::sum(v[0]); });
  check_op("mean", {input(random, Shape{300, 77})}, [](auto&, auto& v) { return tmem::mean(v[0]); });
  const std::int64_t vocab = 50, dim = 33;
  const auto ids = random.integers(4 * 9, 0, 9);  // ids drawn from a few rows, so most repeat
  check_op("embedding", {input(random, Shape{vocab, dim})}, [&ids](auto& tape, auto& v) {
    using B = std::remove_reference_t<decltype(tape.backend())>;
    auto t = tmem::Tensor<B>::from_host(Shape{4, 9}, ids, DType::I32, tmem::MemCategory::Temporary, tape.backend());
    return tmem::embedding(v[0], tape.input(t));
  });
}

namespace {

/// Forward and backward of a two-block transformer stack on backend B; returns the output
/// and the gradients of the input and of every parameter.
template <class B>
std::vector<std::vector<double>> transformer_step(DType dtype, const std::vector<double>& x_values,
                                                  const std::vector<double>& seed, bool autocast) {
  const std::int64_t batch = 2, t = 16, dim = 64, heads = 4, hidden = 256;
  tmem::nn::Init init(1234);
  const DType param_dtype = autocast ? DType::F32 : dtype;
  std::vector<tmem::nn::TransformerBlock<B>> blocks;
  for (int i = 0; i < 2; ++i)
    blocks.emplace_back(dim, heads, hidden, init, 0.0f, param_dtype, "block" + std::to_string(i));
  tmem::Tape<B> tape;
  auto x = tape.input(tmem::Tensor<B>::from_host(Shape{batch, t, dim}, x_values, param_dtype), true);
  std::vector<std::vector<double>> results;
  {
    std::optional<tmem::amp::Autocast> guard;
    if (autocast) guard.emplace(dtype);
    auto h = x;
    for (auto& block : blocks) h = block(h);
    results.push_back(h.value().template to_host<double>());
    tape.backward(h, tmem::Tensor<B>::from_host(h.shape(), seed, h.dtype()));
  }
  results.push_back(x.grad().template to_host<double>());
  for (auto& block : blocks)
    for (auto& p : block.parameters()) results.push_back(p.grad().template to_host<double>());
  return results;
}

/// What transformer_step's results are: "output", "input", then each parameter's name.
std::vector<std::string> transformer_result_names() {
  tmem::nn::Init init(1234);
  std::vector<std::string> names{"output", "input"};
  for (int i = 0; i < 2; ++i)
    for (auto& p :
         tmem::nn::TransformerBlock<Cpu>(64, 4, 256, init, 0.0f, DType::F32, "block" + std::to_string(i)).parameters())
      names.push_back(p.name());
  return names;
}

}  // namespace

TEST_CASE("cuda ops: a transformer block stack matches the CPU backend", "[cuda][ops][nn]") {
  TRAINMEM_REQUIRE_CUDA_DEVICE();
  Inputs random;
  INFO("seed " << random.seed());
  const auto x = random.uniform(2 * 16 * 64);
  const auto seed = random.uniform(2 * 16 * 64);
  struct Case {
    DType dtype;
    bool autocast;
    double tolerance;
  };
  // 16-bit cases: both backends round the same weights; what differs is accumulation
  // order and the rounding of each stored activation, a few 16-bit ulps through 2 blocks.
  for (const Case c : {Case{DType::F64, false, 1e-10}, Case{DType::F32, false, 1e-4}, Case{DType::BF16, true, 5e-2},
                       Case{DType::F16, true, 1e-2}}) {
    INFO("dtype " << dtype_name(c.dtype) << (c.autocast ? " (autocast)" : ""));
    const auto cpu = transformer_step<Cpu>(c.dtype, rounded_to(x, c.autocast ? DType::F32 : c.dtype),
                                           rounded_to(seed, c.dtype), c.autocast);
    const auto gpu = transformer_step<Gpu>(c.dtype, rounded_to(x, c.autocast ? DType::F32 : c.dtype),
                                           rounded_to(seed, c.dtype), c.autocast);
    REQUIRE(cpu.size() == gpu.size());
    const std::vector<std::string> names = transformer_result_names();
    REQUIRE(names.size() == cpu.size());
    for (std::size_t i = 0; i < cpu.size(); ++i) {
      INFO("result " << i << " " << names[i] << " (0: output, 1: input gradient, then parameter gradients)");
      const std::string_view name = names[i];
      if (name.size() > 11 && name.substr(name.size() - 11) == "attn.k.bias") {
        // Softmax is shift invariant, so the k bias gets no gradient: both backends hold
        // rounding noise there (their relative error is meaningless), small beside the k
        // weight's gradient (results[i - 1]).
        REQUIRE(names[i - 1] == std::string(name.substr(0, name.size() - 4)) + "weight");
        CHECK(norm_of(gpu[i]) <= c.tolerance * norm_of(gpu[i - 1]));
        CHECK(norm_of(cpu[i]) <= c.tolerance * norm_of(cpu[i - 1]));
        continue;
      }
      CHECK(relative_error(gpu[i], cpu[i]) <= c.tolerance);
    }
  }
}
