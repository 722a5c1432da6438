// tests/nn/test_modules.cpp — initialisation, and the pre-LN transformer block against a
// plain-loop F64 forward, central differences, and causality.
//
// The block reference below is written from the formulas (GPT-2's pre-LN block:
// x + attn(ln1(x)), then + mlp(ln2(.)), causal softmax(q k^T / sqrt(Dh)) v per head,
// GELU tanh), reading the module's weights by name and nothing else from the library.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "gradcheck.hpp"
#include "test_data.hpp"
#include "trainmem/trainmem.hpp"

using namespace trainmem;
using B = cpu::Backend;
using T = Tensor<B>;
using V = Var<B>;
using Vars = std::vector<V>;

namespace {

struct Stats {
  double min = INFINITY, max = -INFINITY, mean = 0, variance = 0;
};
Stats stats_of(const std::vector<double>& v) {
  Stats s;
  for (double x : v) {
    s.min = std::min(s.min, x);
    s.max = std::max(s.max, x);
    s.mean += x / static_cast<double>(v.size());
  }
  for (double x : v) s.variance += (x - s.mean) * (x - s.mean) / static_cast<double>(v.size());
  return s;
}

using Matrix = std::vector<double>;  // row-major [rows, cols]

Matrix layer_norm_ref(const Matrix& x, std::int64_t rows, std::int64_t d, const Matrix& g, const Matrix& b) {
  Matrix y(x.size());
  for (std::int64_t r = 0; r < rows; ++r) {
    double mean = 0, var = 0;
    for (std::int64_t c = 0; c < d; ++c) mean += x[r * d + c] / d;
    for (std::int64_t c = 0; c < d; ++c) var += (x[r * d + c] - mean) * (x[r * d + c] - mean) / d;
    for (std::int64_t c = 0; c < d; ++c) y[r * d + c] = (x[r * d + c] - mean) / std::sqrt(var + 1e-5) * g[c] + b[c];
  }
  return y;
}

/// x [rows, in] W^T + b for W [out, in].
Matrix linear_ref(const Matrix& x, std::int64_t rows, std::int64_t in, const Matrix& w, const Matrix& b,
                  std::int64_t out) {
  Matrix y(static_cast<std::size_t>(rows * out));
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t o = 0; o < out; ++o) {
      double acc = b[o];
      for (std::int64_t i = 0; i < in; ++i) acc += x[r * in + i] * w[o * in + i];
      y[r * out + o] = acc;
    }
  return y;
}

/// The block's forward in plain F64 loops, from its weights by name.
Matrix transformer_block_ref(const Matrix& x, std::int64_t batch, std::int64_t t, std::int64_t d, std::int64_t heads,
                             std::int64_t hidden, const std::map<std::string, Matrix>& p, bool causal = true) {
  const std::int64_t rows = batch * t, dh = d / heads;
  auto at = [&](const std::string& name) -> const Matrix& { return p.at("block." + name); };
  const Matrix h1 = layer_norm_ref(x, rows, d, at("ln1.weight"), at("ln1.bias"));
  const Matrix q = linear_ref(h1, rows, d, at("attn.q.weight"), at("attn.q.bias"), d);
  const Matrix k = linear_ref(h1, rows, d, at("attn.k.weight"), at("attn.k.bias"), d);
  const Matrix v = linear_ref(h1, rows, d, at("attn.v.weight"), at("attn.v.bias"), d);
  Matrix attended(static_cast<std::size_t>(rows * d), 0.0);
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t h = 0; h < heads; ++h)
      for (std::int64_t i = 0; i < t; ++i) {
        const std::int64_t keys = causal ? i + 1 : t;  // causal: up to and including the query's position
        std::vector<double> score(static_cast<std::size_t>(keys));
        double max = -INFINITY, total = 0;
        for (std::int64_t j = 0; j < keys; ++j) {
          double s = 0;
          for (std::int64_t e = 0; e < dh; ++e) s += q[(b * t + i) * d + h * dh + e] * k[(b * t + j) * d + h * dh + e];
          score[j] = s / std::sqrt(static_cast<double>(dh));
          max = std::max(max, score[j]);
        }
        for (auto& s : score) total += (s = std::exp(s - max));
        for (std::int64_t j = 0; j < keys; ++j)
          for (std::int64_t e = 0; e < dh; ++e)
            attended[(b * t + i) * d + h * dh + e] += score[j] / total * v[(b * t + j) * d + h * dh + e];
      }
  const Matrix a = linear_ref(attended, rows, d, at("attn.out.weight"), at("attn.out.bias"), d);
  Matrix x1(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) x1[i] = x[i] + a[i];
  const Matrix h2 = layer_norm_ref(x1, rows, d, at("ln2.weight"), at("ln2.bias"));
  Matrix up = linear_ref(h2, rows, d, at("mlp.up.weight"), at("mlp.up.bias"), hidden);
  const double c = std::sqrt(2.0 / std::acos(-1.0));
  for (auto& u : up) u = 0.5 * u * (1.0 + std::tanh(c * (u + 0.044715 * u * u * u)));
  const Matrix down = linear_ref(up, rows, hidden, at("mlp.down.weight"), at("mlp.down.bias"), d);
  Matrix y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) y[i] = x1[i] + down[i];
  return y;
}

