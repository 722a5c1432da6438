// tests/autocast/test_autocast_saved_bytes.cpp — what a mixed-precision forward keeps for
// backward, in bytes, and that keeping less changes no value.
//
// Four ways autocast keeps fewer bytes, each checked in closed form against
// MemoryStats and bit for bit against the same computation written without it:
//  - an FP32-category op on a 16-bit input keeps the 16-bit original (the widening is
//    exact): layer_norm (under PyTorch's f32 rule) and cross_entropy against an
//    explicit cast to f32 first;
//  - a norm on a 16-bit input writes a 16-bit output, f32 math inside: against the f32
//    norm of the widened input rounded once, forward and backward;
//  - one activation cast once for every op that casts it (three projections of one
//    f32 activation keep one bf16 copy);
//  - feed_forward keeps the GELU's input and not its output: against linear, gelu,
//    linear written out (and, above its row chunk, runs backward chunk by chunk).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <vector>

#include "test_data.hpp"
#include "trainmem/trainmem.hpp"

namespace tmem = trainmem;
using B = tmem::cpu::Backend;
using tmem::DType;
using tmem::MemCategory;
using tmem::Shape;
using V = tmem::Var<B>;
using T = tmem::Tensor<B>;

namespace {

std::int64_t saved_bytes() { return B::default_instance().memory().live(MemCategory::SavedActivation); }

T values(Shape shape, std::uint64_t seed, DType dtype, double low = -1.0, double high = 1.0) {
  return tmem::testing::random_tensor(std::move(shape), seed, low, high).to(dtype);
}

V parameter(Shape shape, std::uint64_t seed) { return V::parameter(values(std::move(shape), seed, DType::F32)); }

/// Bitwise equality of two tensors' values (as doubles: every dtype here widens exactly).
void check_same(const T& a, const T& b) {
  REQUIRE(a.dtype() == b.dtype());
  CHECK(a.to_host<double>() == b.to_host<double>());
}

}  // namespace

TEST_CASE("an FP32-category op on a bf16 input keeps the bf16 original: same gradients, half the bytes",
          "[amp][saved]") {
  const std::int64_t rows = 12, d = 16;
  const T x0 = values(Shape{rows, d}, 1, DType::BF16, -2, 2);
  const V gamma = parameter(Shape{d}, 2), beta = parameter(Shape{d}, 3);
  tmem::amp::Autocast autocast(DType::BF16);
  tmem::amp::CategoryOverride pytorch_rule("layer_norm", tmem::AutocastCategory::Fp32);
  std::vector<std::vector<T>> grads;
  for (const bool explicit_cast : {false, true}) {
    INFO("x cast to f32 by the user first: " << explicit_cast);
    tmem::Tape<B> tape;
    const V x = tape.input(x0, true);
    const std::int64_t before = saved_bytes();
    const V y = tmem::layer_norm(explicit_cast ? tmem::cast(x, DType::F32) : x, gamma, beta);
    const std::int64_t stats = 2 * rows * 4;  // mean and rstd, f32
    CHECK(saved_bytes() - before == rows * d * (explicit_cast ? 4 : 2) + stats);
    REQUIRE(y.dtype() == DType::F32);
    tmem::sum(tmem::mul(y, y)).backward();
    grads.push_back({x.grad().clone(), gamma.grad().clone(), beta.grad().clone()});
    gamma.zero_grad();
    beta.zero_grad();
  }
  for (std::size_t i = 0; i < 3; ++i) check_same(grads[0][i], grads[1][i]);
}

