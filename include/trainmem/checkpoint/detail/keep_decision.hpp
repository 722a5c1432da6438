// trainmem/checkpoint/detail/keep_decision.hpp — what a region's forward keeps of each op's outputs.
//
// The forward side only: the region's policy decides SAVE, RECOMPUTE or OFFLOAD for each
// op's outputs, the memory budget turns a PREFER_SAVE that would not fit into
// RECOMPUTE (a MUST decision is never overruled), and OFFLOAD copies to host memory
// where the backend has somewhere to offload to (elsewhere it keeps, as SAVE does).
// What is kept goes into the region's KeptOutputs; the recompute only reads those.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "trainmem/checkpoint/detail/kept_outputs.hpp"
#include "trainmem/checkpoint/options.hpp"
#include "trainmem/error.hpp"

namespace trainmem {
namespace detail {

/// \brief A region's policy and memory budget, applied to the outputs of its forward.
template <class B>
class KeepDecision {
 public:
  KeepDecision(Policy policy, std::size_t memory_budget) : policy_(std::move(policy)), memory_budget_(memory_budget) {
    check(static_cast<bool>(policy_),
          "checkpoint: the region's policy is an empty function (use policy::recompute_all() to keep nothing)");
  }

  /// Applies the policy to `outputs` (op_index -1: keep without skipping their producer
  /// in recompute); returns whether they stay in device memory, kept by the region.
  bool keep(std::int64_t op_index, const OpSummary& summary, const std::vector<Tensor<B>>& outputs,
            KeptOutputs<B>& kept) const {
    PolicyDecision d = policy_(summary);
    if (d.decision != Decision::Recompute && d.strength == Strength::Prefer &&
        kept.bytes() + summary.bytes > memory_budget_)
      d = kPreferRecompute;
    if (d.decision == Decision::Recompute) return false;
    if constexpr (HasOffload<B>) {
      if (d.decision == Decision::Offload && op_index >= 0) {
        kept.offload(op_index, outputs);
        checkpoint_stats().outputs_offloaded += static_cast<std::int64_t>(outputs.size());
        return false;
      }
    }
    kept.save(op_index, outputs);  // Save, and Offload with nowhere to offload to
    return true;
  }

 private:
  Policy policy_;
  std::size_t memory_budget_;
};

}  // namespace detail
}  // namespace trainmem
