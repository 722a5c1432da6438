// tests/autocast/test_autocast.cpp — the dtype autocast picks for every op, and the cast cache.
//
// The expected dtypes are written out by hand, per op and per situation, from PyTorch's
// CUDA autocast lists (matmul-class ops in the 16-bit dtype; softmax, losses,
// reductions, exp, log in f32; binary element-wise ops in the widest input; the rest
// in their input's dtype; f64 never narrowed) and our one departure from them (norms on
// a 16-bit input give a 16-bit output, f32 math inside) — not derived from the library's rule.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <trainmem/autocast/autocast.hpp>
#include <trainmem/autocast/cast_cache.hpp>
#include <trainmem/optim/sgd.hpp>
#include <trainmem/trainmem.hpp>

#include "amp_reference.hpp"

namespace tmem = trainmem;
using B = tmem::cpu::Backend;
using tmem::DType;

namespace {

std::vector<double> ramp(std::int64_t n, double low, double high) {
  std::vector<double> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i)
    v[i] = low + (high - low) * static_cast<double>((i * 7) % n) / static_cast<double>(n);
  return v;
}

/// A floating input of `shape` and `dtype` that requires grad.
tmem::Var<B> input(tmem::Tape<B>& tape, tmem::Shape shape, DType dtype, double low = -1.0, double high = 1.0) {
  const std::int64_t n = shape.numel();
  return tape.input(tmem::Tensor<B>::from_host(std::move(shape), ramp(n, low, high), dtype), true);
}

tmem::Tensor<B> int_tensor(tmem::Shape shape, std::vector<double> values) {
  return tmem::Tensor<B>::from_host(std::move(shape), values, DType::I32);
}

struct OpCase {
  std::string name;
  std::function<tmem::Var<B>(tmem::Tape<B>&, DType, std::vector<tmem::Var<B>>&)> run;  // fills the floating inputs
  // Expected output dtype for: f32 inputs under bf16 autocast, f32 under f16, bf16 inputs
  // under bf16, bf16 inputs with autocast off, f64 inputs under bf16 autocast.
  DType f32_bf16, f32_f16, bf16_bf16, bf16_off, f64_bf16;
};

