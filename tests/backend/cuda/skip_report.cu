// tests/backend/cuda/skip_report.cu — one line at the end of the run saying how many CUDA cases were skipped.
//
// Each TEST_CASE skips itself without a device (TRAINMEM_REQUIRE_CUDA_DEVICE); this
// listener prints the device the run used at the start and, at the end, the number of
// cases that skipped, so a run on a machine without a GPU says so plainly instead of
// passing silently. (gpu_gate.cu makes the run exit 77 before any case runs
// when there is no device; this report is what a plain Catch2 main prints.)
#ifndef CATCH_CONFIG_EXTERNAL_INTERFACES
#define CATCH_CONFIG_EXTERNAL_INTERFACES
#endif
#include "cuda_test_support.cuh"

#include <iostream>

namespace {

class CudaSkipReport : public Catch::TestEventListenerBase {
 public:
  using Catch::TestEventListenerBase::TestEventListenerBase;

  void testRunStarting(const Catch::TestRunInfo&) override {
    if (trainmem::cuda::device_count() == 0) {
      std::cerr << "test_cuda: no CUDA device; every CUDA test case will skip\n";
      return;
    }
    int device = 0;
    cudaDeviceProp props{};
    if (cudaGetDevice(&device) == cudaSuccess && cudaGetDeviceProperties(&props, device) == cudaSuccess)
      std::cerr << "test_cuda: device " << device << ": " << props.name << " (sm_" << props.major << props.minor << ", "
                << props.multiProcessorCount << " SMs, " << (props.totalGlobalMem >> 20) << " MiB)\n";
  }
  void testRunEnded(const Catch::TestRunStats& stats) override {
    const int skipped = trainmem::cuda_testing::skipped_test_cases();
    if (skipped > 0)
      std::cerr << "test_cuda: SKIPPED " << skipped << " of " << stats.totals.testCases.total()
                << " test cases: no CUDA device\n";
  }
};

}  // namespace

CATCH_REGISTER_LISTENER(CudaSkipReport)
