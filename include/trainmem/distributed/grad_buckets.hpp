// trainmem/distributed/grad_buckets.hpp — gradients summed over ranks one bucket at a time, each
// bucket as soon as backward is done with it.
//
// The flat parameter space (dist/flat_layout.hpp) is cut into windows of one bucket. A
// window is ready once every parameter with elements in it has its final gradient (the
// tape's grad-ready hook says so while backward still runs). Ready windows start from
// the last down, the order backward makes them ready in when parameters are listed in
// forward order, and a window starts only after every later one: so every rank starts
// the same collectives in the same order, whatever order its gradients became final in,
// which is what matches a collective across ranks.
//
// A started window widens its pieces into an f32 bucket and reduce-scatters it (each
// rank sums one slice, once). Then either
//  - every rank gets the sums (data parallelism, ZeRO-1): the slice is divided,
//    all-gathered in place and narrowed back into each gradient; or
//  - each rank keeps its own shard's sums (ZeRO-2): the divided slice lands in the
//    shard's gradient, and a parameter's full gradient is freed once its last window
//    is done, while backward is still making the others.
//
// NOTE [Collectives in one order on every rank]
// Whether a collective has completed depends on timing, so completion may never decide
// what starts next. A window's all-gather is started right after the next window's
// reduce-scatter (or at the end), never when a test happens to see its sum done; tests
// only finish local work (narrowing a gathered window back, copying a shard's sums).
// At most `in_flight` windows hold a bucket; making room waits for the oldest, which
// starts nothing.
//
// NOTE [A rank whose backward failed]
// A backward that fails part way leaves its leaves' gradients partial and marked
// (Var::grad_incomplete; autograd/tape.hpp), and an optimizer refuses to step on them.
// Averaged with the other ranks, the partial gradient would spoil every rank's sums,
// while only the failed rank knows. So finish() also tells every rank whether some
// rank's gradients were marked (one byte per rank, gathered), and DataParallel marks
// the averages on every rank: all ranks then refuse the same step, and after zero_grad
// all go on together. The failed rank must still join the average (micro_batch_done),
// as every rank joins every collective.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <vector>

#include "trainmem/autograd/var.hpp"
#include "trainmem/core/math.hpp"
#include "trainmem/distributed/communicator.hpp"
#include "trainmem/distributed/flat_layout.hpp"

namespace trainmem::dist {

/// \brief The windows of one step's gradients, their readiness and their collectives.
template <class B>
class GradBuckets {
 public:
  /// `params` must outlive this object; `in_flight` >= 2 windows may hold a bucket at once.
  GradBuckets(Communicator<B>& comm, const std::vector<Var<B>>& params, const FlatLayout& layout,
              std::int64_t bucket_elements, int in_flight)
      : comm_(&comm),
        params_(&params),
        layout_(&layout),
        bucket_(std::max<std::int64_t>(1, bucket_elements)),
        in_flight_limit_(static_cast<std::size_t>(in_flight)),
        windows_((layout.total() + bucket_ - 1) / bucket_),
        params_in_window_(static_cast<std::size_t>(windows_), 0),
        windows_of_param_(params.size(), 0) {
    for (std::size_t i = 0; i < params.size(); ++i) {
      const auto [first, last] = windows_of(i);
      for (std::int64_t w = first; w <= last; ++w) ++params_in_window_[static_cast<std::size_t>(w)];
      windows_of_param_[i] = static_cast<int>(last - first + 1);
    }
  }
  // It keeps pointers to `params` and `layout`: temporaries would dangle.
  GradBuckets(Communicator<B>& comm, const std::vector<Var<B>>&& params, const FlatLayout& layout,
              std::int64_t bucket_elements, int in_flight) = delete;
  GradBuckets(Communicator<B>& comm, const std::vector<Var<B>>& params, const FlatLayout&& layout,
              std::int64_t bucket_elements, int in_flight) = delete;
  GradBuckets(const GradBuckets&) = delete;
  GradBuckets& operator=(const GradBuckets&) = delete;

  /// ZeRO-2: this rank keeps the sums of `shard` only, in `shard_grad` (shard.size()
  /// elements), and the full gradients are freed as their windows are done. With
  /// `accumulate` the divided sums are added to `shard_grad` instead of replacing it
  /// (ZeRO-3 reduces every micro-batch and sums them in the shard).
  void reduce_into_shard(Tensor<B> shard_grad, Range shard, bool accumulate = false) {
    shard_grad_ = std::move(shard_grad);
    shard_ = shard;
    accumulate_ = accumulate;
  }

