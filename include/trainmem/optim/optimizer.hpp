// trainmem/optim/optimizer.hpp — what SGD and AdamW share: parameters and their states.
//
// An optimizer updates parameters in place from their .grad, in f32 (or f64). Each
// update is one pass per tensor through the backend's apply_update, which also writes
// a 16-bit model copy when the parameter has one (mixed precision's master weights).
// A parameter without a gradient is skipped. Every write bumps the parameter's
// version, so cast caches recast and stale saved tensors are caught.
//
// NOTE [Steps a device can cancel]
// A loss scaler decides whether a step happens from a flag (found_inf) that lives next
// to the gradients. `step(StepControl)` hands that flag to every update pass, which
// then does nothing when it is set, and optionally a divisor (the loss scale) that the
// pass divides each gradient by, in f32, before updating. So the host never has to
// read the flag. Whatever a skipped step must not advance is kept on the device too:
// AdamW's bias corrections come from per-parameter [beta1^t, beta2^t] and SGD's
// first-momentum-step test from a per-parameter step count, each advanced by a tiny
// kernel by (found_inf == 0). Any non-zero flag cancels the step, e.g. two ranks' flags
// summed, and then nothing advances. Only the host counters `steps()` and `entry.steps` count
// launched passes, including those a device-side skip cancelled.
//
// `state()` / `load_state()` carry all of it across a restart, keyed by parameter name,
// checked before anything changes: optim/optimizer_state.hpp (included at the end of this
// header). Masters are MasterWeights' state.
//
// NOTE [Parameter groups]
// SGD and AdamW also take their parameters in groups (SgdGroup, AdamWGroup): a group
// carries `lr_scale`, which multiplies the base rate options().lr (the rate a schedule
// drives: `optimizer.options().lr = schedule.lr(step)`), and optional overrides of the
// other options (weight decay; AdamW's betas and eps, SGD's momentum); a field a group
// leaves unset follows options(). Each parameter's update uses its group's settings, so
// two groups step exactly as two optimizers would, one per group, and everything that
// walks entries() (GradScaler's unscale_ and step, MasterWeights, clip_grad_norm,
// TrainStep) covers every group in one call. A parameter in two groups, an empty group or
// a bad value is refused at construction, naming the group index and the field. state()
// saves the groups ("groups", "groups.<i>.<field>" for lr_scale and each override set,
// "params.<name>.group"); load_state refuses a state whose group count or membership
// differs from this optimizer's, naming what differs, and restores the saved hyperparameter
// values (as it restores options(), and as PyTorch's load_state_dict restores its
// param_groups'). An optimizer built from one list has no groups and saves no group keys.
//
// A 16-bit model copy that an update made inf (its master finite but beyond f16's 65504)
// is a CopyOverflowError: at the end of the step on the CPU, at the next host wait on a
// GPU; the step itself is taken in full (NOTE [Model copies that overflow] in
// core/copy_overflow.hpp).
//
// NOTE [Gradients still scaled]
// A gradient from backward of amp::GradScaler::scale(loss) is S times too large (S =
// 65536 at first) until divided, and is marked so on the host (Var::grad_scaled, NOTE
// [Scaled gradients] in autograd/tape.hpp). A step refuses such a gradient, naming the
// parameter and the calls that divide it (scaler.step(optimizer), or scaler.unscale_ first),
// unless the step divides it itself (StepControl::grad_divisor, what scaler.step passes)
// or `allow_scaled_grads()` says the caller accounts for the scale (e.g. step(1 / S)).
// The check reads a host flag: no device work, no sync.
//
// NOTE [All or nothing]
// A step first checks every gradient and allocates every state it will need (first-use
// moments, step scalars), then runs the update passes, which allocate nothing and so
// cannot fail half-way: when an allocation fails, no parameter, master or state has
// changed yet (states first made by the failed step are dropped again), and the step
// can simply be retried.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "trainmem/autograd/grad_mode.hpp"
#include "trainmem/autograd/parameter_list.hpp"
#include "trainmem/autograd/var.hpp"
#include "trainmem/core/rng.hpp"
#include "trainmem/core/stochastic_rounding.hpp"
#include "trainmem/core/update_rules.hpp"
#include "trainmem/error.hpp"
#include "trainmem/state/state_dict.hpp"  // StateDict, in the declarations of state() and load_state()

