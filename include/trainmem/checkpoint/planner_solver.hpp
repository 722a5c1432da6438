// trainmem/checkpoint/planner_solver.hpp — the fastest schedule of a chain under a byte
// budget: a cost model over the measured profile and an exact dynamic program over it.
//
// NOTE [The chain's memory model]
// A schedule splits the chain into segments: a Keep stage, or a region (Recompute,
// Selective, SaveAttention or Offload) over stages [j, j'). Forward leaves `kept` bytes per segment; backward
// visits segments last to first, and when it starts segment q the live bytes are
//     start + (kept of segments 0..q) + backward_rest + G(end of q),
// G(j) being what backward of stages j.. leaves behind (their gradients), taken from
// the plain profile. A segment's backward peak P above that comes from its stages'
// measured peaks: a region first recomputes stages j..j'-2 (their plain saved bytes
// minus what the region kept), then runs the last stage as the one-stage region of the
// profile did, then backward of the recomputed stages as in the plain step. The peak
// of the step is the largest of these levels, of the forward levels, of the loss and
// of the part outside the chain (optimizer). Time is the sum of measured stage times.
// A step of several micro-batches (NOTE [Micro-batches] in planner_profile.hpp) is
// modelled on its last micro-batch, whose start holds the gradients the earlier ones
// made; its peak is the larger of that model's and the same model on the first
// micro-batch's costs (the dynamic program meets the last one's levels; the chosen
// schedule is then checked against both), and its time counts every micro-batch.
//
// Selective, SaveAttention and Offload regions are one stage long (see solve_once).
//
// NOTE [Offload in the model]
// An Offload stage is a one-stage region whose activations all go to pinned host memory
// in forward and come back at its backward; it is a mode only where the profile could
// measure it (the backend has HasOffload; never on the CPU, which has no other memory).
// Its bytes are device bytes (host copies are not in the Total channel) and its times
// are the stage's own windows with the copies in them: each profile mark waits for the
// copies queued so far, so a transfer that the stage's own compute does not hide shows
// as time (the measured bandwidth at work), and the model takes no credit for hiding it
// behind the next stage's, which a planned step (no marks) may still do.
//
// NOTE [Nested segments]
// A Nested segment is a full-recompute region whose inner stages (all but the last) are
// one-stage regions inside it, as Rotor's recursive schedules let a recomputed segment
// checkpoint again. Its forward is the Recompute region's. Its recompute keeps only the
// inner stages' outputs (each the next stage's saved input), so it holds one stage's
// activations at a time instead of the segment's: the inner stages cost what the
// all-Recompute profile measured for them (forward level and kept bytes, then backward
// with their own recompute), the last stage what it costs in a Recompute region. The
// price is one more forward of each inner stage. One level deep: an inner stage is never
// nested again.
//
// NOTE [The dynamic program]
// best[j][a] = least time for stages [0, j) leaving `a` kept bytes (in buckets of u)
// with every level so far within the budget M. A segment [j, j') in mode X moves a to
// a + kept(j, j', X) if start + a·u + kept + backward_rest + G(j') + P ≤ M and the
// forward level fits; the answer is the least best[N][a] whose loss level fits. Levels
// of a region over [j, j') are running maxima over its inner stages, so all O(N²)
// segments cost O(1) each before the bucket loop: O(N²·S) with S buckets. With u = 1
// (small integer costs) the program is exact; with real byte counts u is range/S and
// the chosen schedule is checked against the exact model (and re-solved with bytes
// rounded up, which never lets a schedule through, if rounding to nearest did). Times
// are floats (16 buckets an AVX-512 instruction). The work limit bounds segments × S;
// on chains so long that N² segments would leave fewer buckets than stages, segment
// length is bounded instead (see resolution()): at 1,024 stages 2,000 buckets and
// segments up to 30 stages solve in 26–31 ms, where all segments at 238 buckets (and
// doubles) took 79–128 ms and planned the MLP chain up to 1.3× slower (AMD EPYC Zen 4,
// 2 threads; docs/checkpointing.md).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "trainmem/checkpoint/planner_profile.hpp"

