// tests/optim/test_optimizers.cpp — SGD and AdamW steps against hand-rolled F64 references.
//
// The references follow PyTorch's documented update rules (torch.optim.SGD and
// torch.optim.AdamW pseudo-code), written out here per element; where a closed form
// exists (constant gradients, Adam's first step) it is checked too.
#include <catch2/catch.hpp>
#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "error_matchers.hpp"
#include "test_data.hpp"
#include "trainmem/trainmem.hpp"

using namespace trainmem;
using B = cpu::Backend;
using T = Tensor<B>;
using V = Var<B>;
using testing::ErrorContains;

namespace {

const std::vector<double> kStart = {0.5, -1.0, 2.0, 0.0, 1e-3, -3.0};
const std::vector<std::vector<double>> kGrads = {
    {0.1, -0.2, 0.3, 1.0, -1e-4, 0.0}, {-0.4, 0.5, 0.05, 1.0, 2e-4, 0.7}, {0.2, 0.2, -0.6, 1.0, -3e-4, -0.1}};

V parameter(B& be, const std::vector<double>& values, DType dtype = DType::F64) {
  return V::parameter(
      T::from_host(Shape{static_cast<std::int64_t>(values.size())}, values, dtype, MemCategory::Parameter, be), "p");
}
void set_grad(const V& p, const std::vector<double>& g, B& be, double factor = 1.0) {
  std::vector<double> scaled = g;
  for (auto& v : scaled) v *= factor;
  p.set_grad(T::from_host(p.shape(), scaled, p.dtype(), MemCategory::Gradient, be));
}

/// torch.optim.SGD, per element.
std::vector<double> sgd_reference(const optim::SgdOptions& o, int steps) {
  std::vector<double> p = kStart, buf(p.size(), 0.0);
  for (int t = 0; t < steps; ++t)
    for (std::size_t i = 0; i < p.size(); ++i) {
      double g = kGrads[t][i] + o.weight_decay * p[i];
      if (o.momentum != 0) {
        buf[i] = t == 0 ? g : o.momentum * buf[i] + (1 - o.dampening) * g;
        g = o.nesterov ? g + o.momentum * buf[i] : buf[i];
      }
      p[i] -= o.lr * g;
    }
  return p;
}

/// torch.optim.AdamW, per element.
std::vector<double> adamw_reference(const optim::AdamWOptions& o, int steps) {
  std::vector<double> p = kStart, m(p.size(), 0.0), v(p.size(), 0.0);
  for (int t = 1; t <= steps; ++t)
    for (std::size_t i = 0; i < p.size(); ++i) {
      const double g = kGrads[t - 1][i];
      p[i] *= 1 - o.lr * o.weight_decay;
      m[i] = o.beta1 * m[i] + (1 - o.beta1) * g;
      v[i] = o.beta2 * v[i] + (1 - o.beta2) * g * g;
      const double m_hat = m[i] / (1 - std::pow(o.beta1, t)), v_hat = v[i] / (1 - std::pow(o.beta2, t));
      p[i] -= o.lr * m_hat / (std::sqrt(v_hat) + o.eps);
    }
  return p;
}

void check_close(const std::vector<double>& got, const std::vector<double>& want, double rel) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i);
    CHECK(got[i] == Approx(want[i]).epsilon(rel).margin(rel));
  }
}

}  // namespace

TEST_CASE("SGD: three steps match torch.optim.SGD's rule", "[optim][sgd]") {
  struct Case {
    const char* name;
    optim::SgdOptions options;
  };
  const Case c =
      GENERATE(Case{"plain", {0.1, 0.0, 0.0, 0.0, false}}, Case{"momentum", {0.1, 0.9, 0.0, 0.0, false}},
               Case{"momentum+dampening", {0.05, 0.8, 0.3, 0.0, false}}, Case{"nesterov", {0.1, 0.9, 0.0, 0.0, true}},
               Case{"weight decay", {0.1, 0.0, 0.0, 0.05, false}},
               Case{"momentum+weight decay+nesterov", {0.02, 0.7, 0.0, 0.1, true}});
  const DType dtype = GENERATE(DType::F64, DType::F32);
  INFO(c.name << " " << dtype);
  B be;
  const V p = parameter(be, kStart, dtype);
  optim::SGD<B> sgd({p}, c.options);
  for (int t = 0; t < 3; ++t) {
    set_grad(p, kGrads[t], be);
    sgd.step();
    check_close(p.value().to_host<double>(), sgd_reference(c.options, t + 1), dtype == DType::F64 ? 1e-14 : 1e-6);
  }
  CHECK(sgd.steps() == 3);
  CHECK(p.value().version() == 3);  // every step is an in-place write
  // A momentum buffer like the parameter, only with momentum; counted as optimizer state.
  const auto& entry = sgd.entries().at(0);
  CHECK(entry.first_moment.defined() == (c.options.momentum != 0));
  CHECK_FALSE(entry.second_moment.defined());
  if (entry.first_moment.defined()) {
    CHECK(entry.first_moment.bytes() == kStart.size() * size_of(dtype));
    CHECK(entry.first_moment.category() == MemCategory::OptimizerState);
    CHECK(be.memory().live(MemCategory::OptimizerState) >= static_cast<std::int64_t>(entry.first_moment.bytes()));
  }
}

