// tests/optim/test_param_groups.cpp — parameter groups in SGD and AdamW.
//
// The reference for a grouped optimizer is one plain optimizer per group, with the group's
// settings as its options (lr = base rate x lr_scale): the two must agree bit for bit,
// under a changing base rate, through a loss scaler and FP32 master weights, through
// amp::TrainStep, and across a save and load. Then the groups a constructor or load_state refuses, and the README's
// decay / no-decay snippet, which must be the code compiled here.
#include <catch2/catch.hpp>
#include <filesystem>
#include <string>
#include <vector>

#include "error_matchers.hpp"
#include "guide_snippet.hpp"
#include "trainmem/trainmem.hpp"

using namespace trainmem;
using B = cpu::Backend;
using T = Tensor<B>;
using V = Var<B>;
using testing::ErrorContains;

namespace {

// Values and gradients with no pattern a wrong group could match by chance.
std::vector<double> values(int n, int seed) {
  std::vector<double> out(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) out[static_cast<std::size_t>(i)] = std::sin(0.7 * i + 1.3 * seed) * (1 + 0.25 * seed);
  return out;
}

V parameter(B& be, const std::string& name, int n, int seed, DType dtype = DType::F32) {
  return V::parameter(T::from_host(Shape{n}, values(n, seed), dtype, MemCategory::Parameter, be), name);
}
/// A parameter with the same name, shape, dtype and values as `p`, in storage of its own.
V clone(const V& p, B& be) {
  return V::parameter(T::from_host(p.shape(), p.value().to_host<double>(), p.dtype(), MemCategory::Parameter, be),
                      p.name());
}
void set_grad(const V& p, int step, B& be, double factor = 1.0) {
  std::vector<double> g =
      values(static_cast<int>(p.shape().numel()), 10 * step + 7 + static_cast<int>(p.name().size()));
  for (auto& v : g) v *= factor;
  p.set_grad(T::from_host(p.shape(), g, p.dtype(), MemCategory::Gradient, be));
}
std::vector<double> host(const V& p) { return p.value().to_host<double>(); }

/// Four parameters: a, b in the first group, c, d in the second.
struct Model {
  V a, b, c, d;
  Model(B& be, DType dtype = DType::F32)
      : a(parameter(be, "a", 5, 1, dtype)),
        b(parameter(be, "b", 3, 2, dtype)),
        c(parameter(be, "c", 4, 3, dtype)),
        d(parameter(be, "d", 2, 4, dtype)) {}
  Model(const Model& m, B& be) : a(clone(m.a, be)), b(clone(m.b, be)), c(clone(m.c, be)), d(clone(m.d, be)) {}
  std::vector<V> all() const { return {a, b, c, d}; }
  std::vector<V> first() const { return {a, b}; }
  std::vector<V> second() const { return {c, d}; }
};
void set_grads(const Model& m, int step, B& be, double factor = 1.0) {
  for (const V& p : m.all()) set_grad(p, step, be, factor);
}
void check_same(const Model& got, const Model& want) {
  CHECK(host(got.a) == host(want.a));
  CHECK(host(got.b) == host(want.b));
  CHECK(host(got.c) == host(want.c));
  CHECK(host(got.d) == host(want.d));
}
double base_lr(int step) { return 0.05 / (1 + 0.3 * step); }  // a schedule drives options().lr

}  // namespace

TEST_CASE("SGD: two groups step bit for bit as two SGDs, one per group, under a changing base rate",
          "[optim][groups][sgd]") {
  for (const DType dtype : {DType::F32, DType::F64}) {
    INFO(name_of(dtype));
    B be;
    Model grouped(be, dtype), reference(grouped, be);
    optim::SGD<B> sgd({{.params = grouped.first(), .weight_decay = 0.1},
                       {.params = grouped.second(), .lr_scale = 0.5, .momentum = 0.5, .weight_decay = 0.0}},
                      {.lr = 1.0, .momentum = 0.9, .dampening = 0.1, .weight_decay = 0.3});
    optim::SGD<B> first(reference.first(), {.lr = 1.0, .momentum = 0.9, .dampening = 0.1, .weight_decay = 0.1});
    optim::SGD<B> second(reference.second(), {.lr = 1.0, .momentum = 0.5, .dampening = 0.1, .weight_decay = 0.0});
    for (int step = 0; step < 4; ++step) {
      set_grads(grouped, step, be);
      set_grads(reference, step, be);
      sgd.options().lr = base_lr(step);
      first.options().lr = base_lr(step);
      second.options().lr = base_lr(step) * 0.5;
      sgd.step();
      first.step();
      second.step();
    }
    check_same(grouped, reference);
    CHECK(host(grouped.a) != values(5, 1));  // it moved
  }
}

