// tests/ops/test_gradients.cpp — every op: forward against plain F64 loops, backward
// against central finite differences in F64.
//
// Each op is run on F64 inputs; its output is compared element by element with a
// reference written here as naive loops, and its gradient with respect to every
// floating input is checked by testing::check_gradients through a weighted sum of its
// output (a plain sum would hide errors that keep row sums, as in softmax). The last
// test case shows the checker failing a deliberately wrong gradient.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "gradcheck.hpp"
#include "philox_reference.hpp"
#include "reference.hpp"
#include "test_data.hpp"
#include "trainmem/trainmem.hpp"

using namespace trainmem;
using B = cpu::Backend;
using T = Tensor<B>;
using V = Var<B>;
using Vars = std::vector<V>;

namespace {

T f64(Shape shape, std::uint64_t seed, double low = -1.0, double high = 1.0) {
  return testing::random_tensor(std::move(shape), seed, low, high);
}
T f64_values(Shape shape, const std::vector<double>& values) {
  return T::from_host(std::move(shape), values, DType::F64);
}
std::vector<double> host(const T& t) { return t.to_host<double>(); }

/// Element-wise |got - want| <= tol (1 + |want|); equal infinities match.
void check_values(const std::vector<double>& got, const std::vector<double>& want, double tol = 1e-12) {
  REQUIRE(got.size() == want.size());
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const bool same_inf = std::isinf(want[i]) && got[i] == want[i];
    if (!same_inf && !(std::abs(got[i] - want[i]) <= tol * (1.0 + std::abs(want[i]))) && bad++ == 0) first = i;
  }
  INFO(bad << " of " << got.size() << " values differ; first at " << first << ": got " << got[first] << ", want "
           << want[first]);
  CHECK(bad == 0);
}

void check_gradcheck(const testing::GradCheckResult& r) {
  INFO(r.report());
  CHECK(r.ok);
  CHECK(r.checked > 0);
}

/// Forward of `op` on `inputs` against `expected`, then its gradient against finite differences.
template <class Op>
void check_op(Op op, const std::vector<T>& inputs, const std::vector<double>& expected, double forward_tol = 1e-12,
              testing::GradCheckOptions options = {}) {
  {
    Tape<B> tape;
    Vars vars;
    for (const T& t : inputs) vars.push_back(tape.input(t, true));
    const V y = op(tape, vars);
    CHECK(y.dtype() == DType::F64);
    check_values(host(y.value()), expected, forward_tol);
  }
  check_gradcheck(testing::check_gradients(
      [&](Tape<B>& tape, const Vars& in) { return testing::weighted_sum(tape, op(tape, in)); }, inputs, options));
}

/// Where element `flat` of a shape-`a` tensor finds its partner in a shape-`b` tensor
/// under NumPy's rule (shapes aligned from the right, extent-1 axes repeat): the reference
/// the broadcasting ops are checked against.
std::size_t numpy_partner(const Shape& a, const Shape& b, std::size_t flat) {
  std::size_t partner = 0, stride = 1;
  auto rest = static_cast<std::int64_t>(flat);
  for (std::size_t k = 0; k < a.rank(); ++k) {
    const std::size_t axis = a.rank() - 1 - k;
    const std::int64_t coordinate = rest % a[axis];
    rest /= a[axis];
    if (k >= b.rank()) continue;
    const std::int64_t extent = b[b.rank() - 1 - k];
    partner += static_cast<std::size_t>(extent == 1 ? 0 : coordinate) * stride;
    stride *= static_cast<std::size_t>(extent);
  }
  return partner;
}

}  // namespace

TEST_CASE("matmul: all four transpose combinations", "[ops][grad][matmul]") {
  const bool ta = GENERATE(false, true), tb = GENERATE(false, true);
  INFO("trans_a " << ta << ", trans_b " << tb);
  const std::int64_t m = 3, k = 4, n = 5;
  const T a = f64(ta ? Shape{k, m} : Shape{m, k}, 1), b = f64(tb ? Shape{n, k} : Shape{k, n}, 2);
  check_op([&](Tape<B>&, const Vars& in) { return matmul(in[0], in[1], ta, tb); }, {a, b},
           testing::matmul_reference(host(a), host(b), 1, m, n, k, ta, tb));
}

TEST_CASE("bmm: all four transpose combinations", "[ops][grad][matmul]") {
  const bool ta = GENERATE(false, true), tb = GENERATE(false, true);
  INFO("trans_a " << ta << ", trans_b " << tb);
  const std::int64_t batch = 2, m = 3, k = 4, n = 2;
  const T a = f64(ta ? Shape{batch, k, m} : Shape{batch, m, k}, 3),
          b = f64(tb ? Shape{batch, n, k} : Shape{batch, k, n}, 4);
  check_op([&](Tape<B>&, const Vars& in) { return bmm(in[0], in[1], ta, tb); }, {a, b},
           testing::matmul_reference(host(a), host(b), batch, m, n, k, ta, tb));
}