namespace trainmem {

namespace optim {

/// \brief A parameter as an optimizer sees it: the tensor it updates and its gradient.
///
/// Without mixed precision the tensor updated is the parameter itself. With FP32
/// master weights, `master` is the f32 copy the optimizer updates and `param` the
/// 16-bit model copy it writes after each update.
template <class B>
struct ParamGroupEntry {
  Var<B> param;
  Tensor<B> master;  // undefined: update param.value() directly
  /// Optimizer state by role, allocated on first use: AdamW's m and v; SGD's momentum
  /// buffer (a running average of gradients) is its first moment and it has no second.
  Tensor<B> first_moment, second_moment;
  /// Per-parameter scalars a skipped step must not advance, kept on the device (f64):
  /// AdamW [beta1^t, beta2^t], SGD with momentum [t]. See NOTE [Steps a device can cancel].
  Tensor<B> step_state;
  std::int64_t steps = 0;  // update passes launched for this parameter
  std::size_t group = 0;   // index of its parameter group (0 when the optimizer has none)
};

/// \brief What a loss scaler tells one step; each field is optional (undefined: absent).
template <class B>
struct StepControl {
  /// f32 scalar: each gradient is divided by it inside the update pass, in f32 (the loss
  /// scale, when the gradients are still scaled). Never read on the host.
  Tensor<B> grad_divisor;
  /// f32 scalar: when non-zero (an inf or NaN was found) the pass leaves parameters,
  /// model copies and states unchanged. Never read on the host.
  Tensor<B> found_inf;
};

template <class B>
class Optimizer {
 public:
  explicit Optimizer(std::vector<Var<B>> params) : id_(next_id()) {
    check_parameter_list(params, "optimizer");
    for (const Var<B>& p : params) entries_.push_back({p, {}, {}, {}, {}, 0});
  }
  virtual ~Optimizer() = default;
  // A copy would share the moment tensors with the original and step them twice.
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;
  Optimizer(Optimizer&&) = default;
  Optimizer& operator=(Optimizer&&) = default;

  /// How many parameter groups the optimizer was built with (0: one plain list, every
  /// parameter takes options()). NOTE [Parameter groups].
  std::size_t group_count() const { return group_count_; }
  /// Per group: lr_scale and each override the group sets, by field name (empty without
  /// groups), as state() saves them.
  virtual std::vector<std::map<std::string, double>> group_maps() const = 0;

  /// Throws, naming `who`, unless `param`'s (defined) gradient is one a step may apply:
  /// floating point, and not left part-way by a failed backward (Var::grad_incomplete).
  static void check_grad(const Var<B>& param, std::string_view who) {
    detail::check(!param.grad_incomplete(), who, ": the gradient of '", param.name(),
                  "' is from a backward that failed part way (it holds some of that backward's contributions); "
                  "zero_grad() and run backward again");
    detail::check(is_floating(param.grad().dtype()), who, ": the gradient of '", param.name(), "' is ",
                  param.grad().dtype(), "; gradients must be floating point");
  }

  /// Unique among the optimizers of this process (a loss scaler keys its records by it,
  /// not by address, which a later optimizer may reuse).
  std::uint64_t id() const { return id_; }

  void zero_grad() {
    for (auto& e : entries_) e.param.zero_grad();
  }
  /// The base learning rate, the derived optimizer's options().lr: what an LR schedule
  /// drives (amp::TrainStep sets it before each update) without knowing the optimizer.
  virtual double lr() const = 0;
  virtual void set_lr(double lr) = 0;
  /// Gives parameter i an f32 (or f64) master copy that the optimizer updates; the
  /// parameter's own tensor becomes the model copy each update writes (amp::MasterWeights).
  void set_master(std::size_t i, Tensor<B> master) {
    check_master(i, master);
    entries_[i].master = std::move(master);
  }
  /// Throws, naming `who`, unless parameter i may still get a master: it has none and
  /// has never been stepped.
  void check_may_take_master(std::size_t i, std::string_view who) const {
    detail::check(i < entries_.size(), who, ": index ", i, " is out of range (", entries_.size(), " parameters)");
    const ParamGroupEntry<B>& e = entries_[i];
    detail::check(!e.master.defined(), who, ": '", e.param.name(),
                  "' has a master already (one amp::MasterWeights or amp::TrainStep per optimizer)");
    detail::check(!e.first_moment.defined() && !e.second_moment.defined() && e.steps == 0, who, ": '", e.param.name(),
                  "' has been stepped already; set masters before the first step");
  }
  /// Throws unless set_master(i, master) would succeed; changes nothing.
  void check_master(std::size_t i, const Tensor<B>& master) const {
    check_may_take_master(i, "optimizer::set_master");
    const ParamGroupEntry<B>& e = entries_[i];
    detail::check(master.defined() && (master.dtype() == DType::F32 || master.dtype() == DType::F64) &&
                      master.shape() == e.param.shape() && !master.same_storage(e.param.value()),
                  "optimizer::set_master: the master of '", e.param.name(), "' ", e.param.shape(),
                  " must be a separate f32 or f64 tensor of that shape, got ",
                  master.defined() ? master.shape().str() + " " + std::string(name_of(master.dtype())) : "undefined");
  }
  /// How update passes write 16-bit model copies; stochastic rounding draws from a
  /// Philox stream starting at (seed, 0), `numel` draws per parameter per launched pass
  /// (a pass that found_inf cancels on the device uses up its draws too).
  void set_copy_rounding(RoundingMode mode, std::uint64_t seed = 0) {
    rounding_mode_ = mode;
    rounding_rng_.manual_seed(seed);
  }
  RoundingMode copy_rounding() const { return rounding_mode_; }
  /// The stochastic-rounding stream position (save it with a checkpoint to resume bit for bit).
  RngState copy_rounding_state() const { return rounding_rng_.state(); }
  void set_copy_rounding_state(RngState state) { rounding_rng_.set_state(state); }

