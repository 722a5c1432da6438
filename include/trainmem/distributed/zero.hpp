// trainmem/distributed/zero.hpp — ZeRO-1 and ZeRO-2: each rank keeps optimizer state for its shard only.
//
// In mixed-precision AdamW a parameter costs 16 bytes: 2 (16-bit weight) + 2 (gradient)
// + 4 (f32 master) + 8 (two f32 moments). Data parallelism keeps all 16 on every rank.
// Here rank r owns the contiguous shard r of the flat parameter space
// (dist/flat_layout.hpp) and keeps the masters and moments of that shard only; ZeRO-2
// keeps only the shard's gradient too. Per rank, with Ψ parameters on N ranks:
//   ZeRO-1: 2Ψ weights + 2Ψ gradients + 12Ψ/N          = 4Ψ + 12Ψ/N bytes
//   ZeRO-2: 2Ψ weights + (2 + 12)Ψ/N                  = 2Ψ + 14Ψ/N bytes
// With ZeroOptions::fp32_grads the gradients are f32 (summed over micro-batches in f32,
// amp/master_weights.hpp's NOTE [The f32 gradient]): ZeRO-1 4Ψ + 2Ψ more, ZeRO-2's shard
// 16Ψ/N, and its full gradients 4Ψ while backward makes them.
// (ZeRO-2's full gradients exist only while backward makes them: with the overlap of
// dist/data_parallel.hpp each is freed once the buckets holding it are reduced.)
//
// The weights move into one flat buffer, each parameter's value a view into it, so a
// shard is one contiguous range and the updated 16-bit weights come back with one
// in-place all-gather per bucket. A shard cuts parameters into segments; each segment
// is a parameter of an ordinary optimizer (AdamW by default) with its master in the
// shard's f32 buffer, so the step is the existing fused pass (unscale, skip on
// found_inf, update, 16-bit copy with the configured rounding). A rank with an empty
// shard (Ψ < N ranks' worth) gets one empty segment and still joins every collective.
//
// Parameter groups (AdamWGroup, SgdGroup: NOTE [Parameter groups] in optim/optimizer.hpp)
// survive sharding: each segment joins its parameter's group, so every element steps with
// its group's settings. The shard optimizer holds the groups that have a segment on this
// rank, in order (a rank may hold fewer groups than were given; its state is its own).
//
// With a GradScaler, step(scaler) unscales the shard, sums the ranks' found-inf flags
// (one all-reduce), so every rank skips the same steps and the scalers stay equal, and
// clips with a global norm: each rank's sum of squares, gathered and added in rank
// order, so every rank gets the same norm to the bit.
#pragma once

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "trainmem/amp/grad_scaler.hpp"
#include "trainmem/amp/narrowing.hpp"
#include "trainmem/autograd/grad_mode.hpp"
#include "trainmem/core/stochastic_rounding.hpp"
#include "trainmem/distributed/data_parallel.hpp"
#include "trainmem/optim/adamw.hpp"

