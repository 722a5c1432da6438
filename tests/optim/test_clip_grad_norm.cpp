// tests/optim/test_clip_grad_norm.cpp — global gradient-norm clipping, alone and after unscale_.
//
// References: the 2-norm in closed form (a 3-4-12-13 quadruple) and summed in f64.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include <trainmem/amp/grad_scaler.hpp>
#include <trainmem/optim/clip_grad_norm.hpp>
#include <trainmem/optim/sgd.hpp>
#include <trainmem/trainmem.hpp>

#include "test_data.hpp"

namespace tmem = trainmem;
using B = tmem::cpu::Backend;
using tmem::DType;

namespace {
tmem::Var<B> parameter(std::vector<double> values) {
  const auto n = static_cast<std::int64_t>(values.size());
  return tmem::Var<B>::parameter(tmem::Tensor<B>::from_host(tmem::Shape{n}, values));
}
void set_grad(const tmem::Var<B>& p, std::vector<double> g, DType dtype = DType::F32) {
  p.set_grad(tmem::Tensor<B>::from_host(p.shape(), g, dtype, tmem::MemCategory::Gradient));
}
}  // namespace

TEST_CASE("clip_grad_norm scales every gradient by max_norm / norm when the norm is larger", "[amp][clip]") {
  auto a = parameter({0.0, 0.0}), b = parameter({0.0}), no_grad = parameter({0.0});
  const std::vector<tmem::Var<B>> params = {a, b, no_grad};
  set_grad(a, {3.0, 4.0});
  set_grad(b, {12.0});  // total norm sqrt(9 + 16 + 144) = 13

  CHECK(tmem::optim::clip_grad_norm(params, 20.0) == Approx(13.0).epsilon(1e-7));
  CHECK(a.grad().to_host<double>() == std::vector<double>{3.0, 4.0});  // below max_norm: unchanged

  CHECK(tmem::optim::clip_grad_norm(params, 6.5) == Approx(13.0).epsilon(1e-7));
  const double factor = 6.5 / (13.0 + 1e-6);
  CHECK(a.grad().to_host<double>()[0] == Approx(3.0 * factor).epsilon(1e-6));
  CHECK(a.grad().to_host<double>()[1] == Approx(4.0 * factor).epsilon(1e-6));
  CHECK(b.grad().to_host<double>()[0] == Approx(12.0 * factor).epsilon(1e-6));
  CHECK(tmem::optim::clip_grad_norm(params, 100.0) == Approx(6.5).epsilon(1e-6));

  // Many elements, several dtypes: against an f64 sum of squares.
  const auto g1 = tmem::testing::random_values(5000, 3, -2.0, 2.0),
             g2 = tmem::testing::random_values(777, 4, -1.0, 1.0);
  auto c = parameter(std::vector<double>(g1.size())), d = parameter(std::vector<double>(g2.size()));
  set_grad(c, g1);
  set_grad(d, g2, DType::BF16);
  double sum_sq = 0;
  for (double v : g1) sum_sq += static_cast<double>(static_cast<float>(v)) * static_cast<float>(v);
  for (double v : d.grad().to_host<double>()) sum_sq += v * v;
  CHECK(tmem::optim::clip_grad_norm(std::vector<tmem::Var<B>>{c, d}, 1e9) == Approx(std::sqrt(sum_sq)).epsilon(1e-5));
}

TEST_CASE("clip_grad_norm refuses a parameter listed twice: it would count and scale its gradient twice",
          "[amp][clip]") {
  auto w = parameter({0.0, 0.0});
  set_grad(w, {3.0, 4.0});
  CHECK_THROWS_WITH(tmem::optim::clip_grad_norm(std::vector<tmem::Var<B>>{w, w}, 1.0),
                    Catch::Contains("clip_grad_norm: parameters 0 ('') and 1 ('') share values"));
  CHECK(w.grad().to_host<double>() == std::vector<double>{3.0, 4.0});
  CHECK(tmem::optim::clip_grad_norm(std::vector<tmem::Var<B>>{w}, 1.0) == Approx(5.0).epsilon(1e-7));
}

TEST_CASE("clipping works on unscaled gradients: unscale_, clip, step", "[amp][clip]") {
  auto w = parameter({1.0, 1.0, 1.0});
  tmem::optim::SGD<B> sgd({w}, {.lr = 1.0});
  tmem::amp::GradScaler<B> scaler({.init_scale = 1024.0});
  set_grad(w, {3.0 * 1024, 4.0 * 1024, 12.0 * 1024}, DType::F16);  // what backward on the scaled loss gives
  scaler.unscale_(sgd);
  CHECK(tmem::optim::clip_grad_norm(sgd, 6.5) == Approx(13.0).epsilon(1e-6));
  CHECK(scaler.step(sgd));
  scaler.update();
  const double factor = 6.5 / (13.0 + 1e-6);
  const auto after = w.value().to_host<double>();
  CHECK(after[0] == Approx(1.0 - 3.0 * factor).epsilon(1e-6));
  CHECK(after[1] == Approx(1.0 - 4.0 * factor).epsilon(1e-6));
  CHECK(after[2] == Approx(1.0 - 12.0 * factor).epsilon(1e-6));

  // An overflowed step: the norm is inf, the gradients are left alone and the step skipped.
  set_grad(w, {1.0, std::numeric_limits<double>::infinity(), 1.0}, DType::F16);
  scaler.unscale_(sgd);
  CHECK(std::isinf(tmem::optim::clip_grad_norm(sgd, 1.0)));
  CHECK_FALSE(scaler.step(sgd));
  scaler.update();
  CHECK(w.value().to_host<double>() == after);
  CHECK(scaler.get_scale() == 512.0);
}
