// tests/autograd/test_tape.cpp — tape semantics and every "bad input" error.
//
// Gradients are checked against closed forms worked out by hand (d sum(XW)/dW is the
// column sums of X, and so on); errors must be trainmem::Error whose message names the
// op, the shapes and what was expected.
#include <catch2/catch.hpp>
#include <cmath>
#include <string>
#include <vector>

#include "error_matchers.hpp"
#include "test_data.hpp"
#include "trainmem/trainmem.hpp"

using namespace trainmem;
using B = cpu::Backend;
using T = Tensor<B>;
using testing::ErrorContains;

namespace {

T f64(Shape shape, std::vector<double> values, B& be) {
  return T::from_host(std::move(shape), values, DType::F64, MemCategory::Temporary, be);
}

/// Column sums of a row-major [rows, cols] matrix: d sum(X W) / dW, row by row.
std::vector<double> column_sums(const std::vector<double>& x, std::size_t rows, std::size_t cols, std::size_t repeat) {
  std::vector<double> out(cols * repeat, 0.0);
  for (std::size_t i = 0; i < cols; ++i)
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t j = 0; j < repeat; ++j) out[i * repeat + j] += x[r * cols + i];
  return out;
}

void check_close(const std::vector<double>& got, const std::vector<double>& want, double tol = 1e-12) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i);
    CHECK(got[i] == Approx(want[i]).margin(tol));
  }
}

}  // namespace

TEST_CASE("Gradients accumulate with += across backwards on two tapes, zero_grad clears", "[autograd]") {
  B be;
  const auto w = Var<B>::parameter(testing::random_tensor(Shape{3, 2}, 1, -1, 1, DType::F64, be), "W");
  const auto x1 = testing::random_values(4 * 3, 2), x2 = testing::random_values(5 * 3, 3);
  const auto g1 = column_sums(x1, 4, 3, 2), g2 = column_sums(x2, 5, 3, 2);
  {
    Tape<B> tape(be);
    tape.backward(sum(matmul(tape.input(f64(Shape{4, 3}, x1, be)), w)));
  }
  check_close(w.grad().to_host<double>(), g1);
  CHECK(w.grad().category() == MemCategory::Gradient);
  {
    Tape<B> tape(be);
    tape.backward(sum(matmul(tape.input(f64(Shape{5, 3}, x2, be)), w)));
  }
  std::vector<double> both(g1.size());
  for (std::size_t i = 0; i < both.size(); ++i) both[i] = g1[i] + g2[i];
  check_close(w.grad().to_host<double>(), both);

  w.zero_grad();
  CHECK_FALSE(w.grad().defined());
  {
    Tape<B> tape(be);
    tape.backward(sum(matmul(tape.input(f64(Shape{5, 3}, x2, be)), w)));
  }
  check_close(w.grad().to_host<double>(), g2);
}

TEST_CASE("Gradients from several paths in one graph add up", "[autograd]") {
  B be;
  Tape<B> tape(be);
  const std::vector<double> xv = {0.5, -1.25, 2.0};
  const auto x = tape.input(f64(Shape{3}, xv, be), true, "x");
  // y = sum(x*x + 3x - x): dy/dx = 2x + 2.
  tape.backward(sum(sub(add(mul(x, x), scale(x, 3.0)), x)));
  check_close(x.grad().to_host<double>(), {3.0, -0.5, 6.0});
}

TEST_CASE("Backward with a seed for a non-scalar root", "[autograd]") {
  B be;
  Tape<B> tape(be);
  const std::vector<double> xv = {1, 2, 3, 4, 5, 6}, cv = {0.5, -1, 2, 0, 3, -2}, sv = {1, 10, 100, -1, -10, -100};
  const auto x = tape.input(f64(Shape{2, 3}, xv, be), true, "x");
  const auto c = tape.input(f64(Shape{2, 3}, cv, be));
  const auto y = mul(x, c);
  tape.backward(y, f64(Shape{2, 3}, sv, be));
  std::vector<double> want(6);
  for (std::size_t i = 0; i < 6; ++i) want[i] = sv[i] * cv[i];
  check_close(x.grad().to_host<double>(), want);

  Tape<B> tape2(be);
  const auto x2 = tape2.input(f64(Shape{2, 3}, xv, be), true, "x");
  const auto y2 = mul(x2, x2);
  CHECK_THROWS_MATCHES(tape2.backward(y2, f64(Shape{3, 2}, sv, be)), Error,
                       ErrorContains("seed gradient is [3, 2], root is [2, 3]"));
}