TEST_CASE("SGD: closed forms for a constant gradient, grad_scale multiplies first", "[optim][sgd]") {
  B be;
  const std::vector<double> g(kStart.size(), 0.25);
  const double lr = 0.1, mu = 0.9;
  SECTION("momentum: p3 = p0 - lr g (3 + 2 mu + mu^2)") {
    const V p = parameter(be, kStart);
    optim::SGD<B> sgd({p}, {lr, mu, 0.0, 0.0, false});
    for (int t = 0; t < 3; ++t) {
      set_grad(p, g, be, 4.0);
      sgd.step(/*grad_scale=*/0.25);  // an unscaling step sees g
    }
    std::vector<double> want(kStart.size());
    for (std::size_t i = 0; i < want.size(); ++i) want[i] = kStart[i] - lr * 0.25 * (3 + 2 * mu + mu * mu);
    check_close(p.value().to_host<double>(), want, 1e-14);
  }
  SECTION("a parameter without a gradient is skipped") {
    const V p = parameter(be, kStart), q = parameter(be, kStart);
    optim::SGD<B> sgd({p, q}, {lr, 0.0, 0.0, 0.0, false});
    set_grad(p, g, be);
    sgd.step();
    CHECK(q.value().to_host<double>() == kStart);
    CHECK(q.value().version() == 0);
    CHECK(p.value().to_host<double>()[0] == Approx(kStart[0] - lr * 0.25));
    sgd.zero_grad();
    CHECK_FALSE(p.grad().defined());
  }
}

TEST_CASE("AdamW: three steps match torch.optim.AdamW's rule", "[optim][adamw]") {
  const optim::AdamWOptions options =
      GENERATE(optim::AdamWOptions{1e-3, 0.9, 0.999, 1e-8, 1e-2}, optim::AdamWOptions{0.05, 0.8, 0.99, 1e-6, 0.1},
               optim::AdamWOptions{0.01, 0.0, 0.5, 1e-3, 0.0});
  const DType dtype = GENERATE(DType::F64, DType::F32);
  INFO("lr " << options.lr << " betas " << options.beta1 << "/" << options.beta2 << " " << dtype);
  B be;
  const V p = parameter(be, kStart, dtype);
  optim::AdamW<B> adam({p}, options);
  for (int t = 0; t < 3; ++t) {
    set_grad(p, kGrads[t], be);
    adam.step();
    check_close(p.value().to_host<double>(), adamw_reference(options, t + 1), dtype == DType::F64 ? 1e-13 : 1e-6);
  }
  // Two moments like the parameter, counted as optimizer state.
  const auto& entry = adam.entries().at(0);
  REQUIRE(entry.first_moment.defined());
  REQUIRE(entry.second_moment.defined());
  CHECK(entry.first_moment.bytes() == kStart.size() * size_of(dtype));
  CHECK(entry.second_moment.bytes() == kStart.size() * size_of(dtype));
  CHECK(entry.first_moment.category() == MemCategory::OptimizerState);
  CHECK(be.memory().live(MemCategory::OptimizerState) >= static_cast<std::int64_t>(2 * kStart.size() * size_of(dtype)));
}

TEST_CASE("AdamW: the first step moves each weight by lr * g / (|g| + eps) after decay", "[optim][adamw]") {
  // m_hat = g and v_hat = g^2 after one step, whatever the betas.
  B be;
  const optim::AdamWOptions o{0.01, 0.9, 0.999, 1e-8, 0.1};
  const V p = parameter(be, kStart);
  optim::AdamW<B> adam({p}, o);
  set_grad(p, kGrads[0], be);
  adam.step();
  const auto got = p.value().to_host<double>();
  for (std::size_t i = 0; i < kStart.size(); ++i) {
    const double g = kGrads[0][i];
    CHECK(got[i] == Approx(kStart[i] * (1 - o.lr * o.weight_decay) - o.lr * g / (std::abs(g) + o.eps)).epsilon(1e-14));
  }
}

