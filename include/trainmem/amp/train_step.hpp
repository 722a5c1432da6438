// trainmem/amp/train_step.hpp — one training step in a chosen precision: autocast
// forward, scaled backward, then unscale, skip or step.
//
// What a precision changes in a step is decided here once, from its dtype:
//   f32   the forward runs as written, plain backward, optimizer step;
//   bf16  the forward runs under Autocast(bf16); with master weights (the default) the
//         optimizer's parameters become bf16 model copies of f32 masters that the
//         optimizer updates. No loss scaling: bf16 has f32's exponent range;
//   f16   as bf16, plus a GradScaler: backward runs from the scaled loss, a step whose
//         gradients hold an inf or NaN is skipped, and the scale backs off or grows.
// Without master weights the parameters stay f32 and only the forward is autocast.
//
// Host syncs: none of its own beyond what the scaler needs to say whether it stepped
// (f16: one read of the found-inf flag in GradScaler::step). The loss stays a device
// scalar until someone asks for it (StepReport::loss_value), the scale likewise.
//
//   amp::TrainStep<B> train(optimizer, {.precision = DType::F16});
//   amp::StepReport<B> report = train.run([&] { return cross_entropy(model(x), y); });
// or, to do something between the phases (read gradients, wrap the backward):
//   Var<B> loss = train.forward([&] { ... });
//   train.backward(loss);
//   bool stepped = train.update();
// Each phase marks itself on the backend's MemoryStats ("forward", "backward",
// "optimizer"), so a recorded timeline shows where a step's bytes go.
//
// state() / load_state(): the masters, the scaler and the count of skipped steps, so a
// TrainStep goes into trainmem::save / load (and a Planner's restore list) like the
// optimizer and the model beside it, which hold the rest of a run's state.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "trainmem/amp/grad_scaler.hpp"
#include "trainmem/amp/master_weights.hpp"
#include "trainmem/autocast/autocast.hpp"
#include "trainmem/optim/optimizer.hpp"
#include "trainmem/state/stateful.hpp"

namespace trainmem::amp {

/// \brief The precision a TrainStep trains in.
struct TrainStepOptions {
  DType precision = DType::F32;  // f32, bf16 or f16: the autocast dtype (f32: no autocast)
  bool master_weights = true;    // bf16 / f16: 16-bit model parameters behind f32 masters
  GradScalerOptions scaler{};    // used under f16 (and bf16 with scaler.scale_bf16)
  bool fp32_grads = false;       // with master weights: gradients summed in f32 (MasterWeightsOptions)
};

/// \brief What one step did.
template <class B>
struct StepReport {
  Tensor<B> loss;       // the unscaled loss, a scalar on the backend
  bool stepped = true;  // false: the scaler found an inf or NaN gradient and skipped

  /// The loss on the host (a device sync on a GPU).
  double loss_value() const { return loss.template to_host<double>()[0]; }
};

/// \brief A training step's precision machinery around one optimizer.
template <class B>
class TrainStep {
 public:
  /// Sets up `optimizer`'s parameters for `options.precision`: under bf16 / f16 with
  /// master weights they become 16-bit copies of f32 masters the optimizer updates.
  /// Before the optimizer's first step, and one TrainStep per optimizer; otherwise it
  /// throws before any parameter changes.
  explicit TrainStep(optim::Optimizer<B>& optimizer, TrainStepOptions options = {}, B& backend = B::default_instance())
      : optimizer_(&optimizer),
        options_(checked(options)),
        backend_(&backend),
        scaler_(options_.precision, options_.scaler, backend) {
    if (!is_16bit(options_.precision) || !options_.master_weights) return;
    std::vector<Var<B>> params;
    for (std::size_t i = 0; i < optimizer.entries().size(); ++i) {
      optimizer.check_may_take_master(i, "amp::TrainStep");  // before MasterWeights narrows anything
      params.push_back(optimizer.entries()[i].param);
    }
    MasterWeightsOptions masters{options_.precision};
    masters.fp32_grads = options_.fp32_grads;
    masters_.emplace(std::move(params), masters);
    masters_->attach(optimizer);
  }

