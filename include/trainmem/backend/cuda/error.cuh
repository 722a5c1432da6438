// trainmem/backend/cuda/error.cuh — CUDA and cuBLAS failures become trainmem::Error.
//
// Every runtime and cuBLAS call goes through one of these macros, so a failure names
// the file, the line and the call that failed, and is thrown (never printed, never
// a process exit). A kernel launch is checked right after it is queued; an error raised while
// the kernel runs surfaces at the next checked call, like any CUDA error.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "trainmem/error.hpp"

namespace trainmem::cuda::runtime {

[[noreturn]] inline void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line) {
  cudaGetLastError();  // a non-sticky error must not resurface at the next launch check
  throw Error(detail::concat(file, ":", line, ": ", call, " failed: ", cudaGetErrorName(status), " (",
                             cudaGetErrorString(status), ")"));
}

[[noreturn]] inline void throw_cublas_error(cublasStatus_t status, const char* call, const char* file, int line) {
  throw Error(detail::concat(file, ":", line, ": ", call, " failed: ", cublasGetStatusName(status), " (",
                             cublasGetStatusString(status), ")"));
}

}  // namespace trainmem::cuda::runtime

/// Throws trainmem::Error naming the call, file and line unless it returns cudaSuccess.
#define TRAINMEM_CUDA_CHECK(call)                                                               \
  do {                                                                                          \
    const cudaError_t trainmem_status_ = (call);                                                \
    if (trainmem_status_ != cudaSuccess)                                                        \
      ::trainmem::cuda::runtime::throw_cuda_error(trainmem_status_, #call, __FILE__, __LINE__); \
  } while (0)

/// Throws trainmem::Error naming the call, file and line unless it returns CUBLAS_STATUS_SUCCESS.
#define TRAINMEM_CUBLAS_CHECK(call)                                                               \
  do {                                                                                            \
    const cublasStatus_t trainmem_status_ = (call);                                               \
    if (trainmem_status_ != CUBLAS_STATUS_SUCCESS)                                                \
      ::trainmem::cuda::runtime::throw_cublas_error(trainmem_status_, #call, __FILE__, __LINE__); \
  } while (0)

/// Checks that the kernel launch just queued was accepted (bad configuration, missing image).
#define TRAINMEM_CUDA_CHECK_LAUNCH(kernel_name)                                                                    \
  do {                                                                                                             \
    const cudaError_t trainmem_status_ = cudaGetLastError();                                                       \
    if (trainmem_status_ != cudaSuccess)                                                                           \
      ::trainmem::cuda::runtime::throw_cuda_error(trainmem_status_, "launch of " kernel_name, __FILE__, __LINE__); \
  } while (0)
