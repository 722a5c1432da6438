// trainmem/ops/op_recorder.hpp — the one entry every op goes through.
//
// NOTE [Op entry]
// An op validates its arguments, then builds an OpRecorder from its OpInfo and input
// Vars. The recorder is the single seam for three concerns, so no op handles them:
//  - autocast: `compute_dtype()` comes from the thread's autocast state and the op's
//    category; `input(i)` is input i cast to it (parameters through the cast cache,
//    activations through their Var's memo, so ops casting one value share one copy);
//    a widened input is saved as its narrower original (exact, fewer bytes);
//  - checkpointing: under a region's SaveHook, `compute(f)` may hand back outputs the
//    region kept instead of running f, and `save(t)` packs through the hook;
//  - autograd: `finish(output, backward)` records a Node whose edges route each
//    input's gradient, and returns the output Var;
//  - FP8: `fp8()` is the thread's FP8 context when this op's GEMM is to run in FP8 (a
//    matmul-class op computing in the autocast dtype under amp::Fp8Autocast), else null;
//    `fp8_records_amax()` says whether its quantizations observe amax (only while
//    recording: a no-grad evaluation or a region's recompute observes nothing).
// With grad mode off or no input requiring grad, nothing is saved or recorded.
//
// NOTE [Save order]
// Ops save the inputs they need before computing and their outputs after. A region's
// recompute stops at the last save it has to reproduce; saving inputs first means an
// op whose only contribution to backward is its saved inputs (the last matmul of a
// block) is never recomputed. An op that saves an intermediate output and then does
// more work (feed_forward: z, then GELU and the second linear) calls save_ahead(z)
// inside compute(): while a region replays, z is saved there, so a recompute whose last
// slot is z ends before the rest of the op runs.
#pragma once

#include <functional>
#include <initializer_list>
#include <optional>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "trainmem/autocast/autocast.hpp"
#include "trainmem/autocast/cast_cache.hpp"
#include "trainmem/autocast/fp8_autocast.hpp"
#include "trainmem/autograd/tape.hpp"

namespace trainmem {

/// An op's output tensors: the first is its Var's value, the rest what its backward
/// needs (layer norm's mean and rstd, a log-sum-exp); inline up to three.
template <class B>
using Outputs = SmallVector<Tensor<B>, 3>;

template <class B>
class OpRecorder {
 public:
  /// An op's input Vars, referred to, not copied: they are the op's arguments, which
  /// outlive its recorder (a temporary Var does not bind).
  using Inputs = std::initializer_list<std::reference_wrapper<const Var<B>>>;

  OpRecorder(const OpInfo& op, Inputs inputs, double flops = 0.0) : op_(op), flops_(flops) {
    for (const Var<B>& input : inputs) inputs_.push_back(&input);
    start();
  }
  /// For ops with a run-time number of inputs (concat).
  OpRecorder(const OpInfo& op, std::span<const Var<B>> inputs, double flops) : op_(op), flops_(flops) {
    for (const Var<B>& input : inputs) inputs_.push_back(&input);
    start();
  }

  const OpInfo& op() const { return op_; }
  Tape<B>& tape() const { return *tape_; }
  B& backend() const { return tape_->backend(); }
  bool records() const { return records_; }
  /// Whether input i's gradient is wanted (so backward may skip computing it).
  bool needs_grad(std::size_t i) const { return records_ && var(i).requires_grad(); }
  DType compute_dtype() const { return compute_dtype_; }
  const Var<B>& var(std::size_t i) const {
    detail::check(i < inputs_.size(), op_.name, ": input ", i, " of ", inputs_.size());
    return *inputs_[i];
  }

  /// The FP8 context this op's GEMM runs under, or null when it runs in compute_dtype().
  const amp::Fp8Context<B>* fp8() const {
    const amp::Fp8Context<B>& context = amp::fp8_context<B>();
    const amp::AutocastState& autocast = amp::autocast_state();
    if (!context.active() || !autocast.enabled || autocast.category_of(op_) != AutocastCategory::LowerPrecision ||
        compute_dtype_ != autocast.dtype)
      return nullptr;
    return &context;
  }
  /// Whether this op's FP8 quantizations record amax (the context's say, while recording).
  bool fp8_records_amax() const { return records_ && amp::fp8_context<B>().record_amax; }

  /// Input i in the compute dtype. Parameters are cast once through the cast cache.
  const Tensor<B>& input(std::size_t i) {
    const Var<B>& v = var(i);
    const Tensor<B>& value = v.value();
    if (!is_floating(value.dtype()) || value.dtype() == compute_dtype_) return value;
    if (cast_.empty()) cast_.resize(inputs_.size());  // most ops cast nothing: no allocation for them
    if (!cast_[i]) {
      if (v.tape() == nullptr && v.requires_grad()) {
        cast_[i] = amp::CastCache<B>::instance().get(value, compute_dtype_);
      } else {
        cast_[i] = v.impl().cast_to(compute_dtype_);
      }
    }
    return *cast_[i];
  }

  /// Runs `forward` (returning the op's Outputs) unless the active region kept this op's
  /// outputs in forward and is now replaying, in which case those are reused.
  template <class F>
  Outputs<B> compute(F&& forward) {
    if (hook_ != nullptr) {
      if (const auto* kept = hook_->reuse_outputs(op_index_)) return Outputs<B>(*kept);
    }
    Outputs<B> outputs = std::forward<F>(forward)();
    if (hook_ != nullptr)
      hook_->on_outputs(op_index_, op_, flops_, std::span<const Tensor<B>>(outputs.data(), outputs.size()));
    return outputs;
  }

