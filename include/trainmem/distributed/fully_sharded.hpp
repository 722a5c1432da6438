// trainmem/distributed/fully_sharded.hpp — ZeRO-3: the weights are sharded too, and a unit's
// full weights exist only between its all-gather and its release.
//
// The model is cut into units (a block, or whatever the user wraps): lists of parameters,
// each unit its own flat space (dist/flat_layout.hpp) sharded over the N ranks, so rank r
// keeps shard r of every unit: its 16-bit (or f32) weights, its gradient, its f32 master
// and the optimizer's moments. Per rank, with Ψ parameters in mixed-precision AdamW:
//   2Ψ/N weights + 2Ψ/N gradient + 4Ψ/N masters + 8Ψ/N moments = 16Ψ/N bytes
// (plus the optimizer's per-segment step scalars: one segment per unit a rank has
// elements of; the shards of a unit of Ψ_u elements are ceil(Ψ_u/N) long, the last ones
// shorter). An f32 model keeps no masters: 12Ψ/N.
//
// forward(tape, u, fn, x) runs unit u: waits for its all-gather (started earlier by a
// prefetch, or now), starts the gathers of the next `prefetch_depth` units, runs fn under
// the unit's save hook, puts a boundary op on fn's output and releases the gathered
// weights. Backward reaches the boundary op first (the tape runs newest first): it gathers
// the unit again (waiting for its prefetch) and starts the gathers of the `prefetch_depth`
// units before it. A parameter's grad-ready hook hands its gradient to the unit's
// GradBuckets (dist/grad_buckets.hpp), which widen it into f32 buckets and reduce-scatter
// them into this rank's gradient shard while backward goes on, freeing the full gradient;
// once every parameter of the unit has its gradient, the unit's weights are released and
// the reductions of the unit that finished before it are waited for, so at most two units'
// f32 buckets are alive at once.
// Gathered weights are MemCategory::Workspace: they are no model state, and at most
// 1 + prefetch_depth units of them are live at once (gathered_peak() says how many bytes).
//
// NOTE [Gathered weights and saved tensors]
// An op inside a unit that saves a weight for backward (a matmul its weight) would keep
// the gathered buffer alive until backward: every unit's full weights at once, as if
// nothing were sharded. So fn runs under the unit's SaveHook (the saved-tensor seam,
// autograd/saved_tensor.hpp): a save of a view of the gathered buffer becomes a
// placeholder naming the view (offset, shape), and unpacking it hands out the same view
// of the buffer the boundary op gathered for backward. Everything else is kept as without
// a hook. A checkpoint region inside fn sees a gathered weight as no parameter (it is not
// MemCategory::Parameter) and turns its saves into the region's placeholders; its
// recompute runs during the unit's backward, after the boundary op gathered the weights
// again, so it re-gathers nothing itself and in the same order on every rank. With
// `keep_gathered` a unit is not released after its forward: its backward gathers nothing
// (the planner's "keep the gathered weights through backward", at its byte price).
//
// NOTE [A region around a unit]
// The checkpoint planner runs each stage in its mode by putting a region around it
// (ChainRunner), so a stage that is a unit's forward gets the region outside the unit.
// The unit's hook then passes every save that is not a gathered weight down to the
// region's hook (and each op's entry and outputs, so a selective policy sees the unit's
// ops), and keeps turning gathered weights into its own placeholders. The region's
// recompute calls forward() again under its replay hook: forward() sees that, prefetches
// nothing (the units after it in forward are done with), and keeps the unit gathered for
// the backward that follows, instead of releasing it. A one-unit region thus recomputes
// on the gather its backward makes anyway (no gather of its own). A region over several
// units recomputes them in order, each released when the next one's recompute starts,
// the last kept: an inner unit is gathered for its recompute and again for its backward,
// one gather more a step (what the planner's profile of its forward prices), and at most
// one unit more is gathered than without regions.
// Under autocast the model dtype must be the compute dtype: a cast copy of a weight (the
// cast cache's) would be a full weight that no release frees.
// (A norm that reads a 16-bit weight in f32 for an f32 input takes an f32 copy from the
// cast cache; release drops it with the unit.)
//
// Collectives: every rank runs the same units in the same order, so gathers and
// reduce-scatters start in the same order everywhere (NOTE [Collectives in one order on
// every rank] in dist/grad_buckets.hpp). MPI progresses a started gather inside MPI calls
// only, so each op entry under a unit's hook and each grad-ready hook tests the gathers
// in flight. Gradient accumulation reduce-scatters every micro-batch (each divided by
// N × accumulation_steps) and adds the result into the shard, so no full gradient
// outlives its micro-batch. The step is ZeroOptimizer's (dist/zero.hpp): found-inf and the
// global norm agreed over the ranks, a skipped step bitwise unchanged on every rank; it
// needs no all-gather afterwards, since the next forward gathers the updated shards.
//
// Between units a parameter's value is undefined (its bytes are released). gather(u) makes
// unit u whole until release(u) (to evaluate; gathered before the model is destroyed, the
// parameters keep those values), full_weights() copies every unit to the host, and
// state() / load_state() save and resume this rank's shard through state/.
//
// Limits: each parameter belongs to one unit and is used by that unit's fn only; every op
// of a unit depends on the unit's input (an op that does not runs its backward after the
// unit's release, and a saved weight it unpacks is an Error naming the unit). Unlike
// DataParallel (NOTE [A rank whose backward failed] in dist/grad_buckets.hpp), recovering
// from a backward that failed part way is not supported (a unit's full gradients are freed
// as they are reduced, and their marks with them): under mpi::run a throwing rank ends the job.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "trainmem/amp/grad_scaler.hpp"
#include "trainmem/amp/narrowing.hpp"
#include "trainmem/autocast/autocast.hpp"
#include "trainmem/autocast/cast_cache.hpp"
#include "trainmem/autograd/grad_mode.hpp"
#include "trainmem/checkpoint/stage_hold.hpp"
#include "trainmem/distributed/zero.hpp"
#include "trainmem/ops/op_recorder.hpp"
#include "trainmem/optim/adamw.hpp"
#include "trainmem/optim/optimizer_state.hpp"
#include "trainmem/state/state_dict.hpp"

