// trainmem/backend/cuda/fingerprint_checks.cuh — a recompute's fingerprints compared on the device, raised at the next
// host wait.
//
// DeterminismCheck::Fingerprint (checkpoint/options.hpp, checkpoint/detail/determinism.hpp) compares each tensor a
// region's recompute brings back with the one its forward dropped. On the CPU that is two
// integers. Here the forward's fingerprint stays on the device, in a slot of this pool
// that its Fingerprint handle returns when the region's record goes; the recompute's is
// reduced by the same kernel and compared in the reduction's last step, and a mismatch
// claims the pool's record with the check's number. The record travels back with the
// next host wait and is raised there, as the label and id checks are (NOTE [Checks
// without a host wait] in index_checks.cuh): the same CheckpointError the CPU backend
// throws at once, with no wait of its own. The messages of the checks queued since the
// last wait are kept on the host until that wait.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "trainmem/backend/cuda/error.cuh"
#include "trainmem/error.hpp"

namespace trainmem::cuda::runtime {

class FingerprintChecks;

/// \brief A fingerprint on the device: one slot of a FingerprintChecks pool, returned on destruction.
/// Empty for a tensor of no bytes (nothing to compare).
class DeviceFingerprint {
 public:
  DeviceFingerprint() = default;
  DeviceFingerprint(FingerprintChecks* owner, unsigned long long* slot) : owner_(owner), slot_(slot) {}
  DeviceFingerprint(DeviceFingerprint&& other) noexcept
      : owner_(std::exchange(other.owner_, nullptr)), slot_(std::exchange(other.slot_, nullptr)) {}
  DeviceFingerprint& operator=(DeviceFingerprint&& other) noexcept {
    if (this != &other) {
      release();
      owner_ = std::exchange(other.owner_, nullptr);
      slot_ = std::exchange(other.slot_, nullptr);
    }
    return *this;
  }
  DeviceFingerprint(const DeviceFingerprint&) = delete;
  DeviceFingerprint& operator=(const DeviceFingerprint&) = delete;
  ~DeviceFingerprint() { release(); }

  bool empty() const { return slot_ == nullptr; }
  /// The device word the fingerprint is (or will be, in stream order) stored in.
  unsigned long long* slot() const { return slot_; }

 private:
  inline void release();
  FingerprintChecks* owner_ = nullptr;
  unsigned long long* slot_ = nullptr;
};

/// \brief Device slots for fingerprints, and the record of the first mismatch since the last host wait.
class FingerprintChecks {
 public:
  FingerprintChecks() {
    // Control bytes like the index records: not tensor memory, so not in MemoryStats.
    TRAINMEM_CUDA_CHECK(cudaMalloc(&record_, sizeof(unsigned long long)));
    TRAINMEM_CUDA_CHECK(cudaMemset(record_, 0, sizeof(unsigned long long)));
    const cudaError_t status = cudaMallocHost(&host_record_, sizeof(unsigned long long));
    if (status != cudaSuccess) {
      cudaFree(record_);
      throw_cuda_error(status, "cudaMallocHost(&host_record_, 8)", __FILE__, __LINE__);
    }
    *host_record_ = 0;
  }
  ~FingerprintChecks() {
    for (unsigned long long* chunk : chunks_) cudaFree(chunk);
    cudaFreeHost(host_record_);
    cudaFree(record_);
  }
  FingerprintChecks(const FingerprintChecks&) = delete;
  FingerprintChecks& operator=(const FingerprintChecks&) = delete;

  /// A free slot (a new chunk of kChunk slots when none is left; slots are reused, so a
  /// steady-state step allocates none). Work queued on the one stream reads a slot before
  /// a later fingerprint overwrites it.
  DeviceFingerprint acquire() {
    if (free_.empty()) {
      unsigned long long* chunk = nullptr;
      TRAINMEM_CUDA_CHECK(cudaMalloc(&chunk, kChunk * sizeof(unsigned long long)));
      chunks_.push_back(chunk);
      for (std::size_t k = kChunk; k-- > 0;) free_.push_back(chunk + k);
    }
    unsigned long long* slot = free_.back();
    free_.pop_back();
    return DeviceFingerprint(this, slot);
  }
  void release(unsigned long long* slot) { free_.push_back(slot); }

  /// The number a comparison claims the record with on a mismatch; `message` is raised then.
  unsigned long long expect(std::string message) {
    messages_.push_back(std::move(message));
    return messages_.size();
  }
  unsigned long long* record() const { return record_; }

  /// Queues the copy of the record to the host; read it with raise() once the stream is waited for.
  void queue_read(cudaStream_t stream) {
    if (messages_.empty()) return;
    TRAINMEM_CUDA_CHECK(
        cudaMemcpyAsync(host_record_, record_, sizeof(unsigned long long), cudaMemcpyDeviceToHost, stream));
  }
  /// After a wait: every comparison queued before it has run. Throws the first mismatch (and
  /// clears the record), then forgets the messages either way.
  void raise(cudaStream_t stream) {
    if (messages_.empty()) return;
    const unsigned long long claimed = std::exchange(*host_record_, 0ull);
    std::vector<std::string> messages = std::exchange(messages_, {});
    if (claimed == 0) return;
    TRAINMEM_CUDA_CHECK(cudaMemsetAsync(record_, 0, sizeof(unsigned long long), stream));
    throw CheckpointError(messages.at(claimed - 1) + " (compared on the device, raised at the next host wait)");
  }
  /// Slots in use (tests: a region's record returns its slots).
  std::size_t slots_in_use() const { return chunks_.size() * kChunk - free_.size(); }

 private:
  static constexpr std::size_t kChunk = 1024;
  unsigned long long* record_ = nullptr;
  unsigned long long* host_record_ = nullptr;
  std::vector<unsigned long long*> chunks_;
  std::vector<unsigned long long*> free_;
  std::vector<std::string> messages_;
};

inline void DeviceFingerprint::release() {
  if (owner_ != nullptr) owner_->release(slot_);
  owner_ = nullptr;
  slot_ = nullptr;
}

}  // namespace trainmem::cuda::runtime
