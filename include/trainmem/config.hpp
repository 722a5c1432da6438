// trainmem/config.hpp — build-wide macros.
//
// TRAINMEM_HOST_DEVICE marks math that both compilers must see: under nvcc it is
// `__host__ __device__`, under a host compiler an inline function. Element-wise
// formulas are written once with it, so CPU tests exercise what CUDA kernels run.
// It is always inlined (GCC and Clang: always_inline): a kernel loop vectorises only
// with its functor inlined, and in a large translation unit (the compiled mode's) GCC's
// inliner reaches its growth limit and leaves some functors as calls otherwise.
#pragma once

#if defined(__CUDACC__)
#define TRAINMEM_HOST_DEVICE __host__ __device__ __forceinline__
#elif defined(__GNUC__)
#define TRAINMEM_HOST_DEVICE inline __attribute__((always_inline))
#else
#define TRAINMEM_HOST_DEVICE inline
#endif

#define TRAINMEM_VERSION_MAJOR 0
#define TRAINMEM_VERSION_MINOR 1
#define TRAINMEM_VERSION_PATCH 0
