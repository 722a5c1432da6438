// tests/threads/test_two_threads.cpp — two threads train on the one default backend.
//
// The README's loop, run by two threads at once: each has its own model, tape,
// optimizer and scaler, and both allocate from cpu::Backend::default_instance(), so
// its block cache and MemoryStats are shared. Each thread's weights must equal, bit
// for bit, those of the same model trained alone on one thread (training is
// deterministic, so any difference is interference), and every byte must be freed
// at the end. CI runs this under ThreadSanitizer (scripts/test).
#include <catch2/catch.hpp>

#include <cstdint>
#include <thread>
#include <vector>

#include <trainmem/trainmem.hpp>

#include "tiny_training.hpp"

namespace tmem = trainmem;
using B = tmem::cpu::Backend;

namespace {

constexpr int kSteps = 40;

std::vector<unsigned char> train(std::uint64_t seed) {
  tmem::testing::TinyTraining<B> run(B::default_instance(), tmem::DType::BF16, seed);
  for (int i = 0; i < kSteps; ++i) run.step();
  return run.snapshot();
}

}  // namespace

TEST_CASE("threads: two threads training their own models on the default backend do not interfere", "[threads]") {
  auto& stats = B::default_instance().memory();
  const std::int64_t live_before = stats.live_total();
  const std::vector<unsigned char> alone_a = train(5), alone_b = train(6);
  REQUIRE(alone_a != alone_b);

  for (int round = 0; round < 3; ++round) {
    std::vector<unsigned char> a, b;
    std::thread ta([&] { a = train(5); });
    std::thread tb([&] { b = train(6); });
    ta.join();
    tb.join();
    CAPTURE(round);
    CHECK(a == alone_a);
    CHECK(b == alone_b);
  }
  CHECK(stats.live_total() == live_before);
}

TEST_CASE("threads: MemoryStats and the block cache count exactly under concurrent allocation", "[threads]") {
  B& be = B::default_instance();
  const std::int64_t live_before = be.memory().live_total();
  const std::int64_t allocations_before = be.memory().allocations();
  constexpr int kPerThread = 2000;
  auto churn = [&](std::int64_t n) {
    std::vector<tmem::Tensor<B>> keep;
    for (int i = 0; i < kPerThread; ++i) {
      keep.push_back(
          tmem::Tensor<B>::zeros(tmem::Shape{n + i % 7}, tmem::DType::F32, tmem::MemCategory::Temporary, be));
      if (keep.size() > 16) keep.erase(keep.begin());
    }
  };
  std::thread t1(churn, 100), t2(churn, 100), t3(churn, 300);
  t1.join();
  t2.join();
  t3.join();
  CHECK(be.memory().allocations() - allocations_before == 3 * kPerThread);
  CHECK(be.memory().live_total() == live_before);
}