TEST_CASE("linear: y = x W^T + b, with and without bias, on a rank-3 x", "[ops][grad][matmul]") {
  const bool with_bias = GENERATE(false, true);
  INFO("bias " << with_bias);
  const std::int64_t rows = 6, in = 4, out = 5;
  const T x = f64(Shape{2, 3, in}, 5), w = f64(Shape{out, in}, 6), b = f64(Shape{out}, 7);
  const auto xv = host(x), wv = host(w), bv = host(b);
  std::vector<double> expected(rows * out);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t o = 0; o < out; ++o) {
      double acc = with_bias ? bv[o] : 0.0;
      for (std::int64_t i = 0; i < in; ++i) acc += xv[r * in + i] * wv[o * in + i];
      expected[r * out + o] = acc;
    }
  std::vector<T> inputs = {x, w};
  if (with_bias) inputs.push_back(b);
  check_op([&](Tape<B>&, const Vars& v) { return with_bias ? linear(v[0], v[1], v[2]) : linear(v[0], v[1]); }, inputs,
           expected);
  Tape<B> tape;
  CHECK(linear(tape.input(x), tape.input(w)).shape() == Shape{2, 3, out});
}

TEST_CASE("feed_forward: linear, GELU, linear as one op, biases present or not, both GELUs", "[ops][grad][matmul]") {
  const bool with_biases = GENERATE(false, true);
  const auto approximation = GENERATE(GeluApproximation::Tanh, GeluApproximation::Erf);
  INFO("biases " << with_biases << ", tanh GELU " << (approximation == GeluApproximation::Tanh));
  const std::int64_t rows = 6, dim = 4, hidden = 7, out = 3;
  const T x = f64(Shape{2, 3, dim}, 21, -2, 2), w1 = f64(Shape{hidden, dim}, 22), b1 = f64(Shape{hidden}, 23);
  const T w2 = f64(Shape{out, hidden}, 24), b2 = f64(Shape{out}, 25);
  const auto xv = host(x), w1v = host(w1), b1v = host(b1), w2v = host(w2), b2v = host(b2);
  const double pi = std::acos(-1.0);
  const auto gelu_ref = [&](double z) {
    return approximation == GeluApproximation::Tanh
               ? 0.5 * z * (1 + std::tanh(std::sqrt(2 / pi) * (z + 0.044715 * z * z * z)))
               : 0.5 * z * (1 + std::erf(z / std::sqrt(2.0)));
  };
  std::vector<double> expected(rows * out);
  for (std::int64_t r = 0; r < rows; ++r) {
    std::vector<double> h(hidden);
    for (std::int64_t j = 0; j < hidden; ++j) {
      double z = with_biases ? b1v[j] : 0.0;
      for (std::int64_t i = 0; i < dim; ++i) z += xv[r * dim + i] * w1v[j * dim + i];
      h[j] = gelu_ref(z);
    }
    for (std::int64_t o = 0; o < out; ++o) {
      double y = with_biases ? b2v[o] : 0.0;
      for (std::int64_t j = 0; j < hidden; ++j) y += h[j] * w2v[o * hidden + j];
      expected[r * out + o] = y;
    }
  }
  const std::vector<T> inputs = with_biases ? std::vector<T>{x, w1, w2, b1, b2} : std::vector<T>{x, w1, w2};
  check_op(
      [&](Tape<B>&, const Vars& v) {
        return with_biases ? feed_forward(v[0], v[1], v[3], v[2], v[4], approximation)
                           : feed_forward(v[0], v[1], V(), v[2], V(), approximation);
      },
      inputs, expected);
  Tape<B> tape;
  CHECK(feed_forward(tape.input(x), tape.input(w1), V(), tape.input(w2), V()).shape() == Shape{2, 3, out});
  CHECK_THROWS_WITH(feed_forward(tape.input(x), tape.input(w2), V(), tape.input(w1), V()),
                    Catch::Contains("feed_forward") && Catch::Contains("do not chain"));
}

TEST_CASE("add, sub, mul: same shape, row, column, one collapsed axis and scalar b", "[ops][grad][elementwise]") {
  struct Case {
    Shape a, b;
  };
  const Case c = GENERATE(Case{Shape{2, 3}, Shape{2, 3}}, Case{Shape{2, 3}, Shape{3}}, Case{Shape{2, 2, 3}, Shape{3}},
                          Case{Shape{2, 3}, Shape{}}, Case{Shape{2, 3}, Shape{1}}, Case{Shape{4}, Shape{4}},
                          Case{Shape{2, 3}, Shape{2, 1}}, Case{Shape{3, 3}, Shape{3, 1}},
                          Case{Shape{3, 3}, Shape{1, 3}}, Case{Shape{2, 3, 4}, Shape{2, 1, 4}},
                          Case{Shape{2, 3, 4}, Shape{1, 3, 4}}, Case{Shape{2, 3, 4}, Shape{2, 3, 1}});
  const int which = GENERATE(0, 1, 2);
  const char* names[] = {"add", "sub", "mul"};
  INFO(names[which] << " a " << c.a << " b " << c.b);
  const T a = f64(c.a, 8), b = f64(c.b, 9, 0.5, 1.5);
  const auto av = host(a), bv = host(b);
  const auto n = static_cast<std::size_t>(c.a.numel()), nb = static_cast<std::size_t>(c.b.numel());
  std::vector<double> expected(n);
  for (std::size_t i = 0; i < n; ++i) {
    const double bi = nb == 1 ? bv[0] : bv[numpy_partner(c.a, c.b, i)];
    expected[i] = which == 0 ? av[i] + bi : which == 1 ? av[i] - bi : av[i] * bi;
  }
  check_op(
      [&](Tape<B>&, const Vars& in) {
        return which == 0 ? add(in[0], in[1]) : which == 1 ? sub(in[0], in[1]) : mul(in[0], in[1]);
      },
      {a, b}, expected);
}