  std::vector<ParamGroupEntry<B>>& entries() { return entries_; }
  const std::vector<ParamGroupEntry<B>>& entries() const { return entries_; }
  /// Steps launched (with step(StepControl), including those found_inf cancelled).
  std::int64_t steps() const { return steps_; }
  /// Lets a step apply gradients still multiplied by a loss scale (NOTE [Gradients still
  /// scaled]): for a caller that accounts for the scale itself. Off by default.
  void allow_scaled_grads(bool allow = true) { scaled_grads_allowed_ = allow; }
  bool scaled_grads_allowed() const { return scaled_grads_allowed_; }

  /// Everything a resumed run needs from this optimizer, keyed by parameter name
  /// ("params.<name>.first_moment", ".second_moment", ".step_state", ".steps"), plus
  /// "steps", "copy_rounding.*" and "options.*". The parameters' names must be unique.
  /// Defined in optim/optimizer_state.hpp, as are check_state and load_state.
  StateDict state() const;
  /// Throws (naming the entry) unless `state` fits these parameters and holds valid values; modifies nothing.
  void check_state(const StateDict& state) const;
  /// Restores a state() (after check_state: on error nothing changes). Moments absent
  /// from the state are dropped, as for a parameter never stepped.
  void load_state(const StateDict& state);

  /// One update of every parameter with a gradient; grads are multiplied by grad_scale first.
  void step(double grad_scale = 1.0) {
    detail::check(std::isfinite(grad_scale) && grad_scale > 0,
                  "optimizer::step: grad_scale must be finite and > 0, got ", grad_scale);
    run_step(grad_scale, StepControl<B>{});
  }
  /// One update that the device can cancel or unscale: see StepControl.
  void step(const StepControl<B>& control) {
    if (control.grad_divisor.defined()) check_scalar(control.grad_divisor, "grad_divisor");
    if (control.found_inf.defined()) check_scalar(control.found_inf, "found_inf");
    run_step(1.0, control);
  }

 protected:
  /// Allocates a zeroed optimizer state like `target` on first use.
  static void ensure_state(Tensor<B>& state, const Tensor<B>& target) {
    if (!state.defined())
      state = Tensor<B>::zeros(target.shape(), target.dtype(), MemCategory::OptimizerState, target.backend());
  }
  /// An f64 optimizer-state tensor holding `values` (uploaded: they differ from each other).
  static Tensor<B> device_values(const std::vector<double>& values, B& backend) {
    return Tensor<B>::from_host(Shape{static_cast<std::int64_t>(values.size())}, values, DType::F64,
                                MemCategory::OptimizerState, backend);
  }
  /// f64 scalar: 1 when this step applies, 0 when found_inf cancels it (valid during update()).
  const Tensor<B>& step_applies() const { return applies_; }
  /// f64 scalar 1 on the parameters' backend (valid during update()).
  const Tensor<B>& device_one() const { return one_; }

