// tests/backend/cuda/test_cuda_fp8.cu — cuda::Backend's FP8 kernels against the CPU's exact emulation.
//
// quantize_fp8 and dequantize_fp8 run core/fp8_rules.hpp's element functions on both
// backends, so codes, values and amax must be equal bit for bit (amax: both NaN where a
// NaN is in the data). gemm_fp8 sums in a different order on each side, so C is held to
// the sum of the two sides' errors against the exact result (f = alpha a_scale_inv
// b_scale_inv, S = sum_k |a_ik b_kj| of the decoded FP8 values, u = 2^-24, u_C C's unit
// roundoff):
//   CPU (f32 sums, the f32 factor): (k + 4) u |f| S + 3 u |beta c| + u_C |C_cpu|
//   GPU, bf16-widened path (shapes cuBLASLt's FP8 kernels refuse): the same with C_gpu
//   GPU, FP8 Tensor Cores (FAST_ACCUM off): cuBLASLt promotes partial sums to f32 at
//     least every 128 products, and the Tensor Core's own partial sums are taken to hold
//     14 bits (DeepSeek-V3's measurement on Hopper FP8 GEMM), so at most
//     min(k, 128) 2^-14 |f| S more, plus the f32 terms above.
// Where all sums are small integers (|partial sum| < 2^10) both sides are exact and
// must agree bit for bit, whichever path ran.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda_test_support.cuh"

namespace cuda_fp8_test {

namespace tmem = trainmem;
using namespace trainmem::cuda_testing;
using tmem::DType;
using tmem::Shape;

template <class Backend>
tmem::Tensor<Backend> from_codes(Backend& backend, const std::vector<std::uint8_t>& codes, DType dtype) {
  auto t = tmem::Tensor<Backend>::empty(Shape{static_cast<std::int64_t>(codes.size())}, dtype,
                                        tmem::MemCategory::Temporary, backend);
  if (!codes.empty()) backend.upload(t.data(), codes.data(), codes.size());
  return t;
}
template <class Backend>
std::vector<std::uint8_t> codes_of(const tmem::Tensor<Backend>& t) {
  std::vector<std::uint8_t> out(t.bytes());
  if (!out.empty()) t.backend().download(out.data(), t.data(), t.bytes());
  return out;
}
template <class Backend>
tmem::Tensor<Backend> scalar(Backend& backend, float value) {
  return tmem::Tensor<Backend>::from_host(Shape{1}, std::vector<float>{value}, DType::F32, tmem::MemCategory::Temporary,
                                          backend);
}
bool finite_code(std::uint8_t code, DType dtype) {
  return dtype == DType::F8E4M3 ? (code & 0x7f) != 0x7f : (code & 0x7f) < 0x7c;
}
float value_of(std::uint8_t code, DType dtype) {
  return dtype == DType::F8E4M3 ? static_cast<float>(tmem::Float8E4M3::from_bits(code))
                                : static_cast<float>(tmem::Float8E5M2::from_bits(code));
}
double unit_roundoff_of(DType dtype) {
  return dtype == DType::BF16 ? std::ldexp(1.0, -8) : dtype == DType::F16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -24);
}

struct Fp8GemmCase {
  tmem::GemmArgs g;
  DType a = DType::F8E4M3, b = DType::F8E4M3, c = DType::BF16;
  float a_scale_inv = 1.0f, b_scale_inv = 1.0f;
  bool integers = false;     // operands in [-4, 4]: every sum exact on both sides
  bool tensor_core = false;  // a shape cuBLASLt's FP8 kernels take (its looser bound applies)
  std::string describe() const {
    return tmem::detail::concat(name_of(a), " x ", name_of(b), " -> ", name_of(c), g.trans_a ? " T" : " N",
                                g.trans_b ? "T" : "N", " batch=", g.batch, " m=", g.m, " n=", g.n, " k=", g.k,
                                " strides ", g.stride_a, "/", g.stride_b, "/", g.stride_c, " alpha=", g.alpha,
                                " beta=", g.beta, integers ? " integers" : "");
  }
};

