// tests/core/test_fp8_tensor.cpp — FP8 tensors are storage: made, moved, saved; never computed on.
//
// Tensors of F8E4M3 / F8E5M2 are created (from_host, full, zeros), copied, downloaded
// and kept in state files bit for bit; every kernel but the FP8 ones refuses them with an
// Error that names the op and says to quantize/dequantize first. Expected values are
// worked out by hand from the formats (E4M3: 4 exponent bits, bias 7, 3 mantissa bits,
// max 448; E5M2: 5, 15, 2, max 57344).
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <vector>

#include "error_matchers.hpp"
#include "trainmem/trainmem.hpp"

namespace fp8_tensor {
using B = trainmem::cpu::Backend;
using T = trainmem::Tensor<B>;

std::vector<std::uint8_t> raw_bytes(const T& t) {
  std::vector<std::uint8_t> out(t.bytes());
  t.backend().download(out.data(), t.data(), t.bytes());
  return out;
}
}  // namespace fp8_tensor

TEST_CASE("FP8 tensors: from_host rounds and saturates, to_host widens exactly", "[core][fp8][tensor]") {
  using namespace trainmem;
  using fp8_tensor::T;
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<double> values{1.0, 0.3, -500.0, inf, std::ldexp(1.0, -10), -std::ldexp(1.0, -9), 448.0};
  // 0.3 = 1.2 * 2^-2: 1.25 * 2^-2 in both formats (1.010b; 1.01b). 2^-10 is half of E4M3's
  // smallest subnormal (ties to zero) and E5M2's normal 1.00b * 2^-10.
  const T e4 = T::from_host(Shape{7}, values, DType::F8E4M3);
  CHECK(e4.dtype() == DType::F8E4M3);
  CHECK(e4.bytes() == 7);
  CHECK(fp8_tensor::raw_bytes(e4) == std::vector<std::uint8_t>{0x38, 0x2A, 0xFE, 0x7E, 0x00, 0x81, 0x7E});
  CHECK(e4.to_host<double>() == std::vector<double>{1.0, 0.3125, -448.0, 448.0, 0.0, -std::ldexp(1.0, -9), 448.0});
  const T e5 = T::from_host(Shape{7}, values, DType::F8E5M2);
  CHECK(fp8_tensor::raw_bytes(e5) == std::vector<std::uint8_t>{0x3C, 0x35, 0xE0, 0x7B, 0x14, 0x98, 0x5F});
  CHECK(e5.to_host<float>() ==
        std::vector<float>{1.0f, 0.3125f, -512.0f, 57344.0f, std::ldexp(1.0f, -10), -std::ldexp(1.0f, -9), 448.0f});
}

TEST_CASE("FP8 tensors: full, zeros, clone, copy_from, reshape move bytes", "[core][fp8][tensor]") {
  using namespace trainmem;
  using fp8_tensor::T;
  const T full = T::full(Shape{3, 5}, -1000.0, DType::F8E4M3);  // saturates to -448: 0xFE
  CHECK(fp8_tensor::raw_bytes(full) == std::vector<std::uint8_t>(15, 0xFE));
  CHECK(fp8_tensor::raw_bytes(T::zeros(Shape{4}, DType::F8E5M2)) == std::vector<std::uint8_t>(4, 0x00));
  const T src = T::from_host(Shape{2, 2}, std::vector<double>{1, 2, 3, 4}, DType::F8E5M2);
  const T copy = src.clone();
  CHECK(copy.dtype() == DType::F8E5M2);
  CHECK(copy.to_host() == std::vector<float>{1, 2, 3, 4});
  const T dst = T::zeros(Shape{2, 2}, DType::F8E5M2);
  dst.copy_from(src);
  CHECK(fp8_tensor::raw_bytes(dst) == fp8_tensor::raw_bytes(src));
  CHECK(dst.reshape(Shape{4}).to_host() == std::vector<float>{1, 2, 3, 4});
}

TEST_CASE("FP8 tensors: a state file keeps them bit for bit", "[core][fp8][tensor][state]") {
  using namespace trainmem;
  using fp8_tensor::T;
  const T e4 = T::from_host(Shape{2, 3}, std::vector<double>{1, -2, 0.5, 448, 1e-3, -0.0}, DType::F8E4M3);
  const T e5 = T::from_host(Shape{3}, std::vector<double>{57344, -1.5, std::ldexp(1.0, -16)}, DType::F8E5M2);
  StateDict state;
  state.set("e4", e4);
  state.set("e5", e5);
  CHECK(state.at("e4").type == StateType::F8E4M3);
  CHECK(state.at("e5").type == StateType::F8E5M2);
  CHECK(size_of(StateType::F8E4M3) == 1);
  CHECK(name_of(StateType::F8E5M2) == "f8e5m2");
  const auto path = std::filesystem::temp_directory_path() / ("trainmem_fp8_state_" + std::to_string(::getpid()));
  save(path, state);
  const StateDict back = load(path);
  std::filesystem::remove(path);
  CHECK(back == state);
  const T e4_back = back.at("e4").to_tensor(MemCategory::Temporary, fp8_tensor::B::default_instance());
  CHECK(e4_back.dtype() == DType::F8E4M3);
  CHECK(fp8_tensor::raw_bytes(e4_back) == fp8_tensor::raw_bytes(e4));
  // Loading into an existing tensor checks the dtype like any other.
  const T into = T::zeros(Shape{3}, DType::F8E5M2);
  load_state(into, back.sub("e5"));
  CHECK(fp8_tensor::raw_bytes(into) == fp8_tensor::raw_bytes(e5));
  const T wrong = T::zeros(Shape{3}, DType::F8E4M3);
  CHECK_THROWS_MATCHES(load_state(wrong, back.sub("e5")), Error, testing::ErrorContains("f8e5m2"));
}

TEST_CASE("FP8 tensors: kernels that compute refuse them, naming the op", "[core][fp8][tensor]") {
  using namespace trainmem;
  using fp8_tensor::T;
  using testing::ErrorContains;
  fp8_tensor::B& be = fp8_tensor::B::default_instance();
  const T f8 = T::zeros(Shape{2, 2}, DType::F8E4M3);
  const T f32 = T::zeros(Shape{2, 2}, DType::F32);
  const char* advice = "quantize/dequantize first";
  CHECK_THROWS_MATCHES(be.fill(f8, 1.0), Error, ErrorContains("fill: got an f8e4m3 tensor") && ErrorContains(advice));
  CHECK_THROWS_MATCHES(be.map(math::Identity{}, f8, f32), Error, ErrorContains("map") && ErrorContains(advice));
  CHECK_THROWS_MATCHES(be.map(math::Identity{}, f32, f8), Error, ErrorContains("map") && ErrorContains(advice));
  CHECK_THROWS_MATCHES(be.gemm(GemmArgs{.m = 2, .n = 2, .k = 2}, f8, f8, f32), Error,
                       ErrorContains("gemm") && ErrorContains(advice));
  CHECK_THROWS_MATCHES(be.sum_all(f8, T::zeros(Shape{1}, DType::F32)), Error,
                       ErrorContains("sum_all") && ErrorContains(advice));
  CHECK_THROWS_MATCHES(f8.to(DType::F32), Error, ErrorContains("Tensor::to") && ErrorContains(advice));
  CHECK_THROWS_MATCHES(f32.to(DType::F8E5M2), Error, ErrorContains("Tensor::to") && ErrorContains(advice));
}
