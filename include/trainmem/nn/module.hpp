// trainmem/nn/module.hpp — the module base: parameters and submodules under unique hierarchical names.
//
// A module registers its parameters ("weight") and its submodules ("attn", "blocks.3")
// in its constructor. Registering renames: every parameter's Var is called by its path
// from the outermost module that registered it, so a model built from blocks ends with
// names such as "blocks.3.attn.q.weight", which state files, optimizers and error
// messages key on. A module keeps a flat list of (path, Var) handles rather than
// pointers to its submodules, so copying or moving modules (a std::vector of blocks
// that reallocates) never leaves a dangling registration; register a submodule after
// it is fully built, and do not reassign it afterwards.
//
//   struct Gpt : nn::Module<B> {
//     Gpt(...) : nn::Module<B>("Gpt") {
//       for (int i = 0; i < depth; ++i) blocks.emplace_back(dim, heads, 4 * dim, init);
//       for (int i = 0; i < depth; ++i) register_module("blocks." + std::to_string(i), blocks[i]);
//     }
//     std::vector<nn::TransformerBlock<B>> blocks;
//   };
#pragma once

#include <algorithm>
#include <cstdint>
#include <iomanip>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "trainmem/autograd/var.hpp"
#include "trainmem/state/state_dict.hpp"

namespace trainmem::nn {

/// \brief Base of every module: registered parameters, submodule records, state and summary.
template <class B>
class Module {
 public:
  /// A parameter as its module sees it: the path below this module, and the shared Var.
  struct NamedParameter {
    std::string name;
    Var<B> var;
  };

  /// `type` is shown by summary(); `name` prefixes the parameters' Var names until a
  /// parent registers this module under its own path ("" for an outermost model).
  explicit Module(std::string type, std::string name = {}) : type_(std::move(type)), name_(std::move(name)) {}
  virtual ~Module() = default;
  Module(const Module&) = default;
  Module& operator=(const Module&) = default;
  Module(Module&&) noexcept = default;
  Module& operator=(Module&&) noexcept = default;

  const std::string& type() const { return type_; }
  /// The prefix this module gave its parameters when built or when its parent registered
  /// it (a grandparent's registration renames the parameters, not this field).
  const std::string& name() const { return name_; }

  /// Every parameter, in registration order (submodules' in the order they were registered).
  std::vector<Var<B>> parameters() const {
    std::vector<Var<B>> out;
    out.reserve(params_.size());
    for (const auto& p : params_) out.push_back(p.var);
    return out;
  }
  /// Parameters with their paths below this module ("attn.q.weight").
  const std::vector<NamedParameter>& named_parameters() const { return params_; }
  /// Number of scalar parameters.
  std::int64_t parameter_count() const {
    std::int64_t n = 0;
    for (const auto& p : params_) n += p.var.numel();
    return n;
  }

  /// The parameter values keyed by their paths below this module.
  StateDict state() const {
    StateDict out;
    for (const auto& p : params_) out.set(p.name, p.var.value());
    return out;
  }
  /// Throws (naming every missing or extra entry, shape and dtype) unless `state` fits; changes nothing.
  void check_state(const StateDict& state) const {
    std::map<std::string, ExpectedEntry> expected;
    for (const auto& p : params_) expected[p.name] = {state_type_of(p.var.dtype()), p.var.shape()};
    check_layout(state, expected, "nn::" + type_ + "::load_state");
  }
  /// Copies the saved values into the parameters in place (after check_state: on error nothing changes).
  void load_state(const StateDict& state) {
    check_state(state);
    for (const auto& p : params_) state.at(p.name).copy_to(p.var.value());
  }

  /// One screen: this module, its submodules down to `max_depth` levels with their
  /// parameter counts, and the total count and bytes.
  std::string summary(std::size_t max_depth = 1) const {
    std::ostringstream out;
    std::size_t width = 4;
    for (const auto& c : children_)
      if (c.depth <= max_depth) width = std::max(width, 2 * (c.depth - 1) + c.path.size());
    std::int64_t bytes = 0;
    for (const auto& p : params_) bytes += static_cast<std::int64_t>(p.var.value().bytes());
    out << type_ << (name_.empty() ? "" : " '" + name_ + "'") << "\n";
    for (const auto& c : children_) {
      if (c.depth > max_depth) continue;
      const std::string label = std::string(2 * (c.depth - 1), ' ') + c.path;
      out << "  " << std::left << std::setw(static_cast<int>(width)) << label << "  " << std::setw(18) << c.type
          << std::right << std::setw(14) << grouped(c.count) << "\n";
    }
    out << "  " << grouped(parameter_count()) << " parameters in " << params_.size() << " tensors, " << grouped(bytes)
        << " bytes\n";
    return out.str();
  }

  /// Registers `var` as this module's parameter `local` and renames it to its full path.
  Var<B> register_parameter(const std::string& local, Var<B> var) {
    detail::check(var.defined() && var.requires_grad() && var.is_leaf(), "nn::", type_, "::register_parameter: '",
                  local, "' is not a parameter (a leaf that requires grad)");
    add(local, var);
    var.impl().name = StateDict::join(name_, local);
    return var;
  }
  /// Registers `child` (fully built) as submodule `local`: its parameters become this
  /// module's, under "local.", and are renamed to their full paths. Returns `child`.
  template <class M>
  M& register_module(const std::string& local, M& child) {
    const Module& c = child;
    detail::check(!local.empty(), "nn::", type_, "::register_module: the submodule's name is empty");
    for (const auto& r : children_)
      detail::check(r.path != local, "nn::", type_, "::register_module: a submodule is already called '", local, "'");
    for (const auto& p : c.params_) add(StateDict::join(local, p.name), p.var);
    children_.push_back({local, c.type_, c.parameter_count(), 1});
    for (const auto& r : c.children_) children_.push_back({local + "." + r.path, r.type, r.count, r.depth + 1});
    static_cast<Module&>(child).rename(StateDict::join(name_, local));
    return child;
  }

 private:
  struct ChildRecord {
    std::string path;
    std::string type;
    std::int64_t count;
    std::size_t depth;
  };

  void add(const std::string& path, const Var<B>& var) {
    for (const auto& p : params_) {
      detail::check(p.name != path, "nn::", type_, ": a parameter is already called '", path, "'");
      detail::check(p.var.handle() != var.handle(), "nn::", type_, ": '", path, "' is already registered as '", p.name,
                    "'");
    }
    params_.push_back({path, var});
  }
  /// Gives this module (and so every parameter below it) the prefix `prefix`.
  void rename(const std::string& prefix) {
    name_ = prefix;
    for (const auto& p : params_) p.var.impl().name = StateDict::join(prefix, p.name);
  }
  static std::string grouped(std::int64_t n) {
    std::string digits = std::to_string(n), out;
    for (std::size_t i = 0; i < digits.size(); ++i) {
      if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
      out += digits[i];
    }
    return out;
  }

  std::string type_;
  std::string name_;
  std::vector<NamedParameter> params_;
  std::vector<ChildRecord> children_;
};

}  // namespace trainmem::nn
