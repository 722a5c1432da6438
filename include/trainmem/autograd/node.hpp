// trainmem/autograd/node.hpp — one recorded op: its backward and where grads go.
//
// A Node is an op's backward closure (micrograd style: forward computed the outputs,
// the closure computes input gradients from output gradients and what was saved)
// plus one Edge per input saying where that input's gradient goes: into the node that
// produced it, into a leaf's .grad (+=), or nowhere. The closure owns the op's
// SavedTensors; releasing the node destroys them, which is how backward frees memory
// as it goes.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "trainmem/autograd/op_identity.hpp"
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
};

/// \brief Where one input's gradient goes.
template <class B>
struct Edge {
  Node<B>* node = nullptr;            // producer of the input, or
  int output = 0;                     //   which of its outputs
  std::shared_ptr<GradSlot<B>> leaf;  // the leaf to accumulate into
  DType dtype = DType::F32;           // the input's dtype: its gradient is cast to it
  bool wants_grad() const { return node != nullptr || leaf != nullptr; }
};

template <class B>
using Grads = std::vector<Tensor<B>>;

template <class B>
struct Node {
  const OpIdentity* op = nullptr;
  std::vector<Edge<B>> inputs;
  std::vector<DType> output_dtypes;
  std::vector<Shape> output_shapes;
  /// Input gradients (one per input, undefined where none) from output gradients.
  std::function<Grads<B>(const Grads<B>&)> backward;
  bool released = false;

  void release() {
    backward = nullptr;
    released = true;
  }
};

}  // namespace trainmem
