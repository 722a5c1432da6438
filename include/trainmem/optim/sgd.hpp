// trainmem/optim/sgd.hpp — stochastic gradient descent with momentum (PyTorch's rules).
//
// With momentum, the first step sets the buffer to the gradient and later steps
// blend. Which step is the first is read on the device from a per-parameter count of
// applied steps, so a step the loss scaler cancels on the device does not count
// (NOTE [Steps a device can cancel] in optimizer.hpp). state() saves the buffer as
// "momentum_buffer" and the count as "step_state". Parameter groups (SgdGroup: lr_scale,
// momentum, weight decay): NOTE [Parameter groups] in optim/optimizer.hpp.
#pragma once

#include <array>
#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <vector>

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

/// \brief Parameters of an SGD with settings of their own (NOTE [Parameter groups] in
/// optim/optimizer.hpp): the rate is options().lr x lr_scale; an unset field follows options().
template <class B>
struct SgdGroup {
  std::vector<Var<B>> params{};
  double lr_scale = 1.0;
  std::optional<double> momentum{}, weight_decay{};
};

/// \brief SGD: buf = momentum buf + (1 - dampening) g (buf = g on the first step); p -= lr buf.
template <class B>
class SGD : public Optimizer<B> {
 public:
  using Group = SgdGroup<B>;
  SGD(std::vector<Var<B>> params, SgdOptions options) : Optimizer<B>(std::move(params)), options_(options) {
    validate(options, "SGD");
  }
  /// Parameters in groups, each with its own settings; refused (naming the group and the
  /// field) when a parameter is in two groups, a group is empty or a value is bad.
  SGD(std::vector<Group> groups, SgdOptions options)
      : Optimizer<B>(params_of(groups), "SGD"), options_(options), groups_(std::move(groups)) {
    validate(options_, groups_, "SGD");
  }
  /// The base options; options().lr is the base rate (each group's is lr x lr_scale).
  SgdOptions& options() { return options_; }
  double lr() const override { return options_.lr; }
  void set_lr(double lr) override { options_.lr = lr; }
  /// The groups as built (or as load_state restored their settings); empty without groups.
  const std::vector<Group>& groups() const { return groups_; }
  std::vector<std::map<std::string, double>> group_maps() const override {
    std::vector<std::map<std::string, double>> out;
    for (const Group& g : groups_) {
      std::map<std::string, double>& m = out.emplace_back();
      m["lr_scale"] = g.lr_scale;
      if (g.momentum) m["momentum"] = *g.momentum;
      if (g.weight_decay) m["weight_decay"] = *g.weight_decay;
    }
    return out;
  }
  /// The options parameter group g steps with (options() without groups).
  SgdOptions group_options(std::size_t g) const {
    if (groups_.empty()) return options_;
    const Group& group = groups_.at(g);
    return {options_.lr * group.lr_scale, group.momentum.value_or(options_.momentum), options_.dampening,
            group.weight_decay.value_or(options_.weight_decay), options_.nesterov};
  }

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
  std::vector<std::string> group_fields() const override { return {"momentum", "weight_decay"}; }
  void check_options_map(const std::map<std::string, double>& options,
                         const std::vector<std::map<std::string, double>>& groups) const override {
    validate(from_map(options), groups_from(groups), "SGD::load_state");
  }
  void check_options() const override { validate(options_, groups_, "SGD::step"); }
  /// The step state counts applied steps: a whole number, at most the steps launched.
  void check_param_values(const StateDict& state, const std::string& p, std::int64_t steps) const override {
    check_values(
        state, p + "step_state",
        [steps](double v) { return v >= 0 && v <= static_cast<double>(steps) && v == std::floor(v); },
        detail::concat("a whole number of applied steps in [0, ", steps, "] (this parameter's steps)"),
        "SGD::load_state");
  }
  void load_options_map(const std::map<std::string, double>& options,
                        const std::vector<std::map<std::string, double>>& groups) override {
    options_ = from_map(options);
    std::vector<Group> loaded = groups_from(groups);
    for (std::size_t g = 0; g < groups_.size(); ++g) loaded[g].params = groups_[g].params;
    groups_ = std::move(loaded);
  }

  void update(ParamGroupEntry<B>& e, const Tensor<B>& target, const Tensor<B>& grad, double grad_scale,
              const StepControl<B>& control) override {
    const SgdOptions o = group_options(e.group);
    const math::SgdUpdate update{o.lr, o.momentum, o.dampening, o.weight_decay, grad_scale, o.nesterov, false};
    if (o.momentum == 0.0) {
      this->apply(e, target, grad, update, control);
      return;
    }
    target.backend().map(math::Add{}, e.step_state, this->step_applies(), e.step_state);
    this->apply(e, target, grad, detail::SgdCountedUpdate{update, e.step_state.template data_as<const double>()},
                control);
  }
  void prepare(ParamGroupEntry<B>& e, const Tensor<B>& target) override {
    if (group_options(e.group).momentum == 0.0) return;
    this->ensure_state(e.first_moment, target);
    if (!e.step_state.defined())
      e.step_state = Tensor<B>::zeros(Shape{1}, DType::F64, MemCategory::OptimizerState, target.backend());
  }

 private:
  static std::vector<std::vector<Var<B>>> params_of(const std::vector<Group>& groups) {
    std::vector<std::vector<Var<B>>> out;
    for (const Group& g : groups) out.push_back(g.params);
    return out;
  }
  static std::vector<Group> groups_from(const std::vector<std::map<std::string, double>>& maps) {
    std::vector<Group> out;
    for (const auto& m : maps) {
      Group& g = out.emplace_back();
      g.lr_scale = m.at("lr_scale");
      if (const auto it = m.find("momentum"); it != m.end()) g.momentum = it->second;
      if (const auto it = m.find("weight_decay"); it != m.end()) g.weight_decay = it->second;
    }
    return out;
  }
  /// The options, then each group's own values (NOTE [Parameter groups]).
  static void validate(const SgdOptions& options, const std::vector<Group>& groups, const char* who) {
    validate(options, who);
    const auto non_negative = [](double v) { return std::isfinite(v) && v >= 0; };
    for (std::size_t g = 0; g < groups.size(); ++g) {
      const Group& group = groups[g];
      const auto check = Optimizer<B>::check_group_value;
      check(non_negative(group.lr_scale), who, g, "lr_scale", group.lr_scale, "finite and >= 0");
      if (group.momentum) check(non_negative(*group.momentum), who, g, "momentum", *group.momentum, "finite and >= 0");
      if (group.weight_decay)
        check(non_negative(*group.weight_decay), who, g, "weight_decay", *group.weight_decay, "finite and >= 0");
      detail::check(!options.nesterov || group.momentum.value_or(options.momentum) > 0, who, ": group ", g,
                    ": Nesterov momentum needs momentum > 0 in every group, got momentum ",
                    group.momentum.value_or(options.momentum));
    }
  }
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
  std::vector<Group> groups_;
};

}  // namespace optim
}  // namespace trainmem
