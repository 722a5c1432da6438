// trainmem/checkpoint/detail/determinism.hpp — what a region's recompute must reproduce.
//
// A recompute is only correct if it redoes the forward exactly, so a region records
// both ends of that promise: the state the forward started from (the ReplayState a
// recompute restores: RNG, autocast, cast-cache generation), and what each save of the
// forward looked like. The k-th save of every recompute (the first, and each one after a
// backward with retain_graph) is checked against the k-th record: op, shape and dtype
// always; by default also the values, through a backend fingerprint of every byte
// (core/fingerprint.hpp: a sum of position-keyed splitmix64 terms, so any one changed
// element is always seen and changes that cancel in a sum of values are not blind spots),
// taken once for each dropped tensor in the forward and once for each tensor a recompute
// brings back, no copy of the tensor (a tensor several ops save, as q, k and v projections
// save their input, is read once in each). The CUDA backend compares on the device and raises a
// mismatch at the next host wait, so the check adds no wait. On request a host checksum
// of every byte, or the bytes themselves. A mismatch is a CheckpointError naming both
// saves, never a gradient computed from the wrong tensor.
//
// NOTE [Capture by value]
// A region's fn runs again at backward time with whatever it captured. A lambda that
// captures by reference a variable the caller changes after the forward (a loop variable,
// a pointer to "the current block") recomputes something else: the same shapes, other
// values. Metadata cannot see that; the default fingerprint does, and its message names
// the likely cause.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "trainmem/checkpoint/detail/replay_state.hpp"
#include "trainmem/checkpoint/options.hpp"
#include "trainmem/error.hpp"

namespace trainmem {

namespace detail {

/// 64-bit FNV-1a over bytes.
inline std::uint64_t fnv1a(const std::vector<unsigned char>& bytes) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : bytes) h = (h ^ c) * 1099511628211ull;
  return h;
}
template <class B>
std::vector<unsigned char> host_bytes(const Tensor<B>& t) {
  std::vector<unsigned char> bytes(t.bytes());
  t.backend().download(bytes.data(), t.data(), t.bytes());
  return bytes;
}

/// \brief The replay state a region's forward started from, and every save it made.
template <class B>
class DeterminismRecord {
 public:
  DeterminismRecord(DeterminismCheck level, ReplayState<B> start) : level_(level), start_(std::move(start)) {}

  /// The state a recompute runs under.
  const ReplayState<B>& start() const { return start_; }
  /// Saves the forward made so far.
  std::size_t saves() const { return saves_.size(); }

  /// The forward saved `tensor` for op `op`: into slot `slot` of the region (a tensor
  /// the recompute brings back, whose values are recorded as the level asks), or -1
  /// (kept directly, so the recompute only has to match its metadata). The same tensor
  /// saved again, unchanged, refers to its first save's values instead of reading them again.
  void record(const Tensor<B>& tensor, std::string_view op, std::int64_t slot) {
    Save save{slot, tensor.shape(), tensor.dtype(), op, {}, 0, {}, -1};
    if (slot >= 0 && level_ != DeterminismCheck::Metadata) {
      const auto first = first_save_.find(tensor.data());
      if (first != first_save_.end() && seen_[first->second].is(tensor)) {
        save.same_as = static_cast<std::int64_t>(first->second);
      } else {
        first_save_[tensor.data()] = saves_.size();
        if (level_ == DeterminismCheck::Fingerprint) save.fingerprint = tensor.backend().fingerprint(tensor);
        if (level_ == DeterminismCheck::Checksum) save.checksum = fnv1a(host_bytes(tensor));
        if (level_ == DeterminismCheck::Bitwise) save.bytes = host_bytes(tensor);
      }
    }
    seen_.push_back(Seen::of(tensor));
    saves_.push_back(std::move(save));
  }

