// tests/ops/test_op_contracts.cpp — what sqrt, rsqrt, pow, div, rms_norm and cast promise besides
// their numbers: the dtype autocast runs them in, gradients in each input's own dtype, and
// a trainmem::Error naming the op and the offending argument for bad input.
//
// The values and gradients themselves are checked against F64 references and finite
// differences in test_gradients.cpp.
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "error_matchers.hpp"
#include "trainmem/trainmem.hpp"

using namespace trainmem;
using B = cpu::Backend;
using T = Tensor<B>;
using V = Var<B>;
using testing::ErrorContains;

namespace {

V input(Tape<B>& tape, Shape shape, DType dtype, double value = 0.75) {
  std::vector<double> values(static_cast<std::size_t>(shape.numel()), value);
  return tape.input(T::from_host(std::move(shape), values, dtype), true);
}

struct OpContract {
  std::string name;
  std::function<V(Tape<B>&, DType, std::vector<V>&)> run;
  DType under_bf16_autocast;  // for bf16 inputs
};

}  // namespace

TEST_CASE("new ops: autocast category, cast's dtype, and gradient dtypes", "[ops][autocast]") {
  auto one = [](auto f) {
    return [f](Tape<B>& tape, DType d, std::vector<V>& in) {
      in = {input(tape, Shape{4, 6}, d)};
      return f(in[0]);
    };
  };
  const std::vector<OpContract> cases = {
      // f32: a 16-bit power loses most of its digits.
      {"sqrt", one([](const V& x) { return trainmem::sqrt(x); }), DType::F32},
      {"rsqrt", one([](const V& x) { return rsqrt(x); }), DType::F32},
      {"pow", one([](const V& x) { return trainmem::pow(x, 1.5); }), DType::F32},
      // f32 math on 16-bit storage: bf16 in, bf16 out (NOTE [Norms in 16-bit storage]).
      {"rms_norm",
       [](Tape<B>& tape, DType d, std::vector<V>& in) {
         in = {input(tape, Shape{4, 6}, d), input(tape, Shape{6}, d)};
         return rms_norm(in[0], in[1]);
       },
       DType::BF16},
      // promote: the widest input, here bf16.
      {"div",
       [](Tape<B>& tape, DType d, std::vector<V>& in) {
         in = {input(tape, Shape{4, 6}, d), input(tape, Shape{6}, d)};
         return div(in[0], in[1]);
       },
       DType::BF16},
  };
  for (const auto& c : cases) {
    for (const bool autocast : {true, false}) {
      INFO(c.name << (autocast ? " under bf16 autocast" : " without autocast"));
      amp::Autocast guard(DType::BF16, autocast);
      Tape<B> tape;
      std::vector<V> inputs;
      const V out = c.run(tape, DType::BF16, inputs);
      CHECK(out.dtype() == (autocast ? c.under_bf16_autocast : DType::BF16));
      std::vector<double> ones(static_cast<std::size_t>(out.numel()), 1.0);
      out.backward(T::from_host(out.shape(), ones, out.dtype()));
      for (const V& in : inputs) {
        REQUIRE(in.grad().defined());
        CHECK(in.grad().dtype() == DType::BF16);
      }
    }
  }
  // cast gives the dtype asked for, whatever autocast says, and its gradient in x's dtype.
  for (const DType to : {DType::F32, DType::F16, DType::F64}) {
    INFO("cast bf16 to " << to);
    amp::Autocast guard(DType::BF16);
    Tape<B> tape;
    const V x = input(tape, Shape{3, 2}, DType::BF16);
    const V y = cast(x, to);
    CHECK(y.dtype() == to);
    CHECK(y.value().to_host<double>() == std::vector<double>(6, 0.75));
    tape.backward(sum(y));
    CHECK(x.grad().dtype() == DType::BF16);
    CHECK(x.grad().to_host<double>() == std::vector<double>(6, 1.0));
  }
  {
    Tape<B> tape;
    const V x = input(tape, Shape{2}, DType::F32);
    CHECK(cast(x, DType::F32).handle() == x.handle());  // a cast to x's own dtype is x
  }
  // Without autocast, f64 stays f64 (the accumulator of an f64 rms_norm is f64 too).
  Tape<B> tape;
  CHECK(rms_norm(input(tape, Shape{2, 3}, DType::F64), input(tape, Shape{3}, DType::F64)).dtype() == DType::F64);
}

TEST_CASE("new ops: bad input is an Error naming the op and the argument", "[ops][errors]") {
  Tape<B> tape;
  auto in = [&](Shape s) { return input(tape, std::move(s), DType::F32); };
  const V ids = tape.input(T::from_host(Shape{2, 3}, std::vector<double>(6, 1.0), DType::I32));
  CHECK_THROWS_MATCHES(trainmem::sqrt(ids), Error, ErrorContains("sqrt: x must be floating, got i32 [2, 3]"));
  CHECK_THROWS_MATCHES(rsqrt(ids), Error, ErrorContains("rsqrt: x must be floating, got i32"));
  CHECK_THROWS_MATCHES(trainmem::pow(ids, 2.0), Error, ErrorContains("pow: x must be floating, got i32"));
  CHECK_THROWS_MATCHES(trainmem::pow(in({2}), std::numeric_limits<double>::infinity()), Error,
                       ErrorContains("pow: exponent must be finite, got inf"));
  CHECK_THROWS_MATCHES(div(in({2, 3}), in({2})), Error,
                       ErrorContains("div: cannot broadcast b [2] to a [2, 3] (b must have a's shape, be a row [3]"));
  CHECK_THROWS_MATCHES(div(in({2, 3}), ids), Error, ErrorContains("div: b must be floating, got i32"));
  CHECK_THROWS_MATCHES(rms_norm(in({2, 3}), in({2})), Error,
                       ErrorContains("rms_norm: weight [2] must be [3] for x [2, 3]"));
  CHECK_THROWS_MATCHES(rms_norm(in({}), in({1})), Error, ErrorContains("rms_norm: x must have rank >= 1, got []"));
  CHECK_THROWS_MATCHES(rms_norm(in({2, 3}), in({3}), 0.0), Error,
                       ErrorContains("rms_norm: eps must be positive, got 0"));
  CHECK_THROWS_MATCHES(rms_norm(ids, in({3})), Error, ErrorContains("rms_norm: x must be floating, got i32"));
  CHECK_THROWS_MATCHES(cast(ids, DType::F32), Error, ErrorContains("cast: x must be floating, got i32 [2, 3]"));
  CHECK_THROWS_MATCHES(cast(in({2}), DType::I32), Error,
                       ErrorContains("cast: dtype must be floating, got i32 (for x f32 [2])"));
}