/// Worst |C_gpu - C_cpu| over its bound (<= 1 passes) for one case.
double gemm_error_over_bound(Gpu& gpu, Inputs& random, const Fp8GemmCase& tc) {
  const tmem::GemmArgs& g = tc.g;
  const std::int64_t a_span = tmem::fp8::operand_span(g.batch, g.stride_a, g.m * g.k);
  const std::int64_t b_span = tmem::fp8::operand_span(g.batch, g.stride_b, g.k * g.n);
  const std::int64_t c_span = tmem::fp8::operand_span(g.batch, g.stride_c, g.m * g.n);
  auto random_codes = [&](std::int64_t n, DType dtype) {
    std::vector<std::uint8_t> codes(static_cast<std::size_t>(n));
    for (auto& code : codes) {
      if (tc.integers) {
        const float v = static_cast<float>(random.integer(-4, 4));
        code = dtype == DType::F8E4M3 ? tmem::Float8E4M3(v).bits : tmem::Float8E5M2(v).bits;
        continue;
      }
      do code = static_cast<std::uint8_t>(random.integer(0, 255));
      while (!finite_code(code, dtype) || std::fabs(value_of(code, dtype)) > 64.0f);
    }
    return codes;
  };
  const auto a_codes = random_codes(a_span, tc.a), b_codes = random_codes(b_span, tc.b);
  const auto c0 = tc.integers ? random.integers(c_span, -8, 8) : rounded_to(random.uniform(c_span, -4, 4), tc.c);

  Cpu& cpu = Cpu::default_instance();
  auto c_cpu = tmem::Tensor<Cpu>::from_host(Shape{c_span}, c0, tc.c, tmem::MemCategory::Temporary, cpu);
  cpu.gemm_fp8(g, from_codes(cpu, a_codes, tc.a), from_codes(cpu, b_codes, tc.b), c_cpu, scalar(cpu, tc.a_scale_inv),
               scalar(cpu, tc.b_scale_inv));
  auto c_gpu = tmem::Tensor<Gpu>::from_host(Shape{c_span}, c0, tc.c, tmem::MemCategory::Temporary, gpu);
  gpu.gemm_fp8(g, from_codes(gpu, a_codes, tc.a), from_codes(gpu, b_codes, tc.b), c_gpu, scalar(gpu, tc.a_scale_inv),
               scalar(gpu, tc.b_scale_inv));
  const auto cpu_values = c_cpu.to_host<double>(), gpu_values = c_gpu.to_host<double>();

  const double u = std::ldexp(1.0, -24), u_c = unit_roundoff_of(tc.c);
  const double f = std::fabs(g.alpha * tc.a_scale_inv * tc.b_scale_inv);
  const double tensor_core =
      tc.tensor_core ? static_cast<double>(std::min<std::int64_t>(g.k, 128)) * std::ldexp(1.0, -14) : 0.0;
  double worst = 0.0;
  for (std::int64_t e = 0; e < g.batch; ++e)
    for (std::int64_t i = 0; i < g.m; ++i)
      for (std::int64_t j = 0; j < g.n; ++j) {
        double s = 0.0;
        for (std::int64_t p = 0; p < g.k; ++p) {
          const std::int64_t ai = e * g.stride_a + (g.trans_a ? p * g.m + i : i * g.k + p);
          const std::int64_t bi = e * g.stride_b + (g.trans_b ? j * g.k + p : p * g.n + j);
          s += std::fabs(static_cast<double>(value_of(a_codes[ai], tc.a)) * value_of(b_codes[bi], tc.b));
        }
        const std::size_t ci = static_cast<std::size_t>(e * g.stride_c + i * g.n + j);
        const double got = gpu_values[ci], want = cpu_values[ci];
        if (std::isnan(got) || std::isnan(want)) return INFINITY;
        const double beta_c = std::fabs(g.beta * c0[ci]);
        const double bound = tc.integers ? 0.0
                                         : (2.0 * (static_cast<double>(g.k) + 4) * u + tensor_core) * f * s +
                                               6 * u * beta_c + u_c * (std::fabs(got) + std::fabs(want));
        const double err = std::fabs(got - want);
        if (err > bound) return err == 0.0 ? 0.0 : (bound == 0.0 ? INFINITY : err / bound);
        if (bound > 0.0) worst = std::max(worst, err / bound);
      }
  return worst;
}

}  // namespace cuda_fp8_test