namespace trainmem::dist {

/// \brief What a FullyShardedModel shards and how it moves the weights.
struct FullyShardedOptions {
  /// f32: the shards are the optimizer's target (no masters). f16/bf16: 16-bit weights and
  /// gathers, f32 masters of the shard.
  DType model_dtype = DType::BF16;
  RoundingMode rounding = RoundingMode::NearestEven;  // of the 16-bit copies
  std::uint64_t seed = 0;                             // stochastic rounding's seed
  /// Units whose gathers are started ahead of the one computing (forward and backward); 0: none.
  int prefetch_depth = 1;
  /// Units (by index) kept gathered from their forward through their backward.
  std::vector<std::size_t> keep_gathered = {};
  std::int64_t bucket_bytes = std::int64_t{4} << 20;  // of the f32 gradient buckets
  std::int64_t accumulation_steps = 1;                // micro-batches a step
  int buckets_in_flight = 2;                          // gradient windows in flight, per unit
};

/// \brief A model whose weights, gradients, masters and optimizer state are sharded over
/// the ranks of `comm` (ZeRO-3), run unit by unit.
template <class B, class Optimizer = optim::AdamW<B>>
class FullyShardedModel {
 public:
  /// A collective. `units` lists the parameters of each unit, in the order forward runs
  /// the units. Checks that every rank has the same units and options
  /// (dist/same_configuration.hpp), takes rank 0's weights, keeps this rank's shard of each
  /// unit and releases the full values.
  template <class OptimizerOptions>
  FullyShardedModel(Communicator<B>& comm, std::vector<std::vector<Var<B>>> units, FullyShardedOptions options,
                    OptimizerOptions optimizer_options)
      : comm_(&comm), options_(checked(options, units)) {
    std::vector<Var<B>> all;
    std::vector<Setting> settings{
        setting("model_dtype", options.model_dtype),
        setting("rounding", options.rounding == RoundingMode::Stochastic ? "stochastic" : "nearest-even"),
        setting("prefetch_depth", options.prefetch_depth),
        setting("bucket_bytes", options.bucket_bytes),
        setting("accumulation_steps", options.accumulation_steps),
        setting("units", static_cast<std::int64_t>(units.size()))};
    for (std::size_t u = 0; u < units.size(); ++u) {
      all.insert(all.end(), units[u].begin(), units[u].end());
      settings.push_back(
          setting("unit " + std::to_string(u) + " parameters", static_cast<std::int64_t>(units[u].size())));
      const bool keep =
          std::find(options.keep_gathered.begin(), options.keep_gathered.end(), u) != options.keep_gathered.end();
      settings.push_back(setting("unit " + std::to_string(u) + " keep_gathered", keep ? "on" : "off"));
    }
    check_parameter_list(all, "dist::FullyShardedModel");
    check_same_configuration(comm, all, settings, "dist::FullyShardedModel");
    for (const Var<B>& p : all) {
      trainmem::detail::check(p.dtype() == DType::F32 || p.dtype() == options.model_dtype, "dist::FullyShardedModel: '",
                              p.name(), "' is ", p.dtype(), "; expected f32 or the model dtype ", options.model_dtype);
      trainmem::detail::check(!p.has_grad_ready_hook(), "dist::FullyShardedModel: '", p.name(),
                              "' already has a grad-ready hook (is it in two sharded models?)");
    }
    NoGradGuard no_grad;
    B& backend = all.front().value().backend();
    backend_ = &backend;
    for (const Var<B>& p : all) comm.broadcast(p.value(), 0);  // every rank starts from rank 0's weights

    // This rank's shard of each unit, one after the other in one buffer of each kind.
    std::int64_t mine = 0;
    for (std::size_t u = 0; u < units.size(); ++u) {
      auto unit = std::make_unique<Unit>();
      unit->params = std::move(units[u]);
      unit->layout = FlatLayout(unit->params);
      for (const Var<B>& p : unit->params) unit->shapes.push_back(p.shape());
      unit->shard = shard_range(unit->layout.total(), comm.rank(), comm.size());
      unit->counts = shard_counts(Range{0, unit->layout.total()}, unit->layout.total(), comm.size());
      unit->at = mine;
      unit->keep_gathered =
          std::find(options.keep_gathered.begin(), options.keep_gathered.end(), u) != options.keep_gathered.end();
      mine += unit->shard.size();
      units_.push_back(std::move(unit));
    }
    const bool masters = options.model_dtype != DType::F32;
    weights_ = Tensor<B>::empty(Shape{mine}, options.model_dtype, MemCategory::Parameter, backend);
    grads_ = Tensor<B>::zeros(Shape{mine}, options.model_dtype, MemCategory::Gradient, backend);
    if (masters) masters_ = Tensor<B>::empty(Shape{mine}, DType::F32, MemCategory::MasterWeight, backend);
    std::vector<Var<B>> segments;
    for (std::size_t u = 0; u < units_.size(); ++u) {
      Unit& unit = *units_[u];
      unit.layout.for_each_piece(unit.shard, [&](const Piece& piece) {
        const Tensor<B> source =
            flat_view(unit.params[piece.param].value(), piece.param_offset, piece.param_offset + piece.count);
        const std::int64_t at = unit.at + unit.layout.offset(piece.param) + piece.param_offset - unit.shard.begin;
        // From the values as given: an f32 parameter keeps every bit in its master.
        if (masters) backend.map(math::Identity{}, source, masters_.slice(at, at + piece.count));
        backend.map(math::Identity{}, source, weights_.slice(at, at + piece.count));
        segment_at_.push_back(at);
        segments.push_back(Var<B>::parameter(weights_.slice(at, at + piece.count),
                                             unit.params[piece.param].name() + "[" +
                                                 std::to_string(piece.param_offset) + ":" +
                                                 std::to_string(piece.param_offset + piece.count) + "]"));
      });
    }
    if (masters) {  // a value beyond the model dtype's range: only the rank whose shard holds it throws
      amp::check_narrowed_finite(std::vector<Tensor<B>>{masters_}, std::vector<Tensor<B>>{weights_},
                                 std::vector<std::string>{"the shard"}, "dist::FullyShardedModel");
    }
    if (segments.empty()) {  // an empty shard still steps (and checks) like the others
      segment_at_.push_back(0);
      segments.push_back(Var<B>::parameter(weights_.slice(0, 0), "empty shard"));
    }
    optimizer_ = std::make_unique<Optimizer>(std::move(segments), optimizer_options);
    if (masters) {
      for (std::size_t i = 0; i < segment_at_.size(); ++i) {
        const std::int64_t n = optimizer_->entries()[i].param.numel();
        optimizer_->set_master(i, masters_.slice(segment_at_[i], segment_at_[i] + n));
      }
      optimizer_->set_copy_rounding(options.rounding, options.seed);
    }

    // Nothing below throws: the parameters give up their full values and get their hooks.
    for (std::size_t u = 0; u < units_.size(); ++u) {
      Unit& unit = *units_[u];
      unit.buckets = std::make_unique<GradBuckets<B>>(comm, unit.params, unit.layout, options.bucket_bytes / 4,
                                                      options.buckets_in_flight);
      unit.buckets->reduce_into_shard(grads_.slice(unit.at, unit.at + unit.shard.size()), unit.shard, true);
      unit.hook = std::make_unique<UnitHook>(*this, u);
      for (std::size_t i = 0; i < unit.params.size(); ++i) {
        const Var<B>& p = unit.params[i];
        p.zero_grad();
        p.impl().value = Tensor<B>();
        p.set_grad_ready_hook([this, u, i] { grad_ready(u, i); });
      }
    }
  }
  /// The hooks point at this object, so it stays where it was made.
  FullyShardedModel(const FullyShardedModel&) = delete;
  FullyShardedModel& operator=(const FullyShardedModel&) = delete;
  ~FullyShardedModel() {
    for (auto& unit : units_)
      for (const Var<B>& p : unit->params) p.set_grad_ready_hook({});
  }