  /// Runs `forward` (which returns the loss) under this precision's autocast.
  template <class Forward>
  Var<B> forward(Forward&& forward) {
    backend_->memory().mark("forward");
    if (!is_16bit(options_.precision)) return std::forward<Forward>(forward)();
    Autocast autocast(options_.precision);
    return std::forward<Forward>(forward)();
  }

  /// Backward from `loss`, scaled when the scaler is on.
  void backward(const Var<B>& loss) {
    backend_->memory().mark("backward");
    scaler_.scale(loss).backward();
  }

  /// The optimizer step after backward (skipped when a gradient is inf or NaN), the
  /// scale's update and zeroed gradients. Returns whether the optimizer stepped. A model
  /// copy the step made overflow is thrown (CopyOverflowError) once the step is finished
  /// like any other, so the next step starts clean.
  bool update() {
    backend_->memory().mark("optimizer");
    bool stepped = true;
    try {
      stepped = scaler_.step(*optimizer_);
    } catch (const CopyOverflowError&) {
      scaler_.update();
      optimizer_->zero_grad();
      throw;
    }
    scaler_.update();
    optimizer_->zero_grad();
    if (!stepped) ++skipped_;
    return stepped;
  }

  /// forward, backward and update: one whole step.
  template <class Forward>
  StepReport<B> run(Forward&& forward_pass) {
    StepReport<B> report;
    const Var<B> loss = forward(std::forward<Forward>(forward_pass));
    report.loss = loss.value();
    backward(loss);
    report.stepped = update();
    return report;
  }

  DType precision() const { return options_.precision; }
  const TrainStepOptions& options() const { return options_; }
  /// The current loss scale (a host read when scaling; 1 when not).
  double scale() const { return scaler_.get_scale(); }
  /// Steps the scaler skipped so far.
  std::int64_t skipped_steps() const { return skipped_; }
  GradScaler<B>& scaler() { return scaler_; }
  const GradScaler<B>& scaler() const { return scaler_; }
  /// The f32 masters (none under f32 or without master weights).
  const std::optional<MasterWeights<B>>& master_weights() const { return masters_; }

  /// The masters ("masters.*", absent without them), the scaler ("scaler.*") and
  /// "skipped_steps". The optimizer and the model's parameters are saved on their own.
  StateDict state() const {
    StateDict out;
    if (masters_) out.insert("masters", masters_->state());
    out.insert("scaler", trainmem::state_of(scaler_));
    out.set_i64("skipped_steps", skipped_);
    return out;
  }
  /// Throws (naming the entry) unless `state` fits this TrainStep; changes nothing.
  void check_state(const StateDict& state) const {
    StateDict rest;
    for (const auto& [name, entry] : state)
      if (!StateDict::is_under(name, "scaler") && !(masters_ && StateDict::is_under(name, "masters")))
        rest.set(name, entry);
    check_layout(rest, {{"skipped_steps", {StateType::I64, Shape{}}}}, "amp::TrainStep::load_state");
    trainmem::detail::check(rest.get_i64("skipped_steps") >= 0, "amp::TrainStep::load_state: skipped_steps is ",
                            rest.get_i64("skipped_steps"), ", expected a count (>= 0)");
    if (masters_) masters_->check_state(state.sub("masters"));
    trainmem::check_state(scaler_, state.sub("scaler"));
  }
  /// Restores a state() (after check_state: on error nothing changes). As with
  /// MasterWeights::load_state, the model copies are the model's state: load it too.
  void load_state(const StateDict& state) {
    check_state(state);
    if (masters_) masters_->load_state(state.sub("masters"));
    trainmem::load_state(scaler_, state.sub("scaler"));
    skipped_ = state.get_i64("skipped_steps");
  }

 private:
  static TrainStepOptions checked(const TrainStepOptions& options) {
    trainmem::detail::check(options.precision == DType::F32 || is_16bit(options.precision),
                            "amp::TrainStep: the precision must be f32, bf16 or f16, got ", options.precision);
    return options;
  }

  optim::Optimizer<B>* optimizer_;
  TrainStepOptions options_;
  B* backend_;
  GradScaler<B> scaler_;
  std::optional<MasterWeights<B>> masters_;
  std::int64_t skipped_ = 0;
};

}  // namespace trainmem::amp