namespace trainmem::dist {

namespace detail {
/// The optimizer's parameter group type (optim::AdamWGroup, optim::SgdGroup), or an empty
/// struct for an optimizer without groups.
template <class Optimizer>
struct GroupOf {
  struct type {};
};
template <class Optimizer>
requires requires { typename Optimizer::Group; }
struct GroupOf<Optimizer> {
  using type = typename Optimizer::Group;
};

/// The global 2-norm of a shard optimizer's gradients (a collective): each rank's sum of
/// squares, gathered and added in rank order, so every rank gets the same norm to the bit.
template <class B, class Optimizer>
double global_grad_norm(Communicator<B>& comm, const Optimizer& optimizer) {
  B& backend = optimizer.entries().front().param.value().backend();
  Tensor<B> sum_sq = Tensor<B>::zeros(Shape{}, DType::F64, MemCategory::Temporary, backend);
  for (const auto& e : optimizer.entries())
    if (e.param.grad().defined() && e.param.grad().numel() > 0) backend.sum_squares(e.param.grad(), sum_sq);
  const double mine = sum_sq.template to_host<double>()[0];
  std::vector<double> all(static_cast<std::size_t>(comm.size()));
  comm.all_gather_host(std::as_bytes(std::span(&mine, 1)), std::as_writable_bytes(std::span(all)));
  double total = 0;
  for (double s : all) total += s;
  return std::sqrt(total);
}

/// One step of a shard optimizer whose segments hold reduced gradients: with a scaler
/// (enabled), unscale, agree on found-inf over the ranks (one all-reduce), clip with the
/// global norm when `max_grad_norm` >= 0, step or skip alike on every rank. `after(stepped)`
/// runs after the step, also when the step was taken and its 16-bit copy overflowed
/// (CopyOverflowError, rethrown), so every rank still joins what `after` communicates.
/// Returns whether it stepped. `who` names the caller in errors.
template <class B, class Optimizer, class After>
bool sharded_step(Communicator<B>& comm, Optimizer& optimizer, std::type_identity_t<amp::GradScaler<B>>* scaler,
                  double max_grad_norm, const char* who, After&& after) {
  if (scaler != nullptr && !scaler->is_enabled()) scaler = nullptr;
  trainmem::detail::check(max_grad_norm < 0 || std::isfinite(max_grad_norm), who,
                          ": max_grad_norm must be finite (negative: no clipping), got ", max_grad_norm);
  for (const auto& e : optimizer.entries()) {  // checked before clipping changes any
    trainmem::detail::check(e.param.grad().defined(), who, ": '", e.param.name(),
                            "' has no reduced gradient; call reduce_gradients() (or micro_batch_done()) first");
    optim::Optimizer<B>::check_grad(e.param, who);
  }
  if (scaler != nullptr) {
    scaler->unscale_(optimizer);
    comm.all_reduce_sum(scaler->found_inf(optimizer));
  }
  if (max_grad_norm >= 0) {
    const double norm = global_grad_norm(comm, optimizer);
    const double coefficient = max_grad_norm / (norm + 1e-6);  // optim::clip_grad_norm's rule
    if (std::isfinite(norm) && coefficient < 1.0) {
      for (const auto& e : optimizer.entries()) {
        const Tensor<B>& g = e.param.grad();
        if (!g.defined() || g.numel() == 0) continue;
        g.backend().map(math::Scale{coefficient}, g, g);
        g.bump_version();
      }
    }
  }
  bool stepped = true;
  try {
    if (scaler != nullptr) stepped = scaler->step(optimizer);
    else optimizer.step();
  } catch (const CopyOverflowError&) {  // the step was taken: every rank still runs `after`
    after(true);
    throw;
  }
  after(stepped);
  return stepped;
}
}  // namespace detail

/// \brief What a ZeroOptimizer shards and how it stores the weights.
struct ZeroOptions {
  int stage = 1;  // 1: masters and optimizer state; 2: gradients too
  /// f32: the weights are the optimizer's target (no masters). f16/bf16: the model
  /// copies are 16-bit and each rank keeps f32 masters of its shard.
  DType model_dtype = DType::BF16;
  RoundingMode rounding = RoundingMode::NearestEven;  // of the 16-bit copies
  std::uint64_t seed = 0;                             // stochastic rounding's seed
  /// The 16-bit copies' gradients are summed in f32 (amp::MasterWeightsOptions::fp32_grads,
  /// Var::set_grad_in_f32), and ZeRO-2's shard gradient is f32: 2 more bytes a weight each.
  bool fp32_grads = false;
  DataParallelOptions data_parallel = {};  // bucket size, accumulation
};

/// \brief An optimizer (AdamW by default) whose state is sharded over the ranks of `comm`.
template <class B, class Optimizer = optim::AdamW<B>>
class ZeroOptimizer {
 public:
  /// A collective. Checks that the ranks' parameter lists and settings agree (those of
  /// DataParallel, and the stage, model dtype and rounding: dist/same_configuration.hpp),
  /// takes rank 0's weights, moves the weights into one flat buffer of
  /// `options.model_dtype` and builds this rank's shard.
  template <class OptimizerOptions>
  ZeroOptimizer(Communicator<B>& comm, std::vector<Var<B>> params, ZeroOptions options,
                OptimizerOptions optimizer_options)
      : ZeroOptimizer(comm, std::move(params), std::vector<Group>{}, {}, options, optimizer_options) {}
  /// As above, with the parameters in groups, each with its own settings (checked as the
  /// optimizer checks them, before any collective, then the same on every rank); the flat
  /// layout takes the parameters group by group.
  template <class OptimizerOptions>
  ZeroOptimizer(Communicator<B>& comm, std::vector<typename detail::GroupOf<Optimizer>::type> groups,
                ZeroOptions options, OptimizerOptions optimizer_options)
      : ZeroOptimizer(comm, params_of(groups), groups, group_settings(groups, optimizer_options), options,
                      optimizer_options) {}

