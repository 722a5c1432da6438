// tests/main.cpp — Catch2's main, compiled once and linked into every test executable.
//
// test_cuda gets a second build of this file with TRAINMEM_TEST_REQUIRE_GPU: without a
// usable CUDA device a run exits with 77, which CTest reports as skipped (the tests
// are built wherever nvcc exists and run wherever a GPU does); listing tests, which
// catch_discover_tests does at build time, still works without one.
#if !defined(TRAINMEM_TEST_REQUIRE_GPU)

#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>

#else

#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <iostream>

int main(int argc, char* argv[]) {
  Catch::Session session;
  if (const int rc = session.applyCommandLine(argc, argv); rc != 0) return rc;
  const Catch::ConfigData& config = session.configData();
  const bool listing = config.listTests || config.listTestNamesOnly || config.listTags || config.listReporters;
  if (!listing) {
    int devices = 0;
    const cudaError_t status = cudaGetDeviceCount(&devices);
    if (status != cudaSuccess || devices == 0) {
      std::cerr << "no usable CUDA device (" << (status != cudaSuccess ? cudaGetErrorString(status) : "none found")
                << "); skipping\n";
      return 77;
    }
  }
  return session.run();
}

#endif