TEST_CASE("A leaf that requires grad can be the root", "[autograd]") {
  B be;
  Tape<B> tape(be);
  const auto x = tape.input(f64(Shape{}, {2.0}, be), true, "x");
  tape.backward(x);
  check_close(x.grad().to_host<double>(), {1.0});
}

TEST_CASE("A grad-ready hook runs once, as soon as backward has made the leaf's gradient final", "[autograd]") {
  B be;
  const std::vector<double> xv = {0.5, -1.0, 0.25, 2.0, -0.75, 1.5};
  const std::vector<double> w1v = {0.2, -0.4, 0.1, 0.3, 0.5, -0.6, -0.1, 0.7, 0.2}, w2v = {1.0, -2.0, 0.5};
  const auto w1 = Var<B>::parameter(f64(Shape{3, 3}, w1v, be), "w1");
  const auto w2 = Var<B>::parameter(f64(Shape{3, 1}, w2v, be), "w2");
  const auto unused = Var<B>::parameter(f64(Shape{3, 1}, w2v, be), "unused");
  std::vector<std::string> fired;
  std::vector<double> w1_at_hook;
  w1.set_grad_ready_hook([&] {
    fired.push_back("w1");
    w1_at_hook = w1.grad().to_host<double>();
  });
  w2.set_grad_ready_hook([&] { fired.push_back("w2"); });
  unused.set_grad_ready_hook([&] { fired.push_back("unused"); });
  {
    Tape<B> tape(be);
    const auto x = tape.input(f64(Shape{2, 3}, xv, be));
    const auto h = tanh(matmul(x, w1));  // w1's first use: its last contribution comes last
    matmul(x, unused);                   // on the tape, not reached from the root
    // loss = sum(h w2) + sum(w1 * c), c = w1's values as data: w1's second use is
    // recorded after w2's only one.
    tape.backward(add(sum(matmul(h, w2)), sum(mul(w1, tape.input(f64(Shape{3, 3}, w1v, be))))));
  }
  // w2 is final before w1's first use runs backward; the unreached leaf is never told.
  REQUIRE(fired == std::vector<std::string>{"w2", "w1"});
  CHECK_FALSE(unused.grad().defined());
  // What the hook saw is the final gradient: x^T ((1 - h^2) w2^T) + c, worked out here.
  std::vector<double> want(9);
  for (std::size_t i = 0; i < 3; ++i)
    for (std::size_t j = 0; j < 3; ++j) {
      double g = w1v[i * 3 + j];
      for (std::size_t r = 0; r < 2; ++r) {
        double a = 0;
        for (std::size_t k = 0; k < 3; ++k) a += xv[r * 3 + k] * w1v[k * 3 + j];
        g += xv[r * 3 + i] * (1 - std::tanh(a) * std::tanh(a)) * w2v[j];
      }
      want[i * 3 + j] = g;
    }
  check_close(w1_at_hook, want);
  check_close(w1.grad().to_host<double>(), want);

  CHECK_THROWS_MATCHES(w2.set_grad_ready_hook([] {}), Error, ErrorContains("'w2' has a grad-ready hook already"));
  w2.set_grad_ready_hook({});
  CHECK_FALSE(w2.has_grad_ready_hook());
  fired.clear();
  {
    Tape<B> tape(be);
    tape.backward(sum(matmul(matmul(tape.input(f64(Shape{2, 3}, xv, be)), w1), w2)));  // w2's hook is gone
  }
  CHECK(fired == std::vector<std::string>{"w1"});

  Tape<B> tape(be);
  const auto leaf = tape.input(f64(Shape{}, {2.0}, be), true, "leaf");
  int leaf_fired = 0;
  leaf.set_grad_ready_hook([&] { ++leaf_fired; });
  tape.backward(leaf);  // the root is the leaf itself
  CHECK(leaf_fired == 1);
}