TEST_CASE("scale", "[ops][grad][elementwise]") {
  const T x = f64(Shape{3, 4}, 10);
  auto expected = host(x);
  for (auto& v : expected) v *= -1.7;
  check_op([](Tape<B>&, const Vars& in) { return scale(in[0], -1.7); }, {x}, expected);
}

TEST_CASE("activations: relu, gelu (tanh, erf), sigmoid, tanh, exp, log", "[ops][grad][activation]") {
  struct Activation {
    const char* name;
    std::function<V(const V&)> op;
    std::function<double(double)> reference;
    T input;
  };
  const double pi = std::acos(-1.0);
  const auto away_from_kink = testing::random_signed_away_from_zero(24, 11, 0.05, 2.0);
  const std::vector<Activation> cases = {
      {"relu", [](const V& x) { return relu(x); }, [](double x) { return x > 0 ? x : 0.0; },
       f64_values(Shape{4, 6}, away_from_kink)},
      {"gelu tanh", [](const V& x) { return gelu(x, GeluApproximation::Tanh); },
       [pi](double x) { return 0.5 * x * (1 + std::tanh(std::sqrt(2 / pi) * (x + 0.044715 * x * x * x))); },
       f64(Shape{4, 6}, 12, -3, 3)},
      {"gelu erf", [](const V& x) { return gelu(x, GeluApproximation::Erf); },
       [](double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }, f64(Shape{4, 6}, 13, -3, 3)},
      {"sigmoid", [](const V& x) { return sigmoid(x); }, [](double x) { return 1 / (1 + std::exp(-x)); },
       f64(Shape{4, 6}, 14, -4, 4)},
      {"tanh", [](const V& x) { return trainmem::tanh(x); }, [](double x) { return std::tanh(x); },
       f64(Shape{4, 6}, 15, -2, 2)},
      {"exp", [](const V& x) { return trainmem::exp(x); }, [](double x) { return std::exp(x); },
       f64(Shape{4, 6}, 16, -2, 2)},
      {"log", [](const V& x) { return trainmem::log(x); }, [](double x) { return std::log(x); },
       f64(Shape{4, 6}, 17, 0.2, 3)},
  };
  for (const auto& c : cases) {
    INFO(c.name);
    auto expected = host(c.input);
    for (auto& v : expected) v = c.reference(v);
    check_op([&](Tape<B>&, const Vars& in) { return c.op(in[0]); }, {c.input}, expected);
  }
}

TEST_CASE("silu: closed form, F64 gradient, NaN propagates, and swiglu = silu(gate) * up", "[ops][grad][activation]") {
  const auto silu_ref = [](double x) { return x / (1.0 + std::exp(-x)); };
  SECTION("silu against x / (1 + e^-x) and central differences") {
    const T x = f64(Shape{4, 6}, 18, -5, 5);
    auto expected = host(x);
    for (auto& v : expected) v = silu_ref(v);
    check_op([](Tape<B>&, const Vars& in) { return silu(in[0]); }, {x}, expected);
  }
  SECTION("swiglu against silu(g) u and central differences in both inputs") {
    const T g = f64(Shape{3, 5}, 19, -4, 4), u = f64(Shape{3, 5}, 20, -2, 2);
    const auto gv = host(g), uv = host(u);
    std::vector<double> expected(gv.size());
    for (std::size_t i = 0; i < gv.size(); ++i) expected[i] = silu_ref(gv[i]) * uv[i];
    check_op([](Tape<B>&, const Vars& in) { return swiglu(in[0], in[1]); }, {g, u}, expected);
  }
  SECTION("f32: values within the fast exp's error; NaN in, NaN out, value and gradient") {
    const double nan = std::numeric_limits<double>::quiet_NaN();
    const std::vector<double> xs = {-20.0, -3.0, -0.5, 0.0, 0.25, 2.0, 30.0, nan};
    Tape<B> tape;
    const V x = tape.input(T::from_host(Shape{8}, xs, DType::F32), true);
    const V y = silu(x);
    const auto got = host(y.value());
    for (std::size_t i = 0; i + 1 < xs.size(); ++i) {
      INFO("x = " << xs[i]);
      CHECK(std::abs(got[i] - silu_ref(xs[i])) <= 1e-6 * (1.0 + std::abs(silu_ref(xs[i]))));
    }
    CHECK(std::isnan(got.back()));
    tape.backward(testing::weighted_sum(tape, y));
    CHECK(std::isnan(host(x.grad()).back()));
  }
}

