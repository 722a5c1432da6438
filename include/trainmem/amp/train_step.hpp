// trainmem/amp/train_step.hpp — one training step in a chosen precision: autocast
// forward, scaled backward, then unscale, skip or step; with micro-batches accumulated,
// the gradient norm clipped and the learning rate scheduled.
//
// What a precision changes in a step is decided here once, from its dtype:
//   f32   the forward runs as written, plain backward, optimizer step;
//   bf16  the forward runs under Autocast(bf16); with master weights (the default) the
//         optimizer's parameters become bf16 model copies of f32 masters that the
//         optimizer updates. No loss scaling: bf16 has f32's exponent range;
//   f16   as bf16, plus a GradScaler: backward runs from the scaled loss, a step whose
//         gradients hold an inf or NaN is skipped, and the scale backs off or grows.
// Without master weights the parameters stay f32 and only the forward is autocast.
// With `fp8` set (bf16 or f16 only), the forward runs under amp::Fp8Autocast: linear's
// GEMMs take FP8 operands with delayed scaling (autocast/fp8_scaling.hpp) over every 2-D
// parameter of the optimizer, and update() closes the FP8 step after the skip decision:
// a stepped update folds the step's amaxes (the max over its micro-batches) into the
// histories and makes new scales; a skipped one leaves histories and scales as they were.
// A step with an inf or NaN amax is skipped (FP8 saturated the value that overflowed):
// under f16 the scaler sees it with the gradients (GradScaler::check_with_grads) and
// backs off; under bf16 (no scaler) the amaxes' flag (Fp8Scaling::nonfinite_probe) is the
// step's found-inf flag: the optimizer's update passes skip on the device when it is set
// (optim::StepControl, NOTE [Steps a device can cancel]), and so does Fp8Scaling::
// update(found_inf), so update() reads nothing back. The host learns of such a skip only
// when it asks (see StepOutcome below): update()'s result and StepReport::stepped hold
// the flag and read it when converted to bool; skipped_steps() adds up the flags counted
// on the device, in one read when called.
//
// What a real loop adds around the step, in the order update() does it:
//   schedule        optimizer.set_lr(schedule.lr(k)) with k = step_count(), the updates
//                   run so far, taken or skipped: a skipped f16 step advances the schedule
//                   like any other (PyTorch's loop, which calls scheduler.step() every
//                   iteration), so `total_steps` is the loop's length whatever the scaler
//                   does, and the index is the loop's own step. It is in state(): a
//                   resumed run asks the schedule for the same rates.
//   clip_grad_norm  the gradients unscaled (scaler.unscale_), then optim::clip_grad_norm;
//                   the norm before clipping is reported (a host read). A step about to be
//                   skipped has a non-finite norm and is not clipped.
//   the step        scaler.step (skips on an inf or NaN), scaler.update, zero_grad.
// micro_batches = m: run(forward) calls forward(micro) for micro = 0 .. m-1, each loss
// times 1/m before its backward (so the gradients add up to the mean over the whole
// batch), then one update. The loss's tape is cleared after each backward in run():
// the graph is spent, and the next micro-batch records on it afresh.
//
// Host syncs: the scaler's (f16: one read of the found-inf flag in GradScaler::step) and,
// with clipping, the norm's; no other, FP8 or not. The loss stays a device scalar until
// someone asks for it (StepReport::loss_value), the scale, a bf16 + FP8 step's skip and
// skipped_steps() likewise.
//
//   amp::TrainStep<B> train(optimizer, {.precision = DType::BF16, .micro_batches = 2,
//                                       .clip_grad_norm = 1.0,
//                                       .schedule = optim::LrSchedule::warmup_cosine(3e-3, 10, 100)});
//   amp::StepReport<B> report = train.run([&](int micro) { return loss_of(batch[micro]); });
// or, to do something between the phases (read gradients, wrap the backward):
//   Var<B> loss = train.forward([&] { ... });   // once per micro-batch, with
//   train.backward(loss);                       // a loss the caller divided by m itself
//   bool stepped = train.update();              // schedule, clip, step or skip (bf16 + FP8: a host read)
// Each phase marks itself on the backend's MemoryStats ("forward", "backward",
// "optimizer"), so a recorded timeline shows where a step's bytes go.
//
// state() / load_state(): the masters, the scaler, the FP8 scaling state, the count of
// updates and of skipped ones, so a TrainStep goes into trainmem::save / load (and a Planner's restore list)
// like the optimizer and the model beside it, which hold the rest of a run's state.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "trainmem/amp/grad_scaler.hpp"
#include "trainmem/amp/master_weights.hpp"
#include "trainmem/autocast/autocast.hpp"
#include "trainmem/autocast/fp8_autocast.hpp"
#include "trainmem/ops/elementwise.hpp"
#include "trainmem/optim/clip_grad_norm.hpp"
#include "trainmem/optim/lr_schedule.hpp"
#include "trainmem/optim/optimizer.hpp"
#include "trainmem/state/stateful.hpp"