TEST_CASE("Backward of a non-scalar without a seed throws", "[autograd][errors]") {
  B be;
  Tape<B> tape(be);
  const auto x = tape.input(testing::random_tensor(Shape{2, 3}, 4, -1, 1, DType::F64, be), true, "x");
  CHECK_THROWS_MATCHES(tape.backward(relu(x)), Error, ErrorContains("the root is [2, 3], not a scalar; pass a seed"));
}

TEST_CASE("A second backward needs retain_graph on the first, retained graphs double grads", "[autograd][errors]") {
  B be;
  const auto xv = testing::random_values(6, 5);
  const auto w = Var<B>::parameter(testing::random_tensor(Shape{3, 2}, 6, -1, 1, DType::F64, be), "W");
  const auto once = column_sums(xv, 2, 3, 2);

  SECTION("without retain_graph") {
    Tape<B> tape(be);
    const auto loss = sum(matmul(tape.input(f64(Shape{2, 3}, xv, be)), w));
    tape.backward(loss);
    CHECK_THROWS_MATCHES(tape.backward(loss), Error, ErrorContains("pass retain_graph=true"));
    // The advice names the usual fix first: the next step goes on a new or cleared tape.
    CHECK_THROWS_MATCHES(tape.backward(loss), Error, ErrorContains("record on a new Tape or call tape.clear()"));
    check_close(w.grad().to_host<double>(), once);  // the failed backward added nothing
    // clear() starts a new step on the same tape.
    tape.clear();
    CHECK(tape.size() == 0);
    tape.backward(sum(matmul(tape.input(f64(Shape{2, 3}, xv, be)), w)));
    std::vector<double> twice(once.size());
    for (std::size_t i = 0; i < once.size(); ++i) twice[i] = 2 * once[i];
    check_close(w.grad().to_host<double>(), twice);
  }
  SECTION("with retain_graph") {
    Tape<B> tape(be);
    const auto loss = sum(relu(matmul(tape.input(f64(Shape{2, 3}, xv, be)), w)));
    tape.backward(loss, {}, true);
    const auto first = w.grad().to_host<double>();
    tape.backward(loss, {}, true);
    std::vector<double> doubled(first.size());
    for (std::size_t i = 0; i < first.size(); ++i) doubled[i] = 2 * first[i];
    check_close(w.grad().to_host<double>(), doubled);
    tape.backward(loss);  // a last backward may free the graph
    CHECK_THROWS_MATCHES(tape.backward(loss), Error, ErrorContains("retain_graph"));
  }
}

TEST_CASE("Vars from two tapes cannot be mixed", "[autograd][errors]") {
  B be;
  Tape<B> one(be), two(be);
  const auto a = one.input(testing::random_tensor(Shape{2, 3}, 7, -1, 1, DType::F64, be), true, "a");
  const auto b = two.input(testing::random_tensor(Shape{3, 2}, 8, -1, 1, DType::F64, be), true, "b");
  CHECK_THROWS_MATCHES(matmul(a, b), Error, ErrorContains("matmul: input 1 'b' belongs to another tape than input 0"));
  const auto loss = sum(a);
  CHECK_THROWS_MATCHES(two.backward(loss), Error, ErrorContains("backward: the root Var"));
  CHECK_THROWS_MATCHES(two.backward(loss), Error, ErrorContains("belongs to another tape"));
  // Parameters belong to no tape and may be used on any.
  const auto w = Var<B>::parameter(testing::random_tensor(Shape{3, 3}, 9, -1, 1, DType::F64, be), "W");
  CHECK_NOTHROW(matmul(a, w));
  CHECK_NOTHROW(matmul(b, w, true, false));
  CHECK_THROWS_MATCHES(one.backward(w), Error, ErrorContains("backward: the root Var 'W' is on no tape"));
  // An op whose inputs are all off-tape cannot record.
  CHECK_THROWS_MATCHES(matmul(w, w), Error, ErrorContains("none of its inputs is on a tape"));
}

