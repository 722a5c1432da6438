// trainmem/autograd/tape.hpp — records the forward pass and runs backward.
//
// The tape owns every Node in the order ops ran, which is a topological order: an
// op's inputs were made before it. Backward walks the tape from the root's node down,
// handing each node the gradients that reached it, accumulating input gradients with
// +=, casting each gradient to its input's dtype (autocast ran the op in another), and
// releasing each node's saved tensors as soon as it has run unless retain_graph.
//
// The tape also carries what recompute must replay: the random generator that
// dropout draws from, and the stack of SaveHooks that checkpoint regions push (one
// `HookScope` each, so a throwing fn cannot leave a hook behind). A region's recompute
// records its nodes into a scratch list (`RecordInto`), never onto the tape.
//
// NOTE [When a leaf's gradient is final]
// A leaf with a grad-ready hook (Var::set_grad_ready_hook) is told the moment backward
// has made its gradient final, so data parallelism can send it while backward goes on.
// Before the walk, each edge into such a leaf from a node the root reaches counts as one
// contribution to come. The walk visits nodes newest first, a topological order, so a
// reachable node that the walk passes without gradients for it will never run: its
// contributions are dropped there. A count that reaches zero runs the hook; the leaves
// of nodes below where the walk stops run theirs at the end. Without hooks, none of
// this costs more than one pass over the edges.
//
// NOTE [The tape during backward]
// Backward walks the tape's node list, and what it calls may run user code: a grad-ready
// hook, a checkpoint region's recompute. That code must not change the list under the
// walk: tape.clear() (it would free the nodes being walked), an op recorded onto the tape
// (it would move them) and a second backward of the same tape (it would take the gradients
// the walk holds) are each refused with an Error while a backward runs; the backward then
// ends as a failed one (below). Clear the tape, or record the next step, after backward
// returns; a recompute records into its own scratch list and is not affected.
//
// NOTE [A backward that fails]
// Leaves accumulate as the walk goes (their hooks may already have sent them), so a
// backward that throws part way is not undone: a leaf it reaches may hold some of its
// contributions and not others, and keeping copies to roll back would cost the size of
// every gradient. Instead each leaf the root reaches is marked incomplete
// (Var::grad_incomplete) until zero_grad, and optimizers and the loss scaler refuse it:
// a partial gradient is never applied by mistake. set_grad keeps the mark, since what
// replaces a gradient (unscale_, a ZeRO reduction) is made from it.
//
// NOTE [Scaled gradients]
// A loss scaler multiplies the loss by S on the device, so every gradient below it is S
// times too large until divided. The node that multiplies says so (Node::scales_gradients),
// and each leaf a backward accumulates into after that node has run (in the newest-first
// walk: the leaves below it) is marked scaled (Var::grad_scaled), a host flag that costs
// no device work. Optimizers refuse a scaled gradient unless their step divides it
// (StepControl::grad_divisor) or they were told it is meant; unscale_ and zero_grad clear
// the mark, set_grad keeps it (a replacement is made from the scaled gradient).
//
// NOTE [Gradients summed in f32]
// A 16-bit leaf's gradient is 16-bit: each contribution is cast to the leaf's dtype and
// added in place, so summing micro-batches rounds to 16 bits at every add. A leaf marked
// Var::set_grad_in_f32 (amp::MasterWeightsOptions::fp32_grads) keeps an f32 .grad instead:
// a 16-bit contribution is widened to f32 (exactly) and added there in f32, and an f32
// contribution (an op that computed in f32, e.g. a norm under autocast) is not narrowed
// first. So the sum over micro-batches is, bit for bit, the f32 sum of each micro-batch's
// gradient in the order they ran. Both steps are backend ops any backend has, a cast
// (map Identity, 16-bit -> f32) and a mixed-dtype add (map Add, f32 + 16-bit -> f32,
// computed in f32); nothing else about the tape changes.
#pragma once

#include <memory>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "trainmem/autograd/grad_mode.hpp"
#include "trainmem/autograd/var.hpp"
#include "trainmem/core/math.hpp"
#include "trainmem/core/rng.hpp"

namespace trainmem {

/// \brief Records ops and runs backward over them.
template <class B>
class Tape {
 public:
  explicit Tape(B& backend = B::default_instance()) : backend_(&backend) {}
  ~Tape() { life_->destroyed = true; }
  Tape(const Tape&) = delete;
  Tape& operator=(const Tape&) = delete;

  B& backend() const { return *backend_; }
  Generator& rng() { return rng_; }
  const Generator& rng() const { return rng_; }
  void manual_seed(std::uint64_t seed) { rng_.manual_seed(seed); }

