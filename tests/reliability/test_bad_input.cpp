// tests/reliability/test_bad_input.cpp — hostile input gets a trainmem::Error, never a crash.
//
// A matrix of calls a careless or hostile caller can make: wrong shapes, dtypes,
// ranks, values (NaN, out of range, fractional ids), stale graphs, settings out of
// range. Each must throw trainmem::Error (not std::bad_alloc, not another exception,
// not undefined behaviour that ASan/UBSan would report); the ones named in the
// message checks below must also say what was wrong. The count is printed for CI.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <typeinfo>
#include <vector>

#include <trainmem/amp/grad_scaler.hpp>
#include <trainmem/optim/clip_grad_norm.hpp>
#include <trainmem/optim/sgd.hpp>
#include <trainmem/trainmem.hpp>

#include "error_matchers.hpp"

namespace tmem = trainmem;
using B = tmem::cpu::Backend;
using tmem::DType;
using tmem::Shape;
using T = tmem::Tensor<B>;
using V = tmem::Var<B>;
using tmem::testing::ErrorContains;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

T f32(Shape shape, B& be, double value = 0.5) {
  return T::from_host(shape, std::vector<double>(static_cast<std::size_t>(shape.numel()), value), DType::F32,
                      tmem::MemCategory::Temporary, be);
}
T i32(Shape shape, std::vector<double> values, B& be) {
  return T::from_host(std::move(shape), values, DType::I32, tmem::MemCategory::Temporary, be);
}

struct Case {
  std::string name;
  std::function<void()> call;
};

}  // namespace

TEST_CASE("bad input: float labels and ids that are not i32 values are errors", "[reliability][bad_input]") {
  B be;
  for (double bad : {kNaN, 1e10, -1e10, 2.7, kInf}) {
    CAPTURE(bad);
    CHECK_THROWS_MATCHES(i32(Shape{2}, {1.0, bad}, be), tmem::Error, ErrorContains("not an i32"));
  }
  CHECK(i32(Shape{3}, {-2147483648.0, 0.0, 2147483647.0}, be).to_host<double>() ==
        std::vector<double>{-2147483648.0, 0.0, 2147483647.0});
}

TEST_CASE("bad input: exp of NaN is NaN without an undefined float-to-int cast", "[reliability][bad_input]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  CHECK(std::isnan(tmem::math::exp(nan)));
  CHECK(tmem::math::exp(std::numeric_limits<float>::infinity()) == std::numeric_limits<float>::infinity());
  CHECK(tmem::math::exp(-std::numeric_limits<float>::infinity()) == 0.0f);
}

TEST_CASE("bad input: embedding backward checks the ids again", "[reliability][bad_input]") {
  B be;
  auto table = V::parameter(f32(Shape{4, 3}, be), "table");
  tmem::Tape<B> tape(be);
  const T ids = i32(Shape{2}, {1.0, 3.0}, be);
  auto out = tmem::embedding(table, tape.input(ids));
  ids.data_as<std::int32_t>()[1] = 1 << 28;  // a raw overwrite after forward (no version bump)
  CHECK_THROWS_MATCHES(tape.backward(tmem::sum(out)), tmem::Error, ErrorContains("outside [0, 4)"));
}

TEST_CASE("bad input: nn::Init turns an impossible allocation into a trainmem::Error", "[reliability][bad_input]") {
  tmem::nn::Init init(1);
  CHECK_THROWS_AS(init.uniform(std::int64_t{1} << 60, -1.0, 1.0), tmem::Error);
  CHECK_THROWS_AS(init.normal(std::int64_t{1} << 60, 0.0, 1.0), tmem::Error);
  CHECK_THROWS_AS(init.uniform(-1, -1.0, 1.0), tmem::Error);
}