TEST_CASE("sqrt, rsqrt and pow with integer, fractional, negative and zero exponents", "[ops][grad][power]") {
  struct Power {
    std::string name;
    std::function<V(const V&)> op;
    std::function<double(double)> reference;
  };
  std::vector<Power> cases = {
      {"sqrt", [](const V& x) { return trainmem::sqrt(x); }, [](double x) { return std::sqrt(x); }},
      {"rsqrt", [](const V& x) { return rsqrt(x); }, [](double x) { return 1.0 / std::sqrt(x); }},
  };
  for (double e : {2.0, 3.0, 0.5, -1.5, 0.0, 1.0})
    cases.push_back({"pow " + std::to_string(e), [e](const V& x) { return trainmem::pow(x, e); },
                     [e](double x) { return std::pow(x, e); }});
  const T x = f64(Shape{4, 6}, 23, 0.2, 3.0);
  for (const auto& c : cases) {
    INFO(c.name);
    auto expected = host(x);
    for (auto& v : expected) v = c.reference(v);
    check_op([&](Tape<B>&, const Vars& in) { return c.op(in[0]); }, {x}, expected);
  }
  // An integer exponent of a negative base is defined, and so is its gradient.
  const T negative = f64(Shape{3, 4}, 24, -2.0, -0.3);
  auto cubes = host(negative);
  for (auto& v : cubes) v = v * v * v;
  check_op([](Tape<B>&, const Vars& in) { return trainmem::pow(in[0], 3.0); }, {negative}, cubes);
}

TEST_CASE("div: same shape, row, column and scalar b", "[ops][grad][elementwise]") {
  const Shape b_shape = GENERATE(Shape{2, 3}, Shape{3}, Shape{}, Shape{1}, Shape{2, 1}, Shape{1, 3});
  INFO("b " << b_shape);
  const Shape a_shape{2, 3};
  const T a = f64(a_shape, 25), b = f64(b_shape, 26, 0.5, 1.5);
  const auto av = host(a), bv = host(b);
  std::vector<double> expected(av.size());
  for (std::size_t i = 0; i < av.size(); ++i)
    expected[i] = av[i] / bv[bv.size() == 1 ? 0 : numpy_partner(a_shape, b_shape, i)];
  check_op([](Tape<B>&, const Vars& in) { return div(in[0], in[1]); }, {a, b}, expected);
  check_op([](Tape<B>&, const Vars& in) { return in[0] / in[1]; }, {a, b}, expected);
}

TEST_CASE("cast: f64 to f32 and back passes the gradient through, cast back", "[ops][grad][cast]") {
  // Values and steps on a 2^-12 grid are exact in f32, so the round trip is the identity
  // and central differences through it are exact too.
  std::vector<double> grid(12);
  for (std::size_t i = 0; i < grid.size(); ++i) grid[i] = (static_cast<double>(i) * 1229.0 - 7000.0) / 4096.0;
  const T x = f64_values(Shape{3, 4}, grid);
  testing::GradCheckOptions options;
  options.step = 1.0 / 1024.0;
  check_op([](Tape<B>&, const Vars& in) { return cast(cast(in[0], DType::F32), DType::F64); }, {x}, grid, 0.0, options);
  Tape<B> tape;
  const V xin = tape.input(x, true);
  const V narrow = cast(xin, DType::F32);
  CHECK(narrow.dtype() == DType::F32);
  tape.backward(sum(narrow));
  CHECK(xin.grad().dtype() == DType::F64);
  check_values(host(xin.grad()), std::vector<double>(12, 1.0), 0.0);
}

TEST_CASE("dropout: mask from Philox(seed, offset), same mask in backward", "[ops][grad][dropout]") {
  const float p = 0.3f;
  const std::int64_t n = 4096;
  const T x = f64(Shape{64, 64}, 18, 0.5, 1.5);
  const auto xv = host(x);
  Tape<B> tape;
  tape.manual_seed(1234);
  const RngState start = tape.rng().state();
  CHECK(start == RngState{1234, 0});
  const V xin = tape.input(x, true, "x");
  const V y = dropout(xin, p);
  CHECK(tape.rng().state().offset == static_cast<std::uint64_t>(n));
  const auto yv = host(y.value());

  // Forward: element i is kept iff its uniform draw >= p, with an independent Philox.
  std::vector<double> expected(n);
  std::int64_t kept = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const double u = testing::uniform_from_bits(testing::philox_stream_reference(start.seed, start.offset, i));
    const bool keep = u >= static_cast<double>(p);
    kept += keep;
    expected[i] = keep ? xv[i] / (1.0 - static_cast<double>(p)) : 0.0;
  }
  check_values(yv, expected, 1e-7);  // the scale 1/(1-p) is computed in float
  const double keep_rate = static_cast<double>(kept) / n;
  CHECK(std::abs(keep_rate - 0.7) < 4 * std::sqrt(0.21 / n));

  // Backward regenerates the same mask: dx = dy * keep / (1 - p).
  tape.backward(sum(y));
  const auto dx = host(xin.grad());
  std::int64_t mismatched = 0;
  for (std::int64_t i = 0; i < n; ++i)
    if (std::abs(dx[i] - yv[i] / xv[i]) > 1e-12) ++mismatched;
  CHECK(mismatched == 0);

  // The next dropout on the tape draws a fresh stream; eval mode and p = 0 are the identity.
  const V y2 = dropout(tape.input(x, true), p);
  CHECK(host(y2.value()) != yv);
  CHECK(dropout(xin, p, /*training=*/false).handle() == xin.handle());
  CHECK(dropout(xin, 0.0f).handle() == xin.handle());

  // Finite differences: every pass runs on a fresh tape, so draws the same mask.
  check_gradcheck(testing::check_gradients(
      [&](Tape<B>& t, const Vars& in) { return testing::weighted_sum(t, dropout(in[0], 0.4f)); },
      {f64(Shape{4, 5}, 19)}));
}

