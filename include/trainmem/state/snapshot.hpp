// trainmem/state/snapshot.hpp — take the state of a run's objects now, put it back later, bitwise.
//
//   tmem::Snapshot before({model, masters, optimizer, scaler, tape});  // host copies, now
//   ... steps that must leave no trace (a profile, a trial step) ...
//   before.restore();                                                   // as it was, bit for bit
//
// A Snapshot takes `state_of` of every object (anything state_of accepts: Modules,
// optimizers, amp::MasterWeights, amp::GradScaler, a Tape or Generator, a StateDict of the
// caller's own, a Tensor or Var) and restore() puts it back with `load_state`, whose
// copies bump every tensor's version, so a cast cache recasts. It also keeps what a state
// leaves out because a run never saves it between steps: the gradients (.grad and its
// marks, or its absence) of the parameters of the Modules, optimizers and
// amp::MasterWeights given (and of a Var given that is a leaf requiring grad). The
// objects to pass are those a resumed run loads (trainmem::save's list): resume is bitwise,
// so restore is too. The copies are StateDicts, in host memory: no backend allocator
// counts them. The objects must outlive the snapshot.
#pragma once

#include <functional>
#include <initializer_list>
#include <type_traits>
#include <utility>
#include <vector>

#include "trainmem/autograd/var.hpp"
#include "trainmem/state/state_dict.hpp"
#include "trainmem/state/stateful.hpp"

namespace trainmem {

namespace detail {

/// One leaf's gradient as it was: absent, or its bytes, memory category and marks.
template <class B>
struct GradCopy {
  Var<B> param;
  bool defined = false;
  StateEntry value;
  MemCategory category = MemCategory::Gradient;
  bool incomplete = false, scaled = false;

  explicit GradCopy(Var<B> p) : param(std::move(p)) {
    const Tensor<B>& g = param.grad();
    defined = g.defined();
    if (defined) value = StateEntry::of(g), category = g.category();
    incomplete = param.grad_incomplete();
    scaled = param.grad_scaled();
  }
  void restore() const {
    if (!defined) {
      param.zero_grad();
      return;
    }
    Tensor<B> g = param.grad();  // written in place where it still fits (views of it stay valid)
    if (!g.defined() || g.shape() != value.shape || state_type_of(g.dtype()) != value.type)
      g = value.to_tensor(category, param.value().backend());
    else value.copy_to(g);
    param.zero_grad();  // clears the marks
    param.set_grad(g);
    if (incomplete) param.mark_grad_incomplete();
    param.set_grad_scaled(scaled);
  }
};

/// Calls f on every parameter `object` holds: a Module's parameters(), an optimizer's
/// entries()' params, amp::MasterWeights' params(), or a Var that is a leaf requiring grad.
template <class T, class F>
void for_each_parameter(T& object, F&& f) {
  if constexpr (requires { object.parameters(); }) {
    for (const auto& p : object.parameters()) f(p);
  } else if constexpr (requires { object.entries().front().param; }) {
    for (const auto& e : object.entries()) f(e.param);
  } else if constexpr (requires { object.params().front().grad(); }) {
    for (const auto& p : object.params()) f(p);
  } else if constexpr (requires {
                         object.is_leaf();
                         object.grad();
                       }) {
    if (object.requires_grad() && object.is_leaf()) f(object);
  }
}

}  // namespace detail

/// \brief A reference to an object whose state a Snapshot takes and puts back.
class SnapshotRef {
 public:
  template <class T>
  SnapshotRef(T& object) {  // NOLINT(google-explicit-constructor): a list of objects reads as one
    static_assert(!std::is_const_v<T>, "trainmem::Snapshot: a snapshot puts state back, so its objects are not const");
    take_ = [&object]() -> std::function<void()> {
      StateDict state = state_of(object);
      std::vector<std::function<void()>> grads;
      detail::for_each_parameter(
          object, [&grads](const auto& p) { grads.push_back([copy = detail::GradCopy(p)] { copy.restore(); }); });
      return [&object, state = std::move(state), grads = std::move(grads)] {
        load_state(object, state);
        for (const auto& g : grads) g();
      };
    };
  }
  /// Takes the object's state now; the function returned puts it back.
  std::function<void()> take() const { return take_(); }

 private:
  std::function<std::function<void()>()> take_;
};

/// \brief Host copies of some objects' states and their parameters' gradients, put back by restore().
class Snapshot {
 public:
  explicit Snapshot(const std::vector<SnapshotRef>& objects) {
    for (const SnapshotRef& o : objects) restore_.push_back(o.take());
  }
  Snapshot(std::initializer_list<SnapshotRef> objects) : Snapshot(std::vector<SnapshotRef>(objects)) {}

  /// Puts every object back as it was when the snapshot was taken (in the order given:
  /// each object's state, then its parameters' gradients); may be called again.
  void restore() const {
    for (const auto& r : restore_) r();
  }

 private:
  std::vector<std::function<void()>> restore_;
};

}  // namespace trainmem