namespace trainmem::amp {

/// \brief The precision a TrainStep trains in, and what its loop does around the step.
struct TrainStepOptions {
  DType precision = DType::F32;  // f32, bf16 or f16: the autocast dtype (f32: no autocast)
  bool master_weights = true;    // bf16 / f16: 16-bit model parameters behind f32 masters
  bool fp32_grads = false;       // with master weights: gradients summed in f32 (MasterWeightsOptions)
  GradScalerOptions scaler{};    // used under f16 (and bf16 with scaler.scale_bf16)
  int micro_batches = 1;         // run(): this many forward + backward passes (loss / m each), one update
  double clip_grad_norm = 0.0;   // > 0: clip the global gradient norm to this after unscaling; 0: off
  std::optional<optim::LrSchedule> schedule{};  // set: the optimizer's lr is schedule.lr(step_count()) at each update
  std::optional<DelayedScaling> fp8{};          // set (bf16 / f16): linear's GEMMs in FP8 with this recipe
};

/// \brief Whether an update stepped, as a bool: known on the host, except when the device
/// decided (bf16 + FP8 without a loss scaler: a non-finite amax cancels the step there).
/// Then it holds the step's found-inf flag and converting it to bool reads the flag (a
/// host read: a device sync on a GPU), made only when the caller asks, as for the loss.
template <class B>
class StepOutcome {
 public:
  /// Known on the host (what the loss scaler read, or a step nothing could skip).
  StepOutcome(bool stepped = true) : stepped_(stepped) {}  // NOLINT(google-explicit-constructor): a bool
  /// Decided on the device: `found_inf` (an f32 scalar) is 0 when the step was taken.
  static StepOutcome on_device(Tensor<B> found_inf) {
    StepOutcome out;
    out.found_inf_ = std::move(found_inf);
    return out;
  }
  /// Whether the optimizer stepped; reads the flag when decided_on_device().
  operator bool() const {  // NOLINT(google-explicit-constructor): bool stepped = train.update();
    return found_inf_.defined() ? found_inf_.template to_host<float>()[0] == 0.0f : stepped_;
  }
  bool decided_on_device() const { return found_inf_.defined(); }
  /// The step's found-inf flag on the device (undefined when known on the host).
  const Tensor<B>& found_inf() const { return found_inf_; }

 private:
  bool stepped_ = true;
  Tensor<B> found_inf_;
};

/// \brief What one step did.
template <class B>
struct StepReport {
  Tensor<B> loss;                 // the unscaled loss (the mean over micro-batches), a scalar on the backend
  StepOutcome<B> stepped = true;  // false: an inf or NaN gradient (or FP8 amax) skipped the step
  double lr = 0.0;                // the optimizer's learning rate for this update (the schedule's, if one is set)
  /// With clipping on: the global gradient norm before clipping (unscaled; inf or NaN on a
  /// skipped step). Without clipping: none (it would cost a host read).
  std::optional<double> grad_norm;

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
    if (options_.fp8) {
      std::vector<Var<B>> params;
      for (const auto& e : optimizer.entries()) params.push_back(e.param);
      fp8_ = std::make_unique<Fp8Scaling<B>>(params, *options_.fp8, backend);
    }
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
    if (fp8_) {
      Fp8Autocast<B> autocast(*fp8_, options_.precision);
      return std::forward<Forward>(forward)();
    }
    Autocast autocast(options_.precision);
    return std::forward<Forward>(forward)();
  }

  /// Backward from `loss` as given (scaled when the scaler is on); gradients add to
  /// those of earlier backwards since the last update. run() divides each micro-batch's
  /// loss by micro_batches first; a loop of its own divides its losses itself.
  void backward(const Var<B>& loss) {
    backend_->memory().mark("backward");
    scaler_.scale(loss).backward();
  }