  /// Runs unit u: fn(x) with the unit's full weights gathered, released afterwards (see
  /// the file comment). fn returns one Var; a checkpoint region may run inside it.
  template <class Fn>
  Var<B> forward(Tape<B>& tape, std::size_t u, Fn&& fn, const Var<B>& x) {
    trainmem::detail::check(u < units_.size(), "dist::FullyShardedModel::forward: unit ", u, " of ", units_.size());
    const amp::AutocastState& autocast = amp::autocast_state();
    trainmem::detail::check(!autocast.enabled || autocast.dtype == options_.model_dtype,
                            "dist::FullyShardedModel::forward: autocast to ", autocast.dtype, " over a ",
                            options_.model_dtype,
                            " model would cast every gathered weight into a copy no release frees; make the model "
                            "dtype the autocast dtype");
    Unit& unit = *units_[u];
    // NOTE [A region around a unit]: a recompute keeps the unit gathered for the backward
    // that follows it, releases the unit it recomputed before, and prefetches nothing.
    SaveHook<B>* below = tape.hook();
    const bool recomputing = below != nullptr && below->replaying();
    if (recomputing && held_by_recompute_ < units_.size() && held_by_recompute_ != u &&
        !units_[held_by_recompute_]->keep_gathered)
      release(*units_[held_by_recompute_]);
    wait_gathered(unit);
    if (recomputing) held_by_recompute_ = u;
    else
      for (int k = 1; k <= options_.prefetch_depth && u + static_cast<std::size_t>(k) < units_.size(); ++k)
        start_gather(*units_[u + static_cast<std::size_t>(k)]);
    unit.unpacker = std::make_shared<GatheredViews>(*this, u);
    Var<B> y;
    {
      typename UnitHook::Scope scope(tape, *unit.hook, below);
      y = fn(x);
    }
    y = boundary(y, u);
    if (!recomputing && (!unit.keep_gathered || !grad_enabled())) release(unit);
    return y;
  }

