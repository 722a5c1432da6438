// trainmem/autocast/autocast.hpp — which dtype each op computes in.
//
// Autocast is a thread-local state (enabled, dtype, per-op overrides) set by an RAII
// guard. Every op entry asks `compute_dtype` with the op's declared category and its
// inputs' dtypes; ops never hard-code a precision. The rules are PyTorch's CUDA
// autocast lists: matmul-class ops run in the 16-bit dtype, precision-sensitive ops
// (softmax, losses, reductions, exp, log) in f32, binary element-wise ops in the
// widest input dtype. f64 is never narrowed (gradient checks stay exact). A
// checkpoint region captures this state and replays under it.
//
// NOTE [Norms in 16-bit storage]
// PyTorch also lists the norms as f32: a bf16 activation is widened into an f32 copy,
// normalised into an f32 output and cast back to bf16 by the next matmul — three
// tensors where one would do. Our norm kernels accumulate in f32 whatever they read, so
// autocast runs them on the activation's own storage (Fp32Math): a 16-bit x gives a
// 16-bit y with the weights read in f32 and one rounding of the f32 result, the same
// bits the matmul would have seen, and the same gradients (dy is that matmul's 16-bit
// gradient either way; dx is rounded once to x's dtype either way). An f32 x still gives
// an f32 y. CategoryOverride("layer_norm", AutocastCategory::Fp32) restores PyTorch's rule.
#pragma once

#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "trainmem/autocast/op_info.hpp"
#include "trainmem/core/dtype.hpp"

namespace trainmem::amp {

/// \brief The thread's autocast settings: everything recompute needs to replay.
struct AutocastState {
  bool enabled = false;
  DType dtype = DType::BF16;
  /// Per-op category overrides (op name -> category); shared, never mutated in place.
  std::shared_ptr<const std::map<std::string, AutocastCategory, std::less<>>> overrides;

  bool operator==(const AutocastState& other) const {
    return enabled == other.enabled && dtype == other.dtype && overrides == other.overrides;
  }

  AutocastCategory category_of(const OpInfo& op) const {
    if (overrides) {
      if (auto it = overrides->find(op.name); it != overrides->end()) return it->second;
    }
    return op.autocast;
  }

  /// The dtype `op` computes in, given its floating inputs' dtypes.
  DType compute_dtype(const OpInfo& op, std::span<const DType> inputs) const {
    DType wide = inputs.empty() ? DType::F32 : inputs[0];
    bool any_f64 = false;
    for (DType d : inputs) {
      wide = widest(wide, d);
      any_f64 = any_f64 || d == DType::F64;
    }
    switch (category_of(op)) {
      case AutocastCategory::LowerPrecision: return enabled && !any_f64 ? dtype : wide;
      case AutocastCategory::Fp32: return enabled && !any_f64 ? DType::F32 : wide;
      case AutocastCategory::Fp32Math:
        return enabled && !any_f64 ? (!inputs.empty() && is_16bit(inputs[0]) ? inputs[0] : DType::F32) : wide;
      case AutocastCategory::Promote:
      case AutocastCategory::Unchanged: return wide;
    }
    return wide;
  }
};

/// What an op entry consults is a policy, and this state is all of it: one type, two names.
using AutocastPolicy = AutocastState;

}  // namespace trainmem::amp

namespace trainmem::detail {
/// The calling thread's autocast state, for the guards below to set.
inline amp::AutocastState& thread_autocast_state() {
  thread_local amp::AutocastState state;
  return state;
}
}  // namespace trainmem::detail

namespace trainmem::amp {

/// The calling thread's autocast state.
inline const AutocastState& autocast_state() { return detail::thread_autocast_state(); }

/// \brief RAII: sets the thread's autocast state for a scope and restores it on exit.
///
/// Nestable: an inner `Autocast(DType::F16)` or `Autocast::disabled()` overrides the
/// outer one until it ends. The state is captured by checkpoint regions.
class Autocast {
 public:
  explicit Autocast(DType dtype = DType::BF16, bool enabled = true) : previous_(detail::thread_autocast_state()) {
    detail::check(is_16bit(dtype) || !enabled, "amp::Autocast: the autocast dtype must be f16 or bf16, got ", dtype);
    auto& state = detail::thread_autocast_state();
    state.enabled = enabled;
    if (enabled) state.dtype = dtype;
  }
  /// A guard that turns autocast off in its scope (a region that must run in f32).
  static Autocast disabled() { return Autocast(DType::BF16, false); }
  /// Restores an exact captured state (used by checkpoint recompute).
  explicit Autocast(const AutocastState& state) : previous_(detail::thread_autocast_state()) {
    detail::thread_autocast_state() = state;
  }
  ~Autocast() { detail::thread_autocast_state() = previous_; }
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  AutocastState previous_;
};

/// \brief RAII: overrides the autocast category of named ops for a scope.
class CategoryOverride {
 public:
  CategoryOverride(std::string op_name, AutocastCategory category)
      : previous_(detail::thread_autocast_state().overrides) {
    auto merged = previous_ ? std::make_shared<std::map<std::string, AutocastCategory, std::less<>>>(*previous_)
                            : std::make_shared<std::map<std::string, AutocastCategory, std::less<>>>();
    (*merged)[std::move(op_name)] = category;
    detail::thread_autocast_state().overrides = std::move(merged);
  }
  ~CategoryOverride() { detail::thread_autocast_state().overrides = previous_; }
  CategoryOverride(const CategoryOverride&) = delete;
  CategoryOverride& operator=(const CategoryOverride&) = delete;

 private:
  std::shared_ptr<const std::map<std::string, AutocastCategory, std::less<>>> previous_;
};

}  // namespace trainmem::amp
