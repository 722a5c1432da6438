// examples/common/settings.hpp — the memory settings an example trains under.
//
// Precision, checkpoint schedule and device are parsed here from their command-line
// spellings, and `require_available` is the one place that says which of them the
// examples can run. Every value the options accept is parsed in full; one that the
// example cannot run yet is refused with a message saying so, never quietly replaced
// by another.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "trainmem/checkpoint/planner_profile.hpp"
#include "trainmem/error.hpp"

namespace examples {

enum class Precision { Fp32, Bf16, Fp16 };
enum class Device { Cpu, Cuda };

/// \brief Which activations a training step keeps for backward.
struct CheckpointSchedule {
  enum class Kind {
    None,       // keep every activation
    Sqrt,       // about sqrt(N) segments of the N stages; keep only segment inputs
    Every,      // a segment boundary every K stages
    Selective,  // inside each stage, keep matmul outputs and recompute the cheap ops
    Plan,       // what the checkpoint planner picks for a whole-step budget
  };
  Kind kind = Kind::None;
  std::int64_t every = 0;               // K, for Kind::Every
  double plan_fraction = 0.0;           // Kind::Plan: the budget as a fraction of the plain FP32 step's peak
  std::vector<trainmem::Segment> plan;  // Kind::Plan: the planner's segments, once planned

  bool operator==(const CheckpointSchedule&) const = default;
};

inline std::string_view name_of(Precision p) {
  switch (p) {
    case Precision::Fp32: return "fp32";
    case Precision::Bf16: return "bf16";
    case Precision::Fp16: return "fp16";
  }
  return "?";
}
inline std::string_view name_of(Device d) { return d == Device::Cpu ? "cpu" : "cuda"; }
inline std::string name_of(const CheckpointSchedule& s) {
  switch (s.kind) {
    case CheckpointSchedule::Kind::None: return "none";
    case CheckpointSchedule::Kind::Sqrt: return "sqrt";
    case CheckpointSchedule::Kind::Every: return "every:" + std::to_string(s.every);
    case CheckpointSchedule::Kind::Selective: return "selective";
    case CheckpointSchedule::Kind::Plan: {
      char text[32];
      std::snprintf(text, sizeof text, "plan:%g", s.plan_fraction);
      return text;
    }
  }
  return "?";
}

inline Precision parse_precision(std::string_view text) {
  if (text == "fp32") return Precision::Fp32;
  if (text == "bf16") return Precision::Bf16;
  if (text == "fp16") return Precision::Fp16;
  throw trainmem::Error("--precision: '" + std::string(text) + "' is not one of fp32, bf16, fp16");
}

inline Device parse_device(std::string_view text) {
  if (text == "cpu") return Device::Cpu;
  if (text == "cuda") return Device::Cuda;
  throw trainmem::Error("--device: '" + std::string(text) + "' is not one of cpu, cuda");
}

/// "none", "sqrt", "selective", "every:K" with K a positive integer, or "plan:F" with F
/// in (0, 1]: the planner's fastest schedule within F times the plain FP32 step's peak.
inline CheckpointSchedule parse_checkpoint(std::string_view text) {
  using Kind = CheckpointSchedule::Kind;
  const auto of = [](Kind kind, std::int64_t every = 0) {
    CheckpointSchedule s;
    s.kind = kind;
    s.every = every;
    return s;
  };
  if (text == "none") return of(Kind::None);
  if (text == "sqrt") return of(Kind::Sqrt);
  if (text == "selective") return of(Kind::Selective);
  constexpr std::string_view kPlan = "plan:";
  if (text.substr(0, kPlan.size()) == kPlan) {
    const std::string digits(text.substr(kPlan.size()));
    std::size_t used = 0;
    double f = 0.0;
    try {
      f = std::stod(digits, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    trainmem::require(!digits.empty() && used == digits.size() && f > 0.0 && f <= 1.0, "--checkpoint: '", text,
                      "' needs a fraction in (0, 1] of the plain FP32 step's peak after 'plan:', e.g. plan:0.5");
    CheckpointSchedule s = of(Kind::Plan);
    s.plan_fraction = f;
    return s;
  }
  constexpr std::string_view kEvery = "every:";
  if (text.substr(0, kEvery.size()) == kEvery) {
    const std::string digits(text.substr(kEvery.size()));
    std::size_t used = 0;
    long long k = 0;
    try {
      k = std::stoll(digits, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    trainmem::require(!digits.empty() && used == digits.size() && k > 0, "--checkpoint: '", text,
                      "' needs a positive whole number of stages after 'every:', e.g. every:2");
    return of(Kind::Every, static_cast<std::int64_t>(k));
  }
  throw trainmem::Error("--checkpoint: '" + std::string(text) +
                        "' is not one of none, sqrt, every:K, selective, plan:F");
}

/// \brief Precision, checkpoint schedule and device of one training run.
struct MemorySettings {
  Precision precision = Precision::Fp32;
  CheckpointSchedule checkpoint;
  Device device = Device::Cpu;
  bool fp8 = false;  // --fp8: linear's GEMMs in FP8 (delayed scaling) on top of bf16 / fp16

  /// The same model's plain step: FP32, every activation kept (the memory baseline).
  MemorySettings plain() const { return {Precision::Fp32, {}, device, false}; }
  std::string str() const {
    return std::string(name_of(precision)) + (fp8 ? " + fp8" : "") + ", checkpoint " + name_of(checkpoint) + ", " +
           std::string(name_of(device));
  }
};

/// Throws unless the examples can run `s`. Every checkpoint schedule and precision is
/// wired in; the CUDA backend is not (the CUDA programs are under benchmarks/), so
/// --device cuda is refused, not ignored.
inline void require_available(const MemorySettings& s) {
  trainmem::require(s.checkpoint.kind != CheckpointSchedule::Kind::Every || s.checkpoint.every >= 1,
                    "--checkpoint every:K needs K >= 1, got ", s.checkpoint.every);
  trainmem::require(!s.fp8 || s.precision != Precision::Fp32,
                    "--fp8 runs on top of 16-bit autocast: add --precision bf16 (or fp16)");
  trainmem::require(s.device == Device::Cpu, "--device ", name_of(s.device),
                    ": this example runs on the CPU backend only so far; use --device cpu");
}

}  // namespace examples