  /// Drops the gradient shard and the segments' gradients (before a step's first micro-batch).
  void zero_grad() {
    grads_.zero_();
    optimizer_->zero_grad();
    for (const auto& unit : units_)
      for (const Var<B>& p : unit->params) p.zero_grad();
    scaled_ = false;
  }

  /// Call after each micro-batch's backward (a collective): finishes its reduce-scatters
  /// and releases what backward left gathered; on the last of accumulation_steps hands the
  /// segments their gradients and returns true.
  bool micro_batch_done() {
    NoGradGuard no_grad;
    for (std::size_t u = units_.size(); u-- > 0;) {
      Unit& unit = *units_[u];
      finish_reduction(unit);
      unit.ready = 0;
      unit.reduced = false;
      release(unit);
    }
    unfinished_ = units_.size();
    held_by_recompute_ = SIZE_MAX;
    if (++micro_batches_ < options_.accumulation_steps) return false;
    micro_batches_ = 0;
    for (std::size_t i = 0; i < segment_at_.size(); ++i) {
      const Var<B>& segment = optimizer_->entries()[i].param;
      segment.zero_grad();
      segment.set_grad(grads_.slice(segment_at_[i], segment_at_[i] + segment.numel()));
      if (incomplete_) segment.mark_grad_incomplete();
      segment.set_grad_scaled(scaled_);
    }
    incomplete_ = false;
    return true;
  }

  /// Steps the shard; returns true. `max_grad_norm` >= 0 clips first with the global norm.
  bool step(double max_grad_norm = -1) {
    return detail::sharded_step(*comm_, *optimizer_, nullptr, max_grad_norm, "dist::FullyShardedModel::step",
                                [this](bool) { optimizer_->zero_grad(); });
  }
  /// As step(), with a loss scaler: every rank steps or skips together. Call scaler.update() afterwards.
  bool step(amp::GradScaler<B>& scaler, double max_grad_norm = -1) {
    return detail::sharded_step(*comm_, *optimizer_, &scaler, max_grad_norm, "dist::FullyShardedModel::step",
                                [this](bool) { optimizer_->zero_grad(); });
  }
  /// The global 2-norm of the reduced gradients (a collective; the same on every rank).
  double grad_norm() { return detail::global_grad_norm(*comm_, *optimizer_); }