TEST_CASE("AdamW: two groups (weight decay, lr_scale, betas, eps) step bit for bit as two AdamWs",
          "[optim][groups][adamw]") {
  B be;
  Model grouped(be), reference(grouped, be);
  const optim::AdamWOptions base{.lr = 1.0, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.05};
  optim::AdamW<B> adam(
      {{.params = grouped.first(), .weight_decay = 0.1},
       {.params = grouped.second(), .lr_scale = 0.25, .beta1 = 0.8, .beta2 = 0.99, .eps = 1e-6, .weight_decay = 0.0}},
      base);
  optim::AdamW<B> first(reference.first(), {.lr = 1.0, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.1});
  optim::AdamW<B> second(reference.second(),
                         {.lr = 1.0, .beta1 = 0.8, .beta2 = 0.99, .eps = 1e-6, .weight_decay = 0.0});
  for (int step = 0; step < 4; ++step) {
    set_grads(grouped, step, be);
    set_grads(reference, step, be);
    adam.options().lr = base_lr(step);
    first.options().lr = base_lr(step);
    second.options().lr = base_lr(step) * 0.25;
    adam.step();
    first.step();
    second.step();
  }
  check_same(grouped, reference);
  REQUIRE(adam.groups().size() == 2);
  CHECK(adam.groups()[1].params.size() == 2);
  CHECK(adam.groups()[1].lr_scale == 0.25);
}

TEST_CASE(
    "AdamW groups under FP32 masters and a loss scaler: one scaler.step for every group, "
    "bit for bit as one optimizer and scaler per group",
    "[optim][groups][adamw][amp]") {
  B be;
  Model grouped(be), reference(grouped, be);
  amp::MasterWeights<B> masters(grouped.all(), {.model_dtype = DType::BF16});
  amp::MasterWeights<B> masters_first(reference.first(), {.model_dtype = DType::BF16});
  amp::MasterWeights<B> masters_second(reference.second(), {.model_dtype = DType::BF16});
  optim::AdamW<B> adam({{.params = grouped.first(), .weight_decay = 0.1},
                        {.params = grouped.second(), .lr_scale = 2.0, .weight_decay = 0.0}},
                       {.lr = 0.01});
  optim::AdamW<B> first(reference.first(), {.lr = 0.01, .weight_decay = 0.1});
  optim::AdamW<B> second(reference.second(), {.lr = 0.01 * 2.0, .weight_decay = 0.0});
  masters.attach(adam);
  masters_first.attach(first);
  masters_second.attach(second);
  amp::GradScaler<B> scaler(DType::F16, {}, be), scaler_first(DType::F16, {}, be), scaler_second(DType::F16, {}, be);
  for (int step = 0; step < 3; ++step) {
    // Step 1's gradients overflow: all three skip it.
    const double factor = step == 1 ? INFINITY : 65536.0;
    for (const Model* m : {&grouped, &reference}) {
      set_grads(*m, step, be, factor);
      for (const V& p : m->all()) p.set_grad_scaled(true);
    }
    CHECK(scaler.step(adam) == (step != 1));
    CHECK(scaler_first.step(first) == (step != 1));
    CHECK(scaler_second.step(second) == (step != 1));
    scaler.update();
    scaler_first.update();
    scaler_second.update();
  }
  check_same(grouped, reference);
  for (std::size_t i = 0; i < 2; ++i) {
    CHECK(masters.master(i).to_host<double>() == masters_first.master(i).to_host<double>());
    CHECK(masters.master(i + 2).to_host<double>() == masters_second.master(i).to_host<double>());
  }
}

namespace {

/// sum_p sum(tanh(p * x_p)) over the model's parameters, x_p a fixed input of p's length.
Var<B> tanh_loss(const Model& m, Tape<B>& tape) {
  Var<B> total;
  int seed = 20;
  for (const V& p : m.all()) {
    const V x = tape.input(T::from_host(p.shape(), values(static_cast<int>(p.shape().numel()), seed++)));
    const V term = sum(tanh(mul(p, x)));
    total = total.defined() ? add(total, term) : term;
  }
  return total;
}

}  // namespace