TEST_CASE("bad input: clip_grad_norm of finite 1e20 gradients is finite and clips", "[reliability][bad_input]") {
  B be;
  auto w = V::parameter(f32(Shape{4}, be), "w");
  w.set_grad(f32(Shape{4}, be, 1e20));
  // sqrt(4 * 1e40) = 2e20: f32 squares overflow to inf (and nothing is clipped); f64 does not.
  const double norm = tmem::optim::clip_grad_norm(std::vector<V>{w}, 1.0);
  CHECK(norm == Approx(2e20).epsilon(1e-6));
  for (double g : w.grad().to_host<double>()) CHECK(g == Approx(0.5).epsilon(1e-5));
}

TEST_CASE("bad input: a seed gradient of another dtype is an error at backward", "[reliability][bad_input]") {
  B be;
  auto w = V::parameter(f32(Shape{2, 2}, be), "w");
  tmem::Tape<B> tape(be);
  auto y = tmem::matmul(tape.input(f32(Shape{3, 2}, be)), w);
  const T seed = T::from_host(Shape{3, 2}, std::vector<double>(6, 1.0), DType::F64, tmem::MemCategory::Temporary, be);
  CHECK_THROWS_MATCHES(tape.backward(y, seed), tmem::Error, ErrorContains("seed gradient"));
}