TEST_CASE("Shape mismatches name the op and both shapes", "[autograd][errors]") {
  B be;
  Tape<B> tape(be);
  auto in = [&](Shape s) { return tape.input(T::zeros(std::move(s), DType::F32, MemCategory::Temporary, be), true); };
  CHECK_THROWS_MATCHES(matmul(in({2, 3}), in({4, 5})), Error,
                       ErrorContains("matmul: inner dimensions differ: op(A) is [2, 3] (A [2, 3]), op(B) is [4, 5]"));
  CHECK_THROWS_MATCHES(matmul(in({2, 3}), in({2, 3}), false, false), Error, ErrorContains("(B [2, 3])"));
  CHECK_THROWS_MATCHES(matmul(in({2, 3, 4}), in({4, 5})), Error, ErrorContains("[2, 3, 4]"));
  CHECK_THROWS_MATCHES(bmm(in({2, 3, 4}), in({3, 4, 5})), Error,
                       ErrorContains("bmm: expects 3-D operands with equal batch, got A [2, 3, 4] and B [3, 4, 5]"));
  CHECK_THROWS_MATCHES(bmm(in({2, 3, 4}), in({2, 5, 4})), Error, ErrorContains("bmm: inner dimensions differ"));
  CHECK_THROWS_MATCHES(linear(in({2, 3}), in({4, 5})), Error,
                       ErrorContains("linear: x [2, 3] does not match weight [4, 5] (expected x [..., 5])"));
  CHECK_THROWS_MATCHES(linear(in({2, 5}), in({4, 5}), in({5})), Error,
                       ErrorContains("linear: bias [5] should be [4] for weight [4, 5]"));
  CHECK_THROWS_MATCHES(add(in({2, 3}), in({2})), Error,
                       ErrorContains("add: cannot broadcast b [2] to a [2, 3] (b must have a's shape, be a row [3]"));
  CHECK_THROWS_MATCHES(sub(in({2, 3}), in({3, 2})), Error, ErrorContains("sub: cannot broadcast b [3, 2] to a [2, 3]"));
  CHECK_THROWS_MATCHES(mul(in({4}), in({2, 2})), Error, ErrorContains("mul: cannot broadcast b [2, 2] to a [4]"));
  CHECK_THROWS_MATCHES(layer_norm(in({2, 3}), in({2}), in({3})), Error,
                       ErrorContains("layer_norm: gamma [2] and beta [3] must both be [3] for x [2, 3]"));
  CHECK_THROWS_MATCHES(causal_mask(in({2, 3, 4})), Error,
                       ErrorContains("causal_mask: scores must be [..., T, T], got [2, 3, 4]"));
  CHECK_THROWS_MATCHES(split_heads(in({2, 3, 5}), 2), Error, ErrorContains("split_heads: x [2, 3, 5]"));
  CHECK_THROWS_MATCHES(reshape(in({2, 3}), Shape{4}), Error,
                       ErrorContains("reshape: cannot view [2, 3] (6 elements) as [4]"));
  CHECK_THROWS_MATCHES(transpose(in({3})), Error, ErrorContains("transpose: x must have rank >= 2, got [3]"));
  const T labels = testing::int_tensor(Shape{3}, {0, 1, 2}, be);
  CHECK_THROWS_MATCHES(cross_entropy(in({2, 5}), labels), Error,
                       ErrorContains("cross_entropy: labels must be i32 [2], got [3] i32"));
  CHECK_THROWS_MATCHES(cross_entropy(in({2, 5}), testing::int_tensor(Shape{2}, {1, 7}, be)), Error,
                       ErrorContains("cross_entropy: label 7 at row 1 is outside [0, 5)"));
  CHECK_THROWS_MATCHES(embedding(in({4, 3}), tape.input(testing::int_tensor(Shape{2}, {1, 4}, be))), Error,
                       ErrorContains("embedding: id 4 at position 1 is outside [0, 4)"));
  CHECK_THROWS_MATCHES(dropout(in({4}), 1.0f), Error,
                       ErrorContains("dropout: the dropout probability must be in [0, 1), got 1"));
}

