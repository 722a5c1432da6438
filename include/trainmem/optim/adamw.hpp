// trainmem/optim/adamw.hpp — Adam with decoupled weight decay (PyTorch's rules).
//
// The bias corrections 1 - beta^t come from per-parameter [beta1^t, beta2^t] kept on
// the device and multiplied by [beta1, beta2] only when the step applies, so a step
// the loss scaler cancels on the device leaves t where it was (NOTE [Steps a device
// can cancel] in optimizer.hpp). The powers are f64, as exact as the host's pow.
// state() saves m as "first_moment", v as "second_moment", the powers as "step_state".
#pragma once

#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <utility>

#include "trainmem/core/update_rules.hpp"
#include "trainmem/optim/optimizer.hpp"

namespace trainmem {

namespace detail {
/// AdamWUpdate whose bias corrections read [beta1^t, beta2^t] on the device.
struct AdamWPoweredUpdate {
  math::AdamWUpdate update;
  const double* powers;  // after this step's advance
  /// f(the AdamWUpdate of this step), its corrections read once: a loop over a tensor
  /// asks once (NOTE [Update flags fixed for the loop] in core/update_rules.hpp).
  template <class F>
  TRAINMEM_HOST_DEVICE void visit_fixed(F&& f) const {
    math::AdamWUpdate u = update;
    u.bias1 = 1.0 - powers[0];
    u.bias2 = 1.0 - powers[1];
    f(u);
  }
  template <class T>
  TRAINMEM_HOST_DEVICE void operator()(T& p, T g, T& m, T& v) const {
    visit_fixed([&](const math::AdamWUpdate& u) { u(p, g, m, v); });
  }
};
}  // namespace detail

namespace optim {

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
};

/// \brief AdamW: p *= 1 - lr wd; m, v moments; p -= lr m_hat / (sqrt(v_hat) + eps).
template <class B>
class AdamW : public Optimizer<B> {
 public:
  AdamW(std::vector<Var<B>> params, AdamWOptions options) : Optimizer<B>(std::move(params)), options_(options) {
    validate(options, "AdamW");
  }
  AdamWOptions& options() { return options_; }
  double lr() const override { return options_.lr; }
  void set_lr(double lr) override { options_.lr = lr; }

 protected:
  std::int64_t step_state_size() const override { return 2; }  // [beta1^t, beta2^t]
  std::array<bool, 3> kept_states() const override { return {true, true, true}; }
  std::map<std::string, double> options_map() const override {
    return {{"lr", options_.lr},
            {"beta1", options_.beta1},
            {"beta2", options_.beta2},
            {"eps", options_.eps},
            {"weight_decay", options_.weight_decay}};
  }
  void check_options_map(const std::map<std::string, double>& options) const override {
    validate(from_map(options), "AdamW::load_state");
  }
  void check_options() const override { validate(options_, "AdamW::step"); }
  /// v >= 0 (a mean of squares: sqrt(v_hat) of a negative one is NaN); beta^t in [0, 1]
  /// (0: underflow after many steps); [1, 1] only while no step has been applied, when
  /// the moments are still zero: every applied step multiplies both powers by a beta < 1.
  void check_param_values(const StateDict& state, const std::string& p, std::int64_t) const override {
    check_values(
        state, p + "second_moment", [](double v) { return std::isfinite(v) && v >= 0; },
        "finite and >= 0 (a second moment is a mean of squares)", "AdamW::load_state");
    const std::string powers_name = p + "step_state";
    check_values(
        state, powers_name, [](double v) { return v >= 0 && v <= 1; },
        "in [0, 1] (the bias-correction powers [beta1^t, beta2^t])", "AdamW::load_state");
    if (!state.contains(powers_name)) return;
    double powers[2];
    std::memcpy(powers, state.at(powers_name).bytes.data(), sizeof powers);
    if (powers[0] != 1.0 && powers[1] != 1.0) return;
    detail::check(powers[0] == 1.0 && powers[1] == 1.0, "AdamW::load_state: '", powers_name, "' is [", powers[0], ", ",
                  powers[1],
                  "]: a power is 1 only before the first applied step, and then both are (each applied step "
                  "multiplies both by a beta < 1); nothing was loaded");
    const auto zero = [](double v) { return v == 0; };
    const bool moments_zero = detail::scan_values(state.at(p + "first_moment"), zero).failing == 0 &&
                              detail::scan_values(state.at(p + "second_moment"), zero).failing == 0;
    detail::check(moments_zero, "AdamW::load_state: '", powers_name,
                  "' is [1, 1] (no step applied yet) but the moments are not zero, and only an applied step "
                  "writes them; nothing was loaded");
  }
  void load_options_map(const std::map<std::string, double>& options) override {
    options_ = from_map(options);
    factor_step_ = -1;  // the cached [beta1, beta2] factor belongs to the old step count
    betas_for_ = {-1.0, -1.0};
  }

