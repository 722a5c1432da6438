// trainmem/autograd/var.hpp — a value on a tape, with what backward needs to know.
//
// A Var is a shared handle: copies refer to the same value. An op output knows the
// Node that made it (grad_fn); a leaf that requires grad (a parameter, or an input
// marked so) owns a GradSlot that backward accumulates into with +=. Parameters
// belong to no tape and can be used on any; every other Var belongs to one tape.
//
// A Var also remembers which life of its tape it belongs to: the tape's generation
// (bumped by tape.clear(), which frees the nodes Vars point to) and whether the tape
// still exists. Every use that reaches the tape (an op, backward, Var::tape()) checks
// both, so a Var kept across clear() or past its tape is an Error, not a read of freed
// memory. Reading a stale Var's value is fine: the Var owns its tensor.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "trainmem/autograd/node.hpp"
#include "trainmem/autograd/saved_tensor.hpp"

namespace trainmem {

template <class B>
class Tape;

namespace detail {
/// A tape's life as its Vars see it: clear() bumps the generation, the destructor sets destroyed.
struct TapeLife {
  std::uint64_t generation = 0;
  bool destroyed = false;
};
}  // namespace detail

template <class B>
struct VarImpl {
  Tensor<B> value;
  Tape<B>* tape = nullptr;
  std::shared_ptr<const detail::TapeLife> tape_life;  // set with tape (Tape::adopt)
  std::uint64_t tape_generation = 0;                  // the tape's generation when this Var was made
  Node<B>* grad_fn = nullptr;
  bool requires_grad = false;
  std::shared_ptr<GradSlot<B>> grad_slot;  // leaves that require grad
  SaveHook<B>* hook = nullptr;             // the hook active when this value was made
  std::int64_t op_index = -1;              // ... and the producing op's ordinal under it
  std::string name;

  /// `value` in `dtype` for an op under autocast: one cast, shared by every op that
  /// casts this value to `dtype` while one of them still keeps it (three projections of
  /// one activation save one bf16 copy, not three). The memo holds the casts weakly, so
  /// it keeps no bytes alive; an in-place write to the value makes it cast again.
  Tensor<B> cast_to(DType dtype) const {
    for (const CastMemo& m : casts)
      if (m.dtype == dtype && m.source_version == value.version()) {
        Tensor<B> cast = m.cast.lock();
        if (cast.defined() && cast.version() == m.cast_version) return cast;
      }
    Tensor<B> cast = value.to(dtype);
    std::erase_if(casts, [&](const CastMemo& m) { return m.dtype == dtype || !m.cast.lock().defined(); });
    casts.push_back(CastMemo{dtype, value.version(), typename Tensor<B>::Weak(cast), cast.version()});
    return cast;
  }

  /// The tape (null for a parameter), after checking it was neither cleared nor destroyed
  /// since this Var was made; `who` names the caller in the error.
  Tape<B>* checked_tape(std::string_view who) const {
    if (tape == nullptr || tape_life == nullptr) return tape;
    if (!tape_life->destroyed && tape_life->generation == tape_generation) return tape;  // every op's path: no message
    const std::string what = name.empty() ? std::string("a Var ") + value.shape().str() : "Var '" + name + "'";
    detail::check(!tape_life->destroyed, who, ": ", what,
                  " belongs to a tape that was destroyed; a Var must not outlive its tape");
    detail::check(tape_life->generation == tape_generation, who, ": ", what,
                  " was made before its tape was cleared (tape.clear() freed its graph); make it again in this step");
    return tape;
  }

 private:
  struct CastMemo {
    DType dtype;
    std::uint64_t source_version;
    typename Tensor<B>::Weak cast;
    std::uint64_t cast_version;
  };
  mutable std::vector<CastMemo> casts;
};

/// \brief A tensor value in the autograd graph.
template <class B>
class Var {
 public:
  Var() = default;
  explicit Var(std::shared_ptr<VarImpl<B>> impl) : impl_(std::move(impl)) {}

  /// A trainable leaf on no tape. Its storage is re-tagged as a parameter.
  static Var parameter(Tensor<B> value, std::string name = {}) {
    detail::check(value.defined() && is_floating(value.dtype()), "Var::parameter: '", name,
                  "' needs a defined floating tensor");
    if (value.category() != MemCategory::Parameter) value.storage()->retag(MemCategory::Parameter);
    auto impl = std::make_shared<VarImpl<B>>();
    impl->value = std::move(value);
    impl->requires_grad = true;
    impl->grad_slot = std::make_shared<GradSlot<B>>();
    impl->name = std::move(name);
    return Var(std::move(impl));
  }

  bool defined() const { return impl_ != nullptr; }
  const Tensor<B>& value() const { return impl().value; }
  const Shape& shape() const { return impl().value.shape(); }
  DType dtype() const { return impl().value.dtype(); }
  std::int64_t numel() const { return impl().value.numel(); }
  bool requires_grad() const { return impl().requires_grad; }
  bool is_leaf() const { return impl().grad_fn == nullptr; }
  /// Its tape (null for a parameter); an Error if that tape was cleared or destroyed since.
  Tape<B>* tape() const { return impl().checked_tape("Var::tape"); }
  const std::string& name() const { return impl().name; }
  /// The single element of a one-element Var (a loss, any shape with numel 1), widened to
  /// double: `loss.item()`. Downloads it (a device sync on the GPU). An Error names the
  /// shape when the Var has more or fewer than one element.
  double item() const {
    detail::check(numel() == 1, "Var::item: ", name().empty() ? std::string("the Var") : "'" + name() + "'",
                  " has shape ", shape(), " (", numel(), " elements); item() needs exactly one element");
    return value().template to_host<double>()[0];
  }
  VarImpl<B>& impl() const {
    detail::check(impl_ != nullptr, "Var: use of an undefined Var");
    return *impl_;
  }
  const std::shared_ptr<VarImpl<B>>& handle() const { return impl_; }