  /// Inside compute(): `output`, computed before the rest of the op's work, is one the op
  /// saves after compute. While a region replays its forward, it is saved now, in the
  /// same order, so a recompute that needs nothing after it stops here (NOTE [Save order]);
  /// save(output) then returns what this save made. Otherwise it does nothing.
  void save_ahead(const Tensor<B>& output) {
    if (!records_ || hook_ == nullptr || !hook_->replaying()) return;
    saved_ahead_from_ = output.data();
    saved_ahead_.emplace(pack(output));
  }

  /// Keeps `tensor` for backward through the saved-tensor seam (nothing when not recording).
  /// An input this recorder widened is kept as its narrower original, widened again at
  /// unpack (exact, so backward sees the same values in half the bytes or less).
  SavedTensor<B> save(const Tensor<B>& tensor) {
    if (!records_) return {};
    if (saved_ahead_from_ != nullptr && tensor.data() == saved_ahead_from_) {
      saved_ahead_from_ = nullptr;
      return *std::exchange(saved_ahead_, std::nullopt);
    }
    if (const Tensor<B>* original = narrower_original(tensor)) return pack(*original).widened_to(tensor.dtype());
    return pack(tensor);
  }

  /// The output Var; when recording, a Node whose backward is `backward`, a callable
  /// taking the output's gradient as `const Grads<B>&` (g[0]) and returning Grads<B>,
  /// one per input.
  template <class F>
  Var<B> finish(Tensor<B> output, F&& backward) {
    auto impl = std::make_shared<VarImpl<B>>();
    tape_->adopt(*impl);
    impl->hook = hook_;
    impl->op_index = op_index_;
    if (records_) {
      auto node = std::make_unique<NodeWith<B, std::decay_t<F>>>(std::forward<F>(backward));
      node->op = &op_;
      for (const Var<B>* in : inputs_) {
        Edge<B> edge;
        const VarImpl<B>& v = in->impl();
        edge.dtype = v.value.dtype();
        if (v.requires_grad) {
          if (v.grad_fn != nullptr) edge.node = v.grad_fn;
          else edge.leaf = v.grad_slot;
        }
        node->inputs.push_back(std::move(edge));
      }
      impl->grad_fn = tape_->record(std::move(node));
      impl->requires_grad = true;
    }
    impl->value = std::move(output);
    return Var<B>(std::move(impl));
  }

 private:
  /// Checks the inputs (one tape) and settles the compute dtype and the active hook.
  void start() {
    const OpInfo& op = op_;
    SmallVector<DType, 4> floating;
    for (std::size_t i = 0; i < inputs_.size(); ++i) {
      const VarImpl<B>& v = inputs_[i]->impl();
      if (v.checked_tape(op.name) != nullptr) {
        detail::check(tape_ == nullptr || tape_ == v.tape, op.name, ": input ", i, " ",
                      v.name.empty() ? "" : "'" + v.name + "' ", "belongs to another tape than input 0");
        tape_ = v.tape;
      }
      any_requires_grad_ = any_requires_grad_ || v.requires_grad;
      if (is_floating(v.value.dtype())) floating.push_back(v.value.dtype());
    }
    detail::check(tape_ != nullptr, op.name, ": none of its inputs is on a tape; bring data in with tape.input()");
    records_ = grad_enabled() && any_requires_grad_;
    const amp::AutocastState& autocast = amp::autocast_state();
    if (autocast.category_of(op) == AutocastCategory::LowerPrecision && !autocast.enabled) {
      for (DType d : floating)  // like torch.mm: no silent promotion of matmul operands
        detail::check(d == floating.front(), op.name, ": operands are ", floating.front(), " and ", d,
                      "; outside autocast matmul-class ops need one dtype (cast first, or run under amp::Autocast)");
    }
    compute_dtype_ = autocast.compute_dtype(op, std::span<const DType>(floating.data(), floating.size()));
    hook_ = tape_->hook();
    if (hook_ != nullptr) op_index_ = hook_->begin_op(op);
  }

  SavedTensor<B> pack(const Tensor<B>& tensor) {
    if (hook_ != nullptr) return hook_->pack(tensor, SaveInfo{&op_, op_index_, tensor.bytes(), flops_});
    return SavedTensor<B>::keep(tensor, op_.name);
  }

  /// The activation input whose widening (a cast made here, not a parameter's cached
  /// copy) `tensor` is; null when it is none.
  const Tensor<B>* narrower_original(const Tensor<B>& tensor) const {
    for (std::size_t i = 0; i < cast_.size(); ++i) {
      if (!cast_[i] || cast_[i]->data() != tensor.data() || cast_[i]->shape() != tensor.shape()) continue;
      const VarImpl<B>& v = inputs_[i]->impl();
      if (v.tape != nullptr && size_of(v.value.dtype()) < size_of(tensor.dtype())) return &v.value;
    }
    return nullptr;
  }

  const OpInfo& op_;
  typename OpTimes<B>::Scope timing_{op_.name, false};  // the forward, entry to return, under an OpTimes
  SmallVector<const Var<B>*, 4> inputs_;                // the caller's Vars
  double flops_;
  SmallVector<std::optional<Tensor<B>>, 4> cast_;  // input i cast to the compute dtype (sized at the first cast)
  Tape<B>* tape_ = nullptr;
  SaveHook<B>* hook_ = nullptr;
  std::int64_t op_index_ = -1;
  const void* saved_ahead_from_ = nullptr;     // the output save_ahead saved, until save() takes it
  std::optional<SavedTensor<B>> saved_ahead_;  // optional: most ops never save ahead
  bool any_requires_grad_ = false;
  bool records_ = false;
  DType compute_dtype_ = DType::F32;
};

}  // namespace trainmem