TEST_CASE("Non-floating operands are rejected with their dtype", "[autograd][errors]") {
  B be;
  Tape<B> tape(be);
  const auto x = tape.input(T::zeros(Shape{2, 3}, DType::F32, MemCategory::Temporary, be), true, "x");
  const auto ids = tape.input(testing::int_tensor(Shape{3, 2}, {0, 1, 2, 3, 4, 5}, be), false, "ids");
  CHECK_THROWS_MATCHES(matmul(x, ids), Error, ErrorContains("matmul: B must be floating, got i32 [3, 2]"));
  CHECK_THROWS_MATCHES(relu(ids), Error, ErrorContains("relu: x must be floating, got i32"));
  CHECK_THROWS_MATCHES(tape.input(testing::int_tensor(Shape{1}, {0}, be), true, "labels"), Error,
                       ErrorContains("Tape::input: 'labels' requires grad but is i32"));
  CHECK_THROWS_MATCHES(cross_entropy(x, T::zeros(Shape{2}, DType::F32, MemCategory::Temporary, be)), Error,
                       ErrorContains("labels must be i32 [2], got [2] f32"));
  CHECK_THROWS_MATCHES(amp::Autocast(DType::F32), Error, ErrorContains("autocast dtype must be f16 or bf16, got f32"));
}

TEST_CASE("A saved tensor modified in place before backward is detected", "[autograd][errors]") {
  B be;
  Tape<B> tape(be);
  const T xt = testing::random_tensor(Shape{2, 3}, 10, -1, 1, DType::F64, be);
  const auto x = tape.input(xt, false, "x");
  const auto w = tape.input(testing::random_tensor(Shape{3, 2}, 11, -1, 1, DType::F64, be), true, "w");
  const auto loss = sum(matmul(x, w));  // keeps x for dW
  xt.copy_from(testing::random_tensor(Shape{2, 3}, 12, -1, 1, DType::F64, be));
  CHECK_THROWS_MATCHES(tape.backward(loss), Error,
                       ErrorContains("matmul: a tensor saved for backward was modified in place"));

  // An optimizer-style write to a parameter saved by linear is caught the same way.
  const auto p = Var<B>::parameter(testing::random_tensor(Shape{2, 3}, 13, -1, 1, DType::F64, be), "W");
  Tape<B> tape2(be);
  const auto xin = tape2.input(testing::random_tensor(Shape{4, 3}, 14, -1, 1, DType::F64, be), true, "x");
  const auto loss2 = sum(linear(xin, p));
  p.value().zero_();
  CHECK_THROWS_MATCHES(tape2.backward(loss2), Error, ErrorContains("modified in place"));
}

TEST_CASE("NoGradGuard: nothing is recorded or saved", "[autograd]") {
  B be;
  Tape<B> tape(be);
  const auto x = tape.input(testing::random_tensor(Shape{4, 3}, 15, -1, 1, DType::F32, be), true, "x");
  const auto w = Var<B>::parameter(testing::random_tensor(Shape{2, 3}, 16, -1, 1, DType::F32, be), "W");
  Var<B> y;
  {
    NoGradGuard guard;
    CHECK_FALSE(grad_enabled());
    y = sum(relu(linear(x, w)));
    CHECK(tape.size() == 0);
    CHECK(be.memory().live(MemCategory::SavedActivation) == 0);
    {
      GradModeGuard on(true);
      CHECK(grad_enabled());
    }
    CHECK_FALSE(grad_enabled());
  }
  CHECK(grad_enabled());
  CHECK_FALSE(y.requires_grad());
  CHECK_THROWS_MATCHES(tape.backward(y), Error, ErrorContains("does not require grad"));
  // Ops on inputs that need no gradient record nothing either.
  const auto c = tape.input(testing::random_tensor(Shape{4, 3}, 17, -1, 1, DType::F32, be));
  const auto z = relu(c);
  CHECK(tape.size() == 0);
  CHECK_FALSE(z.requires_grad());
  // With grad mode back on, the same forward records linear, relu and sum.
  const auto loss = sum(relu(linear(x, w)));
  CHECK(tape.size() == 3);
  CHECK(loss.requires_grad());
  CHECK_FALSE(loss.is_leaf());
  CHECK_THROWS_MATCHES(loss.grad(), Error, ErrorContains("is not a leaf that requires grad"));
}