namespace trainmem {

/// \brief The model's prediction for one schedule.
struct PlanPrediction {
  std::array<std::int64_t, kMemChannels> peak{};  // whole step, saved activations
  double ms = 0.0;                                // the whole step, all its micro-batches
  bool operator==(const PlanPrediction&) const = default;
};

/// \brief Cost of one segment on one channel.
struct SegmentCost {
  std::int64_t kept = 0;       // bytes the segment leaves kept after its forward
  std::int64_t fwd_level = 0;  // forward peak above the live bytes at the segment's start
  std::int64_t bwd_level = 0;  // backward peak above the live bytes at its backward start
  double ms = 0.0;
};

namespace detail {

inline std::size_t at(std::int64_t i) { return static_cast<std::size_t>(i); }

/// The profiled mode whose stage costs a segment of mode m uses (Nested: Recompute's).
inline int profiled(StageMode m) { return m == StageMode::Nested ? 1 : static_cast<int>(m); }

/// The profiled mode an inner stage of a region of mode m runs backward in: plain after the
/// region's recompute, or as its own one-stage region inside a Nested segment.
inline int inner_mode(StageMode m) { return m == StageMode::Nested ? 1 : 0; }

/// Time an inner stage k of a region of mode m adds in backward: its recompute (Recompute: its
/// forward; a selective mode: what its policy recomputes, as the one-stage region measured;
/// Nested: its forward as a one-stage region) and its backward.
inline double inner_backward_ms(const StageCosts& s, StageMode m) {
  switch (m) {
    case StageMode::Recompute: return s.fwd_ms[0] + s.bwd_ms[0];
    case StageMode::Nested: return s.fwd_ms[1] + s.bwd_ms[1];
    default: return std::max(0.0, s.bwd_ms[profiled(m)] - s.bwd_ms[0]) + s.bwd_ms[0];
  }
}

/// Prefix sums of the backward live changes of profiled mode q: e[k] = sum of stages < k.
inline std::vector<std::int64_t> backward_change_prefix(const std::vector<StageCosts>& stages, int q, int c) {
  std::vector<std::int64_t> e(stages.size() + 1, 0);
  for (std::size_t k = 0; k < stages.size(); ++k) e[k + 1] = e[k] + stages[k].bwd_change[q][c];
  return e;
}

/// Backward level of stage k: what stages k.. leave behind, plain profile.
inline std::vector<std::int64_t> leftover_suffix(const ChainProfile& p, int c) {
  const std::int64_t n = p.size();
  std::vector<std::int64_t> g(at(n + 1), 0);
  for (std::int64_t k = n - 1; k >= 0; --k)
    g[at(k)] = g[at(k + 1)] + p.stages[at(k)].kept[0][c] + p.stages[at(k)].bwd_change[0][c];
  return g;
}

inline std::int64_t loss_need(const ChainProfile& p, int c) {
  return std::max(p.loss_fwd_peak[c], p.loss_live[c] + p.loss_bwd_peak[c]);
}

}  // namespace detail

/// The model's cost of segment s on channel c, by direct sums (the reference the solver's
/// running sums must agree with).
inline SegmentCost segment_cost(const ChainProfile& p, int c, const Segment& s) {
  using detail::at;
  const int m = detail::profiled(s.mode), q = detail::inner_mode(s.mode);
  const std::int64_t j = s.begin, last = s.end - 1;
  detail::check(!s.hold || !p.held.empty(), "checkpoint planner: segment [", s.begin, ", ", s.end,
                ") holds its stages, and the profile was made without a StageHold");
  const std::vector<StageCosts>& stages = p.costs(s.hold);
  SegmentCost out;
  if (s.mode == StageMode::Keep) {
    for (std::int64_t k = s.begin; k < s.end; ++k) {  // Keep stages one by one
      const StageCosts& st = stages[at(k)];
      out.fwd_level = std::max(out.fwd_level, out.kept + st.fwd_peak[0][c]);
      out.kept += st.kept[0][c];
      out.ms += st.fwd_ms[0] + st.bwd_ms[0];
    }
    // Within a Keep run the backward levels are those of the single stages; solve and
    // predict treat Keep runs stage by stage, so the level here is the last stage's.
    out.bwd_level = stages[at(last)].bwd_peak[0][c];
    return out;
  }
  std::int64_t inner = 0;  // kept by the region so far, before stage k
  for (std::int64_t k = j; k <= last; ++k) {
    const StageCosts& st = stages[at(k)];
    const std::int64_t held = k > j ? stages[at(k - 1)].output_bytes : 0;
    out.fwd_level = std::max(out.fwd_level, inner + held + st.fwd_peak[m][c]);
    inner += st.kept[m][c] - st.output_bytes;
    out.ms += st.fwd_ms[m];
  }
  out.kept = inner + stages[at(last)].output_bytes;
  std::int64_t recomputed = 0;  // recompute of stages j..last-1 before the last stage's
  std::int64_t level = 0;
  for (std::int64_t k = j; k < last; ++k) {
    const StageCosts& st = stages[at(k)];
    level = std::max(level, recomputed + st.fwd_peak[q][c]);
    recomputed += st.kept[q][c] - st.kept[m][c] + st.output_bytes;
    out.ms += detail::inner_backward_ms(stages[at(k)], s.mode);
  }
  const StageCosts& tail = stages[at(last)];
  level = std::max(level, recomputed + tail.bwd_peak[m][c]);
  std::int64_t live = recomputed + tail.bwd_change[m][c];
  for (std::int64_t k = last - 1; k >= j; --k) {
    level = std::max(level, live + stages[at(k)].bwd_peak[q][c]);
    live += stages[at(k)].bwd_change[q][c];
  }
  out.bwd_level = level;
  out.ms += tail.bwd_ms[m];
  return out;
}

/// Splits Keep segments into single stages (the form the model and the solver use).
inline std::vector<Segment> split_keeps(const std::vector<Segment>& segments) {
  std::vector<Segment> out;
  for (const Segment& s : segments) {
    if (s.mode != StageMode::Keep) {
      out.push_back(s);
      continue;
    }
    for (std::int64_t k = s.begin; k < s.end; ++k) out.push_back({k, k + 1, StageMode::Keep, s.hold});
  }
  return out;
}

/// The model's peak (both channels) and time of a whole step under a schedule (every
/// micro-batch: NOTE [The chain's memory model]).
inline PlanPrediction predict(const ChainProfile& p, const std::vector<Segment>& schedule) {
  detail::check_tiling("checkpoint planner: predict", p.size(), schedule);
  const std::vector<Segment> segs = split_keeps(schedule);
  for (const Segment& s : segs) {
    detail::check(p.measured[detail::at(detail::profiled(s.mode))], "checkpoint planner: the profile has no ",
                  name_of(s.mode), " measurement (Offload needs a backend with host memory to offload to)");
    detail::check(s.mode != StageMode::Offload || s.end - s.begin == 1,
                  "checkpoint planner: an Offload segment spans one stage, got stages ", s.begin, "-", s.end - 1);
  }
  PlanPrediction out;
  out.ms = p.outside_ms;
  for (int c = 0; c < kMemChannels; ++c) {
    const std::vector<std::int64_t> g = detail::leftover_suffix(p, c);
    std::int64_t peak = p.outside_peak[c], kept = 0;
    for (const Segment& s : segs) {
      const SegmentCost cost = segment_cost(p, c, s);
      peak = std::max(peak, p.start_live[c] + kept + cost.fwd_level);
      kept += cost.kept;
      peak = std::max(peak, p.start_live[c] + kept + p.backward_rest[c] + g[detail::at(s.end)] + cost.bwd_level);
      if (c == 0) out.ms += static_cast<double>(p.micro_batches) * cost.ms;
    }
    peak = std::max(peak, p.start_live[c] + kept + detail::loss_need(p, c));
    out.peak[c] = peak;
  }
  for (const ChainProfile& first : p.first_micro_batch) {
    const PlanPrediction f = predict(first, schedule);
    for (int c = 0; c < kMemChannels; ++c) out.peak[c] = std::max(out.peak[c], f.peak[c]);
  }
  return out;
}

/// \brief Solver settings.
struct SolverOptions {
  std::int64_t buckets = 2000;  // memory resolution: the budget's range in this many steps
  double work_limit = 1.25e8;   // at most segments × S bucket updates (see resolution())
  bool allow_selective = true;  // Selective and SaveAttention
  bool allow_nested = true;
  bool allow_offload = true;  // where the profile measured it (ChainProfile::measured)
  bool allow_hold = true;     // where the profile has a StageHold's prices (ChainProfile::held)
};

namespace detail {
/// Refuses settings the solver cannot work with (it would otherwise clamp them silently).
inline void check_solver_options(const SolverOptions& o) {
  check(o.buckets >= 1, "checkpoint planner: SolverOptions::buckets must be at least 1, got ", o.buckets);
  check(std::isfinite(o.work_limit) && o.work_limit > 0.0,
        "checkpoint planner: SolverOptions::work_limit must be a positive number, got ", o.work_limit);
}
}  // namespace detail

/// \brief A solver's answer.
struct PlanSolution {
  bool feasible = false;
  std::vector<Segment> segments;
  PlanPrediction prediction;
};

namespace detail {

/// How finely one dynamic program works: bytes per bucket and the longest segment it relaxes.
struct Resolution {
  std::int64_t u = 1;           // bucket width in bytes (1: exact)
  std::int64_t max_length = 0;  // stages in the longest segment considered
};

/// The resolution of a program at `budget` on channel c. All N² segments, with the work
/// limit's N²·S bucket updates deciding S, while that leaves at least a bucket per stage.
/// (N²/2 segments of each of the two multi-stage modes.) On longer chains (1,024 stages:
/// 119 buckets) a stage's kept bytes would be a fraction of a bucket and rounding would
/// decide the schedule; there the program keeps 2N buckets (at most `buckets`) and relaxes
/// segments of at most work_limit / (2N·S) stages (30 at 1,024 stages), far longer than
/// the segments the plans of such chains use.
inline Resolution resolution(const ChainProfile& p, int c, std::int64_t budget, const SolverOptions& o) {
  const std::int64_t n = std::max<std::int64_t>(1, p.size());
  const double nd = static_cast<double>(n);
  const auto all_segments = static_cast<std::int64_t>(std::min(1e15, o.work_limit / (nd * nd)));
  Resolution r;
  std::int64_t buckets = 0;
  if (all_segments >= std::min(o.buckets, n)) {
    buckets = std::min(o.buckets, all_segments);
    r.max_length = n;
  } else {
    buckets = std::min(o.buckets, 2 * n);
    r.max_length = std::clamp<std::int64_t>(
        static_cast<std::int64_t>(o.work_limit / (2.0 * nd * static_cast<double>(buckets))), 8, n);
  }
  buckets = std::max<std::int64_t>(16, buckets);
  r.u = std::max<std::int64_t>(1, (budget - p.start_live[c] + buckets - 1) / buckets);
  return r;
}

/// Whether rounding each segment's bytes to the nearest bucket may give a schedule that
/// fits: its error, up to u/2 a segment, over as many segments as stages must stay below
/// a quarter of the budget's range. Where it would not, the round-up pass alone runs.
inline bool rounding_to_nearest_can_fit(const ChainProfile& p, int c, std::int64_t budget, const SolverOptions& o) {
  const std::int64_t u = resolution(p, c, budget, o).u;
  return u == 1 ||
         static_cast<double>(p.size()) * static_cast<double>(u) <= static_cast<double>(budget - p.start_live[c]) / 2.0;
}

/// One dynamic program at budget `budget` on channel c (see NOTE [The dynamic program]).
inline PlanSolution solve_once(const ChainProfile& p, int c, std::int64_t budget, const SolverOptions& o,
                               bool round_up) {
  const std::int64_t n = p.size();
  PlanSolution none;
  const std::int64_t range = budget - p.start_live[c];
  if (range < 0 || p.outside_peak[c] > budget) return none;
  const Resolution resolved = resolution(p, c, budget, o);
  const std::int64_t u = resolved.u;
  const std::int64_t width = range / u + 1;
  const std::vector<std::int64_t> g = leftover_suffix(p, c);
  constexpr float kInf = std::numeric_limits<float>::infinity();
  std::vector<float> best(at((n + 1) * width), kInf);
  // ((2j + hold) * kModeCodes + mode) of the step into each state; the state it came from
  // is the bucket minus that segment's shift, recomputed when the schedule is read back.
  constexpr std::int32_t kModeCodes = static_cast<std::int32_t>(StageMode::Nested) + 1;
  std::vector<std::int32_t> from(at((n + 1) * width), -1);
  std::vector<std::int64_t> lo(at(n + 1), width), hi(at(n + 1), -1);
  best[0] = 0.0;
  lo[0] = hi[0] = 0;
  const auto bucket_floor = [u](std::int64_t bytes) {
    return bytes < 0 ? -((-bytes + u - 1) / u) : bytes / u;  // floor division
  };
  const auto shift_of = [u, round_up](std::int64_t kept) -> std::int64_t {
    if (round_up) return kept > 0 ? (kept + u - 1) / u : -((-kept) / u);
    return std::llround(static_cast<double>(kept) / static_cast<double>(u));
  };
  const auto relax = [&](std::int64_t j, std::int64_t j2, int hold, int mode, const SegmentCost& cost) {
    const std::int64_t limit_f = bucket_floor(budget - p.start_live[c] - cost.fwd_level);
    const std::int64_t limit_b =
        bucket_floor(budget - p.start_live[c] - cost.kept - p.backward_rest[c] - g[at(j2)] - cost.bwd_level);
    const std::int64_t top = std::min({hi[at(j)], limit_f, limit_b});
    if (top < lo[at(j)]) return;
    const std::int64_t shift = shift_of(cost.kept);
    const std::int64_t first = std::max(lo[at(j)], -shift), last = std::min(top, width - 1 - shift);
    if (last < first) return;
    // Rows j and j2 > j of `best` never overlap. The loop is most of the solve: branch-free
    // and marked simd, it runs 16 buckets an instruction with AVX-512 (OpenMP or -fopenmp-simd on).
    const float* __restrict src = &best[at(j * width)];
    float* __restrict dst = &best[at(j2 * width + shift)];
    std::int32_t* __restrict into = &from[at(j2 * width + shift)];
    const auto code = static_cast<std::int32_t>((2 * j + hold) * kModeCodes + mode);
#pragma omp simd
    for (std::int64_t a = first; a <= last; ++a) {
      const float v = src[a] + static_cast<float>(cost.ms);
      const bool better = v < dst[a];
      dst[a] = better ? v : dst[a];
      into[a] = better ? code : into[a];
    }
    lo[at(j2)] = std::min(lo[at(j2)], first + shift);  // a superset of the finite entries
    hi[at(j2)] = std::max(hi[at(j2)], last + shift);
  };
  // Prefix sums of the backward live changes of inner stages (plain, or one-stage regions),
  // unheld and held.
  const int holds = o.allow_hold && !p.held.empty() ? 2 : 1;
  std::array<std::array<std::vector<std::int64_t>, 2>, 2> prefixes;
  for (int h = 0; h < holds; ++h)
    prefixes[at(h)] = {backward_change_prefix(p.costs(h == 1), 0, c), backward_change_prefix(p.costs(h == 1), 1, c)};
  for (std::int64_t j = 0; j < n; ++j) {
    if (hi[at(j)] < lo[at(j)]) continue;
    for (int h = 0; h < holds; ++h) {
      const std::vector<StageCosts>& stages = p.costs(h == 1);
      const auto& pes = prefixes[at(h)];
      const StageCosts& sj = stages[at(j)];
      relax(j, j + 1, h, 0,
            SegmentCost{sj.kept[0][c], sj.fwd_peak[0][c], sj.bwd_peak[0][c], sj.fwd_ms[0] + sj.bwd_ms[0]});
      for (int mode = 1; mode <= static_cast<int>(StageMode::Nested); ++mode) {
        const auto sm = static_cast<StageMode>(mode);
        if ((is_selective(sm) && !o.allow_selective) || (sm == StageMode::Nested && !o.allow_nested) ||
            (sm == StageMode::Offload && !o.allow_offload) || !p.measured[at(profiled(sm))])
          continue;
        const int m = profiled(sm), q = inner_mode(sm);  // the region's stage costs; its inner stages'
        const std::vector<std::int64_t>& pe = pes[at(q)];
        std::int64_t inner = 0;           // region-kept bytes of stages j..j2-1 minus their outputs
        std::int64_t fwd_level = 0;       // running forward level
        std::int64_t recomputed = 0;      // recompute of stages j..j2-2
        std::int64_t recompute_peak = 0;  // running max of recompute levels of stages j..j2-2
        std::int64_t back_peak = std::numeric_limits<std::int64_t>::min();  // max of bwd_peak[0][k] - pe[k+1]
        double fwd_ms = 0.0, inner_ms = 0.0;
        // Selective regions span one stage: a longer one also keeps each inner stage's
        // last matmul output (the next stage's recompute needs it), which the one-stage
        // profile cannot see; with a residual add after that matmul it saves nothing anyway.
        // Offload regions too: the region model recomputes a longer region's inner stages,
        // which an Offload region brings back from host memory instead.
        const std::int64_t last_end = is_one_stage(sm) ? j + 1 : std::min(n, j + resolved.max_length);
        for (std::int64_t j2 = j + 1; j2 <= last_end; ++j2) {
          const std::int64_t k = j2 - 1;  // the region's last stage
          const StageCosts& st = stages[at(k)];
          if (k > j) {  // stage k-1 becomes an inner stage
            const StageCosts& in = stages[at(k - 1)];
            recompute_peak = std::max(recompute_peak, recomputed + in.fwd_peak[q][c]);
            recomputed += in.kept[q][c] - in.kept[m][c] + in.output_bytes;
            back_peak = std::max(back_peak, in.bwd_peak[q][c] - pe[at(k)]);
            inner_ms += inner_backward_ms(stages[at(k - 1)], sm);
          }
          const std::int64_t held = k > j ? stages[at(k - 1)].output_bytes : 0;
          fwd_level = std::max(fwd_level, inner + held + st.fwd_peak[m][c]);
          fwd_ms += st.fwd_ms[m];
          // The forward level only grows with j2: once no bucket of j is below its limit, no
          // longer segment from j fits either.
          if (bucket_floor(budget - p.start_live[c] - fwd_level) < lo[at(j)]) break;
          if (sm != StageMode::Nested || k > j) {  // a one-stage Nested segment is a Recompute one
            SegmentCost cost;
            cost.kept = inner + st.kept[m][c];
            cost.fwd_level = fwd_level;
            cost.bwd_level = std::max(recompute_peak, recomputed + st.bwd_peak[m][c]);
            if (k > j)
              cost.bwd_level = std::max(cost.bwd_level, recomputed + st.bwd_change[m][c] + pe[at(k)] + back_peak);
            cost.ms = fwd_ms + inner_ms + st.bwd_ms[m];
            relax(j, j2, h, mode, cost);
          }
          inner += st.kept[m][c] - st.output_bytes;
        }
      }
    }
  }
  std::int64_t best_a = -1;
  const std::int64_t limit_end = bucket_floor(budget - p.start_live[c] - loss_need(p, c));
  for (std::int64_t a = lo[at(n)]; a <= std::min(hi[at(n)], limit_end); ++a)
    if (best[at(n * width + a)] < kInf && (best_a < 0 || best[at(n * width + a)] < best[at(n * width + best_a)]))
      best_a = a;
  if (best_a < 0) return none;
  PlanSolution s;
  s.feasible = true;
  std::int64_t j2 = n, a2 = best_a;
  while (j2 > 0) {
    const std::int32_t f = from[at(j2 * width + a2)];
    const Segment segment{f / kModeCodes / 2, j2, static_cast<StageMode>(f % kModeCodes), (f / kModeCodes) % 2 == 1};
    s.segments.push_back(segment);
    a2 -= shift_of(segment_cost(p, c, segment).kept);
    j2 = segment.begin;
  }
  std::reverse(s.segments.begin(), s.segments.end());
  s.prediction = predict(p, s.segments);
  return s;
}

}  // namespace detail

/// The fastest schedule whose predicted peak on `channel` is at most `budget`; not
/// feasible when none is. The answer is always checked against `predict`.
inline PlanSolution solve_chain(const ChainProfile& p, MemChannel channel, std::int64_t budget,
                                const SolverOptions& options = {}) {
  detail::check_solver_options(options);
  // A budget beyond any device (INT64_MAX for "no limit") plans as 2^62 bytes, and one
  // below -2^62 as that: the program's byte arithmetic stays in range.
  constexpr std::int64_t kLargest = std::int64_t{1} << 62;
  budget = std::clamp(budget, -kLargest, kLargest);
  const int c = static_cast<int>(channel);
  // Buckets rounded to nearest first; if rounding let a schedule through that the exact
  // model rejects, once more with every segment's bytes rounded up (never lets one through).
  PlanSolution s;
  if (detail::rounding_to_nearest_can_fit(p, c, budget, options)) {
    s = detail::solve_once(p, c, budget, options, false);
    if (s.feasible && s.prediction.peak[c] <= budget) return s;
  }
  s = detail::solve_once(p, c, budget, options, true);
  if (s.feasible && s.prediction.peak[c] <= budget) return s;
  return {};
}

/// The smallest budget on `channel` that the solver meets (to `tolerance` bytes; exact
/// when it works in whole bytes).
inline std::int64_t smallest_budget(const ChainProfile& p, MemChannel channel, const SolverOptions& options = {},
                                    std::int64_t tolerance = 0) {
  const int c = static_cast<int>(channel);
  std::int64_t hi = predict(p, {{0, p.size(), StageMode::Keep}}).peak[c];  // plain always fits its own peak
  std::int64_t lo = std::max(p.outside_peak[c], p.start_live[c]) - 1;      // never feasible below these
  if (tolerance <= 0) tolerance = std::max<std::int64_t>(1, (hi - lo) / 4096);
  while (hi - lo > tolerance) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    if (solve_chain(p, channel, mid, options).feasible) hi = mid;
    else lo = mid;
  }
  return hi;
}

}  // namespace trainmem
