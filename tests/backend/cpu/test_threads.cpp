// tests/backend/cpu/test_threads.cpp — the thread count the CPU backend's kernels and GEMMs use.
#include <catch2/catch.hpp>

#include "error_matchers.hpp"
#include "trainmem/trainmem.hpp"

using trainmem::testing::ErrorContains;

TEST_CASE("set_num_threads: sets the count the backend uses, rejects zero", "[backend][threads]") {
  const int before = trainmem::num_threads();
  trainmem::set_num_threads(1);
  CHECK(trainmem::num_threads() == 1);
  CHECK(Eigen::nbThreads() == 1);
  trainmem::set_num_threads(before);
  CHECK(trainmem::num_threads() == before);
  CHECK_THROWS_MATCHES(trainmem::set_num_threads(0), trainmem::Error, ErrorContains("at least one thread"));
}
