// tests/main.cpp — Catch2's main, compiled once and linked into every test executable.
//
// A test program may define trainmem::testing::run_gate() (test_cuda does, in
// backend/cuda/gpu_gate.cpp): when it returns non-zero, the run ends with that code before
// any case runs. test_cuda's gate returns 77 without a usable CUDA device, which CTest
// reports as skipped (the tests are built wherever nvcc exists and run wherever a GPU
// does). Listing tests, which catch_discover_tests does at build time, never asks the gate.
// Nothing here uses trainmem, so it is compiled without trainmem's flags or sanitizers.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

namespace trainmem::testing {
/// Defined by test programs that may not run here; absent (null) elsewhere.
[[gnu::weak]] int run_gate();
}  // namespace trainmem::testing

int main(int argc, char* argv[]) {
  Catch::Session session;
  if (const int rc = session.applyCommandLine(argc, argv); rc != 0) return rc;
  const Catch::ConfigData& config = session.configData();
  const bool listing = config.listTests || config.listTestNamesOnly || config.listTags || config.listReporters;
  if (!listing && trainmem::testing::run_gate != nullptr)
    if (const int rc = trainmem::testing::run_gate(); rc != 0) return rc;
  return session.run();
}
