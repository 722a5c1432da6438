// trainmem/distributed/data_parallel.hpp — average gradients over ranks, one bucket at a time,
// while backward still runs.
//
// Each rank runs backward on its own micro-batch; then every gradient is replaced by
// the mean over ranks (and over the micro-batches accumulated since the last average),
// so every rank steps the same optimizer on the same numbers and the weights stay
// identical without ever being sent. The gradients travel in buckets
// (dist/grad_buckets.hpp): a bucket's pieces are widened into one f32 buffer, summed
// with a reduce-scatter (each rank sums one slice) and the summed slices shared with an
// all-gather. A slice is summed once, on one rank, and copied bit for bit to the
// others, so every rank receives identical gradients whatever the MPI library's
// reduction order, and no buffer is larger than a bucket (a 2^30-parameter model needs
// no 2^30 buffer).
//
// Overlap: each parameter gets a grad-ready hook (Var::set_grad_ready_hook), so during
// the backward of the last micro-batch a bucket is sent as soon as backward is done with
// all its gradients, and computing the rest hides the communication. List parameters in
// forward order (nn::Module does) and the last buckets, made first, go first. The hook
// expects one backward per micro-batch; `overlap_with_backward = false` sends everything
// after backward instead, for a loop that runs several or edits gradients in between.
//
// Gradient accumulation: backward adds into .grad, so micro-batches need no
// communication; `micro_batch_done()` communicates only on the last of every
// `accumulation_steps`. The average divides by size() * accumulation_steps: the result
// is the gradient of the mean loss over every micro-batch of every rank, as one process
// with the whole global batch would compute it (when each micro-batch loss is a mean).
//
// Every rank must build it alike: construction refuses, on every rank, parameter lists
// that differ in count, names, shapes, dtypes or order, and a different bucket_bytes or
// accumulation_steps (dist/same_configuration.hpp); and each average carries its number,
// so a rank that skipped one is named at the next (dist/grad_buckets.hpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "trainmem/autograd/grad_mode.hpp"
#include "trainmem/autograd/parameter_list.hpp"
#include "trainmem/autograd/var.hpp"
#include "trainmem/core/math.hpp"
#include "trainmem/distributed/communicator.hpp"
#include "trainmem/distributed/flat_layout.hpp"
#include "trainmem/distributed/grad_buckets.hpp"
#include "trainmem/distributed/same_configuration.hpp"

namespace trainmem::dist {

/// \brief How DataParallel communicates.
struct DataParallelOptions {
  /// Bytes of the f32 buffer one window of gradients is summed in (at least 4).
  std::int64_t bucket_bytes = std::int64_t{4} << 20;
  /// Micro-batches whose gradients add up before one average (at least 1).
  std::int64_t accumulation_steps = 1;
  /// Send each bucket during the last micro-batch's backward, as soon as its gradients are final.
  bool overlap_with_backward = true;
  /// Buckets whose collectives may be in flight at once (at least 2).
  int buckets_in_flight = 2;
};

/// \brief Averages a parameter list's gradients over the ranks of a communicator.
template <class B>
class DataParallel {
 public:
  /// A collective: checks that every rank holds the same parameter list (count, then
  /// names, shapes and dtypes in order) and options, plus `owner_settings` (those of an
  /// object built on this one, such as ZeroOptimizer's stage), with trainmem::Error on
  /// every rank naming the first difference; then makes every rank's parameter values
  /// rank 0's, so all ranks start from the same weights.
  DataParallel(Communicator<B>& comm, std::vector<Var<B>> params, DataParallelOptions options = {},
               const std::vector<Setting>& owner_settings = {})
      : comm_(&comm),
        params_(checked(std::move(params), options)),
        layout_(params_),
        options_(options),
        buckets_(comm, params_, layout_, options.bucket_bytes / 4, options.buckets_in_flight) {
    std::vector<Setting> settings{setting("bucket_bytes", options.bucket_bytes),
                                  setting("accumulation_steps", options.accumulation_steps)};
    settings.insert(settings.end(), owner_settings.begin(), owner_settings.end());
    check_same_configuration(comm, params_, settings, "dist::DataParallel");
    for (const Var<B>& p : params_) comm.broadcast(p.value(), 0);
    if (!options.overlap_with_backward) return;
    for (const Var<B>& p : params_)  // all checked before any is set: a throw leaves no hook behind
      trainmem::detail::check(!p.has_grad_ready_hook(), "dist::DataParallel: '", p.name(),
                              "' already has a grad-ready hook (is it in two DataParallel objects?)");
    for (std::size_t i = 0; i < params_.size(); ++i) {
      params_[i].set_grad_ready_hook([this, i] {
        if (micro_batches_ + 1 == options_.accumulation_steps) buckets_.ready(i, divisor());
      });
    }
  }
  /// The hooks point at this object, so it stays where it was made.
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;
  ~DataParallel() {
    if (options_.overlap_with_backward)
      for (const Var<B>& p : params_) p.set_grad_ready_hook({});
  }

