// trainmem/backend/cuda/allocator.cuh — stream-ordered device pool with exact accounting.
//
// Device memory comes from a cudaMemPool_t the allocator owns, taken and given back in
// stream order on the backend's stream (cudaMallocFromPoolAsync / cudaFreeAsync). A free
// is queued behind the kernels that last used the block, so a Storage can free without
// synchronising, and the pool hands the block to the next allocation on that stream at
// once. The pool's release threshold is "never": a training step allocates the same
// sizes every step and reuses pool memory instead of mapping new pages. MemoryStats
// counts the requested bytes by category, exactly as the CPU allocator does; bytes the
// pool holds that no tensor uses are `cached_bytes()`, returned by `release_cached()`.
//
// Pinned host memory (activation offload) comes from here too, counted as HostOffload
// and cached by size, since cudaMallocHost costs far more than a copy.
//
// Out of memory, allocate() retries once: it calls the reclaim hook (the backend's: wait
// for the offload side stream and let go of every offloaded source whose copy is done,
// NOTE [Offload ordering]), lets the frees queued on the stream run, gives this pool's
// unused blocks back to the device, and asks again.
//
// Destructors call deallocate, which must not throw: a failure there is kept and
// raised by the next allocate() or check_deferred() (the backend's synchronize()).
//
// Every host wait for a stream that the backend issues goes through synchronize(), which
// counts it (host_syncs()), so a test can prove that a training step never waits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "trainmem/backend/cuda/error.cuh"
#include "trainmem/core/memory_stats.hpp"

namespace trainmem::cuda {

/// \brief Device pool allocator on one stream, plus a pinned host cache; every byte counted.
class Allocator {
 public:
  Allocator(MemoryStats& stats, int device, cudaStream_t stream) : stats_(stats), device_(device), stream_(stream) {
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = cudaMemHandleTypeNone;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    TRAINMEM_CUDA_CHECK(cudaMemPoolCreate(&pool_, &props));
    set_release_threshold(UINT64_MAX);
  }
  ~Allocator() {
    release_host_cache();
    // Blocks still in use belong to tensors that outlived their backend; the pool goes anyway.
    cudaStreamSynchronize(stream_);
    cudaMemPoolDestroy(pool_);
  }
  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  // --- device ------------------------------------------------------------------------
  void* allocate(std::size_t bytes, MemCategory category) {
    check_deferred();
    void* ptr = nullptr;
    if (bytes > 0) {
      cudaError_t status = cudaMallocFromPoolAsync(&ptr, bytes, pool_, stream_);
      if (status == cudaErrorMemoryAllocation) {
        // Let whatever holds device bytes only until some copy finishes let go of them
        // (the reclaim hook), let the frees queued on the stream run, give this pool's
        // unused blocks back to the device, and try once more. Only this pool: memory that
        // other pools, other backends or libraries hold is theirs to release
        // (release_cached() on each).
        cudaGetLastError();
        if (reclaim_) reclaim_();
        synchronize(stream_);
        TRAINMEM_CUDA_CHECK(cudaMemPoolTrimTo(pool_, 0));
        status = cudaMallocFromPoolAsync(&ptr, bytes, pool_, stream_);
      }
      if (status == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        throw Error(out_of_memory_message(bytes, category));
      }
      TRAINMEM_CUDA_CHECK(status);
    }
    stats_.on_allocate(category, bytes);
    return ptr;
  }

  void deallocate(void* ptr, std::size_t bytes, MemCategory category) noexcept {
    stats_.on_free(category, bytes);
    if (ptr == nullptr) return;
    const cudaError_t status = cudaFreeAsync(ptr, stream_);
    if (status == cudaSuccess) return;
    cudaGetLastError();  // kept for check_deferred(), not for the next launch check
    // At process exit the runtime may be gone before the last static tensor; nothing to free then.
    if (status != cudaErrorCudartUnloading) defer_error("cudaFreeAsync", status);
  }

  /// Called by the out-of-memory retry before it waits for the stream: frees what pending
  /// copies hold (the backend passes its offload engine's wait-and-reclaim). May throw.
  void set_reclaim_hook(std::function<void()> reclaim) { reclaim_ = std::move(reclaim); }

