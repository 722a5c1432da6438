// trainmem/checkpoint/plan_file.hpp — a checkpoint plan as a small JSON file, so one
// plan, made once, runs in every later process without profiling.
//
// NOTE [Saved plans]
// Profiling times every stage, and on a busy machine those times move from run to run,
// so two processes planning the same model may pick different schedules. A plan saved
// with CheckpointPlan::save and loaded with CheckpointPlan::load (planner.hpp) is the
// same schedule everywhere: what a loaded plan runs is bitwise what the saved one ran.
// The file holds the schedule, the budget it was made for, the model's prediction and
// what the plan was made for; a field is written as the exact text that reads back to
// the same number (to_chars), so save -> load gives an equal PlanRecord. Loading is
// strict: a truncated file, an unknown or missing field, a field of the wrong type, a
// format or version other than this one, segments that do not tile the chain, or a
// plan for another model is a trainmem::Error naming the field. A plan is for a model
// when it names the same number of stages, the same `model` (PlannerOptions::model,
// the user's name for the model: its architecture, sizes and batch shape; the stages
// themselves are functions, with nothing to compare) and the same number of
// micro-batches (its predicted peak counts them); budget, prediction and per-segment
// figures are what the planner predicted when it made the plan. A segment whose stages
// hold (StageHold, checkpoint/stage_hold.hpp) carries "hold": true; without it, false.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "trainmem/checkpoint/detail/json.hpp"
#include "trainmem/checkpoint/planner_solver.hpp"

namespace trainmem {

/// \brief A byte budget: the whole step's peak on the device, or the peak of saved activations.
struct Budget {
  MemChannel channel = MemChannel::Total;
  std::int64_t bytes = 0;
  static Budget whole_step(std::int64_t bytes) { return {MemChannel::Total, bytes}; }
  static Budget saved_activations(std::int64_t bytes) { return {MemChannel::Saved, bytes}; }
  bool operator==(const Budget&) const = default;
};

namespace detail {
inline const char* channel_name(MemChannel c) { return c == MemChannel::Total ? "whole step" : "saved activations"; }
}  // namespace detail

/// \brief Peak bytes and time of one step, measured.
struct StepMeasurement {
  std::array<std::int64_t, kMemChannels> peak{};
  double ms = 0.0;
  bool operator==(const StepMeasurement&) const = default;
};

/// \brief Everything a saved plan holds (NOTE [Saved plans]).
struct PlanRecord {
  static constexpr std::int64_t kVersion = 1;
  static constexpr std::string_view kFormat = "trainmem checkpoint plan";

  std::string model;        // PlannerOptions::model: the user's name for the model
  std::int64_t stages = 0;  // stages in the chain
  int micro_batches = 1;    // micro-batches per step (PlannerOptions::micro_batches)
  Budget budget;            // what the plan was made for
  std::vector<Segment> segments;
  std::vector<std::int64_t> segment_kept;  // per segment: saved bytes kept after its forward
  std::vector<double> segment_ms;          // per segment: predicted time per micro-batch
  PlanPrediction prediction;               // the whole step's
  std::int64_t model_state = 0;            // parameters, gradients, masters, optimizer state
  StepMeasurement plain;                   // the plain step, as profiled
  bool operator==(const PlanRecord&) const = default;

  /// The record as JSON text (fixed key order; numbers that read back bitwise).
  std::string to_json() const {
    namespace js = detail::json;
    const auto peaks = [](const std::array<std::int64_t, kMemChannels>& p, double ms, const char* field) {
      return detail::concat("{\"whole_step_bytes\": ", p[0], ", \"saved_activation_bytes\": ", p[1],
                            ", \"ms\": ", js::number(ms, field), "}");
    };
    std::string out = "{\n";
    out += detail::concat("  \"format\": ", js::quoted(kFormat), ",\n");
    out += detail::concat("  \"version\": ", kVersion, ",\n");
    out += detail::concat("  \"model\": ", js::quoted(model), ",\n");
    out += detail::concat("  \"stages\": ", stages, ",\n");
    out += detail::concat("  \"micro_batches\": ", micro_batches, ",\n");
    out += detail::concat("  \"budget\": {\"channel\": ",
                          js::quoted(budget.channel == MemChannel::Total ? "whole_step" : "saved_activations"),
                          ", \"bytes\": ", budget.bytes, "},\n");
    out += "  \"segments\": [";
    for (std::size_t i = 0; i < segments.size(); ++i)
      out += detail::concat(
          i == 0 ? "\n" : ",\n", "    {\"begin\": ", segments[i].begin, ", \"end\": ", segments[i].end,
          ", \"mode\": ", js::quoted(name_of(segments[i].mode)), ", \"kept_bytes\": ", segment_kept[i],
          ", \"ms\": ", js::number(segment_ms[i], "segments.ms"), segments[i].hold ? ", \"hold\": true}" : "}");
    out += "\n  ],\n";
    out += detail::concat("  \"prediction\": ", peaks(prediction.peak, prediction.ms, "prediction.ms"), ",\n");
    out += detail::concat("  \"model_state_bytes\": ", model_state, ",\n");
    out += detail::concat("  \"plain\": ", peaks(plain.peak, plain.ms, "plain.ms"), "\n");
    out += "}\n";
    return out;
  }

