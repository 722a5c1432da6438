// trainmem/amp/grad_scaler.hpp — dynamic loss scaling (torch.amp.GradScaler's algorithm).
//
// FP16 holds magnitudes down to 6e-8 only; many gradients are smaller and flush to
// zero. Multiplying the loss by S multiplies every gradient by S (backward is linear),
// which lifts them into range; the optimizer then divides by S in f32. Too large an S
// overflows: some gradient becomes inf or NaN, and that step is skipped and S backed
// off. After `growth_interval` clean steps in a row S grows again. Hysteresis
// (DeepSpeed) tolerates H - 1 overflows in a row before backing off.
//
// The scale, growth tracker, hysteresis counter and each optimizer's found-inf flag are
// backend tensors, so on a GPU the loop never waits for the device:
//   scaler.scale(loss).backward();
//   scaler.step(optimizer);      // check the grads, step or skip; returns whether it stepped
//   scaler.update();             // once per step, after every optimizer's step
// `step()` reads the flag on the host to return its bool (one device sync). `step_async()`
// hands the flag and the scale to the optimizer's update passes instead (they skip on
// the device and divide each gradient by the scale in f32) and returns nothing.
// To clip: `unscale_(optimizer)`, then optim::clip_grad_norm, then step. unscale_ writes
// f32 gradients in place of 16-bit ones (their unscaled values would flush in 16 bits).
// The gradients of scale(loss).backward() are marked scaled until step() divides them or
// unscale_() does: a plain optimizer.step() on them, which would apply S-times gradients
// (65536 by default), throws instead (optimizer.hpp: allow_scaled_grads to opt out).
//
// The scale stays a normal f32, in [2^-126, f32 max] (core/loss_scale_rule.hpp): settings,
// loaded states and update(new_scale) outside it are errors, and a scale tensor that was
// overwritten anyway never reaches an update (step() checks it; step_async() checks it
// for inf/NaN with the gradients and so skips).
#pragma once

#include <map>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "trainmem/amp/grad_scaler_state.hpp"
#include "trainmem/ops/elementwise.hpp"
#include "trainmem/optim/optimizer.hpp"
#include "trainmem/state/state_dict.hpp"