  /// A value entering the graph; with requires_grad it is a leaf that gets a .grad.
  Var<B> input(Tensor<B> value, bool requires_grad = false, std::string name = {}) {
    detail::check(value.defined(), "Tape::input: '", name, "' is an undefined tensor");
    auto impl = std::make_shared<VarImpl<B>>();
    impl->value = std::move(value);
    adopt(*impl);
    impl->requires_grad = requires_grad;
    if (requires_grad) {
      detail::check(is_floating(impl->value.dtype()), "Tape::input: '", name, "' requires grad but is ",
                    impl->value.dtype());
      impl->grad_slot = std::make_shared<GradSlot<B>>();
    }
    impl->name = std::move(name);
    return Var<B>(std::move(impl));
  }

  /// Appends a node (to the scratch list during a region's recompute); refused onto the
  /// tape while its backward runs (NOTE [The tape during backward]).
  Node<B>* record(std::unique_ptr<Node<B>> node) {
    detail::check(sink_ != nullptr || !in_backward_, "Tape::record: op '", node->op ? node->op->name : "?",
                  "' recorded onto the tape while its backward runs (from a grad-ready hook?): backward is "
                  "walking the tape's nodes; compute under NoGradGuard there, or after backward returns");
    auto& sink = sink_ ? *sink_ : nodes_;
    sink.push_back(std::move(node));
    return sink.back().get();
  }
  std::size_t size() const { return nodes_.size(); }
  /// Makes `impl` a Var of this tape's current generation.
  void adopt(VarImpl<B>& impl) {
    impl.tape = this;
    impl.tape_life = life_;
    impl.tape_generation = life_->generation;
  }

  /// Drops every node and what it saved; the tape can record a new step. Vars made
  /// before are stale from now on (their next use throws). Refused while backward runs
  /// (NOTE [The tape during backward]).
  void clear() {
    detail::check(!in_backward_,
                  "Tape::clear: tape.clear() called during backward (from a grad-ready hook or an op's backward): "
                  "backward is walking the nodes it would free; clear the tape after backward returns");
    ++life_->generation;
    nodes_.clear();
    backward_ran_ = false;
  }

  // --- the save hook stack (checkpoint regions) -------------------------------------
  SaveHook<B>* hook() const { return hooks_.empty() ? nullptr : hooks_.back(); }

  /// \brief RAII: `hook` is the active save hook for the scope, the previous one after.
  class HookScope {
   public:
    HookScope(Tape& tape, SaveHook<B>* hook) : tape_(tape) { tape.hooks_.push_back(hook); }
    ~HookScope() { tape_.hooks_.pop_back(); }
    HookScope(const HookScope&) = delete;
    HookScope& operator=(const HookScope&) = delete;

   private:
    Tape& tape_;
  };

  /// \brief RAII: records nodes into `scratch` instead of the tape, with a fresh hook stack.
  class RecordInto {
   public:
    RecordInto(Tape& tape, std::vector<std::unique_ptr<Node<B>>>& scratch)
        : tape_(tape), previous_sink_(tape.sink_), previous_hooks_(std::move(tape.hooks_)) {
      tape.sink_ = &scratch;
      tape.hooks_.clear();
    }
    ~RecordInto() {
      tape_.sink_ = previous_sink_;
      tape_.hooks_ = std::move(previous_hooks_);
    }
    RecordInto(const RecordInto&) = delete;
    RecordInto& operator=(const RecordInto&) = delete;

   private:
    Tape& tape_;
    std::vector<std::unique_ptr<Node<B>>>* previous_sink_;
    std::vector<SaveHook<B>*> previous_hooks_;
  };

