// trainmem/distributed/mpi.hpp — the communicator for CPU tensors, over MPI (link trainmem::mpi).
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
//
// NOTE [No rank waits forever]
// Under run() every rank ends with its own message, never a hang. run() opens a notice
// channel (a private duplicate of MPI_COMM_WORLD with one receive always posted) and
// counts the collectives of every Communicator over the whole job. Every collective is
// started non-blocking and waited on by polling, and each poll also reads the channel:
//  - a rank that fails prints its message, then sends "failed: <what>" to the others
//    and waits (at most RunOptions::timeout) until each has answered with its own
//    failure before MPI_Abort, so each rank prints its line before mpirun stops it;
//  - a rank whose work returns sends "left after n collectives" and waits for every
//    other rank's notice: all left after the same n is a clean end; a rank still
//    waiting in a collective sees the notice and fails naming the rank that left (one
//    that ran fewer steps or returned early), which fails the leaving rank too. This
//    wait has no timeout: a rank still computing (saving a last checkpoint) is no error,
//    and a rank waiting in a collective answers at once;
//  - a collective that has waited RunOptions::timeout fails, naming itself and its
//    number: a rank is stuck elsewhere or calls another sequence of collectives.
// In the steady state this costs no message: the channel is read by an MPI_Test in the
// wait loop; the price is that every collective takes MPI's non-blocking path (the
// gradient buckets always did). Disagreements that do not stop a collective (another
// bucket size or accumulation count, the same shapes in another order) are refused at
// set-up instead (dist/same_configuration.hpp). Only a communicator congruent to
// MPI_COMM_WORLD is watched: on a subset of the ranks the counts would differ.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "trainmem/backend/cpu/backend.hpp"
#include "trainmem/distributed/communicator.hpp"

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

/// \brief The notice channel and collective count of one run() (NOTE [No rank waits forever]).
class Watch {
 public:
  /// A collective over MPI_COMM_WORLD.
  explicit Watch(std::chrono::milliseconds timeout) : timeout_(timeout) {
    check(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "MPI_Comm_dup");
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    heard_.assign(static_cast<std::size_t>(size_), Heard{});
    post();
  }
  Watch(const Watch&) = delete;
  Watch& operator=(const Watch&) = delete;
  ~Watch() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    if (receive_ != MPI_REQUEST_NULL) {
      MPI_Cancel(&receive_);
      MPI_Wait(&receive_, MPI_STATUS_IGNORE);
    }
    for (MPI_Request& r : sends_) MPI_Wait(&r, MPI_STATUS_IGNORE);
    MPI_Comm_free(&comm_);
  }

  /// The run() in progress on this process, or nullptr.
  static Watch*& active() {
    static Watch* watch = nullptr;
    return watch;
  }

  /// Numbers the next collective (1, 2, ...: the same on every rank that runs the same ones).
  std::int64_t next_collective() { return ++collectives_; }

  /// Polls `request` until it completes; throws when another rank failed or left, or
  /// when `timeout` passes first. `op` and `number` name the collective.
  void wait(MPI_Request& request, const char* op, std::int64_t number) {
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      int done = 0;
      check(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "MPI_Test");
      if (done) return;
      read_notices();
      for (int q = 0; heard_anything_ && q < size_; ++q) {
        const Heard& h = heard_[static_cast<std::size_t>(q)];
        trainmem::detail::check(!h.failed, "dist::mpi: rank ", q, " failed while this rank waited in ", op,
                                " (collective ", number, "): ", h.text);
        // A rank that left after this collective joined it: its part is on the way.
        trainmem::detail::check(!h.left || h.collectives >= number, "dist::mpi: rank ", q, " left the job after ",
                                h.collectives, " collectives while this rank waited in ", op, " (collective ", number,
                                "): a rank ran fewer steps or returned early");
      }
      const auto waited = std::chrono::steady_clock::now() - start;
      trainmem::detail::check(waited < timeout_, "dist::mpi: ", op, " (collective ", number,
                              ") did not complete within the timeout of ", seconds(timeout_),
                              " s: another rank is stuck, or runs another sequence of collectives");
    }
  }

  /// The work returned: tells the others how many collectives this rank ran and waits
  /// for each one's notice. Throws unless every rank left after as many.
  void leave() {
    announce(Notice::kLeft, "");
    for (int q = 0; q < size_; ++q) {
      if (q == rank_) continue;
      const Heard& h = heard_[static_cast<std::size_t>(q)];
      while (!h.left && !h.failed) read_notices();
      trainmem::detail::check(!h.failed, "dist::mpi: rank ", q, " failed: ", h.text);
      trainmem::detail::check(h.collectives == collectives_, "dist::mpi: rank ", q, " left the job after ",
                              h.collectives, " collectives, this rank after ", collectives_,
                              ": the ranks ran different sequences of collectives");
    }
  }

  /// This rank failed with `what` (already printed): tells the others and waits, at most
  /// `timeout`, until each has answered with its own failure, so each prints before the abort.
  void fail(const char* what) noexcept {
    try {
      announce(Notice::kFailed, what);
      const auto start = std::chrono::steady_clock::now();
      for (int q = 0; q < size_; ++q) {
        if (q == rank_) continue;
        while (!heard_[static_cast<std::size_t>(q)].failed && std::chrono::steady_clock::now() - start < timeout_)
          read_notices();
      }
    } catch (...) {  // the job is ending anyway
    }
  }

 private:
  struct Notice {
    static constexpr std::int32_t kLeft = 1, kFailed = 2;
    std::int32_t kind = 0;
    std::int32_t unused = 0;
    std::int64_t collectives = 0;
    char text[240] = {};
  };
  struct Heard {
    bool left = false, failed = false;
    std::int64_t collectives = 0;
    std::string text;
  };
  static constexpr int kTag = 55;

  static double seconds(std::chrono::milliseconds t) { return static_cast<double>(t.count()) / 1000.0; }

  void post() {
    check(MPI_Irecv(&incoming_, sizeof(Notice), MPI_BYTE, MPI_ANY_SOURCE, kTag, comm_, &receive_), "MPI_Irecv");
  }
  /// Records every notice that has arrived.
  void read_notices() {
    for (;;) {
      int done = 0;
      MPI_Status status;
      check(MPI_Test(&receive_, &done, &status), "MPI_Test");
      if (!done) return;
      Heard& h = heard_[static_cast<std::size_t>(status.MPI_SOURCE)];
      heard_anything_ = true;
      if (incoming_.kind == Notice::kLeft) {
        h.left = true;
        h.collectives = incoming_.collectives;
      } else {
        h.failed = true;
        h.text.assign(incoming_.text, strnlen(incoming_.text, sizeof(incoming_.text)));
      }
      post();
    }
  }
  void announce(std::int32_t kind, const char* text) {
    auto notice = std::make_unique<Notice>();
    notice->kind = kind;
    notice->collectives = collectives_;
    std::strncpy(notice->text, text, sizeof(notice->text) - 1);
    for (int q = 0; q < size_; ++q) {
      if (q == rank_) continue;
      sends_.emplace_back(MPI_REQUEST_NULL);
      check(MPI_Isend(notice.get(), sizeof(Notice), MPI_BYTE, q, kTag, comm_, &sends_.back()), "MPI_Isend");
    }
    sent_.push_back(std::move(notice));  // alive until the sends complete
  }

  std::chrono::milliseconds timeout_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::int64_t collectives_ = 0;
  Notice incoming_;
  MPI_Request receive_ = MPI_REQUEST_NULL;
  std::vector<Heard> heard_;
  bool heard_anything_ = false;  // the per-rank scan of a wait runs only once a notice came
  std::vector<std::unique_ptr<Notice>> sent_;
  std::deque<MPI_Request> sends_;  // stable addresses
};