TEST_CASE(
    "amp::TrainStep steps every group of a grouped AdamW: bit for bit as one AdamW and MasterWeights per "
    "group, stepped by hand",
    "[optim][groups][amp][train_step]") {
  B& be = B::default_instance();
  Model helped(be), by_hand(helped, be);
  amp::MasterWeights<B> masters_first(by_hand.first(), {.model_dtype = DType::BF16});
  amp::MasterWeights<B> masters_second(by_hand.second(), {.model_dtype = DType::BF16});
  optim::AdamW<B> first(by_hand.first(), {.lr = 0.01, .weight_decay = 0.1});
  optim::AdamW<B> second(by_hand.second(), {.lr = 0.01 * 0.5, .beta2 = 0.99, .weight_decay = 0.0});
  masters_first.attach(first);
  masters_second.attach(second);
  optim::AdamW<B> grouped({{.params = helped.first(), .weight_decay = 0.1},
                           {.params = helped.second(), .lr_scale = 0.5, .beta2 = 0.99, .weight_decay = 0.0}},
                          {.lr = 0.01});
  amp::TrainStep<B> train(grouped, {.precision = DType::BF16});
  for (int step = 0; step < 3; ++step) {
    {
      Tape<B> tape;
      Var<B> loss;
      {
        amp::Autocast autocast(DType::BF16);
        loss = tanh_loss(by_hand, tape);
      }
      tape.backward(loss);
      first.step();
      second.step();
      first.zero_grad();
      second.zero_grad();
    }
    Tape<B> tape;
    CHECK(train.run([&] { return tanh_loss(helped, tape); }).stepped);
  }
  check_same(helped, by_hand);
  const std::vector<Tensor<B>>& masters = train.master_weights()->masters();
  REQUIRE(masters.size() == 4);
  for (std::size_t i = 0; i < 2; ++i) {
    CHECK(masters[i].to_host<double>() == masters_first.master(i).to_host<double>());
    CHECK(masters[i + 2].to_host<double>() == masters_second.master(i).to_host<double>());
  }
  CHECK(masters[0].to_host<double>() != values(5, 1));  // the steps moved them
}

TEST_CASE("Groups are refused, naming the group and the field, before anything is built", "[optim][groups][errors]") {
  B be;
  Model m(be);
  using AG = optim::AdamWGroup<B>;
  using SG = optim::SgdGroup<B>;
  CHECK_THROWS_MATCHES(optim::AdamW<B>(std::vector<AG>{{.params = {m.a, m.b}}, {.params = {m.c, m.a}}}, {}), Error,
                       ErrorContains("AdamW: 'a' is in group 0 and in group 1"));
  CHECK_THROWS_MATCHES(optim::SGD<B>(std::vector<SG>{{.params = {m.a}}, {.params = {}}}, {}), Error,
                       ErrorContains("SGD: group 1 has no parameters"));
  CHECK_THROWS_MATCHES(optim::AdamW<B>(std::vector<AG>{}, {}), Error, ErrorContains("AdamW: no parameter groups"));
  CHECK_THROWS_MATCHES(optim::AdamW<B>(std::vector<AG>{{.params = {m.a}}, {.params = {m.b}, .lr_scale = -1.0}}, {}),
                       Error, ErrorContains("AdamW: group 1: lr_scale must be finite and >= 0, got -1"));
  CHECK_THROWS_MATCHES(optim::AdamW<B>(std::vector<AG>{{.params = {m.a}, .beta1 = 1.0}}, {}), Error,
                       ErrorContains("AdamW: group 0: beta1 must be in [0, 1), got 1"));
  CHECK_THROWS_MATCHES(optim::AdamW<B>(std::vector<AG>{{.params = {m.a}}, {.params = {m.b}, .beta2 = -0.5}}, {}), Error,
                       ErrorContains("AdamW: group 1: beta2 must be in [0, 1), got -0.5"));
  CHECK_THROWS_MATCHES(optim::AdamW<B>(std::vector<AG>{{.params = {m.a}, .eps = 0.0}}, {}), Error,
                       ErrorContains("AdamW: group 0: eps must be finite and > 0, got 0"));
  CHECK_THROWS_MATCHES(optim::AdamW<B>(std::vector<AG>{{.params = {m.a}, .weight_decay = NAN}}, {}), Error,
                       ErrorContains("AdamW: group 0: weight_decay must be finite and >= 0, got nan"));
  CHECK_THROWS_MATCHES(optim::SGD<B>(std::vector<SG>{{.params = {m.a}, .momentum = -0.9}}, {}), Error,
                       ErrorContains("SGD: group 0: momentum must be finite and >= 0, got -0.9"));
  CHECK_THROWS_MATCHES(
      optim::SGD<B>(std::vector<SG>{{.params = {m.a}, .momentum = 0.9}, {.params = {m.b}, .momentum = 0.0}},
                    {.momentum = 0.9, .nesterov = true}),
      Error, ErrorContains("SGD: group 1: Nesterov momentum needs momentum > 0"));
  // A parameter listed twice in one group is the parameter list's own error.
  CHECK_THROWS_MATCHES(optim::SGD<B>(std::vector<SG>{{.params = {m.a, m.a}}}, {}), Error,
                       ErrorContains("share values"));
}

