// tests/reliability/test_fault_injection.cpp — every allocation of a training step can fail.
//
// "Nothing lost", made testable: the CPU allocator is told to fail its k-th allocation,
// for every k that one training step makes (forward, checkpoint recompute in backward,
// loss scaler, optimizer states on the first step, update). Each time the step must
// throw trainmem::Error, every byte of the model copies, FP32 masters, optimizer states
// and scaler state must equal what it was before the step (the update completes or
// never begins), no byte may stay live, and the next step must succeed.
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include <trainmem/trainmem.hpp>

#include "error_matchers.hpp"
#include "tiny_training.hpp"

namespace tmem = trainmem;
using B = tmem::cpu::Backend;
using tmem::DType;

namespace {

/// Fails allocation `k` of one step of `run` and checks the step left no trace: the same
/// bytes everywhere and, for a steady step, the same live bytes (a first step may keep
/// the scaler's flag and AdamW's beta scalars, which every later step reuses).
void check_failure_at(B& backend, tmem::testing::TinyTraining<B>& run, std::int64_t k, bool steady) {
  const std::vector<unsigned char> before = run.snapshot();
  const std::int64_t live_before = backend.memory().live_total();
  backend.allocator().fail_allocation(k);
  CHECK_THROWS_MATCHES(run.step(), tmem::Error, tmem::testing::ErrorContains("injected"));
  backend.allocator().fail_allocation(0);
  CHECK(run.snapshot() == before);
  if (steady) CHECK(backend.memory().live_total() == live_before);
}

}  // namespace

TEST_CASE("fault injection: the allocator fails the k-th allocation with a trainmem::Error", "[reliability][faults]") {
  B be;
  be.allocator().fail_allocation(2);
  auto a = tmem::Tensor<B>::zeros(tmem::Shape{4}, DType::F32, tmem::MemCategory::Temporary, be);
  CHECK_THROWS_MATCHES(tmem::Tensor<B>::zeros(tmem::Shape{4}, DType::F32, tmem::MemCategory::Temporary, be),
                       tmem::Error, tmem::testing::ErrorContains("injected"));
  CHECK(be.memory().live_total() == 16);  // the failed one counted nothing
  CHECK_NOTHROW(tmem::Tensor<B>::zeros(tmem::Shape{4}, DType::F32, tmem::MemCategory::Temporary, be));  // one-shot
}

TEST_CASE("fault injection: every allocation of a first and a steady training step fails cleanly",
          "[reliability][faults]") {
  for (DType model_dtype : {DType::F16, DType::BF16}) {
    CAPTURE(model_dtype);
    // The first step also allocates the optimizer states, the scaler's flags and AdamW's
    // step scalars; a fresh set-up per k makes each k the first step.
    std::int64_t first_step_allocations = 0;
    {
      B be;
      tmem::testing::TinyTraining<B> run(be, model_dtype);
      const std::int64_t start = be.memory().allocations();
      REQUIRE(run.step());
      first_step_allocations = be.memory().allocations() - start;
    }
    REQUIRE(first_step_allocations > 20);
    for (std::int64_t k = 1; k <= first_step_allocations; ++k) {
      CAPTURE(k);
      B be;
      tmem::testing::TinyTraining<B> run(be, model_dtype);
      check_failure_at(be, run, k, false);
      const auto before = run.snapshot();
      CHECK(run.step());  // the next step succeeds, and moves the model
      CHECK(run.snapshot() != before);
    }

    // A steady step (states exist): every allocation point, one run, recovering each time.
    B be;
    tmem::testing::TinyTraining<B> run(be, model_dtype);
    REQUIRE(run.step());
    const std::int64_t start = be.memory().allocations();
    REQUIRE(run.step());
    const std::int64_t steady_allocations = be.memory().allocations() - start;
    REQUIRE(steady_allocations > 20);
    for (std::int64_t k = 1; k <= steady_allocations; ++k) {
      CAPTURE(k);
      check_failure_at(be, run, k, true);
      const auto before = run.snapshot();
      CHECK_NOTHROW(run.step());  // the next step succeeds (the scaler may skip it)
      CHECK(run.snapshot() != before);
    }
    WARN("fault injection (" << tmem::name_of(model_dtype) << "): " << first_step_allocations
                             << " allocation points in a first step, " << steady_allocations
                             << " in a steady step; all failed with trainmem::Error and recovered");
  }
}
