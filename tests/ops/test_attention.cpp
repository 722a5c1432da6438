// tests/ops/test_attention.cpp — the fused scaled_dot_product_attention op.
//
// Forward against softmax(scale q k^T + mask) v written as F64 loops here; gradients
// against central differences in F64; in F32 and BF16 against the same attention
// composed of bmm, scale, causal_mask, softmax and bmm; the bytes it saves against
// their closed form; bit-identical gradients when a checkpoint region recomputes it.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "error_matchers.hpp"
#include "gradcheck.hpp"
#include "test_data.hpp"
#include "trainmem/trainmem.hpp"

using namespace trainmem;
using B = cpu::Backend;
using T = Tensor<B>;
using V = Var<B>;

namespace {

/// softmax(scale q k^T, causal: query i sees keys 0 .. tk - tq + i) v, per slice, in F64.
std::vector<double> reference(const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v,
                              std::int64_t n, std::int64_t tq, std::int64_t tk, std::int64_t d, bool causal) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  std::vector<double> out(static_cast<std::size_t>(n * tq * d));
  for (std::int64_t s = 0; s < n; ++s)
    for (std::int64_t i = 0; i < tq; ++i) {
      const std::int64_t visible = causal ? tk - tq + i + 1 : tk;
      std::vector<double> p(static_cast<std::size_t>(visible));
      double max = -std::numeric_limits<double>::infinity(), sum = 0.0;
      for (std::int64_t j = 0; j < visible; ++j) {
        double dot = 0.0;
        for (std::int64_t c = 0; c < d; ++c) dot += q[(s * tq + i) * d + c] * k[(s * tk + j) * d + c];
        p[j] = dot * scale;
        max = std::max(max, p[j]);
      }
      for (double& x : p) sum += x = std::exp(x - max);
      for (std::int64_t c = 0; c < d; ++c) {
        double o = 0.0;
        for (std::int64_t j = 0; j < visible; ++j) o += p[j] / sum * v[(s * tk + j) * d + c];
        out[(s * tq + i) * d + c] = o;
      }
    }
  return out;
}

/// The same attention composed of the unfused ops (square and causal, or any shape unmasked).
V composed(const V& q, const V& k, const V& v, bool causal) {
  auto scores = scale(bmm(q, k, false, true), 1.0 / std::sqrt(static_cast<double>(q.shape()[2])));
  if (causal) scores = causal_mask(scores);
  return bmm(softmax(scores), v);
}

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}
double relative_norm_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0.0, den = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) num += (a[i] - b[i]) * (a[i] - b[i]), den += b[i] * b[i];
  return std::sqrt(num / den);
}

struct Case {
  std::int64_t n, tq, tk, d;
  bool causal;
};

}  // namespace

TEST_CASE("scaled_dot_product_attention: F64 forward against loops, gradients against central differences",
          "[ops][grad][attention]") {
  // The last three span several blocks of query rows (64 each), causal ones with blocks
  // that see different numbers of keys.
  const Case c =
      GENERATE(Case{3, 5, 5, 4, true}, Case{2, 3, 6, 4, true}, Case{2, 4, 7, 3, false}, Case{1, 1, 1, 2, true},
               Case{1, 150, 150, 3, true}, Case{2, 70, 131, 2, true}, Case{1, 129, 140, 2, false});
  INFO("n " << c.n << " tq " << c.tq << " tk " << c.tk << " d " << c.d << " causal " << c.causal);
  const T q = testing::random_tensor({c.n, c.tq, c.d}, 11), k = testing::random_tensor({c.n, c.tk, c.d}, 12),
          v = testing::random_tensor({c.n, c.tk, c.d}, 13);
  Tape<B> tape;
  const V out = scaled_dot_product_attention(tape.input(q), tape.input(k), tape.input(v), c.causal);
  CHECK(out.shape() == Shape{c.n, c.tq, c.d});
  CHECK(max_abs_diff(out.value().to_host<double>(), reference(q.to_host<double>(), k.to_host<double>(),
                                                              v.to_host<double>(), c.n, c.tq, c.tk, c.d, c.causal)) <
        1e-13);

  const auto r = testing::check_gradients(
      [&](Tape<B>& t, const std::vector<V>& in) {
        return testing::weighted_sum(t, scaled_dot_product_attention(in[0], in[1], in[2], c.causal));
      },
      {q, k, v});
  INFO(r.report());
  CHECK(r.ok);
}

