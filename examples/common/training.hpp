// examples/common/training.hpp — one training step, with the two places memory settings enter.
//
// A model is a list of stages (embedding, blocks or layers, head), each a function
// Var -> Var. Two seams decide what a step costs in memory, and each lives in one
// place here:
//  - `run_stages` runs the stages under a checkpoint schedule (which activations are
//    kept and which are recomputed in backward; a planned schedule runs the planner's
//    segments through a ChainRunner);
//  - the library's `amp::TrainStep` wraps the forward (autocast) and the backward plus
//    optimizer step (loss scaling, FP32 master weights); `dtype_of` gives it the
//    precision an example was asked for. Models are created in FP32: under BF16 and FP16
//    the helper turns their parameters into 16-bit copies of FP32 masters.
// The helper marks the phases of a step (forward, backward, optimizer) on the backend's
// MemoryStats and `train_step` the end, so a recorded timeline shows where the bytes go.
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

/// The dtype a model trains in under `precision`.
inline trainmem::DType dtype_of(Precision precision) {
  switch (precision) {
    case Precision::Fp32: return trainmem::DType::F32;
    case Precision::Bf16: return trainmem::DType::BF16;
    case Precision::Fp16: return trainmem::DType::F16;
  }
  return trainmem::DType::F32;
}

/// The FP8 recipe of a run with --fp8 (TrainStepOptions::fp8): delayed scaling over a
/// history of 16 steps, the max rule, no margin; none without it.
inline std::optional<trainmem::amp::DelayedScaling> fp8_of(const MemorySettings& settings) {
  if (!settings.fp8) return std::nullopt;
  return trainmem::amp::DelayedScaling{};
}

/// What the progress line shows about precision: the loss scale and skipped steps under FP16.
template <class B>
std::string precision_status(const trainmem::amp::TrainStep<B>& step) {
  if (!step.scaler().is_enabled()) return {};
  return "scale " + std::to_string(static_cast<long long>(step.scale())) + ", skipped " +
         std::to_string(step.skipped_steps());
}

/// One training step: the model's input, its stages, `loss_of(output)`, backward, optimizer step.
/// A Model has `Var<B> embed(Tape<B>&, const Tensor<B>& input) const` (the input as the
/// first stage sees it) and `std::vector<Stage<B>> stages(bool training) const`.
template <class B, class Model, class LossOf>
trainmem::amp::StepReport<B> train_step(trainmem::Tape<B>& tape, const Model& model,
                                        const std::vector<Stage<B>>& stages, const trainmem::Tensor<B>& input,
                                        LossOf&& loss_of, const CheckpointSchedule& schedule,
                                        trainmem::amp::TrainStep<B>& precision) {
  const trainmem::amp::StepReport<B> report =
      precision.run([&] { return loss_of(run_stages(stages, model.embed(tape, input), schedule)); });
  tape.clear();
  tape.backend().memory().mark("end");
  return report;
}

/// train_step with the stages run by `run` (a planner's profiling or planned runner).
template <class B, class Model, class LossOf>
trainmem::amp::StepReport<B> train_step(trainmem::Tape<B>& tape, const Model& model, const trainmem::Tensor<B>& input,
                                        LossOf&& loss_of, const trainmem::ChainRunner<B>& run,
                                        trainmem::amp::TrainStep<B>& precision) {
  trainmem::amp::StepReport<B> report;
  {
    const trainmem::Var<B> loss = precision.forward([&] { return loss_of(run(model.embed(tape, input))); });
    report.loss = loss.value();
    run.backward_with([&] { precision.backward(loss); });
    report.stepped = precision.update();
  }
  tape.clear();
  tape.backend().memory().mark("end");
  return report;
}

/// Evaluation: forward only, nothing recorded; `stages` should be built with training = false.
/// With 16-bit model parameters (mixed precision) it runs under autocast to their dtype,
/// and with `fp8` (a run trained with --fp8) its linears run in FP8 under the scales
/// training reached (no-grad records no amax, so evaluation does not move them).
template <class B, class Model>
trainmem::Tensor<B> infer(trainmem::Tape<B>& tape, const Model& model, const std::vector<Stage<B>>& stages,
                          const trainmem::Tensor<B>& input, trainmem::amp::Fp8Scaling<B>* fp8 = nullptr) {
  trainmem::NoGradGuard no_grad;
  const trainmem::DType stored = model.parameters().front().dtype();
  trainmem::amp::Autocast autocast(trainmem::is_16bit(stored) ? stored : trainmem::DType::BF16,
                                   trainmem::is_16bit(stored));
  std::optional<trainmem::amp::Fp8Autocast<B>> fp8_guard;
  if (fp8 != nullptr && trainmem::is_16bit(stored)) fp8_guard.emplace(*fp8, stored);
  trainmem::Tensor<B> out = run_stages(stages, model.embed(tape, input), CheckpointSchedule{}).value();
  tape.clear();
  return out;
}

/// The learning rate of a run of `total` steps: linear warm-up over the first 3% of steps,
/// then a cosine decay to zero (ends training at a low rate, which is worth a point of
/// accuracy over a constant rate in a run of a few epochs). amp::TrainStep applies it.
inline trainmem::optim::LrSchedule lr_schedule(double peak, std::int64_t total) {
  const std::int64_t warmup = std::max<std::int64_t>(1, total * 3 / 100);
  if (total <= warmup) return trainmem::optim::LrSchedule::linear_warmup(peak, warmup);
  return trainmem::optim::LrSchedule::warmup_cosine(peak, warmup, total);
}

}  // namespace examples