TEST_CASE("A gradient is cast back to its input's dtype", "[autograd]") {
  // add of f32 and f64 runs in f64 (the "promote" category); each input's gradient
  // arrives in that input's own dtype.
  B be;
  Tape<B> tape(be);
  const auto a = tape.input(
      T::from_host(Shape{3}, std::vector<double>{1, 2, 3}, DType::F32, MemCategory::Temporary, be), true, "a");
  const auto b = tape.input(f64(Shape{3}, {0.5, 0.25, 0.125}, be), true, "b");
  const auto y = add(a, b);
  CHECK(y.dtype() == DType::F64);
  tape.backward(sum(mul(y, y)));
  CHECK(a.grad().dtype() == DType::F32);
  CHECK(b.grad().dtype() == DType::F64);
  check_close(a.grad().to_host<double>(), {3.0, 4.5, 6.25});
  check_close(b.grad().to_host<double>(), {3.0, 4.5, 6.25});
}

TEST_CASE("Matmul-class ops reject mixed operand dtypes outside autocast", "[autograd][errors]") {
  B be;
  Tape<B> tape(be);
  const auto a = tape.input(T::zeros(Shape{2, 3}, DType::F32, MemCategory::Temporary, be), true);
  const auto b = tape.input(T::zeros(Shape{3, 4}, DType::F64, MemCategory::Temporary, be), true);
  CHECK_THROWS_MATCHES(matmul(a, b), Error, ErrorContains("matmul: operands are f32 and f64"));
  const auto w = tape.input(T::zeros(Shape{4, 3}, DType::BF16, MemCategory::Temporary, be), true);
  CHECK_THROWS_MATCHES(linear(a, w), Error, ErrorContains("outside autocast"));
  amp::Autocast autocast(DType::BF16);
  CHECK(linear(a, w).dtype() == DType::BF16);  // under autocast both are cast to bf16
}

TEST_CASE("a backward that fails part way marks the gradients it reached, optimizers refuse them until zero_grad",
          "[autograd][errors]") {
  B be;
  const auto w1 = Var<B>::parameter(testing::random_tensor(Shape{3, 3}, 21, -1, 1, DType::F64, be), "w1");
  const auto w2 = Var<B>::parameter(testing::random_tensor(Shape{3, 3}, 22, -1, 1, DType::F64, be), "w2");
  const T input = testing::random_tensor(Shape{2, 3}, 23, -1, 1, DType::F64, be);
  const auto micro_batch = [&](bool spoil) {
    Tape<B> tape(be);
    const T x_value = input.clone();
    const auto loss = sum(matmul(matmul(tape.input(x_value), w1), w2));
    if (spoil) x_value.copy_from(testing::random_tensor(Shape{2, 3}, 24, -1, 1, DType::F64, be));  // w1's saved x
    tape.backward(loss);
  };
  micro_batch(false);
  const auto w2_after_one = w2.grad().to_host<double>();
  CHECK_FALSE(w2.grad_incomplete());
  // The second micro-batch's backward adds w2's gradient, then finds w1's saved input changed.
  CHECK_THROWS_AS(micro_batch(true), Error);
  CHECK(w2.grad().to_host<double>() != w2_after_one);  // a partial sum: not undone
  CHECK(w1.grad_incomplete());
  CHECK(w2.grad_incomplete());
  optim::SGD<B> sgd({w1, w2}, {0.1});
  const auto w1_before = w1.value().to_host<double>(), w2_before = w2.value().to_host<double>();
  CHECK_THROWS_MATCHES(sgd.step(), Error, ErrorContains("is from a backward that failed part way"));
  CHECK(w1.value().to_host<double>() == w1_before);
  CHECK(w2.value().to_host<double>() == w2_before);
  // zero_grad clears the mark; the step's backward again, and the step runs.
  sgd.zero_grad();
  CHECK_FALSE(w1.grad_incomplete());
  CHECK_FALSE(w2.grad_incomplete());
  micro_batch(false);
  CHECK(w2.grad().to_host<double>() == w2_after_one);
  sgd.step();
  CHECK(w2.value().to_host<double>() != w2_before);
}