 private:
  using Group = typename detail::GroupOf<Optimizer>::type;
  /// `groups` empty: one plain list; else their params are `params`, group by group, and
  /// `group_settings` describes them for the check that every rank has the same.
  template <class OptimizerOptions>
  ZeroOptimizer(Communicator<B>& comm, std::vector<Var<B>> params, std::vector<Group> groups,
                const std::vector<Setting>& group_settings, ZeroOptions options, OptimizerOptions optimizer_options)
      : dp_(comm, std::move(params), checked(options).data_parallel, settings_of(options, group_settings)),
        options_(options),
        shard_(shard_range(dp_.layout().total(), comm.rank(), comm.size())) {
    const auto& ps = dp_.params();
    trainmem::detail::check(!ps.empty(), "dist::ZeroOptimizer: no parameters");
    for (const Var<B>& p : ps)
      trainmem::detail::check(p.dtype() == DType::F32 || p.dtype() == options.model_dtype, "dist::ZeroOptimizer: '",
                              p.name(), "' is ", p.dtype(), "; expected f32 or the model dtype ", options.model_dtype);
    // Everything is made from copies first, the shard optimizer (which checks its
    // options) included; the parameters become views of the flat buffer only at the
    // end, so a throw leaves the model as it was given.
    NoGradGuard no_grad;
    B& backend = ps.front().value().backend();
    const bool masters = options.model_dtype != DType::F32;
    if (masters) master_ = Tensor<B>::empty(Shape{shard_.size()}, DType::F32, MemCategory::MasterWeight, backend);
    flat_ = Tensor<B>::empty(Shape{dp_.layout().total()}, options.model_dtype, MemCategory::Parameter, backend);
    const FlatLayout& layout = dp_.layout();
    if (masters) {  // from the values as given: an f32 parameter keeps every bit in its master
      layout.for_each_piece(shard_, [&](const Piece& piece) {
        const std::int64_t at = layout.offset(piece.param) + piece.param_offset - shard_.begin;
        backend.map(math::Identity{},
                    flat_view(ps[piece.param].value(), piece.param_offset, piece.param_offset + piece.count),
                    master_.slice(at, at + piece.count));
      });
    }
    for (std::size_t i = 0; i < ps.size(); ++i)
      backend.map(math::Identity{}, ps[i].value().reshape(Shape{layout.numel(i)}),
                  flat_view(flat_, layout.offset(i), layout.offset(i) + layout.numel(i)));
    if (masters) {  // every rank holds rank 0's values: all throw alike
      std::vector<Tensor<B>> sources, copies;
      std::vector<std::string> names;
      for (std::size_t i = 0; i < ps.size(); ++i) {
        sources.push_back(ps[i].value());
        copies.push_back(flat_view(flat_, layout.offset(i), layout.offset(i) + layout.numel(i)));
        names.push_back(ps[i].name());
      }
      amp::check_narrowed_finite(sources, copies, names, "dist::ZeroOptimizer");
    }
    if (options.stage == 2)
      grad_shard_ = Tensor<B>::zeros(Shape{shard_.size()}, options.fp32_grads ? DType::F32 : options.model_dtype,
                                     MemCategory::Gradient, backend);

    std::vector<Var<B>> segments;
    layout.for_each_piece(shard_, [&](const Piece& piece) {
      const std::int64_t begin = layout.offset(piece.param) + piece.param_offset;
      segments_.push_back({piece, begin - shard_.begin});
      segments.push_back(Var<B>::parameter(flat_view(flat_, begin, begin + piece.count),
                                           ps[piece.param].name() + "[" + std::to_string(piece.param_offset) + ":" +
                                               std::to_string(piece.param_offset + piece.count) + "]"));
    });
    if (segments.empty()) {  // an empty shard still steps (and checks) like the others
      segments_.push_back({Piece{0, 0, 0, 0}, 0});
      segments.push_back(Var<B>::parameter(flat_view(flat_, 0, 0), "empty shard"));
    }
    if constexpr (requires { typename Optimizer::Group; }) {
      if (!groups.empty()) {  // each segment in its parameter's group; groups with no segment here are left out
        std::vector<std::size_t> group_of;
        for (std::size_t g = 0; g < groups.size(); ++g) group_of.insert(group_of.end(), groups[g].params.size(), g);
        for (Group& g : groups) g.params.clear();
        for (std::size_t i = 0; i < segments.size(); ++i)
          groups[group_of[segments_[i].piece.param]].params.push_back(segments[i]);
        std::erase_if(groups, [](const Group& g) { return g.params.empty(); });
        optimizer_ = std::make_unique<Optimizer>(std::move(groups), optimizer_options);
      }
    }
    if (!optimizer_) optimizer_ = std::make_unique<Optimizer>(std::move(segments), optimizer_options);
    if (masters) {
      for (std::size_t i = 0; i < segments_.size(); ++i)
        optimizer_->set_master(
            i, master_.slice(segments_[i].shard_offset, segments_[i].shard_offset + segments_[i].piece.count));
      optimizer_->set_copy_rounding(options.rounding, options.seed);
    }

    for (std::size_t i = 0; i < ps.size(); ++i) {  // nothing below throws
      ps[i].impl().value =
          flat_view(flat_, layout.offset(i), layout.offset(i) + layout.numel(i)).reshape(ps[i].shape());
      ps[i].zero_grad();
      ps[i].set_grad_in_f32(options.fp32_grads);
    }
    if (options.stage == 2) dp_.reduce_into_shard(grad_shard_, shard_);
  }

