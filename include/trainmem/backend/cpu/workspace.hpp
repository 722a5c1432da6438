// trainmem/backend/cpu/workspace.hpp — a GEMM's scratch memory, held for one call.
//
// Workspaces come from the tracked allocator, so MemoryStats shows them as workspace
// while a GEMM runs and not after, and the allocator's per-size cache hands the same
// blocks back to the next GEMM of a training loop.
#pragma once

#include <cstddef>

#include "trainmem/backend/cpu/allocator.hpp"

namespace trainmem::cpu::kernels {

/// \brief count elements of T from the tracked allocator for one GEMM call (none for 0).
template <class T>
class Workspace {
 public:
  Workspace(Allocator& allocator, std::size_t count)
      : allocator_(allocator),
        bytes_(count * sizeof(T)),
        data_(count ? static_cast<T*>(allocator.allocate(bytes_, MemCategory::Workspace)) : nullptr) {}
  ~Workspace() { allocator_.deallocate(data_, bytes_, MemCategory::Workspace); }
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  T* get() const { return data_; }

 private:
  Allocator& allocator_;
  std::size_t bytes_;
  T* data_;
};

}  // namespace trainmem::cpu::kernels
