// trainmem/distributed/communicator.hpp — the collectives data parallelism is built from.
//
// A Communicator joins `size()` ranks, each running the same program on its own data.
// Every collective must be called by every rank, in the same order, with matching
// shapes: that is what lets a rank block until the others arrive. Sums run on f32 or
// f64 only: a 16-bit sum loses bits at each hop and MPI has no 16-bit float type, so
// callers widen 16-bit values into an f32 buffer first (dist/grad_buckets.hpp does, one
// bucket at a time). Gathers and broadcasts move bytes, so they take any dtype.
//
// The public functions check their arguments and call the implementation's do_*; a
// rank that fails a check throws before it enters the collective. The "v" forms take
// each rank's element count (ranks may hold different amounts, some none), and the
// host forms move plain bytes for set-up checks that run before any tensor exists.
//
// The start_* forms begin a collective and return at once with a Pending to test or
// wait on, so gradients can be summed while backward computes others
// (dist/grad_buckets.hpp). An implementation without non-blocking collectives runs the
// blocking one and returns it done. Started collectives match across ranks by the
// order they were started in, blocking ones included, like every collective.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <numeric>
#include <span>
#include <vector>

#include "trainmem/core/tensor.hpp"
#include "trainmem/error.hpp"

namespace trainmem::dist {

/// \brief A collective in flight: until it is done, the tensors it was given must be
/// neither read nor written.
class Pending {
 public:
  virtual ~Pending() = default;
  /// Whether it has completed. Also moves it forward: MPI advances a non-blocking
  /// collective only inside MPI calls.
  virtual bool test() = 0;
  /// Returns once it has completed.
  virtual void wait() = 0;
};

/// \brief A collective that completed before it was returned.
class Completed final : public Pending {
 public:
  bool test() override { return true; }
  void wait() override {}
};

/// \brief Collectives over the ranks of one job, on tensors of backend B.
template <class B>
class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  /// Sums `tensor` (f32 or f64) element-wise over all ranks, in place.
  void all_reduce_sum(const Tensor<B>& tensor) {
    check_summable(tensor, "all_reduce_sum");
    if (tensor.numel() > 0) do_all_reduce_sum(tensor);
  }
  /// `input` is the concatenation of counts[q] elements for each rank q; `output`
  /// (counts[rank()] elements, same dtype) receives the sum over ranks of this rank's part.
  void reduce_scatter_sum(const Tensor<B>& input, const Tensor<B>& output, std::span<const std::int64_t> counts) {
    check_reduce_scatter(input, output, counts, "reduce_scatter_sum");
    do_reduce_scatter_sum(input, output, counts);
  }
  /// reduce_scatter_sum, started: `output` holds the sum once the Pending is done.
  std::unique_ptr<Pending> start_reduce_scatter_sum(const Tensor<B>& input, const Tensor<B>& output,
                                                    std::span<const std::int64_t> counts) {
    check_reduce_scatter(input, output, counts, "start_reduce_scatter_sum");
    output.bump_version();
    return do_start_reduce_scatter_sum(input, output, counts);
  }
  /// In place: `buffer` holds counts[q] elements of rank q after those of ranks < q;
  /// this rank's part is sent, every other part overwritten by its owner's.
  void all_gather(const Tensor<B>& buffer, std::span<const std::int64_t> counts) {
    check_all_gather(buffer, counts, "all_gather");
    do_all_gather(buffer, counts);
    buffer.bump_version();
  }
  /// all_gather, started: `buffer` holds every rank's part once the Pending is done.
  std::unique_ptr<Pending> start_all_gather(const Tensor<B>& buffer, std::span<const std::int64_t> counts) {
    check_all_gather(buffer, counts, "start_all_gather");
    buffer.bump_version();
    return do_start_all_gather(buffer, counts);
  }
  /// Every rank's `tensor` becomes a copy of rank `root`'s.
  void broadcast(const Tensor<B>& tensor, int root) {
    detail::check(tensor.defined(), "dist::broadcast: the tensor is undefined");
    check_root(root, "broadcast");
    if (tensor.numel() > 0) do_broadcast(tensor, root);
    tensor.bump_version();
  }
  /// Returns once every rank has called it.
  void barrier() { do_barrier(); }

  /// Host bytes: every rank's `bytes` become rank `root`'s (all the same length).
  void broadcast_host(std::span<std::byte> bytes, int root) {
    check_root(root, "broadcast_host");
    do_broadcast_host(bytes, root);
  }
  /// Host bytes: `all` (size() * mine.size() bytes) receives every rank's `mine`, by rank.
  void all_gather_host(std::span<const std::byte> mine, std::span<std::byte> all) {
    detail::check(all.size() == mine.size() * static_cast<std::size_t>(size()), "dist::all_gather_host: ", size(),
                  " ranks of ", mine.size(), " bytes need ", mine.size() * static_cast<std::size_t>(size()),
                  " bytes, got ", all.size());
    do_all_gather_host(mine, all);
  }