std::vector<OpCase> op_cases() {
  using V = std::vector<tmem::Var<B>>;
  auto one = [](auto f) {
    return [f](tmem::Tape<B>& tape, DType d, V& in) {
      in = {input(tape, tmem::Shape{4, 6}, d, 0.1, 2.0)};
      return f(in[0]);
    };
  };
  auto two = [](auto f) {
    return [f](tmem::Tape<B>& tape, DType d, V& in) {
      in = {input(tape, tmem::Shape{4, 6}, d), input(tape, tmem::Shape{4, 6}, d, -2.0, 0.5)};
      return f(in[0], in[1]);
    };
  };
  const DType F32 = DType::F32, F16 = DType::F16, BF16 = DType::BF16, F64 = DType::F64;
  return {
      // Lower precision: matmul, bmm, linear.
      {"matmul",
       [](tmem::Tape<B>& tape, DType d, V& in) {
         in = {input(tape, tmem::Shape{4, 6}, d), input(tape, tmem::Shape{6, 5}, d)};
         return tmem::matmul(in[0], in[1]);
       },
       BF16, F16, BF16, BF16, F64},
      {"bmm",
       [](tmem::Tape<B>& tape, DType d, V& in) {
         in = {input(tape, tmem::Shape{2, 4, 6}, d), input(tape, tmem::Shape{2, 6, 5}, d)};
         return tmem::bmm(in[0], in[1]);
       },
       BF16, F16, BF16, BF16, F64},
      {"linear",
       [](tmem::Tape<B>& tape, DType d, V& in) {
         in = {input(tape, tmem::Shape{4, 6}, d), input(tape, tmem::Shape{5, 6}, d), input(tape, tmem::Shape{5}, d)};
         return tmem::linear(in[0], in[1], in[2]);
       },
       BF16, F16, BF16, BF16, F64},
      // FP32: softmax, log_softmax, cross_entropy, sum, mean, exp, log.
      {"softmax", one([](auto x) { return tmem::softmax(x); }), F32, F32, F32, BF16, F64},
      {"log_softmax", one([](auto x) { return tmem::log_softmax(x); }), F32, F32, F32, BF16, F64},
      {"layer_norm",
       [](tmem::Tape<B>& tape, DType d, V& in) {
         in = {input(tape, tmem::Shape{4, 6}, d), input(tape, tmem::Shape{6}, d, 0.5, 1.5),
               input(tape, tmem::Shape{6}, d)};
         return tmem::layer_norm(in[0], in[1], in[2]);
       },
       F32, F32, BF16, BF16, F64},  // f32 math on the input's storage (NOTE [Norms in 16-bit storage])
      {"rms_norm",
       [](tmem::Tape<B>& tape, DType d, V& in) {
         in = {input(tape, tmem::Shape{4, 6}, d), input(tape, tmem::Shape{6}, d, 0.5, 1.5)};
         return tmem::rms_norm(in[0], in[1]);
       },
       F32, F32, BF16, BF16, F64},
      // The loss and the reductions produce their accumulator dtype: f32 for 16-bit inputs.
      {"cross_entropy",
       [](tmem::Tape<B>& tape, DType d, V& in) {
         in = {input(tape, tmem::Shape{4, 6}, d)};
         return tmem::cross_entropy(in[0], int_tensor(tmem::Shape{4}, {0, 5, 2, 3}));
       },
       F32, F32, F32, F32, F64},
      {"sum", one([](auto x) { return tmem::sum(x); }), F32, F32, F32, F32, F64},
      {"mean", one([](auto x) { return tmem::mean(x); }), F32, F32, F32, F32, F64},
      {"sum over an axis", one([](auto x) { return tmem::sum(x, -1, true); }), F32, F32, F32, F32, F64},
      {"mean over an axis", one([](auto x) { return tmem::mean(x, 0); }), F32, F32, F32, F32, F64},
      {"exp", one([](auto x) { return tmem::exp(x); }), F32, F32, F32, BF16, F64},
      {"log", one([](auto x) { return tmem::log(x); }), F32, F32, F32, BF16, F64},
      // Promote (widest input): equal dtypes here, so the inputs' dtype.
      {"add", two([](auto a, auto b) { return tmem::add(a, b); }), F32, F32, BF16, BF16, F64},
      {"sub", two([](auto a, auto b) { return tmem::sub(a, b); }), F32, F32, BF16, BF16, F64},
      {"mul", two([](auto a, auto b) { return tmem::mul(a, b); }), F32, F32, BF16, BF16, F64},
      {"concat", two([](auto a, auto b) {
         return tmem::concat<B>({a, b}, 0);
       }),
       F32, F32, BF16, BF16, F64},
      // Unchanged: the input's dtype.
      {"scale", one([](auto x) { return tmem::scale(x, 0.5); }), F32, F32, BF16, BF16, F64},
      {"relu", one([](auto x) { return tmem::relu(x); }), F32, F32, BF16, BF16, F64},
      {"gelu", one([](auto x) { return tmem::gelu(x); }), F32, F32, BF16, BF16, F64},
      {"sigmoid", one([](auto x) { return tmem::sigmoid(x); }), F32, F32, BF16, BF16, F64},
      {"tanh", one([](auto x) { return tmem::tanh(x); }), F32, F32, BF16, BF16, F64},
      {"dropout", one([](auto x) { return tmem::dropout(x, 0.25f); }), F32, F32, BF16, BF16, F64},
      {"reshape", one([](auto x) {
         return tmem::reshape(x, tmem::Shape{6, 4});
       }),
       F32, F32, BF16, BF16, F64},
      {"transpose", one([](auto x) { return tmem::transpose(x); }), F32, F32, BF16, BF16, F64},
      {"slice", one([](auto x) { return tmem::slice(x, 1, 1, 4); }), F32, F32, BF16, BF16, F64},
      {"embedding",
       [](tmem::Tape<B>& tape, DType d, V& in) {
         in = {input(tape, tmem::Shape{10, 6}, d)};
         return tmem::embedding(in[0], tape.input(int_tensor(tmem::Shape{3}, {1, 9, 1})));
       },
       F32, F32, BF16, BF16, F64},
  };
}

/// Runs `op` on `input_dtype` inputs; checks the output dtype, then that backward gives
/// each input a gradient in that input's own dtype.
void check_op(const OpCase& op, DType input_dtype, DType expected, const char* situation) {
  INFO(op.name << " with " << input_dtype << " inputs, " << situation);
  tmem::Tape<B> tape;
  std::vector<tmem::Var<B>> inputs;
  const tmem::Var<B> out = op.run(tape, input_dtype, inputs);
  CHECK(out.dtype() == expected);
  std::vector<double> ones(static_cast<std::size_t>(out.numel()), 1.0);
  out.backward(tmem::Tensor<B>::from_host(out.shape(), ones, out.dtype()));
  for (const auto& in : inputs) {
    REQUIRE(in.grad().defined());
    CHECK(in.grad().dtype() == in.dtype());
  }
}

}  // namespace