  /// Gathers unit u now and waits (a collective): its parameters hold their full values
  /// until release(u) (to evaluate or inspect it outside forward).
  void gather(std::size_t u) {
    trainmem::detail::check(u < units_.size(), "dist::FullyShardedModel::gather: unit ", u, " of ", units_.size());
    wait_gathered(*units_[u]);
  }
  /// Frees unit u's gathered weights (waiting for a gather in flight); its parameters have no value after.
  void release(std::size_t u) {
    trainmem::detail::check(u < units_.size(), "dist::FullyShardedModel::release: unit ", u, " of ", units_.size());
    release(*units_[u]);
  }

  /// Every parameter's full value, unit by unit in order, widened to f64 (a collective).
  std::vector<double> full_weights() {
    std::vector<double> out;
    for (const auto& unit : units_) {
      const bool was = unit->gathered.defined();
      wait_gathered(*unit);
      for (double v : unit->gathered.template to_host<double>()) out.push_back(v);
      if (!was) release(*unit);
    }
    return out;
  }

  /// This rank's part of a sharded run (trainmem::save each rank's to its own file, which is
  /// written atomically): "ranks" and "rank", its shard's weights ("weights") and f32
  /// masters ("masters", 16-bit models), and the shard optimizer's state ("optimizer.*").
  StateDict state() const {
    StateDict out;
    out.set_i64("ranks", comm_->size());
    out.set_i64("rank", comm_->rank());
    out.set("weights", weights_);
    if (masters_.defined()) out.set("masters", masters_);
    out.insert("optimizer", optimizer_->state());
    return out;
  }
  /// Throws unless `state` is this rank's part of a run sharded like this one. A run saved
  /// at another number of ranks is refused, naming both: a shard is a range of each unit's
  /// flat space that depends on the number of ranks (resharding is not supported).
  void check_state(const StateDict& state) const {
    const char* who = "dist::FullyShardedModel::load_state";
    const std::int64_t ranks = state.get_i64("ranks", who), rank = state.get_i64("rank", who);
    trainmem::detail::check(ranks == comm_->size(), who, ": the state was saved by a run of ", ranks,
                            " ranks and this run has ", comm_->size(),
                            "; a sharded state resumes only at the number of ranks that saved it");
    trainmem::detail::check(rank == comm_->rank(), who, ": this is rank ", comm_->rank(), " and the state is rank ",
                            rank, "'s; each rank loads the file it saved");
    const auto check_entry = [&](const char* name, const Tensor<B>& t) {
      const StateEntry& e = state.at(name, who);
      trainmem::detail::check(e.type == state_type_of(t.dtype()) && e.shape == t.shape(), who, ": '", name, "' is ",
                              e.type, " ", e.shape, ", this rank's shard is ", t.dtype(), " ", t.shape());
    };
    check_entry("weights", weights_);
    if (masters_.defined()) check_entry("masters", masters_);
    optimizer_->check_state(state.sub("optimizer"));
  }
  /// check_state, then copies: nothing changes when it throws.
  void load_state(const StateDict& state) {
    check_state(state);
    state.at("weights").copy_to(weights_);
    if (masters_.defined()) state.at("masters").copy_to(masters_);
    optimizer_->load_state(state.sub("optimizer"));
  }

  /// Whether unit u stays gathered from its forward through its backward
  /// (FullyShardedOptions::keep_gathered): its gathered bytes held from forward to
  /// backward, against one gather less a step. It decides which gathers run, so it is set
  /// between steps and the same on every rank (a plan made on one rank and loaded on all:
  /// the checkpoint planner's StageHold, stage_hold()).
  void set_keep_gathered(std::size_t u, bool keep) {
    trainmem::detail::check(u < units_.size(), "dist::FullyShardedModel::set_keep_gathered: unit ", u, " of ",
                            units_.size());
    units_[u]->keep_gathered = keep;
  }
  bool keep_gathered(std::size_t u) const { return units_.at(u)->keep_gathered; }
  /// The checkpoint planner's StageHold (PlannerOptions::hold) for a chain whose stage k
  /// runs unit unit_of_stage[k] (-1: a stage of no unit, which holds nothing), or unit k
  /// when the list is empty: holding a stage keeps its unit's gathered weights through its
  /// backward (set_keep_gathered). Plan on one rank and load that plan on every rank.
  StageHold stage_hold(std::vector<std::int64_t> unit_of_stage = {}) {
    for (std::size_t k = 0; k < unit_of_stage.size(); ++k)
      trainmem::detail::check(unit_of_stage[k] >= -1 && unit_of_stage[k] < static_cast<std::int64_t>(units_.size()),
                              "dist::FullyShardedModel::stage_hold: stage ", k, " runs unit ", unit_of_stage[k], " of ",
                              units_.size(), " (-1 for a stage of no unit)");
    return {"gathered weights", [this, map = std::move(unit_of_stage)](std::int64_t stage, bool on) {
              const std::int64_t u = map.empty() ? stage : map.at(static_cast<std::size_t>(stage));
              if (u >= 0) set_keep_gathered(static_cast<std::size_t>(u), on);
            }};
  }

