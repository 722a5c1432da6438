// trainmem/dist/mpi.hpp — the communicator for CPU tensors, over MPI (link trainmem::mpi).
//
// Start the ranks with mpirun (`mpirun -np 4 ./train`); MPI finds the others, on this
// machine or across nodes. mpi::Environment initialises and finalises MPI, and
// mpi::Communicator runs the collectives on a private duplicate of MPI_COMM_WORLD, so
// the program's own MPI traffic can never match a trainmem message.
//
// NOTE [A failing rank ends the job]
// When one rank throws, the others are already waiting inside a collective that rank
// will never join, and nothing they can do from there notices. So the only way out is
// for the failing rank to end the job: mpi::run(fn) runs the rank's work, and on an
// exception prints "trainmem: rank R of N failed: <what>" to stderr and calls
// MPI_Abort, which makes mpirun stop every rank with a non-zero exit status. MPI errors
// themselves are returned, not fatal (MPI_ERRORS_RETURN on the duplicate), and become
// trainmem::Error naming the call, so they take the same path. This is the one place
// trainmem prints and ends the process; a program that does not call run() decides
// for itself.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdio>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "trainmem/backend/cpu/backend.hpp"
#include "trainmem/dist/communicator.hpp"

namespace trainmem::dist::mpi {

namespace detail {
/// Throws trainmem::Error naming `call` and MPI's description of `code`, unless it is MPI_SUCCESS.
inline void check(int code, const char* call) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  trainmem::detail::check(false, "dist::mpi: ", call, " failed: ", std::string(text, static_cast<std::size_t>(length)));
}
/// An MPI count: a message larger than an int holds must be split by the caller.
inline int count_of(std::int64_t n, const char* call) {
  trainmem::detail::check(0 <= n && n <= INT_MAX, "dist::mpi: ", call, ": ", n,
                          " elements exceed an MPI count (use smaller buckets)");
  return static_cast<int>(n);
}
inline MPI_Datatype sum_type(DType dtype) { return dtype == DType::F64 ? MPI_DOUBLE : MPI_FLOAT; }

/// \brief A non-blocking MPI collective with what MPI reads until it completes: the
/// count arrays and the tensors (their storage stays alive while it is in flight).
class Request final : public Pending {
 public:
  Request(std::vector<Tensor<cpu::Backend>> tensors, std::vector<int> counts, std::vector<int> offsets)
      : tensors_(std::move(tensors)), counts_(std::move(counts)), offsets_(std::move(offsets)) {}
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;
  /// Destroyed in flight (an exception unwinding past it): MPI may still write into the
  /// buffers, so they are left alive rather than freed under it; the job is ending.
  ~Request() override {
    if (request_ == MPI_REQUEST_NULL) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && !test()) new std::vector<Tensor<cpu::Backend>>(std::move(tensors_));
  }

  MPI_Request* handle() { return &request_; }
  const std::vector<int>& counts() const { return counts_; }
  const std::vector<int>& offsets() const { return offsets_; }

  bool test() override {
    if (request_ == MPI_REQUEST_NULL) return true;
    int done = 0;
    check(MPI_Test(&request_, &done, MPI_STATUS_IGNORE), "MPI_Test");
    return done != 0;
  }
  void wait() override {
    if (request_ != MPI_REQUEST_NULL) check(MPI_Wait(&request_, MPI_STATUS_IGNORE), "MPI_Wait");
  }

 private:
  std::vector<Tensor<cpu::Backend>> tensors_;
  std::vector<int> counts_, offsets_;
  MPI_Request request_ = MPI_REQUEST_NULL;
};
}  // namespace detail

/// \brief MPI_Init on construction (threads: funneled, the calling thread talks to MPI),
/// MPI_Finalize on destruction; does nothing when MPI is already initialised.
class Environment {
 public:
  Environment(int* argc, char*** argv) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized) return;
    int provided = 0;
    detail::check(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
    owns_ = true;
  }
  Environment() : Environment(nullptr, nullptr) {}
  Environment(const Environment&) = delete;
  Environment& operator=(const Environment&) = delete;
  ~Environment() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owns_ && !finalized) MPI_Finalize();
  }

 private:
  bool owns_ = false;
};

