// trainmem/autocast/fp8_scaling.hpp — delayed scaling's state: per-tensor-role amax histories and scales.
//
// Every weight W a model registers has three tensor roles, each with its own scale:
//   input        x of y = x W^T (E4M3),
//   weight       W itself (E4M3),
//   grad_output  dy, the gradient that reaches y (E5M2).
// (TransformerEngine's fp8_meta per module, with the model's weights naming the modules.)
// All roles live in a few backend f32 tensors, so a step's bookkeeping is a handful of
// kernels whatever the model's size and never a host read:
//   amax     [R]     the running max of |x| this step's quantizations recorded (the max
//                    over micro-batches, since each quantization only raises it);
//   history  [H, R]  a ring of the last H steps' amaxes;
//   scale, scale_inv [R]  what quantize multiplies by and the GEMM divides out.
//
// NOTE [FP8 scales are replay state]
// Scales change once per optimizer step, in update(), after the step's skip decision: a
// skipped step (an inf or NaN gradient) drops its amaxes and leaves the history and the
// scales as they were. The decision comes as a host bool (update(stepped): the loss
// scaler read its flag) or as the step's device flag (update(found_inf): the optimizer
// skipped on the device, and so do the history and the scales, with no host read). An inf
// or NaN amax is itself a reason to skip: FP8 conversion saturates ±inf to ±max
// (core/float8.hpp), so an overflowing activation or an f16 gradient that overflowed under
// the loss scale would otherwise train as a finite value. nonfinite_probe() turns this
// step's amaxes into a flag that GradScaler::check_with_grads adds to its overflow check,
// or that is the step's found-inf flag when there is no scaler (amp::TrainStep does
// both). Each update makes a new
// *generation* of scale tensors and never writes the old ones, so a checkpoint region keeps the generation its forward
// used (a shared_ptr, O(1)) and its recompute quantizes with exactly those scales, even if an update ran in between. A
// recompute records no amax: it replays the forward, it is not a new observation (TransformerEngine issues #415 and
// #3284 are what happens when a recompute moves the scaling state).
//
// The quantized weight is cached per weight, keyed by the weight's storage and version
// and by the scale generation, like the cast cache: an optimizer step or a new scale
// misses, and every micro-batch and recompute in between reuses one quantization.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "trainmem/autocast/fp8_recipe.hpp"
#include "trainmem/autograd/var.hpp"
#include "trainmem/core/backend_contract.hpp"
#include "trainmem/core/float8.hpp"
#include "trainmem/core/fp8_scaling_rule.hpp"
#include "trainmem/core/tensor.hpp"
#include "trainmem/state/state_dict.hpp"

namespace trainmem::amp {

/// A tensor role of a registered weight.
enum class Fp8Role : std::uint8_t { Input = 0, Weight = 1, GradOutput = 2 };

constexpr std::string_view name_of(Fp8Role role) {
  switch (role) {
    case Fp8Role::Input: return "input";
    case Fp8Role::Weight: return "weight";
    case Fp8Role::GradOutput: return "grad_output";
  }
  return "?";
}

/// The largest finite value of an FP8 dtype.
constexpr float fp8_max(DType dtype) { return dtype == DType::F8E4M3 ? Float8E4M3::max : Float8E5M2::max; }

/// \brief One generation of scales: written once by Fp8Scaling::update, then only read.
template <class B>
struct Fp8Scales {
  std::uint64_t generation = 0;
  Tensor<B> scale;      // [R] f32
  Tensor<B> scale_inv;  // [R] f32, 1 / scale
};

/// \brief The delayed-scaling state of a model's weights (NOTE [FP8 scales are replay state]).
template <class B>
class Fp8Scaling {
 public:
  /// Registers every 2-D parameter of `parameters` (linear weights; biases and norms stay
  /// 16-bit), in order; their names key the saved state and must be unique and non-empty.
  explicit Fp8Scaling(const std::vector<Var<B>>& parameters, DelayedScaling recipe = {},
                      B& backend = B::default_instance())
      : recipe_(recipe), backend_(&backend) {
    recipe_.validate("amp::Fp8Scaling");
    detail::check(HasFp8<B>, "amp::Fp8Scaling: this backend has no FP8 kernels (quantize_fp8, gemm_fp8)");
    std::map<std::string, std::size_t> seen;
    for (const Var<B>& p : parameters) {
      detail::check(p.defined(), "amp::Fp8Scaling: an undefined parameter");
      if (p.shape().rank() != 2) continue;
      detail::check(p.tape() == nullptr, "amp::Fp8Scaling: '", p.name(), "' is on a tape, not a parameter");
      detail::check(!p.name().empty(), "amp::Fp8Scaling: a ", p.shape(),
                    " parameter has no name; names key the saved scaling state");
      detail::check(seen.emplace(p.name(), weights_.size()).second, "amp::Fp8Scaling: two parameters are named '",
                    p.name(), "'");
      weights_.push_back(p);
    }
    detail::check(!weights_.empty(), "amp::Fp8Scaling: none of the ", parameters.size(),
                  " parameters is 2-D; FP8 runs the GEMMs of linear weights");
    const auto roles = static_cast<std::int64_t>(role_count());
    history_ = Tensor<B>::zeros(Shape{recipe_.history_length, roles}, DType::F32, MemCategory::OptimizerState, backend);
    amax_ = Tensor<B>::zeros(Shape{roles}, DType::F32, MemCategory::OptimizerState, backend);
    auto first = std::make_shared<Fp8Scales<B>>();
    first->scale = Tensor<B>::full(Shape{roles}, 1.0, DType::F32, MemCategory::OptimizerState, backend);
    first->scale_inv = Tensor<B>::full(Shape{roles}, 1.0, DType::F32, MemCategory::OptimizerState, backend);
    scales_ = std::move(first);
    cache_.resize(weights_.size());
  }
  Fp8Scaling(const Fp8Scaling&) = delete;  // regions point at it while their graph lives
  Fp8Scaling& operator=(const Fp8Scaling&) = delete;

