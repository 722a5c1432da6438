// trainmem/cuda.hpp — everything in trainmem.hpp plus trainmem::cuda::Backend; compile with nvcc.
//
// The one door to the CUDA backend: only this header reaches backend/cuda/*.cuh, and
// trainmem.hpp never includes it, so a CPU-only build sees no CUDA header. Link the
// CMake target trainmem::cuda (CUDA runtime, cuBLAS, cuBLASLt).
#pragma once

#if !defined(__CUDACC__)
#error \
    "trainmem/cuda.hpp holds CUDA kernels: include it from a .cu file compiled by nvcc (or include trainmem/trainmem.hpp for the CPU backend)"
#endif

// Eigen serves the CPU backend on the host only; without this nvcc marks Eigen's
// functions __host__ __device__ and warns about every defaulted member. trainmem::cuda
// defines it too, for translation units that include Eigen before this header.
#if !defined(EIGEN_NO_CUDA)
#define EIGEN_NO_CUDA
#endif

#include "trainmem/trainmem.hpp"

#include "trainmem/backend/cuda/backend.cuh"