TEST_CASE("autocast picks each op category's dtype, backward returns grads in each input's dtype", "[amp][autocast]") {
  for (const OpCase& op : op_cases()) {
    {
      tmem::amp::Autocast guard(DType::BF16);
      check_op(op, DType::F32, op.f32_bf16, "bf16 autocast");
      check_op(op, DType::BF16, op.bf16_bf16, "bf16 autocast");
      check_op(op, DType::F64, op.f64_bf16, "bf16 autocast (f64 is never narrowed)");
    }
    {
      tmem::amp::Autocast guard(DType::F16);
      check_op(op, DType::F32, op.f32_f16, "f16 autocast");
    }
    check_op(op, DType::F32, DType::F32, "autocast off");
    check_op(op, DType::BF16, op.bf16_off, "autocast off");
  }
}

TEST_CASE("binary element-wise ops with mixed inputs run in the widest dtype", "[amp][autocast]") {
  struct Mixed {
    DType a, b, expected;
  };
  const std::vector<Mixed> cases = {{DType::BF16, DType::F32, DType::F32},
                                    {DType::F16, DType::F32, DType::F32},
                                    {DType::F16, DType::BF16, DType::F32},  // neither holds the other
                                    {DType::F32, DType::F64, DType::F64},
                                    {DType::BF16, DType::F64, DType::F64}};
  for (bool autocast_on : {false, true}) {
    tmem::amp::Autocast guard(DType::BF16, autocast_on);
    for (const auto& c : cases) {
      INFO(c.a << " + " << c.b << (autocast_on ? " under bf16 autocast" : " without autocast"));
      tmem::Tape<B> tape;
      auto a = input(tape, tmem::Shape{3, 4}, c.a), b = input(tape, tmem::Shape{3, 4}, c.b);
      const auto y = tmem::add(a, b), z = tmem::mul(a, b);
      CHECK(y.dtype() == c.expected);
      CHECK(z.dtype() == c.expected);
      tmem::sum(z).backward();
      CHECK(a.grad().dtype() == c.a);
      CHECK(b.grad().dtype() == c.b);
    }
  }
}

TEST_CASE("autocast guards nest, disable, restore, and stay on their thread", "[amp][autocast]") {
  auto linear_dtype = [] {
    tmem::Tape<B> tape;
    return tmem::matmul(input(tape, tmem::Shape{2, 3}, DType::F32), input(tape, tmem::Shape{3, 2}, DType::F32)).dtype();
  };
  auto softmax_dtype = [](DType in) {
    tmem::Tape<B> tape;
    return tmem::softmax(input(tape, tmem::Shape{2, 3}, in)).dtype();
  };
  REQUIRE_FALSE(tmem::amp::autocast_state().enabled);
  CHECK(linear_dtype() == DType::F32);
  {
    tmem::amp::Autocast outer(DType::BF16);
    CHECK(linear_dtype() == DType::BF16);
    {
      tmem::amp::Autocast inner(DType::F16);  // Autocast inside Autocast: the inner dtype wins
      CHECK(linear_dtype() == DType::F16);
      {
        auto off = tmem::amp::Autocast::disabled();  // disabled inside enabled
        CHECK(linear_dtype() == DType::F32);
        CHECK(softmax_dtype(DType::BF16) == DType::BF16);  // f32-category ops leave 16-bit inputs alone
        CHECK_FALSE(tmem::amp::autocast_state().enabled);
      }
      CHECK(linear_dtype() == DType::F16);
    }
    CHECK(linear_dtype() == DType::BF16);
    CHECK(softmax_dtype(DType::BF16) == DType::F32);

    // Another thread starts with autocast off, whatever this thread does.
    DType other = DType::BF16;
    bool other_enabled = true;
    std::thread worker([&] {
      other = linear_dtype();
      other_enabled = tmem::amp::autocast_state().enabled;
    });
    worker.join();
    CHECK(other == DType::F32);
    CHECK_FALSE(other_enabled);

    // Restoring an exact captured state (what checkpoint recompute does).
    const tmem::amp::AutocastState captured = tmem::amp::autocast_state();
    {
      auto off = tmem::amp::Autocast::disabled();
      tmem::amp::Autocast replay(captured);
      CHECK(tmem::amp::autocast_state() == captured);
      CHECK(linear_dtype() == DType::BF16);
    }
  }
  CHECK_FALSE(tmem::amp::autocast_state().enabled);
  CHECK(linear_dtype() == DType::F32);
  CHECK_THROWS_AS(tmem::amp::Autocast(DType::F32), tmem::Error);  // the autocast dtype must be 16-bit
}

