// trainmem/dist/data_parallel.hpp — average gradients over ranks, one bucket at a time.
//
// Each rank runs backward on its own micro-batch; then every gradient is replaced by
// the mean over ranks (and over the micro-batches accumulated since the last average),
// so every rank steps the same optimizer on the same numbers and the weights stay
// identical without ever being sent. The gradients are walked in windows of one bucket
// (dist/flat_layout.hpp): a window's pieces are widened into one f32 bucket, summed
// with a reduce-scatter (each rank sums one slice), and the summed slices shared with an
// all-gather. A slice is summed once, on one rank, and copied bit for bit to the
// others, so every rank receives identical gradients whatever the MPI library's
// reduction order, and the only buffer is one bucket (a 2^30-parameter model needs no
// 2^30 buffer).
//
// Gradient accumulation: backward adds into .grad, so micro-batches need no
// communication; `micro_batch_done()` communicates only on the last of every
// `accumulation_steps`. The average divides by size() * accumulation_steps: the result
// is the gradient of the mean loss over every micro-batch of every rank, as one process
// with the whole global batch would compute it (when each micro-batch loss is a mean).
//
// Averaging happens after backward; overlapping it with backward (a bucket sent as
// soon as its gradients are final) is not done yet.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "trainmem/autograd/grad_mode.hpp"
#include "trainmem/autograd/var.hpp"
#include "trainmem/core/math.hpp"
#include "trainmem/dist/communicator.hpp"
#include "trainmem/dist/flat_layout.hpp"
#include "trainmem/dist/same_parameters.hpp"

namespace trainmem::dist {

/// \brief How DataParallel communicates.
struct DataParallelOptions {
  /// Bytes of the f32 buffer one window of gradients is summed in (at least 4).
  std::int64_t bucket_bytes = std::int64_t{4} << 20;
  /// Micro-batches whose gradients add up before one average (at least 1).
  std::int64_t accumulation_steps = 1;
};

/// \brief Averages a parameter list's gradients over the ranks of a communicator.
template <class B>
class DataParallel {
 public:
  /// A collective: checks that every rank holds the same parameter list (count, dtypes,
  /// shapes; trainmem::Error naming the difference), then makes every rank's parameter
  /// values rank 0's, so all ranks start from the same weights.
  DataParallel(Communicator<B>& comm, std::vector<Var<B>> params, DataParallelOptions options = {})
      : comm_(&comm), params_(std::move(params)), layout_(params_), options_(options) {
    trainmem::detail::check(options.bucket_bytes >= 4, "dist::DataParallel: bucket_bytes must be at least 4, got ",
                            options.bucket_bytes);
    trainmem::detail::check(options.accumulation_steps >= 1,
                            "dist::DataParallel: accumulation_steps must be at least 1, got ",
                            options.accumulation_steps);
    check_same_parameters(comm, params_, "dist::DataParallel");
    for (const Var<B>& p : params_) comm.broadcast(p.value(), 0);
  }

  /// Call after each micro-batch's backward: on the last of `accumulation_steps` it
  /// averages the gradients (a collective) and returns true; otherwise it returns false
  /// and communicates nothing.
  bool micro_batch_done() {
    if (++micro_batches_ < options_.accumulation_steps) return false;
    average_gradients();
    return true;
  }

  /// Replaces every gradient by its sum over ranks divided by size() * accumulation_steps.
  /// A parameter without a gradient counts as zeros and receives one. A collective.
  void average_gradients() {
    micro_batches_ = 0;
    if (layout_.total() == 0) return;
    NoGradGuard no_grad;
    const double divisor = static_cast<double>(comm_->size()) * static_cast<double>(options_.accumulation_steps);
    B& backend = params_.front().value().backend();
    const Tensor<B> bucket = Tensor<B>::empty(Shape{std::min(layout_.total(), bucket_elements())}, DType::F32,
                                              MemCategory::Gradient, backend);
    for (const Var<B>& p : params_)
      if (!p.grad().defined()) p.set_grad(Tensor<B>::zeros(p.shape(), p.dtype(), MemCategory::Gradient, backend));
    FlatLayout::for_each_window(Range{0, layout_.total()}, bucket_elements(), [&](Range window) {
      const Tensor<B> sums = bucket.slice(0, window.size());
      layout_.for_each_piece(window, [&](const Piece& piece) {
        backend.map(math::Identity{}, grad_piece(piece),
                    sums.slice(piece.window_offset, piece.window_offset + piece.count));
      });
      sum_over_ranks(sums, divisor);
      layout_.for_each_piece(window, [&](const Piece& piece) {
        backend.map(math::Identity{}, sums.slice(piece.window_offset, piece.window_offset + piece.count),
                    grad_piece(piece));
      });
    });
    for (const Var<B>& p : params_) p.grad().bump_version();
  }

  const std::vector<Var<B>>& params() const { return params_; }
  const FlatLayout& layout() const { return layout_; }
  const DataParallelOptions& options() const { return options_; }
  Communicator<B>& communicator() const { return *comm_; }
  std::int64_t bucket_elements() const { return options_.bucket_bytes / 4; }

 private:
  Tensor<B> grad_piece(const Piece& piece) const {
    return flat_view(params_[piece.param].grad(), piece.param_offset, piece.param_offset + piece.count);
  }

  /// values := (sum over ranks of values) / divisor, identical on every rank.
  void sum_over_ranks(const Tensor<B>& values, double divisor) {
    const int size = comm_->size(), rank = comm_->rank();
    std::vector<std::int64_t> counts(static_cast<std::size_t>(size));
    for (int q = 0; q < size; ++q) counts[static_cast<std::size_t>(q)] = shard_range(values.numel(), q, size).size();
    const Range mine = shard_range(values.numel(), rank, size);
    const Tensor<B> slice = Tensor<B>::empty(Shape{mine.size()}, DType::F32, MemCategory::Gradient, values.backend());
    comm_->reduce_scatter_sum(values, slice, counts);
    if (divisor != 1.0) values.backend().map(math::Scale{1.0 / divisor}, slice, slice);
    values.slice(mine.begin, mine.end).copy_from(slice);
    comm_->all_gather(values, counts);
  }

  Communicator<B>* comm_;
  std::vector<Var<B>> params_;
  FlatLayout layout_;
  DataParallelOptions options_;
  std::int64_t micro_batches_ = 0;
};

}  // namespace trainmem::dist