  void update(ParamGroupEntry<B>& e, const Tensor<B>& target, const Tensor<B>& grad, double grad_scale,
              const StepControl<B>& control) override {
    B& backend = target.backend();
    backend.map(math::Mul{}, e.step_state, power_factor(backend), e.step_state);
    const math::AdamWUpdate update{
        options_.lr, options_.beta1, options_.beta2, options_.eps, options_.weight_decay, grad_scale, 1.0, 1.0};
    this->apply(e, target, grad, detail::AdamWPoweredUpdate{update, e.step_state.template data_as<const double>()},
                control);
  }
  void prepare(ParamGroupEntry<B>& e, const Tensor<B>& target) override {
    B& backend = target.backend();
    this->ensure_state(e.first_moment, target);
    this->ensure_state(e.second_moment, target);
    if (!e.step_state.defined())
      e.step_state = Tensor<B>::full(Shape{2}, 1.0, DType::F64, MemCategory::OptimizerState, backend);
    if (!factor_.defined() || betas_for_ != std::pair{options_.beta1, options_.beta2}) {
      // Both made before either is kept: a failed second allocation leaves the pair as it was.
      Tensor<B> betas_minus_one = this->device_values({options_.beta1 - 1.0, options_.beta2 - 1.0}, backend);
      Tensor<B> factor = Tensor<B>::empty(Shape{2}, DType::F64, MemCategory::OptimizerState, backend);
      betas_minus_one_ = std::move(betas_minus_one);
      factor_ = std::move(factor);
      betas_for_ = {options_.beta1, options_.beta2};
    }
  }

 private:
  static void validate(const AdamWOptions& options, const char* who) {
    const auto finite = [](double v) { return std::isfinite(v); };
    detail::check(finite(options.lr) && options.lr >= 0 && finite(options.eps) && options.eps > 0 &&
                      finite(options.weight_decay) && options.weight_decay >= 0,
                  who, ": lr >= 0, eps > 0 and weight_decay >= 0, all finite, are required; got lr ", options.lr,
                  ", eps ", options.eps, ", weight_decay ", options.weight_decay);
    detail::check(options.beta1 >= 0 && options.beta1 < 1 && options.beta2 >= 0 && options.beta2 < 1, who,
                  ": betas must be in [0, 1), got ", options.beta1, ", ", options.beta2);
  }
  static AdamWOptions from_map(const std::map<std::string, double>& m) {
    return {m.at("lr"), m.at("beta1"), m.at("beta2"), m.at("eps"), m.at("weight_decay")};
  }

  /// [beta1, beta2] when the step applies, [1, 1] when it is cancelled: 1 + applies (beta - 1).
  /// Made once per step (the first parameter asks), without a host read.
  const Tensor<B>& power_factor(B& backend) {
    const std::int64_t step = this->steps_;
    if (factor_step_ == step) return factor_;
    backend.map(math::Mul{}, betas_minus_one_, this->step_applies(), factor_);
    backend.map(math::Add{}, factor_, this->device_one(), factor_);
    factor_step_ = step;
    return factor_;
  }

  AdamWOptions options_;
  Tensor<B> betas_minus_one_, factor_;
  std::pair<double, double> betas_for_{-1.0, -1.0};
  std::int64_t factor_step_ = -1;
};

}  // namespace optim
}  // namespace trainmem