  /// After the backwards of one step: the learning rate from the schedule, the
  /// gradients unscaled and clipped (with clipping on), the optimizer step (skipped when
  /// a gradient is inf or NaN), the scale's update and zeroed gradients; step_count()
  /// then counts one more. Returns whether the optimizer stepped. A model copy the step
  /// made overflow is thrown (CopyOverflowError) once the step is finished like any
  /// other, so the next step starts clean. Under bf16 + FP8 (no scaler) the skip is
  /// decided on the device and nothing is read back: the result reads the flag when
  /// converted to bool (StepOutcome).
  StepOutcome<B> update() {
    backend_->memory().mark("optimizer");
    if (options_.schedule) optimizer_->set_lr(options_.schedule->lr(steps_));
    last_lr_ = optimizer_->lr();
    last_grad_norm_.reset();
    Tensor<B> fp8_probe;
    if (fp8_) {
      fp8_probe = fp8_->nonfinite_probe();
      scaler_.check_with_grads(fp8_probe);  // a disabled scaler ignores it: read below
    }
    if (options_.clip_grad_norm > 0.0) {
      scaler_.unscale_(*optimizer_);  // the true gradients (nothing to do when not scaling)
      last_grad_norm_ = optim::clip_grad_norm(*optimizer_, options_.clip_grad_norm);
    }
    // bf16 + FP8: the amaxes' flag is the step's found-inf flag, acted on by the device.
    const bool on_device = fp8_ && !scaler_.is_enabled();
    StepOutcome<B> stepped = true;
    const auto close = [&] {  // after the skip decision: a skipped step leaves the scales
      if (on_device) {
        fp8_->update(fp8_probe);
        if (!device_skips_.defined())
          device_skips_ = Tensor<B>::zeros(Shape{1}, DType::F64, MemCategory::OptimizerState, *backend_);
        backend_->map(math::CountFound{}, device_skips_, fp8_probe, device_skips_);
      } else if (fp8_) {
        fp8_->update(static_cast<bool>(stepped));
      }
      scaler_.update();
      optimizer_->zero_grad();
      ++steps_;
    };
    try {
      if (on_device) {
        optim::StepControl<B> control;
        control.found_inf = fp8_probe;
        optimizer_->step(control);
        stepped = StepOutcome<B>::on_device(fp8_probe);
      } else {
        stepped = scaler_.step(*optimizer_);
      }
    } catch (const CopyOverflowError&) {
      close();  // the step was taken (with the flag clear, when on the device)
      throw;
    }
    close();
    if (!on_device && !stepped) ++skipped_;
    return stepped;
  }

  /// One whole step: for each of the micro_batches micro-batches, forward (`forward(micro)`,
  /// or `forward()` called once per micro-batch), the loss times 1/micro_batches,
  /// backward and the loss's tape cleared; then update().
  template <class Forward>
  StepReport<B> run(Forward&& forward_pass) {
    static_assert(
        std::is_invocable_v<Forward&, int> || std::is_invocable_v<Forward&>,
        "amp::TrainStep::run: the forward takes the micro-batch index (int) or nothing, and returns the loss");
    StepReport<B> report;
    const int m = options_.micro_batches;
    for (int micro = 0; micro < m; ++micro) {
      Var<B> loss = forward([&]() -> Var<B> {
        if constexpr (std::is_invocable_v<Forward&, int>) return forward_pass(micro);
        else return forward_pass();
      });
      trainmem::detail::check(loss.defined() && loss.tape() != nullptr,
                              "amp::TrainStep::run: the forward of micro-batch ", micro,
                              " returned no loss on a tape (return the loss Var the forward computed)");
      if (m > 1) loss = trainmem::scale(loss, 1.0 / static_cast<double>(m));
      if (micro == 0) {
        report.loss = loss.value();
      } else {  // the mean: the sum of the divided losses, on the backend (no host read)
        Tensor<B> sum = report.loss.clone();
        backend_->map(math::Add{}, sum, loss.value(), sum);
        report.loss = sum;
      }
      Tape<B>& tape = *loss.tape();
      backward(loss);
      tape.clear();
    }
    report.stepped = update();
    report.lr = last_lr_;
    report.grad_norm = last_grad_norm_;
    return report;
  }

  DType precision() const { return options_.precision; }
  const TrainStepOptions& options() const { return options_; }
  /// The current loss scale (a host read when scaling; 1 when not).
  double scale() const { return scaler_.get_scale(); }
  /// Updates skipped so far (by the scaler, or by an inf or NaN FP8 amax). After bf16 +
  /// FP8 steps, whose skips are counted on the device, a host read.
  std::int64_t skipped_steps() const {
    if (!device_skips_.defined()) return skipped_;
    return skipped_ + static_cast<std::int64_t>(device_skips_.template to_host<double>()[0]);
  }
  /// Updates run so far, taken or skipped: the step the schedule's rate is for.
  std::int64_t step_count() const { return steps_; }
  /// The last update's learning rate, and its gradient norm before clipping (clipping on).
  double last_lr() const { return last_lr_; }
  std::optional<double> last_grad_norm() const { return last_grad_norm_; }
  GradScaler<B>& scaler() { return scaler_; }
  const GradScaler<B>& scaler() const { return scaler_; }
  /// The FP8 scaling state (null without options().fp8).
  Fp8Scaling<B>* fp8() const { return fp8_.get(); }
  /// The f32 masters (none under f32 or without master weights).
  const std::optional<MasterWeights<B>>& master_weights() const { return masters_; }

