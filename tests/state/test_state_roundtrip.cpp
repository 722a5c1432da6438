// tests/state/test_state_roundtrip.cpp — state() / load_state() of every kind of state, and
// failed loads that leave the destination bitwise unchanged.
//
// A round trip is judged by behaviour, not by the dict: an optimizer loaded into a fresh
// copy of the model must take the next steps exactly as the original does (compared
// value by value, widened to f64, which is exact for every dtype here). Every load error
// is checked for its message and for a destination that reads back as before.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include <unistd.h>

#include <trainmem/trainmem.hpp>
#include "error_matchers.hpp"

namespace tmem = trainmem;
using B = tmem::cpu::Backend;
using tmem::DType;
using tmem::testing::ErrorContains;

namespace {

using Values = std::vector<std::vector<double>>;

/// Every value an optimizer and its parameters hold, widened to f64 (exact), plus counters.
template <class Opt>
Values snapshot(const Opt& opt) {
  Values out;
  for (const auto& e : opt.entries()) {
    out.push_back(e.param.value().template to_host<double>());
    for (const auto* t : {&e.master, &e.first_moment, &e.second_moment, &e.step_state})
      out.push_back(t->defined() ? t->template to_host<double>() : std::vector<double>{-12345.0});
    out.push_back({static_cast<double>(e.steps)});
  }
  out.push_back({static_cast<double>(opt.steps()), static_cast<double>(opt.copy_rounding_state().offset)});
  return out;
}

/// Two parameters with gradients from a fixed formula of (step, index).
struct Problem {
  tmem::Var<B> w, b;
  explicit Problem(DType dtype = DType::F32) {
    w = tmem::Var<B>::parameter(tmem::Tensor<B>::from_host(tmem::Shape{3, 4}, std::vector<double>(12, 0.5), dtype),
                                "w");
    b = tmem::Var<B>::parameter(tmem::Tensor<B>::from_host(tmem::Shape{4}, std::vector<double>{1, 2, 3, 4}, dtype),
                                "b");
  }
  std::vector<tmem::Var<B>> params() const { return {w, b}; }
  void set_grads(int step) const {
    for (const auto& p : {w, b}) {
      std::vector<double> g(static_cast<std::size_t>(p.numel()));
      for (std::size_t i = 0; i < g.size(); ++i) g[i] = std::sin(0.3 * step + 0.7 * static_cast<double>(i));
      p.set_grad(tmem::Tensor<B>::from_host(p.shape(), g, DType::F32, tmem::MemCategory::Gradient));
    }
  }
};

std::filesystem::path scratch(const std::string& name) {
  return std::filesystem::temp_directory_path() / ("trainmem_roundtrip_" + std::to_string(::getpid()) + "_" + name);
}

}  // namespace

TEST_CASE("tensors, Vars, generators and the tape's stream round-trip", "[state]") {
  for (DType dtype : {DType::F32, DType::F64, DType::F16, DType::BF16, DType::I32}) {
    const auto src = tmem::Tensor<B>::from_host(tmem::Shape{2, 2}, std::vector<double>{1, -2, 3, 7}, dtype);
    const auto dst = tmem::Tensor<B>::zeros(tmem::Shape{2, 2}, dtype);
    const auto version = dst.version();
    tmem::load_state(dst, tmem::state_of(src));
    CHECK(dst.to_host<double>() == src.to_host<double>());
    CHECK(dst.version() > version);  // cast caches see the write
  }
  tmem::Generator g(42);
  g.take(10);
  tmem::Generator h(1);
  tmem::load_state(h, tmem::state_of(g));
  CHECK(h.state() == g.state());
  CHECK(h.take(4) == g.take(4));

  tmem::Tape<B> tape, other;
  tape.manual_seed(5);
  tape.rng().take(100);
  tmem::load_state(other, tmem::state_of(tape));
  CHECK(other.rng().state() == tape.rng().state());
  tmem::StateDict bad = tmem::state_of(tape);
  bad.set_u64("offset", 6);
  CHECK_THROWS_MATCHES(tmem::load_state(other, bad), tmem::Error, ErrorContains("not a multiple of 4"));
}