  std::size_t units() const { return units_.size(); }
  /// Unit u's parameters and this rank's range of its flat space.
  const std::vector<Var<B>>& unit_params(std::size_t u) const { return units_[u]->params; }
  Range unit_shard(std::size_t u) const { return units_[u]->shard; }
  /// Bytes of unit u's gathered weights.
  std::int64_t unit_bytes(std::size_t u) const {
    return units_[u]->layout.total() * static_cast<std::int64_t>(size_of(options_.model_dtype));
  }
  /// Bytes of gathered weights live now, and the most live at once since reset_gathered_peak().
  std::int64_t gathered_live() const { return gathered_live_; }
  std::int64_t gathered_peak() const { return gathered_peak_; }
  void reset_gathered_peak() { gathered_peak_ = gathered_live_; }
  /// All-gathers of a unit's weights started so far (forward's, backward's, full_weights()').
  std::int64_t gathers() const { return gathers_; }

  /// This rank's shard of every unit, in order: weights, gradient, f32 masters (undefined for an f32 model).
  const Tensor<B>& shard_weights() const { return weights_; }
  const Tensor<B>& shard_gradient() const { return grads_; }
  const Tensor<B>& masters() const { return masters_; }
  Optimizer& shard_optimizer() { return *optimizer_; }
  const Optimizer& shard_optimizer() const { return *optimizer_; }
  const FullyShardedOptions& options() const { return options_; }
  Communicator<B>& communicator() const { return *comm_; }

 private:
  struct Unit;

  /// \brief The views of a unit's gathered buffer that one forward's ops saved; unpacked
  /// from the buffer gathered for backward (NOTE [Gathered weights and saved tensors]).
  class GatheredViews final : public Unpacker<B> {
   public:
    GatheredViews(FullyShardedModel& model, std::size_t unit) : model_(&model), unit_(unit) {}
    std::int64_t add(std::int64_t offset, Shape shape, DType dtype) {
      views_.push_back({offset, std::move(shape), dtype});
      return static_cast<std::int64_t>(views_.size()) - 1;
    }
    Tensor<B> unpack(std::int64_t slot, const SavedTensor<B>& placeholder) override {
      const Unit& unit = *model_->units_[unit_];
      trainmem::detail::check(unit.gathered.defined() && !unit.pending, placeholder.op(), ": a weight of sharded unit ",
                              unit_,
                              " was saved for backward, and the unit is not gathered (its backward runs outside the "
                              "unit: every op of a unit must depend on the unit's input)");
      const View& v = views_[static_cast<std::size_t>(slot)];
      const Tensor<B> view = flat_view(unit.gathered, v.offset, v.offset + v.shape.numel()).reshape(v.shape);
      return v.dtype == view.dtype() ? view : amp::CastCache<B>::instance().get(view, v.dtype);
    }

   private:
    struct View {
      std::int64_t offset;
      Shape shape;
      DType dtype;  // the gathered weight's, or the cast cache copy's that the op saved
    };
    FullyShardedModel* model_;
    std::size_t unit_;
    std::vector<View> views_;
  };

  /// \brief The save hook fn runs under: saves of the gathered buffer become placeholders;
  /// everything else goes to the hook below it (a checkpoint region around the unit), or is
  /// kept where there is none.
  class UnitHook final : public SaveHook<B> {
   public:
    /// RAII: the hook on `tape` over `below` while fn runs.
    class Scope {
     public:
      Scope(Tape<B>& tape, UnitHook& hook, SaveHook<B>* below) : hook_(hook), scope_(tape, &hook) {
        hook.below_ = below;
      }
      ~Scope() { hook_.below_ = nullptr; }
      Scope(const Scope&) = delete;
      Scope& operator=(const Scope&) = delete;

     private:
      UnitHook& hook_;
      typename Tape<B>::HookScope scope_;
    };

