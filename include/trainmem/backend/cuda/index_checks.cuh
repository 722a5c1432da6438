// trainmem/backend/cuda/index_checks.cuh — labels and ids checked on the device, raised at the next host wait.
//
// NOTE [Checks without a host wait] below says how: no kernel waits for the host, and
// no host wait is added for a check.
#pragma once

#include <cstddef>
#include <cstring>

#include "trainmem/backend/cuda/error.cuh"
#include "trainmem/backend/cuda/launch.cuh"
#include "trainmem/error.hpp"

namespace trainmem::cuda::runtime {

// NOTE [Checks without a host wait]
// Cross-entropy labels and embedding ids are checked by the kernels that read them: an
// index outside its range is recorded in a BadIndex (launch.cuh) in device memory and
// the kernel goes on (a zero loss term, a zero row). Whenever the backend waits for its
// stream anyway (download, synchronize), the records travel back with the wait (one
// more small copy queued before it) and a claimed record is raised as trainmem::Error
// naming the op, the index and the range, then cleared. So a step with a bad label
// fails at the user's next to_host() or synchronize(), never later and without a wait
// of its own; the CPU backend checks the same indices at the op.
/// \brief The device's BadIndex records and their pinned host mirror.
class IndexChecks {
 public:
  static constexpr std::size_t kBytes =
      sizeof(kernels::BadIndex) * static_cast<std::size_t>(kernels::IndexCheck::kCount);
  IndexChecks() {
    // A few control bytes, like the stream and the events: not tensor memory, so not in MemoryStats.
    TRAINMEM_CUDA_CHECK(cudaMalloc(&device_, kBytes));
    TRAINMEM_CUDA_CHECK(cudaMemset(device_, 0, kBytes));
    const cudaError_t status = cudaMallocHost(&host_, kBytes);
    if (status != cudaSuccess) {
      cudaFree(device_);
      throw_cuda_error(status, "cudaMallocHost(&host_, kBytes)", __FILE__, __LINE__);
    }
    std::memset(static_cast<void*>(host_), 0, kBytes);
  }
  ~IndexChecks() {
    cudaFreeHost(host_);
    cudaFree(device_);
  }
  IndexChecks(const IndexChecks&) = delete;
  IndexChecks& operator=(const IndexChecks&) = delete;

  kernels::BadIndex* device() const { return device_; }
  /// Queues the copy of the records to the host; read them with raise() once the stream is waited for.
  void queue_read(cudaStream_t stream) {
    TRAINMEM_CUDA_CHECK(cudaMemcpyAsync(host_, device_, kBytes, cudaMemcpyDeviceToHost, stream));
  }
  /// Throws the first claimed record (after clearing all of them), if any.
  void raise(cudaStream_t stream) {
    for (int k = 0; k < static_cast<int>(kernels::IndexCheck::kCount); ++k) {
      if (host_[k].claimed == 0) continue;
      const kernels::BadIndex bad = host_[k];
      std::memset(static_cast<void*>(host_), 0, kBytes);
      TRAINMEM_CUDA_CHECK(cudaMemsetAsync(device_, 0, kBytes, stream));
      const bool label = k == static_cast<int>(kernels::IndexCheck::CrossEntropyLabel);
      throw Error(detail::concat(label ? "cross_entropy: label " : "embedding: id ", bad.value,
                                 label ? " at row " : " at position ", bad.position, " is outside [0, ", bad.extent,
                                 ") (checked on the device, raised at the next host wait)"));
    }
  }

 private:
  kernels::BadIndex* device_ = nullptr;
  kernels::BadIndex* host_ = nullptr;
};

}  // namespace trainmem::cuda::runtime