 protected:
  virtual void do_all_reduce_sum(const Tensor<B>& tensor) = 0;
  virtual void do_reduce_scatter_sum(const Tensor<B>& input, const Tensor<B>& output,
                                     std::span<const std::int64_t> counts) = 0;
  virtual void do_all_gather(const Tensor<B>& buffer, std::span<const std::int64_t> counts) = 0;
  virtual void do_broadcast(const Tensor<B>& tensor, int root) = 0;
  virtual void do_barrier() = 0;
  virtual void do_broadcast_host(std::span<std::byte> bytes, int root) = 0;
  virtual void do_all_gather_host(std::span<const std::byte> mine, std::span<std::byte> all) = 0;
  /// Non-blocking forms; by default the blocking collective, returned done.
  virtual std::unique_ptr<Pending> do_start_reduce_scatter_sum(const Tensor<B>& input, const Tensor<B>& output,
                                                               std::span<const std::int64_t> counts) {
    do_reduce_scatter_sum(input, output, counts);
    return std::make_unique<Completed>();
  }
  virtual std::unique_ptr<Pending> do_start_all_gather(const Tensor<B>& buffer, std::span<const std::int64_t> counts) {
    do_all_gather(buffer, counts);
    return std::make_unique<Completed>();
  }

 private:
  void check_reduce_scatter(const Tensor<B>& input, const Tensor<B>& output, std::span<const std::int64_t> counts,
                            const char* op) const {
    check_summable(input, op);
    const std::int64_t total = check_counts(counts, op);
    detail::check(output.defined() && output.dtype() == input.dtype() && input.numel() == total &&
                      output.numel() == counts[static_cast<std::size_t>(rank())],
                  "dist::", op, ": rank ", rank(), " needs an input of ", total, " and an output of ",
                  counts[static_cast<std::size_t>(rank())], " ", input.dtype(), " elements, got ", input.numel(),
                  " and ", output.defined() ? output.numel() : 0, " ",
                  output.defined() ? name_of(output.dtype()) : "undefined");
  }
  void check_all_gather(const Tensor<B>& buffer, std::span<const std::int64_t> counts, const char* op) const {
    detail::check(buffer.defined(), "dist::", op, ": the buffer is undefined");
    const std::int64_t total = check_counts(counts, op);
    detail::check(buffer.numel() == total, "dist::", op, ": the counts add up to ", total, " elements, the buffer ",
                  buffer.shape(), " has ", buffer.numel());
  }
  static void check_summable(const Tensor<B>& t, const char* op) {
    detail::check(t.defined() && (t.dtype() == DType::F32 || t.dtype() == DType::F64), "dist::", op,
                  ": sums run on f32 or f64 tensors (widen 16-bit values first), got ",
                  t.defined() ? name_of(t.dtype()) : "undefined");
  }
  std::int64_t check_counts(std::span<const std::int64_t> counts, const char* op) const {
    detail::check(counts.size() == static_cast<std::size_t>(size()), "dist::", op, ": need one count per rank (",
                  size(), "), got ", counts.size());
    for (std::int64_t c : counts) detail::check(c >= 0, "dist::", op, ": a count is negative (", c, ")");
    return std::accumulate(counts.begin(), counts.end(), std::int64_t{0});
  }
  void check_root(int root, const char* op) const {
    detail::check(0 <= root && root < size(), "dist::", op, ": root ", root, " is not a rank of ", size());
  }
};

/// \brief The communicator of a job with one rank: every collective is a copy or nothing,
/// so code written for data parallelism runs unchanged (and without MPI) in one process.
template <class B>
class SingleProcess final : public Communicator<B> {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }

 protected:
  void do_all_reduce_sum(const Tensor<B>&) override {}
  void do_reduce_scatter_sum(const Tensor<B>& input, const Tensor<B>& output, std::span<const std::int64_t>) override {
    output.copy_from(input.reshape(output.shape()));
  }
  void do_all_gather(const Tensor<B>&, std::span<const std::int64_t>) override {}
  void do_broadcast(const Tensor<B>&, int) override {}
  void do_barrier() override {}
  void do_broadcast_host(std::span<std::byte>, int) override {}
  void do_all_gather_host(std::span<const std::byte> mine, std::span<std::byte> all) override {
    std::copy(mine.begin(), mine.end(), all.begin());
  }
};

}  // namespace trainmem::dist