namespace {

/// Steps `steps` times from `first_step` on, with the base rate of a schedule.
template <class Opt>
void train(Opt& opt, const Model& m, int first_step, int steps, B& be) {
  for (int step = first_step; step < first_step + steps; ++step) {
    set_grads(m, step, be);
    opt.options().lr = base_lr(step);
    opt.step();
  }
}

template <class Opt, class Make>
void check_resume(Make make) {
  B be;
  Model uninterrupted(be), resumed(uninterrupted, be);
  Opt whole = make(uninterrupted, 0.25);
  train(whole, uninterrupted, 0, 6, be);

  Opt before = make(resumed, 0.25);
  train(before, resumed, 0, 3, be);
  const StateDict saved = before.state();
  CHECK(saved.get_i64("groups") == 2);
  CHECK(saved.get_i64("params.c.group") == 1);
  CHECK(saved.get_f64("groups.1.lr_scale") == 0.25);
  // A fresh optimizer made with other group settings: load_state restores the saved ones.
  Model continued(resumed, be);
  Opt after = make(continued, 4.0);
  after.load_state(saved);
  CHECK(after.groups()[1].lr_scale == 0.25);
  CHECK(after.state() == saved);
  train(after, continued, 3, 3, be);
  check_same(continued, uninterrupted);
}

}  // namespace

TEST_CASE("Grouped SGD and AdamW saved after 3 steps and loaded into fresh ones continue bit for bit",
          "[optim][groups][state]") {
  check_resume<optim::AdamW<B>>([](const Model& m, double scale) {
    return optim::AdamW<B>({{.params = m.first(), .weight_decay = 0.1},
                            {.params = m.second(), .lr_scale = scale, .beta2 = 0.99, .weight_decay = 0.0}},
                           {.lr = 0.01});
  });
  check_resume<optim::SGD<B>>([](const Model& m, double scale) {
    return optim::SGD<B>({{.params = m.first(), .weight_decay = 0.1},
                          {.params = m.second(), .lr_scale = scale, .momentum = 0.5, .weight_decay = 0.0}},
                         {.lr = 0.01, .momentum = 0.9});
  });
}

