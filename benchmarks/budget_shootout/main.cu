// trainmem_cuda_budget_shootout — the fixed-budget shoot-out (shootout.hpp) on the CUDA backend:
// the same search and training loop as the CPU program, budgets in GiB of device memory.
// Exit 77 where there is no CUDA device.
//
//   trainmem_cuda_budget_shootout --text FILE --json trainmem.json --budgets-gib 40,24,64
//       --blocks 24 --dim 2048 --heads 16 --seq 2048 --vocab 32768 --extrapolate --bracket 1,2
//       [--export DIR] [--steps 20 --later-steps 6] [--time-limit-s 120]
#include <cstdio>

#include "budget_shootout/shootout.hpp"
#include "common/gpu.cuh"
#include "trainmem/cuda.hpp"

int main(int argc, char** argv) {
  if (trainmem::cuda::device_count() == 0) {
    std::fprintf(stderr, "budget_shootout: no CUDA device\n");
    return 77;
  }
  // One host thread drives the GPU.
  return shootout::main<trainmem::cuda::Backend>(
      argc, argv, 1, benchmarks::gpu_description(trainmem::cuda::Backend::default_instance().device()));
}