    UnitHook(FullyShardedModel& model, std::size_t unit) : model_(&model), unit_(unit) {}
    std::int64_t begin_op(const OpIdentity& op) override {
      model_->progress();
      return below_ != nullptr ? below_->begin_op(op) : next_op_++;
    }
    const std::vector<Tensor<B>>* reuse_outputs(std::int64_t op_index) override {
      return below_ != nullptr ? below_->reuse_outputs(op_index) : nullptr;
    }
    void on_outputs(std::int64_t op_index, const OpIdentity& op, double flops,
                    std::span<const Tensor<B>> outputs) override {
      if (below_ != nullptr) below_->on_outputs(op_index, op, flops, outputs);
    }
    bool replaying() const override { return below_ != nullptr && below_->replaying(); }
    void name_tensor(const VarImpl<B>& x, std::string_view name) override {
      if (below_ != nullptr) below_->name_tensor(x, name);
    }
    SavedTensor<B> pack(const Tensor<B>& tensor, const SaveInfo& info) override {
      const Unit& unit = *model_->units_[unit_];
      if (!unit.gathered.defined()) return others(tensor, info);
      // A gathered weight, or the cast cache's copy of one (a norm reading a 16-bit weight
      // in f32): either is re-made from the backward gather, so neither outlives the unit.
      const auto* weight = static_cast<const std::byte*>(
          tensor.same_storage(unit.gathered) ? tensor.data() : amp::CastCache<B>::instance().source_of(tensor));
      const auto* begin = static_cast<const std::byte*>(unit.gathered.data());
      if (weight == nullptr || weight < begin || weight >= begin + unit.gathered.bytes()) return others(tensor, info);
      const auto offset =
          static_cast<std::int64_t>((weight - begin) / static_cast<std::ptrdiff_t>(size_of(unit.gathered.dtype())));
      const std::int64_t slot = unit.unpacker->add(offset, tensor.shape(), tensor.dtype());
      return SavedTensor<B>::placeholder(tensor, info.op->name, unit.unpacker, slot);
    }

   private:
    SavedTensor<B> others(const Tensor<B>& tensor, const SaveInfo& info) {
      return below_ != nullptr ? below_->pack(tensor, info) : SavedTensor<B>::keep(tensor, info.op->name);
    }

    FullyShardedModel* model_;
    std::size_t unit_;
    SaveHook<B>* below_ = nullptr;  // while fn runs: the hook the unit's forward was called under
    std::int64_t next_op_ = 0;
  };

  struct Unit {
    std::vector<Var<B>> params;
    std::vector<Shape> shapes;  // the parameters' (a released parameter has no value)
    FlatLayout layout;
    Range shard;                       // this rank's range of the unit's flat space
    std::vector<std::int64_t> counts;  // every rank's shard size
    std::int64_t at = 0;               // where the shard starts in the rank's buffers
    bool keep_gathered = false;
    Tensor<B> gathered;                // the full weights, between gather and release
    std::unique_ptr<Pending> pending;  // the gather in flight
    std::unique_ptr<GradBuckets<B>> buckets;
    std::unique_ptr<UnitHook> hook;
    std::shared_ptr<GatheredViews> unpacker;  // of the latest forward
    std::size_t ready = 0;                    // parameters whose gradient this backward made final
    bool reduced = false;                     // its reduce-scatters were waited for in this micro-batch
  };

  static constexpr OpInfo kBoundaryOp{"fully_sharded_unit", OpKind::Shape, AutocastCategory::Unchanged};

  static const FullyShardedOptions& checked(const FullyShardedOptions& o,
                                            const std::vector<std::vector<Var<B>>>& units) {
    const char* who = "dist::FullyShardedModel";
    trainmem::detail::check(!units.empty(), who, ": no units");
    for (std::size_t u = 0; u < units.size(); ++u)
      trainmem::detail::check(!units[u].empty(), who, ": unit ", u, " has no parameters");
    trainmem::detail::check(o.model_dtype == DType::F32 || is_16bit(o.model_dtype), who,
                            ": the model dtype must be f32, f16 or bf16, got ", o.model_dtype);
    trainmem::detail::check(o.prefetch_depth >= 0, who, ": prefetch_depth must be at least 0, got ", o.prefetch_depth);
    trainmem::detail::check(o.bucket_bytes >= 4, who, ": bucket_bytes must be at least 4, got ", o.bucket_bytes);
    trainmem::detail::check(o.accumulation_steps >= 1, who, ": accumulation_steps must be at least 1, got ",
                            o.accumulation_steps);
    trainmem::detail::check(o.buckets_in_flight >= 2, who, ": buckets_in_flight must be at least 2, got ",
                            o.buckets_in_flight);
    for (std::size_t k : o.keep_gathered)
      trainmem::detail::check(k < units.size(), who, ": keep_gathered names unit ", k, " of ", units.size());
    return o;
  }

  double divisor() const {
    return static_cast<double>(comm_->size()) * static_cast<double>(options_.accumulation_steps);
  }