/// \brief The ranks of an MPI communicator (by default every rank of the job), for CPU tensors.
class Communicator final : public dist::Communicator<cpu::Backend> {
 public:
  explicit Communicator(MPI_Comm parent = MPI_COMM_WORLD) {
    detail::check(MPI_Comm_dup(parent, &comm_), "MPI_Comm_dup");
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  ~Communicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  MPI_Comm comm() const { return comm_; }

 protected:
  using TensorT = Tensor<cpu::Backend>;

  void do_all_reduce_sum(const TensorT& t) override {
    detail::check(MPI_Allreduce(MPI_IN_PLACE, t.data(), detail::count_of(t.numel(), "MPI_Allreduce"),
                                detail::sum_type(t.dtype()), MPI_SUM, comm_),
                  "MPI_Allreduce");
    t.bump_version();
  }
  void do_reduce_scatter_sum(const TensorT& input, const TensorT& output,
                             std::span<const std::int64_t> counts) override {
    const std::vector<int> n = element_counts(input, counts, "MPI_Reduce_scatter");
    detail::check(
        MPI_Reduce_scatter(input.data(), output.data(), n.data(), detail::sum_type(input.dtype()), MPI_SUM, comm_),
        "MPI_Reduce_scatter");
    output.bump_version();
  }
  std::unique_ptr<Pending> do_start_reduce_scatter_sum(const TensorT& input, const TensorT& output,
                                                       std::span<const std::int64_t> counts) override {
    auto request = std::make_unique<detail::Request>(
        std::vector<TensorT>{input, output}, element_counts(input, counts, "MPI_Ireduce_scatter"), std::vector<int>{});
    detail::check(MPI_Ireduce_scatter(input.data(), output.data(), request->counts().data(),
                                      detail::sum_type(input.dtype()), MPI_SUM, comm_, request->handle()),
                  "MPI_Ireduce_scatter");
    return request;
  }
  void do_all_gather(const TensorT& buffer, std::span<const std::int64_t> counts) override {
    auto [bytes, offsets] = byte_parts(buffer, counts, "MPI_Allgatherv");
    detail::check(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buffer.data(), bytes.data(), offsets.data(),
                                 MPI_BYTE, comm_),
                  "MPI_Allgatherv");
  }
  std::unique_ptr<Pending> do_start_all_gather(const TensorT& buffer, std::span<const std::int64_t> counts) override {
    auto [bytes, offsets] = byte_parts(buffer, counts, "MPI_Iallgatherv");
    auto request =
        std::make_unique<detail::Request>(std::vector<TensorT>{buffer}, std::move(bytes), std::move(offsets));
    detail::check(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buffer.data(), request->counts().data(),
                                  request->offsets().data(), MPI_BYTE, comm_, request->handle()),
                  "MPI_Iallgatherv");
    return request;
  }
  void do_broadcast(const TensorT& t, int root) override { broadcast_bytes(t.data(), t.bytes(), root); }
  void do_barrier() override { detail::check(MPI_Barrier(comm_), "MPI_Barrier"); }
  void do_broadcast_host(std::span<std::byte> bytes, int root) override {
    broadcast_bytes(bytes.data(), bytes.size(), root);
  }
  void do_all_gather_host(std::span<const std::byte> mine, std::span<std::byte> all) override {
    const int n = detail::count_of(static_cast<std::int64_t>(mine.size()), "MPI_Allgather");
    detail::check(MPI_Allgather(mine.data(), n, MPI_BYTE, all.data(), n, MPI_BYTE, comm_), "MPI_Allgather");
  }

 private:
  /// Each rank's element count as an MPI count (and the whole input fits one too).
  static std::vector<int> element_counts(const TensorT& input, std::span<const std::int64_t> counts, const char* call) {
    std::vector<int> n;
    for (std::int64_t c : counts) n.push_back(detail::count_of(c, call));
    detail::count_of(input.numel(), call);
    return n;
  }
  /// Each rank's part of `buffer` as bytes and byte offsets.
  static std::pair<std::vector<int>, std::vector<int>> byte_parts(const TensorT& buffer,
                                                                  std::span<const std::int64_t> counts,
                                                                  const char* call) {
    const std::int64_t element = static_cast<std::int64_t>(size_of(buffer.dtype()));
    std::vector<int> bytes, offsets;
    std::int64_t offset = 0;
    for (std::int64_t c : counts) {
      bytes.push_back(detail::count_of(c * element, call));
      offsets.push_back(detail::count_of(offset, call));
      offset += c * element;
    }
    return {std::move(bytes), std::move(offsets)};
  }

  /// In pieces of at most 1 GiB: an MPI count is an int, and one parameter may hold more
  /// bytes than that (every rank has the same byte count, so every rank makes the same calls).
  void broadcast_bytes(void* data, std::size_t bytes, int root) {
    constexpr std::size_t kPiece = std::size_t{1} << 30;
    auto* at = static_cast<std::byte*>(data);
    for (std::size_t done = 0; done < bytes; done += kPiece) {
      const std::size_t piece = std::min(kPiece, bytes - done);
      detail::check(MPI_Bcast(at + done, static_cast<int>(piece), MPI_BYTE, root, comm_), "MPI_Bcast");
    }
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
};

/// Runs `work` (returning an int exit status); on an exception prints which rank failed
/// and aborts the whole job (NOTE [A failing rank ends the job]). MPI must be initialised.
template <class Work>
int run(Work&& work) {
  try {
    return work();
  } catch (const std::exception& e) {
    int rank = -1, size = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    std::fprintf(stderr, "trainmem: rank %d of %d failed: %s\n", rank, size, e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
}

}  // namespace trainmem::dist::mpi