TEST_CASE("norms on a bf16 input write bf16 with f32 math: the f32 norm's values rounded once, same gradients",
          "[amp][saved]") {
  const std::int64_t rows = 12, d = 16;
  const T x0 = values(Shape{rows, d}, 21, DType::BF16, -2, 2);
  const T up0 = values(Shape{rows, d}, 22, DType::BF16);  // a downstream weight, so dy is not uniform
  const V gamma = parameter(Shape{d}, 23), beta = parameter(Shape{d}, 24);
  tmem::amp::Autocast autocast(DType::BF16);
  for (const bool rms : {false, true}) {
    INFO((rms ? "rms_norm" : "layer_norm"));
    std::vector<std::vector<T>> results;
    for (const bool f32_rule : {false, true}) {
      INFO("PyTorch's f32 rule, then a cast to bf16: " << f32_rule);
      std::optional<tmem::amp::CategoryOverride> rule;
      if (f32_rule) rule.emplace(rms ? "rms_norm" : "layer_norm", tmem::AutocastCategory::Fp32);
      tmem::Tape<B> tape;
      const V x = tape.input(x0, true), up = tape.input(up0);
      const std::int64_t before = saved_bytes(), live_before = B::default_instance().memory().live_total();
      V y = rms ? tmem::rms_norm(x, gamma) : tmem::layer_norm(x, gamma, beta);
      // mean and rstd (or rstd), f32; x is kept as its bf16 original either way
      CHECK(saved_bytes() - before == rows * d * 2 + (rms ? 1 : 2) * rows * 4);
      if (!f32_rule) {
        REQUIRE(y.dtype() == DType::BF16);
        // y and the statistics, nothing else: no f32 copy of x, no f32 output (x itself is kept)
        CHECK(B::default_instance().memory().live_total() - live_before == rows * d * 2 + (rms ? 1 : 2) * rows * 4);
      }
      if (f32_rule) y = tmem::cast(y, DType::BF16);
      tmem::sum(tmem::mul(y, up)).backward();
      results.push_back({y.value().clone(), x.grad().clone(), gamma.grad().clone()});
      if (!rms) results.back().push_back(beta.grad().clone());
      gamma.zero_grad();
      if (!rms) beta.zero_grad();
    }
    for (std::size_t i = 0; i < results[0].size(); ++i) check_same(results[0][i], results[1][i]);
  }
}

TEST_CASE("cross_entropy on bf16 logits keeps them in bf16, the gradient is the f32-cast one's", "[amp][saved]") {
  const std::int64_t n = 10, c = 24;
  const T logits0 = values(Shape{n, c}, 4, DType::BF16, -3, 3);
  std::vector<double> ids(n);
  for (std::int64_t i = 0; i < n; ++i) ids[i] = static_cast<double>((i * 7) % c);
  const T labels = T::from_host(Shape{n}, ids, DType::I32);
  tmem::amp::Autocast autocast(DType::BF16);
  std::vector<T> grads;
  for (const bool explicit_cast : {false, true}) {
    tmem::Tape<B> tape;
    const V logits = tape.input(logits0, true);
    const std::int64_t before = saved_bytes();
    const V loss = tmem::cross_entropy(explicit_cast ? tmem::cast(logits, DType::F32) : logits, labels);
    // logits, labels (i32) and one f32 log-sum-exp per row
    CHECK(saved_bytes() - before == n * c * (explicit_cast ? 4 : 2) + n * 4 + n * 4);
    loss.backward();
    grads.push_back(logits.grad().clone());
  }
  check_same(grads[0], grads[1]);
}

TEST_CASE("a bf16 input written in place after an FP32 op kept it: backward refuses", "[amp][saved]") {
  const T x0 = values(Shape{4, 8}, 5, DType::BF16);
  const V gamma = parameter(Shape{8}, 6), beta = parameter(Shape{8}, 7);
  tmem::amp::Autocast autocast(DType::BF16);
  tmem::Tape<B> tape;
  const V x = tape.input(x0.clone(), true);
  const V loss = tmem::sum(tmem::layer_norm(x, gamma, beta));
  x.value().copy_from(x0);  // same values, but a write: the saved original is not what forward used
  CHECK_THROWS_WITH(loss.backward(), Catch::Contains("modified in place"));
}

