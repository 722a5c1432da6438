// trainmem/checkpoint/options.hpp — what a checkpoint region is asked to do, and what regions did.
//
// Options travel with each region: the policy (which op outputs to keep), the byte
// budget that may overrule PREFER decisions, how strictly a recompute is compared with
// its forward, and whether it may stop at the last tensor it has to bring back.
// CheckpointStats counts per thread, so tests and benchmarks can see recomputes happen
// (or not) without timing anything.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>

#include "trainmem/checkpoint/policy.hpp"

namespace trainmem {

/// How much of a recompute is compared with its forward.
enum class DeterminismCheck : std::uint8_t {
  Metadata,     // count, op, shape and dtype of every saved tensor (always on)
  Fingerprint,  // ... and a backend fingerprint of every byte of each recomputed tensor, on the device (default)
  Checksum,     // ... and a 64-bit FNV-1a hash of the bytes, copied to the host
  Bitwise,      // ... and the bytes themselves (keeps a host copy: a debugging aid)
};

struct CheckpointOptions {
  Policy policy = policy::recompute_all();
  DeterminismCheck determinism = DeterminismCheck::Fingerprint;
  /// Bytes a region may keep through PREFER_SAVE decisions; MUST decisions ignore it.
  std::size_t memory_budget = std::numeric_limits<std::size_t>::max();
  /// Stop a recompute once every dropped tensor is back (faster). Off: rerun fn to the
  /// end and check that it saves exactly what the forward saved.
  bool early_stop = true;
};

/// Counters of the calling thread's checkpoint activity (for tests and benchmarks).
struct CheckpointStats {
  std::int64_t regions = 0;     // regions entered with grad on
  std::int64_t recomputes = 0;  // forward reruns during backward
  std::int64_t ops_reused = 0;  // ops skipped in recompute because their outputs were kept
  std::int64_t outputs_offloaded = 0;
};
inline CheckpointStats& checkpoint_stats() {
  thread_local CheckpointStats stats;
  return stats;
}

}  // namespace trainmem