TEMPLATE_TEST_CASE("an optimizer loaded into a fresh one continues exactly", "[state][optim]", tmem::optim::AdamW<B>,
                   tmem::optim::SGD<B>) {
  using Opt = TestType;
  auto make = [](const Problem& p) {
    if constexpr (std::is_same_v<Opt, tmem::optim::AdamW<B>>)
      return Opt(p.params(), {.lr = 0.05, .beta1 = 0.8, .beta2 = 0.95, .weight_decay = 0.1});
    else return Opt(p.params(), {.lr = 0.05, .momentum = 0.9, .dampening = 0.1, .weight_decay = 0.01});
  };
  Problem a, b;
  Opt opt_a = make(a);
  for (int k = 0; k < 3; ++k) {
    a.set_grads(k);
    opt_a.step();
  }
  // b: same parameters (model state), then the optimizer state; its options differ until loaded.
  Opt opt_b = make(b);
  opt_b.options().lr = 1.0;
  tmem::load_state(b.w, tmem::state_of(a.w));
  tmem::load_state(b.b, tmem::state_of(a.b));
  opt_b.load_state(opt_a.state());
  CHECK(snapshot(opt_b) == snapshot(opt_a));
  CHECK(opt_b.steps() == 3);
  CHECK(opt_b.options().lr == 0.05);
  for (int k = 3; k < 6; ++k) {
    a.set_grads(k);
    b.set_grads(k);
    opt_a.step();
    opt_b.step();
  }
  CHECK(snapshot(opt_b) == snapshot(opt_a));
}

TEST_CASE("masters, moments, rounding stream and scaler resume a stochastic-rounding bf16 run", "[state][amp]") {
  auto build = [](Problem& p, std::unique_ptr<tmem::amp::MasterWeights<B>>& m,
                  std::unique_ptr<tmem::optim::AdamW<B>>& o) {
    m = std::make_unique<tmem::amp::MasterWeights<B>>(
        p.params(), tmem::amp::MasterWeightsOptions{DType::BF16, tmem::RoundingMode::Stochastic, 11});
    o = std::make_unique<tmem::optim::AdamW<B>>(p.params(), tmem::optim::AdamWOptions{.lr = 1e-3});
    m->attach(*o);
  };
  Problem a, b;
  std::unique_ptr<tmem::amp::MasterWeights<B>> ma, mb;
  std::unique_ptr<tmem::optim::AdamW<B>> oa, ob;
  build(a, ma, oa);
  build(b, mb, ob);
  for (int k = 0; k < 4; ++k) {
    a.set_grads(k);
    oa->step();
  }
  const auto path = scratch("amp.tmstate");
  tmem::save(path, {{"model.w", a.w}, {"model.b", a.b}, {"masters", *ma}, {"optimizer", *oa}});
  tmem::load(path, {{"model.w", b.w}, {"model.b", b.b}, {"masters", *mb}, {"optimizer", *ob}});
  CHECK(snapshot(*ob) == snapshot(*oa));
  for (int k = 4; k < 8; ++k) {
    a.set_grads(k);
    b.set_grads(k);
    oa->step();
    ob->step();
  }
  CHECK(snapshot(*ob) == snapshot(*oa));  // the bf16 copies too: the rounding stream resumed
  std::filesystem::remove(path);
}

TEST_CASE("a GradScaler's state round-trips through its StateDict", "[state][amp]") {
  tmem::amp::GradScaler<B> a(DType::F16, {.init_scale = 1024, .growth_interval = 3, .hysteresis = 2});
  a.update(4096.0);
  tmem::amp::GradScaler<B> b(DType::F16, {});
  tmem::load_state(b, tmem::state_of(a));
  CHECK(b.state() == a.state());
  CHECK(b.get_scale() == 4096.0);
  CHECK(b.options().hysteresis == 2);
  // An invalid state is refused by GradScaler's own checks, before anything changes.
  tmem::StateDict bad = tmem::state_of(a);
  bad.set_f64("backoff_factor", 2.0);
  CHECK_THROWS_MATCHES(tmem::load_state(b, bad), tmem::Error, ErrorContains("backoff_factor"));
  CHECK(b.state() == a.state());
}

