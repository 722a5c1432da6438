// trainmem/backend/cuda/offload.cuh — activations copied to pinned host memory and back, off the main stream.
//
// NOTE [Offload ordering]
// Copies run on a side stream so they overlap the main stream's kernels. Events
// carry every dependency, and no call blocks the host:
//   offload(t): main records `produced`; side waits on it (t is complete), copies t to
//     a pinned buffer and records `copied`. t's storage is kept alive by the engine
//     until `copied` has completed, so the caller may drop t at once: its bytes return
//     to the pool (in main-stream order) only after the copy has read them.
//   fetch(h): the destination is allocated on the main stream; main records
//     `allocated`; side waits on it, copies the pinned bytes in (after the offload
//     copy, being the same stream) and records `fetched`; main waits on `fetched`.
//     Work queued on the main stream before fetch() overlaps the copy; work queued
//     after it sees the data.
//   ~HostCopy: the pinned buffer goes back to the cache once the last copy that reads
//     or writes it has completed (its event is polled, not waited on).
// Pinned bytes count as MemCategory::HostOffload from offload() until they return.
// Finished entries are reclaimed on each offload(), fetch() and synchronize(), and by the
// allocator's out-of-memory retry (which waits for the side stream first, so an
// allocation never fails while a finished copy still holds its source); a
// checkpoint region whose forward offloaded calls release_sources() as it ends, so the
// main stream waits there for its copies and the sources' bytes return to the pool in
// stream order instead of whenever the host next polls (a step that never waits would
// otherwise hold every offloaded activation on the device until backward).
//
// Polling an event that has not completed returns cudaErrorNotReady and also leaves it
// as the thread's last error, where the next launch check would report it as a failed
// launch; every poll goes through event_complete(), which takes it back. A HostCopy
// is handed out only once its buffer and its event exist, so a failed offload leaves
// nothing behind in the engine.
#pragma once

#include <cstddef>
#include <deque>
#include <memory>
#include <utility>

#include "trainmem/backend/cuda/allocator.cuh"
#include "trainmem/core/dtype.hpp"
#include "trainmem/core/memory_stats.hpp"
#include "trainmem/core/shape.hpp"

namespace trainmem::cuda {

namespace runtime {
class OffloadEngine;

/// Whether `event`'s work has completed; never leaves cudaErrorNotReady as the last error.
inline bool event_complete(cudaEvent_t event) {
  const cudaError_t status = cudaEventQuery(event);
  if (status == cudaSuccess) return true;
  if (status == cudaErrorNotReady) {
    if (cudaPeekAtLastError() == cudaErrorNotReady) cudaGetLastError();
    return false;
  }
  throw_cuda_error(status, "cudaEventQuery(event)", __FILE__, __LINE__);
}
}  // namespace runtime

/// \brief A tensor's bytes in pinned host memory (see NOTE [Offload ordering]).
class HostCopy {
 public:
  HostCopy() = default;
  HostCopy(HostCopy&& other) noexcept { *this = std::move(other); }
  HostCopy& operator=(HostCopy&& other) noexcept;
  HostCopy(const HostCopy&) = delete;
  HostCopy& operator=(const HostCopy&) = delete;
  ~HostCopy() { release(); }

  bool defined() const { return engine_ != nullptr; }
  const Shape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  std::size_t bytes() const { return bytes_; }
  /// The category the tensor had on the device (fetch gives it back).
  MemCategory category() const { return category_; }
  /// Whether every copy queued on this buffer so far has completed (does not block).
  bool ready() const { return event_ == nullptr || runtime::event_complete(event_); }
  /// The pinned bytes; read them only once ready() (or after a synchronize).
  const void* host_data() const { return host_; }

 private:
  friend class runtime::OffloadEngine;
  void release() noexcept;