  const DelayedScaling& recipe() const { return recipe_; }
  std::size_t weight_count() const { return weights_.size(); }
  std::size_t role_count() const { return 3 * weights_.size(); }
  /// Role index of (weight w, role): forward roles first, so one map per format sets the scales.
  std::size_t role_index(std::size_t weight, Fp8Role role) const {
    return static_cast<std::size_t>(role) * weights_.size() + weight;
  }
  DType format_of(Fp8Role role) const {
    return role == Fp8Role::GradOutput ? recipe_.backward_format : recipe_.forward_format;
  }
  const Var<B>& weight(std::size_t w) const { return weights_.at(w); }

  /// The registered weight whose value `value` is (its storage and shape), or none.
  std::optional<std::size_t> find_weight(const Tensor<B>& value) const {
    auto it = by_data_.find(value.data());
    if (it == by_data_.end() || weights_[it->second].value().data() != value.data()) {
      by_data_.clear();  // master weights or a load may have replaced values since: index them again
      for (std::size_t w = 0; w < weights_.size(); ++w) by_data_[weights_[w].value().data()] = w;
      it = by_data_.find(value.data());
      if (it == by_data_.end()) return std::nullopt;
    }
    if (weights_[it->second].value().shape() != value.shape()) return std::nullopt;  // a view, not the weight
    return it->second;
  }

  /// The current generation of scales (what a forward quantizes with).
  const std::shared_ptr<const Fp8Scales<B>>& scales() const { return scales_; }
  std::uint64_t generation() const { return scales_->generation; }
  /// Role r's slot of this step's running amax ([1], f32).
  Tensor<B> amax_slot(std::size_t role) const { return slot(amax_, role); }
  /// [1]-shaped views of one generation's tensors, for the kernels.
  static Tensor<B> slot(const Tensor<B>& per_role, std::size_t role) {
    const auto r = static_cast<std::int64_t>(role);
    return per_role.slice(r, r + 1);
  }

  /// fp8(src * scale), recording |src|'s max into the role's amax when `record`.
  Tensor<B> quantize(const Tensor<B>& src, std::size_t role, Fp8Role kind, const Fp8Scales<B>& scales, bool record,
                     MemCategory category = MemCategory::Temporary) requires HasFp8<B> {
    Tensor<B> dst = Tensor<B>::empty(src.shape(), format_of(kind), category, src.backend());
    const Tensor<B> amax = record ? amax_slot(role) : Tensor<B>();
    src.backend().quantize_fp8(src, slot(scales.scale, role), dst, amax);
    if (record) {
      amax_.bump_version();
      ++amax_records_;
    }
    return dst;
  }

