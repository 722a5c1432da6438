// trainmem/optim/sgd.hpp — stochastic gradient descent with momentum (PyTorch's rules).
//
// With momentum, the first step sets the buffer to the gradient and later steps
// blend. Which step is the first is read on the device from a per-parameter count of
// applied steps, so a step the loss scaler cancels on the device does not count
// (NOTE [Steps a device can cancel] in optimizer.hpp). state() saves the buffer as
// "momentum_buffer" and the count as "step_state".
#pragma once

#include <array>
#include <cmath>
#include <map>
#include <string>

#include "trainmem/core/update_rules.hpp"
#include "trainmem/optim/optimizer.hpp"

namespace trainmem {

namespace detail {
/// SgdUpdate whose first-step test reads the applied-step count on the device.
struct SgdCountedUpdate {
  math::SgdUpdate update;
  const double* steps_applied;  // including this one
  /// As SgdUpdate::visit_fixed, with the first step read from the count.
  template <class F>
  TRAINMEM_HOST_DEVICE void visit_fixed(F&& f) const {
    math::SgdUpdate u = update;
    u.first_step = steps_applied[0] == 1.0;
    u.visit_fixed(f);
  }
  template <class T>
  TRAINMEM_HOST_DEVICE void operator()(T& p, T g, T& buffer, T& unused) const {
    visit_fixed([&](const auto& fixed) { fixed(p, g, buffer, unused); });
  }
};
}  // namespace detail

namespace optim {

struct SgdOptions {
  double lr = 0.01;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
};

/// \brief SGD: buf = momentum buf + (1 - dampening) g (buf = g on the first step); p -= lr buf.
template <class B>
class SGD : public Optimizer<B> {
 public:
  SGD(std::vector<Var<B>> params, SgdOptions options) : Optimizer<B>(std::move(params)), options_(options) {
    validate(options, "SGD");
  }
  SgdOptions& options() { return options_; }
  double lr() const override { return options_.lr; }
  void set_lr(double lr) override { options_.lr = lr; }

 protected:
  std::array<const char*, 2> moment_names() const override { return {"momentum_buffer", "unused"}; }
  std::int64_t step_state_size() const override { return 1; }  // [applied steps]
  std::array<bool, 3> kept_states() const override { return {true, false, true}; }
  std::map<std::string, double> options_map() const override {
    return {{"lr", options_.lr},
            {"momentum", options_.momentum},
            {"dampening", options_.dampening},
            {"weight_decay", options_.weight_decay},
            {"nesterov", options_.nesterov ? 1.0 : 0.0}};
  }
  void check_options_map(const std::map<std::string, double>& options) const override {
    validate(from_map(options), "SGD::load_state");
  }
  void check_options() const override { validate(options_, "SGD::step"); }
  /// The step state counts applied steps: a whole number, at most the steps launched.
  void check_param_values(const StateDict& state, const std::string& p, std::int64_t steps) const override {
    check_values(
        state, p + "step_state",
        [steps](double v) { return v >= 0 && v <= static_cast<double>(steps) && v == std::floor(v); },
        detail::concat("a whole number of applied steps in [0, ", steps, "] (this parameter's steps)"),
        "SGD::load_state");
  }
  void load_options_map(const std::map<std::string, double>& options) override { options_ = from_map(options); }

  void update(ParamGroupEntry<B>& e, const Tensor<B>& target, const Tensor<B>& grad, double grad_scale,
              const StepControl<B>& control) override {
    const math::SgdUpdate update{
        options_.lr, options_.momentum, options_.dampening, options_.weight_decay, grad_scale, options_.nesterov,
        false};
    if (options_.momentum == 0.0) {
      this->apply(e, target, grad, update, control);
      return;
    }
    target.backend().map(math::Add{}, e.step_state, this->step_applies(), e.step_state);
    this->apply(e, target, grad, detail::SgdCountedUpdate{update, e.step_state.template data_as<const double>()},
                control);
  }
  void prepare(ParamGroupEntry<B>& e, const Tensor<B>& target) override {
    if (options_.momentum == 0.0) return;
    this->ensure_state(e.first_moment, target);
    if (!e.step_state.defined())
      e.step_state = Tensor<B>::zeros(Shape{1}, DType::F64, MemCategory::OptimizerState, target.backend());
  }

 private:
  static void validate(const SgdOptions& options, const char* who) {
    const auto non_negative = [](double v) { return std::isfinite(v) && v >= 0; };
    detail::check(non_negative(options.lr) && non_negative(options.momentum) && non_negative(options.weight_decay) &&
                      std::isfinite(options.dampening),
                  who, ": lr, momentum and weight_decay must be finite and non-negative, dampening finite; got lr ",
                  options.lr, ", momentum ", options.momentum, ", weight_decay ", options.weight_decay, ", dampening ",
                  options.dampening);
    detail::check(!options.nesterov || (options.momentum > 0 && options.dampening == 0), who,
                  ": Nesterov momentum needs momentum > 0 and zero dampening");
  }
  static SgdOptions from_map(const std::map<std::string, double>& m) {
    return {m.at("lr"), m.at("momentum"), m.at("dampening"), m.at("weight_decay"), m.at("nesterov") != 0.0};
  }

  SgdOptions options_;
};

}  // namespace optim
}  // namespace trainmem
