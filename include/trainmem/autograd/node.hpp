// trainmem/autograd/node.hpp — one recorded op: its backward and where grads go.
//
// A Node is an op's backward closure (micrograd style: forward computed the output,
// the closure computes input gradients from the output's gradient and what was saved)
// plus one Edge per input saying where that input's gradient goes: into the node that
// produced it, into a leaf's .grad (+=), or nowhere. The closure owns the op's
// SavedTensors; releasing the node destroys them, which is how backward frees memory
// as it goes. During backward the node also holds its output's gradient while the
// contributions to it are summed, so the walk keeps no table of its own.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string_view>

#include "trainmem/autograd/op_identity.hpp"
#include "trainmem/autograd/op_times.hpp"
#include "trainmem/core/small_vector.hpp"
#include "trainmem/core/tensor.hpp"

namespace trainmem {

template <class B>
struct Node;

/// \brief The gradient of a leaf (a parameter, or an input that requires grad), and
/// what to call once a backward has made it final (Var::set_grad_ready_hook).
template <class B>
struct GradSlot {
  Tensor<B> grad;
  std::function<void()> on_ready;
  bool incomplete = false;  // a backward that reached this leaf failed part way (until zero_grad)
  /// Holds contributions that passed a node which scales gradients (a loss scaler's):
  /// still multiplied by that scale, until unscaled or zero_grad (NOTE [Scaled gradients]).
  bool scaled = false;
  /// Contributions are summed into an f32 .grad whatever the leaf's dtype (a 16-bit model
  /// copy's "main grad": Var::set_grad_in_f32, amp::MasterWeightsOptions::fp32_grads).
  bool in_f32 = false;
};

/// \brief Where one input's gradient goes.
template <class B>
struct Edge {
  Node<B>* node = nullptr;            // the node that produced the input, or
  std::shared_ptr<GradSlot<B>> leaf;  // the leaf to accumulate into
  DType dtype = DType::F32;           // the input's dtype: its gradient is cast to it
  bool wants_grad() const { return node != nullptr || leaf != nullptr; }
};

/// Gradients, one per input of an op (undefined where none); inline up to three.
template <class B>
using Grads = SmallVector<Tensor<B>, 3>;

/// \brief A recorded op: one output, and its backward (held by NodeWith<B, F>).
template <class B>
struct Node {
  const OpIdentity* op = nullptr;
  SmallVector<Edge<B>, 3> inputs;
  /// The output's gradient as backward sums it up (defined while this node waits to
  /// run); moved out when it runs.
  Tensor<B> grad;
  bool released = false;
  /// The gradients this node hands down are multiplied by a factor the host does not
  /// know (GradScaler::scale's product): leaves reached through it get GradSlot::scaled.
  bool scales_gradients = false;

  virtual ~Node() = default;
  /// Input gradients (one per input, undefined where none) from the output's gradient g[0].
  virtual Grads<B> backward(const Grads<B>& g) = 0;
  /// Drops the backward closure and the SavedTensors it owns.
  virtual void release() { released = true; }
};

/// \brief A Node whose backward is `F`, in the same allocation as the node.
template <class B, class F>
struct NodeWith final : Node<B> {
  template <class G>
  explicit NodeWith(G&& fn) : backward_fn(std::in_place, std::forward<G>(fn)) {}
  Grads<B> backward(const Grads<B>& g) override {
    typename OpTimes<B>::Scope timing(this->op != nullptr ? this->op->name : std::string_view("?"), true);
    return (*backward_fn)(g);
  }
  void release() override {
    backward_fn.reset();
    this->released = true;
  }
  std::optional<F> backward_fn;
};

}  // namespace trainmem
