// tests/state/test_state_values.cpp — load() checks the values of a state, not only its
// layout: step counts, finite masters and moments, non-negative second moments, and
// bias-correction powers a run can reach; a refused load changes nothing.
//
// The bad states are a good state() with one value changed, as a damaged or hand-edited
// file would hold them. The reason each is refused is shown against an independent
// reference where it matters: a negative second moment makes AdamW's next update NaN
// (sqrt of a negative), computed here in f64 by hand.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include <unistd.h>

#include <trainmem/trainmem.hpp>
#include "error_matchers.hpp"

namespace tmem = trainmem;
using B = tmem::cpu::Backend;
using tmem::DType;
using tmem::testing::ErrorContains;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

/// Two named f32 parameters, "w" [2, 3] and "b" [3], with gradients from a formula of the step.
struct ValueProblem {
  tmem::Var<B> w, b;
  ValueProblem() {
    w = tmem::Var<B>::parameter(tmem::Tensor<B>::from_host(tmem::Shape{2, 3}, std::vector<double>(6, 0.25)), "w");
    b = tmem::Var<B>::parameter(tmem::Tensor<B>::from_host(tmem::Shape{3}, std::vector<double>{1, -2, 3}), "b");
  }
  std::vector<tmem::Var<B>> params() const { return {w, b}; }
  void set_grads(int step) const {
    for (const auto& p : {w, b}) {
      std::vector<double> g(static_cast<std::size_t>(p.numel()));
      for (std::size_t i = 0; i < g.size(); ++i) g[i] = std::cos(0.4 * step + 0.9 * static_cast<double>(i));
      p.set_grad(tmem::Tensor<B>::from_host(p.shape(), g, DType::F32, tmem::MemCategory::Gradient));
    }
  }
};

/// Every value of an optimizer's entries (parameters, masters, states, step counts), widened to f64.
template <class Opt>
std::vector<std::vector<double>> values_of(const Opt& opt) {
  std::vector<std::vector<double>> out;
  for (const auto& e : opt.entries()) {
    out.push_back(e.param.value().template to_host<double>());
    for (const auto* t : {&e.master, &e.first_moment, &e.second_moment, &e.step_state})
      out.push_back(t->defined() ? t->template to_host<double>() : std::vector<double>{-777.0});
    out.push_back({static_cast<double>(e.steps)});
  }
  out.push_back({static_cast<double>(opt.steps())});
  return out;
}

/// `state` with the floating entry `name` replaced by `values` (same type and shape).
tmem::StateDict with_values(tmem::StateDict state, const std::string& name, const std::vector<double>& values) {
  const tmem::StateEntry& old = state.at(name);
  REQUIRE(static_cast<std::int64_t>(values.size()) == old.shape.numel());
  state.set(name, tmem::StateEntry::of(tmem::Tensor<B>::from_host(old.shape, values, tmem::dtype_of(old.type))));
  return state;
}

std::vector<double> entry_values(const tmem::StateDict& state, const std::string& name) {
  const tmem::StateEntry& e = state.at(name);
  return e.to_tensor<B>(tmem::MemCategory::Temporary, B::default_instance()).to_host<double>();
}

}  // namespace

TEST_CASE("an optimizer's load refuses impossible values, naming the entry, and changes nothing", "[state][values]") {
  ValueProblem a, b;
  tmem::optim::AdamW<B> oa(a.params(), {.lr = 0.1}), ob(b.params(), {.lr = 0.5});
  for (int k = 0; k < 3; ++k) {
    a.set_grads(k);
    oa.step();
    b.set_grads(k + 5);
    ob.step();
  }
  const auto before = values_of(ob);
  const tmem::StateDict good = oa.state();

  SECTION("a per-parameter step count of -7") {
    tmem::StateDict s = good;
    s.set_i64("params.w.steps", -7);
    CHECK_THROWS_MATCHES(ob.load_state(s), tmem::Error,
                         ErrorContains("'params.w.steps' is -7") && ErrorContains("[0, steps = 3]"));
  }
  SECTION("a per-parameter step count above the optimizer's") {
    tmem::StateDict s = good;
    s.set_i64("params.b.steps", 4);
    CHECK_THROWS_MATCHES(ob.load_state(s), tmem::Error, ErrorContains("'params.b.steps' is 4"));
  }
  SECTION("a negative second moment, which makes the next update NaN") {
    std::vector<double> v = entry_values(good, "params.b.second_moment");
    v[1] = -1.0;
    // The reference: AdamW's next update of that element divides by sqrt(v_hat) + eps,
    // and v_hat = (beta2 v + (1 - beta2) g^2) / (1 - beta2^4) is negative for |g| < 1 here.
    const double g = 0.5, beta2 = 0.999;
    CHECK(std::isnan(std::sqrt((beta2 * v[1] + (1 - beta2) * g * g) / (1 - std::pow(beta2, 4)))));
    CHECK_THROWS_MATCHES(
        ob.load_state(with_values(good, "params.b.second_moment", v)), tmem::Error,
        ErrorContains("'params.b.second_moment'") && ErrorContains("element 1 is -1") && ErrorContains(">= 0"));
  }
  SECTION("a NaN or infinite moment") {
    std::vector<double> m = entry_values(good, "params.w.first_moment");
    m[4] = kNaN;
    CHECK_THROWS_MATCHES(ob.load_state(with_values(good, "params.w.first_moment", m)), tmem::Error,
                         ErrorContains("'params.w.first_moment'") && ErrorContains("element 4 is nan"));
    std::vector<double> v = entry_values(good, "params.w.second_moment");
    v[0] = v[2] = std::numeric_limits<double>::infinity();
    CHECK_THROWS_MATCHES(ob.load_state(with_values(good, "params.w.second_moment", v)), tmem::Error,
                         ErrorContains("2 values") && ErrorContains("element 0 is inf"));
  }
  SECTION("bias-correction powers outside [0, 1]: above 1, negative, NaN") {
    for (const std::vector<double>& powers : std::vector<std::vector<double>>{{1.5, 0.9}, {0.5, -0.25}, {kNaN, 0.9}})
      CHECK_THROWS_MATCHES(ob.load_state(with_values(good, "params.w.step_state", powers)), tmem::Error,
                           ErrorContains("'params.w.step_state'") && ErrorContains("[beta1^t, beta2^t]"));
  }
  SECTION("beta^t = 1 (no step applied) next to moments that a step has written") {
    CHECK_THROWS_MATCHES(ob.load_state(with_values(good, "params.w.step_state", {1.0, 1.0})), tmem::Error,
                         ErrorContains("'params.w.step_state' is [1, 1]") && ErrorContains("moments are not zero"));
    // One power at 1 and the other below it: no run has both.
    CHECK_THROWS_MATCHES(ob.load_state(with_values(good, "params.b.step_state", {1.0, 0.5})), tmem::Error,
                         ErrorContains("'params.b.step_state' is [1, 0.5]"));
  }
  SECTION("the same values inside a whole file: nothing of model or optimizer is loaded") {
    const auto path =
        std::filesystem::temp_directory_path() / ("trainmem_state_values_" + std::to_string(::getpid()) + ".tmstate");
    tmem::StateDict file;
    file.insert("w", tmem::state_of(a.w));
    file.insert("b", tmem::state_of(a.b));
    tmem::StateDict opt = good;
    opt.set_i64("params.b.steps", -7);
    file.insert("optimizer", opt);
    tmem::save(path, file);
    CHECK_THROWS_MATCHES(tmem::load(path, {{"w", b.w}, {"b", b.b}, {"optimizer", ob}}), tmem::Error,
                         ErrorContains("object 'optimizer'") && ErrorContains("'params.b.steps' is -7"));
    std::filesystem::remove(path);
  }
  CHECK(values_of(ob) == before);
}

