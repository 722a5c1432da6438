// trainmem/optim/optimizer_state.hpp — an optimizer's state saved and restored, checked before anything changes.
//
// Optimizer::state() / check_state() / load_state() (declared in optim/optimizer.hpp,
// which includes this header at its end): the moments, the device step state (bias
// corrections), the step counts, the stochastic-rounding stream and the options, keyed
// by parameter name. check_state reads every value before load_state copies anything:
// step counts in range, finite moments, and each optimizer's own rules
// (check_param_values: AdamW's v >= 0 and powers in [0, 1], SGD's whole count of steps).
// Parameter groups (NOTE [Parameter groups] in optim/optimizer.hpp): which parameter is in
// which group, and the group count, must match this optimizer's (checked, naming what
// differs); the groups' hyperparameters are restored from the state, like the options.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <map>
#include <set>
#include <string>

#include "trainmem/error.hpp"
#include "trainmem/optim/optimizer.hpp"
#include "trainmem/state/state_dict.hpp"

namespace trainmem::optim {

/// Everything a resumed run needs from this optimizer, keyed by parameter name
/// ("params.<name>.first_moment", ".second_moment", ".step_state", ".steps"), plus
/// "steps", "copy_rounding.*" and "options.*"; with groups, "groups" (their count),
/// "groups.<i>.<field>" (lr_scale and each override set) and "params.<name>.group".
/// The parameters' names must be unique.
template <class B>
StateDict Optimizer<B>::state() const {
  names_or_throw("state");
  StateDict out;
  out.set_i64("steps", steps_);
  out.set_i64("copy_rounding.mode", static_cast<std::int64_t>(rounding_mode_));
  out.set_u64("copy_rounding.seed", rounding_rng_.state().seed);
  out.set_u64("copy_rounding.offset", rounding_rng_.state().offset);
  for (const auto& [key, value] : options_map()) out.set_f64("options." + key, value);
  if (group_count_ > 0) out.set_i64("groups", static_cast<std::int64_t>(group_count_));
  const auto groups = group_maps();
  for (std::size_t g = 0; g < groups.size(); ++g)
    for (const auto& [key, value] : groups[g]) out.set_f64("groups." + std::to_string(g) + "." + key, value);
  for (const auto& e : entries_) {
    const std::string p = "params." + e.param.name() + ".";
    out.set_i64(p + "steps", e.steps);
    if (group_count_ > 0) out.set_i64(p + "group", static_cast<std::int64_t>(e.group));
    if (e.first_moment.defined()) out.set(p + moment_names()[0], e.first_moment);
    if (e.second_moment.defined()) out.set(p + moment_names()[1], e.second_moment);
    if (e.step_state.defined()) out.set(p + "step_state", e.step_state);
  }
  return out;
}
/// Throws (naming every missing or extra entry, shape and dtype, and every value no run
/// can leave: step counts out of range, non-finite moments, the derived optimizer's
/// own rules) unless `state` fits these parameters and holds valid options; modifies nothing.
template <class B>
void Optimizer<B>::check_state(const StateDict& state) const {
  names_or_throw("load_state");
  check_groups(state);
  std::map<std::string, ExpectedEntry> expected = {{"steps", {StateType::I64, Shape{}}},
                                                   {"copy_rounding.mode", {StateType::I64, Shape{}}},
                                                   {"copy_rounding.seed", {StateType::U64, Shape{}}},
                                                   {"copy_rounding.offset", {StateType::U64, Shape{}}}};
  for (const auto& [key, value] : options_map()) expected["options." + key] = {StateType::F64, Shape{}};
  if (group_count_ > 0) expected["groups"] = {StateType::I64, Shape{}};
  for (std::size_t g = 0; g < group_count_; ++g) {
    // lr_scale always; an override only where the saved group set it (else it follows options()).
    const std::string prefix = "groups." + std::to_string(g) + ".";
    expected[prefix + "lr_scale"] = {StateType::F64, Shape{}};
    for (const std::string& field : group_fields())
      if (state.contains(prefix + field)) expected[prefix + field] = {StateType::F64, Shape{}};
  }
  for (const auto& e : entries_) {
    const std::string p = "params." + e.param.name() + ".";
    const Tensor<B>& target = e.master.defined() ? e.master : e.param.value();
    expected[p + "steps"] = {StateType::I64, Shape{}};
    if (group_count_ > 0) expected[p + "group"] = {StateType::I64, Shape{}};
    // A parameter's states are made together at its first step: all of them or none.
    const std::array<std::string, 3> keys = {p + moment_names()[0], p + moment_names()[1], p + "step_state"};
    const std::array<bool, 3> kept = kept_states();
    const bool any =
        std::ranges::any_of(std::array{0, 1, 2}, [&](int k) { return kept[k] && state.contains(keys[k]); });
    for (int k = 0; k < 3; ++k) {
      if (!kept[k] || !any) continue;
      detail::check(state.contains(keys[k]), "optimizer::load_state: '", keys[k],
                    "' is missing; a parameter's states are saved together (all or none)");
      expected[keys[k]] = k < 2 ? ExpectedEntry{state_type_of(target.dtype()), target.shape()}
                                : ExpectedEntry{StateType::F64, Shape{step_state_size()}};
    }
  }
  check_layout(state, expected, "optimizer::load_state");
  // The values, as a run leaves them: counts in range, finite moments, and what the
  // derived optimizer's states must hold (check_param_values).
  const std::int64_t steps = state.get_i64("steps");
  detail::check(steps >= 0, "optimizer::load_state: steps must be >= 0, got ", steps);
  for (const auto& e : entries_) {
    const std::string p = "params." + e.param.name() + ".";
    const std::int64_t param_steps = state.get_i64(p + "steps");
    detail::check(param_steps >= 0 && param_steps <= steps, "optimizer::load_state: '", p, "steps' is ", param_steps,
                  "; a parameter's steps are in [0, steps = ", steps,
                  "] (it counts the optimizer's steps that updated it); nothing was loaded");
    const auto finite = [](double v) { return std::isfinite(v); };
    for (const char* moment : moment_names())
      check_values(state, p + moment, finite, "finite", "optimizer::load_state");
    check_param_values(state, p, param_steps);
  }
  detail::check(state.get_u64("copy_rounding.offset") % 4 == 0, "optimizer::load_state: copy_rounding.offset ",
                state.get_u64("copy_rounding.offset"),
                " is not a multiple of 4 (streams start at whole Philox blocks)");
  const std::int64_t mode = state.get_i64("copy_rounding.mode");
  detail::check(mode == static_cast<std::int64_t>(RoundingMode::NearestEven) ||
                    mode == static_cast<std::int64_t>(RoundingMode::Stochastic),
                "optimizer::load_state: copy_rounding.mode ", mode, " is not a rounding mode");
  check_options_map(options_from(state), groups_from(state));
}
/// Restores a state() (after check_state: on error nothing changes). Moments absent
/// from the state are dropped, as for a parameter never stepped.
template <class B>
void Optimizer<B>::load_state(const StateDict& state) {
  check_state(state);
  for (auto& e : entries_) {
    const std::string p = "params." + e.param.name() + ".";
    const Tensor<B>& target = e.master.defined() ? e.master : e.param.value();
    load_tensor(state, p + moment_names()[0], e.first_moment, target);
    load_tensor(state, p + moment_names()[1], e.second_moment, target);
    load_tensor(state, p + "step_state", e.step_state, target);
    e.steps = state.get_i64(p + "steps");
  }
  steps_ = state.get_i64("steps");
  rounding_mode_ = static_cast<RoundingMode>(state.get_i64("copy_rounding.mode"));
  rounding_rng_.set_state({state.get_u64("copy_rounding.seed"), state.get_u64("copy_rounding.offset")});
  load_options_map(options_from(state), groups_from(state));
}

/// Throws unless every parameter has a non-empty name no other one has (state keys).
template <class B>
void Optimizer<B>::names_or_throw(const char* who) const {
  std::set<std::string> seen;
  for (const auto& e : entries_) {
    detail::check(!e.param.name().empty(), "optimizer::", who, ": a parameter ", e.param.shape(),
                  " has no name; state is keyed by name (register parameters in an nn::Module)");
    detail::check(seen.insert(e.param.name()).second, "optimizer::", who, ": two parameters are named '",
                  e.param.name(), "'; state is keyed by name (nn::Module gives unique hierarchical names)");
  }
}
template <class B>
std::map<std::string, double> Optimizer<B>::options_from(const StateDict& state) const {
  std::map<std::string, double> options;
  for (const auto& [key, value] : options_map()) options[key] = state.get_f64("options." + key);
  return options;
}
/// The groups' saved hyperparameters: for group g, each "groups.<g>.<field>" the state holds.
template <class B>
std::vector<std::map<std::string, double>> Optimizer<B>::groups_from(const StateDict& state) const {
  std::vector<std::map<std::string, double>> groups(group_count_);
  std::vector<std::string> fields = group_fields();
  fields.insert(fields.begin(), "lr_scale");
  for (std::size_t g = 0; g < group_count_; ++g)
    for (const std::string& field : fields) {
      const std::string key = "groups." + std::to_string(g) + "." + field;
      if (state.contains(key)) groups[g][field] = state.get_f64(key, "optimizer::load_state");
    }
  return groups;
}
/// Throws unless `state` has this optimizer's groups: their count, and each parameter's group.
template <class B>
void Optimizer<B>::check_groups(const StateDict& state) const {
  const auto count_text = [](std::size_t n) { return n == 0 ? std::string("none") : std::to_string(n); };
  std::size_t saved = 0;
  if (state.contains("groups")) {
    const std::int64_t n = state.get_i64("groups", "optimizer::load_state");
    detail::check(n > 0, "optimizer::load_state: 'groups' is ", n, "; a saved group count is > 0");
    saved = static_cast<std::size_t>(n);
  }
  detail::check(saved == group_count_, "optimizer::load_state: the state has ",
                saved == 0 ? std::string("no parameter groups (saved from one list)")
                           : std::to_string(saved) + " parameter groups",
                ", this optimizer ", count_text(group_count_), "; nothing was loaded");
  if (group_count_ == 0) return;
  for (const auto& e : entries_) {
    const std::string key = "params." + e.param.name() + ".group";
    if (!state.contains(key)) continue;  // the layout check names it
    const std::int64_t g = state.get_i64(key, "optimizer::load_state");
    detail::check(g == static_cast<std::int64_t>(e.group), "optimizer::load_state: '", e.param.name(), "' is in group ",
                  g, " in the state and in group ", e.group,
                  " in this optimizer; build the optimizer with the groups it was saved with; nothing was loaded");
  }
}
/// Copies entry `name` into `tensor` (allocated like the entry when absent or of
/// another shape); drops `tensor` when the state has no such entry.
template <class B>
void Optimizer<B>::load_tensor(const StateDict& state, const std::string& name, Tensor<B>& tensor,
                               const Tensor<B>& like) {
  if (!state.contains(name)) {
    tensor = Tensor<B>();
    return;
  }
  const StateEntry& entry = state.at(name);
  if (tensor.defined() && tensor.shape() == entry.shape && state_type_of(tensor.dtype()) == entry.type)
    entry.copy_to(tensor);
  else tensor = entry.to_tensor(MemCategory::OptimizerState, like.backend());
}

}  // namespace trainmem::optim
