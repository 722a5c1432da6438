// benchmarks/common/gpu.cuh — the GPU a CUDA benchmark ran on, as its results file names it.
//
// Figures from different GPUs or drivers are not comparable, so the CUDA benchmarks pass
// this to benchmarks::provenance (common/provenance.hpp): the device's name, the driver
// and runtime versions, the compute capability and the SM count.
#pragma once

#include <cuda_runtime.h>

#include <string>

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

}  // namespace benchmarks
