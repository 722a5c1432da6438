// trainmem/optim/adamw.hpp — Adam with decoupled weight decay (PyTorch's rules).
//
// The bias corrections 1 - beta^t come from per-parameter [beta1^t, beta2^t] kept on
// the device and multiplied by [beta1, beta2] only when the step applies, so a step
// the loss scaler cancels on the device leaves t where it was (NOTE [Steps a device
// can cancel] in optimizer.hpp). The powers are f64, as exact as the host's pow.
// state() saves m as "first_moment", v as "second_moment", the powers as "step_state".
// Parameter groups (AdamWGroup: lr_scale, betas, eps, weight decay) each keep their own
// [beta1, beta2] factor: NOTE [Parameter groups] in optim/optimizer.hpp.
#pragma once

#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

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

/// \brief Parameters of an AdamW with settings of their own (NOTE [Parameter groups] in
/// optim/optimizer.hpp): the rate is options().lr x lr_scale; an unset field follows options().
///
///   optim::AdamW<B> opt({{.params = decay, .weight_decay = 0.1},
///                        {.params = no_decay, .weight_decay = 0.0}}, {.lr = 3e-4});
template <class B>
struct AdamWGroup {
  std::vector<Var<B>> params{};
  double lr_scale = 1.0;
  std::optional<double> beta1{}, beta2{}, eps{}, weight_decay{};
};

/// \brief AdamW: p *= 1 - lr wd; m, v moments; p -= lr m_hat / (sqrt(v_hat) + eps).
template <class B>
class AdamW : public Optimizer<B> {
 public:
  using Group = AdamWGroup<B>;
  AdamW(std::vector<Var<B>> params, AdamWOptions options) : Optimizer<B>(std::move(params)), options_(options) {
    validate(options, "AdamW");
  }
  /// Parameters in groups, each with its own settings; refused (naming the group and the
  /// field) when a parameter is in two groups, a group is empty or a value is bad.
  AdamW(std::vector<Group> groups, AdamWOptions options)
      : Optimizer<B>(params_of(groups), "AdamW"), options_(options), groups_(std::move(groups)) {
    validate(options_, groups_, "AdamW");
    factors_.resize(groups_.size());
  }
  /// The base options; options().lr is the base rate (each group's is lr x lr_scale).
  AdamWOptions& options() { return options_; }
  double lr() const override { return options_.lr; }
  void set_lr(double lr) override { options_.lr = lr; }
  /// The groups as built (or as load_state restored their settings); empty without groups.
  const std::vector<Group>& groups() const { return groups_; }
  std::vector<std::map<std::string, double>> group_maps() const override {
    std::vector<std::map<std::string, double>> out;
    for (const Group& g : groups_) {
      std::map<std::string, double>& m = out.emplace_back();
      m["lr_scale"] = g.lr_scale;
      if (g.beta1) m["beta1"] = *g.beta1;
      if (g.beta2) m["beta2"] = *g.beta2;
      if (g.eps) m["eps"] = *g.eps;
      if (g.weight_decay) m["weight_decay"] = *g.weight_decay;
    }
    return out;
  }
  /// The options parameter group g steps with (options() without groups).
  AdamWOptions group_options(std::size_t g) const {
    if (groups_.empty()) return options_;
    const Group& group = groups_.at(g);
    return {options_.lr * group.lr_scale, group.beta1.value_or(options_.beta1), group.beta2.value_or(options_.beta2),
            group.eps.value_or(options_.eps), group.weight_decay.value_or(options_.weight_decay)};
  }

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
  std::vector<std::string> group_fields() const override { return {"beta1", "beta2", "eps", "weight_decay"}; }
  void check_options_map(const std::map<std::string, double>& options,
                         const std::vector<std::map<std::string, double>>& groups) const override {
    validate(from_map(options), groups_from(groups), "AdamW::load_state");
  }
  void check_options() const override { validate(options_, groups_, "AdamW::step"); }
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
  void load_options_map(const std::map<std::string, double>& options,
                        const std::vector<std::map<std::string, double>>& groups) override {
    options_ = from_map(options);
    std::vector<Group> loaded = groups_from(groups);
    for (std::size_t g = 0; g < groups_.size(); ++g) loaded[g].params = groups_[g].params;
    groups_ = std::move(loaded);
    for (PowerFactor& f : factors_) f = {};  // a cached [beta1, beta2] factor belongs to the old state
  }

