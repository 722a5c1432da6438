// examples/common/training.hpp — one training step, with the two places memory settings enter.
//
// A model is a list of stages (embedding, blocks or layers, head), each a function
// Var -> Var. Two seams decide what a step costs in memory, and each lives in one
// place here:
//  - `run_stages` runs the stages under a checkpoint schedule (which activations are
//    kept and which are recomputed in backward; a planned schedule runs the planner's
//    segments through a ChainRunner);
//  - `PrecisionRunner` wraps the forward (autocast) and the backward plus optimizer
//    step (loss scaling, FP32 master weights).
// `train_step` marks the phases of a step (forward, backward, optimizer) on the
// backend's MemoryStats, so a recorded timeline shows where the bytes go.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/settings.hpp"
#include "trainmem/checkpoint/planner.hpp"
#include "trainmem/trainmem.hpp"

namespace examples {

template <class B>
using Stage = std::function<trainmem::Var<B>(const trainmem::Var<B>&)>;

/// Runs `stages` on `x` in order under `schedule`: the one place checkpoint schedules plug in.
template <class B>
trainmem::Var<B> run_stages(const std::vector<Stage<B>>& stages, trainmem::Var<B> x,
                            const CheckpointSchedule& schedule) {
  namespace tmem = trainmem;
  const auto n = static_cast<std::int64_t>(stages.size());
  tmem::Tape<B>& tape = *x.tape();
  switch (schedule.kind) {
    case CheckpointSchedule::Kind::None:
      for (const auto& stage : stages) x = stage(x);
      return x;
    case CheckpointSchedule::Kind::Sqrt:  // ~sqrt(N) segments; the last is not checkpointed
      return tmem::checkpoint_sequential(tape, stages, tmem::sqrt_segments(n), x);
    case CheckpointSchedule::Kind::Every:  // a segment boundary every K stages
      return tmem::checkpoint_sequential(tape, stages, std::clamp<std::int64_t>(n / schedule.every, 1, n), x);
    case CheckpointSchedule::Kind::Selective: {  // each stage a region that keeps its matmul outputs
      tmem::CheckpointOptions options;
      options.policy = tmem::policy::save_matmuls();
      for (const auto& stage : stages) x = tmem::checkpoint(tape, options, stage, x);
      return x;
    }
    case CheckpointSchedule::Kind::Plan:  // the planner's segments, through ordinary regions
      tmem::require(!schedule.plan.empty(), "run_stages: checkpoint ", name_of(schedule), " has not been planned");
      return tmem::ChainRunner<B>(stages, schedule.plan)(x);
  }
  return x;
}

/// \brief What a step did: its loss and whether the optimizer stepped.
struct StepOutcome {
  double loss = 0.0;
  bool stepped = true;
};

/// \brief The precision a model trains in: the one place autocast, loss scaling and
/// FP32 master weights plug in.
template <class B>
class PrecisionRunner {
 public:
  /// FP32 trains as is. BF16 and FP16 turn the optimizer's parameters into 16-bit model
  /// copies with FP32 masters the optimizer updates; FP16 also scales the loss dynamically.
  PrecisionRunner(Precision precision, trainmem::optim::Optimizer<B>& optimizer)
      : precision_(precision), optimizer_(&optimizer), scaler_(scaler_for(precision)) {
    if (precision == Precision::Fp32) return;
    std::vector<trainmem::Var<B>> params;
    for (const auto& entry : optimizer.entries()) params.push_back(entry.param);
    masters_.emplace(params, trainmem::amp::MasterWeightsOptions{compute_dtype()});
    masters_->attach(optimizer);
  }

  /// The dtype model parameters are created in (mixed precision converts them after).
  static trainmem::DType parameter_dtype(Precision) { return trainmem::DType::F32; }

  /// Runs `forward` (which returns the loss) in this precision.
  template <class Forward>
  trainmem::Var<B> forward(Forward&& forward) {
    if (precision_ == Precision::Fp32) return std::forward<Forward>(forward)();
    trainmem::amp::Autocast autocast(compute_dtype());
    return std::forward<Forward>(forward)();
  }

  /// Backward from `loss` (scaled under FP16), then one optimizer step (skipped on an
  /// overflow) and zeroed gradients. Returns whether the optimizer stepped.
  bool backward_and_step(const trainmem::Var<B>& loss, trainmem::MemoryStats& stats) {
    backward(loss);
    return step(stats);
  }
  /// Backward from `loss` (scaled under FP16).
  void backward(const trainmem::Var<B>& loss) { scaler_.scale(loss).backward(); }
  /// The optimizer step after backward (skipped on an overflow), then zeroed gradients.
  bool step(trainmem::MemoryStats& stats) {
    stats.mark("optimizer");
    const bool stepped = scaler_.step(*optimizer_);
    scaler_.update();
    optimizer_->zero_grad();
    if (!stepped) ++skipped_;
    return stepped;
  }