TEST_CASE("layer_norm over the last dimension: x, gamma and beta", "[ops][grad][norm]") {
  const std::int64_t rows = 6, d = 5;
  const T x = f64(Shape{2, 3, d}, 20, -2, 2), gamma = f64(Shape{d}, 21, 0.5, 1.5), beta = f64(Shape{d}, 22);
  const double eps = 1e-5;
  const auto xv = host(x), gv = host(gamma), bv = host(beta);
  std::vector<double> expected(rows * d);
  for (std::int64_t r = 0; r < rows; ++r) {
    double mean = 0, var = 0;
    for (std::int64_t c = 0; c < d; ++c) mean += xv[r * d + c] / d;
    for (std::int64_t c = 0; c < d; ++c) var += (xv[r * d + c] - mean) * (xv[r * d + c] - mean) / d;
    for (std::int64_t c = 0; c < d; ++c)
      expected[r * d + c] = (xv[r * d + c] - mean) / std::sqrt(var + eps) * gv[c] + bv[c];
  }
  check_op([&](Tape<B>&, const Vars& in) { return layer_norm(in[0], in[1], in[2], eps); }, {x, gamma, beta}, expected);
}

TEST_CASE("rms_norm over the last dimension: x and weight", "[ops][grad][norm]") {
  const std::int64_t d = GENERATE(1, 5, 64);
  INFO("d " << d);
  const std::int64_t rows = 6;
  const T x = f64(Shape{2, 3, d}, 27, -2, 2), weight = f64(Shape{d}, 28, 0.5, 1.5);
  const double eps = 1e-5;
  const auto xv = host(x), wv = host(weight);
  std::vector<double> expected(rows * d);
  for (std::int64_t r = 0; r < rows; ++r) {
    double mean_square = 0;
    for (std::int64_t c = 0; c < d; ++c) mean_square += xv[r * d + c] * xv[r * d + c] / d;
    for (std::int64_t c = 0; c < d; ++c) expected[r * d + c] = xv[r * d + c] / std::sqrt(mean_square + eps) * wv[c];
  }
  check_op([&](Tape<B>&, const Vars& in) { return rms_norm(in[0], in[1], eps); }, {x, weight}, expected);
}

TEST_CASE("softmax and log_softmax over the last dimension", "[ops][grad][softmax]") {
  const bool log_output = GENERATE(false, true);
  INFO((log_output ? "log_softmax" : "softmax"));
  const std::int64_t rows = 4, cols = 5;
  const T x = f64(Shape{rows, cols}, 23, -3, 3);
  const auto xv = host(x);
  std::vector<double> expected(rows * cols);
  for (std::int64_t r = 0; r < rows; ++r) {
    double total = 0;
    for (std::int64_t c = 0; c < cols; ++c) total += std::exp(xv[r * cols + c]);
    for (std::int64_t c = 0; c < cols; ++c)
      expected[r * cols + c] = log_output ? xv[r * cols + c] - std::log(total) : std::exp(xv[r * cols + c]) / total;
  }
  auto op = [&](const V& v) { return log_output ? log_softmax(v) : softmax(v); };
  check_op([&](Tape<B>&, const Vars& in) { return op(in[0]); }, {x}, expected);

  // Large logits: the max is subtracted first, so nothing overflows.
  Tape<B> tape;
  const auto big = host(op(tape.input(f64_values(Shape{1, 3}, {1000.0, 1001.0, 1002.0}))).value());
  const double lse = 1002.0 + std::log(std::exp(-2.0) + std::exp(-1.0) + 1.0);
  check_values(big, log_output ? std::vector<double>{1000 - lse, 1001 - lse, 1002 - lse}
                               : std::vector<double>{std::exp(1000 - lse), std::exp(1001 - lse), std::exp(1002 - lse)});
}

TEST_CASE("cross_entropy: integer labels, mean over rows", "[ops][grad][loss]") {
  const std::int64_t rows = 4, cols = 5;
  const T logits = f64(Shape{rows, cols}, 24, -3, 3);
  const std::vector<double> labels = {1, 0, 4, 1};
  const T label_tensor = testing::int_tensor(Shape{rows}, labels);
  const auto lv = host(logits);
  double loss = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    double total = 0;
    for (std::int64_t c = 0; c < cols; ++c) total += std::exp(lv[r * cols + c]);
    loss += (std::log(total) - lv[r * cols + static_cast<std::int64_t>(labels[r])]) / rows;
  }
  check_op([&](Tape<B>&, const Vars& in) { return cross_entropy(in[0], label_tensor); }, {logits}, {loss});
  // Gradient closed form: (softmax - onehot) / rows.
  Tape<B> tape;
  const V x = tape.input(logits, true);
  tape.backward(cross_entropy(x, label_tensor));
  std::vector<double> want(rows * cols);
  for (std::int64_t r = 0; r < rows; ++r) {
    double total = 0;
    for (std::int64_t c = 0; c < cols; ++c) total += std::exp(lv[r * cols + c]);
    for (std::int64_t c = 0; c < cols; ++c)
      want[r * cols + c] = (std::exp(lv[r * cols + c]) / total - (c == labels[r] ? 1.0 : 0.0)) / rows;
  }
  check_values(host(x.grad()), want);
}