/// Waits for `request`: by polling under the watch of a run(), else blocking.
inline void wait(MPI_Request& request, Watch* watch, const char* op, std::int64_t number) {
  if (watch != nullptr) watch->wait(request, op, number);
  else check(MPI_Wait(&request, MPI_STATUS_IGNORE), op);
}

/// \brief A non-blocking MPI collective with what MPI reads until it completes: the
/// count arrays and the tensors (their storage stays alive while it is in flight).
class Request final : public Pending {
 public:
  /// `op` and `number` name it in the messages of a `watch` (nullptr: none).
  Request(std::vector<Tensor<cpu::Backend>> tensors, std::vector<int> counts, std::vector<int> offsets, Watch* watch,
          const char* op, std::int64_t number)
      : tensors_(std::move(tensors)),
        counts_(std::move(counts)),
        offsets_(std::move(offsets)),
        watch_(watch),
        op_(op),
        number_(number) {}
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
    if (request_ != MPI_REQUEST_NULL) detail::wait(request_, watch_, op_, number_);
  }

 private:
  std::vector<Tensor<cpu::Backend>> tensors_;
  std::vector<int> counts_, offsets_;
  Watch* watch_;
  const char* op_;
  std::int64_t number_;
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
/// Under run(), its collectives are watched (NOTE [No rank waits forever]) when it spans
/// every rank of the job.
class Communicator final : public dist::Communicator<cpu::Backend> {
 public:
  explicit Communicator(MPI_Comm parent = MPI_COMM_WORLD) {
    int same = MPI_UNEQUAL;
    detail::check(MPI_Comm_compare(parent, MPI_COMM_WORLD, &same), "MPI_Comm_compare");
    watched_ = same == MPI_IDENT || same == MPI_CONGRUENT;
    collective("MPI_Comm_idup", [&](MPI_Request* r) { return MPI_Comm_idup(parent, &comm_, r); });
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  ~Communicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  MPI_Comm comm() const { return comm_; }

 protected:
  using TensorT = Tensor<cpu::Backend>;

  void do_all_reduce_sum(const TensorT& t) override {
    const int n = detail::count_of(t.numel(), "MPI_Iallreduce");
    collective("MPI_Iallreduce", [&](MPI_Request* r) {
      return MPI_Iallreduce(MPI_IN_PLACE, t.data(), n, detail::sum_type(t.dtype()), MPI_SUM, comm_, r);
    });
    t.bump_version();
  }
  void do_reduce_scatter_sum(const TensorT& input, const TensorT& output,
                             std::span<const std::int64_t> counts) override {
    do_start_reduce_scatter_sum(input, output, counts)->wait();
    output.bump_version();
  }
  std::unique_ptr<Pending> do_start_reduce_scatter_sum(const TensorT& input, const TensorT& output,
                                                       std::span<const std::int64_t> counts) override {
    auto request =
        make_request({input, output}, element_counts(input, counts, "MPI_Ireduce_scatter"), {}, "MPI_Ireduce_scatter");
    detail::check(MPI_Ireduce_scatter(input.data(), output.data(), request->counts().data(),
                                      detail::sum_type(input.dtype()), MPI_SUM, comm_, request->handle()),
                  "MPI_Ireduce_scatter");
    return request;
  }
  void do_all_gather(const TensorT& buffer, std::span<const std::int64_t> counts) override {
    do_start_all_gather(buffer, counts)->wait();
  }
  std::unique_ptr<Pending> do_start_all_gather(const TensorT& buffer, std::span<const std::int64_t> counts) override {
    auto [bytes, offsets] = byte_parts(buffer, counts, "MPI_Iallgatherv");
    auto request = make_request({buffer}, std::move(bytes), std::move(offsets), "MPI_Iallgatherv");
    detail::check(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buffer.data(), request->counts().data(),
                                  request->offsets().data(), MPI_BYTE, comm_, request->handle()),
                  "MPI_Iallgatherv");
    return request;
  }
  void do_broadcast(const TensorT& t, int root) override { broadcast_bytes(t.data(), t.bytes(), root); }
  void do_barrier() override {
    collective("MPI_Ibarrier", [&](MPI_Request* r) { return MPI_Ibarrier(comm_, r); });
  }
  void do_broadcast_host(std::span<std::byte> bytes, int root) override {
    broadcast_bytes(bytes.data(), bytes.size(), root);
  }
  void do_all_gather_host(std::span<const std::byte> mine, std::span<std::byte> all) override {
    const int n = detail::count_of(static_cast<std::int64_t>(mine.size()), "MPI_Iallgather");
    collective("MPI_Iallgather", [&](MPI_Request* r) {
      return MPI_Iallgather(mine.data(), n, MPI_BYTE, all.data(), n, MPI_BYTE, comm_, r);
    });
  }