  /// Runs `update` over one parameter: divides by the control's divisor, skips on its
  /// flag, and writes the model copy (with the configured rounding) when there is a master.
  template <class Update>
  void apply(const ParamGroupEntry<B>& e, const Tensor<B>& target, const Tensor<B>& grad, Update update,
             const StepControl<B>& control) {
    CopyRounding rounding;
    if (e.master.defined() && rounding_mode_ == RoundingMode::Stochastic)
      rounding = {rounding_mode_, rounding_rng_.take(static_cast<std::uint64_t>(target.numel()))};
    const Tensor<B> copy = e.master.defined() ? e.param.value() : Tensor<B>();
    if (control.grad_divisor.defined()) {
      target.backend().apply_update(
          detail::DivideGrad<Update>{update, control.grad_divisor.template data_as<const float>()}, target, grad,
          e.first_moment, e.second_moment, copy, control.found_inf, rounding, e.param.name());
    } else {
      target.backend().apply_update(update, target, grad, e.first_moment, e.second_moment, copy, control.found_inf,
                                    rounding, e.param.name());
    }
  }
  virtual void update(ParamGroupEntry<B>& e, const Tensor<B>& target, const Tensor<B>& grad, double grad_scale,
                      const StepControl<B>& control) = 0;
  /// Allocates whatever update(e, target, ...) will use, before any update of the step runs.
  virtual void prepare(ParamGroupEntry<B>& e, const Tensor<B>& target) = 0;

  /// Parameters given in groups: `groups[g]` holds group g's. Refuses, naming `who` and
  /// the group, an empty group or a parameter in two groups; then the list's own checks.
  Optimizer(const std::vector<std::vector<Var<B>>>& groups, std::string_view who) : id_(next_id()) {
    detail::check(!groups.empty(), who, ": no parameter groups");
    std::vector<Var<B>> params;
    std::vector<std::size_t> group_of;
    for (std::size_t g = 0; g < groups.size(); ++g) {
      detail::check(!groups[g].empty(), who, ": group ", g, " has no parameters");
      for (const Var<B>& p : groups[g]) {
        for (std::size_t i = 0; i < params.size(); ++i)
          detail::check(
              group_of[i] == g || !p.defined() || !params[i].defined() || !params[i].value().overlaps(p.value()), who,
              ": '", p.name(), "' is in group ", group_of[i], " and in group ", g,
              "; a parameter belongs to one group");
        params.push_back(p);
        group_of.push_back(g);
      }
    }
    check_parameter_list(params, who);
    for (std::size_t i = 0; i < params.size(); ++i) entries_.push_back({params[i], {}, {}, {}, {}, 0, group_of[i]});
    group_count_ = groups.size();
  }
  /// Throws, naming `who`, group `g` and `field`, unless `ok`; `expected` says what is allowed.
  static void check_group_value(bool ok, std::string_view who, std::size_t g, std::string_view field, double value,
                                std::string_view expected) {
    detail::check(ok, who, ": group ", g, ": ", field, " must be ", expected, ", got ", value);
  }

  // What state() saves of the derived optimizer: the keys its first and second moments go
  // under (files saved earlier use them, so a key never changes), the length of the
  // per-parameter step state, and the options as named numbers.
  virtual std::array<const char*, 2> moment_names() const { return {"first_moment", "second_moment"}; }
  virtual std::int64_t step_state_size() const = 0;
  /// Which of {first moment, second moment, step state} prepare() makes for a parameter.
  virtual std::array<bool, 3> kept_states() const = 0;
  virtual std::map<std::string, double> options_map() const = 0;
  /// The fields a group may override (besides lr_scale), as group_maps names them.
  virtual std::vector<std::string> group_fields() const = 0;
  /// Throws unless the states under `prefix` ("params.<name>.") hold values a run of this
  /// optimizer can reach, for a parameter stepped `steps` times (layout already checked).
  virtual void check_param_values(const StateDict& state, const std::string& prefix, std::int64_t steps) const = 0;
  /// Throws unless `options` (the keys options_map writes) and `groups` (as group_maps
  /// writes them, one per group) are valid together; changes nothing.
  virtual void check_options_map(const std::map<std::string, double>& options,
                                 const std::vector<std::map<std::string, double>>& groups) const = 0;
  /// Refuses the current options (options() hands them out to change between steps).
  virtual void check_options() const = 0;
  /// Sets the options (checked) and forgets anything cached from the old state.
  virtual void load_options_map(const std::map<std::string, double>& options,
                                const std::vector<std::map<std::string, double>>& groups) = 0;

  std::vector<ParamGroupEntry<B>> entries_;
  std::int64_t steps_ = 0;
  std::size_t group_count_ = 0;

 private:
  static void check_scalar(const Tensor<B>& t, const char* what) {
    detail::check(t.numel() == 1 && t.dtype() == DType::F32, "optimizer::step: StepControl::", what,
                  " must be an f32 scalar, got ", t.shape(), " ", t.dtype());
  }

  // Save/load helpers (optim/optimizer_state.hpp).
  void names_or_throw(const char* who) const;
  std::map<std::string, double> options_from(const StateDict& state) const;
  std::vector<std::map<std::string, double>> groups_from(const StateDict& state) const;
  void check_groups(const StateDict& state) const;
  static void load_tensor(const StateDict& state, const std::string& name, Tensor<B>& tensor, const Tensor<B>& like);

