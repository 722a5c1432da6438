// trainmem/config.hpp — build-wide macros.
//
// TRAINMEM_HOST_DEVICE marks math that both compilers must see: under nvcc it is
// `__host__ __device__`, under a host compiler it is plain `inline`. Element-wise
// formulas are written once with it, so CPU tests exercise what CUDA kernels run.
#pragma once

#if defined(__CUDACC__)
#define TRAINMEM_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define TRAINMEM_HOST_DEVICE inline
#endif

#define TRAINMEM_VERSION_MAJOR 0
#define TRAINMEM_VERSION_MINOR 1
#define TRAINMEM_VERSION_PATCH 0