TEST_CASE("embedding: row lookup, repeated ids accumulate", "[ops][grad][embedding]") {
  const std::int64_t vocab = 6, dim = 3;
  const T weight = f64(Shape{vocab, dim}, 25);
  const std::vector<double> ids = {1, 4, 1, 0, 5, 1};
  const T id_tensor = testing::int_tensor(Shape{2, 3}, ids);
  const auto wv = host(weight);
  std::vector<double> expected;
  for (double id : ids)
    for (std::int64_t d = 0; d < dim; ++d) expected.push_back(wv[static_cast<std::int64_t>(id) * dim + d]);
  check_op([&](Tape<B>& t, const Vars& in) { return embedding(in[0], t.input(id_tensor)); }, {weight}, expected);

  Tape<B> tape;
  const V w = tape.input(weight, true);
  const V y = embedding(w, tape.input(id_tensor));
  CHECK(y.shape() == Shape{2, 3, dim});
  tape.backward(sum(y));  // d/dW[v] = number of times v was looked up
  const std::vector<double> counts = {1, 3, 0, 0, 1, 1};
  std::vector<double> want;
  for (double c : counts)
    for (std::int64_t d = 0; d < dim; ++d) want.push_back(c);
  check_values(host(w.grad()), want);
}

TEST_CASE("reshape, transpose, split_heads, merge_heads", "[ops][grad][shape]") {
  const T x = f64(Shape{2, 3, 4}, 26);
  const auto xv = host(x);
  SECTION("reshape") {
    check_op([](Tape<B>&, const Vars& in) { return reshape(in[0], Shape{4, 6}); }, {x}, xv);
  }
  SECTION("transpose") {
    std::vector<double> expected(24);
    for (int b = 0; b < 2; ++b)
      for (int r = 0; r < 3; ++r)
        for (int c = 0; c < 4; ++c) expected[(b * 4 + c) * 3 + r] = xv[(b * 3 + r) * 4 + c];
    check_op([](Tape<B>&, const Vars& in) { return transpose(in[0]); }, {x}, expected);
    Tape<B> tape;
    CHECK(transpose(tape.input(x)).shape() == Shape{2, 4, 3});
  }
  SECTION("split_heads and merge_heads") {
    const std::int64_t batch = 2, t = 3, heads = 2, dh = 2;
    std::vector<double> split(24);  // [batch*H, T, Dh] from [batch, T, H*Dh]
    for (std::int64_t b = 0; b < batch; ++b)
      for (std::int64_t s = 0; s < t; ++s)
        for (std::int64_t h = 0; h < heads; ++h)
          for (std::int64_t d = 0; d < dh; ++d)
            split[((b * heads + h) * t + s) * dh + d] = xv[(b * t + s) * heads * dh + h * dh + d];
    check_op([&](Tape<B>&, const Vars& in) { return split_heads(in[0], heads); }, {x}, split);
    const T y = f64_values(Shape{batch * heads, t, dh}, split);
    check_op([&](Tape<B>&, const Vars& in) { return merge_heads(in[0], heads); }, {y}, xv);
    Tape<B> tape;
    const V s = split_heads(tape.input(x), heads);
    CHECK(s.shape() == Shape{4, 3, 2});
    CHECK(merge_heads(s, heads).shape() == Shape{2, 3, 4});
  }
}

TEST_CASE("causal_mask: -inf above the diagonal, zero gradient there", "[ops][grad][shape]") {
  const std::int64_t t = 3;
  const T x = f64(Shape{2, t, t}, 27);
  const auto xv = host(x);
  std::vector<double> expected = xv;
  for (int b = 0; b < 2; ++b)
    for (int i = 0; i < t; ++i)
      for (int j = i + 1; j < t; ++j) expected[(b * t + i) * t + j] = -std::numeric_limits<double>::infinity();
  Tape<B> tape;
  const V xin = tape.input(x, true);
  const V y = causal_mask(xin);
  check_values(host(y.value()), expected);
  // Backward with a seed: the seed passes below and on the diagonal, zero above.
  const auto seed = testing::random_values(18, 28);
  tape.backward(y, f64_values(Shape{2, t, t}, seed));
  std::vector<double> want = seed;
  for (int b = 0; b < 2; ++b)
    for (int i = 0; i < t; ++i)
      for (int j = i + 1; j < t; ++j) want[(b * t + i) * t + j] = 0.0;
  check_values(host(xin.grad()), want);
  // Finite differences through the softmax that always follows it in attention
  // (a masked entry's numeric derivative is 0: it never reaches the output).
  check_gradcheck(testing::check_gradients(
      [](Tape<B>& tp, const Vars& in) { return testing::weighted_sum(tp, softmax(causal_mask(in[0]))); }, {x}));
}