 private:
  /// The watch of the run() in progress, if this communicator is watched.
  detail::Watch* watch() const { return watched_ ? detail::Watch::active() : nullptr; }
  std::int64_t number(detail::Watch* watch) const { return watch ? watch->next_collective() : 0; }

  /// Starts a collective with `start(MPI_Request*)` (returning MPI's code) and waits for it.
  template <class Start>
  void collective(const char* op, Start&& start) {
    detail::Watch* w = watch();
    const std::int64_t n = number(w);
    MPI_Request request = MPI_REQUEST_NULL;
    detail::check(start(&request), op);
    detail::wait(request, w, op, n);
  }
  std::unique_ptr<detail::Request> make_request(std::vector<TensorT> tensors, std::vector<int> counts,
                                                std::vector<int> offsets, const char* op) {
    detail::Watch* w = watch();
    return std::make_unique<detail::Request>(std::move(tensors), std::move(counts), std::move(offsets), w, op,
                                             number(w));
  }

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
      const int piece = static_cast<int>(std::min(kPiece, bytes - done));
      collective("MPI_Ibcast", [&](MPI_Request* r) { return MPI_Ibcast(at + done, piece, MPI_BYTE, root, comm_, r); });
    }
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  bool watched_ = false;
  int rank_ = 0;
  int size_ = 1;
};

/// \brief How run() watches the ranks (NOTE [No rank waits forever]).
struct RunOptions {
  /// The longest a collective may wait for the other ranks, and a failing rank for their answers.
  std::chrono::milliseconds timeout = std::chrono::minutes(5);
};

/// Runs `work` (returning an int exit status) under a watch of the job's collectives; on
/// an exception prints which rank failed and aborts the whole job, once every rank has
/// said why it ends (NOTE [A failing rank ends the job], NOTE [No rank waits forever]).
/// Returns `work`'s status once every rank's work has returned after the same
/// collectives. MPI must be initialised; every rank of MPI_COMM_WORLD calls it.
template <class Work>
int run(Work&& work, RunOptions options = {}) {
  std::unique_ptr<detail::Watch> watch;
  try {
    trainmem::detail::check(detail::Watch::active() == nullptr, "dist::mpi::run: already running (runs do not nest)");
    watch = std::make_unique<detail::Watch>(options.timeout);
    detail::Watch::active() = watch.get();
    const int status = work();
    watch->leave();
    detail::Watch::active() = nullptr;
    return status;
  } catch (const std::exception& e) {
    int rank = -1, size = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    std::fprintf(stderr, "trainmem: rank %d of %d failed: %s\n", rank, size, e.what());
    std::fflush(stderr);
    if (watch) watch->fail(e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
}

}  // namespace trainmem::dist::mpi