TEST_CASE("three projections of one f32 activation keep one bf16 copy of it", "[amp][saved]") {
  const std::int64_t rows = 8, d = 16;
  const T a0 = values(Shape{rows, d}, 8, DType::F32);
  const V wq = parameter(Shape{d, d}, 9), wk = parameter(Shape{d, d}, 10), wv = parameter(Shape{d, d}, 11);
  tmem::amp::Autocast autocast(DType::BF16);
  tmem::Tape<B> tape;
  const V a = tape.input(a0, true);
  const std::int64_t before = saved_bytes();
  const V q = tmem::linear(a, wq), k = tmem::linear(a, wk), v = tmem::linear(a, wv);
  CHECK(saved_bytes() - before == rows * d * 2);  // the weights' casts are cached parameters, not activations
  tmem::sum(tmem::add(tmem::add(q, k), v)).backward();

  // The same gradient from three separate inputs holding the same values (three casts).
  tmem::Tape<B> tape2;
  const V a1 = tape2.input(a0, true), a2 = tape2.input(a0, true), a3 = tape2.input(a0, true);
  const std::int64_t before2 = saved_bytes();
  const V q2 = tmem::linear(a1, wq), k2 = tmem::linear(a2, wk), v2 = tmem::linear(a3, wv);
  CHECK(saved_bytes() - before2 == 3 * rows * d * 2);
  tmem::sum(tmem::add(tmem::add(q2, k2), v2)).backward();
  const auto g = a.grad().to_host<double>(), g1 = a1.grad().to_host<double>(), g2 = a2.grad().to_host<double>(),
             g3 = a3.grad().to_host<double>();
  for (std::size_t i = 0; i < g.size(); ++i) CHECK(g[i] == Approx(g1[i] + g2[i] + g3[i]).epsilon(1e-6));
  for (const V& w : {wq, wk, wv}) w.zero_grad();
}

TEST_CASE("the cast memo keeps no bytes: without grad nothing outlives the ops", "[amp][saved]") {
  const T a0 = values(Shape{8, 16}, 12, DType::F32);
  const V w = parameter(Shape{16, 16}, 13);
  tmem::amp::Autocast autocast(DType::BF16);
  tmem::Tape<B> tape;
  const V a = tape.input(a0, true);
  tmem::NoGradGuard no_grad;
  tmem::amp::CastCache<B>::instance().get(w.value(), DType::BF16);  // the weight's cast, made before counting
  const auto& memory = B::default_instance().memory();
  const std::int64_t before = memory.live_total();
  const V y1 = tmem::linear(a, w), y2 = tmem::linear(a, w);
  CHECK(memory.live_total() - before == 2 * static_cast<std::int64_t>(y1.value().bytes()));
  // In place: the memo must not hand out the cast of the old values.
  a.value().copy_from(values(Shape{8, 16}, 14, DType::F32));
  check_same(tmem::linear(a, w).value(), tmem::linear(tape.input(a.value().clone()), w).value());
}