TEST_CASE("bad input: the matrix — every hostile call throws trainmem::Error", "[reliability][bad_input]") {
  B be;
  auto w = V::parameter(f32(Shape{3, 4}, be), "w");
  auto table = V::parameter(f32(Shape{5, 2}, be), "table");
  auto gamma = V::parameter(f32(Shape{4}, be), "gamma");
  auto beta = V::parameter(f32(Shape{4}, be), "beta");
  tmem::Tape<B> tape(be), other(be);
  auto x = tape.input(f32(Shape{2, 4}, be), true);
  auto x3 = tape.input(f32(Shape{2, 3, 4}, be));
  auto on_other = other.input(f32(Shape{2, 4}, be), true);
  const T labels = i32(Shape{2}, {0.0, 1.0}, be);
  tmem::Var<B> stale;
  {
    tmem::Tape<B> gone(be);
    stale = tmem::relu(gone.input(f32(Shape{2, 4}, be), true));
  }
  std::vector<Case> cases = {
      {"matmul inner mismatch", [&] { tmem::matmul(x, w); }},
      {"matmul rank 1", [&] { tmem::matmul(tape.input(f32(Shape{4}, be)), w); }},
      {"bmm rank 2", [&] { tmem::bmm(x, x); }},
      {"linear weight mismatch",
       [&] {
         tmem::linear(x, V::parameter(f32(Shape{3, 5}, be)));
       }},
      {"linear bias mismatch", [&] { tmem::linear(x, w, V::parameter(f32(Shape{4}, be))); }},
      {"add shape mismatch",
       [&] {
         tmem::add(x, tape.input(f32(Shape{3, 4}, be)));
       }},
      {"mul shape mismatch",
       [&] {
         tmem::mul(x, tape.input(f32(Shape{2, 3}, be)));
       }},
      {"add across tapes", [&] { tmem::add(x, on_other); }},
      {"op on no tape", [&] { tmem::relu(w); }},
      {"op on a destroyed tape's Var", [&] { tmem::relu(stale); }},
      {"backward of a destroyed tape's Var",
       [&] {
         stale.backward(f32(Shape{2, 4}, be));
       }},
      {"backward of a non-scalar without seed", [&] { tape.backward(tmem::relu(x)); }},
      {"backward seed shape mismatch",
       [&] {
         tape.backward(tmem::relu(x), f32(Shape{4, 2}, be));
       }},
      {"backward on another tape", [&] { other.backward(tmem::sum(x)); }},
      {"backward of a no-grad root", [&] { tape.backward(tmem::sum(x3)); }},
      {"relu of i32",
       [&] {
         tmem::relu(tape.input(i32(Shape{2}, {1, 2}, be)));
       }},
      {"softmax of i32",
       [&] {
         tmem::softmax(tape.input(i32(Shape{2}, {1, 2}, be)));
       }},
      {"layer_norm gamma mismatch", [&] { tmem::layer_norm(x, V::parameter(f32(Shape{3}, be)), beta); }},
      {"layer_norm beta mismatch", [&] { tmem::layer_norm(x, gamma, V::parameter(f32(Shape{5}, be))); }},
      {"layer_norm negative eps", [&] { tmem::layer_norm(x, gamma, beta, -1.0); }},
      {"cross_entropy rank 3", [&] { tmem::cross_entropy(x3, labels); }},
      {"cross_entropy labels f32", [&] { tmem::cross_entropy(x, f32(Shape{2}, be)); }},
      {"cross_entropy labels too few", [&] { tmem::cross_entropy(x, i32(Shape{1}, {0}, be)); }},
      {"cross_entropy label out of range",
       [&] {
         tmem::cross_entropy(x, i32(Shape{2}, {0, 4}, be));
       }},
      {"cross_entropy label negative",
       [&] {
         tmem::cross_entropy(x, i32(Shape{2}, {-1, 0}, be));
       }},
      {"cross_entropy undefined labels", [&] { tmem::cross_entropy(x, T()); }},
      {"cross_entropy empty batch",
       [&] {
         tmem::cross_entropy(tape.input(f32(Shape{0, 4}, be)), i32(Shape{0}, {}, be));
       }},
      {"cross_entropy no classes",
       [&] {
         tmem::cross_entropy(tape.input(f32(Shape{2, 0}, be)), labels);
       }},
      {"embedding ids f32", [&] { tmem::embedding(table, tape.input(f32(Shape{2}, be))); }},
      {"embedding id out of range",
       [&] {
         tmem::embedding(table, tape.input(i32(Shape{2}, {0, 5}, be)));
       }},
      {"embedding id negative",
       [&] {
         tmem::embedding(table, tape.input(i32(Shape{2}, {-1, 0}, be)));
       }},
      {"embedding table rank 1", [&] { tmem::embedding(gamma, tape.input(i32(Shape{1}, {0}, be))); }},
      {"reshape count mismatch",
       [&] {
         tmem::reshape(x, Shape{3, 3});
       }},
      {"transpose rank 1", [&] { tmem::transpose(tape.input(f32(Shape{4}, be))); }},
      {"split_heads not dividing", [&] { tmem::split_heads(x3, 3); }},
      {"split_heads zero heads", [&] { tmem::split_heads(x3, 0); }},
      {"merge_heads not dividing", [&] { tmem::merge_heads(x3, 4); }},
      {"causal_mask not square", [&] { tmem::causal_mask(x3); }},
      {"dropout p = 1.5", [&] { tmem::dropout(x, 1.5f); }},
      {"dropout p = NaN", [&] { tmem::dropout(x, std::numeric_limits<float>::quiet_NaN()); }},
      {"negative extent",
       [&] {
         Shape({2, -1});
       }},
      {"extent product overflow",
       [&] {
         Shape({std::int64_t{1} << 62, 4});
       }},
      {"byte count overflow",
       [&] { T::empty(Shape{std::int64_t{1} << 61}, DType::F64, tmem::MemCategory::Temporary, be); }},
      {"from_host count mismatch",
       [&] {
         T::from_host(Shape{3}, std::vector<double>{1, 2}, DType::F32);
       }},
      {"from_host i32 NaN", [&] { i32(Shape{1}, {kNaN}, be); }},
      {"from_host i32 1e10", [&] { i32(Shape{1}, {1e10}, be); }},
      {"from_host i32 2.7", [&] { i32(Shape{1}, {2.7}, be); }},
      {"reshape undefined", [&] { T().reshape(Shape{1}); }},
      {"slice out of range",
       [&] {
         f32(Shape{2, 2}, be).slice(1, 3);
       }},
      {"copy_from shape mismatch", [&] { f32(Shape{2}, be).copy_from(f32(Shape{3}, be)); }},
      {"data_as wrong dtype", [&] { f32(Shape{2}, be).data_as<double>(); }},
      {"parameter of i32", [&] { V::parameter(i32(Shape{1}, {1}, be)); }},
      {"tape input undefined", [&] { tape.input(T()); }},
      {"tape input i32 requiring grad", [&] { tape.input(i32(Shape{1}, {1}, be), true); }},
      {"grad of a non-leaf", [&] { tmem::relu(x).grad(); }},
      {"undefined Var", [&] { V().shape(); }},
      {"Linear with 0 inputs",
       [&] {
         tmem::nn::Init init;
         tmem::nn::Linear<B>(0, 3, init);
       }},
      {"Init of 2^60 values", [&] { tmem::nn::Init(1).uniform(std::int64_t{1} << 60, 0, 1); }},
      {"SGD negative lr", [&] { tmem::optim::SGD<B>({w}, {.lr = -1.0}); }},
      {"SGD of a non-leaf", [&] { tmem::optim::SGD<B>({tmem::relu(x)}, {}); }},
      {"AdamW beta1 = 1", [&] { tmem::optim::AdamW<B>({w}, {.beta1 = 1.0}); }},
      {"clip_grad_norm NaN max", [&] { tmem::optim::clip_grad_norm(std::vector<V>{w}, kNaN); }},
      {"scaler init 0", [&] { tmem::amp::GradScaler<B>(DType::F16, {.init_scale = 0.0}); }},
      {"scaler init 1e-50", [&] { tmem::amp::GradScaler<B>(DType::F16, {.init_scale = 1e-50}); }},
      {"scaler init 1e39", [&] { tmem::amp::GradScaler<B>(DType::F16, {.init_scale = 1e39}); }},
      {"scaler init NaN", [&] { tmem::amp::GradScaler<B>(DType::F16, {.init_scale = kNaN}); }},
      {"scaler backoff 1", [&] { tmem::amp::GradScaler<B>(DType::F16, {.backoff_factor = 1.0}); }},
      {"scaler growth 1", [&] { tmem::amp::GradScaler<B>(DType::F16, {.growth_factor = 1.0}); }},
      {"scaler interval 0", [&] { tmem::amp::GradScaler<B>(DType::F16, {.growth_interval = 0}); }},
      {"scaler hysteresis 0", [&] { tmem::amp::GradScaler<B>(DType::F16, {.hysteresis = 0}); }},
      {"scaler min > max", [&] { tmem::amp::GradScaler<B>(DType::F16, {.min_scale = 8.0, .max_scale = 4.0}); }},
      {"scaler update(0)", [&] { tmem::amp::GradScaler<B>(DType::F16, {}).update(0.0); }},
      {"scaler update() before step", [&] { tmem::amp::GradScaler<B>(DType::F16, {}).update(); }},
      {"scaler state text junk", [&] { tmem::amp::GradScalerState::from_string("scale=abc\n"); }},
      {"scaler state scale 1e39",
       [&] {
         auto s = tmem::amp::GradScalerState{};
         s.scale = 1e39;
         tmem::amp::GradScalerState::from_string(s.to_string());
       }},
      {"scaler state tracker 2.5",
       [&] {
         auto m = tmem::amp::GradScalerState{}.to_map();
         m["_growth_tracker"] = 2.5;
         tmem::amp::GradScalerState::from_map(m);
       }},
      {"scaler state missing key",
       [&] {
         auto m = tmem::amp::GradScalerState{}.to_map();
         m.erase("scale");
         tmem::amp::GradScalerState::from_map(m);
       }},
      {"scaler scale of a parameter", [&] { tmem::amp::GradScaler<B>(DType::F16, {}).scale(w); }},
  };
  int typed = 0;
  for (const Case& c : cases) {
    INFO(c.name);
    bool got_error = false;
    try {
      c.call();
    } catch (const tmem::Error&) {
      got_error = true;
    } catch (const std::exception& e) {
      FAIL_CHECK(c.name << ": threw " << typeid(e).name() << " (" << e.what() << "), not trainmem::Error");
      continue;
    }
    CHECK(got_error);
    typed += got_error ? 1 : 0;
  }
  CHECK(typed == static_cast<int>(cases.size()));
  WARN("bad input matrix: " << cases.size() << " hostile calls, " << typed << " typed trainmem::Error, 0 crashes");
}