  /// Accumulated gradient of a leaf (undefined before the first backward reaching it).
  const Tensor<B>& grad() const {
    detail::check(impl().grad_slot != nullptr, "Var::grad: '", impl().name,
                  "' is not a leaf that requires grad (only leaves accumulate .grad)");
    return impl().grad_slot->grad;
  }
  /// Replaces the gradient (the loss scaler writes unscaled grads, ZeRO reduced shards).
  /// It keeps the marks of a failed backward (grad_incomplete) and of a scaled loss
  /// (grad_scaled): a replacement made from such a gradient is one too.
  void set_grad(Tensor<B> grad) const {
    detail::check(impl().grad_slot != nullptr, "Var::set_grad: '", impl().name, "' is not a leaf that requires grad");
    impl().grad_slot->grad = std::move(grad);
  }
  /// With `on`, backward sums this leaf's gradient in an f32 .grad even when the value is
  /// 16-bit (NOTE [Gradients summed in f32] in autograd/tape.hpp): every contribution is
  /// widened to f32 and added there, so micro-batches accumulate without rounding to 16
  /// bits at each add (Megatron's "main grad"). The .grad counts as MemCategory::Gradient,
  /// 4 bytes per element. Only while .grad is undefined (after zero_grad).
  void set_grad_in_f32(bool on) const {
    detail::check(impl().grad_slot != nullptr, "Var::set_grad_in_f32: '", impl().name,
                  "' is not a leaf that requires grad");
    detail::check(!impl().grad_slot->grad.defined() || impl().grad_slot->in_f32 == on, "Var::set_grad_in_f32: '",
                  impl().name, "' holds a ", impl().grad_slot->grad.dtype(),
                  " gradient already; call zero_grad() before changing where gradients are summed");
    detail::check(!on || dtype() != DType::F64, "Var::set_grad_in_f32: '", impl().name,
                  "' is f64; summing its gradient in f32 would round it (for 16-bit or f32 leaves)");
    impl().grad_slot->in_f32 = on;
  }
  /// Whether backward sums .grad in f32 (set_grad_in_f32).
  bool grad_in_f32() const { return impl().grad_slot != nullptr && impl().grad_slot->in_f32; }
  /// The dtype backward makes .grad in: f32 under set_grad_in_f32, else the value's.
  DType grad_dtype() const { return grad_in_f32() ? DType::F32 : dtype(); }
  void zero_grad() const {
    if (!impl().grad_slot) return;
    impl().grad_slot->grad = Tensor<B>();
    impl().grad_slot->incomplete = false;
    impl().grad_slot->scaled = false;
  }
  /// Whether a backward that reached this leaf failed part way: its .grad then holds some
  /// of that backward's contributions and not others. Optimizers refuse such a gradient;
  /// only zero_grad() clears the mark.
  bool grad_incomplete() const { return impl().grad_slot != nullptr && impl().grad_slot->incomplete; }
  /// Marks .grad incomplete until zero_grad: for a gradient made from a partial one that
  /// set_grad did not replace, e.g. averaged with a rank whose backward failed.
  void mark_grad_incomplete() const {
    detail::check(impl().grad_slot != nullptr, "Var::mark_grad_incomplete: '", impl().name,
                  "' is not a leaf that requires grad");
    impl().grad_slot->incomplete = true;
  }
  /// Whether .grad is still multiplied by a loss scale: a backward from
  /// amp::GradScaler::scale(loss) reached it and nothing divided it since (NOTE [Scaled
  /// gradients] in tape.hpp). Optimizers refuse such a gradient unless their step divides it.
  bool grad_scaled() const { return impl().grad_slot != nullptr && impl().grad_slot->scaled; }
  /// Sets or clears the mark: GradScaler::unscale_ clears it once it has divided the
  /// gradient; code that moves a scaled gradient elsewhere sets it there.
  void set_grad_scaled(bool scaled) const {
    detail::check(impl().grad_slot != nullptr, "Var::set_grad_scaled: '", impl().name,
                  "' is not a leaf that requires grad");
    impl().grad_slot->scaled = scaled;
  }
  /// `hook` runs during each backward that reaches this leaf, right after the last
  /// contribution to its .grad: from then on this backward does not touch the gradient
  /// again, so it may be read, sent or freed while backward goes on (data parallelism
  /// reduces gradients this way). One hook per leaf; an empty function removes it. The
  /// hook must leave the tape alone: tape.clear(), an op recorded onto it or another
  /// backward of it is an Error there (NOTE [The tape during backward], autograd/tape.hpp).
  void set_grad_ready_hook(std::function<void()> hook) const {
    detail::check(impl().grad_slot != nullptr, "Var::set_grad_ready_hook: '", impl().name,
                  "' is not a leaf that requires grad");
    detail::check(!hook || !impl().grad_slot->on_ready, "Var::set_grad_ready_hook: '", impl().name,
                  "' has a grad-ready hook already (remove it first: one hook per leaf)");
    impl().grad_slot->on_ready = std::move(hook);
  }
  bool has_grad_ready_hook() const { return impl().grad_slot && impl().grad_slot->on_ready; }

  /// Same as tape().backward(*this, ...).
  void backward(const Tensor<B>& seed = {}, bool retain_graph = false) const;

 private:
  std::shared_ptr<VarImpl<B>> impl_;
};

}  // namespace trainmem