 public:
  /// Drops every parameter's gradient and the shard's reduced ones (before the first
  /// micro-batch of a step, or after a step that was refused).
  void zero_grad() {
    for (const Var<B>& p : dp_.params()) p.zero_grad();
    optimizer_->zero_grad();
  }

  /// Call after each micro-batch's backward; on the last of accumulation_steps it
  /// reduces the gradients (see reduce_gradients) and returns true.
  bool micro_batch_done() {
    if (!dp_.micro_batch_done()) return false;
    take_reduced_gradients();
    return true;
  }

  /// Averages the gradients over ranks (a collective), finishing what backward started.
  /// ZeRO-1: every gradient becomes the average, as in DataParallel. ZeRO-2: this rank's
  /// shard of the average lands in the shard's gradient buffer and the full gradients
  /// are freed.
  void reduce_gradients() {
    dp_.average_gradients();
    take_reduced_gradients();
  }

  /// Steps the shard and all-gathers the updated weights; returns true (no scaler, no skip).
  /// `max_grad_norm` >= 0 clips first with the global norm.
  bool step(double max_grad_norm = -1) {
    return detail::sharded_step(dp_.communicator(), *optimizer_, nullptr, max_grad_norm, "dist::ZeroOptimizer::step",
                                [this](bool stepped) { finish(stepped); });
  }
  /// As step(), with a loss scaler: the gradients are unscaled, the ranks agree on
  /// found-inf and every rank steps or skips together. Returns whether it stepped.
  /// Call scaler.update() afterwards, as with one process.
  bool step(amp::GradScaler<B>& scaler, double max_grad_norm = -1) {
    return detail::sharded_step(dp_.communicator(), *optimizer_, &scaler, max_grad_norm, "dist::ZeroOptimizer::step",
                                [this](bool stepped) { finish(stepped); });
  }

  /// The global 2-norm of the reduced gradients (a collective; the same on every rank).
  double grad_norm() { return detail::global_grad_norm(dp_.communicator(), *optimizer_); }

  /// The optimizer of this rank's shard (its parameters are the shard's segments).
  Optimizer& shard_optimizer() { return *optimizer_; }
  const Optimizer& shard_optimizer() const { return *optimizer_; }
  /// This rank's range of the flat parameter space.
  Range shard() const { return shard_; }
  /// The shard's f32 masters (undefined with an f32 model) and, for ZeRO-2, its gradient.
  const Tensor<B>& masters() const { return master_; }
  const Tensor<B>& shard_gradient() const { return grad_shard_; }
  /// Every weight, as one flat tensor of the model dtype (the parameters are views of it).
  const Tensor<B>& flat_weights() const { return flat_; }
  const std::vector<Var<B>>& params() const { return dp_.params(); }
  const ZeroOptions& options() const { return options_; }

 private:
  struct Segment {
    Piece piece;                // which part of which parameter
    std::int64_t shard_offset;  // where it starts in the shard
  };

  /// Hands the shard optimizer's segments their reduced gradients, marked incomplete when
  /// the averages are (NOTE [A rank whose backward failed] in dist/grad_buckets.hpp), and
  /// scaled when the model's are (a scaled loss's, not yet divided).
  void take_reduced_gradients() {
    const bool incomplete =
        std::any_of(dp_.params().begin(), dp_.params().end(), [](const Var<B>& p) { return p.grad_incomplete(); });
    const bool scaled =
        std::any_of(dp_.params().begin(), dp_.params().end(), [](const Var<B>& p) { return p.grad_scaled(); });
    for (std::size_t i = 0; i < segments_.size(); ++i) {
      const Piece& piece = segments_[i].piece;
      const Var<B>& segment = optimizer_->entries()[i].param;
      segment.zero_grad();  // clears an earlier mark: this is a new step's gradient
      if (options_.stage == 2)
        segment.set_grad(grad_shard_.slice(segments_[i].shard_offset, segments_[i].shard_offset + piece.count));
      else
        segment.set_grad(piece.count == 0 ? flat_view(dp_.params()[0].grad(), 0, 0)
                                          : flat_view(dp_.params()[piece.param].grad(), piece.param_offset,
                                                      piece.param_offset + piece.count));
      if (incomplete) segment.mark_grad_incomplete();
      segment.set_grad_scaled(scaled);  // still multiplied by the loss scale (NOTE [Scaled gradients])
    }
    if (options_.stage == 2)
      for (const Var<B>& p : dp_.params()) p.zero_grad();
  }