  /// Weight w quantized with `scales`: made once per (storage, version, generation) and
  /// reused; the weight role's amax is recorded when it is made and `record` is set.
  Tensor<B> quantized_weight(std::size_t w, const Tensor<B>& value, const Fp8Scales<B>& scales,
                             bool record) requires HasFp8<B> {
    CachedWeight& c = cache_.at(w);
    if (c.q.defined() && c.data == value.data() && c.version == value.version() && c.generation == scales.generation &&
        c.q.shape() == value.shape())
      return c.q;
    Tensor<B> q =
        quantize(value, role_index(w, Fp8Role::Weight), Fp8Role::Weight, scales, record, MemCategory::Parameter);
    c = CachedWeight{q, value.data(), value.version(), scales.generation};
    ++weight_quantizations_;
    return q;
  }

  /// A device [1] f32 flag of this step's amaxes: 0 when all are finite, NaN when one is
  /// inf or NaN (the tensors it came from saturated in FP8); such a step must be skipped.
  /// GradScaler::check_with_grads takes it as it is; without a scaler it is the step's
  /// found-inf flag (optim::StepControl, then update(found_inf)).
  Tensor<B> nonfinite_probe() const {
    const Tensor<B> zeroed = Tensor<B>::empty(amax_.shape(), DType::F32, MemCategory::Temporary, *backend_);
    backend_->map(math::Scale{0.0}, amax_, zeroed);  // 0 * finite = 0, 0 * inf = NaN, 0 * NaN = NaN
    Tensor<B> probe = Tensor<B>::empty(Shape{1}, DType::F32, MemCategory::Temporary, *backend_);
    backend_->sum_all(zeroed, probe);
    return probe;
  }

  /// Closes an optimizer step whose skip the host decided: when it `stepped`, this step's
  /// amaxes enter the history (at row position(), which then advances) and a new
  /// generation of scales is made from it by the recipe's rule; when it was skipped, its
  /// amaxes are dropped and history, position, scales and generation stay as they were.
  /// Either way the running amax starts again from 0. No host read.
  void update(bool stepped) {
    if (stepped) {
      const std::int64_t roles = static_cast<std::int64_t>(role_count()), h = recipe_.history_length;
      history_.slice(position_, position_ + 1).copy_from(amax_.reshape(Shape{1, roles}));
      position_ = (position_ + 1) % h;
      next_scales(nullptr);
    }
    amax_.zero_();
  }

  /// Closes an optimizer step whose skip the device decided: `found_inf` is the step's
  /// found-inf flag (an f32 scalar on this backend, optim::StepControl::found_inf; 0: the
  /// step was taken), read only by kernels. A taken step's amaxes enter the history as
  /// latest and the scales follow them, as update(true); a skipped step leaves the history
  /// and the scales bitwise as they were, as update(false). Since the host does not know
  /// which, position() stays where it is (the ring's rows move by one instead: a pass over
  /// the [H, R] history, which the max rule makes anyway) and a new generation is made
  /// either way, holding the old scales' bits when the step was skipped (the quantized
  /// weights are made once more). The running amax starts again from 0. No host read.
  void update(const Tensor<B>& found_inf) {
    detail::check(found_inf.defined() && found_inf.numel() == 1 && found_inf.dtype() == DType::F32 &&
                      &found_inf.backend() == backend_,
                  "amp::Fp8Scaling::update: found_inf must be an f32 scalar on the scaling state's backend, got ",
                  found_inf.defined() ? found_inf.shape().str() + " " + std::string(name_of(found_inf.dtype()))
                                      : std::string("undefined"));
    const math::KeepIfFound keep{found_inf.template data_as<const float>()};
    const std::int64_t roles = static_cast<std::int64_t>(role_count()), h = recipe_.history_length;
    // Row j takes row j + 1 (mod H), so oldest-to-latest read from position() drops the
    // oldest; the row before position() (the latest) takes this step's amax.
    Tensor<B> moved = Tensor<B>::empty(history_.shape(), DType::F32, MemCategory::Temporary, *backend_);
    if (h > 1) {
      moved.slice(0, h - 1).copy_from(history_.slice(1, h));
      moved.slice(h - 1, h).copy_from(history_.slice(0, 1));
    }
    const std::int64_t latest = (position_ + h - 1) % h;
    moved.slice(latest, latest + 1).copy_from(amax_.reshape(Shape{1, roles}));
    backend_->map(keep, moved, history_, history_);
    history_.bump_version();
    next_scales(&keep);
    amax_.zero_();
  }

