// trainmem/backend/cuda/stream.cuh — the device and the stream a cuda::Backend owns.
//
// One backend is one device and one stream; every call makes that device current first
// (cheaply: a cudaGetDevice before any cudaSetDevice), so two backends on two GPUs can
// be used from one thread.
#pragma once

#include "trainmem/backend/cuda/error.cuh"
#include "trainmem/error.hpp"

namespace trainmem::cuda {

/// Number of CUDA devices this process can use (0 where there is no driver or no GPU).
inline int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

namespace runtime {

/// Makes `device` current unless it already is (a cudaGetDevice is cheaper than a cudaSetDevice).
inline void make_current(int device) {
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess || current != device) TRAINMEM_CUDA_CHECK(cudaSetDevice(device));
}

/// The current device, or 0 where there is none to ask.
inline int current_device() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    device = 0;
  }
  return device;
}

/// Whether `host` is pinned memory (a copy from it is read later, by the stream).
inline bool is_pinned(const void* host) {
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, host) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return attributes.type == cudaMemoryTypeHost;
}

inline int multiprocessor_count(int device) {
  int count = 0;
  TRAINMEM_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
  return count;
}

/// \brief An owned, non-blocking CUDA stream.
class StreamHandle {
 public:
  explicit StreamHandle(int device) {
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess) cudaGetLastError();
    detail::check(status == cudaSuccess && count > 0, "cuda::Backend: no usable CUDA device (",
                  status != cudaSuccess ? cudaGetErrorString(status) : "none found", ")");
    detail::check(device >= 0 && device < count, "cuda::Backend: device ", device, " does not exist (", count,
                  " found)");
    TRAINMEM_CUDA_CHECK(cudaSetDevice(device));
    TRAINMEM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  ~StreamHandle() {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  StreamHandle(const StreamHandle&) = delete;
  StreamHandle& operator=(const StreamHandle&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

}  // namespace runtime
}  // namespace trainmem::cuda