  runtime::OffloadEngine* engine_ = nullptr;
  void* host_ = nullptr;
  std::size_t bytes_ = 0;
  Shape shape_;
  DType dtype_ = DType::F32;
  MemCategory category_ = MemCategory::SavedActivation;
  cudaEvent_t event_ = nullptr;  // recorded after the last copy that touches host_
};

namespace runtime {

/// \brief The side stream, its events, and what must stay alive until they complete.
class OffloadEngine {
 public:
  OffloadEngine(Allocator& allocator, cudaStream_t main) : allocator_(allocator), main_(main) {
    TRAINMEM_CUDA_CHECK(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
  }
  ~OffloadEngine() {
    cudaStreamSynchronize(side_);
    drain();
    cudaStreamDestroy(side_);
  }
  OffloadEngine(const OffloadEngine&) = delete;
  OffloadEngine& operator=(const OffloadEngine&) = delete;

  cudaStream_t side_stream() const { return side_; }

  /// Starts copying `bytes` at `device_data` to pinned memory; `keep_alive` owns the source.
  HostCopy offload(const void* device_data, std::size_t bytes, Shape shape, DType dtype, MemCategory category,
                   std::shared_ptr<const void> keep_alive) {
    reclaim();
    void* host = allocator_.allocate_host(bytes);
    cudaEvent_t event = nullptr;
    try {
      event = new_event();
    } catch (...) {
      allocator_.deallocate_host(host, bytes);
      throw;
    }
    // From here the copy owns the buffer and the event; if a call below throws, its
    // destructor hands both back through release() like any other HostCopy.
    HostCopy copy;
    copy.engine_ = this;
    copy.host_ = host;
    copy.bytes_ = bytes;
    copy.shape_ = std::move(shape);
    copy.dtype_ = dtype;
    copy.category_ = category;
    copy.event_ = event;
    cudaEvent_t produced = new_event();
    TRAINMEM_CUDA_CHECK(cudaEventRecord(produced, main_));
    TRAINMEM_CUDA_CHECK(cudaStreamWaitEvent(side_, produced, 0));
    cudaEventDestroy(produced);  // released once its work completes
    if (bytes > 0) TRAINMEM_CUDA_CHECK(cudaMemcpyAsync(copy.host_, device_data, bytes, cudaMemcpyDeviceToHost, side_));
    TRAINMEM_CUDA_CHECK(cudaEventRecord(copy.event_, side_));
    cudaEvent_t copied = new_event();
    TRAINMEM_CUDA_CHECK(cudaEventRecord(copied, side_));
    pending_.push_back({copied, std::move(keep_alive), nullptr, 0, false});
    return copy;
  }

  /// Queues the copy of `copy` into `device_data` (allocated on the main stream just before).
  void fetch_into(HostCopy& copy, void* device_data) {
    detail::check(copy.engine_ == this, "fetch: the HostCopy is ", copy.defined() ? "from another backend" : "empty");
    reclaim();
    cudaEvent_t allocated = new_event();
    TRAINMEM_CUDA_CHECK(cudaEventRecord(allocated, main_));
    TRAINMEM_CUDA_CHECK(cudaStreamWaitEvent(side_, allocated, 0));
    cudaEventDestroy(allocated);
    if (copy.bytes_ > 0)
      TRAINMEM_CUDA_CHECK(cudaMemcpyAsync(device_data, copy.host_, copy.bytes_, cudaMemcpyHostToDevice, side_));
    TRAINMEM_CUDA_CHECK(cudaEventRecord(copy.event_, side_));
    TRAINMEM_CUDA_CHECK(cudaStreamWaitEvent(main_, copy.event_, 0));
  }

  /// Takes back a HostCopy's buffer once its last copy completes (called by ~HostCopy).
  void release(void* host, std::size_t bytes, cudaEvent_t last_use) noexcept {
    if (last_use == nullptr) {  // no copy was ever queued on the buffer
      allocator_.deallocate_host(host, bytes);
      return;
    }
    try {
      pending_.push_back({last_use, nullptr, host, bytes, true});
    } catch (...) {
      cudaEventSynchronize(last_use);
      cudaEventDestroy(last_use);
      allocator_.deallocate_host(host, bytes);
    }
  }

  /// Drops every pending entry whose copy has completed.
  void reclaim() {
    while (!pending_.empty() && event_complete(pending_.front().done)) {
      finish(pending_.front());
      pending_.pop_front();
    }
  }
  /// The main stream waits for every copy out queued so far; their sources are let go now,
  /// so their bytes return to the pool in main-stream order, after the copies have read
  /// them. Released pinned buffers still wait for their events (the host reuses them).
  void release_sources() {
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->owns_host) {
        ++it;
        continue;
      }
      TRAINMEM_CUDA_CHECK(cudaStreamWaitEvent(main_, it->done, 0));
      finish(*it);
      it = pending_.erase(it);
    }
  }
  /// Number of copies or buffers still waiting for the side stream.
  std::size_t pending() const { return pending_.size(); }

  void synchronize() {
    allocator_.synchronize(side_);
    reclaim();
  }

 private:
  struct Pending {
    cudaEvent_t done;
    std::shared_ptr<const void> keep_alive;  // the offloaded tensor's storage
    void* host;                              // a released pinned buffer, when owns_host
    std::size_t host_bytes;
    bool owns_host;
  };

  static cudaEvent_t new_event() {
    cudaEvent_t event = nullptr;
    TRAINMEM_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    return event;
  }
  void finish(Pending& entry) noexcept {
    cudaEventDestroy(entry.done);
    entry.keep_alive.reset();
    if (entry.owns_host) allocator_.deallocate_host(entry.host, entry.host_bytes);
  }
  void drain() noexcept {
    for (Pending& entry : pending_) finish(entry);
    pending_.clear();
  }

  Allocator& allocator_;
  cudaStream_t main_;
  cudaStream_t side_ = nullptr;
  std::deque<Pending> pending_;
};

}  // namespace runtime

inline HostCopy& HostCopy::operator=(HostCopy&& other) noexcept {
  if (this != &other) {
    release();
    engine_ = std::exchange(other.engine_, nullptr);
    host_ = std::exchange(other.host_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    shape_ = std::move(other.shape_);
    dtype_ = other.dtype_;
    category_ = other.category_;
    event_ = std::exchange(other.event_, nullptr);
  }
  return *this;
}

inline void HostCopy::release() noexcept {
  if (engine_ == nullptr) return;
  engine_->release(host_, bytes_, event_);
  engine_ = nullptr;
  host_ = nullptr;
  event_ = nullptr;
}

}  // namespace trainmem::cuda