void check_ok(const testing::GradCheckResult& r) {
  INFO(r.report());
  CHECK(r.ok);
}

}  // namespace

TEST_CASE("nn::Linear: PyTorch's U(-1/sqrt(in), 1/sqrt(in)) initialisation, seeded", "[nn][init]") {
  const std::int64_t in = 64, out = 48;
  const double bound = 1.0 / std::sqrt(static_cast<double>(in));
  nn::Init init(7);
  const nn::Linear<B> fc(in, out, init);
  CHECK(fc.weight().shape() == Shape{out, in});
  CHECK(fc.bias().shape() == Shape{out});
  CHECK(fc.weight().dtype() == DType::F32);
  CHECK(fc.weight().value().category() == MemCategory::Parameter);
  CHECK(fc.parameters().size() == 2);
  CHECK(fc.weight().name() == "linear.weight");

  const Stats w = stats_of(fc.weight().value().to_host<double>());
  const double n = static_cast<double>(in * out);
  CHECK(w.min >= -bound);
  CHECK(w.max <= bound);
  CHECK(w.min < -0.99 * bound);  // the whole interval is used
  CHECK(w.max > 0.99 * bound);
  CHECK(std::abs(w.mean) < 4 * bound / std::sqrt(3 * n));
  CHECK(w.variance == Approx(bound * bound / 3).epsilon(0.05));  // variance of U(-a, a) is a^2/3
  const Stats b = stats_of(fc.bias().value().to_host<double>());
  CHECK(b.min >= -bound);
  CHECK(b.max <= bound);

  nn::Init same(7), other(8);
  const nn::Linear<B> again(in, out, same), different(in, out, other);
  CHECK(again.weight().value().to_host<double>() == fc.weight().value().to_host<double>());
  CHECK(again.bias().value().to_host<double>() == fc.bias().value().to_host<double>());
  CHECK(different.weight().value().to_host<double>() != fc.weight().value().to_host<double>());
  // Successive layers from one Init draw different streams.
  const nn::Linear<B> next(in, out, init);
  CHECK(next.weight().value().to_host<double>() != fc.weight().value().to_host<double>());

  const nn::Linear<B> no_bias(in, out, init, false, DType::F64);
  CHECK_FALSE(no_bias.bias().defined());
  CHECK(no_bias.parameters().size() == 1);
  CHECK(no_bias.weight().dtype() == DType::F64);
  CHECK_THROWS_AS(nn::Linear<B>(0, 3, init), Error);
}