namespace trainmem::amp {

/// \brief Dynamic loss scaler with PyTorch's defaults, min/max scale and hysteresis.
template <class B>
class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions options = {}, B& backend = B::default_instance())
      : GradScaler(DType::F16, options, backend) {}

  /// For a run that autocasts to `autocast_dtype`: only f16's narrow exponent range makes
  /// gradients underflow, so the scaler is enabled for f16, disabled for f32 and f64 (no
  /// autocast), and disabled for bf16 (f32's exponent range) unless options.scale_bf16.
  GradScaler(DType autocast_dtype, GradScalerOptions options, B& backend = B::default_instance())
      : options_(options), backend_(&backend) {
    options_.validate("GradScaler");
    enabled_ =
        options_.enabled && (autocast_dtype == DType::F16 || (autocast_dtype == DType::BF16 && options_.scale_bf16));
    if (!enabled_) return;
    scale_ = scalar(DType::F32, options_.init_scale);
    growth_tracker_ = scalar(DType::I32, 0.0);
    hysteresis_left_ = scalar(DType::I32, options_.hysteresis);
  }

  GradScaler(const GradScaler&) = delete;  // two scalers must not share one scale tensor
  GradScaler& operator=(const GradScaler&) = delete;
  GradScaler(GradScaler&&) = default;
  GradScaler& operator=(GradScaler&&) = default;

  bool is_enabled() const { return enabled_; }
  const GradScalerOptions& options() const { return options_; }

  /// loss * scale, as an op on the loss's tape (backward seeds every gradient with the
  /// scale). The gradients that backward leaves are marked scaled (Var::grad_scaled), so
  /// an optimizer refuses to step them until step() or unscale_() divides them. The
  /// disabled scaler returns the loss.
  Var<B> scale(const Var<B>& loss) const {
    if (!enabled_) return loss;
    detail::check(loss.defined() && loss.tape() != nullptr, "GradScaler::scale: the loss must be a Var on a tape");
    Var<B> scaled = trainmem::mul(loss, loss.tape()->input(scale_.clone()));
    if (scaled.impl().grad_fn != nullptr) scaled.impl().grad_fn->scales_gradients = true;
    return scaled;
  }

  /// Divides `optimizer`'s gradients by the scale in place (16-bit gradients are
  /// replaced by f32 ones) and records whether any was inf or NaN. At most once per
  /// optimizer between update()s, and before step(); needed only to look at or clip
  /// the true gradients.
  void unscale_(optim::Optimizer<B>& optimizer) {
    if (!enabled_) return;
    Record& record = record_of(optimizer);
    detail::check(record.stage != Stage::Unscaled,
                  "GradScaler::unscale_: already called on this optimizer since the last update()");
    detail::check(record.stage != Stage::Stepped, "GradScaler::unscale_: called after step(); call update() first");
    // Every check and f32 copy first, then the replacements: on an error nothing changed.
    std::vector<Tensor<B>> grads = checked_grads(optimizer, "GradScaler::unscale_");
    require_grads(grads);
    for (Tensor<B>& g : grads)
      if (is_16bit(g.dtype())) g = g.to(DType::F32, MemCategory::Gradient);
    std::size_t next = 0;
    for (auto& e : optimizer.entries())
      if (e.param.grad().defined()) e.param.set_grad(grads[next++]);
    grads.insert(grads.end(), checked_with_grads_.begin(), checked_with_grads_.end());
    check_grads(grads, scale_, record);
    for (auto& e : optimizer.entries())
      if (e.param.grad().defined()) e.param.set_grad_scaled(false);
    for (const Tensor<B>& g : grads) g.bump_version();
    record.stage = Stage::Unscaled;
  }

  /// Makes the next unscale_ or step check `flag` with the gradients: an inf or NaN in it
  /// skips the step (and backs the scale off) like an overflowing gradient. For values
  /// that overflowed where no gradient shows it: the FP8 recipe's amax probe
  /// (Fp8Scaling::nonfinite_probe), since FP8 saturates an inf to a finite value. Until
  /// the next update(). The disabled scaler ignores it.
  void check_with_grads(Tensor<B> flag) {
    if (!enabled_) return;
    detail::check(flag.defined() && flag.dtype() == DType::F32, "GradScaler::check_with_grads: expected an f32 tensor");
    checked_with_grads_.push_back(std::move(flag));
  }

  /// Steps `optimizer` unless its gradients hold an inf or NaN; returns whether it
  /// stepped. Reads the found-inf flag on the host (a device sync); step_async does not.
  bool step(optim::Optimizer<B>& optimizer) {
    if (!enabled_) {
      optimizer.step();
      return true;
    }
    GradScalerOptions::check_scale("GradScaler::step", "the loss scale", get_scale());
    const optim::StepControl<B> control = prepare_step(optimizer);
    const bool stepped = control.found_inf.template to_host<float>()[0] == 0.0f;
    if (stepped) step_taken(optimizer, control);
    record_of(optimizer).stage = Stage::Stepped;
    return stepped;
  }

  /// As step, with no host read: the optimizer's update passes skip on the device when
  /// the flag is set. The host step counters advance either way (optimizer.hpp's NOTE).
  void step_async(optim::Optimizer<B>& optimizer) {
    if (!enabled_) {
      optimizer.step();
      return;
    }
    step_taken(optimizer, prepare_step(optimizer));
    record_of(optimizer).stage = Stage::Stepped;
  }

  /// Updates the scale from this step's overflow flags (of every optimizer stepped or
  /// unscaled since the last update), on the device. Once per step.
  void update() {
    if (!enabled_) return;
    std::vector<const Tensor<B>*> flags;
    for (auto& [key, record] : records_)
      if (record.stage != Stage::Ready) flags.push_back(&record.found_inf);
    detail::check(!flags.empty(),
                  "GradScaler::update: no inf checks were recorded since the last update(); call "
                  "step() (or unscale_()) for each optimizer first");
    const Tensor<B>* found_inf = flags.front();
    Tensor<B> combined;
    if (flags.size() > 1) {
      combined = flags.front()->clone();
      for (std::size_t i = 1; i < flags.size(); ++i) backend_->map(math::Add{}, combined, *flags[i], combined);
      found_inf = &combined;
    }
    backend_->update_scale(scale_, growth_tracker_, hysteresis_left_, *found_inf, options_.update_args());
    for (auto& [key, record] : records_) record.stage = Stage::Ready;
    checked_with_grads_.clear();
  }

  /// Sets the scale to `new_scale` (no overflow rule applied) and starts a new step.
  void update(double new_scale) {
    if (!enabled_) return;
    GradScalerOptions::check_scale("GradScaler::update", "new_scale", new_scale);
    scale_.copy_from(scalar(DType::F32, new_scale));
    for (auto& [key, record] : records_) record.stage = Stage::Ready;
    checked_with_grads_.clear();
  }

  /// The current scale (a host read: a device sync); 1 when disabled.
  double get_scale() const { return enabled_ ? scale_.template to_host<double>()[0] : 1.0; }
  /// Clean steps since the last growth or overflow (a host read).
  std::int32_t growth_tracker() const { return enabled_ ? read_i32(growth_tracker_) : 0; }
  /// Overflows still tolerated before a backoff (a host read).
  std::int32_t hysteresis_left() const { return enabled_ ? read_i32(hysteresis_left_) : options_.hysteresis; }
  /// The scale as an f32 backend scalar (for kernels that take it without a host read).
  const Tensor<B>& scale_tensor() const { return scale_; }
  /// `optimizer`'s found-inf flag of the current step (f32 scalar; undefined before its first check).
  Tensor<B> found_inf(const optim::Optimizer<B>& optimizer) const {
    auto it = records_.find(optimizer.id());
    return it == records_.end() ? Tensor<B>() : it->second.found_inf;
  }

  /// Everything needed to resume (host reads).
  GradScalerState state() const {
    GradScalerState s;
    s.options = options_;
    s.options.enabled = enabled_;
    s.scale = get_scale();
    s.growth_tracker = growth_tracker();
    s.hysteresis_left = hysteresis_left();
    return s;
  }
  /// Restores a saved state: settings, scale and counters. A disabled scaler ignores it
  /// (as PyTorch's does); loading a disabled scaler's state into an enabled one throws.
  void load_state(const GradScalerState& state) {
    if (!enabled_) return;
    detail::check(state.options.enabled, "GradScaler::load_state: the state was saved from a disabled scaler");
    state.validate("GradScaler::load_state");
    options_ = state.options;
    options_.init_scale = state.scale;
    scale_.copy_from(scalar(DType::F32, state.scale));
    growth_tracker_.copy_from(scalar(DType::I32, state.growth_tracker));
    hysteresis_left_.copy_from(scalar(DType::I32, state.hysteresis_left));
    for (auto& [key, record] : records_) record.stage = Stage::Ready;
  }

 private:
  enum class Stage { Ready, Unscaled, Stepped };
  struct Record {
    Stage stage = Stage::Ready;
    Tensor<B> found_inf;
  };

  Tensor<B> scalar(DType dtype, double value) const {
    return Tensor<B>::full(Shape{}, value, dtype, MemCategory::OptimizerState, *backend_);
  }

  std::int32_t read_i32(const Tensor<B>& t) const {
    std::int32_t value = 0;
    backend_->download(&value, t.data(), sizeof value);
    return value;
  }

  Record& record_of(const optim::Optimizer<B>& optimizer) {
    Record& record = records_[optimizer.id()];
    if (!record.found_inf.defined()) record.found_inf = scalar(DType::F32, 0.0);
    return record;
  }

  /// The optimizer's defined gradients; throws, as its step would, on a gradient that is
  /// not floating point or that a failed backward left incomplete.
  static std::vector<Tensor<B>> checked_grads(const optim::Optimizer<B>& optimizer, const char* who) {
    std::vector<Tensor<B>> grads;
    for (const auto& e : optimizer.entries()) {
      const Tensor<B>& grad = e.param.grad();
      if (!grad.defined()) continue;
      optim::Optimizer<B>::check_grad(e.param, who);
      grads.push_back(grad);
    }
    return grads;
  }
  static void require_grads(std::span<const Tensor<B>> grads) {
    detail::check(!grads.empty(),
                  "GradScaler: no parameter of the optimizer has a gradient (run backward on "
                  "scaler.scale(loss) first)");
  }
  /// Clears the flag, then divides `grads` by `divisor` (1: check only) and flags non-finite values.
  void check_grads(std::span<const Tensor<B>> grads, const Tensor<B>& divisor, Record& record) {
    require_grads(grads);
    record.found_inf.zero_();
    backend_->unscale_grads(grads, divisor, record.found_inf);
  }

  /// optimizer.step(control); a model copy that overflowed (CopyOverflowError) comes after
  /// the step was taken, so the step still counts as this optimizer's for update().
  void step_taken(optim::Optimizer<B>& optimizer, const optim::StepControl<B>& control) {
    try {
      optimizer.step(control);
    } catch (const CopyOverflowError&) {
      record_of(optimizer).stage = Stage::Stepped;
      throw;
    }
  }

  /// Checks the gradients if unscale_ did not, and says how the update passes must treat them.
  optim::StepControl<B> prepare_step(optim::Optimizer<B>& optimizer) {
    Record& record = record_of(optimizer);
    detail::check(record.stage != Stage::Stepped,
                  "GradScaler::step: already called on this optimizer since the last update()");
    optim::StepControl<B> control;
    control.found_inf = record.found_inf;
    if (record.stage == Stage::Ready) {  // grads still scaled: check them, divide inside the update
      std::vector<Tensor<B>> grads = checked_grads(optimizer, "GradScaler::step");
      if (!one_.defined()) one_ = scalar(DType::F32, 1.0);
      require_grads(grads);
      grads.push_back(scale_);  // an inf or NaN scale (written through scale_tensor()) skips the step too
      grads.insert(grads.end(), checked_with_grads_.begin(), checked_with_grads_.end());
      check_grads(grads, one_, record);
      control.grad_divisor = scale_;
    }
    return control;
  }

  GradScalerOptions options_;
  B* backend_;
  bool enabled_ = false;
  Tensor<B> scale_, growth_tracker_, hysteresis_left_, one_;
  std::unordered_map<std::uint64_t, Record> records_;  // by Optimizer::id()
  std::vector<Tensor<B>> checked_with_grads_;          // check_with_grads' flags, until update()
};