TEST_CASE("Optimizers: a training loop through the tape, and bad options", "[optim]") {
  // Least squares on y = X w*: loss = mean((X w - y)^2) falls from its start.
  B be;
  const auto x_values = testing::random_values(32 * 4, 40);
  const std::vector<double> w_true = {1.0, -2.0, 0.5, 3.0};
  std::vector<double> y_values(32);
  for (int r = 0; r < 32; ++r)
    for (int c = 0; c < 4; ++c) y_values[r] += x_values[r * 4 + c] * w_true[c];
  const V w = V::parameter(T::zeros(Shape{4, 1}, DType::F64, MemCategory::Parameter, be), "w");
  optim::AdamW<B> adam({w}, {0.1, 0.9, 0.999, 1e-8, 0.0});
  auto loss_value = [&](bool step) {
    Tape<B> tape(be);
    const V x = tape.input(T::from_host(Shape{32, 4}, x_values, DType::F64, MemCategory::Temporary, be));
    const V y = tape.input(T::from_host(Shape{32, 1}, y_values, DType::F64, MemCategory::Temporary, be));
    const V diff = sub(matmul(x, w), y);
    const V loss = mean(mul(diff, diff));
    const double value = loss.value().to_host<double>()[0];
    if (step) {
      adam.zero_grad();
      tape.backward(loss);
      adam.step();
    }
    return value;
  };
  const double first = loss_value(true);
  for (int i = 0; i < 200; ++i) loss_value(true);
  CHECK(loss_value(false) < 1e-3 * first);

  CHECK_THROWS_MATCHES(optim::SGD<B>({w}, {0.1, 0.0, 0.0, 0.0, true}), Error, ErrorContains("Nesterov"));
  CHECK_THROWS_MATCHES(optim::AdamW<B>({w}, {0.1, 1.0, 0.999, 1e-8, 0.0}), Error,
                       ErrorContains("betas must be in [0, 1)"));
  Tape<B> tape(be);
  const V not_a_leaf = scale(tape.input(T::zeros(Shape{2}, DType::F64, MemCategory::Temporary, be), true), 2.0);
  CHECK_THROWS_MATCHES(optim::SGD<B>({not_a_leaf}, {}), Error, ErrorContains("is not a parameter"));
  CHECK_THROWS_MATCHES(optim::AdamW<B>({w}, {INFINITY, 0.9, 0.999, 1e-8, 0.0}), Error, ErrorContains("got lr inf"));
  CHECK_THROWS_MATCHES(optim::SGD<B>({w}, {0.1, NAN}), Error, ErrorContains("momentum nan"));

  // Options changed between steps through options() are checked by the next step, before
  // anything moves: the weights stay as they were.
  adam.zero_grad();
  {
    Tape<B> tape(be);
    const V x = tape.input(T::from_host(Shape{32, 4}, x_values, DType::F64, MemCategory::Temporary, be));
    tape.backward(mean(matmul(x, w)));
  }
  const auto before = w.value().to_host<double>();
  for (const double lr : {static_cast<double>(NAN), static_cast<double>(INFINITY), -0.1}) {
    adam.options().lr = lr;
    CHECK_THROWS_MATCHES(adam.step(), Error, ErrorContains("AdamW::step: lr >= 0"));
    CHECK(w.value().to_host<double>() == before);
  }
  adam.options().lr = 0.1;
  adam.step();
  CHECK(w.value().to_host<double>() != before);
  optim::SGD<B> sgd({w}, {0.1});
  sgd.options().weight_decay = -1.0;
  const auto after = w.value().to_host<double>();
  CHECK_THROWS_MATCHES(sgd.step(), Error, ErrorContains("SGD::step"));
  CHECK(w.value().to_host<double>() == after);
}