  /// Turns pool caching off (freed blocks go back to the device at each synchronisation) or on.
  void set_caching(bool on) {
    set_release_threshold(on ? UINT64_MAX : 0);
    if (!on) release_cached();
  }
  /// Device bytes the pool holds beyond what live allocations use.
  std::size_t cached_bytes() const {
    std::uint64_t reserved = 0, used = 0;
    TRAINMEM_CUDA_CHECK(cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrReservedMemCurrent, &reserved));
    TRAINMEM_CUDA_CHECK(cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrUsedMemCurrent, &used));
    return static_cast<std::size_t>(reserved - used);
  }
  /// Pinned host bytes kept for reuse.
  std::size_t host_cached_bytes() const { return host_cached_bytes_; }
  /// Returns unused pool memory to the device and cached pinned blocks to the system.
  void release_cached() {
    synchronize(stream_);
    TRAINMEM_CUDA_CHECK(cudaMemPoolTrimTo(pool_, 0));
    release_host_cache();
  }
  /// Bytes the pool has mapped, used or not.
  std::size_t reserved_bytes() const {
    std::uint64_t reserved = 0;
    TRAINMEM_CUDA_CHECK(cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrReservedMemCurrent, &reserved));
    return static_cast<std::size_t>(reserved);
  }

  // --- pinned host (HostOffload) ------------------------------------------------------
  void* allocate_host(std::size_t bytes) {
    check_deferred();
    void* ptr = nullptr;
    if (auto it = host_cache_.find(bytes); it != host_cache_.end() && !it->second.empty()) {
      ptr = it->second.back();
      it->second.pop_back();
      host_cached_bytes_ -= bytes;
    } else if (bytes > 0) {
      const cudaError_t status = cudaMallocHost(&ptr, bytes);
      if (status == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        throw Error(detail::concat("cuda::Allocator: out of pinned host memory allocating ", bytes,
                                   " bytes for host_offload; ", live_summary()));
      }
      TRAINMEM_CUDA_CHECK(status);
    }
    stats_.on_allocate(MemCategory::HostOffload, bytes);
    return ptr;
  }
  /// The caller guarantees no copy still reads or writes the block.
  void deallocate_host(void* ptr, std::size_t bytes) noexcept {
    stats_.on_free(MemCategory::HostOffload, bytes);
    if (ptr == nullptr) return;
    try {
      host_cache_[bytes].push_back(ptr);
      host_cached_bytes_ += bytes;
    } catch (...) {
      cudaFreeHost(ptr);
    }
  }

  /// Waits on the host until `stream` has run everything queued on it; counted in host_syncs().
  void synchronize(cudaStream_t stream) {
    ++host_syncs_;
    TRAINMEM_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  /// Host waits for a stream issued so far (synchronize() calls).
  std::uint64_t host_syncs() const { return host_syncs_; }

  /// Raises an error that a noexcept path (a free in a destructor) had to keep.
  void check_deferred() {
    if (deferred_error_.empty()) return;
    std::string message;
    message.swap(deferred_error_);
    throw Error(message);
  }

  cudaMemPool_t pool() const { return pool_; }
  cudaStream_t stream() const { return stream_; }
  int device() const { return device_; }
  MemoryStats& stats() const { return stats_; }

 private:
  void set_release_threshold(std::uint64_t threshold) {
    TRAINMEM_CUDA_CHECK(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &threshold));
  }
  void release_host_cache() noexcept {
    for (auto& [size, blocks] : host_cache_)
      for (void* ptr : blocks) cudaFreeHost(ptr);
    host_cache_.clear();
    host_cached_bytes_ = 0;
  }
  void defer_error(const char* call, cudaError_t status) noexcept {
    if (!deferred_error_.empty()) return;
    try {
      deferred_error_ = detail::concat("cuda::Allocator: ", call, " failed in a destructor: ", cudaGetErrorName(status),
                                       " (", cudaGetErrorString(status), ")");
    } catch (...) {
    }
  }
  std::string live_summary() const {
    std::string out = "live bytes by category:";
    for (std::size_t c = 0; c < kMemCategoryCount; ++c) {
      const auto category = static_cast<MemCategory>(c);
      out += detail::concat(c ? ", " : " ", name_of(category), " ", stats_.live(category));
    }
    out += detail::concat("; total live ", stats_.live_total(), ", peak ", stats_.peak_total());
    return out;
  }
  std::string out_of_memory_message(std::size_t bytes, MemCategory category) const {
    std::size_t free_bytes = 0, total_bytes = 0;
    cudaMemGetInfo(&free_bytes, &total_bytes);
    cudaGetLastError();
    std::uint64_t reserved = 0;
    cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrReservedMemCurrent, &reserved);
    return detail::concat("cuda::Allocator: out of device memory allocating ", bytes, " bytes for ", name_of(category),
                          " on device ", device_, " (device free ", free_bytes, " of ", total_bytes,
                          " bytes; this pool reserves ", reserved, "); ", live_summary());
  }

  MemoryStats& stats_;
  int device_;
  cudaStream_t stream_;
  cudaMemPool_t pool_ = nullptr;
  std::unordered_map<std::size_t, std::vector<void*>> host_cache_;
  std::size_t host_cached_bytes_ = 0;
  std::string deferred_error_;
  std::uint64_t host_syncs_ = 0;
  std::function<void()> reclaim_;
};

}  // namespace trainmem::cuda