  /// What the progress line shows about precision: the loss scale and skipped steps under FP16.
  std::string status() const {
    if (precision_ != Precision::Fp16) return {};
    return "scale " + std::to_string(static_cast<long long>(scaler_.get_scale())) + ", skipped " +
           std::to_string(skipped_);
  }

 private:
  trainmem::DType compute_dtype() const {
    return precision_ == Precision::Fp16 ? trainmem::DType::F16 : trainmem::DType::BF16;
  }
  static trainmem::amp::GradScaler<B> scaler_for(Precision precision) {
    trainmem::amp::GradScalerOptions options;
    options.enabled = precision == Precision::Fp16;  // BF16 has FP32's range: no scaling
    return trainmem::amp::GradScaler<B>(options);
  }

  Precision precision_;
  trainmem::optim::Optimizer<B>* optimizer_;
  trainmem::amp::GradScaler<B> scaler_;
  std::optional<trainmem::amp::MasterWeights<B>> masters_;
  std::int64_t skipped_ = 0;
};

/// One training step: the model's input, its stages, `loss_of(output)`, backward, optimizer step.
/// A Model has `Var<B> embed(Tape<B>&, const Tensor<B>& input) const` (the input as the
/// first stage sees it) and `std::vector<Stage<B>> stages(bool training) const`.
template <class B, class Model, class LossOf>
StepOutcome train_step(trainmem::Tape<B>& tape, const Model& model, const std::vector<Stage<B>>& stages,
                       const trainmem::Tensor<B>& input, LossOf&& loss_of, const CheckpointSchedule& schedule,
                       PrecisionRunner<B>& precision) {
  trainmem::MemoryStats& stats = tape.backend().memory();
  stats.mark("forward");
  StepOutcome outcome;
  {
    trainmem::Var<B> loss =
        precision.forward([&] { return loss_of(run_stages(stages, model.embed(tape, input), schedule)); });
    outcome.loss = loss.value().template to_host<double>()[0];
    stats.mark("backward");
    outcome.stepped = precision.backward_and_step(loss, stats);
  }
  tape.clear();
  stats.mark("end");
  return outcome;
}

/// train_step with the stages run by `run` (a planner's profiling or planned runner).
template <class B, class Model, class LossOf>
StepOutcome train_step(trainmem::Tape<B>& tape, const Model& model, const trainmem::Tensor<B>& input, LossOf&& loss_of,
                       const trainmem::ChainRunner<B>& run, PrecisionRunner<B>& precision) {
  trainmem::MemoryStats& stats = tape.backend().memory();
  stats.mark("forward");
  StepOutcome outcome;
  {
    trainmem::Var<B> loss = precision.forward([&] { return loss_of(run(model.embed(tape, input))); });
    outcome.loss = loss.value().template to_host<double>()[0];
    stats.mark("backward");
    run.backward_with([&] { precision.backward(loss); });
    outcome.stepped = precision.step(stats);
  }
  tape.clear();
  stats.mark("end");
  return outcome;
}

/// Evaluation: forward only, nothing recorded; `stages` should be built with training = false.
/// With 16-bit model parameters (mixed precision) it runs under autocast to their dtype.
template <class B, class Model>
trainmem::Tensor<B> infer(trainmem::Tape<B>& tape, const Model& model, const std::vector<Stage<B>>& stages,
                          const trainmem::Tensor<B>& input) {
  trainmem::NoGradGuard no_grad;
  const trainmem::DType stored = model.parameters().front().dtype();
  trainmem::amp::Autocast autocast(trainmem::is_16bit(stored) ? stored : trainmem::DType::BF16,
                                   trainmem::is_16bit(stored));
  trainmem::Tensor<B> out = run_stages(stages, model.embed(tape, input), CheckpointSchedule{}).value();
  tape.clear();
  return out;
}

/// Learning rate at `step` of `total`: linear warm-up over the first 3% of steps, then a
/// cosine decay to zero (ends training at a low rate, which is worth a point of accuracy
/// over a constant rate in a run of a few epochs).
inline double learning_rate(double peak, std::int64_t step, std::int64_t total) {
  const std::int64_t warmup = std::max<std::int64_t>(1, total * 3 / 100);
  if (step < warmup) return peak * static_cast<double>(step + 1) / static_cast<double>(warmup);
  const double progress =
      static_cast<double>(step - warmup) / static_cast<double>(std::max<std::int64_t>(1, total - warmup));
  return peak * 0.5 * (1.0 + std::cos(3.141592653589793 * progress));
}

}  // namespace examples