TEST_CASE("nn::Embedding is N(0, stddev), nn::LayerNorm starts as ones and zeros", "[nn][init]") {
  nn::Init init(3);
  const nn::Embedding<B> table(256, 32, init, 0.02);
  const Stats s = stats_of(table.weight().value().to_host<double>());
  const double n = 256.0 * 32.0;
  CHECK(std::abs(s.mean) < 4 * 0.02 / std::sqrt(n));
  CHECK(std::sqrt(s.variance) == Approx(0.02).epsilon(0.05));

  const nn::LayerNorm<B> ln(5, 1e-5, DType::F64);
  const auto params = ln.parameters();
  REQUIRE(params.size() == 2);
  CHECK(params[0].value().to_host<double>() == std::vector<double>(5, 1.0));
  CHECK(params[1].value().to_host<double>() == std::vector<double>(5, 0.0));
  // With those, each output row has mean 0 and variance var / (var + eps).
  Tape<B> tape;
  const auto xv = testing::random_values(15, 4, -2, 2);
  const auto y = ln(tape.input(T::from_host(Shape{3, 5}, xv, DType::F64))).value().to_host<double>();
  for (int r = 0; r < 3; ++r) {
    const Stats in = stats_of(std::vector<double>(xv.begin() + r * 5, xv.begin() + r * 5 + 5));
    const Stats out = stats_of(std::vector<double>(y.begin() + r * 5, y.begin() + r * 5 + 5));
    CHECK(out.mean == Approx(0.0).margin(1e-12));
    CHECK(out.variance == Approx(in.variance / (in.variance + 1e-5)).epsilon(1e-12));
  }
  // eps is refused when the module is built, not at its first forward.
  for (const double eps : {0.0, -1e-5, std::nan("")})
    CHECK_THROWS_WITH(nn::LayerNorm<B>(5, eps), Catch::Contains("nn::LayerNorm: eps must be positive"));
}

TEST_CASE("a dropout probability outside 0 <= p < 1 is refused when attention is built", "[nn][transformer]") {
  nn::Init init(3);
  for (const float p : {1.5f, 1.0f, -0.1f, std::nanf("")}) {
    CHECK_THROWS_WITH(nn::SelfAttention<B>(8, 2, init, p),
                      Catch::Contains("nn::SelfAttention: the dropout probability must be in [0, 1)"));
    CHECK_THROWS_WITH(nn::TransformerBlock<B>(8, 2, 16, init, p), Catch::Contains("dropout probability"));
  }
  CHECK_NOTHROW(nn::SelfAttention<B>(8, 2, init, 0.1f));
}

TEST_CASE("TransformerBlock: output shape and forward against a plain-loop reference", "[nn][transformer]") {
  const auto masking = GENERATE(nn::Masking::Causal, nn::Masking::Bidirectional);
  const bool causal = masking == nn::Masking::Causal;
  INFO((causal ? "causal" : "bidirectional"));
  const std::int64_t batch = 2, t = 3, dim = 4, heads = 2, hidden = 8;
  nn::Init init(11);
  const nn::TransformerBlock<B> block(dim, heads, hidden, init, 0.0f, DType::F64, "block", masking);
  const auto params = block.parameters();
  CHECK(params.size() == 16);  // 2 layer norms x 2, 4 projections x 2, 2 MLP linears x 2
  std::map<std::string, std::vector<double>> by_name;
  for (const auto& p : params) by_name[p.name()] = p.value().to_host<double>();
  CHECK(by_name.size() == 16);

  const auto xv = testing::random_values(batch * t * dim, 12, -1, 1);
  Tape<B> tape;
  const V y = block(tape.input(T::from_host(Shape{batch, t, dim}, xv, DType::F64)));
  CHECK(y.shape() == Shape{batch, t, dim});
  CHECK(y.dtype() == DType::F64);
  const auto got = y.value().to_host<double>();
  const auto want = transformer_block_ref(xv, batch, t, dim, heads, hidden, by_name, causal);
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i);
    CHECK(got[i] == Approx(want[i]).epsilon(1e-12).margin(1e-12));
  }
}