TEST_CASE("feed_forward: the three ops' values and gradients bit for bit, without the GELU output's bytes",
          "[amp][saved]") {
  const std::int64_t rows = 24, dim = 16, hidden = 64;
  const bool mixed = GENERATE(false, true);
  INFO("bf16 autocast: " << mixed);
  const T x0 = values(Shape{2, rows / 2, dim}, 15, DType::F32, -2, 2);
  const V w1 = parameter(Shape{hidden, dim}, 16), b1 = parameter(Shape{hidden}, 17);
  const V w2 = parameter(Shape{dim, hidden}, 18), b2 = parameter(Shape{dim}, 19);
  const std::vector<V> params{w1, b1, w2, b2};
  std::optional<tmem::amp::Autocast> autocast;
  if (mixed) autocast.emplace(DType::BF16);
  const std::int64_t elem = mixed ? 2 : 4;
  std::vector<std::vector<T>> results;
  for (const bool fused : {true, false}) {
    tmem::Tape<B> tape;
    const V x = tape.input(x0, true);
    const std::int64_t before = saved_bytes();
    const V y =
        fused ? tmem::feed_forward(x, w1, b1, w2, b2) : tmem::linear(tmem::gelu(tmem::linear(x, w1, b1)), w2, b2);
    // x (in the compute dtype; in f32 it is the caller's tensor, counted as saved too), z, and h when unfused
    CHECK(saved_bytes() - before == rows * (dim + (fused ? hidden : 2 * hidden)) * elem);
    tmem::sum(tmem::mul(y, y)).backward();
    std::vector<T> r{y.value().clone(), x.grad().clone()};
    for (const V& p : params) {
      r.push_back(p.grad().clone());
      p.zero_grad();
    }
    results.push_back(r);
  }
  for (std::size_t i = 0; i < results[0].size(); ++i) {
    INFO("result " << i << " (0: y, 1: dx, then dW1, db1, dW2, db2)");
    check_same(results[0][i], results[1][i]);
  }
}

TEST_CASE("feed_forward above its row chunk: backward chunk by chunk, the three ops' gradients, a smaller peak",
          "[amp][saved]") {
  // NOTE [Feed-forward backward in row chunks]: more rows than one chunk, and a last partial chunk.
  const std::int64_t rows = 8 * tmem::detail::kFeedForwardRowChunk + 100, dim = 2, hidden = 128;
  const DType dtype = GENERATE(DType::F64, DType::F32);
  INFO("dtype " << dtype);
  const T x0 = values(Shape{rows, dim}, 25, dtype, -2, 2);
  const auto param = [&](Shape shape, std::uint64_t seed) {
    return V::parameter(values(std::move(shape), seed, dtype));
  };
  const V w1 = param(Shape{hidden, dim}, 26), b1 = param(Shape{hidden}, 27);
  const V w2 = param(Shape{dim, hidden}, 28), b2 = param(Shape{dim}, 29);
  const std::vector<V> params{w1, b1, w2, b2};
  auto& memory = B::default_instance().memory();
  std::vector<std::vector<std::vector<double>>> results;
  std::vector<std::int64_t> backward_peak;
  for (const bool fused : {true, false}) {
    tmem::Tape<B> tape;
    const V x = tape.input(x0, true);
    const V y =
        fused ? tmem::feed_forward(x, w1, b1, w2, b2) : tmem::linear(tmem::gelu(tmem::linear(x, w1, b1)), w2, b2);
    const V loss = tmem::sum(tmem::mul(y, y));
    const std::int64_t before = memory.live_total();
    memory.reset_peak();
    loss.backward();
    backward_peak.push_back(memory.peak_total() - before);
    std::vector<std::vector<double>> r{x.grad().to_host<double>()};
    for (const V& p : params) {
      r.push_back(p.grad().to_host<double>());
      p.zero_grad();
    }
    results.push_back(r);
  }
  const double tolerance = dtype == DType::F64 ? 1e-12 : 2e-5;  // only the order of the sums over rows differs
  for (std::size_t i = 0; i < results[0].size(); ++i) {
    INFO("result " << i << " (0: dx, then dW1, db1, dW2, db2)");
    double scale = 0.0;
    for (double v : results[1][i]) scale = std::max(scale, std::abs(v));
    for (std::size_t k = 0; k < results[0][i].size(); ++k)
      REQUIRE(std::abs(results[0][i][k] - results[1][i][k]) <= tolerance * scale);
  }
  // The unfused backward holds [rows, hidden] tensors whole; chunked, three chunks' worth.
  const auto element = static_cast<std::int64_t>(dtype == DType::F64 ? 8 : 4);
  INFO("backward peak above the live bytes: chunked " << backward_peak[0] << ", unfused " << backward_peak[1]);
  CHECK(backward_peak[1] >= rows * hidden * element);
  CHECK(backward_peak[0] < rows * hidden * element / 2);
}