  /// The groups' parameters, group by group.
  static std::vector<Var<B>> params_of(const std::vector<Group>& groups) {
    std::vector<Var<B>> params;
    for (const Group& g : groups) params.insert(params.end(), g.params.begin(), g.params.end());
    return params;
  }
  /// "parameter group i" = its parameter count and settings, after the optimizer's own checks
  /// of the groups (a parameter in two groups, an empty group, a bad value), before any collective.
  template <class OptimizerOptions>
  static std::vector<Setting> group_settings(const std::vector<Group>& groups, const OptimizerOptions& options) {
    const Optimizer check(groups, options);  // throws as the optimizer would; holds no state
    std::vector<Setting> out;
    const auto maps = check.group_maps();
    for (std::size_t g = 0; g < groups.size(); ++g) {
      std::string value = std::to_string(groups[g].params.size()) + " parameters";
      for (const auto& [field, v] : maps[g]) {
        char text[32];  // the shortest text that reads back as v: ranks differing in any bit differ here
        value += ", " + field + " " + std::string(text, std::to_chars(text, text + sizeof text, v).ptr);
      }
      out.push_back({"parameter group " + std::to_string(g), value});
    }
    return out;
  }
  /// The options, checked before any collective (so a bad one throws on its own rank only
  /// there, not part way through set-up).
  static const ZeroOptions& checked(const ZeroOptions& options) {
    trainmem::detail::check(options.stage == 1 || options.stage == 2, "dist::ZeroOptimizer: stage must be 1 or 2, got ",
                            options.stage);
    trainmem::detail::check(options.model_dtype == DType::F32 || is_16bit(options.model_dtype),
                            "dist::ZeroOptimizer: the model dtype must be f32, f16 or bf16, got ", options.model_dtype);
    return options;
  }
  /// What every rank must choose alike: the stage decides the collectives, the model dtype
  /// their byte counts, the rounding the weights every rank receives, fp32_grads the
  /// gradients' dtype; the parameter groups which settings each element steps with.
  static std::vector<Setting> settings_of(const ZeroOptions& options, const std::vector<Setting>& group_settings) {
    std::vector<Setting> out{
        setting("stage", options.stage), setting("model_dtype", options.model_dtype),
        setting("rounding", options.rounding == RoundingMode::Stochastic ? "stochastic" : "nearest-even"),
        setting("fp32_grads", options.fp32_grads ? "on" : "off")};
    out.insert(out.end(), group_settings.begin(), group_settings.end());
    return out;
  }

  /// After a step: every rank's updated shard goes to every other rank, bucket by bucket,
  /// up to buckets_in_flight gathers at once (in place: they need no buffer), and the
  /// shard's gradients (views, or f32 copies unscale_ made) are let go.
  void finish(bool stepped) {
    if (stepped) {
      Communicator<B>& comm = dp_.communicator();
      const std::int64_t total = dp_.layout().total();
      const auto limit = static_cast<std::size_t>(dp_.options().buckets_in_flight);
      std::deque<std::unique_ptr<Pending>> gathers;
      FlatLayout::for_each_window(Range{0, total}, dp_.bucket_elements(), [&](Range window) {
        if (gathers.size() >= limit) {
          gathers.front()->wait();
          gathers.pop_front();
        }
        gathers.push_back(
            comm.start_all_gather(flat_.slice(window.begin, window.end), shard_counts(window, total, comm.size())));
      });
      for (const auto& gather : gathers) gather->wait();
    }
    optimizer_->zero_grad();
  }

  DataParallel<B> dp_;
  ZeroOptions options_;
  Range shard_;
  Tensor<B> flat_, master_, grad_shard_;
  std::vector<Segment> segments_;
  std::unique_ptr<Optimizer> optimizer_;
};

}  // namespace trainmem::dist