TEST_CASE("failed loads name the difference and leave the destination unchanged", "[state]") {
  Problem a, b;
  tmem::optim::AdamW<B> oa(a.params(), {}), ob(b.params(), {.lr = 0.5});
  for (int k = 0; k < 2; ++k) {
    a.set_grads(k);
    oa.step();
    b.set_grads(k + 10);
    ob.step();
  }
  const Values before = snapshot(ob);
  const double lr_before = ob.options().lr;
  auto unchanged = [&] {
    CHECK(snapshot(ob) == before);
    CHECK(ob.options().lr == lr_before);
  };
  const tmem::StateDict good = oa.state();

  SECTION("a missing name") {
    tmem::StateDict s;
    for (const auto& [name, e] : good)
      if (name != "params.b.steps") s.set(name, e);
    CHECK_THROWS_MATCHES(ob.load_state(s), tmem::Error, ErrorContains("'params.b.steps' is missing from the state"));
  }
  SECTION("an extra name") {
    tmem::StateDict s = good;
    s.set_f64("params.w.third_moment", 1.0);
    CHECK_THROWS_MATCHES(ob.load_state(s), tmem::Error,
                         ErrorContains("'params.w.third_moment' (f64 []) in the state has no counterpart"));
  }
  SECTION("a shape") {
    tmem::StateDict s = good;
    s.set("params.w.first_moment", tmem::Tensor<B>::zeros(tmem::Shape{4, 3}, DType::F32));
    CHECK_THROWS_MATCHES(
        ob.load_state(s), tmem::Error,
        ErrorContains("'params.w.first_moment' has shape [4, 3] in the state, the destination is [3, 4]"));
  }
  SECTION("a dtype") {
    tmem::StateDict s = good;
    s.set("params.b.second_moment", tmem::Tensor<B>::zeros(tmem::Shape{4}, DType::F16));
    CHECK_THROWS_MATCHES(ob.load_state(s), tmem::Error,
                         ErrorContains("'params.b.second_moment' is f16 in the state, the destination is f32"));
  }
  SECTION("invalid options") {
    tmem::StateDict s = good;
    s.set_f64("options.beta1", 1.5);
    CHECK_THROWS_MATCHES(ob.load_state(s), tmem::Error, ErrorContains("AdamW::load_state: betas must be in [0, 1)"));
  }
  SECTION("parameters without unique names") {
    Problem c;
    c.b.impl().name = "w";
    tmem::optim::AdamW<B> oc(c.params(), {});
    CHECK_THROWS_MATCHES(oc.state(), tmem::Error, ErrorContains("two parameters are named 'w'"));
  }
  SECTION("whole files: a corrupt checksum, a truncated file, an object left over") {
    const auto path = scratch("errors.tmstate");
    tmem::save(path, {{"optimizer", oa}, {"w", a.w}});
    std::vector<char> bytes;
    {
      std::ifstream in(path, std::ios::binary);
      bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    auto write = [&](const std::vector<char>& b) {
      std::ofstream out(path, std::ios::binary | std::ios::trunc);
      out.write(b.data(), static_cast<std::streamsize>(b.size()));
    };
    const std::vector<double> w_before = b.w.value().to_host<double>();
    std::vector<char> flipped = bytes;
    flipped[flipped.size() - 3] ^= 0x40;
    write(flipped);
    CHECK_THROWS_MATCHES(tmem::load(path, {{"optimizer", ob}, {"w", b.w}}), tmem::Error, ErrorContains("checksum"));
    write(std::vector<char>(bytes.begin(), bytes.end() - 100));
    CHECK_THROWS_MATCHES(tmem::load(path, {{"optimizer", ob}, {"w", b.w}}), tmem::Error, ErrorContains("truncated"));
    write(bytes);
    CHECK_THROWS_MATCHES(tmem::load(path, {{"optimizer", ob}}), tmem::Error,
                         ErrorContains("holds 1 entries no object was given for: 'w'"));
    // The first object fits and the second does not: neither is loaded.
    tmem::Var<B> wrong = tmem::Var<B>::parameter(tmem::Tensor<B>::zeros(tmem::Shape{12}, DType::F32), "wrong");
    CHECK_THROWS_MATCHES(tmem::load(path, {{"optimizer", ob}, {"w", wrong}}), tmem::Error, ErrorContains("object 'w'"));
    CHECK(b.w.value().to_host<double>() == w_before);
    CHECK(wrong.value().to_host<double>() == std::vector<double>(12, 0.0));
    std::filesystem::remove(path);
  }
  unchanged();
}

TEST_CASE("MasterWeights refuse a state of other model copies", "[state][amp]") {
  Problem a, b;
  tmem::amp::MasterWeights<B> ma(a.params(), {.model_dtype = DType::F16}), mb(b.params(), {.model_dtype = DType::BF16});
  const auto before = mb.master(0).to_host<double>();
  CHECK_THROWS_MATCHES(mb.load_state(ma.state()), tmem::Error,
                       ErrorContains("the state's model copies are f16, these are bf16"));
  CHECK(mb.master(0).to_host<double>() == before);
}

TEST_CASE("an entry whose byte count overflows is refused, not wrapped to a small size", "[state]") {
  tmem::StateDict dict;
  // 2^61 f64 values are 2^64 bytes: the count wraps to 0 in 64 bits.
  CHECK_THROWS_MATCHES(dict.set("x", tmem::StateEntry{tmem::StateType::F64, tmem::Shape{std::int64_t{1} << 61}, {}}),
                       tmem::Error, ErrorContains("more bytes than int64 counts"));
  CHECK_FALSE(dict.contains("x"));
}