  /// Parameter `param`'s gradient is final for this step: start what that makes ready
  /// and move the windows in flight on. Sums are divided by `divisor`.
  void ready(std::size_t param, double divisor) {
    check_gradient(param);
    arm(divisor);
    trainmem::detail::check(!ready_[param], "dist: the gradient of '", (*params_)[param].name(),
                            "' was made final twice before the gradients were averaged (a second backward in one "
                            "micro-batch, or a backward after a failed one without averaging in between); with "
                            "overlap_with_backward, run one backward per micro-batch and average after each last one, "
                            "even a failed one, or turn overlap off");
    ready_[param] = 1;
    const auto [first, last] = windows_of(param);
    for (std::int64_t w = first; w <= last; ++w) --waiting_[static_cast<std::size_t>(w)];
    while (next_ >= 0 && waiting_[static_cast<std::size_t>(next_)] == 0) start(next_--);
    poll();
  }

  /// Starts every window not started yet (a gradient never made final counts as zeros)
  /// and waits for all: afterwards the sums are in place. Sums are divided by `divisor`.
  /// Returns whether any rank's gradients were incomplete (Var::grad_incomplete, NOTE
  /// [A rank whose backward failed]). When it throws, the step's state is dropped: the
  /// next backward or finish starts a new one.
  bool finish(double divisor) {
    bool incomplete = false;
    try {
      for (std::size_t i = 0; i < params_->size(); ++i) {
        check_gradient(i);
        incomplete = incomplete || (*params_)[i].grad_incomplete();
      }
      arm(divisor);
      while (next_ >= 0) start(next_--);
      if (!in_flight_.empty() && in_flight_.back().phase == Phase::Summing && !to_shard()) gather(in_flight_.back());
      while (!in_flight_.empty()) {
        in_flight_.front().pending->wait();
        complete(in_flight_.front());
        in_flight_.pop_front();
      }
      if (to_shard()) shard_grad_.bump_version();
    } catch (...) {
      in_flight_.clear();  // a request destroyed in flight keeps its buffers (dist/mpi.hpp)
      armed_ = false;
      throw;
    }
    armed_ = false;
    return any_rank(incomplete);
  }

 private:
  enum class Phase { Summing, Gathering };
  struct Window {
    Range range;
    Phase phase = Phase::Summing;
    Tensor<B> bucket, mine;  // the window in f32; this rank's summed part
    std::vector<std::int64_t> counts;
    std::unique_ptr<Pending> pending;
  };

  bool to_shard() const { return shard_grad_.defined(); }

  /// A gradient the windows can read: absent, or of its parameter's shape and floating.
  void check_gradient(std::size_t param) const {
    const Var<B>& p = (*params_)[param];
    const Tensor<B>& grad = p.grad();
    if (!grad.defined()) return;
    // A ZeRO-3 parameter between its units has no value: its numel is the layout's.
    const bool shape_ok = p.value().defined() ? grad.shape() == p.shape() : grad.numel() == layout_->numel(param);
    trainmem::detail::check(shape_ok && is_floating(grad.dtype()), "dist: the gradient of '", p.name(), "' is ",
                            grad.shape(), " ", grad.dtype(), "; the parameter is ", p.shape(), " ", p.dtype(),
                            " (a gradient must have its parameter's shape and be floating point)");
  }

  /// Whether `mine` is true on some rank (a collective).
  bool any_rank(bool mine) const {
    const auto flag = static_cast<std::byte>(mine ? 1 : 0);
    std::vector<std::byte> all(static_cast<std::size_t>(comm_->size()));
    comm_->all_gather_host(std::span(&flag, 1), all);
    return std::any_of(all.begin(), all.end(), [](std::byte b) { return b != std::byte{0}; });
  }
  Range window_range(std::int64_t w) const { return {w * bucket_, std::min(layout_->total(), (w + 1) * bucket_)}; }
  /// The first and last window holding elements of `param` (last < first when it has none).
  std::pair<std::int64_t, std::int64_t> windows_of(std::size_t param) const {
    const std::int64_t begin = layout_->offset(param), n = layout_->numel(param);
    return n == 0 ? std::pair<std::int64_t, std::int64_t>{0, -1}
                  : std::pair<std::int64_t, std::int64_t>{begin / bucket_, (begin + n - 1) / bucket_};
  }

  void arm(double divisor) {
    if (armed_) return;
    armed_ = true;
    divisor_ = divisor;
    waiting_ = params_in_window_;
    windows_left_ = windows_of_param_;
    ready_.assign(params_->size(), 0);
    next_ = windows_ - 1;
  }