TEST_CASE("sum and mean of all elements", "[ops][grad][reduction]") {
  const T x = f64(Shape{3, 4}, 29);
  double total = 0;
  for (double v : host(x)) total += v;
  check_op([](Tape<B>&, const Vars& in) { return sum(in[0]); }, {x}, {total});
  check_op([](Tape<B>&, const Vars& in) { return mean(in[0]); }, {x}, {total / 12});
  Tape<B> tape;
  const V xin = tape.input(x, true);
  tape.backward(mean(xin));
  check_values(host(xin.grad()), std::vector<double>(12, 1.0 / 12));
}

TEST_CASE("sum and mean over one axis, keepdim or not", "[ops][grad][reduction]") {
  const Shape shape{2, 3, 4};
  const int axis = GENERATE(0, 1, 2, -1, -3);
  const bool keepdim = GENERATE(false, true);
  INFO("axis " << axis << (keepdim ? " keepdim" : ""));
  const T x = f64(shape, 41);
  const auto xv = host(x);
  const auto at = static_cast<std::size_t>(axis < 0 ? axis + 3 : axis);
  // Reference: every element adds into the output cell whose coordinate on `at` is 0.
  std::vector<std::int64_t> out_dims = shape.dims();
  out_dims[at] = 1;
  const Shape kept(out_dims);
  std::vector<double> sums(static_cast<std::size_t>(kept.numel()), 0.0);
  for (std::size_t i = 0; i < xv.size(); ++i) sums[numpy_partner(shape, kept, i)] += xv[i];
  std::vector<double> means = sums;
  for (double& m : means) m /= static_cast<double>(shape[at]);
  check_op([&](Tape<B>&, const Vars& in) { return sum(in[0], axis, keepdim); }, {x}, sums);
  check_op([&](Tape<B>&, const Vars& in) { return mean(in[0], axis, keepdim); }, {x}, means);
  Tape<B> tape;
  const V y = sum(tape.input(x), axis, keepdim);
  if (!keepdim) out_dims.erase(out_dims.begin() + static_cast<std::ptrdiff_t>(at));
  CHECK(y.shape() == Shape(out_dims));
}

TEST_CASE("an RMSNorm written with axis ops matches the rms_norm op", "[ops][grad][reduction]") {
  // y = x * rsqrt(mean(x^2, -1, keepdim) + eps) * w: the custom layer issue 17 tried to write.
  const T x = f64(Shape{3, 5}, 42), w = f64(Shape{5}, 43, 0.5, 1.5), eps = f64_values(Shape{}, {1e-6});
  auto composed = [&](Tape<B>&, const Vars& in) {
    return mul(mul(in[0], rsqrt(add(mean(mul(in[0], in[0]), -1, true), in[2]))), in[1]);
  };
  Tape<B> tape;
  const V fused = rms_norm(tape.input(x), tape.input(w), 1e-6);
  check_op(composed, {x, w, eps}, host(fused.value()), 1e-12);
}

TEST_CASE("slice and concat along each axis", "[ops][grad][shape]") {
  const Shape shape{2, 3, 4};
  const int axis = GENERATE(0, 1, 2, -1);
  const auto at = static_cast<std::size_t>(axis < 0 ? axis + 3 : axis);
  INFO("axis " << axis);
  const T x = f64(shape, 44);
  const auto xv = host(x);
  // Reference slices [1, extent) by walking coordinates.
  const std::int64_t extent = shape[at];
  std::vector<double> sliced;
  for (std::size_t i = 0; i < xv.size(); ++i) {
    std::int64_t rest = static_cast<std::int64_t>(i), coordinate = 0;
    for (std::size_t k = 3; k-- > at;) {
      coordinate = rest % shape[k];
      rest /= shape[k];
    }
    if (coordinate >= 1) sliced.push_back(xv[i]);
  }
  check_op([&](Tape<B>&, const Vars& in) { return slice(in[0], axis, 1, extent); }, {x}, sliced);

  // concat(a, b) along the axis, against an interleaving by hand: parts of extents 2 and 1.
  std::vector<std::int64_t> dims_a = shape.dims(), dims_b = shape.dims();
  dims_a[at] = 2;
  dims_b[at] = 1;
  const T a = f64(Shape(dims_a), 45), b = f64(Shape(dims_b), 46);
  const auto av = host(a), bv = host(b);
  std::int64_t outer = 1, inner = 1;
  for (std::size_t k = 0; k < at; ++k) outer *= shape[k];
  for (std::size_t k = at + 1; k < 3; ++k) inner *= shape[k];
  std::vector<double> joined;
  for (std::int64_t o = 0; o < outer; ++o) {
    for (std::int64_t j = 0; j < 2 * inner; ++j) joined.push_back(av[o * 2 * inner + j]);
    for (std::int64_t j = 0; j < inner; ++j) joined.push_back(bv[o * inner + j]);
  }
  check_op([&](Tape<B>&, const Vars& in) { return concat(in, axis); }, {a, b}, joined);
  // slice undoes concat
  check_op([&](Tape<B>&, const Vars& in) { return slice(concat(in, axis), axis, 2, 3); }, {a, b}, bv);
}