TEST_CASE("load_state refuses a state whose groups differ, naming what differs, and changes nothing",
          "[optim][groups][state][errors]") {
  B be;
  Model m(be);
  optim::AdamW<B> saved_from({{.params = m.first(), .weight_decay = 0.1}, {.params = m.second(), .weight_decay = 0.0}},
                             {});
  train(saved_from, m, 0, 2, be);
  const StateDict saved = saved_from.state();

  Model fresh(m, be);
  optim::AdamW<B> moved({{.params = {fresh.a}}, {.params = {fresh.b, fresh.c, fresh.d}}}, {});
  const StateDict moved_before = moved.state();
  CHECK_THROWS_MATCHES(moved.load_state(saved), Error,
                       ErrorContains("'b' is in group 0 in the state and in group 1 in this optimizer"));
  CHECK(moved.state() == moved_before);

  optim::AdamW<B> three({{.params = {fresh.a, fresh.b}}, {.params = {fresh.c}}, {.params = {fresh.d}}}, {});
  CHECK_THROWS_MATCHES(three.load_state(saved), Error,
                       ErrorContains("the state has 2 parameter groups, this optimizer 3"));
  optim::AdamW<B> plain(fresh.all(), {});
  CHECK_THROWS_MATCHES(plain.load_state(saved), Error,
                       ErrorContains("the state has 2 parameter groups, this optimizer none"));
  const StateDict plain_state = plain.state();
  CHECK(!plain_state.contains("groups"));  // one list: the keys of files saved before groups
  optim::AdamW<B> grouped({{.params = fresh.all()}}, {});
  CHECK_THROWS_MATCHES(grouped.load_state(plain_state), Error,
                       ErrorContains("the state has no parameter groups (saved from one list), this optimizer 1"));

  // A saved group value no run can have is refused like an option.
  StateDict bad = saved;
  bad.set_f64("groups.1.weight_decay", -0.5);
  Model other(m, be);
  optim::AdamW<B> target({{.params = other.first()}, {.params = other.second()}}, {});
  const StateDict target_before = target.state();
  CHECK_THROWS_MATCHES(target.load_state(bad), Error,
                       ErrorContains("AdamW::load_state: group 1: weight_decay must be finite and >= 0, got -0.5"));
  CHECK(target.state() == target_before);
  // An override the file does not hold follows options(); a field no group has is an extra entry.
  StateDict extra = saved;
  extra.set_f64("groups.0.momentum", 0.9);
  CHECK_THROWS_MATCHES(target.load_state(extra), Error, ErrorContains("groups.0.momentum"));
  StateDict fewer;
  for (const auto& [key, entry] : saved)
    if (key != "groups.1.weight_decay") fewer.set(key, entry);
  target.load_state(fewer);
  CHECK(!target.groups()[1].weight_decay.has_value());
  CHECK(target.groups()[0].weight_decay == 0.1);
}

namespace {

/// The README's snippet, in a model of two layers; returns how many parameters each group got
/// and whether every weight moved.
std::vector<std::size_t> readme_snippet() {
  nn::Init init(7);
  nn::Linear<B> fc1(6, 4, init), fc2(4, 2, init);
  std::vector<Var<B>> params = fc1.parameters();
  for (auto& p : fc2.parameters()) params.push_back(p);
  const auto x = Tensor<B>::from_host({3, 6}, values(18, 5));
  std::vector<std::vector<double>> before;
  for (const auto& p : params) before.push_back(host(p));
  // clang-format off
  // Weight decay on the matrices only: biases (and norms' scales) go in a group without it.
  std::vector<trainmem::Var<B>> decay, no_decay;
  for (const auto& p : params) (p.shape().rank() >= 2 ? decay : no_decay).push_back(p);
  trainmem::optim::AdamW<B> optimizer({{.params = decay, .weight_decay = 0.1},
                                       {.params = no_decay, .weight_decay = 0.0}}, {.lr = 3e-4});
  const auto schedule = trainmem::optim::LrSchedule::warmup_cosine(3e-4, /*warmup_steps=*/10, /*total_steps=*/100);
  for (int step = 0; step < 3; ++step) {
    optimizer.options().lr = schedule.lr(step);  // the base rate; a group's lr_scale multiplies it
    trainmem::Tape<B> tape;
    auto loss = trainmem::mean(fc2(trainmem::relu(fc1(tape.input(x)))));
    loss.backward();
    optimizer.step();  // every group in one call (as are scaler.step(optimizer), clip_grad_norm(optimizer, 1.0))
    optimizer.zero_grad();
  }
  // clang-format on
  std::size_t moved = 0;
  for (std::size_t i = 0; i < params.size(); ++i) moved += host(params[i]) != before[i] ? 1 : 0;
  return {optimizer.groups()[0].params.size(), optimizer.groups()[1].params.size(), moved};
}

}  // namespace

TEST_CASE("The README's decay / no-decay snippet is this compiled code, and it trains", "[optim][groups][docs]") {
  const std::filesystem::path here = std::filesystem::path(__FILE__).parent_path();
  const std::string readme = testing::read_text(here / "../../README.md");
  const std::string source = testing::read_text(here / "test_param_groups.cpp");
  const std::string snippet = testing::guide_snippet(readme, "<!-- optimizer-groups -->");
  CHECK(snippet.size() > 200);
  std::string indented;  // the README's lines, as they stand indented in the function above
  for (std::size_t at = 0; at < snippet.size();) {
    const std::size_t end = std::min(snippet.find('\n', at), snippet.size());
    indented += "  " + snippet.substr(at, end - at) + "\n";
    at = end + 1;
  }
  CHECK(source.find(indented) != std::string::npos);
  CHECK(readme_snippet() == std::vector<std::size_t>{2, 2, 4});  // two matrices, two biases, all moved
}