  // --- backward ---------------------------------------------------------------------
  /// Accumulates d(root)/d(leaf) into every reachable leaf's .grad. A non-scalar root
  /// needs a seed gradient of its shape. Without retain_graph, saved tensors are freed
  /// as backward passes them and a second backward throws.
  void backward(const Var<B>& root, const Tensor<B>& seed = {}, bool retain_graph = false) {
    const VarImpl<B>& r = root.impl();
    r.checked_tape("backward");
    detail::check(r.tape != nullptr, "backward: the root Var ", r.name.empty() ? "" : "'" + r.name + "' ",
                  "is on no tape (a parameter or a constant): backward starts from a value computed on this tape");
    detail::check(r.tape == this, "backward: the root Var ", r.name.empty() ? "" : "'" + r.name + "' ",
                  "belongs to another tape");
    detail::check(r.requires_grad, "backward: the root ", r.value.shape(),
                  " does not require grad (no parameter or grad-requiring input reaches it)");
    detail::check(!in_backward_,
                  "backward: called while a backward of this tape runs (from a grad-ready hook?); run it after "
                  "the first one returns");
    detail::check(!backward_ran_,
                  "backward: this tape's graph was freed by an earlier backward. For the next step, "
                  "record on a new Tape or call tape.clear() first; to run backward twice over one graph, "
                  "pass retain_graph=true to the first backward");
    Tensor<B> seed_grad;
    if (seed.defined()) {
      detail::check(seed.shape() == r.value.shape(), "backward: seed gradient is ", seed.shape(), ", root is ",
                    r.value.shape());
      detail::check(seed.dtype() == r.value.dtype(), "backward: seed gradient is ", seed.dtype(), ", root ",
                    r.value.shape(), " is ", r.value.dtype(), " (the seed must have the root's dtype)");
      seed_grad = seed;
    } else {
      detail::check(r.value.numel() == 1, "backward: the root is ", r.value.shape(),
                    ", not a scalar; pass a seed gradient of that shape");
      seed_grad = Tensor<B>::full(r.value.shape(), 1.0, r.value.dtype(), MemCategory::Temporary, *backend_);
    }
    if (!retain_graph) backward_ran_ = true;
    InBackward running(*this);
    if (r.grad_fn == nullptr) {  // the root is itself a leaf
      accumulate_into_leaf(*r.grad_slot, seed_grad);
      if (r.grad_slot->on_ready) r.grad_slot->on_ready();
      return;
    }
    run_backward(r.grad_fn, seed_grad, retain_graph);
  }

  /// Runs backward from `start`, seeded with `seed`, over the tape's nodes (newest
  /// first); without retain_graph each node is released once it has run.
  void run_backward(Node<B>* start, const Tensor<B>& seed, bool retain_graph) {
    start->grad = seed;
    std::size_t waiting = 1;  // nodes holding a gradient they have not run with yet
    bool scaled = false;      // a node that scales gradients has run (NOTE [Scaled gradients])
    ReadyLeaves ready(nodes_, start);
    try {
      // Nodes run newest first; the start node is somewhere on the tape.
      for (auto it = nodes_.rbegin(); it != nodes_.rend() && waiting > 0; ++it) {
        Node<B>* node = it->get();
        if (!node->grad.defined()) {
          ready.passed(*node);
          continue;
        }
        Grads<B> grad_output(1);
        std::swap(grad_output[0], node->grad);
        --waiting;
        detail::check(!node->released, "backward: ", node->op->name,
                      " was already released by an earlier backward; pass retain_graph=true to run backward twice");
        Grads<B> grad_inputs = node->backward(grad_output);
        grad_output.clear();
        if (!retain_graph) node->release();
        scaled = scaled || node->scales_gradients;
        for (std::size_t i = 0; i < node->inputs.size(); ++i) {
          const Edge<B>& edge = node->inputs[i];
          if (!edge.wants_grad() || i >= grad_inputs.size() || !grad_inputs[i].defined()) continue;
          Tensor<B>& g = grad_inputs[i];
          // An f32 contribution to a leaf summed in f32 stays f32 (NOTE [Gradients summed in f32]).
          if (g.dtype() != edge.dtype && !(edge.leaf && edge.leaf->in_f32 && g.dtype() == DType::F32))
            g = g.to(edge.dtype);
          if (edge.leaf) {
            accumulate_into_leaf(*edge.leaf, g);
            edge.leaf->scaled = edge.leaf->scaled || scaled;
          } else if (edge.node->grad.defined()) {
            edge.node->grad = add(edge.node->grad, g);
          } else {
            edge.node->grad = std::move(g);
            ++waiting;
          }
        }
        ready.ran(*node);
      }
    } catch (...) {
      drop_gradients();
      mark_incomplete(start);
      throw;
    }
    if (waiting > 0) {
      drop_gradients();
      mark_incomplete(start);
      detail::check(false, "backward: a gradient reached a node that is not on this tape");
    }
    ready.finish();
  }

 private:
  /// \brief RAII: marks the tape as running a backward (NOTE [The tape during backward]).
  class InBackward {
   public:
    explicit InBackward(Tape& tape) : tape_(tape) { tape.in_backward_ = true; }
    ~InBackward() { tape_.in_backward_ = false; }
    InBackward(const InBackward&) = delete;
    InBackward& operator=(const InBackward&) = delete;

   private:
    Tape& tape_;
  };

