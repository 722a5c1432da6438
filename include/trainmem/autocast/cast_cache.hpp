// trainmem/autocast/cast_cache.hpp — each parameter is cast to the autocast dtype once.
//
// Under autocast a bf16 matmul needs a bf16 copy of an f32 weight. The copy is made
// once per (parameter, version, dtype) and reused by every op and by checkpoint
// recompute; an optimizer step bumps the parameter's version, so the next lookup
// recasts. The cache is per thread and per backend; `clear()` drops every entry and
// starts a new generation (a checkpoint region records the generation it saw).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <utility>

#include "trainmem/core/tensor.hpp"

namespace trainmem::amp {

template <class B>
class CastCache {
 public:
  /// The thread's cache for backend B.
  static CastCache& instance() {
    thread_local CastCache cache;
    return cache;
  }

  /// `source` cast to `dtype`, made now or reused (`source` itself when it is `dtype`
  /// already). Cached copies count as parameters.
  Tensor<B> get(const Tensor<B>& source, DType dtype) {
    if (source.dtype() == dtype) return source;  // caching it would keep the parameter alive
    const Key key{source.data(), dtype};
    auto it = entries_.find(key);
    if (it != entries_.end()) {
      const Entry& entry = it->second;
      if (!entry.source.expired() && entry.version == source.version() && entry.cast.shape() == source.shape())
        return entry.cast;
      entries_.erase(it);
    }
    drop_expired();
    Tensor<B> cast = source.to(dtype, MemCategory::Parameter);
    entries_.emplace(key, Entry{source.storage(), source.version(), cast});
    ++casts_made_;
    return cast;
  }

  /// The address of the tensor `cast` is a cached copy of, or null when it is none.
  const void* source_of(const Tensor<B>& cast) const {
    for (const auto& [key, entry] : entries_)
      if (entry.cast.same_storage(cast)) return key.first;
    return nullptr;
  }

  /// Drops the copies whose source is gone (a released ZeRO-3 unit's weights), which a
  /// lookup would otherwise drop only at the next miss.
  void drop_expired() {
    std::erase_if(entries_, [](const auto& kv) { return kv.second.source.expired(); });
  }

  void clear() {
    entries_.clear();
    ++generation_;
  }
  std::uint64_t generation() const { return generation_; }
  std::size_t size() const { return entries_.size(); }
  /// How many casts were made (not reused) since the cache was created.
  std::uint64_t casts_made() const { return casts_made_; }

 private:
  using Key = std::pair<const void*, DType>;
  struct Entry {
    std::weak_ptr<Storage<B>> source;
    std::uint64_t version;
    Tensor<B> cast;
  };
  std::map<Key, Entry> entries_;
  std::uint64_t generation_ = 0;
  std::uint64_t casts_made_ = 0;
};

}  // namespace trainmem::amp
