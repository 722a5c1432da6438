// trainmem/amp/master_weights.hpp — FP32 master weights behind 16-bit model parameters.
//
// A bf16 weight near 1 moves in steps of 2^-7: an update of lr * g below half that is
// rounded away, every step, so a pure-bf16 weight stops learning. Masters keep each
// weight in f32, where the update lands; the model uses a 16-bit copy. The optimizer
// updates the master and writes the copy in the same pass per tensor (apply_update),
// optionally with stochastic rounding so that the copy is right on average.
//
// Memory: the model copy counts as MemCategory::Parameter (2 bytes per weight), the
// master as MemCategory::MasterWeight (4 bytes). An f32 parameter handed over keeps its
// storage as the master (re-tagged), and the Var's value becomes a new 16-bit tensor;
// every copy of the Var sees it, since a Var is a shared handle.
#pragma once

#include <cstdint>
#include <vector>

#include "trainmem/amp/stochastic_rounding.hpp"
#include "trainmem/core/math.hpp"
#include "trainmem/optim/optimizer.hpp"

namespace trainmem::amp {

/// \brief How MasterWeights writes the 16-bit model copies.
struct MasterWeightsOptions {
  DType model_dtype = DType::BF16;  // f16 or bf16
  RoundingMode rounding = RoundingMode::NearestEven;  // Stochastic: bf16 only
  std::uint64_t seed = 0;  // stochastic rounding's Philox seed
};

/// \brief f32 masters for a set of parameters whose values become 16-bit model copies.
template <class B>
class MasterWeights {
 public:
  /// Takes the parameters (f32, or already 16-bit): f32 values become the masters and
  /// the parameters are narrowed to `options.model_dtype`; 16-bit values are widened
  /// into new masters. Gradients the parameters hold are dropped.
  explicit MasterWeights(std::vector<Var<B>> params, MasterWeightsOptions options = {})
      : params_(std::move(params)), options_(options) {
    trainmem::detail::check(is_16bit(options.model_dtype), "amp::MasterWeights: the model dtype must be f16 or bf16, got ",
                  options.model_dtype);
    trainmem::detail::check(options.rounding != RoundingMode::Stochastic || options.model_dtype == DType::BF16,
                  "amp::MasterWeights: stochastic rounding writes bf16 model copies, the model dtype is ",
                  options.model_dtype);
    masters_.reserve(params_.size());
    for (const Var<B>& p : params_) {
      trainmem::detail::check(p.defined() && p.requires_grad() && p.is_leaf() && p.tape() == nullptr,
                    "amp::MasterWeights: '", p.defined() ? p.name() : "", "' is not a parameter");
      const Tensor<B> value = p.value();
      trainmem::detail::check(value.dtype() == DType::F32 || value.dtype() == options.model_dtype, "amp::MasterWeights: '",
                    p.name(), "' is ", value.dtype(), "; expected f32 or the model dtype ", options.model_dtype);
      Tensor<B> master;
      if (value.dtype() == DType::F32) {
        master = value;
        master.storage()->retag(MemCategory::MasterWeight);
        Tensor<B> model = Tensor<B>::empty(value.shape(), options.model_dtype, MemCategory::Parameter, value.backend());
        value.backend().map(math::Identity{}, master, model);
        p.impl().value = std::move(model);
      } else {
        master = Tensor<B>::empty(value.shape(), DType::F32, MemCategory::MasterWeight, value.backend());
        value.backend().map(math::Identity{}, value, master);
      }
      p.zero_grad();
      masters_.push_back(std::move(master));
    }
  }

  /// Makes `optimizer` update these masters (every optimizer parameter that is one of
  /// ours) and write the model copies with the configured rounding. Before its first step.
  void attach(optim::Optimizer<B>& optimizer) const {
    auto& entries = optimizer.entries();
    std::size_t attached = 0;
    for (std::size_t i = 0; i < entries.size(); ++i) {
      for (std::size_t j = 0; j < params_.size(); ++j) {
        if (entries[i].param.handle() == params_[j].handle()) {
          optimizer.set_master(i, masters_[j]);
          ++attached;
          break;
        }
      }
    }
    trainmem::detail::check(attached > 0, "amp::MasterWeights::attach: the optimizer updates none of these parameters");
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

 private:
  std::vector<Var<B>> params_;
  std::vector<Tensor<B>> masters_;
  MasterWeightsOptions options_;
};

}  // namespace trainmem::amp
