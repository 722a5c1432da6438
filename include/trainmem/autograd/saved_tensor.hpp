// trainmem/autograd/saved_tensor.hpp — the one seam through which ops keep tensors.
//
// NOTE [Saved tensors]
// An op that needs a tensor in backward saves it here, never by capturing a Tensor.
// With no hook active, packing keeps the tensor, and its bytes count as a saved
// activation for as long as something keeps them (SavedRef). Inside a checkpoint region the region's SaveHook packs
// instead: it keeps nothing (a placeholder naming a slot of the region), keeps what its policy says to keep, or
// offloads. Unpacking a placeholder asks the region, which recomputes its forward once and hands out slot after slot.
// No op knows about checkpointing.
//
// A saved tensor remembers the version of its storage. If the storage was written in
// place after the save (an optimizer step, a user's copy_from), unpack throws instead
// of handing backward a value that is not the one forward used.
//
// An op that needs the f32 widening of a 16-bit input (an FP32-category op under
// autocast: layer norm, cross-entropy) saves the 16-bit original with `widened_to`:
// widening is exact, so unpack widens again and backward sees the same bits, while the
// step keeps half the bytes.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "trainmem/autograd/op_identity.hpp"
#include "trainmem/core/tensor.hpp"

namespace trainmem {

/// What a pack hook learns about a tensor being saved.
struct SaveInfo {
  const OpIdentity* op;   // the op saving it
  std::int64_t op_index;  // the op's ordinal under the active hook (-1 if none)
  std::size_t bytes;      // size of the tensor
  double flops;           // the op's estimated forward FLOPs
};

template <class B>
class SavedTensor;
template <class B>
struct VarImpl;

/// \brief Holds a tensor for backward and counts its bytes as a saved activation meanwhile.
///
/// A value: every copy is one more keeper of the bytes (the storage counts its keepers),
/// and the bytes stop counting as saved when the last keeper goes. An empty SavedRef
/// keeps nothing.
template <class B>
class SavedRef {
 public:
  SavedRef() = default;
  explicit SavedRef(Tensor<B> tensor) : tensor_(std::move(tensor)) { add_keeper(); }
  SavedRef(const SavedRef& other) : tensor_(other.tensor_) { add_keeper(); }
  SavedRef(SavedRef&& other) noexcept : tensor_(std::move(other.tensor_)) {}
  SavedRef& operator=(SavedRef other) noexcept {
    std::swap(tensor_, other.tensor_);
    return *this;
  }
  ~SavedRef() {
    if (tensor_.defined()) tensor_.storage()->drop_saved_ref();
  }

  bool holds() const { return tensor_.defined(); }
  const Tensor<B>& tensor() const { return tensor_; }

 private:
  void add_keeper() {
    if (tensor_.defined()) tensor_.storage()->add_saved_ref();
  }

  Tensor<B> tensor_;
};

/// \brief Hands back a placeholder's tensor (implemented by checkpoint regions).
template <class B>
class Unpacker {
 public:
  virtual ~Unpacker() = default;
  virtual Tensor<B> unpack(std::int64_t slot, const SavedTensor<B>& placeholder) = 0;
};

/// \brief A tensor kept for backward: held, or a placeholder a region fills on demand.
template <class B>
class SavedTensor {
 public:
  SavedTensor() = default;

  /// Keeps `tensor`; while kept, a temporary's bytes count as a saved activation.
  static SavedTensor keep(const Tensor<B>& tensor, std::string_view op) {
    SavedTensor saved(op, tensor);
    saved.kept_ = SavedRef<B>(tensor);
    return saved;
  }
  /// A placeholder for slot `slot` of `unpacker`; holds no bytes.
  static SavedTensor placeholder(const Tensor<B>& tensor, std::string_view op, std::shared_ptr<Unpacker<B>> unpacker,
                                 std::int64_t slot) {
    SavedTensor saved(op, tensor);
    saved.unpacker_ = std::move(unpacker);
    saved.slot_ = slot;
    if (tensor.defined()) saved.placeholder_storage_ = tensor.storage();
    return saved;
  }

  /// This saved tensor, handed back by unpack in `dtype`: for a narrower original of a
  /// tensor an op used widened (exact, so backward sees the same values).
  SavedTensor widened_to(DType dtype) && {
    unpack_as_ = dtype;
    return std::move(*this);
  }

  bool defined() const { return kept_.holds() || unpacker_ != nullptr; }
  /// Whether this holds its tensor (kept), not a placeholder's slot.
  bool holds_tensor() const { return kept_.holds(); }
  std::string_view op() const { return op_; }

  /// The saved value; throws if its storage was modified in place since the save.
  Tensor<B> unpack() const {
    detail::check(defined(), "SavedTensor::unpack: nothing was saved (op ", op_, ")");
    if (kept_.holds()) {
      check_version(kept_.tensor().version());
      return unpack_as_ ? kept_.tensor().to(*unpack_as_) : kept_.tensor();
    }
    // The forward's tensor, if anything still keeps it, must not have changed either.
    if (auto storage = placeholder_storage_.lock()) check_version(storage->version());
    const Tensor<B> value = unpacker_->unpack(slot_, *this);
    return unpack_as_ ? value.to(*unpack_as_) : value;
  }

 private:
  SavedTensor(std::string_view op, const Tensor<B>& tensor)
      : op_(op), version_(tensor.defined() ? tensor.version() : 0) {}

  void check_version(std::uint64_t now) const {
    detail::check(now == version_, op_,
                  ": a tensor saved for backward was modified in place after it was saved (version ", version_,
                  " at save, ", now, " now); backward would use the wrong value");
  }

  std::string_view op_;
  SavedRef<B> kept_;                       // the tensor, when kept; or
  std::shared_ptr<Unpacker<B>> unpacker_;  // the region that fills placeholder slot_
  std::int64_t slot_ = -1;
  std::weak_ptr<Storage<B>> placeholder_storage_;  // the forward's tensor, to check its version
  std::optional<DType> unpack_as_;                 // set by widened_to
  std::uint64_t version_ = 0;
};

/// \brief The pack side of the seam, plus the op-level replay a region needs.
///
/// Pushed on a tape by a checkpoint region. Every op recorded while a hook is active
/// calls begin_op, may reuse outputs the hook kept (selective recompute), reports its
/// outputs, and packs what it saves through the hook.
template <class B>
class SaveHook {
 public:
  virtual ~SaveHook() = default;
  /// Called at each op entry; returns the op's ordinal under this hook.
  virtual std::int64_t begin_op(const OpIdentity& op) = 0;
  /// Outputs kept from the forward for this op, to use instead of computing; or null.
  virtual const std::vector<Tensor<B>>* reuse_outputs(std::int64_t op_index) = 0;
  /// The op's outputs, once computed (a policy may keep them).
  virtual void on_outputs(std::int64_t op_index, const OpIdentity& op, double flops,
                          std::span<const Tensor<B>> outputs) = 0;
  /// Decides how a tensor an op needs in backward is kept.
  virtual SavedTensor<B> pack(const Tensor<B>& tensor, const SaveInfo& info) = 0;
  /// Whether this hook replays a region's forward (a recompute): its saves fill the
  /// region's slots, and the one that fills the last slot ends the recompute.
  virtual bool replaying() const { return false; }
  /// checkpoint_name(x, name) while this hook is active. A hook that keeps nothing by
  /// name (a recompute replaying what its forward decided) ignores it.
  virtual void name_tensor(const VarImpl<B>& x, std::string_view name) {
    (void)x;
    (void)name;
  }
};

}  // namespace trainmem