  /// Starts unit's all-gather into a new buffer, unless it is gathered or on its way.
  void start_gather(Unit& unit) {
    if (unit.gathered.defined()) return;
    unit.gathered =
        Tensor<B>::empty(Shape{unit.layout.total()}, options_.model_dtype, MemCategory::Workspace, *backend_);
    if (!unit.shard.empty())
      flat_view(unit.gathered, unit.shard.begin, unit.shard.end)
          .copy_from(weights_.slice(unit.at, unit.at + unit.shard.size()));
    gathered_live_ += static_cast<std::int64_t>(unit.gathered.bytes());
    gathered_peak_ = std::max(gathered_peak_, gathered_live_);
    ++gathers_;
    unit.pending = comm_->start_all_gather(unit.gathered, unit.counts);
  }
  /// Unit's weights are gathered and its parameters' values are views of them.
  void wait_gathered(Unit& unit) {
    start_gather(unit);
    if (!unit.pending) return;
    unit.pending->wait();
    unit.pending.reset();
    for (std::size_t i = 0; i < unit.params.size(); ++i)
      unit.params[i].impl().value =
          flat_view(unit.gathered, unit.layout.offset(i), unit.layout.offset(i) + unit.layout.numel(i))
              .reshape(unit.shapes[i]);
  }
  /// Frees unit's gathered weights (after waiting for a gather in flight).
  void release(Unit& unit) {
    if (!unit.gathered.defined()) return;
    if (unit.pending) {
      unit.pending->wait();
      unit.pending.reset();
    }
    for (const Var<B>& p : unit.params) p.impl().value = Tensor<B>();
    gathered_live_ -= static_cast<std::int64_t>(unit.gathered.bytes());
    unit.gathered = Tensor<B>();
    // The norms read 16-bit weights in f32 through the cast cache: those copies go with the unit.
    amp::CastCache<B>::instance().drop_expired();
  }
  /// Moves the gathers in flight on (MPI progresses them only inside its calls).
  void progress() {
    for (const auto& unit : units_)
      if (unit->pending) unit->pending->test();
  }

  /// fn's output, as an op whose backward gathers unit u before any of the unit's ops run
  /// their backward, and starts the gathers of the units before it.
  Var<B> boundary(const Var<B>& y, std::size_t u) {
    OpRecorder<B> rec(kBoundaryOp, {y}, 0.0);
    const Tensor<B> value = y.value();
    return rec.finish(value, [this, u](const Grads<B>& g) {
      wait_gathered(*units_[u]);
      for (int k = 1; k <= options_.prefetch_depth && static_cast<std::size_t>(k) <= u; ++k)
        start_gather(*units_[u - static_cast<std::size_t>(k)]);
      return Grads<B>{g[0]};
    });
  }

  /// Parameter i of unit u has its final gradient for this backward.
  void grad_ready(std::size_t u, std::size_t i) {
    Unit& unit = *units_[u];
    scaled_ = scaled_ || unit.params[i].grad_scaled();
    unit.buckets->ready(i, divisor());
    if (++unit.ready == unit.params.size()) {
      release(unit);
      if (held_by_recompute_ == u) held_by_recompute_ = SIZE_MAX;
      // The unit before it in backward has had this unit's backward to reduce: waiting for
      // it now keeps at most two units' f32 buckets alive, not every unit's.
      if (unfinished_ < units_.size()) finish_reduction(*units_[unfinished_]);
      unfinished_ = u;
    }
    progress();
  }
  /// Waits for unit's reduce-scatters (a collective: all ranks reach it at the same point of
  /// backward), once a micro-batch.
  void finish_reduction(Unit& unit) {
    if (unit.reduced) return;
    if (unit.buckets->finish(divisor())) incomplete_ = true;
    unit.reduced = true;
  }

  Communicator<B>* comm_;
  FullyShardedOptions options_;
  B* backend_ = nullptr;
  std::vector<std::unique_ptr<Unit>> units_;
  Tensor<B> weights_, grads_, masters_;   // this rank's shard of every unit
  std::vector<std::int64_t> segment_at_;  // where each optimizer segment starts in the shard
  std::unique_ptr<Optimizer> optimizer_;
  std::int64_t gathered_live_ = 0, gathered_peak_ = 0, gathers_ = 0;
  std::int64_t micro_batches_ = 0;
  bool scaled_ = false, incomplete_ = false;
  std::size_t unfinished_ = SIZE_MAX;         // the unit whose gradients were final last, not yet waited for
  std::size_t held_by_recompute_ = SIZE_MAX;  // the unit a region's recompute ran last, kept gathered
};

}  // namespace trainmem::dist