  /// The amax history [H, R] (row (position - 1) mod H is the latest step's).
  const Tensor<B>& history() const { return history_; }
  std::int64_t position() const { return position_; }
  /// How many quantizations recorded an amax (a recompute adds none).
  std::uint64_t amax_records() const { return amax_records_; }
  /// How many weight quantizations were made (not reused from the cache).
  std::uint64_t weight_quantizations() const { return weight_quantizations_; }

  /// For each registered weight "<name>": "<name>.amax_history" [H, 3], "<name>.amax",
  /// "<name>.scale" and "<name>.scale_inv" [3], columns input, weight, grad_output; and
  /// "position", "generation". A host read; taken between steps.
  StateDict state() const {
    const auto host = [](const Tensor<B>& t) { return t.template to_host<float>(); };
    const std::vector<float> history = host(history_), amax = host(amax_), scale = host(scales_->scale),
                             scale_inv = host(scales_->scale_inv);
    const std::size_t roles = role_count();
    StateDict out;
    for (std::size_t w = 0; w < weights_.size(); ++w) {
      std::vector<float> hist(static_cast<std::size_t>(recipe_.history_length) * 3), a(3), s(3), si(3);
      for (std::size_t k = 0; k < 3; ++k) {
        const std::size_t r = role_index(w, static_cast<Fp8Role>(k));
        for (std::int64_t row = 0; row < recipe_.history_length; ++row)
          hist[static_cast<std::size_t>(row) * 3 + k] = history[static_cast<std::size_t>(row) * roles + r];
        a[k] = amax[r];
        s[k] = scale[r];
        si[k] = scale_inv[r];
      }
      const std::string& name = weights_[w].name();
      out.set(name + ".amax_history", host_tensor(Shape{recipe_.history_length, 3}, hist));
      out.set(name + ".amax", host_tensor(Shape{3}, a));
      out.set(name + ".scale", host_tensor(Shape{3}, s));
      out.set(name + ".scale_inv", host_tensor(Shape{3}, si));
    }
    out.set_i64("position", position_);
    out.set_i64("generation", static_cast<std::int64_t>(scales_->generation));
    return out;
  }

  /// Throws (naming the entry) unless `state` was saved by an Fp8Scaling with these
  /// weights and this history length; changes nothing.
  void check_state(const StateDict& state) const {
    std::map<std::string, ExpectedEntry> expected{{"position", {StateType::I64, Shape{}}},
                                                  {"generation", {StateType::I64, Shape{}}}};
    for (const Var<B>& w : weights_) {
      expected[w.name() + ".amax_history"] = {StateType::F32, Shape{recipe_.history_length, 3}};
      for (const char* field : {".amax", ".scale", ".scale_inv"})
        expected[w.name() + field] = {StateType::F32, Shape{3}};
    }
    check_layout(state, expected, "amp::Fp8Scaling::load_state");
    const std::int64_t position = state.get_i64("position"), generation = state.get_i64("generation");
    detail::check(position >= 0 && position < recipe_.history_length, "amp::Fp8Scaling::load_state: position is ",
                  position, ", expected [0, ", recipe_.history_length, ")");
    detail::check(generation >= 0, "amp::Fp8Scaling::load_state: generation is ", generation, ", expected >= 0");
    for (const Var<B>& w : weights_) {
      check_values(
          state, w.name() + ".scale", [](double v) { return std::isfinite(v) && v > 0.0; }, "finite and > 0",
          "amp::Fp8Scaling::load_state");
      check_values(
          state, w.name() + ".scale_inv", [](double v) { return std::isfinite(v) && v > 0.0; }, "finite and > 0",
          "amp::Fp8Scaling::load_state");
    }
  }

  /// Restores a state() (after check_state: on error nothing changes), as a new
  /// generation, so no cached weight or region made before the load is reused with it.
  void load_state(const StateDict& state) {
    check_state(state);
    const std::size_t roles = role_count();
    const auto h = static_cast<std::size_t>(recipe_.history_length);
    std::vector<float> history(h * roles), amax(roles), scale(roles), scale_inv(roles);
    for (std::size_t w = 0; w < weights_.size(); ++w) {
      const std::string& name = weights_[w].name();
      const std::vector<float> hist = floats(state.at(name + ".amax_history")), a = floats(state.at(name + ".amax")),
                               s = floats(state.at(name + ".scale")), si = floats(state.at(name + ".scale_inv"));
      for (std::size_t k = 0; k < 3; ++k) {
        const std::size_t r = role_index(w, static_cast<Fp8Role>(k));
        for (std::size_t row = 0; row < h; ++row) history[row * roles + r] = hist[row * 3 + k];
        amax[r] = a[k];
        scale[r] = s[k];
        scale_inv[r] = si[k];
      }
    }
    history_.copy_from(host_tensor(Shape{recipe_.history_length, static_cast<std::int64_t>(roles)}, history));
    amax_.copy_from(host_tensor(Shape{static_cast<std::int64_t>(roles)}, amax));
    auto loaded = std::make_shared<Fp8Scales<B>>();
    loaded->generation =
        std::max<std::uint64_t>(static_cast<std::uint64_t>(state.get_i64("generation")), scales_->generation + 1);
    loaded->scale = host_tensor(Shape{static_cast<std::int64_t>(roles)}, scale, MemCategory::OptimizerState);
    loaded->scale_inv = host_tensor(Shape{static_cast<std::int64_t>(roles)}, scale_inv, MemCategory::OptimizerState);
    scales_ = std::move(loaded);
    position_ = state.get_i64("position");
  }