  /// The hooked leaves' contributions still to come in one backward (NOTE [When a
  /// leaf's gradient is final]).
  class ReadyLeaves {
   public:
    ReadyLeaves(const std::vector<std::unique_ptr<Node<B>>>& nodes, Node<B>* start) {
      bool hooked = false;
      for (const auto& node : nodes)
        for (const Edge<B>& edge : node->inputs) hooked = hooked || (edge.leaf && edge.leaf->on_ready);
      if (!hooked) return;
      reachable_.insert(start);
      for (auto it = nodes.rbegin(); it != nodes.rend(); ++it) {
        if (!reachable_.contains(it->get())) continue;
        for (const Edge<B>& edge : (*it)->inputs) {
          if (edge.node != nullptr) reachable_.insert(edge.node);
          if (!edge.leaf || !edge.leaf->on_ready) continue;
          auto [at, added] = index_.try_emplace(edge.leaf.get(), remaining_.size());
          if (added) remaining_.emplace_back(edge.leaf.get(), 0);
          ++remaining_[at->second].second;
        }
      }
    }
    /// `node` ran: its contributions have been added.
    void ran(const Node<B>& node) { count_down(node); }
    /// The walk passed a node it had no gradients for: it will not run.
    void passed(const Node<B>& node) {
      if (reachable_.contains(&node)) count_down(node);
    }
    /// Backward is over: every hooked leaf not yet told is final now.
    void finish() {
      for (auto& [slot, left] : remaining_)
        if (left > 0) {
          left = 0;
          slot->on_ready();
        }
    }

   private:
    void count_down(const Node<B>& node) {
      if (remaining_.empty()) return;
      for (const Edge<B>& edge : node.inputs) {
        if (!edge.leaf || !edge.leaf->on_ready) continue;
        auto at = index_.find(edge.leaf.get());
        if (at == index_.end()) continue;
        int& left = remaining_[at->second].second;
        if (left > 0 && --left == 0) edge.leaf->on_ready();
      }
    }

    std::unordered_set<const Node<B>*> reachable_;
    std::unordered_map<const GradSlot<B>*, std::size_t> index_;
    std::vector<std::pair<GradSlot<B>*, int>> remaining_;  // in the order first met
  };

  /// A backward that stops early leaves no gradient behind in the tape's nodes.
  void drop_gradients() {
    for (const auto& node : nodes_) node->grad = Tensor<B>();
  }
  /// After a failed backward from `start`: every leaf it could reach holds a partial sum
  /// (some contributions added, others not), which is not undone; the mark makes
  /// optimizers refuse it until zero_grad.
  void mark_incomplete(const Node<B>* start) {
    std::unordered_set<const Node<B>*> reachable{start};
    for (auto it = nodes_.rbegin(); it != nodes_.rend(); ++it) {
      if (!reachable.contains(it->get())) continue;
      for (const Edge<B>& edge : (*it)->inputs) {
        if (edge.node != nullptr) reachable.insert(edge.node);
        if (edge.leaf) edge.leaf->incomplete = true;
      }
    }
  }

  Tensor<B> add(const Tensor<B>& a, const Tensor<B>& b) {
    Tensor<B> out = Tensor<B>::empty(a.shape(), a.dtype(), MemCategory::Temporary, *backend_);
    backend_->map(math::Add{}, a, b, out);
    return out;
  }
  void accumulate_into_leaf(GradSlot<B>& slot, const Tensor<B>& g) {
    const DType dtype = slot.in_f32 ? DType::F32 : g.dtype();
    if (!slot.grad.defined()) {
      slot.grad = Tensor<B>::empty(g.shape(), dtype, MemCategory::Gradient, *backend_);
      if (g.dtype() == dtype) backend_->copy(slot.grad.data(), g.data(), g.bytes());
      else backend_->map(math::Identity{}, g, slot.grad);  // widened to f32, exactly
    } else {
      detail::check(slot.grad.shape() == g.shape(), "backward: accumulated grad is ", slot.grad.shape(),
                    ", new contribution is ", g.shape());
      backend_->map(math::Add{}, slot.grad, g, slot.grad);
      slot.grad.bump_version();
    }
  }

  B* backend_;
  Generator rng_;
  std::vector<std::unique_ptr<Node<B>>> nodes_;
  std::vector<std::unique_ptr<Node<B>>>* sink_ = nullptr;
  std::vector<SaveHook<B>*> hooks_;
  bool backward_ran_ = false;
  bool in_backward_ = false;
  std::shared_ptr<detail::TapeLife> life_ = std::make_shared<detail::TapeLife>();
};

template <class B>
void Var<B>::backward(const Tensor<B>& seed, bool retain_graph) const {
  Tape<B>* tape = impl().checked_tape("Var::backward");
  detail::check(tape != nullptr, "Var::backward: '", impl().name, "' is a parameter on no tape");
  tape->backward(*this, seed, retain_graph);
}

}  // namespace trainmem