  /// Reads a record from JSON text, strictly (NOTE [Saved plans]); `source` (a path) names
  /// the text in an Error. Checks the file's own consistency, not which model it is for.
  static PlanRecord from_json(std::string_view text, const std::string& source = "plan") {
    namespace js = detail::json;
    const std::string who = "checkpoint plan " + source;
    const js::Value doc = js::parse(text, who);
    const js::Field root(doc, "", &who);
    root.require_keys({"format", "version", "model", "stages", "micro_batches", "budget", "segments", "prediction",
                       "model_state_bytes", "plain"});
    const std::string format = root.at("format").string();
    if (format != kFormat) root.at("format").fail(detail::concat("is '", format, "', expected '", kFormat, "'"));
    const std::int64_t version = root.at("version").integer();
    if (version != kVersion)
      root.at("version").fail(detail::concat("is ", version, ": this library reads version ", kVersion));
    PlanRecord r;
    r.model = root.at("model").string();
    r.stages = root.at("stages").integer();
    if (r.stages < 1) root.at("stages").fail(detail::concat("is ", r.stages, ", expected at least 1"));
    const std::int64_t micro = root.at("micro_batches").integer();
    if (micro < 1 || micro > 1 << 20)
      root.at("micro_batches").fail(detail::concat("is ", micro, ", expected 1 or more"));
    r.micro_batches = static_cast<int>(micro);
    const js::Field budget = root.at("budget");
    budget.require_keys({"channel", "bytes"});
    const std::string channel = budget.at("channel").string();
    if (channel != "whole_step" && channel != "saved_activations")
      budget.at("channel").fail(detail::concat("is '", channel, "', expected 'whole_step' or 'saved_activations'"));
    r.budget = {channel == "whole_step" ? MemChannel::Total : MemChannel::Saved, budget.at("bytes").integer()};
    const js::Field segments = root.at("segments");
    for (std::size_t i = 0; i < segments.size(); ++i) {
      const js::Field s = segments[i];
      s.require_keys({"begin", "end", "mode", "kept_bytes", "ms"}, {"hold"});
      Segment segment{s.at("begin").integer(), s.at("end").integer(), StageMode::Keep};
      if (s.has("hold")) segment.hold = s.at("hold").boolean();
      const std::string mode = s.at("mode").string();
      bool known = false;
      for (int m = 0; m <= static_cast<int>(StageMode::Nested); ++m)
        if (mode == name_of(static_cast<StageMode>(m))) segment.mode = static_cast<StageMode>(m), known = true;
      if (!known)
        s.at("mode").fail(detail::concat("is '", mode,
                                         "', expected one of 'keep', 'recompute', 'selective', 'save attention', "
                                         "'offload', 'nested'"));
      if (segment.begin < 0 || segment.end <= segment.begin || segment.end > r.stages ||
          (!r.segments.empty() && r.segments.back().end != segment.begin) || (r.segments.empty() && segment.begin != 0))
        s.fail(detail::concat("covers stages [", segment.begin, ", ", segment.end,
                              "): the segments must cover the plan's ", r.stages,
                              " stages in order, each starting where the one before it ended"));
      r.segments.push_back(segment);
      r.segment_kept.push_back(s.at("kept_bytes").integer());
      r.segment_ms.push_back(s.at("ms").real());
    }
    if (r.segments.empty() || r.segments.back().end != r.stages)
      segments.fail(detail::concat("covers stages [0, ", r.segments.empty() ? 0 : r.segments.back().end,
                                   ") of the plan's ", r.stages, "; it must cover every stage"));
    const auto peaks = [](const js::Field& f, std::array<std::int64_t, kMemChannels>& peak, double& ms) {
      f.require_keys({"whole_step_bytes", "saved_activation_bytes", "ms"});
      peak = {f.at("whole_step_bytes").integer(), f.at("saved_activation_bytes").integer()};
      ms = f.at("ms").real();
    };
    peaks(root.at("prediction"), r.prediction.peak, r.prediction.ms);
    r.model_state = root.at("model_state_bytes").integer();
    peaks(root.at("plain"), r.plain.peak, r.plain.ms);
    return r;
  }
};

}  // namespace trainmem
