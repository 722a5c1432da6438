// trainmem/distributed/nccl.cuh — the communicator for CUDA tensors, over NCCL (link trainmem::nccl).
//
// NCCL moves GPU memory between GPUs directly (NVLink, PCIe, InfiniBand); it needs each
// rank to hold the same ncclUniqueId, which rank 0 makes and a host communicator (MPI,
// as llm.c does; or SingleProcess for one GPU) hands to the others. That host
// communicator also serves the host-byte collectives of set-up checks.
//
// NOTE [The communication stream]
// Collectives run on a stream of their own, so a later bucket's reduction can overlap
// the backend's compute. Each collective is ordered by two events: it waits for what the
// compute stream has queued so far (the gradients it reads are final), and the compute
// stream waits for it before anything after it (an optimizer step reading the result).
// The host never waits.
#pragma once

#include <nccl.h>

#include <span>
#include <string>
#include <vector>

#include "trainmem/backend/cpu/backend.hpp"
#include "trainmem/backend/cuda/backend.cuh"
#include "trainmem/distributed/communicator.hpp"

namespace trainmem::dist::nccl {

namespace detail {
inline void check(ncclResult_t result, const char* call) {
  trainmem::detail::check(result == ncclSuccess, "dist::nccl: ", call, " failed: ", ncclGetErrorString(result));
}
inline ncclDataType_t sum_type(DType dtype) { return dtype == DType::F64 ? ncclDouble : ncclFloat; }
}  // namespace detail

/// \brief The ranks of a host communicator, each with the GPU of its cuda::Backend.
class Communicator final : public dist::Communicator<cuda::Backend> {
 public:
  Communicator(dist::Communicator<cpu::Backend>& host, cuda::Backend& backend) : host_(&host), backend_(&backend) {
    ncclUniqueId id{};
    if (host.rank() == 0) detail::check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    host.broadcast_host(std::as_writable_bytes(std::span(&id, 1)), 0);
    TRAINMEM_CUDA_CHECK(cudaSetDevice(backend.device()));
    detail::check(ncclCommInitRank(&comm_, host.size(), id, host.rank()), "ncclCommInitRank");
    TRAINMEM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    TRAINMEM_CUDA_CHECK(cudaEventCreateWithFlags(&inputs_ready_, cudaEventDisableTiming));
    TRAINMEM_CUDA_CHECK(cudaEventCreateWithFlags(&outputs_ready_, cudaEventDisableTiming));
  }
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  ~Communicator() override {
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);
    if (comm_ != nullptr) ncclCommDestroy(comm_);
    if (inputs_ready_ != nullptr) cudaEventDestroy(inputs_ready_);
    if (outputs_ready_ != nullptr) cudaEventDestroy(outputs_ready_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  /// The stream collectives run on (NOTE [The communication stream]).
  cudaStream_t stream() const { return stream_; }

 protected:
  using TensorT = Tensor<cuda::Backend>;

  void do_all_reduce_sum(const TensorT& t) override {
    ordered([&] {
      detail::check(ncclAllReduce(t.data(), t.data(), static_cast<std::size_t>(t.numel()), detail::sum_type(t.dtype()),
                                  ncclSum, comm_, stream_),
                    "ncclAllReduce");
    });
    t.bump_version();
  }
  /// Each rank's part is one ncclReduce to its owner, grouped: the counts may differ.
  void do_reduce_scatter_sum(const TensorT& input, const TensorT& output,
                             std::span<const std::int64_t> counts) override {
    const std::size_t element = size_of(input.dtype());
    ordered([&] {
      detail::check(ncclGroupStart(), "ncclGroupStart");
      std::size_t offset = 0;
      for (int q = 0; q < size(); ++q) {
        const auto n = static_cast<std::size_t>(counts[static_cast<std::size_t>(q)]);
        detail::check(ncclReduce(static_cast<const std::byte*>(input.data()) + offset * element, output.data(), n,
                                 detail::sum_type(input.dtype()), ncclSum, q, comm_, stream_),
                      "ncclReduce");
        offset += n;
      }
      detail::check(ncclGroupEnd(), "ncclGroupEnd");
    });
    output.bump_version();
  }
  /// Each rank's part is one ncclBroadcast from its owner, in place, grouped.
  void do_all_gather(const TensorT& buffer, std::span<const std::int64_t> counts) override {
    const std::size_t element = size_of(buffer.dtype());
    ordered([&] {
      detail::check(ncclGroupStart(), "ncclGroupStart");
      std::size_t offset = 0;
      for (int q = 0; q < size(); ++q) {
        const auto bytes = static_cast<std::size_t>(counts[static_cast<std::size_t>(q)]) * element;
        std::byte* at = static_cast<std::byte*>(buffer.data()) + offset;
        detail::check(ncclBroadcast(at, at, bytes, ncclUint8, q, comm_, stream_), "ncclBroadcast");
        offset += bytes;
      }
      detail::check(ncclGroupEnd(), "ncclGroupEnd");
    });
  }
  void do_broadcast(const TensorT& t, int root) override {
    ordered([&] {
      detail::check(ncclBroadcast(t.data(), t.data(), t.bytes(), ncclUint8, root, comm_, stream_), "ncclBroadcast");
    });
  }
  /// Every rank's queued work has run, and every rank got here.
  void do_barrier() override {
    TRAINMEM_CUDA_CHECK(cudaStreamSynchronize(backend_->stream()));
    TRAINMEM_CUDA_CHECK(cudaStreamSynchronize(stream_));
    host_->barrier();
  }
  void do_broadcast_host(std::span<std::byte> bytes, int root) override { host_->broadcast_host(bytes, root); }
  void do_all_gather_host(std::span<const std::byte> mine, std::span<std::byte> all) override {
    host_->all_gather_host(mine, all);
  }

 private:
  /// Runs `enqueue` (NCCL calls on stream_) between the two events of NOTE [The communication stream].
  template <class Enqueue>
  void ordered(Enqueue&& enqueue) {
    TRAINMEM_CUDA_CHECK(cudaEventRecord(inputs_ready_, backend_->stream()));
    TRAINMEM_CUDA_CHECK(cudaStreamWaitEvent(stream_, inputs_ready_, 0));
    enqueue();
    TRAINMEM_CUDA_CHECK(cudaEventRecord(outputs_ready_, stream_));
    TRAINMEM_CUDA_CHECK(cudaStreamWaitEvent(backend_->stream(), outputs_ready_, 0));
  }

  dist::Communicator<cpu::Backend>* host_;
  cuda::Backend* backend_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t inputs_ready_ = nullptr, outputs_ready_ = nullptr;
};

}  // namespace trainmem::dist::nccl