TEST_CASE("TransformerBlock: causal — a later position changes no earlier output, bidirectional — every output",
          "[nn][transformer]") {
  const auto masking = GENERATE(nn::Masking::Causal, nn::Masking::Bidirectional);
  const bool causal = masking == nn::Masking::Causal;
  INFO((causal ? "causal" : "bidirectional"));
  const std::int64_t batch = 2, t = 5, dim = 8, heads = 2;
  nn::Init init(13);
  const nn::TransformerBlock<B> block(dim, heads, 16, init, 0.0f, DType::F64, "block", masking);
  auto xv = testing::random_values(batch * t * dim, 14);
  auto run = [&](const std::vector<double>& x) {
    Tape<B> tape;
    return block(tape.input(T::from_host(Shape{batch, t, dim}, x, DType::F64))).value().to_host<double>();
  };
  const auto before = run(xv);
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t e = 0; e < dim; ++e)  // change the last position only, not by a constant (ln1 would remove it)
      xv[(b * t + t - 1) * dim + e] += 0.1 * static_cast<double>(e + 1);
  const auto after = run(xv);
  std::int64_t earlier_changed = 0, last_changed = 0;
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t s = 0; s < t; ++s)
      for (std::int64_t e = 0; e < dim; ++e) {
        const std::size_t i = static_cast<std::size_t>((b * t + s) * dim + e);
        const bool changed = std::abs(after[i] - before[i]) > 1e-14;
        (s < t - 1 ? earlier_changed : last_changed) += changed;
      }
  CHECK(earlier_changed == (causal ? 0 : batch * (t - 1) * dim));
  CHECK(last_changed == batch * dim);
}

TEST_CASE("TransformerBlock: F64 gradient check of the whole block", "[nn][transformer][grad]") {
  const float p = GENERATE(0.0f, 0.2f);  // with dropout, every fresh tape draws the same masks
  const auto masking = GENERATE(nn::Masking::Causal, nn::Masking::Bidirectional);
  INFO("dropout " << p << (masking == nn::Masking::Causal ? ", causal" : ", bidirectional"));
  const std::int64_t batch = 2, t = 3, dim = 4, heads = 2, hidden = 8;
  nn::Init init(15);
  const nn::TransformerBlock<B> block(dim, heads, hidden, init, p, DType::F64, "block", masking);
  const T x = testing::random_tensor(Shape{batch, t, dim}, 16);

  check_ok(testing::check_gradients(
      [&](Tape<B>& tape, const Vars& in) { return testing::weighted_sum(tape, block(in[0])); }, {x}));
  check_ok(testing::check_parameter_gradients(
      [&](Tape<B>& tape) { return testing::weighted_sum(tape, block(tape.input(x))); }, block.parameters()));
}

TEST_CASE("Mlp: gradient check in F64", "[nn][grad]") {
  nn::Init init(17);
  const nn::Mlp<B> mlp(3, 5, init, DType::F64);
  const T x = testing::random_tensor(Shape{4, 3}, 18, -2, 2);
  check_ok(testing::check_parameter_gradients(
      [&](Tape<B>& tape) { return testing::weighted_sum(tape, mlp(tape.input(x))); }, mlp.parameters()));
  check_ok(testing::check_gradients(
      [&](Tape<B>& tape, const Vars& in) { return testing::weighted_sum(tape, mlp(in[0])); }, {x}));
}

// nn::Embedding's table is a parameter (on no tape) and its ids are a plain Tensor, so
TEST_CASE("nn::Embedding: usable in a forward, gradient check in F64", "[nn][grad]") {
  nn::Init init(19);
  const nn::Embedding<B> table(5, 3, init, 1.0, DType::F64);
  const T ids = testing::int_tensor(Shape{2, 2}, {4, 0, 4, 2});
  check_ok(testing::check_parameter_gradients(
      [&](Tape<B>& tape) { return testing::weighted_sum(tape, table(tape.input(ids))); }, table.parameters()));
}