TEST_CASE("cuda quantize_fp8 / dequantize_fp8: the CPU emulation's bits, amax included", "[cuda][fp8]") {
  TRAINMEM_REQUIRE_CUDA_DEVICE();
  using namespace cuda_fp8_test;
  Gpu& gpu = Gpu::default_instance();
  Cpu& cpu = Cpu::default_instance();
  Inputs random;
  INFO("seed " << random.seed());
  const std::int64_t n = 70001;  // several blocks, a ragged tail
  for (DType src_dtype : {DType::F32, DType::BF16, DType::F16})
    for (DType fp8 : {DType::F8E4M3, DType::F8E5M2})
      for (int special : {0, 1, 2}) {  // none, an inf, an inf and a NaN
        auto values = random.uniform(n, -600.0, 600.0);
        if (special >= 1) values[static_cast<std::size_t>(n / 2)] = -INFINITY;
        if (special >= 2) values[static_cast<std::size_t>(n - 1)] = NAN;
        const float scale = 0.37f;
        INFO(name_of(src_dtype) << " -> " << name_of(fp8) << " special " << special);
        auto src_cpu = tmem::Tensor<Cpu>::from_host(Shape{n}, values, src_dtype, tmem::MemCategory::Temporary, cpu);
        auto src_gpu = tmem::Tensor<Gpu>::from_host(Shape{n}, values, src_dtype, tmem::MemCategory::Temporary, gpu);
        auto dst_cpu = tmem::Tensor<Cpu>::empty(Shape{n}, fp8, tmem::MemCategory::Temporary, cpu);
        auto dst_gpu = tmem::Tensor<Gpu>::empty(Shape{n}, fp8, tmem::MemCategory::Temporary, gpu);
        auto amax_cpu = scalar(cpu, 1.5f);
        auto amax_gpu = scalar(gpu, 1.5f);
        cpu.quantize_fp8(src_cpu, scalar(cpu, scale), dst_cpu, amax_cpu);
        gpu.quantize_fp8(src_gpu, scalar(gpu, scale), dst_gpu, amax_gpu);
        CHECK(codes_of(dst_gpu) == codes_of(dst_cpu));
        const float amax_c = amax_cpu.to_host()[0], amax_g = amax_gpu.to_host()[0];
        if (special == 2) {
          CHECK(std::isnan(amax_c));
          CHECK(std::isnan(amax_g));
        } else {
          CHECK(amax_g == amax_c);
        }
        for (DType out : {DType::F32, DType::BF16, DType::F16}) {
          auto back_cpu = tmem::Tensor<Cpu>::empty(Shape{n}, out, tmem::MemCategory::Temporary, cpu);
          auto back_gpu = tmem::Tensor<Gpu>::empty(Shape{n}, out, tmem::MemCategory::Temporary, gpu);
          cpu.dequantize_fp8(dst_cpu, scalar(cpu, 1.0f / scale), back_cpu);
          gpu.dequantize_fp8(dst_gpu, scalar(gpu, 1.0f / scale), back_gpu);
          std::vector<std::uint8_t> bytes_cpu(back_cpu.bytes()), bytes_gpu(back_gpu.bytes());
          cpu.download(bytes_cpu.data(), back_cpu.data(), back_cpu.bytes());
          gpu.download(bytes_gpu.data(), back_gpu.data(), back_gpu.bytes());
          CHECK(bytes_gpu == bytes_cpu);
        }
      }
}

TEST_CASE("cuda gemm_fp8: cuBLASLt FP8 and the widened path against the CPU emulation", "[cuda][fp8][gemm]") {
  TRAINMEM_REQUIRE_CUDA_DEVICE();
  using namespace cuda_fp8_test;
  Gpu& gpu = Gpu::default_instance();
  Inputs random;
  INFO("seed " << random.seed());
  std::vector<Fp8GemmCase> cases;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      // Tensor Core shapes (k and n multiples of 16): TN directly, the rest through transposes.
      Fp8GemmCase tc;
      tc.g = tmem::GemmArgs{.m = 128, .n = 96, .k = 256, .trans_a = ta, .trans_b = tb};
      tc.a_scale_inv = 0.125f;
      tc.b_scale_inv = 3.0f;
      tc.tensor_core = true;
      for (DType c : {DType::BF16, DType::F32, DType::F16}) {
        tc.c = c;
        cases.push_back(tc);
      }
      tc.a = DType::F8E4M3;
      tc.b = DType::F8E5M2;
      cases.push_back(tc);
      tc.a = DType::F8E5M2;
      tc.b = DType::F8E4M3;
      tc.g.alpha = -0.5;
      tc.g.beta = 0.75;
      cases.push_back(tc);
      // Batched: strided, B shared (a weight), with gaps between entries.
      tc.g = tmem::GemmArgs{.batch = 3,
                            .m = 64,
                            .n = 48,
                            .k = 64,
                            .trans_a = ta,
                            .trans_b = tb,
                            .stride_a = 64 * 64 + 16,
                            .stride_b = 0,
                            .stride_c = 64 * 48};
      cases.push_back(tc);
      tc.g.stride_b = 48 * 64;
      tc.g.stride_c = 64 * 48 + 8;
      cases.push_back(tc);
      // Shapes cuBLASLt's FP8 kernels refuse (k, n not multiples of 16): the widened path.
      Fp8GemmCase odd;
      odd.g = tmem::GemmArgs{.m = 37, .n = 29, .k = 70, .trans_a = ta, .trans_b = tb, .beta = 0.5};
      odd.a_scale_inv = 0.01f;
      odd.b_scale_inv = 2.0f;
      cases.push_back(odd);
      odd.c = DType::F32;
      odd.b = DType::F8E5M2;
      cases.push_back(odd);
      // Exact sums: bit for bit on either path.
      Fp8GemmCase exact;
      exact.g = tmem::GemmArgs{.m = 64, .n = 32, .k = 32, .trans_a = ta, .trans_b = tb, .beta = 1.0};
      exact.c = DType::F32;
      exact.integers = true;
      cases.push_back(exact);
      exact.g.k = 30;
      cases.push_back(exact);
      exact.g.k = 0;  // no products: beta C
      exact.g.beta = 0.5;
      cases.push_back(exact);
    }
  for (const Fp8GemmCase& tc : cases) {
    const double worst = gemm_error_over_bound(gpu, random, tc);
    INFO(tc.describe() << ": worst error / bound " << worst);
    CHECK(worst <= 1.0);
  }
}
