// benchmarks/common/gpu.cuh — the GPU a CUDA benchmark ran on, as its results file names it,
// and how a CUDA benchmark times two implementations against each other.
//
// Figures from different GPUs or drivers are not comparable, so the CUDA benchmarks pass
// this to benchmarks::provenance (common/provenance.hpp): the device's name, the driver
// and runtime versions, the compute capability and the SM count. Two implementations
// are timed in alternating batches, so drift in clocks or load hits both alike.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "common/stats.hpp"
#include "trainmem/backend/cuda/error.cuh"

namespace benchmarks {

/// "NVIDIA H200, driver 12.4 (CUDA runtime 12.4), compute capability 9.0, 132 SMs"; the
/// CUDA error's name when the device cannot be asked.
inline std::string gpu_description(int device) {
  cudaDeviceProp props{};
  if (const cudaError_t e = cudaGetDeviceProperties(&props, device); e != cudaSuccess) return cudaGetErrorName(e);
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  auto version = [](int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); };
  return std::string(props.name) + ", driver " + version(driver) + " (CUDA runtime " + version(runtime) +
         "), compute capability " + std::to_string(props.major) + "." + std::to_string(props.minor) + ", " +
         std::to_string(props.multiProcessorCount) + " SMs";
}

/// Milliseconds per call of two implementations, each the median over the samples; `inner`
/// calls made each sample.
struct PairedTiming {
  double first_ms = 0.0, second_ms = 0.0;
  int inner = 0;
};

/// Times `first(r)` against `second(r)`, each queueing call r of a batch on `stream` (a
/// caller rotating over `sets` operand sets takes set r % sets), with CUDA events on the
/// stream: warm-up first, five rounds of `sets` calls each (clocks, caches, lazy module
/// loading, plans); then `samples` batches of `inner` back-to-back calls of each,
/// alternating batch by batch, where `inner` (at least `sets`) makes a batch of `first`
/// last about `batch_ms` by its last warm-up round.
template <class First, class Second>
PairedTiming time_alternating(cudaStream_t stream, int sets, int samples, double batch_ms, First&& first,
                              Second&& second) {
  cudaEvent_t start, stop;
  TRAINMEM_CUDA_CHECK(cudaEventCreate(&start));
  TRAINMEM_CUDA_CHECK(cudaEventCreate(&stop));
  auto time_batch = [&](auto&& call, int inner) {
    TRAINMEM_CUDA_CHECK(cudaEventRecord(start, stream));
    for (int r = 0; r < inner; ++r) call(r);
    TRAINMEM_CUDA_CHECK(cudaEventRecord(stop, stream));
    TRAINMEM_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0.0f;
    TRAINMEM_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    return static_cast<double>(ms) / inner;
  };
  double per_call_ms = 0.0;
  for (int w = 0; w < 5; ++w) {
    per_call_ms = time_batch(first, sets);
    time_batch(second, sets);
  }
  PairedTiming timing;
  timing.inner = std::max(sets, static_cast<int>(std::ceil(batch_ms / per_call_ms)));
  std::vector<double> first_ms, second_ms;
  for (int sample = 0; sample < samples; ++sample) {
    first_ms.push_back(time_batch(first, timing.inner));
    second_ms.push_back(time_batch(second, timing.inner));
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  timing.first_ms = median(first_ms);
  timing.second_ms = median(second_ms);
  return timing;
}

}  // namespace benchmarks