  /// Widens window w into a bucket and starts its reduce-scatter; then starts the
  /// previous window's all-gather (NOTE [Collectives in one order on every rank]).
  void start(std::int64_t w) {
    while (in_flight_.size() >= in_flight_limit_) {  // only the newest can be summing: the oldest gathers
      in_flight_.front().pending->wait();
      complete(in_flight_.front());
      in_flight_.pop_front();
    }
    B& backend = (*params_)[0].value().backend();
    Window window;
    window.range = window_range(w);
    window.bucket = Tensor<B>::empty(Shape{window.range.size()}, DType::F32, MemCategory::Gradient, backend);
    layout_->for_each_piece(window.range, [&](const Piece& piece) {
      const Var<B>& p = (*params_)[piece.param];
      const Tensor<B> out = window.bucket.slice(piece.window_offset, piece.window_offset + piece.count);
      if (!p.grad().defined()) {
        out.zero_();
        // Data parallelism hands every parameter a gradient; ZeRO-2 frees them anyway.
        if (!to_shard()) p.set_grad(Tensor<B>::zeros(p.shape(), p.grad_dtype(), MemCategory::Gradient, backend));
        return;
      }
      backend.map(math::Identity{}, flat_view(p.grad(), piece.param_offset, piece.param_offset + piece.count), out);
    });
    const int size = comm_->size(), rank = comm_->rank();
    if (to_shard()) {
      window.counts = shard_counts(window.range, layout_->total(), size);
    } else {
      window.counts.resize(static_cast<std::size_t>(size));
      for (int q = 0; q < size; ++q)
        window.counts[static_cast<std::size_t>(q)] = shard_range(window.range.size(), q, size).size();
    }
    window.mine = Tensor<B>::empty(Shape{window.counts[static_cast<std::size_t>(rank)]}, DType::F32,
                                   MemCategory::Gradient, backend);
    window.pending = comm_->start_reduce_scatter_sum(window.bucket, window.mine, window.counts);
    Window* previous = in_flight_.empty() || in_flight_.back().phase != Phase::Summing ? nullptr : &in_flight_.back();
    in_flight_.push_back(std::move(window));
    if (previous != nullptr && !to_shard()) gather(*previous);
  }

  /// Data parallelism: waits for `window`'s sums, divides this rank's slice and starts
  /// sharing it with every rank.
  void gather(Window& window) {
    window.pending->wait();
    const Range mine = shard_range(window.range.size(), comm_->rank(), comm_->size());
    if (divisor_ != 1.0) window.mine.backend().map(math::Scale{1.0 / divisor_}, window.mine, window.mine);
    window.bucket.slice(mine.begin, mine.end).copy_from(window.mine);
    window.mine = Tensor<B>();
    window.phase = Phase::Gathering;
    window.pending = comm_->start_all_gather(window.bucket, window.counts);
  }

  /// Finishes the windows whose collectives have completed, if that needs no new collective.
  void poll() {
    for (auto it = in_flight_.begin(); it != in_flight_.end();) {
      const bool local = it->phase == Phase::Gathering || to_shard();
      if (local && it->pending->test()) {
        complete(*it);
        it = in_flight_.erase(it);
      } else {
        if (!local) it->pending->test();  // progress only: its all-gather starts at a fixed point
        ++it;
      }
    }
  }

  /// The local work after a window's last collective: narrow the sums back into the
  /// gradients, or (ZeRO-2) divide this rank's part into the shard gradient and free
  /// the full gradients no window needs any more.
  void complete(Window& window) {
    B& backend = window.bucket.backend();
    if (!to_shard()) {
      layout_->for_each_piece(window.range, [&](const Piece& piece) {
        const Tensor<B>& grad = (*params_)[piece.param].grad();
        backend.map(math::Identity{}, window.bucket.slice(piece.window_offset, piece.window_offset + piece.count),
                    flat_view(grad, piece.param_offset, piece.param_offset + piece.count));
        grad.bump_version();
      });
      return;
    }
    const std::int64_t n = window.mine.numel();
    if (n > 0) {
      if (divisor_ != 1.0) backend.map(math::Scale{1.0 / divisor_}, window.mine, window.mine);
      const std::int64_t at = std::max(window.range.begin, shard_.begin) - shard_.begin;
      const Tensor<B> into = shard_grad_.slice(at, at + n);
      if (accumulate_) backend.map(math::Add{}, into, window.mine, into);
      else backend.map(math::Identity{}, window.mine, into);
    }
    layout_->for_each_piece(window.range, [&](const Piece& piece) {
      if (--windows_left_[piece.param] == 0) (*params_)[piece.param].zero_grad();
    });
  }

  Communicator<B>* comm_;
  const std::vector<Var<B>>* params_;
  const FlatLayout* layout_;
  std::int64_t bucket_;
  std::size_t in_flight_limit_;
  std::int64_t windows_;
  std::vector<int> params_in_window_, windows_of_param_;  // fixed by the layout
  Tensor<B> shard_grad_;
  Range shard_;
  bool accumulate_ = false;

  // One step's state: armed by its first ready gradient (or by finish), cleared by finish.
  bool armed_ = false;
  double divisor_ = 1.0;
  std::vector<int> waiting_, windows_left_;
  std::vector<char> ready_;
  std::int64_t next_ = -1;  // the next window to start; windows start from the last down
  std::deque<Window> in_flight_;
};

}  // namespace trainmem::dist
