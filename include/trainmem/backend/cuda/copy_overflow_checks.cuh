// trainmem/backend/cuda/copy_overflow_checks.cuh — model copies an update made overflow, raised at the next host wait.
//
// The update kernel (kernels/update.cuh) compares each 16-bit model copy element it writes
// with its master: finite master, inf copy (NOTE [Model copies that overflow] in
// core/copy_overflow.hpp). A thread that finds one claims the record with its pass's
// number (the first claim stays) and adds one to the count; the rare path is the only one
// that touches the record. The record travels back with the next host wait and is raised
// there as CopyOverflowError, as the index and fingerprint checks are (NOTE [Checks
// without a host wait] in index_checks.cuh): the CPU backend throws the same error at the
// step, here it costs no wait of its own. The names of the passes queued since the last
// wait are kept on the host until that wait.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "trainmem/backend/cuda/error.cuh"
#include "trainmem/core/copy_overflow.hpp"
#include "trainmem/core/dtype.hpp"
#include "trainmem/error.hpp"

namespace trainmem::cuda::runtime {

/// \brief The device record of the first model copy that overflowed since the last host wait.
class CopyOverflowChecks {
 public:
  /// record[0]: the claiming pass's number (0: none); record[1]: elements counted.
  static constexpr std::size_t kBytes = 2 * sizeof(unsigned long long);

  CopyOverflowChecks() {
    // Control bytes like the index records: not tensor memory, so not in MemoryStats.
    TRAINMEM_CUDA_CHECK(cudaMalloc(&record_, kBytes));
    TRAINMEM_CUDA_CHECK(cudaMemset(record_, 0, kBytes));
    const cudaError_t status = cudaMallocHost(&host_record_, kBytes);
    if (status != cudaSuccess) {
      cudaFree(record_);
      throw_cuda_error(status, "cudaMallocHost(&host_record_, 16)", __FILE__, __LINE__);
    }
    host_record_[0] = host_record_[1] = 0;
  }
  ~CopyOverflowChecks() {
    cudaFreeHost(host_record_);
    cudaFree(record_);
  }
  CopyOverflowChecks(const CopyOverflowChecks&) = delete;
  CopyOverflowChecks& operator=(const CopyOverflowChecks&) = delete;

  /// The number a pass writing `copy_dtype` copies of parameter `name` claims the record with.
  unsigned long long expect(std::string name, DType copy_dtype) {
    passes_.emplace_back(std::move(name), copy_dtype);
    return passes_.size();
  }
  unsigned long long* record() const { return record_; }

  /// Queues the copy of the record to the host; read it with raise() once the stream is waited for.
  void queue_read(cudaStream_t stream) {
    if (passes_.empty()) return;
    TRAINMEM_CUDA_CHECK(cudaMemcpyAsync(host_record_, record_, kBytes, cudaMemcpyDeviceToHost, stream));
  }
  /// After a wait: every pass queued before it has run. Throws for the first claim (and
  /// clears the record), then forgets the passes either way.
  void raise(cudaStream_t stream) {
    if (passes_.empty()) return;
    const unsigned long long claimed = std::exchange(host_record_[0], 0ull);
    const unsigned long long count = std::exchange(host_record_[1], 0ull);
    std::vector<std::pair<std::string, DType>> passes = std::exchange(passes_, {});
    if (claimed == 0) return;
    TRAINMEM_CUDA_CHECK(cudaMemsetAsync(record_, 0, kBytes, stream));
    const auto& [name, dtype] = passes.at(claimed - 1);
    throw CopyOverflowError(
        detail::copy_overflow_message(
            name, detail::concat(count, " element(s) (over the update passes since the last host wait)"), dtype) +
        " (found on the device, raised at the next host wait)");
  }

 private:
  unsigned long long* record_ = nullptr;
  unsigned long long* host_record_ = nullptr;
  std::vector<std::pair<std::string, DType>> passes_;
};

}  // namespace trainmem::cuda::runtime