  /// The masters ("masters.*", absent without them), the scaler ("scaler.*"), the FP8
  /// scaling state ("fp8.*", with options().fp8 only), "steps"
  /// (step_count(), the schedule's index) and "skipped_steps". Taken between steps: the
  /// gradients of a step part way through its micro-batches are not in it. The
  /// optimizer and the model's parameters are saved on their own.
  StateDict state() const {
    StateDict out;
    if (masters_) out.insert("masters", masters_->state());
    out.insert("scaler", trainmem::state_of(scaler_));
    if (fp8_) out.insert("fp8", fp8_->state());
    out.set_i64("steps", steps_);
    out.set_i64("skipped_steps", skipped_steps());
    return out;
  }
  /// Throws (naming the entry) unless `state` fits this TrainStep; changes nothing.
  void check_state(const StateDict& state) const {
    StateDict rest;
    for (const auto& [name, entry] : state)
      if (!StateDict::is_under(name, "scaler") && !(masters_ && StateDict::is_under(name, "masters")) &&
          !(fp8_ && StateDict::is_under(name, "fp8")))
        rest.set(name, entry);
    check_layout(rest, {{"steps", {StateType::I64, Shape{}}}, {"skipped_steps", {StateType::I64, Shape{}}}},
                 "amp::TrainStep::load_state");
    const std::int64_t steps = rest.get_i64("steps"), skipped = rest.get_i64("skipped_steps");
    trainmem::detail::check(skipped >= 0 && skipped <= steps, "amp::TrainStep::load_state: skipped_steps is ", skipped,
                            " of steps ", steps, ", expected 0 <= skipped_steps <= steps");
    if (masters_) masters_->check_state(state.sub("masters"));
    trainmem::check_state(scaler_, state.sub("scaler"));
    if (fp8_) fp8_->check_state(state.sub("fp8"));
  }
  /// Restores a state() (after check_state: on error nothing changes). As with
  /// MasterWeights::load_state, the model copies are the model's state: load it too.
  void load_state(const StateDict& state) {
    check_state(state);
    if (masters_) masters_->load_state(state.sub("masters"));
    trainmem::load_state(scaler_, state.sub("scaler"));
    if (fp8_) fp8_->load_state(state.sub("fp8"));
    steps_ = state.get_i64("steps");
    skipped_ = state.get_i64("skipped_steps");
    if (device_skips_.defined()) device_skips_.zero_();
  }

 private:
  static TrainStepOptions checked(const TrainStepOptions& options) {
    trainmem::detail::check(options.precision == DType::F32 || is_16bit(options.precision),
                            "amp::TrainStep: the precision must be f32, bf16 or f16, got ", options.precision);
    trainmem::detail::check(!options.fp8 || is_16bit(options.precision),
                            "amp::TrainStep: fp8 runs on top of bf16 or f16 autocast; the precision is ",
                            options.precision);
    trainmem::detail::check(options.micro_batches >= 1, "amp::TrainStep: micro_batches must be >= 1, got ",
                            options.micro_batches);
    trainmem::detail::check(std::isfinite(options.clip_grad_norm) && options.clip_grad_norm >= 0.0,
                            "amp::TrainStep: clip_grad_norm must be finite and >= 0 (0: no clipping), got ",
                            options.clip_grad_norm);
    return options;
  }

  optim::Optimizer<B>* optimizer_;
  TrainStepOptions options_;
  B* backend_;
  GradScaler<B> scaler_;
  std::optional<MasterWeights<B>> masters_;
  std::unique_ptr<Fp8Scaling<B>> fp8_;  // a unique_ptr: regions of a live graph point at it
  std::int64_t steps_ = 0;              // updates run, taken or skipped
  std::int64_t skipped_ = 0;            // of those, skipped as the host knows (by the scaler)
  Tensor<B> device_skips_;              // [1] f64: skipped by the device (bf16 + FP8), counted there
  double last_lr_ = 0.0;
  std::optional<double> last_grad_norm_;
};

}  // namespace trainmem::amp