TEST_CASE("states a run really saves still load: all steps cancelled (beta^t = 1), SGD counts", "[state][values]") {
  SECTION("AdamW whose every step the loss scaler cancelled: powers [1, 1], zero moments") {
    ValueProblem a, b;
    tmem::optim::AdamW<B> oa(a.params(), {}), ob(b.params(), {});
    const tmem::optim::StepControl<B> cancel{tmem::Tensor<B>(), tmem::Tensor<B>::full(tmem::Shape{}, 1.0, DType::F32)};
    for (int k = 0; k < 2; ++k) {
      a.set_grads(k);
      oa.step(cancel);
    }
    const tmem::StateDict s = oa.state();
    REQUIRE(entry_values(s, "params.w.step_state") == std::vector<double>{1.0, 1.0});
    ob.load_state(s);
    CHECK(values_of(ob) == values_of(oa));
  }
  SECTION("SGD's count of applied steps is an integer in [0, the parameter's steps]") {
    ValueProblem a, b;
    tmem::optim::SGD<B> oa(a.params(), {.lr = 0.1, .momentum = 0.9}), ob(b.params(), {.lr = 0.1, .momentum = 0.9});
    for (int k = 0; k < 2; ++k) {
      a.set_grads(k);
      oa.step();
    }
    const auto before = values_of(ob);
    const tmem::StateDict good = oa.state();
    for (double count : {-1.0, 2.5, 3.0, kNaN})
      CHECK_THROWS_MATCHES(ob.load_state(with_values(good, "params.w.step_state", {count})), tmem::Error,
                           ErrorContains("'params.w.step_state'") && ErrorContains("applied steps"));
    std::vector<double> buffer = entry_values(good, "params.b.momentum_buffer");
    buffer[2] = -kNaN;
    CHECK_THROWS_MATCHES(ob.load_state(with_values(good, "params.b.momentum_buffer", buffer)), tmem::Error,
                         ErrorContains("'params.b.momentum_buffer'") && ErrorContains("not finite"));
    CHECK(values_of(ob) == before);
    tmem::load_state(b.w, tmem::state_of(a.w));
    tmem::load_state(b.b, tmem::state_of(a.b));
    ob.load_state(good);
    CHECK(values_of(ob) == values_of(oa));
  }
}

TEST_CASE("MasterWeights refuse NaN or infinite masters and keep their own", "[state][values][amp]") {
  ValueProblem a, b;
  tmem::amp::MasterWeights<B> ma(a.params(), {.model_dtype = DType::BF16}),
      mb(b.params(), {.model_dtype = DType::BF16});
  const auto before = mb.master(1).to_host<double>();
  const tmem::StateDict good = ma.state();
  std::vector<double> master = entry_values(good, "masters.b");
  master[2] = kNaN;
  CHECK_THROWS_MATCHES(mb.load_state(with_values(good, "masters.b", master)), tmem::Error,
                       ErrorContains("'masters.b'") && ErrorContains("element 2 is nan"));
  master[2] = -std::numeric_limits<double>::infinity();
  CHECK_THROWS_MATCHES(mb.load_state(with_values(good, "masters.b", master)), tmem::Error,
                       ErrorContains("element 2 is -inf"));
  CHECK(mb.master(1).to_host<double>() == before);
  mb.load_state(good);
  CHECK(mb.master(1).to_host<double>() == ma.master(1).to_host<double>());
}