TEST_CASE("Optimizers: tied parameters, a bad grad_scale and an integer gradient are refused before anything moves",
          "[optim][errors]") {
  B be;
  static_assert(!std::is_copy_constructible_v<optim::AdamW<B>>, "a copy would share the moments");
  const V w = parameter(be, kStart);
  CHECK_THROWS_MATCHES(optim::SGD<B>({w, w}, {0.1}), Error, ErrorContains("share values"));
  // Views of one storage: disjoint ones are separate parameters (ZeRO's shards), overlapping ones are not.
  const T flat = T::from_host(Shape{6}, kStart, DType::F64, MemCategory::Parameter, be);
  CHECK_NOTHROW(optim::SGD<B>({V::parameter(flat.slice(0, 3), "a"), V::parameter(flat.slice(3, 6), "b")}, {0.1}));
  CHECK_THROWS_MATCHES(optim::SGD<B>({V::parameter(flat.slice(0, 4), "a"), V::parameter(flat.slice(3, 6), "b")}, {0.1}),
                       Error, ErrorContains("parameters 0 ('a') and 1 ('b') share values"));

  optim::AdamW<B> adam({w}, {});
  set_grad(w, kGrads[0], be);
  for (const double bad : {static_cast<double>(NAN), static_cast<double>(INFINITY), -1.0, 0.0}) {
    CHECK_THROWS_MATCHES(adam.step(bad), Error, ErrorContains("grad_scale must be finite and > 0"));
    CHECK(w.value().to_host<double>() == kStart);
  }
  CHECK(adam.steps() == 0);

  // An i32 gradient on the second parameter: the first is not updated either.
  const V first = parameter(be, kStart);
  const V second = V::parameter(T::from_host(Shape{2}, std::vector<double>{1.0, 2.0}, DType::F32), "second");
  optim::SGD<B> sgd({first, second}, {0.1});
  set_grad(first, kGrads[0], be);
  second.set_grad(T::from_host(Shape{2}, std::vector<double>{1.0, 1.0}, DType::I32));
  CHECK_THROWS_MATCHES(sgd.step(), Error, ErrorContains("the gradient of 'second' is i32"));
  CHECK(first.value().to_host<double>() == kStart);
  CHECK(sgd.steps() == 0);
}

TEST_CASE("Optimizers: any non-zero found_inf cancels a step, and nothing of that step advances", "[optim][adamw]") {
  // Two ranks' flags summed give 2; a NaN flag is not 0 either. The AdamW run with two
  // cancelled steps between its clean ones must be torch's two-step AdamW.
  B be;
  const optim::AdamWOptions o{.lr = 0.01, .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8, .weight_decay = 0.1};
  const V p = parameter(be, kStart);
  optim::AdamW<B> adam({p}, o);
  set_grad(p, kGrads[0], be);
  adam.step();
  set_grad(p, kGrads[1], be);
  for (const double flag : {2.0, static_cast<double>(NAN)}) {
    optim::StepControl<B> control;
    control.found_inf = T::full(Shape{}, flag, DType::F32, MemCategory::Temporary, be);
    adam.step(control);
  }
  adam.step();
  const auto got = p.value().to_host<double>();
  const auto expected = adamw_reference(o, 2);
  for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i] == Approx(expected[i]).epsilon(1e-12).margin(1e-15));
}

TEST_CASE("Optimizers: load_state refuses a parameter's states in part and a misaligned rounding stream",
          "[optim][state][errors]") {
  B be;
  const auto stepped_state = [&](optim::Optimizer<B>& optimizer, const V& p) {
    set_grad(p, kGrads[0], be);
    optimizer.step();
    return optimizer.state();
  };
  const auto without = [](const StateDict& state, const std::string& dropped) {
    StateDict out;
    for (const auto& [name, entry] : state)
      if (name != dropped) out.set(name, entry);
    return out;
  };
  const V a = parameter(be, kStart);
  optim::AdamW<B> adam({a}, {});
  const StateDict adam_state = stepped_state(adam, a);
  const V fresh = parameter(be, kStart);
  optim::AdamW<B> loaded({fresh}, {});
  loaded.load_state(adam_state);  // whole: loads
  CHECK(loaded.entries()[0].second_moment.defined());
  optim::AdamW<B> partial({parameter(be, kStart)}, {});
  CHECK_THROWS_MATCHES(partial.load_state(without(adam_state, "params.p.second_moment")), Error,
                       ErrorContains("'params.p.second_moment' is missing"));
  CHECK_FALSE(partial.entries()[0].first_moment.defined());  // nothing loaded

  const V s = parameter(be, kStart);
  optim::SGD<B> sgd({s}, {.lr = 0.1, .momentum = 0.9});
  const StateDict sgd_state = stepped_state(sgd, s);
  optim::SGD<B> sgd_partial({parameter(be, kStart)}, {.lr = 0.1, .momentum = 0.9});
  CHECK_THROWS_MATCHES(sgd_partial.load_state(without(sgd_state, "params.p.step_state")), Error,
                       ErrorContains("'params.p.step_state' is missing"));
  StateDict extra = sgd_state;
  extra.set("params.p.unused", sgd_state.at("params.p.momentum_buffer"));
  CHECK_THROWS_MATCHES(sgd_partial.load_state(extra), Error, ErrorContains("params.p.unused"));
  StateDict misaligned = sgd_state;
  misaligned.set_u64("copy_rounding.offset", 3);
  CHECK_THROWS_MATCHES(sgd_partial.load_state(misaligned), Error,
                       ErrorContains("copy_rounding.offset 3 is not a multiple of 4"));
  CHECK_FALSE(sgd_partial.entries()[0].first_moment.defined());
}
