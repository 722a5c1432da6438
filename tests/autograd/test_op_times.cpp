// tests/autograd/test_op_times.cpp — OpTimes attributes each op call to its op, once.
//
// Times are not checked (tests never time anything); what is checked is the accounting:
// which rows exist, how many forward and backward calls each counted, that nested scopes
// count only the outermost, that a stopped profile records nothing more, and that one
// thread holds one profile at a time.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "error_matchers.hpp"
#include "trainmem/trainmem.hpp"

using namespace trainmem;
using B = cpu::Backend;
using testing::ErrorContains;

namespace {

const OpTimeRow* row_of(const std::vector<OpTimeRow>& rows, const std::string& op) {
  for (const auto& r : rows)
    if (r.op == op) return &r;
  return nullptr;
}

/// sum(tanh(x W^T + b)) on a fresh tape, and its backward.
void step(B& backend, const Tensor<B>& x, const Var<B>& w, const Var<B>& b) {
  Tape<B> tape(backend);
  Var<B> in = tape.input(x);
  tape.backward(sum(tanh(linear(in, w, b))));
}

}  // namespace

TEST_CASE("OpTimes counts every op's forward and backward once, and only while active", "[autograd][op_times]") {
  B& backend = B::default_instance();
  nn::Init init(3);
  nn::Linear<B> fc(8, 4, init);
  const auto params = fc.parameters();
  const auto x = Tensor<B>::from_host(Shape{5, 8}, std::vector<float>(40, 0.25f));

  step(backend, x, params[0], params[1]);  // before the profile: not counted
  OpTimes<B> times(backend);
  step(backend, x, params[0], params[1]);
  step(backend, x, params[0], params[1]);
  times.stop();
  step(backend, x, params[0], params[1]);  // after stop(): not counted

  const auto rows = times.table();
  REQUIRE(rows.size() == 3);
  for (const char* op : {"linear", "tanh", "sum"}) {
    INFO(op);
    const OpTimeRow* r = row_of(rows, op);
    REQUIRE(r != nullptr);
    CHECK(r->forward_calls == 2);
    CHECK(r->backward_calls == 2);
    CHECK(r->forward_ms >= 0.0);
    CHECK(r->backward_ms >= 0.0);
  }
  for (std::size_t i = 1; i < rows.size(); ++i) CHECK(rows[i - 1].total_ms() >= rows[i].total_ms());
}

TEST_CASE("OpTimes charges what runs inside a scope to the outermost one", "[autograd][op_times]") {
  B& backend = B::default_instance();
  nn::Init init(4);
  nn::Linear<B> fc(6, 3, init);
  const auto params = fc.parameters();
  const auto x = Tensor<B>::from_host(Shape{2, 6}, std::vector<float>(12, 0.5f));
  OpTimes<B> times(backend);
  {
    OpTimes<B>::Scope whole("whole step", false);
    step(backend, x, params[0], params[1]);
  }
  const auto rows = times.table();
  REQUIRE(rows.size() == 1);
  CHECK(rows[0].op == "whole step");
  CHECK(rows[0].forward_calls == 1);
  CHECK(rows[0].backward_calls == 0);
}

TEST_CASE("One OpTimes per thread: a second one is an Error", "[autograd][op_times]") {
  B& backend = B::default_instance();
  OpTimes<B> first(backend);
  CHECK_THROWS_MATCHES(OpTimes<B>(backend), Error, ErrorContains("already active on this thread"));
  first.stop();
  OpTimes<B> second(backend);  // the first stopped: allowed
  CHECK(second.table().empty());
}