  void update(ParamGroupEntry<B>& e, const Tensor<B>& target, const Tensor<B>& grad, double grad_scale,
              const StepControl<B>& control) override {
    B& backend = target.backend();
    backend.map(math::Mul{}, e.step_state, power_factor(e.group, backend), e.step_state);
    const AdamWOptions o = group_options(e.group);
    const math::AdamWUpdate update{o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, grad_scale, 1.0, 1.0};
    this->apply(e, target, grad, detail::AdamWPoweredUpdate{update, e.step_state.template data_as<const double>()},
                control);
  }
  void prepare(ParamGroupEntry<B>& e, const Tensor<B>& target) override {
    B& backend = target.backend();
    this->ensure_state(e.first_moment, target);
    this->ensure_state(e.second_moment, target);
    if (!e.step_state.defined())
      e.step_state = Tensor<B>::full(Shape{2}, 1.0, DType::F64, MemCategory::OptimizerState, backend);
    const AdamWOptions o = group_options(e.group);
    PowerFactor& f = factors_[e.group];
    if (!f.factor.defined() || f.betas != std::pair{o.beta1, o.beta2}) {
      // Both made before either is kept: a failed second allocation leaves the pair as it was.
      Tensor<B> betas_minus_one = this->device_values({o.beta1 - 1.0, o.beta2 - 1.0}, backend);
      Tensor<B> factor = Tensor<B>::empty(Shape{2}, DType::F64, MemCategory::OptimizerState, backend);
      f.betas_minus_one = std::move(betas_minus_one);
      f.factor = std::move(factor);
      f.betas = {o.beta1, o.beta2};
      f.step = -1;
    }
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
      const auto field = [&m](const char* name) {
        const auto it = m.find(name);
        return it == m.end() ? std::optional<double>() : std::optional<double>(it->second);
      };
      g.beta1 = field("beta1");
      g.beta2 = field("beta2");
      g.eps = field("eps");
      g.weight_decay = field("weight_decay");
    }
    return out;
  }
  /// The options, then each group's own values (NOTE [Parameter groups]).
  static void validate(const AdamWOptions& options, const std::vector<Group>& groups, const char* who) {
    validate(options, who);
    for (std::size_t g = 0; g < groups.size(); ++g) {
      const Group& group = groups[g];
      const auto check = Optimizer<B>::check_group_value;
      check(std::isfinite(group.lr_scale) && group.lr_scale >= 0, who, g, "lr_scale", group.lr_scale,
            "finite and >= 0");
      if (group.beta1) check(*group.beta1 >= 0 && *group.beta1 < 1, who, g, "beta1", *group.beta1, "in [0, 1)");
      if (group.beta2) check(*group.beta2 >= 0 && *group.beta2 < 1, who, g, "beta2", *group.beta2, "in [0, 1)");
      if (group.eps) check(std::isfinite(*group.eps) && *group.eps > 0, who, g, "eps", *group.eps, "finite and > 0");
      if (group.weight_decay)
        check(std::isfinite(*group.weight_decay) && *group.weight_decay >= 0, who, g, "weight_decay",
              *group.weight_decay, "finite and >= 0");
    }
  }
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

  /// A group's [beta1, beta2] - 1 and the factor made from it for the current step.
  struct PowerFactor {
    Tensor<B> betas_minus_one, factor;
    std::pair<double, double> betas{-1.0, -1.0};
    std::int64_t step = -1;
  };
  /// [beta1, beta2] when the step applies, [1, 1] when it is cancelled: 1 + applies (beta - 1).
  /// Made once per step for each group (its first parameter asks), without a host read.
  const Tensor<B>& power_factor(std::size_t group, B& backend) {
    PowerFactor& f = factors_[group];
    const std::int64_t step = this->steps_;
    if (f.step == step) return f.factor;
    backend.map(math::Mul{}, f.betas_minus_one, this->step_applies(), f.factor);
    backend.map(math::Add{}, f.factor, this->device_one(), f.factor);
    f.step = step;
    return f.factor;
  }

  AdamWOptions options_;
  std::vector<Group> groups_;
  std::vector<PowerFactor> factors_ = std::vector<PowerFactor>(1);  // one per group (one without groups)
};

}  // namespace optim
}  // namespace trainmem
