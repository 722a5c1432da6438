// trainmem/checkpoint/stage_hold.hpp — a choice the planner makes per stage beside its
// mode: hold something from the stage's forward to its backward, so that backward does less.
//
// The one user today is ZeRO-3 (dist::FullyShardedModel::stage_hold): a unit's gathered
// weights are released after its forward and gathered again for its backward, or held
// through, at their bytes, saving the backward's gather. What is held is no saved
// activation, so a hold moves the whole-step channel only. The planner measures a hold's
// price in one more profiled step (every stage plain and held) and adds it, stage by
// stage, to each mode's costs (NOTE [Held stages] in planner_profile.hpp); a plan says
// per segment whether its stages hold, and its runner sets that before running them.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace trainmem {

/// \brief What a stage may hold from its forward to its backward, and how to turn that on
/// or off for a stage (between steps).
struct StageHold {
  std::string name;                                      // what is held, for plans ("gathered weights")
  std::function<void(std::int64_t stage, bool on)> set;  // turns the hold on or off for one stage
  explicit operator bool() const { return static_cast<bool>(set); }
};

}  // namespace trainmem
