// trainmem/backend/cuda/launch.cuh — what every launcher shares: stream, grid size, scratch.
//
// Launchers take a KernelContext (the backend's stream, the device's multiprocessor
// count, the allocator) and size grids with `blocks_for`: enough blocks to cover the
// work, capped at a few waves, with kernels looping grid-stride over the rest, so a
// grid never exceeds the hardware limit and the reductions that depend on the grid
// size stay deterministic on a given device. Scratch memory a kernel needs (partial
// sums, sort buffers) comes from the tracked allocator as Temporary bytes and is freed
// in stream order, so MemoryStats sees it too.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "trainmem/backend/cuda/allocator.cuh"

namespace trainmem::cuda::kernels {

/// Threads per block for element-wise and row kernels.
inline constexpr int kThreads = 256;

/// An index a kernel found outside its range (a cross-entropy label, an embedding id).
/// The first thread to find one claims the record; the backend reads the records when it
/// next waits for its stream and raises them as trainmem::Error (cuda::Backend, NOTE
/// [Checks without a host wait]). 0 in `claimed` means nothing was found.
struct BadIndex {
  unsigned long long claimed;
  long long position, value, extent;
};
/// Which record a check writes.
enum class IndexCheck : int { CrossEntropyLabel = 0, EmbeddingId = 1, kCount = 2 };

struct KernelContext {
  cudaStream_t stream;
  int sm_count;
  Allocator* allocator;
  BadIndex* bad_indices;  // IndexCheck::kCount records on the device
};

/// Blocks of kThreads threads covering `items` work items of `per_thread` each, at most 32 per SM.
inline unsigned blocks_for(const KernelContext& ctx, std::int64_t items, std::int64_t per_thread = 1) {
  const std::int64_t per_block = static_cast<std::int64_t>(kThreads) * per_thread;
  const std::int64_t needed = (items + per_block - 1) / per_block;
  const std::int64_t cap = static_cast<std::int64_t>(ctx.sm_count) * 32;
  return static_cast<unsigned>(std::clamp<std::int64_t>(needed, 1, cap));
}

/// \brief Temporary device memory for one launcher call, freed in stream order.
class ScratchBuffer {
 public:
  ScratchBuffer(const KernelContext& ctx, std::size_t bytes)
      : allocator_(ctx.allocator), bytes_(bytes), data_(allocator_->allocate(bytes, MemCategory::Temporary)) {}
  ~ScratchBuffer() { allocator_->deallocate(data_, bytes_, MemCategory::Temporary); }
  ScratchBuffer(const ScratchBuffer&) = delete;
  ScratchBuffer& operator=(const ScratchBuffer&) = delete;

  template <class T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  std::size_t bytes() const { return bytes_; }

 private:
  Allocator* allocator_;
  std::size_t bytes_;
  void* data_;
};

namespace device {
/// Index of this thread in a 1-D grid, and the grid's stride, as 64-bit values.
__device__ __forceinline__ std::int64_t global_thread() {
  return static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ std::int64_t grid_stride() { return static_cast<std::int64_t>(gridDim.x) * blockDim.x; }

/// Records `value` at `position` as outside [0, extent) unless an earlier report claimed the record.
__device__ inline void report_bad_index(BadIndex* record, long long position, long long value, long long extent) {
  if (atomicCAS(&record->claimed, 0ull, 1ull) == 0ull) {
    record->position = position;
    record->value = value;
    record->extent = extent;
  }
}
}  // namespace device

/// Threads per block for a kernel that gives each row one block: a multiple of 32 that
/// gives each thread about four elements, between 32 and 512.
inline unsigned row_block_threads(std::int64_t cols) {
  std::int64_t threads = 32;
  while (threads < 512 && threads * 4 < cols) threads *= 2;
  return static_cast<unsigned>(threads);
}

/// Grid for row kernels: one block per row, rows beyond 2^20 handled grid-stride.
inline unsigned row_blocks(std::int64_t rows) {
  return static_cast<unsigned>(std::clamp<std::int64_t>(rows, 1, std::int64_t{1} << 20));
}

}  // namespace trainmem::cuda::kernels
