// trainmem/checkpoint/policy.hpp — what a checkpoint region keeps.
//
// A policy looks at each op's outputs inside a region (its kind, bytes, estimated
// FLOPs, and a name given with checkpoint_name) and decides SAVE (keep them from the
// forward), RECOMPUTE (drop them, rerun the op in backward) or OFFLOAD (copy them to
// host memory and bring them back; the CPU backend has no other memory to offload to,
// so there OFFLOAD behaves as SAVE). Each decision is MUST or PREFER: a region's
// memory budget may turn a PREFER_SAVE into RECOMPUTE, never a MUST. This is
// PyTorch's selective activation checkpointing and JAX's checkpoint policies
// (`dots_saveable`, `save_only_these_names`) in one type.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "trainmem/autograd/op_identity.hpp"
#include "trainmem/error.hpp"

namespace trainmem {

enum class Decision : std::uint8_t { Save, Recompute, Offload };
enum class Strength : std::uint8_t { Must, Prefer };

struct PolicyDecision {
  Strength strength = Strength::Prefer;
  Decision decision = Decision::Recompute;
  bool operator==(const PolicyDecision&) const = default;
};

inline constexpr PolicyDecision kMustSave{Strength::Must, Decision::Save};
inline constexpr PolicyDecision kPreferSave{Strength::Prefer, Decision::Save};
inline constexpr PolicyDecision kMustRecompute{Strength::Must, Decision::Recompute};
inline constexpr PolicyDecision kPreferRecompute{Strength::Prefer, Decision::Recompute};
inline constexpr PolicyDecision kMustOffload{Strength::Must, Decision::Offload};

/// What a policy sees of one op's outputs inside a region.
struct OpSummary {
  const OpIdentity& op;
  std::size_t bytes;      // all outputs together
  double flops;           // estimated forward FLOPs of the op
  std::string_view name;  // the name given with checkpoint_name, else empty
};

using Policy = std::function<PolicyDecision(const OpSummary&)>;

namespace policy {

/// Keep nothing inside the region: full recompute (torch.utils.checkpoint).
inline Policy recompute_all() {
  return [](const OpSummary&) { return kPreferRecompute; };
}

/// Keep matmul-class outputs, recompute everything else (JAX dots_saveable; the usual
/// selective checkpointing: matmuls dominate recompute time, element-wise ops memory).
inline Policy save_matmuls() {
  return [](const OpSummary& s) { return s.op.kind == OpKind::Matmul ? kMustSave : kPreferRecompute; };
}

/// Keep the outputs of the ops named in `names` (OpIdentity::name, e.g. "linear"),
/// recompute the rest: PyTorch's selective checkpointing by a list of ops to save.
inline Policy save_ops(std::vector<std::string> names) {
  return [names = std::move(names)](const OpSummary& s) {
    for (const auto& n : names)
      if (s.op.name == n) return kMustSave;
    return kPreferRecompute;
  };
}

/// Keep only what fused attention returns (its output and log-sum-exp: little memory for
/// much compute) and recompute every projection, norm and MLP around it.
inline Policy save_attention() { return save_ops({"scaled_dot_product_attention"}); }

/// Keep the tensors named with checkpoint_name(x, name) for a name in `names`.
inline Policy save_names(std::vector<std::string> names) {
  return [names = std::move(names)](const OpSummary& s) {
    for (const auto& n : names)
      if (!s.name.empty() && s.name == n) return kMustSave;
    return kPreferRecompute;
  };
}

/// Keep what `predicate(kind, bytes, flops)` accepts (PREFER: a budget may override).
inline Policy save_if(std::function<bool(OpKind, std::size_t, double)> predicate) {
  detail::check(static_cast<bool>(predicate), "policy::save_if: the predicate is an empty function");
  return [predicate = std::move(predicate)](const OpSummary& s) {
    return predicate(s.op.kind, s.bytes, s.flops) ? kPreferSave : kPreferRecompute;
  };
}

/// Offload matmul-class outputs to host memory instead of recomputing them.
inline Policy offload_matmuls() {
  return [](const OpSummary& s) { return s.op.kind == OpKind::Matmul ? kMustOffload : kPreferRecompute; };
}

/// Offload every op's outputs to host memory: nothing is recomputed, backward brings
/// them all back (the planner's Offload mode).
inline Policy offload_all() {
  return [](const OpSummary&) { return kMustOffload; };
}

/// The first policy's MUST decisions win; otherwise the second decides.
inline Policy prefer(Policy first, Policy second) {
  detail::check(first && second, "policy::prefer: the ", first ? "second" : "first", " policy is an empty function");
  return [first = std::move(first), second = std::move(second)](const OpSummary& s) {
    const PolicyDecision a = first(s);
    return a.strength == Strength::Must ? a : second(s);
  };
}

}  // namespace policy
}  // namespace trainmem