TEST_CASE("axis ops reject bad axes, ranges and shapes with the op's name", "[ops][reduction][shape]") {
  Tape<B> tape;
  const V x = tape.input(f64(Shape{2, 3}, 47));
  CHECK_THROWS_WITH(sum(x, 2), Catch::Contains("sum: axis 2 is out of range for [2, 3]"));
  CHECK_THROWS_WITH(mean(x, -3, true), Catch::Contains("mean: axis -3 is out of range"));
  CHECK_THROWS_WITH(sum(tape.input(f64(Shape{}, 1)), 0), Catch::Contains("sum: a scalar has no axis 0"));
  CHECK_THROWS_WITH(slice(x, 1, 2, 4), Catch::Contains("slice: range [2, 4) is not within axis 1 of [2, 3]"));
  CHECK_THROWS_WITH(concat<B>({x, tape.input(f64(Shape{3, 3}, 2))}, 1),
                    Catch::Contains("concat: part 1 [3, 3] does not line up with part 0 [2, 3]"));
  CHECK_THROWS_WITH(concat<B>({}, 0), Catch::Contains("concat: nothing to join"));
  CHECK_THROWS_WITH(add(x, tape.input(f64(Shape{1, 1, 3}, 3))), Catch::Contains("add: cannot broadcast b [1, 1, 3]"));
  CHECK_THROWS_WITH(mul(tape.input(f64(Shape{2, 3, 4}, 4)), tape.input(f64(Shape{2, 1, 1}, 5))),
                    Catch::Contains("mul: cannot broadcast b [2, 1, 1]"));
}

// ---------------------------------------------------------------------------------
// The checker catches wrong gradients: x^2 with backward 2x passes; 3x and 2.002x fail.

namespace {

inline constexpr OpInfo kSquareOp{"square_for_test", OpKind::Elementwise, AutocastCategory::Unchanged};

/// x * x recorded through OpRecorder like a library op, with d/dx = factor * x.
V square_with_gradient_factor(const V& x, double factor) {
  OpRecorder<B> rec(kSquareOp, {x}, static_cast<double>(x.numel()));
  const T tx = rec.input(0);
  auto out = rec.compute([&] { return Outputs<B>{detail::binary(math::Mul{}, tx, tx, rec.compute_dtype())}; });
  SavedTensor<B> saved = rec.save(tx);
  return rec.finish(out[0], [=](const Grads<B>& g) {
    const T gx = detail::binary(math::Mul{}, g[0], saved.unpack(), g[0].dtype());
    return Grads<B>{detail::unary(math::Scale{factor}, gx, gx.dtype())};
  });
}

}  // namespace

TEST_CASE("gradcheck detects a deliberately wrong gradient", "[ops][grad][gradcheck]") {
  const T x = f64(Shape{2, 3}, 30, 0.5, 1.5);
  auto run = [&](double factor) {
    return testing::check_gradients(
        [&](Tape<B>& tape, const Vars& in) {
          return testing::weighted_sum(tape, square_with_gradient_factor(in[0], factor));
        },
        {x});
  };
  const auto right = run(2.0);
  INFO(right.report());
  CHECK(right.ok);

  const auto bad_square = run(3.0);  // backward returns 3x instead of 2x
  INFO(bad_square.report());
  CHECK_FALSE(bad_square.ok);
  CHECK(bad_square.failures == 6);
  CHECK(bad_square.worst_excess > 1e4);
  CHECK_THAT(bad_square.report(),
             Catch::Matchers::Contains("MISMATCH") && Catch::Matchers::Contains("input 'in0' [2, 3]"));

  const auto slightly_off = run(2.002);  // a 0.1% error is still far outside tolerance
  CHECK_FALSE(slightly_off.ok);
  CHECK(slightly_off.failures == 6);

  // Parameters (leaves on no tape) are checked the same way, and restored afterwards.
  const V p = V::parameter(x.clone(), "p");
  const auto before = host(p.value());
  const auto param_check = testing::check_parameter_gradients(
      [&](Tape<B>& tape) {
        return testing::weighted_sum(tape, square_with_gradient_factor(add(tape.input(x), p), 3.0));
      },
      Vars{p});
  INFO(param_check.report());
  CHECK_FALSE(param_check.ok);
  CHECK_THAT(param_check.report(), Catch::Matchers::Contains("input 'p'"));
  CHECK(host(p.value()) == before);
}

TEST_CASE("feed_forward with only the second bias trainable: its gradient is the rows' sum of dy, chunked or not",
          "[ops][grad][matmul]") {
  for (const std::int64_t rows : {std::int64_t{3}, detail::kFeedForwardRowChunk + 5}) {
    INFO("rows " << rows);
    Tape<B> tape;
    const auto values = [](std::int64_t n) {
      std::vector<double> v(static_cast<std::size_t>(n));
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.3 * static_cast<double>(i));
      return v;
    };
    const V x = tape.input(T::from_host(Shape{rows, 3}, values(rows * 3), DType::F64));
    const V w_up = tape.input(T::from_host(Shape{4, 3}, values(12), DType::F64));  // frozen
    const V w_down = tape.input(T::from_host(Shape{3, 4}, values(12), DType::F64));
    const V b_down = V::parameter(T::zeros(Shape{3}, DType::F64), "b_down");
    tape.backward(sum(feed_forward(x, w_up, V(), w_down, b_down)));
    CHECK(b_down.grad().to_host<double>() == std::vector<double>(3, static_cast<double>(rows)));
  }
}
