// trainmem/distributed/agreed_plan.hpp — one checkpoint plan on every rank: rank 0's.
//
// Every rank profiles (the profiled steps are training steps, so collective), but each
// rank times its own stages, and two ranks' times differ: left alone, two ranks could
// pick different schedules. Under ZeRO-3 a schedule decides which gathers run (a region
// over several units gathers its inner units once more, a held unit once less, NOTE [A
// region around a unit] in dist/fully_sharded.hpp), and ranks whose gathers differ wait
// on each other forever. agreed_plan makes the plan on rank 0 and hands its JSON (the
// saved-plan format, checkpoint/plan_file.hpp) to every rank. A budget rank 0 cannot meet
// is the same trainmem::Error on every rank.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "trainmem/checkpoint/planner.hpp"
#include "trainmem/distributed/communicator.hpp"

namespace trainmem::dist {

/// The plan rank 0's planner makes for `budget`, on every rank (a collective; each rank's
/// planner profiled the same chain and step). The plan's runner sets the planner's StageHold.
template <class B>
CheckpointPlan<B> agreed_plan(Communicator<B>& comm, const Planner<B>& planner, Budget budget) {
  std::string text;
  bool planned = true;
  if (comm.rank() == 0) {
    try {
      text = planner.plan(budget).to_json();
    } catch (const Error& e) {
      text = e.what();
      planned = false;
    }
  }
  std::int64_t header[2] = {static_cast<std::int64_t>(text.size()), planned ? 1 : 0};
  comm.broadcast_host(std::as_writable_bytes(std::span<std::int64_t>(header)), 0);
  text.resize(static_cast<std::size_t>(header[0]));
  comm.broadcast_host(std::as_writable_bytes(std::span<char>(text.data(), text.size())), 0);
  if (header[1] == 0) throw Error("dist::agreed_plan: rank 0 could not plan: " + text);
  return CheckpointPlan<B>::from_json(planner.stages(), text, planner.options(), "from rank 0");
}

}  // namespace trainmem::dist