  void run_step(double grad_scale, const StepControl<B>& control) {
    NoGradGuard no_grad;
    // NOTE [All or nothing]: check and allocate everything, then update.
    check_options();
    for (auto& e : entries_) {
      const Tensor<B>& grad = e.param.grad();
      if (!grad.defined()) continue;
      check_grad(e.param, "optimizer");
      detail::check(!e.param.grad_scaled() || control.grad_divisor.defined() || scaled_grads_allowed_,
                    "optimizer::step: the gradient of '", e.param.name(),
                    "' is still multiplied by the loss scale (it comes from backward of scaler.scale(loss)); "
                    "step with scaler.step(optimizer), or call scaler.unscale_(optimizer) before optimizer.step() "
                    "(allow_scaled_grads() lets a caller that divides by the scale itself step them)");
      const Tensor<B>& target = e.master.defined() ? e.master : e.param.value();
      detail::check(grad.shape() == target.shape(), "optimizer: grad of '", e.param.name(), "' is ", grad.shape(),
                    ", parameter is ", target.shape());
      detail::check(target.dtype() == DType::F32 || target.dtype() == DType::F64, "optimizer: '", e.param.name(),
                    "' is ", target.dtype(),
                    "; updates run on f32 or f64 tensors (use FP32 master weights for 16-bit models)");
      detail::check(rounding_mode_ != RoundingMode::Stochastic || !e.master.defined() || e.param.dtype() == DType::BF16,
                    "optimizer: stochastic rounding writes bf16 model copies, '", e.param.name(), "' is ",
                    e.param.dtype());
    }
    prepare_states(control);
    ++steps_;
    std::string overflowed;  // NOTE [Model copies that overflow]: raised once every update has run
    for (auto& e : entries_) {
      const Tensor<B>& grad = e.param.grad();
      if (!grad.defined()) continue;
      const Tensor<B>& target = e.master.defined() ? e.master : e.param.value();
      ++e.steps;
      try {
        update(e, target, grad, grad_scale, control);
      } catch (const CopyOverflowError& error) {
        overflowed += (overflowed.empty() ? "" : "; ") + std::string(error.what());
      }
      target.bump_version();
      if (e.master.defined()) e.param.value().bump_version();
    }
    if (!overflowed.empty()) throw CopyOverflowError(overflowed);
  }

  /// Allocates every state this step's updates use; when an allocation fails, the states
  /// it made are dropped again, so the optimizer is as it was before the step.
  void prepare_states(const StepControl<B>& control) {
    std::vector<std::array<bool, 3>> had;
    had.reserve(entries_.size());
    for (const auto& e : entries_)
      had.push_back({e.first_moment.defined(), e.second_moment.defined(), e.step_state.defined()});
    try {
      prepare_applies(control);
      for (auto& e : entries_)
        if (e.param.grad().defined()) prepare(e, e.master.defined() ? e.master : e.param.value());
    } catch (...) {
      for (std::size_t i = 0; i < entries_.size(); ++i) {
        if (!had[i][0]) entries_[i].first_moment = Tensor<B>();
        if (!had[i][1]) entries_[i].second_moment = Tensor<B>();
        if (!had[i][2]) entries_[i].step_state = Tensor<B>();
      }
      throw;
    }
  }

  /// applies_ = (found_inf == 0) (or 1), on the parameters' backend, without a host read.
  void prepare_applies(const StepControl<B>& control) {
    if (entries_.empty()) return;
    B& backend = entries_.front().param.value().backend();
    if (!one_.defined()) one_ = Tensor<B>::full(Shape{}, 1.0, DType::F64, MemCategory::OptimizerState, backend);
    if (!control.found_inf.defined()) {
      applies_ = one_;
      return;
    }
    if (!flagged_applies_.defined())
      flagged_applies_ = Tensor<B>::empty(Shape{}, DType::F64, MemCategory::OptimizerState, backend);
    backend.map(math::IsZero{}, control.found_inf, flagged_applies_);
    applies_ = flagged_applies_;
  }

  static std::uint64_t next_id() {
    static std::atomic<std::uint64_t> counter{0};
    return ++counter;
  }

  std::uint64_t id_;
  RoundingMode rounding_mode_ = RoundingMode::NearestEven;
  bool scaled_grads_allowed_ = false;
  Generator rounding_rng_{0};
  Tensor<B> one_, flagged_applies_, applies_;
};

}  // namespace optim
}  // namespace trainmem

#include "trainmem/optim/optimizer_state.hpp"  // state(), check_state(), load_state()