TEST_CASE("scaled_dot_product_attention: F32 and BF16 match the composed ops, forward and backward",
          "[ops][attention][autocast]") {
  const bool causal = GENERATE(true, false);
  const DType dtype = GENERATE(DType::F32, DType::BF16);
  INFO("causal " << causal << ", " << name_of(dtype));
  const std::int64_t n = 6, t = 100, d = 16;  // two blocks of query rows
  const T q = testing::random_tensor({n, t, d}, 21, -1.0, 1.0, dtype),
          k = testing::random_tensor({n, t, d}, 22, -1.0, 1.0, dtype),
          v = testing::random_tensor({n, t, d}, 23, -1.0, 1.0, dtype),
          weights = testing::random_tensor({n, t, d}, 24, -1.0, 1.0, DType::F32);
  std::vector<std::vector<double>> results[2];
  for (int fused = 0; fused < 2; ++fused) {
    Tape<B> tape;
    const V vq = tape.input(q, true), vk = tape.input(k, true), vv = tape.input(v, true);
    const V out = fused ? scaled_dot_product_attention(vq, vk, vv, causal) : composed(vq, vk, vv, causal);
    tape.backward(sum(mul(cast(out, DType::F32), tape.input(weights))));
    for (const V* x : {&out, &vq, &vk, &vv})
      results[fused].push_back((x == &out ? x->value() : x->grad()).to_host<double>());
  }
  const char* names[] = {"out", "dq", "dk", "dv"};
  for (int i = 0; i < 4; ++i) {
    INFO(names[i]);
    const double diff = relative_norm_diff(results[1][i], results[0][i]);
    CHECK(diff < (dtype == DType::F32 ? 1e-6 : 1e-2));
  }
}

TEST_CASE("scaled_dot_product_attention: saves q, k, v and one f32 per query row, not the scores",
          "[ops][attention][memory]") {
  B backend;
  const std::int64_t n = 8, t = 64, d = 16;
  const DType dtype = GENERATE(DType::F32, DType::BF16);
  auto make = [&](std::uint64_t seed) {
    return T::from_host({n, t, d}, testing::random_values(n * t * d, seed), dtype, MemCategory::Temporary, backend);
  };
  const T q = make(1), k = make(2), v = make(3);
  Tape<B> tape(backend);
  // Inputs made by an op (scale saves nothing), so what attention saves is all the saved activations.
  auto made = [&](const T& x) { return scale(tape.input(x, true), 1.0); };
  const V out = scaled_dot_product_attention(made(q), made(k), made(v), true);
  const auto element = static_cast<std::int64_t>(size_of(dtype));
  CHECK(backend.memory().live(MemCategory::SavedActivation) == 3 * n * t * d * element + n * t * 4);
  CHECK(backend.memory().peak(MemCategory::Workspace) > 0);  // the per-thread scores, freed after the call
  CHECK(backend.memory().live(MemCategory::Workspace) == 0);
  (void)out;
}

TEST_CASE("scaled_dot_product_attention: a checkpoint region recomputes it bit for bit",
          "[ops][attention][checkpoint]") {
  const T x = testing::random_tensor({2, 12, 8}, 5, -1.0, 1.0, DType::F32);
  std::vector<std::vector<float>> grads;
  for (bool checkpointed : {false, true}) {
    Tape<B> tape;
    const V in = tape.input(x, true);
    auto block = [](const V& h) { return scaled_dot_product_attention(h, relu(h), h, true); };
    const V out = checkpointed ? checkpoint(tape, block, in) : block(in);
    tape.backward(testing::weighted_sum(tape, out));
    grads.push_back(in.grad().to_host<float>());
  }
  CHECK(grads[0] == grads[1]);
}

TEST_CASE("scaled_dot_product_attention: bad shapes are errors that name the op", "[ops][attention][errors]") {
  Tape<B> tape;
  const V q = tape.input(testing::random_tensor({2, 4, 8}, 1)), k = tape.input(testing::random_tensor({2, 6, 8}, 2));
  const V wrong_d = tape.input(testing::random_tensor({2, 6, 4}, 3));
  const V flat = tape.input(testing::random_tensor({8, 8}, 4));
  CHECK_THROWS_MATCHES(scaled_dot_product_attention(q, k, wrong_d, false), Error,
                       testing::ErrorContains("scaled_dot_product_attention: expects q [n, tq, d]"));
  CHECK_THROWS_MATCHES(scaled_dot_product_attention(q, k, wrong_d, false), Error, testing::ErrorContains("[2, 6, 4]"));
  CHECK_THROWS_MATCHES(scaled_dot_product_attention(flat, flat, flat, false), Error,
                       testing::ErrorContains("got q [8, 8]"));
  CHECK_THROWS_MATCHES(scaled_dot_product_attention(k, q, q, true), Error,
                       testing::ErrorContains("a causal mask needs tq <= tk"));
}

TEST_CASE("scaled_dot_product_attention refuses a scale that is not finite", "[ops][attention][errors]") {
  Tape<B> tape;
  const V q = tape.input(T::from_host(Shape{1, 2, 4}, std::vector<double>(8, 0.5), DType::F64), true);
  for (const double scale : {std::nan(""), std::numeric_limits<double>::infinity()})
    CHECK_THROWS_MATCHES(scaled_dot_product_attention(q, q, q, false, scale), Error,
                         testing::ErrorContains("scale must be finite"));
  CHECK(std::isfinite(scaled_dot_product_attention(q, q, q, false, 0.25).value().to_host<double>()[0]));
}
