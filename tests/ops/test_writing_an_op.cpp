// tests/ops/test_writing_an_op.cpp — the guide's custom op (docs/writing-an-op.md) is compiled
// and correct: the guide shows softplus_op.hpp verbatim, and the op matches log(1 + e^x) in
// F64, its gradient matches central differences, autocast runs it in f32, it works inside a
// checkpoint region, and bad input is an Error.
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "error_matchers.hpp"
#include "gradcheck.hpp"
#include "guide_snippet.hpp"
#include "softplus_op.hpp"
#include "trainmem/trainmem.hpp"

using namespace trainmem;
using B = cpu::Backend;
using T = Tensor<B>;
using V = Var<B>;

TEST_CASE("the guide's custom op is the compiled one", "[ops][docs]") {
  const std::filesystem::path here = std::filesystem::path(__FILE__).parent_path();
  const std::string guide = testing::read_text(here / "../../docs/writing-an-op.md");
  const std::string source = testing::read_text(here / "softplus_op.hpp");
  REQUIRE(!guide.empty());
  REQUIRE(!source.empty());
  const std::string snippet = testing::guide_snippet(guide, "<!-- softplus-op -->");
  CHECK(snippet.size() > 1000);
  CHECK(source.find(snippet) != std::string::npos);
}

TEST_CASE("the guide's softplus: F64 values, finite-difference gradient, autocast, checkpoint", "[ops][docs]") {
  const T x = testing::random_tensor(Shape{4, 6}, 31, -4.0, 4.0);
  {
    Tape<B> tape;
    const V y = my_ops::softplus(tape.input(x, true));
    const auto xv = x.to_host<double>(), yv = y.value().to_host<double>();
    for (std::size_t i = 0; i < xv.size(); ++i) CHECK(yv[i] == Approx(std::log(1.0 + std::exp(xv[i]))).epsilon(1e-14));
  }
  const auto r = testing::check_gradients(
      [](Tape<B>& tape, const std::vector<V>& in) { return testing::weighted_sum(tape, my_ops::softplus(in[0])); },
      {x});
  INFO(r.report());
  CHECK(r.ok);

  {  // Fp32 category: a bf16 input runs in f32, and its gradient comes back in bf16.
    amp::Autocast guard(DType::BF16);
    Tape<B> tape;
    const V xb = tape.input(x.to(DType::BF16), true);
    const V y = my_ops::softplus(xb);
    CHECK(y.dtype() == DType::F32);
    tape.backward(sum(y));
    CHECK(xb.grad().dtype() == DType::BF16);
  }

  // Inside a checkpoint region the saved input is dropped and recomputed: same gradient.
  auto gradient = [&](bool checkpointed) {
    Tape<B> tape;
    const V xin = tape.input(x, true);
    auto body = [](const V& v) { return my_ops::softplus(my_ops::softplus(v)); };
    tape.backward(sum(checkpointed ? checkpoint(tape, body, xin) : body(xin)));
    return xin.grad().to_host<double>();
  };
  CHECK(gradient(true) == gradient(false));

  Tape<B> tape;
  const V ids = tape.input(T::from_host(Shape{2}, std::vector<double>{0, 1}, DType::I32));
  CHECK_THROWS_MATCHES(my_ops::softplus(ids), Error,
                       testing::ErrorContains("softplus: x must be floating, got i32 [2]"));
}