// --- the scaler's state as a StateDict: its GradScalerState keys, as f64 scalars.
// state/stateful.hpp's state_of / check_state / load_state find these by argument-dependent lookup.

template <class B>
StateDict trainmem_state_of(const GradScaler<B>& scaler) {
  StateDict out;
  for (const auto& [key, value] : scaler.state().to_map()) out.set_f64(key, value);
  return out;
}

/// The GradScalerState a StateDict holds, after checking its entries against the scaler's keys.
template <class B>
GradScalerState grad_scaler_state_from(const GradScaler<B>& scaler, const StateDict& state) {
  std::map<std::string, ExpectedEntry> expected;
  for (const auto& [key, value] : scaler.state().to_map()) expected[key] = {StateType::F64, Shape{}};
  check_layout(state, expected, "amp::GradScaler load_state");
  std::map<std::string, double> values;
  for (const auto& [key, entry] : expected) values[key] = state.get_f64(key);
  return GradScalerState::from_map(values);
}

/// Runs every check GradScaler::load_state makes, on a scratch scaler, so the user's is untouched.
template <class B>
void trainmem_check_state(const GradScaler<B>& scaler, const StateDict& state) {
  const GradScalerState saved = grad_scaler_state_from(scaler, state);
  if (!scaler.is_enabled()) return;  // a disabled scaler ignores loads
  GradScaler<B> scratch(DType::F16, scaler.options(), scaler.scale_tensor().backend());
  scratch.load_state(saved);
}
template <class B>
void trainmem_load_state(GradScaler<B>& scaler, const StateDict& state) {
  trainmem_check_state(scaler, state);
  scaler.load_state(grad_scaler_state_from(scaler, state));
}

}  // namespace trainmem::amp