 private:
  struct CachedWeight {
    Tensor<B> q;
    const void* data = nullptr;
    std::uint64_t version = 0;
    std::uint64_t generation = 0;
  };

  /// A new generation of scales from the history (max rule) or this step's amax (most
  /// recent), by the recipe's rule; with `keep`, the old scales wherever its flag is set.
  void next_scales(const math::KeepIfFound* keep) {
    const std::int64_t roles = static_cast<std::int64_t>(role_count()), h = recipe_.history_length;
    Tensor<B> chosen = amax_;
    Tensor<B> work;
    if (recipe_.rule == AmaxRule::Max) {  // a tree of pairwise maxima over the rows: log2(H) maps
      work = history_.clone();
      for (std::int64_t n = h; n > 1;) {
        const std::int64_t half = n / 2;
        backend_->map(math::AmaxMax{}, work.slice(0, half), work.slice(n - half, n), work.slice(0, half));
        n -= half;
      }
      chosen = work.slice(0, 1).reshape(Shape{roles});
    }
    auto next = std::make_shared<Fp8Scales<B>>();
    next->generation = scales_->generation + 1;
    next->scale = Tensor<B>::empty(Shape{roles}, DType::F32, MemCategory::OptimizerState, *backend_);
    next->scale_inv = Tensor<B>::empty(Shape{roles}, DType::F32, MemCategory::OptimizerState, *backend_);
    const auto forward = static_cast<std::int64_t>(2 * weights_.size());
    const float margin = std::ldexp(1.0f, recipe_.margin);
    const auto rule_over = [&](std::int64_t begin, std::int64_t end, DType format) {
      backend_->map(math::Fp8ScaleFromAmax{fp8_max(format), margin}, chosen.slice(begin, end),
                    scales_->scale.slice(begin, end), next->scale.slice(begin, end));
    };
    rule_over(0, forward, recipe_.forward_format);
    rule_over(forward, roles, recipe_.backward_format);
    if (keep != nullptr) backend_->map(*keep, next->scale, scales_->scale, next->scale);
    backend_->map(math::Reciprocal{}, next->scale, next->scale_inv);
    if (keep != nullptr) backend_->map(*keep, next->scale_inv, scales_->scale_inv, next->scale_inv);
    scales_ = std::move(next);
  }

  Tensor<B> host_tensor(Shape shape, const std::vector<float>& values,
                        MemCategory category = MemCategory::Temporary) const {
    return Tensor<B>::from_host(std::move(shape), values, DType::F32, category, *backend_);
  }
  static std::vector<float> floats(const StateEntry& entry) {
    std::vector<float> out(static_cast<std::size_t>(entry.shape.numel()));
    if (!out.empty()) std::memcpy(out.data(), entry.bytes.data(), out.size() * sizeof(float));
    return out;
  }

  DelayedScaling recipe_;
  B* backend_;
  std::vector<Var<B>> weights_;                         // registered, in order; role_index() lays out their roles
  mutable std::map<const void*, std::size_t> by_data_;  // a weight's value storage -> its index (rebuilt on a miss)
  Tensor<B> history_, amax_;                            // [H, R] ring and [R] running max, updated in place
  std::shared_ptr<const Fp8Scales<B>> scales_;          // the current generation; never written after update()
  std::int64_t position_ = 0;                           // the oldest history row (update(true) writes it)
  std::vector<CachedWeight> cache_;                     // by weight
  std::uint64_t amax_records_ = 0;
  std::uint64_t weight_quantizations_ = 0;
};

}  // namespace trainmem::amp