  /// Call after each micro-batch's backward: on the last of `accumulation_steps` it
  /// averages the gradients (a collective) and returns true; otherwise it returns false
  /// and communicates nothing.
  bool micro_batch_done() {
    if (++micro_batches_ < options_.accumulation_steps) return false;
    average_gradients();
    return true;
  }

  /// Replaces every gradient by its sum over ranks divided by size() * accumulation_steps,
  /// finishing what backward started. A parameter without a gradient counts as zeros
  /// and receives one (under reduce_into_shard: see there). A collective. When some
  /// rank's backward failed part way, every rank's averages are marked incomplete
  /// (NOTE [A rank whose backward failed]) and no rank's optimizer steps on them.
  void average_gradients() {
    micro_batches_ = 0;
    NoGradGuard no_grad;
    if (buckets_.finish(divisor()))
      for (const Var<B>& p : params_) p.mark_grad_incomplete();
  }

  /// ZeRO-2: average_gradients leaves this rank only the average of `shard` of the flat
  /// space, in `shard_grad`, and frees the full gradients.
  void reduce_into_shard(Tensor<B> shard_grad, Range shard) {
    buckets_.reduce_into_shard(std::move(shard_grad), shard);
  }

  const std::vector<Var<B>>& params() const { return params_; }
  const FlatLayout& layout() const { return layout_; }
  const DataParallelOptions& options() const { return options_; }
  Communicator<B>& communicator() const { return *comm_; }
  std::int64_t bucket_elements() const { return options_.bucket_bytes / 4; }

 private:
  /// Everything checked before the hooks are set (so a throw leaves none behind) and
  /// before any collective.
  static std::vector<Var<B>> checked(std::vector<Var<B>> params, const DataParallelOptions& options) {
    check_parameter_list(params, "dist::DataParallel");
    trainmem::detail::check(options.bucket_bytes >= 4, "dist::DataParallel: bucket_bytes must be at least 4, got ",
                            options.bucket_bytes);
    trainmem::detail::check(options.accumulation_steps >= 1,
                            "dist::DataParallel: accumulation_steps must be at least 1, got ",
                            options.accumulation_steps);
    trainmem::detail::check(options.buckets_in_flight >= 2,
                            "dist::DataParallel: buckets_in_flight must be at least 2, got ",
                            options.buckets_in_flight);
    return params;
  }
  double divisor() const {
    return static_cast<double>(comm_->size()) * static_cast<double>(options_.accumulation_steps);
  }

  Communicator<B>* comm_;
  std::vector<Var<B>> params_;
  FlatLayout layout_;
  DataParallelOptions options_;
  GradBuckets<B> buckets_;
  std::int64_t micro_batches_ = 0;
};

}  // namespace trainmem::dist