  /// Checks the k-th save of a recompute against the forward's; returns the slot it fills
  /// (-1: none). Saves come in order, k = 0, 1, ... in each recompute.
  std::int64_t verify(std::size_t k, const Tensor<B>& tensor, std::string_view op) {
    detail::check<CheckpointError>(k < saves_.size(), "checkpoint: recompute is not deterministic: op '", op,
                                   "' saved tensor #", k, " but the forward saved only ", saves_.size());
    const Save& r = saves_[k];
    detail::check<CheckpointError>(r.op == op && r.shape == tensor.shape() && r.dtype == tensor.dtype(),
                                   "checkpoint: recompute is not deterministic: saved tensor #", k, " was ", r.dtype,
                                   " ", r.shape, " from op '", r.op, "' in forward, but ", tensor.dtype(), " ",
                                   tensor.shape(), " from op '", op, "' in recompute");
    if (r.slot < 0 || level_ == DeterminismCheck::Metadata) return r.slot;
    // From here on seen_ describes this recompute's saves (k's predecessors are already theirs).
    const bool checked = r.same_as >= 0 && seen_[static_cast<std::size_t>(r.same_as)].is(tensor);
    seen_[k] = Seen::of(tensor);
    if (checked) return r.slot;  // the tensor of save same_as, whose bytes were just checked
    const Save& values = r.same_as >= 0 ? saves_[static_cast<std::size_t>(r.same_as)] : r;
    if (level_ == DeterminismCheck::Fingerprint)
      tensor.backend().check_fingerprint(
          tensor, values.fingerprint,
          detail::concat(
              "checkpoint: recompute is not deterministic: values of saved tensor #", k, " (op '", r.op, "', ", r.shape,
              ") differ from the forward (fingerprint). The region's function recomputed something else with the "
              "same shapes: most often a lambda that captures by reference ([&]) a variable changed after the forward "
              "(a loop variable, the current layer); capture it by value instead ([=], or [&layer = blocks[i]])"));
    if (level_ == DeterminismCheck::Checksum)
      detail::check<CheckpointError>(fnv1a(host_bytes(tensor)) == values.checksum,
                                     "checkpoint: recompute is not deterministic: values of saved tensor #", k,
                                     " (op '", r.op, "', ", r.shape, ") differ from the forward (checksum)");
    if (level_ == DeterminismCheck::Bitwise)
      detail::check<CheckpointError>(host_bytes(tensor) == values.bytes,
                                     "checkpoint: recompute is not deterministic: values of saved tensor #", k,
                                     " (op '", r.op, "', ", r.shape, ") differ bitwise from the forward");
    return r.slot;
  }

  /// Checks that a recompute run to the end saved as many tensors as the forward.
  void verify_complete(std::size_t recomputed) const {
    detail::check<CheckpointError>(recomputed == saves_.size(),
                                   "checkpoint: recompute is not deterministic: "
                                   "the forward saved ",
                                   saves_.size(), " tensors, the recompute ", recomputed);
  }

 private:
  struct Save {
    std::int64_t slot;  // -1: kept directly, not recomputed
    Shape shape;
    DType dtype;
    std::string_view op;
    typename B::Fingerprint fingerprint;  // DeterminismCheck::Fingerprint
    std::uint64_t checksum;               // DeterminismCheck::Checksum
    std::vector<unsigned char> bytes;
    std::int64_t same_as;  // an earlier save of the same, unchanged tensor, whose values these are; -1: none
  };
  /// Which tensor a save was: the same storage object, bytes and version are the same bytes.
  struct Seen {
    std::weak_ptr<Storage<B>> storage;
    const void* data = nullptr;
    std::size_t bytes = 0;
    std::uint64_t version = 0;
    static Seen of(const Tensor<B>& t) { return Seen{t.storage(), t.data(), t.bytes(), t.version()}; }
    bool is(const Tensor<B>& t) const {
      return data == t.data() && bytes == t.bytes() && version == t.version() && storage.lock() == t.storage();
    }
  };

  DeterminismCheck level_;
  ReplayState<B> start_;
  std::vector<Save> saves_;
  std::vector<Seen> seen_;  // per save: the forward's tensor, then the latest recompute's
  std::unordered_map<const void*, std::size_t> first_save_;  // data pointer -> the save that read its values
};

}  // namespace detail
}  // namespace trainmem