TEST_CASE("CategoryOverride changes an op's category for its scope, nested and restored", "[amp][autocast]") {
  auto run = [](auto f) {
    tmem::Tape<B> tape;
    return f(tape).dtype();
  };
  auto linear = [](tmem::Tape<B>& tape) {
    return tmem::linear(input(tape, tmem::Shape{2, 3}, DType::F32), input(tape, tmem::Shape{4, 3}, DType::F32));
  };
  auto relu = [](tmem::Tape<B>& tape) { return tmem::relu(input(tape, tmem::Shape{2, 3}, DType::F32)); };
  auto softmax = [](tmem::Tape<B>& tape) { return tmem::softmax(input(tape, tmem::Shape{2, 3}, DType::BF16)); };
  tmem::amp::Autocast guard(DType::BF16);
  CHECK(run(linear) == DType::BF16);
  {
    tmem::amp::CategoryOverride keep_linear_f32("linear", tmem::AutocastCategory::Fp32);
    CHECK(run(linear) == DType::F32);
    CHECK(run(relu) == DType::F32);
    {
      tmem::amp::CategoryOverride relu_low("relu", tmem::AutocastCategory::LowerPrecision);
      tmem::amp::CategoryOverride softmax_unchanged("softmax", tmem::AutocastCategory::Unchanged);
      CHECK(run(linear) == DType::F32);  // the outer override still holds
      CHECK(run(relu) == DType::BF16);
      CHECK(run(softmax) == DType::BF16);
      {
        tmem::amp::Autocast inner(DType::F16);  // overrides survive a nested dtype change
        CHECK(run(relu) == DType::F16);
      }
    }
    CHECK(run(relu) == DType::F32);
    CHECK(run(softmax) == DType::F32);
  }
  CHECK(run(linear) == DType::BF16);
}

TEST_CASE("a parameter is cast once per version, an optimizer step invalidates the cast", "[amp][cast_cache]") {
  auto& cache = tmem::amp::CastCache<B>::instance();
  const std::vector<double> w0 = {0.1, 0.2, 0.30000001, -1.0, 1.0 / 3.0, 2.5};
  auto weight = tmem::Var<B>::parameter(tmem::Tensor<B>::from_host(tmem::Shape{2, 3}, w0), "w");
  tmem::optim::SGD<B> sgd({weight}, {.lr = 0.5});
  auto forward = [&](tmem::Tape<B>& tape) {
    auto x = tape.input(tmem::Tensor<B>::from_host(tmem::Shape{1, 3}, std::vector<double>{1.0, 1.0, 1.0}));
    return tmem::linear(x, weight);
  };
  tmem::amp::Autocast guard(DType::BF16);
  const auto made_before = cache.casts_made();
  tmem::Tape<B> tape;
  auto y1 = forward(tape);
  auto y2 = forward(tape);  // same version: reused (a checkpoint recompute does the same lookup)
  CHECK(cache.casts_made() == made_before + 1);
  CHECK(cache.get(weight.value(), DType::BF16).same_storage(cache.get(weight.value(), DType::BF16)));
  CHECK(cache.casts_made() == made_before + 1);

  tmem::sum(tmem::add(y1, y2)).backward();
  const auto grad = weight.grad().to_host<double>();
  sgd.step();  // bumps the parameter's version
  tmem::Tape<B> tape2;
  forward(tape2);
  CHECK(cache.casts_made() == made_before + 2);
  // The new cast holds the updated weight rounded to bf16 (reference: bf16 rounding by hand).
  const auto cast = cache.get(weight.value(), DType::BF16).to_host<double>();
  const auto updated = weight.value().to_host<double>();
  for (std::size_t i = 0; i < w0.size(); ++i) {
    CHECK(updated[i] == Approx(w0[i] - 0.5 * grad[i]).epsilon(1e-6));
    CHECK(cast[i] == tmem::testing::round_to_significant_bits(updated[i], 8));  // bf16: 8 significant bits
  }
  CHECK(cache.casts_made() == made_before + 2);
}
