// trainmem/amp/master_weights.hpp — FP32 master weights behind 16-bit model parameters.
//
// A bf16 weight near 1 moves in steps of 2^-7: an update of lr * g below half that is
// rounded away, every step, so a pure-bf16 weight stops learning. Masters keep each
// weight in f32, where the update lands; the model uses a 16-bit copy. The optimizer
// updates the master and writes the copy in the same pass per tensor (apply_update),
// optionally with stochastic rounding so that the copy is right on average. An update that
// makes a copy overflow (a finite master past f16's 65504) is a CopyOverflowError after the
// step (NOTE [Model copies that overflow] in core/copy_overflow.hpp).
//
// Memory: the model copy counts as MemCategory::Parameter (2 bytes per weight), the
// master as MemCategory::MasterWeight (4 bytes), the gradient as MemCategory::Gradient
// (2 bytes, or 4 with fp32_grads). An f32 parameter handed over keeps its
// storage as the master (re-tagged), and the Var's value becomes a new 16-bit tensor;
// every copy of the Var sees it, since a Var is a shared handle.
//
// NOTE [The f32 gradient]
// By default a model copy's .grad is 16-bit, so gradients accumulated over micro-batches
// round to 16 bits at every add. With MasterWeightsOptions::fp32_grads the gradient lives
// in an f32 .grad beside the master instead (Megatron's "main grad", PyTorch AMP's f32
// .grad): the parameter's Var::set_grad_in_f32, so backward widens each contribution to
// f32 and adds it there (NOTE [Gradients summed in f32] in autograd/tape.hpp, on any
// backend). It is still the Var's .grad, so everything that reads gradients reads it
// unchanged: zero_grad frees it, GradScaler::unscale_ divides it in place (no f32 copy
// to make) and checks it for inf/NaN, optim::clip_grad_norm scales it, the optimizer's
// fused update reads it, and dist::DataParallel / ZeroOptimizer (ZeroOptions::fp32_grads)
// widen it into their f32 buckets. It counts as MemCategory::Gradient, 4 bytes per weight
// instead of 2 (the planner measures it there); the 16-bit gradient is never stored.
//
// state() holds the masters by parameter name ("masters.<name>"); the 16-bit model
// copies are the module's state, and the stochastic-rounding stream the optimizer's.
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "trainmem/amp/narrowing.hpp"
#include "trainmem/autograd/parameter_list.hpp"
#include "trainmem/core/math.hpp"
#include "trainmem/core/stochastic_rounding.hpp"
#include "trainmem/optim/optimizer.hpp"
#include "trainmem/state/state_dict.hpp"

namespace trainmem::amp {

/// \brief How MasterWeights writes the 16-bit model copies.
struct MasterWeightsOptions {
  DType model_dtype = DType::BF16;                    // f16 or bf16
  RoundingMode rounding = RoundingMode::NearestEven;  // Stochastic: bf16 only
  std::uint64_t seed = 0;                             // stochastic rounding's Philox seed
  /// The model copies' gradients are summed in f32 (NOTE [The f32 gradient] above).
  bool fp32_grads = false;
};

/// \brief f32 masters for a set of parameters whose values become 16-bit model copies.
template <class B>
class MasterWeights {
 public:
  /// Takes the parameters (f32, or already 16-bit): f32 values become the masters and
  /// the parameters are narrowed to `options.model_dtype`; 16-bit values are widened
  /// into new masters. Gradients the parameters hold are dropped. Every check and every
  /// new tensor comes first: when one fails, no parameter has changed.
  explicit MasterWeights(std::vector<Var<B>> params, MasterWeightsOptions options = {})
      : params_(std::move(params)), options_(options) {
    detail::check(is_16bit(options.model_dtype), "amp::MasterWeights: the model dtype must be f16 or bf16, got ",
                  options.model_dtype);
    detail::check(options.rounding != RoundingMode::Stochastic || options.model_dtype == DType::BF16,
                  "amp::MasterWeights: stochastic rounding writes bf16 model copies, the model dtype is ",
                  options.model_dtype);
    check_parameter_list(params_, "amp::MasterWeights");
    for (const Var<B>& p : params_) {
      detail::check(p.tape() == nullptr, "amp::MasterWeights: '", p.name(), "' is a leaf of a tape, not a parameter");
      detail::check(p.dtype() == DType::F32 || p.dtype() == options.model_dtype, "amp::MasterWeights: '", p.name(),
                    "' is ", p.dtype(), "; expected f32 or the model dtype ", options.model_dtype);
    }
    // f32 values stay as the masters and get 16-bit model copies; 16-bit ones get f32 masters.
    std::vector<Tensor<B>> made;
    made.reserve(params_.size());
    for (const Var<B>& p : params_)
      made.push_back(p.value().to(p.dtype() == DType::F32 ? options.model_dtype : DType::F32,
                                  p.dtype() == DType::F32 ? MemCategory::Parameter : MemCategory::MasterWeight));
    {
      std::vector<Tensor<B>> sources, copies;
      std::vector<std::string> names;
      for (std::size_t i = 0; i < params_.size(); ++i) {
        if (params_[i].dtype() != DType::F32) continue;
        sources.push_back(params_[i].value());
        copies.push_back(made[i]);
        names.push_back(params_[i].name());
      }
      check_narrowed_finite(sources, copies, names, "amp::MasterWeights");
    }
    masters_.reserve(params_.size());
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const Var<B>& p = params_[i];
      if (p.dtype() == DType::F32) {
        masters_.push_back(p.value());
        masters_.back().storage()->retag(MemCategory::MasterWeight);
        p.impl().value = std::move(made[i]);
      } else {
        masters_.push_back(std::move(made[i]));
      }
      p.zero_grad();
      p.set_grad_in_f32(options_.fp32_grads);
    }
  }

  /// Makes `optimizer` update these masters (every optimizer parameter that is one of
  /// ours) and write the model copies with the configured rounding. Before its first
  /// step; all or nothing.
  void attach(optim::Optimizer<B>& optimizer) const {
    const auto& entries = optimizer.entries();
    std::vector<std::pair<std::size_t, std::size_t>> matches;  // (entry, master)
    for (std::size_t i = 0; i < entries.size(); ++i)
      for (std::size_t j = 0; j < params_.size(); ++j)
        if (entries[i].param.handle() == params_[j].handle()) {
          optimizer.check_master(i, masters_[j]);
          matches.emplace_back(i, j);
          break;
        }
    detail::check(!matches.empty(), "amp::MasterWeights::attach: the optimizer updates none of these parameters");
    for (const auto& [i, j] : matches) optimizer.set_master(i, masters_[j]);
    optimizer.set_copy_rounding(options_.rounding, options_.seed);
  }

  const std::vector<Var<B>>& params() const { return params_; }
  /// Master i (f32), of params()[i].
  const Tensor<B>& master(std::size_t i) const { return masters_.at(i); }
  const std::vector<Tensor<B>>& masters() const { return masters_; }
  const MasterWeightsOptions& options() const { return options_; }

  /// Rewrites every model copy from its master (round to nearest even), e.g. after
  /// loading masters from a checkpoint.
  void copy_to_model() const {
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const Tensor<B>& model = params_[i].value();
      model.backend().map(math::Identity{}, masters_[i], model);
      model.bump_version();
    }
  }

  /// The masters keyed "masters.<parameter name>", and "model_dtype".
  StateDict state() const {
    StateDict out;
    out.set_i64("model_dtype", static_cast<std::int64_t>(options_.model_dtype));
    for (std::size_t i = 0; i < params_.size(); ++i) out.set("masters." + unique_name(i, "state"), masters_[i]);
    return out;
  }
  /// Throws (naming every difference, and the first NaN or infinite master value) unless
  /// `state` fits these masters; changes nothing.
  void check_state(const StateDict& state) const {
    std::map<std::string, ExpectedEntry> expected{{"model_dtype", {StateType::I64, Shape{}}}};
    for (std::size_t i = 0; i < params_.size(); ++i)
      expected["masters." + unique_name(i, "load_state")] = {state_type_of(masters_[i].dtype()), masters_[i].shape()};
    check_layout(state, expected, "amp::MasterWeights::load_state");
    for (std::size_t i = 0; i < params_.size(); ++i)
      check_values(
          state, "masters." + params_[i].name(), [](double v) { return std::isfinite(v); }, "finite (a master weight)",
          "amp::MasterWeights::load_state");
    const std::int64_t dtype = state.get_i64("model_dtype");
    detail::check(dtype == static_cast<std::int64_t>(options_.model_dtype),
                  "amp::MasterWeights::load_state: the state's model copies are ",
                  dtype >= 0 && dtype <= static_cast<std::int64_t>(DType::F8E5M2)
                      ? std::string(name_of(static_cast<DType>(dtype)))
                      : std::to_string(dtype),
                  ", these are ", options_.model_dtype);
  }
  /// Copies the saved masters in place (after check_state). The model copies are not
  /// rewritten: load the module's state too, or call copy_to_model().
  void load_state(const StateDict& state) {
    check_state(state);
    for (std::size_t i = 0; i < params_.size(); ++i) state.at("masters." + params_[i].name()).copy_to(masters_[i]);
  }

 private:
  const std::string& unique_name(std::size_t i, const char* who) const {
    const std::string& name = params_[i].name();
    detail::check(!name.empty(), "amp::MasterWeights::", who, ": parameter ", i,
                  " has no name; state is keyed by name (register parameters in an nn::Module)");
    for (std::size_t j = 0; j < i; ++j)
      detail::check(params_[j].name() != name, "amp::MasterWeights::", who, ": two parameters are named '", name,
                    "'; state is keyed by name (nn::Module gives unique hierarchical names)");
    return name;
  }

  std::vector<Var<B>> params_;
  std::vector<Tensor<B>> masters_;
  MasterWeightsOptions options_;
};

}  // namespace trainmem::amp
